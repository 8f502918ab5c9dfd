"""The recipe templates: the reviewed recipes that ship with the package, and a new recipe made from one.

In a source checkout they are ``recipes/`` beside the package; an installed wheel carries the same files as
the package data ``tiered_training/templates/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tiered_training.recipe.errors import Problem, RecipeError
from tiered_training.recipe.names import name_problem
from tiered_training.text import clip

PACKAGED = "templates"  # tiered_training/templates/ in a wheel
SCHEMA_LINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)\s*$")
NAME_LINE = re.compile(r"^name:[ \t]*(\S.*?)[ \t]*(#.*)?$", re.M)


@dataclass(frozen=True)
class Template:
    path: Path

    @property
    def id(self) -> str:
        return self.path.stem

    def about(self) -> str:
        """The first sentence of the template's leading comment."""
        words: list[str] = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            if not SCHEMA_LINE.match(line):
                words.append(line.lstrip("# ").strip())
        text = " ".join(w for w in words if w)
        return re.split(r"(?<=[.])\s", text, maxsplit=1)[0].rstrip(".")  # whole: a table wraps it


def templates_dir() -> Path:
    """Where the templates are: ``tiered_training/templates/`` (a wheel) or ``recipes/`` (a checkout)."""
    library = Path(__file__).resolve().parents[1]
    for folder in (library / PACKAGED, library.parent / "recipes"):
        if any(folder.glob("*.yaml")):
            return folder
    raise RecipeError([Problem(str(library / PACKAGED), None, "", "no templates: reinstall tiered-training")])


def templates() -> list[Template]:
    return [Template(path) for path in sorted(templates_dir().glob("*.yaml"))]


def find_template(name: str) -> Template:
    """A template by its id (file stem) or its ``name:``; a RecipeError with the closest ids otherwise."""
    import difflib

    every = templates()
    for template in every:
        if name in (template.id, template.path.name, _name_of(template.path.read_text(encoding="utf-8"))):
            return template
    ids = [t.id for t in every]
    close = difflib.get_close_matches(name, ids, n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(close)}?" if close else f"the templates are {', '.join(ids)}"
    raise RecipeError([Problem("--from", None, "", f"no template {clip(name, 60)!r}: {hint}")])


def _name_of(text: str) -> str | None:
    match = NAME_LINE.search(text)
    return match.group(1).strip("'\"") if match else None


def new_recipe_text(template: Template, name: str, schema: str | None) -> str:
    """The template's text with ``name:`` set to ``name`` and the schema line pointing to ``schema``."""
    problem = name_problem(name)
    if problem:
        raise RecipeError([Problem("NAME", None, "", f"{clip(name, 60)!r}: {problem}")])
    text = template.path.read_text(encoding="utf-8")
    text = NAME_LINE.sub(lambda m: f"name: {name}" + (f"  {m.group(2)}" if m.group(2) else ""), text, count=1)
    lines = text.splitlines(keepends=True)
    if lines and SCHEMA_LINE.match(lines[0].rstrip("\n")):
        lines = lines[1:]
    head = f"# yaml-language-server: $schema={schema}\n" if schema else ""
    return head + "".join(lines)
