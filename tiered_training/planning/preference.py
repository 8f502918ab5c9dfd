"""Task dpo in the plan: the RunConfig's preference section, and the reference model's time and memory.

The trainer (``training/dpo_train.py``) trains on packed pairs, chosen then rejected in the rows of one
step, so a step's memory and speed are those of fine-tuning on the same tokens, plus the reference:

- ``precomputed``: before the first step of each job, a first pass of the starting weights over the training
  rows (a forward without gradient), then 8 bytes a pair (two fp32 log-probabilities) on every rank. The plan
  counts one forward per trained token, an upper bound: the pass reads the data once, the budget may repeat it.
- ``adapter_disabled`` (LoRA): each micro-batch's forward again, without gradient, with the adapters off.

Either way the reference keeps no weights of its own; its forward holds one layer's activations at a time,
before the training forward of the same micro-batch, so it adds nothing to the step's peak (the backward of
the loss). A separate copy of the reference, as trl keeps by default, would hold the weights a second time:
``explain`` states that size beside the share this design takes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tiered_training.contract.runconfig import DpoConfig
from tiered_training.recipe import AUTO, PreferenceSection, Recipe

if TYPE_CHECKING:
    from tiered_training.planning.perf import StepTime
    from tiered_training.planning.plan import Plan

PAIR_BYTES = 8  # two fp32 reference log-probabilities per pair
GIB = 1024**3
# The forward's share of each term of a training step (backward ~ 2 x forward for GEMMs with weight
# gradients, 1 x without (a frozen base); flash attention's backward ~ 2.5 x its forward).
FORWARD_SHARE = {"gemm": 1 / 3, "gemm_frozen": 1 / 2, "attention": 1 / 3.5, "memory_bound": 1 / 3}


def reference_mode(recipe: Recipe, adapter: str | None) -> str:
    """precomputed or adapter_disabled: the recipe's, else adapter_disabled under LoRA, else precomputed."""
    section = recipe.preference or PreferenceSection()
    if section.reference != AUTO:
        return section.reference
    return "adapter_disabled" if adapter in ("lora", "qlora") else "precomputed"


def dpo_config(recipe: Recipe, adapter: str | None) -> DpoConfig | None:
    if recipe.task != "dpo":
        return None
    section = recipe.preference or PreferenceSection()
    return DpoConfig(
        loss=section.loss,
        beta=section.beta,
        label_smoothing=section.label_smoothing,
        reference=reference_mode(recipe, adapter),
    )


def task_reason(recipe: Recipe, checked: str) -> str:
    """The plan's reason for task dpo."""
    section = recipe.preference or PreferenceSection()
    smoothing = f", label smoothing {section.label_smoothing:g}" if section.loss == "robust" else ""
    return (
        f"preference tuning (DPO, {section.loss} loss, beta {section.beta:g}{smoothing}) of "
        f"{recipe.model.init_checkpoint} on packed pairs, chosen then rejected (python -m training.dpo_data){checked}"
    )


def forward_seconds(time: StepTime) -> float:
    """A forward without gradient of the step's micro-batches: the forward share of its compute terms."""
    gemm = FORWARD_SHARE["gemm_frozen" if time.frozen else "gemm"]
    return (
        time.gemm * gemm
        + time.attention * FORWARD_SHARE["attention"]
        + time.memory_bound * FORWARD_SHARE["memory_bound"]
        + time.dequantization / 2
    )


def with_reference(recipe: Recipe, adapter: str, time: StepTime) -> StepTime:
    """The step time with the reference's forward, per :data:`reference_mode`."""
    mode = reference_mode(recipe, adapter)
    what = (
        "the base again with the adapters off, without gradient (LoRA's reference)"
        if mode == "adapter_disabled"
        else "the first pass of the starting weights over the data, at most one forward per trained token"
    )
    return dataclasses.replace(time, reference=forward_seconds(time), reference_what=what)


def explain_lines(plan: Plan) -> list[str]:
    """``explain``'s section for task dpo: the reference model's share of memory and time."""
    if plan.recipe.task != "dpo" or plan.memory is None or plan.estimates is None:
        return []
    mode = reference_mode(plan.recipe, plan.adapter)
    e = plan.estimates
    step = e.step_time_seconds
    reference = next((t.seconds for t in e.step_terms if t.name == "DPO: reference forward"), 0.0)
    copy = 2 * plan.parameters / max(plan.shard_group_size, 1)
    peak = plan.memory.total
    if mode == "precomputed":
        pairs = plan.recipe.budget.total_tokens // 32  # a pair of at least 32 tokens: an upper bound
        table = pairs * PAIR_BYTES
        held = (
            f"  log-probabilities      {table / GIB:9,.3f} GiB  8 bytes a pair on every rank, for at most "
            f"{pairs:,} pairs (the budget in pairs of 32 tokens or more)"
        )
        share = table / peak
    else:
        held = (
            "  activations            transient  one layer at a time in its forward without gradient, before the "
            "training forward: not at the step's peak"
        )
        share = 0.0
    how = (
        "the starting weights, a first pass over the data before training"
        if mode == "precomputed"
        else "the base with the LoRA adapters off (as trl with peft)"
    )
    return [
        "",
        f"Reference model (task dpo, preference.reference {mode}: {how})",
        f"  weights                {0:9,.2f} GiB  none of its own; a separate bf16 copy would take "
        f"{copy / GIB:,.2f} GiB per GPU ({copy / plan.instance.usable_hbm_gib / GIB:.1%} of HBM)",
        held,
        f"  share of the peak      {share:9.2%}  of {peak / GIB:,.2f} GiB per GPU",
        f"  time                   {reference:9,.2f} s  a step ({reference / step:.0%} of {step:,.2f} s), in the "
        "wall time and cost above",
    ]
