"""Tokenise text files into the trainer's token shards (see training/README.md for the format).

    python -m training.tools.tokenize_to_shards --tokenizer /path/to/hf-tokenizer --out shards/ corpus/*.txt
    python -m training.tools.tokenize_to_shards --byte-level --out shards/ notes.txt

Each input file is one document (``--lines``: each non-empty line is one). Every document
is followed by the end-of-text token. Tokens are written as flat little-endian uint16
(vocabularies up to 65,536) or uint32 files of at most ``--tokens-per-shard`` tokens,
named ``shard-00000.bin``, ``shard-00001.bin``, ... plus a ``shards.json`` manifest that
lists each shard's token count, bytes, SHA-256 and largest token id (the trainer refuses a shard whose
size, checksum or largest id does not fit before it trains a step; training/components/shard_manifest.py).
``--add-checksums DIR`` adds ``bytes`` and ``sha256`` to a manifest written before they existed.
The tokenizer is loaded from a local directory with ``transformers.AutoTokenizer``: nothing is
downloaded. ``--byte-level`` needs no tokenizer: token = byte value (0-255), end-of-text = 256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from training.components.shard_manifest import file_sha256

BYTE_EOT = 256


class ByteTokenizer:
    """The fallback: one token per UTF-8 byte, plus an end-of-text token."""

    vocab_size = BYTE_EOT + 1
    eos_token_id = BYTE_EOT
    name = "byte-level"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class HFTokenizer:
    def __init__(self, path: str):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        if self.tok.eos_token_id is None:
            raise ValueError(f"the tokenizer in {path} has no eos_token; it is needed between documents")
        self.vocab_size = len(self.tok)
        self.eos_token_id = self.tok.eos_token_id
        self.name = str(path)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)


def documents(files: Iterable[Path], *, lines: bool) -> Iterator[str]:
    for path in files:
        text = Path(path).read_text(encoding="utf-8")
        if lines:
            yield from (line for line in text.splitlines() if line.strip())
        else:
            yield text


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


def write_shards(
    docs: Iterable[str],
    tokenizer,
    out_dir: Path,
    *,
    tokens_per_shard: int = 100_000_000,
    dtype: str | None = None,
    source: str = "text",
) -> dict:
    """Tokenise ``docs`` into ``out_dir``; returns the manifest. Each shard entry has the fields the Prepare step
    writes (``training.corpus_prepare``): file, tokens, bytes, sha256, max_token_id, source."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = dtype or token_dtype(tokenizer.vocab_size)
    if np.iinfo(dtype).max < tokenizer.vocab_size - 1:
        raise ValueError(f"{dtype} cannot hold token ids up to {tokenizer.vocab_size - 1}")
    buffer: list[int] = []
    shards: list[dict] = []
    total_docs = 0

    def flush(final: bool) -> None:
        while len(buffer) >= tokens_per_shard or (final and buffer):
            chunk = buffer[:tokens_per_shard]
            del buffer[: len(chunk)]
            name = f"shard-{len(shards):05d}.bin"
            data = np.asarray(chunk, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
            (out_dir / name).write_bytes(data)
            shards.append(
                {
                    "file": name,
                    "tokens": len(chunk),
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "max_token_id": int(max(chunk)),
                    "source": source,
                }
            )

    for doc in docs:
        buffer.extend(tokenizer.encode(doc))
        buffer.append(tokenizer.eos_token_id)
        total_docs += 1
        flush(final=False)
    flush(final=True)
    manifest = {
        "format": "flat little-endian token ids, documents separated by the end-of-text token",
        "dtype": dtype,
        "tokenizer": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "eos_token_id": tokenizer.eos_token_id,
        "documents": total_docs,
        "tokens": sum(s["tokens"] for s in shards),
        "shards": shards,
    }
    (out_dir / "shards.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def add_checksums(data_dir: Path) -> int:
    """Add ``bytes`` and ``sha256`` to each entry of ``data_dir/shards.json`` that lacks them (the file's
    token count must agree with the entry's); returns how many entries changed."""
    path = Path(data_dir) / "shards.json"
    manifest = json.loads(path.read_text())
    itemsize = np.dtype(manifest["dtype"]).itemsize
    changed = 0
    for entry in manifest["shards"]:
        shard = path.parent / entry["file"]
        size = shard.stat().st_size
        if size != entry["tokens"] * itemsize:
            raise ValueError(f"{shard}: {size} bytes, but {path} says {entry['tokens']} {manifest['dtype']} tokens")
        if "sha256" not in entry:
            entry["bytes"], entry["sha256"] = size, file_sha256(shard)
            changed += 1
    path.write_text(json.dumps(manifest, indent=1))
    return changed


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--add-checksums"]:
        if len(argv) != 2:
            print("usage: python -m training.tools.tokenize_to_shards --add-checksums DIR", file=sys.stderr)
            return 2
        try:
            changed = add_checksums(Path(argv[1]))
        except (OSError, ValueError, KeyError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"{Path(argv[1]) / 'shards.json'}: checksums added to {changed} shard(s)")
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m training.tools.tokenize_to_shards", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("inputs", nargs="+", type=Path, help="UTF-8 text files")
    parser.add_argument("--out", required=True, type=Path, help="output directory for shard-*.bin")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tokenizer", help="local directory of a Hugging Face tokenizer")
    source.add_argument("--byte-level", action="store_true", help="one token per byte (vocab 257)")
    parser.add_argument("--lines", action="store_true", help="each non-empty line is a document")
    parser.add_argument("--tokens-per-shard", type=int, default=100_000_000)
    parser.add_argument("--dtype", choices=["uint16", "uint32"], help="default: uint16 if the vocabulary fits")
    args = parser.parse_args(argv)
    tokenizer = ByteTokenizer() if args.byte_level else HFTokenizer(args.tokenizer)
    manifest = write_shards(
        documents(args.inputs, lines=args.lines),
        tokenizer,
        args.out,
        tokens_per_shard=args.tokens_per_shard,
        dtype=args.dtype,
    )
    print(
        f"{manifest['tokens']:,} tokens from {manifest['documents']:,} documents in {len(manifest['shards'])} "
        f"{manifest['dtype']} shards under {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
