"""The launcher's side of one execution per run (tiered_training/contract/lease.py).

Before torchrun starts, the first host takes the run's lease in the store and a background thread renews it every
``timings.renew_seconds``; it is released when torchrun exits (success, failure, SIGTERM). The other hosts only read
it: they wait (at most ``WAIT_SECONDS``) until the first host holds it, and a live lease of another execution refuses
them too. A job whose Environment names no run prefix (not started by the pipeline, or the probe) takes no lease.

Fencing: a renewal that fails (S3 503, throttling, AccessDenied, no network) is retried until the deadline
(``timings.deadline_seconds`` after the last successful renewal); then the lease counts as lost (``lost`` says why,
naming the lease, the last renewal and the deadline), and the launcher stops the workers. After every renewal the
thread writes the lease's state to a local file (``state_path``: the lease URI, ETag, token, renewed-at and deadline,
or why it was lost), which the workers' rank 0 reads and re-proves against S3 before every commit
(training/components/fence.py). Only the first host holds the lease, and global rank 0, which commits, runs there.
boto3 is the image's (the DLC ships it); torch is not imported.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tiered_training.contract import lease as protocol
from tiered_training.contract.container import EXECUTION_VARIABLE, JOB_NAME_VARIABLE, RUN_URI_VARIABLE

WAIT_SECONDS = 120.0  # how long the other hosts wait for the first host's lease


class LeaseRefused(Exception):
    """This job may not train the run now; the message names the holder."""


def s3_client(environ: Mapping[str, str]) -> Any:
    import boto3

    from training.components.lease_faults import apply_faults

    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or None
    return apply_faults(boto3.client("s3", region_name=region), environ)


class RunLease:
    """The lease of one run, as one host of a training job sees it."""

    def __init__(
        self,
        s3: Any,
        run_uri: str,
        run_id: str,
        holder: protocol.Holder,
        *,
        timings: protocol.Timings | None = None,
        state_path: Path | None = None,
        now: Callable[[], float] = time.time,
        say: Callable[[str], None] = print,
    ):
        self.s3, self.uri, self.run_id, self.holder = s3, protocol.lease_uri(run_uri), run_id, holder
        self.timings = timings or protocol.Timings()
        self.renew_seconds = self.timings.renew_seconds
        self.state_path, self.now, self.say = state_path, now, say
        self.lease: protocol.Lease | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], run_id: str, host: str, **kwargs: Any) -> RunLease | None:
        run_uri = environ.get(RUN_URI_VARIABLE) or ""
        if not run_id or not run_uri:
            return None
        holder = protocol.Holder(environ.get(EXECUTION_VARIABLE) or "", environ.get(JOB_NAME_VARIABLE) or "", host)
        return cls(s3_client(environ), run_uri, run_id, holder, **kwargs)

    def _refusal(self, held: protocol.Lease) -> LeaseRefused:
        return LeaseRefused(
            f"{held.describe(self.now())}; this job ({self.holder.describe()}) does not train it at the same "
            f"time. Wait for that execution to end, or stop it; a lease not renewed by its holder before its "
            f"expiry ({protocol.iso(held.expires)}) is stale and is taken over"
        )

    def take(self) -> None:
        """The first host: acquire the lease and start renewing it."""
        try:
            self.lease = protocol.acquire(
                self.s3, self.uri, self.run_id, self.holder, self.now, stale_seconds=self.timings.stale_seconds
            )
        except protocol.LeaseHeld as held:
            raise self._refusal(held.lease) from None
        except protocol.LeaseLost as error:
            raise LeaseRefused(str(error)) from None
        except Exception as error:  # noqa: BLE001 - botocore's errors: the store cannot be reached or written
            raise LeaseRefused(f"cannot take the lease at {self.uri}: {_short(error)}") from None
        old = self.lease.replaced
        if old is not None:
            self.say(
                f"launcher: lease of run {self.run_id} taken over from {old.holder.describe()}, last renewed at "
                f"{protocol.iso(old.renewed)} (stale since {protocol.iso(old.expires)})"
            )
        t = self.timings
        self.say(
            f"launcher: lease of run {self.run_id} taken at {self.uri} (renewed every {t.renew_seconds:g} s; "
            f"deadline {t.deadline_seconds:g} s, stale after {t.stale_seconds:g} s)"
        )
        self._write_state()
        self._thread = threading.Thread(target=self._renew, name="run-lease", daemon=True)
        self._thread.start()

    def check(self, wait_seconds: float = WAIT_SECONDS, poll_seconds: float = 1.0) -> None:
        """The other hosts: wait until the first host holds the lease; refuse when another execution's live lease
        holds the run. After ``wait_seconds`` without either, go on: the first host failed to start, and the
        rendezvous fails the job."""
        deadline = self.now() + wait_seconds
        while True:
            try:
                held = protocol.read(self.s3, self.uri)
            except Exception as error:  # noqa: BLE001 - the first host's take decides; this host only looks
                self.say(f"launcher: cannot read the lease at {self.uri}: {_short(error)}")
                return
            if held is not None and held.live(self.now()):
                if held.holder.same_as(self.holder):
                    return
                raise self._refusal(held)
            if self.now() >= deadline:
                self.say(f"launcher: no live lease at {self.uri} after {wait_seconds:g} s; going on")
                return
            time.sleep(poll_seconds)

    def deadline(self) -> float:
        """When this holder stops committing unless it renews first (on ``now``'s clock)."""
        assert self.lease is not None
        return self.lease.renewed + self.timings.deadline_seconds

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_seconds):
            assert self.lease is not None
            try:
                self.lease = protocol.renew(
                    self.s3,
                    self.uri,
                    self.lease,
                    self.now,
                    stale_seconds=self.timings.stale_seconds,
                    give_up_at=self.deadline(),
                )
                self._write_state()
                continue
            except protocol.LeaseLost as error:
                self._lose(str(error))
                return
            except Exception as error:  # noqa: BLE001 - retried until the deadline
                self.say(f"launcher: cannot renew the lease at {self.uri}: {_short(error)}")
            if self.now() >= self.deadline():
                self._lose(
                    f"the lease of run {self.run_id} at {self.uri} was not renewed within its deadline: last renewed "
                    f"at {protocol.iso(self.lease.renewed)}, deadline {protocol.iso(self.deadline())} "
                    f"({self.timings.deadline_seconds:g} s); this execution stopped committing and training, "
                    "as another may take the run over once the lease is stale"
                )
                return

    def _lose(self, reason: str) -> None:
        self.lost = reason
        self._write_state()
        self.say(f"launcher: error: {reason}")

    def _write_state(self) -> None:
        """The lease's state for the workers (training/components/fence.py), replaced atomically."""
        if self.state_path is None or self.lease is None:
            return
        lease = self.lease
        state = {
            "uri": self.uri,
            "run_id": self.run_id,
            "etag": lease.etag,
            "token": lease.token,
            "execution": self.holder.execution,
            "training_job": self.holder.job,
            "host": self.holder.host,
            "renewed": lease.renewed,
            "deadline_seconds": self.timings.deadline_seconds,
            "lost": self.lost,
        }
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_path)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.state_path is not None:
            self.state_path.unlink(missing_ok=True)
        if self.lease is None or self.lost:
            return
        try:
            released = protocol.release(self.s3, self.uri, self.lease)
        except Exception as error:  # noqa: BLE001 - it goes stale on its own
            self.say(f"launcher: cannot release the lease at {self.uri}: {_short(error)}")
            return
        self.lease = None
        if released:
            self.say(f"launcher: lease of run {self.run_id} released")


def _short(error: BaseException) -> str:
    return str(error).splitlines()[0][:300] if str(error) else type(error).__name__
