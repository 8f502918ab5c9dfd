"""Validation loss on held-out token shards, every ``cfg.validation.interval_minutes`` of wall clock.

Where the held-out windows come from (``cfg.validation.source``, set by the plan):

- ``channel``: the ``validation`` input channel (the recipe's ``data.validation_uri``),
  mounted at ``$SM_CHANNEL_VALIDATION`` (default ``/opt/ml/input/data/validation``);
- ``holdout``: every ``holdout_every``-th window of the training shards, which the
  training stream then skips (``training.components.data.build_dataloader(holdout_every=...)``);
- ``none``: no validation loss.

With a mixture (``cfg.data.mixture``, from ``channel``), each source's held-out documents are in the folder of its
name; the pass also gives the loss per source (:attr:`Validator.source_losses`).

Each pass reads the same ``cfg.validation.batches`` micro-batches per rank (rank ``r`` of
``n`` takes every ``n``-th held-out window, in order), under ``torch.no_grad`` and
``model.eval()``, and averages the loss over every rank. For fine-tuning (``cfg.sft``) the
windows are packed SFT sequences (``training.components.data.sft_validation_batches``) with the training
loss's masks and per-example positions, and the loss is the mean over their valid labels
(each label weighs the same, however many a batch holds). Ranks agree on when to run
through one small all-reduce after each step, so a pass starts on all of them together.
The result goes to :meth:`training.components.metrics.MetricsHook.record_validation` (CloudWatch,
MLflow, TensorBoard) and to the log.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tiered_training.contract.container import VALIDATION_CHANNEL, channel_dir
from tiered_training.contract.runconfig import RunConfig
from training.components.data import (
    DTYPES,
    find_shards,
    sft_validation_batches,
    split_batch,
    validation_rows,
    window_starts,
)
from training.components.loss import IGNORE_INDEX
from training.components.packing import split_sft_batch

log = logging.getLogger("training.components.validation")

VALIDATION_DIR = channel_dir(VALIDATION_CHANNEL)


def validation_dir() -> Path:
    """``$TT_VALIDATION_DIR``, else SageMaker's ``$SM_CHANNEL_VALIDATION``, else the channel's default path."""
    return Path(os.environ.get("TT_VALIDATION_DIR") or os.environ.get("SM_CHANNEL_VALIDATION") or VALIDATION_DIR)


class HeldOutWindows:
    """This rank's fixed validation windows: ``count`` of them, ``[sequence_length + 1]`` tokens each."""

    def __init__(
        self,
        data_dir: Path,
        token_dtype: str,
        sequence_length: int,
        *,
        rank: int,
        world_size: int,
        count: int,
        holdout_every: int = 0,
        checksums: bool = True,
    ):
        shards = find_shards(data_dir, token_dtype, checksums=checksums)
        self.dtype = DTYPES[token_dtype]
        self.sequence_length = sequence_length
        starts = window_starts(shards, sequence_length)
        mine = validation_rows(int(starts[-1]), holdout_every, rank=rank, world_size=world_size, count=count)
        if len(mine) == 0:
            raise ValueError(f"no validation windows for rank {rank} of {world_size} in {data_dir}")
        self.windows = []
        maps: dict[int, np.memmap] = {}
        for i in mine:
            shard = int(np.searchsorted(starts, i, side="right") - 1)
            if shard not in maps:
                maps[shard] = np.memmap(shards[shard].path, dtype=self.dtype, mode="r")
            start = (int(i) - int(starts[shard])) * sequence_length
            self.windows.append(torch.from_numpy(maps[shard][start : start + sequence_length + 1].astype(np.int64)))

    def batches(self, micro_batch_size: int):
        for i in range(0, len(self.windows) - micro_batch_size + 1, micro_batch_size):
            yield torch.stack(self.windows[i : i + micro_batch_size])


class Validator:
    """Runs a validation pass when its interval has passed; see the module docstring."""

    def __init__(
        self,
        cfg: RunConfig,
        data_dir: Path,
        model: torch.nn.Module,
        device: torch.device,
        *,
        rank: int,
        world_size: int,
        group=None,
        clock: Callable[[], float] = time.monotonic,
        shard=None,
    ):
        """rank, world_size: the data-parallel rank (with context parallelism, its CP group);
        shard: ``ContextParallel.shard``, this rank's part of each batch and its positions."""
        v = cfg.validation
        self.cfg, self.model, self.device, self.group, self.clock = cfg, model, device, group, clock
        self.shard = shard or (lambda inputs, labels: (inputs, labels, None))
        self.interval = v.interval_minutes * 60.0
        directory = validation_dir() if v.source == "channel" else data_dir
        batch = cfg.batch
        holdout_every = v.holdout_every if v.source == "holdout" else 0
        self.sft = cfg.sft is not None
        count = v.batches * batch.micro_batch_size
        self.batches: list[Any]  # SFT: dicts of input_ids, labels and position_ids; else token windows
        self.batch_source: list[int] = []  # a mixture's: each batch's source (an index of cfg.data.mixture)
        self.source_losses: dict[str, float] = {}  # a mixture's: the last pass's loss per source
        if self.sft:
            self.batches = sft_validation_batches(
                directory,
                cfg.data.token_dtype,
                batch.sequence_length,
                batch.micro_batch_size,
                rank=rank,
                world_size=world_size,
                count=count,
                holdout_every=holdout_every,
                vocab_size=cfg.model.vocab_size,
                checksums=v.source == "channel",  # the training stream has proven its own directory
            )
        elif cfg.data.mixture:  # each source's held-out documents, in the folder of its name
            if v.source != "channel":
                raise ValueError("a mixture's held-out documents are in the validation channel (validation.source)")
            self.batches, self.batch_source = [], []
            for index, source in enumerate(cfg.data.mixture):
                try:
                    windows = HeldOutWindows(
                        Path(directory) / source.name,
                        cfg.data.token_dtype,
                        batch.sequence_length,
                        rank=rank,
                        world_size=world_size,
                        count=count,
                    )
                except (FileNotFoundError, ValueError) as error:
                    log.warning("no validation loss for source %s: %s", source.name, error)
                    continue
                for one in windows.batches(batch.micro_batch_size):
                    self.batches.append(one)
                    self.batch_source.append(index)
            if not self.batches:
                raise ValueError(f"no validation windows of any mixture source in {directory}")
        else:
            self.batches = list(
                HeldOutWindows(
                    directory,
                    cfg.data.token_dtype,
                    batch.sequence_length,
                    rank=rank,
                    world_size=world_size,
                    count=count,
                    holdout_every=holdout_every,
                    checksums=v.source == "channel",
                ).batches(batch.micro_batch_size)
            )
        self._one = torch.ones((), device=device, dtype=torch.int64)
        self.last = clock()

    @classmethod
    def build(
        cls, cfg: RunConfig, data_dir: Path, model, device, *, rank: int, world_size: int, group=None, shard=None
    ) -> Validator | None:
        """A Validator, or None when the RunConfig asks for no validation loss."""
        if cfg.validation.source == "none":
            return None
        return cls(cfg, data_dir, model, device, rank=rank, world_size=world_size, group=group, shard=shard)

    def due(self) -> bool:
        """Whether a pass is due on any rank (one small all-reduce: every rank calls it after every step)."""
        flag = torch.tensor([1 if self.clock() - self.last >= self.interval else 0])
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over this pass's batches on every rank."""
        started = time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        total = torch.zeros((), device=self.device, dtype=torch.float32)
        count = 0
        sources = (self.cfg.data.mixture or []) if not self.sft else []
        per_source = torch.zeros(2 * len(sources), device=self.device, dtype=torch.float32)  # sum, count
        positions: torch.Tensor | None
        try:
            for index, batch in enumerate(self.batches):
                if self.sft:  # the loss sum (divisor 1) and the count of valid labels
                    inputs, labels, positions = split_sft_batch(batch, self.device)
                    total += self.model(inputs, labels, positions, divisor=self._one).detach().float()
                    count += int((labels != IGNORE_INDEX).sum())
                else:  # the mean of each batch's mean (every label valid, every batch the same size)
                    inputs, labels, positions = self.shard(*split_batch(batch, self.device))
                    loss = self.model(inputs, labels, positions).detach().float()
                    total += loss
                    count += 1
                    if self.batch_source:
                        per_source[2 * self.batch_source[index]] += loss
                        per_source[2 * self.batch_source[index] + 1] += 1
        finally:
            self.model.train(was_training)
        stats = torch.cat([torch.stack([total, torch.tensor(float(count), device=self.device)]), per_source])
        if dist.is_initialized():
            dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        self.source_losses = {
            source.name: (stats[2 + 2 * i] / stats[3 + 2 * i]).item()
            for i, source in enumerate(sources)
            if stats[3 + 2 * i].item() > 0
        }
        self.last = self.clock()
        loss = (stats[0] / stats[1].clamp(min=1)).item()
        log.info(
            "validation loss %.4f over %d %s per rank (%.1f s)",
            loss,
            count,
            "labels" if self.sft else "batches",
            time.perf_counter() - started,
        )
        return loss

    def maybe_run(self, on_result: Callable[[float], None] | None = None) -> float | None:
        if not self.due():
            return None
        loss = self.evaluate()
        if on_result is not None:
            on_result(loss)
        return loss
