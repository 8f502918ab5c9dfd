"""Template comments say what the planner picks today.

Each template's opening comment ends with a ``# Plan today:`` line naming the decisions
(precision, activation checkpointing, sharding, micro-batch, context parallelism), and its
prose may name decisions too ("the planner picks FP8", "full checkpointing", "splits each
sequence"). Both must match the plan; when the planner changes its mind, this test names the
template and the line to write.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tiered_training.planning.planner import plan_file

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((REPO / "recipes").glob("*.yaml"))


def plan_line(cfg) -> str:
    """The ``# Plan today:`` line for a plan's RunConfig."""
    p, b, pr = cfg.parallel, cfg.batch, cfg.precision
    precision = pr.precision + (f" {pr.fp8_recipe}" if pr.precision == "fp8" and pr.fp8_recipe else "")
    sharding = {"full": f"full sharding (groups of {p.shard_group_size} GPUs)",
                "hybrid": f"hybrid sharding (groups of {p.shard_group_size} GPUs)", "none": "no sharding"}[p.sharding]
    ramp = ", batch ramp" if b.ramp_start_accum_steps else ""
    return (f"# Plan today: {precision}, activation checkpointing {pr.activation_checkpointing}, {sharding}, "
            f"micro-batch {b.micro_batch_size}, context parallel {p.context_parallel}{ramp}.")


def header(path: Path) -> str:
    """The opening comment block, as one string of sentences."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


# Prose that names a decision: (pattern, what the plan must have for it to be true).
CLAIMS = [
    (r"\b(?:picks|chooses|keeps)\s+FP8\b", lambda c: c.precision.precision == "fp8"),
    (r"\b(?:picks|chooses|keeps|in)\s+BF16\b", lambda c: c.precision.precision == "bf16"),
    (r"\b(?:picks|chooses|fit:)\s[^.;]*?\bfull (?:activation )?checkpointing", lambda c: c.precision.activation_checkpointing == "full"),
    (r"\b(?:picks|chooses|fit:)\s[^.;]*?\bselective (?:activation )?checkpointing", lambda c: c.precision.activation_checkpointing == "selective"),
    (r"\bno (?:activation )?checkpointing\b|\bwithout recomputation\b", lambda c: c.precision.activation_checkpointing == "none"),
    (r"\bsplits each sequence\b", lambda c: c.parallel.context_parallel > 1),
    (r"\bhybrid sharding\b", lambda c: c.parallel.sharding == "hybrid"),
    (r"\bbatch ramp\b", lambda c: bool(c.batch.ramp_start_accum_steps)),
]


@pytest.fixture(scope="module")
def plans():
    return {path.name: plan_file(path).run_config() for path in TEMPLATES}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_plan_line_matches_the_plan(path, plans):
    expected = plan_line(plans[path.name])
    written = [line for line in path.read_text().splitlines() if line.startswith("# Plan today:")]
    assert written == [expected], f"{path.name}: write\n{expected}"


# Prose that names a number the plan decides: (pattern with the number as group 1, the plan's number).
NUMBERS = [
    (r"\bmicro-batch (?:of |size )?(\d+)\b", lambda c: c.batch.micro_batch_size),
    (r"\bcontext parallel(?:ism)? (?:of |degree )?(\d+)\b", lambda c: c.parallel.context_parallel),
    (r"\bgroups of (\d+) GPUs\b", lambda c: c.parallel.shard_group_size),
]


def wrong_claims(text: str, cfg) -> list[str]:
    wrong = [pattern for pattern, holds in CLAIMS if re.search(pattern, text) and not holds(cfg)]
    for pattern, number in NUMBERS:
        wrong += [f"{m.group(0)} (the plan: {number(cfg)})" for m in re.finditer(pattern, text)
                  if int(m.group(1)) != number(cfg)]
    return wrong


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_prose_names_only_decisions_the_plan_makes(path, plans):
    text = header(path).replace(header_plan_line(path), "")
    wrong = wrong_claims(text, plans[path.name])
    assert not wrong, f"{path.name}: the comment says {wrong}, the plan says: {plan_line(plans[path.name])}"


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_a_micro_batch_in_the_prose_is_the_plans(path, plans):
    """A template's prose that states the micro-batch (``at micro-batch 2 ...``) states the plan's."""
    text = header(path).replace(header_plan_line(path), "")
    stated = {int(n) for n in re.findall(r"\bmicro-batch (\d+)\b", text)}
    planned = plans[path.name].batch.micro_batch_size
    assert stated <= {planned}, f"{path.name}: the comment says micro-batch {sorted(stated)}, the plan {planned}"


def header_plan_line(path: Path) -> str:
    return next((line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("# Plan today:")), "")


def test_the_rules_catch_a_stale_comment(plans):
    """The flagship's old opening comment (full checkpointing) against today's plan (none)."""
    stale = "The planner picks FP8 (tensorwise), full activation checkpointing and a batch ramp"
    cfg = plans["llama3-8b-fp8.yaml"]
    assert cfg.precision.activation_checkpointing != "full"
    assert wrong_claims(stale, cfg)
    # and a number the plan no longer picks, one line above the plan line that says otherwise
    assert cfg.batch.micro_batch_size != 2
    assert wrong_claims("at micro-batch 2 the activations fit in 179 GiB without recomputation", cfg)
