"""Token shards: flat, memory-mapped uint16/uint32 files, packed into fixed windows.

Format (see training/README.md): every ``*.bin`` file in the data directory (searched
recursively, read in sorted path order) is a raw little-endian array of token ids,
``uint16`` or ``uint32`` as ``RunConfig.data.token_dtype`` says, documents concatenated
with an end-of-text token between them. No header.

Each shard is cut into non-overlapping windows of ``sequence_length + 1`` tokens
(window ``i`` starts at ``i * sequence_length``; inputs are the first ``sequence_length``
tokens, labels the last). Windows never cross a shard boundary.

Order: the global order is one endless stream of windows: epoch ``e`` is a permutation of
all windows seeded with ``(seed, e)``, epochs follow each other. Each micro-step the job
takes the next ``micro_batch_size x world_size`` windows of that stream, and rank ``r``
takes every ``world_size``-th of them from offset ``r`` (within an epoch, rank ``r`` reads
windows ``r, r + world_size, r + 2 x world_size, ...`` of the permutation, as with a
per-rank split). Ranks read disjoint data, and the order depends only on the seed and the data.

The state saved with every checkpoint is the **global** position in that stream (windows
consumed by the whole job), the same on every rank. A job restarted on another number of
hosts therefore continues with exactly the windows that come next; the trainer keeps the
global batch by changing the accumulation (``training/world.py``).

Token ids must be smaller than the model's vocabulary. ``shards.json`` (written by
``tokenize_to_shards``) lists each shard's largest id: a shard over the vocabulary is
refused when the data is opened, naming it. Shards without a manifest entry are scanned
when the data is opened (a vectorised max over the memory map, split over the ranks), so a
bad token fails the job before step 1 with its shard and offset, not when its window comes
up (each restart would then fail again there). Every window is also checked as it is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


MANIFEST = "shards.json"


@dataclass(frozen=True)
class Shard:
    path: Path
    tokens: int
    max_token_id: int | None = None  # from the manifest, when there is one


class DataError(ValueError):
    """Token shards the run cannot use; the message names the shard."""


def find_shards(data_dir: Path, token_dtype: str) -> list[Shard]:
    itemsize = np.dtype(DTYPES[token_dtype]).itemsize
    listed = _manifest_entries(Path(data_dir))
    shards = []
    for path in sorted(Path(data_dir).rglob("*.bin")):
        size = path.stat().st_size
        if size % itemsize:
            raise DataError(f"{path}: {size} bytes is not a whole number of {token_dtype} tokens")
        entry = listed.get(path.resolve(), {})
        shards.append(Shard(path, size // itemsize, entry.get("max_token_id")))
    if not shards:
        raise FileNotFoundError(f"no *.bin token shards under {data_dir}")
    return shards


def _manifest_entries(data_dir: Path) -> dict[Path, dict]:
    """Shard entries of every ``shards.json`` under ``data_dir``, by the shard's resolved path."""
    entries: dict[Path, dict] = {}
    for manifest in sorted(data_dir.rglob(MANIFEST)):
        try:
            shards = json.loads(manifest.read_text()).get("shards") or []
        except (ValueError, OSError, AttributeError):
            continue  # informational; every window is checked anyway
        for entry in shards:
            if isinstance(entry, dict) and "file" in entry:
                entries[(manifest.parent / entry["file"]).resolve()] = entry
    return entries


def check_vocabulary(shards: list[Shard], vocab_size: int) -> None:
    """Refuse a shard whose manifest says it holds ids outside the vocabulary."""
    for shard in shards:
        if shard.max_token_id is not None and shard.max_token_id >= vocab_size:
            raise DataError(_oov_message(shard.path, shard.max_token_id, vocab_size, "its manifest says"))


SCAN_CHUNK = 1 << 24  # tokens per vectorised max (64 MiB of uint32)
_scanned: set[tuple] = set()  # shards found clean in this process (the validation data opens them again)


def scan_vocabulary(shards: list[Shard], token_dtype: str, vocab_size: int, *, rank: int = 0, world_size: int = 1) -> None:
    """Refuse the first token id outside the vocabulary in the shards without a manifest entry,
    naming the shard and the token's offset. Rank ``r`` scans every ``world_size``-th such shard."""
    unlisted = [shard for shard in shards if shard.max_token_id is None]
    for shard in unlisted[rank::world_size]:
        stat = shard.path.stat()
        key = (str(shard.path.resolve()), stat.st_size, stat.st_mtime_ns, vocab_size)
        if key in _scanned or not shard.tokens:
            continue
        tokens = np.memmap(shard.path, dtype=DTYPES[token_dtype], mode="r")
        for start in range(0, len(tokens), SCAN_CHUNK):
            chunk = tokens[start : start + SCAN_CHUNK]
            if int(chunk.max()) >= vocab_size:
                offset = start + int(np.argmax(chunk >= vocab_size))
                raise DataError(_oov_message(shard.path, int(tokens[offset]), vocab_size, f"at token {offset}:"))
        _scanned.add(key)


def _oov_message(path: Path, token: int, vocab_size: int, where: str) -> str:
    return (f"{path}: {where} token id {token}, outside the model's vocabulary of {vocab_size} ids "
            f"(0-{vocab_size - 1}); tokenise the data with the model's tokenizer, or fix model.vocab_size")


class PackedTokenWindows(IterableDataset):
    """An endless, resumable stream of ``[sequence_length + 1]`` int64 windows for one rank."""

    def __init__(self, data_dir: Path, token_dtype: str, sequence_length: int, *, rank: int, world_size: int, seed: int,
                 holdout_every: int = 0, micro_batch_size: int = 1, vocab_size: int | None = None):
        self.shards = find_shards(data_dir, token_dtype)
        if vocab_size is not None:
            check_vocabulary(self.shards, vocab_size)
            scan_vocabulary(self.shards, token_dtype, vocab_size, rank=rank, world_size=world_size)
        self.dtype = DTYPES[token_dtype]
        self.sequence_length = sequence_length
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.micro_batch_size = micro_batch_size
        self.vocab_size = vocab_size
        counts = [max(0, (s.tokens - 1) // sequence_length) for s in self.shards]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # With holdout_every = k, every k-th window (k-1, 2k-1, ...) is held out for validation.
        self.index = held_out_windows(int(self.starts[-1]), holdout_every, held_out=False) if holdout_every else None
        self.windows = int(self.starts[-1]) if self.index is None else len(self.index)
        if self.windows < micro_batch_size * world_size:
            raise DataError(
                f"{self.windows} windows of {sequence_length + 1} tokens in {data_dir} are fewer than one micro-step "
                f"of the job ({micro_batch_size} x {world_size} ranks)"
            )
        self.position = 0  # windows of the global stream consumed by the whole job
        self._maps: dict[int, np.memmap] = {}
        self._order: tuple[int, np.ndarray] | None = None

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.windows))
        return self._order[1]

    def _window(self, position: int) -> np.ndarray:
        epoch, offset = divmod(position, self.windows)
        index = int(self._epoch_order(epoch)[offset])
        if self.index is not None:
            index = int(self.index[index])
        shard = int(np.searchsorted(self.starts, index, side="right") - 1)
        if shard not in self._maps:
            self._maps[shard] = np.memmap(self.shards[shard].path, dtype=self.dtype, mode="r")
        start = (index - int(self.starts[shard])) * self.sequence_length
        window = self._maps[shard][start : start + self.sequence_length + 1]
        if self.vocab_size is not None:
            largest = int(window.max())
            if largest >= self.vocab_size:
                where = f"at token {start + int(np.argmax(window >= self.vocab_size))}:"
                raise DataError(_oov_message(self.shards[shard].path, largest, self.vocab_size, where))
        return window

    def __iter__(self):
        step = self.micro_batch_size * self.world_size
        while True:
            for j in range(self.micro_batch_size):
                window = self._window(self.position + j * self.world_size + self.rank)
                if j == self.micro_batch_size - 1:
                    self.position += step  # the micro-step is done once its last window is handed out
                yield torch.from_numpy(window.astype(np.int64))

    def state_dict(self) -> dict:
        return {"position": self.position, "windows": self.windows, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if "position" not in state:
            raise DataError("the checkpoint's data position is per rank (an older format); it cannot be resumed")
        if state.get("windows") != self.windows or state.get("seed", self.seed) != self.seed:
            raise DataError(
                f"the checkpoint was saved for {state.get('windows')} windows (seed {state.get('seed')}); this data has "
                f"{self.windows} windows (seed {self.seed}): the data changed, so its position does not carry over"
            )
        self.position = int(state["position"])


def held_out_windows(windows: int, every: int, *, held_out: bool = True) -> np.ndarray:
    """The window indices held out for validation (every ``every``-th), or the others."""
    index = np.arange(windows, dtype=np.int64)
    mask = index % every == every - 1
    return index[mask if held_out else ~mask]


def build_dataloader(
    data_dir: Path, token_dtype: str, sequence_length: int, micro_batch_size: int, *, rank: int, world_size: int, seed: int,
    num_workers: int = 0, pin_memory: bool = False, holdout_every: int = 0, vocab_size: int | None = None,
) -> StatefulDataLoader:
    """Batches of ``[micro_batch_size, sequence_length + 1]`` token windows.

    ``num_workers`` may be 0 (read in the training process) or 1 (one background reader);
    the stream is one ordered sequence per rank, so more workers would duplicate it.
    """
    if num_workers not in (0, 1):
        raise ValueError(f"num_workers must be 0 or 1 for the packed token stream, not {num_workers}")
    dataset = PackedTokenWindows(data_dir, token_dtype, sequence_length, rank=rank, world_size=world_size, seed=seed,
                                 holdout_every=holdout_every, micro_batch_size=micro_batch_size, vocab_size=vocab_size)
    # A generator of its own: without one, every iter() draws a worker seed from the global RNG, which
    # then differs between a resumed run and an uninterrupted one (LoRA dropout draws from it).
    return StatefulDataLoader(
        dataset, batch_size=micro_batch_size, num_workers=num_workers, pin_memory=pin_memory, drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )


def split_batch(batch: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    batch = batch.to(device, non_blocking=True)
    return batch[:, :-1], batch[:, 1:]
