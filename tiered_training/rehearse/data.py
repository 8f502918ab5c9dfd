"""The rehearsal's training data: token shards in the trainer's format, put under the run's DataUri in the local S3.

A noisy bigram language (next token = (3 x previous + 7) mod 256, one token in ten random),
which a tiny model learns within a few steps, so the rehearsal's losses fall. The shards
have the recipe's token dtype and a ``shards.json`` manifest with each shard's tokens, bytes, SHA-256
and largest id, as
``training/tools/tokenize_to_shards.py`` writes them.

A fine-tuning recipe (``task: sft``) gets packed SFT shards of a tiny chat dataset instead
(:func:`put_sft_shards`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import subprocess
import sys
from array import array
from pathlib import Path
from typing import TypedDict

from tiered_training.rehearse.s3 import split_uri

VOCAB = 256


class ShardEntry(TypedDict):
    """One token file in a manifest."""

    file: str
    tokens: int
    bytes: int
    sha256: str
    max_token_id: int


def bigram_tokens(count: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    tokens = [1]
    for _ in range(count - 1):
        tokens.append(rng.randrange(VOCAB) if rng.random() < 0.1 else (3 * tokens[-1] + 7) % VOCAB)
    return tokens


def put_shards(client, uri: str, *, token_dtype: str, tokens: int = 200_000, shards: int = 2, seed: int = 0) -> dict:
    """Write ``shards`` token files and their manifest under ``uri``; returns the manifest."""
    bucket, prefix = split_uri(uri)
    prefix = prefix.rstrip("/")
    typecode = {"uint16": "H", "uint32": "I"}[token_dtype]
    stream = bigram_tokens(tokens, seed)
    size = len(stream) // shards
    entries: list[ShardEntry] = []
    for index in range(shards):
        chunk = stream[index * size : (index + 1) * size]
        data = array(typecode, chunk)
        if data.itemsize != {"H": 2, "I": 4}[typecode]:  # array's sizes are the platform's; ours are fixed
            raise RuntimeError(f"array({typecode!r}) is {data.itemsize} bytes here")
        if sys.byteorder == "big":
            data.byteswap()  # the shards are little-endian
        name = f"shard-{index:05d}.bin"
        body = data.tobytes()
        client.upload_fileobj(io.BytesIO(body), bucket, f"{prefix}/{name}" if prefix else name)
        entries.append(
            {
                "file": name,
                "tokens": len(chunk),
                "bytes": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
                "max_token_id": max(chunk),
            }
        )
    manifest = {
        "format": "flat little-endian token ids",
        "dtype": token_dtype,
        "tokenizer": "rehearsal bigram",
        "vocab_size": VOCAB,
        "tokens": sum(e["tokens"] for e in entries),
        "shards": entries,
    }
    client.put_object(
        Bucket=bucket,
        Key=f"{prefix}/shards.json" if prefix else "shards.json",
        Body=json.dumps(manifest, indent=1).encode(),
    )
    return manifest


def _run_tool(command: list[str], repo: Path, what: str) -> None:
    """Run a trainer tool (``python -m training.tools...``) in a subprocess from ``repo``; RehearsalError naming
    ``what`` and the tool's last line of errors when it fails."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    proc = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        from tiered_training.rehearse.errors import RehearsalError

        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RehearsalError(f"could not {what}: {tail}")


def _put_file(client, uri: str, local: Path, name: str | None = None) -> str:
    """Upload ``local`` under the prefix ``uri`` as ``name`` (default: its file name); returns its S3 URI."""
    bucket, prefix = split_uri(uri)
    key = f"{prefix.rstrip('/')}/{name or local.name}".lstrip("/")
    client.upload_file(str(local), bucket, key)
    return f"s3://{bucket}/{key}"


def put_sft_shards(
    client,
    uri: str,
    *,
    sequence_length: int,
    token_dtype: str,
    loss_on: str | None,
    overlong: str | None,
    workdir: Path,
    repo: Path,
    seed: int = 0,
) -> dict:
    """Packed SFT shards of a tiny chat dataset under ``uri``, as a user's data step writes them: the
    trainer's ``python -m training.tools.tiny_chat`` (a word-level tokenizer with a chat template, chat
    JSON Lines, then ``python -m training.sft_data``) in a subprocess, so that this process imports
    no torch or transformers. Returns the shards' manifest."""
    from tiered_training.rehearse.s3 import upload_dir

    out = Path(workdir) / f"sft-data-{seed}"
    # An overlong example is an error only where the recipe says so: the tiny chats fit 32 tokens when dropped.
    overlong = "drop" if overlong in (None, "error") else overlong
    command = [
        sys.executable,
        "-m",
        "training.tools.tiny_chat",
        str(out),
        "--sequence-length",
        str(sequence_length),
        "--dtype",
        token_dtype,
        "--loss-on",
        loss_on or "assistant",
        "--overlong",
        overlong,
        "--seed",
        str(seed),
    ]
    _run_tool(command, repo, "prepare the rehearsal's SFT data")
    train = out / "prepared" / "train"
    upload_dir(client, train, uri)
    return json.loads((train / "shards.json").read_text())


def put_raw_chat(client, uri: str, *, workdir: Path, repo: Path, seed: int = 0, examples: int = 64) -> dict:
    """Raw tool-calling chat examples (JSON Lines, OpenAI ``messages`` with ``tools``) under ``uri``, for a
    recipe whose Prepare step packs them, and a tokenizer whose chat template renders the tools: the trainer's
    ``python -m training.tools.tiny_chat --raw-tools`` in a subprocess. Returns ``{"examples", "tokenizer"}``
    (the tokenizer's local directory, which the rehearsal puts in the init checkpoint)."""
    out = Path(workdir) / f"raw-chat-{seed}"
    command = [
        sys.executable,
        "-m",
        "training.tools.tiny_chat",
        str(out),
        "--sequence-length",
        "1",
        "--raw-tools",
        "--examples",
        str(examples),
        "--seed",
        str(seed),
    ]
    _run_tool(command, repo, "write the rehearsal's raw chat examples")
    uploaded = _put_file(client, uri, out / "chat.jsonl")
    return {"examples": examples, "tokenizer": str(out / "tokenizer"), "uri": uploaded}


def put_raw_corpus(
    client, sources: list, tokenizer_uri: str, *, workdir: Path, repo: Path, seed: int = 0, documents: int = 48
) -> dict:
    """Raw pretraining sources (``data.sources``) under their prefixes, two files each in the source's format
    (Parquet through pyarrow, JSON Lines, JSON or text lines), documents of the tiny chat words in its field;
    and the tiny word-level tokenizer (``python -m training.tools.tiny_chat``) under ``tokenizer_uri``.
    Returns ``{"documents": {source: count}, "files": {source: [uri, ...]}, "tokenizer": dir}``."""
    out = Path(workdir) / f"raw-corpus-{seed}"
    chat = put_raw_chat_tokenizer(out, repo)
    for path in sorted((chat / "tokenizer").iterdir()):
        _put_file(client, tokenizer_uri, path)
    words = [
        w
        for w in json.loads((chat / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
        if not w.startswith("<")
    ]
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    files: dict[str, list[str]] = {}
    for source in sources:
        suffix = {"parquet": ".parquet", "json": ".json", "text_lines": ".txt"}.get(source.format, ".jsonl")
        counts[source.name], files[source.name] = 0, []
        for part in range(2):
            texts = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))) for _ in range(documents // 2)]
            local = out / source.name / f"part-{part}{suffix}"
            local.parent.mkdir(parents=True, exist_ok=True)
            _write_documents(local, source.format, source.field, texts)
            counts[source.name] += len(texts)
            files[source.name].append(_put_file(client, source.uri, local))
    return {"documents": counts, "files": files, "tokenizer": str(chat / "tokenizer")}


def _write_documents(path: Path, fmt: str, field: str, texts: list[str]) -> None:
    if fmt == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            from tiered_training.rehearse.errors import RehearsalError

            raise RehearsalError("a Parquet source needs pyarrow in the rehearsal's environment") from None
        pq.write_table(pa.table({field: texts}), path, row_group_size=max(1, len(texts) // 2))
    elif fmt == "json":
        path.write_text(json.dumps([{field: text} for text in texts]))
    elif fmt == "text_lines":
        path.write_text("".join(text + "\n" for text in texts))
    else:
        path.write_text("".join(json.dumps({field: text}) + "\n" for text in texts))


def put_raw_chat_tokenizer(out: Path, repo: Path) -> Path:
    """The tiny word-level tokenizer (and a small chat set) of ``python -m training.tools.tiny_chat`` in ``out``."""
    command = [sys.executable, "-m", "training.tools.tiny_chat", str(out), "--sequence-length", "1", "--raw-tools"]
    _run_tool(command, repo, "write the rehearsal's tokenizer")
    return out


def put_pairs(
    client, uri: str, *, workdir: Path, repo: Path, seed: int = 0, pairs: int = 64, sequence_length: int | None = None,
    token_dtype: str | None = None,
) -> dict:
    """Preference pairs for a DPO recipe (``python -m training.tools.tiny_pairs`` in a subprocess): raw JSON Lines
    under ``uri`` for the Prepare step to pack, or with ``sequence_length`` the packed pairs. Returns
    ``{"pairs", "tokenizer"}`` (raw) or the packed shards' manifest (with ``tokenizer``)."""
    out = Path(workdir) / f"pairs-{seed}"
    command = [sys.executable, "-m", "training.tools.tiny_pairs", str(out), "--pairs", str(pairs), "--seed", str(seed)]
    if sequence_length is not None:
        command += ["--sequence-length", str(sequence_length)] + (["--dtype", token_dtype] if token_dtype else [])
    _run_tool(command, repo, "write the rehearsal's preference pairs")
    if sequence_length is not None:
        from tiered_training.rehearse.s3 import upload_dir

        train = out / "prepared" / "train"
        upload_dir(client, train, uri)
        return {**json.loads((train / "shards.json").read_text()), "tokenizer": str(out / "tokenizer")}
    return {"pairs": pairs, "tokenizer": str(out / "tokenizer"), "uri": _put_file(client, uri, out / "pairs.jsonl")}


DATA_WINDOW = 1024  # rehearse --data: the sequence length, room for a real chat template's prompt
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def user_tokenizer(given: Path | None, hf_id: str | None) -> Path:
    """``rehearse --data``: the local directory of the tokenizer and chat template the examples are prepared with:
    ``given`` (``--tokenizer``), else the recipe's ``model.hf_id`` from the local Hugging Face cache (the
    rehearsal stays offline)."""
    from tiered_training.rehearse.errors import RehearsalError

    if given is not None:
        if not (Path(given) / "tokenizer.json").is_file():
            raise RehearsalError(
                f"--tokenizer {given}: no tokenizer.json there; give the local directory of the checkpoint's "
                "Hugging Face tokenizer (tokenizer.json, tokenizer_config.json and its chat template)"
            )
        return Path(given)
    if not hf_id:
        raise RehearsalError(
            "--data: the recipe names no tokenizer (model.hf_id); give the checkpoint's local directory with "
            "--tokenizer DIR"
        )
    try:
        from huggingface_hub import snapshot_download

        found = Path(snapshot_download(hf_id, local_files_only=True, allow_patterns=list(TOKENIZER_FILES)))
    except Exception:  # noqa: BLE001 (not cached, or no huggingface_hub: the same advice)
        found = None
    if found is None or not (found / "tokenizer.json").is_file():
        raise RehearsalError(
            f"--data: the recipe's tokenizer {hf_id} (model.hf_id) is not in the local Hugging Face cache, and the "
            "rehearsal does not download: give its local directory with --tokenizer DIR (e.g. after "
            f"`hf download {hf_id} tokenizer.json tokenizer_config.json`)"
        )
    return found


def tokenizer_vocab(directory: Path) -> int:
    """The vocabulary size of a ``tokenizer.json`` (its largest id + 1, added tokens included)."""
    table = json.loads((Path(directory) / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = (table.get("model") or {}).get("vocab") or {}
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    ids += [token["id"] for token in table.get("added_tokens", [])]
    return max(ids) + 1


def data_files(path: Path) -> list[Path]:
    """``rehearse --data``: the file, or every file under the folder (hidden ones left out)."""
    from tiered_training.rehearse.errors import RehearsalError

    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(
            p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.parts)
        )
        if files:
            return files
        raise RehearsalError(f"--data {path}: an empty folder; give a file or a folder of your raw examples")
    raise RehearsalError(f"--data {path}: no such file or folder")


def put_user_data(client, uri: str, path: Path) -> dict:
    """The user's raw examples (a file, or a folder's files at their relative paths) under ``uri``."""
    path = Path(path)
    files = data_files(path)
    size = 0
    for file in files:
        _put_file(client, uri, file, file.name if path.is_file() else str(file.relative_to(path)))
        size += file.stat().st_size
    return {"files": len(files), "bytes": size, "uri": uri}
