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
      "must be 'auto' or an integer", "big")]),
    ({"tuning.micro_batch_size": 0}, [(14, "tuning.micro_batch_size",
      "must be 'auto' or greater than or equal to 1", 0)]),
    ({"tuning.batch_ramp": "yes please"}, [(14, "tuning.batch_ramp",
      "must be 'auto', true, false or a mapping of batch_ramp fields, such as start_fraction: 0.25", "yes please")]),
    ({"monitoring.loss_ceiling": "high"}, [(14, "monitoring.loss_ceiling",
      "must be 'auto' or a number", "high")]),
    # Cross-field rules name the field they are about, at its own line.
    ({"data.allowed_uris": ["s3://other-bucket/x/"]}, [(5, "data.uri",
      "not under any of data.allowed_uris (s3://other-bucket/x/)", "s3://bucket-for-tests/tokens/")]),
    ({"budget.global_batch_tokens": 4096 * 256 + 1024}, [(9, "budget.global_batch_tokens",
      "1049600 is not a multiple of sequence_length 4096", 1049600)]),
    ({"compute": ["x"]}, [(10, "compute", "must be a mapping of compute fields, such as instance_type: ml.p5.48xlarge",
                           MISSING)]),
    ({"model": {"catalog": "llama-3.2-1b", "dimensions": {"layers": 2, "hidden_size": 64}}},
     [(4, f"model.dimensions.{name}", "required field is missing", MISSING)
      for name in ("attention_heads", "ffn_size", "kv_heads", "vocab_size")]),
])
def test_a_bad_value_is_reported_with_what_would_be_valid(overrides, expected):
    assert problems(recipe_dict(**overrides)) == expected


def test_a_bad_list_item_inside_a_section():
    data = recipe_dict(**{"data.allowed_uris": ["s3://bucket-for-tests/tokens/", 7]})
    assert problems(data) == [(8, "data.allowed_uris.1", "input should be a valid string", 7)]


SECTIONS = ["model", "data", "budget", "optimizer", "compute", "checkpointing", "monitoring", "validation", "tracking",
            "probe", "tuning", "export", "tuning.lora", "tuning.batch_ramp", "model.dimensions"]


@pytest.mark.parametrize("value", [["a", "b"], "text", 5], ids=["list", "text", "number"])
@pytest.mark.parametrize("section", SECTIONS)
def test_a_section_that_is_not_a_mapping_says_what_it_takes_in_words(section, value):
    """No class name (ComputeSection, BatchRampSpec): the section's fields, with an example line."""
    overrides = {section: value}
    if section == "tuning.lora":
        overrides.update({"task": "sft", "model.init_checkpoint": "s3://bucket-for-tests/base/"})
    if section == "model.dimensions":
        overrides["model.catalog"] = None
    [(_, field, message, _)] = problems(recipe_dict(**overrides))
    assert field == section
    leaf = section.rsplit(".", 1)[-1]
    assert f"a mapping of {leaf} fields, such as " in message, message
    assert "instance of" not in message and "Section" not in message and "Spec" not in message, message
    example = message.split("such as ", 1)[1]
    key, _, written = example.partition(": ")
    from tiered_training.recipe.loader import _model_at
    assert key in _model_at(tuple(section.split("."))).model_fields and written, message


@pytest.mark.parametrize("field,value,expected", [
    ("tags", ["a"], "must be a mapping of names to values (name: value lines), such as team: ml"),
    ("compute.quotas", 8, "must be a mapping of names to values (name: value lines)"),
    ("data.allowed_uris", "s3://bucket-for-tests/tokens/", "must be a list (lines starting with '- ', or [a, b])"),
])
def test_a_mapping_or_a_list_of_the_wrong_kind_says_so_in_words(field, value, expected):
    [(_, where, message, _)] = problems(recipe_dict(**{field: value}))
    assert (where, message) == (field, expected)


def test_a_large_integer_bound_is_written_as_a_recipe_may_write_it():
    [(_, field, message, value)] = problems(recipe_dict(**{"budget.total_tokens": 1000}))
    assert (field, message, value) == ("budget.total_tokens", "input should be greater than or equal to 1_000_000", 1000)
