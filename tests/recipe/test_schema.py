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


def _grouped_forms(number: int) -> set[str]:
    """``number`` grouped by thousands, with up to 9 leading zeros."""
    forms = set()
    for zeros in range(10):
        digits = "0" * zeros + str(number)
        if len(digits) >= 4:
            first = len(digits) % 3 or 3
            forms.add("_".join([digits[:first]] + [digits[i:i + 3] for i in range(first, len(digits), 3)]))
    return forms


@pytest.mark.parametrize("low,high", [(1, 512), (1_000_000, 10**15), (0, 1), (1, 1), (10, 600), (256, 1_048_576),
                                      (0, 4_294_967_295), (1, None), (0, None), (1_500, None)])
def test_a_grouped_numbers_pattern_takes_the_integers_within_the_bounds_and_no_other(low, high):
    import random
    import re

    from tiered_training.recipe.grouped import grouped_pattern

    pattern = re.compile(grouped_pattern(low, high))
    edges = {low - 1, low, low + 1} | ({high - 1, high, high + 1} if high is not None else {10**18})
    rng = random.Random(low)
    numbers = {n for n in edges | {0, 999, 1000, 10**6, 10**15 + 1} if n >= 0}
    numbers |= {rng.randrange(10 ** rng.randrange(1, 19)) for _ in range(200)}
    for number in numbers:
        within = low <= number and (high is None or number <= high)
        for form in _grouped_forms(number):
            assert bool(pattern.match(form)) is within, (form, low, high)
    for text in ("1_0", "1000_000", "_100", "1__000", "+1_000", "1_000.5", "1_00"):
        assert not pattern.match(text)
