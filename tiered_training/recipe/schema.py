"""The recipe's JSON Schema and the field reference generated from it.

``tiered-training schema`` prints the schema (pydantic's ``model_json_schema`` of
:class:`tiered_training.recipe.Recipe`). The committed copies, ``docs/recipe.schema.json``
(which the templates name in their ``yaml-language-server`` header, for editor
completion and checks) and ``docs/recipe.md``, are written by
``python -m tiered_training.recipe.schema --write``; a test keeps them current.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tiered_training.recipe.grouped import grouped_pattern, integer_bounds

DRAFT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_FILE = Path("docs/recipe.schema.json")
REFERENCE_FILE = Path("docs/recipe.md")
# The first line of every template: yaml-language-server (the YAML extension of VS Code and
# others) validates and completes the file against the schema it names.
HEADER = "# yaml-language-server: $schema=../docs/recipe.schema.json"


def recipe_schema() -> dict[str, Any]:
    from tiered_training.recipe import Recipe

    schema = Recipe.model_json_schema(schema_generator=_generator())
    return {"$schema": DRAFT, "title": "tiered-training recipe", **{k: v for k, v in schema.items() if k != "title"}}


# Marks the string that stands for a grouped number (docs/recipe.md says it once, in its header).
GROUPED_COMMENT = "an integer with its digits grouped by thousands, within the field's bounds"
# A number that is NaN or infinite meets both (every comparison with NaN is false), a finite one neither: under
# `not`, the schema refuses `.nan` and `.inf` as the loader does (allow_inf_nan=False), where bounds cannot.
LARGEST = 1.7976931348623157e308
NOT_FINITE = {"type": "number", "anyOf": [{"exclusiveMinimum": LARGEST}, {"exclusiveMaximum": -LARGEST}]}


def _generator() -> type[Any]:
    """pydantic's generator, with an integer's grouped form (``50_000_000_000``) beside each number.

    The loader reads ``50_000_000_000`` as an integer; a YAML 1.2 parser in an editor reads it as
    text, so the schema takes that text where a number goes, only for an integer within the field's
    bounds (the loader refuses other underscores). A float field refuses NaN and the infinities.
    """
    from pydantic.json_schema import GenerateJsonSchema

    def grouped(number: dict[str, Any]) -> list[dict[str, Any]]:
        bounds = integer_bounds(number)
        if bounds is None:
            return []
        low, high = bounds
        words = f"from {low:_} to {high:_}" if high is not None else f"of at least {low:_}"
        return [{"type": "string", "pattern": grouped_pattern(low, high), "$comment": GROUPED_COMMENT,
                 "patternErrorMessage": f"an integer {words}, with its digits grouped by thousands"}]

    class RecipeJsonSchema(GenerateJsonSchema):
        def int_schema(self, schema: Any) -> dict[str, Any]:
            number = super().int_schema(schema)
            return {"anyOf": [number, *grouped(number)]}

        def float_schema(self, schema: Any) -> dict[str, Any]:
            number = super().float_schema(schema)
            return {"anyOf": [{**number, "not": NOT_FINITE}, *grouped(number)]}

    return RecipeJsonSchema


def schema_text() -> str:
    return json.dumps(recipe_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        return f"[{prop['$ref'].rsplit('/', 1)[-1]}](#{prop['$ref'].rsplit('/', 1)[-1].lower()})"
    if "anyOf" in prop:  # an integer's grouped form is said once, in the header
        return " or ".join(_type(p, defs) for p in prop["anyOf"] if p.get("$comment") != GROUPED_COMMENT)
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs)}"
    if kind == "object":
        extra = prop.get("additionalProperties")
        return f"map of {_type(extra, defs)}" if isinstance(extra, dict) else "map"
    bounds = _bounds(prop)
    return f"{kind}{f' ({bounds})' if bounds else ''}"


def _bounds(prop: dict[str, Any]) -> str:
    parts = []
    for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in prop:
            parts.append(f"{sign} {prop[key]:g}" if isinstance(prop[key], float) else f"{sign} {prop[key]:,}")
    if "minLength" in prop:
        parts.append(f"at least {prop['minLength']} characters")
    if "maxLength" in prop:
        parts.append(f"at most {prop['maxLength']:,} characters")
    if "maxItems" in prop:
        parts.append(f"at most {prop['maxItems']} items")
    if "pattern" in prop:
        parts.append(f"pattern `{prop['pattern']}`")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(title: str, model: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    required = set(model.get("required", []))
    lines = [f"## {title}", ""]
    if model.get("description"):
        lines += [" ".join(model["description"].split()), ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    for name, prop in model.get("properties", {}).items():
        if name in required:
            default = "required"
        elif isinstance(prop.get("default"), dict) and prop["default"]:
            default = "see the section"  # a section's defaults are its fields'
        else:
            default = f"`{json.dumps(prop.get('default'))}`" if "default" in prop else ""
        lines.append(
            f"| `{name}` | {_cell(_type(prop, defs))} | {_cell(default)} | {_cell(prop.get('description', ''))} |"
        )
    return lines + [""]


def _section_paths(schema: dict[str, Any], defs: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Each definition's field path in a recipe (``compute``, ``model.dimensions``)."""
    found: dict[str, str] = {}
    for name, prop in schema.get("properties", {}).items():
        for ref in _refs(prop):
            if ref not in found:
                found[ref] = prefix + name
                found.update(
                    {k: v for k, v in _section_paths(defs[ref], defs, f"{prefix}{name}.").items() if k not in found}
                )
    return found


def _refs(prop: dict[str, Any]) -> list[str]:
    if "$ref" in prop:
        return [prop["$ref"].rsplit("/", 1)[-1]]
    return [r for p in prop.get("anyOf", []) for r in _refs(p)]


def reference_text() -> str:
    """docs/recipe.md: every field of a recipe, its type, bounds, default and meaning."""
    schema = recipe_schema()
    defs = schema.get("$defs", {})
    lines = [
        "# Recipe fields",
        "",
        "Generated from the recipe's JSON Schema ([recipe.schema.json](recipe.schema.json), also printed by",
        "`tiered-training schema`) by `python -m tiered_training.recipe.schema --write`; do not edit by hand.",
        "Values are YAML 1.2: `true`/`false` are the only booleans, and `1:30` or `yes` are text.",
        "A number may be written with its digits grouped by thousands, `50_000_000_000`, and only so:",
        "`1_0` and `1_000.5` are errors. (To a YAML 1.2 parser such as an editor's the grouped form is text,",
        "so the schema takes it as a string of that form when the integer is within the field's bounds.)",
        "As in JSON Schema, a number with no fractional part is an integer: `1.0` and `8.192e3` are 1 and 8192.",
        "`.nan` and `.inf` are refused everywhere.",
        "",
    ]
    lines += _table("Recipe", schema, defs)
    paths = _section_paths(schema, defs)
    for name in sorted(defs, key=lambda n: (paths.get(n, "~"), n)):
        title = f"{paths[name]} ({name})" if name in paths else name
        lines += [f'<a id="{name.lower()}"></a>', ""] + _table(title, defs[name], defs)
    return "\n".join(lines).rstrip("\n") + "\n"


def outputs(root: Path) -> dict[Path, str]:
    return {root / SCHEMA_FILE: schema_text(), root / REFERENCE_FILE: reference_text()}


def main(argv: list[str] | None = None) -> int:
    """``--write``: write docs/recipe.schema.json and docs/recipe.md; ``--check``: exit 1 when they are stale."""
    args = sys.argv[1:] if argv is None else argv
    root = Path(__file__).resolve().parents[2]
    stale = [path for path, text in outputs(root).items() if not path.is_file() or path.read_text() != text]
    if "--write" in args:
        for path, text in outputs(root).items():
            path.write_text(text)
        return 0
    for path in stale:
        print(f"{path} is stale: run python -m tiered_training.recipe.schema --write", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
