"""Failure reasons: which of several errors names the cause.

When one rank or host fails, the others fail after it: their collectives see the peer's
connection close (gloo), NCCL aborts the communicator, or the rendezvous times out.
Those errors are consequences. A job's FailureReason lists the errors that are not first.
"""

from __future__ import annotations

import re

# Messages of an error caused by another process's exit (gloo's TCP transport, NCCL's abort,
# c10d's store and timeouts, torchrun's SIGTERM to the surviving workers).
CONSEQUENCE = re.compile(
    r"connection closed by peer|connection reset by peer|broken pipe|connection refused"
    r"|communicator was aborted|ncclRemoteError|NCCL communicator .*abort|ProcessGroupNCCL.*(abort|watchdog)"
    r"|DistNetworkError|DistStoreError|remote process exited|peer .*(closed|exited|disconnected)"
    r"|timed out|timeout|Signal 15|SIGTERM|SignalException",
    re.IGNORECASE,
)


def is_consequence(text: str) -> bool:
    """True when the error reads as a consequence of another rank's or host's exit."""
    return bool(CONSEQUENCE.search(text))


def causes_first(reasons: list[str]) -> list[str]:
    """``reasons`` with the errors that are not consequences first, each group in its order."""
    return sorted(reasons, key=is_consequence)  # stable: False sorts before True
