"""The loader's messages, whole: the line, the field, what would be valid and the value got,
for the kinds of mistake whose wording comes from the loader rather than from pydantic."""

from __future__ import annotations

import pytest
import yaml

from support import recipe_dict
from tiered_training.errors import RecipeError
from tiered_training.loader import parse_recipe


def error_of(text: str) -> str:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "r.yaml")
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
    # A whole number written as a float: the digits to write instead, up to 1e30 (not included).
    ({"budget.total_tokens": 2.0e9},
     "r.yaml:8: budget.total_tokens: input should be a valid integer: write 2_000_000_000 (digits may be grouped with _) (got 2000000000.0)"),
    ({"budget.total_tokens": 1.0e30}, "r.yaml:8: budget.total_tokens: input should be a valid integer (got 1e+30)"),
    ({"budget.total_tokens": True}, "r.yaml:8: budget.total_tokens: input should be a valid integer, not a boolean (got True)"),
])
def test_whole_messages(overrides, expected):
    assert error_of(dumped(**overrides)) == expected


def test_a_duplicate_key_names_its_second_line():
    text = dumped() + "checkpointing:\n  keep_last: 2\n  keep_last: 3\n"
    assert error_of(text) == "r.yaml:15: checkpointing.keep_last: duplicate key; keep one"
