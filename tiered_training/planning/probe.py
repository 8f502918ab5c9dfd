"""How long the probe job takes: each of its candidates in its own launch (training/probe.py).

A launch starts torchrun and its workers, joins the process group, builds the model (or loads
its checkpoint) and, with ``precision.compile``, compiles it; then it runs ``probe.steps``
optimiser steps of one micro-batch each at the candidate's own speed. So:

    probe seconds = sum over the candidates of (launch allowance [+ compile allowance]
                                                 + probe.steps x micro-batch x sequence / CP / tokens/s per GPU)

The allowances are bounds, not measurements: the one GPU check of this repo measured a 3B model's
first compiled step at 12.3 s against 2.8 s eager on an H200
(bench/gpu/gpu-check-nvidia-h200-2026-11-30-compiled.json and -eager.json, ``first_step_s``);
a multi-node launch adds the process group's start and the checkpoint's load, which it did not measure.
The Probe job's MaxRuntimeInSeconds is at least this (tiered_training/pipeline/definition.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tiered_training.planning.plan import Candidate, Plan

# Per launch: torchrun and its workers, the process group, the model's build or load.
LAUNCH_SECONDS = 180
# Per launch with precision.compile: torch.compile of the model (the measured 3B compile took ~10 s of a first step;
# larger models and their graph breaks take longer).
COMPILE_SECONDS = 300


def candidate_step_seconds(plan: Plan, candidate: Candidate) -> float:
    """One probe step of ``candidate`` (one micro-batch per rank) at its predicted tokens/s per GPU."""
    tokens = candidate.micro_batch_size * plan.recipe.sequence_length / max(1, candidate.context_parallel)
    speed = candidate.tokens_per_second_per_gpu
    return tokens / speed if speed > 0 else float("inf")


def launch_seconds(plan: Plan) -> int:
    """The start-up allowance of one candidate's launch."""
    return LAUNCH_SECONDS + (COMPILE_SECONDS if plan.compile else 0)


def probe_seconds(plan: Plan) -> float:
    """Seconds the probe job runs: each candidate's launch and its ``probe.steps`` steps, one after another."""
    steps = plan.recipe.probe.steps
    return sum(launch_seconds(plan) + steps * candidate_step_seconds(plan, c) for c in plan.candidates)
