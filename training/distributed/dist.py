"""Process-group setup: NCCL (plus gloo for CPU-side control) on GPUs, gloo on the CPU."""

from __future__ import annotations

import gc
import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

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
    from tiered_training.contract.ports import loopback_port

    return loopback_port()


def new_gloo_group() -> dist.ProcessGroup:
    """A CPU group: async checkpoint saves and control flags run on it, apart from NCCL."""
    return dist.new_group(backend="gloo")


def shut_down() -> None:
    """Tear the process group down on every rank together, at the end of a clean run.

    Every rank ends at the same step (stops and ends are agreed by all-reduce), so the barrier
    cannot wait on a rank that left. Collecting afterwards drops gloo work objects while the
    interpreter is still whole.
    """
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    gc.collect()


def exit_process(code: int = 0) -> NoReturn:
    """Flush and leave without interpreter finalisation.

    A gloo worker thread that still holds work (and its tensors) takes the GIL while the
    interpreter finalises and aborts the process ("terminate called without an active
    exception", SIGABRT) after a clean run; torchrun then fails the job. Everything the run
    owes (checkpoints, the model, metrics) is written before this is called.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
