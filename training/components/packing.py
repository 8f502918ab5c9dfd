"""Packed SFT sequences in the trainer: labels from loss masks, and attention per example.

A packed sequence (``training/sft_data.py`` writes them) holds several examples one after the
other, ``N + 1`` tokens with a loss mask and each token's position within its example
(restarting at 0 where an example starts). ``training.components.data`` reads them (``build_sft_dataloader``
for training, ``sft_validation_batches`` for validation) as dicts ``{"input_ids", "labels",
"position_ids"}`` (``data.sft_sample``): a label is valid (not -100) where the target token's
mask is 1 and it does not start an example.

Document masking: the trainer passes ``position_ids`` to the decoder, which finds the packed
examples from them (``training.models.attention.document_ids``: a new example wherever the position
does not go up by one, as transformers' ``find_packed_sequence_indices`` does) and masks attention
causally within each example; RoPE takes the same positions, so each example sees positions
``0 .. len - 1`` as if it ran alone. The mask is a FlexAttention ``BlockMask`` built per block of
128 tokens from the examples' spans, with no ``N x N`` tensor, and attention runs compiled
FlexAttention, which skips the blocks that cross examples: on GPUs always, on the CPU without
gradients (validation). Where FlexAttention cannot run (CPU training: PyTorch 2.13 has no CPU
backward for it; float64) the mask is a boolean ``[batch, 1, N, N]`` tensor given to
``torch.nn.functional.scaled_dot_product_attention`` (the CPU flash kernel with a mask).
A sequence without packing (positions 0 .. N - 1) gets no mask and SDPA's ``is_causal``, as in
pretraining.

Ring attention (context parallelism) has no document mask: ``RunConfig`` refuses
``context_parallel > 1`` with ``sft``, and :func:`check_attention` refuses it here too.
"""

from __future__ import annotations

from typing import Any

import torch

# Attention implementations of the decoder that mask packed examples from each other
DOCUMENT_MASKED = ("sdpa",)


def split_sft_batch(batch: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, ...]:
    """``(inputs, labels, positions)`` of a batch dict on ``device``, as the trainer's micro-batches are."""
    return tuple(batch[key].to(device, non_blocking=True) for key in ("input_ids", "labels", "position_ids"))


def check_attention(lm: torch.nn.Module, context_parallel: int) -> None:
    """Packed examples must not attend to each other: refuse attention without a document mask."""
    if context_parallel > 1:
        raise ValueError(
            f"context_parallel {context_parallel}: ring attention has no document mask for packed "
            "SFT sequences; run fine-tuning with context_parallel 1"
        )
    config: Any = lm.config  # a CausalLM's LMConfig (training.models sits above the components)
    implementation = config.attn_implementation
    if implementation not in DOCUMENT_MASKED:
        raise ValueError(
            f"attention {implementation!r} does not mask packed examples from each other "
            f"(one of {', '.join(DOCUMENT_MASKED)} does)"
        )
