"""The checkpoint manager's fence: rank 0 asks it before writing COMMITTED, before pruning and before an export, and
commits nothing it refuses (real DCP saves by the real CheckpointManager, on one gloo rank in this process)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from training.components.checkpoint import COMMITTED, CheckpointManager, step_dir  # noqa: E402
from training.components.fence import LeaseFenced  # noqa: E402


@pytest.fixture(scope="module")
def group():
    created = not dist.is_initialized()
    if created:
        from tiered_training.contract.ports import loopback_port

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{loopback_port()}", rank=0, world_size=1)
    yield dist.new_group(backend="gloo")
    if created:
        dist.destroy_process_group()
    gc.collect()


class Fence:
    """Allows until ``lost`` is set; records what it was asked."""

    def __init__(self):
        self.asked: list[str] = []
        self.lost: str | None = None
        self.refuse_pruning = False

    def __call__(self, what: str) -> None:
        self.asked.append(what)
        if self.lost or (self.refuse_pruning and what.startswith("pruning")):
            raise LeaseFenced(f"{what} NOT committed: {self.lost or 'the lease was taken over'}")


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((16,), float(step))}, "train": {"step": torch.tensor(step)}}


def _committed(root: Path) -> list[int]:
    return sorted(int(p.parent.name[5:]) for p in root.glob(f"step-*/{COMMITTED}"))


def test_a_save_after_the_lease_is_lost_is_not_committed_and_stops_every_rank(tmp_path, group):
    root = tmp_path / "checkpoints"
    fence = Fence()
    manager = CheckpointManager(root, keep_last=3, rank=0, save_group=group, control_group=group, fence=fence)
    manager.save(2, _state(2), blocking=True)
    assert _committed(root) == [2] and fence.asked == ["checkpoint step-2"]
    fence.lost = "the lease s3://b/r/lease.json was last renewed at T; its deadline D has passed"
    with pytest.raises(LeaseFenced, match="checkpoint step-4 NOT committed: the lease s3://b/r/lease.json"):
        manager.save(4, _state(4), blocking=True)  # the SIGTERM path's save: blocking, then committed or not
    assert _committed(root) == [2] and step_dir(root, 4).is_dir()  # written, never committed
    assert manager.last_committed == 2
    with pytest.raises(LeaseFenced, match="the export to /opt/ml/model NOT committed"):
        manager.prove("the export to /opt/ml/model")


def test_pruning_waits_for_the_fence(tmp_path, group):
    root = tmp_path / "checkpoints"
    fence = Fence()
    manager = CheckpointManager(root, keep_last=1, rank=0, save_group=group, control_group=group, fence=fence)
    manager.save(1, _state(1), blocking=True)
    manager.save(2, _state(2), blocking=True)  # keep_last 1: step-1 pruned, after the fence allowed it
    assert "pruning step-1" in fence.asked and _committed(root) == [2] and not step_dir(root, 1).exists()
    fence.refuse_pruning = True
    with pytest.raises(LeaseFenced, match="pruning step-2 NOT committed"):
        manager.save(3, _state(3), blocking=True)
    assert _committed(root) == [2, 3]  # nothing deleted without the lease
