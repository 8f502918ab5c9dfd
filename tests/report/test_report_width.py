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


def too_wide(text: str, width: int = WIDTH) -> list[str]:
    """Lines wider than ``width`` or ending in a space. A `command` wider than the line continues over lines
    ending in ``\\``; only a quoted word of one (an aws --query) may be wider than a narrow terminal."""
    return [
        line
        for line in text.splitlines()
        if line != line.rstrip() or (len(line) > width and not (width < WIDTH and "'].QuotaCode" in line))
    ]


def words(text: str) -> list[str]:
    """The words of printed text, without the ``\\`` that continue a long command."""
    return [word for word in text.split() if word != "\\"]


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
    assert words(text) == " ".join([*report.explain_lines(plan_file(name)), more]).split()
    assert "--format json" in text.splitlines()[-1] or "--format json" in text.splitlines()[-2]


@pytest.mark.parametrize("old, new", list(zip(NAMES, NAMES[1:] + NAMES[:1])))
def test_diff_of_every_template_fits_100_columns_piped_and_keeps_every_word(old, new):
    text = invoke("diff", old, new)
    assert too_wide(text) == []
    result = report.diff(plan_file(old), plan_file(new))
    assert words(text) == (report.diff_text(result) + report.diff_more_line(old, new)).split()


@pytest.mark.parametrize("args", [("plan", "."), ("validate", "."), ("templates",)])
def test_the_other_review_commands_on_every_template_fit_100_columns_piped(args):
    text = invoke(*args)
    assert too_wide(text) == [] and len(text.splitlines()) >= len(NAMES)


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


def test_a_backquoted_command_is_split_only_where_a_shell_joins_it_again():
    text = invoke("explain", "llama3-8b-fp8.yaml")
    commands = re.findall(r"`[^`]*`", text)
    assert commands and all("\n" not in command.replace(" \\\n", "") for command in commands)
    long = [command for command in commands if "\n" in command]
    assert long and all(command.startswith("`aws service-quotas ") for command in long)
    for command in long:  # each continuation under the command's first line, two columns in
        first, *rest = command.split(" \\\n")
        indent = len(text[: text.index(first)].rsplit("\n", 1)[-1])
        assert all(part.startswith(" " * (indent + 2)) and part[indent + 2] != " " for part in rest), command


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
