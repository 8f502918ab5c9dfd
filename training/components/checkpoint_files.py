"""A checkpoint directory's files, read without torch: steps, the ``COMMITTED`` manifest, the checks
that a checkpoint is whole, and which steps pruning deletes (``training/components/checkpoint.py`` describes the
layout and the life of a checkpoint). Only ``.metadata`` (DCP's pickle) needs torch, imported when
read, so the launcher can look at a resumed job's checkpoints before torchrun starts.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

COMMITTED = "COMMITTED"
METADATA = ".metadata"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_CHUNK = 8 * 1024 * 1024

Acceptor = Callable[[dict[str, Any]], "str | None"]  # a manifest -> why it is not this run's, or None


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step}"


def list_steps(root: Path) -> list[int]:
    """Steps with a ``step-N`` directory, newest first."""
    if not Path(root).is_dir():
        return []
    steps = [int(m.group(1)) for p in Path(root).iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(steps, reverse=True)


def listed_files(path: Path) -> dict[str, int]:
    """``{relative file: bytes it must hold at least}`` from a checkpoint's ``.metadata`` (DCP's pickle: torch)."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(path)).read_metadata()
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    return needed


def saved_keys(path: Path) -> set[str]:
    """Top-level keys of the state saved in a checkpoint (``model``, ``optimizer``, ``train``, ...)."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(path)).read_metadata()
    return {key.split(".", 1)[0] for key in metadata.state_dict_metadata}


def sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The ``COMMITTED`` marker's manifest; ``{}`` for a marker without one, ``None`` without a marker."""
    marker = Path(path) / COMMITTED
    if not marker.is_file():
        return None
    try:
        manifest = json.loads(marker.read_text())
    except (ValueError, OSError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def lineage_problem(path: Path, manifest: dict[str, Any] | None, accept: Acceptor | None = None) -> str | None:
    """Why a committed checkpoint directory is not what its name says, or None.

    The manifest's step must be the directory's step: a copy or a rename of another step's
    checkpoint (``step-6`` copied as ``step-99``) is not step 99. ``accept`` checks the rest of
    the manifest (the run's identity, once manifests record it) and returns a reason or None.
    """
    if manifest is None:
        return None
    match = _STEP_DIR.match(Path(path).name)
    named = int(match.group(1)) if match else None
    recorded = manifest.get("step")
    if recorded is None:
        return "its COMMITTED marker has no manifest step (written by something other than this trainer)"
    if not isinstance(recorded, int) or isinstance(recorded, bool) or recorded != named:
        return f"its manifest is of step {recorded!r}, not {named} (a copy or a rename of another checkpoint)"
    return accept(manifest) if accept is not None else None


def check_file(path: Path, name: str, size: int, checksum: str | None) -> str | None:
    """Why one checkpoint file is unusable, or None."""
    file = Path(path) / name
    if not file.is_file():
        return f"{name} is listed but missing"
    actual = file.stat().st_size
    if actual != size:
        return f"{name} has {actual} bytes; {size} were written"
    if checksum is not None and sha256(file) != checksum:
        return f"{name} fails its checksum (the bytes changed after they were written)"
    return None


def problems(
    path: Path,
    *,
    need_marker: bool = True,
    checksums: bool = True,
    metadata: bool = True,
    accept: Acceptor | None = None,
) -> list[str]:
    """Why ``path`` is not a complete checkpoint on this host ([] if it is): its manifest names
    its step, and every file that ``.metadata`` lists (and the manifest, when there is one) is
    here, whole, unchanged. ``metadata=False`` trusts a manifest's file list without reading
    ``.metadata`` (no torch: the launcher's quick look)."""
    path = Path(path)
    manifest = read_manifest(path)
    if need_marker and manifest is None:
        return ["not committed (no COMMITTED marker: the save did not finish)"]
    if need_marker and (lineage := lineage_problem(path, manifest, accept)):
        return [lineage]
    if not (path / METADATA).is_file():
        return [f"{METADATA} is missing"]
    files = (manifest or {}).get("files") or {}

    def manifest_issues() -> list[str]:
        return [
            issue
            for name, entry in sorted(files.items())
            if (issue := check_file(path, name, int(entry["bytes"]), entry.get("sha256") if checksums else None))
        ]

    if files and not metadata:
        return manifest_issues()
    try:
        needed = listed_files(path)
    except Exception as exc:  # noqa: BLE001 - a damaged file is a reason, not a crash
        return [f"{METADATA} is unreadable ({type(exc).__name__}: {exc})"]
    if files:
        return manifest_issues() + [
            f"{name} is listed in {METADATA} but not in the manifest" for name in sorted(set(needed) - set(files))
        ]
    found = []
    for name, size in sorted(needed.items()):
        file = path / name
        if not file.is_file():
            found.append(f"{name} is listed in {METADATA} but missing")
        elif file.stat().st_size < size:
            found.append(f"{name} is truncated ({file.stat().st_size} of {size} bytes)")
    return found


def find_resumable(
    root: Path, *, checksums: bool = True, metadata: bool = True, accept: Acceptor | None = None
) -> tuple[int | None, list[str]]:
    """On one host: the newest complete checkpoint's step (or None), and a reason for each one skipped.

    ``checksums=False, metadata=False`` checks the manifest's files by size only (the launcher's
    quick look before the job starts, without importing torch)."""
    skipped: list[str] = []
    for step in list_steps(root):
        issues = problems(step_dir(root, step), checksums=checksums, metadata=metadata, accept=accept)
        if not issues:
            return step, skipped
        skipped.append(f"step-{step}: " + "; ".join(issues))
    return None, skipped


def misnamed(root: Path, accept: Acceptor | None = None) -> dict[int, str]:
    """``{step: reason}`` of the committed directories whose manifest disagrees with their name (or run)."""
    found = {}
    for step in list_steps(root):
        reason = lineage_problem(step_dir(root, step), read_manifest(step_dir(root, step)), accept)
        if reason:
            found[step] = reason
    return found


def plan_pruning(
    steps: list[int],
    verified: set[int],
    damaged: set[int],
    keep_last: int,
    in_flight: int | None = None,
    committed: int | None = None,
    held: set[int] | frozenset[int] = frozenset(),
) -> list[int]:
    """Steps to delete: everything older than the kept checkpoints (once there are ``keep_last``),
    and the damaged ones.

    Kept: ``committed`` (the checkpoint just committed) and the newest checkpoints older than it that
    are verified (checked in this process) or ``held`` (committed checkpoints of this run found in the
    directory, from earlier executions or segments), ``keep_last`` in all: the bound counts what the
    run holds, not what this process wrote. Damaged checkpoints never count as kept; neither
    ``committed`` nor the save in flight is ever deleted (the checkpointer prunes only right after a
    commit, so the checkpoint a run resumed from stays until a newer one is committed). ``verified`` and
    ``held`` hold only checkpoints whose manifest names their directory's step, so the order is the
    manifests' order.
    """
    counted = (set(verified) | set(held)) - set(damaged)
    older = sorted(v for v in counted if committed is None or v < committed)
    keep = ([committed] if committed is not None else []) + older
    keep = sorted(keep, reverse=True)[:keep_last] if keep_last > 0 else []
    full = len(keep) >= keep_last and keep
    doomed = []
    for step in steps:
        if step in keep or step == in_flight or step == committed:
            continue
        if step in damaged or (full and step < min(keep)):
            doomed.append(step)
    return sorted(doomed)
