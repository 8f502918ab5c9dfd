"""The pretraining corpus: raw sources mixed by weight, tokenized by the Prepare step, read by the trainer.

One contract, three readers:

- the recipe and the planner build a :class:`CorpusSpec` (which sources, their weights, the budget);
- the Prepare step (``python -m training.corpus_prepare --spec JSON ...``, a SageMaker Processing job on
  ``InstanceCount`` hosts) reads it, tokenizes each source's units and writes the layout below;
- the trainer reads the mixture (:class:`MixtureSource` in ``RunConfig.data.mixture``) and the prepared layout.

Prepared layout under ``<prepared prefix><key>/`` (``key``: a content hash of the inputs' listing, the tokenizer,
the settings and the preparing code's version :data:`CORPUS_KEY_VERSION`):

- ``train/<source>/<unit>.bin`` and ``validation/<source>/<unit>.bin``: flat little-endian token ids, documents
  separated by the end-of-text token (the trainer's shard format, training/components/data.py);
- ``units/<source>/<unit>.json``: the done-marker of one unit (a file, or a Parquet row group), written after its
  shards, naming them with their token count, byte size and SHA-256; a rerun skips units whose marker is there
  and whose shards still match it;
- ``train/<source>/shards.json`` and ``validation/<source>/shards.json``: the source's shards (entries with
  ``file``, ``tokens``, ``bytes``, ``sha256``, ``max_token_id``, ``source``), written when every unit is done;
- ``manifest.json`` (:data:`CORPUS_MANIFEST`): per source its documents, tokens, bad records and shards; written
  last, by the first host, after every host has finished, so a key with it reads as complete.

The property file of the step (``prepared.json``) names ``{"key", "uri", "validation_uri", "reused"}``.
"""

import fnmatch
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

CORPUS_MANIFEST = "manifest.json"
CORPUS_KEY_VERSION = "corpus-prepare/1"  # bump when the prepared bytes for the same inputs would change
SOURCE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,39}$"
CorpusFormat = Literal["auto", "parquet", "jsonl", "json", "text", "text_lines", "saved_dataset"]

# Which raw files a source's format takes, for the Prepare step's readers (training/corpus_readers.py) and for
# preflight's sample (tiered_training/aws/sources.py): one rule, so preflight passes exactly what Prepare reads.
COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
SAVED_DATASET_MARKER = "state.json"  # the file Dataset.save_to_disk writes in its folder
JSON_OR_JSONL = "json-or-jsonl"  # a .json file under format auto: a JSON array if its first character is "["


def compression(name: str) -> str | None:
    """The codec of a compressed file (``a.jsonl.gz``: gzip), or None."""
    return COMPRESSION.get(PurePosixPath(name).suffix.lower())


def plain_suffix(name: str) -> str:
    """The suffix under any compression suffix: ``a.jsonl.gz`` -> ``.jsonl``."""
    path = PurePosixPath(name.lower())
    if path.suffix in COMPRESSION:
        path = path.with_suffix("")
    return path.suffix


def ignored(relative: str, globs: list[str]) -> bool:
    """Whether one of ``data.ignore``'s globs matches the file's path under its source, or its name."""
    name = PurePosixPath(relative).name
    return any(fnmatch.fnmatch(relative, glob) or fnmatch.fnmatch(name, glob) for glob in globs)


def saved_dataset_roots(relatives: list[str]) -> list[str]:
    """The folders (under the source) that hold a saved dataset, sorted; ``.`` for the source's own folder."""
    return sorted(
        {str(PurePosixPath(r).parent) for r in relatives if PurePosixPath(r).name == SAVED_DATASET_MARKER}
    )


def file_format(chosen: str, relative: str) -> str | None:
    """The reader a file outside any saved dataset gets under the source's ``format``: parquet, jsonl, json, text,
    text_lines, :data:`JSON_OR_JSONL` (its first character decides), or None (no reader takes it)."""
    suffix = plain_suffix(relative)
    if chosen in ("text", "text_lines"):
        return None if suffix == ".parquet" else chosen
    if suffix == ".parquet":
        return "parquet" if chosen in ("auto", "parquet") and not compression(relative) else None
    if suffix in JSONL_SUFFIXES:
        return "jsonl" if chosen in ("auto", "jsonl") else None
    if suffix == ".json":
        if chosen in ("jsonl", "json"):
            return chosen
        return JSON_OR_JSONL if chosen == "auto" else None
    if suffix in TEXT_SUFFIXES and chosen == "auto":
        return "text"
    return None


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class CorpusSource(_Frozen):
    """One raw source: an S3 prefix of files of one format, and its share of the token budget."""

    name: str = Field(pattern=SOURCE_NAME_PATTERN, description="names the source in shards, metrics and messages")
    uri: str = Field(description="S3 prefix of the raw files (gzip or zstd compressed files are read as such)")
    format: CorpusFormat = Field(
        default="auto",
        description=(
            "parquet (a column), jsonl / json (a field), text (a file per document), text_lines (a line per "
            "document), saved_dataset (datasets' save_to_disk), or auto (by each file's suffix)"
        ),
    )
    field: str = Field(default="text", min_length=1, description="the column or field that holds the text")
    weight: float | None = Field(default=None, gt=0, description="the source's share of the budget, relative")
    tokens: int | None = Field(default=None, gt=0, description="or the tokens to train on from this source")
    max_epochs: float = Field(default=4.0, gt=0, description="the most times the budget may repeat the source")

    @model_validator(mode="after")
    def _one_share(self) -> "CorpusSource":
        if (self.weight is None) == (self.tokens is None):
            raise ValueError(f"source {self.name}: give exactly one of weight or tokens")
        return self


class CorpusSpec(_Frozen):
    """What the Prepare step makes: every source tokenized once, with a held-out share per source."""

    sources: list[CorpusSource] = Field(min_length=1, max_length=32)
    tokenizer: str = Field(description="S3 URI (or local directory in rehearsal) of the tokenizer's files")
    token_dtype: Literal["uint16", "uint32"] = "uint32"
    validation_fraction: float = Field(
        default=0.001, ge=0, le=0.5, description="the share of each source's documents held out for validation"
    )
    on_bad_example: Literal["error", "skip"] = "error"
    max_bad_fraction: float = Field(default=0.0, ge=0, le=1, description="per source, with on_bad_example skip")
    ignore: list[str] = Field(default=[], description="globs of raw files to leave out on purpose")
    seed: int = 1234
    total_tokens: int = Field(gt=0, description="the run's token budget, which the weights share out")

    @model_validator(mode="after")
    def _unique_names(self) -> "CorpusSpec":
        names = [source.name for source in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names repeat: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
        return self


class MixtureSource(_Frozen):
    """The trainer's view of one source: where its shards are (a folder of the data channel) and its weight
    over the whole budget (normalised over the sources)."""

    name: str = Field(pattern=SOURCE_NAME_PATTERN)
    weight: float = Field(gt=0)
