"""What the plan says about its own evidence: the calibration's rows, and MFU both ways."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from support import ROOT
from tiered_training import catalogs
from tiered_training.cli import app


def explain(path):
    result = CliRunner().invoke(app, ["explain", str(path)], prog_name="tiered-training", env={"COLUMNS": None})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_explain_and_readme_separate_published_runs_from_this_containers_own():
    s = catalogs.performance_model().summary
    assert s.own_rows > 0 and s.published_rows > 0
    phrase = f"calibrated on {s.published_rows} published runs from {s.sources - 1} sources, plus {s.own_rows} runs of this container"
    assert phrase in explain(ROOT / "recipes/llama3-8b-fp8.yaml")
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text())
    assert phrase in readme
