"""How long one training job may run, and how many jobs (segments) a run needs.

SageMaker stops a training job at ``StoppingCondition.MaxRuntimeInSeconds``, which may be
28 days at most and, on an account, no more than its quota for the longest training-job run
time (``training-job-max-runtime`` in ``catalog/quotas.yaml``; AWS's default is 5 days). With a
``RetryStrategy`` that bound covers every attempt of the job together. A run longer than one
job may be runs as a chain of Training steps (segments), each resuming the same run from its
checkpoints; the plan states how many.

Each segment trains a planned share of the steps (:meth:`RunSection.end_step`), sized so that it
ends in time even at the slowest throughput the probe's gate lets through, with room for the
retries its ``RetryStrategy`` may start and the final save:

    reserve = shutdown deadline + attempts x (start-up + one checkpoint interval of lost work)
    one segment's training time = (job runtime - reserve) x probe.min_throughput_fraction

Sources: StoppingCondition in the SageMaker API reference,
https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_StoppingCondition.html, and the
training quotas, https://docs.aws.amazon.com/general/latest/gr/sagemaker.html.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tiered_training.recipe import Recipe

RUNTIME_QUOTA = "training-job-max-runtime"
# A job's restarts under its RetryStrategy (the pipeline's Train steps), on top of the first attempt.
JOB_RETRY_ATTEMPTS = 3
# Provisioning, image pull and model build before the first step of an attempt (an estimate).
START_UP_SECONDS = 900
# Segments beyond this make a definition of dozens of steps; raise the quota or add nodes instead.
MAX_SEGMENTS = 24
# A spot job waits for capacity (and sits out interruptions) at most this long beyond its runtime.
SPOT_WAIT_SECONDS = 24 * 3600
# The probe is short: its spot wait is capped at this beyond its runtime.
PROBE_RUNTIME_SECONDS = 2 * 3600
PROBE_SPOT_WAIT_SECONDS = 3600
# Warm pools (docs/runs.md): a job that another follows (the Probe, a segment but the last) keeps its
# instances this long for it; the Gate and a segment's hand-over take seconds to minutes.
WARM_POOL_SECONDS = 600
# A job that takes a pool must ask for one too, or SageMaker does not match it; when nothing follows it
# (Train after the Probe, a run's last segment), its pool idles, billed, this long.
LAST_WARM_POOL_SECONDS = 60
API_MAX_SECONDS = 28 * 24 * 3600


@dataclass(frozen=True)
class Segments:
    job_runtime_seconds: int  # MaxRuntimeInSeconds of every Train segment
    reserve_seconds: int  # room left in a job for retries and the final save
    training_seconds: float  # planned training time of one segment, at the gate's slowest throughput
    count: int  # segments (1: one job)
    quota_seconds: int  # the account's limit (applied or default)

    def segment_seconds(self) -> float:
        """The wall-clock guard a segment stops at (one attempt's time, less the reserve)."""
        return float(max(0, self.job_runtime_seconds - self.reserve_seconds))


def quota_seconds(recipe: Recipe) -> int:
    return int(min(recipe.compute.quota(RUNTIME_QUOTA), API_MAX_SECONDS))


def job_runtime_seconds(recipe: Recipe) -> int:
    """MaxRuntimeInSeconds of each Train segment: compute.max_runtime_hours, else the account's quota."""
    hours = recipe.compute.max_runtime_hours
    if hours is None:
        return quota_seconds(recipe)
    return int(hours * 3600)


def reserve_seconds(recipe: Recipe) -> int:
    interval = recipe.checkpointing.interval_minutes * 60
    return int(recipe.checkpointing.shutdown_deadline_seconds + JOB_RETRY_ATTEMPTS * (START_UP_SECONDS + interval))


def plan_segments(recipe: Recipe, wall_time_hours: float) -> Segments:
    runtime = job_runtime_seconds(recipe)
    reserve = reserve_seconds(recipe)
    training = max(0.0, (runtime - reserve) * recipe.probe.min_throughput_fraction)
    count = math.ceil(wall_time_hours * 3600 / training) if training > 0 else 0
    return Segments(runtime, reserve, training, max(count, 1) if training > 0 else 0, quota_seconds(recipe))


def spot_wait_seconds(recipe: Recipe, runtime_seconds: int) -> int:
    """MaxWaitTimeInSeconds of a spot segment: compute.max_wait_hours, else its runtime plus one day."""
    if recipe.compute.max_wait_hours is not None:
        return int(recipe.compute.max_wait_hours * 3600)
    return min(API_MAX_SECONDS, runtime_seconds + SPOT_WAIT_SECONDS)


def probe_runtime_seconds(recipe: Recipe, needed: float = 0.0) -> int:
    """MaxRuntimeInSeconds of the probe: PROBE_RUNTIME_SECONDS, or ``needed`` (its estimate) where longer, within
    the job runtime limit."""
    return min(job_runtime_seconds(recipe), max(PROBE_RUNTIME_SECONDS, math.ceil(needed)))
