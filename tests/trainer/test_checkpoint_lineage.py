"""Checkpoint lineage: a checkpoint is what its manifest says, not what its directory is called.

Real torch.distributed.checkpoint saves by the real CheckpointManager, on one gloo rank in this
process: a stale copy under a higher step name, pruning after it, a leftover COMMITTED marker
of another host count, and two saves close together.
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from tiny import tiny_config  # noqa: E402

from training.components.checkpoint import CheckpointManager, find_resumable, plan_pruning, step_dir  # noqa: E402
from training.launcher import LaunchError, build_launch  # noqa: E402


@pytest.fixture(scope="module")
def group():
    """One gloo rank in this process (the manager's collectives need a process group)."""
    created = not dist.is_initialized()
    if created:
        from tiered_training.contract.ports import loopback_port

        port = loopback_port()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield dist.new_group(backend="gloo")
    if created:
        dist.destroy_process_group()
    gc.collect()  # free the groups here: a process forked later (a DataLoader worker) must not inherit them


def _manager(root: Path, group, keep_last: int) -> CheckpointManager:
    return CheckpointManager(root, keep_last=keep_last, rank=0, save_group=group, control_group=group)


def _state(step: int) -> dict:
    # a step-dependent state, so a copy of one step is told apart from another by its bytes
    return {"model": {"w": torch.full((64,), float(step))}, "train": {"step": torch.tensor(step)}}


def _save(manager: CheckpointManager, step: int, *, blocking: bool = True) -> None:
    manager.save(step, _state(step), blocking=blocking)


def _held(root: Path) -> list[str]:
    return sorted((p.name for p in root.iterdir() if p.name.startswith("step-")), key=lambda n: int(n[5:]))


def test_a_stale_copy_under_a_higher_step_name_is_skipped_and_the_committed_checkpoints_survive(tmp_path, group, caplog):
    root = tmp_path / "checkpoints"
    first = _manager(root, group, keep_last=3)
    for step in (3, 6, 8):
        _save(first, step)
    shutil.copytree(step_dir(root, 6), step_dir(root, 99))  # step 6, placed as step-99

    second = _manager(root, group, keep_last=1)
    with caplog.at_level(logging.WARNING, logger="training.components.checkpoint"):
        assert second.resumable_step() == 8
    assert "skipping checkpoint step-99: its manifest is of step 6, not 99" in caplog.text
    state = _state(0)
    second.load(8, state)
    assert state["train"]["step"].item() == 8

    _save(second, 9)  # the first save after resuming; keep_last 1
    assert _held(root) == ["step-9"]  # the stale copy is pruned as damaged, the new checkpoint kept
    assert find_resumable(root) == (9, [])


def test_pruning_keeps_the_checkpoint_just_committed_whatever_else_was_verified():
    # A verified checkpoint named above the one just committed never pushes it out.
    assert plan_pruning([99, 9, 8], verified={99, 9, 8}, damaged=set(), keep_last=1, committed=9) == [8]
    assert plan_pruning([12, 9, 6, 3], verified={3, 6, 9, 12}, damaged=set(), keep_last=2, committed=12) == [3, 6]
    assert plan_pruning([12, 9], verified={9, 12}, damaged={12}, keep_last=1, committed=12) == [9]


def test_two_saves_close_together_leave_the_newest_committed_and_keep_last_on_disk(tmp_path, group):
    # A periodic save, and the final (or SIGTERM) save one step later while the first is still in flight.
    root = tmp_path / "checkpoints"
    manager = _manager(root, group, keep_last=1)
    _save(manager, 3)
    _save(manager, 6, blocking=False)
    _save(manager, 7)  # commits step 6 first, then writes and commits step 7
    assert manager.last_committed == 7
    assert _held(root) == ["step-7"]
    assert find_resumable(root) == (7, [])


# -- the launcher's host-count check reads only a checkpoint it would resume --------------------


def _committed_on(root: Path, group, step: int, world: int) -> Path:
    """A real checkpoint whose manifest says it was committed on ``world`` GPUs."""
    manager = _manager(root, group, keep_last=10)
    _save(manager, step)
    marker = step_dir(root, step) / "COMMITTED"
    manifest = json.loads(marker.read_text())
    marker.write_text(json.dumps({**manifest, "world_size": world}))
    return step_dir(root, step)


def _launch_on(hosts: int, checkpoints: Path):
    cfg = tiny_config(hardware={"gpus_per_node": 1})  # planned for 2 GPUs, one micro-batch each
    resources = {"hosts": [f"algo-{i + 1}" for i in range(hosts)], "current_host": "algo-1", "current_instance_type": "cpu"}
    return build_launch(resources, cfg.to_hyperparameters(), {"SM_NUM_GPUS": "1"}, checkpoint_dir=checkpoints)


def test_a_leftover_committed_marker_of_another_host_count_does_not_block_a_restart(tmp_path, group):
    root = tmp_path / "checkpoints"
    _committed_on(root, group, 6, world=2)
    leftover = step_dir(root, 9)  # its files are gone (a deletion that reached S3 half-way); the marker stayed
    leftover.mkdir()
    (leftover / "COMMITTED").write_text(json.dumps({"step": 9, "world_size": 3, "files": {}}))
    assert _launch_on(2, root).nnodes == 2  # resumes step-6, saved on 2 GPUs


def test_a_restart_that_would_change_the_global_batch_of_the_resumable_checkpoint_is_refused(tmp_path, group):
    root = tmp_path / "checkpoints"
    _committed_on(root, group, 6, world=3)
    with pytest.raises(LaunchError, match="cannot resume the checkpoint of a run on 3 GPUs on 2 GPUs"):
        _launch_on(2, root)
    # a misnamed copy of it is not read either
    shutil.move(step_dir(root, 6), step_dir(root, 12))
    assert _launch_on(2, root).nnodes == 2


def test_weights_with_a_nan_or_an_infinity_are_never_saved(group):
    from training.trainer import _finite_everywhere

    weights = {"a": torch.ones(4), "b": torch.zeros(2, 2), "step": torch.tensor(3)}
    assert _finite_everywhere(weights, group)
    for bad in (float("nan"), float("inf")):
        weights["b"][1, 0] = bad
        assert not _finite_everywhere(weights, group)


def test_a_full_disk_during_a_save_names_the_disk_and_keeps_the_committed_checkpoint(tmp_path, group, monkeypatch,
                                                                                      caplog):
    """DCP reports the failed write as a CheckpointException (a BaseException, its message only the ranks): the save
    is not committed, the reason names the disk, and the checkpoint committed before it is untouched."""
    import errno

    from torch.distributed.checkpoint import filesystem

    from training.components.checkpoint import CheckpointDiskFull

    monkeypatch.setenv("SM_CURRENT_HOST", "algo-1")
    root = tmp_path / "checkpoints"
    manager = _manager(root, group, keep_last=2)
    _save(manager, 3)
    before = (step_dir(root, 3) / "COMMITTED").read_bytes()
    write_item = filesystem._write_item

    def full_disk(transforms, stream, *args, **kwargs):
        if "/step-6/" in str(getattr(stream, "name", "")):
            raise OSError(errno.ENOSPC, "No space left on device", stream.name)
        return write_item(transforms, stream, *args, **kwargs)

    monkeypatch.setattr(filesystem, "_write_item", full_disk)
    for blocking in (True, False):
        with caplog.at_level(logging.ERROR, logger="training.components.checkpoint"):
            with pytest.raises(CheckpointDiskFull) as raised:
                _save(manager, 6, blocking=blocking)
                manager.wait()
        message = str(raised.value)
        assert message.startswith(f"the disk is full on host algo-1 at {step_dir(root, 6)}/__0_0.distcp (ENOSPC) while "
                                  "writing step-6: checkpoint step-6 is NOT committed;"), message
        assert "host algo-1 rank 0: the write failed (OSError: " in message and "No space left on device" in message
        assert "the newest: step-3" in message
        assert "\n" not in message and "CheckpointException" not in message
        assert "checkpoint step-6 NOT committed" in caplog.text
        assert not (step_dir(root, 6) / "COMMITTED").exists()
        assert (step_dir(root, 3) / "COMMITTED").read_bytes() == before
        assert find_resumable(root) == (3, ["step-6: not committed (no COMMITTED marker: the save did not finish)"])


def test_a_resume_with_run_candidate_0_trains_the_candidate_its_checkpoint_records(tmp_path, group):
    from training.candidates import apply

    alternative = {"parallel": {"sharding": "full", "shard_group_size": 1}, "micro_batch_size": 4,
                   "grad_accum_steps": 1,
                   "precision": {"precision": "bf16", "activation_checkpointing": "selective"}}
    cfg = tiny_config(probe={"steps": 2, "alternatives": [alternative, alternative]})
    root = tmp_path / "checkpoints"
    assert apply(cfg, root)[1].startswith("training candidate 1 of 3 (fp32, ")  # nothing to resume: the plan's own
    second = cfg.with_candidate(2)
    manager = CheckpointManager(root, keep_last=1, rank=0, save_group=group, control_group=group,
                                candidate=(2, "bf16, selective AC, full shard 1, micro-batch 4 x 1"))
    _save(manager, 4)
    manifest = json.loads((step_dir(root, 4) / "COMMITTED").read_text())
    assert (manifest["candidate"], manifest["candidate_summary"]) == (2, "bf16, selective AC, full shard 1, micro-batch 4 x 1")

    resumed, line = apply(cfg, root)  # run.candidate 0: the recorded one
    assert resumed == second and resumed.batch.micro_batch_size == 4 and resumed.precision.precision == "bf16"
    assert line == ("training candidate 2 of 3 (bf16, selective AC, full shard 1, micro-batch 4 x 1): "
                    "recorded in the checkpoint it resumes")
    chosen, line = apply(cfg.model_copy(update={"run": cfg.run.model_copy(update={"candidate": 3})}), root)
    assert chosen.run.candidate == 3 and "differs from candidate 2 of the checkpoint it resumes" in line
    shrunk = cfg.model_copy(update={"probe": cfg.probe.model_copy(update={"alternatives": []})})
    with pytest.raises(ValueError, match="records probe candidate 2, but this RunConfig has 1"):
        apply(shrunk, root)


# -- bounded across resumes: pruning counts what the run holds, not what this process wrote ------------


def _committed(root: Path) -> list[int]:
    return sorted(s for s in (int(n[5:]) for n in _held(root)) if (step_dir(root, s) / "COMMITTED").is_file())


def test_short_resumes_never_hold_more_than_keep_last_plus_one_committed_checkpoints(tmp_path, group):
    """Each execution resumes the newest checkpoint and commits one or two more (a periodic save, then the SIGTERM or
    segment-end one while the first is in flight): the directory never holds more than keep_last + 1 committed, and
    the checkpoint resumed from stays until a newer one is committed."""
    root, keep_last = tmp_path / "checkpoints", 3
    first = _manager(root, group, keep_last)
    for step in (1, 2):
        _save(first, step)
    counts, step = [], 2
    for execution in range(6):
        manager = _manager(root, group, keep_last)
        resumed = manager.resumable_step()
        assert resumed == step
        state = _state(0)
        manager.load(resumed, state)
        assert state["train"]["step"].item() == resumed
        saves = 1 if execution % 2 else 2
        for _ in range(saves):
            step += 1
            _save(manager, step, blocking=False)  # in flight: committed when the next save starts, or by wait()
            counts.append(len(_committed(root)))
            assert resumed in _committed(root)  # nothing newer is committed yet, or it was kept
        manager.wait()
        counts.append(len(_committed(root)))
    assert max(counts) <= keep_last + 1, counts
    assert _committed(root) == [step - 2, step - 1, step] and _held(root) == [f"step-{s}" for s in _committed(root)]
    assert find_resumable(root) == (step, [])


def test_a_pile_left_by_earlier_executions_is_pruned_at_the_first_commit_after_a_resume(tmp_path, group):
    """Checkpoints restored from S3 at a restart (each host gets the whole prefix) count: here eight, left by
    executions that each kept a few; a damaged newest one is skipped at resume and deleted, never counted."""
    root = tmp_path / "checkpoints"
    earlier = _manager(root, group, keep_last=100)
    for step in range(1, 9):
        _save(earlier, step)
    (step_dir(root, 8) / "__0_0.distcp").write_bytes(b"damaged")
    manager = _manager(root, group, keep_last=2)
    assert manager.resumable_step() == 7
    _save(manager, 9)
    assert _held(root) == ["step-7", "step-9"]
    # keep_last 1: the checkpoint resumed from goes only once the newer one is committed
    again = _manager(root, group, keep_last=1)
    assert again.resumable_step() == 9
    again.save(10, _state(10), blocking=False)
    assert _committed(root) == [7, 9]
    again.wait()
    assert _held(root) == ["step-10"]


def test_a_full_disk_while_writing_the_committed_marker_names_the_host_and_the_path(tmp_path, group, monkeypatch):
    """The files are written; the COMMITTED marker is not (the disk filled up in between): the job ends with the host,
    the path and the step first, nothing half-written is left, and the checkpoint before it stays resumable."""
    import errno

    from training.components.checkpoint import CheckpointDiskFull

    monkeypatch.setenv("SM_CURRENT_HOST", "algo-2")
    root = tmp_path / "checkpoints"
    manager = _manager(root, group, keep_last=1)
    _save(manager, 3)
    write_text = Path.write_text

    def full_disk(self, data, *args, **kwargs):
        if self.name == "COMMITTED.tmp" and self.parent.name == "step-6":
            write_text(self, data[:10], *args, **kwargs)  # a partial write, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(CheckpointDiskFull) as raised:
        _save(manager, 6)
    message = str(raised.value)
    assert message.startswith(f"the disk is full on host algo-2 at {step_dir(root, 6)}/COMMITTED (ENOSPC) while "
                              "committing checkpoint step-6 (its COMMITTED marker): checkpoint step-6 is NOT committed; "
                              "the checkpoints committed before it are intact (the newest: step-3)"), message
    assert "rank 1" not in message and "\n" not in message
    assert sorted(p.name for p in step_dir(root, 6).iterdir() if p.name.startswith("COMMITTED")) == []
    assert find_resumable(root) == (3, ["step-6: not committed (no COMMITTED marker: the save did not finish)"])
