"""Preflight of ``data.sources``: each raw source listed, its first record read, its field checked, its tokens
estimated from a sample, and a budget that would repeat it beyond its ``max_epochs`` refused.

The estimate: the text bytes of a sample (the first MiB of the first file, or the first rows of its first
Parquet row group) per stored byte, times the source's stored bytes, over the catalogue's bytes per token
(``catalog/processing.yaml``). It is an estimate, and says so; the Prepare step counts exactly.
"""

from __future__ import annotations

import io
import json
import math
import zlib
from typing import TYPE_CHECKING, Any

from tiered_training.contract import corpus

if TYPE_CHECKING:
    from tiered_training.aws.preflight import Check
    from tiered_training.planning.plan import Plan

SAMPLE_BYTES = 1 << 20
SAMPLE_ROWS = 256
MAX_LISTED = 100_000  # keys listed per source before the estimate stops counting (and says so)


def check_sources(s3: Any, plan: Plan) -> list[Check]:
    """One check per source of ``data.sources``, then the Prepare job sized on what the samples say the sources
    hold (the plan sized it on the recipe's ``tokens_estimate`` or, without one, on the budget share)."""
    from tiered_training.aws.preflight import _guard

    spec = plan.corpus_spec()
    if spec is None:
        return []
    shares = {s.name: s.budget_tokens for s in plan.corpus.sources} if plan.corpus else {}
    held: dict[str, int] = {}
    checks = []
    for source in spec.sources:

        def body(source: Any = source) -> Check:
            check, tokens = _check_source(s3, source, shares.get(source.name, 0), spec)
            if tokens:
                held[source.name] = tokens
            return check

        checks.append(_guard("data", source.uri, body))
    if plan.corpus is not None and len(held) == len(spec.sources):
        checks.append(check_prepare(plan, held))
    return checks


def check_prepare(plan: Plan, held: dict[str, int]) -> Check:
    """The deployed Prepare job (its hosts fixed at synth) on the sampled sizes: a failure when it would run past
    ``data.prepare.max_runtime_hours`` (SageMaker stops it there), naming the hosts that would fit."""
    from tiered_training.aws.preflight import FAIL, PASS, Check
    from tiered_training.planning.corpus import MAX_PREPARE_INSTANCES

    assert plan.corpus is not None
    deployed = plan.corpus.prepare
    tokens = sum(held.values())
    hours = tokens / (deployed.tokens_per_vcpu_second * deployed.vcpus * deployed.instance_count) / 3600
    limit = plan.recipe.data.prepare.max_runtime_hours if plan.recipe.data.prepare else 24.0
    cost = (
        ""
        if deployed.price_per_hour is None
        else f", about ${hours * deployed.instance_count * deployed.price_per_hour:,.2f}"
    )
    said = (
        f"Prepare tokenizes about {tokens:,} tokens (sampled; the plan sized it on {deployed.tokens:,}): about "
        f"{hours:,.1f} h on {deployed.instance_count} x {deployed.instance_type}{cost}"
    )
    if hours <= limit:
        return Check("data", "prepare", PASS, said)
    host_hours = hours * deployed.instance_count
    needed = math.ceil(host_hours / limit)
    fix = (
        f"set data.prepare.instance_count: {needed} (or give each source's tokens_estimate) and deploy again"
        if needed <= MAX_PREPARE_INSTANCES
        else "choose a Processing instance with more vCPUs, raise max_runtime_hours, or trim the sources"
    )
    return Check("data", "prepare", FAIL, f"{said}, above data.prepare.max_runtime_hours {limit:g}", fix)


def _check_source(s3: Any, source: Any, budget_tokens: int, spec: Any) -> tuple[Check, int | None]:
    """The source's check, and the tokens its sample says it holds (None where it could not tell)."""
    from tiered_training.aws.preflight import FAIL, PASS, Check
    from tiered_training.catalog import processing

    name = f"source {source.name}"

    def fail(detail: str, fix: str, tokens: int | None = None) -> tuple[Check, int | None]:
        return Check("data", source.uri, FAIL, detail, fix), tokens

    bucket, _, prefix = source.uri.removeprefix("s3://").partition("/")
    objects, more = _listing(s3, bucket, prefix, spec.ignore)
    roots = corpus.saved_dataset_roots([relative for relative, _, _ in objects])
    if source.format == "saved_dataset" and not roots:
        return fail(
            f"{name}: no saved dataset (no {corpus.SAVED_DATASET_MARKER}) under it",
            "give the folder Dataset.save_to_disk wrote, or fix the source's format",
        )
    saved = [o for o in objects if _under(o[0], roots)]
    readable = [
        (*o, fmt) for o in objects if not _under(o[0], roots) and (fmt := corpus.file_format(source.format, o[0]))
    ]
    refused = [
        f"s3://{bucket}/{key}"
        for relative, key, _ in objects
        if not _under(relative, roots) and not corpus.file_format(source.format, relative)
    ]
    if refused:
        shown = ", ".join(refused[:5]) + (f" and {len(refused) - 5} more" if len(refused) > 5 else "")
        return fail(
            f"{name}: {len(refused)} file(s) fit no format ({source.format}), and the Prepare step would stop at "
            f"them: {shown}",
            "give .parquet, .jsonl, .ndjson, .json, .txt (optionally .gz or .zst) or a saved dataset, or list "
            "their globs in data.ignore",
        )
    if not readable and not saved:
        return fail(
            f"{name}: no data files under it",
            f"upload the raw files under {source.uri}, or fix its uri",
        )
    if roots:
        root = roots[0]
        arrows = sorted(
            (key, size) for relative, key, size in saved if _under(relative, [root]) and key.endswith(".arrow")
        )
        where = f"s3://{bucket}/{prefix}{'' if root == '.' else root + '/'}"
        sample = _arrow_sample(s3, bucket, arrows, source.field) if arrows else "no .arrow file in the saved dataset"
        stored = sum(size for relative, key, size in saved if key.endswith(".arrow"))
    else:
        _, key, _, fmt = readable[0]
        where = f"s3://{bucket}/{key}"
        sample = _sample(s3, bucket, key, source, fmt)
        stored = 0
    stored += sum(size for _, _, size, _ in readable)
    files = len(readable) + len(roots)
    if isinstance(sample, str):
        return fail(f"{name}: {where}: {sample}", f"give the text's {_what(source)}")
    text_bytes, sample_bytes, texts = sample
    per_token = processing().bytes_per_token
    tokens = int(stored * text_bytes / max(1, sample_bytes) / per_token)
    kinds = f"{files:,}{'+' if more else ''} file(s)" + (f" ({len(roots)} saved dataset(s))" if roots else "")
    listed = f"{kinds}, {stored / 1e9:,.2f} GB"
    estimate = f"about {tokens:,} tokens (estimated from {len(texts)} records of {where})"
    if tokens and budget_tokens / tokens > source.max_epochs:
        return fail(
            f"{name}: {listed}, {estimate}; the budget's {budget_tokens:,} tokens from it repeat it "
            f"{budget_tokens / tokens:.1f} times, above max_epochs {source.max_epochs:g}",
            "lower its weight, add data, or raise its max_epochs",
            tokens,
        )
    return Check(
        "data", source.uri, PASS, f"{name}: {listed}; the first record has text in {_what(source)}; {estimate}"
    ), tokens


def _under(relative: str, roots: list[str]) -> bool:
    """Whether the file belongs to one of the saved datasets' folders."""
    return any(root == "." or relative.startswith(root + "/") for root in roots)


def _what(source: Any) -> str:
    return "the file" if source.format in ("text", "text_lines") else f"field {source.field!r}"


def _listing(s3: Any, bucket: str, prefix: str, ignore: list[str]) -> tuple[list[tuple[str, str, int]], bool]:
    """``(path under the source, key, bytes)`` of its objects (sorted, data.ignore's globs left out, as the Prepare
    step leaves them), and whether the listing stopped at MAX_LISTED."""
    found, seen = [], 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            seen += 1
            key = item["Key"]
            relative = key[len(prefix) :].lstrip("/")
            if relative and not key.endswith("/") and not corpus.ignored(relative, ignore):
                found.append((relative, key, item["Size"]))
            if seen >= MAX_LISTED:
                return sorted(found), True
    return sorted(found), False


def _head(s3: Any, bucket: str, key: str) -> tuple[bytes, int] | str:
    """The decompressed first bytes of a file (gzip by zlib, zstd by pyarrow) and the stored bytes they came from."""
    body = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{SAMPLE_BYTES - 1}")["Body"].read()
    codec = corpus.compression(key)
    if codec == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body), len(body)
    if codec == "zstd":
        try:
            import pyarrow as pa
        except ImportError:
            return "a zstd file needs pyarrow to be sampled (pip install 'tiered-training[aws]')"
        stream, out = pa.CompressedInputStream(pa.BufferReader(body), "zstd"), bytearray()
        try:
            while chunk := stream.read(1 << 16):
                out += chunk
        except OSError:  # the sample ends inside a frame: what came before it is the sample
            pass
        return bytes(out), len(body)
    return body, len(body)


def _sample(s3: Any, bucket: str, key: str, source: Any, fmt: str) -> tuple[int, int, list[str]] | str:
    """(text bytes, stored bytes they came from, texts) of the file's first records, read as the Prepare step reads
    ``fmt``; a string says what is wrong with the first record."""
    if fmt == "parquet":
        return _parquet_sample(s3, bucket, key, source.field)
    head = _head(s3, bucket, key)
    if isinstance(head, str):
        return head
    body, raw = head
    text = body.decode("utf-8", errors="replace")
    if len(body) >= SAMPLE_BYTES or raw >= SAMPLE_BYTES:  # a cut last line
        text = text[: text.rfind("\n") + 1] or text
    if fmt == "text":
        return len(text.encode()), raw, [text[:100]]
    if fmt == "text_lines":
        lines = [line for line in text.splitlines() if line.strip()]
        return (len("\n".join(lines).encode()), raw, lines) if lines else "no text in its first MiB"
    texts = []
    if fmt == "json" or (fmt == corpus.JSON_OR_JSONL and text.lstrip().startswith("[")):
        from tiered_training.aws.preflight import _first_record

        record, line = _first_record(text)
        rows = [(record, line)]
    else:
        rows = []
        for number, row in enumerate(text.splitlines(), start=1):
            if row.strip():
                try:
                    rows.append((json.loads(row), number))
                except ValueError as error:
                    rows.append((str(error), number))
            if len(rows) >= SAMPLE_ROWS:
                break
    for record, line in rows:
        if isinstance(record, str):
            return f"line {line}: not JSON ({record})"
        if not isinstance(record, dict) or source.field not in record:
            keys = ", ".join(sorted(map(str, record))) if isinstance(record, dict) else type(record).__name__
            return f"line {line}: no field {source.field!r} (keys: {keys})"
        value = record[source.field]
        if not isinstance(value, str):
            return f"line {line}: field {source.field!r} is a {type(value).__name__}, not text"
        texts.append(value)
    if not texts:
        return "no JSON record in its first MiB"
    consumed = (
        raw
        if len(rows) < SAMPLE_ROWS
        else int(raw * len("\n".join(text.splitlines()[: len(rows)])) / max(1, len(text)))
    )
    return sum(len(t.encode()) for t in texts), max(1, consumed), texts


def _arrow_sample(s3: Any, bucket: str, arrows: list[tuple[str, int]], field: str) -> tuple[int, int, list[str]] | str:
    """The first record batch of a saved dataset's first ``.arrow`` file (Arrow's IPC stream, as datasets writes it),
    read by ranged GETs: (text bytes, the batch's bytes, texts)."""
    try:
        import pyarrow as pa
    except ImportError:
        return "a saved dataset needs pyarrow to be sampled (pip install 'tiered-training[aws]')"
    key, size = arrows[0]
    try:
        reader = pa.ipc.open_stream(pa.PythonFile(_RangedFile(s3, bucket, key, size), mode="r"))
        schema = reader.schema
        if field not in schema.names:
            return f"no column {field!r} (columns: {', '.join(schema.names)})"
        batch = reader.read_next_batch()
    except (pa.ArrowInvalid, StopIteration, OSError) as error:
        return f"s3://{bucket}/{key} is not an Arrow stream with a record batch ({error})"
    column = batch.column(schema.names.index(field))
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return f"column {field!r} is {column.type}, not text"
    texts = [t for t in column.to_pylist() if isinstance(t, str)]
    if not texts:
        return f"no text in column {field!r} of its first record batch"
    return sum(len(t.encode()) for t in texts), max(1, batch.nbytes), texts[:SAMPLE_ROWS]


def _parquet_sample(s3: Any, bucket: str, key: str, field: str) -> tuple[int, int, list[str]] | str:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return "a Parquet source needs pyarrow to be sampled (pip install pyarrow)"
    size = s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
    handle = pq.ParquetFile(_RangedFile(s3, bucket, key, size))
    schema = handle.schema_arrow
    if field not in schema.names:
        return f"no column {field!r} (columns: {', '.join(schema.names)})"
    if not (pa.types.is_string(schema.field(field).type) or pa.types.is_large_string(schema.field(field).type)):
        return f"column {field!r} is {schema.field(field).type}, not text"
    batch = next(handle.iter_batches(batch_size=SAMPLE_ROWS, columns=[field]), None)
    texts = [t for t in (batch.column(0).to_pylist() if batch is not None else []) if isinstance(t, str)]
    if not texts:
        return f"no text in column {field!r} of its first row group"
    meta = handle.metadata
    column = schema.names.index(field)
    text_bytes = sum(meta.row_group(i).column(column).total_uncompressed_size for i in range(meta.num_row_groups))
    return text_bytes, size, texts


class _RangedFile(io.RawIOBase):
    """A seekable read-only view of an S3 object through ranged GETs (Parquet reads its footer, then columns)."""

    def __init__(self, s3: Any, bucket: str, key: str, size: int):
        self.s3, self.bucket, self.key, self.size, self.position = s3, bucket, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        if self.position >= self.size or not len(buffer):
            return 0
        end = min(self.size, self.position + len(buffer)) - 1
        data = self.s3.get_object(Bucket=self.bucket, Key=self.key, Range=f"bytes={self.position}-{end}")["Body"].read()
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)
