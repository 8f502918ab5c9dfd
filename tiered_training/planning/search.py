"""The planner's search: the run being planned, the configurations a recipe leaves open, and each one's
memory and predicted step time."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tiered_training.catalog import Instance, Tier
from tiered_training.contract.architecture import Architecture, Lora
from tiered_training.planning import memory, perf, preference
from tiered_training.planning.overlay import Overlay
from tiered_training.planning.plan import Alternative, Decision, DecisionSource, Departure, FailedPlan, Finding
from tiered_training.recipe import AUTO, LoraSection, Recipe

LOSS_CHUNK_TOKENS = 4096
# When the batch ramps, keep at least this many accumulation steps at the full batch.
RAMP_MIN_ACCUM = 4
AC_ORDER = ("none", "selective", "full")
CP_DEGREES = (1, 2, 4, 8)
# The search splits sequences no finer than this: below it, ring attention's blocks are
# too small to hide their communication, and plain data parallelism serves better.
MIN_CP_CHUNK_TOKENS = 4096
GIB = memory.GIB


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
        """Predicted tokens/s per GPU, to a tenth: the one rounding of this figure (every text and field that shows
        it, and every figure derived from it, starts from this value)."""
        return round(self.step_time.tokens_per_second_per_gpu, 1)

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
    if run.recipe.task == "dpo":  # the reference's forward (planning/preference.py)
        time = preference.with_reference(run.recipe, "lora" if run.lora else "none", time)
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
    return recipe.compute.compile and not (recipe.fine_tuning and recipe.tuning.adapter == "qlora")


def _setting(run: _Run, micro_batch: int, **kwargs: Any) -> perf.Setting:
    """A configuration of the search space with the run's fixed choices (compile, LoRA, document mask)."""
    return perf.Setting(
        micro_batch=micro_batch,
        compile=_compiles(run.recipe),
        lora=run.lora,
        document_mask=run.recipe.fine_tuning,
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
    if run.recipe.fine_tuning:
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


def _pins_one(space: Space) -> bool:
    """True when the recipe leaves the search one configuration (micro-batch included)."""
    return space.micro_batch is not None and all(
        len(choices) == 1 for choices in (space.precisions, space.checkpointing, space.groups, space.context_parallel)
    )


def _wants_ramp(recipe: Recipe, tier: Tier) -> bool:
    ramp = recipe.tuning.batch_ramp
    return tier.batch_ramp if ramp == AUTO else bool(ramp)
