"""Activation checkpointing of the decoder layers.

- ``none``: autograd keeps everything it saves.
- ``selective``: op-level selective checkpointing (SAC). The outputs of every matmul
  (``aten.mm``/``addmm``/``bmm``) and of attention (every SDPA variant) are saved;
  everything else (norms, RoPE, SiLU, products, casts) is recomputed in backward.
  ``tiered_training.memory.activation_bytes_per_token(..., "selective")`` models this.
- ``full``: each layer is wrapped with ``checkpoint_wrapper``; only its input is kept.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten


def _save_ops() -> set:
    ops = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default}
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_attention_math",
        "_scaled_dot_product_fused_attention_overrideable",
    ):
        packet = getattr(_aten, name, None)
        if packet is not None:
            ops.add(packet.default)
    scaled_mm = getattr(_aten, "_scaled_mm", None)
    if scaled_mm is not None:  # float8 matmuls
        ops.add(scaled_mm.default)
    return ops


SAVE_OPS = _save_ops()


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context_fn():
    return create_selective_checkpoint_contexts(_policy)


def apply_ac(layers: nn.ModuleList, mode: str) -> None:
    """Wrap each layer of ``layers`` in place according to ``mode``."""
    if mode == "none":
        return
    if mode == "full":
        wrap = partial(checkpoint_wrapper, preserve_rng_state=False)
    elif mode == "selective":
        wrap = partial(checkpoint_wrapper, context_fn=selective_context_fn, preserve_rng_state=False)
    else:
        raise ValueError(f"unknown activation checkpointing {mode!r}")
    for index in range(len(layers)):
        layers[index] = wrap(layers[index])

