"""The alternatives ``explain`` lists: no fitting configuration faster than the slowest listed is left out,
the probe's candidates included."""

from __future__ import annotations

from dataclasses import dataclass

from tiered_training.planning.planner import _alternatives


@dataclass(frozen=True)
class Setting:
    precision: str
    checkpointing: str
    micro_batch: int
    fp8_recipe: str | None = None
    shard_group: int = 8
    context_parallel: int = 1


@dataclass(eq=False)
class FakeOption:
    setting: Setting
    speed: float

    def alternative(self) -> tuple[Setting, float]:
        return self.setting, self.speed


def test_a_probe_candidate_faster_than_a_listed_alternative_is_listed():
    chosen = FakeOption(Setting("fp8", "none", 4), 24_779)
    smaller = FakeOption(Setting("fp8", "none", 2), 22_501)  # the chosen one's kind: not a distinct alternative
    fitting = [
        chosen,
        FakeOption(Setting("fp8", "none", 4, fp8_recipe="mxfp8"), 24_492),
        smaller,
        FakeOption(Setting("fp8", "selective", 4), 21_951),
        FakeOption(Setting("fp8", "selective", 4, fp8_recipe="mxfp8"), 21_690),
        FakeOption(Setting("bf16", "none", 2), 18_626),
    ]
    speeds = [speed for _, speed in _alternatives(fitting, chosen)]
    assert speeds == [24_492, 21_951, 21_690]  # one per kind
    probed = [speed for _, speed in _alternatives(fitting, chosen, also=[chosen, fitting[1], smaller])]
    assert probed == [24_492, 22_501, 21_951, 21_690]  # fastest first, the probe's 22,501 in its place
    slower = [speed for _, speed in _alternatives(fitting, chosen, also=[chosen, fitting[5]])]
    assert slower == [24_492, 21_951, 21_690]  # a slower candidate adds nothing


def test_a_figure_rounds_once_wherever_explain_prints_it():
    """Each probe candidate's speed prints as one figure: in the probe's decision, in its reasons and in its
    table (the plan stores 0.1 tokens/s; a second rounding from the unrounded speed gave 22,501 and 22,502)."""
    import re

    from support import RECIPES

    from tiered_training.planning.planner import plan_file

    for path in RECIPES:
        plan = plan_file(path)
        printed = [f"{c.tokens_per_second_per_gpu:,.0f}" for c in plan.candidates]
        for c in plan.to_dict()["candidates"]:
            for figure in re.findall(r"([\d,]+) tokens/s per GPU predicted", c.get("why") or ""):
                assert figure in printed, (path, figure, printed)
        (decision,) = [d for d in plan.to_dict()["decisions"] if d["field"] == "tuning.probe_candidates"]
        figures = re.findall(r"\d{1,3}(?:,\d{3})+", decision["reason"])
        assert figures == printed[: len(figures)], (path, decision["reason"], printed)
