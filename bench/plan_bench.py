"""How long `tiered-training plan` takes over 1, 10 and 50 recipes, end to end (process start
included) and in-process. Prints a table and saves JSON under bench/results/.

    .venv/bin/python bench/plan_bench.py
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


def make_recipes(directory: Path, count: int) -> list[Path]:
    templates = sorted((ROOT / "recipes").glob("*.yaml"))
    paths = []
    for i in range(count):
        template = templates[i % len(templates)]
        text = template.read_text()
        name = text.split("name: ", 1)[1].split()[0]
        path = directory / f"r{i:03d}.yaml"
        path.write_text(text.replace(f"name: {name}", f"name: {name}-{i}", 1))
        paths.append(path)
    return paths


def timed(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        baseline = timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), 5)
        for count in (1, 10, 50):
            directory = base / str(count)
            directory.mkdir()
            paths = make_recipes(directory, count)
            cli = [str(ROOT / ".venv/bin/tiered-training"), "plan", "--format", "json", str(directory)]
            process = timed(lambda: subprocess.run(cli, check=True, capture_output=True), 5)
            from tiered_training.planner import plan_file

            in_process = timed(lambda: [plan_file(p) for p in paths], 5)
            rows.append(
                {
                    "recipes": count,
                    "cli_seconds_median": statistics.median(process),
                    "in_process_seconds_median": statistics.median(in_process),
                    "python_startup_seconds_median": statistics.median(baseline),
                }
            )
    print(f"{'recipes':>8} {'CLI (s)':>10} {'in-process (s)':>15} {'bare python (s)':>16} {'CLI / bare':>11}")
    for row in rows:
        ratio = row["cli_seconds_median"] / row["python_startup_seconds_median"]
        print(f"{row['recipes']:>8} {row['cli_seconds_median']:>10.3f} {row['in_process_seconds_median']:>15.4f} {row['python_startup_seconds_median']:>16.3f} {ratio:>11.1f}")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_bench.json").write_text(json.dumps(rows, indent=2))
    print(f"saved {out / 'plan_bench.json'}")


if __name__ == "__main__":
    main()
