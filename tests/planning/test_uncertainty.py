"""Ranges, not points: every predicted throughput, time and cost carries the model's held-out error for its kind
of run (planning/uncertainty.py, from make calibrate's leave-one-source-out), in the plan, explain and the
JSON, and the probe's comparison says when a measurement falls outside it."""

from __future__ import annotations

import json

import pytest
import yaml
from support import RECIPES, recipe_dict

from tiered_training import catalog as catalogs
from tiered_training import report
from tiered_training.aws import probe_runs
from tiered_training.planning import uncertainty
from tiered_training.planning.planner import plan_file, resolve
from tiered_training.recipe.loader import parse_recipe


def plan_of(**overrides):
    recipe, lines = parse_recipe(yaml.safe_dump(recipe_dict(**overrides), sort_keys=False), "r.yaml")
    return resolve(recipe, source="r.yaml", lines=lines)


def run(error, **kind):
    base = uncertainty.kind_of_run("H100", "bf16", True, 8192)
    return {**base, **kind, "error": error}


def test_a_small_group_spans_its_extremes_and_a_large_one_its_10th_to_90th_percentiles():
    assert uncertainty.band([0.1, -0.2, 0.05]) == uncertainty.Band(3, 0.1, 0.2, -0.2, 0.1)
    many = [i / 100 for i in range(-10, 11)]  # -10% .. +10%, 21 runs
    found = uncertainty.band(many)
    assert (found.low, found.high) == (-0.08, 0.08)
    # a group that only over-predicts still contains the prediction itself
    assert uncertainty.band([0.1, 0.2]).low == 0.0


def test_measured_throughput_lies_between_the_prediction_over_one_plus_each_error():
    rng = uncertainty.Range(low=-0.2, high=0.25, basis="")
    assert rng.measured(1000.0) == pytest.approx((800.0, 1250.0))
    assert rng.contains(1000.0, 1100.0) and not rng.contains(1000.0, 700.0)


def test_the_range_comes_from_the_runs_of_the_plans_kind_and_widens_where_too_few_match():
    runs = [run(0.05) for _ in range(5)] + [run(-0.3, precision="fp8") for _ in range(2)]
    same = uncertainty.range_for(uncertainty.kind_of_run("H100", "bf16", True, 8192), runs)
    assert (same.low, same.high) == (0.0, 0.05) and "5 calibration runs" in same.basis
    # two FP8 runs are too few: the sequence and compile dimensions do not narrow them further, so the
    # precision goes too and all seven runs count
    fp8 = uncertainty.range_for(uncertainty.kind_of_run("H100", "fp8", True, 8192), runs)
    assert fp8.low == -0.3 and "7 calibration runs" in fp8.basis and "too few that also match" in fp8.basis
    lora = uncertainty.range_for(uncertainty.kind_of_run("H100", "bf16", True, 8192, "lora"), runs)
    assert "none of adapter lora" in lora.basis


def test_the_stored_held_out_runs_are_every_calibration_run():
    summary = catalogs.performance_model().summary
    assert len(summary.loso_runs) == summary.rows
    assert set(summary.loso_by_kind["generation"]) >= {"Ampere", "Hopper", "Blackwell"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_template_carries_ranges_around_its_predictions(path):
    plan = plan_file(path)
    est = plan.estimates
    low, high = est.tokens_per_second_per_gpu_range
    assert low <= est.tokens_per_second_per_gpu <= high and low < high
    assert est.wall_time_hours_range[0] <= est.wall_time_hours <= est.wall_time_hours_range[1]
    assert "held-out errors of" in est.range_basis
    for c in plan.candidates:
        c_low, c_high = c.tokens_per_second_per_gpu_range
        assert c_low <= c.tokens_per_second_per_gpu <= c_high
    text = " ".join(str(line) for line in report.explain_lines(plan))
    assert f"{low:,.0f}-{high:,.0f} tokens/s per GPU" in " ".join(text.split())


def test_a_priced_plan_has_a_cost_range_and_the_json_carries_every_range():
    plan = plan_of(**{"compute.price_per_hour": 100.0})
    est = plan.estimates
    assert est.cost_usd_range[0] <= est.cost_usd <= est.cost_usd_range[1]
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["estimates"]["cost_usd_range"] == pytest.approx(list(est.cost_usd_range))
    assert data["candidates"][0]["tokens_per_second_per_gpu_range"] == list(
        plan.candidates[0].tokens_per_second_per_gpu_range
    )


def test_an_a100_plan_takes_the_ampere_runs():
    plan = plan_of(
        **{
            "compute.instance_type": "ml.p4de.24xlarge",
            "sequence_length": 2048,
            "budget.global_batch_tokens": 2048 * 256,
            "model.catalog": "llama-3.2-1b",
        }
    )
    assert plan.ok
    assert "Ampere" in plan.estimates.range_basis


def test_a_probe_measurement_outside_the_range_is_surprising():
    plan = plan_file(next(r for r in RECIPES if r.name == "llama3-8b-fp8-p5.yaml"))
    first = plan.candidates[0]
    low, high = first.tokens_per_second_per_gpu_range
    found = probe_runs.ProbeMeasurements(
        "job", 1, {1: probe_runs.Measured(1, high * 1.2, 0.5, 0.6), 2: probe_runs.Measured(2, (low + high) / 2)}
    )
    rows = probe_runs.compare(plan.candidates[:2], found)
    assert rows[0].surprising is True
    assert rows[1].surprising is (
        not plan.candidates[1].tokens_per_second_per_gpu_range[0]
        <= (low + high) / 2
        <= plan.candidates[1].tokens_per_second_per_gpu_range[1]
    )
    text = "\n".join(probe_runs.lines(found, rows))
    assert f"surprising: outside the model's range {low:,.0f}-{high:,.0f}" in text
