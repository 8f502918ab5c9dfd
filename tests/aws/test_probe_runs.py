"""The Probe job's final metrics read back per candidate, in the formats the container prints
(tiered_training/contract/metrics.py), and set against the plan's predictions."""

from __future__ import annotations

import re

from support import recipe_dict

from tiered_training.aws import probe_runs
from tiered_training.contract.metrics import probe_metric_definitions
from tiered_training.planning.planner import resolve
from tiered_training.recipe import Recipe


def final(values: dict[str, float]) -> list[dict]:
    return [{"MetricName": name, "Value": value} for name, value in values.items()]


def test_every_metric_the_probe_defines_is_read_back():
    """What the Probe step's MetricDefinitions name is what the reader parses: a line printed in each format,
    matched by its regex, lands on its candidate."""
    definitions = probe_metric_definitions(3)
    values = {}
    for number, (name, (fmt, regex)) in enumerate(definitions.items(), start=1):
        line = fmt.format(number if "best" in name else number / 10)
        values[name] = float(re.search(regex, line).group(1))
    found = probe_runs.parse("job", final(values) + final({"train:progress": 100.0}))
    assert sorted(found.candidates) == [1, 2, 3]
    assert found.best_candidate == int(values["probe:best_candidate"])
    for n, m in found.candidates.items():
        assert m.tokens_per_second_per_gpu == values[f"probe:candidate{n}:tokens_per_second"]
        assert m.peak_reserved_fraction == values[f"probe:candidate{n}:peak_reserved_fraction"]


def test_a_probe_that_printed_nothing_compares_as_unmeasured():
    plan = resolve(Recipe.model_validate(recipe_dict()))
    found = probe_runs.parse("job", [])
    rows = probe_runs.compare(plan.candidates, found)
    assert [r.measured_tokens_per_second_per_gpu for r in rows] == [None] * len(plan.candidates)
    assert not any(r.trained for r in rows) and all(r.ratio is None for r in rows)
    assert probe_runs.lines(found, rows)[-1] == "  the probe reported no choice (it did not finish)"


def test_the_probe_job_is_the_probe_steps():
    steps = [{"name": "Train", "training_job": "t"}, {"name": "Probe", "training_job": "p"}]
    assert probe_runs.probe_job(steps) == "p"
    assert probe_runs.probe_job([{"name": "Probe", "training_job": None}]) is None
