"""The probe's time in the plan: K launches, each a start-up allowance and its steps at the candidate's predicted
step time, counted in the wall time and cost, and bounded by the probe job's runtime."""

from __future__ import annotations

import math

import pytest
from support import recipe_dict

from tiered_training.planning import probe
from tiered_training.planning.planner import resolve
from tiered_training.planning.segments import PROBE_RUNTIME_SECONDS
from tiered_training.recipe import Recipe

PRICED = {"compute.price_per_hour": 100.0}


def plan_of(**overrides):
    plan = resolve(Recipe.model_validate(recipe_dict(**PRICED, **overrides)))
    assert plan.ok, plan.errors
    return plan


def test_the_probe_adds_its_launches_to_wall_time_and_cost():
    on, off = plan_of(), plan_of(**{"probe.enabled": False})
    seconds = probe.probe_seconds(on)
    assert len(on.candidates) == 3
    assert on.estimates.probe_hours == pytest.approx(seconds / 3600)
    assert off.estimates.probe_hours == 0
    assert on.estimates.wall_time_hours == pytest.approx(off.estimates.wall_time_hours + seconds / 3600)
    assert on.estimates.cost_usd == pytest.approx(off.estimates.cost_usd + seconds / 3600 * on.nodes * 100.0)
    reason = on.decision("probe.enabled").reason
    starts = ", ".join(f"{launch.start_up_seconds:,.0f}" for launch in probe.plan_launches(on))
    assert reason.startswith(f"a health check (25 s) and 3 launch(es), each a start-up ({starts} s")
    assert (
        seconds == pytest.approx(probe.HEALTH_CHECK_SECONDS + sum(launch.seconds for launch in probe.plan_launches(on)))
        and f"{seconds / 60:,.0f} min" in reason
    )
    assert f"${seconds / 3600 * 100.0:,.0f}" in reason


def test_a_launch_is_start_up_and_steps_of_one_micro_batch():
    plan = plan_of(**{"probe.steps": 40})
    first = plan.candidates[0]
    tokens = first.micro_batch_size * plan.recipe.sequence_length / first.context_parallel
    launch = probe.plan_launches(plan)[0]
    assert launch.steps == 40 and launch.step_seconds >= tokens / first.tokens_per_second_per_gpu
    # process start, the compiled kernels, and the first step's own work: two steady steps
    assert (
        launch.start_up_seconds == probe.start_up_seconds(True, launch.step_seconds) == 35.0 + 2 * launch.step_seconds
    )
    eager = probe.plan_launches(plan_of(**{"compute.compile": False}))[0]
    assert eager.start_up_seconds == pytest.approx(15.0 + 2 * eager.step_seconds)


def test_the_start_up_grows_with_the_model_and_the_sequence():
    """At 128K a step takes tens of seconds: the first launch's start-up covers more than one of them, and the
    probe job's MaxRuntime follows the probe's time."""
    from tiered_training.pipeline.definition import probe_job_seconds

    small = probe.plan_launches(plan_of())[0]
    long = plan_of(
        **{
            "model.catalog": "llama-3.1-8b",
            "sequence_length": 131072,
            "budget.global_batch_tokens": 131072 * 32,
            "compute.instance_type": "ml.p5.48xlarge",
        }
    )
    first = probe.plan_launches(long)[0]
    assert first.step_seconds > 10 and first.start_up_seconds > first.step_seconds + small.start_up_seconds
    assert probe_job_seconds(long) >= math.ceil(probe.probe_seconds(long))


def test_each_more_step_costs_every_candidate_one_step():
    short, long = plan_of(), plan_of(**{"probe.steps": 200})
    steps = sum(launch.step_seconds for launch in probe.plan_launches(short))
    assert probe.probe_seconds(long) - probe.probe_seconds(short) == pytest.approx(180 * steps)


def test_candidates_that_would_overrun_the_probe_are_cut_with_a_warning():
    long = {
        "probe.steps": 1000,
        "model.catalog": "llama-3.1-8b",
        "sequence_length": 16384,
        "budget.global_batch_tokens": 16384 * 64,
        "tuning.probe_candidates": 5,
    }
    plan = plan_of(**long)
    assert 1 <= len(plan.candidates) < 5
    assert probe.probe_seconds(plan) <= PROBE_RUNTIME_SECONDS
    (cut,) = [f for f in plan.findings if f.code == "probe-candidates-cut"]
    assert cut.severity == "warning" and cut.field == "tuning.probe_candidates"
    assert f"set tuning.probe_candidates: {len(plan.candidates)}" in cut.fix
    decision = plan.decision("tuning.probe_candidates")
    assert decision.value == len(plan.candidates) and "cut to" in decision.reason
    assert len(plan.run_config().probe.alternatives) == len(plan.candidates) - 1


def test_fitting_counts_the_launches_that_finish_in_time():
    launches = [probe.Launch(n, 10.0, 1.0, 50) for n in (1, 2, 3)]  # 60 s each
    health = probe.HEALTH_CHECK_SECONDS  # the health check runs first
    assert probe.fitting(launches, health + 125) == 2
    assert probe.fitting(launches, health + 30) == 0 == probe.fitting(launches, 125 - 60)
    assert probe.fitting(launches, health + 1000) == 3


def test_a_probe_whose_first_launch_cannot_finish_is_an_error_with_the_steps_that_fit(monkeypatch):
    from tiered_training.planning import segments

    monkeypatch.setattr(segments, "PROBE_RUNTIME_SECONDS", 90)  # a 90 s probe job: 25 s health check, 35 s start-up
    plan = resolve(Recipe.model_validate(recipe_dict(**PRICED, **{"probe.steps": 200})))
    (error,) = plan.errors
    assert (error.code, error.field) == ("probe-too-long", "probe.steps")
    assert "over the probe job's runtime of 0.025 h" in error.message
    first = resolve(Recipe.model_validate(recipe_dict(**PRICED))).candidates[0]
    launch = probe.launches([first], sequence_length=4096, steps=200, compile=True, optimizer_seconds=0.0)[0]
    assert error.fix.startswith("set probe.steps to at most ")
    assert (
        int(error.fix.rsplit(" ", 1)[1])
        <= (90 - probe.HEALTH_CHECK_SECONDS - launch.start_up_seconds) / launch.step_seconds
    )
    off = resolve(Recipe.model_validate(recipe_dict(**PRICED, **{"probe.steps": 200, "probe.enabled": False})))
    assert off.ok and [f.severity for f in off.findings if f.code == "probe-too-long"] == ["warning"]
