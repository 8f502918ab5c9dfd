"""The workers' side of the run's lease: before every commit, rank 0 proves the lease is still this execution's.

The first host's launcher holds the lease and keeps its state in a local file named by
:data:`LEASE_STATE_VARIABLE` (training/components/run_lease.py: the lease URI, the ETag and token of the last
renewal, when it was renewed, the deadline, or why it was lost). :class:`Fence` reads that file and refuses
(:class:`LeaseFenced`) when the lease was lost or its deadline has passed; otherwise it proves the lease against S3
(a HeadObject with ``IfMatch`` on that ETag, tiered_training/contract/lease.py ``prove``). A 412 is read again once:
the launcher may have renewed between the file's read and the request. Any other S3 error refuses too: a commit
that cannot be proven is not made.

Global rank 0 commits (the COMMITTED marker, the pruning, the export) and runs on the first host, the lease's; the
other hosts' workers get no state file and no fence. Without a lease (no run prefix, the probe, a local run) there is
no fence. torch is not imported.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tiered_training.contract import lease as protocol
from tiered_training.contract.container import EXECUTION_VARIABLE, JOB_NAME_VARIABLE, LEASE_STATE_VARIABLE


class LeaseFenced(RuntimeError):
    """A commit refused: the run's lease is no longer provably this execution's."""


class Fence:
    """Called with what is about to be committed; raises :class:`LeaseFenced` unless the lease is still held."""

    def __init__(self, state_path: Path, s3: Any, now: Callable[[], float] = time.time):
        self.state_path, self.s3, self.now = state_path, s3, now

    def __call__(self, what: str) -> None:
        for attempt in range(2):
            uri, lease, deadline, lost = self._state(what)
            if lost:
                raise LeaseFenced(f"{what} NOT committed: {lost}")
            try:
                protocol.prove(self.s3, uri, lease, deadline, self.now)
                return
            except protocol.LeaseExpired as error:
                raise LeaseFenced(f"{what} NOT committed: {error}; this execution stops") from None
            except protocol.LeaseLost as error:
                if attempt == 0:
                    continue  # renewed in between? read the state again
                raise LeaseFenced(f"{what} NOT committed: {error}") from None
            except Exception as error:  # noqa: BLE001 - botocore's: unproven, so not committed
                first = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
                raise LeaseFenced(f"{what} NOT committed: cannot prove the lease {uri}: {first}") from None

    def _state(self, what: str) -> tuple[str, protocol.Lease, float, str | None]:
        try:
            state = json.loads(self.state_path.read_text())
            holder = protocol.Holder(state["execution"], state["training_job"], state["host"])
            renewed = float(state["renewed"])
            lease = protocol.Lease(state["run_id"], holder, renewed, renewed, renewed, state["etag"], state["token"])
            return state["uri"], lease, float(state["deadline_seconds"]), state.get("lost")
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise LeaseFenced(
                f"{what} NOT committed: the launcher's lease state {self.state_path} is unreadable ({error})"
            ) from None


def from_environment(environ: Mapping[str, str]) -> Fence | None:
    """The fence of a worker whose launcher holds the run's lease, else None."""
    path = environ.get(LEASE_STATE_VARIABLE) or ""
    if not path:
        return None
    from training.components.run_lease import s3_client

    return Fence(Path(path), s3_client(environ))


def writer_of(environ: Mapping[str, str]) -> dict[str, str]:
    """The pipeline execution and training job that write this run's checkpoints (empty outside a pipeline)."""
    found = {"execution": environ.get(EXECUTION_VARIABLE) or "", "job": environ.get(JOB_NAME_VARIABLE) or ""}
    return {key: value for key, value in found.items() if value}
