"""Errors a user sees: each names the file, line, field, bad value and what would be valid."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .plan import Plan


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    field: str
    message: str
    value: Any = None
    has_value: bool = False

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        got = f" (got {self.value!r})" if self.has_value else ""
        return f"{where}: {self.field or '(recipe)'}: {self.message}{got}"


class RecipeError(Exception):
    """A recipe file that cannot be loaded. ``str()`` is the readable report."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__(str(self))

    def __str__(self) -> str:
        count = len(self.problems)
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
