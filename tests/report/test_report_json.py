"""The JSON every command prints with ``--format json`` (validate, plan) and the markdown
summary: each finding with its file, line and fix; a recipe that does not load under its
file with the loader's problems; ``strict`` turning warnings into failures."""

from __future__ import annotations

import pytest
from support import recipe_dict, write_yaml

from tiered_training import report
from tiered_training.planning.planner import plan_file
from tiered_training.recipe.errors import Problem, RecipeError


@pytest.fixture
def failed(tmp_path):
    return plan_file(write_yaml(tmp_path / "big.yaml", recipe_dict(**{"model.catalog": "qwen2.5-32b"})))


@pytest.fixture
def warned(tmp_path):
    # compute.max_wait_hours without spot: a warning, nothing blocking.
    return plan_file(write_yaml(tmp_path / "warned.yaml", recipe_dict(**{"compute.max_wait_hours": 10})))


INVALID = RecipeError([Problem("z-bad.yaml", 3, "sequence_length", "must be at least 128", 12, True),
                       Problem("z-bad.yaml", 9, "", "duplicate key; keep one")])


def test_a_finding_names_its_file_line_and_fix(failed):
    error = failed.errors[0]
    assert report.finding_dict(failed, error) == {
        "severity": "error", "code": "needs-multiple-nodes", "file": failed.source,
        "line": failed.locations["compute.instance_count"], "field": "compute.instance_count",
        "message": error.message, "fix": error.fix, "value": None}


def test_a_recipe_that_does_not_load_is_listed_with_its_problems():
    assert report.problem_dict(INVALID.problems[0]) == {
        "severity": "error", "code": "invalid-recipe", "fix": "", "file": "z-bad.yaml", "line": 3,
        "field": "sequence_length", "message": "must be at least 128", "value": "12"}
    assert report.failure_dict(INVALID) == {
        "source": "z-bad.yaml", "name": None, "ok": False, "warnings": [],
        "errors": [report.problem_dict(p) for p in INVALID.problems]}
    assert report.failure_dict(RecipeError([]))["source"] is None


def test_validate_json(failed, warned):
    assert warned.ok and warned.warnings, warned.findings
    data = report.validate_data([warned, failed], [INVALID])
    assert (data["schema_version"], data["strict"], data["ok"]) == (report.SCHEMA_VERSION, False, False)
    by_source = {r["source"]: r for r in data["recipes"]}
    assert [r["source"] for r in data["recipes"]] == sorted(by_source)
    assert by_source[warned.source]["ok"] is True and by_source[warned.source]["name"] == "unit-test"
    assert by_source[warned.source]["warnings"] == [report.finding_dict(warned, f) for f in warned.warnings]
    assert by_source[failed.source]["errors"] == [report.finding_dict(failed, f) for f in failed.errors]
    assert by_source[failed.source]["account"] == [report.finding_dict(failed, f) for f in failed.account_findings] != []
    assert by_source["z-bad.yaml"] == report.failure_dict(INVALID)
    # strict: warnings block too.
    strict = report.validate_data([warned], strict=True)
    assert strict["strict"] is True and strict["ok"] is False and strict["recipes"][0]["ok"] is False
    assert report.validate_data([warned])["ok"] is True


def test_plan_json(failed, warned):
    data = report.plans_data([warned], [INVALID])
    placed = warned.to_dict()
    for finding, entry in zip(warned.findings, placed["findings"], strict=True):  # each with where it points
        entry["file"], entry["line"] = report.finding_place(warned, finding)
    assert data == {"schema_version": report.SCHEMA_VERSION, "ok": False, "plans": [placed],
                    "invalid": [report.failure_dict(INVALID)]}
    assert all(f["file"] == warned.source for f in data["plans"][0]["findings"])
    assert report.plans_data([warned])["ok"] is True
    assert report.plans_data([warned, failed])["ok"] is False


def test_catalogue_json():
    from tiered_training import catalog as catalogs

    tiers = report.tiers_data()
    assert tiers["schema_version"] == report.SCHEMA_VERSION and [t["name"] for t in tiers["tiers"]] == [t.name for t in catalogs.tiers()]
    assert report.models_data()["schema_version"] == report.SCHEMA_VERSION
    models = report.models_data()["models"]
    by_id = {m["id"]: m for m in models}
    assert list(by_id) == list(catalogs.models())
    entry = catalogs.models()["llama-3.1-8b"]
    assert by_id["llama-3.1-8b"]["parameters"] == entry.architecture.parameters
    assert by_id["llama-3.1-8b"]["display_name"] == entry.display_name


def test_markdown_summary_marks_errors_and_warnings(failed):
    text = report.plans_markdown([failed])
    lines = text.splitlines()
    assert lines[0].startswith("| recipe | model | tier |") and lines[1] == "|" + "---|" * len(report.COLUMNS)
    assert lines[2] == f"| unit-test | {failed.model_name} | large | 1x ml.p6-b200.48xlarge |" + "  |" * 11 + " 1 error(s) |  |"
    notes = [line for line in lines if line.startswith("- ")]
    assert notes[0] == f"- ❌ {report.format_finding(failed, failed.errors[0])}"
    assert notes[1:] and all(n.startswith("- ⚠️ ") for n in notes[1:])
    assert "\n**unit-test**\n" in text and text.endswith("\n")
    assert not any("info: " in n for n in notes) and any(f.severity == "info" for f in _plan().findings)
    informed = _plan()
    assert not any("departs-from-tier" in line for line in report.plans_markdown([informed]).splitlines())
    assert report.plans_json([informed]) .strip().startswith("{")
    import json as _json
    assert _json.loads(report.plans_json([informed], [INVALID])) == _json.loads(_json.dumps(report.plans_data([informed], [INVALID]), default=str))


def test_instances_json_carries_on_demand_and_spot_prices(monkeypatch):
    from tiered_training import catalog as catalogs

    monkeypatch.setenv(catalogs.price_variable("ml.p5.48xlarge"), "12.5")
    data = report.instances_data()
    assert data["schema_version"] == report.SCHEMA_VERSION
    rows = {r["name"]: r for r in data["instances"]}
    assert rows["ml.p5.48xlarge"]["price_per_hour"] == 12.5 and "environment" in rows["ml.p5.48xlarge"]["price_source"].lower()
    inst = catalogs.instances()["ml.p5.48xlarge"]
    row = rows["ml.p5.48xlarge"]
    assert (row["price_per_hour"], row["price_source"]) == inst.price()
    assert (row["spot_price_per_hour"], row["spot_price_source"]) == inst.price(spot=True)
    assert row["spot_price_per_hour"] < row["price_per_hour"]


def test_tier_rows_give_each_tiers_parameter_range():
    from tiered_training import catalog as catalogs

    tiers = catalogs.tiers()
    rows = report.tier_rows()
    assert rows[0]["parameters"] == f"{tiers[0].min_parameters / 1e9:g}B-{tiers[0].max_parameters / 1e9:g}B"
    assert [r["parameters"].split("-")[0] for r in rows[1:]] == [f"{t.max_parameters / 1e9:g}B" for t in tiers[:-1]]


def test_explain_begins_with_the_decisions_and_shows_the_memory_terms():
    from support import recipe_dict as base

    from tiered_training.planning.planner import resolve
    from tiered_training.recipe import Recipe

    plan = resolve(Recipe.model_validate(base(**{"tuning.batch_ramp": True})))
    lines = report.explain_lines(plan)
    assert lines[:3] == ["unit-test  (recipe)", "", "Decisions"]
    for d, line in zip(plan.decisions, lines[3:]):
        value = d.value if not isinstance(d.value, dict) else ", ".join(f"{k}={v}" for k, v in d.value.items())
        assert line == f"  {d.field:<34} {str(value):<14} [{d.source}] {d.reason}"
    ramp = next(d for d in plan.decisions if d.field == "tuning.batch_ramp")
    assert isinstance(ramp.value, dict)  # shown as key=value pairs
    assert any(line.startswith("  tuning.batch_ramp") and ", ".join(f"{k}={v}" for k, v in ramp.value.items()) in line for line in lines)
    start = lines.index(next(line for line in lines if line.startswith("Memory per GPU")))
    assert lines[start - 1] == ""
    shown = [line.split()[0] for line in lines[start + 1:start + 9]]
    assert shown == [k for k in plan.memory.as_gib() if k != "hbm"]


def _plan(**overrides):
    from support import recipe_dict as base

    from tiered_training.planning.planner import resolve
    from tiered_training.recipe import Recipe

    return resolve(Recipe.model_validate(base(**overrides)))


def test_a_summary_row_says_what_was_planned():
    from tiered_training.planning.memory import GIB

    plan = _plan(**{"tuning.precision": "fp8", "compute.spot": True, "compute.price_per_hour": 100.0})  # warnings: fp8 against the tier
    assert plan.ok and plan.warnings and plan.account_findings
    est = plan.estimates
    row = report.summary_row(plan)
    assert list(row) == list(report.COLUMNS)
    assert row["model"] == f"{plan.model_name} ({plan.parameters / 1e9:.1f}B)"
    assert (row["tier"], row["compute"]) == (plan.tier.name, "1x p6-b200.48xlarge")
    assert (row["precision"], row["AC"]) == (f"fp8/{plan.fp8_recipe}", plan.activation_checkpointing)
    assert row["sharding"] == f"{plan.sharding}/{plan.shard_group_size}"
    assert row["mb x accum"] == f"{plan.micro_batch_size} x {plan.grad_accum_steps}"
    assert row["GiB/GPU"] == f"{plan.memory.total / GIB:,.1f} ({plan.memory.fraction:.0%})"
    assert row["cost"] == f"${est.cost_usd:,.0f} spot est."
    assert row["status"] == f"ok, {len(plan.warnings)} warning(s)" and row["quotas"] == str(len(plan.account_findings))
    brief = report.brief_row(plan)
    assert list(brief) == list(report.BRIEF_COLUMNS) and brief["status"] == f"{len(plan.warnings)} warning(s)"
    assert brief["cost"] == f"~${est.cost_usd:,.0f}" and brief["GiB/GPU"] == row["GiB/GPU"]
    plain_plan = _plan(**{"tuning.precision": "bf16", "tuning.follow_tiers": "strict",
                          "compute.quotas": {"training/ml.p6-b200.48xlarge": 1, "warm-pool/ml.p6-b200.48xlarge": 1}})
    assert plain_plan.ok and not plain_plan.warnings and not plain_plan.account_findings, plain_plan.findings
    plain = report.summary_row(plain_plan)
    assert plain["precision"] == "bf16" and plain["sharding"].count("cp") == 0
    cost = plain_plan.estimates.cost_usd  # None where the price catalogue has no price for the region
    assert plain["cost"] == ("-" if cost is None else f"${cost:,.0f}")
    assert plain["status"] == "ok" and plain["quotas"] == ""
    quotas = report.summary_row(_plan(**{"tuning.precision": "bf16", "tuning.follow_tiers": "strict"}))
    assert quotas["status"] == "ok" and quotas["quotas"] == "2"
    long = report.summary_row(_plan(**{"sequence_length": 131072, "budget.global_batch_tokens": 131072 * 8,
                                       "model.catalog": "llama-3.1-8b", "compute.instance_type": "ml.p5.48xlarge"}))
    assert " cp" in long["sharding"]


def test_durations_read_in_hours_then_days():
    assert report._hours(47.94) == "47.9 h"
    assert report._hours(48.0) == "2.0 d"
    assert report._hours(48.5) == "2.0 d"
    assert report._hours(1234.0) == "51.4 d"


def test_a_finding_points_at_its_field_or_the_nearest_parent(tmp_path):
    from tiered_training.planning.plan import Finding

    plan = plan_file(write_yaml(tmp_path / "r.yaml", recipe_dict()))
    located = Finding("warning", "x", "a message", "do this", "compute.instance_type")
    assert report.finding_line(plan, located) == plan.locations["compute.instance_type"]
    deeper = Finding("warning", "x", "a message", "", "compute.quotas.training/ml.p5.48xlarge")
    assert report.finding_line(plan, deeper) == plan.locations["compute"]
    under = Finding("warning", "x", "a message", "", "compute.instance_type.part")
    assert report.finding_line(plan, under) == plan.locations["compute.instance_type"] != plan.locations["compute"]
    assert report.finding_line(plan, Finding("info", "x", "m")) is None
    assert report.format_finding(plan, located) == (
        f"warning: {plan.source}:{plan.locations['compute.instance_type']}: compute.instance_type: a message. Fix: do this. [x]")
    assert report.format_finding(plan, Finding("info", "y", "m")) == f"info: {plan.source}: m. [y]"
    assert report.format_finding(_plan(), Finding("info", "y", "m")) == "info: unit-test: m. [y]"


def test_explain_sections_in_order():
    plan = _plan(**{"compute.spot": True})
    assert plan.departures and plan.alternatives and plan.findings
    lines = report.explain_lines(plan)
    headings = [line for line in lines if line and not line.startswith(" ")]
    assert headings[1:] == [
        "Decisions", headings[2], "Estimates", headings[4],
        f"Departures from the {plan.tier.name} tier (tuning.follow_tiers: strict keeps the tier's choices)",
        "Next alternatives that fit", headings[7], "Findings"]
    assert headings[2].startswith("Memory per GPU (") and headings[4].startswith("Step time, term by term (")
    assert headings[7].startswith("Probe candidates (")
    for heading in headings[1:]:
        assert lines[lines.index(heading) - 1] == ""  # each section after a blank line
    fraction = next(line for line in lines if line.endswith("of HBM: fits"))
    assert fraction == f"  {'':<22} {plan.memory.fraction:>9.1%} of HBM: fits"
    assert not any(line.lstrip().startswith("hbm") for line in lines)
    terms = plan.estimates.step_terms
    total = sum(t.seconds for t in terms)
    step = lines.index(headings[4])
    for term, line in zip(terms, lines[step + 1:]):
        assert line == f"  {term.name:<26} {term.seconds:>9,.3f} s {term.seconds / total:>6.1%}  {term.what}"
    assert lines[step + 1 + len(terms)] == f"  {'step':<26} {total:>9,.3f} s"
    d = plan.departures[0]
    assert f"  {d.field:<34} {d.tier_value} -> {d.value}: {d.gain:+.1%} predicted, {d.margin_gib:,.1f} GiB kept under the headroom" in lines
    assert lines[-len(plan.findings):] == [f"  {report.format_finding(plan, f)}" for f in plan.findings]


def test_explain_without_findings_says_none():
    import dataclasses

    plan = dataclasses.replace(_plan(), findings=(), departures=(), alternatives=())
    lines = report.explain_lines(plan)
    assert lines[-2:] == ["Findings", "  none"] and "Next alternatives that fit" not in lines
