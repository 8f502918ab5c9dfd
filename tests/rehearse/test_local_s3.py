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
