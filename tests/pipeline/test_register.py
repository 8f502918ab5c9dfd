"""The Register steps: a model package per finished run, validated against botocore's CreateModelPackage."""

from __future__ import annotations

import copy

import pytest
from support import RECIPES, recipe_dict, write_yaml
from test_definition import RESOURCES

from tiered_training.catalog.images import serving_image_uri
from tiered_training.contract import metrics
from tiered_training.pipeline import definition as d
from tiered_training.pipeline import validation
from tiered_training.planning.planner import plan_file


@pytest.fixture(scope="module")
def sft():
    plan = plan_file(next(p for p in RECIPES if p.stem == "llama3.1-8b-sft"))
    return plan, d.build_definition(plan, RESOURCES)


def test_each_chain_ends_with_its_register_step(sft):
    plan, definition = sft
    for chain, register in d.REGISTER_STEPS.items():
        last = d.chain_steps(definition, chain)[-1]
        step = d.find_step(definition, register)
        assert step["Type"] == "RegisterModel" and step["DependsOn"] == [last]
        args = step["Arguments"]
        assert args["ModelPackageGroupName"] == plan.name
        assert args["ModelApprovalStatus"] == "PendingManualApproval"
        container = args["InferenceSpecification"]["Containers"][0]
        assert container["ModelDataUrl"] == {"Get": f"Steps.{last}.ModelArtifacts.S3ModelArtifacts"}
        assert container["Image"] == serving_image_uri("us-east-1")
        meta = args["CustomerMetadataProperties"]
        assert meta["recipe"] == plan.name and meta["plan_hash"] == plan.run_config().plan_hash()
        assert meta["export_uri"] == container["ModelDataUrl"]
        statistics = args["ModelMetrics"]["ModelQuality"]["Statistics"]
        assert statistics["S3Uri"] == meta["evaluation_uri"]
        # the final metrics the package records are those the last segment's MetricDefinitions parse
        defined = {m["Name"] for m in d.find_step(definition, last)["Arguments"]["AlgorithmSpecification"]["MetricDefinitions"]}
        recorded = {k for k in meta if ":" in k}
        assert metrics.FINAL_TRAIN_LOSS in recorded and recorded == defined
    resume = d.find_step(definition, "RegisterResume")["Arguments"]["CustomerMetadataProperties"]
    assert resume["run_id"] == d.as_string(d.param(d.P_RUN_ID))


def test_a_final_metric_line_matches_its_regex():
    line = metrics.FINAL_METRIC_LINE.format(name=metrics.FINAL_EVAL_PERPLEXITY, value=12.3456789)
    import re

    assert float(re.search(metrics.final_metric_regex(metrics.FINAL_EVAL_PERPLEXITY), line).group(1)) == pytest.approx(12.3457)
    assert metrics.final_metric_names("pretrain") == (metrics.FINAL_TRAIN_LOSS,)


def test_botocore_catches_a_wrong_register_argument(sft):
    _plan, definition = sft
    broken = copy.deepcopy(definition)
    args = d.find_step(broken, d.S_REGISTER)["Arguments"]
    args["ModelApprovalStatus"] = 3
    args["InferenceSpecification"]["Containers"][0]["ModelDataURL"] = "s3://x/y"
    args["CustomerMetadataProperties"]["bad key!"] = "x" * 300
    problems = "\n".join(validation.validate_definition(broken))
    for needle in ("step Register: CreateModelPackage", "ModelApprovalStatus", "ModelDataURL", "'bad key!'"[1:-1], "300 characters"):
        assert needle in problems, needle
    del args["ModelPackageGroupName"]
    assert any("ModelPackageGroupName" in p for p in validation.validate_definition(broken))


def test_recipe_chooses_the_image_and_approval_or_no_registration(tmp_path):
    data = recipe_dict()
    image = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/my-server:2"
    data["registry"] = {"approval": "Approved", "serving_image": image}
    data["evaluation"] = {"prompts": ["Say hello."], "max_new_tokens": 8}
    plan = plan_file(write_yaml(tmp_path / "a.yaml", data))
    definition = d.build_definition(plan, RESOURCES)
    args = d.find_step(definition, d.S_REGISTER)["Arguments"]
    assert args["ModelApprovalStatus"] == "Approved"
    assert args["InferenceSpecification"]["Containers"][0]["Image"] == image
    assert plan.run_config().evaluation.prompts == ["Say hello."]
    assert validation.validate_definition(definition) == []
    data["registry"] = {"enabled": False}
    plan = plan_file(write_yaml(tmp_path / "b.yaml", data))
    definition = d.build_definition(plan, RESOURCES)
    assert not [s for s in d.iter_steps(definition["Steps"]) if s["Type"] == "RegisterModel"]
    assert "MetricDefinitions" not in d.find_step(definition, d.S_TRAIN)["Arguments"]["AlgorithmSpecification"]


def test_a_tasks_own_final_metrics_are_recorded(tmp_path, monkeypatch):
    """A task that lists its own final metrics (DPO: trl's names) gets them parsed and recorded; held-out scores,
    which a small data set may lack, stay in the evaluation file (no Register step waits on them)."""
    plan = plan_file(write_yaml(tmp_path / "held.yaml", recipe_dict(**{"data.validation_fraction": 0.01})))
    meta = d.find_step(d.build_definition(plan, RESOURCES), d.S_REGISTER)["Arguments"]["CustomerMetadataProperties"]
    assert {k for k in meta if ":" in k or "/" in k} == {"train:loss"}
    monkeypatch.setitem(metrics.TASK_FINAL_METRICS, plan.recipe.task, ("rewards/accuracies",))
    definition = d.build_definition(plan, RESOURCES)
    args = d.find_step(definition, d.S_REGISTER)["Arguments"]
    assert args["CustomerMetadataProperties"]["rewards/accuracies"] == d.as_string(
        d.get("Steps.Train.FinalMetricDataList['rewards/accuracies'].Value"))
    assert validation.validate_definition(definition) == []


def test_prompts_that_would_not_fit_a_hyperparameter_are_refused_by_field(tmp_path):
    from tiered_training.recipe.errors import RecipeError
    from tiered_training.recipe.loader import load_recipe

    data = recipe_dict()
    data["evaluation"] = {"prompts": ["é" * 250] * 8}  # 8 x 250 characters, 6 each as JSON
    with pytest.raises(RecipeError) as info:
        load_recipe(write_yaml(tmp_path / "long.yaml", data))
    assert "evaluation.prompts" in str(info.value) and "one SageMaker hyperparameter" in str(info.value)
