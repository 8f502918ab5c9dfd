"""Overrides (--set), a recipe on standard input, recipe names that must be unique, directory diffs,
and new recipes from templates (templates, init)."""

from __future__ import annotations

import json
import subprocess

import yaml
from support import CLI, RECIPES, ROOT, recipe_dict, unwrapped, write_yaml
from support import run_cli as run

TEMPLATE = ROOT / "recipes" / "llama3-8b-fp8.yaml"


def _decision(data: dict, field: str):
    (plan,) = data["plans"]
    return next(d for d in plan["decisions"] if d["field"] == field)


def test_set_overrides_a_field_as_if_the_file_said_it():
    result = run("plan", TEMPLATE, "--set", "tuning.precision=bf16", "--format", "json")
    assert result.returncode == 0, result.stderr
    decision = _decision(json.loads(result.stdout), "tuning.precision")
    assert decision["value"] == "bf16" and decision["source"] == "recipe"
    untouched = json.loads(run("plan", TEMPLATE, "--format", "json").stdout)
    assert _decision(untouched, "tuning.precision")["value"] == "fp8"


def test_a_bad_override_is_checked_like_the_file_and_named():
    result = run("validate", TEMPLATE, "--set", "tuning.precision=fp16")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --set tuning.precision=fp16: must be one of 'bf16', 'fp8', 'fp32', 'auto' (got 'fp16')"
    )
    malformed = run("plan", TEMPLATE, "--set", "tuning.precision")
    assert malformed.returncode == 2
    assert "--set tuning.precision: no '=': expected key.path=value, for example tuning.precision=bf16" in malformed.stderr
    integer = run("plan", TEMPLATE, "--set", "compute.instance_count=1.5")
    assert integer.returncode == 2 and "--set compute.instance_count=1.5" in integer.stderr


def test_a_planner_finding_an_override_caused_names_the_override_not_the_file_line():
    """The file says ``precision: auto``; ``--set tuning.precision=fp8`` on an A100 makes the error, so the error
    points at the override (JSON too), while a finding on a field no override touched keeps the file's line."""
    args = ("--set", "compute.instance_type=ml.p4d.24xlarge", "--set", "tuning.precision=fp8")
    result = run("validate", TEMPLATE, *args)
    assert result.returncode == 2, result.stderr
    errors = [line for line in unwrapped(result.stderr).splitlines() if line.startswith("error:")]
    assert errors and errors[0].startswith("error: --set tuning.precision=fp8: tuning.precision: FP8 needs Hopper"), errors
    assert f"{TEMPLATE.relative_to(ROOT)}:" not in errors[0] and str(TEMPLATE) not in errors[0]
    failed = json.loads(run("validate", TEMPLATE, *args, "--format", "json").stdout)
    assert any(e["file"] == "--set tuning.precision=fp8" and e["field"] == "tuning.precision" for e in failed["errors"]), failed
    kept = run("validate", TEMPLATE, "--set", "compute.instance_type=ml.p4d.24xlarge")
    assert "--set tuning.precision" not in kept.stderr


def test_overrides_apply_to_run_config():
    one = json.loads(run("run-config", TEMPLATE).stdout)["run_config"]
    result = run("run-config", TEMPLATE, "--set", "compute.instance_count=2")
    assert result.returncode == 0, result.stderr
    two = json.loads(result.stdout)["run_config"]
    assert (one["parallel"]["sharding"], two["parallel"]["sharding"]) == ("full", "hybrid")
    assert two["batch"]["grad_accum_steps"] * 2 == one["batch"]["grad_accum_steps"]


def test_a_recipe_on_standard_input():
    text = TEMPLATE.read_text()
    result = subprocess.run([*CLI, "validate", "-"], input=text, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "<stdin>: ok"  # the verdict first, then what the account needs
    empty = subprocess.run([*CLI, "plan", "-"], input="", capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert empty.returncode == 2
    assert empty.stderr.strip() == "error: <stdin>: standard input is empty: pipe a recipe into the command"


def test_two_recipes_of_one_name_are_refused_naming_both(tmp_path):
    first = write_yaml(tmp_path / "a.yaml", recipe_dict(name="same"))
    second = write_yaml(tmp_path / "b.yaml", recipe_dict(name="same"))
    result = run("validate", tmp_path)
    assert result.returncode == 2
    assert f"{first}:1: name: 'same' is also the name of {second}" in result.stderr
    assert f"{second}:1: name: 'same' is also the name of {first}" in result.stderr


def test_explain_takes_one_recipe_not_a_directory():
    result = run("explain", "recipes/")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: recipes: a directory: explain takes one recipe file or name (plan takes directories)"
    )


def test_diff_of_two_directories_pairs_recipes_by_name(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    for name in ("keep", "gone"):
        write_yaml(old / f"{name}.yaml", recipe_dict(name=name))
    write_yaml(new / "keep.yaml", recipe_dict(name="keep", **{"tuning.precision": "bf16"}))
    write_yaml(new / "later.yaml", recipe_dict(name="later"))
    result = run("diff", old, new, "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [(d["old"], d["new"]) for d in data["diffs"]] == [("keep", "keep")]
    assert data["added"] == ["later"] and data["removed"] == ["gone"]
    text = run("diff", old, new).stdout
    assert "== keep" in text and f"only in {old}: gone" in text and f"only in {new}: later" in text
    assert f"diff {old} {new} --format json" in unwrapped(text).splitlines()[-1]  # how to see more
    mixed = run("diff", old, RECIPES[0])
    assert mixed.returncode == 2 and "diff takes two recipe files or two directories" in mixed.stderr


def test_templates_list_every_template_on_one_line():
    result = run("templates", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["templates"]
    assert sorted(r["template"] for r in rows) == sorted(p.stem for p in RECIPES)
    assert all(r["about"] and len(r["about"]) <= 80 and "\n" not in r["about"] for r in rows)
    # Each template's first sentence whole (no "..."), one line per template, piped within 100 columns.
    assert not [r["about"] for r in rows if r["about"].endswith("...")]
    table = run("templates")
    lines = table.stdout.splitlines()
    assert len(lines) == 2 + len(rows) + 1, lines  # header, rule, a line each, the closing hint
    assert all(len(line) <= 100 and line == line.rstrip() for line in lines), [line for line in lines if len(line) > 100]


def test_init_writes_a_recipe_that_plans(tmp_path):
    folder = tmp_path / "recipes"
    result = run("init", "my-8b", "--from", "llama3-8b-fp8", "--dir", folder)
    assert result.returncode == 0, result.stderr
    written = folder / "my-8b.yaml"
    data = yaml.safe_load(written.read_text())
    assert data["name"] == "my-8b"
    assert data["model"] == yaml.safe_load(TEMPLATE.read_text())["model"]
    assert run("plan", written).returncode == 0
    again = run("init", "my-8b", "--from", "llama3-8b-fp8", "--dir", folder)
    assert again.returncode == 2 and "exists" in again.stderr
    unknown = run("init", "x", "--from", "llama-8b", "--dir", folder)
    assert unknown.returncode == 2 and "did you mean llama3-8b-fp8" in unknown.stderr
    bad = run("init", "Bad Name", "--from", "llama3-8b-fp8", "--dir", folder)
    assert bad.returncode == 2 and not (folder / "Bad Name.yaml").exists()


def test_init_in_the_checkout_keeps_the_editor_schema_line(tmp_path):
    folder = ROOT / "recipes" / "tmp-init-test"
    try:
        assert run("init", "schema-line", "--from", "llama3-1b-bf16", "--dir", folder).returncode == 0
        first = (folder / "schema-line.yaml").read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=../../docs/recipe.schema.json"
    finally:
        for path in folder.glob("*"):
            path.unlink()
        folder.rmdir()
