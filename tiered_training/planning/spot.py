"""The planner's managed spot: its wait and the range of its cost."""

from __future__ import annotations

from tiered_training import catalog as catalogs
from tiered_training.planning.search import _Run
from tiered_training.planning.segments import (
    PROBE_SPOT_WAIT_SECONDS,
    SPOT_WAIT_SECONDS,
    job_runtime_seconds,
    spot_wait_seconds,
)
from tiered_training.recipe import AUTO, Recipe


def _spot(recipe: Recipe, run: _Run) -> None:
    compute = recipe.compute
    if not compute.spot:
        if compute.max_wait_hours is not None:
            run.warn(
                "max-wait-without-spot",
                "compute.max_wait_hours applies only to spot training",
                "remove it, or set compute.spot: true",
                "compute.max_wait_hours",
            )
        return
    runtime = job_runtime_seconds(recipe)
    wait = spot_wait_seconds(recipe, runtime)
    if compute.max_wait_hours is None:
        run.decide(
            "compute.max_wait_hours",
            round(wait / 3600, 2),
            f"spot: each job's runtime ({runtime / 3600:g} h) plus at most {SPOT_WAIT_SECONDS / 3600:g} h waiting "
            f"for capacity and sitting out interruptions; the probe waits at most {PROBE_SPOT_WAIT_SECONDS / 3600:g} h",
            AUTO,
        )
    elif wait < runtime:
        run.error(
            "spot-max-wait",
            f"compute.max_wait_hours {compute.max_wait_hours:g} is shorter than a training job's runtime of "
            f"{runtime / 3600:g} h; "
            "SageMaker rejects a spot job whose MaxWait is below its MaxRuntime",
            f"set compute.max_wait_hours to at least {runtime / 3600:g}",
            "compute.max_wait_hours",
        )


def _spot_range(run: _Run, wall_hours: float) -> tuple[tuple[float, float] | None, str]:
    """Spot's cost as a range (an estimate) from the on-demand price, and what it is; none without a price
    or where the recipe gives its own price."""
    recipe = run.recipe
    if not recipe.compute.spot or recipe.compute.price_per_hour is not None:
        return None, ""
    on_demand, _ = run.instance.on_demand_price(recipe.compute.region)
    if on_demand is None:
        return None, ""
    low, high = run.instance.spot_range(on_demand)
    saving_low, saving_high = catalogs.spot_savings()
    node_hours = wall_hours * run.nodes
    return (node_hours * low, node_hours * high), "; spot range: " + catalogs.SPOT_RANGE_SOURCE.format(
        low=saving_low, high=saving_high
    )
