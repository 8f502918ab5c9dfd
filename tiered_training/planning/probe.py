"""How long the probe runs: its K candidates, each in its own process launch (training/probe.py).

One launch costs a start-up allowance, then ``probe.steps`` optimiser steps of one micro-batch each
(``grad_accum_steps=1``: the optimiser steps after every micro-batch):

    launch = process start + first step + steps x probe step time
    first step = building the kernels (torch.compile when compile is on) + FIRST_STEP_STEPS x probe step time
    probe step time = micro-batch tokens per GPU / predicted tokens/s per GPU
                      + the optimiser step's share the full run spreads over its accumulation

The first step runs the step itself besides building its kernels, so it grows with the model and the sequence
(one step of an 8B model at 128K tokens takes tens of seconds). The allowance comes from this repository's own
measurements:

- process start: a trainer process spends about 6 to 7 s importing torch, its distributed and checkpoint
  modules and torchao before its first step, its torchrun agent about 2 s (``bench/suite_cost.py``, README);
- the first step, which the probe leaves out of tokens/s: on one H200 with torch 2.11
  (``bench/gpu/gpu-check-nvidia-h200-2026-11-30-*.json``, ``first_step_s`` against the steady step time of
  the same run), Llama 3.2 1B and 3B in BF16 and FP8 at 4K to 64K tokens: compiled 4.8 to 22.5 s, at most
  22.0 s more than two steady steps; eager 0.6 to 2.8 s, at most 1.6 s more than two steps.

Each is rounded up. The probe's whole time must stay under its job's runtime (``probe_runtime_seconds``); the
planner measures fewer candidates where K would not fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tiered_training.planning.plan import Candidate, Plan

PROCESS_START_SECONDS = 10.0  # measured 6 to 7 s (trainer) + about 2 s (torchrun agent)
# Building the first step's kernels, beyond FIRST_STEP_STEPS steady steps: compile on, measured at most 22.0 s;
# eager, at most 1.6 s.
FIRST_STEP_SECONDS = {True: 25.0, False: 5.0}
FIRST_STEP_STEPS = 2  # the first step's own work, cold caches and allocator included, in steady steps
# The health check (training/health_check.py) runs once before the candidates: one launch's process start, then a
# matmul and two all-reduces of 256 MiB, 20 times each (a few seconds on a GPU) and NCCL's set-up. An allowance,
# not yet measured on a GPU.
HEALTH_CHECK_SECONDS = PROCESS_START_SECONDS + 15.0


@dataclass(frozen=True)
class Launch:
    """One candidate's launch in the probe job."""

    number: int
    start_up_seconds: float
    step_seconds: float
    steps: int

    @property
    def seconds(self) -> float:
        return self.start_up_seconds + self.steps * self.step_seconds


def start_up_seconds(compile: bool, step_seconds: float = 0.0) -> float:
    """A launch's allowance before its measured steps: process start, then the first step (building its kernels,
    and the step itself: ``FIRST_STEP_STEPS`` of ``step_seconds``)."""
    return PROCESS_START_SECONDS + FIRST_STEP_SECONDS[compile] + FIRST_STEP_STEPS * step_seconds


def probe_step_seconds(candidate: Candidate, sequence_length: int, optimizer_seconds: float) -> float:
    """One probe step of ``candidate``: one micro-batch at its predicted speed, and a whole optimiser step
    (``optimizer_seconds``: the plan's, which its predicted speed spreads over ``grad_accum_steps``)."""
    tokens = candidate.micro_batch_size * sequence_length / candidate.context_parallel
    spread = optimizer_seconds * (1 - 1 / max(1, candidate.grad_accum_steps))
    return tokens / max(candidate.tokens_per_second_per_gpu, 1e-9) + spread


def launches(
    candidates: Sequence[Candidate], *, sequence_length: int, steps: int, compile: bool, optimizer_seconds: float
) -> list[Launch]:
    """Each candidate's launch, in order."""
    found = []
    for c in candidates:
        step = probe_step_seconds(c, sequence_length, optimizer_seconds)
        found.append(
            Launch(number=c.number, start_up_seconds=start_up_seconds(compile, step), step_seconds=step, steps=steps)
        )
    return found


def total_seconds(found: Sequence[Launch]) -> float:
    """The probe's time: the health check, then every launch."""
    return HEALTH_CHECK_SECONDS + sum(launch.seconds for launch in found)


def fitting(found: Sequence[Launch], limit_seconds: float) -> int:
    """How many of the first launches run within ``limit_seconds`` together, after the health check (0: not even
    the first)."""
    total, count = HEALTH_CHECK_SECONDS, 0
    for launch in found:
        total += launch.seconds
        if total > limit_seconds:
            break
        count += 1
    return count


def optimizer_seconds(plan: Plan) -> float:
    """The plan's optimiser step, from its step-time terms."""
    return sum(t.seconds for t in plan.estimates.step_terms if t.name == "optimiser step")


def plan_launches(plan: Plan) -> list[Launch]:
    """The launches of ``plan``'s probe: one per candidate."""
    return launches(
        plan.candidates,
        sequence_length=plan.recipe.sequence_length,
        steps=plan.recipe.probe.steps,
        compile=plan.compile,
        optimizer_seconds=optimizer_seconds(plan),
    )


def probe_seconds(plan: Plan) -> float:
    """The probe's estimated time: the health check and every candidate's launch (start-up allowance and steps), in
    seconds. Not counted: the job's own provisioning and image pull."""
    return total_seconds(plan_launches(plan))
