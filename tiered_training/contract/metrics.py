"""The metric catalogue, shared by the container and the constructs.

The training container emits these metrics as CloudWatch Embedded Metric Format
lines (``training/components/metrics.py``); the constructs build alarms and dashboards on
them (``tiered_training/constructs/metric_factory.py``). Both import this module,
so a name, unit or dimension lives here and nowhere else.

Dimensions are stable: the recipe name, never a generated job name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAMESPACE = "TieredTraining"
# The container emits on this wall-clock cadence (``RunConfig.metrics.interval_seconds``);
# the alarms are fitted to it (``tiered_training.planning.alarms``).
DEFAULT_INTERVAL_SECONDS = 60.0
# Every metric carries exactly this dimension set.
DIMENSIONS: tuple[str, ...] = ("Recipe",)
# GPU-utilisation and memory metrics also carry the node, on each node's local rank 0.
NODE_DIMENSIONS: tuple[str, ...] = ("Recipe", "Node")


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str  # a CloudWatch unit name
    description: str
    dimensions: tuple[str, ...] = DIMENSIONS
    gpu_only: bool = False  # left out where there is no GPU, never faked


TOKENS_PER_SECOND = MetricSpec("TokensPerSecond", "Count/Second", "training tokens per second, all GPUs")
TOKENS_PER_SECOND_PER_GPU = MetricSpec("TokensPerSecondPerGpu", "Count/Second", "training tokens per second per GPU")
MFU = MetricSpec(
    "MFU", "Percent", "model FLOPs utilisation with full-attention FLOPs (6N + 12*L*h*s), BF16-equivalent for FP8 runs"
)
STEP_TIME = MetricSpec("StepTime", "Seconds", "wall time of one optimiser step")
LOSS = MetricSpec("Loss", "None", "training loss")
GRAD_NORM = MetricSpec("GradNorm", "None", "gradient norm before clipping")
LEARNING_RATE = MetricSpec("LearningRate", "None", "learning rate")
PEAK_MEMORY = MetricSpec("PeakMemoryGiB", "Gigabytes", "peak allocated GPU memory", NODE_DIMENSIONS, gpu_only=True)
PEAK_MEMORY_FRACTION = MetricSpec(
    "PeakMemoryFraction", "Percent", "peak allocated GPU memory as a percentage of HBM", NODE_DIMENSIONS, gpu_only=True
)
GPU_UTILIZATION = MetricSpec(
    "GpuUtilization", "Percent", "NVML GPU utilisation, mean over the node's GPUs", NODE_DIMENSIONS, gpu_only=True
)
DATA_WAIT_FRACTION = MetricSpec("DataWaitFraction", "Percent", "share of step time spent waiting for data")
CHECKPOINT_SAVE_TIME = MetricSpec("CheckpointSaveTime", "Seconds", "blocking time of a checkpoint save")
PROGRESS = MetricSpec(
    "StepsCompleted",
    "Count",
    "optimiser steps completed; also sent by the heartbeat, so the stall alarm sees a live run",
)
NON_FINITE_LOSS = MetricSpec(
    "NonFiniteLossSteps", "Count", "steps of the interval whose loss or gradient norm was NaN or infinite (skipped)"
)
VALIDATION_LOSS = MetricSpec("ValidationLoss", "None", "loss on the held-out validation shards")

# Per source of a pretraining mixture (RunConfig.data.mixture), on rank 0, one event per source and interval.
SOURCE_DIMENSIONS: tuple[str, ...] = ("Recipe", "Source")
SOURCE_TOKENS_SEEN = MetricSpec(
    "SourceTokensSeen", "Count", "tokens trained on from each mixture source since step 0", SOURCE_DIMENSIONS
)
SOURCE_VALIDATION_LOSS = MetricSpec(
    "SourceValidationLoss", "None", "loss on each mixture source's held-out documents", SOURCE_DIMENSIONS
)
BY_SOURCE: tuple[MetricSpec, ...] = (SOURCE_TOKENS_SEEN, SOURCE_VALIDATION_LOSS)  # only with a mixture

ALL: tuple[MetricSpec, ...] = (
    TOKENS_PER_SECOND,
    TOKENS_PER_SECOND_PER_GPU,
    MFU,
    STEP_TIME,
    LOSS,
    GRAD_NORM,
    LEARNING_RATE,
    PEAK_MEMORY,
    PEAK_MEMORY_FRACTION,
    GPU_UTILIZATION,
    DATA_WAIT_FRACTION,
    CHECKPOINT_SAVE_TIME,
    PROGRESS,
    NON_FINITE_LOSS,
    VALIDATION_LOSS,
)

# Straggler scores (``training/components/straggler.py``): each rank's time over a window of steps, the fastest
# rank's over its own, per phase and for the step (NVIDIA Resiliency Extension's relative score), gathered every few
# steps and published by global rank 0 at the metrics cadence. 1 is the fastest rank; 0.8 takes 1.25 times as long.
GPU_DIMENSIONS: tuple[str, ...] = ("Recipe", "Node", "Gpu")  # Gpu: the rank's local rank on its node
STRAGGLER_GATHER_EVERY_STEPS = 5  # the ranks' times are gathered every this many steps (the alarm is fitted to it)
STRAGGLER_SCORE = MetricSpec(
    "StragglerScore",
    "None",
    "the slowest rank's score: the fastest rank's step time over its own (its host, GPU and slow phase are the "
    "event's StragglerHost, StragglerGpu and StragglerPhase; HostStragglerScore names the host as a dimension)",
)
HOST_STRAGGLER_SCORE = MetricSpec(
    "HostStragglerScore", "None", "the lowest straggler score of the host's ranks", NODE_DIMENSIONS
)
GPU_STRAGGLER_SCORE = MetricSpec("GpuStragglerScore", "None", "the straggler score of one rank", GPU_DIMENSIONS)
STRAGGLER: tuple[MetricSpec, ...] = (STRAGGLER_SCORE, HOST_STRAGGLER_SCORE, GPU_STRAGGLER_SCORE)


# What NVML says about each GPU (``training/components/gpu_health.py``), per GPU on each node's local rank 0 at the
# metrics cadence; left out where NVML or a GPU is absent.
def _gpu(name: str, unit: str, description: str) -> MetricSpec:
    return MetricSpec(name, unit, description, GPU_DIMENSIONS, gpu_only=True)


GPU_SM_CLOCK = _gpu("GpuSmClockFraction", "Percent", "SM clock as a percentage of its maximum")
GPU_THROTTLE_THERMAL = _gpu("GpuThrottleThermal", "Count", "1 when a thermal slowdown (software or hardware) holds")
GPU_THROTTLE_POWER = _gpu("GpuThrottlePower", "Count", "1 when the power cap or the hardware power brake holds")
GPU_THROTTLE_HARDWARE = _gpu("GpuThrottleHardware", "Count", "1 when a hardware slowdown holds")
GPU_TEMPERATURE = _gpu("GpuTemperature", "None", "GPU temperature, degrees Celsius")
GPU_POWER = _gpu("GpuPowerWatts", "None", "GPU power draw, watts")
GPU_ECC_UNCORRECTED = _gpu("GpuEccUncorrected", "Count", "volatile uncorrected ECC errors since the driver loaded")
GPU_REMAP_PENDING = _gpu("GpuRemappedRowsPending", "Count", "1 when a row remapping waits for a GPU reset")
GPU_REMAP_FAILED = _gpu("GpuRemappedRowsFailed", "Count", "1 when a row remapping failed")
GPU_XID = _gpu("GpuXidErrors", "Count", "critical XID events in the interval (NVML's event set)")
GPU_SLOWDOWN = _gpu(
    "GpuSlowdown",
    "Count",
    "1 when a thermal slowdown, the hardware power brake or a hardware slowdown holds (not the software power cap, "
    "where a GPU at full load runs)",
)
GPU_HEALTH: tuple[MetricSpec, ...] = (
    GPU_SM_CLOCK,
    GPU_THROTTLE_THERMAL,
    GPU_THROTTLE_POWER,
    GPU_THROTTLE_HARDWARE,
    GPU_TEMPERATURE,
    GPU_POWER,
    GPU_ECC_UNCORRECTED,
    GPU_REMAP_PENDING,
    GPU_REMAP_FAILED,
    GPU_XID,
    GPU_SLOWDOWN,
)

BY_NAME = {m.name: m for m in ALL + STRAGGLER + GPU_HEALTH}

# Probe output: one line per finding, parsed by the Probe step's MetricDefinitions, which put the last
# value of each in the step's FinalMetricDataList (the gate and the Train step read it from there).
# The container prints exactly these formats; the definition builder uses these regexes.
# The chosen candidate's measured tokens/s per GPU and peak reserved memory (fraction of the HBM), and the
# chosen candidate, 1-based (1: the plan's first choice); 0: none fits.
PROBE_TOKENS = "probe:tokens_per_second"
PROBE_MEMORY = "probe:peak_memory_fraction"
PROBE_BEST_CANDIDATE = "probe:best_candidate"
PROBE_METRICS: dict[str, tuple[str, str]] = {
    # metric name: (printf-style format the container prints, regex the pipeline parses)
    PROBE_TOKENS: ("PROBE tokens_per_second={:.2f}", r"PROBE tokens_per_second=([0-9.]+)"),
    PROBE_MEMORY: ("PROBE peak_memory_fraction={:.4f}", r"PROBE peak_memory_fraction=([0-9.]+)"),
    PROBE_BEST_CANDIDATE: ("PROBE best_candidate={:d}", r"PROBE best_candidate=([0-9]+)"),
}

# Per candidate (numbered from 1), printed for each candidate that ran: its tokens/s per GPU after warm-up
# (0 when it ran out of memory) and its peak allocated and reserved memory as fractions of the HBM (1 when it
# ran out of memory). A candidate that failed otherwise prints none of them.
PROBE_CANDIDATE_FIELDS: dict[str, str] = {
    "tokens_per_second": "{:.2f}",
    "peak_allocated_fraction": "{:.4f}",
    "peak_reserved_fraction": "{:.4f}",
}


def probe_candidate_metric(number: int, field: str) -> str:
    """The name of candidate ``number``'s ``field`` (a key of :data:`PROBE_CANDIDATE_FIELDS`)."""
    return f"probe:candidate{number}:{field}"


def probe_candidate_metrics(number: int) -> dict[str, tuple[str, str]]:
    """Candidate ``number``'s metrics: name -> (format, regex), as :data:`PROBE_METRICS`."""
    return {
        probe_candidate_metric(number, field): (
            f"PROBE candidate={number} {field}={fmt}",
            rf"PROBE candidate={number} {field}=([0-9.]+)",
        )
        for field, fmt in PROBE_CANDIDATE_FIELDS.items()
    }


def probe_metric_definitions(count: int) -> dict[str, tuple[str, str]]:
    """Every metric a probe of ``count`` candidates prints: the summary, then each candidate's."""
    found = dict(PROBE_METRICS)
    for number in range(1, count + 1):
        found.update(probe_candidate_metrics(number))
    return found


# The run's final metrics: after the last step the container prints one line per metric (training/evaluation.py),
# parsed by the last segment's MetricDefinitions; the Register step copies them into the model package from the
# step's FinalMetricDataList. Every final training metric the trainer reports is printed, and the held-out scores
# when the run had held-out data; the package records those every run of the task prints: ``train:loss``, and a
# task's own training metrics in TASK_FINAL_METRICS (DPO: trl's names, such as ``rewards/accuracies``). The held-out
# scores, which a small data set may not have, are in the evaluation file the package points at.
FINAL_TRAIN_LOSS = "train:loss"
FINAL_EVAL_LOSS = "eval:loss"
FINAL_EVAL_PERPLEXITY = "eval:perplexity"
TASK_FINAL_METRICS: dict[str, tuple[str, ...]] = {
    # DPO: the last step's preference accuracy (trl's rewards/accuracies), which every DPO step reports
    "dpo": ("train:rewards/accuracies",),
}
FINAL_METRIC_LINE = "FINAL {name}={value:.6g}"


def final_metric_regex(name: str) -> str:
    return rf"FINAL {re.escape(name)}=([-+0-9.eE]+)"


def final_metric_names(task: str) -> tuple[str, ...]:
    """The final metrics every run of ``task`` prints, which the Register step records."""
    return (FINAL_TRAIN_LOSS, *TASK_FINAL_METRICS.get(task, ()))
