"""Task dpo in the plan: the RunConfig's preference section, the reference model's memory and time.

The trainer (``training/dpo_loss.py``) trains on packed pairs, chosen then rejected in one sequence, so a
step's memory and speed are those of fine-tuning on the same tokens; the reference adds:

- ``precomputed``: a first pass of the starting weights over the training pairs before the first step of
  each job (forward only: 2 FLOPs per parameter and token against training's 6, or 4 under LoRA), then
  8 bytes per pair (two fp32 log-probabilities) held on every rank; no second model in memory.
- ``adapter_disabled`` (LoRA): one more forward of each micro-batch with the adapters off, without
  gradient: no weights of its own (the base is shared), the transient activations of one layer at a time.

A separate copy of the reference model, as trl keeps by default, would hold the base's weights a second
time; the plan states that size beside the share this design takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiered_training.contract.runconfig import DpoConfig
from tiered_training.recipe import AUTO, PreferenceSection, Recipe

PAIR_BYTES = 8  # two fp32 reference log-probabilities per pair
FORWARD_FLOPS = 2  # per parameter and token
FULL_TRAINING_FLOPS = 6  # forward, input and weight gradients
LORA_TRAINING_FLOPS = 4  # the frozen base computes no weight gradients


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
        reference=reference_mode(recipe, adapter),  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class Reference:
    """The reference model's cost in a plan."""

    mode: str
    resident_bytes: int  # per GPU, through training
    transient_bytes: int  # per GPU, at the reference forward's peak (adapter_disabled)
    copy_bytes: int  # per GPU, what a separate reference copy of the weights would hold
    step_factor: float  # training step time x this (adapter_disabled's extra forward)
    first_pass_seconds: float  # per job start (precomputed)

    def describe(self, total_bytes: int) -> str:
        gib = 1024**3
        share = (self.resident_bytes + self.transient_bytes) / max(total_bytes, 1)
        if self.mode == "precomputed":
            what = (
                f"precomputed log-probabilities: {self.resident_bytes / gib:.3f} GiB per GPU ({share:.1%} of the "
                f"peak), a first pass of {self.first_pass_seconds / 60:.1f} min per job start"
            )
        else:
            what = (
                f"the base with the adapters off: no weights of its own, {self.transient_bytes / gib:.2f} GiB of "
                f"transient activations ({share:.1%} of the peak), steps x{self.step_factor:.2f} for its forward"
            )
        return f"{what}; a separate reference copy would hold {self.copy_bytes / gib:.1f} GiB per GPU"


def reference(
    mode: str,
    *,
    parameters: int,
    shard_group: int,
    pairs: int,
    layer_activation_bytes: int,
    lora: bool,
    step_seconds: float,
    step_tokens: int,
    data_tokens: int,
) -> Reference:
    """The reference's memory and time for a plan: ``pairs`` in the training data (about), the
    ``layer_activation_bytes`` one layer of a micro-batch keeps in the forward, the training step's seconds
    over ``step_tokens`` tokens (all ranks), and the tokens of one pass over the data."""
    copy = 2 * parameters // max(shard_group, 1)  # bf16 weights, sharded as the policy's
    training = LORA_TRAINING_FLOPS if lora else FULL_TRAINING_FLOPS
    if mode == "precomputed":
        first_pass = step_seconds * (data_tokens / max(step_tokens, 1)) * FORWARD_FLOPS / training
        return Reference(mode, pairs * PAIR_BYTES, 0, copy, 1.0, first_pass)
    return Reference(mode, 0, layer_activation_bytes, copy, 1 + FORWARD_FLOPS / training, 0.0)
