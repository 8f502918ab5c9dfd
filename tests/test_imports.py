"""Light imports: the core loads no aws_cdk, torch or sagemaker SDK; only constructs/ imports
aws_cdk and only training/ imports torch."""

from __future__ import annotations

import ast
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


def _imports(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


def test_only_constructs_import_aws_cdk_and_only_training_imports_torch():
    offenders = []
    for path in sorted(ROOT.glob("**/*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (".venv", "node_modules", "cdk.out", "tests", "bench", "build", "examples"):
            continue
        modules = set(_imports(path))
        if "aws_cdk" in modules and rel.parts[:2] != ("tiered_training", "constructs"):
            offenders.append(f"{rel} imports aws_cdk")
        if modules & {"torch", "torchao", "torchdata", "transformers"} and rel.parts[0] != "training":
            offenders.append(f"{rel} imports torch")
    assert not offenders


def test_the_sagemaker_sdk_stays_out_of_the_synth_and_runtime_paths():
    """The SDK is the oracle of tests/pipeline/test_sdk_oracle.py and a tool of scripts/, nothing else."""
    offenders = []
    for path in sorted(ROOT.glob("**/*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (".venv", "node_modules", "cdk.out", "tests", "scripts", "build"):
            continue
        if "sagemaker" in set(_imports(path)):
            offenders.append(f"{rel} imports the sagemaker SDK")
    assert not offenders
