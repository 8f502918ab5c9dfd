"""Names derived from a recipe's name, with the AWS limit each must meet.

The constructs name their stack, dashboard and alarm topic with these functions, and
the recipe checks its name against every limit here (with the longest stage), so a
name that passes review never fails at deploy time. Training jobs started by a
pipeline get generated names (from the step names, not the recipe's). The
failed-execution rule's name (64 characters at most) is cut and hashed when long.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

STACK_PREFIX = "TieredTraining-"
DASHBOARD_PREFIX = "TieredTraining-"
TOPIC_DISPLAY_PREFIX = "tiered-training "
# A stage (``cdk synth -c stage=dev``) prefixes the stack, pipeline, dashboard, alarm, rule and
# topic names, so that two stages can share an account and region.
STAGE_PATTERN = r"^[a-z][a-z0-9]{0,9}$"
LONGEST_STAGE = "s" * 10
RULE_NAME_LIMIT = 64  # EventBridge PutRule: Name, 1-64 characters [.\-_A-Za-z0-9]


def stage_problem(stage: str | None) -> str | None:
    """Why ``stage`` cannot be a stage name, or None."""
    if stage is None or re.match(STAGE_PATTERN, stage):
        return None
    return f"stage {stage!r}: must be 1-10 lowercase letters or digits, starting with a letter"


def _staged(prefix: str, stage: str | None) -> str:
    return f"{stage}-{prefix}" if stage else prefix


def name_prefix(stage: str | None = None) -> str:
    """What every stack, dashboard, alarm, rule and topic name of a stage starts with."""
    return _staged(STACK_PREFIX, stage)


def stack_name(recipe_name: str, stage: str | None = None) -> str:
    return f"{name_prefix(stage)}{recipe_name}"


def platform_stack_name(stage: str | None = None) -> str:
    return f"{name_prefix(stage)}Platform"


def pipeline_name(recipe_name: str, stage: str | None = None) -> str:
    return f"{stage}-{recipe_name}" if stage else recipe_name


def dashboard_name(recipe_name: str, stage: str | None = None) -> str:
    return f"{_staged(DASHBOARD_PREFIX, stage)}{recipe_name}"


def alarm_name(recipe_name: str, alarm_id: str, stage: str | None = None) -> str:
    return f"{name_prefix(stage)}{recipe_name}-{alarm_id}"


def failed_rule_name(recipe_name: str, stage: str | None = None) -> str:
    """The failed-execution rule's name; a long recipe name is cut and told apart by a hash."""
    name = f"{name_prefix(stage)}{recipe_name}-failed"
    if len(name) <= RULE_NAME_LIMIT:
        return name
    digest = hashlib.sha256(recipe_name.encode()).hexdigest()[:8]
    keep = RULE_NAME_LIMIT - len(f"{name_prefix(stage)}--{digest}-failed")
    return f"{name_prefix(stage)}{recipe_name[:keep]}-{digest}-failed"


def topic_name(recipe_name: str, stage: str | None = None) -> str:
    """A recipe's own alarm topic."""
    return f"{name_prefix(stage)}{recipe_name}-alarms"


def platform_topic_name(stage: str | None = None) -> str:
    """The platform's alarm topic (an underscore, which no recipe name has, keeps it apart)."""
    return f"{name_prefix(stage)}platform_alarms"


def topic_display_name(recipe_name: str) -> str:
    return f"{TOPIC_DISPLAY_PREFIX}{recipe_name}"


@dataclass(frozen=True)
class DerivedName:
    what: str
    derive: Callable[[str], str]
    limit: int
    source: str


DERIVED: tuple[DerivedName, ...] = (
    DerivedName(
        "SageMaker pipeline name",
        lambda name: pipeline_name(name, LONGEST_STAGE),
        256,
        "SageMaker API reference, CreatePipeline",
    ),
    DerivedName(
        "CloudFormation stack name",
        lambda name: stack_name(name, LONGEST_STAGE),
        128,
        "AWS CloudFormation User Guide, stack name",
    ),
    DerivedName(
        "CloudWatch dashboard name",
        lambda name: dashboard_name(name, LONGEST_STAGE),
        255,
        "CloudWatch API reference, PutDashboard",
    ),
    DerivedName(
        "CloudWatch alarm name",
        lambda name: alarm_name(name, "ValidationLossDiverging", LONGEST_STAGE),
        255,
        "CloudWatch API reference, PutMetricAlarm (AlarmName)",
    ),
    DerivedName(
        "SNS topic name",
        lambda name: topic_name(name, LONGEST_STAGE),
        256,
        "Amazon SNS API reference, CreateTopic (Name)",
    ),
    DerivedName(
        "SNS topic display name", topic_display_name, 100, "Amazon SNS API reference, topic attributes (DisplayName)"
    ),
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
