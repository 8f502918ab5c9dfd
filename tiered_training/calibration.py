"""Calibrate the performance model on published runs: ``make calibrate``.

Reads ``catalog/calibration.yaml`` (published tokens/s per GPU and peak memory, each
with its source) and this container's GPU-check results (``bench/gpu/*.json``: a JSON
object ``{"rows": [...]}`` with the same fields). Fits the model's free parameters on
the rows marked ``split: fit`` (least squares on log throughput, Nelder-Mead), prints
predicted against published for every row, and the median and worst error on the rows
the fit never saw. ``--write`` stores the fitted parameters and the errors in
``catalog/performance.yaml``, which the planner reads.

    python -m tiered_training.calibration [--write] [--gpu-dir bench/gpu]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from . import catalogs, memory
from .architecture import Architecture
from .perf import Hardware, LinearCost, Parameters, Setting, step_time

ROOT = Path(__file__).resolve().parent.parent
GPU_DIR = ROOT / "bench" / "gpu"
GIB = 1024**3


class Source(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    url: str
    title: str


class Row(BaseModel):
    """One measured run: its configuration, throughput and, where published, peak memory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    source: Source | str
    date: str
    hardware: str
    gpus: int = Field(ge=1)
    framework: str
    model: str | Architecture
    sequence_length: int = Field(ge=1)
    micro_batch_size: int = Field(ge=1)
    grad_accum_steps: int | None = Field(default=None, ge=1)  # None: not published (taken as more than one)
    precision: Literal["bf16", "fp8", "fp32"]
    fp8_recipe: Literal["tensorwise", "rowwise", "mxfp8"] | None = None
    fp8_all_gather: bool | None = None
    activation_checkpointing: Literal["none", "selective", "full"]
    sharding: Literal["full", "hybrid", "none"]
    shard_group_size: int = Field(ge=1)
    context_parallel: int = Field(default=1, ge=1)
    compile: bool = True
    loss_chunk_tokens: int | None = 4096
    tokens_per_second_per_gpu: float = Field(gt=0)
    peak_memory_gib_allocated: float | None = None
    peak_memory_gib_reserved: float | None = None
    split: Literal["fit", "holdout"] = "holdout"
    notes: str = ""

    @property
    def architecture(self) -> Architecture:
        if isinstance(self.model, Architecture):
            return self.model
        return catalogs.models()[self.model].architecture

    @property
    def setting(self) -> Setting:
        return Setting(
            precision=self.precision,
            checkpointing=self.activation_checkpointing,
            micro_batch=self.micro_batch_size,
            shard_group=self.shard_group_size,
            sharding=self.sharding,
            fp8_recipe=self.fp8_recipe,
            context_parallel=self.context_parallel,
            compile=self.compile,
            fp8_all_gather=self.fp8_all_gather if self.fp8_all_gather is not None else self.fp8_recipe == "tensorwise",
        )


class LinearRow(BaseModel):
    """A single Linear layer, forward and backward: FP8's speed-up over BF16 at one shape."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    source: Source | str
    date: str
    hardware: str
    m: int
    k: int
    n: int
    fp8_recipe: Literal["tensorwise", "rowwise", "mxfp8"]
    speedup: float = Field(gt=0)
    split: Literal["fit", "holdout"] = "fit"


@dataclass(frozen=True)
class Calibration:
    rows: list[Row]
    systems: dict[str, dict]
    frameworks: dict[str, dict]
    linear_rows: list[LinearRow]


def load(gpu_dir: Path | None = GPU_DIR) -> Calibration:
    """The published rows, then every GPU-check row under ``gpu_dir``."""
    data = catalogs._load("calibration.yaml")
    rows = [Row(**row) for row in data["rows"]]
    if gpu_dir is not None and gpu_dir.is_dir():
        for path in sorted(gpu_dir.glob("*.json")):
            document = json.loads(path.read_text())
            for row in document.get("rows", []):
                # A GPU check may record more than a calibration row needs (MFU, step times): keep the row's fields.
                row = {k: v for k, v in row.items() if k in Row.model_fields}
                rows.append(Row(**{"split": "holdout", **row}))
    ids = [r.id for r in rows]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"calibration rows with the same id: {', '.join(duplicates)}")
    linear = [LinearRow(**row) for row in data.get("linear_rows", [])]
    return Calibration(rows=rows, systems=data.get("systems", {}), frameworks=data.get("frameworks", {}), linear_rows=linear)


# -- prediction -------------------------------------------------------------------------


def _value(spec: Any, factors: dict[str, float]) -> float:
    """A number, or ``fit:NAME`` (a calibration-only factor)."""
    if isinstance(spec, str) and spec.startswith("fit:"):
        return factors[spec[4:]]
    return float(spec)


def hardware(row: "Row | LinearRow", cal: Calibration, factors: dict[str, float]) -> tuple[Hardware, float]:
    """The row's machine, and its usable HBM in GiB."""
    instances = catalogs.instances()
    if row.hardware in instances:
        instance = instances[row.hardware]
        return Hardware.of(instance), instance.usable_hbm_gib
    system = cal.systems.get(row.hardware)
    if system is None:
        raise ValueError(f"row {row.id}: hardware {row.hardware!r} is neither an instance type nor a system of calibration.yaml")
    base = instances[system["like"]]
    overrides = {k: system[k] for k in ("hbm_tbps", "peak_bf16_tflops", "peak_fp8_tflops", "usable_hbm_gib") if k in system}
    instance = base.model_copy(update=overrides)
    hw = Hardware.of(instance)
    hw = replace(hw, gpus_per_node=system.get("gpus_per_node", hw.gpus_per_node), compute_factor=_value(system.get("compute_factor", 1.0), factors))
    return hw, instance.usable_hbm_gib


def predict(row: Row, cal: Calibration, params: Parameters, factors: dict[str, float]) -> float:
    """Predicted tokens/s per GPU for the row's run."""
    hw, _ = hardware(row, cal, factors)
    framework = cal.frameworks.get(row.framework, {"factor": 1.0})
    result = step_time(row.architecture, hw, row.setting, sequence_length=row.sequence_length, gpus=row.gpus, accum=1, params=params)
    return result.tokens_per_second_per_gpu * _value(framework.get("factor", 1.0), factors)


def predict_speedup(row: LinearRow, cal: Calibration, params: Parameters, factors: dict[str, float]) -> float:
    """Predicted FP8 speed-up of one compiled Linear, forward and backward."""
    hw, _ = hardware(row, cal, factors)
    bf16 = sum(LinearCost(hw, "bf16", None, True, params).seconds(row.m, row.k, row.n))
    fp8 = sum(LinearCost(hw, "fp8", row.fp8_recipe, True, params).seconds(row.m, row.k, row.n))
    return bf16 / fp8


def predict_memory(row: Row, cal: Calibration, factors: dict[str, float]) -> memory.MemoryBreakdown:
    """The planner's memory breakdown for the row's run, per GPU."""
    _, usable = hardware(row, cal, factors)
    return memory.estimate(
        row.architecture,
        precision=row.precision,
        checkpointing=row.activation_checkpointing,
        sequence_length=row.sequence_length // row.context_parallel,
        micro_batch=row.micro_batch_size,
        shard_group=row.shard_group_size if row.sharding != "none" else 1,
        hbm_bytes=int(usable * GIB),
        loss_chunk_tokens=row.loss_chunk_tokens,
        grad_accum_steps=row.grad_accum_steps,
    )


def predict_memory_gib(row: Row, cal: Calibration, factors: dict[str, float]) -> float:
    """The planner's peak memory for the row's run, as the caching allocator sees it:
    the planner's total without its fixed reserve for the CUDA context and NCCL, which
    live outside ``torch.cuda.max_memory_reserved``."""
    return predict_memory(row, cal, factors).reserved / GIB


# -- fitting ------------------------------------------------------------------------------

FITTED = ("gemm_efficiency", "fp8_gemm_efficiency", "attention_efficiency", "ring_attention_efficiency",
          "eager_memory_factor", "fp8_cast_factor", "fp8_eager_cast_factor")
RECIPES = ("rowwise", "mxfp8")
# Parameter -> (to the fit's unbounded space, back)
_UNIT = (lambda v: math.log(v / (1 - v)), lambda x: 1 / (1 + math.exp(-x)))
_POSITIVE = (math.log, math.exp)
_ABOVE_ONE = (lambda v: math.log(v - 1 + 1e-12), lambda x: 1 + math.exp(x))


def _transforms(names: list[str]) -> list[tuple]:
    out = []
    for name in names:
        if name in ("megatron_te", "fp8_cast_factor"):
            out.append(_POSITIVE)
        elif name in ("eager_memory_factor", "fp8_eager_cast_factor"):
            out.append(_ABOVE_ONE)
        else:
            out.append(_UNIT)  # efficiencies and power factors lie in (0, 1)
    return out


def _unpack(values: dict[str, float], fixed: dict[str, float]) -> tuple[Parameters, dict[str, float]]:
    recipes = {"tensorwise": 1.0, **{r: values[f"recipe_{r}"] for r in RECIPES}}
    params = Parameters(**{k: values[k] for k in FITTED}, **fixed, fp8_recipe_efficiency=recipes)
    factors = {k: v for k, v in values.items() if k not in FITTED and not k.startswith("recipe_")}
    return params, factors


def _start(model: catalogs.PerformanceModel) -> dict[str, float]:
    values = {k: float(model.fitted[k]) for k in FITTED}
    values.update({f"recipe_{r}": float(model.fitted["fp8_recipe_efficiency"][r]) for r in RECIPES})
    values.update(model.calibration_only)
    return values


def nelder_mead(fn, x0: list[float], *, step: float = 0.3, iterations: int = 3000, tolerance: float = 1e-10) -> list[float]:
    """Minimise ``fn`` from ``x0`` (the standard simplex method; pure Python)."""
    n = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    scores = [fn(p) for p in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=scores.__getitem__)
        simplex, scores = [simplex[i] for i in order], [scores[i] for i in order]
        if abs(scores[-1] - scores[0]) < tolerance:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst)]
        r = fn(reflected)
        if r < scores[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            e = fn(expanded)
            simplex[-1], scores[-1] = (expanded, e) if e < r else (reflected, r)
        elif r < scores[-2]:
            simplex[-1], scores[-1] = reflected, r
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            c_score = fn(contracted)
            if c_score < scores[-1]:
                simplex[-1], scores[-1] = contracted, c_score
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, p)] for p in simplex[1:]]
                scores = [scores[0]] + [fn(p) for p in simplex[1:]]
    return simplex[min(range(n + 1), key=scores.__getitem__)]


def fit(cal: Calibration, model: catalogs.PerformanceModel | None = None) -> tuple[Parameters, dict[str, float]]:
    """Fit the free parameters on the ``split: fit`` rows."""
    model = model or catalogs.performance_model()
    start = _start(model)
    names = list(start)
    transforms = _transforms(names)
    rows = [r for r in cal.rows if r.split == "fit"]
    linear = [r for r in cal.linear_rows if r.split == "fit"]

    def loss(x: list[float]) -> float:
        values = {name: back(v) for name, (_, back), v in zip(names, transforms, x)}
        params, factors = _unpack(values, model.fixed)
        runs = sum(math.log(predict(r, cal, params, factors) / r.tokens_per_second_per_gpu) ** 2 for r in rows)
        return runs + sum(math.log(predict_speedup(r, cal, params, factors) / r.speedup) ** 2 for r in linear)

    x = [to(start[name]) for name, (to, _) in zip(names, transforms)]
    for _ in range(3):  # restarts shake the simplex out of a collapsed corner
        x = nelder_mead(loss, x)
    # Rounded as performance.yaml stores them, so that the errors reported are the planner's.
    values = {name: _round(back(v)) for name, (_, back), v in zip(names, transforms, x)}
    return _unpack(values, model.fixed)


# -- report ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    row: Row
    predicted: float
    memory_gib: float | None

    @property
    def error(self) -> float:
        return self.predicted / self.row.tokens_per_second_per_gpu - 1

    @property
    def memory_error(self) -> float | None:
        measured = self.row.peak_memory_gib_reserved
        return None if measured is None or self.memory_gib is None else self.memory_gib / measured - 1


def evaluate(cal: Calibration, params: Parameters, factors: dict[str, float]) -> list[Result]:
    return [Result(r, predict(r, cal, params, factors), predict_memory_gib(r, cal, factors)) for r in cal.rows]


def summary(results: list[Result]) -> dict[str, Any]:
    held = [r for r in results if r.row.split == "holdout"]
    errors = [abs(r.error) for r in held]
    memory_errors = [abs(r.memory_error) for r in held if r.memory_error is not None]
    return {
        "rows": len(results),
        "fit_rows": len(results) - len(held),
        "heldout_rows": len(held),
        "heldout_median_error": round(statistics.median(errors), 4) if errors else None,
        "heldout_worst_error": round(max(errors), 4) if errors else None,
        "heldout_memory_median_error": round(statistics.median(memory_errors), 4) if memory_errors else None,
    }


def table(results: list[Result]) -> str:
    head = f"{'row':<44} {'split':<7} {'published':>9} {'predicted':>9} {'error':>7}   {'GiB pub':>7} {'GiB plan':>8} {'error':>7}"
    lines = [head, "-" * len(head)]
    for r in results:
        mem = r.row.peak_memory_gib_reserved
        mem_text = f"{mem:>7.1f} {r.memory_gib:>8.1f} {r.memory_error:>+7.1%}" if mem is not None else f"{'-':>7} {'-':>8} {'':>7}"
        lines.append(
            f"{r.row.id:<44} {r.row.split:<7} {r.row.tokens_per_second_per_gpu:>9,.0f} {r.predicted:>9,.0f} {r.error:>+7.1%}   {mem_text}"
        )
    return "\n".join(lines)


def write_parameters(params: Parameters, factors: dict[str, float], stats: dict[str, Any], path: Path | None = None) -> None:
    """Store the fitted values and the held-out errors in ``performance.yaml``, keeping its comments."""
    path = path or catalogs.CATALOG_DIR / "performance.yaml"
    text = path.read_text()
    head = text.split("\nfitted:", 1)[0]
    fixed_block = "fixed:" + text.split("\nfixed:", 1)[1].split("\n# Written by", 1)[0]
    tail_comment = "# Written by" + text.split("\n# Written by", 1)[1].split("\nsummary:", 1)[0]
    fitted = {k: _round(getattr(params, k)) for k in FITTED}
    fitted["fp8_recipe_efficiency"] = {k: _round(v) for k, v in params.fp8_recipe_efficiency.items()}
    body = yaml.safe_dump({"fitted": fitted, "calibration_only": {k: _round(v) for k, v in factors.items()}}, sort_keys=False)
    out = head + "\n" + body + fixed_block.rstrip("\n") + "\n" + tail_comment + "\n" + yaml.safe_dump({"summary": stats}, sort_keys=False)
    path.write_text(out)


def _round(value: float) -> float:
    return float(f"{value:.4g}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tiered_training.calibration", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="store the fitted parameters in catalog/performance.yaml")
    parser.add_argument("--gpu-dir", type=Path, default=GPU_DIR, help="GPU-check results (*.json) to add as rows")
    parser.add_argument("--no-fit", action="store_true", help="evaluate the stored parameters without fitting")
    args = parser.parse_args(argv)

    cal = load(args.gpu_dir)
    model = catalogs.performance_model()
    if args.no_fit:
        params, factors = model.parameters(), dict(model.calibration_only)
    else:
        print(f"fitting on {sum(r.split == 'fit' for r in cal.rows)} rows ...", file=sys.stderr)
        params, factors = fit(cal, model)
    results = evaluate(cal, params, factors)
    stats = summary(results)
    print(table(results))
    print()
    print(f"{'single Linear, FP8 over BF16':<44} {'split':<7} {'published':>9} {'predicted':>9} {'error':>7}")
    for row in cal.linear_rows:
        predicted = predict_speedup(row, cal, params, factors)
        print(f"{row.id:<44} {row.split:<7} {row.speedup:>9.2f} {predicted:>9.2f} {predicted / row.speedup - 1:>+7.1%}")
    print()
    print("fitted: " + ", ".join(f"{k}={_round(getattr(params, k))}" for k in FITTED)
          + ", fp8 recipes " + ", ".join(f"{k}={_round(v)}" for k, v in params.fp8_recipe_efficiency.items()))
    print("calibration only: " + ", ".join(f"{k}={_round(v)}" for k, v in factors.items()))
    print(
        f"held-out rows: {stats['heldout_rows']} of {stats['rows']}; throughput error median {stats['heldout_median_error']:.1%}, "
        f"worst {stats['heldout_worst_error']:.1%}; peak memory error median "
        + (f"{stats['heldout_memory_median_error']:.1%}" if stats["heldout_memory_median_error"] is not None else "n/a")
    )
    if args.write:
        write_parameters(params, factors, stats)
        print(f"wrote {catalogs.CATALOG_DIR / 'performance.yaml'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
