"""Following a run: status, progress from CloudWatch metrics, logs, stop.

- **Status**: ``DescribePipelineExecution`` and ``ListPipelineExecutionSteps``.
- **Progress**: the container's EMF metrics (``tiered_training.contract.metrics``, namespace
  ``TieredTraining``, dimension ``Recipe``) through ``GetMetricData``: the step
  (``StepsCompleted``), the loss, tokens/s per GPU against the plan's, and the ETA
  from the measured tokens/s and the tokens left; the slowest GPU by its straggler score
  (``GpuStragglerScore``, dimensions Recipe, Node and Gpu: ``ListMetrics``, then its latest values).
- **Logs**: training jobs log to the group ``/aws/sagemaker/TrainingJobs``, one stream
  per host, ``<job>/algo-N-<epoch>``; the job names come from the steps' metadata.
- **Stop**: ``StopPipelineExecution``.

Every AWS call goes through :func:`tiered_training.aws.session.aws_errors`: one line, no traceback.
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TextIO

from tiered_training.aws.session import EXPIRED, TERMINAL, ExecutionResult, StartError, aws_errors
from tiered_training.contract import metrics as catalogue
from tiered_training.pipeline.definition import S_PROBE, TRAINING_STEPS
from tiered_training.text import clip

if TYPE_CHECKING:
    from tiered_training.planning.plan import Plan
    from tiered_training.recipe import Recipe

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
METRIC_PERIOD = 60
METRIC_WINDOW = timedelta(hours=3)


@dataclass(frozen=True)
class Target:
    """What a run is measured against: the recipe's name and the plan's figures."""

    recipe_name: str
    total_steps: int | None = None
    probe_steps: int | None = None
    global_batch_tokens: int | None = None
    plan_tokens_per_second_per_gpu: float | None = None
    namespace: str = catalogue.NAMESPACE

    @classmethod
    def of(
        cls, recipe: Recipe, plan: Plan | None, *, instance_count: int | None = None, max_steps: int | None = None
    ) -> Target:
        est = plan.to_dict().get("estimates") if plan is not None else None
        total = max_steps or (est or {}).get("total_steps")
        return cls(
            recipe_name=recipe.name,
            total_steps=int(total) if total else None,
            probe_steps=recipe.probe.steps,
            global_batch_tokens=recipe.budget.global_batch_tokens,
            plan_tokens_per_second_per_gpu=(est or {}).get("tokens_per_second_per_gpu"),
        )


STRAGGLER_SCORE = 0.95  # training.components.straggler.SLOW_SCORE: below it a rank is named as a straggler


@dataclass(frozen=True)
class Straggler:
    """The slowest rank by its straggler score (the fastest rank's step time over its own)."""

    host: str
    gpu: str
    score: float
    phase: str | None = None  # the phase that makes it slow (in the EMF event; not a metric)
    phase_score: float | None = None

    @classmethod
    def from_emf(cls, events: list[dict[str, Any]]) -> Straggler | None:
        """The last ``StragglerScore`` event of a job's EMF lines, or None."""
        name = catalogue.STRAGGLER_SCORE.name
        found = [e for e in events if name in e and "StragglerHost" in e]
        if not found:
            return None
        last = found[-1]
        phase_score = last.get("StragglerPhaseScore")
        return cls(
            str(last["StragglerHost"]),
            str(last.get("StragglerGpu", "")),
            float(last[name]),
            last.get("StragglerPhase"),
            float(phase_score) if phase_score is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "straggler": self.score < STRAGGLER_SCORE}

    def describe(self) -> str:
        where = f"{self.host} GPU {self.gpu}"
        if self.score >= STRAGGLER_SCORE:
            return f"none (slowest {where} at {self.score:.2f} of the fastest rank)"
        if self.phase and self.phase_score is not None:
            return f"{where}: {self.phase_score:.2f} of the fastest rank in {self.phase} (step {self.score:.2f})"
        return f"{where}: {self.score:.2f} of the fastest rank"


@dataclass
class Progress:
    """The latest training metrics of a run, and what they imply."""

    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    tokens_per_second: float | None = None
    tokens_per_second_per_gpu: float | None = None
    plan_tokens_per_second_per_gpu: float | None = None
    eta_seconds: float | None = None
    straggler: Straggler | None = None

    @property
    def of_plan(self) -> float | None:
        if self.tokens_per_second_per_gpu is None or not self.plan_tokens_per_second_per_gpu:
            return None
        return self.tokens_per_second_per_gpu / self.plan_tokens_per_second_per_gpu

    def to_dict(self) -> dict[str, Any]:
        found = {**asdict(self), "fraction_of_plan": self.of_plan}
        found["straggler"] = self.straggler.to_dict() if self.straggler else None
        return found

    def describe(self) -> str:
        parts = []
        if self.step is not None:
            parts.append(f"step {self.step:,}" + (f"/{self.total_steps:,}" if self.total_steps else ""))
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}")
        if self.tokens_per_second_per_gpu is not None:
            rate = f"{self.tokens_per_second_per_gpu:,.0f} tok/s/GPU"
            if self.of_plan is not None:
                rate += f" ({self.of_plan:.0%} of plan {self.plan_tokens_per_second_per_gpu:,.0f})"
            parts.append(rate)
        if self.eta_seconds is not None:
            parts.append(f"ETA {format_duration(self.eta_seconds)}")
        if self.straggler is not None:
            parts.append(f"straggler: {self.straggler.describe()}")
        return "  ".join(parts) if parts else "no metrics yet"


@dataclass
class Snapshot:
    arn: str
    status: str
    failure_reason: str | None
    steps: list[dict[str, Any]] | None  # None: the endpoint could not list them
    progress: Progress | None

    def result(self) -> ExecutionResult:
        return ExecutionResult(
            arn=self.arn,
            status=self.status,
            failure_reason=self.failure_reason,
            steps=self.steps or [],
            progress=self.progress.to_dict() if self.progress else None,
        )


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min"


# -- SageMaker ------------------------------------------------------------------------


def latest_execution(sm: Any, pipeline_name: str) -> str:
    with aws_errors(f"list the executions of pipeline {pipeline_name}"):
        listed = sm.list_pipeline_executions(PipelineName=pipeline_name, SortBy="CreationTime", SortOrder="Descending")
    summaries = listed.get("PipelineExecutionSummaries", [])
    if not summaries:
        raise StartError(f"pipeline {pipeline_name} has no executions (start one: tiered-training start RECIPE)")
    # The first page holds the newest; pick by start time rather than trust the order.
    newest = max(summaries, key=lambda s: s.get("StartTime") or datetime.min.replace(tzinfo=UTC))
    return newest["PipelineExecutionArn"]


def execution_steps(sm: Any, arn: str) -> list[dict[str, Any]]:
    with aws_errors("list the execution's steps"):
        pages = sm.get_paginator("list_pipeline_execution_steps").paginate(
            PipelineExecutionArn=arn, SortOrder="Ascending"
        )
        return [step for page in pages for step in page.get("PipelineExecutionSteps", [])]


def step_summary(step: dict[str, Any]) -> dict[str, Any]:
    job_arn = ((step.get("Metadata") or {}).get("TrainingJob") or {}).get("Arn")
    return {
        "name": step.get("StepName"),
        "status": step.get("StepStatus"),
        "started": _iso(step.get("StartTime")),
        "ended": _iso(step.get("EndTime")),
        "failure_reason": step.get("FailureReason"),
        "training_job": job_arn.rsplit("/", 1)[-1] if job_arn else None,
    }


def _iso(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def training_jobs(steps: list[dict[str, Any]]) -> list[str]:
    return [s["training_job"] for s in steps if s.get("training_job")]


def snapshot(
    sm: Any,
    arn: str,
    *,
    target: Target | None = None,
    cloudwatch: Any = None,
    can_list: bool = True,
    now: datetime | None = None,
) -> Snapshot:
    with aws_errors("describe the execution"):
        described = sm.describe_pipeline_execution(PipelineExecutionArn=arn)
    steps: list[dict[str, Any]] | None = None
    if can_list:
        try:
            steps = [step_summary(s) for s in execution_steps(sm, arn)]
        except StartError as error:
            if error.transient:
                raise  # throttled: the next poll lists them again
            steps = None  # no ListPipelineExecutionSteps (permissions, endpoint): the status alone
    progress = None
    if cloudwatch is not None and target is not None:
        progress = read_progress(cloudwatch, target, steps or [], since=described.get("CreationTime"), now=now)
    return Snapshot(
        arn, described.get("PipelineExecutionStatus", "Unknown"), described.get("FailureReason"), steps, progress
    )


def stop(sm: Any, arn: str) -> str:
    """Ask SageMaker to stop the execution; the status it is in afterwards."""
    with aws_errors("describe the execution"):
        status = sm.describe_pipeline_execution(PipelineExecutionArn=arn).get("PipelineExecutionStatus", "Unknown")
    if status in TERMINAL or status == "Stopping":
        return status
    with aws_errors("stop the execution"):
        sm.stop_pipeline_execution(PipelineExecutionArn=arn, ClientRequestToken=str(uuid.uuid4()))
    with aws_errors("describe the execution"):
        return sm.describe_pipeline_execution(PipelineExecutionArn=arn).get("PipelineExecutionStatus", "Stopping")


# -- CloudWatch metrics ------------------------------------------------------------------


def read_progress(
    cw: Any, target: Target, steps: list[dict[str, Any]], *, since: datetime | None = None, now: datetime | None = None
) -> Progress:
    """The latest value of each training metric for the recipe, and the ETA they imply."""
    now = now or datetime.now(UTC)
    start = now - METRIC_WINDOW
    running = [s for s in steps if s.get("name") in TRAINING_STEPS and s.get("started")]
    step_start = running[-1]["started"] if running else None
    for moment in (since, step_start):
        if isinstance(moment, str):
            moment = datetime.fromisoformat(moment)
        if isinstance(moment, datetime) and moment.tzinfo is not None and moment > start:
            start = moment - timedelta(seconds=METRIC_PERIOD)
    wanted = {
        "step": (catalogue.PROGRESS.name, "Maximum"),
        "loss": (catalogue.LOSS.name, "Average"),
        "tps": (catalogue.TOKENS_PER_SECOND.name, "Average"),
        "tps_gpu": (catalogue.TOKENS_PER_SECOND_PER_GPU.name, "Average"),
    }
    queries = [
        {
            "Id": key.replace("_", ""),
            "MetricStat": {
                "Metric": {
                    "Namespace": target.namespace,
                    "MetricName": metric,
                    "Dimensions": [{"Name": catalogue.DIMENSIONS[0], "Value": target.recipe_name}],
                },
                "Period": METRIC_PERIOD,
                "Stat": stat,
            },
            "ReturnData": True,
        }
        for key, (metric, stat) in wanted.items()
    ]
    with aws_errors("read the run's metrics from CloudWatch"):
        answer = cw.get_metric_data(
            MetricDataQueries=queries, StartTime=start, EndTime=now + timedelta(minutes=1), ScanBy="TimestampDescending"
        )
    latest: dict[str, float] = {}
    for result in answer.get("MetricDataResults", []):
        pairs = sorted(zip(result.get("Timestamps", []), result.get("Values", [])), key=lambda p: p[0])
        if pairs:
            latest[result["Id"]] = float(pairs[-1][1])
    straggler = read_straggler(cw, target, start, now)
    in_probe = bool(running) and running[-1]["name"] == S_PROBE
    total = target.probe_steps if in_probe else target.total_steps
    step = int(latest["step"]) if "step" in latest else None
    tps = latest.get("tps")
    eta = None
    if step is not None and total and tps and tps > 0 and target.global_batch_tokens:
        eta = max(0, total - step) * target.global_batch_tokens / tps
    return Progress(
        step=step,
        total_steps=total,
        loss=latest.get("loss"),
        tokens_per_second=tps,
        tokens_per_second_per_gpu=latest.get("tpsgpu"),
        plan_tokens_per_second_per_gpu=target.plan_tokens_per_second_per_gpu,
        eta_seconds=eta,
        straggler=straggler,
    )


def read_straggler(cw: Any, target: Target, start: datetime, now: datetime) -> Straggler | None:
    """The rank with the lowest latest ``GpuStragglerScore`` of the recipe (host and GPU are its dimensions)."""
    spec = catalogue.GPU_STRAGGLER_SCORE
    recipe = {"Name": catalogue.DIMENSIONS[0], "Value": target.recipe_name}
    with aws_errors("list the run's straggler metrics in CloudWatch"):
        pages = cw.get_paginator("list_metrics").paginate(
            Namespace=target.namespace, MetricName=spec.name, Dimensions=[recipe]
        )
        listed = [m for page in pages for m in page.get("Metrics", [])]
    ranks = []
    for metric in listed[:500]:  # one GetMetricData call: 500 queries (62 hosts of 8 GPUs)
        dims = {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
        if set(dims) == set(spec.dimensions):
            ranks.append((dims["Node"], dims["Gpu"], metric["Dimensions"]))
    if not ranks:
        return None
    queries = [
        {
            "Id": f"rank{index}",
            "MetricStat": {
                "Metric": {"Namespace": target.namespace, "MetricName": spec.name, "Dimensions": dims},
                "Period": METRIC_PERIOD,
                "Stat": "Minimum",
            },
            "ReturnData": True,
        }
        for index, (_, _, dims) in enumerate(ranks)
    ]
    with aws_errors("read the run's straggler scores from CloudWatch"):
        answer = cw.get_metric_data(
            MetricDataQueries=queries, StartTime=start, EndTime=now + timedelta(minutes=1), ScanBy="TimestampDescending"
        )
    scores = []
    for result in answer.get("MetricDataResults", []):
        pairs = sorted(zip(result.get("Timestamps", []), result.get("Values", [])), key=lambda p: p[0])
        if pairs and result["Id"].startswith("rank"):
            node, gpu, _ = ranks[int(result["Id"][4:])]
            scores.append((float(pairs[-1][1]), node, gpu))
    if not scores:
        return None
    score, node, gpu = min(scores)
    return Straggler(node, gpu, score)


# -- CloudWatch Logs ----------------------------------------------------------------------


def tail_logs(logs: Any, jobs: list[str], *, lines: int = 50) -> list[dict[str, Any]]:
    """The last ``lines`` log events of the jobs' streams, oldest first, each with its host."""
    events: list[dict[str, Any]] = []
    for job in jobs:
        with aws_errors(f"list the log streams of training job {job}"):
            try:
                streams = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job}/").get(
                    "logStreams", []
                )
            except logs.exceptions.ResourceNotFoundException:
                streams = []
        for stream in streams:
            name = stream["logStreamName"]
            with aws_errors(f"read log stream {name}"):
                got = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=name, limit=lines, startFromHead=False)
            host = name.split("/", 1)[1] if "/" in name else name
            events += [
                {
                    "timestamp": e.get("timestamp", 0),
                    "job": job,
                    "host": host,
                    "message": e.get("message", "").rstrip("\n"),
                }
                for e in got.get("events", [])
            ]
    events.sort(key=lambda e: e["timestamp"])
    return events[-lines:] if lines else events


def format_event(event: dict[str, Any]) -> str:
    when = datetime.fromtimestamp(event["timestamp"] / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    match = re.match(r"algo-\d+", event["host"])
    host = match.group(0) if match else event["host"]
    return f"{when} {event['job']} {host}: {clip(event['message'], 2000)}"


# -- following ---------------------------------------------------------------------------


class LineReporter:
    """For a pipe or a log: one line whenever the status, a step or the progress changes."""

    def __init__(self, out: TextIO):
        self.out = out
        self.seen: dict[str, str] = {}

    def __enter__(self) -> LineReporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def _emit(self, key: str, text: str) -> None:
        if self.seen.get(key) != text:
            self.seen[key] = text
            self.out.write(text + "\n")
            self.out.flush()

    def update(self, snap: Snapshot) -> None:
        self._emit(
            "execution",
            f"execution {snap.status}" + (f": {clip(snap.failure_reason, 300)}" if snap.failure_reason else ""),
        )
        for step in snap.steps or []:
            detail = step["status"] or ""
            if step.get("failure_reason"):
                detail += f": {clip(step['failure_reason'], 300)}"
            self._emit(f"step:{step['name']}", f"  {step['name']}: {detail}")
        if snap.progress is not None and snap.progress.step is not None:
            self._emit("progress", f"  training: {snap.progress.describe()}")

    def warn(self, text: str) -> None:
        self.seen.pop("execution", None)  # repeat the status once the error has passed
        self.out.write(f"warning: {clip(text, 400)}\n")
        self.out.flush()

    def finish(self, snap: Snapshot) -> None:
        self.out.write(
            f"{snap.status}: {snap.arn}"
            + (f" ({clip(snap.failure_reason, 300)})" if snap.failure_reason else "")
            + "\n"
        )
        self.out.flush()


class LiveReporter:
    """For a terminal: a rich live display with the execution, its steps and a progress bar of training steps."""

    def __init__(self, out: TextIO):
        import os

        from rich.console import Console
        from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        plain = bool(os.environ.get("NO_COLOR"))  # https://no-color.org: no style at all
        self.console = Console(file=out, highlight=False, markup=False, color_system=None if plain else "auto")
        self.bar = Bar(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            BarColumn(bar_width=24),
            TextColumn("{task.fields[detail]}", markup=False),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> LiveReporter:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def _task(self, key: str, description: str, detail: str, total: float | None = None, completed: float = 0) -> None:
        if key not in self.tasks:
            self.tasks[key] = self.bar.add_task(description, total=total, detail=detail)
        self.bar.update(self.tasks[key], description=description, detail=detail, total=total, completed=completed)

    def update(self, snap: Snapshot) -> None:
        self._task("execution", f"execution {snap.status}", clip(snap.failure_reason or "", 200))
        for step in snap.steps or []:
            detail = clip(step.get("failure_reason") or "", 200)
            self._task(f"step:{step['name']}", f"  {step['name']} {step['status']}", detail)
        p = snap.progress
        if p is not None and p.step is not None:
            self._task(
                "progress",
                "  training",
                p.describe(),
                total=p.total_steps,
                completed=min(p.step, p.total_steps or p.step),
            )

    def warn(self, text: str) -> None:
        self.console.print(f"warning: {clip(text, 400)}")

    def finish(self, snap: Snapshot) -> None:
        for task in self.bar.tasks:
            if task.total is None:
                self.bar.update(task.id, total=1, completed=1)
        self.bar.stop()
        self.console.print(
            f"{snap.status}: {snap.arn}" + (f" ({clip(snap.failure_reason, 300)})" if snap.failure_reason else "")
        )


class QuietReporter:
    """For ``--format json``: nothing until the end (the caller prints the result)."""

    def __enter__(self) -> QuietReporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def update(self, snap: Snapshot) -> None:
        return None

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        print(f"warning: {clip(text, 400)}", file=sys.stderr, flush=True)

    def finish(self, snap: Snapshot) -> None:
        return None


def reporter_for(out: TextIO | None = None) -> Any:
    out = out or sys.stdout
    isatty = getattr(out, "isatty", lambda: False)
    return LiveReporter(out) if isatty() else LineReporter(out)


def follow(
    sm: Any,
    arn: str,
    *,
    target: Target | None = None,
    cloudwatch: Any = None,
    poll_seconds: float = 30.0,
    timeout_seconds: float | None = None,
    reporter: Any = None,
    sleep: Callable[[float], None] = time.sleep,
    renew: Callable[[], tuple[Any, Any]] | None = None,
) -> ExecutionResult:
    """Poll an execution until it ends (or ``timeout_seconds``), reporting status, steps and progress.

    A multi-day run outlives throttling, lost connections and credentials that expire and
    are renewed: such an error (after the clients' own retries) is reported and the next
    poll, after a growing pause of at most :data:`MAX_BACKOFF` seconds, tries again. Other
    errors end the follow. After expired credentials, ``renew`` (if given) makes new
    clients, which read the credentials again (a static key renewed in ~/.aws/credentials;
    SSO and assumed roles renew themselves).
    """
    reporter = reporter or reporter_for()
    started = time.monotonic()
    can_list = True
    snap: Snapshot | None = None
    failures = 0
    with reporter:
        while True:
            try:
                snap = snapshot(sm, arn, target=target, cloudwatch=cloudwatch, can_list=can_list)
            except StartError as error:
                if not error.transient:
                    raise
                failures += 1
                if renew is not None and error.code in EXPIRED:
                    try:
                        sm, cloudwatch = renew()
                    except StartError as again:
                        _warn(reporter, f"cannot renew the AWS clients: {again}")
                pause = min(MAX_BACKOFF, max(poll_seconds, 1.0) * 2 ** min(failures - 1, 6))
                _warn(
                    reporter,
                    f"{error}; still following, next try in "
                    f"{format_duration(pause) if pause >= 60 else f'{pause:.0f} s'}",
                )
                if timeout_seconds is not None and time.monotonic() - started > timeout_seconds:
                    break
                sleep(pause)
                continue
            failures = 0
            can_list = snap.steps is not None
            reporter.update(snap)
            if snap.status in TERMINAL:
                break
            if timeout_seconds is not None and time.monotonic() - started > timeout_seconds:
                break
            sleep(poll_seconds)
        if snap is None:
            raise StartError(f"{arn}: no status could be read before the follow timed out")
        reporter.finish(snap)
    return snap.result()


MAX_BACKOFF = 600.0


def _warn(reporter: Any, text: str) -> None:
    warn = getattr(reporter, "warn", None)
    if warn is not None:
        warn(text)
    else:
        print(f"warning: {text}", file=sys.stderr, flush=True)
