"""The planner's adapters: LoRA and QLoRA settings, and the full-parameter alternative."""

from __future__ import annotations

from tiered_training.contract.architecture import Lora
from tiered_training.planning import preference
from tiered_training.planning import probe as probes
from tiered_training.planning.choice import _candidates
from tiered_training.planning.plan import Estimates, FullParameter
from tiered_training.planning.records import _relaxed
from tiered_training.planning.runtime import _launches
from tiered_training.planning.search import _Run
from tiered_training.recipe import AUTO, LoraSection, Recipe

LORA_DEFAULTS_WHY = (
    "defaults: rank 16 and alpha 32 with dropout 0.05 (torchtune's and QLoRA's Llama recipes), on all seven "
    "projections "
    "(QLoRA, https://arxiv.org/abs/2305.14314: adapters on every linear layer match full fine-tuning)"
)


def _adapter(recipe: Recipe, run: _Run) -> None:
    """Task sft: full-parameter or LoRA, from the recipe, the export format or the tier."""
    if not recipe.fine_tuning:
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
        recipe.task,
        preference.task_reason(recipe, checked)
        if recipe.task == "dpo"
        else f"supervised fine-tuning of {recipe.model.init_checkpoint} on packed example shards "
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
            f"{found.memory.fraction:.0%} of HBM): {found.speed:,.0f} tokens/s per GPU, {hours:,.1f} h, "
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
