"""The largest model that LoRA and QLoRA fit on one node of each instance type."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiered_training.catalog import instances, models
from tiered_training.planning import capacity

DOC = Path(__file__).resolve().parents[2] / "docs" / "memory.md"


@pytest.mark.parametrize("name", list(instances()))
def test_qlora_fits_more_parameters_than_lora_on_every_instance_type_and_each_figure_fits(name):
    instance = instances()[name]
    lora, qlora = (capacity.largest(instance, adapter) for adapter in capacity.ADAPTERS)
    assert qlora.parameters > lora.parameters > 0
    assert qlora.model_parameters >= lora.model_parameters
    for found in (lora, qlora):
        adapters = capacity.adapters(found.adapter)
        shape = models()[found.shape].architecture
        assert capacity.fits(shape.model_copy(update={"layers": found.layers}), instance, adapters, 4096)
        assert not capacity.fits(shape.model_copy(update={"layers": found.layers + 1}), instance, adapters, 4096)
        if found.model is not None:
            assert capacity.fits(models()[found.model].architecture, instance, adapters, 4096)
        bigger = [m for m, e in models().items() if e.architecture.parameters > found.model_parameters]
        assert not any(capacity.fits(models()[m].architecture, instance, adapters, 4096) for m in bigger)


def test_the_table_in_docs_memory_is_the_planners_output():
    text = DOC.read_text()
    start = text.index("<!-- capacity table: planning/capacity.py table() -->\n")
    end = text.index("<!-- end capacity table -->")
    assert text[start:end].splitlines()[1:] == capacity.table()


def test_explain_shows_the_largest_model_for_an_adapter_recipe_only():
    import yaml
    from support import recipe_dict

    from tiered_training.planning.planner import resolve
    from tiered_training.recipe.loader import parse_recipe
    from tiered_training.report import explain_lines

    def explain(data):
        recipe, lines = parse_recipe(yaml.safe_dump(data, sort_keys=False), "r.yaml")
        return explain_lines(resolve(recipe, source="r.yaml", lines=lines))

    sft = {
        "task": "sft",
        "model.catalog": "llama-3.1-8b",
        "model.init_checkpoint": "s3://bucket-for-tests/m/",
        "data.uri": "s3://bucket-for-tests/sft/",
        "tuning.adapter": "lora",
        "budget.total_tokens": 100_000_000,
        "budget.global_batch_tokens": 4096 * 64,
    }
    lines = explain(recipe_dict(**sft))
    start = next(i for i, line in enumerate(lines) if line.startswith("Largest model on one node"))
    p4d = next(line for line in lines[start:] if line.strip().startswith("ml.p4d.24xlarge"))
    lora, qlora = (capacity.largest(instances()["ml.p4d.24xlarge"], a) for a in capacity.ADAPTERS)
    assert f"lora {lora.model}, {lora.parameters / 1e9:,.0f}B" in p4d and f"qlora {qlora.model}" in p4d
    assert not any(
        line.startswith("Largest model") for line in explain(recipe_dict(**{"model.catalog": "llama-3.1-8b"}))
    )
