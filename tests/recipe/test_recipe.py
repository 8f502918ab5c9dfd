"""The recipe language: one test per schema rule, and the shape of the error a user sees."""

from __future__ import annotations

import pytest
from support import RECIPES, recipe_dict

from tiered_training.recipe.errors import RecipeError
from tiered_training.recipe.loader import load_recipe, parse_recipe


def problems_of(write_recipe, data):
    path = write_recipe(data)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return info.value.problems


def only(problems, field):
    matching = [p for p in problems if p.field == field]
    assert matching, f"no problem for {field}: {[str(p) for p in problems]}"
    return matching[0]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_template_loads(path):
    assert load_recipe(path).name


def test_base_recipe_defaults_every_tuning_field_to_auto(write_recipe):
    recipe = load_recipe(write_recipe(recipe_dict()))
    tuning = recipe.tuning.model_dump()
    assert tuning.pop("lora") is None  # the LoRA settings' own defaults, when tuning.adapter resolves to lora
    assert all(v == "auto" for v in tuning.values())
    assert recipe.data.input_mode == "FastFile"
    assert recipe.task == "pretrain"


def test_unknown_key_is_an_error_with_suggestion_and_line(write_recipe):
    text = "name: unit-test\nmodel:\n  catalog: llama-3.2-1b\n  catalogue: x\n"
    problems = problems_of(write_recipe, text)
    p = only(problems, "model.catalogue")
    assert p.line == 4
    assert "did you mean 'catalog'" in p.message


def test_pipeline_name_pattern(write_recipe):
    p = only(problems_of(write_recipe, recipe_dict(name="my_recipe")), "name")
    assert p.message == "must be letters, digits and hyphens, starting and ending with a letter or digit, such as my-8b"
    assert p.value == "my_recipe"


@pytest.mark.parametrize("length", [127, 131073])
def test_sequence_length_bounds(write_recipe, length):
    p = only(problems_of(write_recipe, recipe_dict(sequence_length=length)), "sequence_length")
    assert p.value == length


def test_data_uri_must_be_s3(write_recipe):
    only(problems_of(write_recipe, recipe_dict(**{"data.uri": "/local/tokens"})), "data.uri")



def test_allowed_uris_default_to_the_data_uri(write_recipe):
    data = load_recipe(write_recipe(recipe_dict(**{"data.uri": "s3://bucket-a/tokens/v2/"}))).data
    assert data.data_prefixes == ["s3://bucket-a/tokens/v2/"]
    assert data.allows("s3://bucket-a/tokens/v2/shard-0")
    assert not data.allows("s3://bucket-a/tokens/v3/")


def test_allowed_uris_bound_data_uri_by_whole_segments(write_recipe):
    recipe = recipe_dict(**{"data.uri": "s3://bucket-a/tokens/v2/", "data.allowed_uris": ["s3://bucket-a/tokens", "s3://bucket-b/x/"]})
    data = load_recipe(write_recipe(recipe)).data
    assert data.allows("s3://bucket-a/tokens/v3/") and data.allows("s3://bucket-b/x/y")
    assert not data.allows("s3://bucket-a/tokens-other/") and not data.allows("s3://bucket-c/")


def test_data_uri_outside_allowed_uris_is_an_error(write_recipe):
    recipe = recipe_dict(**{"data.uri": "s3://bucket-a/tokens/", "data.allowed_uris": ["s3://bucket-b/"]})
    p = only(problems_of(write_recipe, recipe), "data.uri")
    assert "allowed_uris" in p.message and p.line == 5  # the data.uri line (name, model, catalog, data, uri)


def test_data_kms_key_arn_names_a_key(write_recipe):
    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    assert load_recipe(write_recipe(recipe_dict(**{"data.kms_key_arn": key}))).data.kms_key_arn == key
    # An alias cannot be granted in IAM: the key's own ARN is needed.
    only(problems_of(write_recipe, recipe_dict(**{"data.kms_key_arn": "arn:aws:kms:us-east-1:123456789012:alias/data"})), "data.kms_key_arn")

def test_token_dtype_choices(write_recipe):
    p = only(problems_of(write_recipe, recipe_dict(**{"data.token_dtype": "int16"})), "data.token_dtype")
    assert "'uint16'" in p.message and "'uint32'" in p.message


def test_input_mode_choices(write_recipe):
    only(problems_of(write_recipe, recipe_dict(**{"data.input_mode": "Pipe"})), "data.input_mode")


def test_model_needs_exactly_one_source(write_recipe):
    dims = {"layers": 2, "hidden_size": 256, "attention_heads": 4, "kv_heads": 2, "ffn_size": 512, "vocab_size": 1000}
    p = only(problems_of(write_recipe, recipe_dict(**{"model.dimensions": dims})), "model")
    assert "exactly one" in p.message


def test_dimensions_heads_must_divide(write_recipe):
    dims = {"layers": 2, "hidden_size": 250, "attention_heads": 4, "kv_heads": 2, "ffn_size": 512, "vocab_size": 1000}
    data = recipe_dict()
    data["model"] = {"dimensions": dims}
    p = only(problems_of(write_recipe, data), "model.dimensions")
    assert "multiple of attention_heads" in p.message


def test_tuning_precision_choices_include_auto(write_recipe):
    p = only(problems_of(write_recipe, recipe_dict(**{"tuning.precision": "fp16"})), "tuning.precision")
    assert "'bf16'" in p.message and "'auto'" in p.message and p.value == "fp16"


def test_tuning_micro_batch_must_be_positive(write_recipe):
    only(problems_of(write_recipe, recipe_dict(**{"tuning.micro_batch_size": 0})), "tuning.micro_batch_size")


def test_global_batch_multiple_of_sequence(write_recipe):
    p = only(problems_of(write_recipe, recipe_dict(**{"budget.global_batch_tokens": 4096 * 10 + 1})), "budget.global_batch_tokens")
    assert "multiple of sequence_length" in p.message


def test_budget_smaller_than_one_batch(write_recipe):
    only(problems_of(write_recipe, recipe_dict(**{"budget.total_tokens": 1_000_000, "budget.global_batch_tokens": 4096 * 512})), "budget.total_tokens")


def test_spot_wait_must_be_positive(write_recipe):
    only(problems_of(write_recipe, recipe_dict(**{"compute.max_wait_hours": -1})), "compute.max_wait_hours")


def test_alarm_email_format(write_recipe):
    only(problems_of(write_recipe, recipe_dict(**{"monitoring.alarm_email": "not-an-email"})), "monitoring.alarm_email")


def test_training_plan_arn_format(write_recipe):
    only(problems_of(write_recipe, recipe_dict(**{"compute.training_plan_arn": "arn:aws:iam::1:role/x"})), "compute.training_plan_arn")


def test_tag_keys_reject_aws_prefix(write_recipe):
    only(problems_of(write_recipe, recipe_dict(tags={"aws:owner": "me"})), "tags")


def test_missing_required_fields_are_all_reported(write_recipe):
    problems = problems_of(write_recipe, {"name": "x"})
    assert {p.field for p in problems} >= {"model", "data", "sequence_length", "budget", "compute"}
    assert all("required" in p.message for p in problems)


def test_every_problem_is_reported_at_once(write_recipe):
    data = recipe_dict(name="bad name", sequence_length=5, **{"tuning.precision": "fp4"})
    problems = problems_of(write_recipe, data)
    assert {"name", "sequence_length", "tuning.precision"} <= {p.field for p in problems}


def test_duplicate_key_is_an_error():
    text = "name: a\nname: b\n"
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "dup.yaml")
    p = only(info.value.problems, "name")
    assert p.line == 2 and "duplicate" in p.message


def test_yaml_syntax_error_names_the_line():
    with pytest.raises(RecipeError) as info:
        parse_recipe("name: a\nmodel:\n  catalog: x\n  name: a: b\nsequence_length: 4096\n", "broken.yaml")
    assert [p.line for p in info.value.problems] == [4]
    assert str(info.value).startswith("broken.yaml:4: YAML syntax: ")


def test_not_a_mapping():
    with pytest.raises(RecipeError, match="mapping"):
        parse_recipe("- a\n- b\n", "list.yaml")


def test_missing_file_is_a_recipe_error(tmp_path):
    with pytest.raises(RecipeError, match="cannot read"):
        load_recipe(tmp_path / "nope.yaml")


def test_error_text_names_file_line_field_value_and_valid_values(write_recipe):
    path = write_recipe(recipe_dict(**{"tuning.activation_checkpointing": "some"}))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    text = str(info.value)
    assert str(path) in text
    assert "tuning.activation_checkpointing" in text
    assert "'some'" in text
    assert "'selective'" in text
    line = info.value.problems[0].line
    assert path.read_text().splitlines()[line - 1].strip().startswith("activation_checkpointing")


def test_error_inside_a_union_branch_points_at_the_nested_field(write_recipe):
    problems = problems_of(write_recipe, recipe_dict(**{"tuning.batch_ramp": {"start_fraction": 2}}))
    assert [p.field for p in problems] == ["tuning.batch_ramp.start_fraction"]
    assert problems[0].value == 2 and "less than or equal to 1" in problems[0].message
