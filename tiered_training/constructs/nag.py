"""cdk-nag AwsSolutions as a policy-validation plugin (cdk-nag v3), and acknowledgements.

Every acknowledgement names the exact finding ID and a reason a reviewer can check.
"""

from __future__ import annotations

import jsii
from aws_cdk import Acknowledgment, App, Stack, Validations
from constructs import IConstruct, IValidation


def add_nag(app: App) -> None:
    """Run the AwsSolutions pack on every stack at synth; an unacknowledged finding fails synth."""
    from cdk_nag import AwsSolutionsChecks

    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(construct: IConstruct, rule: str, reason: str) -> None:
    Validations.of(construct).acknowledge(Acknowledgment(id=rule, reason=reason))


def acknowledge_all(construct: IConstruct, rules: list[tuple[str, str]]) -> None:
    """Several (finding ID, reason) acknowledgements on one construct, in one call."""
    if rules:
        Validations.of(construct).acknowledge(*(Acknowledgment(id=rule, reason=reason) for rule, reason in rules))


def render_like_nag(value) -> str:
    """A resolved CloudFormation value as cdk-nag writes it inside a finding ID."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((key, arg),) = value.items()
        if key == "Ref":
            return f"<{arg}>"
        if key == "Fn::GetAtt":
            return f"<{arg[0]}.{arg[1]}>"
        if key == "Fn::ImportValue":
            return render_like_nag(arg)
        if key == "Fn::Join":
            return arg[0].join(render_like_nag(part) for part in arg[1])
    return str(value)


@jsii.implements(IValidation)
class LateAcknowledgements:
    """Acknowledgements whose finding IDs contain tokens (a bucket ARN from another stack).

    They are recorded from ``validate()``, which runs after CDK has resolved cross-stack
    references and before the validation plugins read acknowledgements from the tree.
    Each entry: the construct the finding is on, a resource ARN (a token), the rule
    prefix, and the reason.
    """

    def __init__(self, stack: Stack | None = None) -> None:
        self.stack = stack  # the entries' stack, when known (saves a Stack.of call)
        self.entries: list[tuple[IConstruct, str | None, str, str]] = []

    def add(self, construct: IConstruct, resource: str, reason: str, rule: str = "AwsSolutions-IAM5") -> None:
        self.entries.append((construct, resource, rule, reason))

    def add_rule(self, construct: IConstruct, rule: str, reason: str) -> None:
        """An acknowledgement with a complete finding ID, recorded with the others in one call."""
        self.entries.append((construct, None, rule, reason))

    def validate(self) -> list[str]:
        # One resolve and one acknowledge call per construct (jsii round trips are the cost).
        by_construct: dict[int, tuple[IConstruct, list[tuple[str | None, str, str]]]] = {}
        for construct, resource, rule, reason in self.entries:
            by_construct.setdefault(id(construct), (construct, []))[1].append((resource, rule, reason))
        for construct, entries in by_construct.values():
            tokens = [resource for resource, _rule, _reason in entries if resource is not None]
            values = iter((self.stack or Stack.of(construct)).resolve(tokens) if tokens else [])
            acknowledge_all(
                construct,
                [
                    (rule if resource is None else f"{rule}[Resource::{render_like_nag(next(values))}]", reason)
                    for resource, rule, reason in entries
                ],
            )
        return []
