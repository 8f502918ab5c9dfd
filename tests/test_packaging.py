"""The package as a platform repo installs it: the wheel's contents, and examples/platform-repo
synthesised from the wheel installed in a fresh virtual environment, cdk-nag and cfn-lint clean.

The fresh environment has no system site-packages and nothing but ``tiered-training[cdk]``
and its dependencies, installed with constraints.txt (by uv, or pip where uv is absent).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from support import ROOT

EXAMPLE = ROOT / "examples" / "platform-repo"
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "tiered_training", "training", "recipes"]


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, command))}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the sources (no stale build/ directory can leak into it)."""
    source = tmp_path_factory.mktemp("source")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)])
    (built,) = out.glob("tiered_training-*.whl")
    return built


def test_wheel_holds_every_package_the_container_and_the_metadata(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every package directory of the source tree (pyproject.toml lists them by hand).
    for init in (ROOT / "tiered_training").rglob("__init__.py"):
        rel = init.relative_to(ROOT).as_posix()
        assert rel in names, f"{rel} is missing from the wheel: list its package in pyproject.toml"
    assert {"tiered_training/py.typed", "tiered_training/catalog/models.yaml"} <= names
    templates = {f"tiered_training/templates/{p.name}" for p in (ROOT / "recipes").glob("*.yaml")}
    assert templates and templates <= names  # tiered-training templates and init read them
    # The container's build context: every file of training/ that the image gets.
    for path in (ROOT / "training").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(ROOT / "training").as_posix()
            assert f"tiered_training/container/{rel}" in names, f"training/{rel} is missing from the wheel"
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert f"{dist_info}/licenses/LICENSE" in names
    license_text = zipfile.ZipFile(wheel).read(f"{dist_info}/licenses/LICENSE").decode()
    assert "Apache License" in license_text and "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in license_text
    metadata = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    requirements = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    # Libraries declare ranges; exact pins live only in constraints.txt.
    assert requirements and not [r for r in requirements if "==" in r.split(";")[0]], requirements


def test_constraints_pin_what_pyproject_declares():
    from packaging.requirements import Requirement

    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # The SageMaker SDK oracle's packages are declared beside pyproject.toml (installed with --no-deps).
    oracle = [line for line in (ROOT / "requirements-oracle.txt").read_text().splitlines() if line and not line.startswith("#")]
    for spec in project["dependencies"] + [s for extra in project["optional-dependencies"].values() for s in extra] + oracle:
        requirement = Requirement(spec)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"constraints.txt pins no version of {name}"
        assert pins[name] in requirement.specifier, f"{name}=={pins[name]} is outside {requirement.specifier}"


@pytest.fixture(scope="module")
def example_assembly(wheel, tmp_path_factory) -> Path:
    """examples/platform-repo synthesised by a fresh virtual environment that installed only the wheel."""
    env_dir = tmp_path_factory.mktemp("fresh-venv")
    venv.EnvBuilder(with_pip=False, system_site_packages=False, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # uv (the Makefile's installer, beside this interpreter) where it is there, else pip: the same constraints.
    uv = Path(sys.executable).with_name("uv")
    installer = [str(uv), "pip", "install", "--python", str(python)] if uv.exists() else [
        sys.executable, "-m", "pip", "--python", str(python), "install", "--no-compile"]
    _run([*installer, "--quiet", "-c", str(ROOT / "constraints.txt"), f"{wheel}[cdk]"])
    # A copy of the example, away from the checkout: only the installed package can be imported.
    app_dir = tmp_path_factory.mktemp("platform-repo")
    shutil.copytree(EXAMPLE, app_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("cdk.out", "__pycache__"))
    out = tmp_path_factory.mktemp("example-cdk.out")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CDK_CONTEXT_JSON", "VIRTUAL_ENV")}
    node_bin = ROOT / "node_modules" / ".bin"
    if node_bin.is_dir():
        env["PATH"] = f"{node_bin}{os.pathsep}{env.get('PATH', '')}"
    # What the CDK CLI passes to the app: cdk.json's context, and the output directory.
    env["CDK_CONTEXT_JSON"] = json.dumps(json.loads((app_dir / "cdk.json").read_text())["context"])
    env["CDK_OUTDIR"] = str(out)
    where = _run([str(python), "-c", "import tiered_training; print(tiered_training.__file__)"], cwd=app_dir, env=env)
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout
    _run([str(python), "app.py"], cwd=app_dir, env=env)  # cdk-nag runs in the app: a finding fails synth
    return out


def test_example_synthesises_from_the_wheel_with_cdk_nag_and_cfn_lint_clean(example_assembly):
    templates = sorted(str(p) for p in example_assembly.glob("*.template.json"))
    assert templates
    report = json.loads((example_assembly / "validation-report.json").read_text())
    assert [v for r in report.get("pluginReports", []) for v in r.get("violations", [])] == []
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    # W3005 (a DependsOn that a GetAtt already implies) is in the custom resource that CDK's
    # recommended @aws-cdk/aws-ec2:restrictDefaultSecurityGroup adds to the VPC: CDK's template, not ours.
    result = subprocess.run(
        [str(cfn_lint), "--format", "parseable", "--ignore-checks", "W3005", "--", *templates], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_example_image_is_built_from_the_packaged_container(example_assembly):
    (manifest,) = example_assembly.glob("*.assets.json")
    (image,) = json.loads(manifest.read_text())["dockerImages"].values()
    assert image["source"]["dockerFile"] == "training/Dockerfile"
    context = example_assembly / image["source"]["directory"]
    assert (context / "training" / "launcher.py").is_file() and (context / "training" / "Dockerfile").is_file()
    assert (context / "tiered_training" / "contract" / "runconfig.py").is_file()
    assert not (context / "training" / "tools").exists()  # GPU checks and data tools stay out of the image
    assert not (context / "tiered_training" / "container").exists()  # the trainer is sent once


def _template(assembly: Path) -> dict:
    (path,) = assembly.glob("*.template.json")
    return json.loads(path.read_text())


def test_example_roles_vpc_and_schedule(example_assembly):
    resources = _template(example_assembly)["Resources"]
    by_type: dict[str, dict] = {}
    for logical, resource in resources.items():
        by_type.setdefault(resource["Type"], {})[logical] = resource
    # The team's own role runs the jobs: no execution role is made, and the grants go to it.
    roles = by_type["AWS::IAM::Role"]
    assert not [k for k in roles if "ExecutionRole" in k]
    (team_role,) = [k for k in roles if k.startswith("TrainingJobRole")]
    policy = next(p for p in by_type["AWS::IAM::Policy"].values() if p["Properties"]["Roles"] == [{"Ref": team_role}])
    text = json.dumps(policy)
    assert ":s3:::example-team-data/tokens/*" in text
    assert "/team-llama3-1b/checkpoints/*" in text and "kms:Encrypt" in text
    assert "ec2:CreateNetworkInterface" in text and "ec2:DescribeDhcpOptions" in text and '"ec2:Vpc"' in text
    # The jobs run in the team's private subnets, with a group whose members reach each other.
    (pipeline,) = by_type["AWS::SageMaker::Pipeline"].values()
    body = json.dumps(pipeline["Properties"]["PipelineDefinition"])
    assert "VpcConfig" in body and "VpctrainingSubnet1Subnet" in body
    (ingress,) = by_type["AWS::EC2::SecurityGroupIngress"].values()
    assert ingress["Properties"]["IpProtocol"] == "-1"
    assert ingress["Properties"]["SourceSecurityGroupId"] == ingress["Properties"]["GroupId"]
    # EventBridge Scheduler starts the pipeline, an IPipeline, with the permission it granted itself.
    (schedule,) = by_type["AWS::Scheduler::Schedule"].values()
    target = schedule["Properties"]["Target"]
    assert ":pipeline/team-llama3-1b" in json.dumps(target["Arn"])
    assert target["SageMakerPipelineParameters"]["PipelineParameterList"] == [{"Name": "MaxSteps", "Value": "200"}]
    assert "sagemaker:StartPipelineExecution" in json.dumps(by_type["AWS::IAM::Policy"])
