"""NVML readings and XID events (training/components/gpu_health.py) through a small NVML stand-in, injected here
only: the module's production path imports pynvml, and without NVML or a GPU it reads nothing."""

from __future__ import annotations

import io
import queue
from types import SimpleNamespace

import pytest

from tiered_training.contract import metrics as catalogue
from tiered_training.contract.failures import causes_first
from training.components.gpu_health import GpuHealth, GpuHealthMonitor, XidEvent
from training.components.metrics import parse_emf_lines
from training.launcher import failure_reason

from .helpers import tiny_config
from .test_runtime_metrics import T0, Clock


class NotSupported(Exception):
    pass


class StandInNvml:
    """The pynvml calls gpu_health makes, answering for ``gpus`` GPUs; ``unsupported`` queries raise."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, gpus=2, unsupported=(), **per_gpu):
        self.gpus, self.unsupported = gpus, set(unsupported)
        self.state = {"sm": [1980] * gpus, "max_sm": [1980] * gpus, "reasons": [0] * gpus, "temp": [60] * gpus,
                      "power": [700_000] * gpus, "ecc": [0] * gpus, "rows": [(0, 0, 0, 0)] * gpus}
        self.state.update(per_gpu)
        self.events: queue.Queue = queue.Queue()

    def _call(self, name, value):
        if name in self.unsupported:
            raise NotSupported(name)
        return value

    def nvmlInit(self):
        if "init" in self.unsupported:
            raise NotSupported("driver not loaded")

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetIndex(self, handle):
        return handle

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self._call("sm", self.state["sm"][h])

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return self._call("sm", self.state["max_sm"][h])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._call("reasons", self.state["reasons"][h])

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._call("temp", self.state["temp"][h])

    def nvmlDeviceGetPowerUsage(self, h):
        return self._call("power", self.state["power"][h])

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return self._call("ecc", self.state["ecc"][h])

    def nvmlDeviceGetRemappedRows(self, h):
        return self._call("rows", self.state["rows"][h])

    def nvmlEventSetCreate(self):
        return self._call("events", "set")

    def nvmlDeviceRegisterEvents(self, h, kinds, events):
        return None

    def nvmlEventSetWait_v2(self, events, timeout_ms):
        try:
            gpu, xid = self.events.get_nowait()
        except queue.Empty:
            raise NotSupported("timeout") from None
        return SimpleNamespace(device=gpu, eventData=xid, eventType=0x8)


def _values(event):
    names = [m["Name"] for m in event["_aws"]["CloudWatchMetrics"][0]["Metrics"]]
    return {name: event[name] for name in names}


def test_each_gpu_reports_its_clocks_throttling_heat_power_and_memory_errors():
    # GPU 0 at its software power cap only (a busy, healthy GPU); GPU 1 in a hardware thermal slowdown too
    nvml = StandInNvml(gpus=2, sm=[1980, 1400], reasons=[0x04, 0x40 | 0x04], temp=[61, 88], ecc=[0, 3],
                       rows=[(0, 0, 0, 0), (0, 2, 1, 0)])
    out = io.StringIO()
    monitor = GpuHealthMonitor(tiny_config(), GpuHealth(nvml), node="algo-2", stream=out, clock=Clock(T0),
                               failure_dir="")
    monitor.emit()
    events = parse_emf_lines(out.getvalue())
    assert [(e["Node"], e["Gpu"]) for e in events] == [("algo-2", "0"), ("algo-2", "1")]
    for event in events:
        directive = event["_aws"]["CloudWatchMetrics"][0]
        assert tuple(directive["Dimensions"][0]) == catalogue.GPU_DIMENSIONS
        assert {m["Name"] for m in directive["Metrics"]} == {s.name for s in catalogue.GPU_HEALTH}
        for metric in directive["Metrics"]:
            assert metric["Unit"] == catalogue.BY_NAME[metric["Name"]].unit
    healthy, sick = (_values(e) for e in events)
    assert healthy["GpuSmClockFraction"] == 100.0 and sick["GpuSmClockFraction"] == pytest.approx(70.707, abs=1e-3)
    assert (sick["GpuThrottleThermal"], sick["GpuThrottlePower"], sick["GpuThrottleHardware"]) == (1, 1, 0)
    assert (healthy["GpuThrottleThermal"], healthy["GpuThrottlePower"]) == (0, 1)
    assert (healthy["GpuSlowdown"], sick["GpuSlowdown"]) == (0, 1)  # the power cap alone is no slowdown
    assert (sick["GpuTemperature"], sick["GpuPowerWatts"], sick["GpuEccUncorrected"]) == (88, 700.0, 3)
    assert (sick["GpuRemappedRowsPending"], sick["GpuRemappedRowsFailed"]) == (1, 0)


def test_what_nvml_cannot_say_is_left_out():
    nvml = StandInNvml(gpus=1, unsupported={"ecc", "rows", "events"})
    health = GpuHealth(nvml)
    (values,) = health.read()
    names = {spec.name for spec, _ in values}
    assert "GpuEccUncorrected" not in names and "GpuRemappedRowsPending" not in names
    assert "GpuTemperature" in names
    assert health.wait_xid(0) is None  # no event set: no XID, never a made-up one
    assert not GpuHealth(StandInNvml(unsupported={"init"})).available  # no driver: nothing at all
    assert not GpuHealth(StandInNvml(gpus=0)).available


def test_a_fatal_xid_is_the_first_thing_the_failure_reason_says(tmp_path):
    """XID 79 on algo-2's GPU 1 is written to the launcher's failure directory at once; the ranks that then time
    out in a collective, and one whose CUDA call fails, come after it."""
    nvml = StandInNvml(gpus=2)
    out = io.StringIO()
    failures = tmp_path / "failures"
    failures.mkdir()
    monitor = GpuHealthMonitor(tiny_config(), GpuHealth(nvml), node="algo-2", stream=out, clock=Clock(T0),
                               failure_dir=str(failures), rank="8")
    nvml.events.put((1, 13))  # a graphics exception: reported, not fatal
    nvml.events.put((1, 79))
    assert monitor.step(0) == XidEvent(1, 13) and monitor.step(0) == XidEvent(1, 79) and monitor.step(0) is None
    assert "gpu-health: XID 79 on algo-2 GPU 1 (GPU has fallen off the bus): the GPU cannot go on" in out.getvalue()
    assert [p.name for p in failures.iterdir()] == ["rank-8-gpu1"]
    (failures / "rank-9").write_text("DistBackendError: [c10d] NCCL collective operation timed out after 600000 ms\n")
    (failures / "rank-8").write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    reason = failure_reason(failures, 1, "algo-2")
    assert reason == "algo-2 rank-8-gpu1: GpuFault: XID 79 on algo-2 GPU 1 (GPU has fallen off the bus)"
    (event, other) = parse_emf_lines(out.getvalue())  # sent at once with a fatal XID: this interval's, per GPU
    assert event["GpuXidErrors"] == 0 and other["GpuXidErrors"] == 2 and other["Gpu"] == "1"


def test_across_hosts_the_gpu_fault_comes_before_other_causes_and_the_timeouts():
    reasons = ["algo-1 rank-0: ValueError: shard 3 is truncated",
               "algo-1 rank-2: DistBackendError: gloo collective timed out",
               "algo-3 rank-21-gpu5: GpuFault: XID 48 on algo-3 GPU 5 (double-bit (uncorrectable) ECC error)"]
    assert causes_first(reasons) == [reasons[2], reasons[0], reasons[1]]


def test_without_nvml_or_on_other_ranks_no_monitor_starts():
    from training.components.gpu_health import start_monitor

    assert start_monitor(tiny_config(), local_rank=1) is None
    if not GpuHealth().available:  # this machine: no NVIDIA driver, so the real pynvml reads nothing
        assert start_monitor(tiny_config(), local_rank=0) is None
