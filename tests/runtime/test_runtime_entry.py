"""The container's training path end to end on the CPU: hyperparameters.json in, torchrun
over 2 ranks, EMF metric lines on stdout (validation loss included), the same metrics in a
local MLflow tracking store and in TensorBoard event files, a committed checkpoint and a
safetensors export out."""

from __future__ import annotations

import json

import pytest

from tiered_training.contract import metrics

from .helpers import run_training_module, tiny_config


@pytest.mark.torch
def test_python_m_training_emits_metrics_checkpoints_and_exports(tmp_path, monkeypatch):
    cfg = tiny_config(
        parallel={"sharding": "full", "shard_group_size": 2},
        hardware__gpus_per_node=2,
        batch__total_steps=6,
        checkpoint={"interval_minutes": 60.0, "interval_steps": 3, "keep_last": 2, "shutdown_deadline_seconds": 60},
        # every 4th window held out; a validation pass after every step
        validation={"source": "holdout", "holdout_every": 4, "interval_minutes": 1e-6, "batches": 2},
        tracking={"experiment_name": "tiny-experiment"},
    )
    # The container's tracking, pointed at a local MLflow store and a local TensorBoard directory.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("TT_TENSORBOARD_DIR", str(tmp_path / "tensorboard"))
    monkeypatch.setenv("TRAINING_JOB_NAME", "tiny-job-1")
    result = run_training_module(tmp_path, cfg)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]

    emf = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{") and '"_aws"' in line]
    assert emf, result.stdout[-2000:]
    names = set()
    for record in emf:
        directive = record["_aws"]["CloudWatchMetrics"][0]
        assert directive["Namespace"] == metrics.NAMESPACE
        assert record["Recipe"] == cfg.recipe_name
        for metric in directive["Metrics"]:
            spec = metrics.BY_NAME[metric["Name"]]
            assert metric["Unit"] == spec.unit
            names.add(metric["Name"])
    assert {"TokensPerSecond", "Loss", "StepsCompleted", "MFU", "ValidationLoss"} <= names
    assert max(r["StepsCompleted"] for r in emf if "StepsCompleted" in r) == 6
    validation = [r["ValidationLoss"] for r in emf if "ValidationLoss" in r]
    assert 0 < validation[-1] < 10  # about ln(256) = 5.5 for the tiny model on random tokens
    assert "validation loss" in result.stderr

    # MLflow: the run of this job, the RunConfig (the plan's decisions) as params, the metrics by step.
    import os

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("tiny-experiment")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "tiny-job-1" and run.info.status == "FINISHED"
    assert run.data.params["precision.precision"] == '"fp32"' and run.data.params["batch.total_steps"] == "6"
    for name in ("Loss", "TokensPerSecond", "MFU", "LearningRate", "GradNorm", "ValidationLoss"):
        history = client.get_metric_history(run.info.run_id, name)
        assert history and history[-1].step == 6, name
    assert client.get_metric_history(run.info.run_id, "Loss")[-1].value == pytest.approx(
        [r["Loss"] for r in emf if "Loss" in r][-1]
    )

    # TensorBoard: the same scalars in event files.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert {"Loss", "TokensPerSecond", "MFU", "ValidationLoss"} <= set(events.Tags()["scalars"])
    assert events.Scalars("Loss")[-1].step == 6

    committed = sorted(p.parent.name for p in (tmp_path / "ckpt").rglob("COMMITTED"))
    assert committed, list((tmp_path / "ckpt").iterdir())
    assert any((tmp_path / "model").rglob("*.safetensors"))
    # the candidate trained: said once at start, recorded in every checkpoint (a resume with run.candidate 0 reads it)
    assert result.stdout.count("training candidate 1 of 1 (fp32, none AC, full shard 2, micro-batch 2 x 1): ") == 1
    manifest = json.loads((tmp_path / "ckpt" / committed[-1] / "COMMITTED").read_text())
    assert (manifest["candidate"], manifest["candidate_summary"]) == (1, "fp32, none AC, full shard 2, micro-batch 2 x 1")
