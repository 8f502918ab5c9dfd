"""The prepared GPU check: it imports, its dry run lists every case with a prediction, and the script parses."""

from __future__ import annotations

import subprocess
import sys

from .helpers import REPO


def test_gpu_check_list_dry_run():
    result = subprocess.run(
        [sys.executable, "-m", "training.gpu_check", "--list"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("gpu_check: 12 runs")
    names = [line.split()[0] for line in lines[1:]]
    for model in ("1b", "3b"):
        for precision in ("bf16", "fp8-tensorwise", "fp8-rowwise"):
            assert f"{model}-{precision}" in names and f"{model}-{precision}-compile" in names
    assert all("predicted peak" in line for line in lines[1:])


def test_gpu_check_without_cuda_exits_cleanly():
    import torch

    if torch.cuda.is_available():
        return
    result = subprocess.run(
        [sys.executable, "-m", "training.gpu_check", "--models", "1b", "--no-compile"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and "no CUDA device" in result.stderr


def test_gpu_check_shell_script_parses():
    script = REPO / "training" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert "timeout" in script.read_text() and "training.gpu_check" in script.read_text()
