"""The prepared GPU check: its dry run lists every case with the planner's allocated and
reserved peaks, its CPU smoke runs the trainer and writes calibration rows in the agreed
format, and its shell script parses and keeps carried packages behind the image's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .helpers import REPO

ROW_KEYS = ["id", "source", "date", "hardware", "gpu", "gpus", "framework", "model", "sequence_length",
            "micro_batch_size", "grad_accum_steps", "precision", "fp8_recipe", "activation_checkpointing", "sharding", "shard_group_size",
            "context_parallel", "compile", "tokens_per_second_per_gpu", "peak_memory_gib_allocated",
            "peak_memory_gib_reserved", "notes"]


def test_gpu_check_list_dry_run():
    result = subprocess.run(
        [sys.executable, "-m", "training.tools.gpu_check", "--list"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("gpu_check: 12 runs")
    names = [line.split()[0] for line in lines[1:]]
    for model in ("1b", "3b"):
        for precision in ("bf16", "fp8-tensorwise", "fp8-rowwise"):
            assert f"{model}-{precision}" in names and f"{model}-{precision}-compile" in names
    assert all("GiB allocated" in line and "GiB reserved" in line for line in lines[1:])


def test_gpu_check_without_cuda_exits_cleanly(capsys):
    """In-process (a process of its own would spend seconds importing torch): main's status is the exit status
    (``sys.exit(main())``, which the CPU smoke below runs)."""
    import torch

    from training.tools.gpu_check import main

    if torch.cuda.is_available():
        return
    assert main(["--models", "1b", "--compile", "off"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_gpu_check_cpu_smoke_writes_calibration_rows(tmp_path):
    """The GPU runs' code path on the CPU: the trainer runs, and each run becomes a row with
    exactly the calibration keys; the carried-package path goes after site-packages."""
    out = tmp_path / "smoke.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TT_APPEND_SYSPATH": str(tmp_path / "carried")}
    result = subprocess.run(
        [sys.executable, "-m", "training.tools.gpu_check", "--cpu-smoke", "--precisions", "bf16", "--steps", "3",
         "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=240, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    document = json.loads(out.read_text())
    [row] = document["rows"]
    assert list(row) == ROW_KEYS
    assert row["framework"] == "tiered-training" and row["precision"] == "bf16" and row["compile"] is False
    assert row["tokens_per_second_per_gpu"] > 0 and row["model"]["hidden_size"] == 128
    assert row["grad_accum_steps"] == 1  # the planner's memory is compared for this very setting
    [run] = document["runs"]
    assert run["status"] == "ok" and run["steps"] == 3 and run["predicted_allocated_gib"] <= run["predicted_reserved_gib"]
    assert document["environment"]["sys_path_tail"][-1] == str(tmp_path / "carried")
    assert "site-packages" in document["environment"]["packages"]["torch"]["from"]
    packing = document["packing"]  # packed SFT sequences against each example alone: compiled FlexAttention
    assert packing["status"] == "ok" and packing["relative_error"] <= packing["tolerance"] < packing["leak"]
    assert packing["mask"] == "block" and packing["kernels"]["packed"] == []  # no SDPA kernel with a mask
    assert packing["kernels"]["single"] == ["aten::_scaled_dot_product_flash_attention_for_cpu"]


def test_gpu_check_shell_script_parses():
    script = REPO / "training" / "tools" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert "timeout" in text and "training.tools.gpu_check" in text
    assert "--no-deps" in text and "TT_APPEND_SYSPATH" in text
