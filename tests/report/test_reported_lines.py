"""Exact reported lines: each error names the line a person must edit, and is one line of text."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tiered_training.cli.app import app
from tiered_training.recipe.errors import RecipeError
from tiered_training.recipe.loader import load_recipe, parse_recipe

HEAD = """\
name: unit-test
model:
  catalog: llama-3.2-1b
data:
  uri: s3://bucket-for-tests/tokens/
sequence_length: 4096
"""
BUDGET = """\
budget:
  total_tokens: 10000000000
  global_batch_tokens: 1048576
"""
COMPUTE = """\
compute:
  instance_type: ml.p6-b200.48xlarge
"""


def problems(text: str) -> list[tuple[int | None, str]]:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "r.yaml")
    return [(p.line, p.field) for p in info.value.problems]


def error_text(text: str) -> str:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "r.yaml")
    return str(info.value)


def line_of(text: str, fragment: str) -> int:
    (number,) = [i for i, line in enumerate(text.splitlines(), 1) if fragment in line]
    return number


def test_the_base_text_is_valid():
    recipe, lines = parse_recipe(HEAD + BUDGET + COMPUTE, "r.yaml")
    assert recipe.compute.instance_count == 1
    assert lines["budget"] == 7 and lines["budget.global_batch_tokens"] == 9 and lines["compute.instance_type"] == 11


@pytest.mark.parametrize("broken", [
    "  name: a: b\n",  # a second ': ' on one line
    " dims: 3\n",  # indented less than its siblings
])
def test_yaml_syntax_error_at_its_line(broken):
    # Line 4, under model: (after "  catalog: llama-3.2-1b").
    text = HEAD.replace("  catalog: llama-3.2-1b\n", "  catalog: llama-3.2-1b\n" + broken) + BUDGET + COMPUTE
    assert line_of(text, broken.strip()) == 4
    assert problems(text) == [(4, "")]
    message = error_text(text)
    assert message.startswith("r.yaml:4: YAML syntax: ") and "\n" not in message


def test_a_missing_field_is_reported_at_its_section():
    text = HEAD + "budget:\n  total_tokens: 10000000000\n" + COMPUTE
    assert problems(text) == [(line_of(text, "budget:"), "budget.global_batch_tokens")]
    assert error_text(text) == "r.yaml:7: budget.global_batch_tokens: required field is missing"


def test_a_missing_section_is_reported_at_the_top_of_the_file():
    text = HEAD + BUDGET
    assert problems(text) == [(1, "compute")]


def test_a_bad_list_item_is_reported_at_the_item():
    text = HEAD.replace("data:\n  uri: s3://bucket-for-tests/tokens/\n", (
        "data:\n  uri: s3://bucket-for-tests/tokens/\n  allowed_uris:\n"
        "    - s3://bucket-for-tests/tokens/\n    - not-a-uri\n    - s3://bucket-for-tests/other/\n"
    )) + BUDGET + COMPUTE
    assert problems(text) == [(line_of(text, "- not-a-uri"), "data.allowed_uris.1")]


def test_a_field_is_reported_at_its_key_when_the_value_is_on_the_next_line():
    text = HEAD + BUDGET + "compute:\n  instance_type:\n    ml.p6-b200.48xlarge\n  instance_count:\n    0\n"
    assert problems(text) == [(line_of(text, "instance_count:"), "compute.instance_count")]


@pytest.mark.parametrize("section, field, value, valid", [
    ("compute", "instance_count", "0", "greater than or equal to 1"),
    ("optimizer", "warmup_tokens", "-1", "greater than or equal to 0"),
])
def test_out_of_range_values_are_one_line_errors(tmp_path, section, field, value, valid):
    extra = f"  instance_count: {value}\n" if section == "compute" else f"optimizer:\n  {field}: {value}\n"
    text = HEAD + BUDGET + COMPUTE + extra
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    line = line_of(text, f"{field}: {value}")
    assert str(info.value) == f"{path}:{line}: {section}.{field}: input should be {valid} (got {value})"
    # The CLI: a one-line message naming file, line and field, exit code 2 (bad local input), no traceback.
    result = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "1000"})
    assert result.exit_code == 2, result.output
    assert f"{path}:{line}: {section}.{field}" in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, IndexError)


def test_the_planner_refuses_zero_nodes_from_a_recipe_built_in_code():
    from tiered_training.planning.planner import resolve

    recipe, _ = parse_recipe(HEAD + BUDGET + COMPUTE, "r.yaml")
    zero = recipe.model_copy(update={"compute": recipe.compute.model_copy(update={"instance_count": 0})})
    plan = resolve(zero)
    assert not plan.ok
    assert [(f.code, f.field) for f in plan.findings if f.severity == "error"] == [("no-nodes", "compute.instance_count")]
