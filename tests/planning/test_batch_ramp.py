"""The batch ramp and the step counts both sides of the RunConfig contract use, by hand-computed values."""

from __future__ import annotations

import pytest
from support import recipe_dict

from tiered_training.contract.runconfig import BatchConfig, RunConfig, ramp_accum_steps, steps_for_tokens


def test_ramp_is_linear_in_accumulation_steps():
    # start 4, full 16 over 6 steps: 4 + 12 * step // 6.
    assert [ramp_accum_steps(s, 4, 16, 6) for s in range(8)] == [4, 6, 8, 10, 12, 14, 16, 16]
    assert [ramp_accum_steps(s, 3, 8, 4) for s in range(5)] == [3, 4, 5, 6, 8]  # 3 + 5 * s // 4, floored
    assert ramp_accum_steps(0, 2, 8, 1) == 2 and ramp_accum_steps(1, 2, 8, 1) == 8  # a one-step ramp


@pytest.mark.parametrize("start, ramp_steps, step", [(None, 6, 0), (0, 6, 0), (4, 0, 0), (4, -1, 0), (4, 6, 6), (4, 6, 7)])
def test_no_ramp_is_the_full_batch(start, ramp_steps, step):
    assert ramp_accum_steps(step, start, 16, ramp_steps) == 16


def test_batch_config_follows_the_ramp():
    batch = BatchConfig(sequence_length=4096, micro_batch_size=2, grad_accum_steps=16, global_batch_tokens=4096 * 2 * 16 * 8,
                        total_steps=100, ramp_start_accum_steps=4, ramp_steps=6)
    assert [batch.accum_steps_at(s) for s in range(8)] == [4, 6, 8, 10, 12, 14, 16, 16]
    flat = batch.model_copy(update={"ramp_start_accum_steps": None, "ramp_steps": 0})
    assert {flat.accum_steps_at(s) for s in range(8)} == {16}


def test_steps_for_tokens_without_a_ramp_round_up():
    assert steps_for_tokens(1000, 10, None, 4, 0) == 25  # 40 tokens a step
    assert steps_for_tokens(1001, 10, None, 4, 0) == 26
    assert steps_for_tokens(40, 10, None, 4, 0) == 1
    assert steps_for_tokens(0, 10, None, 4, 0) == 1  # at least one step
    assert steps_for_tokens(1, 10, None, 4, 0) == 1


def test_steps_for_tokens_count_the_ramps_smaller_steps():
    # start 1, full 4 over 3 steps, 10 tokens per accumulation step:
    # the ramp's steps train on 10, 20 and 30 tokens (60 in all), then 40 a step.
    assert steps_for_tokens(10, 10, 1, 4, 3) == 1
    assert steps_for_tokens(11, 10, 1, 4, 3) == 2
    assert steps_for_tokens(30, 10, 1, 4, 3) == 2
    assert steps_for_tokens(31, 10, 1, 4, 3) == 3
    assert steps_for_tokens(60, 10, 1, 4, 3) == 3
    assert steps_for_tokens(61, 10, 1, 4, 3) == 4
    assert steps_for_tokens(100, 10, 1, 4, 3) == 4
    assert steps_for_tokens(101, 10, 1, 4, 3) == 5
    assert steps_for_tokens(0, 10, 1, 4, 3) == 1


def _config() -> RunConfig:
    from tiered_training.planning.planner import resolve
    from tiered_training.recipe import Recipe

    return resolve(Recipe.model_validate(recipe_dict())).run_config()


def test_a_value_of_2500_characters_is_the_limit():
    config = _config()
    at_limit = config.model_copy(update={"recipe_name": "r" * 2498})  # JSON quotes make 2,500
    assert len(at_limit.to_hyperparameters()["recipe_name"]) == 2500
    over = config.model_copy(update={"recipe_name": "r" * 2499})
    with pytest.raises(ValueError, match="^hyperparameter recipe_name is 2501 characters; the limit is 2500$"):
        over.to_hyperparameters()


def test_sagemaker_keys_are_skipped_wherever_they_come():
    config = _config()
    first = {"sagemaker_program": '"train.py"', "sagemaker_region": '"us-east-1"', **config.to_hyperparameters()}
    assert RunConfig.from_hyperparameters(first) == config


def test_the_json_file_is_indented_for_people():
    config = _config()
    text = config.to_json()
    assert text.splitlines()[1] == '  "recipe_name": "unit-test",'
    assert RunConfig.from_json(text) == config


def test_mfu_is_the_planners_flops_over_the_bf16_peak():
    config = _config()
    flops = config.model.flops_per_token(config.batch.sequence_length)
    assert flops > 6 * config.model.parameters  # dense FLOPs plus attention
    assert config.mfu(1000.0) == pytest.approx(flops * 1000.0 / config.hardware.peak_bf16_flops, rel=1e-12)
    assert config.mfu(2000.0) == pytest.approx(2 * config.mfu(1000.0), rel=1e-12)
    assert 0 < config.mfu(config.metrics.plan_tokens_per_second_per_gpu) < 1
