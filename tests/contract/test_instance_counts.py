"""New runs and resumes allow the same instance counts: the plan's ``compute.instance_counts``."""

from __future__ import annotations

import pytest
from support import RECIPES

from tiered_training.contract.world import check_instance_count, planned_world
from tiered_training.planning.planner import plan_file


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_a_resume_is_allowed_on_exactly_the_counts_a_new_run_is(path):
    plan = plan_file(path)
    cfg = plan.run_config()
    gpus = cfg.hardware.gpus_per_node
    saved = planned_world(cfg)  # a run started as planned
    counts = {n for n in range(1, 4 * max(plan.instance_counts) + 1) if check_instance_count(cfg, n * gpus, n) is None}
    assert counts == set(plan.instance_counts)
    resumable = {
        n for n in range(1, 4 * max(plan.instance_counts) + 1) if check_instance_count(cfg, n * gpus, n, saved) is None
    }
    assert resumable == set(plan.instance_counts) | ({saved // gpus} if saved % gpus == 0 else set())


def test_a_resume_on_fewer_hosts_than_the_plan_allows_is_refused_naming_the_counts():
    """qwen2.5-32b-hybrid needs 2 hosts at least: a new run on 1 is refused, and so is a resume on 1."""
    plan = plan_file(next(p for p in RECIPES if p.stem == "qwen2.5-32b-hybrid"))
    cfg = plan.run_config()
    assert 1 not in plan.instance_counts
    new = check_instance_count(cfg, 8, 1)
    resume = check_instance_count(cfg, 8, 1, saved_world=32)
    assert new is not None and resume is not None
    assert resume.startswith(
        "cannot resume the checkpoint of a run on 32 GPUs on 8 GPUs (1 host(s)): the plan needs "
        "at least 2 hosts, as a new run would"
    )
    assert resume.endswith(f"instance counts this plan supports: {', '.join(map(str, plan.instance_counts))}")
    assert check_instance_count(cfg, 16, 2, saved_world=32) is None
