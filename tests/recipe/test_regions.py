"""Region names checked offline against botocore's endpoint data, in validate, instances and preflight;
the pattern alone, said so, where botocore is not installed; the base image's registry per region."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from support import offline_aws_env, recipe_dict, run_cli, write_yaml

from tiered_training.recipe import regions


@pytest.fixture
def no_botocore(monkeypatch):
    """As with the base install: importing botocore fails."""
    regions.known_regions.cache_clear()
    monkeypatch.setitem(sys.modules, "botocore", None)
    monkeypatch.setitem(sys.modules, "botocore.session", None)
    yield
    regions.known_regions.cache_clear()


def test_validate_refuses_a_region_botocore_does_not_know_with_file_line_and_field(tmp_path):
    path = write_yaml(tmp_path / "moon.yaml", recipe_dict(**{"compute.region": "us-moon-1"}))
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "us-moon-1" in text)
    result = run_cli("validate", path)
    assert result.returncode == 2
    assert f"{path}:{line}: compute.region: 'us-moon-1': not a region where SageMaker runs" in result.stderr
    assert "us-east-1" in result.stderr and "Traceback" not in result.stderr
    near = run_cli("validate", write_yaml(tmp_path / "near.yaml", recipe_dict(**{"compute.region": "eu-west-9"})))
    assert near.returncode == 2 and "did you mean 'eu-west-3'?" in near.stderr
    known = run_cli("validate", write_yaml(tmp_path / "ok.yaml", recipe_dict(**{"compute.region": "ap-east-2"})))
    assert known.returncode == 0, known.stderr
    assert "checked against their pattern only" not in known.stderr


def test_instances_refuses_an_unknown_region_instead_of_printing_a_table():
    result = run_cli("instances", "--region", "eu-moon-1")
    assert result.returncode == 2
    assert "'eu-moon-1': not a region where SageMaker runs; did you mean 'eu-south-1'?" in result.stderr
    assert "ml.p5.48xlarge" not in result.stdout


def test_preflight_refuses_an_unknown_region_before_any_call(tmp_path, monkeypatch):
    offline_aws_env(monkeypatch, tmp_path, "us-east-1")
    path = write_yaml(tmp_path / "recipe.yaml", recipe_dict())
    result = run_cli("preflight", path, "--region", "eu-moon-1", "--endpoint-url", "http://127.0.0.1:9")
    assert result.returncode == 2
    assert "--region 'eu-moon-1': not a region where SageMaker runs; did you mean 'eu-south-1'?" in result.stderr


def test_without_botocore_the_pattern_alone_is_checked_and_validate_says_so(tmp_path, no_botocore):
    assert regions.known_regions() is None
    assert regions.region_problem("us-moon-1") is None
    assert "not an AWS region name" in regions.region_problem("us_east_1")
    result = run_cli("validate", write_yaml(tmp_path / "moon.yaml", recipe_dict(**{"compute.region": "us-moon-1"})))
    assert result.returncode == 0, result.stderr
    assert "note: region names are checked against their pattern only: botocore" in result.stderr
    assert "pip install 'tiered-training[aws]'" in result.stderr
    plain = run_cli("validate", write_yaml(tmp_path / "plain.yaml", recipe_dict()))
    assert plain.returncode == 0 and "pattern only" not in plain.stderr  # no region, nothing to say


def test_every_regions_registry_is_the_sdks_ap_east_2_included():
    """base_images.yaml against the SageMaker SDK's own table (sagemaker-core's image_uri_config)."""
    core = pytest.importorskip("sagemaker.core")
    from tiered_training.catalog.images import base_images, default_base_image, registry_account

    table = json.loads((Path(core.__file__).parent / "image_uri_config" / "pytorch-amzn2023.json").read_text())
    version = default_base_image().pytorch
    registries = table["training"]["versions"][version]["registries"]
    assert registry_account("ap-east-2") == registries["ap-east-2"] == "975050140332"
    for region in base_images():
        assert registry_account(region) == registries[region], region
    comment = Path(regions.__file__).parents[1].joinpath("catalog", "base_images.yaml").read_text()
    assert re.search(r"ap-east-2 \(Taipei\) its own account,\n#\s+975050140332", comment)


def test_preflight_refuses_an_unknown_region_from_the_environment(tmp_path, monkeypatch):
    offline_aws_env(monkeypatch, tmp_path, "eu-moon-1")
    path = write_yaml(tmp_path / "recipe.yaml", recipe_dict())
    result = run_cli("preflight", path, "--endpoint-url", "http://127.0.0.1:9")
    assert result.returncode == 2, result.stderr
    assert "'eu-moon-1': not a region where SageMaker runs; did you mean 'eu-south-1'?" in result.stderr
