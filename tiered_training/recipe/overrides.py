"""Command-line overrides of a recipe's fields: ``--set key.path=value``, as Hydra's ``key=value``.

The value is read as YAML 1.2, as the file's values are (``--set tuning.precision=bf16``,
``--set compute.instance_count=2``, ``--set data.allowed_uris=[s3://a/, s3://b/]``), and set into the
recipe's mapping before validation, so an override is checked as the file is; a problem with an
overridden field names the override instead of a line of the file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from tiered_training.recipe.errors import Problem, RecipeError
from tiered_training.recipe.untrusted import check_events, syntax_hint, tag_problems
from tiered_training.recipe.yaml12 import Loader
from tiered_training.text import clip

KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class Override:
    text: str  # as given: key.path=value
    path: tuple[str, ...]
    value: Any

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    def covers(self, field: str) -> bool:
        """Whether a problem with ``field`` is about this override (the field or one below it)."""
        return field == self.dotted or field.startswith(self.dotted + ".")

    def above(self, field: str) -> bool:
        """Whether ``field`` is a section on this override's path (``nope`` of ``nope.x``)."""
        return self.dotted.startswith(field + ".")


def parse_overrides(texts: Sequence[str]) -> list[Override]:
    """``key.path=value`` strings; a malformed one is a RecipeError naming it."""
    overrides, problems = [], []
    for text in texts:
        key, sep, raw = text.partition("=")
        key = key.strip()
        where = f"--set {clip(text, 100)}"
        if not sep or not KEY.match(key):
            problems.append(Problem(where, None, "", malformed(key, sep)))
            continue
        try:
            value = _read_value(raw, where) if raw.strip() else None
        except RecipeError as exc:  # bounded and checked as a file is: aliases, nesting, tags
            problems += [Problem(where, None, "", f"the value: {p.message}") for p in exc.problems]
            continue
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            hint = syntax_hint(raw, getattr(exc, "problem", None) or "", mark.line + 1 if mark else 1)
            said = f"the value: YAML: {hint[0]}" if hint else f"the value is not YAML: {clip(str(exc).splitlines()[0])}"
            problems.append(Problem(where, None, "", said))
            continue
        overrides.append(Override(text, tuple(key.split(".")), value))
    if problems:
        raise RecipeError(problems)
    return overrides


def _read_value(raw: str, where: str) -> Any:
    """An override's value, read as a recipe file's values are: the same bounds, tags and YAML 1.2 scalars."""
    check_events(raw, where)
    loader = Loader(raw)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        refused = tag_problems(node, (), where)
        if refused:
            raise RecipeError(refused[:1])
        return loader.construct_document(node)
    finally:
        loader.dispose()


INDEX = re.compile(r"\[[^\]]*\]|\.\d+(?=\.|$)")


def malformed(key: str, sep: str) -> str:
    """Why ``key`` (before ``=``) is not a field path, and what would be valid."""
    from tiered_training.recipe.keys import ascii_skeleton, non_ascii

    example = "for example tuning.precision=bf16"
    if not sep:
        return f"no '=': expected key.path=value, {example}"
    if not key:
        return f"no field before '=': expected key.path=value, {example}"
    if INDEX.search(key):
        whole = INDEX.split(key)[0] or key
        return (
            f"a list item cannot be set alone; set the whole list: {whole}=[first, second] (a flow list, read as YAML)"
        )
    if non_ascii(key):
        guess = ascii_skeleton(key)
        meant = f"; did you mean {guess!r}?" if KEY.match(guess) else ""
        return f"contains non-ASCII {', '.join(non_ascii(key))}: field names are ASCII letters, digits and _{meant}"
    return f"a field path is names of letters, digits and _ joined by '.', {example}"


def apply_overrides(data: dict[str, Any], overrides: list[Override]) -> list[Problem]:
    """Sets each override into ``data`` (creating mappings on the way); the problems of paths that cannot be set."""
    problems = []
    for override in overrides:
        node: Any = data
        for depth, key in enumerate(override.path[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                where = ".".join(override.path[: depth + 1])
                problems.append(Problem(f"--set {clip(override.text, 100)}", None, "", f"{where} is not a section"))
                break
            node = child
        else:
            node[override.path[-1]] = override.value
    return problems


def attribute(
    problems: list[Problem], overrides: list[Override], in_file: frozenset[str] = frozenset()
) -> list[Problem]:
    """Each problem with an overridden field, named by its override (``--set a.b=x: ...``) instead of a line.

    A problem with a section on an override's path that the file does not have (``nope`` of
    ``--set nope.x=1``) is the override's too; ``in_file`` is the file's fields.
    """
    out = []
    for problem in problems:
        override = next(
            (
                o
                for o in reversed(overrides)
                if problem.field
                and (o.covers(problem.field) or (o.above(problem.field) and problem.field not in in_file))
            ),
            None,
        )
        if override is None:
            out.append(problem)
            continue
        below = problem.field[len(override.dotted) + 1 :] if override.covers(problem.field) else problem.field
        out.append(
            Problem(
                file=f"--set {clip(override.text, 100)}",
                line=None,
                field=below,
                message=problem.message,
                value=problem.value,
                has_value=problem.has_value,
            )
        )
    return out
