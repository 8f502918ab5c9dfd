"""What each GPU says about itself, through NVML (the ``nvidia-ml-py`` bindings): clocks, throttling, heat, power,
memory errors and XID events.

:class:`GpuHealth` reads, per GPU of this node: the SM clock against its maximum, the clock-throttle reasons
(thermal, power cap or power brake, hardware slowdown), temperature, power, volatile uncorrected ECC errors,
remapped rows pending or failed; and it waits on NVML's event set for critical XID events. Each reading is left out
where NVML, the GPU or that query is absent (``NVMLError_NotSupported``): nothing is faked.

:class:`GpuHealthMonitor` is a thread on each node's local rank 0: every ``cfg.metrics.interval_seconds`` it prints
one EMF event per GPU (dimensions Recipe, Node, Gpu: :data:`tiered_training.contract.metrics.GPU_HEALTH`), and
between them it waits for XID events. A fatal XID (:data:`FATAL_XIDS`) is written at once to the launcher's failure
directory (``TIERED_TRAINING_FAILURE_DIR``) as ``rank-<RANK>-gpu<N>``: the job's FailureReason then names the host,
the GPU and the XID ahead of the collective timeouts it causes on other ranks
(:func:`tiered_training.contract.failures.causes_first`).

The process then exits at once (:data:`GPU_FAULT_EXIT`): the GPU cannot go on, and torchrun stops the node's
other workers, so the job fails now instead of at the next collective timeout.

``TIERED_TRAINING_NVML_STANDIN=module`` (rehearsals and tests only) makes :func:`start_monitor` read that module
instead of ``pynvml``: how a rehearsal makes one simulated host report an XID without a GPU.

XID meanings: NVIDIA's XID catalogue, https://docs.nvidia.com/deploy/xid-errors/index.html.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tiered_training.contract import metrics as catalogue
from tiered_training.contract.failures import GPU_FAULT_PREFIX
from tiered_training.contract.metrics import MetricSpec
from training.components.metrics import emit_emf, node_name

XID_MEANINGS = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit (uncorrectable) ECC error",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
# XIDs after which the GPU cannot go on (the catalogue's "reset the GPU" or "node reboot" actions).
FATAL_XIDS = frozenset({48, 64, 74, 79, 95, 119, 120})

# NVML's clock-event (throttle) reason bits (nvml.h, nvmlClocksEventReason*).
THERMAL_BITS = 0x20 | 0x40  # software thermal slowdown, hardware thermal slowdown
POWER_BITS = 0x04 | 0x80  # software power cap, hardware power brake
HARDWARE_BITS = 0x08  # hardware slowdown
# What a healthy GPU under load does not show: the software power cap (0x04) is left out, a busy GPU runs at it.
SLOWDOWN_BITS = THERMAL_BITS | 0x80 | HARDWARE_BITS
GPU_FAULT_EXIT = 75  # the exit status of a process whose GPU reported a fatal XID
STANDIN_VARIABLE = "TIERED_TRAINING_NVML_STANDIN"


@dataclass(frozen=True)
class XidEvent:
    gpu: int  # the NVML index on this node
    xid: int

    @property
    def fatal(self) -> bool:
        return self.xid in FATAL_XIDS

    def describe(self, host: str) -> str:
        meaning = XID_MEANINGS.get(self.xid, "see NVIDIA's XID catalogue")
        return f"XID {self.xid} on {host} GPU {self.gpu} ({meaning})"


class GpuHealth:
    """NVML readings of this node's GPUs; ``available`` is False without NVML or a GPU. ``nvml``: the module
    (default ``pynvml``; tests pass a stand-in)."""

    def __init__(self, nvml: Any = None) -> None:
        self.nvml: Any = None
        self.handles: list[Any] = []
        self._events: Any = None
        try:
            if nvml is None:
                nvml = importlib.import_module("pynvml")
            nvml.nvmlInit()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            self.nvml = nvml
        except Exception:  # no library, no driver, no GPU: nothing to read
            self.handles = []
            return
        try:
            events = nvml.nvmlEventSetCreate()
            for handle in self.handles:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
            self._events = events
        except Exception:  # XID events not supported here: the other readings still are
            self._events = None

    @property
    def available(self) -> bool:
        return bool(self.handles)

    def _try(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # this query is not supported on this GPU: left out
            return None

    def read(self) -> list[list[tuple[MetricSpec, float]]]:
        """Per GPU (in NVML index order), the readings it gives."""
        nvml, c = self.nvml, catalogue
        found = []
        for handle in self.handles:
            values: list[tuple[MetricSpec, float]] = []
            sm = self._try(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
            top = self._try(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM)
            if sm is not None and top:
                values.append((c.GPU_SM_CLOCK, 100.0 * sm / top))
            reasons = self._try(nvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
            if reasons is not None:
                values += [
                    (c.GPU_THROTTLE_THERMAL, 1.0 if reasons & THERMAL_BITS else 0.0),
                    (c.GPU_THROTTLE_POWER, 1.0 if reasons & POWER_BITS else 0.0),
                    (c.GPU_THROTTLE_HARDWARE, 1.0 if reasons & HARDWARE_BITS else 0.0),
                    (c.GPU_SLOWDOWN, 1.0 if reasons & SLOWDOWN_BITS else 0.0),
                ]
            temperature = self._try(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
            if temperature is not None:
                values.append((c.GPU_TEMPERATURE, float(temperature)))
            power = self._try(nvml.nvmlDeviceGetPowerUsage, handle)
            if power is not None:
                values.append((c.GPU_POWER, power / 1000.0))  # milliwatts
            ecc = self._try(
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            )
            if ecc is not None:
                values.append((c.GPU_ECC_UNCORRECTED, float(ecc)))
            rows = self._try(nvml.nvmlDeviceGetRemappedRows, handle)
            if rows is not None:
                _, _, pending, failed = rows
                values += [(c.GPU_REMAP_PENDING, float(bool(pending))), (c.GPU_REMAP_FAILED, float(bool(failed)))]
            found.append(values)
        return found

    def wait_xid(self, timeout_s: float) -> XidEvent | None:
        """The next critical XID event within ``timeout_s``, or None (none came, or no event set)."""
        if self._events is None:
            time.sleep(max(0.0, timeout_s))
            return None
        nvml = self.nvml
        try:
            data = nvml.nvmlEventSetWait_v2(self._events, int(timeout_s * 1000))
        except Exception:  # NVML_ERROR_TIMEOUT: no event in the time
            return None
        index = self._try(nvml.nvmlDeviceGetIndex, data.device)
        return XidEvent(int(index) if index is not None else -1, int(data.eventData))


class GpuHealthMonitor(threading.Thread):
    """Each node's local rank 0: the GPUs' readings as EMF every interval, XID events as they come (a daemon)."""

    def __init__(
        self,
        cfg,
        health: GpuHealth,
        *,
        node: str | None = None,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.time,
        failure_dir: str | None = None,
        rank: str | None = None,
        on_fatal: Callable[[XidEvent], None] | None = None,
    ) -> None:
        """``on_fatal``: called after a fatal XID is recorded (:func:`start_monitor` exits the process)."""
        super().__init__(name="gpu-health", daemon=True)
        self.cfg, self.health = cfg, health
        self.node = node or node_name()
        self.stream = stream
        self.clock = clock
        self.interval = float(cfg.metrics.interval_seconds)
        self.failure_dir = failure_dir if failure_dir is not None else os.environ.get("TIERED_TRAINING_FAILURE_DIR")
        self.rank = rank if rank is not None else os.environ.get("RANK", "0")
        self.on_fatal = on_fatal
        self.xids: dict[int, int] = {}  # GPU -> XID events in the interval
        self.events: list[XidEvent] = []
        self._stop_event = threading.Event()
        self._warned = False

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        next_emit = self.clock() + self.interval
        while not self._stop_event.is_set():
            self.step(min(1.0, max(0.0, next_emit - self.clock())))
            if self.clock() >= next_emit:
                self.emit()
                next_emit = self.clock() + self.interval

    def step(self, timeout_s: float) -> XidEvent | None:
        """Wait up to ``timeout_s`` for an XID event and record it."""
        event = self.health.wait_xid(timeout_s)
        if event is not None:
            self.record(event)
        return event

    def record(self, event: XidEvent) -> None:
        self.events.append(event)
        self.xids[event.gpu] = self.xids.get(event.gpu, 0) + 1
        text = event.describe(self.node)
        out = self.stream or sys.stdout
        out.write(f"gpu-health: {text}" + (": the GPU cannot go on" if event.fatal else "") + "\n")
        out.flush()
        if event.fatal and self.failure_dir:
            try:  # the launcher puts it first in the FailureReason
                Path(self.failure_dir, f"rank-{self.rank}-gpu{event.gpu}").write_text(f"{GPU_FAULT_PREFIX} {text}\n")
            except OSError:
                pass
        if event.fatal:
            self.emit()  # its count reaches CloudWatch (the GpuFault alarm) before the process goes
            if self.on_fatal is not None:
                self.on_fatal(event)

    def emit(self) -> None:
        """One EMF event per GPU with this interval's readings and XID count."""
        try:
            readings = self.health.read()
            now = self.clock()
            for gpu, values in enumerate(readings):
                values = values + [(catalogue.GPU_XID, float(self.xids.get(gpu, 0)))]
                dims = {"Recipe": self.cfg.recipe_name, "Node": self.node, "Gpu": str(gpu)}
                emit_emf(self.cfg.metrics.namespace, dims, values, None, self.stream, timestamp=now)
            self.xids = {}
        except Exception as error:  # metrics never stop a training run
            if not self._warned:
                print(f"gpu-health: warning: emission failed, carrying on: {error!r}", file=sys.stderr, flush=True)
                self._warned = True


def _exit(event: XidEvent) -> None:
    sys.stdout.flush()
    os._exit(GPU_FAULT_EXIT)  # from the monitor's thread: the trainer's collectives on this GPU would hang


def start_monitor(cfg, local_rank: int, environ: Mapping[str, str] | None = None) -> GpuHealthMonitor | None:
    """The monitor of this node's GPUs, started on local rank 0 when NVML sees a GPU; None otherwise."""
    environ = os.environ if environ is None else environ
    if local_rank != 0:
        return None
    standin = environ.get(STANDIN_VARIABLE)
    health = GpuHealth(importlib.import_module(standin) if standin else None)
    if not health.available:
        return None
    monitor = GpuHealthMonitor(cfg, health, on_fatal=_exit)
    monitor.start()
    return monitor
