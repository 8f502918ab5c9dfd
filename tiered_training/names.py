"""Names derived from a recipe's name, with the AWS limit each must meet.

The constructs name their stack, dashboard and alarm topic with these functions, and
the recipe checks its name against every limit here, so a name that passes review
never fails at deploy time. Training jobs started by a pipeline get generated names
(from the step names, not the recipe's), and alarm names are left to
CloudFormation, so neither depends on the recipe's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

STACK_PREFIX = "TieredTraining-"
DASHBOARD_PREFIX = "TieredTraining-"
TOPIC_DISPLAY_PREFIX = "tiered-training "


def stack_name(recipe_name: str) -> str:
    return f"{STACK_PREFIX}{recipe_name}"


def dashboard_name(recipe_name: str) -> str:
    return f"{DASHBOARD_PREFIX}{recipe_name}"


def topic_display_name(recipe_name: str) -> str:
    return f"{TOPIC_DISPLAY_PREFIX}{recipe_name}"


@dataclass(frozen=True)
class DerivedName:
    what: str
    derive: Callable[[str], str]
    limit: int
    source: str


DERIVED: tuple[DerivedName, ...] = (
    DerivedName("SageMaker pipeline name", lambda name: name, 256, "SageMaker API reference, CreatePipeline"),
    DerivedName("CloudFormation stack name", stack_name, 128, "AWS CloudFormation User Guide, stack name"),
    DerivedName("CloudWatch dashboard name", dashboard_name, 255, "CloudWatch API reference, PutDashboard"),
    DerivedName("SNS topic display name", topic_display_name, 100, "Amazon SNS API reference, topic attributes (DisplayName)"),
    DerivedName("recipe tag value", lambda name: name, 256, "AWS tagging: a tag value has at most 256 characters"),
)


def longest_name() -> int:
    """The longest recipe name whose every derived name fits its limit."""
    return min(d.limit - len(d.derive("")) for d in DERIVED)


def name_problem(recipe_name: str) -> str | None:
    """Why ``recipe_name`` is too long for a derived name, or None."""
    for derived in DERIVED:
        text = derived.derive(recipe_name)
        if len(text) > derived.limit:
            return (
                f"{len(recipe_name)} characters; at most {longest_name()}: the {derived.what} "
                f"{derived.derive('<name>')!r} may have at most {derived.limit} characters"
            )
    return None
