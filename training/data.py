"""Token shards: flat, memory-mapped uint16/uint32 files, packed into fixed windows.

Format (see training/README.md): every ``*.bin`` file in the data directory (searched
recursively, read in sorted path order) is a raw little-endian array of token ids,
``uint16`` or ``uint32`` as ``RunConfig.data.token_dtype`` says, documents concatenated
with an end-of-text token between them. No header.

Each shard is cut into non-overlapping windows of ``sequence_length + 1`` tokens
(window ``i`` starts at ``i * sequence_length``; inputs are the first ``sequence_length``
tokens, labels the last). Windows never cross a shard boundary.

Order: each epoch permutes all windows with ``seed + epoch``; rank ``r`` of ``n`` takes
every ``n``-th window from position ``r``, so ranks read disjoint data and the
order depends only on the seed, the data and the world size. The iterator's state
(epoch, position) is saved through ``StatefulDataLoader`` in every checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


@dataclass(frozen=True)
class Shard:
    path: Path
    tokens: int


def find_shards(data_dir: Path, token_dtype: str) -> list[Shard]:
    itemsize = np.dtype(DTYPES[token_dtype]).itemsize
    shards = []
    for path in sorted(Path(data_dir).rglob("*.bin")):
        size = path.stat().st_size
        if size % itemsize:
            raise ValueError(f"{path}: {size} bytes is not a whole number of {token_dtype} tokens")
        shards.append(Shard(path, size // itemsize))
    if not shards:
        raise FileNotFoundError(f"no *.bin token shards under {data_dir}")
    return shards


class PackedTokenWindows(IterableDataset):
    """An endless, resumable stream of ``[sequence_length + 1]`` int64 windows for one rank."""

    def __init__(self, data_dir: Path, token_dtype: str, sequence_length: int, *, rank: int, world_size: int, seed: int,
                 holdout_every: int = 0):
        self.shards = find_shards(data_dir, token_dtype)
        self.dtype = DTYPES[token_dtype]
        self.sequence_length = sequence_length
        self.rank, self.world_size, self.seed = rank, world_size, seed
        counts = [max(0, (s.tokens - 1) // sequence_length) for s in self.shards]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # With holdout_every = k, every k-th window (k-1, 2k-1, ...) is held out for validation.
        self.index = held_out_windows(int(self.starts[-1]), holdout_every, held_out=False) if holdout_every else None
        self.windows = int(self.starts[-1]) if self.index is None else len(self.index)
        self.per_rank = self.windows // world_size
        if self.per_rank == 0:
            raise ValueError(
                f"{self.windows} windows of {sequence_length + 1} tokens in {data_dir} are fewer than the {world_size} ranks"
            )
        self.epoch = 0
        self.position = 0  # windows of this epoch already yielded by this rank
        self._maps: dict[int, np.memmap] = {}
        self._order: tuple[int, np.ndarray] | None = None

    def _epoch_order(self) -> np.ndarray:
        if self._order is None or self._order[0] != self.epoch:
            rng = np.random.default_rng([self.seed, self.epoch])
            order = rng.permutation(self.windows)[self.rank :: self.world_size][: self.per_rank]
            self._order = (self.epoch, order)
        return self._order[1]

    def _window(self, index: int) -> np.ndarray:
        if self.index is not None:
            index = int(self.index[index])
        shard = int(np.searchsorted(self.starts, index, side="right") - 1)
        if shard not in self._maps:
            self._maps[shard] = np.memmap(self.shards[shard].path, dtype=self.dtype, mode="r")
        start = (index - int(self.starts[shard])) * self.sequence_length
        return self._maps[shard][start : start + self.sequence_length + 1]

    def __iter__(self):
        while True:
            order = self._epoch_order()
            while self.position < len(order):
                window = self._window(int(order[self.position]))
                self.position += 1
                yield torch.from_numpy(window.astype(np.int64))
            self.epoch += 1
            self.position = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "windows": self.windows, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("windows") != self.windows or state.get("world_size") != self.world_size:
            raise ValueError(
                f"data loader state is for {state.get('windows')} windows on {state.get('world_size')} ranks; "
                f"this run has {self.windows} windows on {self.world_size} ranks"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def held_out_windows(windows: int, every: int, *, held_out: bool = True) -> np.ndarray:
    """The window indices held out for validation (every ``every``-th), or the others."""
    index = np.arange(windows, dtype=np.int64)
    mask = index % every == every - 1
    return index[mask if held_out else ~mask]


def build_dataloader(
    data_dir: Path, token_dtype: str, sequence_length: int, micro_batch_size: int, *, rank: int, world_size: int, seed: int,
    num_workers: int = 0, pin_memory: bool = False, holdout_every: int = 0,
) -> StatefulDataLoader:
    """Batches of ``[micro_batch_size, sequence_length + 1]`` token windows.

    ``num_workers`` may be 0 (read in the training process) or 1 (one background reader);
    the stream is one ordered sequence per rank, so more workers would duplicate it.
    """
    if num_workers not in (0, 1):
        raise ValueError(f"num_workers must be 0 or 1 for the packed token stream, not {num_workers}")
    dataset = PackedTokenWindows(data_dir, token_dtype, sequence_length, rank=rank, world_size=world_size, seed=seed,
                                 holdout_every=holdout_every)
    return StatefulDataLoader(
        dataset, batch_size=micro_batch_size, num_workers=num_workers, pin_memory=pin_memory, drop_last=True
    )


def split_batch(batch: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    batch = batch.to(device, non_blocking=True)
    return batch[:, :-1], batch[:, 1:]
