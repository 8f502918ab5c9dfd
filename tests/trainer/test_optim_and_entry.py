"""Schedule, batch ramp and the ``python -m training`` entry (config loading, paths)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tiny import tiny_config  # noqa: E402

from training.components.optim import lr_factor  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_warmup_then_cosine_to_min():
    opt = tiny_config(optimizer={"warmup_steps": 10, "min_lr_ratio": 0.1, "schedule": "cosine"}).optimizer
    factors = [lr_factor(s, opt, 100) for s in range(101)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(1.0) and factors[100] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:]))
    assert factors[55] == pytest.approx(0.55)  # halfway: (1 + min) / 2


def test_linear_and_constant_schedules():
    linear = tiny_config(optimizer={"warmup_steps": 0, "min_lr_ratio": 0.0, "schedule": "linear"}).optimizer
    assert [lr_factor(s, linear, 4) for s in range(5)] == pytest.approx([1, 0.75, 0.5, 0.25, 0])
    constant = tiny_config(optimizer={"warmup_steps": 2, "schedule": "constant"}).optimizer
    assert [lr_factor(s, constant, 10) for s in range(4)] == pytest.approx([0.5, 1, 1, 1])


def test_batch_ramp_through_accumulation():
    batch = tiny_config(batch={"grad_accum_steps": 8, "ramp_start_accum_steps": 2, "ramp_steps": 6}).batch
    assert [batch.accum_steps_at(s) for s in range(8)] == [2, 3, 4, 5, 6, 7, 8, 8]
    flat = tiny_config(batch={"grad_accum_steps": 4}).batch
    assert {flat.accum_steps_at(s) for s in range(10)} == {4}


def test_config_from_json_and_hyperparameters(tmp_path):
    from training.__main__ import load_config

    cfg = tiny_config()
    (tmp_path / "run.json").write_text(cfg.to_json())
    (tmp_path / "hp.json").write_text(json.dumps(cfg.to_hyperparameters()))
    assert load_config(tmp_path / "run.json") == cfg
    assert load_config(tmp_path / "hp.json") == cfg


def test_paths_flags_env_and_defaults(monkeypatch):
    from training.paths import Paths

    monkeypatch.delenv("SM_CHANNEL_TRAIN", raising=False)
    monkeypatch.delenv("TT_DATA_DIR", raising=False)
    monkeypatch.setenv("TT_CHECKPOINT_DIR", "/tmp/ck")
    paths = Paths.resolve(model_dir="/tmp/m")
    assert str(paths.data_dir) == "/opt/ml/input/data/train"
    assert str(paths.checkpoint_dir) == "/tmp/ck" and str(paths.model_dir) == "/tmp/m"


@pytest.mark.torch
def test_python_m_training_single_process(tmp_path):
    """The entry point outside torchrun: one process, a JSON config, path flags; trains, saves, exports."""
    from tiny import write_learnable_shards

    write_learnable_shards(tmp_path / "data", tokens=5000)
    cfg = tiny_config(
        batch={"total_steps": 4, "grad_accum_steps": 3, "ramp_start_accum_steps": 1, "ramp_steps": 2},
        checkpoint={"interval_steps": 0, "interval_minutes": 1e-6, "keep_last": 2},  # by time: after every step
    )
    (tmp_path / "run.json").write_text(cfg.to_json())
    proc = subprocess.run(
        [sys.executable, "-m", "training", "--config", str(tmp_path / "run.json"), "--data-dir", str(tmp_path / "data"),
         "--checkpoint-dir", str(tmp_path / "ck"), "--model-dir", str(tmp_path / "model")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for step, accum in [(1, 1), (2, 2), (3, 3), (4, 3)]:  # the batch ramp through accumulation
        line = next(line for line in proc.stderr.splitlines() if f"step {step:>6} | loss" in line)
        assert f"mbs 2 x accum {accum}" in line, line
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-3", "step-4"]  # keep_last 2
    assert (tmp_path / "ck" / "step-4" / "COMMITTED").is_file()
    assert (tmp_path / "model" / "config.json").is_file()
