"""A run's identity (what a resume must match) and its reported MFU, from a planned RunConfig."""

from __future__ import annotations

import pytest
from support import recipe_dict

from tiered_training.planning.planner import resolve
from tiered_training.recipe import Recipe


def config():
    return resolve(Recipe.model_validate(recipe_dict())).run_config()


def test_the_models_display_name_is_not_part_of_the_identity():
    cfg = config()
    renamed = cfg.model_copy(update={"model": cfg.model.model_copy(update={"name": "another name"})})
    assert renamed.identity_parts() == cfg.identity_parts() and renamed.plan_hash() == cfg.plan_hash()


def test_identity_hashes_are_twelve_hex_digits():
    cfg = config()
    parts = cfg.identity_parts()
    assert list(parts) == ["model", "batch", "data"]
    for value in [*parts.values(), cfg.plan_hash()]:
        assert len(value) == 12 and int(value, 16) >= 0


def test_mfu_counts_full_or_causal_attention():
    cfg = config()
    s, tps = cfg.batch.sequence_length, 1000.0
    full = cfg.model.flops_per_token(s) * tps / cfg.hardware.peak_bf16_flops
    causal = cfg.model.flops_per_token(s, causal=True) * tps / cfg.hardware.peak_bf16_flops
    assert causal < full
    assert cfg.mfu(tps) == pytest.approx(full, rel=1e-12)
    assert cfg.mfu(tps, causal=True) == pytest.approx(causal, rel=1e-12)
