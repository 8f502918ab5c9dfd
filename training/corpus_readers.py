"""The raw corpora of a pretraining mixture, split into units and read document by document.

A source's files (``CorpusSource.uri``, an S3 prefix or a local directory) become units:

- Parquet (``.parquet``): one unit per row group, the named column read with pyarrow (over S3 by ranged GETs);
- JSON Lines (``.jsonl``, ``.ndjson``, or ``.json`` whose first character is not ``[``): a unit per file, a record
  per line, the named field (stdlib ``json``);
- JSON (``.json``, an array of objects): a unit per file, the named field of each element;
- plain text (``.txt``, ``.text``, ``.md``; any suffix with ``format: text``): the file is one document;
  ``text_lines``: each non-blank line is one;
- a saved dataset (a folder with ``state.json``, as ``Dataset.save_to_disk`` writes it): one unit, read with
  ``datasets.load_from_disk``, the named column.

``.gz`` and ``.zst`` files are decompressed as they are read (pyarrow's compressed input streams). A file that fits
no format is refused, naming it, unless one of the spec's ``ignore`` globs matches its path under the source.

Bad records (a missing field, a field that is not text, an empty text, invalid UTF-8, a line that is not JSON)
come out as :class:`Bad` with the record's place (line, row or record number) and the reason, for the caller's
``on_bad_example`` rule.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tiered_training.contract.corpus import (
    JSON_OR_JSONL,
    CorpusSource,
    compression,
    file_format,
    ignored,
    saved_dataset_roots,
)
from training.corpus_store import Object, Store
from training.json_lines import decoded_lines, json_lines

SAVED_FILES = ("state.json", "dataset_info.json")
BATCH_ROWS = 4096  # Parquet and saved-dataset rows per read


class BadData(ValueError):
    """Input the Prepare step cannot use: one line naming the source, the file (its URI), the record and why."""


@dataclass(frozen=True)
class Bad:
    """A record that is no document: its number (line, row or record) and the reason."""

    number: int
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class Unit:
    """A piece of work written once: a file, a Parquet row group, or a saved dataset."""

    source: str
    uri: str  # the file (or the saved dataset's folder)
    relative: str  # below the source's prefix
    format: str  # resolved: parquet, jsonl, json, text, text_lines, saved_dataset
    field: str
    etag: str
    size: int  # bytes of input (a row group: its compressed size)
    row_group: int | None = None
    first_row: int = 0  # a row group's first row in its file
    file_size: int = 0  # the file's bytes (a row group's unit: the whole file's)
    files: tuple[Object, ...] = ()  # a saved dataset's objects

    @property
    def label(self) -> str:
        return self.uri if self.row_group is None else f"{self.uri} (row group {self.row_group})"

    @property
    def record_kind(self) -> str:
        return {"jsonl": "line", "text_lines": "line", "json": "record", "text": "file"}.get(self.format, "row")

    def material(self) -> dict:
        return {
            "source": self.source,
            "relative": self.relative,
            "format": self.format,
            "field": self.field,
            "etag": self.etag,
            "size": self.size,
            "row_group": self.row_group,
            "files": [[o.relative, o.etag, o.size] for o in self.files],
        }

    def place(self, number: int) -> str:
        """The record's place: ``s3://.../a.jsonl:12``, ``s3://.../a.parquet: row 40``."""
        if self.record_kind == "line":
            return f"{self.uri}:{number}"
        if self.record_kind == "file":
            return self.uri
        return f"{self.uri}: {self.record_kind} {number}"


def _file_format(source: CorpusSource, obj: Object, store: Store) -> str | None:
    chosen = file_format(source.format, obj.relative)
    if chosen == JSON_OR_JSONL:
        return "json" if _first_character(obj, store) == "[" else "jsonl"
    return chosen


def _first_character(obj: Object, store: Store) -> str:
    with _open_stream(obj, store) as stream:
        head = stream.read(4096)
    return head.decode("utf-8-sig", errors="replace").lstrip()[:1]


def _open_stream(obj: Object, store: Store):
    """The decompressed bytes of a file, buffered."""
    import pyarrow as pa

    raw = store.open_range(obj)
    if not isinstance(raw, io.BufferedReader):
        raw = io.BufferedReader(raw, 8 << 20)  # S3: a ranged GET per 8 MiB
    codec = compression(obj.relative)
    if codec is None:
        return raw
    return io.BufferedReader(pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), codec), 1 << 20)


def plan_units(source: CorpusSource, objects: list[Object], ignore: list[str], store: Store) -> list[Unit]:
    """The source's units in a fixed order; BadData for a file that fits no format and no ignore glob."""
    kept = [o for o in objects if not ignored(o.relative, ignore)]
    saved_roots = saved_dataset_roots([o.relative for o in kept])
    if source.format == "saved_dataset" and not saved_roots:
        raise BadData(f"source {source.name}: {source.uri}: no saved dataset (no state.json) under it")
    units: list[Unit] = []
    refused: list[str] = []
    for root in saved_roots:
        prefix = "" if root == "." else root + "/"
        files = tuple(o for o in kept if o.relative.startswith(prefix))
        kept = [o for o in kept if not o.relative.startswith(prefix)]
        etag = hashlib.sha256(json.dumps([[o.relative, o.etag, o.size] for o in files]).encode()).hexdigest()[:32]
        uri = files[0].uri[: len(files[0].uri) - len(files[0].relative)] + prefix
        units.append(
            Unit(
                source.name,
                uri,
                prefix or ".",
                "saved_dataset",
                source.field,
                etag,
                sum(o.size for o in files),
                files=files,
            )
        )
    for obj in kept:
        fmt = None if source.format == "saved_dataset" else _file_format(source, obj, store)
        if fmt is None:
            refused.append(obj.uri)
        elif fmt == "parquet":
            units.extend(_row_groups(source, obj, store))
        else:
            units.append(Unit(source.name, obj.uri, obj.relative, fmt, source.field, obj.etag, obj.size))
    if refused:
        shown = ", ".join(refused[:5]) + (f" and {len(refused) - 5} more" if len(refused) > 5 else "")
        raise BadData(
            f"source {source.name}: {len(refused)} file(s) fit no format ({source.format}): {shown}; "
            "give .parquet, .jsonl, .json, .txt (optionally .gz or .zst) or a saved dataset, "
            "set the source's format, or leave them out with the spec's ignore globs"
        )
    if not units:
        raise BadData(f"source {source.name}: {source.uri}: no files to read under it")
    return units


def _row_groups(source: CorpusSource, obj: Object, store: Store) -> list[Unit]:
    import pyarrow.parquet as pq

    try:
        with store.open_range(obj) as handle:
            meta = pq.ParquetFile(handle).metadata
    except Exception as error:  # pyarrow's refusal of a file that is not Parquet
        raise BadData(f"source {source.name}: {obj.uri}: not a Parquet file pyarrow can read ({error})") from None
    units, first = [], 0
    for index in range(meta.num_row_groups):
        group = meta.row_group(index)
        size = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        units.append(
            Unit(source.name, obj.uri, obj.relative, "parquet", source.field, obj.etag, size, index, first, obj.size)
        )
        first += group.num_rows
    return units


# ---- reading ----------------------------------------------------------------------------------------------


def documents(unit: Unit, store: Store, work: Path) -> Iterator[str | Bad]:
    """The unit's documents, in order, with a :class:`Bad` in place of each bad record."""
    if unit.format == "parquet":
        yield from _parquet(unit, store)
    elif unit.format == "saved_dataset":
        yield from _saved(unit, store, work)
    elif unit.format == "jsonl":
        yield from _jsonl(unit, store)
    elif unit.format == "json":
        yield from _json(unit, store)
    elif unit.format == "text_lines":
        yield from _lines(unit, store)
    else:
        yield from _text(unit, store)


def _obj(unit: Unit) -> Object:
    return Object(unit.uri, unit.relative, unit.etag, unit.file_size or unit.size)


def _not_utf8(number: int, bad: UnicodeDecodeError) -> Bad:
    return Bad(number, "not UTF-8", f"{bad.reason} at byte {bad.start}")


def _jsonl(unit: Unit, store: Store) -> Iterator[str | Bad]:
    with _open_stream(_obj(unit), store) as stream:
        for number, value in json_lines(stream):
            if isinstance(value, UnicodeDecodeError):
                yield _not_utf8(number, value)
            elif isinstance(value, ValueError):
                yield Bad(number, "not JSON", str(value))
            else:
                yield _field(value, unit.field, number)


def _json(unit: Unit, store: Store) -> Iterator[str | Bad]:
    with _open_stream(_obj(unit), store) as stream:
        raw = stream.read()
    try:
        records = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as bad:
        yield Bad(0, "not UTF-8", f"{bad.reason} at byte {bad.start}")
        return
    except ValueError as bad:
        yield Bad(0, "not JSON", str(bad))
        return
    if not isinstance(records, list):
        yield Bad(0, "not a JSON array", f"a JSON {type(records).__name__}")
        return
    for number, record in enumerate(records):
        yield _field(record, unit.field, number)


def _field(record, name: str, number: int) -> str | Bad:
    if not isinstance(record, dict):
        return Bad(number, "not an object", f"a JSON {type(record).__name__}")
    if name not in record or record[name] is None:
        keys = ", ".join(sorted(map(str, record))[:8]) or "none"
        return Bad(number, "missing field", f"no {name!r} (keys: {keys})")
    return _text_value(record[name], name, number)


def _text_value(value, name: str, number: int) -> str | Bad:
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as bad:
            return Bad(number, "not UTF-8", f"{name}: {bad.reason} at byte {bad.start}")
    if not isinstance(value, str):
        return Bad(number, "not text", f"{name} is a {type(value).__name__}")
    if not value.strip():
        return Bad(number, "empty text", f"{name} is empty")
    return value


def _lines(unit: Unit, store: Store) -> Iterator[str | Bad]:
    with _open_stream(_obj(unit), store) as stream:
        for number, line in decoded_lines(stream):
            if isinstance(line, UnicodeDecodeError):
                yield _not_utf8(number, line)
                continue
            line = line.rstrip("\r\n")
            if line.strip():
                yield line


def _text(unit: Unit, store: Store) -> Iterator[str | Bad]:
    with _open_stream(_obj(unit), store) as stream:
        raw = stream.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as bad:
        yield Bad(0, "not UTF-8", f"{bad.reason} at byte {bad.start}")
        return
    yield text if text.strip() else Bad(0, "empty text", "the file holds no text")


def _parquet(unit: Unit, store: Store) -> Iterator[str | Bad]:
    import pyarrow.parquet as pq

    assert unit.row_group is not None
    with store.open_range(_obj(unit)) as handle:
        parquet = pq.ParquetFile(handle)
        names = parquet.schema_arrow.names
        rows = parquet.metadata.row_group(unit.row_group).num_rows
        if unit.field not in names:
            detail = f"no column {unit.field!r} (columns: {', '.join(names[:8])})"
            for row in range(unit.first_row, unit.first_row + rows):
                yield Bad(row, "missing field", detail)
            return
        column = parquet.read_row_group(unit.row_group, columns=[unit.field]).column(0)
    yield from _column(column.to_pylist(), unit.field, unit.first_row)


def _column(values: list, name: str, first: int) -> Iterator[str | Bad]:
    for offset, value in enumerate(values):
        if type(value) is str and value.strip():
            yield value
        elif value is None:
            yield Bad(first + offset, "missing field", f"{name} is null")
        else:
            yield _text_value(value, name, first + offset)


def _saved(unit: Unit, store: Store, work: Path) -> Iterator[str | Bad]:
    import datasets

    datasets.disable_progress_bars()
    local = work / "saved" / hashlib.sha256(unit.uri.encode()).hexdigest()[:16]
    prefix = "" if unit.relative == "." else unit.relative
    for obj in unit.files:
        store.download(obj.uri, local / obj.relative[len(prefix) :])
    rows = datasets.load_from_disk(str(local))
    if not isinstance(rows, datasets.Dataset):
        raise BadData(f"source {unit.source}: {unit.uri}: a DatasetDict; give one split's folder")
    if unit.field not in rows.column_names:
        detail = f"no column {unit.field!r} (columns: {', '.join(rows.column_names[:8])})"
        for row in range(len(rows)):
            yield Bad(row, "missing field", detail)
        return
    column = rows.data.column(unit.field)
    for start in range(0, len(rows), BATCH_ROWS):
        yield from _column(column.slice(start, BATCH_ROWS).to_pylist(), unit.field, start)
