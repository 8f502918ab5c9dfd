"""What the loader says about a bad value: the field, its line, the value and what would be valid."""

from __future__ import annotations

import pytest
import yaml
from support import recipe_dict

from tiered_training.recipe.errors import RecipeError
from tiered_training.recipe.loader import parse_recipe

MISSING = object()


def problems(data) -> list[tuple]:
    with pytest.raises(RecipeError) as info:
        parse_recipe(yaml.safe_dump(data, sort_keys=False), "r.yaml")
    return [(p.line, p.field, p.message, p.value if p.has_value else MISSING) for p in info.value.problems]


# Validation is strict: text is never parsed as a number or a boolean, so the message is pydantic's
# strict one (no "unable to parse string").
@pytest.mark.parametrize("overrides, expected", [
    ({"tuning.precision": "fp4"}, [(14, "tuning.precision", "must be one of 'bf16', 'fp8', 'fp32', 'auto'", "fp4")]),
    ({"tuning.micro_batch_size": "big"}, [(14, "tuning.micro_batch_size",
      "must be one of 'auto'; or input should be a valid integer", "big")]),
    ({"tuning.micro_batch_size": 0}, [(14, "tuning.micro_batch_size",
      "must be one of 'auto'; or input should be greater than or equal to 1", 0)]),
    ({"tuning.batch_ramp": "yes please"}, [(14, "tuning.batch_ramp",
      "must be one of 'auto'; or input should be a valid boolean; "
      "or input should be a valid dictionary or instance of BatchRampSpec", "yes please")]),
    ({"monitoring.loss_ceiling": "high"}, [(14, "monitoring.loss_ceiling",
      "must be one of 'auto'; or input should be a valid number", "high")]),
    # Cross-field rules name the field they are about, at its own line.
    ({"data.allowed_uris": ["s3://other-bucket/x/"]}, [(5, "data.uri",
      "not under any of data.allowed_uris (s3://other-bucket/x/)", "s3://bucket-for-tests/tokens/")]),
    ({"budget.global_batch_tokens": 4096 * 256 + 1024}, [(9, "budget.global_batch_tokens",
      "1049600 is not a multiple of sequence_length 4096", 1049600)]),
    ({"compute": ["x"]}, [(10, "compute", "input should be a valid dictionary or instance of ComputeSection", MISSING)]),
    ({"model": {"catalog": "llama-3.2-1b", "dimensions": {"layers": 2, "hidden_size": 64}}},
     [(4, f"model.dimensions.{name}", "required field is missing", MISSING)
      for name in ("attention_heads", "ffn_size", "kv_heads", "vocab_size")]),
])
def test_a_bad_value_is_reported_with_what_would_be_valid(overrides, expected):
    assert problems(recipe_dict(**overrides)) == expected


def test_a_bad_list_item_inside_a_section():
    data = recipe_dict(**{"data.allowed_uris": ["s3://bucket-for-tests/tokens/", 7]})
    assert problems(data) == [(8, "data.allowed_uris.1", "input should be a valid string", 7)]
