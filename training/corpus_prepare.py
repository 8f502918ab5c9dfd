"""The pipeline's Prepare step for pretraining: raw corpora to token shards, on N hosts and every core.

    python -m training.corpus_prepare --spec '<CorpusSpec JSON>' --prepared s3://store/recipe/prepared/ \\
        --property-file /opt/ml/processing/output/prepared/prepared.json [--host-index I --host-count N]
        [--processes P] [--wait-timeout SECONDS]

Every host lists every source (:mod:`training.corpus_readers`) and gets the same units in the same order; each
unit goes to one host (largest first, to the least loaded host: deterministic), and each host tokenizes its units
on a pool of one process per core. A unit's shards (``train/<source>/<unit>.bin``, ``validation/<source>/<unit>.bin``)
are uploaded with their SHA-256, then its done-marker (``units/<source>/<unit>.json``). A unit whose marker is
there and whose shards still match it is skipped, so a stopped job run again redoes only the rest; a unit named
alike under an earlier key (the same input, tokenizer and settings) is copied from there instead of tokenized.
The host with index 0 then waits for every unit's marker, checks the bad records per source, and writes each
source's ``shards.json`` and the key's ``manifest.json`` last. The layout is :mod:`tiered_training.contract.corpus`'s.

Every source is tokenized whole (not only its share of ``total_tokens``): the trainer samples the sources by
weight over the budget (``training.components.data.MixtureWindows``), repeating a source smaller than its share,
so the shards of one corpus serve every mixture and budget (weights and budget are not in the key).

Host identity: ``/opt/ml/config/resourceconfig.json`` (``current_host``, ``hosts``; ``$TIERED_TRAINING_OPT_ML``
moves ``/opt/ml``), or ``--host-index``/``--host-count``. Bad input exits 2 with one line naming the source, the
file, the record and the reason.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tiered_training.contract.corpus import CORPUS_KEY_VERSION, CORPUS_MANIFEST, CorpusSpec
from training.corpus_readers import Bad, BadData, Unit, documents, plan_units
from training.corpus_store import Store, as_prefix, is_s3, sha256_file
from training.prepare_step import run_step

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
ENCODE_BATCH = 512  # documents per encode_batch call
SHOWN_BAD = 5  # bad records named per unit
PROGRESS_SECONDS = 30.0


@dataclass(frozen=True)
class Settings:
    """What a worker needs besides the unit."""

    base: str  # <prepared><key>/
    tokenizer_file: str  # the fast tokenizer's JSON, local
    eos_token_id: int
    token_dtype: str
    validation_fraction: float
    seed: int
    on_bad_example: str
    unit_material: str  # the tokenizer and settings part of every unit's name


# ---- tokenizer ------------------------------------------------------------------------------------------


class Tokenizer:
    """The Hugging Face tokenizer of ``path`` (a local folder): its fast backend encodes; the end-of-text token
    separates documents."""

    def __init__(self, path: Path, uri: str):
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as error:
            raise BadData(f"tokenizer {uri}: not a Hugging Face tokenizer transformers can load ({error})") from None
        if not getattr(tok, "is_fast", False):
            raise BadData(f"tokenizer {uri}: no fast tokenizer (tokenizer.json); the Prepare step needs one")
        if tok.eos_token_id is None:
            raise BadData(f"tokenizer {uri}: no eos_token; it separates the documents")
        self.uri = uri
        self.vocab_size = len(tok)
        self.eos_token_id = int(tok.eos_token_id)
        self.fast_file = path.parent / "tokenizer.fast.json"
        tok.backend_tokenizer.save(str(self.fast_file))
        digest = hashlib.sha256()
        for file in sorted(p for p in path.iterdir() if p.is_file()):
            digest.update(file.name.encode() + b"\0" + bytes.fromhex(sha256_file(file)))
        self.fingerprint = digest.hexdigest()


def fetch_tokenizer(store: Store, uri: str, work: Path) -> Tokenizer:
    """The tokenizer's files (the top level of ``uri``, weights left out) copied to ``work`` and loaded."""
    objects = [o for o in store.list(uri) if "/" not in o.relative and not o.relative.endswith(WEIGHT_SUFFIXES)]
    if not objects:
        raise BadData(f"tokenizer {uri}: no files under it; give the folder (or S3 prefix) of a Hugging Face tokenizer")
    target = work / "tokenizer"
    for obj in objects:
        store.download(obj.uri, target / obj.relative)
    return Tokenizer(target, uri)


# ---- planning: the key, the units, the hosts --------------------------------------------------------------


def list_units(spec: CorpusSpec, store: Store) -> list[Unit]:
    units: list[Unit] = []
    for source in spec.sources:
        units.extend(plan_units(source, store.list(source.uri), spec.ignore, store))
    return units


def unit_material(spec: CorpusSpec, tokenizer: Tokenizer) -> str:
    return json.dumps(
        {
            "version": CORPUS_KEY_VERSION,
            "tokenizer": tokenizer.fingerprint,
            "token_dtype": spec.token_dtype,
            "validation_fraction": spec.validation_fraction,
            "seed": spec.seed,
        },
        sort_keys=True,
    )


def unit_name(unit: Unit, material: str) -> str:
    return hashlib.sha256((material + json.dumps(unit.material(), sort_keys=True)).encode()).hexdigest()[:24]


def content_key(spec: CorpusSpec, tokenizer: Tokenizer, units: list[Unit]) -> str:
    """The inputs (each unit's file, ETag and size), the tokenizer's files, the settings and the code's version.
    The weights and the budget are left out: the shards hold every source whole."""
    material = {
        "units": unit_material(spec, tokenizer),
        "sources": [[s.name, s.uri, s.format, s.field] for s in spec.sources],
        "inputs": [u.material() for u in units],
        "on_bad_example": spec.on_bad_example,
        "max_bad_fraction": spec.max_bad_fraction,
        "ignore": spec.ignore,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def assign(units: list[Unit], hosts: int) -> list[int]:
    """Each unit's host: the largest unit first, to the host with the fewest bytes so far (ties: the lowest)."""
    load = [0] * hosts
    owner = [0] * len(units)
    for index in sorted(range(len(units)), key=lambda i: (-units[i].size, i)):
        host = min(range(hosts), key=lambda h: (load[h], h))
        owner[index] = host
        load[host] += max(1, units[index].size)
    return owner


def host_identity(args: argparse.Namespace) -> tuple[int, int, str]:
    """``(index, count, name)`` of this host."""
    if args.host_index is not None or args.host_count is not None:
        count = args.host_count or 1
        index = args.host_index or 0
        if not 0 <= index < count:
            raise BadData(f"--host-index {index} is not below --host-count {count}")
        return index, count, f"host {index}"
    opt_ml = Path(os.environ.get("TIERED_TRAINING_OPT_ML", "/opt/ml"))
    path = Path(args.resource_config) if args.resource_config else opt_ml / "config" / "resourceconfig.json"
    if not path.is_file():
        return 0, 1, "host 0"
    try:
        config = json.loads(path.read_text())
        hosts, current = config["hosts"], config["current_host"]
    except (ValueError, KeyError, TypeError) as error:
        raise BadData(f"{path}: not a resource config with hosts and current_host ({error})") from None
    ordered = sorted(hosts, key=_host_key)
    if current not in ordered:
        raise BadData(f"{path}: current_host {current!r} is not in hosts {ordered}")
    return ordered.index(current), len(ordered), current


def _host_key(host: str) -> tuple[str, int]:
    stem, _, number = host.rpartition("-")  # algo-2 before algo-10
    return (stem, int(number)) if number.isdigit() else (host, -1)


# ---- one unit ----------------------------------------------------------------------------------------------


class _Split:
    """One output file of a unit: ids appended, counted and hashed as they are written."""

    def __init__(self, path: Path, dtype: str):
        self.path, self.dtype = path, np.dtype(dtype).newbyteorder("<")
        self.handle = open(path, "wb")
        self.digest = hashlib.sha256()
        self.tokens = self.documents = self.bytes = 0
        self.max_token_id = -1

    def write(self, ids: list[int], documents: int) -> None:
        if not ids:
            return
        array = np.asarray(ids, dtype=self.dtype)
        data = array.tobytes()
        self.handle.write(data)
        self.digest.update(data)
        self.tokens += len(array)
        self.bytes += len(data)
        self.documents += documents
        self.max_token_id = max(self.max_token_id, int(array.max()))

    def close(self) -> None:
        self.handle.close()


_worker: dict = {}


def _init_worker(settings: Settings) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per process: the pool is the parallelism
    from tokenizers import Tokenizer as FastTokenizer

    tokenizer = FastTokenizer.from_file(settings.tokenizer_file)
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    _worker.update(settings=settings, encode=encode, store=Store(), work=Path(tempfile.mkdtemp(prefix="corpus-unit-")))


def prepare_unit(unit: Unit, name: str) -> dict:
    """Tokenize one unit, upload its shards, then its marker; returns the marker."""
    settings: Settings = _worker["settings"]
    store: Store = _worker["store"]
    work: Path = _worker["work"]
    encode = _worker["encode"]
    eos = settings.eos_token_id
    limit = np.iinfo(settings.token_dtype).max
    splits = {s: _Split(work / f"{name}.{s}.bin", settings.token_dtype) for s in ("train", "validation")}
    rng = np.random.default_rng([settings.seed, int(name[:16], 16)])
    bad: Counter = Counter()
    shown: list[str] = []
    records = 0
    batch: list[str] = []

    def flush() -> None:
        if not batch:
            return
        held = rng.random(len(batch)) < settings.validation_fraction  # by the document's position in the unit
        out: dict[str, list[int]] = {"train": [], "validation": []}
        counts = {"train": 0, "validation": 0}
        for encoding, hold in zip(encode(batch, add_special_tokens=False), held):
            split = "validation" if hold else "train"
            out[split].extend(encoding.ids)
            out[split].append(eos)
            counts[split] += 1
        for split, ids in out.items():
            splits[split].write(ids, counts[split])
        batch.clear()

    try:
        for doc in documents(unit, store, work):
            records += 1
            if isinstance(doc, Bad):
                message = f"source {unit.source}: {unit.place(doc.number)}: {doc.reason}" + (
                    f" ({doc.detail})" if doc.detail else ""
                )
                if settings.on_bad_example == "error":
                    raise BadData(message + "; fix the record, or set on_bad_example: skip with a max_bad_fraction")
                bad[doc.reason] += 1
                if len(shown) < SHOWN_BAD:
                    shown.append(message)
                continue
            batch.append(doc)
            if len(batch) >= ENCODE_BATCH:
                flush()
        flush()
    finally:
        for split in splits.values():
            split.close()
    if max(s.max_token_id for s in splits.values()) > limit:
        raise BadData(f"{unit.label}: token ids above {limit} do not fit {settings.token_dtype}; use uint32")
    shards: dict[str, dict | None] = {}
    for split_name, split in splits.items():
        if not split.tokens:
            shards[split_name] = None
            split.path.unlink()
            continue
        entry = {
            "file": f"{name}.bin",
            "tokens": split.tokens,
            "bytes": split.bytes,
            "sha256": split.digest.hexdigest(),
            "max_token_id": split.max_token_id,
            "source": unit.source,
        }
        store.put_file(split.path, shard_uri(settings.base, split_name, unit.source, name), str(entry["sha256"]))
        split.path.unlink()
        shards[split_name] = entry
    marker = {
        "unit": name,
        "source": unit.source,
        "file": unit.uri,
        "row_group": unit.row_group,
        "input": unit.material(),
        "records": records,
        "documents": {s: splits[s].documents for s in splits},
        "bad": dict(bad),
        "bad_shown": shown,
        "shards": shards,
    }
    store.put_bytes(marker_uri(settings.base, unit.source, name), json.dumps(marker, indent=1).encode())
    shutil.rmtree(work / "saved", ignore_errors=True)
    return marker


def shard_uri(base: str, split: str, source: str, name: str) -> str:
    return f"{base}{split}/{source}/{name}.bin"


def marker_uri(base: str, source: str, name: str) -> str:
    return f"{base}units/{source}/{name}.json"


def marker_ok(store: Store, base: str, name: str, marker: dict | None) -> bool:
    """Whether a unit's marker is there and its shards still match it."""
    if not isinstance(marker, dict) or marker.get("unit") != name:
        return False
    for split, entry in (marker.get("shards") or {}).items():
        if entry and not store.matches(shard_uri(base, split, marker["source"], name), entry["bytes"], entry["sha256"]):
            return False
    return True


def read_marker(store: Store, uri: str) -> dict | None:
    data = store.read_bytes(uri)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


# ---- a host's share ------------------------------------------------------------------------------------------


def earlier_keys(store: Store, prepared: str, key: str) -> list[str]:
    """The other keys' prefixes under ``prepared`` (where a unit of the same name may be done already)."""
    if not is_s3(prepared):
        root = Path(prepared)
        return (
            [f"{as_prefix(str(p))}" for p in sorted(root.iterdir()) if p.is_dir() and p.name != key]
            if root.is_dir()
            else []
        )
    from training.corpus_store import split_uri

    bucket, prefix = split_uri(as_prefix(prepared))
    found = []
    for page in store.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            if common["Prefix"] != f"{prefix}{key}/":
                found.append(f"s3://{bucket}/{common['Prefix']}")
    return found


def copy_unit(store: Store, old: str, base: str, name: str, marker: dict) -> None:
    for split, entry in (marker.get("shards") or {}).items():
        if entry:
            source = shard_uri(old, split, marker["source"], name)
            target = shard_uri(base, split, marker["source"], name)
            if is_s3(source):
                from training.corpus_store import split_uri

                bucket, key = split_uri(target)
                from_bucket, from_key = split_uri(source)
                store.client.copy_object(
                    Bucket=bucket,
                    Key=key,
                    CopySource={"Bucket": from_bucket, "Key": from_key},
                    ChecksumAlgorithm="SHA256",
                )
            else:
                Path(target).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
    store.put_bytes(marker_uri(base, marker["source"], name), json.dumps(marker, indent=1).encode())


def run_units(
    todo: list[tuple[Unit, str]], settings: Settings, processes: int, log: Callable[[str], None]
) -> Iterable[dict]:
    """Tokenize ``todo`` on ``processes`` processes, yielding each marker as its unit finishes."""
    if processes <= 1:
        _init_worker(settings)
        for unit, name in todo:
            yield prepare_unit(unit, name)
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_init_worker, initargs=(settings,)) as pool:
        pending = {pool.submit(prepare_unit, unit, name) for unit, name in todo}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        finally:
            for future in pending:
                future.cancel()


def prepare(
    spec: CorpusSpec,
    prepared: str,
    *,
    host_index: int = 0,
    host_count: int = 1,
    host_name: str = "host 0",
    processes: int | None = None,
    wait_timeout: float = 6 * 3600.0,
    poll_seconds: float = 10.0,
    store: Store | None = None,
    work: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """This host's part of the Prepare step; returns what the property file says."""
    store = store or Store()
    work = Path(work or tempfile.mkdtemp(prefix="corpus-prepare-"))
    prepared = as_prefix(prepared)
    tokenizer = fetch_tokenizer(store, spec.tokenizer, work)
    if tokenizer.vocab_size - 1 > np.iinfo(spec.token_dtype).max:
        raise BadData(
            f"token_dtype {spec.token_dtype} cannot hold the tokenizer's ids up to "
            f"{tokenizer.vocab_size - 1}; use uint32"
        )
    units = list_units(spec, store)
    key = content_key(spec, tokenizer, units)
    base = f"{prepared}{key}/"
    found = {"key": key, "uri": f"{base}train/", "validation_uri": f"{base}validation/"}
    if store.exists(base + CORPUS_MANIFEST):
        log(f"reusing prepared corpus {key}: {base} ({len(units)} units, unchanged)")
        return {**found, "reused": True}
    material = unit_material(spec, tokenizer)
    names = [unit_name(u, material) for u in units]
    owner = assign(units, host_count)
    mine = [(u, n) for u, n, h in zip(units, names, owner) if h == host_index]
    log(
        f"preparing corpus {key} on {host_name} ({host_index + 1} of {host_count}): "
        f"{len(mine)} of {len(units)} units, {sum(u.size for u, _ in mine):,} bytes"
    )
    todo = []
    reused = copied = 0
    others = earlier_keys(store, prepared, key)
    for unit, name in mine:
        if marker_ok(store, base, name, read_marker(store, marker_uri(base, unit.source, name))):
            reused += 1
            continue
        for old in others:
            marker = read_marker(store, marker_uri(old, unit.source, name))
            if marker_ok(store, old, name, marker):
                assert marker is not None
                copy_unit(store, old, base, name, marker)
                copied += 1
                break
        else:
            todo.append((unit, name))
    if reused or copied:
        log(f"{reused} unit(s) already done, {copied} copied from an earlier key, {len(todo)} to tokenize")
    settings = Settings(
        base,
        str(tokenizer.fast_file),
        tokenizer.eos_token_id,
        spec.token_dtype,
        spec.validation_fraction,
        spec.seed,
        spec.on_bad_example,
        material,
    )
    processes = processes or len(os.sched_getaffinity(0))
    todo.sort(key=lambda pair: -pair[0].size)  # the largest first: the pool ends together
    started, last, tokens = time.monotonic(), 0.0, 0
    for done, marker in enumerate(run_units(todo, settings, min(processes, max(1, len(todo))), log), start=1):
        tokens += sum(e["tokens"] for e in marker["shards"].values() if e)
        now = time.monotonic()
        if now - last >= PROGRESS_SECONDS or done == len(todo):
            rate = tokens / max(now - started, 1e-9)
            log(f"{host_name}: {done}/{len(todo)} units tokenized, {tokens:,} tokens, {rate:,.0f} tokens/s")
            last = now
    if host_index != 0:
        return {**found, "reused": False}
    markers = wait_for_units(store, base, units, names, owner, wait_timeout, poll_seconds, log)
    write_manifests(spec, tokenizer, store, base, key, units, names, markers, host_count, log)
    return {**found, "reused": False}


def wait_for_units(
    store: Store,
    base: str,
    units: list[Unit],
    names: list[str],
    owner: list[int],
    timeout: float,
    poll: float,
    log: Callable[[str], None],
) -> dict[str, dict]:
    """Every unit's marker, once all are there; BadData naming the missing units and their hosts at ``timeout``."""
    deadline = time.monotonic() + timeout
    sources = sorted({u.source for u in units})
    while True:
        present: set[str] = set()
        for source in sources:
            present.update(o.relative[: -len(".json")] for o in store.list(f"{base}units/{source}/"))
        missing = [i for i, name in enumerate(names) if name not in present]
        if not missing:
            break
        if time.monotonic() >= deadline:
            hosts = Counter(owner[i] for i in missing)
            shown = ", ".join(units[i].label for i in missing[:5])
            raise BadData(
                f"{len(missing)} of {len(units)} units have no done-marker after {timeout:.0f} s, on host(s) "
                + ", ".join(f"{h} ({n} units)" for h, n in sorted(hosts.items()))
                + f": {shown}; those hosts stopped or are still running; run the Prepare step again "
                "(it redoes only the missing units)"
            )
        log(
            f"waiting for {len(missing)} unit(s) of other hosts "
            f"({', '.join(str(h) for h in sorted({owner[i] for i in missing}))})"
        )
        time.sleep(poll)
    markers = {}
    for unit, name in zip(units, names):
        marker = read_marker(store, marker_uri(base, unit.source, name))
        if marker is None or marker.get("unit") != name:
            raise BadData(f"{marker_uri(base, unit.source, name)}: not a done-marker of unit {unit.label}")
        markers[name] = marker
    return markers


def write_manifests(
    spec: CorpusSpec,
    tokenizer: Tokenizer,
    store: Store,
    base: str,
    key: str,
    units: list[Unit],
    names: list[str],
    markers: dict[str, dict],
    host_count: int,
    log: Callable[[str], None],
) -> None:
    """Per source and split ``shards.json``, after checking the bad records per source; ``manifest.json`` last."""
    summary: dict[str, dict] = {}
    for source in spec.sources:
        mine = [markers[n] for u, n in zip(units, names) if u.source == source.name]
        bad: Counter = Counter()
        for marker in mine:
            bad.update(marker["bad"])
        records = sum(m["records"] for m in mine)
        if sum(bad.values()) > spec.max_bad_fraction * records:
            reasons = ", ".join(f"{r}: {c:,}" for r, c in bad.most_common())
            shown = "; ".join(line for m in mine for line in m["bad_shown"])[:1500]
            raise BadData(
                f"source {source.name}: {sum(bad.values()):,} of {records:,} records are bad "
                f"({sum(bad.values()) / max(records, 1):.2%}), more than max_bad_fraction {spec.max_bad_fraction} "
                f"allows ({reasons}): {shown}"
            )
        entry: dict = {
            "records": records,
            "bad": dict(bad),
            "units": len(mine),
            "documents": {},
            "tokens": {},
            "shards": {},
        }
        for split in ("train", "validation"):
            shards = [m["shards"][split] for m in mine if m["shards"].get(split)]
            shards.sort(key=lambda e: e["file"])
            documents = sum(m["documents"][split] for m in mine)
            tokens = sum(e["tokens"] for e in shards)
            listing = {
                "format": "flat little-endian token ids, documents separated by the end-of-text token",
                "dtype": spec.token_dtype,
                "source": source.name,
                "split": split,
                "tokenizer": spec.tokenizer,
                "vocab_size": tokenizer.vocab_size,
                "eos_token_id": tokenizer.eos_token_id,
                "documents": documents,
                "tokens": tokens,
                "shards": shards,
            }
            store.put_bytes(f"{base}{split}/{source.name}/shards.json", json.dumps(listing, indent=1).encode())
            entry["documents"][split], entry["tokens"][split], entry["shards"][split] = documents, tokens, len(shards)
        if not entry["tokens"]["train"]:
            raise BadData(f"source {source.name}: {source.uri}: no training tokens (every document bad or held out)")
        summary[source.name] = entry
        if sum(bad.values()):
            log(f"source {source.name}: skipped {sum(bad.values()):,} bad record(s) of {records:,} ({dict(bad)})")
    manifest = {
        "key": key,
        "version": CORPUS_KEY_VERSION,
        "spec": json.loads(spec.model_dump_json()),
        "token_dtype": spec.token_dtype,
        "tokenizer": {
            "uri": spec.tokenizer,
            "vocab_size": tokenizer.vocab_size,
            "eos_token_id": tokenizer.eos_token_id,
        },
        "hosts": host_count,
        "sources": summary,
    }
    store.put_bytes(base + CORPUS_MANIFEST, json.dumps(manifest, indent=1).encode())
    for name, entry in summary.items():
        log(
            f"source {name}: {entry['documents']['train']:,} documents, {entry['tokens']['train']:,} training tokens, "
            f"{entry['tokens']['validation']:,} validation tokens in {entry['units']} unit(s)"
        )
    log(f"prepared corpus {key}: {base}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.corpus_prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--spec",
        required=True,
        nargs="+",
        help="the CorpusSpec as JSON (tiered_training/contract/corpus.py), whole or in consecutive pieces (the "
        "pipeline splits it: a container argument holds at most 256 characters)",
    )
    parser.add_argument(
        "--prepared", required=True, help="S3 prefix (or folder) under which each key's shards are kept"
    )
    parser.add_argument("--property-file", required=True, type=Path, help="writes {key, uri, validation_uri, reused}")
    parser.add_argument("--host-index", type=int, help="this host's index (default: from resourceconfig.json)")
    parser.add_argument("--host-count", type=int, help="the number of hosts (default: from resourceconfig.json)")
    parser.add_argument("--resource-config", help="default: /opt/ml/config/resourceconfig.json")
    parser.add_argument("--processes", type=int, help="tokenizing processes (default: one per core)")
    parser.add_argument("--wait-timeout", type=float, default=6 * 3600.0, help="seconds host 0 waits for the others")
    parser.add_argument("--poll-seconds", type=float, default=10.0)
    args = parser.parse_args(argv)

    def step(work: Path) -> dict:
        from pydantic import ValidationError

        try:
            spec = CorpusSpec.model_validate_json("".join(args.spec))
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "spec"
            raise BadData(f"--spec: {where}: {first['msg']}") from None
        index, count, name = host_identity(args)
        return prepare(
            spec,
            args.prepared,
            host_index=index,
            host_count=count,
            host_name=name,
            processes=args.processes,
            wait_timeout=args.wait_timeout,
            poll_seconds=args.poll_seconds,
            work=work,
        )

    return run_step("corpus-prepare-", args.property_file, step, BadData)


if __name__ == "__main__":
    sys.exit(main())
