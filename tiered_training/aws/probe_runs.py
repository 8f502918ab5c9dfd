"""The probe's measurements of an execution, against the plan's predictions, per candidate.

The Probe step's training job puts the last value of each ``PROBE`` line in its ``FinalMetricDataList``
(``DescribeTrainingJob``): per candidate ``probe:candidate{n}:tokens_per_second``,
``...:peak_allocated_fraction`` and ``...:peak_reserved_fraction``, and ``probe:best_candidate``, the one
Train runs (0: none fits). The formats are ``tiered_training.contract.metrics``'. The job comes from the
execution's steps (``ListPipelineExecutionSteps``: the Probe step's ``Metadata.TrainingJob.Arn``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tiered_training.aws.session import StartError, aws_errors
from tiered_training.contract.metrics import PROBE_BEST_CANDIDATE, PROBE_CANDIDATE_FIELDS
from tiered_training.pipeline.definition import S_PROBE

if TYPE_CHECKING:
    from tiered_training.planning.plan import Candidate

_CANDIDATE = re.compile(r"probe:candidate(\d+):(\w+)")  # probe_candidate_metric(number, field), read back
BEST = PROBE_BEST_CANDIDATE


@dataclass(frozen=True)
class Measured:
    """One candidate as the probe measured it (None: not printed, the candidate failed otherwise than OOM)."""

    number: int
    tokens_per_second_per_gpu: float | None = None
    peak_allocated_fraction: float | None = None
    peak_reserved_fraction: float | None = None


@dataclass(frozen=True)
class ProbeMeasurements:
    training_job: str
    best_candidate: int | None  # None: the job printed none (it failed); 0: none fits
    candidates: dict[int, Measured] = field(default_factory=dict)


@dataclass(frozen=True)
class CandidateComparison:
    """A candidate's prediction (the plan) and measurement (the probe), with the ratio measured/predicted."""

    number: int
    configuration: str
    predicted_tokens_per_second_per_gpu: float
    predicted_memory_fraction: float
    measured_tokens_per_second_per_gpu: float | None
    measured_peak_allocated_fraction: float | None
    measured_peak_reserved_fraction: float | None
    ratio: float | None  # measured / predicted tokens/s
    trained: bool  # the one Train runs
    predicted_range: tuple[float, float] | None = None  # the model's held-out range for its kind of run
    surprising: bool | None = None  # measured outside predicted_range (None: no range or no measurement)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def probe_job(steps: list[dict[str, Any]]) -> str | None:
    """The Probe step's training job name, from the steps as ``runs.step_summary`` gives them."""
    for step in steps:
        if step.get("name") == S_PROBE and step.get("training_job"):
            return str(step["training_job"])
    return None


def parse(job: str, final_metrics: list[dict[str, Any]]) -> ProbeMeasurements:
    """The measurements in a training job's ``FinalMetricDataList``."""
    values: dict[int, dict[str, float]] = {}
    best = None
    for metric in final_metrics:
        name, value = metric.get("MetricName", ""), metric.get("Value")
        if not isinstance(value, int | float):
            continue
        if name == BEST:
            best = int(value)
            continue
        match = _CANDIDATE.fullmatch(name)
        if match and match.group(2) in PROBE_CANDIDATE_FIELDS:
            values.setdefault(int(match.group(1)), {})[match.group(2)] = float(value)
    measured = {
        n: Measured(
            n,
            got.get("tokens_per_second"),
            got.get("peak_allocated_fraction"),
            got.get("peak_reserved_fraction"),
        )
        for n, got in sorted(values.items())
    }
    return ProbeMeasurements(job, best, measured)


def read(sm: Any, job: str) -> ProbeMeasurements:
    """The Probe job's measurements (``DescribeTrainingJob``)."""
    with aws_errors(f"describe the probe's training job {job}"):
        described = sm.describe_training_job(TrainingJobName=job)
    return parse(job, described.get("FinalMetricDataList") or [])


def read_for_steps(sm: Any, steps: list[dict[str, Any]] | None) -> tuple[ProbeMeasurements | None, str | None]:
    """(measurements, problem): none without a Probe job; a job that cannot be described is a problem, not a
    failure of the caller."""
    job = probe_job(steps or [])
    if job is None:
        return None, None
    try:
        return read(sm, job), None
    except StartError as error:
        return None, str(error)


def compare(candidates: tuple[Candidate, ...] | list[Candidate], found: ProbeMeasurements) -> list[CandidateComparison]:
    """Each of the plan's candidates with what the probe measured of it."""
    rows = []
    for c in candidates:
        m = found.candidates.get(c.number, Measured(c.number))
        tps = m.tokens_per_second_per_gpu
        rows.append(
            CandidateComparison(
                number=c.number,
                configuration=c.describe(),
                predicted_tokens_per_second_per_gpu=c.tokens_per_second_per_gpu,
                predicted_memory_fraction=c.memory_fraction,
                measured_tokens_per_second_per_gpu=tps,
                measured_peak_allocated_fraction=m.peak_allocated_fraction,
                measured_peak_reserved_fraction=m.peak_reserved_fraction,
                ratio=None if tps is None or not c.tokens_per_second_per_gpu else tps / c.tokens_per_second_per_gpu,
                trained=found.best_candidate == c.number,
                predicted_range=c.tokens_per_second_per_gpu_range,
                surprising=None if tps is None else c.surprising(tps),
            )
        )
    return rows


def lines(found: ProbeMeasurements, rows: list[CandidateComparison]) -> list[str]:
    """The comparison as text: a heading, one line per candidate, and which one Train runs."""
    out = [
        f"probe ({found.training_job}): predicted against measured, per candidate",
        f"  {'#':>2}  {'predicted':>10}  {'measured':>10}  {'ratio':>5}  {'memory':>6}  {'reserved':>8}  configuration",
    ]
    for r in rows:
        tps = r.measured_tokens_per_second_per_gpu
        measured = "-" if tps is None else f"{tps:,.0f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        reserved = "-" if r.measured_peak_reserved_fraction is None else f"{r.measured_peak_reserved_fraction:.0%}"
        mark = "  <- Train" if r.trained else ""
        if r.surprising and r.predicted_range is not None:
            low, high = r.predicted_range
            mark += f"  (surprising: outside the model's range {low:,.0f}-{high:,.0f})"
        out.append(
            f"  {r.number:>2}  {r.predicted_tokens_per_second_per_gpu:>10,.0f}  {measured:>10}  {ratio:>5}  "
            f"{r.predicted_memory_fraction:>6.0%}  {reserved:>8}  {r.configuration}{mark}"
        )
    if found.best_candidate is None:
        out.append("  the probe reported no choice (it did not finish)")
    elif found.best_candidate == 0:
        out.append("  no candidate fits under the memory limit: Train does not run")
    else:
        out.append(f"  Train runs candidate {found.best_candidate}: the fastest measured under the memory limit")
    return out
