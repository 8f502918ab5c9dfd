"""Probe mode: the sweep's logic with a stand-in trainer, and the real trainer under torchrun on the CPU."""

from __future__ import annotations

import io
import re

import pytest
import torch

from tiered_training.contract.metrics import PROBE_METRICS
from training.probe import OK, OOM, candidate_config, run_probe
from training.step_stats import StepStats

from .helpers import run_training_module, tiny_config

GIB = 1024**3


def _matches(text: str) -> dict[str, list[str]]:
    """What SageMaker's MetricDefinitions would extract from this log, metric by metric."""
    return {name: re.findall(regex, text) for name, (_, regex) in PROBE_METRICS.items()}


def _fake_trainer(oom_at: int | None, calls: list, peak_per_sample: int | None = GIB):
    def run(cfg, paths, *, hooks, max_steps, resume, save_checkpoints, export):
        mb = cfg.batch.micro_batch_size
        calls.append((mb, max_steps, resume, save_checkpoints, export, cfg.batch.grad_accum_steps))
        if oom_at is not None and mb >= oom_at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        for step in range(1, max_steps + 1):
            tokens = mb * cfg.batch.sequence_length * 8
            time_s = 2.0 if step == 1 else 0.1 * (1 + 0.2 * mb)  # warm-up step, then steady
            for hook in hooks:
                hook(StepStats(step=step, loss=3.0, grad_norm=1.0, lr=1e-3, tokens=tokens, step_time_s=time_s,
                               data_wait_s=0.0, tokens_per_second=tokens / time_s, micro_batch_size=mb,
                               grad_accum_steps=1, world_size=8,
                               peak_memory_bytes=None if peak_per_sample is None else peak_per_sample * mb * 10))

    return run


def test_oom_is_a_result_and_stops_the_sweep():
    cfg = tiny_config(probe={"steps": 3, "micro_batch_candidates": [8, 1, 2, 4]})  # unsorted on purpose
    calls, out = [], io.StringIO()
    report = run_probe(cfg, paths=None, run_fn=_fake_trainer(oom_at=4, calls=calls), stream=out)
    assert [c[0] for c in calls] == [1, 2, 4]  # small to large; 8 never runs
    assert all(c[1:] == (3, False, False, False, 1) for c in calls)
    assert [(c.micro_batch_size, c.status) for c in report.candidates] == [(1, OK), (2, OK), (4, OOM)]
    assert "OutOfMemoryError" in report.candidates[-1].error
    best = report.best
    assert best.micro_batch_size == 2
    # steady state: the warm-up step is left out
    assert best.tokens_per_second == pytest.approx(2 * 32 * 8 / (0.1 * 1.4) / 8)  # per GPU (world size 8)
    text = out.getvalue()
    found = _matches(text)
    assert found == {
        "probe:tokens_per_second": [f"{best.tokens_per_second:.2f}"],
        "probe:peak_memory_fraction": [f"{20 * GIB / cfg.hardware.hbm_bytes:.4f}"],
        "probe:best_micro_batch": ["2"],
    }
    assert "probe candidate: micro_batch=4 status=oom" in text


def test_nothing_fits_reports_zero():
    cfg = tiny_config(probe={"steps": 2, "micro_batch_candidates": [1, 2]})
    calls, out = [], io.StringIO()
    report = run_probe(cfg, None, run_fn=_fake_trainer(oom_at=1, calls=calls), stream=out)
    assert [c.status for c in report.candidates] == [OOM]
    assert _matches(out.getvalue())["probe:best_micro_batch"] == ["0"]
    assert _matches(out.getvalue())["probe:tokens_per_second"] == ["0.00"]


def test_other_errors_are_not_swallowed():
    def broken(cfg, paths, **_):
        raise ValueError("no *.bin token shards")

    with pytest.raises(ValueError):
        run_probe(tiny_config(), None, run_fn=broken, stream=io.StringIO())


def test_candidate_config_keeps_the_plan_apart_from_the_batch():
    cfg = tiny_config(batch__grad_accum_steps=4, batch__ramp_start_accum_steps=1, batch__ramp_steps=10)
    probe_cfg = candidate_config(cfg, 8)
    assert (probe_cfg.batch.micro_batch_size, probe_cfg.batch.grad_accum_steps, probe_cfg.batch.ramp_steps) == (8, 1, 0)
    assert probe_cfg.batch.total_steps == cfg.batch.total_steps
    assert probe_cfg.model == cfg.model and probe_cfg.precision == cfg.precision


@pytest.mark.torch
def test_probe_runs_the_real_trainer_under_torchrun(tmp_path):
    """``torchrun --nproc_per_node 2 -m training --probe`` on the tiny model (gloo); regexes over the real log."""
    cfg = tiny_config(
        parallel={"sharding": "full", "shard_group_size": 2},
        hardware__gpus_per_node=2,
        probe={"steps": 3, "micro_batch_candidates": [2, 1]},
    )
    result = run_training_module(tmp_path, cfg, "--probe", timeout=240)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    found = _matches(result.stdout)
    assert len(found["probe:tokens_per_second"]) == 1 and float(found["probe:tokens_per_second"][0]) > 0
    assert found["probe:best_micro_batch"] in (["1"], ["2"])
    # No GPU: the workers' peak resident set as a fraction of hbm_bytes, and the candidate lines say so.
    assert len(found["probe:peak_memory_fraction"]) == 1 and 0 < float(found["probe:peak_memory_fraction"][0]) < 1
    assert "(resident set, CPU)" in result.stdout
    assert result.stdout.count("probe candidate: micro_batch=") == 2
    assert not any((tmp_path / "ckpt").rglob("*.distcp")) and not any((tmp_path / "model").rglob("*.safetensors"))
