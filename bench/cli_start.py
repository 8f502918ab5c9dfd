"""How fast the command line starts: ``tiered-training plan recipes/`` against a bare Python that imports
what every command needs (``python -c "import yaml, pydantic"``), as a ratio measured in one run.
Target: at most 4x. Prints a table and saves JSON under bench/results/.

    .venv/bin/python bench/cli_start.py [--repeat N]

The two commands alternate, so that a busy machine slows both alike; each is timed ``--repeat``
times (default 9) and the medians are compared. ``--help`` and ``validate`` are timed too, for reference.
Where the time goes: ``python -X importtime -m tiered_training.cli.app plan recipes/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 4.0
CLI = Path(sys.executable).parent / "tiered-training"


def commands() -> dict[str, list[str]]:
    recipes = str(ROOT / "recipes")
    return {
        "bare: import yaml, pydantic": [sys.executable, "-c", "import yaml, pydantic"],
        "plan recipes/": [str(CLI), "plan", recipes],
        "validate recipes/": [str(CLI), "validate", recipes],
        "--help": [str(CLI), "--help"],
    }


def run_once(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9, help="runs of each command (the median is kept)")
    args = parser.parse_args(argv)
    if not CLI.exists():
        print(f"no {CLI}: install the package first (make synth)", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this tree's code, whichever checkout installed the script
    env.pop("NO_COLOR", None)
    cmds = commands()
    for cmd in cmds.values():  # warm the file cache and the bytecode
        run_once(cmd, env)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(args.repeat):
        for name, cmd in cmds.items():
            times[name].append(run_once(cmd, env))
    bare = statistics.median(times["bare: import yaml, pydantic"])
    rows = [
        {
            "command": name,
            "median_seconds": statistics.median(values),
            "min_seconds": min(values),
            "ratio_to_bare": statistics.median(values) / bare,
        }
        for name, values in times.items()
    ]
    print(f"{'command':<30} {'median (s)':>10} {'min (s)':>8} {'x bare':>7}")
    for row in rows:
        print(
            f"{row['command']:<30} {row['median_seconds']:>10.3f} {row['min_seconds']:>8.3f} "
            f"{row['ratio_to_bare']:>7.2f}"
        )
    ratio = next(r["ratio_to_bare"] for r in rows if r["command"] == "plan recipes/")
    met = ratio <= TARGET_RATIO
    print(f"plan recipes/: {ratio:.2f}x a bare start (target at most {TARGET_RATIO:g}x: {'met' if met else 'MISSED'})")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    result = {"target_ratio": TARGET_RATIO, "plan_ratio": ratio, "target_met": met, "repeat": args.repeat, "rows": rows}
    (out / "cli_start.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out / 'cli_start.json'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
