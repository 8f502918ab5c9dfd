"""Fencing the run's lease when S3 misbehaves (moto's S3 on 127.0.0.1, wrapped to answer 503, 409, AccessDenied, or
to apply a write and lose its response): renewals that are idempotent and retried, a holder that stops at its
deadline, and the workers' fence that proves the lease before a commit."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest

pytest.importorskip("moto")
pytest.importorskip("boto3")

from botocore.exceptions import ClientError  # noqa: E402

from tiered_training.contract import lease as protocol  # noqa: E402
from tiered_training.rehearse.s3 import LocalS3  # noqa: E402
from training.components.fence import Fence, LeaseFenced  # noqa: E402
from training.components.run_lease import RunLease  # noqa: E402

BUCKET = "lease-fencing-store"
RUN_URI = f"s3://{BUCKET}/recipe/checkpoints/runs/run-1/"
URI = protocol.lease_uri(RUN_URI)
KEY = URI.split("/", 3)[3]
A = protocol.Holder("arn:aws:sagemaker:us-east-1:1:pipeline/p/execution/aaa", "p-Resume-aaa", "algo-1")
B = protocol.Holder("arn:aws:sagemaker:us-east-1:1:pipeline/p/execution/bbb", "p-Resume-bbb", "algo-1")
FAST = protocol.Timings(renew_seconds=0.05, deadline_seconds=0.4, stale_seconds=1.0, skew_seconds=0.0)


def _error(code: str, status: int, operation: str = "PutObject") -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
    )


class Faulty:
    """S3 as the holder sees it: the lease object's PutObject (or HeadObject) answers from ``faults`` first, in order.
    ``"lost"`` applies the write and loses its response; botocore then sends the same request again (the old ETag),
    which S3 answers itself. ``always``: every lease request answers with that error."""

    def __init__(self, client, faults=(), always: ClientError | None = None):
        self.client, self.faults, self.always = client, list(faults), always
        self.calls = 0

    def put_object(self, **kwargs):
        if kwargs["Key"] == KEY:
            self.calls += 1
            if self.always is not None:
                raise self.always
            if self.faults:
                fault = self.faults.pop(0)
                if fault == "lost":
                    self.client.put_object(**kwargs)  # applied; the response never arrives
                    return self.client.put_object(**kwargs)  # botocore's retry: the same IfMatch
                raise fault
        return self.client.put_object(**kwargs)

    def head_object(self, **kwargs):
        if self.always is not None and kwargs["Key"] == KEY:
            raise self.always
        return self.client.head_object(**kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


@pytest.fixture(scope="module")
def s3():
    with LocalS3() as local:
        client = local.client()
        local.ensure_bucket(client, BUCKET, versioned=True)
        yield client


@pytest.fixture
def client(s3):
    yield s3
    s3.delete_object(Bucket=BUCKET, Key=KEY)


def test_a_renewal_applied_whose_response_was_lost_keeps_the_lease(client):
    lease = protocol.acquire(client, URI, "run-1", A)
    faulty = Faulty(client, ["lost"])
    kept = protocol.renew(faulty, URI, lease)  # the retry got 412: the lease read names this holder and token
    found = protocol.read(client, URI)
    assert kept.etag == found.etag != lease.etag and found.holder == A and found.renewed >= lease.renewed
    again = protocol.renew(client, URI, kept)  # the adopted ETag renews
    assert protocol.read(client, URI).etag == again.etag
    with pytest.raises(protocol.LeaseHeld):
        protocol.acquire(client, URI, "run-1", B)


def test_409_and_503_and_throttling_are_retried_and_given_up_at_the_deadline(client):
    lease = protocol.acquire(client, URI, "run-1", A)
    faults = [_error("ConditionalRequestConflict", 409), _error("ServiceUnavailable", 503), _error("SlowDown", 503)]
    slept: list[float] = []
    faulty = Faulty(client, faults)
    renewed = protocol.renew(faulty, URI, lease, give_up_at=time.time() + 60, sleep=slept.append)
    assert faulty.calls == 4 and len(slept) == 3
    assert protocol.read(client, URI).etag == renewed.etag
    down = Faulty(client, always=_error("ServiceUnavailable", 503))
    with pytest.raises(ClientError, match="ServiceUnavailable"):
        protocol.renew(down, URI, renewed, give_up_at=time.time() + 0.5, sleep=time.sleep)
    assert down.calls > 1  # retried, then given up at the deadline
    with pytest.raises(ClientError, match="AccessDenied"):  # not S3's "try again": raised at once
        protocol.renew(Faulty(client, always=_error("AccessDenied", 403)), URI, renewed, give_up_at=time.time() + 60)


def test_a_412_from_another_acquisition_of_the_same_job_is_lost_not_adopted(client):
    old = protocol.acquire(client, URI, "run-1", A)
    protocol.acquire(client, URI, "run-1", A)  # the same job restarted (RetryStrategy): a new token
    with pytest.raises(protocol.LeaseLost, match="was taken over: run run-1 is held by execution .*aaa"):
        protocol.renew(client, URI, old)


def test_prove_checks_the_deadline_and_the_etag(client):
    t = [1_800_000_000.0]
    lease = protocol.acquire(client, URI, "run-1", A, lambda: t[0], stale_seconds=300)
    protocol.prove(client, URI, lease, 150, lambda: t[0] + 149)
    with pytest.raises(protocol.LeaseExpired) as expired:
        protocol.prove(client, URI, lease, 150, lambda: t[0] + 150)
    assert str(expired.value) == (
        f"the lease {URI} was last renewed at 2027-01-15T08:00:00.000000Z; its deadline "
        "2027-01-15T08:02:30.000000Z (150 s later) has passed"
    )
    protocol.acquire(client, URI, "run-1", B, lambda: t[0] + 301)  # stale: taken over
    with pytest.raises(protocol.LeaseLost, match="no longer this holder's: run run-1 is held by execution .*bbb"):
        protocol.prove(client, URI, lease, 150, lambda: t[0] + 1)


def test_prove_retries_503_until_the_deadline_then_says_the_deadline_passed(client):
    lease = protocol.acquire(client, URI, "run-1", A)
    down = Faulty(client, always=_error("ServiceUnavailable", 503, "HeadObject"))
    started = time.time()
    with pytest.raises(protocol.LeaseExpired, match="deadline .* has passed"):
        protocol.prove(down, URI, replace(lease, renewed=started), 0.5)
    assert 0.5 <= time.time() - started < 3


def test_timings_must_leave_room_for_the_longest_save_and_the_clock_skew():
    assert protocol.Timings().problem(save_seconds=110) is None  # 300 > 150 + 110 + 10
    problem = protocol.Timings().problem(save_seconds=140)
    assert problem == (
        "the lease's staleness (300 s, TIERED_TRAINING_LEASE_STALE_SECONDS) must exceed its deadline (150 s) + the "
        "longest save (checkpoint.shutdown_deadline_seconds, 140 s) + the clock skew (10 s) = 300 s, or an old "
        "holder's last write could land after a takeover"
    )
    with pytest.raises(ValueError, match="STALE_SECONDS"):
        protocol.Timings.from_environment({"TIERED_TRAINING_LEASE_STALE_SECONDS": "300"}, save_seconds=140)
    longer = protocol.Timings.from_environment({}, save_seconds=400)  # no staleness set: long enough for the save
    assert longer.stale_seconds == 150 + 400 + 10 + 60 and longer.problem(400) is None
    fast = protocol.Timings.from_environment(
        {
            "TIERED_TRAINING_LEASE_RENEW_SECONDS": "1",
            "TIERED_TRAINING_LEASE_DEADLINE_SECONDS": "3",
            "TIERED_TRAINING_LEASE_STALE_SECONDS": "20",
            "TIERED_TRAINING_LEASE_SKEW_SECONDS": "0",
        },
        save_seconds=10,
    )
    assert fast == protocol.Timings(1, 3, 20, 0)
    with pytest.raises(ValueError, match="TIERED_TRAINING_LEASE_DEADLINE_SECONDS='soon': expected a number"):
        protocol.Timings.from_environment({"TIERED_TRAINING_LEASE_DEADLINE_SECONDS": "soon"}, save_seconds=10)
    with pytest.raises(ValueError, match="renew interval .* less than its deadline"):
        protocol.Timings.from_environment({"TIERED_TRAINING_LEASE_RENEW_SECONDS": "200"}, save_seconds=10)


def _wait(condition, seconds: float = 10.0) -> None:
    end = time.time() + seconds
    while not condition() and time.time() < end:
        threading.Event().wait(0.02)


def test_a_holder_whose_renewals_fail_stops_at_its_deadline_and_its_fence_refuses_commits(client, tmp_path):
    said: list[str] = []
    state = tmp_path / "lease-state.json"
    holder = RunLease(client, RUN_URI, "run-1", A, timings=FAST, state_path=state, say=said.append)
    holder.take()
    fence = Fence(state, client)
    fence("checkpoint step-2")  # held and renewed: allowed
    holder.s3 = Faulty(client, always=_error("AccessDenied", 403))  # the holder's renewals fail from now on
    renewed = holder.lease.renewed
    _wait(lambda: holder.lost is not None)
    assert holder.lost is not None and time.time() >= renewed + FAST.deadline_seconds
    assert holder.lost.startswith(
        f"the lease of run run-1 at {URI} was not renewed within its deadline: last renewed at "
    )
    assert f"deadline {protocol.iso(holder.lease.renewed + FAST.deadline_seconds)} (0.4 s)" in holder.lost
    assert any("cannot renew the lease" in line and "AccessDenied" in line for line in said)
    assert json.loads(state.read_text())["lost"] == holder.lost
    with pytest.raises(LeaseFenced) as fenced:
        fence("checkpoint step-4")
    assert str(fenced.value) == f"checkpoint step-4 NOT committed: {holder.lost}"

    _wait(lambda: time.time() > renewed + FAST.stale_seconds)
    taker_said: list[str] = []
    taker = RunLease(client, RUN_URI, "run-1", B, timings=FAST, say=taker_said.append)
    taker.take()  # stale: taken over, and announced
    assert taker_said[0] == (
        f"launcher: lease of run run-1 taken over from execution {A.execution} (training job {A.job}), last renewed "
        f"at {protocol.iso(renewed)} (stale since {protocol.iso(renewed + FAST.stale_seconds)})"
    )
    holder.release()
    taker.release()


def test_the_fence_refuses_once_another_execution_holds_the_lease_even_before_the_deadline(client, tmp_path):
    state = tmp_path / "lease-state.json"
    holder = RunLease(client, RUN_URI, "run-1", A, timings=protocol.Timings(60, 150), state_path=state)
    holder.take()
    Fence(state, client)("the export to /opt/ml/model")
    client.delete_object(Bucket=BUCKET, Key=KEY)  # released or replaced behind this holder's back
    protocol.acquire(client, URI, "run-1", B)
    with pytest.raises(LeaseFenced, match="checkpoint step-6 NOT committed: the lease .* is no longer this holder's"):
        Fence(state, client)("checkpoint step-6")
    with pytest.raises(LeaseFenced, match="cannot prove the lease .*AccessDenied"):
        Fence(state, Faulty(client, always=_error("AccessDenied", 403, "HeadObject")))("checkpoint step-6")
    holder.release()
    assert not state.exists()


def test_the_rehearsal_fault_answers_503_to_lease_writes_from_step_n_on_even_after_pruning(s3, tmp_path):
    """TIERED_TRAINING_LEASE_FAULT=step-N: lease writes keep answering 503 once a checkpoint of step N or later was
    committed on this host, though pruning removes step-N; other objects and reads are left alone."""
    import boto3
    from botocore.config import Config

    from training.components.lease_faults import apply_faults

    config = Config(retries={"max_attempts": 1, "mode": "standard"})
    plain = boto3.client("s3", endpoint_url=s3.meta.endpoint_url, region_name="us-east-1", config=config)
    faulty = apply_faults(plain, {"TIERED_TRAINING_LEASE_FAULT": "step-4", "TT_CHECKPOINT_DIR": str(tmp_path)})
    faulty.put_object(Bucket=BUCKET, Key=KEY, Body=b"{}")  # nothing committed yet
    (tmp_path / "step-2").mkdir()
    (tmp_path / "step-2" / "COMMITTED").write_text("")
    faulty.put_object(Bucket=BUCKET, Key=KEY, Body=b"{}")  # step 2 < 4
    (tmp_path / "step-6").mkdir()
    (tmp_path / "step-6" / "COMMITTED").write_text("")
    for _ in range(2):
        with pytest.raises(ClientError) as raised:
            faulty.put_object(Bucket=BUCKET, Key=KEY, Body=b"{}")
        assert raised.value.response["Error"]["Code"] == "ServiceUnavailable"
        (tmp_path / "step-6" / "COMMITTED").unlink(missing_ok=True)  # pruned: still failing
    faulty.put_object(Bucket=BUCKET, Key="recipe/other.json", Body=b"{}")
    assert faulty.head_object(Bucket=BUCKET, Key=KEY)["ContentLength"] == 2
    with pytest.raises(ValueError, match="expected SECONDS or step-N"):
        apply_faults(plain, {"TIERED_TRAINING_LEASE_FAULT": "step-x"})
