"""Calibrate the performance model on published runs: ``make calibrate``.

Reads ``catalog/calibration.yaml`` (published tokens/s per GPU and peak memory, each
with its source) and this container's GPU-check results (``bench/gpu/*.json``: a JSON
object ``{"rows": [...]}`` with the same fields). Fits the model's free parameters on
every row (least squares on log throughput, each source weighted as one, Nelder-Mead) and prints predicted against
published for every row.

Validation holds out whole sources: for each source (a published document, or this
container's GPU checks), the model is refitted without that source's rows and predicts
them; a factor that only that source's rows would fit stays at 1. The table reports the
median and worst error by source and overall, for throughput and peak memory.
``--write`` stores the fitted parameters and these errors in ``catalog/performance.yaml``,
which the planner reads.

    python -m tiered_training.planning.calibration [--write] [--json FILE] [--gpu-dir bench/gpu] [--no-loso]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tiered_training import catalog as catalogs
from tiered_training.contract.architecture import Architecture
from tiered_training.planning import memory, perf, uncertainty
from tiered_training.planning.perf import Hardware, LinearCost, Parameters, Setting, step_time

ROOT = Path(__file__).resolve().parents[2]
GPU_DIR = ROOT / "bench" / "gpu"
GIB = 1024**3
# The source of this container's own GPU-check rows, as validation groups them.
OWN_RUNS = "this container's GPU checks (bench/gpu)"


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
    notes: str = ""

    @property
    def source_key(self) -> str:
        return source_key(self)

    @property
    def published(self) -> bool:
        return self.framework != "tiered-training"

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


def source_key(row: Row | LinearRow) -> str:
    """The independent source a row comes from: its document (a repository file at any
    commit counts as one), or this container's GPU checks."""
    if isinstance(row, Row) and not row.published:
        return OWN_RUNS
    url = row.source.url if isinstance(row.source, Source) else row.source
    parts = url.split("/")
    if "github.com" in url and len(parts) > 6 and parts[5] in ("blob", "tree"):
        parts[6] = "-"  # the branch or commit
    return "/".join(parts)


@dataclass(frozen=True)
class Calibration:
    rows: list[Row]
    systems: dict[str, dict[str, Any]]  # calibration.yaml's, by name
    frameworks: dict[str, dict[str, Any]]
    linear_rows: list[LinearRow]
    machines: dict[str, tuple[Hardware, float]] = field(default_factory=dict, compare=False)  # hardware() cache


class CalibrationError(Exception):
    """A calibration row that cannot be read: one line naming its file, line and field."""


def _row_lines(text: str) -> list[int]:
    """The 1-based line of each entry of ``rows:`` in calibration.yaml's text (an empty list if it has none)."""
    root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if not isinstance(root, yaml.MappingNode):
        return []
    for key, value in root.value:
        if key.value == "rows" and isinstance(value, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in value.value]
    return []


def _row(entry: Any, index: int, keep_known: bool = False) -> Row:
    """``entry`` as a row, or :class:`CalibrationError` naming the row and the field (the caller adds where)."""
    name = f"rows[{index}]" + (f" ({entry['id']})" if isinstance(entry, dict) and "id" in entry else "")
    if not isinstance(entry, dict):
        raise CalibrationError(f"{name}: a row is a mapping of fields (id, source, hardware, ...)")
    if keep_known:  # a GPU check may record more than a row needs (MFU, step times): keep the row's fields
        entry = {k: v for k, v in entry.items() if k in Row.model_fields}
    try:
        return Row(**entry)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(map(str, error["loc"])) or "row"
        extra = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise CalibrationError(f"{name}: {field}: {error['msg']}{extra}") from None


def load(gpu_dir: Path | None = GPU_DIR) -> Calibration:
    """The published rows, then every GPU-check row under ``gpu_dir``. Raises :class:`CalibrationError` for a row
    that cannot be read, naming its file, line and field."""
    data = catalogs._load("calibration.yaml")
    path = catalogs.CATALOG_DIR / "calibration.yaml"
    entries = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise CalibrationError(f"{path}: no rows: list the published runs under rows:")
    rows = []
    for index, entry in enumerate(entries):
        try:
            rows.append(_row(entry, index))
        except CalibrationError as exc:
            lines = _row_lines(path.read_text(encoding="utf-8"))  # composed again only to name the row's line
            where = f"{path}:{lines[index]}" if index < len(lines) else str(path)
            raise CalibrationError(f"{where}: {exc}") from None
    if gpu_dir is not None and gpu_dir.is_dir():
        for json_path in sorted(gpu_dir.glob("*.json")):
            try:
                document = json.loads(json_path.read_text())
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                raise CalibrationError(f"{json_path}: not a GPU check's JSON ({exc})") from None
            found = document.get("rows", []) if isinstance(document, dict) else None
            if not isinstance(found, list):
                raise CalibrationError(f"{json_path}: rows: a list of rows, as `make gpu-check` writes")
            try:
                rows += [_row(entry, index, keep_known=True) for index, entry in enumerate(found)]
            except CalibrationError as exc:
                raise CalibrationError(f"{json_path}: {exc}") from None
    ids = [r.id for r in rows]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise CalibrationError(f"calibration rows with the same id: {', '.join(duplicates)}; give each its own")
    linear = [LinearRow(**row) for row in data.get("linear_rows", [])]
    return Calibration(
        rows=rows, systems=data.get("systems", {}), frameworks=data.get("frameworks", {}), linear_rows=linear
    )


# -- prediction -------------------------------------------------------------------------


def _value(spec: Any, factors: dict[str, float]) -> float:
    """A number, or ``fit:NAME`` (a calibration-only factor)."""
    if isinstance(spec, str) and spec.startswith("fit:"):
        return factors[spec[4:]]
    return float(spec)


def hardware(row: Row | LinearRow, cal: Calibration, factors: dict[str, float]) -> tuple[Hardware, float]:
    """The row's machine, and its usable HBM in GiB."""
    system = cal.systems.get(row.hardware)
    spec = system.get("compute_factor", 1.0) if system else 1.0
    key = row.hardware
    if key not in cal.machines:
        cal.machines[key] = _machine(row, cal)
    hw, usable = cal.machines[key]
    if spec == 1.0 or (isinstance(spec, str) and spec[4:] not in factors):
        return hw, usable  # (a fitted factor not given: the machine as its figures say)
    return replace(hw, compute_factor=_value(spec, factors)), usable


def _machine(row: Row | LinearRow, cal: Calibration) -> tuple[Hardware, float]:
    instances = catalogs.instances()
    if row.hardware in instances:
        instance = instances[row.hardware]
        return Hardware.of(instance), instance.usable_hbm_gib
    system = cal.systems.get(row.hardware)
    if system is None:
        raise ValueError(
            f"row {row.id}: hardware {row.hardware!r} is neither an instance type nor a system of calibration.yaml"
        )
    base = instances[system["like"]]
    overrides: dict[str, Any] = {
        k: system[k]
        for k in (
            "hbm_tbps",
            "peak_bf16_tflops",
            "peak_fp8_tflops",
            "usable_hbm_gib",
            "efa_gbps",
            "matmul_bf16_fraction",
            "matmul_fp8_fraction",
        )
        if k in system
    }
    instance = base.model_copy(update=overrides)
    hw = Hardware.of(instance)
    hw = replace(hw, gpus_per_node=system.get("gpus_per_node", hw.gpus_per_node))
    return hw, instance.usable_hbm_gib


def kind_of_run(row: Row, cal: Calibration) -> dict[str, str]:
    """The row's kind of run (planning/uncertainty.py): GPU generation, precision, compiled or eager, sequence."""
    hw, _ = hardware(row, cal, {})
    return uncertainty.kind_of_run(hw.gpu, row.precision, row.compile, row.sequence_length)


def run_setting(row: Row, cal: Calibration) -> Setting:
    """The row's setting as its framework runs it: attention kernel, K/V repeat, positions, elementwise kernels
    and float8 casts (calibration.yaml's ``frameworks``); this container's rows run its own decoder and loss."""
    framework = cal.frameworks.get(row.framework, {})
    return replace(
        row.setting,
        attention_kernel=framework.get("attention_kernel", "sdpa"),
        repeat_kv=framework.get("repeat_kv", False),
        rope=framework.get("rope", True),
        native_elementwise=framework.get("native_elementwise", False),
        fp8_casts=framework.get("fp8_casts", "torchao"),
        container_code=not row.published,
    )


def predict(row: Row, cal: Calibration, params: Parameters, factors: dict[str, float]) -> float:
    """Predicted tokens/s per GPU for the row's run."""
    hw, _ = hardware(row, cal, factors)
    framework = cal.frameworks.get(row.framework, {"factor": 1.0})
    # The optimiser step is charged once per optimiser step: a run's gradient accumulation
    # spreads it over that many micro-batches (unpublished: one, torchtitan's default).
    accum = row.grad_accum_steps or 1
    setting = run_setting(row, cal)
    result = step_time(
        row.architecture, hw, setting, sequence_length=row.sequence_length, gpus=row.gpus, accum=accum, params=params
    )
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
        compiled=row.compile,
    )


def predict_memory_gib(row: Row, cal: Calibration, factors: dict[str, float]) -> float | None:
    """The planner's peak memory for the row's run, as the caching allocator sees it:
    the planner's total without its fixed reserve for the CUDA context and NCCL, which
    live outside ``torch.cuda.max_memory_reserved``. None for a framework whose memory
    layout the model does not describe (``memory_model: false``)."""
    if not cal.frameworks.get(row.framework, {}).get("memory_model", True):
        return None
    return predict_memory(row, cal, factors).reserved / GIB


# -- fitting ------------------------------------------------------------------------------

FITTED = (
    "gemm_efficiency",
    "fp8_gemm_efficiency",
    "attention_efficiency",
    "ring_step_overhead",
    "eager_memory_factor",
    "fp8_cast_factor",
    "fp8_eager_cast_factor",
)
RECIPES = ("rowwise", "mxfp8")
# Parameter -> (to the fit's unbounded space, back)
Transform = tuple[Callable[[float], float], Callable[[float], float]]
_UNIT: Transform = (lambda v: math.log(v / (1 - v)), lambda x: 1 / (1 + math.exp(-x)))
_POSITIVE: Transform = (math.log, math.exp)
_ABOVE_ONE: Transform = (lambda v: math.log(v - 1 + 1e-12), lambda x: 1 + math.exp(x))


def _transforms(names: list[str]) -> list[Transform]:
    out: list[Transform] = []
    for name in names:
        if name in ("megatron_te", "fp8_cast_factor", "fp8_eager_cast_factor", "ring_step_overhead"):
            out.append(_POSITIVE)
        elif name == "eager_memory_factor":
            out.append(_ABOVE_ONE)
        else:
            out.append(_UNIT)  # efficiencies and power factors lie in (0, 1)
    return out


def _unpack(values: dict[str, float], fixed: dict[str, float]) -> tuple[Parameters, dict[str, float]]:
    recipes = {"tensorwise": 1.0, **{r: values[f"recipe_{r}"] for r in RECIPES}}
    params = Parameters(**{k: values[k] for k in FITTED}, **fixed, fp8_recipe_efficiency=recipes)
    factors = {k: v for k, v in values.items() if k not in FITTED and not k.startswith("recipe_")}
    return params, factors


# Where every fit starts, whatever was fitted before: a refit without a source must not
# inherit what that source taught an earlier fit.
START = {
    "gemm_efficiency": 0.5,
    "fp8_gemm_efficiency": 0.5,
    "attention_efficiency": 0.4,
    "ring_step_overhead": 0.1,
    "eager_memory_factor": 2.0,
    "fp8_cast_factor": 1.5,
    "fp8_eager_cast_factor": 1.5,
    **{f"recipe_{r}": 0.9 for r in RECIPES},
}
# A parameter that no row of a fit informs takes the value that adds no effect (a ring
# step then costs its counted work only: perf.ring_seconds and the exposed exchange).
NEUTRAL = {
    "ring_step_overhead": 0.0,
    "eager_memory_factor": 1.0,
    "fp8_cast_factor": 1.0,
    "fp8_eager_cast_factor": 1.0,
    **{f"recipe_{r}": 1.0 for r in RECIPES},
}


def _informed(rows: list[Row], linear: list[LinearRow], cal: Calibration) -> set[str]:
    """The free parameters and factors that these rows' predictions depend on."""
    names = {"gemm_efficiency", "attention_efficiency"}
    for r in rows:
        names |= _factor_names(r, cal)
        if r.context_parallel > 1:
            names.add("ring_step_overhead")
        setting = run_setting(r, cal)
        # eager: the factor prices a published Llama's kernels (native ones and this container's are counted)
        if not setting.compile and not setting.native_elementwise and not setting.container_code:
            names.add("eager_memory_factor")
        if r.precision == "fp8":
            names.add("fp8_gemm_efficiency")
            if setting.fp8_casts == "torchao":
                names.add("fp8_cast_factor" if r.compile else "fp8_eager_cast_factor")
            if r.fp8_recipe in RECIPES:
                names.add(f"recipe_{r.fp8_recipe}")
    for linear_row in linear:
        names |= _factor_names(linear_row, cal) | {"fp8_gemm_efficiency", "fp8_cast_factor"}
        if linear_row.fp8_recipe in RECIPES:
            names.add(f"recipe_{linear_row.fp8_recipe}")
    return names


def nelder_mead(
    fn: Callable[[list[float]], float],
    x0: list[float],
    *,
    step: float = 0.3,
    iterations: int = 3000,
    tolerance: float = 1e-10,
) -> list[float]:
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


def _factor_names(row: Row | LinearRow, cal: Calibration) -> set[str]:
    """The calibration-only factors (``fit:NAME``) a row's prediction uses."""
    specs = [cal.systems.get(row.hardware, {}).get("compute_factor")]
    if isinstance(row, Row):
        specs.append(cal.frameworks.get(row.framework, {}).get("factor"))
    return {spec[4:] for spec in specs if isinstance(spec, str) and spec.startswith("fit:")}


def fit(
    cal: Calibration,
    model: catalogs.PerformanceModel | None = None,
    *,
    without: str | None = None,
    iterations: int = 1500,
) -> tuple[Parameters, dict[str, float]]:
    """Fit the free parameters on every row but those of source ``without``, from ``START``.
    A parameter or factor that no remaining row informs is not fitted: it takes its
    ``NEUTRAL`` value (1: no effect)."""
    model = model or catalogs.performance_model()
    rows = [r for r in cal.rows if source_key(r) != without]
    linear = [r for r in cal.linear_rows if source_key(r) != without]
    informed = _informed(rows, linear, cal)
    factors_start = {
        k: 1.0 if k in ("megatron_te",) else 0.9 for k in model.calibration_only
    }  # power factors lie in (0, 1)
    start = {k: v for k, v in {**START, **factors_start}.items() if k in informed}
    unused = {k: NEUTRAL.get(k, 1.0) for k in [*START, *model.calibration_only] if k not in informed}
    names = list(start)
    transforms = _transforms(names)

    # Each source weighs as much as any other, however many rows it publishes.
    per_source: dict[str, int] = {}
    for r in rows:
        per_source[source_key(r)] = per_source.get(source_key(r), 0) + 1
    weights = [len(rows) / len(per_source) / per_source[source_key(r)] for r in rows]

    def loss(x: list[float]) -> float:
        values = {name: back(v) for name, (_, back), v in zip(names, transforms, x)}
        params, factors = _unpack({**values, **unused}, model.fixed)
        runs = sum(
            w * math.log(predict(r, cal, params, factors) / r.tokens_per_second_per_gpu) ** 2
            for r, w in zip(rows, weights)
        )
        return runs + sum(math.log(predict_speedup(r, cal, params, factors) / r.speedup) ** 2 for r in linear)

    x = [to(start[name]) for name, (to, _) in zip(names, transforms)]
    for _ in range(3):  # restarts shake the simplex out of a collapsed corner
        x = nelder_mead(loss, x, iterations=iterations)
    # Rounded as performance.yaml stores them, so that the errors reported are the planner's.
    values = {name: _round(back(v)) for name, (_, back), v in zip(names, transforms, x)}
    return _unpack({**values, **unused}, model.fixed)


def sources(cal: Calibration) -> list[str]:
    """Every independent source of the rows, in the order the rows first name them."""
    return list(dict.fromkeys(source_key(r) for r in cal.rows))


def leave_one_source_out(
    cal: Calibration, model: catalogs.PerformanceModel | None = None, *, iterations: int = 1500
) -> list[Result]:
    """Each source's rows predicted by the model fitted without that source."""
    results = []
    for key in sources(cal):
        params, factors = fit(cal, model, without=key, iterations=iterations)
        results += [
            Result(r, predict(r, cal, params, factors), predict_memory_gib(r, cal, factors))
            for r in cal.rows
            if source_key(r) == key
        ]
    return results


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


def _median_worst(errors: list[float]) -> tuple[float | None, float | None]:
    errors = [abs(e) for e in errors]
    return (round(statistics.median(errors), 4), round(max(errors), 4)) if errors else (None, None)


def summary(cal: Calibration, loso: list[Result]) -> dict[str, Any]:
    """What the planner quotes: the rows, and the leave-one-source-out errors."""
    throughput = _median_worst([r.error for r in loso])
    memory_ = _median_worst([r.memory_error for r in loso if r.memory_error is not None])
    published = _median_worst([r.error for r in loso if r.row.published])
    own = _median_worst([r.error for r in loso if not r.row.published])
    by_kind = uncertainty.bands_by_kind((kind_of_run(r.row, cal), r.error) for r in loso)
    return {
        "rows": len(cal.rows),
        "published_rows": sum(r.published for r in cal.rows),
        "own_rows": sum(not r.published for r in cal.rows),
        "sources": len(sources(cal)),
        "loso_median_error": throughput[0],
        "loso_worst_error": throughput[1],
        "loso_memory_median_error": memory_[0],
        "loso_memory_worst_error": memory_[1],
        "loso_published_median_error": published[0],
        "loso_published_worst_error": published[1],
        "loso_own_median_error": own[0],
        "loso_own_worst_error": own[1],
        # by kind of run, every source's rows: what the planner's ranges come from
        "loso_by_kind": {d: {k: b.to_dict() for k, b in groups.items()} for d, groups in by_kind.items()},
        # each held-out run's kind and error: the planner's range is the band of the runs of a plan's kind
        "loso_runs": [{**kind_of_run(r.row, cal), "error": round(r.error, 4)} for r in loso],
    }


def _label(key: str, rows: list[Row]) -> str:
    if key == OWN_RUNS:
        return key
    title = rows[0].source.title if isinstance(rows[0].source, Source) else key
    return title.split(",")[0]


def loso_table(cal: Calibration, loso: list[Result]) -> str:
    """Leave-one-source-out errors by source and overall."""

    def pct(v: float | None) -> str:
        return f"{v:>7.1%}" if v is not None else f"{'-':>7}"

    head = f"{'held-out source':<48} {'rows':>4} {'median':>7} {'worst':>7}   {'memory':>6} {'median':>7} {'worst':>7}"
    lines = [head, "-" * len(head)]
    groups = [
        (_label(k, [r.row for r in loso if source_key(r.row) == k]), [r for r in loso if source_key(r.row) == k])
        for k in sources(cal)
    ]
    groups.append(("published sources", [r for r in loso if r.row.published]))
    groups.append(("all sources", loso))
    kinds = {r.row.id: kind_of_run(r.row, cal) for r in loso}
    for dimension in uncertainty.DIMENSIONS:
        for value in sorted({k[dimension] for k in kinds.values()}):
            chosen = [r for r in loso if kinds[r.row.id][dimension] == value]
            groups.append((f"{dimension}: {value}, published", [r for r in chosen if r.row.published]))
            groups.append((f"{dimension}: {value}, all", chosen))
    split = len(sources(cal))
    for i, (label, results) in enumerate(groups):
        if not results:
            continue
        if i in (split, split + 2):
            lines.append("-" * len(head))
        thr = _median_worst([r.error for r in results])
        mem_errors = [r.memory_error for r in results if r.memory_error is not None]
        mem = _median_worst(mem_errors)
        lines.append(
            f"{label[:48]:<48} {len(results):>4} {pct(thr[0])} {pct(thr[1])}   {len(mem_errors):>6} {pct(mem[0])} "
            f"{pct(mem[1])}"
        )
    return "\n".join(lines)


def loso_record(cal: Calibration, loso: list[Result], params: Parameters) -> dict[str, Any]:
    """The leave-one-source-out table as data (``--json``): by source, then published and all,
    each row's held-out error, and the parameters fitted on every source."""

    def group(results: list[Result]) -> dict[str, Any]:
        thr = _median_worst([r.error for r in results])
        mem = _median_worst([r.memory_error for r in results if r.memory_error is not None])
        return {
            "rows": len(results),
            "median": thr[0],
            "worst": thr[1],
            "memory_median": mem[0],
            "memory_worst": mem[1],
        }

    by_source = {
        _label(k, [r.row for r in loso if source_key(r.row) == k]): group([r for r in loso if source_key(r.row) == k])
        for k in sources(cal)
    }
    kinds = {r.row.id: kind_of_run(r.row, cal) for r in loso}

    def by(dimension: str, results: list[Result]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for value in sorted({kinds[r.row.id][dimension] for r in results}):
            chosen = [r for r in results if kinds[r.row.id][dimension] == value]
            found = uncertainty.band(r.error for r in chosen)
            out[value] = {**group(chosen), "low": found.low, "high": found.high} if found else group(chosen)
        return out

    fitted: dict[str, Any] = {k: _round(getattr(params, k)) for k in FITTED}
    fitted["fp8_recipe_efficiency"] = {k: _round(v) for k, v in params.fp8_recipe_efficiency.items()}
    return {
        "sources": by_source,
        "published sources": group([r for r in loso if r.row.published]),
        "all sources": group(loso),
        # by GPU generation and by kind of run: published rows, and every row (this container's included)
        "by kind of run, published": {d: by(d, [r for r in loso if r.row.published]) for d in uncertainty.DIMENSIONS},
        "by kind of run, all": {d: by(d, loso) for d in uncertainty.DIMENSIONS},
        "rows": {r.row.id: round(r.error, 4) for r in loso},
        "fitted": fitted,
    }


def table(results: list[Result], loso: list[Result] | None = None) -> str:
    """Every row: published against predicted by the fit on every source and, where given,
    by the fit without the row's source."""
    held = {r.row.id: r for r in loso or []}
    head = (
        f"{'row':<60} {'published':>9} {'predicted':>9} {'error':>7} {'LOSO':>7}   "
        f"{'GiB pub':>7} {'GiB plan':>8} {'error':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        mem = r.row.peak_memory_gib_reserved
        mem_text = (
            f"{mem:>7.1f} {r.memory_gib:>8.1f} {r.memory_error:>+7.1%}"
            if r.memory_error is not None
            else f"{'-':>7} {'-':>8} {'':>7}"
        )
        out = held.get(r.row.id)
        loso_text = f"{out.error:>+7.1%}" if out else f"{'':>7}"
        lines.append(
            f"{r.row.id:<60} {r.row.tokens_per_second_per_gpu:>9,.0f} {r.predicted:>9,.0f} {r.error:>+7.1%} "
            f"{loso_text}   {mem_text}"
        )
    return "\n".join(lines)


def write_parameters(
    params: Parameters, factors: dict[str, float], stats: dict[str, Any], path: Path | None = None
) -> None:
    """Store the fitted values and the held-out errors in ``performance.yaml``, keeping its comments."""
    path = path or catalogs.CATALOG_DIR / "performance.yaml"
    text = path.read_text()
    head = text.split("\nfitted:", 1)[0]
    fixed_block = "fixed:" + text.split("\nfixed:", 1)[1].split("\n# Written by", 1)[0]
    tail_comment = "# Written by" + text.split("\n# Written by", 1)[1].split("\nsummary:", 1)[0]
    fitted: dict[str, float | dict[str, float]] = {k: _round(getattr(params, k)) for k in FITTED}
    fitted["fp8_recipe_efficiency"] = {k: _round(v) for k, v in params.fp8_recipe_efficiency.items()}
    body = yaml.safe_dump(
        {"fitted": fitted, "calibration_only": {k: _round(v) for k, v in factors.items()}}, sort_keys=False
    )
    out = (
        head
        + "\n"
        + body
        + fixed_block.rstrip("\n")
        + "\n"
        + tail_comment
        + "\n"
        + yaml.safe_dump({"summary": stats}, sort_keys=False, default_flow_style=None, width=160)
    )
    path.write_text(out)


def _round(value: float) -> float:
    return float(f"{value:.4g}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tiered_training.planning.calibration", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--write", action="store_true", help="store the fitted parameters in catalog/performance.yaml")
    parser.add_argument("--gpu-dir", type=Path, default=GPU_DIR, help="GPU-check results (*.json) to add as rows")
    parser.add_argument("--no-fit", action="store_true", help="evaluate the stored parameters without fitting")
    parser.add_argument("--no-loso", action="store_true", help="skip the leave-one-source-out refits")
    parser.add_argument("--json", type=Path, help="also save the leave-one-source-out table as JSON here")
    args = parser.parse_args(argv)
    if (args.write or args.json) and args.no_loso:
        parser.error("--write and --json store the leave-one-source-out errors: drop --no-loso")

    try:
        cal = load(args.gpu_dir)
    except CalibrationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model = catalogs.performance_model()
    if args.no_fit:
        params, factors = perf.parameters_of(model), dict(model.calibration_only)
    else:
        print(f"fitting on {len(cal.rows)} rows ...", file=sys.stderr)
        params, factors = fit(cal, model)
    loso = None
    if not args.no_loso:
        print(f"refitting without each of {len(sources(cal))} sources ...", file=sys.stderr)
        loso = leave_one_source_out(cal, model)
    results = evaluate(cal, params, factors)
    print(table(results, loso))
    print()
    print(f"{'single Linear, FP8 over BF16':<60} {'published':>9} {'predicted':>9} {'error':>7}")
    for row in cal.linear_rows:
        predicted = predict_speedup(row, cal, params, factors)
        print(f"{row.id:<60} {row.speedup:>9.2f} {predicted:>9.2f} {predicted / row.speedup - 1:>+7.1%}")
    print()
    print(
        "fitted: "
        + ", ".join(f"{k}={_round(getattr(params, k))}" for k in FITTED)
        + ", fp8 recipes "
        + ", ".join(f"{k}={_round(v)}" for k, v in params.fp8_recipe_efficiency.items())
    )
    print("calibration only: " + ", ".join(f"{k}={_round(v)}" for k, v in factors.items()))
    published = sum(r.published for r in cal.rows)
    own = len(cal.rows) - published
    print(
        f"rows: {published} published runs from {len(sources(cal)) - (own > 0)} sources, plus {own} "
        f"run{'s' * (own != 1)} of this container "
        f"(its GPU checks); all in the fit"
    )
    if loso is not None:
        print()
        print("Leave one source out: each source's rows predicted by the model refitted without them")
        print(loso_table(cal, loso))
    if args.write and loso is not None:  # --write without the held-out errors stopped above
        write_parameters(params, factors, summary(cal, loso))
        print(f"wrote {catalogs.CATALOG_DIR / 'performance.yaml'}")
    if args.json and loso is not None:
        args.json.write_text(json.dumps(loso_record(cal, loso, params), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
