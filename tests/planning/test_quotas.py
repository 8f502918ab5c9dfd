"""Service quotas as data: the catalogue, what a plan needs, and the planner's quota findings."""

from __future__ import annotations

import re

import pytest
from support import RECIPES, recipe_dict, write_yaml

from tiered_training import catalog as catalogs
from tiered_training.planning import quotas
from tiered_training.planning.planner import plan_file

KINDS = {"training": "{} for training job usage", "spot-training": "{} for spot training job usage",
         "warm-pool": "{} for training warm pool usage"}


def quota_findings(plan) -> dict[str, str]:
    """Quota name (from the fix's compute.quotas key) -> the finding's text."""
    out = {}
    for finding in plan.findings:
        if finding.code == quotas.FINDING_CODE:
            name = re.search(r"compute\.quotas: \{([^:]+):", finding.fix).group(1)
            out[name] = f"{finding.message}. Fix: {finding.fix}"
    return out


def plan_of(tmp_path, **overrides):
    return plan_file(write_yaml(tmp_path / "r.yaml", recipe_dict(**overrides)))


def test_every_catalogue_instance_has_its_training_spot_and_warm_pool_quota():
    catalog = catalogs.quotas()
    for instance in catalogs.instances():
        for kind, title in KINDS.items():
            entry = catalog[f"{kind}/{instance}"]
            assert entry.title == title.format(instance) and entry.instance_type == instance
            assert entry.unit == "instances" and entry.source.startswith("https://")
            # A code no public page names is absent, and the entry says so.
            assert entry.code or "no public page" in entry.note


def test_account_wide_quotas_carry_code_default_and_source():
    catalog = catalogs.quotas()
    expected = {
        "training-job-max-runtime": ("L-33A961FD", 432000),
        "training-instances": ("L-00C91CB5", 4),
        "spot-training-instances": ("L-93958082", 4),
        "training-job-instances": ("L-622CFD70", 20),
        "spot-training-job-instances": ("L-DB62C864", 20),
    }
    for name, (code, default) in expected.items():
        assert (catalog[name].code, catalog[name].default) == (code, default)
        assert catalog[name].default_published and catalog[name].source.startswith("https://docs.aws.amazon.com/")


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_template_lists_the_quotas_a_default_account_lacks(path):
    plan = plan_file(path)
    compute = plan.recipe.compute
    found = quota_findings(plan)
    kind = "spot-training" if compute.spot else "training"
    expected = {f"{kind}/{compute.instance_type}"}
    if not compute.spot:
        expected.add(f"warm-pool/{compute.instance_type}")
    # Segments keep every training job within the runtime quota the recipe states (else AWS's default).
    if compute.instance_count > 4:
        expected.add(f"{kind}-instances")
    if plan.corpus is not None:  # data.sources: the Prepare job's Processing instances (no default published)
        expected.add(f"processing/{plan.recipe.data.prepare.instance_type}")
    assert set(found) == expected
    for name, text in found.items():
        quota = catalogs.quotas()[name]
        count = plan.corpus.prepare.instance_count if name.startswith("processing/") else compute.instance_count
        assert quota.title in text and f"--desired-value {count}" in text or name == "training-job-max-runtime"
        assert (quota.code or "list-service-quotas") in text and "request-service-quota-increase" in text


def test_stated_quotas_silence_the_findings_and_a_short_one_says_what_it_states(tmp_path):
    assert quota_findings(plan_of(tmp_path))  # p6-b200: a default account has none
    enough = {"training/ml.p6-b200.48xlarge": 2, "warm-pool/ml.p6-b200.48xlarge": 2}
    assert not quota_findings(plan_of(tmp_path, **{"compute.instance_count": 2, "compute.quotas": enough}))
    short = quota_findings(plan_of(tmp_path, **{"compute.instance_count": 3, "compute.quotas": enough}))
    assert set(short) == set(enough)
    assert "needs 3" in short["training/ml.p6-b200.48xlarge"] and "compute.quotas states 2" in short["training/ml.p6-b200.48xlarge"]


def test_no_warm_pool_without_a_probe(tmp_path):
    assert "warm-pool/ml.p6-b200.48xlarge" not in quota_findings(plan_of(tmp_path, **{"probe.enabled": False}))


def test_spot_needs_spot_quotas_and_no_warm_pool(tmp_path):
    found = quota_findings(plan_of(tmp_path, **{"compute.spot": True, "compute.instance_count": 5}))
    assert set(found) == {"spot-training/ml.p6-b200.48xlarge", "spot-training-instances"}
    assert "'Number of instances across all spot training jobs' (L-93958082)" in found["spot-training-instances"]


def test_the_runtime_finding_starts_above_the_applied_quota(tmp_path):
    at_default = plan_of(tmp_path, **{"compute.max_runtime_hours": 120})
    assert "training-job-max-runtime" not in quota_findings(at_default)
    above = quota_findings(plan_of(tmp_path, **{"compute.max_runtime_hours": 121}))
    assert "435,600 s (121 h)" in above["training-job-max-runtime"] and "L-33A961FD" in above["training-job-max-runtime"]
    raised = plan_of(tmp_path, **{"compute.max_runtime_hours": 121, "compute.quotas": {"training-job-max-runtime": 435600}})
    assert "training-job-max-runtime" not in quota_findings(raised)


def test_more_nodes_than_one_job_may_have(tmp_path):
    found = quota_findings(plan_of(tmp_path, **{"compute.instance_count": 24}))
    assert "training-job-instances" in found and "L-622CFD70" in found["training-job-instances"]


def test_the_warm_pool_need_follows_the_pipeline_definition():
    """The probe keeps a warm pool exactly when the definition asks for one (KeepAlivePeriodInSeconds)."""
    from tiered_training.pipeline import definition as d

    resources = d.PipelineResources(role_arn="arn:aws:iam::123456789012:role/r", image_uri="1.dkr.ecr.us-east-1.amazonaws.com/i:1",
                                    checkpoint_s3_uri="s3://b/c/", output_s3_uri="s3://b/o/")
    for path in RECIPES:
        plan = plan_file(path)
        probe = d.training_arguments(plan, resources, probe=True)
        assert ("KeepAlivePeriodInSeconds" in probe["ResourceConfig"]) == (not plan.recipe.compute.spot)
        assert quotas.uses_warm_pool(plan.recipe) == (not plan.recipe.compute.spot and plan.recipe.probe.enabled)
        listed = any(n.quota.name.startswith("warm-pool/") for n in quotas.needs(plan.recipe))
        assert listed == quotas.uses_warm_pool(plan.recipe)
        full = d.training_arguments(plan, resources, probe=False)
        assert full["StoppingCondition"]["MaxRuntimeInSeconds"] == quotas.runtime_need(plan.recipe)


def test_an_unknown_quota_name_is_a_one_line_error_naming_the_known_ones(tmp_path):
    from tiered_training.recipe.errors import RecipeError

    with pytest.raises(RecipeError) as error:
        plan_of(tmp_path, **{"compute.quotas": {"training/ml.p6-b200": 2}})
    assert "unknown quota 'training/ml.p6-b200'" in str(error.value) and "training/ml.p6-b200.48xlarge" in str(error.value)


def test_the_apps_context_quotas_count_for_every_recipe_and_the_recipe_wins(tmp_path):
    plan = plan_of(tmp_path, **{"compute.instance_count": 2, "compute.quotas": {"warm-pool/ml.p6-b200.48xlarge": 1}})
    account = quotas.parse_account('{"training/ml.p6-b200.48xlarge": 2, "warm-pool/ml.p6-b200.48xlarge": 8}')
    found = quota_findings(quotas.with_account(plan, account))
    assert set(found) == {"warm-pool/ml.p6-b200.48xlarge"} and "compute.quotas states 1" in found["warm-pool/ml.p6-b200.48xlarge"]
    assert quotas.with_account(plan, {}) is plan


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"),
    ("[1]", "must be an object"),
    ('{"training/ml.p9": 1}', "unknown quota 'training/ml.p9'"),
    ('{"training-instances": -1}', "is not a number >= 0"),
    ('{"training-job-max-runtime": 9999999}', "above AWS's hard limit of 2,419,200 seconds"),
])
def test_bad_context_quotas_are_one_line_errors(text, message):
    with pytest.raises(ValueError) as error:
        quotas.parse_account(text)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_cli_reads_the_context_quotas_of_cdk_json(tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from tiered_training.cli.app import app

    monkeypatch.chdir(tmp_path)
    recipe = write_yaml(tmp_path / "r.yaml", recipe_dict())
    plan_json = lambda: json.loads(CliRunner().invoke(app, ["plan", "-f", "json", str(recipe)]).stdout)  # noqa: E731
    codes = lambda data: [f["code"] for p in data["plans"] for f in p["findings"]]  # noqa: E731
    assert codes(plan_json()).count("quota-needed") == 2
    context = {"quotas": {"training/ml.p6-b200.48xlarge": 1, "warm-pool/ml.p6-b200.48xlarge": 1}}
    (tmp_path / "cdk.json").write_text(json.dumps({"app": "python app.py", "context": context}))
    assert "quota-needed" not in codes(plan_json())
    (tmp_path / "cdk.json").write_text(json.dumps({"app": "python app.py", "context": {"quotas": {"nope": 1}}}))
    result = CliRunner().invoke(app, ["validate", str(recipe)])
    assert result.exit_code == 2 and "cdk.json: context.quotas: unknown quota 'nope'" in result.output
