"""Cross-entropy over the vocabulary, computed in chunks of tokens.

Full logits are ``tokens x vocab``; their fp32 upcast and gradient dominate memory at
long context (about 10 bytes per logit). Here each chunk of ``chunk_tokens`` tokens
is projected, upcast and reduced inside its own activation checkpoint, so at most
one chunk's logits exist at a time, in the forward and in the backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = hidden @ weight.t()
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_tokens: int,
    *,
    group: dist.ProcessGroup | None = None,
    divisor: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean token cross-entropy of ``hidden @ weight.T`` against ``labels``.

    hidden: [..., h] in the compute dtype; weight: [vocab, h]; labels: [...] (ignore -100).

    divisor: the training step's global count of valid labels (every micro-batch and rank,
    :func:`valid_tokens`): the loss sum here is divided by it, and nothing else; the sum of
    these over micro-batches and ranks (FSDP sums gradients) is the step's token mean.

    group: the ranks that hold parts of the same sequences (context parallelism). The
    tokens are then counted over the group and each rank returns ``group size x`` its
    loss sum over that count: the mean over the group's ranks (which gradient averaging
    takes) is the token-weighted mean over the whole sequences.
    """
    hidden = hidden.reshape(-1, hidden.shape[-1])
    labels = labels.reshape(-1)
    count = (labels != IGNORE_INDEX).sum()
    scale = 1
    if divisor is not None:
        count, group = divisor, None
    if group is not None:
        dist.all_reduce(count, group=group)
        scale = dist.get_world_size(group)
    count = count.clamp(min=1)
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], chunk_tokens):
        end = start + chunk_tokens
        h, y = hidden[start:end], labels[start:end]
        if hidden.requires_grad or weight.requires_grad:
            total = total + checkpoint(_chunk_loss_sum, h, weight, y, use_reentrant=False)
        else:
            total = total + _chunk_loss_sum(h, weight, y)
    return total * scale / count


def valid_tokens(micro_batches, device: torch.device) -> torch.Tensor:
    """The step's count of valid labels over this rank's ``(inputs, labels, positions)``
    micro-batches and every rank (one all-reduce; the data-parallel and context-parallel ranks
    together), at least 1. Known before the first forward, as in torchtitan's train loop
    (https://github.com/pytorch/torchtitan/blob/main/torchtitan/train.py)."""
    count = torch.zeros((), dtype=torch.int64, device=device)
    for _, labels, _ in micro_batches:
        count += (labels != IGNORE_INDEX).sum()
    if dist.is_initialized():
        dist.all_reduce(count)
    return count.clamp(min=1)
