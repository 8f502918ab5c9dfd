"""No configuration that really ran is refused: every calibration row's configuration, as the planner sees it.

The rows (``catalog/calibration.yaml`` and this container's GPU checks, ``bench/gpu``) are runs that
completed. The planner's memory model describes this container's layout (FSDP2, torchao float8,
transformers' Llama blocks), so every row of a framework with that layout must fit the physical HBM of its
machine; rows of frameworks whose memory the model does not describe (``memory_model: false``: Megatron with
Transformer Engine, llm-foundry's FSDP v1 MPT blocks) are not this container's runs and are left out.

Where a row ran on whole instances of the catalogue, the planner itself is run on the row's configuration,
pinned in a recipe: it must plan it, at worst with the ``tight`` warning.
"""

from __future__ import annotations

import pytest
from support import recipe_dict

from tiered_training import catalog as catalogs
from tiered_training.planning import calibration
from tiered_training.planning.planner import resolve
from tiered_training.recipe import Recipe

CAL = calibration.load()
FACTORS = {"grand_teton_power": 1.0, "megatron_te": 1.0}  # compute factors: no bearing on memory
OURS = [r for r in CAL.rows if CAL.frameworks.get(r.framework, {}).get("memory_model", True)]


def test_the_rows_cover_this_containers_layout():
    assert len(OURS) >= 30
    assert {r.framework for r in OURS} == {"torchtitan", "tiered-training"}


@pytest.mark.parametrize("row", OURS, ids=lambda r: r.id)
def test_every_row_fits_its_physical_hbm(row):
    _, usable = calibration.hardware(row, CAL, FACTORS)
    predicted = calibration.predict_memory(row, CAL, FACTORS)
    assert predicted.total <= usable * calibration.GIB, (
        f"{row.id}: {predicted.total / calibration.GIB:.1f} GiB predicted on {usable} GiB"
    )


def _on_instances(row: calibration.Row) -> bool:
    instance = catalogs.instances().get(row.hardware)
    return instance is not None and row.gpus % instance.gpus == 0


WHOLE = [r for r in OURS if _on_instances(r)]


def _recipe(row: calibration.Row) -> Recipe:
    instance = catalogs.instances()[row.hardware]
    ranks = row.gpus // row.context_parallel
    tokens = row.sequence_length * row.micro_batch_size * ranks * (row.grad_accum_steps or 1)
    model = {"catalog": row.model} if isinstance(row.model, str) else {"name": "row", "dimensions": row.model}
    data = recipe_dict(
        **{
            "name": "calibration-row",
            "model": model,
            "sequence_length": row.sequence_length,
            "budget.total_tokens": tokens * 1000,
            "budget.global_batch_tokens": tokens,
            "compute.instance_type": row.hardware,
            "compute.instance_count": row.gpus // instance.gpus,
            "compute.compile": row.compile,
            "tuning.precision": row.precision,
            "tuning.activation_checkpointing": row.activation_checkpointing,
            "tuning.sharding": row.sharding,
            "tuning.shard_group_size": row.shard_group_size,
            "tuning.micro_batch_size": row.micro_batch_size,
            "tuning.context_parallel": row.context_parallel,
            "tuning.batch_ramp": False,
        }
    )
    if row.precision == "fp8":
        data["tuning"]["fp8_recipe"] = row.fp8_recipe or "tensorwise"
    return Recipe.model_validate(data)


def test_some_rows_ran_on_whole_catalogue_instances():
    assert len(WHOLE) >= 4


@pytest.mark.parametrize("row", WHOLE, ids=lambda r: r.id)
def test_the_planner_plans_every_row_that_ran_on_catalogue_instances(row):
    plan = resolve(_recipe(row))
    errors = [f"{f.code}: {f.message}" for f in plan.findings if f.severity == "error"]
    assert not errors, errors
    assert (plan.micro_batch_size, plan.activation_checkpointing) == (
        row.micro_batch_size,
        row.activation_checkpointing,
    )


# -- pinned configurations: the physical HBM, not the headroom ------------------------------------


def _pinned_8b(sequence_length: int, **tuning) -> Recipe:
    pins = {
        "precision": "bf16",
        "activation_checkpointing": "none",
        "micro_batch_size": 1,
        "sharding": "full",
        "shard_group_size": 8,
        "context_parallel": 1,
    } | tuning
    data = recipe_dict(
        **{
            "model": {"catalog": "llama-3.1-8b"},
            "compute.instance_type": "ml.p5.48xlarge",
            "sequence_length": sequence_length,
            "budget.global_batch_tokens": sequence_length * 64,
        }
        | {f"tuning.{k}": v for k, v in pins.items()}
    )
    return Recipe.model_validate(data)


def test_a_pinned_configuration_over_the_headroom_is_planned_with_a_warning():
    from tiered_training.pipeline.definition import memory_limit

    plan = resolve(_pinned_8b(10240))
    assert not [f for f in plan.findings if f.severity == "error"]
    tight = [f for f in plan.findings if f.code == "tight"]
    assert len(tight) == 1 and tight[0].severity == "warning"
    assert plan.tier.memory_headroom < plan.memory.fraction <= 1
    assert tight[0].message.startswith(f"tight: {plan.memory.fraction:.0%} of HBM")
    assert "the probe will measure it" in tight[0].message
    assert memory_limit(plan) == 1.0  # the probe's gate lets it use the HBM it was planned to use


def test_auto_keeps_the_headroom():
    from tiered_training.pipeline.definition import memory_limit

    plan = resolve(_pinned_8b(10240, micro_batch_size="auto", activation_checkpointing="auto"))
    assert plan.memory.fraction <= plan.tier.memory_headroom
    assert "tight" not in {f.code for f in plan.findings}
    assert memory_limit(plan) == plan.tier.memory_headroom


def test_a_pinned_configuration_over_the_physical_hbm_is_refused():
    plan = resolve(_pinned_8b(16384))
    refused = [f for f in plan.findings if f.code == "does-not-fit"]
    assert len(refused) == 1 and "all of its usable HBM" in refused[0].message
