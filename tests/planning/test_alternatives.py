"""``explain``'s "Next alternatives that fit": the next fastest configurations in order, none skipped. For every
template, every configuration the search found to fit that is faster than the third alternative listed is listed
(the plan's own excepted)."""

from __future__ import annotations

import pytest
from support import RECIPES

from tiered_training.planning import choice
from tiered_training.planning.planner import plan_file


def _config(c) -> tuple:
    return (c.precision, c.fp8_recipe, c.activation_checkpointing, c.shard_group_size, c.context_parallel,
            c.micro_batch_size)


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_no_faster_fitting_configuration_is_left_out(path, monkeypatch):
    seen = {}
    original = choice._alternatives

    def spy(fitting, chosen, *args, **kwargs):
        seen["fitting"], seen["chosen"] = fitting, chosen
        return original(fitting, chosen, *args, **kwargs)

    monkeypatch.setattr(choice, "_alternatives", spy)
    plan = plan_file(path)
    alternatives = list(plan.alternatives)
    speeds = [a.tokens_per_second_per_gpu for a in alternatives]
    assert speeds == sorted(speeds, reverse=True), speeds
    listed = [_config(a) for a in alternatives]
    assert len(set(listed)) == len(listed), "a configuration listed twice"
    fitting = [o.alternative() for o in seen["fitting"]]
    own = _config(seen["chosen"].alternative())
    assert own not in listed, "the plan's own configuration is no alternative"
    others = {_config(a) for a in fitting} - {own}
    assert len(alternatives) >= min(3, len(others))
    if not alternatives:
        return
    # The next three fastest; a plan that splits sequences adds the fastest at each other degree, slower than those.
    third = speeds[min(3, len(speeds)) - 1]
    for option in fitting:
        if option.tokens_per_second_per_gpu > third and _config(option) != own:
            assert _config(option) in listed, (path.name, option)


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_each_predicted_speed_prints_one_way(path):
    """The plan's tokens/s per GPU and each probe candidate's appear in `explain` as one figure each: never also as
    the figure one above or below (two roundings of one value), unless that is another listed configuration's own."""
    from typer.testing import CliRunner

    from tiered_training.cli.app import app

    text = CliRunner().invoke(app, ["explain", str(path)], env={"COLUMNS": "100"}).stdout
    plan = plan_file(path)
    speeds = {plan.estimates.tokens_per_second_per_gpu} | {c.tokens_per_second_per_gpu for c in plan.candidates}
    listed = speeds | {a.tokens_per_second_per_gpu for a in plan.alternatives}
    for speed in speeds:
        shown = f"{speed:,.0f}"
        assert shown in text, (shown, path.name)
        for neighbour in (round(speed) - 1, round(speed) + 1):
            if neighbour not in {round(s) for s in listed}:
                assert f"{neighbour:,}" not in text, (speed, neighbour, path.name)
