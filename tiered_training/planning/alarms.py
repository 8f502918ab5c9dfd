"""Alarms fitted to the plan: each alarm's period, datapoints and threshold, and the time it takes to fire.

Pure (no aws_cdk): the constructs build their CloudWatch alarms from :func:`fit_alarms`,
the CLI reads :func:`routing_findings`, and the tests check the stated times against a
CloudWatch alarm evaluator fed with the container's own EMF lines.

What the fit starts from:

- ``C``, the container's cadence (``RunConfig.metrics.interval_seconds``, 60 s): one job
  event a minute while steps end, a heartbeat a minute while none does;
- ``T``, the plan's step time (``plan.estimates.step_time_seconds``): a step longer than
  ``C`` reports at its end, so step metrics arrive every ``D = max(T, C)``;
- the pauses of a healthy run: a blocking checkpoint save (at most the recipe's
  ``checkpointing.shutdown_deadline_seconds``, the time a save must fit in anyway) and a
  validation pass.

Every alarm on the container's metrics uses one **window** ``W = max(5 min, 2D + C)``,
in whole minutes: a healthy run, and one at half its planned speed, puts at least one
datapoint into every window, so ``1 of 1`` datapoints with missing data *not breaching*
fires on the first window that breaches and never on the silence before, between and
after runs (the probe, spot waits, a finished or shortened run). The stall alarm needs
the heartbeat instead: its window is the stall time, widened to the longest healthy pause.

The times a condition takes to fire (``fires_within_seconds``) are stated per alarm and
checked for every template in ``tests/constructs/test_alarm_evaluation.py``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tiered_training.contract import metrics as catalogue

if TYPE_CHECKING:
    from tiered_training.planning.plan import Finding, Plan

MINUTE = 60
MIN_WINDOW_SECONDS = 5 * MINUTE
NAN_LOSS = 1.0e9  # what a step with a NaN loss counts as in the loss alarm's expression
EVALUATION_SECONDS = MINUTE  # CloudWatch evaluates a standard-resolution alarm every minute
STALL_COVERAGE = 0.75  # share of the stall window the heartbeat must cover (the run was alive)

THROUGHPUT = "ThroughputBelowPlan"
GPU_UTILIZATION = "GpuUtilizationLow"
MEMORY = "MemoryNearlyFull"
LOSS = "LossDiverging"
VALIDATION = "ValidationLossDiverging"
STALLED = "Stalled"
EXECUTION_FAILED = "ExecutionFailed"
STRAGGLER = "Straggler"
GPU_FAULT = "GpuFault"
GPU_SLOWDOWN = "GpuSlowdown"
# The slowest rank's straggler score (the fastest rank's step time over its own) below which a whole window
# alarms. Healthy ranks of one plan differ by a few percent; a GPU at 0.85 of the others' speed in forward and
# backward scores about 0.86.
STRAGGLER_THRESHOLD = 0.9


def whole_minutes(seconds: float) -> int:
    """``seconds`` rounded up to whole minutes (an alarm period of 60 s or more is a multiple of 60)."""
    return int(math.ceil(seconds / MINUTE - 1e-9)) * MINUTE


@dataclass(frozen=True)
class AlarmFit:
    """One alarm: what it watches, how CloudWatch evaluates it, and how soon it fires."""

    name: str  # the construct ID
    condition: str  # what a person reads in the alarm's description
    period_seconds: int
    threshold: float
    comparison: str  # a CloudWatch ComparisonOperator
    fires_within_seconds: int  # from the condition's onset to ALARM
    evaluation_periods: int = 1
    datapoints_to_alarm: int = 1
    treat_missing_data: str = "notBreaching"  # no datapoint: no run of this recipe, not an alarm
    notifies: bool = True  # False: visible on the dashboard, another route notifies


@dataclass(frozen=True)
class AlarmPlan:
    """The fitted alarms of one plan, with the numbers they came from."""

    cadence_seconds: float
    step_seconds: float
    window_seconds: int
    stall_seconds: int
    stall_min_reports: int
    validation_seconds: float  # estimated length of one validation pass
    loss_ceiling: float
    alarms: dict[str, AlarmFit]

    def __getitem__(self, name: str) -> AlarmFit:
        return self.alarms[name]


def loss_ceiling(plan: Plan) -> float:
    """The recipe's ``monitoring.loss_ceiling``, or ln(V) + ``loss_margin``.

    ln(V) nats is the loss of a uniform guess over the vocabulary, about where a fresh
    model starts; a run above it by the margin has diverged.
    """
    mon = plan.recipe.monitoring
    if mon.loss_ceiling != "auto":
        return float(mon.loss_ceiling)
    return round(math.log(plan.architecture.vocab_size) + mon.loss_margin, 2)


def validation_seconds(plan: Plan) -> float:
    """A conservative length of one validation pass: its forward passes at half the training speed."""
    assert plan.estimates is not None
    per_micro_batch = plan.estimates.step_time_seconds / max(1, plan.grad_accum_steps)
    return plan.recipe.validation.batches * per_micro_batch / 2


def fit_alarms(plan: Plan, cadence_seconds: float = catalogue.DEFAULT_INTERVAL_SECONDS) -> AlarmPlan:
    """Every alarm of the plan's recipe, fitted to its step time and the container's cadence."""
    assert plan.estimates is not None
    recipe = plan.recipe
    mon = recipe.monitoring
    c = float(cadence_seconds)
    t = float(plan.estimates.step_time_seconds)
    d = max(t, c)
    window = whole_minutes(max(MIN_WINDOW_SECONDS, 2 * d + c))
    # A window breaches once it holds only the condition's datapoints; the step that was
    # running at the onset reports up to D later, and CloudWatch evaluates once a minute.
    window_fires = window + int(math.ceil(d)) + 2 * EVALUATION_SECONDS

    val_seconds = validation_seconds(plan)
    pause = 2 * t + recipe.checkpointing.shutdown_deadline_seconds + val_seconds
    stall = whole_minutes(max(mon.stall_minutes * MINUTE, pause))
    min_reports = max(2, int(STALL_COVERAGE * stall / c))
    # A validation pass starts at the first step boundary after its interval and is sent with
    # the next event; the window compares it with the training loss of the same few minutes.
    val_interval = recipe.validation.interval_minutes * MINUTE
    val_fires = int(math.ceil(val_interval + t + val_seconds + c)) + 2 * EVALUATION_SECONDS
    ceiling = loss_ceiling(plan)
    plan_rate = plan.estimates.tokens_per_second_per_gpu
    minutes = window // MINUTE
    # Straggler scores are gathered every few steps and published at the first gather after the cadence: one
    # datapoint at least every C + (gather steps) * T. The alarm watches the window's highest score, so it fires
    # once every score in the window is below the threshold: the slow rank stayed slow for the whole window.
    straggler_every = c + catalogue.STRAGGLER_GATHER_EVERY_STEPS * t
    straggler_window = whole_minutes(max(MIN_WINDOW_SECONDS, 2 * straggler_every + c))
    # Each GPU reports its slowdown flag every C; a period of whole minutes holds at least one report of every GPU.
    # The alarm fires when some GPU was slowed in every period of the window (a brief excursion does not).
    slowdown_period = whole_minutes(c)
    slowdown_periods = max(1, window // slowdown_period)

    alarms = [
        AlarmFit(
            THROUGHPUT,
            f"tokens/s per GPU below {mon.min_throughput_fraction:g} x the plan's {plan_rate:,.0f} over {minutes} min",
            # Rounded down (after rounding off float dust): a run at exactly the fraction of the plan does not breach.
            window,
            math.floor(round(mon.min_throughput_fraction * plan_rate * 100, 6)) / 100,
            "LessThanThreshold",
            window_fires,
        ),
        AlarmFit(
            GPU_UTILIZATION,
            f"a node's GPU utilisation during steps below {mon.min_gpu_utilization:g}% over {minutes} min",
            window,
            mon.min_gpu_utilization,
            "LessThanThreshold",
            window_fires,
        ),
        AlarmFit(
            MEMORY,
            f"a node's peak GPU memory above {mon.max_memory_fraction:.0%} of HBM",
            window,
            round(mon.max_memory_fraction * 100, 2),
            "GreaterThanThreshold",
            window_fires,
        ),
        AlarmFit(
            LOSS,
            f"training loss above {ceiling:g} or not finite",
            window,
            ceiling,
            "GreaterThanThreshold",
            window_fires,
        ),
        AlarmFit(
            STALLED,
            f"no training step for {stall // MINUTE} min while the run is alive (heartbeat)",
            stall,
            1,
            "GreaterThanOrEqualToThreshold",
            stall + 2 * EVALUATION_SECONDS + int(math.ceil(c)),
        ),
        AlarmFit(
            STRAGGLER,
            f"the slowest rank's straggler score (StragglerScore) below {STRAGGLER_THRESHOLD:g} of the fastest "
            f"rank for {straggler_window // MINUTE} min; the host is the Node dimension of the lowest "
            "HostStragglerScore (GpuStragglerScore: host and GPU; the log line and the event's StragglerHost, "
            "StragglerGpu and StragglerPhase say the same)",
            straggler_window,
            STRAGGLER_THRESHOLD,
            "LessThanThreshold",
            straggler_window + int(math.ceil(straggler_every)) + 2 * EVALUATION_SECONDS,
        ),
        AlarmFit(
            GPU_FAULT,
            f"a GPU reported a critical XID event (GpuXidErrors; its Node and Gpu dimensions name the host and GPU, "
            f"the log's gpu-health line the XID: uncorrectable ECC 48, row remapping 63/64, NVLink 74, lost GPU 79, "
            f"...) within {minutes} min",
            window,
            1,
            "GreaterThanOrEqualToThreshold",
            # counted in the GPU's next event (at most C later), seen at the next evaluation
            int(math.ceil(c)) + 2 * EVALUATION_SECONDS,
        ),
        AlarmFit(
            GPU_SLOWDOWN,
            f"a GPU in a thermal slowdown, the hardware power brake or a hardware slowdown (GpuSlowdown; its Node "
            f"and Gpu dimensions name the host and GPU; not the software power cap) in every "
            f"{slowdown_period // MINUTE} min of {slowdown_period * slowdown_periods // MINUTE} min",
            slowdown_period,
            1,
            "GreaterThanOrEqualToThreshold",
            # the window of periods, the report that shows the last of them (at most C late), the evaluation
            slowdown_period * slowdown_periods + int(math.ceil(c)) + 2 * EVALUATION_SECONDS,
            evaluation_periods=slowdown_periods,
            datapoints_to_alarm=slowdown_periods,
        ),
        AlarmFit(
            EXECUTION_FAILED,
            "an execution of the pipeline failed (the failed-execution rule notifies)",
            5 * MINUTE,
            1,
            "GreaterThanOrEqualToThreshold",
            5 * MINUTE + EVALUATION_SECONDS,
            notifies=False,
        ),
    ]
    if plan.validation_config().source != "none":
        alarms.append(
            AlarmFit(
                VALIDATION,
                f"validation loss more than {mon.max_validation_gap:g} above the training loss",
                window,
                mon.max_validation_gap,
                "GreaterThanThreshold",
                val_fires,
            )
        )
    return AlarmPlan(
        cadence_seconds=c,
        step_seconds=t,
        window_seconds=window,
        stall_seconds=stall,
        stall_min_reports=min_reports,
        validation_seconds=val_seconds,
        loss_ceiling=ceiling,
        alarms={a.name: a for a in alarms},
    )


# -- who the alarms reach ------------------------------------------------------------------

PLATFORM_ALARM_CONTEXT_KEYS = ("alarm_email",)


def platform_subscribed(context: Mapping[str, object] | None) -> bool:
    """Whether the app's context subscribes someone to the platform's alarm topic."""
    return any((context or {}).get(key) for key in PLATFORM_ALARM_CONTEXT_KEYS)


def routing_findings(plan: Plan, platform_has_subscriber: bool) -> list[Finding]:
    """A warning when the recipe's alarms reach no one.

    A recipe's alarms go to its ``monitoring.alarm_topic_arn``, else to a topic of its own
    subscribed to ``monitoring.alarm_email``, else to the platform's topic, which has a
    subscriber only when the app gives it one (``-c alarm_email=...`` or the
    ``TrainingPlatform`` props).
    """
    from tiered_training.planning.plan import Finding

    mon = plan.recipe.monitoring
    if mon.alarm_topic_arn or mon.alarm_email or platform_has_subscriber:
        return []
    return [
        Finding(
            "warning",
            "alarms-unrouted",
            "the recipe's alarms go to the platform topic, which has no subscriber: a stall or a diverged loss "
            "notifies no one",
            "set monitoring.alarm_email or monitoring.alarm_topic_arn, or give the app an alarm_email "
            "(cdk.json context or -c alarm_email=...)",
            "monitoring",
        )
    ]


def app_context(path: str | Path = "cdk.json") -> dict[str, object]:
    """The ``context`` of a CDK app's cdk.json (empty when there is none)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    context = data.get("context") if isinstance(data, dict) else None
    return context if isinstance(context, dict) else {}


def with_routing_findings(plan: Plan, context: Mapping[str, object] | None = None) -> Plan:
    """The plan with :func:`routing_findings` added, for the app whose context is given (default ./cdk.json)."""
    context = app_context() if context is None else context
    extra = routing_findings(plan, platform_subscribed(context))
    return replace(plan, findings=plan.findings + tuple(extra)) if extra else plan


# -- the table in docs/monitoring.md -------------------------------------------------------


def markdown_table(plans: list[Plan]) -> str:
    """Each plan's step time, windows and times to fire, in minutes (``python -m tiered_training.planning.alarms``)."""
    rows = [
        "| recipe | step time | window | stall window | throughput, GPU, memory, loss | stall | validation "
        "| straggler window | straggler | GPU slowdown |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for plan in plans:
        fit = fit_alarms(plan)
        minutes = [
            fit.window_seconds / MINUTE,
            fit.stall_seconds / MINUTE,
            fit[THROUGHPUT].fires_within_seconds / MINUTE,
            fit[STALLED].fires_within_seconds / MINUTE,
        ]
        validation = fit.alarms.get(VALIDATION)
        straggler = fit[STRAGGLER]
        cells = [f"{m:.0f}" for m in minutes] + [
            f"{validation.fires_within_seconds / MINUTE:.0f}" if validation else "-",
            f"{straggler.period_seconds / MINUTE:.0f}",
            f"{straggler.fires_within_seconds / MINUTE:.0f}",
            f"{fit[GPU_SLOWDOWN].fires_within_seconds / MINUTE:.0f}",
        ]
        rows.append(f"| {plan.name} | {fit.step_seconds:.0f} s | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    import sys

    from tiered_training.planning.planner import plan_file
    from tiered_training.recipe.loader import find_recipes

    print(
        markdown_table(
            [
                plan_file(path).require_ok()
                for path in find_recipes([Path(arg) for arg in sys.argv[1:] or ["recipes"]])[0]
            ]
        )
    )
