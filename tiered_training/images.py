"""The container's base image: the AWS Deep Learning Container URI for a region.

Read from ``catalog/base_images.yaml``, which ``scripts/regenerate_base_images.py``
writes with the sagemaker SDK's ``image_uris.retrieve`` (a developer tool, never
imported here). The constructs pass ``base_image_uri(region)`` as the Docker build
arg ``BASE_IMAGE`` of ``training/Dockerfile``. No heavy imports: PyYAML and pydantic only.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict

from .catalogs import _load

CATALOG_FILE = "base_images.yaml"


class BaseImage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    framework: str  # the sagemaker SDK's framework key, e.g. pytorch-amzn2023
    repository: str
    pytorch: str
    cuda: str
    tag: str
    os: str


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
