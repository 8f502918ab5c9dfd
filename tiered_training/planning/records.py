"""The planner's decision records: why the plan departs from the tier, what each choice beats, and
what to change where nothing fits."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tiered_training.planning import perf
from tiered_training.planning.plan import Departure
from tiered_training.planning.search import GIB, Option, _Run, _space, search
from tiered_training.recipe import AUTO

FP8_GPUS_HINT = "ml.p5.48xlarge, ml.p5e.48xlarge, ml.p5en.48xlarge, ml.p6-b200.48xlarge or ml.p6-b300.48xlarge"


def _record(run: _Run, chosen: Option, by_tier: Option | None, fitting: list[Option]) -> None:
    """Decisions for every tuning field, and the departures from the tier with their gain."""
    tuning, tier, s = run.recipe.tuning, run.tier, chosen.setting
    margin = (run.headroom - chosen.memory.total) / GIB
    gain = chosen.speed / by_tier.speed - 1 if by_tier else 0.0
    tier_setting = by_tier.setting if by_tier else None
    speeds = f"{chosen.speed:,.0f} vs {by_tier.speed:,.0f} tokens/s per GPU" if by_tier else ""
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
        versus = f"{chosen.speed:,.0f} vs {same[0].speed:,.0f} tokens/s per GPU with {tier_value}" if same else speeds
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
        if run.recipe.fine_tuning:
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
            f"({by_tier.alternative().describe()}: {by_tier.speed:,.0f} tokens/s per GPU), keeping {margin:,.1f} GiB "
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
