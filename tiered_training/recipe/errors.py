"""Errors a user sees in a recipe: each names the file, line, field, bad value and what would be valid."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiered_training.text import clip, escape, quote


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    field: str
    message: str
    value: Any = None
    has_value: bool = False

    def __str__(self) -> str:
        where = f"{escape(self.file)}:{self.line}" if self.line else escape(self.file)
        got = f" (got {quote(self.value)})" if self.has_value else ""
        field = f"{clip(self.field, 120)}: " if self.field else ""
        return f"{where}: {field}{clip(self.message, 400)}{got}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the value quoted as it is in the message."""
        return {
            "file": self.file,
            "line": self.line,
            "field": clip(self.field, 120),
            "message": clip(self.message, 400),
            "value": quote(self.value) if self.has_value else None,
        }


class RecipeError(Exception):
    """A recipe file that cannot be loaded. ``str()`` is the readable report."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__(str(self))

    def __str__(self) -> str:
        count = len(self.problems)
        if count == 1:
            return str(self.problems[0])
        head = (
            f"{count} problem{'s' if count != 1 else ''} in {self.problems[0].file}"
            if self.problems
            else "invalid recipe"
        )
        return "\n".join([head] + [f"  {p}" for p in self.problems])
