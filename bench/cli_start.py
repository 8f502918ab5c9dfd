"""How fast the command line starts: ``tiered-training plan recipes/`` against a bare Python that imports
what every command needs (``python -c "import yaml, pydantic"``), as a ratio measured in one run.
Target: at most 4x, both with bytecode (as a user runs it, after the first run) and without (every module
compiled from source: ``PYTHONDONTWRITEBYTECODE`` and an empty ``PYTHONPYCACHEPREFIX``, the bare import
included). Prints a table and saves JSON as bench/cli_start.json.

    .venv/bin/python bench/cli_start.py [--repeat N] [--before CHECKOUT]

The commands alternate, so that a busy machine slows them alike; each is timed ``--repeat`` times
(default 9) and the medians are compared. Both wall-clock and CPU time (user + system) are measured;
the verdict compares CPU time (``--measure wall`` for wall-clock), which other processes on a shared
machine disturb far less, and which equals the wall-clock time of these one-thread commands on a quiet
one. ``--help`` and ``validate`` are timed too, for reference.
Where the time goes: ``python -X importtime -m tiered_training.cli.app plan recipes/``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 4.0
CLI = Path(sys.executable).parent / "tiered-training"


def commands(before: Path | None) -> dict[str, tuple[list[str], Path]]:
    """Each command and the checkout whose code it runs."""
    recipes = str(ROOT / "recipes")
    out = {
        "bare: import yaml, pydantic": ([sys.executable, "-c", "import yaml, pydantic"], ROOT),
        "plan recipes/": ([str(CLI), "plan", recipes], ROOT),
        "validate recipes/": ([str(CLI), "validate", recipes], ROOT),
        "--help": ([str(CLI), "--help"], ROOT),
    }
    if before is not None:
        out["plan recipes/ (--before)"] = ([str(CLI), "plan", recipes], before)
    return out


def run_once(cmd: list[str], env: dict[str, str], tree: Path) -> tuple[float, float]:
    """Wall-clock and CPU seconds (user + system) of one run of ``tree``'s code."""
    env = {**env, "PYTHONPATH": str(tree)}  # this tree's code, whichever checkout installed the script
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9, help="runs of each command (the median is kept)")
    parser.add_argument(
        "--measure",
        choices=("cpu", "wall"),
        default="cpu",
        help="what the verdict compares: CPU time (user + system; steady on a shared machine) or wall-clock time",
    )
    parser.add_argument(
        "--before", type=Path, help="another checkout (an earlier commit): its plan is timed in the same run too"
    )
    args = parser.parse_args(argv)
    if not CLI.exists():
        print(f"no {CLI}: install the package first (make synth)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.pop("NO_COLOR", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a user runs it: the warm-up run writes the bytecode
    env.pop("PYTHONPYCACHEPREFIX", None)
    with tempfile.TemporaryDirectory() as empty:
        modes = {
            "bytecode": env,
            "no bytecode": {**env, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": empty},
        }
        rows = [row for mode, mode_env in modes.items() for row in measure(args, mode, mode_env)]
    print(f"{'mode':<12} {'command':<26} {'wall (s)':>9} {'x bare':>7} {'CPU (s)':>8} {'x bare':>7}")
    for row in rows:
        print(
            f"{row['mode']:<12} {row['command']:<26} {row['wall_median_seconds']:>9.3f} "
            f"{row['wall_ratio_to_bare']:>7.2f} {row['cpu_median_seconds']:>8.3f} {row['cpu_ratio_to_bare']:>7.2f}"
        )
    verdicts = {}
    for mode in modes:
        for command in ("plan recipes/", "--help"):
            row = next(r for r in rows if r["mode"] == mode and r["command"] == command)
            verdicts[f"{command} ({mode})"] = row[f"{args.measure}_ratio_to_bare"]
    met = all(v <= TARGET_RATIO for v in verdicts.values())
    for name, ratio in verdicts.items():
        print(
            f"{name}: {ratio:.2f}x a bare start in {args.measure} time, medians of {args.repeat} "
            f"(target at most {TARGET_RATIO:g}x: {'met' if ratio <= TARGET_RATIO else 'MISSED'})"
        )
    result = {
        "target_ratio": TARGET_RATIO,
        "measure": args.measure,
        "ratios": verdicts,
        "target_met": met,
        "repeat": args.repeat,
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    out = ROOT / "bench" / "cli_start.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out}")
    return 0 if met else 1


def measure(args: argparse.Namespace, mode: str, env: dict[str, str]) -> list[dict]:
    """Each command's median wall-clock and CPU time in one mode, and its ratios to the bare start's."""
    cmds = commands(args.before)
    for cmd, tree in cmds.values():  # warm the file cache (and, with bytecode, write it)
        run_once(cmd, env, tree)
    walls: dict[str, list[float]] = {name: [] for name in cmds}
    cpus: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(args.repeat):
        for name, (cmd, tree) in cmds.items():
            wall, cpu = run_once(cmd, env, tree)
            walls[name].append(wall)
            cpus[name].append(cpu)
    bare = "bare: import yaml, pydantic"
    return [
        {
            "mode": mode,
            "command": name,
            "wall_median_seconds": statistics.median(walls[name]),
            "cpu_median_seconds": statistics.median(cpus[name]),
            "wall_ratio_to_bare": statistics.median(walls[name]) / statistics.median(walls[bare]),
            "cpu_ratio_to_bare": statistics.median(cpus[name]) / statistics.median(cpus[bare]),
        }
        for name in cmds
    ]

if __name__ == "__main__":
    sys.exit(main())
