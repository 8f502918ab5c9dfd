"""Alarm fitting as pure functions of the plan (tiered_training/planning/alarms.py), no CDK."""

from __future__ import annotations

import math

import pytest
from support import recipe_dict, write_yaml

from tiered_training.planning import alarms
from tiered_training.planning.planner import plan_file

LLAMA3_VOCABULARY = 128_256


def plan_of(tmp_path, name="alarms", **overrides):
    return plan_file(write_yaml(tmp_path / f"{name}.yaml", recipe_dict(**overrides)))


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return plan_of(tmp_path_factory.mktemp("alarms"), **{"monitoring.min_throughput_fraction": 0.6})


@pytest.fixture
def fit(plan):  # per test: mutation testing sees which tests reach fit_alarms
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
    minutes = fit.window_seconds // 60
    assert alarm.condition == f"tokens/s per GPU below 0.6 x the plan's {rate:,.0f} over {minutes} min"
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
    assert fit[alarms.LOSS].condition == "training loss above 12.76 or not finite"
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
    assert fit[alarms.MEMORY].condition == "a node's peak GPU memory above 90% of HBM"
    minutes = fit.window_seconds // 60
    assert fit[alarms.GPU_UTILIZATION].condition == f"a node's GPU utilisation during steps below 55% over {minutes} min"


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
    assert stalled.condition == f"no training step for {fit.stall_seconds // 60} min while the run is alive (heartbeat)"
    short = alarms.fit_alarms(plan_of(tmp_path, "short", **{"monitoring.stall_minutes": 30}))
    assert short.stall_seconds == 30 * 60


def test_validation_alarm_only_with_a_validation_loss(tmp_path):
    with_holdout = alarms.fit_alarms(plan_of(tmp_path, "holdout"))
    validation = with_holdout[alarms.VALIDATION]
    assert (validation.threshold, validation.comparison) == (0.5, "GreaterThanThreshold")
    none = alarms.fit_alarms(plan_of(tmp_path, "none", **{"data.validation_fraction": 0}))
    assert alarms.VALIDATION not in none.alarms
    assert set(none.alarms) == {alarms.THROUGHPUT, alarms.GPU_UTILIZATION, alarms.MEMORY, alarms.LOSS,
                                alarms.STALLED, alarms.EXECUTION_FAILED, alarms.STRAGGLER, alarms.GPU_FAULT,
                                alarms.GPU_SLOWDOWN}
    failed = none[alarms.EXECUTION_FAILED]
    assert (failed.period_seconds, failed.threshold, failed.comparison, failed.fires_within_seconds, failed.notifies) == (
        300, 1, "GreaterThanOrEqualToThreshold", 360, False)
    assert failed.condition == "an execution of the pipeline failed (the failed-execution rule notifies)"
    assert validation.condition == "validation loss more than 0.5 above the training loss"
    assert validation.period_seconds == with_holdout.window_seconds
    # Evaluated at the first step after its interval, sent with the next event, then two evaluations.
    plan = plan_of(tmp_path, "holdout")
    step = plan.estimates.step_time_seconds
    assert validation.fires_within_seconds == math.ceil(30 * 60 + step + with_holdout.validation_seconds + 60) + 120


def test_validation_pass_length(tmp_path):
    # One sequence per GPU and step: one micro-batch per step.
    plan = plan_of(tmp_path, **{"validation.batches": 6, "budget.global_batch_tokens": 4096 * 8})
    assert plan.grad_accum_steps == 1
    assert alarms.validation_seconds(plan) == pytest.approx(6 * plan.estimates.step_time_seconds / 2, rel=1e-12)
    assert alarms.fit_alarms(plan).validation_seconds == alarms.validation_seconds(plan)
    accumulating = plan_of(tmp_path, "accumulating", **{"validation.batches": 6, "tuning.micro_batch_size": 1})
    assert accumulating.grad_accum_steps > 1
    per_micro_batch = accumulating.estimates.step_time_seconds / accumulating.grad_accum_steps
    assert alarms.validation_seconds(accumulating) == pytest.approx(6 * per_micro_batch / 2, rel=1e-12)


def test_a_slow_cadence_needs_two_heartbeats_at_least(tmp_path):
    plan = plan_of(tmp_path)
    fit = alarms.fit_alarms(plan, cadence_seconds=300)
    assert fit.cadence_seconds == 300.0
    assert fit.stall_min_reports == max(2, int(0.75 * fit.stall_seconds / 300)) == 2
    assert fit[alarms.STALLED].fires_within_seconds == fit.stall_seconds + 120 + 300


def test_routing_warns_only_when_the_alarms_reach_no_one(tmp_path):
    plan = plan_of(tmp_path)
    (finding,) = alarms.routing_findings(plan, platform_has_subscriber=False)
    assert (finding.severity, finding.code, finding.field) == ("warning", "alarms-unrouted", "monitoring")
    assert finding.message == ("the recipe's alarms go to the platform topic, which has no subscriber: "
                               "a stall or a diverged loss notifies no one")
    assert finding.fix == ("set monitoring.alarm_email or monitoring.alarm_topic_arn, or give the app an alarm_email "
                           "(cdk.json context or -c alarm_email=...)")
    assert alarms.routing_findings(plan, platform_has_subscriber=True) == []
    assert alarms.routing_findings(plan_of(tmp_path, "mail", **{"monitoring.alarm_email": "a@example.com"}), False) == []
    topic = "arn:aws:sns:us-east-1:123456789012:alarms"
    assert alarms.routing_findings(plan_of(tmp_path, "topic", **{"monitoring.alarm_topic_arn": topic}), False) == []


def test_the_apps_context_decides_the_platform_subscriber(tmp_path):
    assert alarms.platform_subscribed({"alarm_email": "oncall@example.com"})
    assert not alarms.platform_subscribed({"alarm_email": ""}) and not alarms.platform_subscribed(None)
    cdk_json = tmp_path / "cdk.json"
    assert alarms.app_context(cdk_json) == {}  # no file
    cdk_json.write_text("{not json")
    assert alarms.app_context(cdk_json) == {}
    cdk_json.write_text('["a list"]')
    assert alarms.app_context(cdk_json) == {}
    cdk_json.write_text('{"context": ["a list"]}')
    assert alarms.app_context(cdk_json) == {}
    cdk_json.write_text('{"app": "python app.py", "context": {"alarm_email": "oncall@example.com"}}')
    assert alarms.app_context(cdk_json) == {"alarm_email": "oncall@example.com"}
    plan = plan_of(tmp_path)
    assert alarms.with_routing_findings(plan, {"alarm_email": "oncall@example.com"}) is plan
    warned = alarms.with_routing_findings(plan, {})
    assert warned.findings == plan.findings + tuple(alarms.routing_findings(plan, False))


def test_memory_threshold_is_a_percentage_to_the_hundredth(tmp_path):
    plan = plan_of(tmp_path, **{"monitoring.max_memory_fraction": 0.93456})
    assert alarms.fit_alarms(plan)[alarms.MEMORY].threshold == 93.46


def test_the_docs_table_shows_a_dash_without_a_validation_alarm(tmp_path):
    plan = plan_of(tmp_path, **{"data.validation_fraction": 0})
    fit = alarms.fit_alarms(plan)
    row = alarms.markdown_table([plan]).splitlines()[2]
    assert row == (f"| unit-test | {fit.step_seconds:.0f} s | {fit.window_seconds // 60} | {fit.stall_seconds // 60} | "
                   f"{fit[alarms.THROUGHPUT].fires_within_seconds / 60:.0f} | {fit[alarms.STALLED].fires_within_seconds / 60:.0f} | - | "
                   f"{fit[alarms.STRAGGLER].period_seconds // 60} | {fit[alarms.STRAGGLER].fires_within_seconds / 60:.0f} | "
                   f"{fit[alarms.GPU_SLOWDOWN].fires_within_seconds / 60:.0f} |")


def test_straggler_alarm_watches_the_window_s_highest_score_and_names_where_the_host_is(plan, fit):
    """Scores arrive at least every C + 5 T; the window holds two of them and the cadence, so one healthy
    datapoint in it keeps the alarm quiet, and a rank slow for the whole window fires it."""
    from tiered_training.contract import metrics as catalogue

    alarm = fit[alarms.STRAGGLER]
    every = fit.cadence_seconds + catalogue.STRAGGLER_GATHER_EVERY_STEPS * fit.step_seconds
    assert alarm.period_seconds >= 2 * every + fit.cadence_seconds and alarm.period_seconds % 60 == 0
    assert alarm.threshold == alarms.STRAGGLER_THRESHOLD == 0.9 and alarm.comparison == "LessThanThreshold"
    assert breaches(alarm, 0.86) and not breaches(alarm, 0.94)  # a GPU at 0.85 in forward/backward; 3 % spread
    assert alarm.fires_within_seconds == alarm.period_seconds + math.ceil(every) + 120
    for name in ("StragglerScore", "HostStragglerScore", "GpuStragglerScore", "StragglerHost"):
        assert name in alarm.condition
