"""A signal to ``tiered-training rehearse`` stops the whole rehearsal within seconds: every host's launcher,
torchrun and trainer workers (which torchrun starts in sessions of their own), with no orphan left, and the
command exits 128 + the signal's number, keeping its work directory."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiered_training.rehearse.hosts import descendants, stop_trees

REPO = Path(__file__).resolve().parents[2]
# BF16: its workers reach their first step sooner than an FP8 template's (no float8 modules); the stop is the same.
RECIPE = REPO / "recipes" / "llama3-1b-bf16.yaml"


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _alive(pid: int, started: str) -> bool:
    """The same process (its start time), and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0] not in ("Z", "X") and fields[19] == started


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()[19]


def _workers(pid: int) -> list[int]:
    """The trainer workers below ``pid`` (torchrun runs ``python -m training``)."""
    return [p for p in descendants(pid) if "training" in _cmdline(p)[1:] and "-m" in _cmdline(p)]


def test_stopping_a_host_ends_its_whole_tree_even_children_in_sessions_of_their_own():
    """As torchrun's workers: a child in a session of its own, which ignores SIGTERM, is found and killed."""
    child = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    host = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}], "
        "start_new_session=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", host], start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        tree = {pid: _start_time(pid) for pid in [proc.pid, *descendants(proc.pid)]}
        assert len(tree) == 2 and all(tree.values())
        started = time.monotonic()
        stop_trees([proc.pid], grace_s=0.5)
        proc.wait(timeout=5)
        while any(_alive(pid, start or "") for pid, start in tree.items()) and time.monotonic() - started < 5:
            time.sleep(0.05)
        assert not any(_alive(pid, start or "") for pid, start in tree.items())
        assert time.monotonic() - started < 3
    finally:
        if proc.poll() is None:
            for pid in [proc.pid, *descendants(proc.pid)]:
                os.kill(pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.torch
@pytest.mark.skipif(not (importlib.util.find_spec("torch") and importlib.util.find_spec("moto")), reason="torch, moto")
def test_sigterm_stops_every_process_of_the_rehearsal_and_keeps_its_work_directory(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path / "out.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tiered_training.cli.app",
                "rehearse",
                str(RECIPE),
                "--hosts",
                "2",
                "--workers",
                "1",
                "--steps",
                "1000",
                "--param",
                "SkipProbe=true",
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if len(_workers(proc.pid)) >= 2 and "training INFO: step" in log.read_text():
                break
            time.sleep(0.2)
        assert proc.poll() is None and len(_workers(proc.pid)) >= 2, log.read_text()[-3000:]
        tree = {pid: _start_time(pid) for pid in descendants(proc.pid)}
        assert len(tree) >= 6  # per host: the launcher, torchrun, a worker (and the workers' helpers)
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        code = proc.wait(timeout=20)
        left = [pid for pid, started in tree.items() if started is not None and _alive(pid, started)]
        while left and time.monotonic() - stopped < 10:
            time.sleep(0.1)
            left = [pid for pid in left if _alive(pid, tree[pid] or "")]
        output = log.read_text()
        assert code == 143, output[-3000:]
        assert not left, [" ".join(_cmdline(pid)) for pid in left]
        assert time.monotonic() - stopped < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "error: rehearse stopped by SIGTERM; the work directory is kept: " in output
    (workdir,) = (tmp_path / "rehearse-out").iterdir()
    assert workdir.name.startswith(RECIPE.stem + "-")
    trace = (workdir / "trace.txt").read_text()
    assert "pipeline trace:" in trace
    assert f"stopped by SIGTERM: every host is stopped; the work directory is kept: {workdir}" in trace
    assert sorted(workdir.glob("*/attempt-1/algo-*/algo-*.log"))  # each host's log
