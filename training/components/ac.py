"""Activation checkpointing of the decoder layers (torchtitan's policies).

- ``none``: autograd keeps everything it saves.
- ``selective``: op-level selective checkpointing (SAC), torchtitan's per-op policy.
  Inside each layer the outputs of attention (every SDPA variant, FlexAttention) are saved, and so
  is every other matmul output, counted in forward order: the 1st, 3rd, 5th and 7th of a
  Llama layer (``q_proj``, ``v_proj``, ``gate_proj``, ``down_proj``). The 2nd, 4th and
  6th (``k_proj``, ``o_proj``, ``up_proj``) and everything cheap (norms, RoPE, SiLU,
  products, casts) are recomputed in backward. FP8's ``amax`` reductions are saved so
  the recomputed casts use the forward's scales.
  ``tiered_training.planning.memory.activation_bytes_per_token(..., "selective")`` models this.
- ``full``: each layer is wrapped with ``checkpoint_wrapper``; only its input is kept.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten

# Matmuls: every other one is saved. ``linear`` appears on backends that do not decompose it.
MATMUL_OPS = {_aten.mm.default, _aten.addmm.default, _aten.linear.default}


def _save_ops() -> set:
    """Ops whose outputs are saved (matmuls subject to the every-other rule)."""
    ops: set = set(MATMUL_OPS) | {_aten.bmm.default, _aten.max.default}
    for name in (
        "_scaled_mm",  # float8 matmuls reached directly
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_attention_math",
        "_scaled_dot_product_fused_attention_overrideable",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    ):
        packet = getattr(_aten, name, None)
        if packet is not None:
            ops.add(packet.default)
    ops.add(torch.ops.higher_order.flex_attention)  # packed SFT sequences (training/models/attention.py)
    return ops


SAVE_OPS = _save_ops()


def selective_policy():
    """A fresh policy for one checkpointed call: forward and recompute count matmuls apart."""
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if op in MATMUL_OPS:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            return CheckpointPolicy.MUST_SAVE if counts[key] % 2 == 1 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_context_fn():
    return create_selective_checkpoint_contexts(selective_policy())


def apply_ac(layers: nn.ModuleList, mode: str, *, preserve_rng_state: bool = False) -> None:
    """Wrap each layer of ``layers`` in place according to ``mode``.

    ``preserve_rng_state``: the layers draw random numbers (LoRA dropout); the recomputation
    replays the forward's random state, so backward sees the forward's dropout masks. Without
    dropout (torchtitan's models, full training) there is nothing to replay and it stays off.
    """
    if mode == "none":
        return
    if mode == "full":
        wrap = partial(checkpoint_wrapper, preserve_rng_state=preserve_rng_state)
    elif mode == "selective":
        wrap = partial(checkpoint_wrapper, context_fn=selective_context_fn, preserve_rng_state=preserve_rng_state)
    else:
        raise ValueError(f"unknown activation checkpointing {mode!r}")
    for index in range(len(layers)):
        layers[index] = wrap(layers[index])
