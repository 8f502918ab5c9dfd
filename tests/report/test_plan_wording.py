"""What the plan says about its own evidence: the calibration's rows, and MFU both ways."""

from __future__ import annotations

import math
import re

from support import ROOT, unwrapped
from typer.testing import CliRunner

from tiered_training import catalog as catalogs
from tiered_training.cli.app import app


def explain(path):
    result = CliRunner().invoke(app, ["explain", str(path)], prog_name="tiered-training", env={"COLUMNS": None})
    assert result.exit_code == 0, result.output
    return unwrapped(result.stdout)


def test_explain_and_readme_separate_published_runs_from_this_containers_own():
    s = catalogs.performance_model().summary
    assert s.own_rows > 0 and s.published_rows > 0
    phrase = f"calibrated on {s.published_rows} published runs from {s.sources - 1} sources, plus {s.own_rows} runs of this container"
    assert phrase in explain(ROOT / "recipes/llama3-8b-fp8.yaml")
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text())
    assert phrase in readme


def test_plan_and_explain_report_mfu_with_full_and_causal_attention_labelled():
    import json

    from tiered_training.planning.planner import plan_file

    path = ROOT / "recipes/llama3-8b-128k.yaml"
    plan = plan_file(path)
    e, arch, seq = plan.estimates, plan.architecture, plan.recipe.sequence_length
    full, causal = arch.flops_per_token(seq), arch.flops_per_token(seq, causal=True)
    # Same numbers in a different order of operations: equal to a few units in the last place.
    assert math.isclose(e.mfu_causal, e.mfu * causal / full, rel_tol=1e-12)
    assert e.mfu_causal < 0.7 * e.mfu  # at 128K the two differ by far more than rounding
    line = next(x for x in explain(path).splitlines() if "MFU" in x)
    assert f"{e.mfu:.1%} counting full attention (6N + 12*L*h*s, torchtitan's convention" in line
    assert f"{e.mfu_causal:.1%} counting the causal half of attention (6N + 6*L*h*s)" in line
    runner = CliRunner()
    table = runner.invoke(app, ["plan", "--wide", str(path)], prog_name="tiered-training", env={"COLUMNS": None}).stdout
    assert "MFU full/causal" in table and f"{e.mfu:.1%}/{e.mfu_causal:.1%}" in table
    data = json.loads(runner.invoke(app, ["plan", "-f", "json", str(path)], prog_name="tiered-training", env={"COLUMNS": None}).stdout)
    assert data["plans"][0]["estimates"]["mfu_causal"] == e.mfu_causal


def test_readme_quotes_the_stored_leave_one_source_out_figures():
    s = catalogs.performance_model().summary
    readme = (ROOT / "README.md").read_text()
    row = (f"| **published sources** | {s.published_rows} | **{s.loso_published_median_error:.1%}** | "
           f"**{s.loso_published_worst_error:.1%}** |")
    assert row in readme, "make calibrate changed the figures: update the README's table"
    assert f"| all sources | {s.rows} | {s.loso_median_error:.1%} | {s.loso_worst_error:.1%} | " in readme
