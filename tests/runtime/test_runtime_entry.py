"""The container's training path end to end on the CPU: hyperparameters.json in, torchrun
over 2 ranks, EMF metric lines on stdout, a committed checkpoint and a safetensors export out."""

from __future__ import annotations

import json

import pytest

from tiered_training import metrics

from .helpers import run_training_module, tiny_config


@pytest.mark.torch
def test_python_m_training_emits_metrics_checkpoints_and_exports(tmp_path):
    cfg = tiny_config(
        parallel={"sharding": "full", "shard_group_size": 2},
        hardware__gpus_per_node=2,
        batch__total_steps=6,
        checkpoint={"interval_minutes": 60.0, "interval_steps": 3, "keep_last": 2, "shutdown_deadline_seconds": 60},
    )
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
    assert {"TokensPerSecond", "Loss", "StepsCompleted", "MFU"} <= names
    assert max(r["StepsCompleted"] for r in emf if "StepsCompleted" in r) == 6

    committed = sorted(p.parent.name for p in (tmp_path / "ckpt").rglob("COMMITTED"))
    assert committed, list((tmp_path / "ckpt").iterdir())
    assert any((tmp_path / "model").rglob("*.safetensors"))
