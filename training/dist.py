"""Process-group setup: NCCL (plus gloo for CPU-side control) on GPUs, gloo on the CPU."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(timeout_s: float = 1800) -> DistInfo:
    """Initialise the default process group once (idempotent) from torchrun's environment.

    Without torchrun (no ``RANK``), a one-process group on a free local port is used, so
    the trainer also runs as a plain ``python -m training``.
    """
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "cuda:nccl,cpu:gloo"
    else:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device)


def _free_port() -> int:
    from tiered_training.ports import loopback_port

    return loopback_port()


def new_gloo_group() -> dist.ProcessGroup:
    """A CPU group: async checkpoint saves and control flags run on it, apart from NCCL."""
    return dist.new_group(backend="gloo")
