"""The pipeline's Prepare step: raw SFT examples in S3 to packed shards in S3, keyed by their content.

    python -m training.sft_prepare --input s3://bucket/raw/ --tokenizer s3://bucket/checkpoint/ \\
        --prepared s3://store/recipe/output/prepared/ --property-file OUT/prepared.json \\
        --sequence-length 8192 [the settings of python -m training.sft_data]

The key is the SHA-256 of the inputs (each object's key, ETag and size under ``--input``), the
tokenizer and its chat template (:meth:`SftTokenizer.fingerprint_material`) and the settings. When
``<prepared><key>/manifest.json`` exists, the shards under ``<prepared><key>/train/`` are reused
("reusing prepared data <key>") and nothing is downloaded. Otherwise the inputs are downloaded and
packed by :func:`training.sft_data.prepare` (the code of the local command), the shards uploaded,
and ``manifest.json`` written last, so a job that stops halfway leaves no key that reads as done.
Either way the property file names the shards: ``{"key": ..., "uri": ..., "reused": ...}``.

The inputs under ``--input``: JSON Lines, JSON, Parquet files (every object with one of those
suffixes, in key order), or one ``Dataset.save_to_disk`` directory (a ``state.json`` at the top).
Only the tokenizer files of ``--tokenizer`` are read (every top-level object but the weights).
Bad input exits 2 with one line, as the local command does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from training.sft_data import Settings, SftTokenizer, prepare
from training.sft_formats import FORMATS, BadData

KEY_VERSION = "sft-prepare/1"
INPUT_SUFFIXES = (".jsonl", ".json", ".parquet")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
DONE = "manifest.json"  # written last under the key's prefix


def split_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise BadData(f"{uri}: not an s3:// URI", "input")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    return bucket, prefix


def as_prefix(uri: str) -> str:
    return uri if uri.endswith("/") else uri + "/"


def list_objects(client, uri: str) -> list[dict]:
    """Every object under ``uri`` (a prefix): ``{"key", "relative", "etag", "size"}``, in key order."""
    bucket, prefix = split_uri(as_prefix(uri))
    found = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if item["Key"].endswith("/"):
                continue
            found.append(
                {
                    "key": item["Key"],
                    "relative": item["Key"][len(prefix) :],
                    "etag": item["ETag"].strip('"'),
                    "size": item["Size"],
                }
            )
    return sorted(found, key=lambda o: o["key"])


def input_objects(client, uri: str) -> tuple[list[dict], bool]:
    """The objects that are the inputs, and whether they are one ``save_to_disk`` directory."""
    objects = list_objects(client, uri)
    if any(o["relative"] == "state.json" for o in objects):
        return objects, True
    chosen = [o for o in objects if o["relative"].endswith(INPUT_SUFFIXES)]
    if not chosen:
        raise BadData(
            f"{uri}: no .jsonl, .json or .parquet objects and no Dataset.save_to_disk directory (state.json) "
            f"under it ({len(objects)} other objects)",
            "input",
        )
    return chosen, False


def settings_material(settings: Settings) -> dict:
    return {
        "sequence_length": settings.sequence_length,
        "loss_on": settings.loss_on,
        "overlong": settings.overlong,
        "format": settings.format,
        "on_bad_example": settings.on_bad_example,
        "max_bad_fraction": settings.max_bad_fraction,
        "dtype": settings.dtype,
    }


def content_key(inputs: list[dict], tokenizer: SftTokenizer, settings: Settings) -> str:
    """The inputs' keys, ETags and sizes, the tokenizer with its chat template, and the settings."""
    digest = hashlib.sha256(KEY_VERSION.encode())
    listing = [[o["relative"], o["etag"], o["size"]] for o in inputs]
    digest.update(json.dumps({"inputs": listing, "settings": settings_material(settings)}, sort_keys=True).encode())
    digest.update(b"\0" + tokenizer.fingerprint_material())
    return digest.hexdigest()[:32]


def download(client, objects: list[dict], bucket: str, target: Path) -> None:
    for o in objects:
        path = target / o["relative"]
        path.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, o["key"], str(path))


def exists(client, uri: str) -> bool:
    bucket, key = split_uri(uri)
    from botocore.exceptions import ClientError

    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def run(args: argparse.Namespace, settings: Settings, client, work: Path, log=print) -> dict:
    """Reuse or prepare; returns what the property file says."""
    tokenizer_objects = [
        o
        for o in list_objects(client, args.tokenizer)
        if "/" not in o["relative"] and not o["relative"].endswith(WEIGHT_SUFFIXES)
    ]
    if not tokenizer_objects:
        raise BadData(f"{args.tokenizer}: no objects; --tokenizer is the S3 prefix of a Hugging Face checkpoint")
    download(client, tokenizer_objects, split_uri(args.tokenizer)[0], work / "tokenizer")
    tokenizer = SftTokenizer(work / "tokenizer")
    tokenizer.path = args.tokenizer  # the manifest names the checkpoint, not the job's copy
    inputs, saved = input_objects(client, args.input)
    key = content_key(inputs, tokenizer, settings)
    base = f"{as_prefix(args.prepared)}{key}/"
    train = f"{base}train/"
    size = sum(o["size"] for o in inputs)
    if exists(client, base + DONE):
        log(f"reusing prepared data {key}: {train} ({len(inputs)} input object(s), {size:,} bytes, unchanged)")
        return {"key": key, "uri": train, "reused": True}
    log(f"preparing data {key}: {len(inputs)} input object(s), {size:,} bytes under {args.input}")
    raw = work / "raw"
    download(client, inputs, split_uri(args.input)[0], raw)
    files = [raw] if saved else [raw / o["relative"] for o in inputs]
    out = work / "out"

    def named(text: str, **options) -> None:  # the skipped examples, by their S3 URIs
        log(text.replace(f"{raw}/", as_prefix(args.input)), **options)

    try:
        manifests = prepare(files, tokenizer, out, settings, log=named)
    except BadData as error:  # named by its S3 URI, not the job's local copy
        raise BadData(str(error).replace(f"{raw}/", as_prefix(args.input)), error.reason) from None
    manifest = manifests["train"]
    bucket, prefix = split_uri(train)
    for path in sorted((out / "train").iterdir()):
        client.upload_file(str(path), bucket, prefix + path.name)
    done = {
        "key": key,
        "uri": train,
        "inputs": [{"key": o["relative"], "etag": o["etag"], "size": o["size"]} for o in inputs],
        "input_uri": args.input,
        "tokenizer_uri": args.tokenizer,
        "settings": settings_material(settings),
        "train": manifest,
    }
    bucket, done_key = split_uri(base + DONE)
    client.put_object(Bucket=bucket, Key=done_key, Body=json.dumps(done, indent=1).encode())
    log(
        f"prepared data {key}: {manifest['examples']:,} examples in "
        f"{sum(s['sequences'] for s in manifest['shards']):,} sequences at {train}"
    )
    return {"key": key, "uri": train, "reused": False}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.sft_prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="S3 prefix of the raw examples")
    parser.add_argument("--tokenizer", required=True, help="S3 prefix of the Hugging Face checkpoint (its tokenizer)")
    parser.add_argument("--prepared", required=True, help="S3 prefix under which each key's shards are kept")
    parser.add_argument("--property-file", required=True, type=Path, help="writes {key, uri, reused} here")
    parser.add_argument("--sequence-length", required=True, type=int)
    parser.add_argument("--dtype", choices=["uint16", "uint32"])
    parser.add_argument("--loss-on", choices=["assistant", "all"], default="assistant")
    parser.add_argument("--overlong", choices=["error", "drop", "truncate"], default="error")
    parser.add_argument("--format", choices=FORMATS, default="auto")
    parser.add_argument("--on-bad-example", choices=["error", "skip"], default="error")
    parser.add_argument("--max-bad-fraction", type=float, default=0.0)
    args = parser.parse_args(argv)
    settings = Settings(
        args.sequence_length,
        args.loss_on,
        args.overlong,
        dtype=args.dtype,
        format=args.format,
        on_bad_example=args.on_bad_example,
        max_bad_fraction=args.max_bad_fraction,
    )
    import boto3

    work = Path(tempfile.mkdtemp(prefix="sft-prepare-"))
    try:
        found = run(args, settings, boto3.client("s3"), work)
    except BadData as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.property_file.parent.mkdir(parents=True, exist_ok=True)
    args.property_file.write_text(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
