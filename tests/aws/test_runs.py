"""start, status, logs, stop and start --follow against moto server on 127.0.0.1.

moto 5.2.5 (the newest release) answers ListPipelineExecutionSteps and
StopPipelineExecution with HTTP 500 (not implemented). Those two actions, and only
those, are added to moto's SageMaker responses in this process (:func:`add_missing_actions`):
the steps are what the test says ran, a stop marks the execution Stopping as SageMaker
does. moto serialises them through botocore's output shapes like every other action,
so the client parses real wire responses, and everything else (pipelines,
executions, CloudWatch metrics, CloudWatch Logs) is moto's own. botocore's Stubber was
the alternative; it would replace the HTTP layer for the whole client, so the
describe/list/metrics calls in the same poll could no longer come from moto.
"""

from __future__ import annotations

import io
import json
import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from support import free_port, json_output, moto_server, offline_aws_env, recipe_dict, write_yaml
from typer.testing import CliRunner

from tiered_training.aws.runs import LOG_GROUP
from tiered_training.aws.session import ParameterError
from tiered_training.aws.start import start
from tiered_training.cli.app import app
from tiered_training.contract import metrics as catalogue
from tiered_training.pipeline import definition as d
from tiered_training.planning.planner import plan_file

REGION = "us-east-1"
ACCOUNT = "123456789012"
RUNNER = CliRunner()
STEPS: dict[str, list[dict]] = {}  # execution ARN -> the steps that "ran"


def add_missing_actions(monkeypatch) -> None:
    from moto.core.responses import ActionResult
    from moto.sagemaker.responses import SageMakerResponse
    from moto.sagemaker.utils import get_pipeline_execution_from_arn

    def list_pipeline_execution_steps(self):
        arn = self._get_param("PipelineExecutionArn")
        get_pipeline_execution_from_arn(self.sagemaker_backend.pipelines, arn)  # ValidationException if unknown
        return ActionResult({"PipelineExecutionSteps": STEPS.get(arn, [])})

    def stop_pipeline_execution(self):
        arn = self._get_param("PipelineExecutionArn")
        execution = get_pipeline_execution_from_arn(self.sagemaker_backend.pipelines, arn)
        execution.pipeline_execution_status = "Stopping"
        return ActionResult({"PipelineExecutionArn": arn})

    monkeypatch.setattr(SageMakerResponse, "list_pipeline_execution_steps", list_pipeline_execution_steps, raising=False)
    monkeypatch.setattr(SageMakerResponse, "stop_pipeline_execution", stop_pipeline_execution, raising=False)


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        offline_aws_env(mp, home, REGION)
        add_missing_actions(mp)
        with moto_server() as url:
            yield url


def client(service: str, endpoint: str, region: str = REGION):
    import boto3

    return boto3.client(service, endpoint_url=endpoint, region_name=region)


def deploy(plan, endpoint: str, region: str = REGION) -> None:
    resources = d.PipelineResources(
        role_arn=f"arn:aws:iam::{ACCOUNT}:role/exec", image_uri=f"{ACCOUNT}.dkr.ecr.{region}.amazonaws.com/t:1",
        checkpoint_s3_uri="s3://tt-store/c/", output_s3_uri="s3://tt-store/o/",
    )
    client("sagemaker", endpoint, region).create_pipeline(
        PipelineName=plan.name, PipelineDefinition=d.to_json(d.build_definition(plan, resources)),
        RoleArn=f"arn:aws:iam::{ACCOUNT}:role/pipeline",
    )


@pytest.fixture(scope="module")
def recipe(endpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("recipes")
    path = write_yaml(folder / "run.yaml", recipe_dict(name="follow-me", **{"data.allowed_uris": ["s3://bucket-for-tests/tokens/", "s3://other-data/set/"]}))
    deploy(plan_file(path), endpoint)
    return path


def invoke(*args, env=None):
    return RUNNER.invoke(app, [str(a) for a in args], prog_name="tiered-training", env=env)


def executions(endpoint: str, name: str, region: str = REGION) -> list[str]:
    listed = client("sagemaker", endpoint, region).list_pipeline_executions(PipelineName=name)["PipelineExecutionSummaries"]
    return [e["PipelineExecutionArn"] for e in listed]


def moto_execution(arn: str):
    from moto.backends import get_backend
    from moto.sagemaker.utils import get_pipeline_execution_from_arn

    region = arn.split(":")[3]
    return get_pipeline_execution_from_arn(get_backend("sagemaker")[ACCOUNT][region].pipelines, arn)


def ran(arn: str, *steps: tuple[str, str], started: dict[str, datetime] | None = None) -> None:
    now = datetime.now(UTC)
    STEPS[arn] = [
        {
            "StepName": name, "StepStatus": status, "StartTime": (started or {}).get(name, now),
            "Metadata": {"TrainingJob": {"Arn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/pipelines-{arn[-12:]}-{name.lower()}"}},
        }
        for name, status in steps
    ]


def put_metrics(endpoint: str, recipe_name: str, at: datetime | None = None, **values: float) -> None:
    names = {"step": catalogue.PROGRESS, "loss": catalogue.LOSS, "tps": catalogue.TOKENS_PER_SECOND, "tps_gpu": catalogue.TOKENS_PER_SECOND_PER_GPU}
    client("cloudwatch", endpoint).put_metric_data(
        Namespace=catalogue.NAMESPACE,
        MetricData=[
            {"MetricName": names[key].name, "Dimensions": [{"Name": "Recipe", "Value": recipe_name}], "Value": value, "Timestamp": at or datetime.now(UTC)}
            for key, value in values.items()
        ],
    )


# -- start -------------------------------------------------------------------------------


def test_start_honours_aws_region_then_aws_default_region(endpoint, tmp_path):
    path = write_yaml(tmp_path / "eu.yaml", recipe_dict(name="in-eu"))
    deploy(plan_file(path), endpoint, "eu-west-1")
    result = invoke("start", path, "--no-follow", "--endpoint-url", endpoint, env={"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": REGION})
    assert result.exit_code == 0, result.output
    assert ":eu-west-1:" in result.stdout
    result = invoke("start", path, "--no-follow", "--endpoint-url", endpoint, env={"AWS_REGION": None, "AWS_DEFAULT_REGION": "eu-west-1"})
    assert result.exit_code == 0, result.output
    assert len(executions(endpoint, "in-eu", "eu-west-1")) == 2
    # No region anywhere: the one plan priced in (the price catalogue's default).
    deploy(plan_file(path), endpoint, "us-east-1")
    result = invoke("start", path, "--no-follow", "--endpoint-url", endpoint, env={"AWS_REGION": None, "AWS_DEFAULT_REGION": None})
    assert result.exit_code == 0, result.output
    assert ":us-east-1:" in result.stdout
    assert len(executions(endpoint, "in-eu", "us-east-1")) == 1


def test_start_checks_its_parameters_before_any_call(endpoint, recipe):
    before = executions(endpoint, "follow-me")
    result = invoke("start", recipe, "--endpoint-url", endpoint, "--max-steps", "-5", "--instance-count", "0", "--data-uri", "not-a-uri")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(word in lines[0] for word in ("--max-steps -5", "--instance-count 0", "--data-uri 'not-a-uri'"))
    outside = invoke("start", recipe, "--endpoint-url", endpoint, "--data-uri", "s3://someone-else/data/")
    assert outside.exit_code == 2 and "data.allowed_uris" in outside.stderr
    assert executions(endpoint, "follow-me") == before

    with pytest.raises(ParameterError):
        start(recipe, max_steps=0, client=object(), follow=False)


def test_start_passes_an_allowed_data_uri(endpoint, recipe):
    result = invoke("start", recipe, "--no-follow", "--endpoint-url", endpoint, "--data-uri", "s3://other-data/set/part-2/", "--max-steps", "7")
    assert result.exit_code == 0, result.output
    arn = result.stdout.strip()
    parameters = client("sagemaker", endpoint).list_pipeline_parameters_for_execution(PipelineExecutionArn=arn)["PipelineParameters"]
    assert {"Name": "DataUri", "Value": "s3://other-data/set/part-2/"} in parameters
    assert {"Name": "MaxSteps", "Value": "7"} in parameters


def test_endpoint_errors_are_one_line(endpoint, recipe, tmp_path):
    cases = [
        (("--endpoint-url", "not a url"), 2, "not an http(s) URL"),
        (("--endpoint-url", f"http://127.0.0.1:{free_port()}"), 1, "Could not connect"),
    ]
    for args, code, words in cases:
        result = invoke("start", recipe, "--no-follow", *args)
        assert result.exit_code == code, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], lines
        assert result.exception is None or isinstance(result.exception, SystemExit)
    unknown = write_yaml(tmp_path / "unknown.yaml", recipe_dict(name="never-deployed"))
    result = invoke("start", unknown, "--no-follow", "--endpoint-url", endpoint)
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "never-deployed" in result.stderr and "cdk deploy" in result.stderr
    assert f"start pipeline never-deployed (the name: of {unknown})" in result.stderr  # which name start looked for
    for command in ("status", "logs", "stop"):
        result = invoke(command, unknown, "--endpoint-url", endpoint)
        assert result.exit_code == 1 and result.stderr.count("\n") == 1, (command, result.output)


# -- status, logs, stop --------------------------------------------------------------------


def started(endpoint: str, recipe) -> str:
    result = invoke("start", recipe, "--no-follow", "--endpoint-url", endpoint)
    assert result.exit_code == 0, result.output
    arn = result.stdout.strip()
    moto_execution(arn).pipeline_execution_status = "Executing"
    return arn


def test_status_shows_steps_jobs_and_training_progress(endpoint, recipe):
    arn = started(endpoint, recipe)
    ran(arn, ("ProbeOrSkip", "Succeeded"), ("Probe", "Succeeded"), ("Gate", "Succeeded"), ("Train", "Executing"))
    put_metrics(endpoint, "follow-me", step=120, loss=2.5, tps=64_000, tps_gpu=8_000)
    result = invoke("status", recipe, "--endpoint-url", endpoint)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert arn in out and "status: Executing" in out
    assert f"Train: Executing (pipelines-{arn[-12:]}-train)" in out
    plan = plan_file(recipe)
    total = plan.estimates.total_steps
    assert f"step 120/{total:,}" in out and "loss 2.500" in out
    share = 8_000 / plan.estimates.tokens_per_second_per_gpu
    assert f"8,000 tok/s/GPU ({share:.0%} of plan" in out and "ETA" in out

    data = json_output("status", invoke("status", recipe, "--endpoint-url", endpoint, "-f", "json", "--execution", arn).stdout)
    assert data["status"] == "Executing" and data["progress"]["step"] == 120
    expected_eta = (total - 120) * plan.recipe.budget.global_batch_tokens / 64_000
    assert data["progress"]["eta_seconds"] == pytest.approx(expected_eta)
    assert data["steps"][-1]["training_job"] == f"pipelines-{arn[-12:]}-train"


def test_status_names_the_slowest_gpu_by_its_straggler_score(endpoint, recipe):
    """Each rank's GpuStragglerScore (dimensions Recipe, Node, Gpu), as the container's rank 0 publishes them."""
    arn = started(endpoint, recipe)
    ran(arn, ("ProbeOrSkip", "Succeeded"), ("Probe", "Succeeded"), ("Gate", "Succeeded"), ("Train", "Executing"))
    put_metrics(endpoint, "follow-me", step=130, loss=2.4, tps=64_000, tps_gpu=8_000)
    scores = {("algo-1", "0"): 1.0, ("algo-1", "1"): 0.98, ("algo-2", "0"): 0.97, ("algo-2", "1"): 0.81}
    client("cloudwatch", endpoint).put_metric_data(
        Namespace=catalogue.NAMESPACE,
        MetricData=[
            {"MetricName": catalogue.GPU_STRAGGLER_SCORE.name, "Value": score, "Timestamp": datetime.now(UTC),
             "Dimensions": [{"Name": "Recipe", "Value": "follow-me"}, {"Name": "Node", "Value": node},
                            {"Name": "Gpu", "Value": gpu}]}
            for (node, gpu), score in scores.items()
        ],
    )
    result = invoke("status", recipe, "--endpoint-url", endpoint, "--execution", arn)
    assert result.exit_code == 0, result.output
    assert "straggler: algo-2 GPU 1: 0.81 of the fastest rank" in result.stdout
    data = json_output("status", invoke("status", recipe, "--endpoint-url", endpoint, "-f", "json", "--execution", arn).stdout)
    assert data["progress"]["straggler"] == {"host": "algo-2", "gpu": "1", "score": 0.81, "phase": None,
                                             "phase_score": None, "straggler": True}


def probe_job(endpoint: str, arn: str, **metrics: float) -> str:
    """The execution's Probe job in moto, its FinalMetricDataList the given ``probe:...`` values
    (``candidate2_tokens_per_second`` is ``probe:candidate2:tokens_per_second``)."""
    from moto.backends import get_backend

    name = f"pipelines-{arn[-12:]}-probe"
    client("sagemaker", endpoint).create_training_job(
        TrainingJobName=name, RoleArn=f"arn:aws:iam::{ACCOUNT}:role/exec",
        AlgorithmSpecification={"TrainingImage": f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/t:1", "TrainingInputMode": "File"},
        OutputDataConfig={"S3OutputPath": "s3://tt-store/o/"},
        ResourceConfig={"InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": 1, "VolumeSizeInGB": 100},
        StoppingCondition={"MaxRuntimeInSeconds": 7200},
    )
    job = get_backend("sagemaker")[ACCOUNT][REGION].training_jobs[name]
    job.final_metric_data_list = [
        {"MetricName": "probe:" + key.replace("_", ":", 1) if key.startswith("candidate") else "probe:" + key,
         "Value": value, "Timestamp": datetime.now(UTC)}
        for key, value in metrics.items()
    ]
    return name


def test_status_shows_each_probe_candidate_predicted_against_measured(endpoint, recipe):
    plan = plan_file(recipe)
    assert len(plan.candidates) == 3
    first, second, third = (c.tokens_per_second_per_gpu for c in plan.candidates)
    arn = started(endpoint, recipe)
    ran(arn, ("Probe", "Succeeded"), ("Gate", "Succeeded"), ("Train", "Executing"))
    job = probe_job(endpoint, arn, best_candidate=2,
                    candidate1_tokens_per_second=round(first * 0.5, 2), candidate1_peak_allocated_fraction=0.5,
                    candidate1_peak_reserved_fraction=0.6,
                    candidate2_tokens_per_second=round(second * 1.1, 2), candidate2_peak_allocated_fraction=0.4,
                    candidate2_peak_reserved_fraction=0.45)  # candidate 3 failed: it printed nothing
    result = invoke("status", recipe, "--endpoint-url", endpoint, "--execution", arn)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    at = lines.index(f"probe ({job}): predicted against measured, per candidate")
    one, two, three = lines[at + 2:at + 5]
    assert one.split()[:5] == ["1", f"{first:,.0f}", f"{first * 0.5:,.0f}", "0.50", f"{plan.candidates[0].memory_fraction:.0%}"]
    assert "60%" in one and not one.endswith("<- Train")
    assert two.split()[3] == "1.10" and two.endswith("<- Train")
    assert three.split()[:4] == ["3", f"{third:,.0f}", "-", "-"]
    assert lines[at + 5] == "  Train runs candidate 2: the fastest measured under the memory limit"

    data = json_output("status", invoke("status", recipe, "--endpoint-url", endpoint, "--execution", arn, "-f", "json").stdout)
    probe = data["probe"]
    assert probe["training_job"] == job and probe["best_candidate"] == 2
    assert [c["trained"] for c in probe["candidates"]] == [False, True, False]
    assert probe["candidates"][1]["ratio"] == pytest.approx(1.1, rel=1e-4)
    assert probe["candidates"][0]["measured_peak_reserved_fraction"] == 0.6
    assert probe["candidates"][2]["measured_tokens_per_second_per_gpu"] is None


def test_status_without_the_probe_job_says_so_in_a_line(endpoint, recipe):
    arn = started(endpoint, recipe)
    ran(arn, ("Probe", "Failed"))  # no such job in moto: DescribeTrainingJob refuses
    result = invoke("status", recipe, "--endpoint-url", endpoint, "--execution", arn)
    assert result.exit_code == 0, result.output
    assert "probe: cannot read its measurements: " in result.stdout
    assert "Traceback" not in result.output


def test_explain_run_shows_a_runs_probe_by_run_id_or_execution(endpoint, recipe):
    arn = started(endpoint, recipe)
    ran(arn, ("Probe", "Succeeded"))
    job = probe_job(endpoint, arn, best_candidate=0, candidate1_tokens_per_second=0.0,
                    candidate1_peak_allocated_fraction=1.0, candidate1_peak_reserved_fraction=1.0)
    by_id = invoke("explain", recipe, "--run", arn.rsplit("/", 1)[-1], "--endpoint-url", endpoint, "--region", REGION)
    assert by_id.exit_code == 0, by_id.output
    assert f"probe ({job}): predicted against measured, per candidate" in by_id.stdout
    assert "no candidate fits under the memory limit: Train does not run" in by_id.stdout
    assert by_id.stdout.index("Probe candidates (") < by_id.stdout.index(f"probe ({job})")
    data = json_output("explain", invoke("explain", recipe, "--run", arn, "--endpoint-url", endpoint, "-f", "json").stdout)
    assert data["execution_arn"] == arn and data["probe"]["best_candidate"] == 0
    assert data["probe"]["candidates"][0]["ratio"] == 0.0
    unknown = invoke("explain", recipe, "--run", "nosuchrun", "--endpoint-url", endpoint, "--region", REGION)
    assert unknown.exit_code != 0 and "--run nosuchrun: pipeline follow-me has no execution with that id" in unknown.output
    assert "Traceback" not in unknown.output


def test_logs_tail_the_training_jobs_streams(endpoint, recipe):
    arn = started(endpoint, recipe)
    ran(arn, ("Probe", "Succeeded"), ("Train", "Executing"))
    logs = client("logs", endpoint)
    try:
        logs.create_log_group(logGroupName=LOG_GROUP)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    base = int(time.time() * 1000)
    for offset, job in ((-100_000, f"pipelines-{arn[-12:]}-probe"), (0, f"pipelines-{arn[-12:]}-train")):
        for host in (1, 2):
            stream = f"{job}/algo-{host}-1700000000"
            logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
            events = [{"timestamp": base + offset + i * 10 + host, "message": f"{job} host {host} line {i} [not markup]"} for i in range(5)]
            logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=events)
    result = invoke("logs", recipe, "--endpoint-url", endpoint, "-n", "3")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3
    assert all("-train algo-" in line for line in lines) and "line 4 [not markup]" in lines[-1]
    assert "algo-2: " in lines[-1]  # the later host at the same step
    data = json_output("logs", invoke("logs", recipe, "--endpoint-url", endpoint, "-n", "100", "-f", "json").stdout)
    assert len(data["events"]) == 20 and data["log_group"] == LOG_GROUP
    assert [e["timestamp"] for e in data["events"]] == sorted(e["timestamp"] for e in data["events"])


def test_stop_stops_the_latest_execution(endpoint, recipe):
    arn = started(endpoint, recipe)
    result = invoke("stop", recipe, "--endpoint-url", endpoint)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"Stopping: {arn}"
    moto_execution(arn).pipeline_execution_status = "Stopped"
    again = invoke("stop", recipe, "--endpoint-url", endpoint, "--execution", arn, "-f", "json")
    assert json.loads(again.stdout) == {
        "schema_version": 3, "ok": True, "exit_code": 0, "errors": [], "execution_arn": arn, "status": "Stopped"
    }


# -- start --follow ------------------------------------------------------------------------


def test_follow_shows_step_loss_throughput_against_the_plan_and_eta(endpoint, tmp_path):
    plan = plan_file(write_yaml(tmp_path / "fresh.yaml", recipe_dict(name="follow-fresh")))
    deploy(plan, endpoint)
    sm, cw = client("sagemaker", endpoint), client("cloudwatch", endpoint)
    rate = plan.estimates.tokens_per_second_per_gpu
    world = {"polls": 0}

    now = datetime.now(UTC)
    # The run as minutes of it would look: created 10 min ago, the probe from -6 min, training from -90 s.
    started = {"Probe": now - timedelta(minutes=6), "Gate": now - timedelta(minutes=2), "Train": now - timedelta(seconds=90)}

    def advance(_seconds: float) -> None:
        """One poll interval of the run: the probe, then training steps, then the end."""
        world["polls"] += 1
        arn = world["arn"]
        execution = moto_execution(arn)
        n = world["polls"]
        if n == 1:
            ran(arn, ("Probe", "Executing"), started=started)
            put_metrics(endpoint, "follow-fresh", at=now - timedelta(minutes=5), step=10, loss=9.0, tps=rate * 8, tps_gpu=rate)
        elif n == 2:
            ran(arn, ("Probe", "Succeeded"), ("Gate", "Succeeded"), ("Train", "Executing"), started=started)
            put_metrics(endpoint, "follow-fresh", at=now, step=500, loss=3.25, tps=rate * 8 * 0.9, tps_gpu=rate * 0.9)
        else:
            ran(arn, ("Probe", "Succeeded"), ("Gate", "Succeeded"), ("Train", "Succeeded"), started=started)
            execution.pipeline_execution_status = "Succeeded"

    class Recording(io.StringIO):
        def write(self, text):  # the ARN is the first line; the world needs it to advance
            if "arn" not in world and "/execution/" in text:
                world["arn"] = text.strip()
                execution = moto_execution(world["arn"])
                execution.pipeline_execution_status = "Executing"
                execution.creation_time = now - timedelta(minutes=10)
            return super().write(text)

    out = Recording()
    result = start(plan, client=sm, cloudwatch=cw, poll_seconds=0, out=out, sleep=advance)
    text = out.getvalue()
    assert result.ok and world["polls"] == 3
    assert f"step 10/{plan.recipe.probe.steps}" in text  # the probe's own steps while it runs
    assert f"step 500/{plan.estimates.total_steps:,}" in text
    assert "loss 3.250" in text and f"{rate * 0.9:,.0f} tok/s/GPU (90% of plan {rate:,.0f})" in text
    assert "ETA" in text and "  Train: Executing" in text and "  Train: Succeeded" in text
    assert text.splitlines()[-1] == f"Succeeded: {result.arn}"


def test_cli_follow_json_reports_the_end_state(endpoint, recipe):
    result = invoke("start", recipe, "--endpoint-url", endpoint, "--poll-seconds", "0", "-f", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["status"] == "Succeeded" and data["execution_arn"].startswith("arn:aws:sagemaker:")


def test_status_lists_the_recipes_runs_and_their_last_checkpoints(endpoint, recipe):
    """Two runs in the store (one with a stale copy under a higher name, which its manifest step unmasks) and one
    without a committed checkpoint: listed with the last checkpoint by manifest step, newest commit first."""
    s3 = client("s3", endpoint)
    s3.create_bucket(Bucket="tt-store")

    def commit(run: str, directory: str, step: int, at: float, owner: str | None = None) -> None:
        manifest = {"step": step, "committed_at": at, "world_size": 8, "files": {},
                    "run": {"run_id": owner or run, "data_uri": "s3://bucket-for-tests/tokens/", "tokens_seen": step * 1000}}
        s3.put_object(Bucket="tt-store", Key=f"c/runs/{run}/{directory}/COMMITTED", Body=json.dumps(manifest).encode())

    commit("aaa111", "step-4", 4, 100.0)
    commit("aaa111", "step-6", 6, 200.0)
    commit("aaa111", "step-99", 2, 50.0)  # a stale copy of step 2 under a higher name
    commit("aaa111", "step-30", 30, 400.0, owner="bbb222")  # a copy of another run's checkpoint: the trainer skips it
    commit("bbb222", "step-3", 3, 300.0)
    s3.put_object(Bucket="tt-store", Key="c/runs/ccc333/step-2/__0_0.distcp", Body=b"x")  # a save that never committed
    started(endpoint, recipe)
    result = invoke("status", recipe, "--endpoint-url", endpoint)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    at = lines.index("runs (s3://tt-store/c/runs/; resume one with `start --resume RUN`):")
    assert lines[at + 1:at + 4] == [
        "  bbb222: last checkpoint step 3, 3,000 tokens, data s3://bucket-for-tests/tokens/ (1 kept)",
        "  aaa111: last checkpoint step 6, 6,000 tokens, data s3://bucket-for-tests/tokens/ (2 kept)",
        "  ccc333: no committed checkpoint",
    ]
    data = json.loads(invoke("status", recipe, "--endpoint-url", endpoint, "-f", "json").stdout)
    assert data["runs_uri"] == "s3://tt-store/c/runs/" and [r["run_id"] for r in data["runs"]] == ["bbb222", "aaa111", "ccc333"]


def test_start_resume_checks_the_run_in_the_store_before_starting(endpoint, recipe):
    """A run that is not in the store, or other data than the run's, is refused before StartPipelineExecution."""
    s3 = client("s3", endpoint)
    sm = client("sagemaker", endpoint)
    try:
        s3.create_bucket(Bucket="tt-store")
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    manifest = {"step": 5, "committed_at": 1.0, "files": {}, "run": {"run_id": "keep5", "data_uri": "s3://bucket-for-tests/tokens/"}}
    s3.put_object(Bucket="tt-store", Key="c/runs/keep5/step-5/COMMITTED", Body=json.dumps(manifest).encode())
    before = len(executions(endpoint, "follow-me"))
    for run, data, words in (("gone9", None, "has no committed checkpoint in the store (runs that can be resumed: "),
                             ("keep5", "s3://other-data/set/", "the run trains on s3://bucket-for-tests/tokens/")):
        with pytest.raises(ParameterError, match=re.escape(words)):
            start(recipe, client=sm, s3=s3, resume=run, data_uri=data, follow=False, out=io.StringIO())
    assert len(executions(endpoint, "follow-me")) == before
    result = start(recipe, client=sm, s3=s3, resume="keep5", follow=False, out=io.StringIO())
    assert len(executions(endpoint, "follow-me")) == before + 1 and result.arn


# -- transient errors: a follow outlives them -------------------------------------------------


def stubbed_sagemaker():
    import boto3
    from botocore.config import Config
    from botocore.stub import Stubber

    sm = boto3.client("sagemaker", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x",
                      config=Config(retries={"mode": "standard", "max_attempts": 1}))
    return sm, Stubber(sm)


ARN = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:pipeline/follow-me/execution/abc123"


def described(stubber, status: str) -> None:
    stubber.add_response("describe_pipeline_execution", {"PipelineExecutionArn": ARN, "PipelineExecutionStatus": status},
                         {"PipelineExecutionArn": ARN})
    stubber.add_response("list_pipeline_execution_steps", {"PipelineExecutionSteps": []},
                         {"PipelineExecutionArn": ARN, "SortOrder": "Ascending"})


@pytest.mark.parametrize("code,words", [("ThrottlingException", "Rate exceeded"), ("ExpiredTokenException", "credentials have expired")])
def test_follow_survives_a_throttle_or_expired_credentials_and_keeps_following(code, words):
    from tiered_training.aws import runs

    sm, stubber = stubbed_sagemaker()
    described(stubber, "Executing")
    stubber.add_client_error("describe_pipeline_execution", service_error_code=code, service_message="Rate exceeded" if "Thrott" in code else "expired", http_status_code=400)
    described(stubber, "Succeeded")
    out, pauses = io.StringIO(), []
    with stubber:
        result = runs.follow(sm, ARN, poll_seconds=5, reporter=runs.LineReporter(out), sleep=pauses.append)
        stubber.assert_no_pending_responses()
    assert result.status == "Succeeded"
    lines = out.getvalue().splitlines()
    warning = next(line for line in lines if line.startswith("warning: "))
    assert code in warning and words in warning and "still following" in warning
    assert lines.index(warning) < lines.index("execution Succeeded")
    assert pauses == [5, 5]  # the poll, then the pause after the error (at least the poll interval)


def test_follow_stops_on_an_error_that_will_not_pass():
    from tiered_training.aws import runs
    from tiered_training.aws.session import StartError

    sm, stubber = stubbed_sagemaker()
    stubber.add_client_error("describe_pipeline_execution", service_error_code="AccessDeniedException", http_status_code=400)
    with stubber, pytest.raises(StartError, match="AccessDenied"):
        runs.follow(sm, ARN, poll_seconds=0, reporter=runs.LineReporter(io.StringIO()), sleep=lambda s: None)


def test_every_client_uses_the_standard_retry_mode(monkeypatch):
    from tiered_training.aws.session import aws_client

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    for service in ("sagemaker", "cloudwatch", "logs"):
        client = aws_client(service, region=REGION)
        assert client.meta.config.retries["mode"] == "standard"


def test_no_client_in_the_package_leaves_the_retry_mode_to_chance():
    import re as regex
    from pathlib import Path

    import tiered_training

    root = Path(tiered_training.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        for match in regex.finditer(r"\bConfig\((.*)", text):
            assert "RETRIES" in match.group(1) or '"mode": "standard"' in match.group(1), f"{path.name}: {match.group(0)}"
        if "boto3.client(" in text or ".client(" in text and "session(" in text:
            assert "Config(" in text, path.name


def test_after_expired_credentials_the_follow_renews_its_clients():
    from tiered_training.aws import runs

    old, old_stubber = stubbed_sagemaker()
    old_stubber.add_client_error("describe_pipeline_execution", service_error_code="ExpiredTokenException", http_status_code=400)
    new, new_stubber = stubbed_sagemaker()
    described(new_stubber, "Succeeded")
    renewed = []

    def renew():
        renewed.append(True)
        return new, None

    out = io.StringIO()
    with old_stubber, new_stubber:
        result = runs.follow(old, ARN, poll_seconds=1, reporter=runs.LineReporter(out), sleep=lambda s: None, renew=renew)
        old_stubber.assert_no_pending_responses()
        new_stubber.assert_no_pending_responses()
    assert result.status == "Succeeded" and renewed == [True]
    assert "credentials have expired" in out.getvalue()


def test_start_resume_is_refused_while_another_execution_holds_the_runs_lease(endpoint, recipe):
    """A live lease in the run's prefix refuses `start --resume` before StartPipelineExecution, naming its holder's
    execution (exit 1); once it has gone stale (not renewed for STALE_SECONDS) the resume starts."""
    from tiered_training.contract import lease

    s3 = client("s3", endpoint)
    try:
        s3.create_bucket(Bucket="tt-store")
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    manifest = {"step": 4, "committed_at": 1.0, "files": {}, "run": {"run_id": "held7"}}
    s3.put_object(Bucket="tt-store", Key="c/runs/held7/step-4/COMMITTED", Body=json.dumps(manifest).encode())
    holder = lease.Holder(f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:pipeline/follow-me/execution/holder1",
                          "follow-me-Resume-holder1", "algo-1")
    taken = lease.acquire(s3, "s3://tt-store/c/runs/held7/lease.json", "held7", holder)
    before = len(executions(endpoint, "follow-me"))
    result = invoke("start", recipe, "--no-follow", "--endpoint-url", endpoint, "--resume", "held7")
    assert result.exit_code == 1, result.output
    assert "--resume held7: run held7 is held by execution arn:aws:sagemaker:" in result.stderr
    assert "execution/holder1 (training job follow-me-Resume-holder1)" in result.stderr
    assert len(executions(endpoint, "follow-me")) == before
    stale = lease.renew(s3, "s3://tt-store/c/runs/held7/lease.json", taken,
                        now=lambda: time.time() - lease.STALE_SECONDS - 1)
    assert not stale.live(time.time())
    result = invoke("start", recipe, "--no-follow", "--endpoint-url", endpoint, "--resume", "held7")
    assert result.exit_code == 0, result.output
    assert len(executions(endpoint, "follow-me")) == before + 1
