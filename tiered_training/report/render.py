"""Put report content on a terminal or a pipe, safely.

- User text is never read as rich markup: tables hold :class:`rich.text.Text`, and
  lines are printed with ``markup=False``, so ``[/]`` or ``[bold]`` in a recipe prints
  as written.
- On a terminal, output fits its width: a table too wide for it becomes one block
  of ``key  value`` lines per row, and long lines wrap at spaces with a hanging
  indent, so a number is never split across lines.
- Piped (not a terminal, no ``COLUMNS``), lines do not wrap: a line is as long as it is.
  A table wider than :data:`PIPED_TABLE_WIDTH` wraps its prose cells at spaces to that
  width (numbers and single words are never split), so ``tiers | less`` stays readable.
- Every cell and line is capped (:data:`CELL_LIMIT`, :data:`LINE_LIMIT`), so a huge
  value costs nothing to lay out.
"""

from __future__ import annotations

import math
import os
import re
import sys
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

from tiered_training.text import clip, escape

CELL_LIMIT = 120
LINE_LIMIT = 4000
# Width for output that is not a terminal: wide enough that nothing wraps.
UNBOUNDED = 100_000
# Piped, a table wider than this wraps its prose cells (at spaces) to this width.
PIPED_TABLE_WIDTH = 100
# Notes under a table (legends, sources, hints) wrap at spaces to this width, or the terminal's if narrower.
NOTE_WIDTH = 100
NBSP = "\u00a0"
GAP = 2  # columns between two of a table's columns


def console(stderr: bool = False):
    """A rich Console: the terminal's width on a terminal, ``COLUMNS`` if set, else unbounded.

    ``NO_COLOR`` set (https://no-color.org): no colour, and no bold or other ANSI style either.
    """
    from rich.console import Console

    plain = {"color_system": None} if os.environ.get("NO_COLOR") else {}
    probe = Console(stderr=stderr, highlight=False, markup=False, emoji=False, **plain)
    if probe.is_terminal:
        return probe
    width = _columns() or UNBOUNDED
    return Console(
        stderr=stderr, highlight=False, markup=False, emoji=False, width=width, soft_wrap=width == UNBOUNDED, **plain
    )


def _columns() -> int | None:
    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def width_of(con) -> int | None:
    """The width to wrap at, or None where nothing should wrap."""
    return None if con.width >= UNBOUNDED else con.width


def print_lines(con, lines: Iterable[str]) -> None:
    """Plain lines, wrapped at spaces (hanging indent) when the console has a width; never markup."""
    width = width_of(con)
    out = con.file
    for line in lines:
        line = clip(line, LINE_LIMIT) if len(line) > LINE_LIMIT else line
        line = line if line.isprintable() else escape(line)  # one line, whatever a name holds
        if width is None or len(line) <= width:
            out.write(line + "\n")
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")))
        wrapped = textwrap.wrap(
            line.strip(" "),
            width=width,
            initial_indent=indent,
            subsequent_indent=indent + "    ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        out.write("\n".join(wrapped or [line]) + "\n")
    out.flush()


def print_notes(con, lines: Iterable[str]) -> None:
    """Prose under a table, wrapped at spaces to :data:`NOTE_WIDTH` (or the console's width if narrower),
    piped or not; a word longer than the width (a path, a command) stays whole."""
    width = min(width_of(con) or NOTE_WIDTH, NOTE_WIDTH)
    wrapped = []
    for line in lines:
        line = line if line.isprintable() else escape(line)
        # A `command` stays on one line: its spaces are no-break spaces while the line wraps.
        line = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", NBSP), line)
        parts = textwrap.wrap(line, width=width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
        wrapped += [part.replace(NBSP, " ") for part in parts] or [""]
    print_lines(con, wrapped)


def _cell(value: Any):
    from rich.text import Text

    return Text(clip("" if value is None else str(value), CELL_LIMIT))


def print_table(
    con,
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    *,
    numeric: Iterable[str] = (),
    title_column: str | None = None,
    show_lines: bool = False,
    wide: bool = False,
) -> None:
    """Rows as a table when it fits the console, else one ``key  value`` block per row.

    ``numeric`` columns never wrap; nothing is folded, so a number is never split. A ``wide`` table
    (asked for with ``--wide``) keeps each row on one line when piped.
    """
    from rich import box
    from rich.table import Table

    numeric = set(numeric)
    # A rule under the header, two spaces between columns, no borders: the narrowest table that reads well.
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        header_style="bold",
        show_lines=show_lines,
    )
    for column in columns:
        prose = column not in numeric and any(" " in str(row.get(column) or "") for row in rows)
        table.add_column(column, no_wrap=not prose, justify="right" if column in numeric else "left")
    for row in rows:
        table.add_row(*(_cell(row.get(c, "")) for c in columns))
    width = width_of(con)
    measured = con.measure(table, options=con.options.update_width(UNBOUNDED))
    if width is None:
        if measured.maximum > PIPED_TABLE_WIDTH and not wide:
            _wrap_prose(table, columns, rows, PIPED_TABLE_WIDTH)
        con.print(table)
        return
    if measured.maximum <= width:
        con.print(table)
        return
    _print_blocks(con, rows, columns, title_column or columns[0], numeric)


def _wrap_prose(table, columns: Sequence[str], rows: Sequence[dict[str, Any]], target: int) -> None:
    """Fix the widths of the prose columns so that the table is at most ``target`` wide where it can be.

    The widest prose column gives way first, never below its longest word or its header's
    longest word; the other columns keep their full width, so no number or name is cut.
    """
    texts = {c: [str(c)] + [clip("" if r.get(c) is None else str(r.get(c)), CELL_LIMIT) for r in rows] for c in columns}
    natural = {c: max(len(t) for t in texts[c]) for c in columns}
    floor = {c: max(len(w) for t in texts[c] for w in (t.split() or [""])) for c in columns}
    prose = [i for i, column in enumerate(table.columns) if not column.no_wrap]
    widths = {i: natural[columns[i]] for i in prose}
    fixed = sum(natural[c] for i, c in enumerate(columns) if i not in widths)
    budget = target - fixed - GAP * (len(columns) - 1)
    while sum(widths.values()) > budget:
        shrinkable = [i for i in widths if widths[i] > floor[columns[i]]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
    for i, w in widths.items():
        table.columns[i].width = w


def _print_blocks(con, rows, columns, title_column, numeric) -> None:
    from rich.table import Table
    from rich.text import Text

    key_width = max(len(c) for c in columns)
    for index, row in enumerate(rows):
        if index:
            con.print()
        con.print(Text(clip(str(row.get(title_column, "")), CELL_LIMIT), style="bold"))
        grid = Table.grid(padding=(0, 2))
        grid.add_column(width=key_width, no_wrap=True, style="dim")
        grid.add_column(overflow="fold")
        for column in columns:
            if column == title_column or row.get(column) in (None, ""):
                continue
            grid.add_row(Text(column), _cell(row[column]))
        con.print(grid)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no Infinity or NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(data: Any) -> str:
    """Strict JSON (no NaN or Infinity), sorted keys, two-space indent."""
    import json

    return json.dumps(finite(data), indent=2, sort_keys=True, allow_nan=False, default=str)


def print_json(data: Any) -> None:
    sys.stdout.write(dumps(data) + "\n")
    sys.stdout.flush()
