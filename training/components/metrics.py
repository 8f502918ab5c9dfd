"""CloudWatch Embedded Metric Format (EMF) lines on a wall-clock cadence, plus a progress heartbeat.

:class:`MetricsHook` is a trainer hook: a callable that receives a
:class:`training.step_stats.StepStats` after every optimiser step, on every rank. It
aggregates the steps of each ``cfg.metrics.interval_seconds`` (60 s by default) of wall
clock and prints, on stdout (SageMaker ships it to CloudWatch Logs, where CloudWatch
extracts the metrics from the EMF JSON):

- on global rank 0, one EMF event per interval with the job-wide metrics, dimension
  ``Recipe``: tokens/s (total and per GPU), MFU, step time, loss (mean of the interval's
  finite losses), gradient norm (largest), learning rate, data-wait fraction, the number
  of steps with a non-finite loss, checkpoint save time and validation loss (when one
  happened in the interval), and the progress counter ``StepsCompleted``. A step longer
  than the interval is reported at its end;
- on global rank 0, a **heartbeat** while no step ends: every interval, an event with
  ``StepsCompleted`` alone. It goes on during long steps, checkpoint saves, validation and
  waits, so the stall alarm can tell a live run that makes no progress (the heartbeat
  repeats the same count) from no run at all (no events). It starts after the first step
  of the process and stops when the run returns (:meth:`MetricsHook.close`) or reaches its
  last step, so a finished, stopped or shortened run goes quiet;
- on each node's local rank 0, one EMF event per interval with the node's GPU metrics,
  dimensions ``Recipe`` and ``Node``: peak allocated memory (GiB and percent of HBM) and
  NVML utilisation averaged over the node's GPUs and over the samples taken *during
  training steps* (a checkpoint save or a validation pass idles the GPUs by design). Without
  a GPU (no CUDA peak memory, no NVML) these metrics are left out, never faked;
- on rank 0, one readable line per job event for people reading the log.

The first step of each process (start-up, ``torch.compile``) is left out of tokens/s, MFU
and GPU utilisation, so a restart does not read as a slow run.

A background :class:`Heartbeat` thread (on each node's local rank 0) calls
:meth:`MetricsHook.tick` every few seconds: it samples NVML and sends the heartbeat or a
due interval. Tests drive :meth:`MetricsHook.tick` and the hook with a fake ``clock``.

Every name, unit and dimension comes from :mod:`tiered_training.contract.metrics`, the
catalogue that the alarms also read. The namespace is ``cfg.metrics.namespace``
(which defaults to ``tiered_training.contract.metrics.NAMESPACE``).

MFU is ``RunConfig.mfu``: the planner's own FLOPs formula, ``Architecture.flops_per_token``, and the
BF16 peak (``cfg.hardware.peak_bf16_flops``), so FP8 runs report BF16-equivalent MFU. The metric
counts full attention (6N + 12*L*h*s, torchtitan's convention); the printed line also gives the
causal MFU (6N + 6*L*h*s), labelled, since at long context the two differ widely.

The same job values go to the ``sinks`` (MLflow, TensorBoard: :mod:`training.components.tracking`).
Emission never stops training: an error is reported once on stderr and the hook
carries on.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any, Protocol

from aws_embedded_metrics.environment import Environment
from aws_embedded_metrics.logger.metrics_context import MetricsContext
from aws_embedded_metrics.logger.metrics_logger import MetricsLogger
from aws_embedded_metrics.serializers.log_serializer import LogSerializer
from aws_embedded_metrics.sinks import Sink as EmfSink

from tiered_training.contract import metrics as catalogue
from tiered_training.contract.metrics import MetricSpec

GIB = 1024**3


class StepStatsLike(Protocol):
    """The fields of ``training.step_stats.StepStats`` that this hook reads (read-only: StepStats is frozen)."""

    @property
    def step(self) -> int: ...

    @property
    def loss(self) -> float: ...

    @property
    def grad_norm(self) -> float: ...

    @property
    def lr(self) -> float: ...

    @property
    def tokens(self) -> int: ...

    @property
    def step_time_s(self) -> float: ...

    @property
    def data_wait_s(self) -> float: ...

    @property
    def tokens_per_second(self) -> float: ...

    @property
    def checkpoint_save_s(self) -> float | None: ...

    @property
    def peak_memory_bytes(self) -> int | None: ...

    @property
    def world_size(self) -> int: ...


# -- EMF plumbing: a stdout sink without environment detection ------------------------------


class StreamSink(EmfSink):
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

    def __init__(self, sink: EmfSink):
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

    def get_sink(self) -> EmfSink:
        return self.sink


def emit_emf(
    namespace: str,
    dimensions: dict[str, str],
    values: list[tuple[MetricSpec, float]],
    properties: dict[str, Any] | None = None,
    stream: IO[str] | None = None,
    timestamp: float | None = None,
) -> None:
    """Print one EMF event: the given metrics, with exactly ``dimensions`` as their one dimension set,
    stamped ``timestamp`` (seconds since the epoch; default now)."""
    environment = _StdoutEnvironment(StreamSink(stream))

    async def resolve() -> Environment:
        return environment

    logger = MetricsLogger(resolve)
    logger.set_namespace(namespace)
    logger.set_dimensions(dimensions, use_default=False)
    if timestamp is not None:
        logger.set_timestamp(datetime.fromtimestamp(timestamp, tz=UTC))
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


class Sink(Protocol):
    """Where job-wide values also go (``training.components.tracking``): one call per job event."""

    def log_metrics(self, step: int, values: dict[str, float]) -> None: ...

    def close(self) -> None: ...


@dataclass
class _JobWindow:
    steps: int = 0
    warm_steps: int = 0  # steps counted in tokens/s (not the first of the process)
    tokens: int = 0
    step_time: float = 0.0
    data_wait: float = 0.0
    losses: list[float] = field(default_factory=list)
    non_finite: int = 0
    grad_norm: float | None = None
    lr: float | None = None
    checkpoint_save: float | None = None
    validation_loss: float | None = None
    non_finite_text: str | None = None


@dataclass
class _NodeWindow:
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
    """Trainer hook: ``hook(stats)`` on every rank after every step. See the module docstring.

    - ``clock``: seconds since the epoch (default ``time.time``); it times the cadence and
      stamps the EMF events.
    - ``gpu_sampler``: mean NVML utilisation of this node's GPUs now, or None; default NVML.
    - ``sinks``: MLflow / TensorBoard writers for the job values (rank 0).
    """

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
        clock: Callable[[], float] = time.time,
        sinks: Sequence[Sink] = (),
    ) -> None:
        self.cfg = cfg
        self.rank = _env_int("RANK", 0) if rank is None else rank
        self.local_rank = _env_int("LOCAL_RANK", 0) if local_rank is None else local_rank
        self._world_size = world_size  # else StepStats.world_size, else WORLD_SIZE
        self.node = node or node_name()
        self.stream = stream
        self.clock = clock
        self.interval = float(cfg.metrics.interval_seconds)
        self.namespace = cfg.metrics.namespace
        self.sinks = list(sinks) if self.rank == 0 else []
        self._job = _JobWindow()
        self._node = _NodeWindow()
        self._samples: deque[tuple[float, float]] = deque()
        self._lock = threading.RLock()
        self._warned = False
        self._closed = False
        self._seen_steps = 0
        self._last_step = 0
        self._last_step_at: float | None = None
        now = clock()
        self._last_emit = self._last_job_emit = self._last_node_emit = now
        if gpu_sampler is None and self.local_rank == 0:
            sampler = NvmlSampler()
            gpu_sampler = sampler.sample if sampler.available else None
        self._gpu_sampler = gpu_sampler if self.local_rank == 0 else None
        self._heartbeat: Heartbeat | None = None
        self._source_tokens: dict[str, int] = {}
        self._source_validation: dict[str, float] = {}

    @property
    def active(self) -> bool:
        """Whether this rank emits anything (global rank 0, or a node's local rank 0)."""
        return self.rank == 0 or self.local_rank == 0

    # The hook ----------------------------------------------------------------------------

    def __call__(self, stats: StepStatsLike) -> None:
        if not self.active or self._closed:
            return
        self._guard(self._on_step, stats)

    def tick(self) -> None:
        """Sample the GPUs, and send the heartbeat or a due interval (the Heartbeat thread calls it)."""
        if not self.active or self._closed:
            return
        self._guard(self._on_tick)

    def record_validation(self, loss: float, by_source: dict[str, float] | None = None) -> None:
        """A validation loss (and a mixture's, per source), sent with the next job event (rank 0)."""
        if self.rank != 0 or self._closed:
            return
        with self._lock:
            self._job.validation_loss = float(loss)
            if by_source:
                self._source_validation = dict(by_source)

    def record_sources(self, tokens: dict[str, int]) -> None:
        """A mixture's tokens trained on per source since step 0 (rank 0), sent with each job event."""
        if self.rank != 0 or self._closed:
            return
        with self._lock:
            self._source_tokens = dict(tokens)

    def record_preference(self, step: int, values: dict[str, float]) -> None:
        """A DPO step's metrics under trl's names (``rewards/margins``, ...), to the sinks (MLflow, TensorBoard)."""
        if self.rank != 0 or self._closed:
            return
        for sink in self.sinks:
            self._guard(sink.log_metrics, step, values)

    def start(self, every_seconds: float | None = None) -> MetricsHook:
        """Start the background :class:`Heartbeat` (on the ranks that emit)."""
        if self.active and self._heartbeat is None:
            self._heartbeat = Heartbeat(self, every_seconds or min(5.0, self.interval / 4))
            self._heartbeat.start()
        return self

    def close(self) -> None:
        """The run is over on this rank: send what is pending, stop the heartbeat, close the sinks."""
        if self._closed:
            return
        with self._lock:
            if self.active and not self._closed:
                self._guard(self._flush)
            self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.stop()
        for sink in self.sinks:
            self._guard(sink.close)

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as error:  # metrics must never stop a training run
            if not self._warned:
                print(f"metrics: warning: emission failed, carrying on: {error!r}", file=sys.stderr, flush=True)
                self._warned = True

    def _on_step(self, stats: StepStatsLike) -> None:
        with self._lock:
            now = self.clock()
            self._seen_steps += 1
            warm = self._seen_steps > 1
            self._last_step = int(stats.step)
            self._last_step_at = now
            final = stats.step >= self.cfg.batch.total_steps
            if self.rank == 0:
                self._accumulate_job(stats, warm)
            if self.local_rank == 0:
                self._accumulate_node(stats, now, warm)
            if self.rank == 0 and (final or now - self._last_job_emit >= self.interval):
                self._emit_job(now)
            if self.local_rank == 0 and (final or now - self._last_node_emit >= self.interval):
                self._emit_node(now)
        if final:
            self.close()

    def _on_tick(self) -> None:
        with self._lock:
            now = self.clock()
            if self._gpu_sampler is not None:
                value = self._gpu_sampler()
                if value is not None:
                    self._samples.append((now, float(value)))
            if self.rank != 0 or self._seen_steps == 0 or now - self._last_emit < self.interval:
                return
            if self._job.steps or self._job.validation_loss is not None:
                self._emit_job(now)
            else:
                self._emit_heartbeat(now)

    def _flush(self) -> None:
        now = self.clock()
        if self.rank == 0 and (self._job.steps or self._job.validation_loss is not None):
            self._emit_job(now)
        if self.local_rank == 0 and (self._node.peak_memory is not None or self._node.utilisation):
            self._emit_node(now)

    # Windows -------------------------------------------------------------------------------

    def _accumulate_job(self, stats: StepStatsLike, warm: bool) -> None:
        w = self._job
        w.steps += 1
        if warm:
            w.warm_steps += 1
            w.tokens += int(stats.tokens)
            w.step_time += float(stats.step_time_s)
            w.data_wait += float(stats.data_wait_s)
        loss = float(stats.loss)
        if math.isfinite(loss) and not getattr(stats, "skipped", False):  # a skipped step counts as non-finite
            w.losses.append(loss)
        else:
            w.non_finite += 1
            w.non_finite_text = str(stats.loss)
        grad = float(stats.grad_norm)
        if math.isfinite(grad):
            w.grad_norm = grad if w.grad_norm is None else max(w.grad_norm, grad)
        w.lr = float(stats.lr)
        if stats.checkpoint_save_s is not None:
            w.checkpoint_save = (w.checkpoint_save or 0.0) + float(stats.checkpoint_save_s)
        if self._world_size is None and getattr(stats, "world_size", None):
            self._world_size = int(stats.world_size)

    def _accumulate_node(self, stats: StepStatsLike, now: float, warm: bool) -> None:
        w = self._node
        if stats.peak_memory_bytes is not None:
            w.peak_memory = max(w.peak_memory or 0, int(stats.peak_memory_bytes))
        if self._gpu_sampler is None:
            return
        value = self._gpu_sampler()
        if value is not None:
            self._samples.append((now, float(value)))
        # The step ran from (end - step time) to its end; a checkpoint save came after it.
        end = now - float(stats.checkpoint_save_s or 0.0)
        begin = end - float(stats.step_time_s)
        while self._samples and self._samples[0][0] <= begin:
            self._samples.popleft()
        if warm:
            w.utilisation += [value for at, value in self._samples if at <= end]
        self._samples.clear()

    # What is emitted -----------------------------------------------------------------------

    def job_values(self) -> list[tuple[MetricSpec, float]]:
        """Rank 0's job-wide metrics for the current window."""
        w = self._job
        values: list[tuple[MetricSpec, float]] = []
        if w.warm_steps and w.step_time > 0:
            tokens_per_second = w.tokens / w.step_time
            world = self._world_size or _env_int("WORLD_SIZE", 1)
            per_gpu = tokens_per_second / max(1, world)
            values += [
                (catalogue.TOKENS_PER_SECOND, tokens_per_second),
                (catalogue.TOKENS_PER_SECOND_PER_GPU, per_gpu),
                (catalogue.MFU, 100.0 * self.cfg.mfu(per_gpu)),
                (catalogue.STEP_TIME, w.step_time / w.warm_steps),
                (catalogue.DATA_WAIT_FRACTION, 100.0 * w.data_wait / w.step_time),
            ]
        if w.steps:
            if w.losses:
                values.append((catalogue.LOSS, sum(w.losses) / len(w.losses)))
            values.append((catalogue.NON_FINITE_LOSS, float(w.non_finite)))
            if w.grad_norm is not None:
                values.append((catalogue.GRAD_NORM, w.grad_norm))
            if w.lr is not None:
                values.append((catalogue.LEARNING_RATE, w.lr))
        if w.checkpoint_save is not None:
            values.append((catalogue.CHECKPOINT_SAVE_TIME, w.checkpoint_save))
        if w.validation_loss is not None:
            values.append((catalogue.VALIDATION_LOSS, w.validation_loss))
        values.append((catalogue.PROGRESS, float(self._last_step)))
        # CloudWatch rejects NaN and infinity in EMF: a non-finite value is left out.
        return [(spec, value) for spec, value in values if math.isfinite(value)]

    def node_values(self) -> list[tuple[MetricSpec, float]]:
        """This node's GPU metrics; empty without a GPU."""
        w = self._node
        values: list[tuple[MetricSpec, float]] = []
        if w.peak_memory is not None:
            values.append((catalogue.PEAK_MEMORY, w.peak_memory / GIB))
            values.append((catalogue.PEAK_MEMORY_FRACTION, 100.0 * w.peak_memory / self.cfg.hardware.hbm_bytes))
        if w.utilisation:
            values.append((catalogue.GPU_UTILIZATION, sum(w.utilisation) / len(w.utilisation)))
        return values

    def _properties(self) -> dict[str, Any]:
        return {"Step": self._last_step, "TotalSteps": self.cfg.batch.total_steps}

    def _emit_job(self, now: float) -> None:
        job = self.job_values()
        extra = self._properties()
        if self._job.non_finite_text is not None:
            extra["LossNonFinite"] = self._job.non_finite_text
        recipe = {"Recipe": self.cfg.recipe_name}
        emit_emf(self.namespace, _dims(catalogue.DIMENSIONS, recipe), job, extra, self.stream, timestamp=now)
        self._print_readable(dict(job))
        self._emit_sources(now, extra)
        named = {spec.name: value for spec, value in job}
        for sink in self.sinks:
            self._guard(sink.log_metrics, self._last_step, named)
        self._job = _JobWindow()
        self._last_emit = self._last_job_emit = now

    def _emit_sources(self, now: float, extra: dict[str, Any]) -> None:
        """One event per mixture source: its tokens so far and its last validation loss."""
        names = list(dict.fromkeys([*self._source_tokens, *self._source_validation]))
        for name in names:
            values = []
            if name in self._source_tokens:
                values.append((catalogue.SOURCE_TOKENS_SEEN, float(self._source_tokens[name])))
            if name in self._source_validation and math.isfinite(self._source_validation[name]):
                values.append((catalogue.SOURCE_VALIDATION_LOSS, self._source_validation[name]))
            dims = _dims(catalogue.SOURCE_DIMENSIONS, {"Recipe": self.cfg.recipe_name, "Source": name})
            emit_emf(self.namespace, dims, values, extra, self.stream, timestamp=now)
        if names:
            total = max(1, sum(self._source_tokens.values()))
            parts = []
            for name in names:
                seen = self._source_tokens.get(name, 0)
                part = f"{name} {seen:,} tokens ({100 * seen / total:.1f}%)"
                if name in self._source_validation:
                    part += f", validation loss {self._source_validation[name]:.4f}"
                parts.append(part)
            (self.stream or sys.stdout).write("metrics: sources: " + "; ".join(parts) + "\n")
        self._source_validation = {}

    def _emit_heartbeat(self, now: float) -> None:
        since = now - self._last_step_at if self._last_step_at is not None else 0.0
        properties = {**self._properties(), "Heartbeat": True, "SecondsSinceStep": round(since, 1)}
        recipe = {"Recipe": self.cfg.recipe_name}
        emit_emf(
            self.namespace,
            _dims(catalogue.DIMENSIONS, recipe),
            [(catalogue.PROGRESS, float(self._last_step))],
            properties,
            self.stream,
            timestamp=now,
        )
        self._last_emit = now

    def _emit_node(self, now: float) -> None:
        node = self.node_values()
        if node:
            dims = _dims(catalogue.NODE_DIMENSIONS, {"Recipe": self.cfg.recipe_name, "Node": self.node})
            emit_emf(self.namespace, dims, node, self._properties(), self.stream, timestamp=now)
        self._node = _NodeWindow()
        self._last_node_emit = now

    @property
    def _causal_share(self) -> float:
        """Causal over full-attention FLOPs per token."""
        s = self.cfg.batch.sequence_length
        return self.cfg.model.flops_per_token(s, causal=True) / self.cfg.model.flops_per_token(s)

    def _print_readable(self, job: dict) -> None:
        c = catalogue
        parts = [f"step {self._last_step}/{self.cfg.batch.total_steps}"]
        if c.LOSS in job:
            parts.append(f"loss {job[c.LOSS]:.4f}")
        if self._job.non_finite:
            parts.append(f"non-finite loss in {self._job.non_finite} step(s)")
        if c.GRAD_NORM in job:
            parts.append(f"grad_norm {job[c.GRAD_NORM]:.3f}")
        if c.LEARNING_RATE in job:
            parts.append(f"lr {job[c.LEARNING_RATE]:.3e}")
        if c.TOKENS_PER_SECOND in job:
            parts += [
                f"tokens/s {job[c.TOKENS_PER_SECOND]:,.0f} ({job[c.TOKENS_PER_SECOND_PER_GPU]:,.0f}/GPU)",
                f"MFU {job[c.MFU]:.1f}% full attention ({job[c.MFU] * self._causal_share:.1f}% causal)",
                f"step {job[c.STEP_TIME]:.3f}s",
                f"data wait {job[c.DATA_WAIT_FRACTION]:.1f}%",
            ]
        if c.CHECKPOINT_SAVE_TIME in job:
            parts.append(f"ckpt save {job[c.CHECKPOINT_SAVE_TIME]:.2f}s")
        if c.VALIDATION_LOSS in job:
            parts.append(f"validation loss {job[c.VALIDATION_LOSS]:.4f}")
        out = self.stream or sys.stdout
        out.write("metrics: " + " | ".join(parts) + "\n")
        out.flush()


class Heartbeat(threading.Thread):
    """Calls ``hook.tick()`` every ``every_seconds`` until stopped (a daemon: it never holds a run open)."""

    def __init__(self, hook: MetricsHook, every_seconds: float) -> None:
        super().__init__(name="metrics-heartbeat", daemon=True)
        self.hook = hook
        self.every_seconds = every_seconds
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.every_seconds):
            self.hook.tick()

    def stop(self) -> None:
        self._stop_event.set()


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
