"""explain and diff fit 100 columns, piped and on a terminal, keep every word, and say how to see more."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from tiered_training import report
from tiered_training.cli.app import app
from tiered_training.planning.planner import plan_file
from tiered_training.recipe.templates import templates, templates_dir

WIDTH = 100
NAMES = [t.path.name for t in templates()]


def invoke(*args, columns: str | None = None) -> str:
    # CliRunner's stdout is not a terminal: COLUMNS unset is output piped to a file or `less`.
    result = CliRunner().invoke(app, list(args), prog_name="tiered-training", env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    return result.stdout


def a_command(line: str) -> bool:
    """A line that holds one `command` and nothing else: kept whole, to be copied, however wide."""
    return bool(re.fullmatch(r" *`[^`]*`[,.;]?", line))


def too_wide(text: str, width: int = WIDTH) -> list[str]:
    return [line for line in text.splitlines() if len(line) > width and not a_command(line)]


@pytest.fixture(autouse=True)
def in_templates(monkeypatch):
    # Paths as a person types them: relative, so the checkout's own path is not what is measured.
    monkeypatch.chdir(templates_dir())


@pytest.mark.parametrize("name", NAMES)
def test_explain_of_every_template_fits_100_columns_piped_and_keeps_every_word(name):
    text = invoke("explain", name)
    assert too_wide(text) == []
    assert max(map(len, text.splitlines())) > 60  # a wide report, not an empty one
    more = report.explain_more_line(name)
    assert text.split() == " ".join([*report.explain_lines(plan_file(name)), more]).split()
    assert "--format json" in text.splitlines()[-1] or "--format json" in text.splitlines()[-2]


@pytest.mark.parametrize("old, new", list(zip(NAMES, NAMES[1:] + NAMES[:1])))
def test_diff_of_every_template_fits_100_columns_piped_and_keeps_every_word(old, new):
    text = invoke("diff", old, new)
    assert too_wide(text) == []
    result = report.diff(plan_file(old), plan_file(new))
    assert text.split() == (report.diff_text(result) + report.diff_more_line(old, new)).split()


@pytest.mark.parametrize("columns", ["80", "100", "120"])
def test_explain_and_diff_fit_a_terminal_and_never_exceed_100_columns(columns):
    width = min(int(columns), WIDTH)
    explained = invoke("explain", "llama3-8b-fp8.yaml", columns=columns)
    diffed = invoke("diff", "llama3-8b-fp8.yaml", "llama3-8b-fp8-p5.yaml", columns=columns)
    assert too_wide(explained, width) == [] and too_wide(diffed, width) == []
    # Continuation lines of a decision start under its reason column where the reason has room there.
    lines = explained.splitlines()
    model = next(i for i, line in enumerate(lines) if line.startswith("  model "))
    hang = report.REASON_COLUMN if width - report.REASON_COLUMN >= 40 else 6
    assert lines[model + 1].startswith(" " * hang) and lines[model + 1][hang] != " "


def test_a_backquoted_command_is_never_split():
    text = invoke("explain", "llama3-8b-fp8.yaml")
    commands = re.findall(r"`[^`]*`", text)
    assert commands and all("\n" not in command for command in commands)


def test_a_row_wraps_under_its_column_unless_a_word_would_not_fit_there():
    from tiered_training.report.render import Hang, wrap_line

    row = Hang("  field" + " " * 45 + "[auto] " + "a reason of many words " * 6, 52)
    lines = wrap_line(row, 100, row.hang)
    assert len(lines) > 1 and all(line.startswith(" " * 52) and line[52] != " " for line in lines[1:])
    assert " ".join(lines).split() == row.split()
    command = Hang(row + " run `tiered-training prices --region us-east-1 --format json --price-list-only` now", 52)
    lines = wrap_line(command, 100, command.hang)
    assert any("`tiered-training prices --region us-east-1 --format json --price-list-only`" in line for line in lines)
    assert all(line.startswith("      ") and line[6] != " " for line in lines[1:])  # all under indent + 4
