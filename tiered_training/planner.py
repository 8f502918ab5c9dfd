"""Resolve a Recipe into a Plan: fill every ``auto`` from the tier table, prove or
refute that the run fits in GPU memory, and estimate throughput, time and cost.
"""

from __future__ import annotations

import difflib
import math
from bisect import bisect_left
from pathlib import Path

from . import catalogs, memory
from .architecture import Architecture
from .catalogs import Instance, Tier
from .plan import Decision, Estimates, Finding, Plan
from .recipe import AUTO, BatchRampSpec, Recipe
from .runconfig import ramp_accum_steps

LOSS_CHUNK_TOKENS = 4096
# When the batch ramps, keep at least this many accumulation steps at the full batch.
RAMP_MIN_ACCUM = 4
AC_ORDER = ("none", "selective", "full")
FP8_GPUS_HINT = "ml.p5.48xlarge, ml.p5e.48xlarge, ml.p5en.48xlarge, ml.p6-b200.48xlarge or ml.p6-b300.48xlarge"
# SageMaker's MaxWaitTimeInSeconds upper bound (28 days).
MAX_WAIT_LIMIT_HOURS = 28 * 24


def plan_file(path: str | Path) -> Plan:
    """Load and resolve one recipe file. Raises :class:`errors.RecipeError` for a bad file."""
    from .loader import load_recipe_with_lines

    recipe, lines = load_recipe_with_lines(path)
    return resolve(recipe, source=str(path), lines=lines)


class _Builder:
    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.decisions: list[Decision] = []
        self.findings: list[Finding] = []

    def decide(self, field: str, value, reason: str, requested) -> None:
        source = "auto" if requested == AUTO else ("derived" if requested is None else "recipe")
        self.decisions.append(Decision(field, value, reason, source))

    def error(self, code: str, message: str, fix: str, field: str = "") -> None:
        self.findings.append(Finding("error", code, message, fix, field))

    def warn(self, code: str, message: str, fix: str = "", field: str = "") -> None:
        self.findings.append(Finding("warning", code, message, fix, field))

    def info(self, code: str, message: str, field: str = "") -> None:
        self.findings.append(Finding("info", code, message, "", field))


def resolve(recipe: Recipe, source: str | None = None, lines: dict[str, int] | None = None) -> Plan:
    b = _Builder(recipe)
    tuning = recipe.tuning

    model_name, arch = _model(recipe, b)
    instance = _instance(recipe, b)
    if arch is None or instance is None:
        return _unresolved(recipe, source, lines, b, model_name, arch, instance)

    nodes = recipe.compute.instance_count
    gpus = nodes * instance.gpus
    params = arch.parameters
    tier, inside = catalogs.tier_for(params)
    b.decide("tier", tier.name, _tier_reason(params, tier), None)
    if not inside:
        lo, hi = catalogs.tiers()[0].min_parameters, catalogs.tiers()[-1].max_parameters
        text = f"{params / 1e9:.2f}B parameters lies outside the {lo / 1e9:g}B-{hi / 1e9:g}B the tiers cover; planned as '{tier.name}'"
        if recipe.model.allow_outside_tiers:
            b.info("outside-tiers", text + " (acknowledged by model.allow_outside_tiers)", "model")
        else:
            b.warn("outside-tiers", text, "set model.allow_outside_tiers: true to acknowledge", "model")

    if recipe.sequence_length > arch.max_sequence_length:
        b.error(
            "sequence-too-long",
            f"sequence_length {recipe.sequence_length} exceeds {model_name}'s maximum of {arch.max_sequence_length}",
            f"set sequence_length to at most {arch.max_sequence_length}, or use a model with longer context",
            "sequence_length",
        )
    _spot(recipe, b)
    if nodes < tier.min_nodes:
        b.error(
            "needs-multiple-nodes",
            f"the {tier.name} tier ({params / 1e9:.1f}B parameters) needs at least {tier.min_nodes} nodes; the recipe has {nodes}",
            f"set compute.instance_count to {tier.min_nodes} or more",
            "compute.instance_count",
        )

    precision, fp8_recipe = _precision(recipe, arch, instance, tier, b)

    per_gpu_sequences = _sequences_per_gpu(recipe, gpus, b)
    fit = _fit(recipe, arch, instance, tier, nodes, precision, per_gpu_sequences, b)
    if fit is None:
        return _unresolved(recipe, source, lines, b, model_name, arch, instance, tier=tier, nodes=nodes, precision=precision, fp8_recipe=fp8_recipe)
    checkpointing, sharding, group, micro_batch, breakdown = fit

    accum = per_gpu_sequences // micro_batch
    b.decide(
        "grad_accum_steps",
        accum,
        f"{recipe.budget.global_batch_tokens:,} tokens per step / ({micro_batch} x {recipe.sequence_length:,} tokens x {gpus} GPUs)",
        None,
    )
    ramp_start, ramp_steps, total_steps = _ramp_and_steps(recipe, tier, accum, micro_batch, gpus, b)
    warmup_tokens = recipe.optimizer.warmup_tokens
    if warmup_tokens is None:
        warmup_tokens = recipe.budget.total_tokens // 100
    warmup_steps = max(1, min(total_steps, math.ceil(warmup_tokens / recipe.budget.global_batch_tokens)))
    b.decide("optimizer.warmup_steps", warmup_steps, f"{warmup_tokens:,} warmup tokens / global batch", AUTO if recipe.optimizer.warmup_tokens is None else "set")

    estimates = _estimates(recipe, arch, instance, nodes, precision, fp8_recipe, checkpointing, sharding, total_steps, b)
    if estimates.wall_time_hours > recipe.compute.max_runtime_hours:
        b.warn(
            "runtime-too-short",
            f"the run needs about {estimates.wall_time_hours:,.1f} h but compute.max_runtime_hours is {recipe.compute.max_runtime_hours:g}; "
            "the job stops there and resumes only when restarted",
            f"raise compute.max_runtime_hours to {math.ceil(estimates.wall_time_hours * 1.1)}"
            if estimates.wall_time_hours * 1.1 <= MAX_WAIT_LIMIT_HOURS
            else f"SageMaker caps a job at {MAX_WAIT_LIMIT_HOURS} h: add nodes, lower budget.total_tokens, or plan several executions that resume from the checkpoint",
            "compute.max_runtime_hours",
        )

    return Plan(
        recipe=recipe,
        source=source,
        model_name=model_name,
        architecture=arch,
        tier=tier,
        instance=instance,
        nodes=nodes,
        precision=precision,
        fp8_recipe=fp8_recipe,
        activation_checkpointing=checkpointing,
        sharding=sharding,
        shard_group_size=group,
        micro_batch_size=micro_batch,
        grad_accum_steps=accum,
        ramp_start_accum_steps=ramp_start,
        ramp_steps=ramp_steps,
        warmup_steps=warmup_steps,
        loss_chunk_tokens=LOSS_CHUNK_TOKENS,
        compile=recipe.compute.compile,
        memory=breakdown,
        estimates=estimates,
        decisions=tuple(b.decisions),
        findings=tuple(b.findings),
        locations=dict(lines or {}),
    )


def _unresolved(recipe, source, lines, b, model_name, arch, instance, tier=None, nodes=None, precision="bf16", fp8_recipe=None) -> Plan:
    """A Plan that stops at its errors: enough to report them, never to build from."""
    arch = arch or Architecture(layers=1, hidden_size=64, attention_heads=1, kv_heads=1, ffn_size=64, vocab_size=256)
    instance = instance or Instance(
        name=recipe.compute.instance_type, gpu="unknown", gpus=1, usable_hbm_gib=0.0, peak_bf16_tflops=0.0,
        peak_fp8_tflops=None, mxfp8=False, efa_gbps=0, rdma=False, family="unknown", price_per_hour=0.0, price_source="unknown",
    )
    tier = tier or catalogs.tier_for(arch.parameters)[0]
    return Plan(
        recipe=recipe, source=source, model_name=model_name, architecture=arch, tier=tier, instance=instance,
        nodes=nodes or recipe.compute.instance_count, precision=precision, fp8_recipe=fp8_recipe,
        activation_checkpointing="full", sharding="full", shard_group_size=1, micro_batch_size=0, grad_accum_steps=0,
        ramp_start_accum_steps=None, ramp_steps=0, warmup_steps=0, loss_chunk_tokens=LOSS_CHUNK_TOKENS,
        compile=recipe.compute.compile, memory=None, estimates=None, decisions=tuple(b.decisions),
        findings=tuple(b.findings), locations=dict(lines or {}),
    )


def _tier_reason(params: int, tier: Tier) -> str:
    return f"{params / 1e9:.2f}B parameters; the '{tier.name}' tier reaches {tier.max_parameters / 1e9:g}B"


def _model(recipe: Recipe, b: _Builder) -> tuple[str, Architecture | None]:
    section = recipe.model
    if section.dimensions is not None:
        name = section.name or "custom"
        b.decide("model", name, f"explicit dimensions: {section.dimensions.parameters / 1e9:.2f}B parameters", "set")
        return name, section.dimensions
    catalog = catalogs.models()
    entry = catalog.get(section.catalog)
    if entry is None:
        close = difflib.get_close_matches(section.catalog, list(catalog), n=3)
        b.error(
            "unknown-model",
            f"model.catalog {section.catalog!r} is not in the model catalogue",
            f"use one of: {', '.join(close or catalog)}; or give model.dimensions",
            "model.catalog",
        )
        return section.catalog, None
    b.decide("model", entry.id, f"{entry.display_name}, {entry.architecture.parameters / 1e9:.2f}B parameters ({entry.source})", "set")
    return entry.display_name, entry.architecture


def _instance(recipe: Recipe, b: _Builder) -> Instance | None:
    catalog = catalogs.instances()
    instance = catalog.get(recipe.compute.instance_type)
    if instance is None:
        close = difflib.get_close_matches(recipe.compute.instance_type, list(catalog), n=3)
        b.error(
            "unknown-instance",
            f"compute.instance_type {recipe.compute.instance_type!r} is not a GPU training instance in the catalogue",
            f"use one of: {', '.join(close or catalog)}",
            "compute.instance_type",
        )
    return instance


def _spot(recipe: Recipe, b: _Builder) -> None:
    compute = recipe.compute
    if not compute.spot:
        if compute.max_wait_hours is not None:
            b.warn("max-wait-without-spot", "compute.max_wait_hours applies only to spot training", "remove it, or set compute.spot: true", "compute.max_wait_hours")
        return
    if compute.max_wait_hours is None:
        wait = min(MAX_WAIT_LIMIT_HOURS, compute.max_runtime_hours * 2)
        b.decide("compute.max_wait_hours", wait, "spot: twice the maximum runtime, to allow for waiting and interruptions", AUTO)
        if wait < compute.max_runtime_hours:
            b.error("spot-max-wait", "spot needs MaxWait at least the runtime, and SageMaker caps MaxWait at 672 h", f"lower compute.max_runtime_hours to at most {MAX_WAIT_LIMIT_HOURS}", "compute.max_runtime_hours")
    elif compute.max_wait_hours < compute.max_runtime_hours:
        b.error(
            "spot-max-wait",
            f"compute.max_wait_hours {compute.max_wait_hours:g} is shorter than compute.max_runtime_hours {compute.max_runtime_hours:g}; "
            "SageMaker rejects a spot job whose MaxWait is below its MaxRuntime",
            f"set compute.max_wait_hours to at least {compute.max_runtime_hours:g}",
            "compute.max_wait_hours",
        )
    elif compute.max_wait_hours > MAX_WAIT_LIMIT_HOURS:
        b.error("spot-max-wait", f"compute.max_wait_hours {compute.max_wait_hours:g} exceeds SageMaker's limit of {MAX_WAIT_LIMIT_HOURS} h", f"set it to at most {MAX_WAIT_LIMIT_HOURS}", "compute.max_wait_hours")


def fp8_gain(hidden_size: int) -> float:
    """Expected FP8 speed-up over BF16 at this hidden size (throughput.yaml)."""
    table = sorted(catalogs.throughput_priors().fp8_gain_by_hidden.items())
    xs = [math.log2(h) for h, _ in table]
    x = math.log2(hidden_size)
    if x <= xs[0]:
        return table[0][1]
    if x >= xs[-1]:
        return table[-1][1]
    i = bisect_left(xs, x)
    t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return table[i - 1][1] + t * (table[i][1] - table[i - 1][1])


def _precision(recipe: Recipe, arch: Architecture, instance: Instance, tier: Tier, b: _Builder) -> tuple[str, str | None]:
    tuning = recipe.tuning
    if tuning.precision == AUTO:
        precision = tier.precision
        reason = f"{tier.name} tier: {tier.precision_why}"
        if precision == "fp8" and not instance.fp8:
            precision = "bf16"
            reason = f"the {tier.name} tier prefers FP8, but the {instance.gpu} has no FP8 tensor cores; BF16 instead"
        b.decide("tuning.precision", precision, reason, AUTO)
    else:
        precision = tuning.precision
        b.decide("tuning.precision", precision, "set in the recipe", tuning.precision)
        if precision == "fp8" and not instance.fp8:
            b.error(
                "fp8-unsupported",
                f"FP8 needs Hopper or Blackwell GPUs; {instance.name} has the {instance.gpu}",
                f"set tuning.precision to bf16, or use {FP8_GPUS_HINT}",
                "tuning.precision",
            )
        elif precision != tier.precision and not (tier.precision == "fp8" and not instance.fp8):
            b.warn(
                "against-tier",
                f"tuning.precision {precision} goes against the {tier.name} tier's {tier.precision} ({tier.precision_why})",
                "set tuning.precision: auto unless this is deliberate",
                "tuning.precision",
            )

    fp8_recipe = None
    if precision == "fp8":
        if tuning.fp8_recipe == AUTO:
            fp8_recipe = "tensorwise"
            b.decide("tuning.fp8_recipe", fp8_recipe, "tensorwise scaling is the fastest torchao recipe with FSDP float8 all-gather (10,417 vs MXFP8 9,969 tokens/s per B200 on Llama 3 8B)", AUTO)
        else:
            fp8_recipe = tuning.fp8_recipe
            b.decide("tuning.fp8_recipe", fp8_recipe, "set in the recipe", fp8_recipe)
            if fp8_recipe == "mxfp8" and not instance.mxfp8:
                b.error(
                    "mxfp8-unsupported",
                    f"MXFP8 needs Blackwell GPUs; {instance.name} has the {instance.gpu}",
                    "set tuning.fp8_recipe to tensorwise or rowwise, or use ml.p6-b200.48xlarge or ml.p6-b300.48xlarge",
                    "tuning.fp8_recipe",
                )
        gain = fp8_gain(arch.hidden_size)
        if gain < 1.1:
            b.warn(
                "fp8-small-gain",
                f"FP8 is unlikely to speed up a model of hidden size {arch.hidden_size} (expected x{gain:.2f}); its GEMMs are too small",
                "set tuning.precision: bf16",
                "tuning.precision",
            )
    elif tuning.fp8_recipe != AUTO:
        b.warn("fp8-recipe-ignored", f"tuning.fp8_recipe {tuning.fp8_recipe} has no effect at precision {precision}", "remove it or set tuning.precision: fp8", "tuning.fp8_recipe")
    return precision, fp8_recipe


def _sequences_per_gpu(recipe: Recipe, gpus: int, b: _Builder) -> int:
    sequences = recipe.budget.global_batch_tokens // recipe.sequence_length
    if sequences % gpus:
        step = recipe.sequence_length * gpus
        lower = max(step, recipe.budget.global_batch_tokens // step * step)
        b.error(
            "batch-not-divisible",
            f"budget.global_batch_tokens {recipe.budget.global_batch_tokens:,} is {sequences} sequences, which do not split evenly over {gpus} GPUs",
            f"use a multiple of {step:,} (sequence_length x GPUs), for example {lower:,} or {lower + step:,}",
            "budget.global_batch_tokens",
        )
        return 0
    return sequences // gpus


def _estimate(recipe, arch, instance, precision, checkpointing, group, micro_batch):
    return memory.estimate(
        arch,
        precision=precision,
        checkpointing=checkpointing,
        sequence_length=recipe.sequence_length,
        micro_batch=micro_batch,
        shard_group=group,
        hbm_bytes=instance.hbm_bytes,
        loss_chunk_tokens=LOSS_CHUNK_TOKENS,
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _fit(recipe, arch, instance, tier, nodes, precision, per_gpu_sequences, b):
    """Choose checkpointing, sharding and micro-batch: the first that fits under the headroom."""
    tuning = recipe.tuning
    gpus = nodes * instance.gpus
    limit = tier.memory_headroom * instance.hbm_bytes
    if per_gpu_sequences == 0:
        return None

    # Checkpointing: the tier's choice first, then more recomputation if needed.
    if tuning.activation_checkpointing == AUTO:
        start = AC_ORDER.index(tier.activation_checkpointing)
        ac_options = list(AC_ORDER[start:])
    else:
        ac_options = [tuning.activation_checkpointing]
        if tuning.activation_checkpointing != tier.activation_checkpointing:
            b.warn(
                "against-tier",
                f"tuning.activation_checkpointing {tuning.activation_checkpointing} goes against the {tier.name} tier's {tier.activation_checkpointing}",
                "set it to auto unless this is deliberate",
                "tuning.activation_checkpointing",
            )

    # Sharding: the smallest shard group that fits; a node first, then 2 nodes, and so on.
    if tuning.sharding == "none":
        groups = [("none", 1)]
    elif tuning.shard_group_size != AUTO:
        size = tuning.shard_group_size
        if gpus % size:
            b.error("shard-group", f"tuning.shard_group_size {size} does not divide the {gpus} GPUs", f"use one of {', '.join(map(str, _divisors(gpus)))}", "tuning.shard_group_size")
            return None
        kind = "full" if size == gpus else "hybrid"
        if tuning.sharding not in (AUTO, kind):
            b.error("shard-group", f"tuning.sharding {tuning.sharding} with shard_group_size {size} of {gpus} GPUs is {kind} sharding", f"set tuning.sharding to {kind} or auto", "tuning.sharding")
            return None
        groups = [(kind, size)]
    elif tuning.sharding == "full" or nodes == 1:
        groups = [("full", gpus)]
    else:  # hybrid or auto across nodes
        groups = [("hybrid" if k < nodes else "full", k * instance.gpus) for k in _divisors(nodes)]

    if tuning.micro_batch_size == AUTO:
        batch_options = sorted(_divisors(per_gpu_sequences), reverse=True)
        if _wants_ramp(recipe, tier) and per_gpu_sequences >= RAMP_MIN_ACCUM:
            # A ramp needs accumulation steps to ramp through.
            batch_options = [m for m in batch_options if per_gpu_sequences // m >= RAMP_MIN_ACCUM]
    else:
        batch_options = [tuning.micro_batch_size]
        if per_gpu_sequences % tuning.micro_batch_size:
            b.error(
                "micro-batch",
                f"tuning.micro_batch_size {tuning.micro_batch_size} does not divide the {per_gpu_sequences} sequences each GPU takes per step",
                f"use one of {', '.join(map(str, _divisors(per_gpu_sequences)))}",
                "tuning.micro_batch_size",
            )
            return None

    best = None  # the smallest-memory setting tried, for the error message
    for checkpointing in ac_options:
        for kind, group in groups:
            for micro_batch in batch_options:
                estimate = _estimate(recipe, arch, instance, precision, checkpointing, group, micro_batch)
                if best is None or estimate.total < best[4].total:
                    best = (checkpointing, kind, group, micro_batch, estimate)
                if estimate.total <= limit:
                    _record_fit(recipe, tier, instance, nodes, checkpointing, kind, group, micro_batch, estimate, groups, b)
                    return checkpointing, kind, group, micro_batch, estimate

    checkpointing, kind, group, micro_batch, estimate = best
    b.error(
        "does-not-fit",
        f"needs {estimate.total / memory.GIB:,.1f} GiB per GPU at best ({checkpointing} checkpointing, {kind} sharding over {group} GPUs, "
        f"micro-batch {micro_batch}); the {instance.gpu}'s limit is {limit / memory.GIB:,.1f} GiB ({tier.memory_headroom:.0%} of {instance.usable_hbm_gib:g} GiB)",
        _fit_fix(recipe, arch, instance, tier, precision, limit),
        "compute.instance_count",
    )
    return None


def _fit_fix(recipe, arch, instance, tier, precision, limit) -> str:
    for nodes in (2, 4, 8, 16, 32, 64):
        if nodes <= recipe.compute.instance_count:
            continue
        gpus = nodes * instance.gpus
        if _estimate(recipe, arch, instance, precision, "full", gpus, 1).total <= limit:
            return f"use compute.instance_count: {nodes} or more, a shorter sequence_length, or an instance with more memory per GPU"
    return "use a shorter sequence_length, a smaller model, or an instance with more memory per GPU"


def _record_fit(recipe, tier, instance, nodes, checkpointing, kind, group, micro_batch, estimate, groups, b):
    tuning = recipe.tuning
    ac_reason = f"{tier.name} tier: {tier.checkpointing_why}"
    if tuning.activation_checkpointing == AUTO and checkpointing != tier.activation_checkpointing:
        ac_reason = f"the {tier.name} tier's {tier.activation_checkpointing} checkpointing does not fit even at micro-batch 1; {checkpointing} does"
    elif tuning.activation_checkpointing != AUTO:
        ac_reason = "set in the recipe"
    b.decide("tuning.activation_checkpointing", checkpointing, ac_reason, tuning.activation_checkpointing)

    if tuning.sharding == "none":
        shard_reason = "set in the recipe: every GPU keeps a full replica"
    elif tuning.shard_group_size != AUTO:
        shard_reason = "shard group set in the recipe"
    elif nodes == 1:
        shard_reason = f"one node: FSDP shards over its {instance.gpus} GPUs on NVLink"
    elif kind == "hybrid":
        shard_reason = (
            f"the smallest shard group that fits is {group // instance.gpus} node(s) ({group} GPUs): all-gathers stay inside the group, "
            f"and {nodes * instance.gpus // group} replicas all-reduce gradients over EFA"
        )
    else:
        tried = ", ".join(f"{g // instance.gpus} node(s)" for _, g in groups[:-1])
        shard_reason = f"no smaller shard group fits ({tried} tried); FSDP shards over all {group} GPUs" if tried else f"FSDP shards over all {group} GPUs"
    b.decide("tuning.sharding", kind, shard_reason, tuning.sharding)
    b.decide("tuning.shard_group_size", group, f"{group} GPUs share one sharded copy of the parameters and optimiser state", tuning.shard_group_size)

    fraction = estimate.total / estimate.hbm
    if tuning.micro_batch_size == AUTO:
        reason = f"{tier.batch_why}: {fraction:.0%} of HBM, under the {tier.memory_headroom:.0%} headroom"
    else:
        reason = f"set in the recipe; {fraction:.0%} of HBM, under the {tier.memory_headroom:.0%} headroom"
    b.decide("tuning.micro_batch_size", micro_batch, reason, tuning.micro_batch_size)


def _wants_ramp(recipe: Recipe, tier: Tier) -> bool:
    ramp = recipe.tuning.batch_ramp
    return tier.batch_ramp if ramp == AUTO else bool(ramp)


def _ramp_and_steps(recipe, tier, accum, micro_batch, gpus, b) -> tuple[int | None, int, int]:
    """Batch ramp (linear in gradient-accumulation steps) and the step count that meets the token budget."""
    tuning = recipe.tuning
    want = _wants_ramp(recipe, tier)
    spec = tuning.batch_ramp if isinstance(tuning.batch_ramp, BatchRampSpec) else BatchRampSpec()
    global_tokens = recipe.budget.global_batch_tokens
    tokens_per_accum = micro_batch * recipe.sequence_length * gpus
    start = ramp_steps = None
    if want and accum < 2:
        b.decide("tuning.batch_ramp", False, "the global batch is one micro-batch per GPU; there is nothing to ramp", tuning.batch_ramp)
    elif want:
        start = max(1, round(accum * spec.start_fraction))
        ramp_steps = max(1, math.ceil(spec.ramp_fraction * recipe.budget.total_tokens / global_tokens))
        why = tier.batch_why if tuning.batch_ramp == AUTO else "set in the recipe"
        b.decide(
            "tuning.batch_ramp",
            {"start_accum_steps": start, "ramp_steps": ramp_steps},
            f"{why}: from {start * tokens_per_accum:,} to {global_tokens:,} tokens per step over {ramp_steps} steps",
            tuning.batch_ramp,
        )
    else:
        reason = f"{tier.name} tier: {tier.batch_why}" if tuning.batch_ramp == AUTO else "set in the recipe"
        b.decide("tuning.batch_ramp", False, reason, tuning.batch_ramp)

    if start is None:
        steps = math.ceil(recipe.budget.total_tokens / global_tokens)
        return None, 0, steps
    ramp_tokens = sum(ramp_accum_steps(i, start, accum, ramp_steps) for i in range(ramp_steps)) * tokens_per_accum
    remaining = max(0, recipe.budget.total_tokens - ramp_tokens)
    return start, ramp_steps, ramp_steps + math.ceil(remaining / global_tokens)


def _estimates(recipe, arch, instance, nodes, precision, fp8_recipe, checkpointing, sharding, total_steps, b) -> Estimates:
    priors = catalogs.throughput_priors()
    anchors = priors.anchors.get(instance.gpu, {})
    if precision == "fp8":
        key = "mxfp8" if fp8_recipe == "mxfp8" and "mxfp8" in anchors else "fp8"
        anchor = anchors.get(key) or anchors["bf16"]  # a GPU without FP8 is already an error
        mfu = anchor.mfu * fp8_gain(arch.hidden_size) / fp8_gain(4096)
        source = f"{anchor.source}; scaled for hidden size {arch.hidden_size}"
    else:
        anchor = anchors["bf16"]
        mfu = anchor.mfu
        source = anchor.source
        if precision == "fp32":
            mfu *= 0.5
            source += "; halved for TF32, whose peak is half of BF16"
    mfu *= priors.recompute_cost["selective"] / priors.recompute_cost[checkpointing]
    if nodes > 1:
        mfu *= priors.multi_node_efficiency["full" if sharding == "full" else "hybrid"]
        source += f"; x{priors.multi_node_efficiency['full' if sharding == 'full' else 'hybrid']} for {sharding} sharding across nodes"

    flops = arch.flops_per_token(recipe.sequence_length)
    per_gpu = mfu * instance.peak_bf16_flops / flops
    gpus = nodes * instance.gpus
    total = per_gpu * gpus
    wall_hours = recipe.budget.total_tokens / total / 3600
    price, price_source = instance.price(recipe.compute.price_per_hour)
    return Estimates(
        flops_per_token=flops,
        tokens_per_second_per_gpu=per_gpu,
        tokens_per_second=total,
        mfu=mfu,
        mfu_source=source,
        step_time_seconds=recipe.budget.global_batch_tokens / total,
        total_steps=total_steps,
        wall_time_hours=wall_hours,
        price_per_hour=price,
        price_source=price_source,
        cost_usd=wall_hours * nodes * price,
    )
