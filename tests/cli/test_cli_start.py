"""`start --set` and `start --dry-run` against moto server on 127.0.0.1 (started and stopped here)."""

from __future__ import annotations

import json

import pytest
from aws_calls import recording
from support import ROOT, moto_server

from tiered_training.cli.app import main as cli_main
from tiered_training.pipeline import definition as d
from tiered_training.planning.planner import plan_file

REGION = "us-east-1"
RECIPE = ROOT / "recipes" / "llama3-1b-bf16.yaml"  # its plan runs on 1, 2, 4 or 8 instances


def main(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        cli_main(["start", *map(str, argv)])
        code = 0
    except SystemExit as done:
        code = done.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def endpoint():
    with moto_server() as url:
        yield url


@pytest.fixture(scope="module")
def client(endpoint):
    import boto3

    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_MAX_ATTEMPTS": "1",
        }.items():
            mp.setenv(key, value)
        mp.delenv("AWS_PROFILE", raising=False)
        sm = boto3.client("sagemaker", endpoint_url=endpoint, region_name=REGION)
        plan = plan_file(RECIPE)
        resources = d.PipelineResources(
            role_arn="arn:aws:iam::123456789012:role/exec",
            image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
            checkpoint_s3_uri="s3://b/c/",
            output_s3_uri="s3://b/o/",
        )
        sm.create_pipeline(
            PipelineName=plan.name,
            PipelineDefinition=d.to_json(d.build_definition(plan, resources)),
            RoleArn="arn:aws:iam::123456789012:role/pipeline",
        )
        yield sm


def arrived(client, arn: str) -> dict[str, str]:
    listed = client.list_pipeline_parameters_for_execution(PipelineExecutionArn=arn)["PipelineParameters"]
    return {p["Name"]: p["Value"] for p in listed}


def test_set_starts_the_pipeline_with_the_fields_as_parameters(client, endpoint, capsys):
    smaller = plan_file(RECIPE, ["budget.total_tokens=1_000_000_000"]).estimates.total_steps
    code, out, err = main(
        [
            RECIPE,
            "--endpoint-url",
            endpoint,
            "--region",
            REGION,
            "--no-follow",
            "--set",
            "compute.instance_count=2",
            "--set",
            "probe.enabled=false",
            "--set",
            "budget.total_tokens=1_000_000_000",
        ],
        capsys,
    )
    assert code == 0, err
    assert arrived(client, out.splitlines()[0]) == {"InstanceCount": "2", "SkipProbe": "true", "MaxSteps": str(smaller)}


def test_set_of_a_field_the_deployed_pipeline_fixes_is_refused_before_any_call(client, endpoint, capsys):
    with recording("start") as recorder:
        code, _, err = main([RECIPE, "--endpoint-url", endpoint, "--set", "tuning.precision=fp8"], capsys)
        bad, _, bad_err = main([RECIPE, "--endpoint-url", endpoint, "--set", "tuning.precision=fp16"], capsys)
        clash, _, clash_err = main(
            [RECIPE, "--endpoint-url", endpoint, "--set", "compute.instance_count=2", "--instance-count", "4"], capsys
        )
    assert recorder.calls == []
    assert code == 2 and "--set tuning.precision=fp8: the deployed pipeline fixes tuning.precision" in err
    assert bad == 2 and bad_err.strip() == (
        "error: --set tuning.precision=fp16: must be one of 'bf16', 'fp8', 'fp32', 'auto' (got 'fp16')"
    )
    assert clash == 2 and "disagree" in clash_err


def test_dry_run_prints_the_pipeline_and_parameters_and_calls_nothing(client, endpoint, capsys):
    before = client.list_pipeline_executions(PipelineName="llama3-1b-bf16")["PipelineExecutionSummaries"]
    args = [RECIPE, "--endpoint-url", endpoint, "--region", REGION, "--dry-run", "--set", "compute.instance_count=4"]
    with recording("start") as recorder:
        code, out, err = main(args, capsys)
        as_json, data, _ = main([*args, "--stage", "dev", "--format", "json"], capsys)
    assert recorder.calls == []
    assert client.list_pipeline_executions(PipelineName="llama3-1b-bf16")["PipelineExecutionSummaries"] == before
    assert code == 0, err
    assert out.splitlines()[0] == f"dry run: would start the pipeline llama3-1b-bf16 in {REGION}"
    assert "  InstanceCount = 4" in out.splitlines()
    assert "  SkipProbe = false  (the pipeline's default)" in out.splitlines()
    parsed = json.loads(data)
    assert as_json == 0 and parsed["ok"] and parsed["dry_run"] and parsed["pipeline"] == "dev-llama3-1b-bf16"
    assert {p["name"]: (p["value"], p["given"]) for p in parsed["parameters"]}["InstanceCount"] == ("4", True)
    refused, _, refused_err = main([*args[:-1], "compute.instance_count=3"], capsys)
    assert refused == 2 and refused_err.startswith("error: --set compute.instance_count=3: the plan's global batch")
    assert "--instance-count" not in refused_err and refused_err.count("\n") == 1
    typed, _, typed_err = main([*args[:-2], "--instance-count", "3"], capsys)
    assert typed == 2 and typed_err.startswith("error: --instance-count 3: the plan's global batch")


def test_the_run_commands_json_keeps_its_shape_against_the_endpoint(client, endpoint, capsys):
    import jsonschema

    def checked(command: str, args: list, code: int) -> dict:
        try:
            cli_main([command, str(RECIPE), "--endpoint-url", endpoint, "--region", REGION, "-f", "json", *args])
            got = 0
        except SystemExit as done:
            got = done.code or 0
        captured = capsys.readouterr()
        assert got == code, (command, captured.err)
        data = json.loads(captured.out)
        schema = json.loads((ROOT / "docs" / "schemas" / f"{command}.schema.json").read_text())
        jsonschema.Draft202012Validator(schema).validate(data)
        assert sorted(data) == sorted(schema["properties"]) and data["ok"] is (code == 0)
        return data

    started = checked("start", ["--no-follow"], 0)
    assert started["execution_arn"] and started["pipeline"] == "llama3-1b-bf16" and not started["dry_run"]
    arn = started["execution_arn"]
    assert checked("status", ["--execution", arn], 0)["execution_arn"] == arn
    logs = checked("logs", ["--execution", arn], 1)  # moto cannot list an execution's steps (HTTP 500)
    assert logs["execution_arn"] is None and "cannot list the execution's steps" in logs["errors"][0]["message"]
    assert checked("stop", ["--execution", arn], 0)["execution_arn"] == arn
    preflight = checked("preflight", [], 1)  # moto does not answer every call it makes: a failure, in its shape
    assert preflight["errors"] and preflight["recipe"] is None
    missing = checked("status", ["--stage", "nowhere"], 1)  # no such pipeline: AWS refuses
    assert missing["execution_arn"] is None and missing["errors"]


def test_registry_lists_the_recipes_models_and_approves_one(client, endpoint, capsys):
    """Two versions in the recipe's group, as its Register steps add them: listed newest first with their run and
    metrics; --approve sets one's status; an unknown version or both flags are refused by name."""
    plan = plan_file(RECIPE)
    client.create_model_package_group(ModelPackageGroupName=plan.name)
    spec = {"Containers": [{"Image": "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:1",
                            "ModelDataUrl": "s3://b/o/model/job/output/model.tar.gz"}],
            "SupportedContentTypes": ["application/json"], "SupportedResponseMIMETypes": ["application/json"]}
    for run, loss in (("run-a", "2.5"), ("run-b", "2.1")):
        client.create_model_package(
            ModelPackageGroupName=plan.name, ModelApprovalStatus="PendingManualApproval", InferenceSpecification=spec,
            ModelMetrics={"ModelQuality": {"Statistics": {"ContentType": "application/json",
                                                          "S3Uri": f"s3://b/c/runs/{run}/evaluation.json"}}},
            CustomerMetadataProperties={"run_id": run, "plan_hash": "abc", "train:loss": loss})

    def registry(*args: str) -> tuple[int, dict | str]:
        try:
            cli_main(["registry", str(RECIPE), "--endpoint-url", endpoint, "--region", REGION, *args])
            code = 0
        except SystemExit as done:
            code = done.code or 0
        captured = capsys.readouterr()
        return code, json.loads(captured.out) if "json" in args else captured.out + captured.err

    code, listed = registry("-f", "json")
    assert code == 0 and listed["group"] == plan.name
    assert [(p["version"], p["run_id"], p["metrics"], p["approval"]) for p in listed["packages"]] == [
        (2, "run-b", {"train:loss": "2.1"}, "PendingManualApproval"),
        (1, "run-a", {"train:loss": "2.5"}, "PendingManualApproval"),
    ]
    assert listed["packages"][1]["evaluation"] == "s3://b/c/runs/run-a/evaluation.json"
    code, text = registry("--approve", "1", "--note", "held-out loss checked")
    # (moto's UpdateModelPackage drops the metadata it is not given; SageMaker keeps it: the run is not checked here)
    assert code == 0 and text.startswith("Approved: version 1") and "\n  1: Approved, run " in text
    described = client.describe_model_package(ModelPackageName=listed["packages"][1]["arn"])
    assert described["ModelApprovalStatus"] == "Approved" and described["ApprovalDescription"] == "held-out loss checked"
    code, text = registry("--reject", "9")
    assert code == 1 and "has no version 9 (versions: 2, 1)" in text
    code, text = registry("--approve", "1", "--reject", "2")
    assert code == 2 and "--approve and --reject: give one" in text


def test_start_without_a_region_uses_the_one_plan_prices_in(tmp_path, monkeypatch, capsys):
    """No --region, no compute.region, no AWS_REGION and no configured one: the recipe's default region, as in
    plan, not 'no AWS region'."""
    from tiered_training import catalog

    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    code, out, err = main([RECIPE, "--dry-run"], capsys)
    default = catalog.prices().default_region
    assert code == 0, err
    assert out.splitlines()[0] == (
        f"dry run: would start the pipeline llama3-1b-bf16 in {default} (the recipe's default region, which plan prices in)"
    )
    assert json.loads(main([RECIPE, "--dry-run", "-f", "json"], capsys)[1])["region"] == default
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert "in eu-west-1 (the environment)" in main([RECIPE, "--dry-run"], capsys)[1]
