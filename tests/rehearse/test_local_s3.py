"""The rehearsal's S3: moto keeps its buckets per process, so each rehearsal starts from an empty S3."""

from __future__ import annotations

import pytest

pytest.importorskip("moto")

from tiered_training.rehearse.s3 import LocalS3  # noqa: E402


def test_a_second_rehearsal_in_the_same_process_starts_from_an_empty_s3():
    with LocalS3() as s3:
        client = s3.client()
        s3.ensure_bucket(client, "rehearsal-checkpoint-store", versioned=True)
        client.put_object(Bucket="rehearsal-checkpoint-store", Key="r/checkpoints/step-29/COMMITTED", Body=b"{}")
    with LocalS3() as s3:
        assert s3.client().list_buckets().get("Buckets", []) == []


def test_two_local_s3_at_once_keep_each_others_buckets():
    with LocalS3() as first:
        client = first.client()
        first.ensure_bucket(client, "first-store", versioned=True)
        client.put_object(Bucket="first-store", Key="r/checkpoints/step-2/COMMITTED", Body=b"{}")
        client.put_object(Bucket="first-store", Key="r/checkpoints/step-2/COMMITTED", Body=b"{}")  # two versions
        with LocalS3() as second:
            assert second.endpoint == first.endpoint  # one moto server per process
            second.ensure_bucket(second.client(), "second-store")
            assert client.get_object(Bucket="first-store", Key="r/checkpoints/step-2/COMMITTED")["Body"].read() == b"{}"
        names = {b["Name"] for b in client.list_buckets()["Buckets"]}
        assert names == {"first-store"}  # the second removed its own bucket only
        assert client.get_object(Bucket="first-store", Key="r/checkpoints/step-2/COMMITTED")["Body"].read() == b"{}"


def test_loopback_ports_are_drawn_below_the_ephemeral_range():
    from tiered_training.ports import ephemeral_start, loopback_port

    ports = {loopback_port() for _ in range(20)}
    assert all(10_000 <= port < ephemeral_start() for port in ports)
    assert len(ports) > 1  # drawn at random, not the same each time
