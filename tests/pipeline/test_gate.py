"""The probe gate as a decision table, run through the pipeline interpreter with stand-in probe metrics.

The Probe job prints the lines the container prints (``metrics.PROBE_METRICS`` formats); the
interpreter parses them with the step's own MetricDefinitions and evaluates the Gate and
GateReason conditions as SageMaker would. No torch, no AWS.
"""

from __future__ import annotations

import pytest
from support import recipe_dict, write_yaml

from tiered_training.contract import metrics
from tiered_training.contract.runconfig import RunConfig
from tiered_training.pipeline import definition as d
from tiered_training.planning import probe
from tiered_training.planning.planner import plan_file
from tiered_training.rehearse.interpreter import Interpreter, JobAttempt

RESOURCES = d.PipelineResources("arn:aws:iam::000000000000:role/r", "image", "s3://b/ck/", "s3://b/out")


def probe_lines(tokens: float, memory: float, best: int) -> list[str]:
    """What the container prints: each candidate's lines (the chosen one's the given figures), then the summary."""
    values = {"probe:tokens_per_second": tokens, "probe:peak_memory_fraction": memory, "probe:best_candidate": best}
    lines = []
    for number in (1, 2, 3):
        figures = (tokens, memory * 0.9, memory) if number == best else (tokens / 2, 0.5, 0.6)
        lines += [fmt.format(v) for (fmt, _), v in zip(metrics.probe_candidate_metrics(number).values(), figures)]
    return lines + [fmt.format(values[name]) for name, (fmt, _regex) in metrics.PROBE_METRICS.items()]


# the run's final metrics, as the last segment prints them (the Register step reads them)
FINAL = [(0.0, "algo-1", f"FINAL {name}=1.5") for name in metrics.final_metric_names("sft")]


class Jobs:
    """Stand-in training jobs: every job completes; the Probe prints the given metrics."""

    def __init__(self, lines: list[str]):
        self.lines, self.calls = lines, []

    def __call__(self, step, job_name, args, attempt, *, warm_from):
        self.calls.append((step, args))
        log = [(float(i), "algo-1", line) for i, line in enumerate(self.lines)] if step == d.S_PROBE else FINAL
        return JobAttempt("Completed", log=log)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    path = write_yaml(tmp_path_factory.mktemp("gate") / "gate.yaml", recipe_dict(**{"probe.min_throughput_fraction": 0.75}))
    return plan_file(path)


@pytest.fixture
def body(plan):  # per test: mutation testing sees which tests reach build_definition
    return d.build_definition(plan, RESOURCES)


def run(body, tokens, memory, best=2):
    jobs = Jobs(probe_lines(tokens, memory, best))
    execution = Interpreter(body, jobs).run({})
    return execution, [step for step, _ in jobs.calls]


def test_the_limits_come_from_the_recipe_and_the_tier(plan):
    planned = plan.estimates.tokens_per_second_per_gpu
    assert d.probe_threshold(plan) == round(0.75 * planned, 2)
    assert d.memory_limit(plan) == plan.tier.memory_headroom
    assert 0.5 < plan.tier.memory_headroom < 1


@pytest.mark.parametrize(
    "case, tokens_factor, memory_delta, outcome",
    [
        ("both pass", 1.2, -0.1, "Train"),
        ("both exactly at their limits", 1.0, 0.0, "Train"),
        ("memory too high, throughput fine", 1.2, +0.01, d.S_FAIL_MEMORY),
        ("throughput low, memory fine", 0.9, -0.1, d.S_FAIL_THROUGHPUT),
        ("throughput low and memory too high: memory first", 0.5, +0.01, d.S_FAIL_MEMORY),
    ],
)
def test_gate_decision_table(plan, body, case, tokens_factor, memory_delta, outcome):
    threshold, limit = d.probe_threshold(plan), d.memory_limit(plan)
    tokens = round(threshold * tokens_factor, 2)
    memory = round(limit + memory_delta, 4)
    execution, steps = run(body, tokens, memory)
    if outcome == "Train":
        assert execution.status == "Succeeded", (case, execution.failure)
        assert steps == [d.S_PROBE, d.S_TRAIN], case
        return
    assert execution.status == "Failed" and execution.failed_step == outcome, (case, execution.failed_step)
    assert steps == [d.S_PROBE], case  # no training job after a failed gate
    # The failure reason gives the measured value next to the limit, names the best candidate and lists them all.
    planned = round(plan.estimates.tokens_per_second_per_gpu, 2)
    listed = "; ".join(f"{c.number} = {c.describe()}" for c in plan.candidates)
    if outcome == d.S_FAIL_THROUGHPUT:
        assert execution.failure == (
            f"unit-test: probe throughput check failed: the fastest candidate under the memory limit, 2.0, measured "
            f"{tokens} tokens/s per GPU, needs at least {threshold} (0.75 x the plan's {planned}); its peak reserved "
            f"memory fraction {memory} (limit {limit}). Candidates: {listed}. Fix the recipe or rerun with "
            "SkipProbe=true.")
    else:
        assert execution.failure == (
            f"unit-test: probe memory check failed: best candidate 2.0 (0: none fits under the limit), peak reserved "
            f"memory fraction {memory} is above the limit {limit} (plan {plan.memory.fraction:.3f}); throughput "
            f"{tokens} tokens/s per GPU (needs {threshold}). Candidates: {listed}. Lower tuning.micro_batch_size or "
            "raise activation checkpointing.")


def test_the_plan_has_three_candidates_and_the_fail_messages_list_them(plan):
    assert len(plan.candidates) == 3  # tuning auto: the probe measures the three fastest that fit
    for message in (d.throughput_failure(plan), d.memory_failure(plan)):
        text = "".join(part for part in message if isinstance(part, str))
        assert all(f"{c.number} = {c.describe()}" in text for c in plan.candidates)
        assert [part.name for part in message if isinstance(part, d.ProbeMetric)].count(d.PROBE_CANDIDATE) == 1


@pytest.mark.parametrize("best", [1, 3])
def test_train_runs_the_candidate_the_probe_chose(plan, body, best):
    threshold, limit = d.probe_threshold(plan), d.memory_limit(plan)
    jobs = Jobs(probe_lines(threshold * 2, limit / 2, best))
    assert Interpreter(body, jobs).run({}).status == "Succeeded"
    (train,) = [args for step, args in jobs.calls if step == d.S_TRAIN]
    # SageMaker's metric values are floats; the container reads "3.0" as candidate 3.
    assert train["HyperParameters"]["run.candidate"] == f"{best}.0"
    cfg = RunConfig.from_hyperparameters(train["HyperParameters"])
    assert cfg.run.candidate == best
    assert cfg.with_candidate(best).batch.micro_batch_size == plan.candidates[best - 1].micro_batch_size


def test_without_the_probe_and_on_resume_the_run_keeps_its_recorded_candidate(body):
    for params, chain in (({"SkipProbe": "true"}, d.S_TRAIN_WITHOUT_PROBE), ({"RunId": "run-1"}, d.S_RESUME)):
        jobs = Jobs([])
        assert Interpreter(body, jobs).run(params).status == "Succeeded"
        (args,) = [args for step, args in jobs.calls if step == chain]
        assert RunConfig.from_hyperparameters(args["HyperParameters"]).run.candidate == 0


def test_throughput_just_below_the_threshold_fails(plan, body):
    threshold = d.probe_threshold(plan)
    execution, _ = run(body, round(threshold - 0.01, 2), 0.1)
    assert execution.failed_step == d.S_FAIL_THROUGHPUT


def test_probe_runtime_is_capped_and_train_keeps_the_recipes(tmp_path):
    # 1.5 h jobs leave time to train only with short checkpoint intervals (segments.reserve_seconds);
    # the run then takes a chain of segments, each with the recipe's runtime.
    for hours, interval in ((120.0, 30.0), (1.5, 5.0)):
        path = write_yaml(tmp_path / f"r{hours}.yaml", recipe_dict(**{
            "compute.max_runtime_hours": hours, "checkpointing.interval_minutes": interval}))
        plan = plan_file(path)
        body = d.build_definition(plan, RESOURCES)
        jobs = Jobs(probe_lines(d.probe_threshold(plan) * 2, 0.1, 2))
        assert Interpreter(body, jobs).run({}).status == "Succeeded"
        runtime = {step: args["StoppingCondition"]["MaxRuntimeInSeconds"] for step, args in jobs.calls}
        # the probe's limit covers its candidates' launches (probe_seconds), within the job runtime
        assert probe.probe_seconds(plan) < runtime[d.S_PROBE] == min(hours * 3600, d.PROBE_MAX_RUNTIME_SECONDS)
        train = d.chain_steps(body, d.S_TRAIN)
        assert len(train) == plan.segments and (plan.segments == 1) == (hours == 120.0)  # 1.5 h jobs: a chain
        assert runtime == {d.S_PROBE: runtime[d.S_PROBE], **dict.fromkeys(train, hours * 3600)}
        # every segment trains the candidate the probe chose
        assert {args["HyperParameters"]["run.candidate"] for step, args in jobs.calls if step in train} == {"2.0"}


def test_skip_probe_runs_train_without_probe_and_no_gate(body):
    jobs = Jobs([])
    execution = Interpreter(body, jobs).run({"SkipProbe": "true"})
    assert execution.status == "Succeeded"
    assert [step for step, _ in jobs.calls] == [d.S_TRAIN_WITHOUT_PROBE]


def test_step_descriptions(plan, body):
    threshold, limit = d.probe_threshold(plan), d.memory_limit(plan)
    assert d.find_step(body, d.S_GATE)["Description"] == f"Probe tokens/s per GPU >= {threshold} and peak memory fraction <= {limit}"
    assert d.find_step(body, d.S_GATE_REASON)["Description"] == (
        "Which gate check failed (memory first: nothing else matters when the model does not fit)")
    assert d.find_step(body, d.S_PROBE_OR_SKIP)["Description"] == "Skip the probe when SkipProbe is true"
