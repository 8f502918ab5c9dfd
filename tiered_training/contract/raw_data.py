"""The raw fine-tuning examples the Prepare step reads (training/sft_prepare.py) and preflight checks: which
objects under ``data.uri`` are inputs, and which ``data.ignore`` leaves out. Everything else is refused."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

JSON_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")  # JSON Lines or a JSON array, gzipped or not
INPUT_SUFFIXES = (*JSON_SUFFIXES, ".parquet")
SAVED_MARKER = "state.json"  # a Dataset.save_to_disk directory: every object under the prefix is its


def ignored(relative: str, globs: Iterable[str]) -> bool:
    """Whether a glob of ``data.ignore`` matches the object's key under the data prefix or its file name."""
    name = relative.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(relative, g) or fnmatch.fnmatchcase(name, g) for g in globs)


def sort_raw(relatives: Iterable[str], globs: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """``(inputs, ignored, refused)`` of the keys under a raw data prefix (not a save_to_disk directory)."""
    globs = list(globs)
    inputs, left_out, refused = [], [], []
    for relative in relatives:
        if relative.endswith(INPUT_SUFFIXES):
            inputs.append(relative)
        elif ignored(relative, globs):
            left_out.append(relative)
        else:
            refused.append(relative)
    return inputs, left_out, refused
