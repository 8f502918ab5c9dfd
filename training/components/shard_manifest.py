"""The token shards' manifest (``shards.json``) and the checks of the files against it. No torch.

``shards.json`` (``training.tools.tokenize_to_shards`` and the corpus Prepare write it) has top-level
``format``, ``dtype``, ``tokenizer``, ``vocab_size``, ``eos_token_id``, ``documents``, ``tokens`` and
``shards``: one entry per shard with ``file`` (relative to the manifest), ``tokens``, ``bytes``,
``sha256`` (hex of the file's bytes), ``max_token_id`` and optionally ``source`` (a mixture source's
name). A listed file must exist with that many tokens and bytes and that SHA-256; the hashing is split
over a host's local ranks and remembered per (path, size, mtime) in the process, as the vocabulary scan
is. An entry without ``sha256`` (a manifest written before checksums) is refused with the command that
adds them (``tokenize_to_shards --add-checksums DIR``). ``*.bin`` files that no manifest lists are read
as they are (hand-made data): nothing proves their content, and the run's fingerprint has their sizes only.

Errors name the object by its S3 URI when the data came from one (``where``), else by its path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MANIFEST = "shards.json"
SFT_KIND = "sft-packed"  # training/sft_data.py's packed shards: a manifest of another format
HASH_BLOCK = 8 << 20
ADD_CHECKSUMS = "python -m training.tools.tokenize_to_shards --add-checksums"

_hashes: dict[tuple[str, int, int], str] = {}  # (resolved path, size, mtime_ns) -> sha256 hex


class DataError(ValueError):
    """Data the run cannot use; the message names the shard or manifest (by S3 URI where there is one)."""


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of ``path``'s bytes, remembered per (path, size, mtime) in this process."""
    stat = Path(path).stat()
    key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _hashes:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(HASH_BLOCK), b""):
                digest.update(block)
        _hashes[key] = digest.hexdigest()
    return _hashes[key]


class Namer:
    """How an error names a file under ``data_dir``: the S3 URI it was copied from (``data_uri`` is the
    directory's) with the local path (``short``: the URI alone), or the path."""

    def __init__(self, data_dir: Path, data_uri: str | None = None):
        self.root, self.data_uri = Path(data_dir).resolve(), data_uri

    def __call__(self, path: Path, short: bool = False) -> str:
        if not self.data_uri:
            return str(path)
        try:
            relative = Path(path).resolve().relative_to(self.root).as_posix()
        except ValueError:
            return str(path)
        uri = self.data_uri.rstrip("/") + ("/" + relative if relative != "." else "/")
        return uri if short else f"{uri} (local copy {path})"


def namer(data_dir: Path, data_uri: str | None) -> Namer:
    return Namer(data_dir, data_uri)


def read_manifests(data_dir: Path, name: Namer | None = None) -> dict[Path, tuple[Path, dict]]:
    """Every token-shard entry of every ``shards.json`` under ``data_dir``, by the shard's resolved path:
    ``(the manifest, the entry)``. A manifest that is not JSON, or of packed SFT shards, is refused."""
    name = name or Namer(data_dir)
    entries: dict[Path, tuple[Path, dict]] = {}
    for manifest in sorted(Path(data_dir).rglob(MANIFEST)):
        try:
            content = json.loads(manifest.read_text())
        except (ValueError, OSError) as error:
            raise DataError(f"{name(manifest)}: not a readable JSON manifest ({error})") from None
        if not isinstance(content, dict):
            raise DataError(f"{name(manifest)}: a JSON {type(content).__name__}, not a manifest object")
        if content.get("kind") == SFT_KIND:
            raise DataError(
                f"{name(manifest)}: packed SFT shards (with loss masks), not flat token shards: fine-tune on "
                "them (sft), or tokenise text for pretraining with training.tools.tokenize_to_shards"
            )
        for entry in content.get("shards") or []:
            if isinstance(entry, dict) and isinstance(entry.get("file"), str):
                entries[(manifest.parent / entry["file"]).resolve()] = (manifest, entry)
    return entries


def check_listed(
    data_dir: Path, entries: dict[Path, tuple[Path, dict]], itemsize: int, name: Namer | None = None
) -> None:
    """Every listed shard exists with the manifest's bytes and tokens, and the entry has a checksum."""
    name = name or Namer(data_dir)
    for path, (manifest, entry) in sorted(entries.items()):
        shown = name(manifest.parent / entry["file"])
        if not path.is_file():
            raise DataError(
                f"{shown}: missing; {name(manifest, short=True)} lists it: the shard was deleted or the upload "
                "is incomplete"
            )
        size = path.stat().st_size
        tokens = entry.get("tokens")
        expected = entry.get("bytes", tokens * itemsize if isinstance(tokens, int) else None)
        if expected is not None and size != expected:
            raise DataError(
                f"{shown}: {size:,} bytes, but {name(manifest, short=True)} says {expected:,}"
                + (f" ({tokens:,} tokens)" if isinstance(tokens, int) else "")
                + ": the shard was cut short or changed; restore it from its source, or tokenise again"
            )
        if isinstance(tokens, int) and size != tokens * itemsize:
            raise DataError(
                f"{shown}: {size // itemsize:,} tokens of {itemsize} bytes, but {name(manifest, short=True)} says "
                f"{tokens:,}: "
                "the manifest is of another token type, or the shard was changed"
            )
        if not isinstance(entry.get("sha256"), str):
            raise DataError(
                f"{name(manifest)}: {entry['file']} has no sha256 (a manifest written before checksums); "
                f"add them with {ADD_CHECKSUMS} {manifest.parent} (or tokenise again), then upload the manifest"
            )


def verify_checksums(
    files: Iterable[tuple[Path, str, str]], *, rank: int = 0, world_size: int = 1, name: Namer | None = None
) -> None:
    """Refuse a file whose SHA-256 is not the one its manifest gives. ``files``: (path, sha256 hex, the
    manifest's name); rank ``r`` of a host's ``world_size`` local ranks hashes every ``world_size``-th file."""
    name = name or Namer(Path("/"))
    for path, expected, manifest in sorted(files)[rank::world_size]:
        found = file_sha256(path)
        if found != expected:
            raise DataError(
                f"{name(path)}: its SHA-256 is {found[:16]}..., but {manifest} says {expected[:16]}...: the content "
                "changed after the manifest was written (same size); restore the shard, or prepare the data again"
            )


def listing(data_dir: Path | None) -> dict[str, list[Any]]:
    """The data's files for a run's identity: ``{relative path: [bytes, sha256 or None]}`` for every token
    shard and ``shards.json`` (the checksums are the manifests' own; a manifest's is of its bytes).
    Nothing is hashed but the manifests: the trainer proves the shards equal them when it opens them."""
    if data_dir is None or not Path(data_dir).is_dir():
        return {}
    root = Path(data_dir)
    checksums: dict[Path, str] = {}
    for manifest in sorted(root.rglob(MANIFEST)):
        try:
            content = json.loads(manifest.read_text())
        except (ValueError, OSError):
            continue
        for entry in (content.get("shards") or []) if isinstance(content, dict) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
                continue
            sums = entry.get("sha256")  # a token shard's hex; a packed SFT shard's {file name: hex}
            named = {entry["file"]: sums} if isinstance(sums, str) else sums if isinstance(sums, dict) else {}
            for file, sha in named.items():
                if isinstance(file, str) and isinstance(sha, str):
                    checksums[(manifest.parent / entry["file"]).parent.resolve() / Path(file).name] = sha
    found: dict[str, list[Any]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and (p.suffix == ".bin" or p.name == MANIFEST)):
        sha = hashlib.sha256(path.read_bytes()).hexdigest() if path.name == MANIFEST else checksums.get(path.resolve())
        found[path.relative_to(root).as_posix()] = [path.stat().st_size, sha]
    return found
