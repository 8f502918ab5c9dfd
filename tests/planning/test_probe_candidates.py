"""What the probe measures: the decisions the model is least sure of. An FP8 plan measures the fastest BF16 that
fits; context parallelism is not measured where the sequence fits without it; each candidate says why it is there."""

from __future__ import annotations

import pytest
import yaml
from support import RECIPES, recipe_dict

from tiered_training import report
from tiered_training.planning.planner import plan_file, resolve
from tiered_training.recipe.loader import parse_recipe


def plan_of(**overrides):
    recipe, lines = parse_recipe(yaml.safe_dump(recipe_dict(**overrides), sort_keys=False), "r.yaml")
    return resolve(recipe, source="r.yaml", lines=lines)


@pytest.mark.parametrize("model", ["llama-3.2-3b", "llama-3.1-8b"])
@pytest.mark.parametrize("instance", ["ml.p5.48xlarge", "ml.p6-b200.48xlarge"])
def test_an_fp8_plan_at_8k_measures_bf16_and_no_context_parallelism(model, instance):
    plan = plan_of(
        **{
            "model.catalog": model,
            "sequence_length": 8192,
            "budget.global_batch_tokens": 8192 * 128,
            "compute.instance_type": instance,
        }
    )
    assert plan.ok and plan.precision == "fp8" and len(plan.candidates) == 3
    # CP 2 was a candidate here: at 8K every configuration fits without it, and the ring only adds work
    assert {c.context_parallel for c in plan.candidates} == {1}
    reason = plan.decision("tuning.probe_candidates").reason
    assert "no context-parallel candidate: the sequence fits without it" in reason
    assert "an FP8 plan measures the fastest BF16" in reason
    (bf16,) = [c for c in plan.candidates if c.precision == "bf16"]
    assert bf16.why.startswith("BF16 against the plan's FP8, where the model errs most: the fastest BF16 that fits")
    assert f"{bf16.tokens_per_second_per_gpu:,.0f} tokens/s per GPU predicted" in bf16.why
    assert plan.candidates[0].why == "the plan's own configuration"


def test_context_parallel_candidates_stay_where_the_sequence_needs_them():
    plan = plan_file(next(r for r in RECIPES if r.name == "llama3-8b-128k-p5.yaml"))
    assert plan.ok and all(c.context_parallel > 1 for c in plan.candidates)


# What the probe measures for each template, and why (the reason's first clause; explain prints it whole).
# A change to the model's calibration or to the templates may change it: update it with the change.
TEMPLATE_CANDIDATES = {
    "dense-32b-128k.yaml": [
        ("fp8/tensorwise", "full", "hybrid/8", 2, "the plan's own configuration"),
        ("fp8/tensorwise", "full", "full/16", 2, "the sharding group in doubt"),
        ("bf16", "full", "hybrid/8", 2, "BF16 against the plan's FP8, where the model errs most"),
    ],
    "dense-64b.yaml": [
        ("fp8/tensorwise", "none", "full/64", 1, "the plan's own configuration"),
        ("fp8/mxfp8", "none", "full/64", 1, "the next fastest that can win"),
        ("bf16", "selective", "hybrid/32", 1, "BF16 against the plan's FP8, where the model errs most"),
    ],
    "llama3-1b-bf16.yaml": [
        ("bf16", "none", "full/8", 1, "the plan's own configuration"),
        ("bf16", "selective", "full/8", 1, "the activation checkpointing in doubt"),
    ],
    "llama3-1b-raw-mixture.yaml": [
        ("bf16", "none", "full/8", 1, "the plan's own configuration"),
        ("bf16", "selective", "full/8", 1, "the activation checkpointing in doubt"),
    ],
    "llama3-8b-128k-p5.yaml": [
        ("fp8/tensorwise", "full", "full/8", 2, "the plan's own configuration"),
        ("bf16", "full", "full/8", 2, "BF16 against the plan's FP8, where the model errs most"),
        ("fp8/tensorwise", "selective", "full/8", 8, "the activation checkpointing in doubt"),
        ("fp8/tensorwise", "full", "full/8", 4, "the next fastest that can win"),
    ],
    "llama3-8b-128k.yaml": [
        ("fp8/tensorwise", "none", "full/8", 4, "the plan's own configuration"),
        ("fp8/tensorwise", "full", "full/8", 1, "the activation checkpointing in doubt"),
        ("fp8/mxfp8", "full", "full/8", 1, "the next fastest that can win"),
        ("bf16", "full", "full/8", 1, "BF16 against the plan's FP8, where the model errs most"),
    ],
    "llama3-8b-fp8-p5.yaml": [
        ("fp8/tensorwise", "none", "hybrid/8", 1, "the plan's own configuration"),
        ("fp8/tensorwise", "none", "full/16", 1, "the sharding group in doubt"),
        ("fp8/tensorwise", "selective", "hybrid/8", 1, "the activation checkpointing in doubt"),
        ("bf16", "none", "hybrid/8", 1, "BF16 against the plan's FP8, where the model errs most"),
    ],
    "llama3-8b-fp8.yaml": [
        ("fp8/tensorwise", "none", "full/8", 1, "the plan's own configuration"),
        ("fp8/mxfp8", "none", "full/8", 1, "the next fastest that can win"),
        ("bf16", "none", "full/8", 1, "BF16 against the plan's FP8, where the model errs most"),
    ],
    "llama3.1-8b-sft.yaml": [
        ("fp8/tensorwise", "none", "full/8", 1, "the plan's own configuration"),
        ("fp8/mxfp8", "none", "full/8", 1, "the next fastest that can win"),
        ("bf16", "none", "full/8", 1, "BF16 against the plan's FP8, where the model errs most"),
    ],
    "llama3.1-8b-dpo.yaml": [
        ("fp8/tensorwise", "none", "full/8", 1, "the plan's own configuration"),
        ("fp8/tensorwise", "selective", "full/8", 1, "the activation checkpointing in doubt"),
        ("bf16", "none", "full/8", 1, "BF16 against the plan's FP8, where the model errs most"),
    ],
    "llama3.1-8b-tools-sft.yaml": [
        ("fp8/tensorwise", "none", "full/8", 1, "the plan's own configuration"),
        ("fp8/mxfp8", "none", "full/8", 1, "the next fastest that can win"),
        ("bf16", "none", "full/8", 1, "BF16 against the plan's FP8, where the model errs most"),
    ],
    "qwen2.5-14b-fp8.yaml": [
        ("fp8/tensorwise", "none", "hybrid/8", 1, "the plan's own configuration"),
        ("fp8/tensorwise", "none", "full/16", 1, "the sharding group in doubt"),
        ("fp8/tensorwise", "selective", "full/16", 1, "the activation checkpointing in doubt"),
        ("bf16", "none", "full/16", 1, "BF16 against the plan's FP8, where the model errs most"),
    ],
    "qwen2.5-32b-hybrid.yaml": [
        ("fp8/tensorwise", "none", "hybrid/16", 1, "the plan's own configuration"),
        ("fp8/mxfp8", "none", "hybrid/16", 1, "the next fastest that can win"),
        ("bf16", "selective", "hybrid/8", 1, "BF16 against the plan's FP8, where the model errs most"),
    ],
    "qwen2.5-32b-lora-dpo.yaml": [
        ("fp8/tensorwise", "none", "full/8", 1, "the plan's own configuration"),
        ("fp8/tensorwise", "selective", "full/8", 1, "the activation checkpointing in doubt"),
        ("bf16", "none", "full/8", 1, "BF16 against the plan's FP8, where the model errs most"),
    ],
    "qwen2.5-32b-lora.yaml": [
        ("fp8/tensorwise", "selective", "full/8", 1, "the plan's own configuration"),
        ("fp8/tensorwise", "full", "full/8", 1, "the activation checkpointing in doubt"),
        ("bf16", "selective", "full/8", 1, "BF16 against the plan's FP8, where the model errs most"),
    ],
}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_the_probe_candidates_of_every_template(path):
    plan = plan_file(path)
    found = [
        (
            c.precision + (f"/{c.fp8_recipe}" if c.fp8_recipe else ""),
            c.activation_checkpointing,
            f"{c.sharding}/{c.shard_group_size}",
            c.context_parallel,
            c.why.split(":")[0],
        )
        for c in plan.candidates
    ]
    assert found == TEMPLATE_CANDIDATES[path.name]
    assert set(TEMPLATE_CANDIDATES) == {r.name for r in RECIPES}


def test_a_candidate_is_measured_only_where_the_model_doubts_the_decision():
    """Every candidate but an FP8 plan's BF16 can win by the model's own held-out bounds: its highest measured
    speed reaches the plan's lowest; each says both ranges."""
    for path in RECIPES:
        plan = plan_file(path)
        chosen = plan.candidates[0]
        for c in plan.candidates[1:]:
            if c.why.startswith("BF16 against"):
                continue
            assert c.tokens_per_second_per_gpu_range[1] >= chosen.tokens_per_second_per_gpu_range[0], (path.name, c)
            low, high = c.tokens_per_second_per_gpu_range
            assert f"puts it at {low:,.0f}-{high:,.0f}" in c.why


def test_a_configuration_beyond_the_models_error_is_not_measured(monkeypatch):
    """With a model held out to within 1%, only configurations within about 2% of the plan's can win: the
    others are not measured (an FP8 plan's BF16 excepted), and the decision says how many."""
    from tiered_training.planning import uncertainty

    narrow = uncertainty.Range(low=-0.01, high=0.01, basis="held-out errors within 1%")
    monkeypatch.setattr(uncertainty, "range_for", lambda kind, runs: narrow)
    plan = plan_file(next(r for r in RECIPES if r.name == "llama3-8b-fp8.yaml"))
    chosen = plan.candidates[0]
    for c in plan.candidates[1:]:
        if not c.why.startswith("BF16 against"):
            assert c.tokens_per_second_per_gpu >= chosen.tokens_per_second_per_gpu * 0.99 / 1.01
    (bf16,) = [c for c in plan.candidates if c.precision == "bf16"]
    assert bf16.why.endswith("measured although it cannot win by these bounds, as every FP8 plan does")
    assert "slower beyond the model's error are not measured" in plan.decision("tuning.probe_candidates").reason


def test_a_32b_plan_at_128k_measures_another_sharding_group_and_another_degree_only_where_it_can_win():
    """The 32B 128K plan measures another sharding group; another context-parallel degree only where its
    predicted margin lies inside the model's held-out error (with the ring's work counted, CP 4 is more than
    that error behind CP 2 there; the 8B 128K template, whose degrees are closer, measures one)."""
    plan = plan_file(next(r for r in RECIPES if r.name == "dense-32b-128k.yaml"))
    chosen = plan.candidates[0]
    assert any(c.why.startswith("the sharding group in doubt") for c in plan.candidates)
    for c in plan.candidates[1:]:
        if c.context_parallel != chosen.context_parallel:
            assert c.why.startswith("the context-parallel degree in doubt")
    assert any(
        c.context_parallel != candidates[0].context_parallel
        for path in RECIPES
        if path.name.startswith("llama3-8b-128k")
        for candidates in [plan_file(path).candidates]
        for c in candidates
    )


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_template_says_why_it_measures_each_candidate(path):
    plan = plan_file(path)
    assert plan.ok, plan.errors
    assert plan.candidates[0].why == "the plan's own configuration"
    assert all(c.why for c in plan.candidates)
    if plan.precision == "fp8" and plan.recipe.tuning.precision == "auto" and len(plan.candidates) > 1:
        assert any(c.precision == "bf16" for c in plan.candidates), "an FP8 template measures BF16"
    lines = [str(line) for line in report.explain_lines(plan)]
    text = " ".join(" ".join(line.split()) for line in lines)
    for c in plan.candidates:
        assert " ".join(c.why.split()) in text
