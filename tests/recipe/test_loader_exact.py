"""The loader's messages, whole: the line, the field, what would be valid and the value got,
for the kinds of mistake whose wording comes from the loader rather than from pydantic."""

from __future__ import annotations

import pytest
import yaml
from support import recipe_dict

from tiered_training.recipe.errors import RecipeError
from tiered_training.recipe.loader import parse_recipe


def error_of(text: str) -> str:
    """The report as printed; each problem also as ``--format json`` gives it."""
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "r.yaml")
    for problem in info.value.problems:
        shown = problem.to_dict()
        assert isinstance(shown["file"], str) and isinstance(shown["field"], str) and isinstance(shown["message"], str)
    return str(info.value)


def dumped(**overrides) -> str:
    return yaml.safe_dump(recipe_dict(**overrides), sort_keys=False)


@pytest.mark.parametrize("overrides,expected", [
    # A choice among fixed values lists them.
    ({"data.token_dtype": "uint8"}, "r.yaml:6: data.token_dtype: must be one of 'uint16', 'uint32' (got 'uint8')"),
    # A rule across fields says what is wrong without pydantic's "Value error, " prefix.
    ({"model.catalog": None, "model.dimensions": {"layers": 2, "hidden_size": 100, "attention_heads": 3, "kv_heads": 1,
                                                  "ffn_size": 256, "vocab_size": 1000}},
     "r.yaml:4: model.dimensions: hidden_size 100 is not a multiple of attention_heads 3"),
    # A whole number written as a float is that integer (as in JSON Schema); the value is shown as written.
    ({"budget.total_tokens": 1.0e30},
     "r.yaml:8: budget.total_tokens: input should be less than or equal to 1_000_000_000_000_000 (got 1.0e+30)"),
    ({"budget.total_tokens": 2500000.5}, "r.yaml:8: budget.total_tokens: input should be a valid integer (got 2500000.5)"),
    ({"budget.total_tokens": True}, "r.yaml:8: budget.total_tokens: input should be a valid integer, not a boolean (got True)"),
])
def test_whole_messages(overrides, expected):
    assert error_of(dumped(**overrides)) == expected


def test_a_duplicate_key_names_its_second_line():
    text = dumped() + "checkpointing:\n  keep_last: 2\n  keep_last: 3\n"
    assert error_of(text) == "r.yaml:15: checkpointing.keep_last: duplicate key; keep one"


@pytest.mark.parametrize("text,expected", [
    ("- a\n- b\n", "r.yaml:1: a recipe is a YAML mapping of fields (name, model, data, ...)"),
    ("name: a\nb: \x07\n", "r.yaml:2: b: YAML: character U+0007 (a control character) at column 4 is not allowed in YAML text; remove it"),
    ("name: !!int x\n", "r.yaml:1: name: YAML tag !!int: 'x' cannot be read as a YAML 1.2 integer; remove the tag"),
])
def test_documents_that_are_not_recipes(text, expected):
    assert error_of(text) == expected


def test_a_recipe_without_a_file_name():
    with pytest.raises(RecipeError) as info:
        parse_recipe("- a\n")
    assert str(info.value) == "<recipe>:1: a recipe is a YAML mapping of fields (name, model, data, ...)"


def test_the_size_bound_is_inclusive():
    from tiered_training.recipe.loader import MAX_BYTES

    assert error_of("#" * (MAX_BYTES + 1)) == f"r.yaml: {MAX_BYTES + 1:,} characters; a recipe is at most {MAX_BYTES:,}"
    # At the bound the text is read: an empty document is not a mapping.
    assert error_of("#" * MAX_BYTES) == "r.yaml:1: a recipe is a YAML mapping of fields (name, model, data, ...)"


def test_problems_are_listed_in_line_order():
    text = dumped(**{"sequence_length": 1, "compute.instance_count": 0})
    assert error_of(text) == (
        "2 problems in r.yaml\n"
        "  r.yaml:6: sequence_length: input should be greater than or equal to 128 (got 1)\n"
        "  r.yaml:12: compute.instance_count: input should be greater than or equal to 1 (got 0)")


def test_an_unprintable_file_name_stays_on_one_line():
    from tiered_training.recipe.errors import Problem

    problem = Problem("runs/a\nb\t\x1b.yaml", 3, "name", "required field is missing")
    assert str(problem) == "runs/a\\nb\\t\\x1b.yaml:3: name: required field is missing"
    assert str(Problem("plain é.yaml", None, "", "m")) == "plain é.yaml: m"
    # Only the unprintable characters are escaped: a backslash or a quote in the name stays as it is.
    assert str(Problem("dir\\it's\n.yaml", 1, "", "m")) == "dir\\it's\\n.yaml:1: m"
