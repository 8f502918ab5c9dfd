"""The launcher takes the run's lease before torchrun and releases it after (moto's S3 on 127.0.0.1; a stub
torchrun that records that it ran)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("moto")

from tiered_training.contract import lease as protocol  # noqa: E402
from tiered_training.contract.container import EXECUTION_VARIABLE, JOB_NAME_VARIABLE, RUN_URI_VARIABLE  # noqa: E402
from tiered_training.rehearse.s3 import LocalS3  # noqa: E402

from .helpers import REPO, tiny_config  # noqa: E402

BUCKET = "launcher-lease-store"
RUN_URI = f"s3://{BUCKET}/r/checkpoints/runs/run-1/"
ME = "arn:aws:sagemaker:us-east-1:1:pipeline/r/execution/mine"
OTHER = protocol.Holder("arn:aws:sagemaker:us-east-1:1:pipeline/r/execution/other", "r-Resume-other", "algo-1")


@pytest.fixture(scope="module")
def s3():
    with LocalS3() as local:
        client = local.client()
        local.ensure_bucket(client, BUCKET, versioned=True)
        yield local, client


def _launch(tmp_path, local, stub_status: int = 0, host: str = "algo-1"):
    root = tmp_path / "opt/ml"
    (root / "input/config").mkdir(parents=True)
    (root / "output").mkdir()
    cfg = tiny_config(run={"id": "run-1"}, batch__global_batch_tokens=128)  # planned on 2 GPUs: 2 hosts of 1
    (root / "input/config/hyperparameters.json").write_text(json.dumps(cfg.to_hyperparameters()))
    rc = {"current_host": host, "hosts": ["algo-1", "algo-2"], "current_instance_type": "ml.g5.xlarge"}
    (root / "input/config/resourceconfig.json").write_text(json.dumps(rc))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f'#!/bin/sh\necho "TORCHRUN RAN"\nexit {stub_status}\n')
    (bin_dir / "torchrun").chmod(0o755)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TIERED_TRAINING_", "TT_", "SM_"))},
        "TIERED_TRAINING_OPT_ML": str(root),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "SM_NUM_GPUS": "1",
        RUN_URI_VARIABLE: RUN_URI,
        EXECUTION_VARIABLE: ME,
        JOB_NAME_VARIABLE: "r-Resume-mine",
        "AWS_ENDPOINT_URL_S3": local.endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    env.pop("AWS_PROFILE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "training.launcher", "train"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    failure = root / "output/failure"
    return proc, failure.read_text().strip() if failure.is_file() else ""


def test_a_live_lease_of_another_execution_refuses_the_job_before_torchrun(tmp_path, s3):
    local, client = s3
    held = protocol.acquire(client, protocol.lease_uri(RUN_URI), "run-1", OTHER)
    try:
        proc, failure = _launch(tmp_path, local)
    finally:
        protocol.release(client, protocol.lease_uri(RUN_URI), held)
    assert proc.returncode == 3, proc.stderr
    assert "TORCHRUN RAN" not in proc.stdout
    assert failure.startswith("launcher: run run-1 is held by execution " + OTHER.execution), failure
    assert (
        "(training job r-Resume-other)" in failure
        and f"this job (execution {ME} (training job r-Resume-mine))" in failure
    )
    assert proc.stderr.strip().splitlines() == ["launcher: error: " + failure[len("launcher: ") :]]


@pytest.mark.parametrize("status", [0, 1])
def test_the_first_host_takes_the_lease_and_releases_it_whatever_torchrun_did(tmp_path, s3, status):
    local, client = s3
    proc, _ = _launch(tmp_path, local, stub_status=status)
    assert proc.returncode == status, proc.stderr
    assert "TORCHRUN RAN" in proc.stdout
    assert f"launcher: lease of run run-1 taken at {RUN_URI}lease.json" in proc.stdout
    assert "launcher: lease of run run-1 released" in proc.stdout
    assert protocol.read(client, protocol.lease_uri(RUN_URI)) is None


def test_a_stale_lease_is_taken_over_and_the_same_job_retakes_its_own(tmp_path, s3):
    local, client = s3
    uri = protocol.lease_uri(RUN_URI)
    stale = protocol.acquire(client, uri, "run-1", OTHER, now=lambda: time.time() - protocol.STALE_SECONDS - 5)
    proc, _ = _launch(tmp_path / "stale", local)
    assert proc.returncode == 0 and "TORCHRUN RAN" in proc.stdout, proc.stderr
    assert protocol.read(client, uri) is None and not protocol.release(client, uri, stale)
    mine = protocol.acquire(client, uri, "run-1", protocol.Holder(ME, "r-Resume-mine", "algo-1"))  # a crashed attempt's
    proc, _ = _launch(tmp_path / "retry", local)
    assert proc.returncode == 0 and "TORCHRUN RAN" in proc.stdout, proc.stderr
    assert not protocol.release(client, uri, mine)


def test_the_other_hosts_refuse_while_another_execution_holds_the_lease(tmp_path, s3):
    local, client = s3
    held = protocol.acquire(client, protocol.lease_uri(RUN_URI), "run-1", OTHER)
    try:
        proc, failure = _launch(tmp_path, local, host="algo-2")
    finally:
        protocol.release(client, protocol.lease_uri(RUN_URI), held)
    assert proc.returncode == 3 and "TORCHRUN RAN" not in proc.stdout, proc.stderr
    assert OTHER.execution in failure
