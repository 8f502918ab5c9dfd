"""A run's identity: what its checkpoints record, and what a resume must match (docs/runs.md).

Every checkpoint's manifest (the ``COMMITTED`` marker, training/components/checkpoint.py) carries a ``run``
entry: the run id, the recipe, the plan hash and its parts (``RunConfig.identity_parts``: the
model, the sequence length and global batch, the token type and shuffle seed), the data URI,
the data's files (``data_files``: each shard's and manifest's size and checksum, the checksums the
manifests give) with a fingerprint of them, for fine-tuning also the packed shards' own fingerprint
of examples, tokenizer and packing, the world size, the step and the tokens seen. Before torchrun
starts, the launcher compares the newest committed checkpoint's identity with this job's
(:func:`mismatches`) and refuses a resume that would not continue the same run, naming what changed
(the object, by S3 URI) and what to do. Torch is not imported here.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from tiered_training.contract.runconfig import RUN_ID_PATTERN, RunConfig
from training.components.checkpoint_files import COMMITTED, lineage_problem
from training.components.shard_manifest import listing

PART_NAMES = {
    "model": "the model (architecture or starting checkpoint)",
    "batch": "the sequence length or global batch",
    "data": "the token type or data seed",
    "sft": "the fine-tuning settings (adapter, LoRA rank, alpha, dropout or target modules)",
    "dpo": "the preference settings (loss, beta, label smoothing or reference)",
}
SFT_KIND = "sft-packed"


def data_files(data_dir: Path | None) -> dict[str, list[Any]]:
    """The data's shards and manifests for the identity: ``{relative path: [bytes, sha256 prefix or None]}``,
    the checksums the manifests give (training/components/shard_manifest.py; the trainer proves the files
    equal them when it opens the data)."""
    return {name: [size, sha[:16] if sha else None] for name, (size, sha) in listing(data_dir).items()}


def data_fingerprint(data_dir: Path | None, files: dict[str, list[Any]] | None = None) -> str:
    """A short hash of :func:`data_files`: the shards' relative paths, sizes and checksums."""
    files = data_files(data_dir) if files is None else files
    if not files:
        return ""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def names_and_sizes(data_dir: Path | None) -> str:
    """The fingerprint checkpoints saved before ``data_files`` (names, sizes and the manifests' bytes)."""
    if data_dir is None or not Path(data_dir).is_dir():
        return ""
    digest = hashlib.sha256()
    root = Path(data_dir)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and (p.suffix == ".bin" or p.name == "shards.json")):
        digest.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\n".encode())
        if path.name == "shards.json":
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def changed_files(saved: dict[str, list[Any]], current: dict[str, list[Any]], data_uri: str | None) -> str:
    """The objects that differ between two :func:`data_files`, each named (by S3 URI under ``data_uri``)."""

    def name(path: str) -> str:
        return f"{data_uri.rstrip('/')}/{path}" if data_uri else path

    found = [f"{name(p)} was deleted" for p in sorted(set(saved) - set(current))]
    found += [f"{name(p)} is new" for p in sorted(set(current) - set(saved))]
    for path in sorted(set(saved) & set(current)):
        (size, sha), (new_size, new_sha) = saved[path], current[path]
        if size != new_size:
            found.append(f"{name(path)} changed size ({size:,} -> {new_size:,} bytes)")
        elif sha != new_sha:
            found.append(f"{name(path)} changed content (sha256 {sha or 'none'} -> {new_sha or 'none'})")
    shown = found[:5] + ([f"and {len(found) - 5} more"] if len(found) > 5 else [])
    return ", ".join(shown)


def sft_fingerprint(data_dir: Path | None) -> str:
    """The packed SFT shards' own fingerprint (``shards.json`` of kind ``sft-packed``: a hash of the
    examples, the tokenizer and the packing settings), or "" for other data."""
    manifest = Path(data_dir) / "shards.json" if data_dir is not None else None
    if manifest is None or not manifest.is_file():
        return ""
    try:
        found = json.loads(manifest.read_text())
    except (ValueError, OSError):
        return ""
    if not isinstance(found, dict) or found.get("kind") != SFT_KIND:
        return ""
    return str(found.get("fingerprint") or "")


def identity(cfg: RunConfig, data_dir: Path | None, world_size: int) -> dict[str, Any]:
    """This job's run identity, without the step (which the checkpoint adds)."""
    files = data_files(data_dir)
    found = {
        "run_id": cfg.run.id,
        "recipe": cfg.recipe_name,
        "plan_hash": cfg.plan_hash(),
        "plan_parts": cfg.identity_parts(),
        "data_uri": cfg.run.data_uri,
        "data_fingerprint": data_fingerprint(data_dir, files),
        "data_files": files,
        "world_size": world_size,
    }
    if cfg.sft is not None:
        found["sft_data_fingerprint"] = sft_fingerprint(data_dir)
    return found


def committed_manifests(checkpoint_dir: Path) -> list[tuple[int, Path, dict[str, Any]]]:
    """Committed checkpoints under ``checkpoint_dir`` as (manifest step, directory, manifest), newest first.

    The step is the manifest's own; a marker without one is ordered by its directory's name."""
    found: list[tuple[int, Path, dict[str, Any]]] = []
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return found
    for path in root.glob("step-*"):
        marker = path / COMMITTED
        if not marker.is_file():
            continue
        try:
            manifest = json.loads(marker.read_text())
        except (ValueError, OSError):
            manifest = {}
        if not isinstance(manifest, dict):
            manifest = {}
        step = manifest.get("step")
        if not isinstance(step, int):
            tail = path.name.split("-", 1)[1]
            step = int(tail) if tail.isdigit() else -1
        found.append((step, path, manifest))
    return sorted(found, key=lambda entry: entry[0], reverse=True)


def mismatches(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between a checkpoint's run identity and this job's, each with what to do."""
    found = []
    run = current.get("run_id") or "?"
    new_run = "start a new run (leave RunId at 'new'; `tiered-training start` without --resume)"
    if saved.get("run_id") and current.get("run_id") and saved["run_id"] != current["run_id"]:
        found.append(
            f"the checkpoint belongs to run {saved['run_id']!r}, not {run!r}: the prefix holds another run's "
            "checkpoints; resume that run by its own name"
        )
    if saved.get("recipe") and current.get("recipe") and saved["recipe"] != current["recipe"]:
        found.append(f"the checkpoint is of recipe {saved['recipe']!r}, not {current['recipe']!r}; {new_run}")
    saved_parts, parts = saved.get("plan_parts") or {}, current.get("plan_parts") or {}
    changed = [
        name
        for name in PART_NAMES
        if (name in saved_parts or name in ("sft", "dpo") and name in parts)
        and saved_parts.get(name) != parts.get(name)
    ]
    for name in changed:
        found.append(
            f"{PART_NAMES[name]} changed since run {run!r} started (plan {saved.get('plan_hash')} -> "
            f"{current.get('plan_hash')}): its checkpoint cannot carry over; {new_run}, or restore the recipe"
        )
    if saved.get("data_uri") and current.get("data_uri") and saved["data_uri"] != current["data_uri"]:
        found.append(
            f"the data changed: run {run!r} trains on {saved['data_uri']}, this execution gives "
            f"{current['data_uri']}; resume with DataUri={saved['data_uri']}, or {new_run}"
        )
    elif (
        saved.get("sft_data_fingerprint")
        and current.get("sft_data_fingerprint")
        and saved["sft_data_fingerprint"] != current["sft_data_fingerprint"]
    ):
        found.append(
            f"the fine-tuning data at {current.get('data_uri') or 'the train channel'} is not the data run "
            f"{run!r} was trained on (packed-shard fingerprint {saved['sft_data_fingerprint'][:12]} -> "
            f"{current['sft_data_fingerprint'][:12]}: other examples, tokenizer or packing settings), so the "
            f"run's data position does not carry over; restore that data, or {new_run}"
        )
    elif (
        saved.get("data_fingerprint")
        and current.get("data_fingerprint")
        and saved["data_fingerprint"] != current["data_fingerprint"]
    ):
        what = "its shards' names, sizes or checksums differ"
        if isinstance(saved.get("data_files"), dict) and isinstance(current.get("data_files"), dict):
            what = changed_files(saved["data_files"], current["data_files"], current.get("data_uri")) or what
        found.append(
            f"the data at {current.get('data_uri') or 'the train channel'} changed since run {run!r} saved "
            f"step {saved.get('step')} ({what}), so the run's data position does not carry over; restore the "
            f"data, or {new_run}"
        )
    return found


def check_resume(cfg: RunConfig, checkpoint_dir: Path | None, data_dir: Path | None, world_size: int) -> str | None:
    """Why this job may not start (one line with what to do), or None: a run id that cannot name a
    prefix, a resume of a run without a committed checkpoint, or a checkpoint of another run."""
    run = cfg.run
    if run.id and not re.fullmatch(RUN_ID_PATTERN, run.id):
        return (
            f"RunId {run.id!r} is not a run id (letters, digits, '.', '_' and '-', at most 128); "
            "`tiered-training status RECIPE` lists the recipe's runs"
        )
    manifests = committed_manifests(checkpoint_dir) if checkpoint_dir is not None else []
    # As the trainer: a directory whose manifest is of another step (a copy or a rename) is skipped, and so is
    # another run's checkpoint while the run has one of its own.
    manifests = [entry for entry in manifests if lineage_problem(entry[1], entry[2]) is None]
    if run.resume and not manifests:
        return (
            f"run {run.id!r} has no committed checkpoint to resume (its prefix is empty or holds only unfinished "
            "saves); `tiered-training status RECIPE` lists the recipe's runs, or start a new run (RunId=new)"
        )
    own = [entry for entry in manifests if not (run.id and same_run({"run_id": run.id})(entry[2]))]
    for _step, _path, manifest in own or manifests:
        saved = manifest.get("run")
        if isinstance(saved, dict):
            current = identity(cfg, data_dir, world_size)
            if "data_files" not in saved:  # saved before checksums: its fingerprint is of names and sizes
                current["data_fingerprint"] = names_and_sizes(data_dir)
            problems = mismatches(saved, current)
            return f"cannot resume run {run.id!r}: " + "; ".join(problems) if problems else None
    return None


def same_run(current: dict[str, Any]):
    """A checkpoint acceptor (``CheckpointManager(accept=...)``): a manifest of another run is never resumed or kept."""

    def accept(manifest: dict[str, Any]) -> str | None:
        saved = manifest.get("run")
        if isinstance(saved, dict) and saved.get("run_id") and saved["run_id"] != current.get("run_id"):
            return f"a checkpoint of run {saved['run_id']!r}, not of this run {current.get('run_id')!r}"
        return None

    return accept
