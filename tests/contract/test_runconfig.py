"""RunConfig, the one contract with the container: hyperparameters both ways, within SageMaker's limits."""

from __future__ import annotations

import json

import pytest
from support import RECIPES

from tiered_training.contract.runconfig import MAX_HYPERPARAMETER_VALUE, MAX_HYPERPARAMETERS, RunConfig
from tiered_training.planning.planner import plan_file


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_hyperparameters_round_trip_for_every_template(path):
    config = plan_file(path).run_config()
    hyperparameters = config.to_hyperparameters()
    assert len(hyperparameters) <= MAX_HYPERPARAMETERS
    assert all(isinstance(v, str) and len(v) <= MAX_HYPERPARAMETER_VALUE for v in hyperparameters.values())
    assert RunConfig.from_hyperparameters(hyperparameters) == config
    assert RunConfig.from_json(config.to_json()) == config


def test_run_config_carries_the_plan_decisions():
    plan = plan_file(RECIPES[0])
    config = plan.run_config()
    assert config.recipe_name == plan.name
    assert config.precision.precision == plan.precision
    assert config.precision.activation_checkpointing == plan.activation_checkpointing
    assert config.parallel.shard_group_size == plan.shard_group_size
    assert config.batch.micro_batch_size == plan.micro_batch_size
    assert config.model.layers == plan.architecture.layers
    assert config.hardware.peak_bf16_flops == plan.instance.peak_bf16_flops


def test_sagemaker_keys_are_ignored_and_pipeline_overrides_parse():
    config = plan_file(RECIPES[0]).run_config()
    hyperparameters = config.to_hyperparameters()
    hyperparameters["sagemaker_program"] = "x"
    hyperparameters["batch.total_steps"] = "17"  # a pipeline parameter arrives as a plain string
    assert RunConfig.from_hyperparameters(hyperparameters).batch.total_steps == 17


def test_unknown_hyperparameter_is_rejected():
    hyperparameters = plan_file(RECIPES[0]).run_config().to_hyperparameters()
    hyperparameters["batch.bogus"] = json.dumps(1)
    with pytest.raises(ValueError):
        RunConfig.from_hyperparameters(hyperparameters)


def test_segments_split_the_steps_evenly_and_the_last_ends_the_run():
    from tiered_training.contract.runconfig import RunSection

    ends = [RunSection(segment=k, segments=3).end_step(7) for k in (1, 2, 3)]
    assert ends == [3, 5, 7]
    assert RunSection().end_step(7) == 7
    with pytest.raises(ValueError, match="beyond run.segments"):
        RunSection(segment=4, segments=3)


def test_the_identity_ignores_what_a_resume_may_change():
    """The step count (MaxSteps), the micro-batch and accumulation (they follow the world) and the run's own fields
    leave the plan hash alone; the model, the global batch and the data seed do not."""
    cfg = plan_file(RECIPES[0]).run_config()
    same = cfg.model_copy(update={
        "batch": cfg.batch.model_copy(update={"total_steps": 5, "grad_accum_steps": cfg.batch.grad_accum_steps * 2}),
        "run": cfg.run.model_copy(update={"id": "x", "segment": 1, "segments": 2}),
    })
    assert same.plan_hash() == cfg.plan_hash()
    for part, changed in (
        ("model", cfg.model_copy(update={"model": cfg.model.model_copy(update={"layers": 3})})),
        ("batch", cfg.model_copy(update={"batch": cfg.batch.model_copy(update={"global_batch_tokens": 1024})})),
        ("data", cfg.model_copy(update={"data": cfg.data.model_copy(update={"seed": 99})})),
    ):
        parts = changed.identity_parts()
        assert parts[part] != cfg.identity_parts()[part] and changed.plan_hash() != cfg.plan_hash()
        assert {k: v for k, v in parts.items() if k != part} == {k: v for k, v in cfg.identity_parts().items() if k != part}
