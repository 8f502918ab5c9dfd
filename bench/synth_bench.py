#!/usr/bin/env python3
"""Synth time of the tiered-training app for 1, 10 and 50 recipes, next to a bare one-bucket CDK app.

Each case runs in a fresh Python process, the way `cdk synth` runs the app: the
repository's own `app.py`, with the recipe directory in CDK_CONTEXT_JSON and a temporary
CDK_OUTDIR (import, plan, build, cdk-nag and synth; CDK's built-in CloudFormation
validation is opt-in there, as app.py runs by default). The references, measured in the
same run:

- the bare one-bucket app with CDK's defaults (built-in CloudFormation validation on):
  what any CDK app pays. Target: 50 recipes <= 1.5x this.
- the same bare app with that validation off (the jsii runtime and aws-cdk-lib alone).

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

APP = ROOT / "app.py"


def write_recipes(directory: Path, count: int) -> None:
    text = TEMPLATE.read_text()
    for i in range(count):
        (directory / f"r{i:03d}.yaml").write_text(text.replace("name: llama3-8b-fp8", f"name: bench-{i:03d}"))


def run(code: str | None, recipes: Path | None = None) -> float:
    """Seconds for one fresh process: ``code`` (a bare app) or, with ``recipes``, the repository's app.py."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "CDK_OUTDIR": out}
        env.pop("CDK_CONTEXT_JSON", None)
        if recipes is not None:
            env["CDK_CONTEXT_JSON"] = json.dumps({"recipes": str(recipes)})
            command = [sys.executable, str(APP)]
        else:
            command = [sys.executable, "-c", code]
        start = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(command[1:2])} failed ({result.returncode}):\n{result.stderr[-3000:]}")
        if recipes is not None:
            stacks = list(Path(out).glob("*.template.json"))
            expected = len(list(recipes.glob("*.yaml"))) + 1
            if len(stacks) != expected:
                raise SystemExit(f"app.py wrote {len(stacks)} templates, expected {expected}")
        return elapsed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 10, 50])
    args = parser.parse_args()
    run(BARE)  # warm jsii's cache and the file system
    rows = [
        {"case": "bare app, CDK defaults", "recipes": -1, "seconds": []},
        {"case": "bare app, no CFN validation", "recipes": 0, "seconds": []},
    ] + [{"case": f"{count} recipe(s) + platform", "recipes": count, "seconds": []} for count in args.counts]
    with tempfile.TemporaryDirectory() as directory:
        dirs = {}
        for count in args.counts:
            dirs[count] = Path(directory) / str(count)
            dirs[count].mkdir()
            write_recipes(dirs[count], count)
        # Round robin, so that a change in the machine's load affects every case alike.
        for _ in range(args.repeat):
            for row in rows:
                if row["recipes"] == -1:
                    row["seconds"].append(run(BARE_DEFAULTS))
                elif row["recipes"] == 0:
                    row["seconds"].append(run(BARE))
                else:
                    row["seconds"].append(run(None, dirs[row["recipes"]]))
    defaults, bare = rows[0]["seconds"], rows[1]["seconds"]
    reference = statistics.median(defaults)
    floor = statistics.median(bare)
    print(f"{'case':<28} {'median s':>9} {'min s':>7} {'x bare':>7} {'x bare, no val.':>16}")
    for row in rows:
        med = statistics.median(row["seconds"])
        row["median"] = round(med, 3)
        row["ratio"] = round(med / reference, 3)  # vs the bare app with CDK defaults (the target's reference)
        row["ratio_no_validation"] = round(med / floor, 3)
        print(f"{row['case']:<28} {med:>9.2f} {min(row['seconds']):>7.2f} {row['ratio']:>7.2f} {row['ratio_no_validation']:>16.2f}")
    print("x bare: vs the bare app with CDK defaults; x bare, no val.: vs the bare app without CFN validation")
    target = next((r for r in rows if r["recipes"] == 50), None)
    if target:
        verdict = "meets" if target["ratio"] <= 1.5 else "misses"
        print(f"50 recipes: {target['ratio']:.2f}x the bare app with CDK defaults ({verdict} the 1.5x target)")
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"synth-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({
        "python": sys.version.split()[0], "machine": platform.machine(), "cpus": os.cpu_count(),
        "node": subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip(),
        "load": os.getloadavg(), "repeat": args.repeat, "rows": rows,
    }, indent=2))
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
