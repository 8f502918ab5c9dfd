"""Probe mode: one candidate's measurement with a stand-in trainer, the choice over the candidates' results, and
the launcher running each candidate in its own torchrun on the CPU."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiered_training.contract.metrics import probe_metric_definitions
from training.probe import (
    FAILED,
    OK,
    OOM,
    CandidateResult,
    choose,
    probe_config,
    read_results,
    result_file,
    run_probe,
    slow_seconds,
    summary_lines,
)
from training.step_stats import StepStats

from .helpers import REPO, tiny_config

GIB = 1024**3
ALTERNATIVE = {
    "parallel": {"sharding": "full", "shard_group_size": 1},
    "precision": {"precision": "bf16", "activation_checkpointing": "selective", "loss_chunk_tokens": 64},
    "micro_batch_size": 4,
    "grad_accum_steps": 1,
}


def _matches(text: str, count: int) -> dict[str, list[str]]:
    """What SageMaker's MetricDefinitions would extract from this log, metric by metric."""
    return {name: re.findall(regex, text) for name, (_, regex) in probe_metric_definitions(count).items()}


def _two_candidates(**probe):
    return tiny_config(probe={"steps": 3, "alternatives": [ALTERNATIVE], **probe})


def _fake_trainer(calls: list, *, oom: bool = False, compile_warmup: bool = False):
    def run(cfg, paths, *, hooks, max_steps, resume, save_checkpoints, export, step_delay_s):
        mb = cfg.batch.micro_batch_size
        calls.append((mb, cfg.precision.precision, cfg.batch.grad_accum_steps, max_steps, resume, save_checkpoints,
                      export, step_delay_s))
        if oom:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        for step in range(1, max_steps + 1):
            tokens = mb * cfg.batch.sequence_length * 8
            slow = step == 1 or (compile_warmup and step == 2)
            time_s = (2.0 if slow else 0.1) + step_delay_s
            for hook in hooks:
                hook(StepStats(step=step, loss=3.0, grad_norm=1.0, lr=1e-3, tokens=tokens, step_time_s=time_s,
                               data_wait_s=0.0, tokens_per_second=tokens / time_s, micro_batch_size=mb,
                               grad_accum_steps=1, world_size=8, peak_memory_bytes=mb * 10 * GIB,
                               peak_reserved_bytes=mb * 12 * GIB))

    return run


def test_a_candidate_runs_its_own_configuration_and_writes_its_result(tmp_path):
    cfg = _two_candidates()
    calls, out = [], io.StringIO()
    environ = {"TIERED_TRAINING_PROBE_DIR": str(tmp_path), "TIERED_TRAINING_SLOW_CANDIDATE": "2:0.4"}
    result = run_probe(cfg, None, candidate=2, run_fn=_fake_trainer(calls), stream=out, environ=environ)
    # candidate 2: the alternative's micro-batch and precision, one micro-batch a step, nothing saved, slowed
    assert calls == [(4, "bf16", 1, 3, False, False, False, 0.4)]
    assert result.status == OK and result.slowed_s == 0.4
    assert result.tokens_per_second == pytest.approx(4 * 32 * 8 / 0.5 / 8)  # steps 2 and 3; per GPU (8)
    assert (result.peak_allocated_bytes, result.peak_reserved_bytes) == (40 * GIB, 48 * GIB)
    assert CandidateResult.from_json(result_file(tmp_path, 2).read_text()) == result
    line = out.getvalue()
    assert line.startswith("probe candidate 2 (bf16, selective AC, full shard 1, micro-batch 4 x 1): status=ok")
    assert "(slowed on purpose by TIERED_TRAINING_SLOW_CANDIDATE: +0.4 s a step)" in line
    assert "PROBE" not in line  # the host-0 launcher prints the lines the pipeline parses


def test_compile_leaves_out_two_warm_up_steps():
    cfg = tiny_config(probe={"steps": 4}, precision__compile=True)
    result = run_probe(cfg, None, run_fn=_fake_trainer([], compile_warmup=True), stream=io.StringIO(), environ={})
    assert result.tokens_per_second == pytest.approx(2 * 32 * 8 / 0.1 / 8)  # steps 3 and 4 only


def test_oom_is_a_result_and_other_errors_are_not():
    result = run_probe(_two_candidates(), None, run_fn=_fake_trainer([], oom=True), stream=io.StringIO(), environ={})
    assert result.status == OOM and "OutOfMemoryError" in result.error

    def broken(cfg, paths, **_):
        raise ValueError("no *.bin token shards")

    with pytest.raises(ValueError):
        run_probe(tiny_config(), None, run_fn=broken, stream=io.StringIO(), environ={})


def test_slow_candidate_variable():
    assert slow_seconds({"TIERED_TRAINING_SLOW_CANDIDATE": "1:2.5"}, 1) == 2.5
    assert slow_seconds({"TIERED_TRAINING_SLOW_CANDIDATE": "1:2.5"}, 2) == 0.0
    with pytest.raises(ValueError, match='expected "CANDIDATE:SECONDS"'):
        slow_seconds({"TIERED_TRAINING_SLOW_CANDIDATE": "fast"}, 1)


def test_probe_config_keeps_the_plan_apart_from_the_batch():
    cfg = tiny_config(batch__grad_accum_steps=4, batch__ramp_start_accum_steps=1, batch__ramp_steps=10)
    one = probe_config(cfg, 1)
    assert (one.batch.micro_batch_size, one.batch.grad_accum_steps, one.batch.ramp_steps) == (2, 1, 0)
    assert one.batch.total_steps == cfg.batch.total_steps and one.model == cfg.model and one.run.candidate == 1


def _result(number, status=OK, tokens=None, reserved=None, **kw):
    hbm = 179 * GIB
    return CandidateResult(number, status, tokens, None if reserved is None else int(reserved * hbm * 0.9),
                           None if reserved is None else int(reserved * hbm), **kw)


def test_the_fastest_under_the_memory_limit_is_chosen_and_every_value_is_printed():
    cfg = tiny_config(probe={"steps": 3, "alternatives": [ALTERNATIVE] * 3, "memory_limit": 0.85},
                      metrics__plan_tokens_per_second_per_gpu=10634.0)
    results = [_result(1, tokens=7020.0, reserved=0.5), _result(2, tokens=9870.0, reserved=0.61),
               _result(3, tokens=12000.0, reserved=0.92), _result(4, FAILED, error="algo-2 rank-1: ValueError: bad")]
    assert choose(results, 0.85, cfg.hardware.hbm_bytes).best.candidate == 2
    text = "\n".join(summary_lines(results, cfg))
    found = _matches(text, 4)
    assert found["probe:best_candidate"] == ["2"]
    assert found["probe:tokens_per_second"] == ["9870.00"]
    assert found["probe:peak_memory_fraction"] == ["0.6100"]
    assert found["probe:candidate3:peak_reserved_fraction"] == ["0.9200"]
    assert found["probe:candidate1:peak_allocated_fraction"] == ["0.4500"]
    assert not any(found[f"probe:candidate4:{f}"] for f in ("tokens_per_second", "peak_reserved_fraction"))
    why = text.splitlines()[-1]
    assert why.startswith("probe: chose candidate 2 (bf16, selective AC, full shard 1, micro-batch 4 x 1): "
                          "9,870 tokens/s per GPU measured; reserved 61% <= 85%")
    assert "candidate 1 (predicted 10,634): 7,020, slower" in why
    assert "candidate 3: 12,000, over the memory limit: reserved 92% > 85%" in why
    assert "candidate 4, failed: algo-2 rank-1: ValueError: bad" in why


def test_a_measurement_outside_the_models_range_is_called_surprising():
    """The plan hands each candidate's predicted tokens/s and the range of the model's held-out errors: the reason
    line says, per measured candidate, whether it fell within the range."""
    cfg = tiny_config(probe={"steps": 3, "alternatives": [ALTERNATIVE] * 2, "memory_limit": 0.85,
                             "predicted": [(10634.0, 8900.0, 12100.0), (9000.0, 7500.0, 10300.0),
                                           (8000.0, 6700.0, 9100.0)]})
    results = [_result(1, tokens=7020.0, reserved=0.5), _result(2, tokens=9870.0, reserved=0.61),
               _result(3, OOM)]
    why = "\n".join(summary_lines(results, cfg)).splitlines()[-1]
    assert why.startswith("probe: chose candidate 2 (bf16, selective AC, full shard 1, micro-batch 4 x 1): 9,870 "
                          "tokens/s per GPU measured (predicted 9,000, range 7,500-10,300: within the model's error)")
    assert "candidate 1 (predicted 10,634, range 8,900-12,100: surprising): 7,020, slower" in why
    assert "candidate 3 (predicted 8,000, range 6,700-9,100), ran out of memory" in why


def test_nothing_fits_prints_zero_and_the_smallest_reserved_fraction():
    cfg = tiny_config(probe={"steps": 3, "alternatives": [ALTERNATIVE] * 2, "memory_limit": 0.5})
    results = [_result(1, OOM), _result(2, tokens=900.0, reserved=0.7), _result(3, tokens=800.0, reserved=0.6)]
    found = _matches("\n".join(summary_lines(results, cfg)), 3)
    assert found["probe:best_candidate"] == ["0"] and found["probe:tokens_per_second"] == ["0.00"]
    assert found["probe:peak_memory_fraction"] == ["0.6000"]
    assert found["probe:candidate1:tokens_per_second"] == ["0.00"]
    assert found["probe:candidate1:peak_reserved_fraction"] == ["1.0000"]
    only_oom = _matches("\n".join(summary_lines([_result(1, OOM)], tiny_config())), 1)
    assert only_oom["probe:peak_memory_fraction"] == ["1.0000"] and only_oom["probe:best_candidate"] == ["0"]


def test_a_launch_without_a_result_is_a_failed_candidate(tmp_path):
    result_file(tmp_path, 1).write_text(_result(1, tokens=5.0, reserved=0.1).to_json())
    results = read_results(tmp_path, 3, {3: "algo-1 rank-0: RuntimeError: boom"})
    assert [r.status for r in results] == [OK, FAILED, FAILED]
    assert results[1].error == "the launch wrote no result" and results[2].error.endswith("boom")


# -- the launcher: one torchrun per candidate, then the choice --------------------------------------------------


def _opt_ml(tmp_path: Path, cfg) -> Path:
    import numpy as np

    root = tmp_path / "opt/ml"
    (root / "input/config").mkdir(parents=True)
    (root / "input/config/hyperparameters.json").write_text(json.dumps(cfg.to_hyperparameters()))
    (root / "input/config/resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-1", "hosts": ["algo-1"], "current_instance_type": "cpu", "network_interface_name": "lo"}))
    data = root / "input/data/train"
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for index in range(2):
        rng.integers(0, cfg.model.vocab_size, 20_000).astype(np.uint16).tofile(data / f"shard-{index:05d}.bin")
    return root


@pytest.mark.torch
def test_each_candidate_runs_in_its_own_torchrun_and_the_slowed_first_is_not_chosen(tmp_path):
    from tiered_training.contract.ports import loopback_port

    two = {"sharding": "full", "shard_group_size": 2}
    alternative = {**ALTERNATIVE, "parallel": two, "micro_batch_size": 1, "grad_accum_steps": 2,
                   "precision": {"precision": "fp32", "activation_checkpointing": "none", "loss_chunk_tokens": 64}}
    cfg = tiny_config(parallel=two, hardware__gpus_per_node=2, batch__global_batch_tokens=128,
                      probe={"steps": 3, "alternatives": [alternative]})
    root = _opt_ml(tmp_path, cfg)
    env = {**os.environ, "TIERED_TRAINING_OPT_ML": str(root), "TIERED_TRAINING_MASTER_ADDR": "127.0.0.1",
           "TIERED_TRAINING_MASTER_PORT": str(loopback_port()), "SM_NUM_GPUS": "2", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "TIERED_TRAINING_MODE": "probe", "TIERED_TRAINING_SLOW_CANDIDATE": "1:1.0"}
    proc = subprocess.run([sys.executable, "-m", "training.launcher", "train"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert "--probe --candidate=1" in text and "--probe --candidate=2" in text
    results = [CandidateResult.from_json(result_file(root / "output/data/probe", n).read_text()) for n in (1, 2)]
    assert results[0].pid != results[1].pid  # a new process tree each
    assert [r.status for r in results] == [OK, OK]
    found = _matches(proc.stdout, 2)
    assert {name: len(values) for name, values in found.items()} == dict.fromkeys(found, 1)  # each once
    assert found["probe:best_candidate"] == ["2"]  # candidate 1 is slowed by a second a step
    assert float(found["probe:candidate2:tokens_per_second"][0]) > float(found["probe:candidate1:tokens_per_second"][0])
    assert 0 < float(found["probe:peak_memory_fraction"][0]) < 1
    assert "(resident set, CPU)" in proc.stdout and "(slowed on purpose by TIERED_TRAINING_SLOW_CANDIDATE)" in proc.stdout
    assert "probe: chose candidate 2 (fp32, none AC, full shard 2, micro-batch 1 x 2)" in proc.stdout
    assert not (root / "output/failure").exists()
    assert not any((root / "checkpoints").rglob("*.distcp")) and not any((root / "model").rglob("*.safetensors"))
    # the health check ran first, on the same ranks; its CPU figures are printed, not compared with GPU figures
    assert text.index("--module training.health_check") < text.index("--probe --candidate=1")
    assert "health check: algo-1 GPU 1: matmul " in proc.stdout and ", all-reduce in node " in proc.stdout
    assert "not compared with the catalogue's GPU figures" in proc.stdout


@pytest.mark.torch
def test_a_host_below_the_health_check_fails_the_probe_before_any_candidate(tmp_path):
    """TIERED_TRAINING_HEALTH_EXPECT asks this CPU for a matmul figure it cannot reach: the Probe job fails, its
    FailureReason names the host, the GPU and the figure, and no candidate runs (the gate never starts Train)."""
    from tiered_training.contract.ports import loopback_port

    cfg = tiny_config(hardware__gpus_per_node=2, probe={"steps": 3})
    root = _opt_ml(tmp_path, cfg)
    env = {**os.environ, "TIERED_TRAINING_OPT_ML": str(root), "TIERED_TRAINING_MASTER_ADDR": "127.0.0.1",
           "TIERED_TRAINING_MASTER_PORT": str(loopback_port()), "SM_NUM_GPUS": "2", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "TIERED_TRAINING_MODE": "probe", "TIERED_TRAINING_HEALTH_EXPECT": "matmul_tflops=1000000"}
    proc = subprocess.run([sys.executable, "-m", "training.launcher", "train"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-4000:]
    assert "--probe --candidate" not in text
    reason = (root / "output/failure").read_text().strip()
    assert reason.startswith("probe: algo-1 rank-"), reason
    assert "HealthCheckFailed: health check failed on 1 host(s): algo-1 GPU " in reason
    assert "TFLOP/s matmul, below the 1,000,000.0 expected (TIERED_TRAINING_HEALTH_EXPECT)" in reason
