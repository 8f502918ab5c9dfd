"""Load a recipe file: YAML with line numbers, then strict validation.

Every problem is reported at once, each with file, line, field path, the bad value
and what would be valid. Nothing here raises anything but :class:`RecipeError`.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .errors import Problem, RecipeError
from .recipe import AT, Recipe

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
Lines = dict[str, int]
# Errors pydantic reports for the branches of a union that the value did not take.
UNION_ALTERNATIVES = frozenset({"literal_error", "bool_type", "bool_parsing", "int_type", "int_parsing", "model_type", "dict_type"})


def load_recipe(path: str | Path) -> Recipe:
    return load_recipe_with_lines(path)[0]


def load_recipe_with_lines(path: str | Path) -> tuple[Recipe, Lines]:
    """The recipe and a map from dotted field path to its 1-based line."""
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError([Problem(name, None, "", f"cannot read the file: {exc.strerror or exc}")]) from None
    except UnicodeDecodeError:
        raise RecipeError([Problem(name, None, "", "the file is not UTF-8 text")]) from None
    return parse_recipe(text, name)


def parse_recipe(text: str, name: str = "<recipe>") -> tuple[Recipe, Lines]:
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise RecipeError([Problem(name, line, "", f"YAML syntax: {exc.problem or exc}")]) from None
    except yaml.YAMLError as exc:
        raise RecipeError([Problem(name, None, "", f"YAML: {exc}")]) from None

    if not isinstance(data, dict):
        raise RecipeError([Problem(name, 1, "", "a recipe is a YAML mapping of fields (name, model, data, ...)")])

    lines: Lines = {}
    problems: list[Problem] = []
    _index(node, (), lines, problems, name)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        problems += _problems(exc, data, lines, name)
        recipe = None
    if problems:
        problems.sort(key=lambda p: (p.line or 0, p.field))
        raise RecipeError(problems)
    return recipe, lines


def _index(node: yaml.Node, path: tuple, lines: Lines, problems: list[Problem], name: str) -> None:
    """Record the line of every key; report duplicate keys, which YAML would silently overwrite."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            child = path + (key,)
            dotted = ".".join(map(str, child))
            if key in seen:
                problems.append(Problem(name, key_node.start_mark.line + 1, dotted, "duplicate key; keep one"))
            seen.add(key)
            lines[dotted] = key_node.start_mark.line + 1
            _index(value_node, child, lines, problems, name)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = path + (index,)
            lines[".".join(map(str, child))] = item.start_mark.line + 1
            _index(item, child, lines, problems, name)


def _real_path(loc: tuple, data: Any) -> tuple[tuple, bool]:
    """Split pydantic's location into the path that exists in the document.

    Union branches add labels such as ``literal['auto']``, ``int`` or a model's class
    name; they are neither document keys nor fields. Returns the document path and
    whether it reached a value (False for a missing field).
    """
    path: list = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            path.append(part)
            node = node[part]
        elif isinstance(node, dict) and _is_field(tuple(path), part):
            path.append(part)  # a field the document leaves out
            return tuple(path), False
    return tuple(path), True


def _is_field(path: tuple, name: Any) -> bool:
    model = _model_at(path)
    return model is not None and name in model.model_fields


def _value_at(data: Any, path: tuple) -> tuple[Any, bool]:
    node = data
    for part in path:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None, False
    return node, True


def _model_at(path: tuple) -> type[BaseModel] | None:
    model: Any = Recipe
    for part in path:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _submodel(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _submodel(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def _problems(exc: ValidationError, data: dict, lines: Lines, name: str) -> list[Problem]:
    grouped: dict[str, dict[str, Any]] = {}
    for error in exc.errors(include_url=False):
        path, reached = _real_path(tuple(error["loc"]), data)
        message = _message(error, path)
        match = re.match(rf"^(?:Value error, )?{AT}([\w.]+): (.*)$", error["msg"], re.S)
        if match:  # a cross-field check names its own field
            path = tuple(match.group(1).split("."))
            message = match.group(2)
            reached = True
        dotted = ".".join(map(str, path))
        entry = grouped.setdefault(dotted, {"path": path, "messages": [], "choices": [], "reached": reached, "alternatives": True})
        entry["alternatives"] &= error["type"] in UNION_ALTERNATIVES
        if error["type"] == "literal_error" and not match:
            entry["choices"].append(str((error.get("ctx") or {}).get("expected", "")))
        elif message not in entry["messages"]:
            entry["messages"].append(message)
    problems = []
    for dotted, entry in grouped.items():
        path = entry["path"]
        if entry["alternatives"] and any(other.startswith(dotted + ".") for other in grouped):
            continue  # a union's other branches failed too; the deeper problem is the one to fix
        if entry["choices"]:
            choices = ", ".join(entry["choices"]).replace(" or ", ", ")
            entry["messages"].insert(0, f"must be one of {choices}")
        value, has_value = _value_at(data, path) if entry["reached"] else (None, False)
        if isinstance(value, (dict, list)):
            has_value = False
        problems.append(
            Problem(
                file=name,
                line=_line_for(path, lines),
                field=dotted,
                message="; or ".join(entry["messages"]),
                value=value,
                has_value=has_value,
            )
        )
    return problems


def _line_for(path: tuple, lines: Lines) -> int | None:
    for end in range(len(path), 0, -1):
        line = lines.get(".".join(map(str, path[:end])))
        if line:
            return line
    return 1 if path else None


def _message(error: dict, path: tuple) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        parent = _model_at(path[:-1])
        valid = sorted(parent.model_fields) if parent else []
        hint = difflib.get_close_matches(str(path[-1]), valid, n=1)
        suggestion = f"did you mean '{hint[0]}'? " if hint else ""
        return f"unknown field; {suggestion}valid fields here: {', '.join(valid)}"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '')}"
    if kind == "string_pattern_mismatch":
        return f"does not match the required pattern {ctx.get('pattern', '')}"
    msg = error["msg"].removeprefix("Value error, ")
    return msg[0].lower() + msg[1:] if msg else kind
