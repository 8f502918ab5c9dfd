"""The container's base image: the AWS Deep Learning Container URI for a region.

Read from ``catalog/base_images.yaml``, which ``scripts/regenerate_base_images.py``
writes with the sagemaker SDK's ``image_uris.retrieve`` (a developer tool, never
imported here). The constructs pass ``base_image_uri(region)`` as the Docker build
arg ``BASE_IMAGE`` of ``training/Dockerfile``. No heavy imports: PyYAML and pydantic only.

The base image lives in AWS's own ECR registry for the region, whose account differs by
region (763104351884 in many, another in each opt-in region): :func:`registry` and
:func:`login_command` take it from the same file. ``make image-login REGION=<region>`` (and
``python -m tiered_training.catalog.images registry <region>``) use them.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict

from tiered_training.catalog import _load

CATALOG_FILE = "base_images.yaml"


class BaseImage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    framework: str  # the sagemaker SDK's framework key, e.g. pytorch-amzn2023
    repository: str
    pytorch: str
    cuda: str
    tag: str
    os: str
    python: str  # the DLC's Python (major.minor): the container's requirements resolve against it


@cache
def default_base_image() -> BaseImage:
    return BaseImage(**_load(CATALOG_FILE)["default"])


@cache
def base_images() -> dict[str, str]:
    """Region name to the default base image's URI in that region."""
    return dict(_load(CATALOG_FILE)["images"])


def base_image_uri(region: str) -> str:
    """The default base image's URI in ``region``; a clear error for a region the catalogue lacks."""
    images = base_images()
    try:
        return images[region]
    except KeyError:
        raise ValueError(
            f"no base image for region {region!r} in tiered_training/catalog/{CATALOG_FILE}; "
            f"known regions: {', '.join(sorted(images))}. Pass the Dockerfile's BASE_IMAGE build arg explicitly, "
            "or regenerate the file with scripts/regenerate_base_images.py"
        ) from None


def registry(region: str) -> str:
    """The base image's ECR registry host in ``region``: ``<account>.dkr.ecr.<region>.amazonaws.com``."""
    return base_image_uri(region).split("/", 1)[0]


def registry_account(region: str) -> str:
    return registry(region).split(".", 1)[0]


def login_command(region: str) -> str:
    """The shell command that logs Docker in to the base image's registry (before ``cdk deploy``)."""
    return (
        f"aws ecr get-login-password --region {region} | "
        f"docker login --username AWS --password-stdin {registry(region)}"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m tiered_training.catalog.images {registry,uri,login-command} REGION``: one line, for scripts."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    show = {"registry": registry, "uri": base_image_uri, "login-command": login_command}
    if len(args) != 2 or args[0] not in show:
        print(f"usage: python -m tiered_training.catalog.images {{{','.join(show)}}} REGION", file=sys.stderr)
        return 2
    try:
        print(show[args[0]](args[1]))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


SERVING_CATALOG_FILE = "serving_images.yaml"


@cache
def serving_images() -> dict[str, str]:
    """Region name to the default serving image's URI (the LMI container that serves the export)."""
    return dict(_load(SERVING_CATALOG_FILE)["images"])


def serving_image_uri(region: str) -> str:
    """The default serving image in ``region``; a clear error for a region the catalogue lacks."""
    images = serving_images()
    try:
        return images[region]
    except KeyError:
        raise ValueError(
            f"no serving image for region {region!r} in tiered_training/catalog/{SERVING_CATALOG_FILE}; "
            f"known regions: {', '.join(sorted(images))}. Set registry.serving_image in the recipe"
        ) from None


if __name__ == "__main__":
    raise SystemExit(main())

