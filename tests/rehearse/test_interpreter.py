"""The pipeline interpreter on the real definitions, with stand-in training jobs (no torch)."""

from __future__ import annotations

import pytest
from support import ROOT as REPO

from tiered_training.contract import metrics
from tiered_training.contract.runconfig import RunConfig
from tiered_training.pipeline.definition import PipelineResources, build_definition, find_step
from tiered_training.planning.planner import plan_file
from tiered_training.rehearse.interpreter import Interpreter, JobAttempt, PipelineError, final_metrics
from tiered_training.rehearse.run import attempt_names

RESOURCES = PipelineResources("arn:aws:iam::000000000000:role/r", "image", "s3://b/ck/", "s3://b/out")


@pytest.fixture(scope="module")
def definition():
    # three segments under an 80-hour job limit (the interpreter's chains of Train, Train-2, Train-3)
    plan = plan_file(REPO / "recipes/qwen2.5-32b-hybrid.yaml", ["compute.max_runtime_hours=80"])
    assert plan.segments == 3
    return plan, build_definition(plan, RESOURCES)


# the run's final metrics, as the last segment prints them (the Register step reads them)
FINAL = [(0.0, "algo-1", f"FINAL {name}=1.5") for name in metrics.final_metric_names("sft")]


class Jobs:
    """Stand-in jobs: each step's attempts end as scripted; the Probe prints ``probe_lines``."""

    def __init__(self, probe_lines, script=None):
        self.probe_lines, self.script, self.calls, self.args = probe_lines, dict(script or {}), [], {}

    def __call__(self, step, job_name, args, attempt, *, warm_from):
        self.calls.append((step, attempt, warm_from))
        self.args[step] = args
        outcomes = self.script.get(step, [])
        outcome = outcomes.pop(0) if outcomes else JobAttempt("Completed", log=list(FINAL))
        if step == "Probe" and outcome.status == "Completed":
            outcome.log = [(float(i), "algo-1", line) for i, line in enumerate(self.probe_lines)]
        return outcome


def lines_of(values: dict[str, float]) -> list[str]:
    """The container's PROBE lines (the contract's formats) for the given metric values."""
    formats = metrics.probe_metric_definitions(3)
    return [formats[name][0].format(int(value) if name == "probe:best_candidate" else value)
            for name, value in values.items()]


def test_a_probe_where_nothing_fits_ends_at_fail_memory_saying_so(definition):
    plan, body = definition
    # every candidate ran out of memory: tokens 0 and fractions 1 each, and no candidate chosen
    oom = {f"probe:candidate{n}:{field}": 0.0 if field == "tokens_per_second" else 1.0
           for n in (1, 2, 3) for field in metrics.PROBE_CANDIDATE_FIELDS}
    summary = {"probe:tokens_per_second": 0.0, "probe:peak_memory_fraction": 1.0, "probe:best_candidate": 0}
    execution = Interpreter(body, Jobs(lines_of({**oom, **summary}))).run({})
    assert execution.status == "Failed" and execution.failed_step == "FailMemory"
    assert "best candidate 0.0 (0: none fits under the limit), peak reserved memory fraction 1.0 is above" in (
        execution.failure)
    assert f"Candidates: 1 = {plan.candidates[0].describe()}; 2 = " in execution.failure
    assert execution.metrics["Probe"] == {**oom, **summary}


def test_a_good_probe_runs_train_on_the_probes_warm_pool(definition):
    plan, body = definition
    lines = ["PROBE tokens_per_second=1.00", "PROBE tokens_per_second=50000.00",  # the last match counts
             "PROBE peak_memory_fraction=0.5000", "PROBE best_candidate=2"]
    jobs = Jobs(lines)
    execution = Interpreter(body, jobs).run({"InstanceCount": 2})
    assert execution.status == "Succeeded"
    # The plan's 3 segments, each on the warm pool of the job before it, each training the candidate chosen.
    assert jobs.calls == [("Probe", 1, None), ("Train", 1, "Probe"), ("Train-2", 1, "Train"), ("Train-3", 1, "Train-2")]
    for step in ("Train", "Train-2", "Train-3"):
        assert jobs.args[step]["HyperParameters"]["run.candidate"] == "2.0"
        assert RunConfig.from_hyperparameters(jobs.args[step]["HyperParameters"]).run.candidate == 2
    assert execution.metrics["Probe"]["probe:tokens_per_second"] == 50000.0
    assert find_step(body, "Probe")["Arguments"]["ResourceConfig"]["KeepAlivePeriodInSeconds"] > 0
    assert find_step(body, "Train")["Arguments"]["ResourceConfig"]["KeepAlivePeriodInSeconds"] > 0
    # The last segment takes the pool, so it asks for one too, for a minute only (nothing follows it).
    assert find_step(body, "Train-3")["Arguments"]["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 60


def test_a_job_that_sets_no_keep_alive_does_not_take_the_warm_pool(definition):
    """SageMaker matches a job to a warm pool only when the job asks for a warm pool itself."""
    import copy

    plan, body = definition
    broken = copy.deepcopy(body)
    del find_step(broken, "Train-3")["Arguments"]["ResourceConfig"]["KeepAlivePeriodInSeconds"]
    lines = ["PROBE tokens_per_second=50000.00", "PROBE peak_memory_fraction=0.5000", "PROBE best_candidate=1"]
    jobs = Jobs(lines)
    execution = Interpreter(broken, jobs).run({"InstanceCount": 2})
    assert jobs.calls[-1] == ("Train-3", 1, None)
    assert any("Train-3: cannot reuse the warm pool of Train-2: it sets no ResourceConfig.KeepAlivePeriodInSeconds"
               in e.text for e in execution.trace if e.kind == "warm-pool")


def test_a_job_refused_for_a_resource_limit_is_retried_for_a_bounded_time(definition):
    """Another execution holds the account's instances: the step waits and tries again, then gives up."""
    _, body = definition
    limit = lambda: JobAttempt("Failed", "ResourceLimitExceeded: instances in use", error="SageMaker.RESOURCE_LIMIT")  # noqa: E731
    jobs = Jobs([], {"TrainWithoutProbe": [limit(), limit()]})
    execution = Interpreter(body, jobs).run({"SkipProbe": "true"})
    retries = [e.text for e in execution.trace if e.kind == "retry"]
    assert execution.status == "Succeeded" and len(retries) == 2
    assert "SageMaker.RESOURCE_LIMIT; retry policy 2: job 2 of 4 after 1800 s" in retries[0]
    assert "job 3 of 4 after 3600 s" in retries[1]
    jobs = Jobs([], {"TrainWithoutProbe": [limit() for _ in range(4)]})
    execution = Interpreter(body, jobs).run({"SkipProbe": "true"})
    assert execution.status == "Failed" and "SageMaker.RESOURCE_LIMIT" in execution.failure
    waited = sum(float(t.rsplit("after ", 1)[1].split()[0]) for t in (e.text for e in execution.trace if e.kind == "retry"))
    assert waited == 1800 + 3600 + 7200  # bounded: the step fails after 3.5 hours of waiting


def test_a_failed_segment_ends_the_chain_and_dependson_is_kept(definition):
    """Segment 2 fails with an algorithm error: segment 3 never starts. A definition whose DependsOn names a step
    that has not run before it is refused rather than run out of order."""
    import copy

    _, body = definition
    jobs = Jobs([], {"TrainWithoutProbe-2": [JobAttempt("Failed", "loss is NaN")]})
    execution = Interpreter(body, jobs).run({"SkipProbe": "true"})
    assert execution.status == "Failed" and execution.failed_step == "TrainWithoutProbe-2"
    assert [c[0] for c in jobs.calls] == ["TrainWithoutProbe", "TrainWithoutProbe-2"]
    broken = copy.deepcopy(body)
    find_step(broken, "TrainWithoutProbe-2")["DependsOn"] = ["TrainWithoutProbe-3"]
    with pytest.raises(PipelineError, match="DependsOn TrainWithoutProbe-3, which has not succeeded"):
        Interpreter(broken, Jobs([])).run({"SkipProbe": "true"})


def test_the_execution_id_names_a_new_run_and_runid_resumes_one(definition):
    _, body = definition
    seen = []

    def jobs(step, job_name, args, attempt, *, warm_from):
        seen.append((step, args["CheckpointConfig"]["S3Uri"], args["HyperParameters"]["run.id"]))
        return JobAttempt("Completed", log=list(FINAL))

    Interpreter(body, jobs, execution_id="abc123def456").run({"SkipProbe": "true"})
    Interpreter(body, jobs, execution_id="fff000fff000").run({"RunId": "abc123def456"})
    assert {uri for _, uri, _ in seen} == {"s3://b/ck/runs/abc123def456/"}
    assert {run for _, _, run in seen} == {'"abc123def456"'}
    assert [step for step, _, _ in seen][3:] == ["Resume", "Resume-2", "Resume-3"]


def test_retry_strategy_then_retry_policy(definition):
    _, body = definition
    lost = lambda: JobAttempt("Failed", "algo-2 was lost", internal=True)  # noqa: E731
    jobs = Jobs([], {"TrainWithoutProbe": [lost() for _ in range(4)] + [JobAttempt("Interrupted", "spot")]})
    execution = Interpreter(body, jobs).run({"SkipProbe": "true"})
    restarts = [e.text for e in execution.trace if e.kind == "restart"]
    retries = [e.text for e in execution.trace if e.kind == "retry"]
    assert len(restarts) == 4 and "RetryStrategy starts it again (0 retries left)" in restarts[2]
    assert "interrupted (spot)" in restarts[3]
    assert len(retries) == 1 and "SageMaker.JOB_INTERNAL_ERROR; retry policy 1: job 2 of 5 after 300 s" in retries[0]
    assert execution.status == "Succeeded"
    # The second job's attempts continue the step's count: "TrainWithoutProbe attempt N" names one attempt, in the
    # trace (the runner's and the restarts' lines) and in the summary (attempt_names).
    numbers = [attempt for step, attempt, _ in jobs.calls if step == "TrainWithoutProbe"]
    assert numbers == list(range(1, 7)) and len(execution.jobs["TrainWithoutProbe"]) == 6
    assert [name for name, _ in attempt_names(execution)][:6] == [f"TrainWithoutProbe attempt {n}" for n in numbers]
    assert [t.split(": ", 1)[1].split(" ", 2)[:2] for t in restarts] == [["attempt", str(n)] for n in (1, 2, 3, 5)]


def test_unknown_expressions_and_parameters_are_named(definition):
    _, body = definition
    with pytest.raises(PipelineError, match="unknown parameter"):
        Interpreter(body, Jobs([])).run({"Nope": 1})
    broken = {**body, "Steps": [{"Name": "X", "Type": "Fail", "Arguments": {"ErrorMessage": {"Std:Format": "x"}}}]}
    with pytest.raises(PipelineError, match="Std:Format"):
        Interpreter(broken, Jobs([])).run({})
    missing = Interpreter(body, Jobs(["PROBE tokens_per_second=9.0", "PROBE best_candidate=1"]))
    with pytest.raises(PipelineError, match="probe:peak_memory_fraction.*unresolved"):
        missing.run({})


def test_final_metrics_take_the_last_match_in_time_order():
    definitions = [{"Name": "m", "Regex": r"m=([0-9.]+)"}]
    log = [(2.0, "algo-2", "m=2"), (1.0, "algo-1", "m=1"), (3.0, "algo-1", "nothing")]
    assert final_metrics(definitions, log) == {"m": 2.0}


class Processing(Jobs):
    """Jobs, and a processing job that writes ``files`` into its outputs' directories."""

    def __init__(self, tmp_path, files):
        super().__init__([])
        self.tmp_path, self.files = tmp_path, files

    def process(self, step, job_name, args):
        outputs = {}
        for output in args["ProcessingOutputConfig"]["Outputs"]:
            local = self.tmp_path / output["OutputName"]
            local.mkdir(exist_ok=True)
            for name, text in self.files.items():
                (local / name).write_text(text)
            outputs[output["OutputName"]] = str(local)
        self.calls.append((step, args["AppSpecification"]["ContainerArguments"][1]))
        return JobAttempt("Completed", detail={"outputs": outputs})


def test_a_processing_steps_property_file_feeds_json_get_in_later_steps(tmp_path):
    plan = plan_file(REPO / "recipes/llama3.1-8b-tools-sft.yaml")
    body = build_definition(plan, RESOURCES)
    jobs = Processing(tmp_path, {"prepared.json": '{"key": "k", "uri": "s3://b/out/prepared/k/train/", "reused": true}'})
    execution = Interpreter(body, jobs).run({"SkipProbe": True, "DataUri": "s3://raw/x/"})
    assert execution.status == "Succeeded", execution.failure
    assert jobs.calls[0] == ("Prepare", "s3://raw/x/") and jobs.calls[1][0] == "TrainWithoutProbe"
    assert execution.property_files["Prepare"]["PreparedData"]["uri"] == "s3://b/out/prepared/k/train/"

    missing = Processing(tmp_path / "none", {})
    (tmp_path / "none").mkdir()
    execution = Interpreter(body, missing).run({"SkipProbe": True})
    assert execution.status == "Failed" and execution.failed_step == "Prepare" and "PreparedData" in execution.failure
    without_uri = Processing(tmp_path / "other", {"prepared.json": '{"key": "k"}'})
    (tmp_path / "other").mkdir()
    with pytest.raises(PipelineError, match="property file PreparedData of step Prepare has no 'uri'"):
        Interpreter(body, without_uri).run({"SkipProbe": True})


class Registering(Jobs):
    """Stand-in jobs with a model registry: records each CreateModelPackage request."""

    def __init__(self, *args, refuse: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.requests, self.refuse = [], refuse

    def register(self, step, args):
        if self.refuse:
            raise ValueError(self.refuse)
        self.requests.append((step, args))
        return f"arn:aws:sagemaker:us-east-1:000000000000:model-package/{args['ModelPackageGroupName']}/{len(self.requests)}"


def test_the_register_step_sends_the_rendered_package_after_the_last_segment(definition):
    plan, body = definition
    jobs = Registering([])
    execution = Interpreter(body, jobs, execution_id="abc123def456").run({"SkipProbe": "true"})
    assert execution.status == "Succeeded", execution.failure
    ((step, request),) = jobs.requests
    assert step == "RegisterWithoutProbe" and [c[0] for c in jobs.calls][-1] == "TrainWithoutProbe-3"
    job = execution.jobs["TrainWithoutProbe-3"][-1]
    assert request["InferenceSpecification"]["Containers"][0]["ModelDataUrl"] == execution.artifacts["TrainWithoutProbe-3"]
    assert execution.artifacts["TrainWithoutProbe-3"].startswith("s3://b/out/model/pipelines-abc123def456-")
    assert job.status == "Completed"
    meta = request["CustomerMetadataProperties"]
    assert meta["run_id"] == "abc123def456" and meta["train:loss"] == "1.5"
    assert request["ModelMetrics"]["ModelQuality"]["Statistics"]["S3Uri"] == "s3://b/ck/runs/abc123def456/evaluation.json"
    assert execution.packages["RegisterWithoutProbe"]["arn"].endswith(f"/{plan.name}/1")


def test_a_register_step_fails_without_its_final_metrics_or_when_refused(definition):
    _, body = definition
    silent = Registering([], {"TrainWithoutProbe-3": [JobAttempt("Completed")]})  # printed no FINAL line
    with pytest.raises(PipelineError, match="FinalMetricDataList\\['train:loss'\\].*is unresolved"):
        Interpreter(body, silent).run({"SkipProbe": "true"})
    refused = Registering([], refuse="ValidationException: no such group")
    execution = Interpreter(body, refused).run({"SkipProbe": "true"})
    assert execution.status == "Failed" and execution.failed_step == "RegisterWithoutProbe"
    assert "CreateModelPackage failed: ValidationException: no such group" in execution.failure
