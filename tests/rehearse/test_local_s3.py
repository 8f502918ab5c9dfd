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


def test_a_close_pair_of_saves_leaves_keep_last_plus_two_checkpoints_in_s3_until_every_host_has_synced(tmp_path):
    """SageMaker's sync as the rehearsal mimics it: each host's directory on its own. With keep_last 1, a
    periodic save (step 6) and the final one a step later (step 7): the first host's sync carries the
    pruning of step 3 and the new step 7, the second host's has not run yet. The prefix then holds
    keep_last + 2 checkpoints, and keep_last once both hosts have synced."""
    import shutil

    from tiered_training.rehearse.s3 import CheckpointSync, checkpoints_in, list_keys

    hosts = {"algo-1": tmp_path / "algo-1", "algo-2": tmp_path / "algo-2"}
    files = {"algo-1": [".metadata", "__0_0.distcp", "COMMITTED"], "algo-2": ["__1_0.distcp"]}  # rank 0 commits

    def save(step):
        for host, root in hosts.items():
            (root / f"step-{step}").mkdir(parents=True)
            for name in files[host]:
                (root / f"step-{step}" / name).write_text(f"{host} {step}")

    def prune(step):  # every host deletes its own copy, before the next save starts
        for root in hosts.values():
            shutil.rmtree(root / f"step-{step}")

    with LocalS3() as s3:
        client = s3.client()
        s3.ensure_bucket(client, "checkpoints")
        uri = "s3://checkpoints/run/checkpoints"
        syncs = {host: CheckpointSync(client, root, uri, host) for host, root in hosts.items()}

        def held():
            return sorted(checkpoints_in(list_keys(client, uri)), key=lambda name: int(name[5:]))

        save(3)
        save(6)
        for sync in syncs.values():
            sync.sync_once()
        assert held() == ["step-3", "step-6"]  # kept + in flight: keep_last + 1
        prune(3)  # step 6 committed
        save(7)  # the final save, a step later
        syncs["algo-1"].sync_once()
        assert held() == ["step-3", "step-6", "step-7"]  # algo-2 still holds step-3 in S3: keep_last + 2
        syncs["algo-2"].sync_once()
        assert held() == ["step-6", "step-7"]
        prune(6)  # step 7 committed
        for sync in syncs.values():
            sync.sync_once()
        assert held() == ["step-7"]


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
    from tiered_training.contract.ports import ephemeral_start, loopback_port

    ports = {loopback_port() for _ in range(20)}
    assert all(10_000 <= port < ephemeral_start() for port in ports)
    assert len(ports) > 1  # drawn at random, not the same each time
