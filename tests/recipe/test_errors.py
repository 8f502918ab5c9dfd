"""The text of every error a user reads (tiered_training/errors.py): exact, one line per problem, bounded."""

from __future__ import annotations

import pytest
from support import recipe_dict, write_yaml

from tiered_training.planning.plan import PlanError
from tiered_training.planning.planner import plan_file
from tiered_training.recipe.errors import Problem, RecipeError
from tiered_training.text import QUOTE_LIMIT, clip, quote


def test_clip_joins_lines_and_cuts_at_the_limit():
    assert clip("a\nb\r\nc  d") == "a b c d"
    assert clip("a\rb") == "a b"
    assert clip("a  b") == "a  b"  # one line already: left as it is
    assert clip("x" * QUOTE_LIMIT) == "x" * QUOTE_LIMIT
    assert clip("x" * (QUOTE_LIMIT + 1)) == "x" * QUOTE_LIMIT + f"... ({QUOTE_LIMIT + 1} characters)"
    assert clip("y" * 5000, 10) == "yyyyyyyyyy... (5,000 characters)"


def test_quote_is_a_bounded_repr():
    assert quote("abc") == "'abc'"
    assert quote("a" * (QUOTE_LIMIT - 2)) == repr("a" * (QUOTE_LIMIT - 2))  # the quotes count
    assert quote("a" * QUOTE_LIMIT) == repr("a" * QUOTE_LIMIT)[:QUOTE_LIMIT] + f"... ({QUOTE_LIMIT + 2} characters)"
    assert quote("a" * (QUOTE_LIMIT + 1)) == repr("a" * QUOTE_LIMIT) + f"... ({QUOTE_LIMIT + 1} characters)"
    assert quote("b" * 50_000_000, 5) == "'bbbbb'... (50,000,000 characters)"
    assert quote([1, 2]) == "[1, 2]"
    assert quote(list(range(100)), 20) == "[0, 1, 2, 3, 4, 5, 6... (390 characters)"

    class Lines:
        def __repr__(self):
            return "first\nsecond"

    assert quote(Lines()) == "first second"
    assert quote(10**5000) == f"<an integer of more than {QUOTE_LIMIT} digits>"


def test_problem_text_names_file_line_field_message_and_value():
    assert str(Problem("r.yaml", 7, "budget.total_tokens", "must be positive", -1, True)) == (
        "r.yaml:7: budget.total_tokens: must be positive (got -1)")
    assert str(Problem("r.yaml", None, "", "not a mapping")) == "r.yaml: not a mapping"
    assert str(Problem("r.yaml", 0, "name", "bad", None, True)) == "r.yaml: name: bad (got None)"
    long = Problem("r.yaml", 3, "f" * 200, "m" * 1000, "v" * 100, True)
    text = str(long)
    assert text == (f"r.yaml:3: {'f' * 120}... (200 characters): {'m' * 400}... (1,000 characters) "
                    f"(got {repr('v' * 80)}... (100 characters))")
    assert "\n" not in str(Problem("r.yaml", 2, "a\nb", "c\nd", "e\nf", True))


def test_problem_as_json():
    assert Problem("r.yaml", 7, "compute.spot", "must be a boolean", "yes", True).to_dict() == {
        "file": "r.yaml", "line": 7, "field": "compute.spot", "message": "must be a boolean", "value": "'yes'"}
    assert Problem("r.yaml", None, "", "empty").to_dict() == {
        "file": "r.yaml", "line": None, "field": "", "message": "empty", "value": None}
    cut = Problem("r.yaml", 1, "f" * 121, "m" * 401, "v" * 81, True).to_dict()
    assert cut["field"] == "f" * 120 + "... (121 characters)"
    assert cut["message"] == "m" * 400 + "... (401 characters)"
    assert cut["value"] == repr("v" * 80) + "... (81 characters)"


def test_recipe_error_is_one_line_per_problem():
    one = RecipeError([Problem("r.yaml", 2, "name", "bad")])
    assert str(one) == "r.yaml:2: name: bad" and one.args == ("r.yaml:2: name: bad",)
    two = RecipeError([Problem("r.yaml", 2, "name", "bad"), Problem("r.yaml", 5, "data.uri", "missing")])
    assert str(two) == "2 problems in r.yaml\n  r.yaml:2: name: bad\n  r.yaml:5: data.uri: missing"
    assert two.args == (str(two),)
    assert str(RecipeError([])) == "invalid recipe"


def test_plan_error_lists_each_finding_with_its_fix(tmp_path):
    path = write_yaml(tmp_path / "big.yaml", recipe_dict(**{"model.catalog": "qwen2.5-32b"}))
    plan = plan_file(path)
    assert not plan.ok
    with pytest.raises(PlanError) as raised:
        plan.require_ok()
    lines = str(raised.value).splitlines()
    assert lines[0] == f"unit-test: {len(plan.errors)} error(s)"
    assert len(lines) == 1 + len(plan.errors)
    needs = next(line for line in lines if "needs-multiple-nodes" in line)
    assert needs.startswith(f"  error: {path}:") and needs.endswith(" [needs-multiple-nodes]")
    assert f"{path}:{plan.locations['compute.instance_count']}: compute.instance_count: " in needs
    assert "Fix: set compute.instance_count to" in needs
    assert raised.value.plan is plan and raised.value.args == (str(raised.value),)
