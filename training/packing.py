"""Packed SFT sequences in the trainer: labels from loss masks, and attention per example.

A packed sequence (``training/sft_data.py`` writes them) holds several examples one after the
other, ``N + 1`` tokens with a loss mask and each token's position within its example
(restarting at 0 where an example starts). A sample is the dict
``{"input_ids", "labels", "position_ids"}`` (:func:`sample`): a label is valid (not -100) where
the target token's mask is 1 and it does not start an example.

Document masking: the trainer passes ``position_ids`` to the Hugging Face model, and
transformers' mask creation (``masking_utils.create_causal_mask``) finds the packed examples
from them (``find_packed_sequence_indices``: a new example wherever the position does not go
up by one) and builds a causal mask that is block-diagonal over the examples; RoPE takes the
same positions, so each example sees positions ``0 .. len - 1`` as if it ran alone. With the
``sdpa`` attention the model uses, that mask is a boolean ``[batch, 1, N, N]`` tensor given to
``torch.nn.functional.scaled_dot_product_attention``: on GPUs it runs the memory-efficient
(or cuDNN) kernel, since the flash kernel takes no mask, and it computes every block of the
causal square (no skipping of masked blocks, N x N bytes of mask per sequence); on the CPU it
runs the CPU flash kernel with the mask. A sequence without packing (positions 0 .. N - 1)
gets no mask tensor and SDPA's ``is_causal``, as in pretraining.

Ring attention (context parallelism) has no document mask: ``RunConfig`` refuses
``context_parallel > 1`` with ``sft``, and :func:`check_attention` refuses it here too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .data import DTYPES, held_out_windows
from .loss import IGNORE_INDEX

MANIFEST = "shards.json"
KIND = "sft-packed"
# Attention implementations whose transformers mask honours packed position_ids
DOCUMENT_MASKED = ("sdpa", "eager", "flex_attention")


def sample(tokens, mask, positions) -> dict[str, torch.Tensor]:
    """One training sample from a packed sequence's ``N + 1`` tokens, loss mask and positions."""
    tokens, mask, positions = (torch.as_tensor(np.asarray(a, dtype=np.int64)) for a in (tokens, mask, positions))
    labels = tokens[1:].clone()
    labels[(mask[1:] == 0) | (positions[1:] == 0)] = IGNORE_INDEX
    return {"input_ids": tokens[:-1], "labels": labels, "position_ids": positions[:-1]}


def collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


def split_sft_batch(batch: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, ...]:
    """``(inputs, labels, positions)`` of a batch dict on ``device``, as the trainer's micro-batches are."""
    return tuple(batch[key].to(device, non_blocking=True) for key in ("input_ids", "labels", "position_ids"))


def check_attention(lm: torch.nn.Module, context_parallel: int) -> None:
    """Packed examples must not attend to each other: refuse attention without a document mask."""
    if context_parallel > 1:
        raise ValueError(f"context_parallel {context_parallel}: ring attention has no document mask for packed "
                         "SFT sequences; run fine-tuning with context_parallel 1")
    implementation = lm.config._attn_implementation
    if implementation not in DOCUMENT_MASKED:
        raise ValueError(f"attention {implementation!r} does not mask packed examples from each other "
                         f"(one of {', '.join(DOCUMENT_MASKED)} does)")


class PackedSequences:
    """The packed sequences of one directory, in order (validation reads a fixed set of them).

    rank ``r`` of ``world_size`` takes every ``world_size``-th sequence from ``r``, at most
    ``count``; with ``holdout_every``, only every ``holdout_every``-th sequence is read (the ones
    the training stream holds out).
    """

    def __init__(self, data_dir: Path, *, rank: int = 0, world_size: int = 1, count: int | None = None,
                 holdout_every: int = 0):
        data_dir = Path(data_dir)
        path = data_dir / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"no {MANIFEST} of packed SFT sequences in {data_dir}")
        manifest = json.loads(path.read_text())
        if manifest.get("kind") != KIND:
            raise ValueError(f"{path}: kind {manifest.get('kind')!r} is not {KIND!r} (packed SFT sequences)")
        self.length = int(manifest["sequence_length"]) + 1
        dtype = DTYPES[manifest["token_dtype"]]
        self.shards = []
        for entry in manifest["shards"]:
            stem = data_dir / Path(entry["file"]).stem
            arrays = [np.memmap(p, dtype=d, mode="r").reshape(-1, self.length) for p, d in (
                (stem.with_suffix(".bin"), dtype), (Path(f"{stem}.mask.bin"), np.uint8), (Path(f"{stem}.pos.bin"), dtype))]
            self.shards.append(arrays)
        counts = [len(arrays[0]) for arrays in self.shards]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        total = int(self.starts[-1])
        index = held_out_windows(total, holdout_every) if holdout_every else np.arange(total, dtype=np.int64)
        self.index = index[rank::world_size][:count]
        if len(self.index) == 0:
            raise ValueError(f"no packed sequences for rank {rank} of {world_size} in {data_dir}")

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        global_index = int(self.index[i])
        shard = int(np.searchsorted(self.starts, global_index, side="right") - 1)
        row = global_index - int(self.starts[shard])
        return sample(*(array[row] for array in self.shards[shard]))

    def batches(self, micro_batch_size: int):
        for i in range(0, len(self) - micro_batch_size + 1, micro_batch_size):
            yield collate([self[j] for j in range(i, i + micro_batch_size)])
