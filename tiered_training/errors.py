"""Errors a user sees: each names the file, line, field, bad value and what would be valid."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .plan import Plan

# A message quotes at most this many characters of a user's value.
QUOTE_LIMIT = 80


def clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` on one line, cut to ``limit`` characters with a note of how much was left out."""
    text = " ".join(str(text).split()) if ("\n" in text or "\r" in text) else str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def escape(text: str) -> str:
    """``text`` with every unprintable character (newline, tab, escape...) written as Python escapes it.

    For names the user chose (a file name may hold a newline): the message stays on one line,
    and the name stays recognisable.
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` cut to ``limit`` characters (a 50 MB string is never quoted whole)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit for str()
        return f"<an integer of more than {limit} digits>"
    return clip(text, limit)


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
        head = f"{count} problem{'s' if count != 1 else ''} in {self.problems[0].file}" if self.problems else "invalid recipe"
        return "\n".join([head] + [f"  {p}" for p in self.problems])


class PlanError(Exception):
    """A recipe that loads but cannot work: the plan has hard errors."""

    def __init__(self, plan: "Plan"):
        self.plan = plan
        super().__init__(str(self))

    def __str__(self) -> str:
        from .report import format_finding

        lines = [f"{self.plan.name}: {len(self.plan.errors)} error(s)"]
        lines += [f"  {format_finding(self.plan, f)}" for f in self.plan.errors]
        return "\n".join(lines)
