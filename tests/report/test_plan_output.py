"""What a plan hands on: the planner's own decisions in the RunConfig (the recipe's values are
in tests/pipeline/test_fidelity.py), the validation source, and the JSON of ``plan --json`` for a plan
and for a failed one (the same shape, so a script can read either)."""

from __future__ import annotations

import json

import pytest
from support import recipe_dict

from tiered_training.contract.runconfig import TENSORBOARD_DIR
from tiered_training.planning.planner import resolve
from tiered_training.recipe import Recipe

MLFLOW = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/team"


def plan_of(**overrides):
    return resolve(Recipe.model_validate(recipe_dict(**overrides)))


def test_the_planners_decisions_reach_the_run_config():
    plan = plan_of(**{"tuning.precision": "fp8", "tuning.sharding": "full", "tuning.batch_ramp": True,
                      "model.init_checkpoint": "s3://bucket-for-tests/hf/llama/", "optimizer.max_nonfinite_skips": 7,
                      "tracking.mlflow_tracking_server_arn": MLFLOW})
    assert plan.ok and plan.fp8_recipe == "tensorwise" and plan.ramp_start_accum_steps and plan.ramp_steps > 0
    config = plan.run_config()
    assert config.model.init_checkpoint == "s3://bucket-for-tests/hf/llama/"
    p = config.precision
    assert (p.precision, p.fp8_recipe, p.activation_checkpointing) == ("fp8", "tensorwise", plan.activation_checkpointing)
    assert p.fp8_all_gather is True  # tensorwise scaling and FSDP: the all-gathers are float8
    assert p.compile is True and p.loss_chunk_tokens == plan.loss_chunk_tokens == 4096
    b = config.batch
    assert (b.micro_batch_size, b.grad_accum_steps, b.ramp_start_accum_steps, b.ramp_steps) == (
        plan.micro_batch_size, plan.grad_accum_steps, plan.ramp_start_accum_steps, plan.ramp_steps)
    assert config.optimizer.max_nonfinite_skips == 7
    assert config.checkpoint.interval_steps == 0  # by time only
    assert config.tracking.mlflow_tracking_uri == MLFLOW
    assert config.tracking.tensorboard_dir == TENSORBOARD_DIR
    assert config.metrics.plan_tokens_per_second_per_gpu == round(plan.estimates.tokens_per_second_per_gpu, 2)
    assert (config.run.segments, config.run.segment_seconds) == (plan.segments, plan.segment_seconds)


def test_no_compile_no_tensorboard_and_bf16_arrive_too():
    plan = plan_of(**{"tuning.precision": "bf16", "compute.compile": False, "tracking.tensorboard": False})
    config = plan.run_config()
    assert config.precision.compile is False
    assert config.precision.fp8_recipe is None and config.precision.fp8_all_gather is False
    assert config.tracking.tensorboard_dir is None and config.tracking.mlflow_tracking_uri is None


@pytest.mark.parametrize("sharding", ["none", "hybrid"])
def test_float8_all_gather_only_where_fsdp_gathers(sharding):
    plan = plan_of(**{"tuning.precision": "fp8", "tuning.sharding": sharding, "model.catalog": "llama-3.2-1b",
                      "compute.instance_count": 2})
    assert plan.ok, plan.errors
    assert plan.run_config().precision.fp8_all_gather is (sharding != "none")


@pytest.mark.parametrize("micro_batch,candidates", [(1, [1, 2]), (2, [1, 2, 4]), (4, [2, 4, 8]), (8, [4, 8, 16])])
def test_the_probe_tries_half_and_double_the_micro_batch(micro_batch, candidates):
    plan = plan_of(**{"tuning.micro_batch_size": micro_batch})
    assert plan.ok, plan.errors
    assert plan.run_config().probe.micro_batch_candidates == candidates


def test_an_odd_micro_batch_halves_down():
    plan = plan_of(**{"tuning.micro_batch_size": 3, "budget.global_batch_tokens": 4096 * 96})
    assert plan.ok, plan.errors
    assert plan.run_config().probe.micro_batch_candidates == [1, 3, 6]


def test_a_segmented_run_tells_the_container_its_segments():
    plan = plan_of(**{"budget.total_tokens": 3 * 10**11, "compute.max_runtime_hours": 24})
    assert plan.ok and plan.segments > 1
    assert plan.run_config().run.segments == plan.segments


@pytest.mark.parametrize("data,source,every", [
    ({"data.validation_uri": "s3://bucket-for-tests/val/"}, "channel", 0),
    ({"data.validation_fraction": 0.01}, "holdout", 100),
    ({"data.validation_fraction": 0.5}, "holdout", 2),  # at least every second window stays for training
    ({"data.validation_fraction": 0.0}, "none", 0),
])
def test_where_validation_comes_from(data, source, every):
    config = plan_of(**data, **{"validation.interval_minutes": 9.0, "validation.batches": 5}).run_config().validation
    assert (config.source, config.holdout_every, config.interval_minutes, config.batches) == (source, every, 9.0, 5)


def test_an_unknown_decision_is_named():
    with pytest.raises(KeyError, match="tuning.nothing"):
        plan_of().decision("tuning.nothing")


def test_alternatives_read_plainly():
    from tiered_training.planning.plan import Alternative

    fp8 = Alternative("fp8", "rowwise", "selective", 2, 8, 2, 1.0, 10.0, 0.5)
    bf16 = Alternative("bf16", None, "full", 1, 16, 1, 1.0, 10.0, 0.5)
    assert fp8.describe() == "fp8/rowwise, selective AC, micro-batch 2, shard group 8, CP 2"
    assert bf16.describe() == "bf16, full AC, micro-batch 1, shard group 16"


def _shape(value):
    """Keys, recursively: the JSON's shape without its values."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return None


def test_plan_json_has_the_same_shape_for_a_failed_plan():
    ok = plan_of(**{"compute.spot": True})
    failed = plan_of(**{"model.catalog": "qwen2.5-32b", "compute.spot": True})
    assert ok.ok and not failed.ok
    good, bad = ok.to_dict(), failed.to_dict()
    json.dumps(good), json.dumps(bad)
    shape, failed_shape = _shape(good), _shape(bad)
    # A failed plan has no memory proof or estimates: those are null, not missing.
    for key in ("memory_gib", "estimates"):
        assert isinstance(shape.pop(key), dict) and failed_shape.pop(key) is None
    assert set(shape.pop("tuning")) == set(failed_shape.pop("tuning"))
    shape.pop("run", None), failed_shape.pop("run", None)
    assert shape == failed_shape
    assert (bad["ok"], bad["estimates"], bad["memory_gib"], bad["memory_fraction"], bad["departures"], bad["alternatives"]) == (
        False, None, None, None, [], [])
    assert bad["name"] == "unit-test" and bad["source"] is None
    assert bad["model"] == {"name": failed.model_name, "parameters": failed.parameters, "tier": failed.tier.name}
    assert bad["compute"] == {"instance_type": "ml.p6-b200.48xlarge", "gpu": None, "nodes": 1, "gpus": None, "spot": True}
    assert bad["tuning"]["sequence_length"] == 4096 and bad["tuning"]["global_batch_tokens"] == 4096 * 256
    assert bad["tuning"]["precision"] is None
    assert bad["memory_headroom"] == failed.tier.memory_headroom
    assert bad["decisions"] and bad["decisions"][0] == {
        "field": failed.decisions[0].field, "value": failed.decisions[0].value,
        "reason": failed.decisions[0].reason, "source": failed.decisions[0].source}
    assert {f["code"] for f in bad["findings"]} == {f.code for f in failed.findings} >= {"needs-multiple-nodes"}


def test_plan_json_of_a_plan():
    plan = plan_of(**{"compute.spot": True})
    data = plan.to_dict()
    assert data["ok"] is True and data["name"] == "unit-test"
    assert data["model"] == {"name": plan.model_name, "parameters": plan.parameters, "tier": plan.tier.name}
    assert data["compute"] == {"instance_type": "ml.p6-b200.48xlarge", "gpu": plan.instance.gpu, "nodes": 1,
                               "gpus": plan.gpus, "spot": True}
    assert data["tuning"]["micro_batch_size"] == plan.micro_batch_size
    assert data["memory_gib"] == plan.memory.as_gib()
    assert data["memory_headroom"] == plan.tier.memory_headroom
    assert data["memory_fraction"] == round(plan.memory.fraction, 4)
    # Four decimals: shown on plans whose fifth decimal is not zero.
    plans = [plan_of(**{"tuning.micro_batch_size": b}) for b in (1, 2, 4)]
    shown = [p for p in plans if round(p.memory.fraction, 5) != round(p.memory.fraction, 4)]
    assert shown and all(p.to_dict()["memory_fraction"] == round(p.memory.fraction, 4) for p in shown)
    assert data["run"] == {"segments": plan.segments, "job_runtime_seconds": plan.job_runtime_seconds,
                           "spot_wait_seconds": plan.spot_wait_seconds, "instance_counts": list(plan.instance_counts)}
    assert data["run"]["spot_wait_seconds"] > 0 and data["run"]["instance_counts"]
