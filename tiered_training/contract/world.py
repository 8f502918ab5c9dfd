"""The run's world size against the plan's: the global batch stays as planned, or the run is refused.

The plan fixes the global batch (``batch.global_batch_tokens``, and the batch ramp's
accumulation at each step) for the world it planned: ``global_batch_tokens /
(micro_batch_size x sequence_length x grad_accum_steps)`` data-parallel ranks, each a
context-parallel group of ``parallel.context_parallel`` GPUs. Every ``world`` here counts GPUs;
scaling the accumulation by planned/world is the same as by the ratio of data-parallel ranks. A job may run on another
number of hosts (the pipeline's ``InstanceCount`` parameter, or a restart on the capacity
that is left): then the accumulation is scaled so every step still sees the planned number
of tokens. Where that is not a whole number of micro-batches, or the hybrid shard group does
not divide the world, :func:`accumulation` raises :class:`WorldSizeError` before the model is
built, with the world sizes that would work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tiered_training.contract.runconfig import BatchConfig, ParallelConfig, RunConfig


class WorldSizeError(ValueError):
    """This world size cannot run the plan's global batch (or its sharding)."""


class _Node(Protocol):
    @property
    def gpus_per_node(self) -> int: ...


class RunShape(Protocol):
    """The parts of a :class:`RunConfig` that the world-size checks read (the planner has only these)."""

    @property
    def batch(self) -> BatchConfig: ...

    @property
    def parallel(self) -> ParallelConfig: ...

    @property
    def hardware(self) -> _Node: ...


def planned_world(cfg: RunShape) -> int:
    """The GPUs the plan's global batch is for: data-parallel ranks (each a context-parallel group) x cp."""
    batch = cfg.batch
    per_rank = batch.micro_batch_size * batch.sequence_length * batch.grad_accum_steps
    data_ranks, rest = divmod(batch.global_batch_tokens, per_rank)
    if rest or data_ranks < 1:
        raise WorldSizeError(
            f"batch.global_batch_tokens {batch.global_batch_tokens} is not a whole number of micro-batches "
            f"({batch.micro_batch_size} x {batch.sequence_length} tokens x {batch.grad_accum_steps} accumulation steps)"
        )
    return data_ranks * cfg.parallel.context_parallel


def _accumulations(cfg: RunShape) -> set[int]:
    """Every accumulation the run uses: the ramp's and the full one."""
    batch = cfg.batch
    start, full, ramp = batch.ramp_start_accum_steps, batch.grad_accum_steps, max(batch.ramp_steps, 0)
    if start and ramp >= abs(full - start):  # the linear ramp moves by at most 1 a step: it takes every value between
        return set(range(min(start, full), max(start, full) + 1))
    return {batch.accum_steps_at(step) for step in range(ramp + 1)}


def _fits(cfg: RunShape, world: int, planned: int) -> str | None:
    """Why ``world`` ranks cannot run the plan, or None."""
    parallel = cfg.parallel
    if world % parallel.context_parallel:
        return (
            f"context parallelism of {parallel.context_parallel} needs a multiple of {parallel.context_parallel} GPUs"
        )
    if parallel.sharding == "hybrid" and world % parallel.shard_group_size:
        return f"hybrid sharding needs a multiple of the shard group of {parallel.shard_group_size} GPUs"
    bad = sorted(a for a in _accumulations(cfg) if (a * planned) % world)
    if bad:
        return (
            f"the planned accumulation of {bad[0]} micro-batches on {planned} GPUs would be "
            f"{bad[0] * planned / world:g} on {world}"
        )
    return None


def accumulation(cfg: RunConfig, world: int) -> tuple[Callable[[int], int], bool]:
    """Accumulation steps at each (0-based) step on ``world`` ranks, and whether that keeps the plan's
    global batch. Where it cannot (a fresh run on a world the plan did not foresee), the plan's
    accumulation is used as it is, and the caller says so."""
    try:
        planned = planned_world(cfg)
    except WorldSizeError:
        return cfg.batch.accum_steps_at, False
    if world == planned:
        return cfg.batch.accum_steps_at, True
    if _fits(cfg, world, planned) is None:
        return (lambda step: cfg.batch.accum_steps_at(step) * planned // world), True
    return cfg.batch.accum_steps_at, False


def resume_accumulation(cfg: RunConfig, saved_world: int, world: int) -> Callable[[int], int]:
    """Accumulation for resuming, on ``world`` ranks, a run saved on ``saved_world``: every step keeps the
    global batch the saved run had. :class:`WorldSizeError` (before any training) where it cannot."""
    saved, _ = accumulation(cfg, saved_world)
    if world == saved_world:
        return saved
    steps = range(max(cfg.batch.ramp_steps, 0) + 1)
    problem = None
    if world % cfg.parallel.context_parallel:
        cp = cfg.parallel.context_parallel
        problem = f"context parallelism of {cp} needs a multiple of {cp} GPUs"
    elif cfg.parallel.sharding == "hybrid" and world % cfg.parallel.shard_group_size:
        problem = f"hybrid sharding needs a multiple of the shard group of {cfg.parallel.shard_group_size} GPUs"
    else:
        bad = sorted({saved(s) for s in steps if (saved(s) * saved_world) % world})
        if bad:
            problem = (
                f"its accumulation of {bad[0]} micro-batches on {saved_world} GPUs would be "
                f"{bad[0] * saved_world / world:g} on {world}"
            )
    if problem:
        gpus = cfg.hardware.gpus_per_node or 1
        working = [
            n
            for n in range(1, 4 * max(1, saved_world // gpus) + 1)
            if (n * gpus) % cfg.parallel.context_parallel == 0
            and not (cfg.parallel.sharding == "hybrid" and (n * gpus) % cfg.parallel.shard_group_size)
            and all((saved(s) * saved_world) % (n * gpus) == 0 for s in steps)
        ]
        hint = f"; instance counts that can resume it: {', '.join(map(str, working))}" if working else ""
        raise WorldSizeError(
            f"cannot resume the checkpoint of a run on {saved_world} GPUs on {world} GPUs ({world // gpus} host(s) of "
            f"{gpus}): {problem}, and the global batch must not change mid-run{hint}"
        )
    return lambda step: saved(step) * saved_world // world


def supported_instance_counts(cfg: RunShape, *, limit: int | None = None) -> list[int]:
    """Host counts that run the plan as planned: the global batch kept at every step of the ramp, the
    sharding and context parallelism intact, and no more memory per GPU than planned (with full
    sharding, fewer GPUs hold bigger shards, so only counts at least the planned one).

    ``limit``: the largest count tried (default: four times the planned hosts, at least 8).
    """
    gpus = cfg.hardware.gpus_per_node or 1
    try:
        planned = planned_world(cfg)
    except WorldSizeError:
        return []
    planned_hosts = -(-planned // gpus)
    limit = limit or max(8, 4 * planned_hosts)
    counts = []
    for hosts in range(1, limit + 1):
        world = hosts * gpus
        if cfg.parallel.sharding == "full" and world < planned:
            continue
        if world == planned or _fits(cfg, world, planned) is None:
            counts.append(hosts)
    return counts
