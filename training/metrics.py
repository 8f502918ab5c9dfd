"""CloudWatch Embedded Metric Format (EMF) lines from the trainer's per-step stats.

:class:`MetricsHook` is a trainer hook: a callable that receives a
:class:`training.step_stats.StepStats` after every optimiser step, on every rank.
Every ``cfg.metrics.interval_steps`` steps (and at the last step) it prints, on
stdout, which SageMaker ships to CloudWatch Logs, where CloudWatch extracts the
metrics from the EMF JSON:

- on global rank 0, one EMF line with the job-wide metrics, dimension ``Recipe``:
  tokens/s (total and per GPU), MFU, step time, loss, gradient norm, learning rate,
  data-wait fraction, checkpoint save time (only when a save happened in the window)
  and the progress counter ``StepsCompleted`` (the cumulative step count, which the
  stall alarm watches);
- on each node's local rank 0, one EMF line with the node's GPU metrics, dimensions
  ``Recipe`` and ``Node``: peak allocated memory (GiB and percent of HBM) and NVML
  GPU utilisation averaged over the node's GPUs and over the window. Without a GPU
  (no CUDA peak memory, no NVML) these metrics are left out, never faked;
- on rank 0, one readable line for people reading the log.

Every name, unit and dimension comes from :mod:`tiered_training.metrics`, the
catalogue that the alarms also read. The namespace is ``cfg.metrics.namespace``
(which defaults to ``tiered_training.metrics.NAMESPACE``).

MFU is ``RunConfig.mfu``: the planner's own FLOPs formula, ``Architecture.flops_per_token``, and the
BF16 peak (``cfg.hardware.peak_bf16_flops``), so FP8 runs report BF16-equivalent MFU.

Emission never stops training: an error is reported once on stderr and the hook
carries on.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Protocol

from aws_embedded_metrics.environment import Environment
from aws_embedded_metrics.logger.metrics_context import MetricsContext
from aws_embedded_metrics.logger.metrics_logger import MetricsLogger
from aws_embedded_metrics.serializers.log_serializer import LogSerializer
from aws_embedded_metrics.sinks import Sink

from tiered_training import metrics as catalogue
from tiered_training.metrics import MetricSpec

GIB = 1024**3


class StepStatsLike(Protocol):
    """The fields of ``training.step_stats.StepStats`` that this hook reads."""

    step: int
    loss: float
    grad_norm: float
    lr: float
    tokens: int
    step_time_s: float
    data_wait_s: float
    tokens_per_second: float
    checkpoint_save_s: float | None
    peak_memory_bytes: int | None
    world_size: int


# -- EMF plumbing: a stdout sink without environment detection ------------------------------


class StreamSink(Sink):
    """aws-embedded-metrics' stdout sink, writing to a chosen stream (stdout by default) and flushing."""

    def __init__(self, stream: IO[str] | None = None):
        self.stream = stream
        self.serializer = LogSerializer()

    def accept(self, context: MetricsContext) -> None:
        out = self.stream or sys.stdout
        for line in self.serializer.serialize(context):
            if line:
                out.write(line + "\n")
        out.flush()

    @staticmethod
    def name() -> str:
        return "StreamSink"


class _StdoutEnvironment(Environment):
    """No probing of EC2/Lambda metadata endpoints: the job may run under network isolation."""

    def __init__(self, sink: Sink):
        self.sink = sink

    async def probe(self) -> bool:
        return True

    def get_name(self) -> str:
        return "tiered-training"

    def get_type(self) -> str:
        return "SageMakerTrainingJob"

    def get_log_group_name(self) -> str:
        return ""

    def configure_context(self, context: MetricsContext) -> None:
        pass

    def get_sink(self) -> Sink:
        return self.sink


def emit_emf(
    namespace: str,
    dimensions: dict[str, str],
    values: list[tuple[MetricSpec, float]],
    properties: dict[str, Any] | None = None,
    stream: IO[str] | None = None,
) -> None:
    """Print one EMF event: the given metrics, with exactly ``dimensions`` as their one dimension set."""
    environment = _StdoutEnvironment(StreamSink(stream))

    async def resolve() -> Environment:
        return environment

    logger = MetricsLogger(resolve)
    logger.set_namespace(namespace)
    logger.set_dimensions(dimensions, use_default=False)
    for key, value in (properties or {}).items():
        logger.set_property(key, value)
    for spec, value in values:
        logger.put_metric(spec.name, float(value), spec.unit)
    logger.flush_sync()


# -- GPU utilisation from NVML ---------------------------------------------------------------


class NvmlSampler:
    """Mean NVML utilisation of this node's GPUs; ``available`` is False without NVML or GPUs."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml = pynvml
        except Exception:  # no driver, no library, no GPU: leave the metric out
            self._handles = []

    @property
    def available(self) -> bool:
        return bool(self._handles)

    def sample(self) -> float | None:
        if not self._handles:
            return None
        try:
            rates = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
        except Exception:
            return None
        return sum(rates) / len(rates)


# -- the hook ----------------------------------------------------------------------------------


@dataclass
class _Window:
    steps: int = 0
    tokens: int = 0
    step_time: float = 0.0
    data_wait: float = 0.0
    checkpoint_save: float | None = None
    peak_memory: int | None = None
    utilisation: list[float] = field(default_factory=list)


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def node_name() -> str:
    """The SageMaker host name (algo-N): stable across restarts, unlike the job name."""
    for var in ("SM_CURRENT_HOST",):
        if os.environ.get(var):
            return os.environ[var]
    if "GROUP_RANK" in os.environ:
        return f"node-{os.environ['GROUP_RANK']}"
    return socket.gethostname()


class MetricsHook:
    """Trainer hook: ``hook(stats)`` on every rank after every step. See the module docstring."""

    def __init__(
        self,
        cfg,
        *,
        rank: int | None = None,
        local_rank: int | None = None,
        world_size: int | None = None,
        node: str | None = None,
        stream: IO[str] | None = None,
        gpu_sampler: Callable[[], float | None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.rank = _env_int("RANK", 0) if rank is None else rank
        self.local_rank = _env_int("LOCAL_RANK", 0) if local_rank is None else local_rank
        self._world_size = world_size  # else StepStats.world_size, else WORLD_SIZE
        self.node = node or node_name()
        self.stream = stream
        self.interval = max(1, cfg.metrics.interval_steps)
        self.namespace = cfg.metrics.namespace
        self._window = _Window()
        self._warned = False
        if gpu_sampler is None and self.local_rank == 0:
            sampler = NvmlSampler()
            gpu_sampler = sampler.sample if sampler.available else None
        self._gpu_sampler = gpu_sampler if self.local_rank == 0 else None

    # The hook ----------------------------------------------------------------------------

    def __call__(self, stats: StepStatsLike) -> None:
        if self.rank != 0 and self.local_rank != 0:
            return
        try:
            self._accumulate(stats)
            if stats.step % self.interval == 0 or stats.step >= self.cfg.batch.total_steps:
                self._emit(stats)
                self._window = _Window()
        except Exception as error:  # metrics must never stop a training run
            if not self._warned:
                print(f"metrics: warning: emission failed, carrying on: {error!r}", file=sys.stderr, flush=True)
                self._warned = True

    def _accumulate(self, stats: StepStatsLike) -> None:
        w = self._window
        w.steps += 1
        w.tokens += int(stats.tokens)
        w.step_time += float(stats.step_time_s)
        w.data_wait += float(stats.data_wait_s)
        if stats.checkpoint_save_s is not None:
            w.checkpoint_save = (w.checkpoint_save or 0.0) + float(stats.checkpoint_save_s)
        if stats.peak_memory_bytes is not None:
            w.peak_memory = max(w.peak_memory or 0, int(stats.peak_memory_bytes))
        if self._gpu_sampler is not None:
            value = self._gpu_sampler()
            if value is not None:
                w.utilisation.append(float(value))

    # What is emitted -----------------------------------------------------------------------

    def job_values(self, stats: StepStatsLike) -> list[tuple[MetricSpec, float]]:
        """Rank 0's job-wide metrics for the current window."""
        w = self._window
        tokens_per_second = w.tokens / w.step_time if w.step_time > 0 else float(stats.tokens_per_second)
        world = self._world_size or getattr(stats, "world_size", None) or _env_int("WORLD_SIZE", 1)
        per_gpu = tokens_per_second / max(1, world)
        mfu = 100.0 * self.cfg.mfu(per_gpu)
        values: list[tuple[MetricSpec, float]] = [
            (catalogue.TOKENS_PER_SECOND, tokens_per_second),
            (catalogue.TOKENS_PER_SECOND_PER_GPU, per_gpu),
            (catalogue.MFU, mfu),
            (catalogue.STEP_TIME, w.step_time / max(1, w.steps)),
            (catalogue.LOSS, float(stats.loss)),
            (catalogue.GRAD_NORM, float(stats.grad_norm)),
            (catalogue.LEARNING_RATE, float(stats.lr)),
            (catalogue.DATA_WAIT_FRACTION, 100.0 * w.data_wait / w.step_time if w.step_time > 0 else 0.0),
            (catalogue.PROGRESS, float(stats.step)),
        ]
        if w.checkpoint_save is not None:
            values.append((catalogue.CHECKPOINT_SAVE_TIME, w.checkpoint_save))
        # CloudWatch rejects NaN and infinity in EMF; a diverged loss shows as a missing
        # datapoint (the loss alarm treats missing as breaching) plus a property.
        return [(spec, value) for spec, value in values if math.isfinite(value)]

    def node_values(self) -> list[tuple[MetricSpec, float]]:
        """This node's GPU metrics; empty without a GPU."""
        w = self._window
        values: list[tuple[MetricSpec, float]] = []
        if w.peak_memory is not None:
            values.append((catalogue.PEAK_MEMORY, w.peak_memory / GIB))
            values.append((catalogue.PEAK_MEMORY_FRACTION, 100.0 * w.peak_memory / self.cfg.hardware.hbm_bytes))
        if w.utilisation:
            values.append((catalogue.GPU_UTILIZATION, sum(w.utilisation) / len(w.utilisation)))
        return values

    def _emit(self, stats: StepStatsLike) -> None:
        recipe = {"Recipe": self.cfg.recipe_name}
        properties = {"Step": int(stats.step), "TotalSteps": self.cfg.batch.total_steps}
        if self.rank == 0:
            job = self.job_values(stats)
            extra = dict(properties)
            if not math.isfinite(float(stats.loss)):
                extra["LossNonFinite"] = str(stats.loss)
            emit_emf(self.namespace, _dims(catalogue.DIMENSIONS, recipe), job, extra, self.stream)
        node = self.node_values() if self.local_rank == 0 else []
        if node:
            dims = _dims(catalogue.NODE_DIMENSIONS, {**recipe, "Node": self.node})
            emit_emf(self.namespace, dims, node, properties, self.stream)
        if self.rank == 0:
            self._print_readable(stats, dict(job), dict(node))

    def _print_readable(self, stats: StepStatsLike, job: dict, node: dict) -> None:
        c = catalogue
        parts = [
            f"step {stats.step}/{self.cfg.batch.total_steps}",
            f"loss {float(stats.loss):.4f}",
            f"grad_norm {float(stats.grad_norm):.3f}",
            f"lr {float(stats.lr):.3e}",
            f"tokens/s {job.get(c.TOKENS_PER_SECOND, 0):,.0f} ({job.get(c.TOKENS_PER_SECOND_PER_GPU, 0):,.0f}/GPU)",
            f"MFU {job.get(c.MFU, 0):.1f}%",
            f"step {job.get(c.STEP_TIME, 0):.3f}s",
            f"data wait {job.get(c.DATA_WAIT_FRACTION, 0):.1f}%",
        ]
        if c.CHECKPOINT_SAVE_TIME in job:
            parts.append(f"ckpt save {job[c.CHECKPOINT_SAVE_TIME]:.2f}s")
        if c.PEAK_MEMORY in node:
            parts.append(f"mem {node[c.PEAK_MEMORY]:.1f} GiB ({node[c.PEAK_MEMORY_FRACTION]:.1f}%)")
        if c.GPU_UTILIZATION in node:
            parts.append(f"GPU util {node[c.GPU_UTILIZATION]:.0f}%")
        out = self.stream or sys.stdout
        out.write("metrics: " + " | ".join(parts) + "\n")
        out.flush()


def _dims(names: tuple[str, ...], values: dict[str, str]) -> dict[str, str]:
    """Exactly the catalogue's dimension set, in its order."""
    return {name: str(values[name]) for name in names}


def parse_emf_lines(text: str) -> list[dict]:
    """The EMF events in a log (lines that are JSON objects with an ``_aws`` key): for tests and tooling."""
    events = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and "_aws" in event:
            events.append(event)
    return events
