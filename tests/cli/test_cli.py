"""The tiered-training CLI as a user runs it: exit codes, formats, no tracebacks."""

from __future__ import annotations

import json

import pytest
from support import RECIPES, ROOT, recipe_dict, unwrapped, write_yaml
from support import run_cli as run
from support import run_cli_process as run_process


def test_plan_table_over_all_templates():
    result = run("plan", "recipes/")
    assert result.returncode == 0, result.stderr
    for path in RECIPES:
        name = path.read_text().split("name: ", 1)[1].split()[0]
        assert name in result.stdout


def test_plan_json_is_stable_and_complete():
    result = run("plan", "--format", "json", *RECIPES)
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["schema_version"] == 3
    assert len(data["plans"]) == len(RECIPES)
    plan = data["plans"][0]
    assert {"memory_gib", "estimates", "decisions", "findings", "tuning"} <= set(plan)
    assert result.stdout == run("plan", "--format", "json", *RECIPES).stdout


def test_plan_markdown_is_a_table():
    result = run("plan", "--format", "markdown", RECIPES[0])
    assert result.returncode == 0
    assert result.stdout.startswith("| recipe |")


def test_invalid_recipe_exits_2_with_readable_message_and_no_traceback(tmp_path):
    bad = write_yaml(tmp_path / "bad.yaml", recipe_dict(sequence_length=64, **{"tuning.precision": "fp4"}))
    for command in ("validate", "plan", "explain"):
        result = (run_process if command == "validate" else run)(command, bad)
        assert result.returncode == 2, command
        assert "Traceback" not in result.stderr + result.stdout
        assert f"{bad}:" in result.stderr
        assert "sequence_length" in result.stderr and "tuning.precision" in result.stderr


def test_validate_exits_0_for_templates_and_2_for_a_plan_error(tmp_path):
    assert run("validate", "recipes/").returncode == 0
    wrong = write_yaml(tmp_path / "a100.yaml", recipe_dict(**{"compute.instance_type": "ml.p4d.24xlarge", "tuning.precision": "fp8"}))
    result = run("validate", wrong)
    assert result.returncode == 2
    assert "fp8-unsupported" in result.stderr and "Fix:" in result.stderr


def test_validate_strict_fails_on_warnings(tmp_path):
    warned = write_yaml(tmp_path / "warn.yaml", recipe_dict(**{"tuning.precision": "fp8"}))
    assert run("validate", warned).returncode == 0
    assert run("validate", "--strict", warned).returncode == 2


def test_explain_shows_every_decision_and_the_memory_proof():
    result = run("explain", "recipes/qwen2.5-32b-hybrid.yaml")
    assert result.returncode == 0
    for text in ("tuning.precision", "tuning.sharding", "tuning.micro_batch_size", "Memory per GPU", "fits", "MFU", "cost"):
        assert text in result.stdout


def test_diff_between_b200_and_p5_templates():
    result = run("diff", "--format", "json", "recipes/llama3-8b-fp8.yaml", "recipes/llama3-8b-fp8-p5.yaml")
    assert result.returncode == 0
    (data,) = json.loads(result.stdout)["diffs"]
    fields = {c["field"] for c in data["changed"]}
    assert "compute.instance_type" in fields
    cost = data["metrics"]["cost_usd"]
    assert (cost["delta"] is None) == (cost["old"] is None or cost["new"] is None)
    markdown = run("diff", "--format", "markdown", "recipes/llama3-8b-fp8.yaml", "recipes/llama3-8b-fp8-p5.yaml")
    assert "| decision | old | new | why |" in markdown.stdout
    text = run("diff", "recipes/llama3-8b-fp8.yaml", "recipes/llama3-8b-fp8-p5.yaml")
    assert "memory_gib_per_gpu" in text.stdout


def test_diff_of_identical_recipes_reports_no_change():
    result = run("diff", RECIPES[0], RECIPES[0])
    assert "no decision changed" in result.stdout


def test_tiers_prints_the_table_from_data():
    result = run("tiers", "--format", "markdown")
    assert result.returncode == 0
    for tier in ("small", "medium", "large"):
        assert f"| {tier} |" in result.stdout
    assert "selective" in result.stdout and "FP8" in result.stdout


def test_run_config_round_trips(tmp_path):
    result = run("run-config", "recipes/llama3-8b-fp8.yaml")
    assert result.returncode == 0
    from tiered_training.contract.runconfig import RunConfig

    config = RunConfig.model_validate(json.loads(result.stdout)["run_config"])
    assert config.recipe_name == "llama3-8b-fp8"
    from training.__main__ import load_config

    (tmp_path / "run.json").write_text(result.stdout)  # the container reads the output as it is
    assert load_config(tmp_path / "run.json") == config


def test_readme_quotes_the_tier_table():
    from tiered_training import report

    readme = (ROOT / "README.md").read_text()
    assert report.markdown_table(report.tier_rows(), report.TIER_COLUMNS) in readme


def test_plan_chart_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "memory.png"
    result = run("plan", "--chart", out, RECIPES[0])
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_diff_shows_the_segments_when_the_accounts_runtime_limit_changes(tmp_path):
    """The same recipe with the account's raised runtime quota: fewer, longer training jobs, and the diff says so."""
    text = (ROOT / "recipes/qwen2.5-32b-hybrid.yaml").read_text()
    raised = tmp_path / "raised.yaml"
    raised.write_text(text.replace("  instance_count: 4\n", "  instance_count: 4\n  quotas:\n    training-job-max-runtime: 1209600\n"))
    (data,) = json.loads(run("diff", "--format", "json", "recipes/qwen2.5-32b-hybrid.yaml", raised).stdout)["diffs"]
    changed = {c["field"]: (c["old"], c["new"]) for c in data["changed"]}
    assert changed["compute.segments"] == (2, 1) and changed["compute.max_runtime_hours"] == (120.0, 336.0)


def test_every_template_passes_validate_strict():
    result = run("validate", "--strict", "recipes/")
    assert result.returncode == 0, result.stderr
    verdicts = [
        line for line in unwrapped(result.stdout).splitlines() if not (line.startswith("account: ") and line.endswith(" [quota-needed]"))
    ]
    assert verdicts == [f"{path.relative_to(ROOT)}: ok" for path in RECIPES]


def test_a_recipe_is_found_by_its_pipeline_name():
    qwen = ROOT / "recipes" / "qwen2.5-14b-fp8.yaml"
    by_name = run("run-config", "qwen25-14b-fp8")
    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout == run("run-config", qwen).stdout
    unknown = run("explain", "qwen-14b")
    assert unknown.returncode == 2
    assert "qwen25-14b-fp8" in unknown.stderr and unknown.stderr.count("\n") == 1
