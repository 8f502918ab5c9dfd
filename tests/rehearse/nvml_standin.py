"""A small NVML stand-in for rehearsals (``TIERED_TRAINING_NVML_STANDIN=tests.rehearse.nvml_standin``): healthy GPUs
(one per worker, ``SM_NUM_GPUS``), and one critical XID that ``NVML_STANDIN_XID="HOST:GPU:XID:SECONDS"`` makes
host HOST's GPU report SECONDS after the monitor starts. Tests only: the container reads pynvml."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

NVML_CLOCK_SM, NVML_TEMPERATURE_GPU, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 1, 0, 1, 0
nvmlEventTypeXidCriticalError = 0x8
_started = time.monotonic()
_sent = False


class NVMLError(Exception):
    pass


def nvmlInit():
    global _started
    _started = time.monotonic()


def nvmlDeviceGetCount():
    return int(os.environ.get("SM_NUM_GPUS", "1"))


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetIndex(handle):
    return handle


def nvmlDeviceGetClockInfo(handle, kind):
    return 1980


def nvmlDeviceGetMaxClockInfo(handle, kind):
    return 1980


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    return 0


def nvmlDeviceGetTemperature(handle, sensor):
    return 60


def nvmlDeviceGetPowerUsage(handle):
    return 500_000


def nvmlDeviceGetTotalEccErrors(handle, kind, counter):
    return 0


def nvmlDeviceGetRemappedRows(handle):
    return (0, 0, 0, 0)


def nvmlEventSetCreate():
    return "events"


def nvmlDeviceRegisterEvents(handle, kinds, events):
    return None


def nvmlEventSetWait_v2(events, timeout_ms):
    global _sent
    host, gpu, xid, seconds = (os.environ.get("NVML_STANDIN_XID") or "::0:0").split(":")
    due = _started + float(seconds)
    if not _sent and host == os.environ.get("SM_CURRENT_HOST") and time.monotonic() + timeout_ms / 1000 >= due:
        time.sleep(max(0.0, due - time.monotonic()))
        _sent = True
        return SimpleNamespace(device=int(gpu), eventType=nvmlEventTypeXidCriticalError, eventData=int(xid))
    time.sleep(timeout_ms / 1000)
    raise NVMLError("NVML_ERROR_TIMEOUT")
