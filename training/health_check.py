"""The probe job's health check, before its candidates: is every host as fast as its GPUs and network should be?

Run under ``torchrun`` (the launcher runs it first in probe mode: ``python -m training.health_check``). Each rank
measures a matrix multiply on its device, an all-reduce among the ranks of its node and an all-reduce across all
ranks (when there are several nodes); rank 0 gathers the figures, prints one line per rank, and compares them with
what the catalogue says the hardware does (``RunConfig.hardware``, from ``tiered_training/catalog/instances.yaml``:
NVIDIA's datasheet dense BF16 peak and NVLink bandwidth, AWS's EFA bandwidth per instance):

- matmul: at least :data:`MATMUL_FRACTION` of the dense BF16 peak (``peak_bf16_flops``);
- all-reduce within a node: a bus bandwidth (nccl-tests' definition: size x 2(n-1)/n / time,
  https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md) of at least :data:`NVLINK_FRACTION` of the
  NVLink bandwidth per GPU and direction;
- all-reduce across nodes: at least :data:`NETWORK_FRACTION` of the instance's EFA bandwidth over its GPUs.

A rank below its figure fails the check: every rank raises :class:`HealthCheckFailed` naming the host, the GPU and the
figure, the launcher writes it as the Probe job's FailureReason, and the job fails before any candidate runs, so
the pipeline's gate never starts training on those instances.

Only GPU figures are compared with GPU figures. On a CPU (a rehearsal) the figures are measured and printed but
not compared with the catalogue, unless ``TIERED_TRAINING_HEALTH_EXPECT`` gives this machine's own expected
figures (``matmul_tflops=X,node_gbps=Y,world_gbps=Z``, any of them; rehearsals and tests only): that is how the
failure path is exercised without a GPU.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

MATMUL_FRACTION = 0.5  # cuBLAS BF16 GEMMs of this size reach well above half the dense peak on a healthy GPU
NVLINK_FRACTION = 0.3  # NCCL's all-reduce bus bandwidth in a node, against NVLink's per-direction figure
NETWORK_FRACTION = 0.25  # across nodes, against EFA's bandwidth per GPU
EXPECT_VARIABLE = "TIERED_TRAINING_HEALTH_EXPECT"
FIGURES = ("matmul_tflops", "node_gbps", "world_gbps")


class HealthCheckFailed(RuntimeError):
    """A host is below the figures its hardware should reach."""


@dataclass(frozen=True)
class RankFigures:
    host: str
    gpu: int  # local rank
    matmul_tflops: float
    node_gbps: float | None  # all-reduce bus bandwidth among the node's ranks, GB/s (None: one rank per node)
    world_gbps: float | None  # across all ranks (None: one node)


@dataclass(frozen=True)
class Expected:
    """The least each figure may be (None: not compared), and where it comes from."""

    matmul_tflops: float | None = None
    node_gbps: float | None = None
    world_gbps: float | None = None
    source: str = ""

    @classmethod
    def from_catalogue(cls, hardware) -> Expected:
        """From the RunConfig's hardware: GPU figures, for GPUs only."""
        gpus = max(1, hardware.gpus_per_node)
        nvlink = getattr(hardware, "nvlink_bytes_per_s", 0.0)
        network = getattr(hardware, "network_bits_per_s", 0.0)
        return cls(
            matmul_tflops=MATMUL_FRACTION * hardware.peak_bf16_flops / 1e12,
            node_gbps=NVLINK_FRACTION * nvlink / 1e9 if nvlink else None,
            world_gbps=NETWORK_FRACTION * network / 8 / gpus / 1e9 if network else None,
            source=f"the catalogue's {hardware.instance_type}",
        )

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Expected | None:
        text = environ.get(EXPECT_VARIABLE, "")
        if not text:
            return None
        found: dict[str, float] = {}
        for part in text.split(","):
            name, sep, value = part.partition("=")
            try:
                if not sep or name.strip() not in FIGURES:
                    raise ValueError
                found[name.strip()] = float(value)
            except ValueError:
                raise ValueError(
                    f"{EXPECT_VARIABLE}={text!r}: expected NAME=VALUE pairs separated by commas, NAME one of "
                    f"{', '.join(FIGURES)}"
                ) from None
        return cls(**found, source=EXPECT_VARIABLE)


def problems(figures: Sequence[RankFigures], expected: Expected) -> list[str]:
    """One line for each rank and figure below what is expected, slowest first."""
    found: list[tuple[float, str]] = []
    units = {"matmul_tflops": "TFLOP/s matmul", "node_gbps": "GB/s all-reduce in the node",
             "world_gbps": "GB/s all-reduce across nodes"}  # fmt: skip
    for rank in figures:
        for name in FIGURES:
            least = getattr(expected, name)
            value = getattr(rank, name)
            if least is None or value is None or value >= least:
                continue
            found.append(
                (
                    value / least,
                    f"{rank.host} GPU {rank.gpu}: {value:,.1f} {units[name]}, below the {least:,.1f} "
                    f"expected ({expected.source})",
                )
            )
    return [text for _, text in sorted(found, key=lambda pair: pair[0])]


def _bus_gbps(seconds: float, size_bytes: int, ranks: int) -> float:
    return size_bytes * 2 * (ranks - 1) / ranks / seconds / 1e9


def matmul_tflops(device, size: int, iterations: int) -> float:
    """This device's matrix-multiply speed: BF16 on a GPU, FP32 on the CPU, TFLOP/s."""
    import torch

    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    if cuda:
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(iterations):
        a @ b
    if cuda:
        torch.cuda.synchronize(device)
    return 2 * size**3 * iterations / (time.perf_counter() - started) / 1e12


def measure(
    device, *, matmul_size: int, iterations: int, all_reduce_bytes: int
) -> tuple[float, float | None, float | None]:
    """This rank's figures: matmul TFLOP/s, node and world all-reduce bus bandwidth (collective)."""
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    tflops = matmul_tflops(device, matmul_size, iterations)

    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    node_group, _ = dist.new_subgroups(group_size=local) if world % local == 0 else (None, None)
    buffer = torch.ones(all_reduce_bytes // 4, device=device, dtype=torch.float32)

    def all_reduce_gbps(group, ranks: int) -> float | None:
        if ranks < 2:
            return None
        dist.all_reduce(buffer, group=group)  # warm-up: the communicator's set-up
        sync()
        started = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(buffer, group=group)
        sync()
        return _bus_gbps((time.perf_counter() - started) / iterations, buffer.numel() * 4, ranks)

    node = all_reduce_gbps(node_group, local) if node_group is not None else None
    across = all_reduce_gbps(None, world) if world > local else None
    return tflops, node, across


def run(cfg, environ: Mapping[str, str] | None = None) -> list[RankFigures]:
    """Measure, gather, print and compare (rank 0 raises :class:`HealthCheckFailed`); every rank returns the
    figures of all ranks."""
    import torch.distributed as dist

    from training.components.metrics import node_name
    from training.distributed.dist import init_distributed

    environ = os.environ if environ is None else environ
    info = init_distributed()
    cuda = info.device.type == "cuda"
    expected = Expected.from_environment(environ)
    started = time.perf_counter()
    tflops, node, across = measure(
        info.device,
        matmul_size=8192 if cuda else 256,
        iterations=20 if cuda else 5,
        all_reduce_bytes=(256 if cuda else 1) * 2**20,
    )
    mine = RankFigures(node_name(), info.local_rank, tflops, node, across)
    gathered: list = [None] * info.world_size
    dist.all_gather_object(gathered, asdict(mine))
    figures = [RankFigures(**found) for found in gathered]
    for rank in figures if info.rank == 0 else []:
        print(
            f"health check: {rank.host} GPU {rank.gpu}: matmul {rank.matmul_tflops:,.2f} TFLOP/s"
            + (f", all-reduce in node {rank.node_gbps:,.2f} GB/s" if rank.node_gbps is not None else "")
            + (f", across nodes {rank.world_gbps:,.2f} GB/s" if rank.world_gbps is not None else ""),
            flush=True,
        )
    if expected is None and cuda:
        expected = Expected.from_catalogue(cfg.hardware)
    if expected is None:
        if info.rank == 0:
            print(
                "health check: figures measured on the CPU are not compared with the catalogue's GPU figures "
                f"({EXPECT_VARIABLE} gives a rehearsal's own)",
                flush=True,
            )
        return figures
    found = problems(figures, expected)  # every rank decides alike: each host's job fails at once
    seconds = time.perf_counter() - started
    if found:
        raise HealthCheckFailed(
            f"health check failed on {len({line.split(' GPU ')[0] for line in found})} host(s): " + "; ".join(found)
        )
    if info.rank == 0:
        print(f"health check: every rank meets the expected figures ({expected.source}); {seconds:.1f} s", flush=True)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    from training.__main__ import load_config, record_failure
    from training.distributed.dist import shut_down
    from training.paths import HYPERPARAMETERS_FILE

    parser = argparse.ArgumentParser(prog="python -m training.health_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help=f"RunConfig or hyperparameters JSON (default: {HYPERPARAMETERS_FILE})")
    args, _ = parser.parse_known_args(argv)  # the launcher passes the trainer's path arguments too
    try:
        run(load_config(args.config or HYPERPARAMETERS_FILE))
        shut_down()
    except BaseException as error:
        if not (isinstance(error, SystemExit) and error.code in (0, None)):
            record_failure(error)
        raise
    return 0


if __name__ == "__main__":
    from training.distributed.dist import exit_process

    exit_process(main())
