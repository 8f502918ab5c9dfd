"""Resolve a Recipe into a Plan: search the configurations every ``auto`` leaves open,
prove or refute that the run fits in GPU memory, and estimate throughput, time and cost.

The tier table is the starting point and the reason. For every ``auto`` field the search
tries precision, activation checkpointing, micro-batch, shard group and context-parallel
degree; the performance model (``perf.py``) predicts each configuration's speed and the
memory model (``memory.py``) its footprint. The plan takes the fastest configuration that
fits under the tier's headroom, and says where and why it leaves the tier's advice.
``tuning.follow_tiers: strict`` keeps the tier's choices.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tiered_training import catalog as catalogs
from tiered_training.catalog import Instance, Tier
from tiered_training.contract.architecture import Architecture, Lora
from tiered_training.contract.runconfig import steps_for_tokens
from tiered_training.planning import corpus, memory, perf
from tiered_training.planning import probe as probes
from tiered_training.planning.overlay import Overlay
from tiered_training.planning.plan import (
    Alternative,
    Candidate,
    Decision,
    DecisionSource,
    Departure,
    Estimates,
    FailedPlan,
    Finding,
    FullParameter,
    Plan,
    PlanResult,
)
from tiered_training.planning.quotas import findings as quota_findings
from tiered_training.planning.segments import (
    JOB_RETRY_ATTEMPTS,
    LAST_WARM_POOL_SECONDS,
    MAX_SEGMENTS,
    PROBE_SPOT_WAIT_SECONDS,
    RUNTIME_QUOTA,
    SPOT_WAIT_SECONDS,
    WARM_POOL_SECONDS,
    Segments,
    job_runtime_seconds,
    plan_segments,
    probe_runtime_seconds,
    quota_seconds,
    spot_wait_seconds,
)
from tiered_training.recipe import AUTO, BatchRampSpec, LoraSection, Recipe

LOSS_CHUNK_TOKENS = 4096
# When the batch ramps, keep at least this many accumulation steps at the full batch.
RAMP_MIN_ACCUM = 4
AC_ORDER = ("none", "selective", "full")
CP_DEGREES = (1, 2, 4, 8)
# The search splits sequences no finer than this: below it, ring attention's blocks are
# too small to hide their communication, and plain data parallelism serves better.
MIN_CP_CHUNK_TOKENS = 4096
# The plan leaves the tier's advice only for a predicted gain above this; to FP8 against
# a tier that advises BF16 (for its numerical ease), only above the FP8 threshold.
MIN_DEPARTURE_GAIN = 0.02
MIN_FP8_GAIN = 0.10
# Configurations within this of the fastest count as equally fast: the plan takes the one
# closest to the tier's choice.
NEAR_FASTEST = 0.02
# Configurations the probe measures when tuning.probe_candidates is auto and the search has a choice.
DEFAULT_PROBE_CANDIDATES = 3
FP8_GPUS_HINT = "ml.p5.48xlarge, ml.p5e.48xlarge, ml.p5en.48xlarge, ml.p6-b200.48xlarge or ml.p6-b300.48xlarge"
GIB = memory.GIB


def plan_file(
    path: str | Path,
    overrides: Sequence[str] = (),
    overlay: Overlay | Callable[[str], Overlay | None] | None = None,
) -> PlanResult:
    """Load and resolve one recipe file (``-``: standard input), with ``--set`` overrides and the account's
    calibration ``overlay`` (planning/overlay.py) if given: an overlay, or a function of the recipe's name that
    returns the recipe's own (``overlay.cached``).

    Raises :class:`RecipeError` for a bad file or override."""
    from tiered_training.recipe.loader import load_recipe_with_lines, source_name
    from tiered_training.recipe.overrides import parse_overrides
    from tiered_training.text import clip

    recipe, lines = load_recipe_with_lines(path, overrides)
    if callable(overlay):
        overlay = overlay(recipe.name)
    plan = resolve(recipe, source=source_name(path), lines=lines, overlay=overlay)
    plan.overrides.update({o.dotted: clip(o.text, 100) for o in parse_overrides(overrides)})
    return plan


# -- working state ---------------------------------------------------------------------


@dataclass
class _Log:
    """The planner's working state for one recipe before its model and instance are known: what it decided
    and found so far."""

    recipe: Recipe
    decisions: list[Decision] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    model_name: str = ""
    source: str | None = None

    def decide(self, field_path: str, value: object, reason: str, requested: object) -> None:
        source: DecisionSource = "auto" if requested == AUTO else ("derived" if requested is None else "recipe")
        self.decisions.append(Decision(field_path, value, reason, source))

    def error(self, code: str, message: str, fix: str, field_path: str = "") -> None:
        self.findings.append(Finding("error", code, message, fix, field_path))

    def warn(self, code: str, message: str, fix: str = "", field_path: str = "") -> None:
        self.findings.append(Finding("warning", code, message, fix, field_path))

    def info(self, code: str, message: str, field_path: str = "") -> None:
        self.findings.append(Finding("info", code, message, "", field_path))

    @property
    def failed(self) -> bool:
        return any(f.severity == "error" for f in self.findings)

    @property
    def nodes(self) -> int:
        return self.recipe.compute.instance_count

    def failure(
        self,
        source: str | None,
        lines: dict[str, int] | None,
        arch: Architecture | None = None,
        tier: Tier | None = None,
    ) -> FailedPlan:
        return FailedPlan(
            recipe=self.recipe,
            source=source,
            model_name=self.model_name,
            tier=tier,
            parameters=arch.parameters if arch else None,
            decisions=tuple(self.decisions),
            findings=tuple(self.findings),
            locations=dict(lines or {}),
        )


@dataclass(kw_only=True)
class _Run(_Log):
    """The planner's working state once the model, the instance and the tier are known."""

    arch: Architecture
    instance: Instance
    tier: Tier
    departures: list[Departure] = field(default_factory=list)
    alternatives: list[Alternative] = field(default_factory=list)
    probe_options: list[Option] = field(default_factory=list)  # what the probe measures, the chosen one first
    probe_why: list[str] = field(default_factory=list)  # why each of probe_options is measured
    lora: Lora | None = None  # task sft with LoRA adapters
    lora_section: LoraSection | None = None
    pinned: bool = False  # the recipe pins one configuration: it must fit the physical HBM, not the headroom
    overlay: Overlay | None = None  # the account's own calibration

    # Derived facts.
    @property
    def gpus(self) -> int:
        return self.nodes * self.instance.gpus

    @property
    def hardware(self) -> perf.Hardware:
        return _hardware(self.instance)

    @property
    def headroom(self) -> float:
        return self.tier.memory_headroom * self.instance.hbm_bytes

    @property
    def limit(self) -> float:
        """Bytes a configuration may take: the headroom for a search, the physical HBM for one the recipe pins."""
        return float(self.instance.hbm_bytes) if self.pinned else self.headroom

    @property
    def sequences(self) -> int:
        """Sequences per optimiser step, over all ranks."""
        return self.recipe.budget.global_batch_tokens // self.recipe.sequence_length

    @property
    def strict(self) -> bool:
        return self.recipe.tuning.follow_tiers == "strict"

    @property
    def min_nodes(self) -> int:
        return self.tier.min_nodes_for(self.lora is not None)


# -- the search space and its evaluation --------------------------------------------------


@lru_cache(maxsize=32)
def _hardware(instance: Instance) -> perf.Hardware:
    return perf.Hardware.of(instance)


@dataclass(frozen=True)
class Option:
    """One configuration, evaluated: its memory and its predicted step time."""

    setting: perf.Setting
    accum: int
    memory: memory.MemoryBreakdown
    time: perf.StepTime | None  # None when it does not fit
    fits: bool

    @property
    def step_time(self) -> perf.StepTime:
        """The predicted step time; the search predicts none for a configuration that does not fit."""
        if self.time is None:
            raise ValueError(f"no step time predicted for {self.setting}: it does not fit")
        return self.time

    @property
    def speed(self) -> float:
        return self.step_time.tokens_per_second_per_gpu

    def alternative(self) -> Alternative:
        s = self.setting
        return Alternative(
            precision=s.precision,
            fp8_recipe=s.fp8_recipe,
            activation_checkpointing=s.checkpointing,
            micro_batch_size=s.micro_batch,
            shard_group_size=s.shard_group,
            context_parallel=s.context_parallel,
            tokens_per_second_per_gpu=round(self.speed, 1),
            memory_gib=round(self.memory.total / GIB, 2),
            memory_fraction=round(self.memory.fraction, 4),
        )


@dataclass(frozen=True)
class Space:
    """The values each tuning field may take: one when the recipe pins it (or the tier, when strict)."""

    precisions: tuple[tuple[str, str | None], ...]  # (precision, fp8 recipe)
    checkpointing: tuple[str, ...]
    groups: tuple[tuple[str, int], ...]  # (sharding, shard group size)
    context_parallel: tuple[int, ...]
    micro_batch: int | None  # None: search
    nodes: int


def _memory(run: _Run, setting: perf.Setting) -> memory.MemoryBreakdown:
    return memory.estimate(
        run.arch,
        precision=setting.precision,
        checkpointing=setting.checkpointing,
        lora=setting.lora,
        document_mask=setting.document_mask,
        # Context parallelism splits each sequence: a rank holds seq/cp tokens' activations.
        sequence_length=run.recipe.sequence_length // setting.context_parallel,
        micro_batch=setting.micro_batch,
        shard_group=setting.shard_group if setting.sharding != "none" else 1,
        hbm_bytes=run.instance.hbm_bytes,
        loss_chunk_tokens=LOSS_CHUNK_TOKENS,
        compiled=setting.compile,
    )


def evaluate(
    run: _Run, setting: perf.Setting, nodes: int | None = None, estimate: memory.MemoryBreakdown | None = None
) -> Option:
    """Memory and step time of ``setting`` for this recipe on ``nodes`` (default: the recipe's)."""
    nodes = nodes or run.nodes
    gpus = nodes * run.instance.gpus
    per_rank = run.sequences // (gpus // setting.context_parallel)
    accum = max(1, per_rank // setting.micro_batch)
    estimate = estimate or _memory(run, setting)
    time = perf.step_time(
        run.arch,
        run.hardware,
        setting,
        sequence_length=run.recipe.sequence_length,
        gpus=gpus,
        accum=accum,
        params=perf.stored_parameters(),
    )
    return Option(setting, accum, estimate, time, estimate.total <= run.limit)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _micro_batches(run: _Run, per_rank: int) -> list[int]:
    """Micro-batch sizes to try, largest first: divisors of the sequences a rank takes per step."""
    options = sorted(_divisors(per_rank), reverse=True)
    if _wants_ramp(run.recipe, run.tier) and per_rank >= RAMP_MIN_ACCUM:
        options = [m for m in options if per_rank // m >= RAMP_MIN_ACCUM]  # a ramp needs steps to ramp through
    return options


def _compiles(recipe: Recipe) -> bool:
    """compute.compile, except under QLoRA, whose NF4 base runs eager."""
    return recipe.compute.compile and not (recipe.task == "sft" and recipe.tuning.adapter == "qlora")


def _setting(run: _Run, micro_batch: int, **kwargs: Any) -> perf.Setting:
    """A configuration of the search space with the run's fixed choices (compile, LoRA, document mask)."""
    return perf.Setting(
        micro_batch=micro_batch,
        compile=_compiles(run.recipe),
        lora=run.lora,
        document_mask=run.recipe.task == "sft",
        **kwargs,
    )


def search(run: _Run, space: Space) -> list[Option]:
    """For every combination of the space, the largest micro-batch that fits (or, when none
    does, the smallest), evaluated. Speed grows with the micro-batch and so does memory,
    so the largest that fits is the fastest of its combination."""
    options = []
    gpus = space.nodes * run.instance.gpus
    limit = run.limit
    for precision, recipe_name in space.precisions:
        for checkpointing in space.checkpointing:
            for sharding, group in space.groups:
                for cp in space.context_parallel:
                    if group % cp and sharding != "none":
                        continue
                    per_rank = run.sequences // (gpus // cp)
                    sizes = [space.micro_batch] if space.micro_batch else _micro_batches(run, per_rank)
                    sizes = [m for m in sizes if per_rank % m == 0]
                    if not sizes:
                        continue

                    setting = functools.partial(
                        _setting,
                        run,
                        precision=precision,
                        checkpointing=checkpointing,
                        shard_group=group,
                        sharding=sharding,
                        fp8_recipe=recipe_name,
                        context_parallel=cp,
                    )

                    # Memory grows with the micro-batch: bisect for the largest that fits, then
                    # predict the speed of that one only.
                    lo, hi = 0, len(sizes) - 1  # sizes[hi] is the smallest
                    best = _memory(run, setting(sizes[hi]))
                    if best.total <= limit:
                        while lo < hi:
                            mid = (lo + hi) // 2
                            estimate = _memory(run, setting(sizes[mid]))
                            if estimate.total <= limit:
                                best, hi = estimate, mid
                            else:
                                lo = mid + 1
                    if best.total <= limit:
                        options.append(evaluate(run, setting(sizes[hi]), space.nodes, best))
                    else:  # kept for the does-not-fit report, which needs its memory only
                        options.append(Option(setting(sizes[hi]), 0, best, None, False))
    return options


def _groups(run: _Run, nodes: int, cps: tuple[int, ...]) -> tuple[tuple[str, int], ...] | None:
    """Shard groups to try; None after an error."""
    tuning = run.recipe.tuning
    gpus = nodes * run.instance.gpus
    if tuning.sharding == "none":
        return (("none", 1),)
    if tuning.shard_group_size != AUTO:
        size = tuning.shard_group_size
        if gpus % size:
            run.error(
                "shard-group",
                f"tuning.shard_group_size {size} does not divide the {gpus} GPUs",
                f"use one of {', '.join(map(str, _divisors(gpus)))}",
                "tuning.shard_group_size",
            )
            return None
        kind = "full" if size == gpus else "hybrid"
        if tuning.sharding not in (AUTO, kind):
            run.error(
                "shard-group",
                f"tuning.sharding {tuning.sharding} with shard_group_size {size} of {gpus} GPUs is {kind} sharding",
                f"set tuning.sharding to {kind} or auto",
                "tuning.shard_group_size",
            )
            return None
        return ((kind, size),)
    if tuning.sharding == "hybrid":
        if nodes == 1:
            run.error(
                "shard-group",
                "hybrid sharding replicates shard groups across nodes; the recipe has one node",
                "set tuning.sharding to full or auto, or compute.instance_count to 2 or more",
                "tuning.sharding",
            )
            return None
        return tuple(("hybrid", k * run.instance.gpus) for k in _divisors(nodes) if k < nodes)
    if tuning.sharding == "full" or nodes == 1:
        return (("full", gpus),)
    return tuple(("hybrid" if k < nodes else "full", k * run.instance.gpus) for k in _divisors(nodes))


def _context_parallel(run: _Run) -> tuple[int, ...] | None:
    """Context-parallel degrees to try; None after an error."""
    tuning, seq = run.recipe.tuning, run.recipe.sequence_length
    node = run.instance.gpus
    if run.recipe.task == "sft":
        if tuning.context_parallel not in (AUTO, 1):
            run.error(
                "context-parallel",
                f"tuning.context_parallel {tuning.context_parallel}: ring attention has no document "
                "mask, so packed fine-tuning examples would attend to each other",
                "set tuning.context_parallel: 1 or auto",
                "tuning.context_parallel",
            )
            return None
        return (1,)
    if tuning.context_parallel != AUTO:
        cp = tuning.context_parallel
        if node % cp or seq % (2 * cp):
            run.error(
                "context-parallel",
                f"tuning.context_parallel {cp} must divide the {node} GPUs of a node (ring attention stays on NVLink) "
                f"and split each {seq:,}-token sequence into 2 x {cp} equal chunks (for the causal load balance)",
                f"use one of {', '.join(str(d) for d in CP_DEGREES if node % d == 0 and seq % (2 * d) == 0)}",
                "tuning.context_parallel",
            )
            return None
        if cp > 1 and tuning.sharding == "none":
            run.error(
                "context-parallel",
                "context parallelism shards the state over its ranks; tuning.sharding none keeps a full replica per "
                "GPU",
                "set tuning.sharding to full, hybrid or auto, or tuning.context_parallel: 1",
                "tuning.context_parallel",
            )
            return None
        return (cp,)
    degrees = tuple(
        d
        for d in CP_DEGREES
        if node % d == 0 and seq % (2 * d) == 0 and d <= run.gpus and (d == 1 or seq // d >= MIN_CP_CHUNK_TOKENS)
    )
    return degrees if tuning.sharding != "none" else (1,)


def _precisions(run: _Run) -> tuple[tuple[str, str | None], ...]:
    tuning, instance, tier = run.recipe.tuning, run.instance, run.tier
    if tuning.precision != AUTO:
        precisions = [tuning.precision]
    elif run.lora is not None and run.lora.quantized:  # QLoRA computes in bf16 from its NF4 base
        precisions = ["bf16"]
    elif run.strict:
        precisions = [tier.precision if tier.precision != "fp8" or instance.fp8 else "bf16"]
    else:
        precisions = ["bf16", "fp8"] if instance.fp8 else ["bf16"]
        if tier.precision == "fp32":
            precisions.append("fp32")
    out: list[tuple[str, str | None]] = []
    for precision in precisions:
        if precision != "fp8":
            out.append((precision, None))
        elif tuning.fp8_recipe != AUTO:
            out.append((precision, tuning.fp8_recipe))
        else:
            out.append((precision, "tensorwise"))
            if instance.mxfp8 and not run.strict:
                out.append((precision, "mxfp8"))
    return tuple(out)


def _checkpointing(run: _Run) -> tuple[str, ...]:
    tuning = run.recipe.tuning
    if tuning.activation_checkpointing != AUTO:
        return (tuning.activation_checkpointing,)
    if run.strict:
        return AC_ORDER[AC_ORDER.index(run.tier.activation_checkpointing) :]
    return AC_ORDER


def tier_choice(run: _Run, options: list[Option]) -> Option | None:
    """What the tier alone would pick among ``options``: its precision, its checkpointing
    (or more recompute when that does not fit), then the smallest shard group, the smallest
    context-parallel degree and the largest micro-batch that fit."""
    tier, tuning = run.tier, run.recipe.tuning
    precision = (
        tuning.precision
        if tuning.precision != AUTO
        else (tier.precision if tier.precision != "fp8" or run.instance.fp8 else "bf16")
    )
    recipe_name = tuning.fp8_recipe if tuning.fp8_recipe != AUTO else "tensorwise"
    start = AC_ORDER.index(tier.activation_checkpointing) if tuning.activation_checkpointing == AUTO else 0
    fitting = [
        o
        for o in options
        if o.fits
        and o.setting.precision == precision
        and (precision != "fp8" or o.setting.fp8_recipe == recipe_name)
        and AC_ORDER.index(o.setting.checkpointing) >= start
    ]
    if not fitting:
        return None
    return min(
        fitting,
        key=lambda o: (
            AC_ORDER.index(o.setting.checkpointing),
            o.setting.shard_group,
            o.setting.context_parallel,
            -o.setting.micro_batch,
        ),
    )


# -- resolve ------------------------------------------------------------------------------


def resolve(
    recipe: Recipe, source: str | None = None, lines: dict[str, int] | None = None, overlay: Overlay | None = None
) -> PlanResult:
    """The plan of ``recipe``; ``overlay``: the account's own calibration (planning/overlay.py), if any."""
    log = _Log(recipe, source=source)
    log.model_name, arch = _model(recipe, log)
    instance = _instance(recipe, log)
    if instance is not None and recipe.compute.price_per_hour is None:
        _check_environment_price(instance, source)
    if arch is None or instance is None:
        return log.failure(source, lines, arch)
    if log.nodes < 1:  # a Recipe built without validation (model_construct, model_copy)
        log.error(
            "no-nodes",
            f"compute.instance_count {log.nodes}: a run needs at least one node",
            "set compute.instance_count to 1 or more",
            "compute.instance_count",
        )
        return log.failure(source, lines, arch)

    params = arch.parameters
    tier, inside = catalogs.tier_for(params)
    run = _Run(
        recipe,
        decisions=log.decisions,
        findings=log.findings,
        model_name=log.model_name,
        source=source,
        arch=arch,
        instance=instance,
        tier=tier,
        overlay=overlay,
    )
    run.decide("tier", tier.name, _tier_reason(params, tier), None)
    _adapter(recipe, run)
    if not inside:
        lo, hi = catalogs.tiers()[0].min_parameters, catalogs.tiers()[-1].max_parameters
        text = (
            f"{params / 1e9:.2f}B parameters lies outside the {lo / 1e9:g}B-{hi / 1e9:g}B the tiers cover; "
            f"planned as '{tier.name}'"
        )
        if recipe.model.allow_outside_tiers:
            run.info("outside-tiers", text + " (acknowledged by model.allow_outside_tiers)", "model")
        else:
            run.warn("outside-tiers", text, "set model.allow_outside_tiers: true to acknowledge", "model")

    if recipe.sequence_length > run.arch.max_sequence_length:
        run.error(
            "sequence-too-long",
            f"sequence_length {recipe.sequence_length} exceeds {run.model_name}'s maximum of "
            f"{run.arch.max_sequence_length}",
            f"set sequence_length to at most {run.arch.max_sequence_length}, or use a model with longer context",
            "sequence_length",
        )
    _runtime(recipe, run)
    _spot(recipe, run)
    _keep_last(recipe, run)
    if run.nodes < run.min_nodes:
        lora_fix = (
            ", or fine-tune with LoRA on one node (tuning.adapter: lora)"
            if recipe.task == "sft" and tier.min_nodes_for(True) <= run.nodes
            else ""
        )
        full = " for full-parameter training" if tier.min_nodes_for(True) != tier.min_nodes else ""
        run.error(
            "needs-multiple-nodes",
            f"the {tier.name} tier ({params / 1e9:.1f}B parameters) needs at least {run.min_nodes} nodes{full}; the "
            f"recipe has {run.nodes}",
            f"set compute.instance_count to {run.min_nodes} or more{lora_fix}",
            "compute.instance_count",
        )
    _check_precision(run)
    run.findings.extend(quota_findings(recipe))

    chosen = _choose(run)
    if chosen is None or run.failed:
        return run.failure(source, lines, run.arch, run.tier)

    setting = chosen.setting
    gpus, cp = run.gpus, setting.context_parallel
    unsplittable = (
        memory.nf4_unsplittable(run.arch, run.lora.targets, setting.shard_group)
        if run.lora is not None and run.lora.quantized
        else []
    )
    if unsplittable:
        unit = memory.NF4_BLOCK * memory.NF4_SCALER_BLOCK
        run.error(
            "qlora-shards",
            f"QLoRA under FSDP2 splits each NF4 weight over the shard group of {setting.shard_group}: "
            f"{', '.join(unsplittable)} do not split into whole blocks of {unit:,} elements per rank",
            "use tuning.adapter: lora, or a tuning.shard_group_size that divides them",
            "tuning.adapter",
        )
        return run.failure(source, lines, run.arch, run.tier)
    run.decide(
        "grad_accum_steps",
        chosen.accum,
        f"{recipe.budget.global_batch_tokens:,} tokens per step / ({setting.micro_batch} x "
        f"{recipe.sequence_length:,} tokens x {gpus // cp} data-parallel ranks)",
        None,
    )
    ramp_start, ramp_steps, total_steps = _ramp_and_steps(run, chosen)
    warmup_steps = _warmup(run, chosen, ramp_start, ramp_steps, total_steps)
    candidates = _bound_probe(run, _candidates(run, chosen, ramp_start), chosen)
    estimates = _estimates(run, chosen, total_steps, _probe_hours(run, candidates, chosen))
    full_parameter = _full_parameter(run, estimates) if run.lora is not None else None
    segments = _segments(run, estimates)
    instance_counts = _instance_counts(run, chosen, total_steps, ramp_start, ramp_steps, warmup_steps)
    corpus_plan = _corpus(run, estimates)
    if run.failed:
        return run.failure(source, lines, run.arch, run.tier)

    return Plan(
        recipe=recipe,
        source=source,
        model_name=run.model_name,
        architecture=run.arch,
        tier=tier,
        instance=run.instance,
        nodes=run.nodes,
        precision=setting.precision,
        fp8_recipe=setting.fp8_recipe,
        activation_checkpointing=setting.checkpointing,
        sharding=setting.sharding,
        shard_group_size=setting.shard_group,
        context_parallel=cp,
        micro_batch_size=setting.micro_batch,
        grad_accum_steps=chosen.accum,
        ramp_start_accum_steps=ramp_start,
        ramp_steps=ramp_steps,
        warmup_steps=warmup_steps,
        loss_chunk_tokens=LOSS_CHUNK_TOKENS,
        compile=_compiles(recipe),
        memory=chosen.memory,
        estimates=estimates,
        decisions=tuple(run.decisions),
        findings=tuple(run.findings),
        departures=tuple(run.departures),
        alternatives=tuple(run.alternatives),
        candidates=tuple(candidates),
        segments=segments.count,
        job_runtime_seconds=segments.job_runtime_seconds,
        segment_seconds=segments.segment_seconds(),
        spot_wait_seconds=spot_wait_seconds(recipe, segments.job_runtime_seconds) if recipe.compute.spot else None,
        instance_counts=tuple(instance_counts),
        locations=dict(lines or {}),
        lora=run.lora_section,
        full_parameter=full_parameter,
        corpus=corpus_plan,
    )


def _corpus(run: _Run, estimates: Estimates) -> corpus.CorpusPlan | None:
    """``data.sources``: each source's share and epochs, and the Prepare job's hosts, time and cost."""
    recipe = run.recipe
    if not recipe.data.sources:
        return None
    sources = corpus.source_plans(recipe)
    prepare = corpus.prepare_plan(recipe, sources, estimates.wall_time_hours - estimates.probe_hours)
    if isinstance(prepare, str):
        run.error(
            "prepare-instance",
            prepare,
            "choose one of the catalogue's Processing instances",
            "data.prepare.instance_type",
        )
        return None
    requested = recipe.data.prepare.instance_count if recipe.data.prepare else AUTO
    run.decide("data.prepare.instance_count", prepare.instance_count, prepare.count_reason, requested)
    planned = corpus.CorpusPlan(sources=tuple(sources), prepare=prepare)
    run.findings.extend(corpus.corpus_findings(recipe, planned))
    run.findings.extend(quota_findings(recipe, prepare_instances=prepare.instance_count, only_processing=True))
    return planned


def _space(run: _Run, nodes: int | None = None) -> Space | None:
    """The recipe's search space, or None after an error (already recorded)."""
    nodes = nodes or run.nodes
    cps = _context_parallel(run)
    if cps is None:
        return None
    groups = _groups(run, nodes, cps)
    if groups is None:
        return None
    tuning = run.recipe.tuning
    micro = None if tuning.micro_batch_size == AUTO else tuning.micro_batch_size
    return Space(_precisions(run), _checkpointing(run), groups, cps, micro, nodes)


def _batch_fits(run: _Run, space: Space) -> bool:
    """Check that the global batch splits over the data-parallel ranks and micro-batches."""
    recipe, gpus = run.recipe, space.nodes * run.instance.gpus
    ranks = [gpus // cp for cp in space.context_parallel]
    if not any(run.sequences % r == 0 for r in ranks):
        dp = gpus // space.context_parallel[0]
        step = recipe.sequence_length * dp
        lower = max(step, recipe.budget.global_batch_tokens // step * step)
        run.error(
            "batch-not-divisible",
            f"budget.global_batch_tokens {recipe.budget.global_batch_tokens:,} is {run.sequences} sequences, which "
            f"do not split evenly over {dp} data-parallel ranks",
            f"use a multiple of {step:,} (sequence_length x data-parallel ranks), for example {lower:,} or "
            f"{lower + step:,}",
            "budget.global_batch_tokens",
        )
        return False
    if space.micro_batch:
        per_rank = [run.sequences // r for r in ranks if run.sequences % r == 0]
        if not any(p % space.micro_batch == 0 for p in per_rank):
            run.error(
                "micro-batch",
                f"tuning.micro_batch_size {space.micro_batch} does not divide the {per_rank[0]} sequences each "
                "data-parallel rank takes per step",
                f"use one of {', '.join(map(str, _divisors(per_rank[0])))}",
                "tuning.micro_batch_size",
            )
            return False
    return True


def _choose(run: _Run) -> Option | None:
    """Search, then pick: the tier's choice unless a faster one fits (auto), or the tier's (strict)."""
    space = _space(run)
    if space is None or not _batch_fits(run, space):
        return None
    run.pinned = _pins_one(space)
    options = search(run, space)
    # Fastest first; on a tie, the simpler configuration (less recompute, no context parallelism).
    fitting = sorted(
        (o for o in options if o.fits),
        key=lambda o: (
            -round(o.speed, 6),
            o.setting.context_parallel,
            o.setting.shard_group,
            AC_ORDER.index(o.setting.checkpointing),
        ),
    )
    if not fitting:
        _does_not_fit(run, options)
        return None
    by_tier = tier_choice(run, options)
    chosen = by_tier or fitting[0]
    if not run.strict and by_tier is not None:
        candidates = fitting
        if _fp8_against_tier(run):
            # FP8 against a tier that advises BF16 must earn its numerical risk on its own.
            bf16 = [o for o in fitting if o.setting.precision != "fp8"]
            fp8 = [o for o in fitting if o.setting.precision == "fp8"]
            if bf16 and fp8 and fp8[0].speed < bf16[0].speed * (1 + MIN_FP8_GAIN):
                candidates = bf16
        worth = [o for o in candidates if o.speed > by_tier.speed * (1 + MIN_DEPARTURE_GAIN)]
        if worth:
            # Among the near-fastest, the one that departs from the tier the least.
            near = [o for o in worth if o.speed >= worth[0].speed * (1 - NEAR_FASTEST)]
            chosen = min(near, key=lambda o: (_departures_from(o, by_tier), -o.speed))
    _record(run, chosen, by_tier, fitting)
    run.probe_options = _probe_options(run, fitting, chosen)
    run.alternatives = _alternatives(fitting, chosen, also=run.probe_options)
    return chosen


def _probe_options(run: _Run, fitting: list[Option], chosen: Option) -> list[Option]:
    """The configurations the probe measures: the chosen one, then the fastest others that fit (FP8 only where the
    choice may take it: against a tier that advises BF16, only when the chosen one is FP8 or the recipe pins FP8).
    An FP8 plan measures the fastest BF16 that fits (FP8 against BF16 is where the model errs most); context
    parallelism is not measured where the sequence fits without it (the ring only adds work there).
    ``run.probe_why`` gets the reason for each."""
    asked = run.recipe.tuning.probe_candidates
    count = asked if isinstance(asked, int) else (1 if run.pinned or run.strict else DEFAULT_PROBE_CANDIDATES)
    pool = [o for o in fitting if o is not chosen]
    if _fp8_against_tier(run) and chosen.setting.precision != "fp8":
        pool = [o for o in pool if o.setting.precision != "fp8"]
    fits_without_cp = any(o.setting.context_parallel == 1 for o in fitting)
    if fits_without_cp:
        pool = [o for o in pool if o.setting.context_parallel == 1]
    picked = [chosen, *pool[: count - 1]]
    bf16 = next((o for o in pool if o.setting.precision == "bf16"), None) if chosen.setting.precision == "fp8" else None
    if count > 1 and bf16 is not None and bf16 not in picked:
        picked = [*picked[: min(len(picked), count - 1)], bf16]

    def against(o: Option) -> str:
        return (
            f"{_figure(o.speed)} tokens/s per GPU predicted, {o.speed / chosen.speed - 1:+.1%} against the plan's"
        )

    run.probe_why = ["the plan's own configuration"] + [
        f"BF16 against the plan's FP8, where the model errs most: the fastest BF16 that fits, {against(o)}"
        if o is bf16
        else f"the next fastest that fits: {against(o)}"
        for o in picked[1:]
    ]
    if count == 1:
        why = (
            "set in the recipe: the probe measures the plan's configuration only"
            if isinstance(asked, int)
            else "the recipe pins every tuning field, so there is one configuration to measure"
            if run.pinned
            else "tuning.follow_tiers is strict: the tier's configuration only"
        )
    elif len(picked) == 1:
        how = "set in the recipe" if isinstance(asked, int) else "auto"
        why = f"{how}: {count} wanted, but only the plan's configuration fits; the probe measures it"
    else:
        others = ", ".join(_figure(o.speed) for o in picked[1:])
        short = f"; only {len(picked)} fit" if len(picked) < count else ""
        how = "set in the recipe" if isinstance(asked, int) else "auto"
        fastest = "fastest " if bf16 not in picked[1:] else ""
        why = (
            f"{how}: the probe measures the {len(picked)} {fastest}that fit ({_figure(chosen.speed)} predicted for the "
            f"plan's, then {others} tokens/s per GPU){short}; "
            "the full run takes the fastest measured under the headroom"
        )
        if bf16 in picked[1:]:
            why += "; an FP8 plan measures the fastest BF16"
        if fits_without_cp and any(o.setting.context_parallel > 1 for o in fitting):
            why += "; no context-parallel candidate: the sequence fits without it"
    run.decide("tuning.probe_candidates", len(picked), why, asked)
    return picked


def _pins_one(space: Space) -> bool:
    """True when the recipe leaves the search one configuration (micro-batch included)."""
    return space.micro_batch is not None and all(
        len(choices) == 1 for choices in (space.precisions, space.checkpointing, space.groups, space.context_parallel)
    )


def _figure(speed: float) -> str:
    """A speed as printed: rounded once, from the 0.1 tokens/s that the plan stores, as every table prints it."""
    return f"{round(speed, 1):,.0f}"


def _alternatives(
    fitting: list[Option], chosen: Option, count: int = 3, also: list[Option] | None = None
) -> list[Alternative]:
    """The next fastest configurations that differ from the chosen one in precision,
    checkpointing or shard group (the fastest context-parallel degree of each); and, where
    the chosen one splits sequences, the fastest at every other context-parallel degree
    that fits, so that the degrees can be compared side by side. Each of ``also`` (the probe's
    candidates) faster than the slowest of those is listed too, so none faster is left out."""

    def key(o: Option) -> tuple[str, str | None, str, int]:
        s = o.setting
        return (s.precision, s.fp8_recipe, s.checkpointing, s.shard_group)

    seen, picked = {key(chosen)}, []
    for option in fitting:
        if key(option) not in seen:
            seen.add(key(option))
            picked.append(option)
    picked = picked[:count]
    floor = min((o.speed for o in picked), default=float("inf"))
    for option in also or []:
        if option.setting != chosen.setting and all(option is not p for p in picked) and option.speed > floor:
            picked.append(option)
    picked.sort(key=lambda o: -o.speed)
    if chosen.setting.context_parallel > 1:
        degrees = {chosen.setting.context_parallel} | {o.setting.context_parallel for o in picked}
        for option in fitting:  # fastest first
            if option.setting.context_parallel not in degrees:
                degrees.add(option.setting.context_parallel)
                picked.append(option)
        picked.sort(key=lambda o: -o.speed)
    return [o.alternative() for o in picked]


def _departures_from(option: Option, by_tier: Option) -> int:
    a, b = option.setting, by_tier.setting
    return sum(
        getattr(a, name) != getattr(b, name)
        for name in ("precision", "fp8_recipe", "checkpointing", "context_parallel", "shard_group")
    )


def _fp8_against_tier(run: _Run) -> bool:
    return run.tier.precision != "fp8" and run.recipe.tuning.precision == AUTO


def _record(run: _Run, chosen: Option, by_tier: Option | None, fitting: list[Option]) -> None:
    """Decisions for every tuning field, and the departures from the tier with their gain."""
    tuning, tier, s = run.recipe.tuning, run.tier, chosen.setting
    margin = (run.headroom - chosen.memory.total) / GIB
    gain = chosen.speed / by_tier.speed - 1 if by_tier else 0.0
    tier_setting = by_tier.setting if by_tier else None
    speeds = f"{_figure(chosen.speed)} vs {_figure(by_tier.speed)} tokens/s per GPU" if by_tier else ""
    side = "under" if margin >= 0 else "over"
    fit_text = (
        f"{chosen.memory.fraction:.0%} of HBM, {abs(margin):,.1f} GiB {side} the {tier.memory_headroom:.0%} headroom"
    )
    if margin < 0:
        run.warn(
            "tight",
            f"tight: {chosen.memory.fraction:.0%} of HBM ({chosen.memory.total / GIB:,.1f} of "
            f"{run.instance.usable_hbm_gib:g} GiB), over the {tier.name} tier's {tier.memory_headroom:.0%} headroom; "
            "the recipe pins this configuration, so the plan keeps it and the probe will measure it",
            "set tuning.micro_batch_size (or activation_checkpointing) to auto to keep the headroom",
            "tuning.micro_batch_size",
        )

    def departure(field_path: str, attribute: str, tier_value: str, value: str, what: str) -> str:
        # The gain of this one change: against the same configuration with the tier's value.
        changed: dict[str, Any] = {attribute: tier_value} | (
            {"fp8_recipe": None if tier_value != "fp8" else "tensorwise"} if attribute == "precision" else {}
        )
        same = [o for o in fitting if o.setting == replace(s, **changed, micro_batch=o.setting.micro_batch)]
        own = chosen.speed / same[0].speed - 1 if same else gain
        versus = speeds
        if same:
            versus = f"{_figure(chosen.speed)} vs {_figure(same[0].speed)} tokens/s per GPU with {tier_value}"
        reason = (
            f"departs from the {tier.name} tier's {tier_value} ({what}): {value} is predicted {own:+.0%} faster "
            f"({versus}) and fits at {fit_text}"
        )
        run.departures.append(Departure(field_path, tier_value, value, round(own, 4), round(margin, 2), reason))
        return reason

    # Precision
    if tuning.precision != AUTO:
        reason = "set in the recipe"
    elif tier_setting and s.precision != tier_setting.precision:
        reason = departure("tuning.precision", "precision", tier_setting.precision, s.precision, tier.precision_why)
    elif tier.precision == "fp8" and not run.instance.fp8:
        reason = f"the {tier.name} tier prefers FP8, but the {run.instance.gpu} has no FP8 tensor cores; BF16 instead"
    else:
        reason = f"{tier.name} tier: {tier.precision_why}" + _versus(fitting, chosen, "precision")
    run.decide("tuning.precision", s.precision, reason, tuning.precision)
    if s.precision == "fp8":
        if tuning.fp8_recipe != AUTO:
            reason = "set in the recipe"
        else:
            reason = (
                "tensorwise scaling with float8 all-gather is torchao's fastest recipe"
                if s.fp8_recipe == "tensorwise"
                else "predicted fastest"
            )
            reason += _versus(fitting, chosen, "fp8_recipe")
        run.decide("tuning.fp8_recipe", s.fp8_recipe, reason, tuning.fp8_recipe)

    # Checkpointing
    if tuning.activation_checkpointing != AUTO:
        reason = "set in the recipe"
    elif tier_setting and s.checkpointing != tier_setting.checkpointing:
        reason = departure(
            "tuning.activation_checkpointing",
            "checkpointing",
            tier_setting.checkpointing,
            s.checkpointing,
            tier.checkpointing_why,
        )
    elif s.checkpointing != tier.activation_checkpointing:
        reason = (
            f"the {tier.name} tier's {tier.activation_checkpointing} checkpointing does not fit even at micro-batch 1; "
            f"{s.checkpointing} does"
        )
    else:
        reason = f"{tier.name} tier: {tier.checkpointing_why}" + _versus(fitting, chosen, "checkpointing")
    run.decide("tuning.activation_checkpointing", s.checkpointing, reason, tuning.activation_checkpointing)

    # Sharding and shard group
    nodes, node = run.nodes, run.instance.gpus
    if tuning.sharding == "none":
        shard_reason = "set in the recipe: every GPU keeps a full replica"
    elif tuning.shard_group_size != AUTO:
        shard_reason = "shard group set in the recipe"
    elif nodes == 1:
        shard_reason = f"one node: FSDP shards over its {node} GPUs on NVLink"
    else:
        smaller = [o for o in fitting if o.setting.shard_group < s.shard_group]
        spans = f"{s.shard_group // node} node(s) ({s.shard_group} GPUs)"
        if s.sharding == "hybrid":
            shard_reason = (
                f"a shard group of {spans}: its all-gathers stay inside the group, and {run.gpus // s.shard_group} "
                "replicas "
                f"all-reduce gradients over EFA"
                + ("; the smallest that fits" if not smaller else "; predicted fastest")
            )
        else:
            shard_reason = f"FSDP shards over all {s.shard_group} GPUs, across nodes over EFA" + (
                "; no smaller group fits" if not smaller else "; predicted faster than the smaller groups that fit"
            )
    run.decide("tuning.sharding", s.sharding, shard_reason, tuning.sharding)
    run.decide(
        "tuning.shard_group_size",
        s.shard_group,
        f"{s.shard_group} GPUs share one sharded copy of the parameters and optimiser state"
        + (" (context-parallel ranks included)" if s.context_parallel > 1 else ""),
        tuning.shard_group_size,
    )

    # Context parallelism
    cp = s.context_parallel
    if tuning.context_parallel != AUTO:
        cp_reason = "set in the recipe"
    elif cp == 1:
        if run.recipe.task == "sft":
            cp_reason = "each GPU holds whole sequences: ring attention has no document mask for packed examples"
        else:
            cp_reason = "each GPU holds whole sequences" + (
                "" if run.recipe.sequence_length < 32768 else "; splitting them is predicted no faster"
            )
    else:
        whole = [o for o in fitting if o.setting.context_parallel == 1]
        if whole:
            why = f"predicted {chosen.speed / whole[0].speed - 1:+.0%} faster than whole sequences per GPU"
        elif run.sequences % run.gpus:
            why = f"the global batch of {run.sequences} sequences does not split over {run.gpus} GPUs without it"
        else:
            why = "without it no configuration fits"
        cp_reason = (
            f"splits each {run.recipe.sequence_length:,}-token sequence over {cp} GPUs (ring attention over NVLink), "
            f"dividing activations and logits per GPU by {cp}: {why}"
        )
    run.decide("tuning.context_parallel", cp, cp_reason, tuning.context_parallel)

    # Micro-batch
    head = (
        "set in the recipe"
        if tuning.micro_batch_size != AUTO
        else "the largest that fits: bigger GEMMs, fewer collectives per token"
    )
    run.decide("tuning.micro_batch_size", s.micro_batch, f"{head}; {fit_text}", tuning.micro_batch_size)

    if run.departures and by_tier is not None:  # departures are from the tier's choice
        changes = ", ".join(f"{d.field.split('.')[-1]} {d.tier_value} -> {d.value}" for d in run.departures)
        run.info(
            "departs-from-tier",
            f"the plan leaves the {tier.name} tier's advice ({changes}) for a predicted {gain:+.0%} over the tier's "
            "own choice "
            f"({by_tier.alternative().describe()}: {_figure(by_tier.speed)} tokens/s per GPU), "
            f"keeping {margin:,.1f} GiB "
            "under the headroom; "
            "tuning.follow_tiers: strict keeps the tier's choices",
            "tuning.follow_tiers",
        )


def _versus(fitting: list[Option], chosen: Option, attribute: str) -> str:
    """'; predicted +x% over <the best fitting option that differs only in attribute>'."""
    mine = getattr(chosen.setting, attribute)
    others = [
        o
        for o in fitting
        if getattr(o.setting, attribute) != mine and (attribute != "fp8_recipe" or o.setting.precision == "fp8")
    ]
    if not others:
        return ""
    other = others[0]
    return (
        f"; predicted {chosen.speed / other.speed - 1:+.0%} over the fastest with "
        f"{attribute.replace('_', ' ')} {getattr(other.setting, attribute)}"
    )


# -- when nothing fits -----------------------------------------------------------------------

RELAXABLE = (
    ("activation_checkpointing", "tuning.activation_checkpointing"),
    ("sharding", "tuning.sharding"),
    ("micro_batch_size", "tuning.micro_batch_size"),
    ("shard_group_size", "tuning.shard_group_size"),
    ("context_parallel", "tuning.context_parallel"),
)


def _does_not_fit(run: _Run, options: list[Option]) -> None:
    smallest = min(options, key=lambda o: o.memory.total)
    s = smallest.setting
    cp = f", context parallelism {s.context_parallel}" if s.context_parallel > 1 else ""
    run.error(
        "does-not-fit",
        f"needs {smallest.memory.total / GIB:,.1f} GiB per GPU at best ({s.checkpointing} checkpointing, "
        f"{s.sharding} sharding over "
        f"{s.shard_group} GPUs, micro-batch {s.micro_batch}{cp}); the {run.instance.gpu}'s limit is "
        f"{run.limit / GIB:,.1f} GiB "
        + (
            "(all of its usable HBM: the recipe pins this configuration)"
            if run.pinned
            else f"({run.tier.memory_headroom:.0%} of {run.instance.usable_hbm_gib:g} GiB)"
        ),
        _fit_fix(run),
        "compute.instance_count",
    )


def _relaxed(run: _Run, free: tuple[str, ...], nodes: int | None = None) -> Option | None:
    """The fastest option that fits with the recipe's pins in ``free`` set to auto (and on ``nodes``)."""
    tuning = run.recipe.tuning.model_copy(
        update=dict.fromkeys(free, AUTO) | ({"sharding": AUTO} if "shard_group_size" in free else {})
    )
    probe = _Run(
        run.recipe.model_copy(update={"tuning": tuning}),
        model_name=run.model_name,
        arch=run.arch,
        instance=run.instance,
        tier=run.tier,
        lora=run.lora,
        lora_section=run.lora_section,
    )
    space = _space(probe, nodes)
    if space is None:
        return None
    gpus = space.nodes * run.instance.gpus
    if not any(probe.sequences % (gpus // cp) == 0 for cp in space.context_parallel):
        return None
    fitting = [o for o in search(probe, space) if o.fits]
    return max(fitting, key=lambda o: o.speed) if fitting else None


def _fit_fix(run: _Run) -> str:
    """The smallest change from the recipe's pinned settings that fits: one pinned field set
    to auto, then more nodes; the fix names the value the search finds."""
    tuning = run.recipe.tuning
    pinned = [(attr, path) for attr, path in RELAXABLE if getattr(tuning, attr) != AUTO]
    fixes = []
    for attr, path in pinned:
        found = _relaxed(run, (attr,))
        if found:
            value = {
                "activation_checkpointing": found.setting.checkpointing,
                "sharding": found.setting.sharding,
                "micro_batch_size": found.setting.micro_batch,
                "shard_group_size": found.setting.shard_group,
                "context_parallel": found.setting.context_parallel,
            }[attr]
            fixes.append((found.speed, f"set {path}: {value} (fits at {found.memory.fraction:.0%} of HBM)"))
    if fixes:
        return "; or ".join(text for _, text in sorted(fixes, reverse=True))
    free = tuple(attr for attr, _ in pinned)
    for factor in (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64):
        nodes = run.nodes * factor
        if nodes > 512:
            break
        found = _relaxed(run, (), nodes) or (_relaxed(run, free, nodes) if free else None)
        if found:
            extra = "" if _relaxed(run, (), nodes) else " with " + ", ".join(f"{path}: auto" for _, path in pinned)
            return (
                f"use compute.instance_count: {nodes}{extra} (fits at {found.memory.fraction:.0%} of HBM), "
                "a shorter sequence_length, or an instance with more memory per GPU"
            )
    return "use a shorter sequence_length, a smaller model, or an instance with more memory per GPU"


# -- the parts before the search ---------------------------------------------------------


LORA_DEFAULTS_WHY = (
    "defaults: rank 16 and alpha 32 with dropout 0.05 (torchtune's and QLoRA's Llama recipes), on all seven "
    "projections "
    "(QLoRA, https://arxiv.org/abs/2305.14314: adapters on every linear layer match full fine-tuning)"
)


def _adapter(recipe: Recipe, run: _Run) -> None:
    """Task sft: full-parameter or LoRA, from the recipe, the export format or the tier."""
    if recipe.task != "sft":
        return
    tier, tuning = run.tier, recipe.tuning
    data = recipe.data
    stated = [f"loss on {data.loss_on} tokens"] if data.loss_on else []
    stated += [f"overlong examples: {data.overlong}"] if data.overlong else []
    stated += [f"format {data.format}"] if data.format else []
    stated += [f"bad examples: {data.on_bad_example}"] if data.on_bad_example else []
    stated += [f"at most {data.max_bad_fraction:g} of them bad"] if data.max_bad_fraction is not None else []
    checked = f"; the shards' manifest must say {', '.join(stated)} (preflight checks it)" if stated else ""
    run.decide(
        "task",
        "sft",
        f"supervised fine-tuning of {recipe.model.init_checkpoint} on packed example shards "
        f"(python -m training.sft_data){checked}",
        "set",
    )
    requested = tuning.adapter
    if requested != AUTO:
        adapter, reason = requested, "set in the recipe"
        if requested == "none" and tier.fine_tuning == "lora":
            run.warn(
                "against-tier",
                f"tuning.adapter none goes against the {tier.name} tier's LoRA ({tier.fine_tuning_why})",
                "set tuning.adapter: auto unless this is deliberate",
                "tuning.adapter",
            )
    elif recipe.export.format == "adapter":
        adapter, reason = "lora", "export.format adapter: the run trains a LoRA adapter to export"
    else:
        adapter = "lora" if tier.fine_tuning == "lora" else "none"
        reason = f"{tier.name} tier: {tier.fine_tuning_why}"
    if adapter == "qlora":
        reason += "; the frozen base's projections in NF4 (torchao), about 0.52 byte per parameter, computing in bf16"
    run.decide("tuning.adapter", adapter, reason, requested)
    if adapter == "none":
        return
    section = tuning.lora or LoraSection()
    run.lora_section = section
    run.lora = Lora(section.rank, tuple(section.target_modules), section.dropout > 0, quantized=adapter == "qlora")
    trainable = run.lora.parameters(run.arch)
    targets = "all seven projections" if len(section.target_modules) == 7 else ", ".join(section.target_modules)
    why = "set in the recipe" if tuning.lora is not None else LORA_DEFAULTS_WHY
    run.decide(
        "tuning.lora",
        {"rank": section.rank, "alpha": section.alpha, "dropout": section.dropout, "target_modules": targets},
        f"{trainable / 1e6:,.1f}M trainable parameters, {trainable / run.arch.parameters:.2%} of the model; {why}",
        AUTO if tuning.lora is None else "set",
    )


FULL_PARAMETER_NODES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def _dollars(cost: float | None) -> str:
    return "no price" if cost is None else f"${cost:,.0f}"


def _full_parameter(run: _Run, lora: Estimates) -> FullParameter | None:
    """The same fine-tuning with every parameter trained: the fewest nodes (of the tier's
    minimum or more) on which it fits, its speed, time and cost; for ``explain``."""
    tuning = run.recipe.tuning.model_copy(update={"adapter": "none", "lora": None})
    full = _Run(
        run.recipe.model_copy(update={"tuning": tuning}),
        model_name=run.model_name,
        arch=run.arch,
        instance=run.instance,
        tier=run.tier,
    )
    for nodes in (n for n in FULL_PARAMETER_NODES if n >= run.tier.min_nodes):
        found = _relaxed(full, (), nodes)
        if found is None:
            continue
        gpus = nodes * run.instance.gpus
        hours = run.recipe.budget.total_tokens / (found.speed * gpus) / 3600
        if lora.probe_hours:  # its probe: as many launches as LoRA's, each of this configuration
            (launch,) = _launches(full, _candidates(full, found, None)[:1], found)
            hours += probes.total_seconds([launch] * len(run.probe_options)) / 3600
        price, _ = run.instance.price(
            run.recipe.compute.price_per_hour, spot=run.recipe.compute.spot, region=run.recipe.compute.region
        )
        alternative = FullParameter(
            nodes=nodes,
            setting=found.alternative().describe(),
            tokens_per_second_per_gpu=round(found.speed, 1),
            memory_fraction=round(found.memory.fraction, 4),
            wall_time_hours=hours,
            cost_usd=None if price is None else hours * nodes * price,
        )
        run.info(
            "full-parameter-alternative",
            f"full-parameter fine-tuning instead of LoRA needs {nodes} x {run.instance.name} ({alternative.setting}, "
            f"{found.memory.fraction:.0%} of HBM): {_figure(found.speed)} tokens/s per GPU, {hours:,.1f} h, "
            f"{_dollars(alternative.cost_usd)}, against LoRA's {lora.tokens_per_second_per_gpu:,.0f} tokens/s per GPU "
            f"on {run.nodes} node(s), {lora.wall_time_hours:,.1f} h, {_dollars(lora.cost_usd)}",
            "tuning.adapter",
        )
        return alternative
    run.info(
        "full-parameter-alternative",
        f"full-parameter fine-tuning fits on none of {', '.join(map(str, FULL_PARAMETER_NODES))} x {run.instance.name}",
        "tuning.adapter",
    )
    return None


def _tier_reason(params: int, tier: Tier) -> str:
    return f"{params / 1e9:.2f}B parameters; the '{tier.name}' tier reaches {tier.max_parameters / 1e9:g}B"


def _model(recipe: Recipe, run: _Log) -> tuple[str, Architecture | None]:
    section = recipe.model
    if section.hf_config is not None:
        from tiered_training.contract import hf_config

        base = Path(run.source).parent if run.source else None
        try:
            name, arch = hf_config.read(section.hf_config, base)
        except hf_config.ConfigError as exc:
            run.error(
                "hf-config",
                str(exc),
                "give a local Llama or Qwen2 checkpoint directory or its config.json",
                "model.hf_config",
            )
            return section.hf_config, None
        run.decide(
            "model",
            name,
            f"from {hf_config.config_path(section.hf_config, base)}: {arch.parameters / 1e9:.2f}B parameters",
            "set",
        )
        return name, arch
    if section.dimensions is not None:
        name = section.name or "custom"
        run.decide("model", name, f"explicit dimensions: {section.dimensions.parameters / 1e9:.2f}B parameters", "set")
        return name, section.dimensions
    if section.catalog is None:  # a ModelSection built without validation, with no source at all
        raise TypeError("model: give one of catalog, dimensions or hf_config")
    catalog = catalogs.models()
    entry = catalog.get(section.catalog)
    if entry is None:
        close = difflib.get_close_matches(section.catalog, list(catalog), n=3)
        run.error(
            "unknown-model",
            f"model.catalog {section.catalog!r} is not in the model catalogue",
            f"use one of: {', '.join(close or catalog)}; or give model.dimensions",
            "model.catalog",
        )
        return section.catalog, None
    run.decide(
        "model",
        entry.id,
        f"{entry.display_name}, {entry.architecture.parameters / 1e9:.2f}B parameters ({entry.source})",
        "set",
    )
    return entry.display_name, entry.architecture


def _instance(recipe: Recipe, run: _Log) -> Instance | None:
    catalog = catalogs.instances()
    instance = catalog.get(recipe.compute.instance_type)
    if instance is None:
        close = difflib.get_close_matches(recipe.compute.instance_type, list(catalog), n=3)
        run.error(
            "unknown-instance",
            f"compute.instance_type {recipe.compute.instance_type!r} is not a GPU training instance in the catalogue",
            f"use one of: {', '.join(close or catalog)}",
            "compute.instance_type",
        )
    return instance


def _keep_last(recipe: Recipe, run: _Run) -> None:
    """SageMaker uploads each host's checkpoints behind the trainer and propagates local deletions,
    so right after a commit the one older checkpoint may already be gone from S3 while the new
    one is still uploading (docs/rehearse.md)."""
    if recipe.checkpointing.keep_last == 1:
        run.warn(
            "keep-last-1",
            "checkpointing.keep_last 1: right after each save S3 may hold no complete checkpoint (the older one is "
            "deleted while the new one still uploads); an instance lost then loses every step so far",
            "set checkpointing.keep_last to 2 or more",
            "checkpointing.keep_last",
        )


def _runtime(recipe: Recipe, run: _Run) -> None:
    """Each training job's MaxRuntimeInSeconds, against the account's runtime quota."""
    quota = quota_seconds(recipe)
    source = (
        "the account's value in compute.quotas" if RUNTIME_QUOTA in recipe.compute.quotas else "AWS's default quota"
    )
    hours = recipe.compute.max_runtime_hours
    if hours is None:
        run.decide(
            "compute.max_runtime_hours",
            round(quota / 3600, 2),
            f"each training job runs at most the longest training-job run time, {quota / 3600:g} h ({source}, "
            f"{RUNTIME_QUOTA}); a longer run is split into segments",
            AUTO,
        )
    elif hours * 3600 > quota:
        run.error(
            "runtime-above-quota",
            f"compute.max_runtime_hours {hours:g} is above the account's longest training-job run time of "
            f"{quota / 3600:g} h "
            f"({source}, {RUNTIME_QUOTA}); CreateTrainingJob would refuse the job",
            "remove compute.max_runtime_hours (a longer run is split into segments), or state the account's raised "
            "quota "
            f"under compute.quotas.{RUNTIME_QUOTA} (in seconds)",
            "compute.max_runtime_hours",
        )


def _spot(recipe: Recipe, run: _Run) -> None:
    compute = recipe.compute
    if not compute.spot:
        if compute.max_wait_hours is not None:
            run.warn(
                "max-wait-without-spot",
                "compute.max_wait_hours applies only to spot training",
                "remove it, or set compute.spot: true",
                "compute.max_wait_hours",
            )
        return
    runtime = job_runtime_seconds(recipe)
    wait = spot_wait_seconds(recipe, runtime)
    if compute.max_wait_hours is None:
        run.decide(
            "compute.max_wait_hours",
            round(wait / 3600, 2),
            f"spot: each job's runtime ({runtime / 3600:g} h) plus at most {SPOT_WAIT_SECONDS / 3600:g} h waiting "
            f"for capacity and sitting out interruptions; the probe waits at most {PROBE_SPOT_WAIT_SECONDS / 3600:g} h",
            AUTO,
        )
    elif wait < runtime:
        run.error(
            "spot-max-wait",
            f"compute.max_wait_hours {compute.max_wait_hours:g} is shorter than a training job's runtime of "
            f"{runtime / 3600:g} h; "
            "SageMaker rejects a spot job whose MaxWait is below its MaxRuntime",
            f"set compute.max_wait_hours to at least {runtime / 3600:g}",
            "compute.max_wait_hours",
        )


def _warm_pools(run: _Run, count: int) -> None:
    """How long a job keeps its instances for the next one (``KeepAlivePeriodInSeconds``), and the idle time
    that can be billed (docs/runs.md)."""
    compute = run.recipe.compute
    if compute.spot:
        run.decide("compute.warm_pool_minutes", 0, "none: warm pools do not work with managed spot training", None)
        return
    nodes = compute.instance_count
    probe = "the Probe" if run.recipe.probe.enabled else "the Probe (when SkipProbe is false)"
    handing = probe + (" and every segment but the last" if count > 1 else "")
    run.decide(
        "compute.warm_pool_minutes",
        WARM_POOL_SECONDS // 60,
        f"jobs that another follows ({handing}) keep their instances for it; the job that takes them asks for a "
        f"warm pool too (SageMaker matches only such a job), kept {LAST_WARM_POOL_SECONDS // 60} min after the run; "
        f"billed idle time: at "
        f"most {WARM_POOL_SECONDS // 60} min x {nodes} instance(s) when the gate or a segment fails, and "
        f"{LAST_WARM_POOL_SECONDS // 60} min x {nodes} after the run",
        None,
    )


def _segments(run: _Run, estimates: Estimates) -> Segments:
    """The number of training jobs the run needs under the runtime limit (tiered_training/planning/segments.py)."""
    recipe = run.recipe
    training_hours = estimates.wall_time_hours - estimates.probe_hours
    segments = plan_segments(recipe, training_hours)
    if segments.count < 1:
        run.error(
            "runtime-too-short",
            f"a training job of {segments.job_runtime_seconds / 3600:g} h leaves no time to train after the room "
            "kept for "
            f"{JOB_RETRY_ATTEMPTS} retries and the final save ({segments.reserve_seconds / 3600:.1f} h)",
            "raise compute.max_runtime_hours, or lower checkpointing.interval_minutes",
            "compute.max_runtime_hours",
        )
        return segments
    reason = (
        f"the run needs about {training_hours:,.1f} h; one job trains at most "
        f"{segments.training_seconds / 3600:,.1f} h: its {segments.job_runtime_seconds / 3600:g} h runtime less "
        f"{segments.reserve_seconds / 3600:.1f} h for {JOB_RETRY_ATTEMPTS} retries and the final save, at "
        f"{recipe.probe.min_throughput_fraction:g} x the planned speed (the gate's floor)"
    )
    run.decide("compute.segments", segments.count, reason, None)
    _warm_pools(run, segments.count)
    if segments.count > MAX_SEGMENTS:
        run.error(
            "too-many-segments",
            f"the run needs {segments.count} training jobs of {segments.job_runtime_seconds / 3600:g} h; the pipeline "
            f"chains at most {MAX_SEGMENTS}",
            f"state the account's raised quota under compute.quotas.{RUNTIME_QUOTA}, add nodes, or lower "
            "budget.total_tokens",
            "compute.segments",
        )
    return segments


def _instance_counts(
    run: _Run, chosen: Option, total_steps: int, ramp_start: int | None, ramp_steps: int, warmup_steps: int
) -> list[int]:
    """The InstanceCount values that keep the planned global batch and memory (tiered_training/contract/world.py)."""
    from tiered_training.contract.runconfig import BatchConfig, ParallelConfig
    from tiered_training.contract.world import supported_instance_counts

    setting = chosen.setting
    recipe = run.recipe

    # The parts of a RunConfig that supported_instance_counts reads.
    shape = SimpleNamespace(
        batch=BatchConfig(
            sequence_length=recipe.sequence_length,
            micro_batch_size=setting.micro_batch,
            grad_accum_steps=chosen.accum,
            global_batch_tokens=recipe.budget.global_batch_tokens,
            total_steps=total_steps,
            ramp_start_accum_steps=ramp_start,
            ramp_steps=ramp_steps,
        ),
        parallel=ParallelConfig(
            sharding=setting.sharding, shard_group_size=setting.shard_group, context_parallel=setting.context_parallel
        ),
        hardware=SimpleNamespace(gpus_per_node=run.instance.gpus, min_nodes=run.min_nodes),
    )
    counts = supported_instance_counts(shape)
    run.decide(
        "compute.instance_counts",
        counts,
        "InstanceCount values that keep the planned global batch (the accumulation rescaled), the sharding, and "
        "at most the planned memory per GPU; `start --instance-count` and the pipeline refuse others before compute",
        None,
    )
    return counts


def _check_precision(run: _Run) -> None:
    """Errors and warnings about pinned precision settings; the search decides the rest."""
    tuning, instance, tier = run.recipe.tuning, run.instance, run.tier
    if tuning.precision != AUTO:
        if tuning.precision == "fp8" and not instance.fp8:
            run.error(
                "fp8-unsupported",
                f"FP8 needs Hopper or Blackwell GPUs; {instance.name} has the {instance.gpu}",
                f"set tuning.precision to bf16, or use {FP8_GPUS_HINT}",
                "tuning.precision",
            )
        elif tuning.precision != tier.precision and not (tier.precision == "fp8" and not instance.fp8):
            run.warn(
                "against-tier",
                f"tuning.precision {tuning.precision} goes against the {tier.name} tier's {tier.precision} "
                f"({tier.precision_why})",
                "set tuning.precision: auto unless this is deliberate",
                "tuning.precision",
            )
        if tuning.precision == "fp8" and instance.fp8:
            gain = _fp8_gain(run)
            if gain < 1.1:
                run.warn(
                    "fp8-small-gain",
                    f"FP8 is predicted to speed up this model by only x{gain:.2f} (hidden size "
                    f"{run.arch.hidden_size}); its GEMMs are too small",
                    "set tuning.precision: bf16",
                    "tuning.precision",
                )
    if tuning.fp8_recipe == "mxfp8" and not instance.mxfp8 and tuning.precision != "bf16":
        run.error(
            "mxfp8-unsupported",
            f"MXFP8 needs Blackwell GPUs; {instance.name} has the {instance.gpu}",
            "set tuning.fp8_recipe to tensorwise or rowwise, or use ml.p6-b200.48xlarge or ml.p6-b300.48xlarge",
            "tuning.fp8_recipe",
        )
    if tuning.fp8_recipe != AUTO and tuning.precision not in ("fp8", AUTO):
        run.warn(
            "fp8-recipe-ignored",
            f"tuning.fp8_recipe {tuning.fp8_recipe} has no effect at precision {tuning.precision}",
            "remove it or set tuning.precision: fp8",
            "tuning.fp8_recipe",
        )
    if tuning.activation_checkpointing != AUTO and tuning.activation_checkpointing != tier.activation_checkpointing:
        run.warn(
            "against-tier",
            f"tuning.activation_checkpointing {tuning.activation_checkpointing} goes against the {tier.name} tier's "
            f"{tier.activation_checkpointing}",
            "set it to auto unless this is deliberate",
            "tuning.activation_checkpointing",
        )


def _fp8_gain(run: _Run) -> float:
    """Predicted FP8 (tensorwise) speed-up over BF16 at micro-batch 1, one node, no checkpointing."""
    node = run.instance.gpus
    speeds = {}
    for precision, recipe_name in (("bf16", None), ("fp8", "tensorwise")):
        setting = perf.Setting(
            precision=precision, checkpointing="none", micro_batch=1, shard_group=node, fp8_recipe=recipe_name
        )
        speeds[precision] = perf.step_time(
            run.arch,
            run.hardware,
            setting,
            sequence_length=run.recipe.sequence_length,
            gpus=node,
            accum=8,
            params=perf.stored_parameters(),
        ).tokens_per_second_per_gpu
    return speeds["fp8"] / speeds["bf16"]


# -- steps, warmup and estimates -------------------------------------------------------------


def _wants_ramp(recipe: Recipe, tier: Tier) -> bool:
    ramp = recipe.tuning.batch_ramp
    return tier.batch_ramp if ramp == AUTO else bool(ramp)


def _tokens_per_accum(run: _Run, chosen: Option) -> int:
    s = chosen.setting
    return s.micro_batch * run.recipe.sequence_length * (run.gpus // s.context_parallel)


def _ramp_spec(recipe: Recipe) -> BatchRampSpec:
    """The recipe's batch ramp, or the default one (for ``auto`` and ``true``)."""
    return recipe.tuning.batch_ramp if isinstance(recipe.tuning.batch_ramp, BatchRampSpec) else BatchRampSpec()


def _ramp_start(spec: BatchRampSpec, accum: int) -> int | None:
    """Accumulation steps at a ramp's step 0: ``spec.start_fraction`` of ``accum``; None when a step is one
    micro-batch per data-parallel rank (there is nothing to ramp)."""
    return max(1, round(accum * spec.start_fraction)) if accum >= 2 else None


def _ramp_and_steps(run: _Run, chosen: Option) -> tuple[int | None, int, int]:
    """Batch ramp (linear in gradient-accumulation steps) and the step count that meets the token budget."""
    recipe, tier, tuning = run.recipe, run.tier, run.recipe.tuning
    accum = chosen.accum
    want = _wants_ramp(recipe, tier)
    spec = _ramp_spec(recipe)
    global_tokens = recipe.budget.global_batch_tokens
    tokens_per_accum = _tokens_per_accum(run, chosen)
    start = _ramp_start(spec, accum) if want else None
    ramp_steps = None
    if want and start is None:
        run.decide(
            "tuning.batch_ramp",
            False,
            "the global batch is one micro-batch per data-parallel rank; there is nothing to ramp",
            tuning.batch_ramp,
        )
    elif start is not None:
        ramp_steps = max(1, math.ceil(spec.ramp_fraction * recipe.budget.total_tokens / global_tokens))
        why = tier.batch_why if tuning.batch_ramp == AUTO else "set in the recipe"
        run.decide(
            "tuning.batch_ramp",
            {"start_accum_steps": start, "ramp_steps": ramp_steps},
            f"{why}: from {start * tokens_per_accum:,} to {global_tokens:,} tokens per step over {ramp_steps} steps",
            tuning.batch_ramp,
        )
    else:
        reason = f"{tier.name} tier: {tier.batch_why}" if tuning.batch_ramp == AUTO else "set in the recipe"
        run.decide("tuning.batch_ramp", False, reason, tuning.batch_ramp)
    total = steps_for_tokens(recipe.budget.total_tokens, tokens_per_accum, start, accum, ramp_steps or 0)
    return start, ramp_steps or 0, total


def _candidates(run: _Run, chosen: Option, ramp_start: int | None) -> list[Candidate]:
    """The probe's candidates as the plan records them: the chosen one (with the plan's ramp), then the others,
    each ramping from the same share of its own accumulation."""
    spec = _ramp_spec(run.recipe)
    found = []
    for number, option in enumerate(run.probe_options or [chosen], start=1):
        s = option.setting
        start = ramp_start
        if number > 1 and ramp_start is not None:
            start = _ramp_start(spec, option.accum)
        found.append(
            Candidate(
                number=number,
                precision=s.precision,
                fp8_recipe=s.fp8_recipe,
                activation_checkpointing=s.checkpointing,
                sharding=s.sharding,
                shard_group_size=s.shard_group,
                context_parallel=s.context_parallel,
                micro_batch_size=s.micro_batch,
                grad_accum_steps=option.accum,
                ramp_start_accum_steps=start,
                tokens_per_second_per_gpu=round(option.speed, 1),
                memory_fraction=round(option.memory.fraction, 4),
                why=run.probe_why[number - 1] if number <= len(run.probe_why) else "the plan's own configuration",
            )
        )
    return found


def _warmup(run: _Run, chosen: Option, start: int | None, ramp_steps: int, total_steps: int) -> int:
    """Warmup steps that train on ``optimizer.warmup_tokens`` tokens, the ramp's smaller steps counted as such."""
    recipe = run.recipe
    tokens = recipe.optimizer.warmup_tokens
    if tokens is None:
        tokens = recipe.budget.total_tokens // 100
    steps = min(total_steps, steps_for_tokens(tokens, _tokens_per_accum(run, chosen), start, chosen.accum, ramp_steps))
    during = " (the batch ramp's smaller steps counted as such)" if start and steps <= ramp_steps else ""
    run.decide(
        "optimizer.warmup_steps",
        steps,
        f"the first {steps:,} steps train on {tokens:,} warmup tokens{during}",
        AUTO if recipe.optimizer.warmup_tokens is None else "set",
    )
    return steps


def _check_environment_price(instance: Instance, source: str | None) -> None:
    """A ``TIERED_TRAINING_PRICE_<INSTANCE>`` that is not a price is an error of the input, not a missing price."""
    from tiered_training.recipe.errors import Problem, RecipeError

    variable = catalogs.price_variable(instance.name)
    try:
        if variable in os.environ:
            catalogs.environment_price(variable)
    except catalogs.PriceError as error:
        raise RecipeError([Problem(source or "recipe", None, "", str(error))]) from None


def _spot_range(run: _Run, wall_hours: float) -> tuple[tuple[float, float] | None, str]:
    """Spot's cost as a range (an estimate) from the on-demand price, and what it is; none without a price
    or where the recipe gives its own price."""
    recipe = run.recipe
    if not recipe.compute.spot or recipe.compute.price_per_hour is not None:
        return None, ""
    on_demand, _ = run.instance.on_demand_price(recipe.compute.region)
    if on_demand is None:
        return None, ""
    low, high = run.instance.spot_range(on_demand)
    saving_low, saving_high = catalogs.spot_savings()
    node_hours = wall_hours * run.nodes
    return (node_hours * low, node_hours * high), "; spot range: " + catalogs.SPOT_RANGE_SOURCE.format(
        low=saving_low, high=saving_high
    )


def _launches(run: _Run, candidates: Sequence[Candidate], chosen: Option) -> list[probes.Launch]:
    return probes.launches(
        candidates,
        sequence_length=run.recipe.sequence_length,
        steps=run.recipe.probe.steps,
        compile=_compiles(run.recipe),
        optimizer_seconds=chosen.step_time.optimizer,
    )


def _bound_probe(run: _Run, candidates: list[Candidate], chosen: Option) -> list[Candidate]:
    """The candidates whose launches finish within the probe job's runtime: fewer where K would not; an error
    where not even the plan's own would (a warning when the recipe turns the probe off)."""
    recipe = run.recipe
    limit = probe_runtime_seconds(recipe)
    found = _launches(run, candidates, chosen)
    total = probes.total_seconds(found)
    if total <= limit:
        return candidates
    count = probes.fitting(found, limit)
    minutes = f"{total / 60:,.0f} min"
    kept = candidates[: max(1, count)]
    if len(kept) < len(candidates):
        for index, decision in enumerate(run.decisions):
            if decision.field == "tuning.probe_candidates":
                run.decisions[index] = replace(
                    decision,
                    value=len(kept),
                    reason=f"{decision.reason}; cut to {len(kept)}: {len(candidates)} launches would take {minutes}, "
                    f"over the probe's runtime of {limit / 3600:g} h",
                )
    if count >= 1:
        run.warn(
            "probe-candidates-cut",
            f"{len(candidates)} probe candidates of {recipe.probe.steps} steps each would take about {minutes}, "
            f"over the probe job's runtime of {limit / 3600:g} h; the probe measures the first {count}",
            f"set tuning.probe_candidates: {count}, or lower probe.steps",
            "tuning.probe_candidates",
        )
        return kept
    first = found[0]
    room = limit - probes.HEALTH_CHECK_SECONDS - first.start_up_seconds
    steps = int(room // first.step_seconds) if first.step_seconds > 0 else 0
    message = (
        f"the probe's {recipe.probe.steps} steps of the plan's configuration would take about "
        f"{first.seconds / 60:,.0f} min, over the probe job's runtime of {limit / 3600:g} h"
    )
    fix = f"set probe.steps to at most {steps}" if steps >= 3 else "raise compute.max_runtime_hours"
    if recipe.probe.enabled:
        run.error("probe-too-long", message, fix, "probe.steps")
    else:
        run.warn("probe-too-long", message + " (when SkipProbe is false)", fix, "probe.steps")
    return kept


def _probe_hours(run: _Run, candidates: list[Candidate], chosen: Option) -> float:
    """The probe's time in the run (planning/probe.py), with a decision that says what it adds; 0 when the
    recipe turns the probe off."""
    recipe = run.recipe
    found = _launches(run, candidates, chosen)
    seconds = probes.total_seconds(found)
    if not recipe.probe.enabled:
        return 0.0
    steps = ", ".join(f"{launch.step_seconds:,.2f}" for launch in found)
    price, _ = run.instance.price(recipe.compute.price_per_hour, spot=recipe.compute.spot, region=recipe.compute.region)
    cost = "" if price is None else f" and ${seconds / 3600 * run.nodes * price:,.0f}"
    run.decide(
        "probe.enabled",
        True,
        f"a health check ({probes.HEALTH_CHECK_SECONDS:g} s) and "
        f"{len(found)} launch(es) x ({found[0].start_up_seconds:g} s start-up, as measured: process start and the "
        f"{'compiled ' if _compiles(recipe) else ''}first step; then {recipe.probe.steps} steps of one micro-batch "
        f"at {steps} s) add {seconds / 60:,.0f} min{cost} to the run's wall time and cost",
        None,
    )
    return seconds / 3600


def _estimates(run: _Run, chosen: Option, total_steps: int, probe_hours: float = 0.0) -> Estimates:
    recipe, instance = run.recipe, run.instance
    summary = catalogs.performance_model().summary
    flops = run.arch.flops_per_token(recipe.sequence_length, lora=run.lora)
    per_gpu = chosen.speed
    source = f"performance model {summary.wording()} (make calibrate)"
    if run.overlay is not None:
        factor, runs = run.overlay.factor(instance.name, chosen.setting.precision)
        if runs:
            per_gpu *= factor
            cited = f"calibrated with {runs} runs of this account"
            source += f"; {cited} (x{factor:.3f} on {instance.name} in {chosen.setting.precision})"
            run.info("account-calibration", f"{cited}: their measured tokens/s are x{factor:.3f} the model's")
    total = per_gpu * run.gpus
    wall_hours = recipe.budget.total_tokens / total / 3600 + probe_hours
    price, price_source = instance.price(
        recipe.compute.price_per_hour, spot=recipe.compute.spot, region=recipe.compute.region
    )
    spot_range, spot_note = _spot_range(run, wall_hours)
    return Estimates(
        flops_per_token=flops,
        tokens_per_second_per_gpu=per_gpu,
        tokens_per_second=total,
        mfu=flops * per_gpu / instance.peak_bf16_flops,
        mfu_causal=run.arch.flops_per_token(recipe.sequence_length, causal=True, lora=run.lora)
        * per_gpu
        / instance.peak_bf16_flops,
        throughput_source=source,
        step_time_seconds=recipe.budget.global_batch_tokens / total,
        step_terms=tuple(chosen.step_time.terms()),
        total_steps=total_steps,
        wall_time_hours=wall_hours,
        price_per_hour=price,
        price_source=price_source + spot_note,
        cost_usd=None if price is None else wall_hours * run.nodes * price,
        spot_cost_usd_range=spot_range,
        probe_hours=probe_hours,
    )
