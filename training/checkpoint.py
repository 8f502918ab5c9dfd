"""Checkpoints that survive any interruption: DCP async saves, commit markers, fallback on resume.

Layout: ``<checkpoint dir>/step-N/`` holds a torch.distributed.checkpoint (``.metadata``
plus ``__<rank>_<i>.distcp`` files) and, once complete, a ``COMMITTED`` marker.

Life of a checkpoint:

1. :meth:`CheckpointManager.save` stages the state to CPU memory and writes it in a
   background thread through a gloo group (``dcp.async_save``); training continues.
2. At every step boundary :meth:`CheckpointManager.poll` asks all ranks whether their
   write is done (one all-reduce on a second gloo group). Once all are, each rank checks
   that the files it wrote, as listed in ``.metadata``, exist with the listed sizes;
   rank 0 also checks ``.metadata``. Only if every check passes does rank 0 write
   ``COMMITTED``, and then it picks all but the last ``keep_last`` committed checkpoints for
   pruning; the first rank on every host deletes its local copies.
3. On resume, :func:`find_resumable` takes the newest committed checkpoint whose
   ``.metadata`` and every file it lists are present; anything else is skipped with a
   logged reason, falling back to the previous one. Rank 0 decides; all ranks follow.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

log = logging.getLogger("training.checkpoint")

COMMITTED = "COMMITTED"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step}"


def list_steps(root: Path) -> list[int]:
    """Steps with a ``step-N`` directory, newest first."""
    if not Path(root).is_dir():
        return []
    steps = [int(m.group(1)) for p in Path(root).iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(steps, reverse=True)


def listed_files(path: Path) -> dict[str, int]:
    """``{relative file: bytes it must hold at least}`` from a checkpoint's ``.metadata``."""
    metadata = FileSystemReader(str(path)).read_metadata()
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    return needed


def problems(path: Path, *, only_rank: int | None = None, need_marker: bool = True) -> list[str]:
    """Why ``path`` is not a complete checkpoint ([] if it is).

    ``only_rank`` restricts the file check to the files that rank wrote.
    """
    path = Path(path)
    if need_marker and not (path / COMMITTED).is_file():
        return ["not committed (no COMMITTED marker: the save did not finish)"]
    if not (path / ".metadata").is_file():
        return [".metadata is missing"]
    try:
        needed = listed_files(path)
    except Exception as exc:  # noqa: BLE001 - a damaged file is a reason, not a crash
        return [f".metadata is unreadable ({type(exc).__name__}: {exc})"]
    found = []
    for name, size in sorted(needed.items()):
        if only_rank is not None and not name.startswith(f"__{only_rank}_"):
            continue
        file = path / name
        if not file.is_file():
            found.append(f"{name} is listed in .metadata but missing")
        elif file.stat().st_size < size:
            found.append(f"{name} is truncated ({file.stat().st_size} of {size} bytes)")
    return found


def find_resumable(root: Path) -> tuple[int | None, list[str]]:
    """The newest complete checkpoint's step (or None), and a reason for each one skipped."""
    skipped = []
    for step in list_steps(root):
        issues = problems(step_dir(root, step))
        if not issues:
            return step, skipped
        skipped.append(f"step-{step}: " + "; ".join(issues))
    return None, skipped


@dataclass
class _InFlight:
    step: int
    future: Any
    started: float


class CheckpointManager:
    """Saves, commits, prunes and finds checkpoints under ``root`` (all ranks call every method)."""

    def __init__(self, root: Path, *, keep_last: int, rank: int, save_group: dist.ProcessGroup, control_group: dist.ProcessGroup):
        self.root = Path(root)
        self.keep_last = max(1, keep_last)
        self.rank = rank
        self.save_group = save_group
        self.control_group = control_group
        self.in_flight: _InFlight | None = None
        self.last_committed: int | None = None

    # -- saving ------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any], *, blocking: bool = False) -> float:
        """Start saving ``state`` as ``step-N``; returns the seconds training was blocked.

        A save still in flight is finished (and committed) first.
        """
        started = time.monotonic()
        self.wait()
        path = step_dir(self.root, step)
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if path.exists():
                shutil.rmtree(path)  # a stale, uncommitted attempt at the same step
        dist.barrier(group=self.control_group)
        if blocking:
            dcp.save(state, checkpoint_id=str(path), process_group=self.save_group)
            done: Future = Future()
            done.set_result(None)
            self.in_flight = _InFlight(step, done, started)
            self.wait()
        else:
            future = dcp.async_save(state, checkpoint_id=str(path), process_group=self.save_group)
            self.in_flight = _InFlight(step, future, started)
        return time.monotonic() - started

    def poll(self) -> int | None:
        """Commit the in-flight save if every rank has finished writing; returns its step if committed.

        Collective on the control group: every rank calls it at the same step boundary.
        """
        if self.in_flight is None:
            return None
        done = torch.tensor([0 if _is_done(self.in_flight.future) else 1])
        dist.all_reduce(done, op=dist.ReduceOp.MAX, group=self.control_group)
        if done.item():
            return None
        return self._commit()

    def wait(self) -> int | None:
        """Block until the in-flight save is written, then commit it."""
        if self.in_flight is None:
            return None
        _result(self.in_flight.future)
        return self._commit()

    def _commit(self) -> int | None:
        flight, self.in_flight = self.in_flight, None
        _result(flight.future)  # re-raises a failed write
        path = step_dir(self.root, flight.step)
        issues = problems(path, only_rank=self.rank, need_marker=False)
        bad = torch.tensor([1 if issues else 0])
        dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=self.control_group)
        if bad.item():
            for issue in issues:
                log.error("checkpoint step-%d is incomplete on rank %d: %s", flight.step, self.rank, issue)
            if self.rank == 0:
                log.error("checkpoint step-%d NOT committed", flight.step)
            return None
        doomed: list[int] = []
        if self.rank == 0:
            issues = problems(path, need_marker=False) if _single_host() else []
            if issues:
                log.error("checkpoint step-%d NOT committed: %s", flight.step, "; ".join(issues))
            else:
                marker = path / COMMITTED
                marker.write_text(f"step {flight.step}\ncommitted {time.time():.3f}\n")
                _fsync_dir(path)
                log.info("checkpoint step-%d committed (%.1f s after the save started)", flight.step, time.monotonic() - flight.started)
                doomed = self.to_prune()
        # Rank 0 decides what to prune; the first rank of every host deletes its local copy.
        shared = [doomed]
        dist.broadcast_object_list(shared, src=0, group=self.control_group)
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            for step in shared[0]:
                shutil.rmtree(step_dir(self.root, step), ignore_errors=True)
                if self.rank == 0:
                    log.info("pruned checkpoint step-%d", step)
        dist.barrier(group=self.control_group)
        self.last_committed = flight.step
        return flight.step

    def to_prune(self) -> list[int]:
        """Rank 0: committed checkpoints beyond the newest ``keep_last``, and incomplete ones older than those kept."""
        steps = list_steps(self.root)
        committed = [s for s in steps if (step_dir(self.root, s) / COMMITTED).is_file()]
        keep = set(committed[: self.keep_last])
        oldest_kept = min(keep) if keep else None
        return [s for s in steps if s not in keep and (s in committed or (oldest_kept is not None and s < oldest_kept))]

    # -- loading -----------------------------------------------------------------

    def resumable_step(self) -> int | None:
        """Rank 0 picks the newest complete checkpoint, logging every skip; all ranks get its step."""
        choice = torch.tensor([-1])
        if self.rank == 0:
            step, skipped = find_resumable(self.root)
            for reason in skipped:
                log.warning("skipping checkpoint %s", reason)
            if step is not None:
                log.info("resuming from checkpoint step-%d", step)
                choice[0] = step
        dist.broadcast(choice, src=0, group=self.control_group)
        return None if choice.item() < 0 else int(choice.item())

    def load(self, step: int, state: dict[str, Any]) -> None:
        dcp.load(state, checkpoint_id=str(step_dir(self.root, step)), process_group=self.save_group)


def _is_done(future: Any) -> bool:
    if hasattr(future, "upload_completion"):  # AsyncSaveResponse
        return future.upload_completion.done()
    return future.done()


def _result(future: Any) -> None:
    if hasattr(future, "upload_completion"):
        future.upload_completion.result()
    else:
        future.result()


def _single_host() -> bool:
    """True when every rank writes to this host's disk (then rank 0 can check every file)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))) == int(os.environ.get("WORLD_SIZE", "1"))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
