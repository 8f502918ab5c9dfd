#!/usr/bin/env python3
"""Where the test suite's CPU time goes, and the least it could take with the processes it starts.

Runs the README's test command (``pytest -n 2 --dist loadscope --no-loadscope-reorder``, or the
pytest arguments given) with every Python process of the run traced: its CPU time at exit, whether
it imported torch and torchao, and the test that started it. The trace is a ``.pth`` file put in
this interpreter's site-packages for the run and removed after it, so that it reaches processes
whatever environment they are given (a rehearsal's hosts get a SageMaker-like one); a process of
this virtual environment started elsewhere during the run is traced too. Non-Python processes
(node for CDK synthesis and the CDK CLI) are counted as the rest of the run's CPU time.

Then it measures, in the same run, the least CPU time that one process spends importing what each
kind of process imports (best of three fresh processes), and prints the floor: the start-up CPU of
the processes this suite starts, plus the in-process tests, spread over the CPUs, as if every
training step, save and export took no time at all.

    python bench/suite_cost.py [--cpus 2] [-- pytest args...]

Prints tables and writes bench/results/suite-cost-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_COMMAND = ["-n", "2", "--dist", "loadscope", "--no-loadscope-reorder", "-q", "-p", "no:cacheprovider"]

TRACER = '''
import atexit, json, os, sys, time
_start = time.time()
_done = []


def _record():
    if _done:
        return
    _done.append(1)
    times = os.times()
    row = {"argv": list(getattr(sys, "orig_argv", sys.argv))[:8], "cpu": times.user + times.system,
           "wall": time.time() - _start, "torch": "torch" in sys.modules, "torchao": "torchao" in sys.modules,
           "dcp": "torch.distributed.checkpoint" in sys.modules,
           "test": os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0]}
    try:
        with open(OUT, "a") as f:
            f.write(json.dumps(row) + "\\n")
    except OSError:
        pass


atexit.register(_record)
_exit = os._exit


def _traced_exit(code):  # torchrun's workers and forked children leave through os._exit
    _record()
    _exit(code)


os._exit = _traced_exit
'''

# What each kind of process imports before it can do anything.
IN_PROCESS = ("pytest-xdist worker (in-process tests)", "pytest")
NON_PYTHON = "non-Python (node, CDK CLI, ...)"
IMPORTS = {
    "torchrun agent": "import torch.distributed.run",
    "other torch process": "import torch",
    "trainer worker": "import training.trainer, torch._dynamo",
    "trainer worker with float8": "import training.trainer, torch._dynamo, torchao.float8",
}


def kind(row: dict) -> str:
    argv = " ".join(row["argv"])
    if "exec(eval(" in argv:
        return IN_PROCESS[0]
    if "pytest" in " ".join(row["argv"][:3]):
        return IN_PROCESS[1]
    if "torchrun" in argv or "torch.distributed.run" in argv:
        return "torchrun agent"
    if "training.launcher" in argv:
        return "launcher (no torch)"
    if row["torch"] and row["dcp"]:
        return "trainer worker with float8" if row["torchao"] else "trainer worker"
    if row["torch"]:
        return "other torch process"
    return "other Python"


def least_import_cpu(code: str, repeat: int = 3) -> float:
    """The least CPU seconds one fresh process takes to run ``code`` (its imports)."""
    best = float("inf")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for _ in range(repeat):
        before = os.times()
        subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT, capture_output=True)
        after = os.times()
        best = min(best, (after.children_user - before.children_user) + (after.children_system - before.children_system))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="CPUs the floor spreads over (default: this machine's)")
    parser.add_argument("pytest_args", nargs="*", help="pytest arguments (default: the README's test command)")
    args = parser.parse_args()

    site = Path(sysconfig.get_paths()["purelib"])
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        (Path(tmp) / "tt_suite_trace.py").write_text(TRACER.replace("OUT", repr(str(trace)), 1))
        pth = site / "tt_suite_trace.pth"
        pth.write_text(f"import sys; sys.path.append({tmp!r}); import tt_suite_trace\n")
        try:
            before = os.times()
            started = time.monotonic()
            command = [sys.executable, "-m", "pytest", *(args.pytest_args or README_COMMAND)]
            print("running:", " ".join(command[2:]), flush=True)
            result = subprocess.run(command, cwd=ROOT)
            wall = time.monotonic() - started
            after = os.times()
        finally:
            pth.unlink(missing_ok=True)
        rows = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    total = (after.children_user - before.children_user) + (after.children_system - before.children_system)

    by_kind: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    by_module: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for row in rows:
        k = kind(row)
        by_kind[k][0] += 1
        by_kind[k][1] += row["cpu"]
        if k in IMPORTS:
            module = by_module[row["test"] or "(outside a test)"]
            module[0] += 1
            module[1] += row["cpu"]
    python_cpu = sum(cpu for _, cpu in by_kind.values())
    by_kind[NON_PYTHON] = [None, max(total - python_cpu, 0.0)]

    least = {name: least_import_cpu(code) for name, code in IMPORTS.items()}
    in_process = sum(by_kind[name][1] for name in IN_PROCESS if name in by_kind)
    start_up = sum(by_kind.get(name, [0, 0.0])[0] * least[name] for name in IMPORTS)
    floor = (start_up + in_process + by_kind[NON_PYTHON][1]) / args.cpus

    print(f"\npytest exit status {result.returncode}; {wall / 60:.1f} min; {total / 60:.1f} CPU-min in all\n")
    print(f"{'process kind':<40} {'count':>6} {'CPU-s':>8} {'share':>6} {'CPU-s each':>10}")
    for name, (count, cpu) in sorted(by_kind.items(), key=lambda item: -item[1][1]):
        each = f"{cpu / count:10.1f}" if count else f"{'':>10}"
        print(f"{name:<40} {count if count is not None else '':>6} {cpu:8.0f} {cpu / total:6.0%} {each}")
    print(f"\n{'test module (processes importing torch)':<56} {'count':>6} {'CPU-s':>8}")
    for module, (count, cpu) in sorted(by_module.items(), key=lambda item: -item[1][1])[:15]:
        print(f"{module:<56} {count:>6} {cpu:8.0f}")
    print(f"\n{'least import CPU of one process':<40} {'CPU-s':>6}")
    for name, cpu in least.items():
        print(f"{name:<40} {cpu:6.2f}")
    print(f"\nfloor on {args.cpus} CPU(s), with every process's work taken as free: {floor / 60:.1f} min "
          f"(imports {start_up / 60:.1f} CPU-min, in-process tests {in_process / 60:.1f}, non-Python "
          f"{by_kind[NON_PYTHON][1] / 60:.1f}); measured {wall / 60:.1f} min")

    out = ROOT / "bench" / "results" / f"suite-cost-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": command[2:], "exit_status": result.returncode, "wall_s": wall, "cpu_s": total, "cpus": args.cpus,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "by_kind": {name: {"count": count, "cpu_s": cpu} for name, (count, cpu) in by_kind.items()},
        "by_module": {module: {"count": count, "cpu_s": cpu} for module, (count, cpu) in by_module.items()},
        "least_import_cpu_s": least, "floor_s": floor, "start_up_cpu_s": start_up, "in_process_cpu_s": in_process,
    }, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
