"""An unknown name gets the closest valid ones, not a list of every name there is."""

from __future__ import annotations

import pytest
import yaml
from support import recipe_dict

from tiered_training.catalog import quotas
from tiered_training.recipe import Recipe
from tiered_training.recipe.errors import RecipeError
from tiered_training.recipe.keys import LIST_LIMIT, suggest
from tiered_training.recipe.loader import parse_recipe


def message_of(data: dict) -> str:
    with pytest.raises(RecipeError) as info:
        parse_recipe(yaml.safe_dump(data, sort_keys=False), "r.yaml")
    [problem] = info.value.problems
    return problem.message


def test_an_unknown_top_level_field_gets_the_closest_not_all_seventeen():
    assert len(Recipe.model_fields) > LIST_LIMIT
    assert message_of(recipe_dict(trackng={"tensorboard": True})) == "unknown field; did you mean 'tracking'?"
    assert (
        message_of(recipe_dict(zzz=1))
        == f"unknown field; none of the {len(Recipe.model_fields)} fields here is close (docs/recipe.md lists them)"
    )


def test_an_unknown_quota_names_the_closest_or_where_the_quotas_are_listed():
    assert len(quotas()) > LIST_LIMIT
    near = message_of(recipe_dict(**{"compute.quotas": {"training-instance": 4}}))
    assert near == "unknown quota 'training-instance'; did you mean 'training-instances'?"
    far = message_of(recipe_dict(**{"compute.quotas": {"zzz": 4}}))
    assert far == (
        f"unknown quota 'zzz'; none of the {len(quotas())} quotas is close (tiered_training/catalog/quotas.yaml lists them)"
    )


def test_a_loose_match_among_many_gives_the_closest_few():
    names = [f"{word}-{n}" for word in ("alpha", "beta", "gamma") for n in range(5)]
    assert (
        suggest("ga", names, "names", "the list")
        == "closest: gamma-4, gamma-3, gamma-2 (of 15 names; the list lists them)"
    )


def test_a_few_names_are_all_listed():
    assert suggest("zzz", ["a", "b"], "names", "the list") == "valid names: a, b"
    assert suggest("aa", ["a", "aa1"], "names", "the list") == "did you mean 'aa1'? valid names: a, aa1"


@pytest.mark.parametrize(
    "override,field",
    [("nope.x=1", "nope"), ("compute.zzz.y=2", "compute.zzz"), ("tuning.zzz=1", "")],
)
def test_an_unknown_key_that_an_override_brings_is_named_by_the_override(override, field):
    with pytest.raises(RecipeError) as info:
        parse_recipe(yaml.safe_dump(recipe_dict(), sort_keys=False), "r.yaml", [override])
    [problem] = info.value.problems
    assert (problem.file, problem.line, problem.field) == (f"--set {override}", None, field)
    assert problem.message.startswith("unknown field; ")


def test_an_unknown_section_in_the_file_stays_the_files():
    text = yaml.safe_dump(recipe_dict(nope={"y": 1}), sort_keys=False)
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "r.yaml", ["nope.x=1"])
    [problem] = info.value.problems
    assert (problem.file, problem.field) == ("r.yaml", "nope") and problem.line
