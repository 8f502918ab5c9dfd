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
        assert message.startswith("checkpoint step-6 NOT committed: the disk is full (rank 0: the write failed (OSError: ")
        assert "No space left on device" in message and "(ENOSPC)" in message and "the newest: step-3" in message
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
