"""The recipe's JSON Schema: the command prints it, the committed copies are current, the templates name it."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml
from support import RECIPES, ROOT, recipe_dict
from typer.testing import CliRunner

from tiered_training.cli.app import app
from tiered_training.recipe import schema
from tiered_training.recipe.yaml12 import Loader


def test_the_committed_schema_and_field_reference_are_current():
    for path, text in schema.outputs(ROOT).items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run python -m tiered_training.recipe.schema --write"


def test_the_schema_command_prints_the_committed_schema():
    result = CliRunner().invoke(app, ["schema"], prog_name="tiered-training")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json.loads((ROOT / schema.SCHEMA_FILE).read_text())


def test_the_field_reference_lists_every_field():
    from tiered_training.recipe import Recipe

    text = (ROOT / schema.REFERENCE_FILE).read_text()
    for name in Recipe.model_fields:
        assert f"| `{name}` |" in text
    assert "| `max_runtime_hours` | number (>= 0.0166667, <= 672) or null | `null` | the longest one training job" in text


@pytest.mark.parametrize("template", RECIPES, ids=lambda p: p.name)
def test_every_template_names_the_schema_and_satisfies_it(template):
    text = template.read_text()
    assert text.splitlines()[0] == schema.HEADER
    assert (template.parent / schema.HEADER.split("$schema=")[1]).resolve() == (ROOT / schema.SCHEMA_FILE).resolve()
    jsonschema.validate(yaml.load(text, Loader=Loader), schema.recipe_schema())


@pytest.mark.parametrize("field,value", [("compute.instance_count", True), ("compute.max_runtime_hours", "1:30"), ("nаme", "x")])
def test_an_editor_flags_what_the_loader_refuses(field, value):
    data = recipe_dict(**{field: value})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema.recipe_schema())
