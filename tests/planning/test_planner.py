"""The tier engine and planner: decisions at the tier boundaries, every hard error,
parameter counts, and the memory arithmetic against hand-computed values."""

from __future__ import annotations

import math
import re

import pytest
from support import RECIPES, recipe_dict

from tiered_training import catalog as catalogs
from tiered_training.contract.architecture import Architecture
from tiered_training.contract.runconfig import ramp_accum_steps as ramp_accum
from tiered_training.planning import memory, perf
from tiered_training.planning.planner import plan_file, resolve
from tiered_training.recipe import Recipe
from tiered_training.recipe.loader import parse_recipe

GIB = 1024**3


def plan_of(**overrides):
    return resolve(Recipe.model_validate(recipe_dict(**overrides)))


def with_dimensions(params_target_layers: int, **overrides):
    """A Llama-3-shaped model whose size is set by its layer count."""
    dims = {"layers": params_target_layers, "hidden_size": 4096, "attention_heads": 32, "kv_heads": 8, "ffn_size": 14336, "vocab_size": 128256}
    data = recipe_dict(**overrides)
    data["model"] = {"dimensions": dims, "name": "probe-model"}
    return resolve(Recipe.model_validate(data))


def codes(plan, severity=None):
    return {f.code for f in plan.findings if severity is None or f.severity == severity}


# -- catalogues ----------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(catalogs.models()), ids=str)
def test_parameter_counts_match_published_sizes(model):
    entry = catalogs.models()[model]
    assert entry.architecture.parameters == pytest.approx(entry.published_parameters, rel=0.005)


def test_llama_31_8b_is_8_03_billion():
    assert catalogs.models()["llama-3.1-8b"].architecture.parameters == 8_030_261_248


def test_instance_catalogue_covers_every_family():
    names = set(catalogs.instances())
    for family in ("p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300"):
        assert any(name.startswith(f"ml.{family}.") for name in names), family


def test_instance_price_overrides(monkeypatch):
    instance = catalogs.instances()["ml.p6-b200.48xlarge"]
    monkeypatch.setattr(catalogs, "prices", lambda: catalogs.Prices(
        source="https://aws.amazon.com/sagemaker-ai/pricing/", checked="2026-12-01", default_region="us-east-1",
        regions={"us-east-1": {"ml.p6-b200.48xlarge": 100.0}}))
    assert instance.price()[0] == 100.0
    assert instance.price(region="eu-west-1")[0] is None
    monkeypatch.setenv("TIERED_TRAINING_PRICE_ML_P6_B200_48XLARGE", "90.5")
    assert instance.price() == (90.5, "environment TIERED_TRAINING_PRICE_ML_P6_B200_48XLARGE")
    assert instance.price(70.0)[0] == 70.0
    plan = plan_of(**{"compute.price_per_hour": 50.0})
    assert plan.estimates.price_per_hour == 50.0


# -- tiers at the boundaries ---------------------------------------------------------


def test_seven_b_class_is_small_and_bf16():
    plan = plan_of(**{"model.catalog": "mistral-7b", "tuning.follow_tiers": "strict"})  # 7.25B
    assert plan.tier.name == "small"
    assert plan.precision == "bf16"
    assert plan.activation_checkpointing == "selective"
    assert plan.ramp_steps == 0
    assert not plan.departures


def test_just_above_seven_and_a_half_b_is_medium_fp8():
    plan = plan_of(**{"model.catalog": "qwen2.5-7b", "tuning.follow_tiers": "strict"})  # 7.62B
    assert plan.tier.name == "medium"
    assert plan.precision == "fp8" and plan.fp8_recipe == "tensorwise"
    assert plan.activation_checkpointing == "full"
    assert plan.ramp_start_accum_steps is not None and plan.ramp_steps > 0


@pytest.mark.parametrize("layers,tier", [(131, "medium"), (133, "large")])
def test_thirty_b_boundary(layers, tier):
    plan = with_dimensions(layers, **{"compute.instance_count": 2, "budget.global_batch_tokens": 4096 * 512})
    assert (plan.parameters <= 30e9) == (tier == "medium")
    assert plan.tier.name == tier
    assert plan.ok, [f.message for f in plan.errors]


def test_every_auto_field_gets_a_decision_with_a_reason():
    plan = plan_of()
    fields = {d.field for d in plan.decisions}
    assert {"tuning.precision", "tuning.activation_checkpointing", "tuning.sharding", "tuning.shard_group_size", "tuning.micro_batch_size", "tuning.batch_ramp"} <= fields
    assert all(d.reason for d in plan.decisions)


@pytest.mark.parametrize("model", ["llama-3.2-1b", "llama-3.1-8b"])
def test_micro_batch_is_the_largest_that_fits_under_headroom(model):
    plan = plan_of(**{"model.catalog": model, "budget.global_batch_tokens": 4096 * 1024})
    assert plan.memory.fraction <= plan.tier.memory_headroom
    ranks = plan.gpus // plan.context_parallel
    per_rank = plan.recipe.budget.global_batch_tokens // plan.recipe.sequence_length // ranks
    bigger = [d for d in range(plan.micro_batch_size + 1, per_rank + 1) if per_rank % d == 0]
    if bigger:
        est = memory.estimate(
            plan.architecture, precision=plan.precision, checkpointing=plan.activation_checkpointing,
            sequence_length=4096 // plan.context_parallel, micro_batch=bigger[0], shard_group=plan.shard_group_size,
            hbm_bytes=plan.instance.hbm_bytes,
        )
        assert est.fraction > plan.tier.memory_headroom
    assert plan.micro_batch_size * plan.grad_accum_steps * ranks * 4096 == plan.recipe.budget.global_batch_tokens


def test_override_against_tier_is_a_warning():
    plan = plan_of(**{"tuning.precision": "fp8"})
    assert plan.ok
    assert "against-tier" in codes(plan, "warning")
    assert "fp8-small-gain" in codes(plan, "warning")


def test_model_outside_tiers_warns_unless_acknowledged():
    tiny = {"layers": 2, "hidden_size": 512, "attention_heads": 8, "kv_heads": 8, "ffn_size": 1024, "vocab_size": 32000}
    data = recipe_dict()
    data["model"] = {"dimensions": tiny}
    plan = resolve(Recipe.model_validate(data))
    assert "outside-tiers" in codes(plan, "warning")
    data["model"]["allow_outside_tiers"] = True
    assert "outside-tiers" in codes(resolve(Recipe.model_validate(data)), "info")


def test_strict_multi_node_picks_smallest_shard_group_that_fits():
    plan = plan_of(**{"model.catalog": "qwen2.5-32b", "compute.instance_count": 4, "sequence_length": 8192, "budget.global_batch_tokens": 8192 * 512, "tuning.follow_tiers": "strict"})
    assert plan.ok
    assert plan.sharding == "hybrid" and plan.shard_group_size == 8
    assert plan.activation_checkpointing == "full"


def test_auto_multi_node_takes_the_fastest_shard_group():
    plan = plan_of(**{"model.catalog": "qwen2.5-32b", "compute.instance_count": 4, "sequence_length": 8192, "budget.global_batch_tokens": 8192 * 512})
    assert plan.ok
    assert all(a.tokens_per_second_per_gpu <= plan.estimates.tokens_per_second_per_gpu * 1.02 for a in plan.alternatives)
    assert "EFA" in plan.decision("tuning.sharding").reason



def test_pinned_hybrid_sharding_is_kept_even_where_full_is_faster():
    base = {"model.catalog": "qwen2.5-32b", "compute.instance_count": 4, "sequence_length": 16384, "budget.global_batch_tokens": 16384 * 256}
    assert plan_of(**base).sharding == "full"  # the search's own choice here
    plan = plan_of(**base, **{"tuning.sharding": "hybrid"})
    assert plan.ok and plan.sharding == "hybrid" and plan.shard_group_size < plan.gpus
    assert all(a.shard_group_size < plan.gpus for a in plan.alternatives)


def test_hybrid_sharding_on_one_node_is_an_error_with_its_fix():
    plan = plan_of(**{"tuning.sharding": "hybrid", "compute.instance_count": 1})
    error = next(e for e in plan.errors if e.field == "tuning.sharding")
    assert "one node" in error.message and "instance_count" in error.fix

def test_hybrid_grows_the_group_when_one_node_does_not_fit():
    # A 64B-class model on P5 (80 GB) cannot hold its state on one node: the group grows.
    data = recipe_dict(**{"compute.instance_type": "ml.p5.48xlarge", "compute.instance_count": 8, "budget.global_batch_tokens": 4096 * 1024})
    data["model"] = {"dimensions": {"layers": 72, "hidden_size": 8192, "attention_heads": 64, "kv_heads": 8, "ffn_size": 28672, "vocab_size": 128256}}
    data["tuning"] = {"follow_tiers": "strict"}
    plan = resolve(Recipe.model_validate(data))
    assert plan.ok, [str(e) for e in plan.errors]
    assert (plan.sharding, plan.shard_group_size) == ("hybrid", 32)
    reason = plan.decision("tuning.sharding").reason
    assert "a shard group of 4 node(s) (32 GPUs)" in reason and "2 replicas" in reason and "the smallest that fits" in reason
    # The smallest: half the group would not fit under the tier's headroom.
    half = memory.estimate(
        plan.architecture, precision=plan.precision, checkpointing=plan.activation_checkpointing,
        sequence_length=4096, micro_batch=plan.micro_batch_size, shard_group=16, hbm_bytes=plan.instance.hbm_bytes,
    )
    assert half.fraction > plan.tier.memory_headroom >= plan.memory.fraction


def test_fp8_falls_back_to_bf16_on_a100_when_auto():
    plan = plan_of(**{"model.catalog": "llama-3.1-8b", "compute.instance_type": "ml.p4de.24xlarge", "compute.instance_count": 2})
    assert plan.precision == "bf16"
    assert "no FP8" in plan.decision("tuning.precision").reason


# -- hard errors ---------------------------------------------------------------------


def test_error_fp8_on_a100():
    plan = plan_of(**{"compute.instance_type": "ml.p4d.24xlarge", "tuning.precision": "fp8"})
    assert "fp8-unsupported" in codes(plan, "error")
    assert "bf16" in plan.errors[0].fix


def test_error_mxfp8_on_hopper():
    plan = plan_of(**{"compute.instance_type": "ml.p5.48xlarge", "tuning.precision": "fp8", "tuning.fp8_recipe": "mxfp8"})
    assert "mxfp8-unsupported" in codes(plan, "error")


def test_error_large_model_on_one_node():
    plan = plan_of(**{"model.catalog": "qwen2.5-32b"})
    assert "needs-multiple-nodes" in codes(plan, "error")
    assert "instance_count" in next(f for f in plan.errors if f.code == "needs-multiple-nodes").fix


def test_error_does_not_fit_anywhere_names_a_fix():
    plan = plan_of(**{"model.catalog": "llama-3.1-70b", "compute.instance_type": "ml.p5.48xlarge", "compute.instance_count": 2, "model.allow_outside_tiers": True, "budget.global_batch_tokens": 4096 * 64})
    error = next(f for f in plan.errors if f.code == "does-not-fit")
    assert "GiB" in error.message and "instance_count" in error.fix
    assert plan.estimates is None


def test_error_spot_max_wait_shorter_than_runtime():
    plan = plan_of(**{"compute.spot": True, "compute.max_runtime_hours": 48, "compute.max_wait_hours": 24})
    assert "spot-max-wait" in codes(plan, "error")


def test_spot_without_max_wait_gets_one():
    """Each spot job waits at most a day beyond its runtime, and says so."""
    plan = plan_of(**{"compute.spot": True, "compute.max_runtime_hours": 48})
    assert plan.ok and plan.decision("compute.max_wait_hours").value == 72
    assert plan.spot_wait_seconds == 72 * 3600 and "24 h" in plan.decision("compute.max_wait_hours").reason


def test_a_job_may_not_ask_for_more_than_the_accounts_runtime_quota():
    """AWS's default longest training-job run time is 5 days; more is an error unless compute.quotas says the
    account's limit is higher (and the API's 28 days cap even that)."""
    too_long = plan_of(**{"compute.max_runtime_hours": 240})
    (error,) = [f for f in too_long.errors if f.code == "runtime-above-quota"]
    assert "120 h" in error.message and "compute.quotas.training-job-max-runtime" in error.fix
    raised = plan_of(**{"compute.max_runtime_hours": 240, "compute.quotas": {"training-job-max-runtime": 864000}})
    assert raised.ok and raised.job_runtime_seconds == 240 * 3600
    default = plan_of()
    assert default.job_runtime_seconds == 432000 and default.decision("compute.max_runtime_hours").value == 120


def test_a_run_longer_than_one_job_is_planned_as_segments():
    """The issue's case: a 32B recipe on 2 nodes with a 400B-token budget needs about 850 h. It now plans the
    segments it needs under the 5-day default, and `explain` and the diff show the count (a decision)."""
    from tiered_training.report import explain_lines

    plan = plan_of(**{"model.catalog": "qwen2.5-32b", "compute.instance_count": 2, "budget.total_tokens": 400 * 10**9,
                      "budget.global_batch_tokens": 4_194_304})
    assert plan.ok, [f.message for f in plan.errors]
    hours = plan.estimates.wall_time_hours - plan.estimates.probe_hours  # the training's, without the probe's job
    decision = plan.decision("compute.segments")
    from tiered_training.planning.segments import reserve_seconds

    per_job = (plan.job_runtime_seconds - reserve_seconds(plan.recipe)) * plan.recipe.probe.min_throughput_fraction / 3600
    assert plan.segments == decision.value == math.ceil(hours / per_job) and plan.segments >= 8
    assert f"{hours:,.1f} h" in decision.reason and "retries" in decision.reason
    assert any("compute.segments" in line and str(plan.segments) in line for line in explain_lines(plan))
    # Beyond MAX_SEGMENTS the pipeline would be dozens of steps: an error with the fixes.
    huge = plan_of(**{"model.catalog": "qwen2.5-32b", "compute.instance_count": 2, "budget.total_tokens": 4 * 10**12,
                      "budget.global_batch_tokens": 4_194_304})
    assert "too-many-segments" in codes(huge, "error")


def test_the_plan_states_the_instance_counts_it_supports():
    """Counts that keep the global batch whole; with full sharding none below the plan (bigger shards)."""
    plan = plan_of(**{"compute.instance_count": 2})
    counts = plan.decision("compute.instance_counts").value
    assert counts == list(plan.instance_counts) and 2 in counts and 3 not in counts
    if plan.sharding == "full":
        assert 1 not in counts


def test_error_sequence_longer_than_model_supports():
    plan = plan_of(**{"model.catalog": "mistral-7b", "sequence_length": 65536, "budget.global_batch_tokens": 65536 * 8})
    assert "sequence-too-long" in codes(plan, "error")


def test_error_unknown_catalogue_entries_suggest_close_names():
    plan = plan_of(**{"model.catalog": "llama-3.1-8", "compute.instance_type": "ml.p6-b200.48xl"})
    errors = {f.code: f for f in plan.errors}
    assert "llama-3.1-8b" in errors["unknown-model"].fix
    assert "ml.p6-b200.48xlarge" in errors["unknown-instance"].fix


def test_error_global_batch_not_divisible_over_gpus():
    plan = plan_of(**{"budget.global_batch_tokens": 4096 * 12, "compute.instance_count": 1})
    assert "batch-not-divisible" in codes(plan, "error")


def test_error_explicit_micro_batch_that_does_not_fit_suggests_the_smallest_change():
    plan = plan_of(**{
        "model.catalog": "llama-3.1-8b", "sequence_length": 131072, "budget.global_batch_tokens": 131072 * 16,
        "tuning.micro_batch_size": 2, "tuning.context_parallel": 1, "tuning.activation_checkpointing": "full",
    })
    error = next(f for f in plan.errors if f.code == "does-not-fit")
    # One pinned field freed is enough (micro-batch 1, or context parallelism): never more nodes.
    assert "tuning.micro_batch_size: 1" in error.fix or "tuning.context_parallel" in error.fix
    assert "instance_count" not in error.fix


def test_fit_fix_respects_pinned_checkpointing():
    # Pinned 'none' does not fit at 128K; full checkpointing does, on the same node.
    plan = plan_of(**{
        "model.catalog": "llama-3.1-8b", "sequence_length": 131072, "budget.global_batch_tokens": 131072 * 16,
        "tuning.activation_checkpointing": "none", "tuning.context_parallel": 1,
    })
    error = next(f for f in plan.errors if f.code == "does-not-fit")
    assert "tuning.activation_checkpointing: full" in error.fix or "tuning.context_parallel" in error.fix
    assert "instance_count" not in error.fix


def test_plan_with_errors_never_yields_a_run_config():
    from tiered_training.planning.plan import PlanError

    plan = plan_of(**{"model.catalog": "qwen2.5-32b"})
    with pytest.raises(PlanError, match="needs-multiple-nodes"):
        plan.run_config()


# -- memory arithmetic ----------------------------------------------------------------


def test_llama_8b_states_are_15_gib_per_gpu_over_8():
    arch = catalogs.models()["llama-3.1-8b"].architecture
    states = memory.sharded_state_bytes(arch, 8)
    assert sum(states.values()) / GIB == pytest.approx(16 * 8.03e9 / 8 / GIB, rel=0.002)
    assert sum(states.values()) / GIB == pytest.approx(14.96, abs=0.01)


def test_activation_formula_matches_hand_count():
    arch = Architecture(layers=1, hidden_size=256, attention_heads=8, kv_heads=2, ffn_size=688, vocab_size=512)
    # Counted with saved_tensors_hooks on transformers' LlamaDecoderLayer (bf16): 10,920 bytes per token.
    assert memory.activation_bytes_per_token(arch, "bf16", "none") == 10920
    # ... and 19,752 bytes per token in fp32.
    assert memory.activation_bytes_per_token(arch, "fp32", "none") == 19752
    assert memory.activation_bytes_per_token(arch, "bf16", "full") == 2 * 256
    assert memory.activation_bytes_per_token(arch, "fp8", "none") == memory.activation_bytes_per_token(arch, "bf16", "none")


def test_llama_8b_breakdown_by_hand():
    arch = catalogs.models()["llama-3.1-8b"].architecture
    s, b = 8192, 2
    est = memory.estimate(arch, precision="bf16", checkpointing="full", sequence_length=s, micro_batch=b, shard_group=8, hbm_bytes=179 * GIB)
    h, V, t = 4096, 128256, s * b
    # With full checkpointing the 4,096-token loss chunk over a 128K vocabulary sets the peak.
    assert est.peak_at == "loss backward"
    assert est.activations == 32 * 2 * h * t + 2 * 2 * 128 * s  # block inputs, RoPE cos and sin
    assert est.logits_and_loss == (4 * h + 4 + 4 * h) * t + 12 * 4096 * V + 2 * h * t
    assert est.unsharded_in_flight == 2 * (arch.root_parameters + arch.layer_parameters) + 2 * V * h
    assert est.gradients == memory.sharded_state_bytes(arch, 8)["grad"]
    assert est.allocated + est.overhead == est.total and est.reserved == est.allocated + est.fragmentation
    unchunked = memory.estimate(arch, precision="bf16", checkpointing="full", sequence_length=s, micro_batch=b, shard_group=8, hbm_bytes=179 * GIB, loss_chunk_tokens=None)
    assert unchunked.logits_and_loss - est.logits_and_loss == 12 * (t - 4096) * V
    # One micro-batch per step: no sharded gradients exist yet when the loss is differentiated.
    single = memory.estimate(arch, precision="bf16", checkpointing="full", sequence_length=s, micro_batch=b, shard_group=8, hbm_bytes=179 * GIB, grad_accum_steps=1)
    assert single.peak_at == "loss backward" and single.gradients == 0


def test_selective_sits_between_none_and_full():
    arch = catalogs.models()["llama-3.1-8b"].architecture
    per_token = {mode: memory.activation_bytes_per_token(arch, "bf16", mode) for mode in ("none", "selective", "full")}
    assert per_token["none"] > per_token["selective"] > per_token["full"]
    # torchtitan's policy keeps the block input, q, v, gate, down and attention's output and log-sum-exp.
    assert per_token["selective"] == 2 * (4096 + 4096 + 1024 + 14336 + 4096 + 4096) + 4 * 32


def test_128k_context_on_h100_needs_context_parallelism():
    kwargs = {"model.catalog": "llama-3.1-8b", "sequence_length": 131072, "budget.global_batch_tokens": 131072 * 8}
    b200 = plan_of(**kwargs)
    assert b200.ok and b200.micro_batch_size == 1
    whole = plan_of(**{**kwargs, "compute.instance_type": "ml.p5.48xlarge", "tuning.context_parallel": 1})
    assert not whole.ok and "does-not-fit" in codes(whole, "error")
    assert "tuning.context_parallel" in next(f for f in whole.errors if f.code == "does-not-fit").fix
    h100 = plan_of(**{**kwargs, "compute.instance_type": "ml.p5.48xlarge"})
    assert h100.ok and h100.context_parallel > 1
    assert h100.decision("tuning.context_parallel").source == "auto"
    config = h100.run_config()
    assert config.parallel.context_parallel == h100.context_parallel
    assert config.parallel.shard_group_size % config.parallel.context_parallel == 0
    ranks = h100.gpus // h100.context_parallel
    assert config.batch.micro_batch_size * 131072 * ranks * config.batch.grad_accum_steps == config.batch.global_batch_tokens


# -- estimates ----------------------------------------------------------------------


def test_estimates_are_consistent():
    plan = plan_of(**{"model.catalog": "llama-3.1-8b", "compute.price_per_hour": 100.0})
    e = plan.estimates
    assert e.tokens_per_second == pytest.approx(e.tokens_per_second_per_gpu * plan.gpus)
    assert e.mfu == pytest.approx(e.flops_per_token * e.tokens_per_second_per_gpu / plan.instance.peak_bf16_flops)
    training = plan.recipe.budget.total_tokens / e.tokens_per_second / 3600
    assert e.probe_hours > 0 and e.wall_time_hours == pytest.approx(training + e.probe_hours)
    assert e.cost_usd == pytest.approx(e.wall_time_hours * plan.nodes * e.price_per_hour)


def test_p5_estimate_agrees_with_the_published_sagemaker_run():
    # AWS's torchtitan post: 4 x ml.p5.48xlarge, Llama 3 8B, 8,192 tokens, per-op SAC, compile: 7,166 tokens/s per GPU.
    plan = plan_of(**{
        "model.catalog": "llama-3.1-8b", "compute.instance_type": "ml.p5.48xlarge", "compute.instance_count": 4,
        "sequence_length": 8192, "budget.global_batch_tokens": 8192 * 64, "tuning.precision": "bf16",
        "tuning.activation_checkpointing": "selective", "tuning.micro_batch_size": 1, "tuning.sharding": "full",
        "tuning.context_parallel": 1,
    })
    # That run's PyTorch ran flash-attention 2 on H100; this container's (torch 2.11) runs cuDNN's
    # attention there, which the model prices faster: above the published figure, by less than a quarter.
    assert 7166 < plan.estimates.tokens_per_second_per_gpu < 7166 * 1.25


def test_ramp_reaches_full_batch_and_total_steps_meet_budget():
    plan = plan_of(**{"model.catalog": "llama-3.1-8b"})
    start, full, steps = plan.ramp_start_accum_steps, plan.grad_accum_steps, plan.ramp_steps
    assert ramp_accum(0, start, full, steps) == start
    assert ramp_accum(steps, start, full, steps) == full
    per_accum = plan.micro_batch_size * plan.recipe.sequence_length * plan.gpus
    tokens = sum(ramp_accum(i, start, full, steps) for i in range(plan.estimates.total_steps)) * per_accum
    assert tokens >= plan.recipe.budget.total_tokens
    assert tokens - plan.recipe.budget.total_tokens < plan.recipe.budget.global_batch_tokens


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_templates_plan_without_errors_or_warnings(path):
    """No warnings but the quotas a default account lacks (tests/planning/test_quotas.py checks those)."""
    plan = plan_file(path)
    assert plan.ok, [f.message for f in plan.errors]
    others = [f for f in plan.warnings if f.code != "quota-needed"]
    assert not others, [f.message for f in others]


def test_templates_cover_every_tier_and_a_p5_variant():
    plans = [plan_file(p) for p in RECIPES]
    assert {p.tier.name for p in plans} == {"small", "medium", "large"}
    assert any(p.instance.family == "p5" for p in plans)
    assert any(p.recipe.sequence_length == 131072 for p in plans)
    assert any(p.sharding == "hybrid" for p in plans)
    assert any(p.parameters > 60e9 and p.nodes >= 4 for p in plans)


def test_findings_point_at_the_recipe_line(tmp_path):
    text = "\n".join([
        "name: line-test",
        "model: {catalog: llama-3.2-1b}",
        "data: {uri: 's3://bucket-for-tests/x/'}",
        "sequence_length: 4096",
        "budget: {total_tokens: 10000000000, global_batch_tokens: 1048576}",
        "compute:",
        "  instance_type: ml.p4d.24xlarge",
        "tuning:",
        "  precision: fp8",
    ])
    recipe, lines = parse_recipe(text, "line.yaml")
    plan = resolve(recipe, source="line.yaml", lines=lines)
    from tiered_training.report import format_finding

    text = format_finding(plan, plan.errors[0])
    assert text.startswith("error: line.yaml:9: tuning.precision:") and text.endswith(" [fp8-unsupported]")


# -- the search ------------------------------------------------------------------------------


def _fastest_by_brute_force(plan):
    """Every configuration of precision, recipe, checkpointing, micro-batch and context
    parallelism for this plan's recipe, evaluated directly: the fastest that fits."""

    recipe, arch = plan.recipe, plan.architecture
    hw = perf.Hardware.of(plan.instance)
    limit = plan.tier.memory_headroom * plan.instance.hbm_bytes
    sequences = recipe.budget.global_batch_tokens // recipe.sequence_length
    best = 0.0
    for precision, fp8_recipe in (("bf16", None), ("fp8", "tensorwise"), ("fp8", "rowwise"), ("fp8", "mxfp8")):
        for ac in ("none", "selective", "full"):
            for cp in (1, 2, 4, 8):
                ranks = plan.gpus // cp
                if sequences % ranks or recipe.sequence_length // cp < 4096 and cp > 1:
                    continue
                per_rank = sequences // ranks
                for mb in (m for m in range(1, per_rank + 1) if per_rank % m == 0 and per_rank // m >= 4):
                    est = memory.estimate(arch, precision=precision, checkpointing=ac, sequence_length=recipe.sequence_length // cp,
                                          micro_batch=mb, shard_group=plan.gpus, hbm_bytes=plan.instance.hbm_bytes)
                    if est.total > limit:
                        continue
                    setting = perf.Setting(precision, ac, mb, plan.gpus, fp8_recipe=fp8_recipe, context_parallel=cp)
                    t = perf.step_time(arch, hw, setting, sequence_length=recipe.sequence_length, gpus=plan.gpus,
                                       accum=per_rank // mb, params=perf.stored_parameters())
                    best = max(best, t.tokens_per_second_per_gpu)
    return best


def test_auto_is_within_five_percent_of_the_fastest_for_8b_on_b200():
    plan = plan_of(**{"model.catalog": "llama-3.1-8b", "sequence_length": 8192, "budget.global_batch_tokens": 4 * 1024 * 1024})
    assert plan.ok
    assert plan.estimates.tokens_per_second_per_gpu >= 0.95 * _fastest_by_brute_force(plan)


def test_strict_keeps_the_tier_and_auto_explains_its_departure():
    kwargs = {"model.catalog": "llama-3.1-8b", "sequence_length": 8192, "budget.global_batch_tokens": 4 * 1024 * 1024}
    strict = plan_of(**kwargs, **{"tuning.follow_tiers": "strict"})
    auto = plan_of(**kwargs)
    assert (strict.precision, strict.activation_checkpointing) == ("fp8", "full")
    assert not strict.departures and "departs-from-tier" not in codes(strict)
    assert auto.estimates.tokens_per_second_per_gpu > strict.estimates.tokens_per_second_per_gpu
    assert auto.activation_checkpointing != "full"
    departure = next(d for d in auto.departures if d.field == "tuning.activation_checkpointing")
    assert departure.tier_value == "full" and departure.gain > 0.02 and departure.margin_gib > 0
    assert "predicted" in auto.decision("tuning.activation_checkpointing").reason
    assert "departs-from-tier" in codes(auto, "info")


def test_explain_shows_step_terms_departures_and_three_alternatives():
    from tiered_training.report import explain_lines

    plan = plan_of(**{"model.catalog": "llama-3.1-8b", "sequence_length": 8192, "budget.global_batch_tokens": 4 * 1024 * 1024})
    text = "\n".join(explain_lines(plan))
    for section in ("Step time, term by term", "compute: GEMMs", "compute: attention", "recomputation",
                    "communication (exposed)", "optimiser step", "Departures from the medium tier", "Next alternatives that fit"):
        assert section in text
    assert len(plan.alternatives) == 3
    assert all(a.memory_fraction <= plan.tier.memory_headroom for a in plan.alternatives)
    speeds = [a.tokens_per_second_per_gpu for a in plan.alternatives]
    assert speeds == sorted(speeds, reverse=True)
    assert sum(t.seconds for t in plan.estimates.step_terms) == pytest.approx(plan.estimates.step_time_seconds, rel=0.02)


def test_fp8_against_a_bf16_tier_must_earn_ten_percent():
    plan = plan_of(**{"model.catalog": "llama-3.2-1b"})  # small tier: BF16
    if plan.precision == "fp8":
        bf16 = max(a.tokens_per_second_per_gpu for a in plan.alternatives if a.precision == "bf16")
        assert plan.estimates.tokens_per_second_per_gpu >= 1.1 * bf16
    assert plan_of(**{"model.catalog": "llama-3.2-1b", "tuning.follow_tiers": "strict"}).precision == "bf16"


def test_errored_plan_is_its_own_type_without_estimates():
    from tiered_training.planning.plan import FailedPlan
    from tiered_training.report import explain_lines, summary_row

    # A recipe that would fit but carries an error still gets no estimates.
    plan = plan_of(**{"compute.spot": True, "compute.max_runtime_hours": 48, "compute.max_wait_hours": 24})
    assert isinstance(plan, FailedPlan) and not plan.ok
    data = plan.to_dict()
    assert data["estimates"] is None and data["memory_gib"] is None and data["ok"] is False
    assert "Estimates" not in "\n".join(explain_lines(plan))
    assert summary_row(plan)["status"] == "1 error(s)"
    unknown = plan_of(**{"model.catalog": "no-such-model"})
    assert isinstance(unknown, FailedPlan) and unknown.tier is None and unknown.to_dict()["model"]["tier"] is None


def test_warmup_tokens_are_tokens_during_the_ramp():
    plan = plan_of(**{"model.catalog": "llama-3.1-8b", "optimizer.warmup_tokens": 3_000_000_000, "budget.total_tokens": 50_000_000_000,
                      "sequence_length": 8192, "budget.global_batch_tokens": 4 * 1024 * 1024})
    assert plan.ramp_steps > 0
    per_accum = plan.micro_batch_size * plan.recipe.sequence_length * plan.gpus // plan.context_parallel
    start, full = plan.ramp_start_accum_steps, plan.grad_accum_steps

    def tokens(steps):
        return sum(ramp_accum(i, start, full, plan.ramp_steps) for i in range(steps)) * per_accum

    assert tokens(plan.warmup_steps) >= 3_000_000_000 > tokens(plan.warmup_steps - 1)
    assert plan.run_config().optimizer.warmup_steps == plan.warmup_steps


def test_long_context_templates_choose_context_parallelism():
    for name in ("llama3-8b-128k-p5.yaml", "dense-32b-128k.yaml"):
        plan = plan_file(RECIPES[0].parent / name)
        assert plan.ok, [f.message for f in plan.errors]
        assert plan.recipe.sequence_length == 131072
        assert plan.context_parallel > 1 and plan.decision("tuning.context_parallel").source == "auto"


def test_explain_compares_every_context_parallel_degree_that_fits():
    """At 128K on one p5 the plan takes the fastest context-parallel degree that fits, and
    explain lists the fastest setting of each other degree beside it."""
    from tiered_training.report import explain_lines

    plan = plan_file(RECIPES[0].parent / "llama3-8b-128k-p5.yaml")
    others = {2, 4, 8} - {plan.context_parallel}
    assert plan.context_parallel in (2, 4, 8) and len(others) == 2
    degrees = {a.context_parallel: a for a in plan.alternatives}
    assert others <= set(degrees)
    assert all(degrees[cp].tokens_per_second_per_gpu < plan.estimates.tokens_per_second_per_gpu for cp in others)
    text = "\n".join(explain_lines(plan))
    assert all(re.search(rf", CP {cp}$", text, re.M) for cp in others)  # the setting ends the line


def test_keep_last_1_warns_that_s3_may_hold_no_complete_checkpoint():
    plan = plan_of(**{"checkpointing.keep_last": 1})
    (finding,) = [f for f in plan.findings if f.code == "keep-last-1"]
    assert plan.ok and finding.severity == "warning" and finding.field == "checkpointing.keep_last"
    assert "no complete checkpoint" in finding.message and "2 or more" in finding.fix
    assert "keep-last-1" not in codes(plan_of(**{"checkpointing.keep_last": 2}))


def test_the_plan_keeps_the_tiers_choice_for_a_gain_below_the_minimum():
    # Llama 3.1 8B on 4 p4d nodes: sharding over all 32 GPUs is predicted a little faster
    # (< 2%) than the tier's node-local hybrid group; too little to leave the tier's advice.
    plan = plan_of(**{"model.catalog": "llama-3.1-8b", "compute.instance_type": "ml.p4d.24xlarge",
                      "compute.instance_count": 4, "budget.global_batch_tokens": 4096 * 1024})
    assert (plan.sharding, plan.shard_group_size) == ("hybrid", 8)
    assert not plan.departures and "departs-from-tier" not in codes(plan)
    faster = [a for a in plan.alternatives if a.tokens_per_second_per_gpu > plan.estimates.tokens_per_second_per_gpu]
    assert faster and all(a.tokens_per_second_per_gpu < 1.02 * plan.estimates.tokens_per_second_per_gpu for a in faster)
    assert faster[0].shard_group_size == 32


def test_explain_states_the_warm_pools_and_bounds_their_idle_cost():
    """The keep-alive the definition sets, and the billed idle time it can cost, are in `explain`; none with spot."""
    from tiered_training.pipeline import definition as d
    from tiered_training.report import explain_lines

    plan = plan_of(**{"compute.instance_count": 2})
    decision = plan.decision("compute.warm_pool_minutes")
    assert decision.value == d.WARM_POOL_SECONDS // 60 == 10
    assert "at most 10 min x 2 instance(s) when the gate or a segment fails, and 1 min x 2 after the run" in decision.reason
    assert any("compute.warm_pool_minutes" in line for line in explain_lines(plan))
    spot = plan_of(**{"compute.instance_count": 2, "compute.spot": True})
    assert spot.decision("compute.warm_pool_minutes").value == 0
