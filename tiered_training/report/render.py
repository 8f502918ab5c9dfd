"""Put report content on a terminal or a pipe, safely.

- User text is never read as rich markup: tables hold :class:`rich.text.Text`, and
  lines are printed with ``markup=False``, so ``[/]`` or ``[bold]`` in a recipe prints
  as written.
- On a terminal, output fits its width: a table too wide for it becomes one block
  of ``key  value`` lines per row, and long lines wrap at spaces with a hanging
  indent, so a number is never split across lines.
- Piped (not a terminal, no ``COLUMNS``), plain lines do not wrap (an ``error:`` line is one
  line), but a report's (:func:`print_report`: explain, diff, validate's findings) and notes wrap at
  100 columns; a `command` longer than that continues over lines ending in ``\\``.
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


class Console:
    """Where a command prints: stdout or stderr, its width, whether it is a terminal and may be styled.

    Plain lines and tables that fit are written here directly; rich (about 30 ms to import) is loaded
    only for what needs it: a table that wraps or becomes blocks (:meth:`rich`).
    """

    def __init__(self, stderr: bool = False):
        self.stderr = stderr
        self.file = sys.stderr if stderr else sys.stdout
        isatty = getattr(self.file, "isatty", lambda: False)
        self.is_terminal = bool(os.environ.get("FORCE_COLOR")) or isatty()
        # NO_COLOR set (https://no-color.org): no colour, and no bold or other ANSI style either.
        self.styled = self.is_terminal and not os.environ.get("NO_COLOR")
        if self.is_terminal:
            self.width = _columns() or _terminal_columns(self.file)
        else:
            self.width = _columns() or UNBOUNDED
        self._rich: Any = None

    def rich(self):
        """The rich Console of the same stream, width and styling."""
        if self._rich is None:
            from rich.console import Console as Rich

            self._rich = Rich(
                file=self.file,
                stderr=self.stderr,
                highlight=False,
                markup=False,
                emoji=False,
                width=self.width,
                soft_wrap=self.width == UNBOUNDED,
                force_terminal=self.is_terminal,
                color_system="auto" if self.styled else None,
            )
        return self._rich

    def print(self, text: str = "", soft_wrap: bool = False) -> None:
        """One line of plain text (wrapped at spaces to the width, unless ``soft_wrap``)."""
        if soft_wrap:
            self.file.write(text + "\n")
            self.file.flush()
        else:
            print_lines(self, [text])

    def bold(self, text: str) -> str:
        return f"\x1b[1m{text}\x1b[0m" if self.styled else text


def console(stderr: bool = False) -> Console:
    """stdout's (or stderr's) :class:`Console`: the terminal's width on a terminal, ``COLUMNS`` if set,
    else unbounded."""
    return Console(stderr)


def _terminal_columns(file) -> int:
    try:
        return os.get_terminal_size(file.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        return 80


def _columns() -> int | None:
    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def width_of(con) -> int | None:
    """The width to wrap at, or None where nothing should wrap."""
    return None if con.width >= UNBOUNDED else con.width


class Hang(str):
    """A line of text that wraps with its continuation lines starting at column ``hang`` (under the
    column where its prose begins), not at its own indent plus four."""

    hang: int

    def __new__(cls, text: str, hang: int) -> Hang:
        line = super().__new__(cls, text)
        line.hang = hang
        return line


# Continuation lines keep at least this many columns for text; a deeper hang falls back to indent + 4.
MIN_HANG_TEXT = 40


def print_lines(con, lines: Iterable[str]) -> None:
    """Plain lines, wrapped at spaces (hanging indent) when the console has a width; a `command` in
    backquotes stays whole on one line, to be copied; never markup."""
    _write_wrapped(con, lines, width_of(con))


def print_report(con, lines: Iterable[str]) -> None:
    """A report's lines (explain, diff), wrapped at spaces to :data:`NOTE_WIDTH` (or the console's width
    if narrower), piped or not; a :class:`Hang` line's continuation starts under its prose column."""
    _write_wrapped(con, lines, min(width_of(con) or NOTE_WIDTH, NOTE_WIDTH))


def _write_wrapped(con, lines: Iterable[str], width: int | None) -> None:
    out = con.file
    for line in lines:
        hang = getattr(line, "hang", None)
        line = clip(line, LINE_LIMIT) if len(line) > LINE_LIMIT else line
        line = line if line.isprintable() else escape(line)  # one line, whatever a name holds
        if width is None or len(line) <= width:
            out.write(line + "\n")
            continue
        out.write("\n".join(wrap_line(line, width, hang)) + "\n")
    out.flush()


def wrap_line(line: str, width: int, hang: int | None = None) -> list[str]:
    """``line`` wrapped at spaces to ``width``: continuation lines start at column ``hang`` (default:
    the line's indent plus four); a word longer than the width stays whole, and so does a `command` in
    backquotes, except one longer than the width: it continues over lines that end in ``\\``, as a shell
    reads it, broken at spaces outside quotes."""
    indent = " " * (len(line) - len(line.lstrip(" ")))
    line = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", NBSP), line)
    line = re.sub(r"^( *[a-z]+:) ", lambda m: m.group(1) + NBSP, line)  # `warning: PATH` stays on its first line
    # Under its column where the longest word fits there, else under the line's indent plus four.
    longest = max((len(word) for word in line.split(" ")), default=0)  # a `command` is one word here
    if hang is None or width - hang < max(MIN_HANG_TEXT, longest):
        hang = len(indent) + 4
    wrapped = textwrap.wrap(
        line.strip(" "),
        width=width,
        initial_indent=indent,
        subsequent_indent=" " * hang,
        break_long_words=False,
        break_on_hyphens=False,
    )
    out: list[str] = []
    for part in wrapped or [line]:
        if len(part) > width and "`" in part and NBSP in part:
            out += _continued(part, width)
        else:
            out.append(part.replace(NBSP, " "))
    return out


def _continued(part: str, width: int) -> list[str]:
    """A line that is one long `command` (its spaces no-break spaces), as shell lines joined by ``\\``:
    broken at spaces outside quotes, each continuation two columns deeper; a word wider than that stays whole."""
    text = part.lstrip(" ")
    lead = part[: len(part) - len(text)]
    words, word, quote = [], "", ""
    for char in text:
        if char == NBSP and not quote:
            words.append(word)
            word = ""
            continue
        if char in "\"'" and (not quote or quote == char):
            quote = "" if quote else char
        word += char.replace(NBSP, " ")
    words.append(word)
    lines: list[str] = []
    current = ""
    for word in words:
        indent = lead if not lines else lead + "  "
        if current and len(indent) + len(current) + 1 + len(word) + 2 > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    lines.append(current)
    return [
        (lead if index == 0 else lead + "  ") + chunk + (" \\" if index < len(lines) - 1 else "")
        for index, chunk in enumerate(lines)
    ]


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
    numeric = set(numeric)
    width = width_of(con)
    plain = _plain_table(con, rows, columns, numeric, show_lines)
    if plain is not None and (wide and width is None or plain_width(plain) <= (width or PIPED_TABLE_WIDTH)):
        con.file.write("".join(line + "\n" for line in plain))  # printable ASCII (and the header's bold)
        con.file.flush()
        return
    from rich import box
    from rich.table import Table

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
    out = con.rich()
    measured = out.measure(table, options=out.options.update_width(UNBOUNDED))
    if width is None:
        if measured.maximum > PIPED_TABLE_WIDTH and not wide:
            _wrap_prose(table, columns, rows, PIPED_TABLE_WIDTH)
        _print_stripped(out, table)
        return
    if measured.maximum <= width:
        _print_stripped(out, table)
        return
    _print_blocks(out, rows, columns, title_column or columns[0], numeric)


def _print_stripped(out, table) -> None:
    """A rich table with no trailing spaces (rich pads every cell to its column's width)."""
    with out.capture() as captured:
        out.print(table)
    out.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    out.file.flush()


def plain_width(lines: list[str]) -> int:
    """The widest of a plain table's lines (its rule's)."""
    return len(lines[1])


def _plain_table(con, rows, columns, numeric, show_lines: bool) -> list[str] | None:
    """The table as rich draws it (a rule under the header, :data:`GAP` spaces between columns), one line
    per row, or None where only rich can draw it: a cell of more than one line or of characters wider
    than one column."""
    texts = [[str(c) for c in columns]]
    for row in rows:
        texts.append([clip("" if row.get(c) is None else str(row.get(c)), CELL_LIMIT) for c in columns])
    if not all(cell.isascii() and cell.isprintable() for line in texts for cell in line):
        return None
    widths = [max(len(line[i]) for line in texts) for i in range(len(columns))]
    gap = " " * GAP

    def line(cells: list[str]) -> str:
        return gap.join(
            cell.rjust(w) if column in numeric else cell.ljust(w) for cell, w, column in zip(cells, widths, columns)
        ).rstrip()

    total = sum(widths) + GAP * (len(columns) - 1)
    out = [con.bold(line(texts[0])), "\u2500" * total]
    for index, cells in enumerate(texts[1:]):
        if show_lines and index:
            out.append("")
        out.append(line(cells))
    return out


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
        _print_stripped(con, grid)


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
