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

Packed SFT sequences (``training/sft_data.py`` writes them; :func:`build_sft_dataloader`) are
read in the same global order, one item per sequence, as dicts of ``input_ids``, ``labels``
(-100 where no loss is taken) and ``position_ids``. Pretraining refuses them, and they are
refused for a run of another sequence length or token type.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from training.components.shard_manifest import (
    MANIFEST,
    DataError,
    check_listed,
    namer,
    read_manifests,
    verify_checksums,
)
from training.sft_data import SFT_KIND, sft_files

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


@dataclass(frozen=True)
class Shard:
    path: Path
    tokens: int
    max_token_id: int | None = None  # from the manifest, when there is one


def local_ranks() -> tuple[int, int]:
    """This process's rank among its host's ranks and their count (torchrun's LOCAL_RANK, LOCAL_WORLD_SIZE):
    each host checks its own copy of the data, its ranks sharing the work."""
    return int(os.environ.get("LOCAL_RANK", "0")), max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def find_shards(
    data_dir: Path, token_dtype: str, *, data_uri: str | None = None, checksums: bool = True
) -> list[Shard]:
    """The ``*.bin`` shards under ``data_dir`` in path order. Each shard a ``shards.json`` lists must have its
    manifest's bytes, tokens and (``checksums``) SHA-256 (training/components/shard_manifest.py); errors name
    the shard by its S3 URI (``data_uri``, the directory's) where there is one."""
    itemsize = np.dtype(DTYPES[token_dtype]).itemsize
    name = namer(data_dir, data_uri)
    listed = read_manifests(Path(data_dir), name)
    check_listed(Path(data_dir), listed, itemsize, name)
    shards = []
    for path in sorted(Path(data_dir).rglob("*.bin")):
        size = path.stat().st_size
        if size % itemsize:
            raise DataError(f"{name(path)}: {size} bytes is not a whole number of {token_dtype} tokens")
        entry = listed.get(path.resolve(), (None, {}))[1]
        shards.append(Shard(path, size // itemsize, entry.get("max_token_id")))
    if not shards:
        where = data_uri or str(data_dir)
        raise FileNotFoundError(
            f"no *.bin token shards under {where}"
            + (f" (copied to {data_dir})" if data_uri else "")
            + "; tokenise text with python -m training.tools.tokenize_to_shards and upload its output there"
        )
    if checksums:
        rank, world_size = local_ranks()
        files = [(path, entry["sha256"], name(manifest, short=True)) for path, (manifest, entry) in listed.items()]
        verify_checksums(files, rank=rank, world_size=world_size, name=name)
    return shards


def check_vocabulary(shards: list[Shard], vocab_size: int) -> None:
    """Refuse a shard whose manifest says it holds ids outside the vocabulary."""
    for shard in shards:
        if shard.max_token_id is not None and shard.max_token_id >= vocab_size:
            raise DataError(_oov_message(shard.path, shard.max_token_id, vocab_size, "its manifest says"))


SCAN_CHUNK = 1 << 24  # tokens per vectorised max (64 MiB of uint32)
_scanned: set[tuple] = set()  # shards found clean in this process (the validation data opens them again)


def scan_vocabulary(
    shards: list[Shard], token_dtype: str, vocab_size: int, *, rank: int = 0, world_size: int = 1
) -> None:
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
    return (
        f"{path}: {where} token id {token}, outside the model's vocabulary of {vocab_size} ids "
        f"(0-{vocab_size - 1}); tokenise the data with the model's tokenizer, or fix model.vocab_size"
    )


class RankStream(IterableDataset):
    """This rank's items of an endless global stream: each micro-step the job takes the next
    ``micro_batch_size x world_size`` items and rank ``r`` every ``world_size``-th of them from offset ``r``;
    ``position`` counts the items the whole job has consumed. Subclasses set ``rank``, ``world_size``,
    ``micro_batch_size`` and ``position`` and implement ``_item(position)``."""

    rank: int
    world_size: int
    micro_batch_size: int
    position: int

    def _item(self, position: int):
        raise NotImplementedError

    def __iter__(self):
        step = self.micro_batch_size * self.world_size
        while True:
            for j in range(self.micro_batch_size):
                item = self._item(self.position + j * self.world_size + self.rank)
                if j == self.micro_batch_size - 1:
                    self.position += step  # the micro-step is done once its last item is handed out
                yield item


class GlobalStream(RankStream):
    """The endless, resumable order over ``windows`` items shared by the readers (see the module docstring):
    epoch ``e`` permutes the items with ``(seed, e)``; rank ``r`` takes every ``world_size``-th of each
    micro-step's ``micro_batch_size x world_size``. Subclasses call ``_start`` and implement ``_read(index)``."""

    def _start(
        self, total: int, *, rank: int, world_size: int, seed: int, micro_batch_size: int, holdout_every: int, what: str
    ) -> None:
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.micro_batch_size = micro_batch_size
        # With holdout_every = k, every k-th item (k-1, 2k-1, ...) is held out for validation.
        self.index = held_out_windows(total, holdout_every, held_out=False) if holdout_every else None
        self.windows = total if self.index is None else len(self.index)
        if self.windows < micro_batch_size * world_size:
            raise DataError(
                f"{self.windows} {what} are fewer than one micro-step of the job "
                f"({micro_batch_size} x {world_size} ranks)"
            )
        self.position = 0  # items of the global stream consumed by the whole job
        self._order: tuple[int, np.ndarray] | None = None

    def _read(self, index: int):
        raise NotImplementedError

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.windows))
        return self._order[1]

    def _item(self, position: int):
        epoch, offset = divmod(position, self.windows)
        index = int(self._epoch_order(epoch)[offset])
        if self.index is not None:
            index = int(self.index[index])
        return self._read(index)

    def state_dict(self) -> dict:
        return {"position": self.position, "windows": self.windows, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if "position" not in state:
            raise DataError("the checkpoint's data position is per rank (an older format); it cannot be resumed")
        if state.get("windows") != self.windows or state.get("seed", self.seed) != self.seed:
            raise DataError(
                f"the checkpoint was saved for {state.get('windows')} windows (seed {state.get('seed')}); "
                f"this data has {self.windows} windows (seed {self.seed}): the data changed, "
                "so its position does not carry over"
            )
        self.position = int(state["position"])


class PackedTokenWindows(GlobalStream):
    """An endless, resumable stream of ``[sequence_length + 1]`` int64 windows for one rank."""

    def __init__(
        self,
        data_dir: Path,
        token_dtype: str,
        sequence_length: int,
        *,
        rank: int,
        world_size: int,
        seed: int,
        holdout_every: int = 0,
        micro_batch_size: int = 1,
        vocab_size: int | None = None,
        data_uri: str | None = None,
    ):
        self.shards = find_shards(data_dir, token_dtype, data_uri=data_uri)
        if vocab_size is not None:
            check_vocabulary(self.shards, vocab_size)
            scan_vocabulary(self.shards, token_dtype, vocab_size, rank=rank, world_size=world_size)
        self.dtype = DTYPES[token_dtype]
        self.sequence_length = sequence_length
        self.vocab_size = vocab_size
        self.starts = window_starts(self.shards, sequence_length)
        self._maps: dict[int, np.memmap] = {}
        self._start(
            int(self.starts[-1]),
            rank=rank,
            world_size=world_size,
            seed=seed,
            micro_batch_size=micro_batch_size,
            holdout_every=holdout_every,
            what=f"windows of {sequence_length + 1} tokens in {data_dir}",
        )

    def _read(self, index: int) -> torch.Tensor:
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
        return torch.from_numpy(window.astype(np.int64))


class MixtureWindows(RankStream):
    """Windows from several sources (each a folder of shards under ``data_dir``), sampled by weight.

    The global stream's position ``q`` takes the source whose count lags its weight most (the largest
    ``w_s * (q + 1) - n_s``, the first source on a tie), so after any ``q`` windows each source has had
    ``w_s * q`` of them within one window, over the whole budget. Each source's own windows come in its own
    endless order (:class:`PackedTokenWindows`, seeded with ``(seed, source index)``), so a source smaller than
    its share repeats, epoch after epoch. Ranks take the global stream's items as :class:`GlobalStream` does; the
    saved state is the global position and the per-source counts there, the same on every rank."""

    def __init__(
        self,
        data_dir: Path,
        mixture: list,
        token_dtype: str,
        sequence_length: int,
        *,
        rank: int,
        world_size: int,
        seed: int,
        micro_batch_size: int = 1,
        vocab_size: int | None = None,
        data_uri: str | None = None,
    ):
        if not mixture:
            raise DataError("a mixture needs at least one source")
        self.names = [source.name for source in mixture]
        total = float(sum(source.weight for source in mixture))
        self.weights = np.array([source.weight / total for source in mixture])
        self.sources = []
        for index, name in enumerate(self.names):
            folder = Path(data_dir) / name
            if not folder.is_dir():
                raise DataError(f"{folder}: no shards of mixture source {name} (the prepared corpus names its sources)")
            self.sources.append(
                PackedTokenWindows(
                    folder,
                    token_dtype,
                    sequence_length,
                    rank=0,
                    world_size=1,
                    seed=seed * 1000 + index,
                    vocab_size=vocab_size,
                    data_uri=f"{data_uri.rstrip('/')}/{name}/" if data_uri else None,
                )
            )
        self.sequence_length = sequence_length
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.micro_batch_size = micro_batch_size
        self.position = 0
        self._at = 0  # the schedule's cursor: positions before it are counted in _counts
        self._counts = np.zeros(len(self.names), dtype=np.int64)

    def _advance(self, counts: np.ndarray, at: int, to: int) -> tuple[np.ndarray, int, int]:
        """The schedule from ``at`` up to and including ``to``: the counts after it and the source of ``to``."""
        source = -1
        while at <= to:
            source = int(np.argmax(self.weights * (at + 1) - counts))
            counts[source] += 1
            at += 1
        return counts, at, source

    def _item(self, position: int) -> torch.Tensor:
        if position < self._at:  # only a reload goes back: recount from the start
            self._counts[:], self._at = 0, 0
        self._counts, self._at, source = self._advance(self._counts, self._at, position)
        return self.sources[source]._item(int(self._counts[source]) - 1)

    def counts(self) -> dict[str, int]:
        """Windows of each source in the global stream before the current position (the whole job's)."""
        counts, at = self._counts.copy(), self._at
        if at > self.position:
            counts, at = np.zeros_like(counts), 0
        if at < self.position:
            counts, _, _ = self._advance(counts, at, self.position - 1)
        return dict(zip(self.names, (int(c) for c in counts)))

    def tokens_seen(self) -> dict[str, int]:
        """Tokens trained on from each source so far, the whole job's (labels: ``sequence_length`` a window)."""
        return {name: count * self.sequence_length for name, count in self.counts().items()}

    def state_dict(self) -> dict:
        return {
            "position": self.position,
            "seed": self.seed,
            "mixture": dict(zip(self.names, (float(w) for w in self.weights))),
            "windows": {name: source.windows for name, source in zip(self.names, self.sources)},
            "counts": self.counts(),
        }

    def load_state_dict(self, state: dict) -> None:
        mine = {
            "seed": self.seed,
            "mixture": dict(zip(self.names, (float(w) for w in self.weights))),
            "windows": {name: source.windows for name, source in zip(self.names, self.sources)},
        }
        for field, value in mine.items():
            if state.get(field) != value:
                raise DataError(
                    f"the checkpoint's data was saved for {field} {state.get(field)}; this run has {value}: "
                    "the mixture or its data changed, so its position does not carry over"
                )
        self.position = int(state["position"])
        self._counts = np.array([int(state["counts"][name]) for name in self.names], dtype=np.int64)
        self._at = self.position


def window_starts(shards: list[Shard], sequence_length: int) -> np.ndarray:
    """The index of each shard's first window (``sequence_length + 1`` tokens, every ``sequence_length``), then
    the count of all: windows never cross a shard boundary."""
    counts = [max(0, (s.tokens - 1) // sequence_length) for s in shards]
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def held_out_windows(windows: int, every: int, *, held_out: bool = True) -> np.ndarray:
    """The window indices held out for validation (every ``every``-th), or the others."""
    index = np.arange(windows, dtype=np.int64)
    mask = index % every == every - 1
    return index[mask if held_out else ~mask]


def validation_rows(total: int, holdout_every: int, *, rank: int, world_size: int, count: int) -> np.ndarray:
    """This rank's validation items of ``total``: the held-out ones with ``holdout_every`` (else all), in order,
    every ``world_size``-th from ``rank``, ``count`` at most."""
    index = held_out_windows(total, holdout_every) if holdout_every else np.arange(total, dtype=np.int64)
    return index[rank::world_size][:count]


def build_dataloader(
    data_dir: Path,
    token_dtype: str,
    sequence_length: int,
    micro_batch_size: int,
    *,
    rank: int,
    world_size: int,
    seed: int,
    num_workers: int = 0,
    pin_memory: bool = False,
    holdout_every: int = 0,
    vocab_size: int | None = None,
    data_uri: str | None = None,
    mixture: list | None = None,
) -> StatefulDataLoader:
    """Batches of ``[micro_batch_size, sequence_length + 1]`` token windows.

    ``num_workers`` may be 0 (read in the training process) or 1 (one background reader);
    the stream is one ordered sequence per rank, so more workers would duplicate it.
    ``mixture`` (``RunConfig.data.mixture``): sources sampled by weight (:class:`MixtureWindows`; their
    held-out documents are in the validation channel, so ``holdout_every`` must be 0).
    """
    if num_workers not in (0, 1):
        raise ValueError(f"num_workers must be 0 or 1 for the packed token stream, not {num_workers}")
    dataset: IterableDataset
    if mixture:
        if holdout_every:
            raise DataError("a mixture's validation documents are held out by the Prepare step, not by holdout_every")
        dataset = MixtureWindows(
            data_dir,
            mixture,
            token_dtype,
            sequence_length,
            rank=rank,
            world_size=world_size,
            seed=seed,
            micro_batch_size=micro_batch_size,
            vocab_size=vocab_size,
            data_uri=data_uri,
        )
    else:
        dataset = PackedTokenWindows(
            data_dir,
            token_dtype,
            sequence_length,
            rank=rank,
            world_size=world_size,
            seed=seed,
            holdout_every=holdout_every,
            micro_batch_size=micro_batch_size,
            vocab_size=vocab_size,
            data_uri=data_uri,
        )
    return _loader(dataset, micro_batch_size, num_workers=num_workers, pin_memory=pin_memory, seed=seed)


def _loader(
    dataset: IterableDataset, micro_batch_size: int, *, num_workers: int, pin_memory: bool, seed: int
) -> StatefulDataLoader:
    # A generator of its own: without one, every iter() draws a worker seed from the global RNG, which
    # then differs between a resumed run and an uninterrupted one (LoRA dropout draws from it).
    return StatefulDataLoader(
        dataset,
        batch_size=micro_batch_size,
        num_workers=num_workers,
        pin_memory=pin_memory,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )


def split_batch(batch: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    batch = batch.to(device, non_blocking=True)
    return batch[:, :-1], batch[:, 1:]


class SftSequences(GlobalStream):
    """An endless, resumable stream of packed SFT sequences for one rank (``training/sft_data.py``
    writes them), in the global order above. Each item is a dict of ``[sequence_length]`` int64 tensors:
    ``input_ids``, ``labels`` (-100 where no loss is taken) and ``position_ids`` (restarting per example).
    ``token_dtype`` None: as the manifest says; else the manifest must say the same."""

    def __init__(
        self,
        data_dir: Path,
        token_dtype: str | None,
        sequence_length: int,
        *,
        rank: int,
        world_size: int,
        seed: int,
        holdout_every: int = 0,
        micro_batch_size: int = 1,
        vocab_size: int | None = None,
        data_uri: str | None = None,
        checksums: bool = True,
        with_index: bool = False,
    ):
        self.data_dir = Path(data_dir)
        self.with_index = with_index
        self.manifest = read_sft_manifest(
            self.data_dir, token_dtype, sequence_length, vocab_size=vocab_size, data_uri=data_uri, checksums=checksums
        )
        self.dtype = DTYPES[self.manifest["token_dtype"]]
        self.sequence_length = sequence_length
        self.vocab_size = vocab_size
        counts = [entry["sequences"] for entry in self.manifest["shards"]]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._maps: dict[int, tuple[np.memmap, ...]] = {}  # tokens, mask, positions
        self._start(
            int(self.starts[-1]),
            rank=rank,
            world_size=world_size,
            seed=seed,
            micro_batch_size=micro_batch_size,
            holdout_every=holdout_every,
            what=f"packed sequences of {sequence_length + 1} tokens in {data_dir}",
        )

    def _read(self, index: int) -> dict[str, torch.Tensor]:
        shard = int(np.searchsorted(self.starts, index, side="right") - 1)
        if shard not in self._maps:
            base = self.data_dir / self.manifest["shards"][shard]["file"]
            self._maps[shard] = tuple(
                np.memmap(path, dtype=dtype, mode="r")
                for path, dtype in zip(sft_files(base), (self.dtype, np.uint8, self.dtype))
            )
        width = self.sequence_length + 1
        start = (index - int(self.starts[shard])) * width
        tokens, mask, pos = (np.asarray(m[start : start + width]).astype(np.int64) for m in self._maps[shard])
        if self.vocab_size is not None and int(tokens.max()) >= self.vocab_size:
            where = f"at token {start + int(np.argmax(tokens >= self.vocab_size))}:"
            raise DataError(
                _oov_message(
                    sft_files(self.data_dir / self.manifest["shards"][shard]["file"])[0],
                    int(tokens.max()),
                    self.vocab_size,
                    where,
                )
            )
        sample = sft_sample(tokens, mask, pos)
        if self.with_index:  # the row, for a DPO run's precomputed reference
            sample["index"] = torch.tensor(index)
        return sample


def sft_sample(tokens: np.ndarray, mask: np.ndarray, pos: np.ndarray) -> dict[str, torch.Tensor]:
    """The trainer's view of one packed sequence of ``N + 1`` tokens: inputs ``tokens[:-1]``, targets
    ``tokens[1:]`` where ``mask[1:]`` is 1 and no example starts (``pos[1:] != 0``), else -100."""
    valid = (mask[1:] == 1) & (pos[1:] != 0)
    labels = np.where(valid, tokens[1:], -100)
    return {
        "input_ids": torch.from_numpy(np.ascontiguousarray(tokens[:-1])),
        "labels": torch.from_numpy(labels.astype(np.int64)),
        "position_ids": torch.from_numpy(np.ascontiguousarray(pos[:-1])),
    }


def read_sft_manifest(
    data_dir: Path,
    token_dtype: str | None,
    sequence_length: int,
    *,
    vocab_size: int | None = None,
    data_uri: str | None = None,
    checksums: bool = True,
) -> dict:
    """The ``shards.json`` of a packed SFT directory, checked against what the run asks for; the
    shard files' sizes are checked too, and (``checksums``) their SHA-256 against the manifest's, the hashing
    split over the host's local ranks. Raises DataError naming the file (by S3 URI under ``data_uri``) and
    what to do."""
    data_dir = Path(data_dir)
    name = namer(data_dir, data_uri)
    path = data_dir / MANIFEST
    shown = name(path)
    prepare = "prepare the data with python -m training.sft_data (training/README.md)"
    if not path.is_file():
        nested = sorted(str(p.parent) for p in data_dir.rglob(MANIFEST)) if data_dir.is_dir() else []
        hint = (
            f"; manifests found in {', '.join(nested[:3])}: point the data at one of them" if nested else f"; {prepare}"
        )
        raise DataError(f"{name(data_dir)}: no {MANIFEST}, so no packed SFT shards{hint}")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as error:
        raise DataError(f"{shown}: not JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != SFT_KIND:
        kind = manifest.get("kind") if isinstance(manifest, dict) else None
        raise DataError(
            f"{shown}: kind is {kind!r}, not {SFT_KIND!r}: these are not packed SFT shards "
            f"(token shards for pretraining are read without sft); {prepare}"
        )
    if manifest.get("sequence_length") != sequence_length:
        raise DataError(
            f"{shown}: sequence_length is {manifest.get('sequence_length')}, but the run trains on "
            f"{sequence_length}; prepare the data again with --sequence-length {sequence_length}"
        )
    if manifest.get("token_dtype") not in DTYPES:
        raise DataError(f"{shown}: token_dtype is {manifest.get('token_dtype')!r}, not one of {', '.join(DTYPES)}")
    if token_dtype is not None and manifest["token_dtype"] != token_dtype:
        raise DataError(
            f"{shown}: token_dtype is {manifest['token_dtype']}, but the run reads {token_dtype} "
            f"(data.token_dtype): set data.token_dtype: {manifest['token_dtype']} in the recipe, or "
            f"prepare the data again with --dtype {token_dtype}"
        )
    token_dtype = manifest["token_dtype"]
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not shards:
        raise DataError(f"{shown}: lists no shards; {prepare}")
    width = sequence_length + 1
    files: list[tuple[Path, str, str]] = []
    for entry in shards:
        if not isinstance(entry, dict) or not isinstance(entry.get("sequences"), int) or "file" not in entry:
            raise DataError(f"{shown}: a shard entry without file and sequences: {entry!r}")
        sums = entry.get("sha256")
        if not isinstance(sums, dict):
            raise DataError(
                f"{shown}: {entry['file']} has no sha256 (packed by a version before checksums); {prepare} again"
            )
        for file, dtype in zip(sft_files(data_dir / entry["file"]), (token_dtype, "uint8", token_dtype)):
            expected = entry["sequences"] * width * np.dtype(DTYPES.get(dtype, dtype)).itemsize
            size = file.stat().st_size if file.is_file() else None
            if size != expected:
                found = "missing" if size is None else f"{size} bytes"
                raise DataError(
                    f"{name(file)}: {found}, expected {expected} bytes ({entry['sequences']} sequences of {width} "
                    f"{dtype}) as {shown} says; the upload is incomplete or the files are from another run"
                )
            if not isinstance(sums.get(file.name), str):
                raise DataError(f"{shown}: {entry['file']}: no sha256 for {file.name}; {prepare} again")
            files.append((file, sums[file.name], name(path, short=True)))
        if vocab_size is not None and entry.get("max_token", 0) >= vocab_size:
            raise DataError(
                _oov_message(Path(name(data_dir / entry["file"])), entry["max_token"], vocab_size, "its manifest says")
            )
    if checksums:
        rank, world_size = local_ranks()
        verify_checksums(files, rank=rank, world_size=world_size, name=name)
    return manifest


def build_sft_dataloader(
    data_dir: Path,
    token_dtype: str | None,
    sequence_length: int,
    micro_batch_size: int,
    *,
    rank: int,
    world_size: int,
    seed: int,
    num_workers: int = 0,
    pin_memory: bool = False,
    holdout_every: int = 0,
    vocab_size: int | None = None,
    data_uri: str | None = None,
    with_index: bool = False,
) -> StatefulDataLoader:
    """Batches of packed SFT sequences: dicts of ``[micro_batch_size, sequence_length]`` int64 tensors
    (``input_ids``, ``labels``, ``position_ids``, and with ``with_index`` each row's ``index``); the arguments are
    those of :func:`build_dataloader`."""
    if num_workers not in (0, 1):
        raise ValueError(f"num_workers must be 0 or 1 for the packed sequence stream, not {num_workers}")
    dataset = SftSequences(
        data_dir,
        token_dtype,
        sequence_length,
        rank=rank,
        world_size=world_size,
        seed=seed,
        holdout_every=holdout_every,
        micro_batch_size=micro_batch_size,
        vocab_size=vocab_size,
        data_uri=data_uri,
        with_index=with_index,
    )
    return _loader(dataset, micro_batch_size, num_workers=num_workers, pin_memory=pin_memory, seed=seed)


def sft_validation_batches(
    data_dir: Path,
    token_dtype: str | None,
    sequence_length: int,
    micro_batch_size: int,
    *,
    rank: int,
    world_size: int,
    count: int,
    holdout_every: int = 0,
    vocab_size: int | None = None,
    checksums: bool = True,
) -> list[dict[str, torch.Tensor]]:
    """This rank's fixed validation batches of packed SFT sequences, in the data's order: rank ``r``
    takes every ``world_size``-th sequence (of the held-out ones with ``holdout_every``), ``count`` in all."""
    data = SftSequences(
        data_dir, token_dtype, sequence_length, rank=0, world_size=1, seed=0, vocab_size=vocab_size, checksums=checksums
    )
    mine = validation_rows(int(data.starts[-1]), holdout_every, rank=rank, world_size=world_size, count=count)
    if len(mine) < micro_batch_size:
        raise DataError(
            f"no validation batch of {micro_batch_size} sequences for rank {rank} of {world_size} in {data_dir}"
        )
    samples = [data._read(int(i)) for i in mine]
    return [
        {key: torch.stack([s[key] for s in samples[i : i + micro_batch_size]]) for key in samples[0]}
        for i in range(0, len(samples) - micro_batch_size + 1, micro_batch_size)
    ]
