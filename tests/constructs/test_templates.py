"""Every synthesized template: cfn-lint clean, cdk-nag clean (the session synth would raise), snapshots."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tiered_training.constructs.app import PLATFORM_STACK
from tiered_training.constructs.platform import stack_id

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("UPDATE_SNAPSHOTS") == "1"
ROOT = Path(__file__).resolve().parents[2]


def test_cfn_lint_has_no_errors(assembly_dir):
    templates = sorted(str(p) for p in assembly_dir.glob("*.template.json"))
    assert templates
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run([str(cfn_lint), "--format", "parseable", "--", *templates], capture_output=True, text=True)
    # cfn-lint's exit status is a bit mask: 2 errors, 4 warnings, 8 informational. Errors fail the test.
    assert not result.returncode & 2 and not result.returncode & 1, result.stdout + result.stderr
    assert not result.returncode & 4, f"cfn-lint warnings: {result.stdout}"


def test_cdk_nag_report_has_no_findings(assembly_dir):
    report = assembly_dir / "validation-report.json"
    if report.exists():
        data = json.loads(report.read_text())
        violations = [v for r in data.get("pluginReports", []) for v in r.get("violations", [])]
        # @aws-cdk/core:annotationsInValidationReport lists annotations too: the app's own
        # warnings (tiered-training:*, e.g. alarms that notify no one) are expected there.
        assert [v for v in violations if not v["ruleName"].startswith("Annotation::tiered-training:")] == []


def normalise(template: dict) -> str:
    text = json.dumps(template, indent=1, sort_keys=True)
    # Asset hashes change with any file in the image's build context.
    return re.sub(r"[0-9a-f]{64}", "<asset-hash>", text) + "\n"


def test_snapshots(templates, template_names):
    """The test run only compares; ``make snapshots`` (UPDATE_SNAPSHOTS=1) writes them."""
    names = [PLATFORM_STACK] + [stack_id(n) for n in template_names]
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        for name in names:
            (SNAPSHOTS / f"{name}.json").write_text(normalise(templates[name]))
        for orphan in set(SNAPSHOTS.glob("*.json")) - {SNAPSHOTS / f"{name}.json" for name in names}:
            orphan.unlink()
        return
    missing = [name for name in names if not (SNAPSHOTS / f"{name}.json").exists()]
    stale = [name for name in names if name not in missing and (SNAPSHOTS / f"{name}.json").read_text() != normalise(templates[name])]
    assert not missing and not stale, (
        f"templates without a snapshot in tests/constructs/snapshots/: {missing}; templates that differ from theirs: {stale}. "
        "If the change is intended, run `make snapshots` and commit the snapshots."
    )


def test_app_py_with_a_bad_recipe_exits_2_with_readable_messages(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "recipes" / "llama3-8b-fp8.yaml").read_text().replace("name: llama3-8b-fp8", "name: bad_name"))
    env = {**os.environ, "CDK_OUTDIR": str(tmp_path / "out"), "CDK_CONTEXT_JSON": json.dumps({"recipes": str(tmp_path)})}
    result = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "bad.yaml:" in result.stderr and "name:" in result.stderr and "bad_name" in result.stderr
    assert "Traceback" not in result.stderr and "jsii" not in result.stderr
