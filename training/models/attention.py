"""The decoder's attention: causal SDPA, and packed examples masked from each other.

A packed sequence holds several examples; its ``position_ids`` restart at 0 where one starts
(as transformers' ``find_packed_sequence_indices`` reads them). :func:`document_mask` turns
them into the mask the attention function takes, in one of two forms:

- a FlexAttention ``BlockMask`` (``torch.nn.attention.flex_attention``): per block of
  ``BLOCK`` queries and keys, whether it is skipped, computed whole or masked element by
  element (causal within one example). Built from each block's first and last example, so it
  costs ``O((N / BLOCK)^2)`` integers, never an ``N x N`` tensor; the kernel skips the blocks
  that cross examples. FlexAttention is fast only compiled (eager, it materialises every score),
  so the attention runs through one ``torch.compile`` of ``flex_attention``; inside a compiled
  layer (``training/components/compile.py``) dynamo traces it into the layer's graph.
- a dense boolean ``[batch, 1, N, N]`` mask for SDPA where FlexAttention cannot run: on the CPU
  when gradients are recorded (PyTorch 2.13's FlexAttention has no CPU backward, eager or
  compiled), in float64 (Inductor's CPU template takes float32, float16 and bfloat16 only), or
  without a C++ compiler for Inductor. So CPU training keeps the dense mask; CPU evaluation
  (validation, ``torch.no_grad``) and every CUDA step take the block mask.

A sequence that is one example gets no mask and SDPA's ``is_causal``, as in pretraining.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

BLOCK = 128  # FlexAttention's default block of queries and keys
CPU_FLEX_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # Inductor's CPU flex template
# On the CPU the dense mask of a shorter row is at most 16 MiB, and compiling FlexAttention's kernel costs
# 15-80 s a shape (bench/packed_attention.json): below this length the dense mask is the cheaper one.
CPU_FLEX_MIN_TOKENS = 4096

Mask = torch.Tensor | BlockMask


def document_ids(position_ids: torch.Tensor) -> torch.Tensor | None:
    """``[batch, N]``: each token's example within its row (0, 1, ...; a new one wherever the position
    does not go up by one), or None when every row is one sequence."""
    first = position_ids[:, :1] - 1
    example = (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)
    if bool((example[:, -1] == 0).all()):
        return None
    return example


def dense_mask(example: torch.Tensor) -> torch.Tensor:
    """``[batch, 1, N, N]`` booleans: causal within each example."""
    n = example.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=example.device).tril()
    return (causal & (example[:, :, None] == example[:, None, :]))[:, None]


def block_mask(example: torch.Tensor, block: int = BLOCK) -> BlockMask:
    """The FlexAttention mask of ``dense_mask(example)``, built per block.

    Examples are contiguous and numbered in order, so query block ``i`` needs key block ``j`` when
    ``j <= i`` and ``j``'s last example is at least ``i``'s first; it needs no element mask when
    ``j < i`` and both blocks lie inside one example. Rows shorter than a whole block at the end are
    always masked element by element.
    """
    batch, n = example.shape
    blocks = -(-n // block)
    padded = torch.cat([example, example[:, -1:].expand(batch, blocks * block - n)], dim=1)
    spans = padded.view(batch, blocks, block)
    first, last = spans[..., 0], spans[..., -1]  # [batch, blocks]
    index = torch.arange(blocks, device=example.device)
    below = index[:, None] >= index[None, :]  # [q block, kv block]
    needed = below & (last[:, None, :] >= first[:, :, None])
    whole = (first == last) & (index < n // block)  # one example, no rows past N
    full = needed & (index[:, None] > index[None, :]) & whole[:, :, None] & whole[:, None, :]
    full &= first[:, :, None] == first[:, None, :]
    partial = needed & ~full

    def indices(blocks_used: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # the used key blocks of each query block first, in order (a stable sort of "not used")
        order = torch.argsort((~blocks_used).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return blocks_used.sum(-1, dtype=torch.int32)[:, None], order[:, None]

    doc = example

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (doc[b, q_idx] == doc[b, kv_idx])

    kv_num, kv_index = indices(partial)
    full_num, full_index = indices(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_index, full_num, full_index, BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(n, n)
    )


def flex_runs(device: torch.device, dtype: torch.dtype, tokens: int = CPU_FLEX_MIN_TOKENS) -> bool:
    """Whether compiled FlexAttention runs here, for rows of ``tokens``: CUDA, or the CPU without
    gradients, in a dtype of Inductor's CPU template, with a C++ compiler to build it, for rows of at
    least :data:`CPU_FLEX_MIN_TOKENS`."""
    if device.type == "cuda":
        return True
    if device.type != "cpu" or dtype not in CPU_FLEX_DTYPES or torch.is_grad_enabled():
        return False
    if tokens < CPU_FLEX_MIN_TOKENS:
        return False
    from torch._inductor import config

    return shutil.which(config.cpp.cxx[0] or "g++") is not None


def document_mask(position_ids: torch.Tensor, dtype: torch.dtype) -> Mask | None:
    """The attention mask of the packed examples in ``position_ids`` (see the module docstring), or
    None when no row is packed."""
    example = document_ids(position_ids)
    if example is None:
        return None
    if flex_runs(position_ids.device, dtype, position_ids.shape[-1]):
        return block_mask(example)
    return dense_mask(example)


# One compiled FlexAttention (compiling is lazy: the first call per shape builds the kernel)
compiled_flex: Callable[..., torch.Tensor] = torch.compile(flex_attention, dynamic=False)


def sdpa_attention(
    module: nn.Module | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: Mask | None,
    scale: float,
) -> torch.Tensor:
    """Causal attention on ``[batch, heads, sequence, head_dim]``: SDPA's ``is_causal`` without a mask,
    compiled FlexAttention with a ``BlockMask``, SDPA with a boolean mask (which replaces causality).
    GQA runs in the kernel, except with a boolean mask, where K/V heads are repeated. Returns
    ``[batch, sequence, heads, head_dim]``."""
    groups = query.shape[1] // key.shape[1]
    if isinstance(mask, BlockMask):
        out = compiled_flex(query, key, value, block_mask=mask, scale=scale, enable_gqa=groups > 1)
        return out.transpose(1, 2).contiguous()
    kwargs = {}
    if groups > 1:
        if mask is None:
            kwargs["enable_gqa"] = True
        else:
            key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scale, is_causal=mask is None and query.shape[2] > 1, **kwargs
    )
    return out.transpose(1, 2).contiguous()
