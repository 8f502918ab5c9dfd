"""One execution per run: a lease object in the run's checkpoint prefix (``<run prefix>lease.json``).

The lease names its holder (the pipeline execution, the training job, the host, and a token drawn at each
acquisition) and three times: acquired, renewed and expires (renewed + the holder's staleness). Every write is an S3
conditional write, so two writers cannot both win:

- **acquire**: PutObject with ``IfNoneMatch="*"`` (no lease yet). If one exists, it is taken, with ``IfMatch`` on
  the ETag just read, when it is this holder's own (the same training job restarted by its RetryStrategy, or the
  same execution: a retried step, the next segment) or stale (its ``expires`` has passed); otherwise
  :class:`LeaseHeld` names the holder. Taking another holder's stale lease is a takeover (``Lease.replaced``).
- **renew**: PutObject with ``IfMatch`` on the lease's ETag, every ``renew_seconds``. Renewal is idempotent: after
  a 412 (or a 404) the lease is read, and if it still names this holder and token (a write S3 applied whose response
  was lost, retried by botocore with the old ETag), its ETag is adopted; otherwise :class:`LeaseLost`. A 409
  (``ConditionalRequestConflict``: S3 says retry), a 5xx, throttling or a lost connection is retried until the
  caller's deadline.
- **prove**: before every commit, HeadObject with ``IfMatch`` on the ETag of the last renewal, and the local
  deadline: :class:`LeaseExpired` or :class:`LeaseLost` when the lease is no longer provably this holder's.
- **release**: DeleteObject with ``IfMatch``: only the lease this holder still holds is removed.

Fencing: a holder not renewed for ``deadline_seconds`` (D) stops committing and training. Let R be its last renewal
(on its own clock, written as ``renewed``; ``expires`` = R + S). It starts no write after R + D, and a write it
started lands within the longest save W (``checkpoint.shutdown_deadline_seconds``: the save and its upload). A taker
judges ``expires`` on its own clock, which may differ from the holder's by the skew K, so it writes no earlier than
R + S - K. No write of the old holder lands after the takeover when R + D + W < R + S - K, that is

    S > D + W + K        defaults: 300 s > 150 s + 110 s + 10 s = 270 s

:meth:`Timings.problem` refuses settings that break it. K: EC2 instances, SageMaker's included, keep UTC with the
Amazon Time Sync Service (satellite-connected and atomic reference clocks in every Region,
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/set-time.html), to which chrony typically reports offsets under a
millisecond; AWS publishes no bound for training instances (S3 itself only refuses requests signed more than 15
minutes off, ``RequestTimeTooSkewed``), so K = 10 s allows 10,000 times the usual offset. A holder that dies without
releasing (instance lost, SIGKILL) blocks its run for at most S after its last renewal.

The S3 client is passed in (boto3's, or any with the same calls and ``ClientError`` codes); nothing here imports
boto3, so the CLI and the container's launcher share this one protocol.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from tiered_training.contract.container import (
    LEASE_CLOCK_SKEW_SECONDS,
    LEASE_DEADLINE_SECONDS,
    LEASE_DEADLINE_VARIABLE,
    LEASE_NAME,
    LEASE_RENEW_SECONDS,
    LEASE_RENEW_VARIABLE,
    LEASE_SKEW_VARIABLE,
    LEASE_STALE_RENEWALS,
    LEASE_STALE_VARIABLE,
)

RENEW_SECONDS = LEASE_RENEW_SECONDS
STALE_SECONDS = LEASE_RENEW_SECONDS * LEASE_STALE_RENEWALS
CONFLICTS = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
PRECONDITION = ("PreconditionFailed", "412")
RETRY = (  # S3 says: try again (a conflicting conditional write in flight, an error on its side, throttling)
    ("ConditionalRequestConflict", "409", "InternalError", "ServiceUnavailable", "SlowDown", "Throttling")
    + ("ThrottlingException", "RequestTimeout", "500", "502", "503", "504")
)
MISSING = ("NoSuchKey", "404", "NotFound")
ATTEMPTS = 4  # acquire's read-and-take rounds before it gives up on a lease that keeps changing


class LeaseHeld(Exception):
    """Another execution holds the run's live lease."""

    def __init__(self, lease: Lease, now: float):
        super().__init__(lease.describe(now))
        self.lease = lease


class LeaseLost(Exception):
    """The lease this holder renews was taken over (or removed) by someone else."""


class LeaseExpired(Exception):
    """The holder has not renewed its lease within its deadline: it may no longer commit."""


@dataclass(frozen=True)
class Timings:
    """The lease's timings in seconds (the module's docstring derives the rule between them)."""

    renew_seconds: float = LEASE_RENEW_SECONDS
    deadline_seconds: float = LEASE_DEADLINE_SECONDS
    stale_seconds: float = STALE_SECONDS
    skew_seconds: float = LEASE_CLOCK_SKEW_SECONDS

    def problem(self, save_seconds: float) -> str | None:
        """Why these timings cannot fence a holder whose longest save takes ``save_seconds``, or None."""
        if not 0 < self.renew_seconds < self.deadline_seconds:
            return (
                f"the lease's renew interval ({self.renew_seconds:g} s, {LEASE_RENEW_VARIABLE}) must be more than 0 "
                f"and less than its deadline ({self.deadline_seconds:g} s, {LEASE_DEADLINE_VARIABLE})"
            )
        if self.skew_seconds < 0:
            return f"the clock skew allowed for ({self.skew_seconds:g} s, {LEASE_SKEW_VARIABLE}) must be at least 0"
        needed = self.deadline_seconds + save_seconds + self.skew_seconds
        if self.stale_seconds <= needed:
            return (
                f"the lease's staleness ({self.stale_seconds:g} s, {LEASE_STALE_VARIABLE}) must exceed its deadline "
                f"({self.deadline_seconds:g} s) + the longest save (checkpoint.shutdown_deadline_seconds, "
                f"{save_seconds:g} s) + the clock skew ({self.skew_seconds:g} s) = {needed:g} s, or an old "
                "holder's last write could land after a takeover"
            )
        return None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], save_seconds: float) -> Timings:
        """The training job's settings (the container's defaults for those not set); ValueError naming the variable
        when one is not a number or the timings break the rule. Without a staleness set, it is the default or, for a
        longer save, the least that keeps the rule plus one renewal."""
        values: dict[str, float] = {}
        for name, variable in (
            ("renew_seconds", LEASE_RENEW_VARIABLE),
            ("deadline_seconds", LEASE_DEADLINE_VARIABLE),
            ("stale_seconds", LEASE_STALE_VARIABLE),
            ("skew_seconds", LEASE_SKEW_VARIABLE),
        ):
            text = (environ.get(variable) or "").strip()
            if text:
                try:
                    values[name] = float(text)
                except ValueError:
                    raise ValueError(f"{variable}={text[:40]!r}: expected a number of seconds") from None
        timings = cls(**values)
        if LEASE_STALE_VARIABLE not in environ or not environ[LEASE_STALE_VARIABLE].strip():
            least = timings.deadline_seconds + save_seconds + timings.skew_seconds + timings.renew_seconds
            timings = replace(timings, stale_seconds=max(timings.stale_seconds, least))
        problem = timings.problem(save_seconds)
        if problem:
            raise ValueError(problem)
        return timings


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
    token: str = ""  # drawn at each acquisition: a renewal recognises its own write by it
    replaced: Lease | None = None  # the stale lease of another holder that acquire took over

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
                "token": self.token,
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
                str(found.get("token") or ""),
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


def acquire(
    s3: Any,
    uri: str,
    run_id: str,
    holder: Holder,
    now: Callable[[], float] = time.time,
    *,
    stale_seconds: float = STALE_SECONDS,
) -> Lease:
    """Take the run's lease (see the module's docstring), or raise :class:`LeaseHeld`."""
    bucket, key = _split(uri)
    current: Lease | None = None
    token = uuid.uuid4().hex
    for _ in range(ATTEMPTS):
        t = now()
        lease = Lease(run_id, holder, t, t, t + stale_seconds, token=token)
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
            taken = current if current is not None and not current.holder.same_as(holder) else None
            return replace(lease, etag=etag, replaced=taken)
        except Exception as error:
            if _code(error) not in CONFLICTS and not (current is not None and _code(error) in MISSING):
                raise
        current = read(s3, uri)  # someone else wrote (or removed) it in between: decide again on what is there
    if current is not None and current.live(now()) and not current.holder.same_as(holder):
        raise LeaseHeld(current, now())
    raise LeaseLost(f"the lease at {uri} kept changing while {holder.describe()} tried to take it")


def renew(
    s3: Any,
    uri: str,
    lease: Lease,
    now: Callable[[], float] = time.time,
    *,
    stale_seconds: float = STALE_SECONDS,
    give_up_at: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Lease:
    """The lease rewritten with new renewed and expires times, if it is still this holder's (see the module's
    docstring); S3's "try again" answers are retried until ``give_up_at`` (on ``now``'s clock), then raised."""
    bucket, key = _split(uri)
    t = now()
    renewed = replace(lease, renewed=t, expires=t + stale_seconds, replaced=None)
    body = renewed.body()
    delay = 0.1
    while True:
        try:
            etag = s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json", IfMatch=lease.etag)[
                "ETag"
            ]
            return replace(renewed, etag=etag)
        except Exception as error:
            code = _code(error)
            if code in PRECONDITION + MISSING:
                found = read(s3, uri)
                if found is not None and found.holder == lease.holder and lease.token and found.token == lease.token:
                    return replace(found, run_id=lease.run_id)  # this holder's own write: adopt its ETag
                raise LeaseLost(
                    f"the lease of run {lease.run_id} was taken over: "
                    + (found.describe(t) if found is not None else "it was removed")
                ) from None
            if not _retryable(error) or give_up_at is None or now() + delay >= give_up_at:
                raise
        sleep(delay)
        delay = min(delay * 2, 5.0)


def prove(
    s3: Any,
    uri: str,
    lease: Lease,
    deadline_seconds: float,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Raise unless ``lease`` is still this holder's: renewed within ``deadline_seconds`` (:class:`LeaseExpired`)
    and still the object at ``uri`` (a HeadObject with ``IfMatch`` on its ETag; :class:`LeaseLost`). S3's "try
    again" answers are retried until the deadline; its other errors are raised as they are: a lease that cannot be
    proven is not this holder's to commit under."""
    bucket, key = _split(uri)
    deadline = lease.renewed + deadline_seconds
    delay = 0.1
    while True:
        t = now()
        if t >= deadline:
            raise LeaseExpired(
                f"the lease {uri} was last renewed at {_iso(lease.renewed)}; its deadline "
                f"{_iso(deadline)} ({deadline_seconds:g} s later) has passed"
            )
        try:
            s3.head_object(Bucket=bucket, Key=key, IfMatch=lease.etag)
            return
        except Exception as error:
            if _code(error) in PRECONDITION + MISSING:
                found = read(s3, uri)
                raise LeaseLost(
                    f"the lease {uri} (last renewed by this holder at {_iso(lease.renewed)}) is no longer this "
                    "holder's: " + (found.describe(now()) if found is not None else "it was removed")
                ) from None
            if not _retryable(error):
                raise
        sleep(min(delay, max(0.0, deadline - now())))
        delay = min(delay * 2, 5.0)


def iso(seconds: float) -> str:
    """A lease time as written in its body (UTC, ISO 8601)."""
    return _iso(seconds)


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


def _retryable(error: BaseException) -> bool:
    """An answer S3 says to retry, or no answer at all (botocore's connection and read-timeout errors)."""
    code = _code(error)
    return code in RETRY or (not code and type(error).__module__.startswith(("botocore", "urllib3")))


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"not an S3 URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(text: Any) -> float:
    return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
