"""Every command's ``--format json`` validates against its schema in docs/schemas/, on success and on
failure, with the same top-level keys; the committed schemas are the generated ones."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from support import RECIPES, ROOT, recipe_dict, write_yaml
from typer.testing import CliRunner

from tiered_training.cli import output
from tiered_training.cli.app import app

RUNNER = CliRunner()
SCHEMAS = ROOT / "docs" / "schemas"
TEMPLATE = ROOT / "recipes" / "llama3-1b-bf16.yaml"


def invoke(*args):
    return RUNNER.invoke(app, [str(a) for a in args], prog_name="tiered-training", env={"COLUMNS": None})


def checked(command: str, result, code: int) -> dict:
    """The output, after checking it against the command's committed schema and its exit code."""
    assert result.exit_code == code, (command, result.output)
    data = json.loads(result.stdout)
    schema = json.loads((SCHEMAS / f"{command}.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    assert sorted(data) == sorted(schema["properties"]), command  # every key
    assert data["ok"] is (code == 0) and data["exit_code"] == code and data["schema_version"] == 3
    assert bool(data["errors"]) is (code != 0), (command, data["errors"])
    return data


def test_the_committed_schemas_are_the_generated_ones():
    assert output.main(["--check"]) == 0, "run: python -m tiered_training.cli.output --write"
    from tiered_training import report

    assert output.SCHEMA_VERSION == report.SCHEMA_VERSION
    names = (*output.OUTPUTS, *output.DOCUMENTS)
    assert sorted(p.name for p in SCHEMAS.glob("*.json")) == sorted(f"{c}.schema.json" for c in names)


def test_a_schema_refuses_a_missing_or_unknown_key():
    schema = json.loads((SCHEMAS / "diff.schema.json").read_text())
    good = output.data("diff", 0)
    jsonschema.Draft202012Validator(schema).validate(good)
    for bad in ({k: v for k, v in good.items() if k != "diffs"}, good | {"diff": None}, good | {"ok": "yes"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft202012Validator(schema).validate(bad)
    with pytest.raises(ValueError, match="ok is True with exit code 2"):
        output.PlanOutput(ok=True, exit_code=2)


@pytest.fixture
def recipes(tmp_path) -> dict[str, Path]:
    folder = tmp_path / "recipes"
    folder.mkdir()
    return {
        "good": write_yaml(folder / "good.yaml", recipe_dict(**{"monitoring.alarm_email": "ops@example.com"})),
        "unplannable": write_yaml(
            tmp_path / "a100.yaml",
            recipe_dict(name="a100", **{"compute.instance_type": "ml.p4d.24xlarge", "tuning.precision": "fp8"}),
        ),
        "invalid": write_yaml(tmp_path / "invalid.yaml", recipe_dict(sequence_length=3)),
        "folder": folder,
    }


def test_plan_explain_and_validate_keep_their_shape(recipes):
    for command in ("plan", "explain", "validate"):
        checked(command, invoke(command, "-f", "json", recipes["good"]), 0)
        failed = checked(command, invoke(command, "-f", "json", recipes["unplannable"]), 2)
        assert "fp8-unsupported" in {e["code"] for e in failed["errors"]}
        invalid = checked(command, invoke(command, "-f", "json", recipes["invalid"]), 2)
        assert invalid["errors"][0]["file"] == str(recipes["invalid"])
    plan = checked("plan", invoke("plan", "-f", "json", recipes["unplannable"]), 2)["plans"][0]
    assert plan["ok"] is False and plan["run"] is None  # the keys of a plan without errors, null
    (entry,) = checked("validate", invoke("validate", "-f", "json", recipes["invalid"]), 2)["recipes"]
    assert entry["account"] == []
    strict = checked("validate", invoke("validate", "-f", "json", "--strict", *RECIPES), 0)
    assert all(r["ok"] for r in strict["recipes"])


def test_diff_keeps_its_shape(recipes, tmp_path):
    other = write_yaml(tmp_path / "p5.yaml", recipe_dict(**{"compute.instance_type": "ml.p5.48xlarge"}))
    (one,) = checked("diff", invoke("diff", "-f", "json", recipes["good"], other), 0)["diffs"]
    metrics = one["metrics"]
    assert "tokens_per_second_per_gpu" in metrics and "tokens_per_second" not in metrics
    checked("diff", invoke("diff", "-f", "json", recipes["good"], recipes["unplannable"]), 2)
    checked("diff", invoke("diff", "-f", "json", recipes["good"], recipes["invalid"]), 2)
    both = checked("diff", invoke("diff", "-f", "json", recipes["folder"], recipes["folder"]), 0)
    assert [d["old"] for d in both["diffs"]] == ["unit-test"] and both["added"] == both["removed"] == []
    checked("diff", invoke("diff", "-f", "json", recipes["folder"], recipes["good"]), 2)


def test_catalogue_and_template_commands_keep_their_shape(tmp_path):
    checked("tiers", invoke("tiers", "-f", "json"), 0)
    checked("models", invoke("models", "-f", "json"), 0)
    checked("models", invoke("models", "-f", "json", "--from-config", tmp_path / "none.json"), 2)
    checked("instances", invoke("instances", "-f", "json"), 0)
    checked("templates", invoke("templates", "-f", "json"), 0)
    made = checked("init", invoke("init", "mine", "--from", "llama3-8b-fp8", "--dir", tmp_path, "-f", "json"), 0)
    assert made["path"] == str(tmp_path / "mine.yaml")
    again = checked("init", invoke("init", "mine", "--from", "llama3-8b-fp8", "--dir", tmp_path, "-f", "json"), 2)
    assert again["path"] is None and "exists" in again["errors"][0]["message"]


def test_prices_keep_their_shape_from_the_cache_and_when_it_is_unreadable():
    from tiered_training.catalog import price_cache

    price = price_cache.CachedPrice(
        "us-east-1",
        "ml.p5.48xlarge",
        55.04,
        "USD",
        "SKU1",
        "USE1-Train:ml.p5.48xlarge",
        "2026-01-01",
        "2026-01-02",
        "2026-01-03T00:00:00Z",
    )
    price_cache.save_region("us-east-1", [price])
    shown = checked("prices", invoke("prices", "--region", "us-east-1", "-f", "json"), 0)
    assert [p["instance"] for p in shown["prices"]] == ["ml.p5.48xlarge"]
    price_cache.cache_path().write_text("not json")
    checked("prices", invoke("prices", "--region", "us-east-1", "-f", "json"), 1)


COMMANDS = sorted(set(output.OUTPUTS) - {"error"})


@pytest.mark.parametrize("command", COMMANDS)
def test_a_usage_error_has_the_commands_shape(command):
    data = checked(command, invoke(command, "-f", "json", "--no-such-option"), 2)
    assert "--no-such-option" in data["errors"][0]["message"]


def test_a_command_line_without_a_command_has_the_error_shape():
    checked("error", invoke("no-such-command", "-f", "json"), 2)


def test_a_recipe_that_does_not_load_has_each_run_commands_shape(recipes):
    for command in ("start", "status", "logs", "stop", "preflight", "rehearse"):
        data = checked(command, invoke(command, recipes["invalid"], "-f", "json"), 2)
        assert data["errors"][0]["file"] == str(recipes["invalid"]), command


def test_start_dry_run_has_starts_shape():
    data = checked("start", invoke("start", TEMPLATE, "--dry-run", "--region", "us-east-1", "-f", "json"), 0)
    assert data["dry_run"] is True and data["execution_arn"] is None


def test_run_config_keeps_its_shape(recipes):
    made = checked("run-config", invoke("run-config", recipes["good"]), 0)
    assert made["recipe_name"] == "unit-test" and made["run_config"]["recipe_name"] == "unit-test"
    assert made["hyperparameters"] is None
    flat = checked("run-config", invoke("run-config", recipes["good"], "--hyperparameters"), 0)["hyperparameters"]
    assert all(isinstance(v, str) for v in flat.values()) and flat
    for bad in ("unplannable", "invalid"):
        failed = checked("run-config", invoke("run-config", recipes[bad], "-f", "json"), 2)
        assert failed["run_config"] is None and failed["recipe_name"] is None


@pytest.mark.parametrize(
    "args",
    [
        ("plan", "--no-such-option"),
        ("validate", "--no-such-option"),
        ("explain",),
        ("diff", TEMPLATE),
        ("run-config", "--no-such-option"),
        ("calibrate",),
        ("start", "--no-such-option"),
        ("status", "--no-such-option"),
        ("logs", "--no-such-option"),
        ("stop", "--no-such-option"),
        ("preflight", "--no-such-option"),
        ("prices", "--no-such-option"),
        ("templates", "--no-such-option"),
        ("init", "--no-such-option"),
        ("tiers", "--no-such-option"),
        ("models", "--no-such-option"),
        ("instances", "--no-such-option"),
        ("rehearse", "--no-such-option"),
    ],
    ids=lambda a: " ".join(map(str, a)),
)
def test_a_usage_error_has_its_commands_shape(args):
    """A command line the command refuses before it runs: the command's own keys, empty, and one error."""
    result = invoke(*args, "-f", "json")
    data = checked(args[0], result, 2)
    assert len(data["errors"]) == 1 and result.stderr.count("\n") == 1, result.output


def test_a_plan_finding_caused_by_set_cites_the_override_in_json(recipes):
    args = ("--set", "compute.instance_type=ml.p4d.24xlarge", "--set", "tuning.precision=fp8")
    for command in ("plan", "explain"):
        data = checked(command, invoke(command, "-f", "json", recipes["good"], *args), 2)
        (error,) = [e for e in data["errors"] if e["code"] == "fp8-unsupported"]
        assert error["file"] == "--set tuning.precision=fp8" and error["line"] is None
        (finding,) = [f for f in data["plans"][0]["findings"] if f["code"] == "fp8-unsupported"]
        assert (finding["file"], finding["line"]) == ("--set tuning.precision=fp8", None)
    plain = checked("plan", invoke("plan", "-f", "json", recipes["unplannable"]), 2)["plans"][0]["findings"]
    (finding,) = [f for f in plain if f["code"] == "fp8-unsupported"]
    assert finding["file"] == str(recipes["unplannable"]) and finding["line"] >= 1
