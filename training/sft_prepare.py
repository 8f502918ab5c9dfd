"""The pipeline's Prepare step: raw SFT examples in S3 to packed shards in S3, keyed by their content.

    python -m training.sft_prepare --input s3://bucket/raw/ --tokenizer s3://bucket/checkpoint/ \\
        --prepared s3://store/recipe/output/prepared/ --property-file OUT/prepared.json \\
        --sequence-length 8192 [--ignore GLOB ...] [the settings of python -m training.sft_data]

The key is the SHA-256 of the inputs (each object's key, ETag and size under ``--input``), the
tokenizer and its chat template (:meth:`SftTokenizer.fingerprint_material`), the settings and the
version of the preparing code (:func:`code_version`, a hash of the preparing modules' source: data
prepared by other code is never reused). When ``<prepared><key>/manifest.json`` exists and every
object it lists under ``<prepared><key>/train/`` has the SHA-256 it records (S3's own
``ChecksumSHA256``, stored at upload and read with ``ChecksumMode``), the shards are reused
("reusing prepared data <key>") and nothing is downloaded. A missing or changed object is named by
its S3 URI and the key is prepared again (the same bytes: packing is deterministic). Otherwise the inputs are
downloaded and packed by :func:`training.sft_data.prepare` (the code of the local command), each
file uploaded in one PutObject with ``ChecksumAlgorithm`` SHA256 (S3 refuses a body that does not
match the checksum botocore sends, and the stored one must be the manifest's), and
``manifest.json`` written last, so a job that stops halfway leaves no key that reads as done.
Either way the property file names the shards: ``{"key": ..., "uri": ..., "reused": ...}``.

The inputs under ``--input``: JSON Lines, JSON (either gzipped, ``.gz``), Parquet files (every object
with one of those suffixes, in key order), or one ``Dataset.save_to_disk`` directory (a ``state.json``
at the top). Any other object (a README, ``.DS_Store``) is refused by its S3 URI unless a ``--ignore``
glob (the recipe's ``data.ignore``) matches its key or name; the ignored ones are logged. Only the
tokenizer files of ``--tokenizer`` are read (every top-level object but the weights). Bad input exits
2 with one line, as the local command does.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

from tiered_training.contract.raw_data import INPUT_SUFFIXES, SAVED_MARKER, sort_raw
from training.init_archive import ARCHIVE_SUFFIXES, ArchiveError, unpacked
from training.prepare_step import run_step
from training.sft_data import Settings, SftTokenizer, bad_example_arguments, check_bad_fraction, prepare
from training.sft_formats import FORMATS, BadData

KEY_VERSION = "sft-prepare/2"
# what decides the shards
CODE_MODULES = (
    "training.sft_prepare",
    "training.sft_data",
    "training.sft_formats",
    "training.json_lines",
    "training.dpo_data",
)
MAX_PUT = 5 << 30  # S3's largest single PutObject
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


def input_objects(client, uri: str, ignore: tuple[str, ...] = (), log=print) -> tuple[list[dict], bool]:
    """The objects that are the inputs, and whether they are one ``save_to_disk`` directory. Objects no
    reader takes are refused by name unless a glob of ``ignore`` (the recipe's ``data.ignore``, matched
    against the key under ``uri`` and its file name) matches them; the ignored ones are logged."""
    objects = list_objects(client, uri)
    if any(o["relative"] == SAVED_MARKER for o in objects):
        return objects, True
    inputs, left_out, refused = sort_raw([o["relative"] for o in objects], ignore)
    chosen = [o for o in objects if o["relative"] in set(inputs)]
    prefix = as_prefix(uri)

    def shown(names: list[str]) -> str:
        return ", ".join(prefix + name for name in names[:10]) + (" ..." if len(names) > 10 else "")

    if left_out:
        log(f"ignoring {len(left_out)} object(s) under {uri} as data.ignore says: {shown(left_out)}")
    if refused:
        raise BadData(
            f"{len(refused)} object(s) under {uri} that no reader takes: {shown(refused)}; the inputs are "
            f"{', '.join(INPUT_SUFFIXES)} files or one Dataset.save_to_disk directory: remove them, or list them "
            "in the recipe's data.ignore (globs such as '*.md')",
            "input",
        )
    if not chosen:
        raise BadData(
            f"{uri}: no .jsonl, .json or .parquet objects and no Dataset.save_to_disk directory (state.json) "
            f"under it ({len(objects)} other objects)",
            "input",
        )
    return chosen, False


def code_version() -> str:
    """A hash of the preparing modules' source (:data:`CODE_MODULES`): any change to the code that decides
    the shards makes a new key, so data prepared by an earlier version is prepared again, not reused."""
    digest = hashlib.sha256()
    for name in CODE_MODULES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        digest.update(name.encode() + b"\0" + (Path(origin).read_bytes() if origin else b"") + b"\0")
    return digest.hexdigest()[:16]


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


def content_key(inputs: list[dict], tokenizer: SftTokenizer, settings: Settings, code: str | None = None) -> str:
    """The inputs' keys, ETags and sizes, the tokenizer with its chat template, the settings and the version
    of the preparing code (``code``, default :func:`code_version`)."""
    digest = hashlib.sha256(KEY_VERSION.encode() + b"\0" + (code or code_version()).encode())
    listing = [[o["relative"], o["etag"], o["size"]] for o in inputs]
    digest.update(json.dumps({"inputs": listing, "settings": settings_material(settings)}, sort_keys=True).encode())
    digest.update(b"\0" + tokenizer.fingerprint_material())
    return digest.hexdigest()[:32]


def download(client, objects: list[dict], bucket: str, target: Path) -> None:
    for o in objects:
        path = target / o["relative"]
        path.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, o["key"], str(path))


def _missing(error) -> bool:
    return error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


def exists(client, uri: str) -> bool:
    bucket, key = split_uri(uri)
    from botocore.exceptions import ClientError

    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if _missing(error):
            return False
        raise
    return True


def b64(hex_digest: str) -> str:
    """A hex SHA-256 as S3 gives it (``ChecksumSHA256``: base64 of the digest's bytes)."""
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


def damaged(client, base: str) -> list[str]:
    """The prepared objects under ``base`` that are not as its manifest says, by S3 URI with why: each shard
    file's SHA-256 that S3 keeps (``ChecksumSHA256``, stored when Prepare uploaded it with that checksum and
    returned with ``ChecksumMode``) must be the manifest's. An object written again since (even with the same
    size) has another checksum, or none."""
    from botocore.exceptions import ClientError

    train = f"{base}train/"
    bucket, key = split_uri(base + DONE)
    body = client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")["Body"].read()
    try:
        done = json.loads(body)
        files = [(f"{train}{name}", str(sha)) for name, sha in done["checksums"].items()]
    except (ValueError, KeyError, TypeError, AttributeError):
        return [f"{base}{DONE} (not a manifest with shard checksums)"]
    found = []
    for uri, sha in files:
        bucket, key = split_uri(uri)
        try:
            head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as error:
            if not _missing(error):
                raise
            found.append(f"{uri} (missing)")
            continue
        stored = head.get("ChecksumSHA256")
        if stored != b64(sha):
            why = "no SHA-256 checksum: written again since" if not stored else f"SHA-256 {stored}, manifest {b64(sha)}"
            found.append(f"{uri} ({why})")
    return found


def upload(client, path: Path, uri: str, sha256: str) -> None:
    """One PutObject with ``ChecksumAlgorithm`` SHA256: botocore sends the body's SHA-256, S3 refuses a body
    that does not match it (BadDigest) and keeps it (``ChecksumSHA256``) for :func:`damaged`; the stored
    checksum must be the manifest's ``sha256`` (the file sent is the file packed)."""
    if path.stat().st_size > MAX_PUT:
        raise BadData(f"{path.name}: over 5 GiB, more than one PutObject takes; pack with fewer sequences per shard")
    bucket, key = split_uri(uri)
    with open(path, "rb") as body:
        stored = client.put_object(Bucket=bucket, Key=key, Body=body, ChecksumAlgorithm="SHA256").get("ChecksumSHA256")
    if stored != b64(sha256):
        raise BadData(f"{uri}: S3 stored SHA-256 {stored}, but the packed file's is {b64(sha256)}; run the step again")


def run(args: argparse.Namespace, settings: Settings, client, work: Path, log=print) -> dict:
    """Reuse or prepare; returns what the property file says."""
    if args.tokenizer.endswith(ARCHIVE_SUFFIXES):  # an earlier run's export: the archive alone, listed by its key
        bucket, key = split_uri(args.tokenizer)  # (the role may list only under the key it reads)
        listed = client.list_objects_v2(Bucket=bucket, Prefix=key).get("Contents", [])
        tokenizer_objects = [
            {"key": o["Key"], "relative": key.rsplit("/", 1)[-1], "etag": o["ETag"].strip('"'), "size": o["Size"]}
            for o in listed
            if o["Key"] == key
        ]
    else:
        tokenizer_objects = [
            o
            for o in list_objects(client, args.tokenizer)
            if "/" not in o["relative"] and not o["relative"].endswith(WEIGHT_SUFFIXES)
        ]
    if not tokenizer_objects:
        raise BadData(f"{args.tokenizer}: no objects; --tokenizer is the S3 prefix of a Hugging Face checkpoint")
    download(client, tokenizer_objects, split_uri(args.tokenizer)[0], work / "tokenizer")
    try:  # an earlier run's export (model.tar.gz): its tokenizer is inside
        tokenizer_dir = unpacked(work / "tokenizer", work)
    except ArchiveError as error:
        raise BadData(str(error)) from None
    tokenizer = SftTokenizer(tokenizer_dir)
    tokenizer.path = args.tokenizer  # the manifest names the checkpoint, not the job's copy
    inputs, saved = input_objects(client, args.input, tuple(getattr(args, "ignore", None) or ()), log)
    code = code_version()
    key = content_key(inputs, tokenizer, settings, code)
    base = f"{as_prefix(args.prepared)}{key}/"
    train = f"{base}train/"
    size = sum(o["size"] for o in inputs)
    if exists(client, base + DONE):
        bad = damaged(client, base)
        if not bad:
            log(f"reusing prepared data {key}: {train} ({len(inputs)} input object(s), {size:,} bytes, unchanged)")
            return {"key": key, "uri": train, "reused": True}
        # The key fixes what the shards are (packing is deterministic), so preparing again writes the bytes the
        # manifest records; a job that stops halfway leaves objects that still fail this check.
        log(f"prepared data {key} is damaged, preparing it again: {'; '.join(bad)}", file=sys.stderr)
    log(f"preparing data {key}: {len(inputs)} input object(s), {size:,} bytes under {args.input}")
    raw = work / "raw"
    download(client, inputs, split_uri(args.input)[0], raw)
    files = [raw] if saved else [raw / o["relative"] for o in inputs]
    out = work / "out"

    def named(text: str, **options) -> None:  # the skipped examples, by their S3 URIs
        log(text.replace(f"{raw}/", as_prefix(args.input)), **options)

    try:
        manifests = _prepare(settings)(files, tokenizer, out, settings, log=named)
    except BadData as error:  # named by its S3 URI, not the job's local copy
        raise BadData(str(error).replace(f"{raw}/", as_prefix(args.input)), error.reason) from None
    manifest = manifests["train"]
    checksums = {name: sha for entry in manifest["shards"] for name, sha in entry["sha256"].items()}
    for path in sorted((out / "train").iterdir()):
        if path.name not in checksums:  # shards.json
            checksums[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        upload(client, path, train + path.name, checksums[path.name])
    done = {
        "key": key,
        "uri": train,
        "code_version": code,
        "checksums": checksums,  # every object under uri: its SHA-256 (hex)
        "inputs": [{"key": o["relative"], "etag": o["etag"], "size": o["size"]} for o in inputs],
        "input_uri": args.input,
        "tokenizer_uri": args.tokenizer,
        "settings": settings_material(settings),
        "train": manifest,
    }
    bucket, done_key = split_uri(base + DONE)
    client.put_object(Bucket=bucket, Key=done_key, Body=json.dumps(done, indent=1).encode(), ChecksumAlgorithm="SHA256")
    log(
        f"prepared data {key}: {manifest['examples']:,} examples in "
        f"{sum(s['sequences'] for s in manifest['shards']):,} sequences at {train}"
    )
    return {"key": key, "uri": train, "reused": False}


def _prepare(settings: Settings):
    """training.sft_data's prepare, or for preference pairs (task dpo) training.dpo_data's."""
    if settings.format == "preference":
        from training import dpo_data

        return dpo_data.prepare
    return prepare


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
    parser.add_argument("--format", choices=(*FORMATS, "preference"), default="auto", help="preference: DPO pairs")
    bad_example_arguments(parser, "examples")
    parser.add_argument(
        "--ignore", action="append", default=[], metavar="GLOB", help="objects under --input to leave out (data.ignore)"
    )
    args = parser.parse_args(argv)
    check_bad_fraction(parser, args)
    settings = Settings.from_args(args)
    import boto3

    def step(work: Path) -> dict:
        return run(args, settings, boto3.client("s3"), work)

    return run_step("sft-prepare-", args.property_file, step, BadData)


if __name__ == "__main__":
    sys.exit(main())
