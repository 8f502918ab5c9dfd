"""Schedule, batch ramp and the ``python -m training`` entry (config loading, paths)."""

from __future__ import annotations

import json
import re
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



def _train_rates(optimizer, scheduler, steps: int) -> list[float]:
    """The learning rate each optimiser step applies (and the one the trainer logs for it)."""
    rates = []
    for _ in range(steps):
        assert scheduler.get_last_lr()[0] == optimizer.param_groups[0]["lr"]
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("resumed_at", [2, 8, 19])  # in the warmup, in the decay, and at the old total
def test_a_resume_with_a_larger_max_steps_follows_the_new_total_from_the_step_it_resumes(resumed_at):
    """MaxSteps 20, then resumed with MaxSteps 40: the first step after the resume already runs at the 40-step
    schedule's rate (not the 20-step schedule's one, then a jump a step later); the warmup stays as it was."""
    torch = pytest.importorskip("torch")
    from training.components.optim import build_optimizer, build_scheduler, resume_schedule

    opt = tiny_config(optimizer={"lr": 1e-4, "warmup_steps": 4, "min_lr_ratio": 0.1, "schedule": "cosine"}).optimizer
    model, cpu = torch.nn.Linear(4, 4), torch.device("cpu")
    model.weight.grad, model.bias.grad = torch.ones(4, 4), torch.ones(4)
    optimizer = build_optimizer(model, opt, cpu)
    scheduler = build_scheduler(optimizer, opt, 20)
    first = _train_rates(optimizer, scheduler, resumed_at)
    saved = optimizer.state_dict(), scheduler.state_dict()

    optimizer = build_optimizer(model, opt, cpu)  # the next execution, MaxSteps 40
    scheduler = build_scheduler(optimizer, opt, 40)
    optimizer.load_state_dict(saved[0])
    scheduler.load_state_dict(saved[1])
    restored, rate = resume_schedule(scheduler)
    second = _train_rates(optimizer, scheduler, 40 - resumed_at)

    assert first == pytest.approx([opt.lr * lr_factor(s, opt, 20) for s in range(resumed_at)], rel=1e-12)
    assert second == pytest.approx([opt.lr * lr_factor(s, opt, 40) for s in range(resumed_at, 40)], rel=1e-12)
    assert restored == pytest.approx(opt.lr * lr_factor(resumed_at, opt, 20), rel=1e-12)
    assert rate == pytest.approx(second[0], rel=1e-12)
    assert (rate > restored) == (resumed_at >= opt.warmup_steps)  # a longer decay is higher at the same step
    assert scheduler.get_last_lr()[0] == pytest.approx(opt.lr * opt.min_lr_ratio, rel=1e-12)  # the minimum at 40

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

    # resumed with MaxSteps 8: every step after the resume runs at the 8-step schedule's rate
    longer = cfg.model_copy(update={"batch": cfg.batch.model_copy(update={"total_steps": 8})})
    (tmp_path / "run.json").write_text(longer.to_json())
    proc = subprocess.run(
        [sys.executable, "-m", "training", "--config", str(tmp_path / "run.json"), "--data-dir", str(tmp_path / "data"),
         "--checkpoint-dir", str(tmp_path / "ck"), "--model-dir", str(tmp_path / "model")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "the learning-rate schedule is rebuilt for 8 total steps (the checkpoint's: 4): step 5 runs at" in proc.stderr
    logged = [(int(step), rate) for step, rate in re.findall(r"step +(\d+) \| loss \S+ \| grad_norm \S+ \| lr (\S+)",
                                                               proc.stderr)]
    opt = cfg.optimizer
    assert logged == [(step, f"{opt.lr * lr_factor(step - 1, opt, 8):.3e}") for step in range(5, 9)], logged
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-7", "step-8"]  # still keep_last 2
