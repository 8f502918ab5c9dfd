"""Load a recipe file: YAML 1.2 with line numbers, then strict validation.

Scalars resolve as in YAML 1.2 (:mod:`tiered_training.recipe.yaml12`): ``1:30`` and ``yes``
are text, and validation is strict, so a number field refuses text and booleans and
a boolean field refuses anything but ``true`` and ``false``; the message says what
YAML 1.1 would have read.

Every problem is reported at once, each with file, line, field path, the bad value
and what would be valid. Nothing here raises anything but :class:`RecipeError`.

Hostile input is bounded before it can cost anything: only regular files of at most
:data:`MAX_BYTES` are read (a FIFO or a device is never opened for a blocking read);
the YAML event stream is checked for nesting depth and for the size the document
would have once every alias is expanded *before* the document is composed, so a
"billion laughs" file or a 50,000-deep one is one line of error, not a hang or a
crash in the recursive composer.
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from tiered_training.recipe import AT, PATTERN_MEANING, Recipe
from tiered_training.recipe.errors import Problem, RecipeError
from tiered_training.recipe.keys import lookalike_hint
from tiered_training.recipe.overrides import apply_overrides, attribute, parse_overrides
from tiered_training.recipe.untrusted import (
    FLOAT_TAG,
    INT_TAG,
    MERGE_TAG,
    character_message,
    check_events,
    decode,
    key_on_line,
    syntax_hint,
    tag_problems,
)
from tiered_training.recipe.yaml12 import BOOL_ERRORS, Loader, quoted_reading, yaml11_reading
from tiered_training.text import clip

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

_Loader = Loader
Lines = dict[str, int]
# A place in the document: mapping keys and sequence indexes (pydantic's error locations too).
Loc = tuple[int | str, ...]
# Errors pydantic reports for the branches of a union that the value did not take.
UNION_ALTERNATIVES = frozenset(
    {"literal_error", "bool_type", "bool_parsing", "int_type", "int_parsing", "float_type", "model_type", "dict_type"}
)
RECIPE_SUFFIXES = (".yaml", ".yml")
# A recipe is a few kilobytes; this bound is far above that (untrusted.py bounds its depth and nodes).
MAX_BYTES = 1 << 20


def find_recipes(paths: Iterable[str | Path]) -> tuple[list[Path], list[RecipeError]]:
    """The recipe files that ``paths`` name, and the paths that are errors.

    A directory contributes its ``*.yaml``/``*.yml`` entries (hidden ones excepted)
    whatever their kind, so a dangling link, a FIFO or an unreadable file is
    reported when it is read rather than silently skipped. The CLI and the CDK app
    both list recipes with this function.
    """
    files: list[Path] = []
    errors: list[RecipeError] = []
    for path in map(Path, paths):
        try:
            is_dir = path.is_dir()
        except OSError as exc:
            errors.append(_file_error(path, f"cannot read: {exc.strerror or exc}"))
            continue
        if not is_dir:
            files.append(path)  # read_recipe_text says what is wrong with it, if anything
            continue
        try:
            entries = sorted(p for p in path.iterdir() if p.suffix in RECIPE_SUFFIXES and not p.name.startswith("."))
        except OSError as exc:
            errors.append(_file_error(path, f"cannot list the directory: {exc.strerror or exc}"))
            continue
        files += entries
    return files, errors


def recipe_by_name(name: str, folder: Path) -> tuple[Path | None, list[str]]:
    """The recipe in ``folder`` whose pipeline name (its ``name:``) or file stem is ``name``, and every name there.

    ``qwen25-14b-fp8`` finds ``recipes/qwen2.5-14b-fp8.yaml``, whose ``name:`` it is; so does
    ``qwen2.5-14b-fp8``. A file that does not load is skipped.
    """
    files, _ = find_recipes([folder]) if folder.is_dir() else ([], [])
    names: list[str] = []
    for path in files:
        try:
            _, data, _, _, _ = _compose(read_recipe_text(path), str(path))  # bounded, as every recipe is read
        except RecipeError:
            continue
        pipeline = data.get("name") if isinstance(data, dict) else None
        if isinstance(pipeline, str):
            names.append(pipeline)
        if name in (pipeline, path.stem):
            return path, names
    return None, sorted(names)


def _file_error(path: Path, message: str) -> RecipeError:
    return RecipeError([Problem(str(path), None, "", message)])


STDIN = "-"  # a recipe path that means standard input
STDIN_NAME = "<stdin>"


def read_recipe_text(path: str | Path) -> str:
    """The text of a recipe file (``-``: standard input); only a regular UTF-8 file of at most MAX_BYTES is read."""
    if str(path) == STDIN:
        return _stdin_text()
    path = Path(path)
    name = str(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if path.is_symlink():
            raise _file_error(
                path, f"cannot read the file: a dangling symbolic link (to {clip(os.readlink(path))})"
            ) from None
        raise _file_error(path, "cannot read the file: no such file or directory") from None
    except OSError as exc:
        raise _file_error(path, f"cannot read the file: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _kind(info.st_mode)
            raise _file_error(path, f"cannot read the file: {kind}, not a regular file")
        if info.st_size > MAX_BYTES:
            raise _file_error(path, f"{info.st_size:,} bytes; a recipe is at most {MAX_BYTES:,} bytes")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise _file_error(path, f"cannot read the file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise _file_error(path, f"more than {MAX_BYTES:,} bytes; a recipe is at most {MAX_BYTES:,} bytes")
    return _decoded(data, name, "file")


def _decoded(data: bytes, name: str, what: str) -> str:
    text, problem = decode(data, name, what)
    if problem is not None:
        raise RecipeError([problem])
    return text


def _stdin_text() -> str:
    """Standard input as a recipe's text, bounded as a file is."""
    if sys.stdin is None or sys.stdin.closed:
        raise RecipeError([Problem(STDIN_NAME, None, "", "standard input is closed: pipe a recipe into the command")])
    data = sys.stdin.buffer.read(MAX_BYTES + 1) if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    if len(data) > MAX_BYTES:
        raise RecipeError(
            [Problem(STDIN_NAME, None, "", f"more than {MAX_BYTES:,} bytes; a recipe is at most {MAX_BYTES:,} bytes")]
        )
    if not data.strip():
        raise RecipeError([Problem(STDIN_NAME, None, "", "standard input is empty: pipe a recipe into the command")])
    return _decoded(data, STDIN_NAME, "input")


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return "a special file"


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    return load_recipe_with_lines(path, overrides)[0]


def load_recipe_with_lines(path: str | Path, overrides: Sequence[str] = ()) -> tuple[Recipe, Lines]:
    """The recipe and a map from dotted field path to its 1-based line; ``overrides`` are ``--set`` values."""
    return parse_recipe(read_recipe_text(path), source_name(path), overrides)


def source_name(path: str | Path) -> str:
    """How messages name a recipe: its path, or ``<stdin>`` for ``-``."""
    return STDIN_NAME if str(path) == STDIN else str(path)


def parse_recipe(text: str, name: str = "<recipe>", overrides: Sequence[str] = ()) -> tuple[Recipe, Lines]:
    node, data, lines, written, problems = _compose(text, name)

    if not isinstance(data, dict):
        raise RecipeError([Problem(name, 1, "", "a recipe is a YAML mapping of fields (name, model, data, ...)")])
    parsed = parse_overrides(overrides)
    in_file = frozenset(lines)
    problems += apply_overrides(data, parsed)
    for override in parsed:  # the file's line no longer holds the value, nor its text
        for field in [f for f in lines if override.covers(f)]:
            del lines[field]
        for field in [f for f in written if override.covers(f)]:
            del written[field]
        if isinstance(override.value, int | float) and not isinstance(override.value, bool):
            written[override.dotted] = override.text.partition("=")[2].strip()

    try:
        recipe = Recipe.model_validate(_integral_floats_as_ints(data, {}), strict=True)
    except ValidationError as exc:
        problems += _problems(exc, data, lines, name, written)
        recipe = None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # never a traceback for bad input
        problems.append(Problem(name, 1, "", f"cannot validate the recipe: {clip(str(exc))}"))
        recipe = None
    if problems or recipe is None:  # a recipe that failed validation always left a problem
        problems = attribute(problems, parsed, in_file)
        problems.sort(key=lambda p: (p.line or 0, p.field))
        raise RecipeError(problems)
    return recipe, lines


def _integral_floats_as_ints(value: Any, copies: dict[int, Any]) -> Any:
    """A copy of the data with each float that has no fractional part as the integer (``1.0``, ``8.192e3``): an
    integer to JSON Schema (https://json-schema.org/draft/2020-12/json-schema-validation#section-6.1.1), so to an editor
    too; a float field takes the integer as the float. Messages still show the value as written."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict | list):
        if id(value) in copies:  # an alias: one copy, cycles included
            return copies[id(value)]
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            copies[id(value)] = out
            out.update((key, _integral_floats_as_ints(item, copies)) for key, item in value.items())
            return out
        items: list[Any] = []
        copies[id(value)] = items
        items.extend(_integral_floats_as_ints(item, copies) for item in value)
        return items
    return value


def _compose(text: str, name: str) -> tuple[yaml.Node | None, Any, Lines, dict[str, str], list[Problem]]:
    """The YAML node tree, the constructed document, key lines, numbers as written and duplicate-key problems."""
    if len(text) > MAX_BYTES:
        raise RecipeError([Problem(name, None, "", f"{len(text):,} characters; a recipe is at most {MAX_BYTES:,}")])
    lines: Lines = {}
    written: dict[str, str] = {}
    problems: list[Problem] = []
    try:
        check_events(text, name)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None, None, lines, written, problems
            refused = tag_problems(node, (), name)
            if refused:  # before constructing: an unknown tag has no constructor, a bad !!int no line
                raise RecipeError(refused)
            _index(node, (), lines, problems, name, written)
            data = loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or str(exc)
        hint = syntax_hint(text, problem, line)
        if hint is not None:
            raise RecipeError([Problem(name, line, hint[1], f"YAML: {hint[0]}")]) from None
        if exc.context and exc.context.startswith("found duplicate anchor"):  # PyYAML's words for it
            problem = "an anchor defined twice; give each anchor its own name"
        raise RecipeError([Problem(name, line, "", f"YAML syntax: {clip(problem)}")]) from None
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        message = character_message(text, exc.position, exc.character)
        raise RecipeError([Problem(name, line, key_on_line(text, line), f"YAML: {message}")]) from None
    except yaml.YAMLError as exc:
        raise RecipeError([Problem(name, None, "", f"YAML: {clip(str(exc))}")]) from None
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        # SafeConstructor on an explicit tag with a bad value (``!!int x``, ``!!timestamp x``).
        raise RecipeError([Problem(name, None, "", f"YAML: a value cannot be read: {clip(str(exc))}")]) from None
    return node, data, lines, written, problems


def _index(
    node: yaml.Node, path: Loc, lines: Lines, problems: list[Problem], name: str, written: dict[str, str]
) -> None:
    """Record the line of every key and each plain number's text; report duplicate keys, which YAML would
    silently overwrite.

    A merge key (``<<: *base``) brings in the keys of the merged mappings that the
    mapping does not set itself, as YAML defines it; overriding a merged key is not a
    duplicate.
    """
    if isinstance(node, yaml.MappingNode):
        for key, (key_node, value_node) in _entries(node, path, problems, name).items():
            child = path + (key,)
            lines[".".join(map(str, child))] = key_node.start_mark.line + 1
            _index(value_node, child, lines, problems, name, written)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = path + (index,)
            lines[".".join(map(str, child))] = item.start_mark.line + 1
            _index(item, child, lines, problems, name, written)
    elif isinstance(node, yaml.ScalarNode) and node.tag in (INT_TAG, FLOAT_TAG) and path:
        written[".".join(map(str, path))] = node.value


def _entries(
    node: yaml.MappingNode, path: Loc, problems: list[Problem] | None, name: str
) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """A mapping's keys as YAML resolves them: its own keys, then merged keys it does not set."""
    own: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    merged: list[yaml.Node] = []
    for key_node, value_node in node.value:
        if key_node.tag == MERGE_TAG:
            merged += value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            continue
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "<complex key>"
        if key in own and problems is not None:
            dotted = ".".join(map(str, path + (key,)))
            problems.append(Problem(name, key_node.start_mark.line + 1, clip(dotted), "duplicate key; keep one"))
        own[key] = (key_node, value_node)
    for source in merged:  # earlier merged mappings win over later ones
        if isinstance(source, yaml.MappingNode):
            for key, entry in _entries(source, path, None, name).items():
                own.setdefault(key, entry)
    return own


def _real_path(loc: Loc, data: Any) -> tuple[Loc, bool]:
    """Split pydantic's location into the path that exists in the document.

    Union branches add labels such as ``literal['auto']``, ``int`` or a model's class
    name; they are neither document keys nor fields. Returns the document path and
    whether it reached a value (False for a missing field).
    """
    path: list[int | str] = []
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


def _is_field(path: Loc, name: Any) -> bool:
    model = _model_at(path)
    return model is not None and name in model.model_fields


def _value_at(data: Any, path: Loc) -> tuple[Any, bool]:
    node = data
    for part in path:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None, False
    return node, True


def _model_at(path: Loc) -> type[BaseModel] | None:
    model: Any = Recipe
    for part in path:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        if isinstance(part, int):  # an item of a list of sections (data.sources.0): the item's model
            continue
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


def _problems(
    exc: ValidationError, data: dict[str, Any], lines: Lines, name: str, written: dict[str, str]
) -> list[Problem]:
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
        entry = grouped.setdefault(
            dotted,
            {
                "path": path,
                "messages": [],
                "choices": [],
                "wants": [],
                "reached": reached,
                "alternatives": True,
                "kinds": set(),
            },
        )
        want = TYPE_WANTS.get(error["type"]) or (
            message.removeprefix("must be ") if error["type"] == "model_type" else None
        )
        if want and want not in entry["wants"]:
            entry["wants"].append(want)
        entry["alternatives"] &= error["type"] in UNION_ALTERNATIVES
        entry["kinds"].add(error["type"])
        if error["type"] == "extra_forbidden":
            parent = _model_at(path[:-1])
            entry["meant"] = lookalike_hint(str(path[-1]), parent.model_fields if parent else [])[1]
        if error["type"] == "literal_error" and not match:
            entry["choices"].append(str((error.get("ctx") or {}).get("expected", "")))
        elif message not in entry["messages"]:
            entry["messages"].append(message)
    _merge_misspelt_keys(grouped)
    problems = []
    for dotted, entry in grouped.items():
        path = entry["path"]
        if entry["alternatives"] and any(other.startswith(dotted + ".") for other in grouped):
            continue  # a union's other branches failed too; the deeper problem is the one to fix
        if entry["alternatives"] and entry["wants"] and len(entry["choices"]) + len(entry["wants"]) > 1:
            # a union: each branch's type in words, such as "'auto', true or false, or a mapping of ..."
            named = [c for text in entry["choices"] for c in text.replace(" or ", ", ").split(", ")]
            entry["messages"] = [f"must be {_either(named + entry['wants'])}"]
        elif (
            entry["choices"] and entry["messages"] and all(m.startswith("input should be ") for m in entry["messages"])
        ):
            # a choice or a bounded value: "must be 'auto' or greater than or equal to 1"
            named = [c for text in entry["choices"] for c in text.replace(" or ", ", ").split(", ")]
            bounds = [m.removeprefix("input should be ") for m in entry["messages"]]
            entry["messages"] = [f"must be {_either(named + bounds)}"]
        elif entry["choices"]:
            choices = ", ".join(entry["choices"]).replace(" or ", ", ")
            entry["messages"].insert(0, f"must be one of {choices}")
        value, has_value = _value_at(data, path) if entry["reached"] else (None, False)
        if isinstance(value, (dict, list)):
            has_value = False
        message = "; or ".join(entry["messages"])
        typed = entry["kinds"] - {"extra_forbidden", "literal_error"}
        boolean = bool(entry["kinds"] & BOOL_ERRORS)
        trap = (
            (yaml11_reading(value, boolean=boolean) or quoted_reading(value, entry["kinds"]))
            if has_value and typed
            else None
        )
        if trap:
            message = f"{message}: {trap}"
        elif has_value and isinstance(value, bool) and entry["kinds"] & {"int_type", "float_type"}:
            message = f"{message}, not a boolean"
        if has_value and not trap and dotted in written:
            value = _as_written(value, written[dotted])
        problems.append(
            Problem(
                file=name,
                line=_line_for(path, lines),
                field=dotted,
                message=message,
                value=None if trap else value,
                has_value=has_value and not trap,
            )
        )
    return problems


class _Written(str):
    """A number as the file writes it (``100_000``, ``0x201``, ``1e400``): quoted in a message without quotes."""

    def __repr__(self) -> str:
        return str(self)


def _as_written(value: Any, text: str) -> Any:
    """``value`` shown as written where that differs from Python's form, with the value where it is not plain."""
    if not isinstance(value, int | float) or isinstance(value, bool) or text == repr(value) or len(text) > 80:
        return value
    plain = text.replace("_", "").lstrip("+")
    if isinstance(value, int) and plain.lstrip("-").startswith(("0x", "0o")):
        return _Written(f"{text} = {value}")
    if (
        isinstance(value, float)
        and not math.isfinite(value)
        and "inf" not in text.lower()
        and "nan" not in text.lower()
    ):
        return _Written(f"{text}, beyond a float's range: {value}")
    if isinstance(value, float) and "e" in plain.lower() and "e" not in repr(value):  # 1.00000000005e10
        return _Written(f"{text} = {value!r}")
    return _Written(text)


# A union branch's type, in words.
TYPE_WANTS = {
    "bool_type": "true, false",
    "bool_parsing": "true, false",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "dict_type": "a mapping",
}


def _either(options: list[str]) -> str:
    return options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"


def _merge_misspelt_keys(grouped: dict[str, dict[str, Any]]) -> None:
    """An unknown key meant as a required field that is missing is one problem, not two."""
    for entry in list(grouped.values()):
        meant = entry.pop("meant", None)
        if meant is None or "extra_forbidden" not in entry["kinds"]:
            continue
        for field in (meant, *SUPPLIES.get(meant, ())):
            sibling = ".".join(map(str, entry["path"][:-1] + (field,)))
            other = grouped.get(sibling)
            if other is not None and other["kinds"] == {"missing"}:
                del grouped[sibling]


# A field that gives others their default: misspelt, it is the one problem (data.sources gives data.uri).
SUPPLIES = {"sources": ("uri",)}


# An example line for the sections whose fields have no defaults to show.
EXAMPLES = {
    "ModelSection": "catalog: llama-3.1-8b",
    "DataSection": "uri: s3://my-bucket/tokens/",
    "BudgetSection": "total_tokens: 50_000_000_000",
    "ComputeSection": "instance_type: ml.p5.48xlarge",
    "Architecture": "layers: 32",
}


def _mapping_message(path: Loc, model: type[BaseModel] | None) -> str:
    """What a section that is not a mapping should be, with one of its fields as an example."""
    what = f"{path[-1]} fields" if path else "fields"
    example = _example(model) if model is not None else None
    return f"must be a mapping of {what}" + (f", such as {example}" if example else "")


def _example(model: type[BaseModel]) -> str | None:
    if model.__name__ in EXAMPLES:
        return EXAMPLES[model.__name__]
    for name, field in model.model_fields.items():
        default = field.default
        if isinstance(default, bool):
            return f"{name}: {str(default).lower()}"
        if isinstance(default, (int, float, str)):
            return f"{name}: {default}"
    return None


def _line_for(path: Loc, lines: Lines) -> int | None:
    for end in range(len(path), 0, -1):
        line = lines.get(".".join(map(str, path[:end])))
        if line:
            return line
    return 1 if path else None


def _message(error: ErrorDetails, path: Loc) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        parent = _model_at(path[:-1])
        message, _ = lookalike_hint(str(path[-1]), parent.model_fields if parent else [])
        return message
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '')}"
    if kind == "model_type":
        return _mapping_message(path, _model_at(path))
    if kind == "dict_type":
        example = ", such as team: ml" if path == ("tags",) else ""
        return f"must be a mapping of names to values (name: value lines){example}"
    if kind == "list_type":
        return "must be a list (lines starting with '- ', or [a, b])"
    if kind == "string_pattern_mismatch":
        meaning = PATTERN_MEANING.get(str(ctx.get("pattern", "")))
        return (
            f"must be {meaning}" if meaning else "has the wrong form for this field (tiered-training schema shows it)"
        )
    if kind in BOUNDS and isinstance(ctx.get(BOUNDS[kind][1]), int) and abs(ctx[BOUNDS[kind][1]]) >= 10_000:
        words, key = BOUNDS[kind]  # a large integer bound as a recipe may write it: 1_000_000
        return f"input should be {words} {ctx[key]:_}"
    msg = error["msg"].removeprefix("Value error, ")
    return msg[0].lower() + msg[1:] if msg else kind


# pydantic's bound errors: the words before the bound, and the bound's key in the error's context.
BOUNDS = {
    "greater_than": ("greater than", "gt"),
    "greater_than_equal": ("greater than or equal to", "ge"),
    "less_than": ("less than", "lt"),
    "less_than_equal": ("less than or equal to", "le"),
}
