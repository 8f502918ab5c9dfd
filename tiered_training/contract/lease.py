"""One execution per run: a lease object in the run's checkpoint prefix (``<run prefix>lease.json``).

The lease names its holder (the pipeline execution, the training job, the host) and three times: acquired, renewed
and expires (renewed + :data:`STALE_SECONDS`). Every write is an S3 conditional write, so two writers cannot both win:

- **acquire**: PutObject with ``IfNoneMatch="*"`` (no lease yet). If one exists, it is taken, with ``IfMatch`` on
  the ETag just read, when it is this holder's own (the same training job restarted by its RetryStrategy, or the
  same execution: a retried step, the next segment) or stale (its ``expires`` has passed); otherwise
  :class:`LeaseHeld` names the holder.
- **renew**: PutObject with ``IfMatch`` on the lease's ETag, every :data:`RENEW_SECONDS`; a mismatch is
  :class:`LeaseLost` (another holder took it over after this one stopped renewing).
- **release**: DeleteObject with ``IfMatch``: only the lease this holder still holds is removed.

A holder that dies without releasing (instance lost, SIGKILL) blocks its run for at most :data:`STALE_SECONDS` after
its last renewal; expiry is judged on the reader's clock against the holder's, so clocks must agree to well within
that (EC2 instances keep time with the Amazon Time Sync Service).

The S3 client is passed in (boto3's, or any with the same calls and ``ClientError`` codes); nothing here imports
boto3, so the CLI and the container's launcher share this one protocol.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from tiered_training.contract.container import LEASE_NAME, LEASE_RENEW_SECONDS, LEASE_STALE_RENEWALS

RENEW_SECONDS = LEASE_RENEW_SECONDS
STALE_SECONDS = LEASE_RENEW_SECONDS * LEASE_STALE_RENEWALS
CONFLICTS = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
MISSING = ("NoSuchKey", "404", "NotFound")
ATTEMPTS = 4  # acquire's read-and-take rounds before it gives up on a lease that keeps changing


class LeaseHeld(Exception):
    """Another execution holds the run's live lease."""

    def __init__(self, lease: Lease, now: float):
        super().__init__(lease.describe(now))
        self.lease = lease


class LeaseLost(Exception):
    """The lease this holder renews was taken over (or removed) by someone else."""


@dataclass(frozen=True)
class Holder:
    execution: str  # the pipeline execution's ARN (or id); "" outside a pipeline
    job: str  # the training job's name (SageMaker's TRAINING_JOB_NAME)
    host: str = ""

    def same_as(self, other: Holder) -> bool:
        """The same training job (restarted by its RetryStrategy), or another job of the same execution."""
        return bool(self.job and self.job == other.job) or bool(self.execution and self.execution == other.execution)

    def describe(self) -> str:
        execution = self.execution or "an unknown execution"
        return f"execution {execution}" + (f" (training job {self.job})" if self.job else "")


@dataclass(frozen=True)
class Lease:
    run_id: str
    holder: Holder
    acquired: float
    renewed: float
    expires: float
    etag: str = ""

    def live(self, now: float) -> bool:
        return now < self.expires

    def body(self) -> bytes:
        return json.dumps(
            {
                "run_id": self.run_id,
                "execution": self.holder.execution,
                "training_job": self.holder.job,
                "host": self.holder.host,
                "acquired": _iso(self.acquired),
                "renewed": _iso(self.renewed),
                "expires": _iso(self.expires),
                "renew_seconds": RENEW_SECONDS,
                "write": uuid.uuid4().hex,  # every write its own ETag, even within one clock tick
            },
            indent=1,
        ).encode()

    @classmethod
    def parse(cls, data: bytes, etag: str, last_modified: float) -> Lease:
        """A lease from its body; an unreadable body counts as renewed when it was last written."""
        try:
            found = json.loads(data)
            if not isinstance(found, dict):
                raise ValueError
            holder = Holder(
                str(found.get("execution") or ""), str(found.get("training_job") or ""), str(found.get("host") or "")
            )
            renewed = _epoch(found["renewed"])
            return cls(
                str(found.get("run_id") or ""),
                holder,
                _epoch(found["acquired"]),
                renewed,
                _epoch(found["expires"]),
                etag,
            )
        except (ValueError, KeyError, TypeError):
            return cls("", Holder("", ""), last_modified, last_modified, last_modified + STALE_SECONDS, etag)

    def describe(self, now: float) -> str:
        left = self.expires - now
        state = f"live for {left:.0f} s more unless renewed" if left > 0 else f"stale for {-left:.0f} s"
        return (
            f"run {self.run_id or '?'} is held by {self.holder.describe()} since {_iso(self.acquired)}, "
            f"last renewed {_iso(self.renewed)} ({state})"
        )


def lease_uri(run_uri: str) -> str:
    """``s3://bucket/<recipe>/checkpoints/runs/<run>/lease.json`` for the run's prefix."""
    return run_uri.rstrip("/") + "/" + LEASE_NAME


def read(s3: Any, uri: str) -> Lease | None:
    """The run's lease, or None when there is none."""
    bucket, key = _split(uri)
    try:
        response = s3.get_object(Bucket=bucket, Key=key)
    except Exception as error:
        if _code(error) in MISSING:
            return None
        raise
    modified = response.get("LastModified")
    return Lease.parse(
        response["Body"].read(), response.get("ETag", ""), modified.timestamp() if modified else time.time()
    )


def acquire(s3: Any, uri: str, run_id: str, holder: Holder, now: Callable[[], float] = time.time) -> Lease:
    """Take the run's lease (see the module's docstring), or raise :class:`LeaseHeld`."""
    bucket, key = _split(uri)
    current: Lease | None = None
    for _ in range(ATTEMPTS):
        t = now()
        lease = Lease(run_id, holder, t, t, t + STALE_SECONDS)
        if current is None:
            condition = {"IfNoneMatch": "*"}
        elif current.holder.same_as(holder) or not current.live(t):
            condition = {"IfMatch": current.etag}
        else:
            raise LeaseHeld(current, t)
        try:
            etag = s3.put_object(
                Bucket=bucket, Key=key, Body=lease.body(), ContentType="application/json", **condition
            )["ETag"]
            return replace(lease, etag=etag)
        except Exception as error:
            if _code(error) not in CONFLICTS and not (current is not None and _code(error) in MISSING):
                raise
        current = read(s3, uri)  # someone else wrote (or removed) it in between: decide again on what is there
    if current is not None and current.live(now()) and not current.holder.same_as(holder):
        raise LeaseHeld(current, now())
    raise LeaseLost(f"the lease at {uri} kept changing while {holder.describe()} tried to take it")


def renew(s3: Any, uri: str, lease: Lease, now: Callable[[], float] = time.time) -> Lease:
    """The lease rewritten with new renewed and expires times, if it is still this holder's."""
    bucket, key = _split(uri)
    t = now()
    renewed = replace(lease, renewed=t, expires=t + STALE_SECONDS)
    try:
        etag = s3.put_object(
            Bucket=bucket, Key=key, Body=renewed.body(), ContentType="application/json", IfMatch=lease.etag
        )["ETag"]
    except Exception as error:
        if _code(error) in CONFLICTS + MISSING:
            other = read(s3, uri)
            raise LeaseLost(
                f"the lease of run {lease.run_id} was taken over: "
                + (other.describe(t) if other is not None else "it was removed")
            ) from None
        raise
    return replace(renewed, etag=etag)


def release(s3: Any, uri: str, lease: Lease) -> bool:
    """Remove the lease if this holder still holds it; whether it did."""
    bucket, key = _split(uri)
    try:
        s3.delete_object(Bucket=bucket, Key=key, IfMatch=lease.etag)
    except Exception as error:
        if _code(error) in CONFLICTS + MISSING:
            return False
        raise
    return True


def _code(error: BaseException) -> str:
    """The AWS error code of a botocore ClientError (or its HTTP status), else ""."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return ""
    code = str((response.get("Error") or {}).get("Code") or "")
    return code or str((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or "")


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"not an S3 URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(text: Any) -> float:
    return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
