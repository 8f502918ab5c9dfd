"""Simulated training runs that print the container's real EMF lines, on a fake clock.

:class:`Simulation` drives ``training.components.metrics.MetricsHook`` (one per node, as on
SageMaker: global rank 0 on the first node, local rank 0 on every node) through steps of
the plan's step time, checkpoint saves, validation passes, start-ups, hangs and stops,
with the heartbeat ticking as its thread would. Global rank 0's ``StragglerHook``
(training/components/straggler.py) gathers every rank's phase times from :class:`RankTimes`:
each rank a few percent apart (a healthy run's spread), one GPU slower when the conditions say so. No torch: the hooks get the trainer's
``StepStats`` as the trainer would fill them. The lines land in a
:class:`cloudwatch_alarms.MetricStore`.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cloudwatch_alarms import MetricStore

from tiered_training.planning.plan import Plan
from training.components.gpu_health import GpuHealth, GpuHealthMonitor, XidEvent
from training.components.metrics import MetricsHook
from training.components.straggler import StragglerHook
from training.step_stats import StepStats

TICK_SECONDS = 10.0  # the heartbeat thread's period (5 s in the container; coarser here for speed)
START_UP_SECONDS = 300.0  # model build, checkpoint load: no metrics yet
COMPILE_SECONDS = 180.0  # the first step of a process is longer (torch.compile, warm-up)
GPU_BUSY = 97.0
HW_THERMAL_SLOWDOWN = 0x40  # nvmlClocksEventReasonHwThermalSlowdown
RANK_SPREAD = 0.03  # healthy ranks' forward/backward times differ by up to 3 %


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Conditions:
    """What the run looks like from a given time on (each a function of simulated time)."""

    slowdown: Callable[[float], float] = lambda t: 1.0  # step time multiplier
    loss: Callable[[float, float], float] | None = None  # (t, healthy loss) -> loss
    validation_gap: Callable[[float], float] = lambda t: 0.03
    idle_node: Callable[[float], int | None] = lambda t: None  # index of a node whose GPUs idle
    hang_at: float | None = None  # a step that starts after this never ends
    xid: tuple[float, int, int, int] | None = None  # (time, node index, GPU, XID): that GPU reports it then
    slow_gpu: Callable[[float], tuple[int, float] | None] = lambda t: None  # (node index, speed): its last GPU
    # (node index, GPU): that GPU's NVML clock-event reasons hold a hardware thermal slowdown
    thermal_gpu: Callable[[float], tuple[int, int] | None] = lambda t: None


class HealthyNvml:
    """An NVML stand-in (tests only): every GPU at its full clock, 65 C, 700 W, no errors."""

    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 1, 0, 1, 0
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, gpus: int, reasons: Callable[[int], int] = lambda gpu: 0):
        self.gpus = gpus
        self.reasons = reasons  # GPU -> its clock-event reason bits now

    def nvmlInit(self): pass
    def nvmlDeviceGetCount(self): return self.gpus
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetClockInfo(self, h, kind): return 1980
    def nvmlDeviceGetMaxClockInfo(self, h, kind): return 1980
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return self.reasons(h)
    def nvmlDeviceGetTemperature(self, h, sensor): return 65
    def nvmlDeviceGetPowerUsage(self, h): return 700_000
    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter): return 0
    def nvmlDeviceGetRemappedRows(self, h): return (0, 0, 0, 0)
    def nvmlEventSetCreate(self): raise RuntimeError("the simulation sends XID events itself")


class RankTimes:
    """The all-gather of a StragglerHook on global rank 0: every rank's window, from rank 0's own.

    Forward/backward differs per rank by up to RANK_SPREAD (changing at every gather), and on the slow GPU it takes
    1/speed as long; the other phases are rank 0's."""

    def __init__(self, sim: Simulation):
        self.sim = sim
        self.gathers = 0

    def objects(self, value):
        gpus = self.sim.plan.instance.gpus
        return [(f"algo-{r // gpus + 1}", r % gpus) for r in range(self.sim.plan.gpus)]

    def floats(self, values):
        self.gathers += 1
        gpus = self.sim.plan.instance.gpus
        slow = self.sim.conditions.slow_gpu(self.sim.now)
        rows = []
        for rank in range(self.sim.plan.gpus):
            spread = 1 + RANK_SPREAD * (((rank * 7 + self.gathers * 3) % 11) / 10)
            speed = slow[1] if slow is not None and rank == slow[0] * gpus + gpus - 1 else 1.0
            row = list(values)
            row[1] = values[1] * spread / speed
            rows.append(row)
        return rows


@dataclass
class Simulation:
    plan: Plan
    start: float = field(default_factory=lambda: float(int(time.time()) // 60 * 60 - 2 * 86_400))
    conditions: Conditions = field(default_factory=Conditions)
    total_steps: int | None = None  # a longer run of the same plan (same step time and alarms); default the plan's

    def __post_init__(self) -> None:
        self.cfg = self.plan.run_config()
        if self.total_steps:  # the run's length as the container sees it (TotalSteps in its metrics)
            batch = self.cfg.batch.model_copy(update={"total_steps": self.total_steps})
            self.cfg = self.cfg.model_copy(update={"batch": batch})
        self.clock = Clock(self.start)
        self.out = io.StringIO()
        self.step = 0
        self.phase = "idle"  # what the GPUs do: idle, step, save, validation
        self.hooks: list[MetricsHook] = []
        estimates = self.plan.estimates
        assert estimates is not None
        self.step_seconds = estimates.step_time_seconds
        self.memory_bytes = int((self.plan.memory.fraction if self.plan.memory else 0.8) * self.cfg.hardware.hbm_bytes)
        self.ln_v = math.log(self.plan.architecture.vocab_size)

    # -- pieces of a run ----------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.clock.now

    def _sampler(self, node: int) -> Callable[[], float]:
        def sample() -> float:
            if self.phase != "step":
                return 0.0 if self.phase != "validation" else 60.0
            idle = self.conditions.idle_node(self.now)
            return 2.0 if idle == node else GPU_BUSY

        return sample

    def _reasons(self, node: int) -> Callable[[int], int]:
        def reasons(gpu: int) -> int:
            hot = self.conditions.thermal_gpu(self.now)
            return HW_THERMAL_SLOWDOWN if hot == (node, gpu) else 0

        return reasons

    def _start_process(self) -> None:
        gpus = self.plan.instance.gpus
        self.hooks = [
            MetricsHook(
                self.cfg, rank=i * gpus, local_rank=0, world_size=self.plan.gpus, node=f"algo-{i + 1}",
                stream=self.out, clock=self.clock, gpu_sampler=self._sampler(i),
            )
            for i in range(self.plan.nodes)
        ]
        gpus = self.plan.instance.gpus
        self.health = [
            GpuHealthMonitor(self.cfg, GpuHealth(HealthyNvml(gpus, self._reasons(i))), node=f"algo-{i + 1}",
                             stream=self.out, clock=self.clock, failure_dir="")
            for i in range(self.plan.nodes)
        ]
        self._next_health = self.now + self.cfg.metrics.interval_seconds
        self.straggler = StragglerHook(self.cfg, rank=0, local_rank=0, node="algo-1", gather=RankTimes(self),
                                       stream=self.out, clock=self.clock)

    def wait(self, seconds: float, phase: str | None = None) -> None:
        """Time passes; the heartbeat ticks (when a process runs)."""
        if phase is not None:
            self.phase = phase
        end = self.now + seconds
        while self.now + TICK_SECONDS <= end:
            self.clock.now += TICK_SECONDS
            for hook in self.hooks:
                hook.tick()
            self._gpu_health()
        self.clock.now = end
        self._gpu_health()

    def _gpu_health(self) -> None:
        """Each node's GPU monitor (while a process runs): an XID when the conditions say, events at the cadence."""
        if not self.hooks:
            return
        xid = self.conditions.xid
        if xid is not None and xid[0] <= self.now and not getattr(self, "_xid_sent", False):
            self.health[xid[1]].record(XidEvent(xid[2], xid[3]))
            self._xid_sent = True
        if self.now >= self._next_health:
            for monitor in self.health:
                monitor.emit()
            self._next_health = self.now + self.cfg.metrics.interval_seconds

    def healthy_loss(self) -> float:
        return 2.2 + (self.ln_v - 2.2) * math.exp(-self.step / 400)

    def _one_step(self, first: bool) -> bool:
        batch = self.cfg.batch
        accum = batch.accum_steps_at(self.step)
        seconds = self.step_seconds * accum / batch.grad_accum_steps * self.conditions.slowdown(self.now)
        if first:
            seconds += COMPILE_SECONDS
        hang = self.conditions.hang_at is not None and self.now >= self.conditions.hang_at
        if hang:
            return False
        self.wait(seconds, "step")
        self.step += 1
        save_s = None
        if self.step % self._save_every == 0 or self.step >= batch.total_steps:
            save_s = 0.8 * self.cfg.checkpoint.shutdown_deadline_seconds
            self.wait(save_s, "save")
        loss = self.healthy_loss()
        if self.conditions.loss is not None:
            loss = self.conditions.loss(self.now, loss)
        # a context-parallel group of GPUs shares each sequence
        tokens = accum * batch.micro_batch_size * batch.sequence_length * self.plan.gpus // self.cfg.parallel.context_parallel
        stats = StepStats(
            step=self.step, loss=loss, grad_norm=0.8, lr=1e-4, tokens=tokens, step_time_s=seconds,
            data_wait_s=0.01 * seconds, tokens_per_second=tokens / seconds, micro_batch_size=batch.micro_batch_size,
            grad_accum_steps=accum, checkpoint_save_s=save_s, peak_memory_bytes=self.memory_bytes,
            world_size=self.plan.gpus, forward_backward_s=0.9 * seconds, optimizer_s=0.05 * seconds,
        )
        for hook in self.hooks:
            hook(stats)
        self.straggler(stats)
        self.phase = "idle"
        return True

    @property
    def _save_every(self) -> int:
        return max(1, round(self.cfg.checkpoint.interval_minutes * 60 / self.step_seconds))

    def run_process(self, seconds: float, *, end: str = "stop") -> None:
        """One training process: start-up, steps (with saves and validation) for ``seconds``, then
        ``end``: 'stop' (SIGTERM: a final save, then the run returns), 'return' (MaxSteps reached),
        or 'finish' (run to the plan's last step from where it is)."""
        self._start_process()
        self.wait(START_UP_SECONDS, "idle")
        until = self.now + seconds
        last_validation = self.now
        first = True
        total = self.cfg.batch.total_steps
        validation_every = self.cfg.validation.interval_minutes * 60
        while (self.now < until or end == "finish") and self.step < total:
            if not self._one_step(first):  # a hang: the heartbeat goes on, no step ends
                self.wait(until - self.now, "idle")
                break
            first = False
            if self.cfg.validation.source != "none" and self.now - last_validation >= validation_every:
                self.wait(self.plan.recipe.validation.batches * self.step_seconds / max(1, self.cfg.batch.grad_accum_steps) / 3,
                          "validation")
                gap = self.conditions.validation_gap(self.now)
                self.hooks[0].record_validation(self.healthy_loss() + gap)
                last_validation = self.now
        if end == "stop":
            self.wait(0.8 * self.cfg.checkpoint.shutdown_deadline_seconds, "save")
        for hook in self.hooks:
            hook.close()
        self.hooks = []
        self.phase = "idle"

    def store(self) -> MetricStore:
        store = MetricStore()
        store.add_emf_lines(self.out.getvalue())
        return store
