"""Every plan a user reads, whole: for each template and for recipes that reach each of the
planner's findings, ``plan --json``'s content (decisions with their reasons, findings with their
fixes, estimates, alternatives, segments) equals the reviewed copy in ``tests/golden/plans.json``.

A change of wording, of a number in a message or of a decision shows here as a diff that a
reviewer reads. Floats are compared to 6 significant digits (the models are pure Python; the
last digits may differ with the C library's ``log``/``exp``). The copy is never written by the
test run: ``make snapshots`` (``UPDATE_GOLDEN=1``) rewrites it after a change that is meant."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest
from support import DELETE, RECIPES, recipe_dict, rounded

from tiered_training.planning.planner import plan_file, resolve
from tiered_training.recipe import Recipe

GOLDEN = Path(__file__).parents[1] / "golden" / "plans.json"

# Recipes built to reach the findings no template has (a template is a plan that works).
SFT = {"task": "sft", "model.init_checkpoint": "s3://bucket-for-tests/hf/base/", "sequence_length": 8192,
       "budget.total_tokens": 200_000_000, "budget.global_batch_tokens": 8192 * 64}
CRAFTED: dict[str, dict] = {
    "pinned-does-not-fit": {"model.catalog": "llama-3.1-8b", "sequence_length": 65536,
                            "budget.global_batch_tokens": 65536 * 64, "compute.instance_type": "ml.p5.48xlarge",
                            "tuning.activation_checkpointing": "none", "tuning.micro_batch_size": 2,
                            "tuning.sharding": "full"},
    "too-big-for-one-node": {"model.catalog": "llama-3.1-70b", "compute.instance_type": "ml.p5.48xlarge",
                             "tuning.precision": "bf16"},
    "keep-last-1-and-spot": {"checkpointing.keep_last": 1, "compute.spot": True, "compute.max_wait_hours": 1},
    "runtime-above-quota": {"compute.max_runtime_hours": 200},
    "max-wait-without-spot": {"compute.max_wait_hours": 30},
    "unknown-model": {"model.catalog": "llama-3.1-8"},
    "unknown-instance": {"compute.instance_type": "ml.p5.24xlarge"},
    "pins-against-the-tier": {"model.catalog": "llama-3.1-8b", "tuning.precision": "bf16",
                              "tuning.activation_checkpointing": "none", "tuning.batch_ramp": False},
    "short-budget": {"budget.total_tokens": 4096 * 256 * 3},
    "two-nodes-hybrid": {"model.catalog": "llama-3.1-8b", "compute.instance_count": 2, "tuning.sharding": "hybrid"},
    "runtime-too-short": {"compute.max_runtime_hours": 0.25},
    "too-many-segments": {"model.catalog": "llama-3.1-8b", "budget.total_tokens": 2_000_000_000_000,
                          "compute.max_runtime_hours": 6},
    "segmented": {"compute.max_runtime_hours": 4},
    "unsharded-8b-on-a100": {"model.catalog": "llama-3.1-8b", "compute.instance_type": "ml.p4d.24xlarge",
                             "tuning.precision": "bf16", "tuning.sharding": "none"},
    "pinned-group-32b": {"model.catalog": "qwen2.5-32b", "compute.instance_type": "ml.p4d.24xlarge",
                         "tuning.precision": "bf16", "compute.instance_count": 2, "tuning.sharding": "hybrid",
                         "tuning.shard_group_size": 8},
    "pinned-70b-needs-nodes": {"model.catalog": "llama-3.1-70b", "compute.instance_type": "ml.p4d.24xlarge",
                               "tuning.precision": "bf16", "tuning.micro_batch_size": 2,
                               "tuning.activation_checkpointing": "none"},
    "70b-128k-a100": {"model.catalog": "llama-3.1-70b", "compute.instance_type": "ml.p4d.24xlarge",
                      "tuning.precision": "bf16", "sequence_length": 131072, "budget.global_batch_tokens": 131072 * 16,
                      "tuning.context_parallel": 1},
    "lora-priced": {**SFT, "model.catalog": "qwen2.5-32b", "tuning.adapter": "lora", "compute.price_per_hour": 60.0},
    "lora-unsharded": {**SFT, "model.catalog": "qwen2.5-32b", "tuning.adapter": "lora", "tuning.sharding": "none"},
    "precision-departs-3b": {"model.catalog": "llama-3.2-3b", "sequence_length": 2048, "budget.global_batch_tokens": 2048 * 256},
    "precision-departs-7b-32k": {"model.catalog": "mistral-7b", "compute.instance_type": "ml.p5.48xlarge",
                                 "sequence_length": 32768, "budget.global_batch_tokens": 32768 * 256},
    "fp8-rowwise-pinned": {"model.catalog": "llama-3.1-8b", "tuning.precision": "fp8", "tuning.fp8_recipe": "rowwise"},
    "ramp-spec": {"model.catalog": "llama-3.1-8b", "tuning.batch_ramp": {"start_fraction": 0.5, "ramp_fraction": 0.05}},
    "nothing-to-ramp": {"model.catalog": "llama-3.1-8b", "budget.global_batch_tokens": 4096 * 8, "tuning.micro_batch_size": 1},
    "shard-group-not-divisor": {"tuning.shard_group_size": 3},
    "sharding-names-the-other-kind": {"model.catalog": "llama-3.1-8b", "compute.instance_count": 2, "tuning.sharding": "full",
                                      "tuning.shard_group_size": 8},
    "hybrid-on-one-node": {"tuning.sharding": "hybrid"},
    "cp-with-sft": {**SFT, "model.catalog": "llama-3.1-8b", "tuning.context_parallel": 2},
    "cp-bad-degree": {"sequence_length": 32768, "budget.global_batch_tokens": 32768 * 64, "tuning.context_parallel": 3},
    "cp-without-sharding": {"sequence_length": 32768, "budget.global_batch_tokens": 32768 * 64, "tuning.context_parallel": 2,
                            "tuning.sharding": "none"},
    "sft-full-against-tier": {**SFT, "model.catalog": "qwen2.5-32b", "tuning.adapter": "none", "compute.instance_count": 2},
    "sft-adapter-export": {**SFT, "model.catalog": "llama-3.1-8b", "export.format": "adapter"},
    "sft-lora-section": {**SFT, "model.catalog": "llama-3.1-8b", "tuning.adapter": "lora", "data.loss_on": "all", "data.overlong": "drop",
                         "tuning.lora": {"rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}},
    "batch-not-divisible": {"budget.global_batch_tokens": 4096 * 250},
    "micro-batch-not-divisor": {"tuning.micro_batch_size": 3},
    "fp8-tier-on-a100": {"model.catalog": "llama-3.1-8b", "compute.instance_type": "ml.p4d.24xlarge"},
    "explicit-dimensions": {"model.catalog": DELETE, "model.name": "llama3-shaped-20-layers",
                            "model.dimensions": {"layers": 20, "hidden_size": 4096, "attention_heads": 32, "kv_heads": 8,
                                                 "ffn_size": 14336, "vocab_size": 128256}},
    # A local config.json (meta-llama/Llama-3.1-8B's, less the fields the planner ignores), relative to the recipe.
    "hf-config": {"model.catalog": DELETE, "model.hf_config": "tests/golden/hf/llama-3.1-8b"},
    "hf-config-missing": {"model.catalog": DELETE, "model.hf_config": "tests/golden/hf/no-such-model"},
    # Findings and reasons the recipes above do not reach.
    "fp8-recipe-at-bf16": {"tuning.precision": "bf16", "tuning.fp8_recipe": "rowwise"},
    "outside-tiers-acknowledged": {"model.catalog": "llama-3.1-70b", "model.allow_outside_tiers": True,
                                   "compute.instance_count": 4},
    "longer-than-the-model": {"model.catalog": "mistral-7b", "sequence_length": 65536,
                              "budget.global_batch_tokens": 65536 * 64},
    "sft-full-32b-one-node": {**SFT, "model.catalog": "qwen2.5-32b", "tuning.adapter": "none"},
    "fp8-small-model": {"model.catalog": "llama-3.2-1b", "tuning.precision": "fp8"},
    "hybrid-group-pinned": {"model.catalog": "llama-3.1-8b", "compute.instance_count": 2, "tuning.sharding": "hybrid",
                            "tuning.shard_group_size": 8},
    "cp-pinned": {"model.catalog": "llama-3.1-8b", "sequence_length": 65536, "budget.global_batch_tokens": 65536 * 64,
                  "tuning.context_parallel": 4},
    "32k-small-model": {"model.catalog": "llama-3.2-1b", "sequence_length": 32768, "budget.global_batch_tokens": 32768 * 64},
    "3b-128k-no-cp": {"model.catalog": "llama-3.2-3b", "sequence_length": 131072, "budget.global_batch_tokens": 131072 * 16,
                      "tuning.context_parallel": 1},
    "fewer-sequences-than-gpus": {"model.catalog": "llama-3.1-8b", "sequence_length": 65536,
                                  "budget.global_batch_tokens": 65536 * 4},
}


def _plan(name: str) -> dict:
    if name.startswith("recipes/"):
        plan = plan_file(name)  # a path relative to the checkout, where each test runs (the fixture below)
    else:
        plan = resolve(Recipe.model_validate(recipe_dict(**CRAFTED[name])), source=f"{name}.yaml")
    return rounded(json.loads(json.dumps(plan.to_dict())))


NAMES = [f"recipes/{p.name}" for p in RECIPES] + list(CRAFTED)


@pytest.fixture(autouse=True)
def _in_the_checkout(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])


@functools.cache
def _golden() -> dict:
    """The reviewed copy, read once (written first under UPDATE_GOLDEN)."""
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({name: _plan(name) for name in NAMES}, indent=1, sort_keys=True) + "\n")
    assert GOLDEN.exists(), "tests/golden/plans.json is missing: make snapshots writes it"
    return json.loads(GOLDEN.read_text())


def test_the_golden_copy_covers_every_template_and_crafted_recipe():
    assert set(_golden()) == set(NAMES)


# Each test plans its own recipe (no shared fixture): mutation testing (scripts/mutation.py)
# records which test reaches which function.
@pytest.mark.parametrize("name", NAMES)
def test_plan_is_the_reviewed_one(name):
    golden = _golden()
    assert name in golden, f"{name} has no reviewed plan: make snapshots writes it"
    assert _plan(name) == golden[name]


@pytest.mark.parametrize("name, codes", [
    ("pinned-does-not-fit", {"does-not-fit"}),
    ("too-big-for-one-node", {"does-not-fit"}),
    ("keep-last-1-and-spot", {"keep-last-1", "spot-max-wait"}),
    ("runtime-above-quota", {"runtime-above-quota"}),
    ("max-wait-without-spot", {"max-wait-without-spot"}),
    ("unknown-model", {"unknown-model"}),
    ("unknown-instance", {"unknown-instance"}),
    ("runtime-too-short", {"runtime-too-short"}),
    ("too-many-segments", {"too-many-segments"}),
    ("unsharded-8b-on-a100", {"does-not-fit"}),
    ("pinned-group-32b", {"does-not-fit"}),
    ("pinned-70b-needs-nodes", {"does-not-fit"}),
    ("70b-128k-a100", {"does-not-fit"}),
    ("lora-priced", {"full-parameter-alternative"}),
    ("lora-unsharded", {"full-parameter-alternative"}),
    ("shard-group-not-divisor", {"shard-group"}),
    ("sharding-names-the-other-kind", {"shard-group"}),
    ("hybrid-on-one-node", {"shard-group"}),
    ("cp-with-sft", {"context-parallel"}),
    ("cp-bad-degree", {"context-parallel"}),
    ("cp-without-sharding", {"context-parallel"}),
    ("sft-full-against-tier", {"against-tier"}),
    ("batch-not-divisible", {"batch-not-divisible"}),
    ("micro-batch-not-divisor", {"micro-batch"}),
    ("hf-config-missing", {"hf-config"}),
])
def test_the_crafted_recipes_reach_the_findings_they_are_for(name, codes):
    assert codes <= {f["code"] for f in _plan(name).get("findings", [])}
