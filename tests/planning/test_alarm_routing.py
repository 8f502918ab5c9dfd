"""`tiered-training validate` warns when a recipe's alarms reach no one."""

from __future__ import annotations

import json

from support import recipe_dict, write_yaml
from typer.testing import CliRunner

from tiered_training.cli.app import app


def _validate(tmp_path, monkeypatch, context: dict | None, **overrides):
    monkeypatch.chdir(tmp_path)
    if context is not None:
        (tmp_path / "cdk.json").write_text(json.dumps({"app": "python app.py", "context": context}))
    # The account's applied quotas, so that --strict judges the alarms alone.
    quotas = {"training/ml.p6-b200.48xlarge": 1, "warm-pool/ml.p6-b200.48xlarge": 1}
    recipe = write_yaml(tmp_path / "r.yaml", recipe_dict(**{"compute.quotas": quotas, **overrides}))
    return CliRunner().invoke(app, ["validate", "--strict", str(recipe)])


def test_alarms_to_an_unsubscribed_platform_topic_warn(tmp_path, monkeypatch):
    result = _validate(tmp_path, monkeypatch, None)
    assert result.exit_code == 2
    assert "[alarms-unrouted]" in result.output and "monitoring" in result.output


def test_an_address_in_the_recipe_or_the_app_context_routes_them(tmp_path, monkeypatch):
    assert _validate(tmp_path, monkeypatch, None, **{"monitoring.alarm_email": "a@example.com"}).exit_code == 0
    assert _validate(tmp_path, monkeypatch, {"alarm_email": "oncall@example.com"}).exit_code == 0


def test_the_monitoring_doc_states_the_fitted_times_of_every_template():
    from support import RECIPES, ROOT

    from tiered_training.planning.alarms import markdown_table
    from tiered_training.planning.planner import plan_file

    table = markdown_table([plan_file(path) for path in RECIPES])
    assert table in (ROOT / "docs" / "monitoring.md").read_text(), "run: python -m tiered_training.planning.alarms recipes/"
