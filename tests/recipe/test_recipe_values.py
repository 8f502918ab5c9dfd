"""Recipe values that other parts read: data prefixes a run may use, and an account's quotas."""

from __future__ import annotations

import pytest
from support import recipe_dict

from tiered_training import catalog as catalogs
from tiered_training.recipe import Recipe


def data_section(**fields):
    return Recipe.model_validate(recipe_dict(**{f"data.{k}": v for k, v in fields.items()})).data


@pytest.mark.parametrize("prefix", ["s3://bucket-for-tests/tokens", "s3://bucket-for-tests/tokens/"])
def test_a_uri_is_allowed_under_whole_path_segments(prefix):
    data = data_section(uri=prefix, allowed_uris=[prefix])
    assert data.data_prefixes == [prefix]
    assert data.allows(prefix)  # the prefix itself
    assert data.allows("s3://bucket-for-tests/tokens/2024/")
    assert not data.allows("s3://bucket-for-tests/tokens-other/")
    assert not data.allows("s3://bucket-for-tests/token")


def test_without_allowed_uris_the_recipes_uri_is_the_prefix():
    data = data_section()
    assert data.data_prefixes == ["s3://bucket-for-tests/tokens/"]
    assert data.allows("s3://bucket-for-tests/tokens/") and not data.allows("s3://bucket-for-tests/other/")


def test_quota_is_the_accounts_value_or_aws_default():
    name = "training-job-max-runtime"
    default = catalogs.quotas()[name].default
    plain = Recipe.model_validate(recipe_dict()).compute
    assert plain.quota(name) == default
    applied = Recipe.model_validate(recipe_dict(**{"compute.quotas": {name: default * 2}})).compute
    assert applied.quota(name) == default * 2
