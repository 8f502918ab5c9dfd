"""``calibrate --from-runs`` end to end on a moto server: the runs' metrics as the container's EMF lines become,
an overlay fitted, stored in the account's store and cached, a plan citing it, and an absurd one refused."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pytest
from aws import test_runs
from support import moto_server, offline_aws_env, recipe_dict, write_yaml
from typer.testing import CliRunner

from tiered_training.cli.app import app
from tiered_training.contract import metrics as catalogue
from tiered_training.pipeline import definition as d
from tiered_training.planning.overlay import store_key
from tiered_training.planning.planner import plan_file

REPO = Path(__file__).resolve().parents[2]

REGION = "us-east-1"
ACCOUNT = "123456789012"
RUNNER = CliRunner()


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        offline_aws_env(mp, home, REGION)
        mp.setenv("XDG_CACHE_HOME", str(home / "cache"))
        test_runs.add_missing_actions(mp)  # ListPipelineExecutionSteps: the executions' Probe jobs
        with moto_server() as url:
            client("s3", url).create_bucket(Bucket="tt-store")
            yield url


def client(service: str, endpoint: str):
    import boto3

    return boto3.client(service, endpoint_url=endpoint, region_name=REGION)


def deployed(folder, name: str, endpoint: str):
    path = write_yaml(folder / f"{name}.yaml", recipe_dict(name=name, **{"tuning.precision": "bf16", "tuning.probe_candidates": 3}))
    plan = plan_file(path)
    resources = d.PipelineResources(
        role_arn=f"arn:aws:iam::{ACCOUNT}:role/exec",
        image_uri=f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/t:1",
        checkpoint_s3_uri="s3://tt-store/c/",
        output_s3_uri="s3://tt-store/o/",
    )
    client("sagemaker", endpoint).create_pipeline(
        PipelineName=plan.name,
        PipelineDefinition=d.to_json(d.build_definition(plan, resources)),
        RoleArn=f"arn:aws:iam::{ACCOUNT}:role/pipeline",
    )
    return path, plan


def ran(endpoint: str, plan, ratio: float, minutes: int = 20) -> None:
    """Per-minute TokensPerSecondPerGpu of a run: a slow first quarter (compile, warm-up), then ``ratio`` times
    the plan's, within 1%."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    predicted = plan.estimates.tokens_per_second_per_gpu
    data = []
    for i in range(minutes):
        value = predicted * (0.2 if i < minutes // 4 else ratio * (1 + 0.01 * ((i % 3) - 1)))
        data.append(
            {
                "MetricName": catalogue.TOKENS_PER_SECOND_PER_GPU.name,
                "Dimensions": [{"Name": "Recipe", "Value": plan.name}],
                "Value": value,
                "Timestamp": now - timedelta(minutes=minutes - i),
            }
        )
    client("cloudwatch", endpoint).put_metric_data(Namespace=catalogue.NAMESPACE, MetricData=data)


def invoke(*args):
    return RUNNER.invoke(app, [str(a) for a in args], prog_name="tiered-training")


def schema_checked(result, code: int) -> dict:
    """calibrate's JSON, checked against docs/schemas/calibrate.schema.json, ``ok == (exit_code == 0)``."""
    import jsonschema
    from support import ROOT

    assert result.exit_code == code, result.output
    data = json.loads(result.stdout)
    jsonschema.Draft202012Validator(json.loads((ROOT / "docs/schemas/calibrate.schema.json").read_text())).validate(data)
    assert data["ok"] is (code == 0) and data["exit_code"] == code
    return data


def test_an_overlay_from_the_accounts_runs_is_stored_cached_and_cited(endpoint, tmp_path):
    a, plan_a = deployed(tmp_path, "cal-a", endpoint)
    b, plan_b = deployed(tmp_path, "cal-b", endpoint)
    ran(endpoint, plan_a, 0.88)
    ran(endpoint, plan_b, 0.90)
    result = invoke("calibrate", a, b, "--from-runs", "--endpoint-url", endpoint)
    assert result.exit_code == 0, result.output
    assert "calibrated with 2 runs of this account" in result.output
    assert "leave-one-run-out error: median" in result.output
    stored = json.loads(client("s3", endpoint).get_object(Bucket="tt-store", Key=store_key("cal-a"))["Body"].read())
    # each recipe's own overlay, in its store, written by its operators
    assert client("s3", endpoint).get_object(Bucket="tt-store", Key=store_key("cal-b"))["Body"].read() == (
        json.dumps(stored, indent=1, sort_keys=True) + "\n"
    ).encode()
    factor = stored["factors"][f"{plan_a.instance.name}/bf16"]
    assert factor == pytest.approx(0.89, abs=0.01)
    planned = invoke("plan", a, "--format", "json")
    assert planned.exit_code == 0, planned.output
    estimates = (
        json.loads(planned.output)["plans"][0]["estimates"]
        if "plans" in json.loads(planned.output)
        else json.loads(planned.output)["estimates"]
    )
    assert "calibrated with 2 runs of this account" in estimates["throughput_source"]
    assert estimates["tokens_per_second_per_gpu"] == pytest.approx(
        factor * plan_a.estimates.tokens_per_second_per_gpu, rel=0.001
    )


def estimated(output: str) -> float:
    data = json.loads(output)
    return (data["plans"][0] if "plans" in data else data)["estimates"]["tokens_per_second_per_gpu"]


def test_a_recipe_plans_with_its_own_overlay_only_and_the_old_one_is_named(endpoint, tmp_path):
    """Another recipe's overlay does not change this recipe's plan; the account-wide overlay of earlier versions is
    not read, and plan says what to do about it."""
    from tiered_training.planning.overlay import cache_path

    path, plan = deployed(tmp_path, "cal-own", endpoint)
    shipped = plan.estimates.tokens_per_second_per_gpu
    other = {"version": 1, "factors": {f"{plan.instance.name}/bf16": 0.7}, "runs": {f"{plan.instance.name}/bf16": 2},
             "count": 2, "leave_one_out": {"median": 0.01, "worst": 0.02, "shipped_median": 0.3, "shipped_worst": 0.3}}
    cache_path("cal-other").parent.mkdir(parents=True, exist_ok=True)
    cache_path("cal-other").write_text(json.dumps(other))
    legacy = cache_path("cal-own").parents[2] / "overlay.json"
    legacy.write_text(json.dumps(other))
    planned = invoke("plan", path, "--format", "json")
    assert planned.exit_code == 0, planned.output
    assert estimated(planned.stdout) == pytest.approx(shipped)
    assert f"{legacy} (one overlay for every recipe) is no longer read" in planned.stderr
    assert "tiered-training calibrate cal-own --from-runs" in planned.stderr
    cache_path("cal-own").parent.mkdir(parents=True, exist_ok=True)
    cache_path("cal-own").write_text(json.dumps(other))
    planned = invoke("plan", path, "--format", "json")
    assert estimated(planned.stdout) == pytest.approx(0.7 * shipped, rel=1e-3)
    assert "no longer read" not in planned.stderr


def test_an_absurd_overlay_is_refused_with_the_reason(endpoint, tmp_path):
    path, plan = deployed(tmp_path, "cal-broken", endpoint)
    ran(endpoint, plan, 0.3)
    result = invoke("calibrate", path, "--from-runs", "--endpoint-url", endpoint)
    assert result.exit_code == 1, result.output
    assert "overlay refused: measured over predicted tokens/s outside 0.5-1.5" in result.output
    failed = schema_checked(invoke("calibrate", path, "--from-runs", "--endpoint-url", endpoint, "-f", "json"), 1)
    assert failed["overlay"] is None and "overlay refused" in failed["errors"][0]["message"]


def test_the_probes_candidates_are_points_of_their_own_precision(endpoint, tmp_path):
    """No full run yet: the probe's two candidates that ran are the overlay's points, the one out of memory is
    none; the output says where the points came from."""
    path, plan = deployed(tmp_path, "cal-probe", endpoint)
    assert len(plan.candidates) == 3 and {c.precision for c in plan.candidates} == {"bf16"}
    first, second, _third = (c.tokens_per_second_per_gpu for c in plan.candidates)
    sm = client("sagemaker", endpoint)
    arn = sm.start_pipeline_execution(PipelineName=plan.name)["PipelineExecutionArn"]
    test_runs.ran(arn, ("Probe", "Succeeded"), ("Train", "Executing"))
    test_runs.probe_job(endpoint, arn, best_candidate=2, candidate1_tokens_per_second=round(0.90 * first, 2),
                        candidate2_tokens_per_second=round(0.92 * second, 2), candidate3_tokens_per_second=0.0)
    result = invoke("calibrate", path, "--from-runs", "--endpoint-url", endpoint)
    assert result.exit_code == 0, result.output
    assert "calibrated with 2 runs of this account" in result.output
    assert "points: 2 from probes (one per measured candidate), 0 from full runs" in result.output
    assert "left out: cal-probe: 0 per-minute points" in result.output
    stored = json.loads(client("s3", endpoint).get_object(Bucket="tt-store", Key=store_key("cal-probe"))["Body"].read())
    assert stored["factors"] == {f"{plan.instance.name}/bf16": pytest.approx((0.90 * 0.92) ** 0.5, abs=1e-3)}
    data = schema_checked(invoke("calibrate", path, "--from-runs", "--endpoint-url", endpoint, "-f", "json"), 0)
    assert data["points"] == {"probe": 2, "run": 0}
    schema = json.loads((REPO / "docs/schemas/calibrate.schema.json").read_text())
    jsonschema.validate(data, schema)
    assert data["ok"] is True and data["exit_code"] == 0 and data["uris"] and data["overlay"]["factors"]
    # a failure has the same shape: ok false, its exit code, the errors
    refused = invoke("calibrate", path, "--endpoint-url", endpoint, "-f", "json")
    failed = json.loads(refused.stdout)
    jsonschema.validate(failed, schema)
    assert failed["ok"] is False and failed["exit_code"] == refused.exit_code == 2 and failed["errors"]
