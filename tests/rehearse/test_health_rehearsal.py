"""A host that fails the probe's health check stops the pipeline before training, naming it: a rehearsal of the
llama3-1b-bf16 template on 2 simulated hosts of 1 CPU worker each, whose Probe job is told to expect a matmul figure
no CPU reaches (TIERED_TRAINING_HEALTH_EXPECT: CPU figures are never compared with the catalogue's GPU ones)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("moto")

from tiered_training.rehearse.run import Options, rehearse  # noqa: E402

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    root = tmp_path_factory.mktemp("health")
    out = io.StringIO()
    result = rehearse(Options(REPO / "recipes/llama3-1b-bf16.yaml", hosts=2, workers=1, steps=4,
                              workdir=root / "work", health_expect="matmul_tflops=1000000"), out)
    return result, out.getvalue()


def test_the_probe_fails_naming_the_host_gpu_and_figure_and_training_never_starts(rehearsal):
    result, log = rehearsal
    execution = result.execution
    assert execution.status == "Failed" and execution.failed_step == "Probe", log[-4000:]
    (attempt,) = execution.jobs["Probe"]
    reason = attempt.failure_reason
    assert reason.startswith("probe: algo-"), reason
    assert "HealthCheckFailed: health check failed on 2 host(s): algo-" in reason
    assert "GPU 0: " in reason and "TFLOP/s matmul, below the 1,000,000.0 expected" in reason
    assert not result.train_attempts() and "Train" not in execution.jobs
    assert not any(key.startswith("probe:") for key in execution.metrics.get("Probe", {}))  # no candidate ran


@pytest.fixture(scope="module")
def xid_rehearsal(tmp_path_factory):
    """2 simulated hosts of 1 worker, no probe; algo-2's GPU 0 reports XID 79 two seconds into its training job
    (an NVML stand-in, tests/rehearse/nvml_standin.py, read by the container's GPU monitor)."""
    root = tmp_path_factory.mktemp("xid")
    out = io.StringIO()
    faults = {"TIERED_TRAINING_NVML_STANDIN": "tests.rehearse.nvml_standin", "NVML_STANDIN_XID": "algo-2:0:79:2"}
    result = rehearse(Options(REPO / "recipes/llama3-1b-bf16.yaml", hosts=2, workers=1, steps=40,
                              params={"SkipProbe": "true"}, workdir=root / "work",
                              environment={"TrainWithoutProbe": faults}), out)
    return result, out.getvalue()


def test_a_fatal_xid_on_one_host_is_the_first_thing_the_failure_reason_says(xid_rehearsal):
    result, log = xid_rehearsal
    execution = result.execution
    assert execution.status == "Failed" and execution.failed_step.startswith("TrainWithoutProbe"), log[-4000:]
    (attempt,) = result.train_attempts()
    assert attempt.failure_reason.startswith(
        "algo-2 rank-1-gpu0: GpuFault: XID 79 on algo-2 GPU 0 (GPU has fallen off the bus)"), attempt.failure_reason
    assert attempt.detail["exit_codes"]["algo-2"] != 0
    said = [line for _, host, line in attempt.log if host == "algo-2"]
    assert "gpu-health: XID 79 on algo-2 GPU 0 (GPU has fallen off the bus): the GPU cannot go on" in said
    xids = [json.loads(line)["GpuXidErrors"] for line in attempt.detail["emf"]["algo-2"] if "GpuXidErrors" in line]
    assert xids[-1] == 1 and set(xids[:-1]) == {0}  # sent before the process exits: the GpuFault alarm sees it
