"""A rehearsal's wall time, and whether an interrupted rehearsal ends with the losses of an uninterrupted one.

    .venv/bin/python bench/rehearse_bench.py [RECIPE] [--hosts 2] [--steps K] [--variants planned,fp32]

For each variant of the recipe (``planned``: as the planner decided it, FP8 included;
``fp32``: the same recipe with ``tuning.precision: fp32``) it runs the rehearsal twice with
the same scaled settings and the same number of steps: once with ``--interrupt
kill-host@save`` (the last host is killed while it writes its second checkpoint; the job
starts again and resumes from the first), once uninterrupted. It prints every step's loss
from both runs (every digit, from the EMF events) and whether they are equal, bit for bit,
and saves everything as JSON in ``bench/results/rehearse.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import tempfile
import time
from pathlib import Path

from tiered_training.rehearse.run import Options, rehearse

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench/results/rehearse.json"


def variant_recipe(recipe: Path, variant: str, workdir: Path) -> Path:
    if variant == "planned":
        return recipe
    if variant != "fp32":
        raise SystemExit(f"unknown variant {variant!r}: planned or fp32")
    text = recipe.read_text()
    if "\ntuning:" in text:
        raise SystemExit(f"{recipe} has a tuning section; give the fp32 variant a recipe without one")
    path = workdir / f"{recipe.stem}-fp32.yaml"
    path.write_text(text.rstrip("\n") + "\ntuning:\n  precision: fp32\n")
    return path


def run(recipe: Path, *, hosts: int, steps: int | None, interrupt: str | None) -> dict:
    log = io.StringIO()
    started = time.perf_counter()
    result = rehearse(Options(recipe, hosts=hosts, workers=2, steps=steps, interrupt=interrupt, clean=True), log)
    seconds = time.perf_counter() - started
    attempts = result.train_attempts()
    return {
        "interrupt": interrupt or "none",
        "seconds": round(seconds, 1),
        "ok": result.ok,
        "interrupted": result.interrupted,
        "steps": result.scaled.config.batch.total_steps,
        "precision": result.scaled.config.precision.precision,
        "train_attempts": [{"status": a.status, "resumed_from": a.detail.get("resumed_from"),
                            "seconds": a.detail.get("seconds"),
                            "steps": sorted(a.detail.get("losses", {}))} for a in attempts],
        "max_checkpoints_in_s3": result.max_checkpoints,
        "keep_last": result.keep_last,
        "losses": result.losses(),
        "validation_losses": result.validation_losses(),
        "log_tail": log.getvalue()[-3000:] if not result.ok else "",
    }


def compare(uninterrupted: dict, interrupted: dict) -> dict:
    a, b = uninterrupted["losses"], interrupted["losses"]
    steps = sorted(set(a) | set(b))
    rows = [{"step": s, "uninterrupted": a.get(s), "interrupted": b.get(s),
             "equal": s in a and s in b and a[s] == b[s]} for s in steps]
    resumed = [t["resumed_from"] for t in interrupted["train_attempts"] if t["resumed_from"]]
    diffs = [abs(a[s] - b[s]) for s in steps if s in a and s in b]
    va, vb = uninterrupted["validation_losses"], interrupted["validation_losses"]
    common = sorted(set(va) & set(vb))  # validation runs by wall clock: the steps differ between runs
    return {
        "rows": rows,
        "validation_common_steps": common,
        "validation_equal_at_common_steps": all(va[s] == vb[s] for s in common),
        "resumed_from": resumed[0] if resumed else None,
        "all_equal": bool(rows) and all(r["equal"] for r in rows) and len(a) == uninterrupted["steps"],
        "max_abs_difference": max(diffs) if diffs else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", nargs="?", default=str(ROOT / "recipes/qwen2.5-32b-hybrid.yaml"))
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None, help="default: what the interrupt needs (see rehearse --steps)")
    parser.add_argument("--variants", default="planned,fp32")
    args = parser.parse_args()
    recipe = Path(args.recipe)
    report = {"recipe": str(recipe), "hosts": args.hosts, "machine": f"{platform.node()} {platform.machine()}",
              "variants": {}}
    with tempfile.TemporaryDirectory() as workdir:
        for variant in args.variants.split(","):
            path = variant_recipe(recipe, variant, Path(workdir))
            interrupted = run(path, hosts=args.hosts, steps=args.steps, interrupt="kill-host@save")
            uninterrupted = run(path, hosts=args.hosts, steps=interrupted["steps"], interrupt=None)
            comparison = compare(uninterrupted, interrupted)
            report["variants"][variant] = {"uninterrupted": uninterrupted, "interrupted": interrupted, **comparison}
            print_variant(variant, uninterrupted, interrupted, comparison)
    report["all_equal"] = all(v["all_equal"] for v in report["variants"].values())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=1))
    print(f"\nsaved {OUT.relative_to(ROOT)}")


def print_variant(variant: str, uninterrupted: dict, interrupted: dict, comparison: dict) -> None:
    print(f"\n{variant}: precision {interrupted['precision']}, {interrupted['steps']} steps, "
          f"resumed from step {comparison['resumed_from']} after: {interrupted['interrupted']}")
    print(f"{'run':<16} {'wall s':>7} {'ok':>5} {'Train attempts':>15} {'max ckpts in S3':>16}")
    for row in (uninterrupted, interrupted):
        print(f"{row['interrupt']:<16} {row['seconds']:>7} {str(row['ok']):>5} {len(row['train_attempts']):>15} "
              f"{row['max_checkpoints_in_s3']:>7} (<= {row['keep_last'] + 1})")
    print(f"{'step':>5} {'uninterrupted':>22} {'interrupted':>22}  equal")
    for r in comparison["rows"]:
        print(f"{r['step']:>5} {_value(r['uninterrupted']):>22} {_value(r['interrupted']):>22}  {'yes' if r['equal'] else 'NO'}")
    print(f"every step's loss equal, bit for bit: {comparison['all_equal']} "
          f"(largest difference {comparison['max_abs_difference']})")
    va, vb = uninterrupted["validation_losses"], interrupted["validation_losses"]
    print(f"validation loss, uninterrupted: {_series(va)}")
    print(f"validation loss, interrupted:   {_series(vb)}")
    print(f"validation loss equal where both runs had a pass (steps {comparison['validation_common_steps']}): "
          f"{comparison['validation_equal_at_common_steps']}")


def _value(value) -> str:
    return "-" if value is None else repr(value)


def _series(values: dict) -> str:
    return " ".join(f"{step}:{value:.4f}" for step, value in values.items()) or "none"


if __name__ == "__main__":
    main()
