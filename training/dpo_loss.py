"""Preference (DPO) loss on packed pairs, as trl's ``DPOTrainer`` computes it.

A packed row (``training/dpo_data.py``) holds whole pairs: prompt + chosen, then prompt + rejected, each a
sequence whose positions start at 0. A sequence's log-probability is the sum of its completion tokens'
log-probabilities (the labels that are not -100); sequence ``2k`` of a row is pair ``k``'s chosen answer,
``2k + 1`` its rejected one, and a trailing padding sequence has no targets.

With ``m = (logp_c - ref_c) - (logp_r - ref_r)`` (the policy's log-ratio margin over the reference):

- ``sigmoid`` (DPO): ``-log sigmoid(beta m)``;
- ``ipo``: ``((logp_c - ref_c) / n_c - (logp_r - ref_r) / n_r - 1 / (2 beta))^2``, ``n`` the completion tokens;
- ``robust``: ``(-(1 - e) log sigmoid(beta m) + e log sigmoid(-beta m)) / (1 - 2e)``, ``e`` the label smoothing.

The step's loss is the mean over its pairs, on every rank and micro-batch (the divisor is the step's global
pair count), which is trl's batch mean for one micro-batch on one rank. The metrics carry trl's names:
``rewards/chosen`` (``beta (logp_c - ref_c)``), ``rewards/rejected``, ``rewards/margins``,
``rewards/accuracies`` (chosen reward above rejected) and ``logps/chosen``, ``logps/rejected``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tiered_training.contract.runconfig import DpoConfig
from training.components.loss import IGNORE_INDEX

METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def _chunk_logps(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = (hidden @ weight.t()).float()
    return -F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="none")


def token_logps(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    """Each label's log-probability under ``hidden @ weight.T`` (fp32; 0 where the label is -100), computed
    ``chunk_tokens`` at a time, each chunk's logits recomputed in the backward (as the SFT loss's)."""
    shape = labels.shape
    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    parts = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, y = hidden[start : start + chunk_tokens], labels[start : start + chunk_tokens]
        if h.requires_grad or weight.requires_grad:
            parts.append(checkpoint(_chunk_logps, h, weight, y, use_reentrant=False))
        else:
            parts.append(_chunk_logps(h, weight, y))
    return torch.cat(parts).reshape(shape)


def sequence_index(positions: torch.Tensor) -> torch.Tensor:
    """Each token's sequence within its row: the count of positions equal to 0 so far, minus one."""
    return (positions == 0).long().cumsum(dim=-1) - 1


@dataclass
class Pairs:
    """The pairs of a micro-batch, row by row: log-probabilities and completion lengths."""

    chosen: torch.Tensor  # [pairs] summed completion log-probabilities
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor  # [pairs] completion tokens
    rejected_tokens: torch.Tensor
    rows: torch.Tensor  # [pairs] the row (in the micro-batch) of each pair
    slots: torch.Tensor  # [pairs] its place among the row's pairs


def pair_sums(logps: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor) -> Pairs:
    """Sums of ``logps`` ([rows, tokens]) per completion, grouped into pairs (chosen = even sequences)."""
    rows, length = labels.shape
    sequences = sequence_index(positions).clamp(min=0)
    valid = labels != IGNORE_INDEX
    slots = int(sequences.max().item()) + 2
    slots += slots % 2
    flat = sequences + torch.arange(rows, device=labels.device).unsqueeze(1) * slots
    sums = torch.zeros(rows * slots, dtype=logps.dtype, device=logps.device)
    sums = sums.index_add(0, flat.reshape(-1), torch.where(valid, logps, torch.zeros_like(logps)).reshape(-1))
    counts = torch.zeros(rows * slots, dtype=torch.long, device=labels.device)
    counts = counts.index_add(0, flat.reshape(-1), valid.long().reshape(-1))
    sums, counts = sums.view(rows, slots // 2, 2), counts.view(rows, slots // 2, 2)
    present = (counts[..., 0] > 0) & (counts[..., 1] > 0)
    row, slot = present.nonzero(as_tuple=True)
    return Pairs(sums[row, slot, 0], sums[row, slot, 1], counts[row, slot, 0], counts[row, slot, 1], row, slot)


def preference_loss(
    cfg: DpoConfig,
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    chosen_tokens: torch.Tensor,
    rejected_tokens: torch.Tensor,
) -> torch.Tensor:
    """Each pair's loss (trl's ``per_sequence_loss``) for ``cfg.loss``."""
    chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
    margin = chosen_ratio - rejected_ratio
    beta = cfg.beta
    if cfg.loss == "sigmoid":
        return -F.logsigmoid(beta * margin)
    if cfg.loss == "ipo":
        per_token = chosen_ratio / chosen_tokens.clamp(min=1) - rejected_ratio / rejected_tokens.clamp(min=1)
        return (per_token - 1 / (2 * beta)) ** 2
    e = cfg.label_smoothing
    return (-(1 - e) * F.logsigmoid(beta * margin) + e * F.logsigmoid(-beta * margin)) / (1 - 2 * e)


def metric_sums(cfg: DpoConfig, pairs: Pairs, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor) -> torch.Tensor:
    """The sums over the pairs of each of :data:`METRICS` (divide by the pair count for trl's means)."""
    chosen_reward = cfg.beta * (pairs.chosen.detach() - ref_chosen)
    rejected_reward = cfg.beta * (pairs.rejected.detach() - ref_rejected)
    return torch.stack(
        [
            chosen_reward.sum(),
            rejected_reward.sum(),
            (chosen_reward - rejected_reward).sum(),
            (chosen_reward > rejected_reward).float().sum(),
            pairs.chosen.detach().sum(),
            pairs.rejected.detach().sum(),
        ]
    ).float()


class PairLogps(nn.Module):
    """The DPO training module (FSDP's root, as ``CausalLMLoss`` for SFT): the pairs' completion log-probabilities
    of a micro-batch of packed rows."""

    def __init__(self, lm: nn.Module, loss_chunk_tokens: int):
        super().__init__()
        self.lm = lm
        self.loss_chunk_tokens = loss_chunk_tokens

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor) -> tuple:
        """A tuple of :class:`Pairs`' fields (FSDP's hooks see the tensors of a tuple): ``Pairs(*output)``."""
        lm: Any = self.lm
        hidden = lm.model(input_ids, position_ids)
        logps = token_logps(hidden, lm.lm_head.weight, labels, self.loss_chunk_tokens)
        p = pair_sums(logps, labels, position_ids)
        return p.chosen, p.rejected, p.chosen_tokens, p.rejected_tokens, p.rows, p.slots


def reference_pairs(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor) -> Pairs:
    """The reference's pairs for a micro-batch: ``model`` without gradient (the starting weights for a first pass;
    under LoRA, wrap the call in ``training.models.lora.adapters_disabled``)."""
    with torch.no_grad():
        return Pairs(*model(inputs, labels, positions))


def pair_step(
    model: nn.Module,
    cfg: DpoConfig,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    positions: torch.Tensor,
    reference: tuple[torch.Tensor, torch.Tensor],
    divisor: torch.Tensor | int,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One micro-batch: its pairs' summed loss over ``divisor`` (the step's pair count), the metric sums, and
    its pair count. ``reference``: the reference log-probabilities of its pairs, chosen and rejected, in
    :func:`pair_sums`' order."""
    pairs = Pairs(*model(inputs, labels, positions))
    ref_chosen, ref_rejected = (r.to(pairs.chosen.device, pairs.chosen.dtype) for r in reference)
    losses = preference_loss(
        cfg, pairs.chosen, pairs.rejected, ref_chosen, ref_rejected, pairs.chosen_tokens, pairs.rejected_tokens
    )
    return losses.sum() / divisor, metric_sums(cfg, pairs, ref_chosen, ref_rejected), int(pairs.chosen.numel())
