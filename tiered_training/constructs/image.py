"""TrainingImage: the training container, built from ``training/Dockerfile`` or taken as an ECR URI.

Synth needs no Docker daemon: a DockerImageAsset is only an entry in the asset
manifest until ``cdk deploy`` builds and pushes it.
"""

from __future__ import annotations

import atexit
import re
import shutil
import tempfile
from functools import cache
from pathlib import Path

from aws_cdk import IgnoreMode, Stack
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from constructs import Construct

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = "training/Dockerfile"
ECR_URI = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/(?P<repo>[a-z0-9._/-]+)(?::[\w.-]+|@sha256:[0-9a-f]{64})$"
)
PULL_ACTIONS = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]


def default_base_image(region: str | None) -> str | None:
    """The base image for a region from the container's catalogue, when that module exists."""
    if not region:
        return None
    try:
        from tiered_training.images import base_image_uri
    except ImportError:
        return None
    try:
        return base_image_uri(region)
    except Exception:  # an unknown region: the Dockerfile's default applies
        return None


def docker_ignore(directory: Path, dockerfile: str) -> list[str]:
    """Exclude patterns for the asset: ``<Dockerfile>.dockerignore`` (BuildKit's per-Dockerfile file), else ``.dockerignore``."""
    for candidate in (directory / f"{dockerfile}.dockerignore", directory / ".dockerignore"):
        if candidate.is_file():
            lines = candidate.read_text(encoding="utf-8").splitlines()
            patterns = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
            # Docker reads the Dockerfile even when the ignore file lists it; the staged asset must hold it.
            return patterns + [f"!{dockerfile}"]
    return []


def included_top_level(patterns: list[str]) -> list[str] | None:
    """The top-level names an ignore file of the form ``*`` then ``!name`` lets through; None otherwise."""
    if not patterns or patterns[0] != "*":
        return None
    names = []
    for pattern in patterns[1:]:
        if pattern.startswith("!"):
            name = pattern[1:].strip("/").split("/")[0]
            if name not in names:
                names.append(name)
    return names


@cache
def build_context(root: Path, dockerfile: str) -> Path:
    """A copy of only what the Dockerfile's ignore file lets through (once per process).

    CDK fingerprints an asset by walking its whole directory; the repository root holds
    .venv and node_modules (hundreds of MB), which an ignore file with negations cannot
    prune. Copying the few included entries first makes synth independent of them.
    """
    patterns = docker_ignore(root, dockerfile)
    names = included_top_level(patterns)
    if names is None:
        return root
    target = Path(tempfile.mkdtemp(prefix="tiered-training-image-"))
    atexit.register(shutil.rmtree, target, True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for pattern in names:
        for source in sorted(root.glob(pattern)):
            if source.is_dir():
                shutil.copytree(source, target / source.name, ignore=ignore, dirs_exist_ok=True)
            elif source.is_file():
                shutil.copy2(source, target / source.name)
    # The Dockerfile and its ignore file, where the build expects them.
    for extra in (dockerfile, f"{dockerfile}.dockerignore"):
        if (root / extra).is_file():
            (target / extra).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / extra, target / extra)
    return target


class TrainingImage(Construct):
    """The training image.

    Props (give at most one of ``image_uri`` and ``directory``):

    - ``image_uri``: an existing ECR image (``<account>.dkr.ecr.<region>.amazonaws.com/<repo>:<tag>``);
      nothing is built.
    - ``directory``: the build context; default the repository root (with
      ``training/Dockerfile`` and its ``Dockerfile.dockerignore``).
    - ``file``: the Dockerfile, relative to ``directory``; default ``training/Dockerfile``.
    - ``region``: picks the default ``BASE_IMAGE`` build arg from
      ``tiered_training.images.base_image_uri``; default none (the Dockerfile's default).
    - ``build_args``: extra build args, which win over the default ``BASE_IMAGE``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        image_uri: str | None = None,
        directory: str | Path | None = None,
        file: str = DOCKERFILE,
        region: str | None = None,
        build_args: dict[str, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.asset: ecr_assets.DockerImageAsset | None = None
        self.repository_arn: str
        if image_uri is not None:
            if directory is not None:
                raise ValueError("TrainingImage: give image_uri or directory, not both")
            match = ECR_URI.match(image_uri)
            if not match:
                raise ValueError(
                    f"TrainingImage: {image_uri!r} is not an ECR image URI "
                    "(<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>)"
                )
            self.image_uri = image_uri
            self.repository_arn = Stack.of(self).format_arn(
                service="ecr",
                region=match["region"],
                account=match["account"],
                resource="repository",
                resource_name=match["repo"],
            )
            return
        context = Path(directory) if directory is not None else build_context(REPO_ROOT, file)
        args = {}
        base = default_base_image(region)
        if base:
            args["BASE_IMAGE"] = base
        args.update(build_args or {})
        self.asset = ecr_assets.DockerImageAsset(
            self,
            "Asset",
            directory=str(context),
            file=file,
            build_args=args or None,
            platform=ecr_assets.Platform.LINUX_AMD64,
            exclude=docker_ignore(context, file),
            ignore_mode=IgnoreMode.DOCKER,
        )
        self.image_uri = self.asset.image_uri
        self.repository_arn = self.asset.repository.repository_arn

    def pull_statements(self) -> list[dict]:
        """The policy statements (plain IAM JSON) of :meth:`grant_pull`."""
        return [
            {"Effect": "Allow", "Action": PULL_ACTIONS, "Resource": self.repository_arn},
            # ecr:GetAuthorizationToken has no resource-level permissions: IAM requires Resource "*".
            {"Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
        ]

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        """Pull the image: the repository's read actions, plus ecr:GetAuthorizationToken."""
        grant = iam.Grant.add_to_principal(grantee=grantee, actions=PULL_ACTIONS, resource_arns=[self.repository_arn])
        # ecr:GetAuthorizationToken has no resource-level permissions: IAM requires Resource "*".
        token = iam.Grant.add_to_principal(grantee=grantee, actions=["ecr:GetAuthorizationToken"], resource_arns=["*"])
        return grant.combine(token)
