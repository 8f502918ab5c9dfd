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


@pytest.mark.parametrize("model", ["llama-3.2-1b", "llama-3.1-8b"])
@pytest.mark.parametrize("instance", ["ml.p5.48xlarge", "ml.p6-b200.48xlarge"])
def test_an_fp8_plan_at_8k_measures_bf16_and_no_context_parallelism(model, instance):
    plan = plan_of(**{"model.catalog": model, "sequence_length": 8192, "budget.global_batch_tokens": 8192 * 128,
                      "compute.instance_type": instance})
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
