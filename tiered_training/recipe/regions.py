"""AWS region names, checked offline against botocore's endpoint data (``endpoints.json``).

botocore comes with the ``aws`` and ``cdk`` extras only. Without it a region name is checked
against :data:`REGION_PATTERN` alone, and :func:`known_regions` returns None so that a command
can say so. botocore is imported on the first check, never when this module is.
"""

from __future__ import annotations

import difflib
import functools
import re

# https://docs.aws.amazon.com/general/latest/gr/rande.html: a partition's prefix, a place, a number.
REGION_PATTERN = r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$"
WITHOUT_BOTOCORE = (
    "region names are checked against their pattern only: botocore, which lists the regions where "
    "SageMaker runs, is not installed (pip install 'tiered-training[aws]')"
)


@functools.cache
def known_regions() -> frozenset[str] | None:
    """The regions where SageMaker runs, in every partition, from botocore's endpoint data; None without botocore."""
    try:
        import botocore.session
    except ImportError:
        return None
    session = botocore.session.Session()
    return frozenset(
        region
        for partition in session.get_available_partitions()
        for region in session.get_available_regions("sagemaker", partition)
    )


def region_problem(region: str) -> str | None:
    """What is wrong with ``region`` as a region for SageMaker (with the closest known name), or None."""
    if len(region) > 32 or not re.match(REGION_PATTERN, region):
        return f"{region[:40]!r}: not an AWS region name (like us-east-1)"
    known = known_regions()
    if known is None or region in known:
        return None
    import botocore

    close = difflib.get_close_matches(region, sorted(known), n=1)
    same_prefix = sorted(r for r in known if r.split("-")[0] == region.split("-")[0])
    if close:
        hint = f"did you mean {close[0]!r}? "
    elif same_prefix:
        hint = f"the {region.split('-')[0]}-* ones are {', '.join(same_prefix)}; "
    else:
        hint = ""
    return (
        f"{region!r}: not a region where SageMaker runs; {hint}"
        f"botocore {botocore.__version__} knows {len(known)} (a newer botocore may know more)"
    )
