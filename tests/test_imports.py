"""Light imports: the core loads no aws_cdk, torch or sagemaker SDK at run time. Which layer may import
what (only constructs/ imports aws_cdk, only training/ imports torch, the SageMaker SDK nowhere) is
import-linter's contracts in pyproject.toml, which `make test` checks."""

from __future__ import annotations

import json
import subprocess
import sys

from support import ROOT

HEAVY = ("aws_cdk", "torch", "sagemaker", "constructs", "jsii", "boto3", "botocore")


def test_cli_and_planner_import_nothing_heavy():
    code = (
        "import sys, tiered_training, tiered_training.cli.app, tiered_training.planning.planner, tiered_training.report, tiered_training.pipeline.definition, "
        "tiered_training.planning.quotas, tiered_training.aws.preflight\n"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r}]\n"
        "print(','.join(sorted(heavy)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_old_module_paths_import_the_moved_module_with_a_deprecation_warning():
    """0.2 moved the flat modules into layers; their old paths work until 0.3, and say where they went."""
    from tiered_training._moved import MOVED

    code = (
        "import importlib, warnings, json\n"
        "out = {}\n"
        f"for old, new in {MOVED!r}.items():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)\n"
        "    out[old] = [module is importlib.import_module(new), [str(w.message) for w in caught\n"
        "                if issubclass(w.category, DeprecationWarning)]]\n"
        "print(json.dumps(out))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert set(got) == set(MOVED) and len(MOVED) >= 20
    for old, (same, warnings) in got.items():
        assert same, old
        assert warnings == [f"{old} moved to {MOVED[old]}; the old path goes in 0.3"], old


def test_an_old_module_path_still_runs_with_python_dash_m():
    result = subprocess.run([sys.executable, "-m", "tiered_training.images", "registry", "eu-west-1"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "763104351884.dkr.ecr.eu-west-1.amazonaws.com"
    assert result.stderr == "note: tiered_training.images moved to tiered_training.catalog.images; the old path goes in 0.3\n"
