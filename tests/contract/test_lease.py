"""The run lease against S3's conditional writes (moto's S3 on 127.0.0.1, a versioned bucket like the store)."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("moto")
pytest.importorskip("boto3")

from tiered_training.contract import lease as protocol  # noqa: E402
from tiered_training.rehearse.s3 import LocalS3  # noqa: E402
from training.components.run_lease import LeaseRefused, RunLease  # noqa: E402

BUCKET = "lease-test-store"
RUN_URI = f"s3://{BUCKET}/recipe/checkpoints/runs/run-1/"
URI = protocol.lease_uri(RUN_URI)
A = protocol.Holder("arn:aws:sagemaker:us-east-1:1:pipeline/p/execution/aaa", "p-Resume-aaa", "algo-1")
B = protocol.Holder("arn:aws:sagemaker:us-east-1:1:pipeline/p/execution/bbb", "p-Resume-bbb", "algo-1")


class Clock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def s3():
    with LocalS3() as local:
        client = local.client()
        local.ensure_bucket(client, BUCKET, versioned=True)
        yield client


@pytest.fixture
def client(s3):
    yield s3
    s3.delete_object(Bucket=BUCKET, Key=URI.split("/", 3)[3])


def test_acquire_writes_a_lease_naming_the_holder_beside_the_checkpoints(client):
    clock = Clock()
    taken = protocol.acquire(client, URI, "run-1", A, clock)
    assert URI == RUN_URI + "lease.json"
    found = protocol.read(client, URI)
    assert found is not None and found.holder == A and found.run_id == "run-1"
    assert found.etag == taken.etag and found.expires == pytest.approx(clock.t + protocol.STALE_SECONDS)
    body = client.get_object(Bucket=BUCKET, Key=URI.split("/", 3)[3])["Body"].read().decode()
    assert A.execution in body and A.job in body and '"expires"' in body


def test_a_second_execution_is_refused_naming_the_holder(client):
    clock = Clock()
    protocol.acquire(client, URI, "run-1", A, clock)
    clock.t += protocol.STALE_SECONDS - 1
    with pytest.raises(protocol.LeaseHeld) as held:
        protocol.acquire(client, URI, "run-1", B, clock)
    assert held.value.lease.holder == A
    assert A.execution in str(held.value) and "live for 1 s more" in str(held.value)


def test_the_same_job_restarted_and_the_same_execution_retake_their_own_lease(client):
    clock = Clock()
    first = protocol.acquire(client, URI, "run-1", A, clock)
    again = protocol.acquire(client, URI, "run-1", A, clock)  # RetryStrategy: the same job name
    assert again.etag != first.etag
    next_segment = protocol.Holder(A.execution, "p-Resume-2-aaa", "algo-1")
    protocol.acquire(client, URI, "run-1", next_segment, clock)
    assert protocol.read(client, URI).holder == next_segment


def test_renew_extends_the_lease_and_fails_once_it_was_taken_over(client):
    clock = Clock()
    lease = protocol.acquire(client, URI, "run-1", A, clock)
    clock.t += protocol.RENEW_SECONDS
    lease = protocol.renew(client, URI, lease, clock)
    assert protocol.read(client, URI).expires == pytest.approx(clock.t + protocol.STALE_SECONDS)
    clock.t += protocol.STALE_SECONDS + 1  # A stopped renewing: stale
    taken = protocol.acquire(client, URI, "run-1", B, clock)
    assert taken.holder == B
    with pytest.raises(protocol.LeaseLost, match="execution/bbb"):
        protocol.renew(client, URI, lease, clock)
    assert not protocol.release(client, URI, lease)  # A cannot remove B's lease
    assert protocol.read(client, URI).holder == B


def test_release_removes_the_lease_and_a_new_execution_takes_it_at_once(client):
    clock = Clock()
    lease = protocol.acquire(client, URI, "run-1", A, clock)
    assert protocol.release(client, URI, lease)
    assert protocol.read(client, URI) is None  # the versioned store keeps a delete marker
    assert protocol.acquire(client, URI, "run-1", B, clock).holder == B


def test_two_takers_of_a_stale_lease_cannot_both_win(client):
    clock = Clock()
    protocol.acquire(client, URI, "run-1", A, clock)
    clock.t += protocol.STALE_SECONDS + 1
    stale = protocol.read(client, URI)
    key = URI.split("/", 3)[3]
    # B takes over with IfMatch on the stale ETag; a third taker that read the same ETag loses the race.
    client.put_object(
        Bucket=BUCKET,
        Key=key,
        Body=protocol.Lease("run-1", B, clock.t, clock.t, clock.t + 300).body(),
        IfMatch=stale.etag,
    )
    with pytest.raises(Exception) as lost:
        client.put_object(Bucket=BUCKET, Key=key, Body=b"{}", IfMatch=stale.etag)
    assert protocol._code(lost.value) == "PreconditionFailed"
    c = protocol.Holder("arn:aws:sagemaker:us-east-1:1:pipeline/p/execution/ccc", "p-Resume-ccc")
    with pytest.raises(protocol.LeaseHeld):  # acquire reads again, and B's lease is live
        protocol.acquire(client, URI, "run-1", c, clock)


def test_concurrent_acquirers_exactly_one_wins(client):
    holders = [protocol.Holder(f"execution/{i}", f"job-{i}") for i in range(6)]
    won, refused = [], []
    barrier = threading.Barrier(len(holders))

    def take(holder):
        barrier.wait()
        try:
            won.append(protocol.acquire(client, URI, "run-1", holder))
        except protocol.LeaseHeld:
            refused.append(holder)

    threads = [threading.Thread(target=take, args=(h,)) for h in holders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == len(holders) - 1
    assert protocol.read(client, URI).holder == won[0].holder


def test_the_launchers_lease_renews_in_the_background_and_releases(client, s3):
    a = RunLease(s3, RUN_URI, "run-1", A, timings=protocol.Timings(renew_seconds=0.05), say=lambda _: None)
    a.take()
    first = a.lease.etag
    for _ in range(100):
        if a.lease.etag != first:
            break
        threading.Event().wait(0.05)
    assert a.lease.etag != first  # renewed by the thread
    other = RunLease(s3, RUN_URI, "run-1", B, say=lambda _: None)
    with pytest.raises(
        LeaseRefused, match="held by execution arn:aws:sagemaker:.*execution/aaa .training job p-Resume-aaa"
    ):
        other.take()
    with pytest.raises(LeaseRefused, match="execution/aaa"):
        other.check()  # the other hosts of B refuse too
    RunLease(s3, RUN_URI, "run-1", protocol.Holder(A.execution, A.job, "algo-2"), say=lambda _: None).check()
    a.release()
    assert protocol.read(s3, URI) is None
    said = []
    waited = RunLease(s3, RUN_URI, "run-1", protocol.Holder(A.execution, A.job, "algo-2"), say=said.append)
    waited.check(wait_seconds=0.3, poll_seconds=0.1)  # the first host never took it: go on, the rendezvous decides
    assert said == [f"launcher: no live lease at {URI} after 0.3 s; going on"]
    other.take()
    other.release()


def test_an_unreadable_lease_counts_as_renewed_when_written(client):
    key = URI.split("/", 3)[3]
    client.put_object(Bucket=BUCKET, Key=key, Body=b"not json")
    found = protocol.read(client, URI)
    assert found is not None and found.holder == protocol.Holder("", "")
    import time

    assert found.live(time.time()) and not found.live(time.time() + protocol.STALE_SECONDS + 60)
