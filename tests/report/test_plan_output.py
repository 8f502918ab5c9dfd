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


PINNED = {"tuning.precision": "bf16", "tuning.activation_checkpointing": "none", "tuning.sharding": "full",
          "tuning.shard_group_size": 8, "tuning.context_parallel": 1}


def _configuration(c):
    return (c.precision, c.fp8_recipe, c.activation_checkpointing, c.sharding, c.shard_group_size,
            c.context_parallel, c.micro_batch_size, c.grad_accum_steps)


def test_auto_measures_three_the_plans_own_first_and_hands_them_to_the_container():
    plan = plan_of()
    assert plan.ok, plan.errors
    first, *others = plan.candidates
    assert [c.number for c in plan.candidates] == [1, 2, 3]
    assert _configuration(first) == (plan.precision, plan.fp8_recipe, plan.activation_checkpointing, plan.sharding,
                                     plan.shard_group_size, plan.context_parallel, plan.micro_batch_size,
                                     plan.grad_accum_steps)
    assert first.tokens_per_second_per_gpu == round(plan.estimates.tokens_per_second_per_gpu, 1)
    assert len({_configuration(c) for c in plan.candidates}) == 3
    assert all(c.memory_fraction <= plan.tier.memory_headroom for c in plan.candidates)
    assert plan.decision("tuning.probe_candidates").value == 3
    config = plan.run_config()
    assert config.probe.count == 3 and config.probe.memory_limit == plan.tier.memory_headroom
    for c in others:
        alt = config.candidate_config(c.number)
        assert (alt.precision.precision, alt.precision.activation_checkpointing, alt.parallel.shard_group_size,
                alt.micro_batch_size, alt.grad_accum_steps) == (c.precision, c.activation_checkpointing,
                                                                 c.shard_group_size, c.micro_batch_size,
                                                                 c.grad_accum_steps)


def test_a_pinned_configuration_measures_one():
    plan = plan_of(**PINNED, **{"tuning.micro_batch_size": 8})
    assert [c.number for c in plan.candidates] == [1]
    assert plan.run_config().probe.alternatives == []
    assert "pins every tuning field" in plan.decision("tuning.probe_candidates").reason


def test_an_explicit_count_is_kept():
    plan = plan_of(**{"tuning.probe_candidates": 2})
    assert len(plan.candidates) == 2 and len(plan.run_config().probe.alternatives) == 1
    assert plan.decision("tuning.probe_candidates").source == "recipe"


def test_fewer_fit_than_asked():
    plan = plan_of(**PINNED, **{"tuning.probe_candidates": 5})
    assert len(plan.candidates) == 1
    assert "5 wanted, but only the plan's configuration fits" in plan.decision("tuning.probe_candidates").reason
    # Llama 3.1 8B on p4d at 2K: no FP8, and few layouts fit the 40 GB GPUs
    wider = plan_of(**{"tuning.probe_candidates": 5, "model.catalog": "llama-3.1-8b",
                       "compute.instance_type": "ml.p4d.24xlarge", "sequence_length": 2048})
    assert 1 < len(wider.candidates) < 5
    assert f"only {len(wider.candidates)} fit" in wider.decision("tuning.probe_candidates").reason


def test_fp8_is_not_a_candidate_against_a_bf16_tier_unless_the_plan_takes_it(monkeypatch):
    from tiered_training.planning import choice

    # FP8 that does not earn its numerical risk (a gain threshold it cannot reach): the plan keeps the tier's BF16,
    # and the probe does not measure FP8 behind the plan's back.
    monkeypatch.setattr(choice, "MIN_FP8_GAIN", 10.0)
    plan = plan_of()  # the small tier advises BF16; FP8 fits on this instance
    assert plan.tier.precision == "bf16" and plan.instance.fp8
    assert plan.precision == "bf16" and {c.precision for c in plan.candidates} == {"bf16"}
    monkeypatch.undo()
    chosen = plan_of(**{"tuning.precision": "fp8"})
    assert chosen.candidates[0].precision == "fp8"
    # and measures others beside it (those that can win by the model's held-out bounds)
    assert len(chosen.candidates) >= 2


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


def test_explain_lists_the_candidates_and_the_wide_table_counts_them():
    from tiered_training import report
    from tiered_training.cli.output import Plan as PlanModel

    plan = plan_of(**{"compute.price_per_hour": 100.0})
    lines = [str(line) for line in report.explain_lines(plan)]
    at = next(i for i, line in enumerate(lines) if line.startswith("Probe candidates"))
    assert f"under {plan.probe_memory_limit:.0%} of HBM" in lines[at]
    for c, line in zip(plan.candidates, lines[at + 2 :], strict=False):
        assert line.split()[:2] == [str(c.number), f"{c.tokens_per_second_per_gpu:,.0f}"]
        assert c.describe().split(",")[0] in line
    assert any(line.strip().startswith("wall time") and "the probe's" in line for line in lines)
    assert report.summary_row(plan)["probe"] == "3"
    assert report.summary_row(plan_of(**{"probe.enabled": False}))["probe"] == "off"
    model = PlanModel.model_validate(json.loads(json.dumps(plan.to_dict())))
    assert [c.number for c in model.candidates] == [1, 2, 3]
