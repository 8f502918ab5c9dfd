#!/usr/bin/env python3
"""Synth time of the tiered-training app for 1, 10 and 50 recipes, next to a bare one-bucket CDK app.

Each case runs in a fresh Python process (as `cdk synth` runs app.py): import, build,
plan, cdk-nag and synth to a temporary out directory, with CDK's built-in CloudFormation
validation off in both (as app.py runs by default; it costs about 1.4 s a stack). The bare app is the floor that
any CDK app pays (the jsii runtime and aws-cdk-lib). Target: 50 recipes <= 1.5x bare.

    python bench/synth_bench.py [--repeat 3] [--counts 1 10 50]

Prints a table and writes bench/results/synth-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "recipes" / "llama3-8b-fp8.yaml"

BARE = """
from aws_cdk import App, Stack, aws_s3 as s3
app = App(builtin_cloud_formation_validation=False)
stack = Stack(app, "Bare")
s3.Bucket(stack, "Bucket")
app.synth()
"""

BARE_DEFAULTS = BARE.replace("App(builtin_cloud_formation_validation=False)", "App()")

RECIPES = """
import sys
from aws_cdk import App
from tiered_training.constructs.app import FEATURE_FLAGS, build_app, load_plans
app = App(context=dict(FEATURE_FLAGS), builtin_cloud_formation_validation=False)
build_app(load_plans(sys.argv[1]), app=app, nag=True)
app.synth()
"""


def write_recipes(directory: Path, count: int) -> None:
    text = TEMPLATE.read_text()
    for i in range(count):
        (directory / f"r{i:03d}.yaml").write_text(text.replace("name: llama3-8b-fp8", f"name: bench-{i:03d}"))


def run(code: str, *args: str) -> float:
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "CDK_OUTDIR": out}
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, check=True, capture_output=True)
        return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 10, 50])
    args = parser.parse_args()
    run(BARE)  # warm jsii's cache and the file system
    rows = []
    defaults = [run(BARE_DEFAULTS) for _ in range(args.repeat)]
    rows.append({"case": "bare app, CDK defaults", "recipes": -1, "seconds": defaults})
    bare = [run(BARE) for _ in range(args.repeat)]
    rows.append({"case": "bare app, no CFN validation", "recipes": 0, "seconds": bare})
    for count in args.counts:
        with tempfile.TemporaryDirectory() as directory:
            write_recipes(Path(directory), count)
            times = [run(RECIPES, directory) for _ in range(args.repeat)]
        rows.append({"case": f"{count} recipe(s) + platform", "recipes": count, "seconds": times})
    floor = statistics.median(bare)
    print(f"{'case':<28} {'median s':>9} {'min s':>7} {'x bare':>7}   (x bare: vs the bare app with the same settings)")
    for row in rows:
        med = statistics.median(row["seconds"])
        row["median"] = round(med, 3)
        row["ratio"] = round(med / floor, 3)
        print(f"{row['case']:<28} {med:>9.2f} {min(row['seconds']):>7.2f} {row['ratio']:>7.2f}")
    target = next((r for r in rows if r["recipes"] == 50), None)
    if target:
        verdict = "meets" if target["ratio"] <= 1.5 else "misses"
        print(f"50 recipes: {target['ratio']:.2f}x bare ({verdict} the 1.5x target)")
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"synth-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({
        "python": sys.version.split()[0], "machine": platform.machine(), "cpus": os.cpu_count(),
        "node": subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip(),
        "repeat": args.repeat, "rows": rows,
    }, indent=2))
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
