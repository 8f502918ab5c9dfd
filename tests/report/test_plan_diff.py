"""``diff``: what changed between two plans, and how the text and markdown render it."""

from __future__ import annotations

from support import recipe_dict

from tiered_training import report
from tiered_training.planning.memory import GIB
from tiered_training.planning.planner import resolve
from tiered_training.recipe import Recipe


def plan_of(**overrides):
    # A stated price: the catalogue may have none for a region, and then a plan has no cost to compare.
    return resolve(Recipe.model_validate(recipe_dict(**({"compute.price_per_hour": 100.0} | overrides))))


def test_diff_of_two_plans():
    old = plan_of()
    new = plan_of(**{"compute.instance_type": "ml.p5.48xlarge", "name": "on-p5"})
    result = report.diff(old, new)
    assert (result["schema_version"], result["old"], result["new"]) == (report.SCHEMA_VERSION, "unit-test", "on-p5")
    changed = {c["field"]: c for c in result["changed"]}
    assert [c["field"] for c in result["changed"]] == sorted(changed)
    assert (changed["compute.instance_type"]["old"], changed["compute.instance_type"]["new"]) == ("ml.p6-b200.48xlarge", "ml.p5.48xlarge")
    assert (changed["compute.gpu"]["old"], changed["compute.gpu"]["new"]) == ("B200", "H100")
    assert changed["compute.instance_counts"]["old"] == list(old.instance_counts)
    assert changed["compute.instance_counts"]["new"] == list(new.instance_counts)
    micro = changed["tuning.micro_batch_size"]
    assert (micro["old"], micro["new"]) == (old.micro_batch_size, new.micro_batch_size)
    assert micro["reason"] == new.decision("tuning.micro_batch_size").reason != ""
    assert changed["compute.instance_type"]["reason"] == ""  # the recipe's own value: no decision
    assert "tuning.sequence_length" not in changed and "model.name" not in changed
    values = {
        "memory_gib_per_gpu": (old.memory.total / GIB, new.memory.total / GIB),
        "tokens_per_second_per_gpu": (old.estimates.tokens_per_second_per_gpu, new.estimates.tokens_per_second_per_gpu),
        "mfu": (old.estimates.mfu, new.estimates.mfu),
        "mfu_causal": (old.estimates.mfu_causal, new.estimates.mfu_causal),
        "wall_time_hours": (old.estimates.wall_time_hours, new.estimates.wall_time_hours),
        "cost_usd": (old.estimates.cost_usd, new.estimates.cost_usd),
    }
    assert list(result["metrics"]) == list(values)
    for key, (a, b) in values.items():
        assert result["metrics"][key] == {"old": a, "new": b, "delta": b - a, "ratio": b / a}, key
    old_findings = {(f.severity, f.code, f.message) for f in old.findings}
    new_findings = {(f.severity, f.code, f.message) for f in new.findings}
    assert result["findings_added"] == [{"severity": s, "code": c, "message": m} for s, c, m in sorted(new_findings - old_findings)]
    assert result["findings_removed"] == [{"severity": s, "code": c, "message": m} for s, c, m in sorted(old_findings - new_findings)]
    assert result["findings_added"] and result["findings_removed"]


def test_the_run_shape_is_part_of_the_diff():
    old = plan_of(**{"budget.total_tokens": 3 * 10**11})
    new = plan_of(**{"budget.total_tokens": 3 * 10**11, "compute.max_runtime_hours": 24})
    changed = {c["field"]: (c["old"], c["new"]) for c in report.diff(old, new)["changed"]}
    assert changed["compute.segments"] == (old.segments, new.segments) and new.segments > old.segments
    assert changed["compute.max_runtime_hours"] == (round(old.job_runtime_seconds / 3600, 2), round(new.job_runtime_seconds / 3600, 2))
    assert changed["compute.max_runtime_hours"][1] == 24.0


def test_a_failed_plan_has_no_estimates_to_compare():
    old = plan_of()
    failed = plan_of(**{"model.catalog": "qwen2.5-32b"})
    result = report.diff(old, failed)
    for key, metric in result["metrics"].items():
        assert metric["new"] is None and metric["delta"] is None and metric["ratio"] is None, key
        assert metric["old"] is not None
    assert report.diff(failed, failed)["changed"] == []
    # What only the plan has (the run's segments) shows as gone.
    changed = {c["field"]: (c["old"], c["new"]) for c in result["changed"]}
    assert changed["compute.segments"] == (old.segments, None)


def test_a_different_model_shows_under_model():
    old, new = plan_of(), plan_of(**{"model.catalog": "llama-3.1-8b"})
    changed = {c["field"]: (c["old"], c["new"]) for c in report.diff(old, new)["changed"]}
    assert changed["model.name"] == (old.model_name, new.model_name)
    assert changed["model.parameters"] == (old.parameters, new.parameters)


RESULT = {
    "old": "a", "new": "b",
    "changed": [
        {"field": "tuning.micro_batch_size", "old": 16, "new": 4, "reason": "the largest that fits"},
        {"field": "compute.instance_type", "old": "ml.p6-b200.48xlarge", "new": None, "reason": ""},
    ],
    "metrics": {
        "memory_gib_per_gpu": {"old": 132.08, "new": 43.49, "delta": 43.49 - 132.08, "ratio": 43.49 / 132.08},
        "mfu": {"old": 0.4834, "new": 0.4729, "delta": 0.4729 - 0.4834, "ratio": 0.4729 / 0.4834},
        "cost_usd": {"old": 1328.3, "new": None, "delta": None, "ratio": None},
    },
    "findings_added": [{"severity": "warning", "code": "x-new", "message": "appears"}],
    "findings_removed": [{"severity": "info", "code": "x-old", "message": "goes"}],
}


def test_diff_as_text():
    assert report.diff_text(RESULT) == (
        "a -> b\n"
        "  tuning.micro_batch_size: 16 -> 4  (the largest that fits)\n"
        "  compute.instance_type: ml.p6-b200.48xlarge -> -\n"
        "  memory_gib_per_gpu: 132.1 -> 43.5 (-67.1% relative)\n"
        "  mfu: 48.3% -> 47.3% (-1.1 points)\n"
        "  cost_usd: $1,328 -> -\n"
        "  new warning[x-new]: appears\n"
        "  resolved info[x-old]: goes\n"
    )
    same = RESULT | {"changed": [], "findings_added": [], "findings_removed": []}
    assert report.diff_text(same).splitlines()[:2] == ["a -> b", "  no decision changed"]


def test_diff_as_markdown():
    assert report.diff_markdown(RESULT) == (
        "### Plan diff: `a` → `b`\n"
        "\n"
        "| decision | old | new | why |\n"
        "|---|---|---|---|\n"
        "| tuning.micro_batch_size | 16 | 4 | the largest that fits |\n"
        "| compute.instance_type | ml.p6-b200.48xlarge | - |  |\n"
        "\n"
        "| estimate | old | new | change |\n"
        "|---|---|---|---|\n"
        "| memory_gib_per_gpu | 132.1 | 43.5 | -67.1% relative |\n"
        "| mfu | 48.3% | 47.3% | -1.1 points |\n"
        "| cost_usd | $1,328 | - | - |\n"
        "\n"
        "**New findings**\n"
        "- warning[x-new]: appears\n"
        "\n"
        "**Resolved findings**\n"
        "- info[x-old]: goes\n"
    )
    same = RESULT | {"changed": [], "findings_added": [], "findings_removed": []}
    text = report.diff_markdown(same)
    assert text.splitlines()[2] == "No decision changed." and "| decision |" not in text and "findings" not in text


def test_an_estimate_that_shows_the_same_is_left_out_of_text_and_markdown():
    """``wall_time_hours: 70.1 -> 70.1 (-0.0% relative)`` says nothing: text and markdown leave it out, JSON keeps it."""
    old = plan_of()
    new = plan_of(**{"tags": {"team": "other"}})  # a change that moves no estimate
    result = report.diff(old, new)
    assert set(result["metrics"]) >= {"wall_time_hours", "cost_usd"}
    text, markdown = report.diff_text(result), report.diff_markdown(result)
    assert "wall_time_hours" not in text and "relative" not in text
    assert "  no estimate changed (as shown)" in text.splitlines()
    assert "| estimate |" not in markdown and "No estimate changed (as shown)." in markdown
    # A figure that moves by less than its last shown digit is left out; one that shows a change stays.
    nudged = dict(result, metrics={
        "wall_time_hours": {"old": 70.12, "new": 70.14, "delta": 0.02, "ratio": 70.14 / 70.12},
        "cost_usd": {"old": 1000.0, "new": 1100.0, "delta": 100.0, "ratio": 1.1},
    })
    lines = report.diff_text(nudged).splitlines()
    assert not any("wall_time_hours" in line for line in lines)
    assert any(line.startswith("  cost_usd: $1,000 -> $1,100 (+10.0% relative)") for line in lines), lines
