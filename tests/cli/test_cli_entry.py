"""The ``tiered-training`` script (``tiered_training.cli:main``): the command it names runs as it does in the full
app, the rest (typos, --help, --version) sees every command, and the garbage collector is left as it was."""

from __future__ import annotations

import gc
import tomllib

import pytest
from support import ROOT

from tiered_training import cli

RECIPE = ROOT / "recipes" / "llama3-8b-fp8.yaml"


@pytest.fixture(autouse=True)
def _unfreeze():
    yield
    gc.unfreeze()  # main() sets the app's objects aside from collection; the rest of the session collects them


def run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        cli.main(list(args))
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_script_is_this_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tiered-training"] == "tiered_training.cli:main"


def test_a_named_command_runs(capsys):
    code, out, _ = run(capsys, "plan", str(RECIPE))
    assert code == 0 and "llama3-8b-fp8" in out
    code, out, _ = run(capsys, "plan", "--help")
    assert code == 0 and "Usage: tiered-training plan" in out and "--set" in out


def test_a_typo_is_answered_from_every_command(capsys):
    code, _, err = run(capsys, "expalin", str(RECIPE))
    assert code == 2 and "No such command 'expalin'" in err and "'explain'" in err


def test_help_and_version_see_the_whole_app(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("plan", "validate", "explain", "diff", "rehearse", "start", "calibrate"):
        assert command in out
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("tiered-training ")


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_left_as_it_was(capsys, enabled):
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        run(capsys, "--version")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
