"""Alarm fitting as pure functions of the plan (tiered_training/alarms.py), no CDK."""

from __future__ import annotations

import math

import pytest

from support import recipe_dict, write_yaml
from tiered_training import alarms
from tiered_training.planner import plan_file

LLAMA3_VOCABULARY = 128_256


def plan_of(tmp_path, name="alarms", **overrides):
    return plan_file(write_yaml(tmp_path / f"{name}.yaml", recipe_dict(**overrides)))


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return plan_of(tmp_path_factory.mktemp("alarms"), **{"monitoring.min_throughput_fraction": 0.6})


@pytest.fixture(scope="module")
def fit(plan):
    return alarms.fit_alarms(plan)


def breaches(alarm: alarms.AlarmFit, value: float) -> bool:
    return {
        "LessThanThreshold": value < alarm.threshold,
        "GreaterThanThreshold": value > alarm.threshold,
        "GreaterThanOrEqualToThreshold": value >= alarm.threshold,
    }[alarm.comparison]


def test_throughput_threshold_is_the_recipes_fraction_of_the_planned_rate(plan, fit):
    rate = plan.estimates.tokens_per_second_per_gpu
    alarm = fit[alarms.THROUGHPUT]
    assert 0.6 * rate - 0.01 < alarm.threshold <= 0.6 * rate  # to the cent, rounded down
    assert alarm.comparison == "LessThanThreshold"
    assert "below 0.6 x the plan's" in alarm.condition
    assert not breaches(alarm, rate) and not breaches(alarm, 0.61 * rate)
    assert breaches(alarm, 0.59 * rate)


@pytest.mark.parametrize("fraction", [0.1, 0.7, 0.95, 1.0])
def test_a_run_at_the_planned_rate_never_breaches(tmp_path, fraction):
    plan = plan_of(tmp_path, **{"monitoring.min_throughput_fraction": fraction})
    fit = alarms.fit_alarms(plan)
    rate = plan.estimates.tokens_per_second_per_gpu
    assert not breaches(fit[alarms.THROUGHPUT], rate)
    assert not breaches(fit[alarms.THROUGHPUT], plan.run_config().metrics.plan_tokens_per_second_per_gpu)


def test_loss_ceiling_for_llama3_is_ln_v_plus_one(plan, fit):
    assert plan.architecture.vocab_size == LLAMA3_VOCABULARY
    assert alarms.loss_ceiling(plan) == pytest.approx(math.log(LLAMA3_VOCABULARY) + 1, abs=0.005) == 12.76
    assert fit.loss_ceiling == fit[alarms.LOSS].threshold == 12.76
    assert fit[alarms.LOSS].comparison == "GreaterThanThreshold"
    assert not breaches(fit[alarms.LOSS], math.log(LLAMA3_VOCABULARY))  # a fresh model's loss
    assert breaches(fit[alarms.LOSS], alarms.NAN_LOSS)  # a NaN step counts as this


def test_loss_ceiling_follows_the_margin_or_the_recipes_value(tmp_path):
    wide = plan_of(tmp_path, "wide", **{"monitoring.loss_margin": 2.5})
    assert alarms.loss_ceiling(wide) == round(math.log(LLAMA3_VOCABULARY) + 2.5, 2)
    fixed = plan_of(tmp_path, "fixed", **{"monitoring.loss_ceiling": 7.25})
    assert alarms.loss_ceiling(fixed) == 7.25 == alarms.fit_alarms(fixed)[alarms.LOSS].threshold


def test_gpu_and_memory_thresholds_are_the_recipes(tmp_path):
    plan = plan_of(tmp_path, **{"monitoring.min_gpu_utilization": 55.0, "monitoring.max_memory_fraction": 0.9})
    fit = alarms.fit_alarms(plan)
    assert (fit[alarms.GPU_UTILIZATION].threshold, fit[alarms.GPU_UTILIZATION].comparison) == (55.0, "LessThanThreshold")
    assert (fit[alarms.MEMORY].threshold, fit[alarms.MEMORY].comparison) == (90.0, "GreaterThanThreshold")  # percent
    assert "above 90% of HBM" in fit[alarms.MEMORY].condition


def test_windows_are_whole_minutes_that_hold_a_datapoint(plan, fit):
    step = plan.estimates.step_time_seconds
    cadence = alarms.catalogue.DEFAULT_INTERVAL_SECONDS
    assert fit.step_seconds == step and fit.cadence_seconds == cadence
    assert fit.window_seconds % 60 == 0
    assert fit.window_seconds >= max(5 * 60, 2 * max(step, cadence) + cadence)
    assert fit.window_seconds - 60 < max(5 * 60, 2 * max(step, cadence) + cadence)  # the smallest such
    for name in (alarms.THROUGHPUT, alarms.GPU_UTILIZATION, alarms.MEMORY, alarms.LOSS):
        alarm = fit[name]
        assert alarm.period_seconds == fit.window_seconds
        assert (alarm.evaluation_periods, alarm.datapoints_to_alarm, alarm.treat_missing_data) == (1, 1, "notBreaching")
        assert alarm.fires_within_seconds == fit.window_seconds + math.ceil(max(step, cadence)) + 120


def test_a_slow_step_widens_the_window(tmp_path):
    # Minutes per step (a 67M-token batch on one node): step metrics arrive once a step.
    assert alarms.whole_minutes(60) == 60 and alarms.whole_minutes(61) == 120 and alarms.whole_minutes(0.5) == 60
    plan = plan_of(tmp_path, **{"budget.global_batch_tokens": 4096 * 16384, "model.catalog": "llama-3.1-8b"})
    fit = alarms.fit_alarms(plan)
    step = plan.estimates.step_time_seconds
    assert step > 150
    assert fit.window_seconds == alarms.whole_minutes(2 * step + 60) > 5 * 60


def test_stall_window_covers_the_longest_healthy_pause(tmp_path):
    plan = plan_of(tmp_path, **{"monitoring.stall_minutes": 7, "checkpointing.shutdown_deadline_seconds": 600})
    fit = alarms.fit_alarms(plan)
    pause = 2 * plan.estimates.step_time_seconds + 600 + fit.validation_seconds
    assert fit.stall_seconds == alarms.whole_minutes(max(7 * 60, pause))
    stalled = fit[alarms.STALLED]
    assert stalled.period_seconds == fit.stall_seconds
    assert (stalled.threshold, stalled.comparison) == (1, "GreaterThanOrEqualToThreshold")
    assert stalled.fires_within_seconds == fit.stall_seconds + 120 + 60
    assert fit.stall_min_reports == max(2, int(0.75 * fit.stall_seconds / 60))
    assert "no training step for" in stalled.condition
    short = alarms.fit_alarms(plan_of(tmp_path, "short", **{"monitoring.stall_minutes": 30}))
    assert short.stall_seconds == 30 * 60


def test_validation_alarm_only_with_a_validation_loss(tmp_path):
    with_holdout = alarms.fit_alarms(plan_of(tmp_path, "holdout"))
    validation = with_holdout[alarms.VALIDATION]
    assert (validation.threshold, validation.comparison) == (0.5, "GreaterThanThreshold")
    none = alarms.fit_alarms(plan_of(tmp_path, "none", **{"data.validation_fraction": 0}))
    assert alarms.VALIDATION not in none.alarms
    assert set(none.alarms) == {alarms.THROUGHPUT, alarms.GPU_UTILIZATION, alarms.MEMORY, alarms.LOSS,
                                alarms.STALLED, alarms.EXECUTION_FAILED}
    assert none[alarms.EXECUTION_FAILED].notifies is False
