"""How long planning takes, search included: 50 recipes in-process (target: under 1 s, process
start excluded), and ``tiered-training plan`` over 1, 10 and 50 recipes end to end for
reference. Prints a table and saves JSON under bench/results/.

    .venv/bin/python bench/plan_bench.py

The recipes are the templates in recipes/, renamed, cycled to the count. Each plan runs
the full search (precision, checkpointing, micro-batch, shard group, context parallelism).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_SECONDS = 1.0
REPEAT = 5


def make_recipes(directory: Path, count: int) -> list[Path]:
    templates = sorted((ROOT / "recipes").glob("*.yaml"))
    paths = []
    for i in range(count):
        template = templates[i % len(templates)]
        text = template.read_text()
        name = text.split("\nname: ", 1)[1].split()[0]
        path = directory / f"r{i:03d}.yaml"
        path.write_text(text.replace(f"\nname: {name}", f"\nname: {name}-{i}", 1))
        paths.append(path)
    return paths


def timed(fn, repeat: int = REPEAT) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    from tiered_training.planning.planner import plan_file, resolve
    from tiered_training.recipe.loader import load_recipe_with_lines

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        baseline = timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))
        for count in (1, 10, 50):
            directory = base / str(count)
            directory.mkdir()
            paths = make_recipes(directory, count)
            plan_file(paths[0])  # catalogues loaded and cached once, as in any process
            loaded = [load_recipe_with_lines(p) for p in paths]
            in_process = timed(lambda paths=paths: [plan_file(p) for p in paths])
            search_only = timed(lambda loaded=loaded: [resolve(recipe, lines=lines) for recipe, lines in loaded])
            cli = [str(ROOT / ".venv/bin/tiered-training"), "plan", "--format", "json", str(directory)]
            process = timed(lambda cli=cli: subprocess.run(cli, capture_output=True))
            rows.append(
                {
                    "recipes": count,
                    "in_process_seconds_median": statistics.median(in_process),
                    "resolve_seconds_median": statistics.median(search_only),
                    "cli_seconds_median": statistics.median(process),
                    "python_startup_seconds_median": statistics.median(baseline),
                }
            )

    print(f"{'recipes':>8} {'load+plan (s)':>14} {'plan only (s)':>14} {'CLI (s)':>9} {'bare python (s)':>16}")
    for row in rows:
        print(
            f"{row['recipes']:>8} {row['in_process_seconds_median']:>14.3f} {row['resolve_seconds_median']:>14.3f} "
            f"{row['cli_seconds_median']:>9.3f} {row['python_startup_seconds_median']:>16.3f}"
        )
    fifty = rows[-1]["in_process_seconds_median"]
    verdict = "met" if fifty < TARGET_SECONDS else "MISSED"
    print(f"50 recipes, search included, in-process: {fifty:.3f} s (target under {TARGET_SECONDS:g} s: {verdict})")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    result = {"target_seconds": TARGET_SECONDS, "fifty_recipes_seconds": fifty, "target_met": fifty < TARGET_SECONDS, "rows": rows}
    (out / "plan_bench.json").write_text(json.dumps(result, indent=2))
    print(f"saved {out / 'plan_bench.json'}")


if __name__ == "__main__":
    main()
