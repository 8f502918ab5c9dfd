"""Mutation test: every template, mutated every way a careless or hostile edit could.

Mutations: each field deleted, its type swapped, pushed past its bounds (zero,
negative, huge, infinite, NaN), set to long and odd strings; unknown keys added;
top-level keys duplicated. For each:

- no exception but ``RecipeError`` escapes the loader and planner (no traceback);
- each takes less than 2 s;
- a recipe that loads with no plan error is really runnable: its RunConfig
  round-trips, its pipeline definition passes ``validate_definition`` (SageMaker's
  rules, botocore's CreateTrainingJob shape), its estimates are finite and its
  name fits every derived name; so ``validate`` can never exit 0 on an invalid plan.

The loader and planner run in-process for every mutation; the CLI (``validate``
through typer's CliRunner) runs on a deterministic sample, checking its exit code
against the same verdict.
"""

from __future__ import annotations

import copy
import json
import math
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from support import RECIPES
from typer.testing import CliRunner

from tiered_training import report
from tiered_training.cli.app import app
from tiered_training.contract.runconfig import RunConfig
from tiered_training.pipeline import definition as d
from tiered_training.pipeline import validation
from tiered_training.planning.planner import resolve
from tiered_training.recipe import names
from tiered_training.recipe.errors import RecipeError
from tiered_training.recipe.loader import parse_recipe

LIMIT_SECONDS = 2.0  # CPU seconds of one verdict: a shared machine stretches wall time, not CPU time
CLI_SAMPLE_EVERY = 25
RESOURCES = d.PipelineResources(
    role_arn="arn:aws:iam::123456789012:role/exec", image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
    checkpoint_s3_uri="s3://b/c/", output_s3_uri="s3://b/o/",
)

ODD_STRINGS = {
    "empty": "",
    "spaces": "   ",
    "markup": "[bold]x[/] [/]",
    "long": "a" * 5000,
    "newlines": "a\nb\r\nc",
    "nul": "a\x00b",
    "unicode": "名前-ñ-🙂",
    "template": "${AWS_SECRET} {{x}} %s",
    "number-like": "1e3",
    "auto": "auto",
}
TYPE_SWAPS = {"int": 7, "float": 0.5, "bool": True, "null": None, "list": [1, "a"], "map": {"a": 1}, "string": "x"}
BOUNDS = {"zero": 0, "negative": -1, "int64": 2**63, "huge": 10**30, "tiny": 1e-300, "max-float": 1.7e308, "inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def paths(node: Any, prefix: tuple = ()) -> Iterator[tuple]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield prefix + (key,)
            yield from paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield prefix + (index,)
            yield from paths(value, prefix + (index,))


def replaced(data: dict, path: tuple, value: Any = None, delete: bool = False) -> dict:
    data = copy.deepcopy(data)
    node = data
    for part in path[:-1]:
        node = node[part]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=10**6)


def mutations(text: str) -> Iterator[tuple[str, str]]:
    data = yaml.safe_load(text)
    for path in paths(data):
        where = ".".join(map(str, path))
        value = _get(data, path)
        yield f"delete {where}", dump(replaced(data, path, delete=True))
        for label, swap in TYPE_SWAPS.items():
            if type(swap) is not type(value):
                yield f"{where} = {label}", dump(replaced(data, path, swap))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            for label, bound in BOUNDS.items():
                yield f"{where} = {label}", dump(replaced(data, path, bound))
            yield f"{where} x1000", dump(replaced(data, path, value * 1000))
        if isinstance(value, str):
            for label, odd in ODD_STRINGS.items():
                yield f"{where} = {label} string", dump(replaced(data, path, odd))
            yield f"{where} doubled", dump(replaced(data, path, value * 2))
        if isinstance(value, dict):
            yield f"{where} + unknown key", dump(replaced(data, path + ("unknown_key",), 1))
        if isinstance(value, list) and value:
            yield f"{where} duplicated item", dump(replaced(data, path, value + value[-1:]))
    yield "unknown top-level key", dump({**data, "extra": 1})
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line and not line.startswith((" ", "#", "-")) and ":" in line:
            yield f"duplicate line {index + 1}", "\n".join(lines[: index + 1] + [line] + lines[index + 1 :]) + "\n"
    yield "empty file", ""
    yield "a list, not a mapping", "- " + "\n- ".join(lines[:3]) + "\n"
    yield "tabs for indentation", text.replace("  ", "\t")
    yield "truncated", text[: len(text) // 2]


def _get(data: Any, path: tuple) -> Any:
    for part in path:
        data = data[part]
    return data


def verdict(text: str, name: str) -> bool:
    """True when the recipe is runnable, False when it is reported; anything else raises."""
    try:
        recipe, lines = parse_recipe(text, name)
    except RecipeError as error:
        assert error.problems, "a RecipeError without problems"
        for line in str(error).splitlines():
            assert len(line) < 1200, f"message line of {len(line)} characters"
        return False
    plan = resolve(recipe, source=name, lines=lines)
    report.plans_json([plan])  # strict JSON: raises on NaN or Infinity
    if not plan.ok:
        return False
    est = plan.estimates
    for value in (est.tokens_per_second_per_gpu, est.wall_time_hours, est.step_time_seconds):
        assert math.isfinite(value) and value > 0, value
    assert est.cost_usd is None or (math.isfinite(est.cost_usd) and est.cost_usd > 0), est.cost_usd
    config = plan.run_config()
    assert RunConfig.from_json(config.to_json()) == config
    json.loads(config.to_json())
    problems = validation.validate_definition(d.build_definition(plan, RESOURCES))
    assert not problems, problems
    assert names.name_problem(plan.name) is None
    return True


def all_mutations() -> list[tuple[str, str, str]]:
    out = []
    for path in RECIPES:
        for label, text in mutations(path.read_text()):
            out.append((path.name, label, text))
    return out


def test_no_mutation_of_any_template_gives_a_traceback_a_hang_or_a_false_ok(tmp_path):
    cases = all_mutations()
    assert len(cases) > 2000
    failures, slow, verdicts = [], [], {}
    runner = CliRunner()
    for index, (template, label, text) in enumerate(cases):
        started = time.process_time()
        try:
            verdicts[index] = verdict(text, f"{template}[{label}]")
        except Exception as exc:  # noqa: BLE001 - collect every failure, then report them together
            failures.append(f"{template} [{label}]: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        seconds = time.process_time() - started
        if seconds > LIMIT_SECONDS:
            slow.append(f"{template} [{label}]: {seconds:.2f} s")
    assert not failures, f"{len(failures)} of {len(cases)} mutations failed:\n" + "\n".join(failures[:40])
    assert not slow, "\n".join(slow)
    # Both verdicts occur: the mutations reach the planner, not only the loader.
    assert 0 < sum(verdicts.values()) < len(verdicts)

    mismatched = []
    for index in range(0, len(cases), CLI_SAMPLE_EVERY):
        template, label, text = cases[index]
        path = tmp_path / f"mutation-{index}.yaml"
        path.write_text(text, encoding="utf-8")
        result = runner.invoke(app, ["validate", str(path)], prog_name="tiered-training")
        expected = 0 if verdicts[index] else 2
        if result.exit_code != expected or (result.exception and not isinstance(result.exception, SystemExit)):
            mismatched.append(f"{template} [{label}]: exit {result.exit_code}, expected {expected}: {result.output[-300:]}")
    assert not mismatched, "\n".join(mismatched)


@pytest.mark.parametrize("template", RECIPES, ids=lambda p: p.name)
def test_every_template_is_mutated_at_every_field(template):
    data = yaml.safe_load(template.read_text())
    labels = {label for label, _ in mutations(template.read_text())}
    for path in paths(data):
        assert f"delete {'.'.join(map(str, path))}" in labels


# -- YAML 1.1 readings and lookalike keys, written as a user would type them --------------------

CYRILLIC = str.maketrans({"a": "а", "e": "е", "o": "о", "p": "р", "c": "с"})


def typed_mutations(text: str) -> Iterator[tuple[str, str, str]]:
    """Edits of one line of the template's text: (label, text, words the one problem must hold).

    Every number becomes ``1:30`` (YAML 1.1: 90) or ``true``; every boolean ``yes`` or ``off``;
    every key gets a Cyrillic lookalike letter.
    """
    lines = text.splitlines()
    for index, line in enumerate(lines):
        stripped = line.split("#", 1)[0].rstrip()
        key, sep, value = stripped.partition(":")
        if not sep or key.strip().startswith("-") or "yaml-language-server" in line:
            continue
        value = value.strip()
        indent = key[: len(key) - len(key.lstrip())]
        parents = [x.strip().rstrip(":") for x in lines[:index] if x.strip() and not x.lstrip().startswith("#")
                   and len(x) - len(x.lstrip()) < len(indent)]
        if indent and parents and parents[-1] == "tags":
            continue  # free-form keys and text values

        def edit(new_key: str, new_value: str, index: int = index, indent: str = indent) -> str:
            return "\n".join(lines[:index] + [f"{indent}{new_key}: {new_value}".rstrip()] + lines[index + 1 :]) + "\n"

        where = f"line {index + 1} ({key.strip()})"
        if re.fullmatch(r"-?[0-9][0-9_]*(\.[0-9]+)?(e-?[0-9]+)?", value):
            yield f"{where} = 1:30", edit(key.strip(), "1:30"), ["'1:30'", "YAML 1.1"]
            yield f"{where} = true", edit(key.strip(), "true"), ["not a boolean"]
        elif value in ("true", "false"):
            yield f"{where} = yes", edit(key.strip(), "yes"), ["'yes'", "true or false"]
            yield f"{where} = off", edit(key.strip(), "off"), ["'off'", "true or false"]
        looks = key.strip().translate(CYRILLIC)
        if looks != key.strip():
            yield f"{where} lookalike", edit(looks, value), ["non-ASCII", f"did you mean '{key.strip()}'?"]


@pytest.mark.parametrize("template", RECIPES, ids=lambda p: p.name)
def test_yaml_11_readings_and_lookalike_keys_are_one_clear_problem(template):
    cases = list(typed_mutations(template.read_text()))
    assert any("1:30" in label for label, _, _ in cases) and any("lookalike" in label for label, _, _ in cases)
    for label, text, words in cases:
        started = time.process_time()
        with pytest.raises(RecipeError) as info:
            parse_recipe(text, template.name)
        assert time.process_time() - started < LIMIT_SECONDS, label
        (problem,) = info.value.problems
        line = str(problem)
        assert "\n" not in line and all(word in line for word in words), (label, line)
