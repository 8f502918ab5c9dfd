"""A host that fails the probe's health check stops the pipeline before training, naming it: a rehearsal of the
llama3-1b-bf16 template on 2 simulated hosts of 1 CPU worker each, whose Probe job is told to expect a matmul figure
no CPU reaches (TIERED_TRAINING_HEALTH_EXPECT: CPU figures are never compared with the catalogue's GPU ones)."""

from __future__ import annotations

import io
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
