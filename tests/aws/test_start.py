"""`tiered-training start` against moto server on 127.0.0.1 (started and stopped here)."""

from __future__ import annotations

import io

import pytest
from support import RECIPES, moto_server

from tiered_training.aws.session import StartError
from tiered_training.aws.start import pipeline_parameters, start
from tiered_training.cli.app import main as cli_main
from tiered_training.pipeline import definition as d
from tiered_training.planning.planner import plan_file

REGION = "us-east-1"


def main(argv: list[str]) -> int:
    """``tiered-training start ARGV...`` in this process: its exit code."""
    try:
        cli_main(["start", *argv])
    except SystemExit as done:
        return done.code or 0
    return 0


@pytest.fixture(scope="module")
def endpoint():
    with moto_server() as url:
        yield url


@pytest.fixture(scope="module")
def aws_env():
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION, "AWS_MAX_ATTEMPTS": "1",
        }.items():
            mp.setenv(key, value)
        mp.delenv("AWS_PROFILE", raising=False)
        yield


@pytest.fixture(scope="module")
def client(endpoint, aws_env):
    import boto3
    from botocore.config import Config

    # moto answers ListPipelineExecutionSteps with HTTP 500: no retries, so the fallback is quick.
    return boto3.client("sagemaker", endpoint_url=endpoint, region_name=REGION, config=Config(retries={"max_attempts": 1}))


@pytest.fixture(scope="module")
def deployed(client):
    iam_role = "arn:aws:iam::123456789012:role/pipeline"
    plan = plan_file(RECIPES[0])
    resources = d.PipelineResources(
        role_arn="arn:aws:iam::123456789012:role/exec", image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
        checkpoint_s3_uri="s3://b/c/", output_s3_uri="s3://b/o/",
    )
    client.create_pipeline(
        PipelineName=plan.name, PipelineDefinition=d.to_json(d.build_definition(plan, resources)), RoleArn=iam_role,
    )
    return plan


def arrived(client, arn: str) -> dict[str, str]:
    """The parameters the execution was started with, as SageMaker records them."""
    listed = client.list_pipeline_parameters_for_execution(PipelineExecutionArn=arn)["PipelineParameters"]
    return {p["Name"]: p["Value"] for p in listed}


def test_start_prints_the_arn_and_follows_to_the_end(client, deployed):
    out = io.StringIO()
    result = start(deployed, client=client, max_steps=10, skip_probe=True, poll_seconds=0, out=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == result.arn
    assert f":pipeline/{deployed.name}/execution/" in result.arn.lower()
    assert result.status == "Succeeded" and result.ok
    assert "Succeeded" in out.getvalue()
    executions = client.list_pipeline_executions(PipelineName=deployed.name)["PipelineExecutionSummaries"]
    assert result.arn in [e["PipelineExecutionArn"] for e in executions]
    assert arrived(client, result.arn) == {"MaxSteps": "10", "SkipProbe": "true"}


def test_start_from_a_recipe_path_without_following(client, deployed):
    out = io.StringIO()
    result = start(RECIPES[0], client=client, follow=False, out=out)
    assert out.getvalue().strip() == result.arn
    assert arrived(client, result.arn) == {}  # no overrides: the pipeline's defaults


def test_unknown_pipeline_is_one_readable_error(client, tmp_path):
    from support import recipe_dict, write_yaml

    path = write_yaml(tmp_path / "r.yaml", recipe_dict(name="never-deployed"))
    with pytest.raises(StartError, match="never-deployed"):
        start(path, client=client, follow=False, out=io.StringIO())


def test_main_against_the_endpoint(endpoint, aws_env, deployed, client, capsys):
    code = main([str(RECIPES[0]), "--endpoint-url", endpoint, "--region", REGION, "--poll-seconds", "0", "--instance-count", "2"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    arn = captured.out.splitlines()[0]
    assert "/execution/" in arn
    assert arrived(client, arn) == {"InstanceCount": "2"}


def test_parameters():
    assert pipeline_parameters(instance_count=2, skip_probe=False, data_uri="s3://x/y/") == [
        {"Name": "InstanceCount", "Value": "2"},
        {"Name": "DataUri", "Value": "s3://x/y/"},
        {"Name": "SkipProbe", "Value": "false"},
    ]
    assert pipeline_parameters() == []


def test_cli_start_against_the_endpoint(endpoint, aws_env, deployed, client):
    import os
    import subprocess
    import sys

    from support import ROOT

    result = subprocess.run(
        [sys.executable, "-m", "tiered_training.cli.app", "start", str(RECIPES[0]), "--endpoint-url", endpoint,
         "--region", REGION, "--poll-seconds", "0", "--skip-probe", "--max-steps", "5"],
        capture_output=True, text=True, cwd=ROOT, env=dict(os.environ), timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f":pipeline/{deployed.name}/execution/" in result.stdout.lower()
    assert "Traceback" not in result.stderr
    arn = result.stdout.splitlines()[0].strip()
    assert arrived(client, arn) == {"MaxSteps": "5", "SkipProbe": "true"}


def test_start_in_a_stage_starts_the_stages_pipeline(client, deployed):
    from tiered_training.recipe import names

    staged = names.pipeline_name(deployed.name, "dev")
    assert staged == f"dev-{deployed.name}"
    resources = d.PipelineResources(
        role_arn="arn:aws:iam::123456789012:role/exec", image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
        checkpoint_s3_uri="s3://b/c/", output_s3_uri="s3://b/o/",
    )
    client.create_pipeline(
        PipelineName=staged, PipelineDefinition=d.to_json(d.build_definition(deployed, resources)),
        RoleArn="arn:aws:iam::123456789012:role/pipeline",
    )
    result = start(deployed, client=client, follow=False, stage="dev", out=io.StringIO())
    assert f":pipeline/{staged}/execution/" in result.arn.lower()


def test_a_bad_stage_is_bad_input(capsys):
    assert main([str(RECIPES[0]), "--stage", "Dev!", "--no-follow"]) == 2
    assert "stage 'Dev!'" in capsys.readouterr().err


def test_resume_names_the_run_and_a_new_start_does_not(client, deployed):
    """`start --resume RUN` sets RunId; a plain start leaves it at the pipeline's default, a new run."""
    assert pipeline_parameters(resume="a1b2c3") == [{"Name": "RunId", "Value": "a1b2c3"}]
    result = start(deployed, client=client, resume="a1b2c3", follow=False, out=io.StringIO())
    sent = client.list_pipeline_parameters_for_execution(PipelineExecutionArn=result.arn)["PipelineParameters"]
    assert {"Name": "RunId", "Value": "a1b2c3"} in sent
    for bad in ("new", "../other-recipe", ""):
        with pytest.raises(StartError, match="--resume") as raised:
            start(deployed, client=client, resume=bad, follow=False, out=io.StringIO())
        assert raised.value.exit_code == 2


def test_an_instance_count_that_changes_the_global_batch_is_refused_before_any_call(tmp_path):
    """The issue's case: --instance-count 3 on a plan for one 8-GPU node would train a batch 3 x the plan's.
    It is refused before any AWS call (no client, no endpoint), naming the counts the plan supports."""
    plan = plan_file(next(p for p in RECIPES if p.stem == "llama3-8b-fp8"))
    assert 3 not in plan.instance_counts
    with pytest.raises(StartError) as raised:
        start(plan, instance_count=3, follow=False, out=io.StringIO(), endpoint_url="http://127.0.0.1:9")
    assert raised.value.exit_code == 2
    message = str(raised.value)
    assert "--instance-count 3" in message and "4,194,304 tokens" in message
    assert f"the plan supports {', '.join(map(str, plan.instance_counts))}" in message


def test_a_resume_is_held_to_the_instance_counts_a_new_run_may_use(tmp_path):
    """qwen2.5-32b-hybrid needs at least 2 hosts: `start --resume RUN --instance-count 1` is refused before any call,
    as a new run on 1 host is (the launcher would refuse it too, after the instances started)."""
    plan = plan_file(next(p for p in RECIPES if p.stem == "qwen2.5-32b-hybrid"))
    assert 1 not in plan.instance_counts
    for resume in (None, "run-a"):
        with pytest.raises(StartError) as raised:
            start(plan, instance_count=1, resume=resume, follow=False, out=io.StringIO(), endpoint_url="http://127.0.0.1:9")
        assert raised.value.exit_code == 2
        assert f"the plan supports {', '.join(map(str, plan.instance_counts))}" in str(raised.value)
    assert "--instance-count 1 (resuming run-a)" in str(raised.value)
