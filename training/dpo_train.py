"""The trainer's preference (DPO) step: the reference log-probabilities and the forward and backward of pairs.

The reference (``dpo.reference``):

- ``precomputed``: before the first step of every job, while the model still holds the starting weights
  (``trainer.build`` loads them; a resume restores the trained state only after this pass), each rank computes
  the reference log-probabilities of its share of the training rows, and the ranks exchange them: a table of
  8 bytes a pair, looked up by row in each step. Every rank runs the same number of forwards (FSDP's
  collectives), its last batch repeated where the rows do not divide.
- ``adapter_disabled`` (LoRA): each micro-batch's reference is a forward of the same model without gradient
  and with the adapters off (``training.models.lora.adapters_disabled``), as trl does with peft.

The step's loss is the mean over the step's pairs on every rank (``training/dpo_loss.py``); the metrics are
trl's, averaged over the step's pairs and logged by rank 0.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from training.dpo_loss import METRICS, Pairs, pair_step, reference_pairs, sequence_index
from training.models.lora import adapters_disabled

log = logging.getLogger("training.dpo")


class ReferenceTable:
    """Precomputed reference log-probabilities: row index -> ``[slots, 2]`` (chosen, rejected) per pair slot."""

    def __init__(self, rows: dict[int, torch.Tensor]):
        self.rows = rows

    def lookup(self, index: torch.Tensor, pairs_rows: torch.Tensor, slots: torch.Tensor):
        values = [self.rows[int(index[r])][int(s)] for r, s in zip(pairs_rows.tolist(), slots.tolist())]
        table = torch.stack(values) if values else torch.zeros(0, 2)
        return table[:, 0], table[:, 1]


def check_pairs(manifest: dict, where: str) -> None:
    """The shards must hold pairs (``python -m training.dpo_data``), not SFT examples."""
    if manifest.get("layout") != "pairs":
        raise ValueError(
            f"{where}: packed SFT examples, not preference pairs; prepare the pairs with python -m training.dpo_data "
            "(layout: pairs in shards.json)"
        )


def rows_read(dataset, start: int, count: int) -> list[int]:
    """The rows the training stream hands out at its global positions ``[start, start + count)`` (the order of
    ``training.components.data.GlobalStream``)."""
    rows = set()
    for position in range(start, start + count):
        epoch, offset = divmod(position, dataset.windows)
        index = int(dataset._epoch_order(epoch)[offset])
        rows.add(int(dataset.index[index]) if dataset.index is not None else index)
    return sorted(rows)


def precompute(trainer, data_dir, rows: list[int] | None = None) -> ReferenceTable:
    """The reference log-probabilities of the training rows (``rows``: only these, such as the probe's few
    steps'), from the weights the model holds now."""
    from training.components.data import SftSequences

    cfg, info = trainer.cfg, trainer.info
    data = SftSequences(
        data_dir, cfg.data.token_dtype, cfg.batch.sequence_length, rank=0, world_size=1, seed=0, checksums=False
    )
    check_pairs(data.manifest, str(data_dir))
    total = int(data.starts[-1])
    rank, world = trainer.cp.data_rank, trainer.cp.data_ranks
    mine = list(range(total) if rows is None else rows)[rank::world]
    total = len(range(total) if rows is None else rows)
    size = cfg.batch.micro_batch_size
    per_rank = -(-total // world)
    batches = -(-per_rank // size)  # the same count on every rank
    table: dict[int, torch.Tensor] = {}
    trainer.model.eval()
    for b in range(batches):
        chunk = mine[b * size : (b + 1) * size] or mine[-size:] or [0]
        chunk = (chunk + chunk[-1:] * size)[:size]
        samples = [data._read(i) for i in chunk]
        inputs, labels, positions = (
            torch.stack([s[k] for s in samples]).to(info.device) for k in ("input_ids", "labels", "position_ids")
        )
        pairs = reference_pairs(trainer.model, inputs, labels, positions)
        for row, slot, c, r in zip(pairs.rows.tolist(), pairs.slots.tolist(), pairs.chosen, pairs.rejected):
            index = chunk[row]
            if index not in table:
                table[index] = torch.zeros(_slots(positions[row]), 2)
            table[index][slot] = torch.stack([c, r]).float().cpu()
    trainer.model.train()
    if dist.is_initialized() and world > 1:
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, table)
        for part in gathered:
            table.update(part)
    if info.is_main:
        pairs_count = sum(len(v) for v in table.values())
        log.info("reference log-probabilities of %d rows (%d pair slots) precomputed", len(table), pairs_count)
    return ReferenceTable(table)


def _slots(positions: torch.Tensor) -> int:
    return (int(sequence_index(positions).max()) + 2) // 2


def pair_count(micro_batches: list[tuple], device: torch.device) -> torch.Tensor:
    """The step's pairs over every micro-batch and rank (a pair: two sequences with targets), at least 1."""
    count = torch.zeros((), dtype=torch.int64)
    for _, labels, positions, _ in micro_batches:
        sequences = sequence_index(positions.cpu()).clamp(min=0)
        with_targets = torch.zeros(labels.shape[0], int(sequences.max()) + 2, dtype=torch.long)
        with_targets.scatter_add_(1, sequences, (labels.cpu() != -100).long())
        has = with_targets > 0
        slots = has.shape[1] // 2 * 2
        count += (has[:, 0:slots:2] & has[:, 1:slots:2]).sum()
    count = count.to(device)
    if dist.is_initialized():
        dist.all_reduce(count)
    return count.clamp(min=1)


def forward_backward(trainer, micro_batches: list[tuple]) -> torch.Tensor:
    """The DPO step's forward and backward: this rank's part of the step's mean pair loss. The metric sums
    over the step's pairs are left in ``trainer.dpo_metrics`` (summed over ranks by :func:`step_metrics`)."""
    from training.distributed.parallel import sync_replicas

    cfg, model, device = trainer.cfg, trainer.model, trainer.info.device
    dpo = cfg.dpo
    divisor = pair_count(micro_batches, device)
    loss_sum = torch.zeros((), device=device, dtype=torch.float32)
    sums = torch.zeros(len(METRICS) + 1, dtype=torch.float32)
    for i, (inputs, labels, positions, index) in enumerate(micro_batches):
        sync_replicas(model, trainer.mesh, last=i == len(micro_batches) - 1)
        if dpo.reference == "adapter_disabled":
            with adapters_disabled(trainer.lm):
                ref: Pairs = reference_pairs(model, inputs, labels, positions)
            reference = (ref.chosen, ref.rejected)
        else:
            rows = _pairs_layout(labels, positions)
            reference = trainer.reference.lookup(index, *rows)
        loss, metric_sums, count = pair_step(model, dpo, inputs, labels, positions, reference, divisor)
        loss.backward()
        loss_sum += loss.detach()
        sums[:-1] += metric_sums.cpu()
        sums[-1] += count
    trainer.dpo_metrics = sums
    return loss_sum


def _pairs_layout(labels: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, slot) of each pair of a micro-batch, in :func:`training.dpo_loss.pair_sums`' order."""
    from training.dpo_loss import pair_sums

    p = pair_sums(torch.zeros(labels.shape, dtype=torch.float32), labels.cpu(), positions.cpu())
    return p.rows, p.slots


def step_metrics(trainer, group) -> dict[str, float]:
    """trl's metrics of the last step, means over its pairs on every rank."""
    sums = trainer.dpo_metrics.double()
    if dist.is_initialized():
        dist.all_reduce(sums, group=group)
    count = max(float(sums[-1]), 1.0)
    return {name: float(value) / count for name, value in zip(METRICS, sums[:-1].tolist())}


def build_validator(cfg, data_dir, trainer, group):
    """The held-out pairs' DPO loss and metrics (:class:`PairValidator`), or None where there are none."""
    from training.components.validation import Validator

    class PairValidator(Validator):
        """Validation on held-out pairs: the mean pair loss, and trl's metrics (``eval`` in the log). The
        precomputed reference of its batches is computed when it is built, from the starting weights."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.references = None
            self.metrics: dict[str, float] = {}
            if cfg.dpo.reference == "precomputed":
                self.model.eval()
                self.references = [self._reference(batch) for batch in self.batches]
                self.model.train()

        def _inputs(self, batch):
            return tuple(batch[k].to(self.device) for k in ("input_ids", "labels", "position_ids"))

        def _reference(self, batch):
            inputs = self._inputs(batch)
            if cfg.dpo.reference == "adapter_disabled":
                with adapters_disabled(trainer.lm):
                    ref = reference_pairs(self.model, *inputs)
            else:
                ref = reference_pairs(self.model, *inputs)
            return ref.chosen.detach(), ref.rejected.detach()

        def evaluate(self) -> float:
            import time

            started = time.perf_counter()
            was_training = self.model.training
            self.model.eval()
            sums = torch.zeros(len(METRICS) + 2, dtype=torch.float64)
            try:
                with torch.no_grad():
                    for i, batch in enumerate(self.batches):
                        reference = self.references[i] if self.references is not None else self._reference(batch)
                        inputs, labels, positions = self._inputs(batch)
                        step = pair_step(self.model, cfg.dpo, inputs, labels, positions, reference, 1)
                        sums[0] += float(step[0])
                        sums[1:-1] += step[1].double().cpu()
                        sums[-1] += step[2]
            finally:
                self.model.train(was_training)
            if dist.is_initialized():
                dist.all_reduce(sums)
            pairs = max(float(sums[-1]), 1.0)
            self.metrics = {name: float(v) / pairs for name, v in zip(METRICS, sums[1:-1].tolist())}
            self.last = self.clock()
            mean = float(sums[0]) / pairs
            log.info(
                "validation DPO loss %.4f over %d held-out pairs (%.1f s); eval %s",
                mean,
                int(pairs),
                time.perf_counter() - started,
                " ".join(f"{k}={v:.4f}" for k, v in self.metrics.items()),
            )
            return mean

    return PairValidator.build(
        cfg,
        data_dir,
        trainer.model,
        trainer.info.device,
        rank=trainer.cp.data_rank,
        world_size=trainer.cp.data_ranks,
        group=group,
        shard=trainer.cp.shard,
    )
