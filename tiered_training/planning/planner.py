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
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from tiered_training import catalog as catalogs
from tiered_training.catalog import Instance, Tier
from tiered_training.contract.architecture import Architecture
from tiered_training.planning import corpus, memory
from tiered_training.planning.adapters import _adapter, _full_parameter
from tiered_training.planning.choice import _candidates, _choose, _ramp_and_steps, _rounded, _warmup, prediction_range
from tiered_training.planning.overlay import Overlay
from tiered_training.planning.plan import Estimates, Plan, PlanResult
from tiered_training.planning.quotas import findings as quota_findings
from tiered_training.planning.records import _check_precision
from tiered_training.planning.runtime import (
    _bound_probe,
    _instance_counts,
    _keep_last,
    _probe_hours,
    _runtime,
    _segments,
)
from tiered_training.planning.search import LOSS_CHUNK_TOKENS, Option, _compiles, _Log, _Run
from tiered_training.planning.segments import spot_wait_seconds
from tiered_training.planning.spot import _spot, _spot_range
from tiered_training.recipe import AUTO, Recipe


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
            if recipe.fine_tuning and tier.min_nodes_for(True) <= run.nodes
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


def _check_environment_price(instance: Instance, source: str | None) -> None:
    """A ``TIERED_TRAINING_PRICE_<INSTANCE>`` that is not a price is an error of the input, not a missing price."""
    from tiered_training.recipe.errors import Problem, RecipeError

    variable = catalogs.price_variable(instance.name)
    try:
        if variable in os.environ:
            catalogs.environment_price(variable)
    except catalogs.PriceError as error:
        raise RecipeError([Problem(source or "recipe", None, "", str(error))]) from None


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
    # One rounding per figure: to a tenth, as each probe candidate and alternative stores its own; every figure
    # derived from it (time, cost, range) starts from that value, so one speed never prints two ways.
    per_gpu = round(per_gpu, 1)
    total = per_gpu * run.gpus
    wall_hours = recipe.budget.total_tokens / total / 3600 + probe_hours
    price, price_source = instance.price(
        recipe.compute.price_per_hour, spot=recipe.compute.spot, region=recipe.compute.region
    )
    spot_range, spot_note = _spot_range(run, wall_hours)
    found = prediction_range(run, chosen.setting)
    speed_range = wall_range = cost_range = None
    if found is not None:
        slow, fast = found.measured(per_gpu)
        speed_range = _rounded((slow, fast))
        training_hours = wall_hours - probe_hours
        wall_range = (
            min(wall_hours, training_hours * per_gpu / fast + probe_hours),
            max(wall_hours, training_hours * per_gpu / slow + probe_hours),
        )
        if price is not None:
            cost_range = (wall_range[0] * run.nodes * price, wall_range[1] * run.nodes * price)
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
        tokens_per_second_per_gpu_range=speed_range,
        wall_time_hours_range=wall_range,
        cost_usd_range=cost_range,
        range_basis="" if found is None else found.basis,
    )
