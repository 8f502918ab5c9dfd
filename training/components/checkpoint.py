"""Checkpoints that survive any interruption, on one host or many: DCP async saves, a global
commit decision, checksums, fallback on resume, bounded pruning.

Layout: ``<checkpoint dir>/step-N/`` holds a torch.distributed.checkpoint (``.metadata``
plus ``__<rank>_<i>.distcp`` files) and, once complete, a ``COMMITTED`` marker. On
SageMaker every host has its own checkpoint directory: a host holds only the files its
own ranks wrote (rank 0's host also holds ``.metadata``), and SageMaker uploads every
host's directory to the one S3 prefix, where the files of all hosts meet. A restarted
job gets the whole prefix on every host.

Life of a checkpoint:

1. :meth:`CheckpointManager.save` stages the state to CPU memory and writes it in a
   background thread through a gloo group (``dcp.async_save``); training continues.
   When its write is done, each rank computes the size and SHA-256 of every file it
   wrote (rank 0 also of ``.metadata``), still in the background.
2. At every step boundary :meth:`CheckpointManager.poll` asks all ranks whether that is
   done (one all-reduce). Then the ranks' file lists are gathered on rank 0, which checks
   them against ``.metadata``: every listed file was written by some rank, with at least
   the listed size. Only then does rank 0 write ``COMMITTED``, a JSON manifest of every
   file with its size and checksum. The decision is global: each host checked its own
   files, no host needs the others' files.
3. Pruning, right after each commit: rank 0 keeps the checkpoint just committed and the newest
   ``keep_last - 1`` older committed checkpoints of this run that the directory holds (checked in
   this process, or committed by an earlier execution or segment and restored from S3 at the
   restart), and deletes everything older, plus the damaged ones; a checkpoint that carries
   ``COMMITTED`` but failed a check, or whose manifest disagrees with its name or run, never counts
   as kept. The bound counts what the run holds, not what this process wrote, so it holds across
   resumes and segments; the checkpoint resumed from is deleted only once a newer one is committed.
   The decision is rank 0's, and the first rank of every host deletes the same steps from its own
   disk. Every host therefore holds at most ``keep_last + 1`` checkpoints (the kept ones and the one
   being written). In S3 the bound is looser: each host's sync runs on its own, so until every
   host's sync has carried a deletion to S3, the prefix may also hold a pruned checkpoint;
   a save that starts within that lag (a periodic save followed closely by the final or
   SIGTERM one) is seen as ``keep_last + 2`` (see ``tests/rehearse``).
4. On resume, :meth:`CheckpointManager.resumable_step` takes the newest committed
   checkpoint whose manifest names the directory's step (and, with ``accept``, the run)
   and whose every file is present on every host with the manifest's size and checksum
   (the ranks of each host share the hashing); anything else is skipped with a logged
   reason, falling back to the previous one.

A checkpoint is identified by its manifest, not its directory name: a copy of step 6 placed
as ``step-99`` says ``"step": 6`` in its manifest, and is skipped (and pruned as damaged).

A write that fails on any rank leaves the checkpoint without ``COMMITTED`` (a restart skips it)
and the ones committed before it as they were. DCP reports it as a ``CheckpointException`` (a
``BaseException``) holding each rank's own error; the reason names that error and the rank's host.
A full disk (ENOSPC, EDQUOT), while writing the files or the ``COMMITTED`` marker, does not empty
itself, so it ends the job on every rank with :class:`CheckpointDiskFull`, which says first on which
host and at which path the disk was full; other write failures are logged and training goes on.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from training.components.checkpoint_files import (  # noqa: F401 - the file-level API, re-exported
    COMMITTED,
    METADATA,
    Acceptor,
    check_file,
    find_resumable,
    lineage_problem,
    list_steps,
    listed_files,
    misnamed,
    plan_pruning,
    problems,
    read_manifest,
    saved_keys,
    sha256,
    step_dir,
)
from training.components.fence import LeaseFenced

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

log = logging.getLogger("training.components.checkpoint")

DISK_FULL = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT"}


class CheckpointDiskFull(RuntimeError):
    """A checkpoint could not be written because a disk is full; the checkpoints committed before it are intact."""


@dataclass
class _InFlight:
    step: int
    future: Future  # resolves to {file: {"bytes", "sha256"}} of this rank's files, once written
    started: float
    tokens_seen: int | None = None


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def _local_world() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


class CheckpointManager:
    """Saves, commits, prunes and finds checkpoints under ``root`` (all ranks call every method)."""

    def __init__(
        self,
        root: Path,
        *,
        keep_last: int,
        rank: int,
        save_group: dist.ProcessGroup,
        control_group: dist.ProcessGroup,
        accept: Acceptor | None = None,
        identity: dict[str, Any] | None = None,
        candidate: tuple[int, str] | None = None,
        fence: Callable[[str], None] | None = None,
        writer: dict[str, str] | None = None,
    ):
        """``accept``: rank 0 asks it of every manifest found at resume or pruning; a reason (a
        checkpoint of another run) makes the checkpoint skipped and never kept. ``identity``: the
        run's identity (training/components/identity.py), recorded in every manifest. ``candidate``: the
        probe candidate trained and its summary, recorded in every manifest (a resume with run.candidate 0
        trains it again). ``fence``: rank 0 calls it with what is about to be committed (a checkpoint, a pruning, an
        export) and commits nothing when it raises (training/components/fence.py: the run's lease). ``writer``: the
        pipeline execution and training job that commit, recorded in every manifest (whose history a prefix holds)."""
        self.root = Path(root)
        self.writer = dict(writer or {})
        self.fence = fence
        self.candidate = candidate
        self.accept = accept
        self.identity = identity
        self.keep_last = max(1, keep_last)
        self.rank = rank
        self.save_group = save_group
        self.control_group = control_group
        self.in_flight: _InFlight | None = None
        self.last_committed: int | None = None
        self.verified: set[int] = set()  # checkpoints checked in this process (committed here, or at resume)
        self.damaged: set[int] = set()  # committed or not, found unusable at resume

    # -- saving ------------------------------------------------------------------

    def save(
        self, step: int, state: dict[str, Any], *, blocking: bool = False, tokens_seen: int | None = None
    ) -> float:
        """Start saving ``state`` as ``step-N``; returns the seconds training was blocked.

        A save still in flight is finished (and committed) first.
        """
        started = time.monotonic()
        self.wait()
        path = step_dir(self.root, step)
        if _local_rank() == 0:  # every host clears its own stale attempt (or a downloaded damaged copy)
            self.root.mkdir(parents=True, exist_ok=True)
            if path.exists():
                shutil.rmtree(path)
        self.verified.discard(step)
        self.damaged.discard(step)
        dist.barrier(group=self.control_group)
        written: Future | AsyncSaveResponse  # an AsyncSaveResponse only with an async stager
        if blocking:
            done: Future = Future()
            try:
                dcp.save(state, checkpoint_id=str(path), process_group=self.save_group)
                done.set_result(None)
            except (Exception, CheckpointException) as exc:  # decided on in _commit, on every rank
                done.set_exception(exc)
            written = done
        else:
            written = dcp.async_save(state, checkpoint_id=str(path), process_group=self.save_group)
        self.in_flight = _InFlight(step, _then_checksum(written, path, self.rank), started, tokens_seen)
        if blocking:
            self.wait()
        return time.monotonic() - started

    def poll(self) -> int | None:
        """Commit the in-flight save if every rank has finished writing; returns its step if committed.

        Collective on the control group: every rank calls it at the same step boundary.
        """
        if self.in_flight is None:
            return None
        done = torch.tensor([0 if self.in_flight.future.done() else 1])
        dist.all_reduce(done, op=dist.ReduceOp.MAX, group=self.control_group)
        if done.item():
            return None
        return self._commit()

    def wait(self) -> int | None:
        """Block until the in-flight save is written, then commit it."""
        if self.in_flight is None:
            return None
        try:
            self.in_flight.future.result()
        except (Exception, CheckpointException):  # noqa: BLE001 - reported (and decided on) in _commit
            pass
        return self._commit()

    def _commit(self) -> int | None:
        flight, self.in_flight = self.in_flight, None
        assert flight is not None  # poll and wait commit only a save in flight
        path = step_dir(self.root, flight.step)
        try:
            mine, failures = flight.future.result(), []
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - a failed write on any rank means no commit
            mine, failures = {}, write_failures(exc, self.rank)
        gathered: list | None = [None] * dist.get_world_size(self.control_group) if self.rank == 0 else None
        dist.gather_object((mine, failures, _host()), gathered, dst=0, group=self.control_group)
        doomed: list[int] = []
        committed = False
        disk_full = None
        fenced = None
        if self.rank == 0:
            assert gathered is not None  # rank 0 gathers
            hosts = [host for _, _, host in gathered]  # by rank: the control group spans every rank
            files: dict[str, dict] = {}
            causes = list(dict.fromkeys(cause for _, rank_failures, _ in gathered for cause in rank_failures))
            for rank_files, _, _ in gathered:
                files.update(rank_files or {})
            issues = [_describe(cause, hosts) for cause in causes] or _check_against_metadata(path, files)
            full = next((cause for cause in causes if cause.code), None)
            if not issues:
                fenced = self._fenced(f"checkpoint step-{flight.step}")
            if not issues and not fenced:
                committed, full = self._write_marker(flight, path, files, hosts, issues)
            if fenced:
                log.error("%s", fenced)
            elif issues:
                log.error("checkpoint step-%d NOT committed: %s", flight.step, "; ".join(issues))
                if full:
                    disk_full = self._disk_full_reason(flight.step, full, hosts, issues)
            else:
                log.info(
                    "checkpoint step-%d committed (%.1f s after the save started)",
                    flight.step,
                    time.monotonic() - flight.started,
                )
                self.verified.add(flight.step)
                for step, reason in misnamed(self.root, self.accept).items():
                    if step not in self.damaged:
                        log.warning("checkpoint step-%d is not this run's (%s): pruned as damaged", step, reason)
                    self.damaged.add(step)
                    self.verified.discard(step)
                steps = list_steps(self.root)
                doomed = plan_pruning(
                    steps, self.verified, self.damaged, self.keep_last, committed=flight.step, held=self._held(steps)
                )
                if doomed and (fenced := self._fenced("pruning " + ", ".join(f"step-{s}" for s in doomed))):
                    log.error("%s", fenced)
                    doomed = []
        # Rank 0 decides; the first rank of every host deletes its local copies.
        shared: list[Any] = [committed, doomed, disk_full, fenced]
        dist.broadcast_object_list(shared, src=0, group=self.control_group)
        committed, doomed, disk_full, fenced = shared
        self._delete(doomed)
        dist.barrier(group=self.control_group)
        if fenced:
            raise LeaseFenced(fenced)
        if disk_full:
            raise CheckpointDiskFull(disk_full)
        if not committed:
            return None
        self.verified.add(flight.step)
        self.verified.difference_update(doomed)
        self.last_committed = flight.step
        return flight.step

    def _write_marker(
        self, flight: _InFlight, path: Path, files: dict[str, dict], hosts: list[str], issues: list[str]
    ) -> tuple[bool, WriteFailure | None]:
        """Rank 0: write ``COMMITTED`` (through a temporary file); whether it was written, and the failure when the
        disk was full. A failed write is added to ``issues`` and leaves no marker."""
        manifest = {
            "step": flight.step,
            "committed_at": round(time.time(), 3),
            "world_size": dist.get_world_size(),
            "files": dict(sorted(files.items())),
        }
        if self.candidate is not None:
            manifest["candidate"], manifest["candidate_summary"] = self.candidate
        if self.writer:
            manifest["writer"] = self.writer
        manifest.update(run_entry(self.identity, flight.step, flight.tokens_seen))
        marker = path / COMMITTED
        tmp = path / (COMMITTED + ".tmp")
        try:
            tmp.write_text(json.dumps(manifest, indent=1))
            os.replace(tmp, marker)
            _fsync_dir(path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            failure = WriteFailure(self.rank, f"{type(exc).__name__}: {exc}", _disk_full(exc), str(marker), True)
            issues.append(_describe(failure, hosts))
            return False, failure if failure.code else None
        return True, None

    def _disk_full_reason(self, step: int, full: WriteFailure, hosts: list[str], issues: list[str]) -> str:
        """What a full disk did, first: on which host, at which path, while doing what; then what is left."""
        host = hosts[full.rank] if full.rank < len(hosts) else f"of rank {full.rank}"
        doing = f"committing checkpoint step-{step} (its {COMMITTED} marker)" if full.marker else f"writing step-{step}"
        where = full.path or step_dir(self.root, step)
        before = f"step-{self.last_committed}" if self.last_committed is not None else "none in this job"
        return (
            f"the disk is full on host {host} at {where} ({full.code}) while {doing}: checkpoint step-{step} is NOT "
            f"committed; the checkpoints committed before it are intact (the newest: {before}); free space "
            f"under {self.root} on {host} (fewer checkpoints: checkpoint.keep_last) or give the job a larger "
            f"volume ({'; '.join(issues)})"
        )

    def _held(self, steps: list[int]) -> set[int]:
        """Rank 0: the committed checkpoints of this run in the directory (from earlier executions and segments too,
        restored from S3 on every host at a restart), whether or not this process checked them."""
        return {s for s in steps if s not in self.damaged and read_manifest(step_dir(self.root, s)) is not None}

    def _fenced(self, what: str) -> str | None:
        """Rank 0: why ``what`` may not be committed (the fence refused it), or None."""
        if self.fence is None:
            return None
        try:
            self.fence(what)
        except Exception as exc:  # noqa: BLE001 - any failure to prove the lease refuses the commit
            return str(exc)
        return None

    def prove(self, what: str) -> None:
        """Collective: raise :class:`LeaseFenced` on every rank unless rank 0's fence allows ``what`` (only the
        lease's host has a fence, so every rank takes part)."""
        reason: list[Any] = [self._fenced(what) if self.rank == 0 else None]
        dist.broadcast_object_list(reason, src=0, group=self.control_group)
        if reason[0]:
            if self.rank == 0:
                log.error("%s", reason[0])
            raise LeaseFenced(reason[0])

    def _delete(self, steps: list[int]) -> None:
        if _local_rank() == 0:
            for step in steps:
                shutil.rmtree(step_dir(self.root, step), ignore_errors=True)
                if self.rank == 0:
                    log.info("pruned checkpoint step-%d", step)
        self.damaged.difference_update(steps)

    # -- loading -----------------------------------------------------------------

    def resumable_step(self) -> int | None:
        """The newest checkpoint that is complete and unchanged on every host; all ranks get its step.

        Rank 0 reads each candidate's manifest; every host checks every file (its ranks share
        the hashing), since after a restart any rank may read any file. Skips are logged.
        """
        candidates: list = [list_steps(self.root)] if self.rank == 0 else [None]
        dist.broadcast_object_list(candidates, src=0, group=self.control_group)
        for step in candidates[0]:
            issues = self._verify_everywhere(step)
            if not issues:
                if self.rank == 0:
                    log.info("resuming from checkpoint step-%d", step)
                self.verified.add(step)
                return step
            self.damaged.add(step)
            if self.rank == 0:
                log.warning("skipping checkpoint step-%d: %s", step, "; ".join(issues))
        return None

    def _verify_everywhere(self, step: int) -> list[str]:
        path = step_dir(self.root, step)
        header: list = [None]
        if self.rank == 0:
            manifest = read_manifest(path)
            if manifest is None:
                header[0] = ("issues", ["not committed (no COMMITTED marker: the save did not finish)"])
            elif lineage := lineage_problem(path, manifest, self.accept):
                header[0] = ("issues", [lineage])
            elif not manifest.get("files"):  # a marker without a manifest: sizes from .metadata only
                header[0] = ("issues", problems(path))
            else:
                header[0] = ("files", manifest["files"])
        dist.broadcast_object_list(header, src=0, group=self.control_group)
        kind, value = header[0]
        if kind == "issues":
            return value
        mine = []
        names = sorted(value)
        for index, name in enumerate(names):
            if index % _local_world() == _local_rank():
                issue = check_file(path, name, int(value[name]["bytes"]), value[name].get("sha256"))
                if issue:
                    mine.append(f"{issue} on host {_host()}")
        gathered: list = [None] * dist.get_world_size(self.control_group)
        dist.all_gather_object(gathered, mine, group=self.control_group)
        return sorted({issue for issues in gathered for issue in issues})

    def load(self, step: int, state: dict[str, Any]) -> None:
        dcp.load(state, checkpoint_id=str(step_dir(self.root, step)), process_group=self.save_group)

    def saved_keys(self, step: int) -> set[str]:
        """Top-level keys in a checkpoint; rank 0 reads them, all ranks get them."""
        keys: list = [saved_keys(step_dir(self.root, step)) if self.rank == 0 else None]
        dist.broadcast_object_list(keys, src=0, group=self.control_group)
        return keys[0]


@dataclass(frozen=True)
class WriteFailure:
    """One rank's failed checkpoint write: the rank, its error, ``ENOSPC``/``EDQUOT`` when a disk was full, the file
    it was writing (when the error names one), and whether it was the ``COMMITTED`` marker."""

    rank: int
    error: str
    code: str | None = None
    path: str | None = None
    marker: bool = False


def write_failures(exc: BaseException, rank: int) -> list[WriteFailure]:
    """A failed checkpoint write, by failing rank. DCP's ``CheckpointException`` holds each failing rank's own error
    (its message is only their ranks); a full disk is named as such, with the file being written."""
    if isinstance(exc, CheckpointException):
        causes = sorted(((r, pair[0]) for r, pair in exc.failures.items()), key=lambda item: item[0])
    else:
        causes = [(rank, exc)]
    return [
        WriteFailure(failed, f"{type(cause).__name__}: {cause}".replace("\n", " "), _disk_full(cause), _filename(cause))
        for failed, cause in causes
    ]


def _describe(failure: WriteFailure, hosts: list[str]) -> str:
    """One failure in words, naming the host of the rank (``hosts`` by rank)."""
    where = f"host {hosts[failure.rank]} rank {failure.rank}" if failure.rank < len(hosts) else f"rank {failure.rank}"
    text = f"{where}: the write failed ({failure.error})"
    return f"{text}: no space left on the disk ({failure.code})" if failure.code else text


def _filename(exc: BaseException | None) -> str | None:
    """The file an OSError (or what caused it) names."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.filename:
            return str(exc.filename)
        exc = exc.__cause__ or exc.__context__
    return None


def _disk_full(exc: BaseException | None) -> str | None:
    """``ENOSPC`` or ``EDQUOT`` when ``exc`` (or what caused it) is a write to a full disk, else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            return DISK_FULL[exc.errno]
        if "No space left on device" in str(exc):
            return "ENOSPC"
        exc = exc.__cause__ or exc.__context__
    return None


def run_entry(identity: dict[str, Any] | None, step: int, tokens_seen: int | None) -> dict[str, Any]:
    """The manifest's ``run`` entry: the run's identity at this step (nothing outside a run)."""
    if not identity:
        return {}
    return {"run": {**identity, "step": step, "tokens_seen": tokens_seen}}


def _check_against_metadata(path: Path, files: dict[str, dict]) -> list[str]:
    """Rank 0: every file ``.metadata`` lists was written by some rank, at least as long as listed."""
    if METADATA not in files:
        return [f"{METADATA} was not written"]
    try:
        needed = listed_files(path)
    except Exception as exc:  # noqa: BLE001
        return [f"{METADATA} is unreadable ({type(exc).__name__}: {exc})"]
    issues = []
    for name, size in sorted(needed.items()):
        if name not in files:
            issues.append(f"{name} is listed in {METADATA} but no rank wrote it")
        elif files[name]["bytes"] < size:
            issues.append(f"{name} is truncated ({files[name]['bytes']} of {size} bytes)")
    return issues


def _then_checksum(written: Any, path: Path, rank: int) -> Future:
    """A future of this rank's written files with their sizes and checksums, computed in the
    background once the DCP write is done."""
    result: Future = Future()

    def work() -> None:
        try:
            if hasattr(written, "upload_completion"):  # AsyncSaveResponse
                written.upload_completion.result()
            else:
                written.result()
            own = sorted(p for p in Path(path).glob(f"__{rank}_*") if p.is_file())
            if rank == 0 and (Path(path) / METADATA).is_file():
                own.append(Path(path) / METADATA)
            for file in own:  # written by this process; on disk before anyone reads the manifest
                _fsync(file)
            result.set_result({p.name: {"bytes": p.stat().st_size, "sha256": sha256(p)} for p in own})
        except BaseException as exc:  # noqa: BLE001 - surfaced by _commit
            result.set_exception(exc)

    threading.Thread(target=work, name=f"checksum-step-{path.name}", daemon=True).start()
    return result


def _host() -> str:
    return os.environ.get("SM_CURRENT_HOST") or f"node-{os.environ.get('GROUP_RANK', '0')}"


def _fsync(file: Path) -> None:
    try:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _fsync_dir(path: Path) -> None:
    _fsync(path)
