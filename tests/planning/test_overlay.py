"""An account's own calibration: factors fitted on its measured runs, refused when absurd, cited by plans."""

from __future__ import annotations

import pytest
from support import recipe_dict

from tiered_training.planning import overlay
from tiered_training.planning.overlay import Measurement, OverlayRefused
from tiered_training.planning.planner import resolve
from tiered_training.recipe import Recipe

P5 = "ml.p5.48xlarge"


def _m(run: str, ratio: float, precision: str = "bf16", instance: str = P5, predicted: float = 10_000.0):
    return Measurement(run, instance, precision, measured=predicted * ratio, predicted=predicted, kind="probe")


def test_factors_per_instance_and_precision_with_leave_one_run_out_error():
    runs = [_m("a", 0.90), _m("b", 0.92), _m("c", 0.88), _m("d", 1.10, "fp8"), _m("e", 1.12, "fp8")]
    fitted = overlay.fit(runs)
    assert fitted.factors[f"{P5}/bf16"] == pytest.approx(0.90, abs=0.005)
    assert fitted.factors[f"{P5}/fp8"] == pytest.approx(1.11, abs=0.005)
    assert fitted.count == 5 and fitted.factor(P5, "fp8") == (fitted.factors[f"{P5}/fp8"], 2)
    assert fitted.factor("ml.p4d.24xlarge", "bf16") == (1.0, 0)
    loo = fitted.leave_one_out
    assert loo["median"] < loo["shipped_median"] and loo["worst"] < 0.05
    text = overlay.report(fitted)
    assert "calibrated with 5 runs of this account" in text and "leave-one-run-out error: median" in text


def test_a_factor_outside_the_bounds_is_refused_with_the_reason():
    with pytest.raises(OverlayRefused, match=r"outside 0.5-1.5 \(ml.p5.48xlarge/bf16 0.30\).*broken or misconfigured"):
        overlay.fit([_m("a", 0.3), _m("b", 0.3)])


def test_an_overlay_that_predicts_held_out_runs_worse_is_refused():
    with pytest.raises(OverlayRefused, match=r"worse than the shipped model \(median error"):
        overlay.fit([_m("a", 0.8), _m("b", 1.25)])


def test_no_runs_is_refused():
    with pytest.raises(OverlayRefused, match="no measured runs"):
        overlay.fit([])


def test_round_trip_and_a_stored_overlay_out_of_bounds_is_rejected():
    fitted = overlay.fit([_m("a", 0.9), _m("b", 0.91)])
    assert overlay.Overlay.from_dict(fitted.to_dict()) == fitted
    bad = fitted.to_dict() | {"factors": {f"{P5}/bf16": 3.0}}
    with pytest.raises(ValueError, match="outside 0.5-1.5"):
        overlay.Overlay.from_dict(bad)


def test_a_plan_cites_the_accounts_runs_and_scales_its_throughput():
    recipe = Recipe.model_validate(recipe_dict(**{"compute.instance_type": P5, "tuning.precision": "bf16"}))
    shipped = resolve(recipe)
    predicted = shipped.estimates.tokens_per_second_per_gpu
    fitted = overlay.fit([_m(r, x, predicted=predicted) for r, x in (("a", 0.85), ("b", 0.87), ("c", 0.86))])
    plan = resolve(recipe, overlay=fitted)
    assert plan.estimates.tokens_per_second_per_gpu == pytest.approx(0.86 * predicted, rel=0.01)
    assert plan.estimates.wall_time_hours == pytest.approx(shipped.estimates.wall_time_hours / 0.86, rel=0.01)
    assert "calibrated with 3 runs of this account" in plan.estimates.throughput_source
    assert any(f.code == "account-calibration" for f in plan.findings)
    # Another instance type or precision: the shipped model, no citation.
    other = resolve(
        recipe.model_copy(update={"tuning": recipe.tuning.model_copy(update={"precision": "fp8"})}), overlay=fitted
    )
    assert "this account" not in other.estimates.throughput_source
