"""Failure reasons: which of several errors names the cause.

When one rank or host fails, the others fail after it: their collectives see the peer's
connection close (gloo), NCCL aborts the communicator, a collective or the c10d store times
out, or the rendezvous times out. Those errors are consequences. A timeout of anything else
(reading a data shard, a download) is a cause. A job's FailureReason lists the errors that are
not consequences first, and among them a GPU's own fault (an XID, an uncorrectable ECC error, a lost GPU: the
container's NVML monitor writes it with :data:`GPU_FAULT_PREFIX`) before anything else.
"""

from __future__ import annotations

import re

# Messages of an error caused by another process's exit (gloo's TCP transport, NCCL's abort,
# c10d's store, torchrun's SIGTERM to the surviving workers).
CONSEQUENCE = re.compile(
    r"connection closed by peer|connection reset by peer|broken pipe|connection refused"
    r"|communicator was aborted|ncclRemoteError|NCCL communicator .*abort|ProcessGroupNCCL.*(abort|watchdog)"
    r"|DistNetworkError|DistStoreError|Rendezvous\w*Error|remote process exited|peer .*(closed|exited|disconnected)"
    r"|Signal 15|SIGTERM|SignalException",
    re.IGNORECASE,
)
TIMEOUT = re.compile(r"timed out|time ?out", re.IGNORECASE)
# A timeout is a consequence only when it is a collective's, the store's or the rendezvous's: the
# peer it waited for is gone. Words of PyTorch's messages (gloo, NCCL, c10d, torchrun).
DISTRIBUTED = re.compile(
    r"gloo|nccl|c10d|ProcessGroup|WorkNCCL|watchdog|collective|all_?reduce|all_?gather|reduce_scatter|broadcast"
    r"|barrier|rendezvous|TCPStore|\bstore\b|(recv|send) operation|waiting for clients|clients joined",
    re.IGNORECASE,
)


GPU_FAULT_PREFIX = "GpuFault:"  # training/components/gpu_health.py starts its failure line with it
GPU_FAULT = re.compile(
    re.escape(GPU_FAULT_PREFIX) + r"|\bXID \d+|uncorrectable ECC|fallen off the bus",
    re.IGNORECASE,
)


def is_gpu_fault(text: str) -> bool:
    """True when the error is a GPU's own fault, the cause of the timeouts it brings on other ranks."""
    return bool(GPU_FAULT.search(text))


def is_consequence(text: str) -> bool:
    """True when the error reads as a consequence of another rank's or host's exit."""
    if CONSEQUENCE.search(text):
        return True
    return bool(TIMEOUT.search(text) and DISTRIBUTED.search(text))


def causes_first(reasons: list[str]) -> list[str]:
    """``reasons`` with a GPU's own faults first, then the other errors that are not consequences, then the
    consequences, each group in its order."""
    return sorted(reasons, key=lambda text: 0 if is_gpu_fault(text) else 1 + is_consequence(text))  # stable
