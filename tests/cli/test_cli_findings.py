"""Every command that plans reports the same findings, those of the app (./cdk.json) included."""

from __future__ import annotations

import json

from support import recipe_dict, write_yaml
from typer.testing import CliRunner

from tiered_training.cli.app import app

RUNNER = CliRunner()


def invoke(*args):
    return RUNNER.invoke(app, [str(a) for a in args], prog_name="tiered-training", env={"COLUMNS": None})


def test_plan_explain_validate_and_diff_report_unrouted_alarms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cdk.json").write_text(json.dumps({"context": {}}))  # no alarm_email for the platform topic
    unrouted = write_yaml(tmp_path / "unrouted.yaml", recipe_dict())
    routed = write_yaml(tmp_path / "routed.yaml", recipe_dict(**{"monitoring.alarm_email": "ops@example.com"}))
    for command in ("plan", "explain", "validate"):
        text = invoke(command, unrouted)
        assert text.exit_code == 0, (command, text.output)
        assert "alarms-unrouted" in text.output, (command, text.output)
        quiet = invoke(command, routed)
        assert "alarms-unrouted" not in quiet.output, (command, quiet.output)
    (plan,) = json.loads(invoke("plan", unrouted, "--format", "json").stdout)["plans"]
    assert "alarms-unrouted" in {f["code"] for f in plan["findings"]}
    (checked,) = json.loads(invoke("validate", unrouted, "--format", "json").stdout)["recipes"]
    assert "alarms-unrouted" in {f["code"] for f in checked["warnings"]}
    diff = invoke("diff", routed, unrouted)
    assert diff.exit_code == 0, diff.output
    assert "new warning[alarms-unrouted]" in diff.stdout, diff.stdout
    (tmp_path / "cdk.json").write_text(json.dumps({"context": {"alarm_email": "oncall@example.com"}}))
    assert "alarms-unrouted" not in invoke("plan", unrouted).output
