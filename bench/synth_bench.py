#!/usr/bin/env python3
"""Synth time of the tiered-training app for 1, 10 and 50 recipes, next to a bare one-bucket CDK app.

Each case runs in a fresh Python process, the way `cdk synth` runs the app: the
repository's own `app.py` (import, plan, build, cdk-nag, synth), with the recipe
directory in CDK_CONTEXT_JSON and a temporary CDK_OUTDIR. The reference is a bare
one-bucket app, measured in the same run, with the same settings: CDK's built-in
CloudFormation validation is off in both by default (as `app.py` runs), or on in both
with `--cfn-validation`. Target: 50 recipes in at most 8x the bare app.

    python bench/synth_bench.py [--repeat 3] [--counts 1 10 50] [--cfn-validation]

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
APP = ROOT / "app.py"
TARGET = 8.0

BARE = """
import sys
from aws_cdk import App, Stack, aws_s3 as s3
app = App(builtin_cloud_formation_validation=sys.argv[1] == "true")
stack = Stack(app, "Bare")
s3.Bucket(stack, "Bucket")
app.synth()
"""


def write_recipes(directory: Path, count: int) -> None:
    text = TEMPLATE.read_text()
    for i in range(count):
        (directory / f"r{i:03d}.yaml").write_text(text.replace("name: llama3-8b-fp8", f"name: bench-{i:03d}"))


def run(validation: bool, recipes: Path | None = None) -> float:
    """Seconds for one fresh process: the bare app, or with ``recipes`` the repository's app.py."""
    flag = "true" if validation else "false"
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "CDK_OUTDIR": out}
        env.pop("CDK_CONTEXT_JSON", None)
        if recipes is not None:
            env["CDK_CONTEXT_JSON"] = json.dumps({"recipes": str(recipes), "cfn_validation": flag})
            command = [sys.executable, str(APP)]
        else:
            command = [sys.executable, "-c", BARE, flag]
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
    parser.add_argument("--cfn-validation", action="store_true", help="CDK's built-in CloudFormation validation on, in every case")
    args = parser.parse_args()
    validation = args.cfn_validation
    run(validation)  # warm jsii's cache and the file system
    rows = [{"case": "bare app (one bucket)", "recipes": 0, "seconds": []}] + [
        {"case": f"{count} recipe(s) + platform", "recipes": count, "seconds": []} for count in args.counts
    ]
    with tempfile.TemporaryDirectory() as directory:
        dirs = {}
        for count in args.counts:
            dirs[count] = Path(directory) / str(count)
            dirs[count].mkdir()
            write_recipes(dirs[count], count)
        # Round robin, so that a change in the machine's load affects every case alike.
        for _ in range(args.repeat):
            for row in rows:
                row["seconds"].append(run(validation, dirs.get(row["recipes"])))
    reference = statistics.median(rows[0]["seconds"])
    setting = "on" if validation else "off"
    print(f"CloudFormation validation {setting} in every case; {args.repeat} runs each, round robin")
    print(f"{'case':<28} {'median s':>9} {'min s':>7} {'x bare':>7}")
    for row in rows:
        med = statistics.median(row["seconds"])
        row["median"] = round(med, 3)
        row["ratio"] = round(med / reference, 3)
        print(f"{row['case']:<28} {med:>9.2f} {min(row['seconds']):>7.2f} {row['ratio']:>7.2f}")
    target = next((r for r in rows if r["recipes"] == 50), None)
    if target:
        verdict = "meets" if target["ratio"] <= TARGET else "misses"
        print(f"50 recipes: {target['ratio']:.2f}x the bare app ({verdict} the {TARGET:g}x target)")
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"synth-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({
        "python": sys.version.split()[0], "machine": platform.machine(), "cpus": os.cpu_count(),
        "node": subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip(),
        "load": os.getloadavg(), "repeat": args.repeat, "cfn_validation": validation, "target": TARGET, "rows": rows,
    }, indent=2))
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
