"""The planner's runtime: checkpoints kept, the job runtime and segments, warm pools, instance counts,
and the probe's launches within its job's runtime."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace

from tiered_training.planning import probe as probes
from tiered_training.planning.plan import Candidate, Estimates
from tiered_training.planning.search import Option, _compiles, _Run
from tiered_training.planning.segments import (
    JOB_RETRY_ATTEMPTS,
    LAST_WARM_POOL_SECONDS,
    MAX_SEGMENTS,
    RUNTIME_QUOTA,
    WARM_POOL_SECONDS,
    Segments,
    plan_segments,
    probe_runtime_seconds,
    quota_seconds,
)
from tiered_training.recipe import AUTO, Recipe


def _keep_last(recipe: Recipe, run: _Run) -> None:
    """SageMaker uploads each host's checkpoints behind the trainer and propagates local deletions,
    so right after a commit the one older checkpoint may already be gone from S3 while the new
    one is still uploading (docs/rehearse.md)."""
    if recipe.checkpointing.keep_last == 1:
        run.warn(
            "keep-last-1",
            "checkpointing.keep_last 1: right after each save S3 may hold no complete checkpoint (the older one is "
            "deleted while the new one still uploads); an instance lost then loses every step so far",
            "set checkpointing.keep_last to 2 or more",
            "checkpointing.keep_last",
        )


def _runtime(recipe: Recipe, run: _Run) -> None:
    """Each training job's MaxRuntimeInSeconds, against the account's runtime quota."""
    quota = quota_seconds(recipe)
    source = (
        "the account's value in compute.quotas" if RUNTIME_QUOTA in recipe.compute.quotas else "AWS's default quota"
    )
    hours = recipe.compute.max_runtime_hours
    if hours is None:
        run.decide(
            "compute.max_runtime_hours",
            round(quota / 3600, 2),
            f"each training job runs at most the longest training-job run time, {quota / 3600:g} h ({source}, "
            f"{RUNTIME_QUOTA}); a longer run is split into segments",
            AUTO,
        )
    elif hours * 3600 > quota:
        run.error(
            "runtime-above-quota",
            f"compute.max_runtime_hours {hours:g} is above the account's longest training-job run time of "
            f"{quota / 3600:g} h "
            f"({source}, {RUNTIME_QUOTA}); CreateTrainingJob would refuse the job",
            "remove compute.max_runtime_hours (a longer run is split into segments), or state the account's raised "
            "quota "
            f"under compute.quotas.{RUNTIME_QUOTA} (in seconds)",
            "compute.max_runtime_hours",
        )


def _warm_pools(run: _Run, count: int) -> None:
    """How long a job keeps its instances for the next one (``KeepAlivePeriodInSeconds``), and the idle time
    that can be billed (docs/runs.md)."""
    compute = run.recipe.compute
    if compute.spot:
        run.decide("compute.warm_pool_minutes", 0, "none: warm pools do not work with managed spot training", None)
        return
    nodes = compute.instance_count
    probe = "the Probe" if run.recipe.probe.enabled else "the Probe (when SkipProbe is false)"
    handing = probe + (" and every segment but the last" if count > 1 else "")
    run.decide(
        "compute.warm_pool_minutes",
        WARM_POOL_SECONDS // 60,
        f"jobs that another follows ({handing}) keep their instances for it; the job that takes them asks for a "
        f"warm pool too (SageMaker matches only such a job), kept {LAST_WARM_POOL_SECONDS // 60} min after the run; "
        f"billed idle time: at "
        f"most {WARM_POOL_SECONDS // 60} min x {nodes} instance(s) when the gate or a segment fails, and "
        f"{LAST_WARM_POOL_SECONDS // 60} min x {nodes} after the run",
        None,
    )


def _segments(run: _Run, estimates: Estimates) -> Segments:
    """The number of training jobs the run needs under the runtime limit (tiered_training/planning/segments.py)."""
    recipe = run.recipe
    training_hours = estimates.wall_time_hours - estimates.probe_hours
    segments = plan_segments(recipe, training_hours)
    if segments.count < 1:
        run.error(
            "runtime-too-short",
            f"a training job of {segments.job_runtime_seconds / 3600:g} h leaves no time to train after the room "
            "kept for "
            f"{JOB_RETRY_ATTEMPTS} retries and the final save ({segments.reserve_seconds / 3600:.1f} h)",
            "raise compute.max_runtime_hours, or lower checkpointing.interval_minutes",
            "compute.max_runtime_hours",
        )
        return segments
    reason = (
        f"the run needs about {training_hours:,.1f} h; one job trains at most "
        f"{segments.training_seconds / 3600:,.1f} h: its {segments.job_runtime_seconds / 3600:g} h runtime less "
        f"{segments.reserve_seconds / 3600:.1f} h for {JOB_RETRY_ATTEMPTS} retries and the final save, at "
        f"{recipe.probe.min_throughput_fraction:g} x the planned speed (the gate's floor)"
    )
    run.decide("compute.segments", segments.count, reason, None)
    _warm_pools(run, segments.count)
    if segments.count > MAX_SEGMENTS:
        run.error(
            "too-many-segments",
            f"the run needs {segments.count} training jobs of {segments.job_runtime_seconds / 3600:g} h; the pipeline "
            f"chains at most {MAX_SEGMENTS}",
            f"state the account's raised quota under compute.quotas.{RUNTIME_QUOTA}, add nodes, or lower "
            "budget.total_tokens",
            "compute.segments",
        )
    return segments


def _instance_counts(
    run: _Run, chosen: Option, total_steps: int, ramp_start: int | None, ramp_steps: int, warmup_steps: int
) -> list[int]:
    """The InstanceCount values that keep the planned global batch and memory (tiered_training/contract/world.py)."""
    from tiered_training.contract.runconfig import BatchConfig, ParallelConfig
    from tiered_training.contract.world import supported_instance_counts

    setting = chosen.setting
    recipe = run.recipe

    # The parts of a RunConfig that supported_instance_counts reads.
    shape = SimpleNamespace(
        batch=BatchConfig(
            sequence_length=recipe.sequence_length,
            micro_batch_size=setting.micro_batch,
            grad_accum_steps=chosen.accum,
            global_batch_tokens=recipe.budget.global_batch_tokens,
            total_steps=total_steps,
            ramp_start_accum_steps=ramp_start,
            ramp_steps=ramp_steps,
        ),
        parallel=ParallelConfig(
            sharding=setting.sharding, shard_group_size=setting.shard_group, context_parallel=setting.context_parallel
        ),
        hardware=SimpleNamespace(gpus_per_node=run.instance.gpus, min_nodes=run.min_nodes),
    )
    counts = supported_instance_counts(shape)
    run.decide(
        "compute.instance_counts",
        counts,
        "InstanceCount values that keep the planned global batch (the accumulation rescaled), the sharding, and "
        "at most the planned memory per GPU; `start --instance-count` and the pipeline refuse others before compute",
        None,
    )
    return counts


def _launches(run: _Run, candidates: Sequence[Candidate], chosen: Option) -> list[probes.Launch]:
    return probes.launches(
        candidates,
        sequence_length=run.recipe.sequence_length,
        steps=run.recipe.probe.steps,
        compile=_compiles(run.recipe),
        optimizer_seconds=chosen.step_time.optimizer,
    )


def _bound_probe(run: _Run, candidates: list[Candidate], chosen: Option) -> list[Candidate]:
    """The candidates whose launches finish within the probe job's runtime: fewer where K would not; an error
    where not even the plan's own would (a warning when the recipe turns the probe off)."""
    recipe = run.recipe
    limit = probe_runtime_seconds(recipe)
    found = _launches(run, candidates, chosen)
    total = probes.total_seconds(found)
    if total <= limit:
        return candidates
    count = probes.fitting(found, limit)
    minutes = f"{total / 60:,.0f} min"
    kept = candidates[: max(1, count)]
    if len(kept) < len(candidates):
        for index, decision in enumerate(run.decisions):
            if decision.field == "tuning.probe_candidates":
                run.decisions[index] = replace(
                    decision,
                    value=len(kept),
                    reason=f"{decision.reason}; cut to {len(kept)}: {len(candidates)} launches would take {minutes}, "
                    f"over the probe's runtime of {limit / 3600:g} h",
                )
    if count >= 1:
        run.warn(
            "probe-candidates-cut",
            f"{len(candidates)} probe candidates of {recipe.probe.steps} steps each would take about {minutes}, "
            f"over the probe job's runtime of {limit / 3600:g} h; the probe measures the first {count}",
            f"set tuning.probe_candidates: {count}, or lower probe.steps",
            "tuning.probe_candidates",
        )
        return kept
    first = found[0]
    room = limit - probes.HEALTH_CHECK_SECONDS - first.start_up_seconds
    steps = int(room // first.step_seconds) if first.step_seconds > 0 else 0
    message = (
        f"the probe's {recipe.probe.steps} steps of the plan's configuration would take about "
        f"{first.seconds / 60:,.0f} min, over the probe job's runtime of {limit / 3600:g} h"
    )
    fix = f"set probe.steps to at most {steps}" if steps >= 3 else "raise compute.max_runtime_hours"
    if recipe.probe.enabled:
        run.error("probe-too-long", message, fix, "probe.steps")
    else:
        run.warn("probe-too-long", message + " (when SkipProbe is false)", fix, "probe.steps")
    return kept


def _probe_hours(run: _Run, candidates: list[Candidate], chosen: Option) -> float:
    """The probe's time in the run (planning/probe.py), with a decision that says what it adds; 0 when the
    recipe turns the probe off."""
    recipe = run.recipe
    found = _launches(run, candidates, chosen)
    seconds = probes.total_seconds(found)
    if not recipe.probe.enabled:
        return 0.0
    steps = ", ".join(f"{launch.step_seconds:,.2f}" for launch in found)
    starts = ", ".join(f"{launch.start_up_seconds:,.0f}" for launch in found)
    price, _ = run.instance.price(recipe.compute.price_per_hour, spot=recipe.compute.spot, region=recipe.compute.region)
    cost = "" if price is None else f" and ${seconds / 3600 * run.nodes * price:,.0f}"
    run.decide(
        "probe.enabled",
        True,
        f"a health check ({probes.HEALTH_CHECK_SECONDS:g} s) and "
        f"{len(found)} launch(es), each a start-up ({starts} s: process start, then the "
        f"{'compiled ' if _compiles(recipe) else ''}first step, {probes.FIRST_STEP_SECONDS[_compiles(recipe)]:g} s to "
        f"build its kernels and {probes.FIRST_STEP_STEPS} steps' time, as measured), then {recipe.probe.steps} "
        f"steps of one micro-batch at {steps} s, add {seconds / 60:,.0f} min{cost} to the run's wall time and cost",
        None,
    )
    return seconds / 3600
