"""TrainingImage: the training container, as an ECR repository and tag, a DockerImageAsset, an
image URI, or built from the container that ships with the package.

The build context of the packaged container holds two directories: ``tiered_training/`` (the
library's core, which the trainer imports) and ``training/`` (the trainer, its
``Dockerfile`` and ``Dockerfile.dockerignore``). In a source checkout ``training/`` sits
beside the package; in an installed wheel it is the package data
``tiered_training/container/``. Synth needs no Docker daemon: a DockerImageAsset is only
an entry in the asset manifest until ``cdk deploy`` builds and pushes it.
"""

from __future__ import annotations

import atexit
import re
import shutil
import tempfile
from functools import cache
from pathlib import Path

from aws_cdk import IgnoreMode, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from constructs import Construct

DOCKERFILE = "training/Dockerfile"
PACKAGED_CONTAINER = "container"  # tiered_training/container/ in a wheel: the trainer directory
ECR_URI = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/(?P<repo>[a-z0-9._/-]+)(?::[\w.-]+|@sha256:[0-9a-f]{64})$"
)


def default_base_image(region: str | None) -> str | None:
    """The base image for a region from the container's catalogue; None for no region or an unknown one."""
    if not region:
        return None
    from tiered_training.catalog.images import base_image_uri

    try:
        return base_image_uri(region)
    except Exception:  # an unknown region: the Dockerfile's default applies
        return None


def container_sources() -> tuple[Path, Path]:
    """``(library, trainer)``: the directories of the ``tiered_training`` package and of the trainer.

    The trainer is the package data ``tiered_training/container/`` of an installed wheel, or
    ``training/`` beside the package in a source checkout (editable installs included).
    """
    import tiered_training

    library = Path(tiered_training.__file__).resolve().parent
    for trainer in (library / PACKAGED_CONTAINER, library.parent / "training"):
        if (trainer / "Dockerfile").is_file():
            return library, trainer
    raise FileNotFoundError(
        f"the training container's build context is missing: neither {library / PACKAGED_CONTAINER} "
        f"nor {library.parent / 'training'} holds a Dockerfile; reinstall tiered-training, or give "
        "TrainingImage an image_uri, a repository or an asset"
    )


def docker_ignore(directory: Path, dockerfile: str) -> list[str]:
    """Exclude patterns for the asset: ``<Dockerfile>.dockerignore`` (BuildKit's per-Dockerfile file), else
    ``.dockerignore``."""
    for candidate in (directory / f"{dockerfile}.dockerignore", directory / ".dockerignore"):
        if candidate.is_file():
            lines = candidate.read_text(encoding="utf-8").splitlines()
            patterns = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
            # Docker reads the Dockerfile even when the ignore file lists it; the staged asset must hold it.
            return patterns + [f"!{dockerfile}"]
    return []


def _ignore(skip_at: Path | None = None, skip: str | None = None):
    """A copytree ignore function: caches and bytecode everywhere, and ``skip`` directly under ``skip_at``."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        ignored = {n for n in names if n in ("__pycache__", ".pytest_cache") or n.endswith(".pyc")}
        if skip_at is not None and Path(directory) == skip_at and skip in names:
            ignored.add(skip)
        return ignored

    return ignore


@cache
def build_context() -> Path:
    """A directory with the packaged container's build context (made once per process).

    Only the two directories the Dockerfile copies go in: CDK fingerprints an asset by
    walking its whole directory, and a checkout's root also holds .venv and node_modules.
    """
    library, trainer = container_sources()
    target = Path(tempfile.mkdtemp(prefix="tiered-training-image-"))
    atexit.register(shutil.rmtree, target, True)
    shutil.copytree(library, target / "tiered_training", ignore=_ignore(skip_at=library, skip=PACKAGED_CONTAINER))
    shutil.copytree(trainer, target / "training", ignore=_ignore())
    return target


class TrainingImage(Construct):
    """The training image.

    Props: give at most one of ``repository``, ``asset`` and ``image_uri``; with none, the
    container that ships with the package is built at deploy time.

    - ``repository`` and ``tag``: an ECR repository (``IRepository``) and a tag or a digest
      (``sha256:...``); default tag ``latest``.
    - ``asset``: a ``DockerImageAsset`` of your own.
    - ``image_uri``: an existing ECR image (``<account>.dkr.ecr.<region>.amazonaws.com/<repo>:<tag>``).
    - ``region``: for the packaged build, picks the ``BASE_IMAGE`` build arg from
      ``tiered_training.catalog.images.base_image_uri``; default none (the Dockerfile's default).
    - ``build_args``: extra build args for the packaged build, which win over ``BASE_IMAGE``.

    Attributes: ``image_uri``, ``repository`` (``IRepository``), ``asset`` (the
    ``DockerImageAsset``, or None).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        repository: ecr.IRepository | None = None,
        tag: str = "latest",
        asset: ecr_assets.DockerImageAsset | None = None,
        image_uri: str | None = None,
        region: str | None = None,
        build_args: dict[str, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        given = [
            name
            for name, value in (("repository", repository), ("asset", asset), ("image_uri", image_uri))
            if value is not None
        ]
        if len(given) > 1:
            raise ValueError(f"TrainingImage: give one of repository, asset and image_uri, not {' and '.join(given)}")
        self.asset: ecr_assets.DockerImageAsset | None = asset
        self.repository: ecr.IRepository
        if repository is not None:
            self.repository = repository
            self.image_uri: str = (
                repository.repository_uri_for_digest(tag)
                if tag.startswith("sha256:")
                else repository.repository_uri_for_tag(tag)
            )
            return
        if image_uri is not None:
            match = ECR_URI.match(image_uri)
            if not match:
                raise ValueError(
                    f"TrainingImage: {image_uri!r} is not an ECR image URI "
                    "(<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>)"
                )
            arn = Stack.of(self).format_arn(
                service="ecr",
                region=match["region"],
                account=match["account"],
                resource="repository",
                resource_name=match["repo"],
            )
            self.repository = ecr.Repository.from_repository_attributes(
                self, "Repository", repository_arn=arn, repository_name=match["repo"]
            )
            self.image_uri = image_uri
            return
        if asset is None:
            context = build_context()
            args = {}
            base = default_base_image(region)
            if base:
                args["BASE_IMAGE"] = base
            args.update(build_args or {})
            asset = ecr_assets.DockerImageAsset(
                self,
                "Asset",
                directory=str(context),
                file=DOCKERFILE,
                build_args=args or None,
                platform=ecr_assets.Platform.LINUX_AMD64,
                exclude=docker_ignore(context, DOCKERFILE),
                ignore_mode=IgnoreMode.DOCKER,
            )
            self.asset = asset
        self.repository = asset.repository
        self.image_uri = asset.image_uri

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        """Pull the image: the repository's read actions, plus ecr:GetAuthorizationToken."""
        return self.repository.grant_pull(grantee)
