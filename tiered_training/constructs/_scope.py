"""Stack and environment lookups without jsii round trips where the answer is already known.

``Stack.of(construct)`` and ``stack.partition``/``region``/``account`` are each a call into
the jsii runtime. The constructs here remember their stack, and each stack its three
environment tokens, so that a recipe stack asks once instead of once per construct.
"""

from __future__ import annotations

import hashlib
import re
from typing import Callable

import jsii
from aws_cdk import Aws, Stack
from constructs import IConstruct, IValidation

_STACK = "_tiered_training_stack"
_ENV = "_tiered_training_env"


def stack_of(scope: IConstruct) -> Stack:
    """The stack of ``scope``: the scope itself, what one of our constructs remembered, or ``Stack.of``."""
    if isinstance(scope, Stack):
        return scope
    known = getattr(scope, _STACK, None)
    return known if known is not None else Stack.of(scope)


_PATH = "_tiered_training_path"


def remember_stack(construct: IConstruct, stack: Stack, scope: IConstruct | None = None, construct_id: str | None = None) -> None:
    """Remember ``construct``'s stack and, when its scope is that stack or one of our constructs,
    its construct path inside the stack (for :func:`logical_id`)."""
    setattr(construct, _STACK, stack)
    if scope is not None and construct_id is not None:
        parent = [] if scope is stack else getattr(scope, _PATH, None)
        setattr(construct, _PATH, None if parent is None else [*parent, construct_id])


def path_in_stack(construct: IConstruct) -> list[str] | None:
    """The construct IDs from the stack down to ``construct``, when :func:`remember_stack` knew them."""
    return getattr(construct, _PATH, None)


def logical_id(path: list[str]) -> str:
    """The logical ID CDK allocates to the element at this path inside its stack
    (``makeUniqueId``: the IDs without "Resource", then 8 hex digits of the path's MD5)."""
    components = [c for c in path if c != "Default"]
    if len(components) == 1:
        candidate = re.sub(r"[^A-Za-z0-9]", "", components[0])
        if len(candidate) <= 255:
            return candidate
    digest = hashlib.md5("/".join(components).encode("utf-8")).hexdigest()[:8].upper()
    human: list[str] = []
    for component in components:
        if not human or not human[-1].endswith(component):
            human.append(component)
    text = "".join(re.sub(r"[^A-Za-z0-9]", "", c) for c in human if c != "Resource")
    return text[:240] + digest


def env_of(stack: Stack) -> tuple[str, str, str]:
    """``(partition, region, account)`` of the stack (tokens for an environment-agnostic one)."""
    env = getattr(stack, _ENV, None)
    if env is None:
        env = (stack.partition, stack.region, stack.account)
        setattr(stack, _ENV, env)
    return env


_AGNOSTIC: tuple[str, str, str] | None = None


def remember_agnostic_env(stack: Stack) -> None:
    """For a stack made without ``env``: its partition, region and account are the pseudo
    parameters (``Aws.PARTITION``, ...), the same tokens for every such stack; ask once per process."""
    global _AGNOSTIC
    if _AGNOSTIC is None:
        _AGNOSTIC = (Aws.PARTITION, Aws.REGION, Aws.ACCOUNT_ID)
    setattr(stack, _ENV, _AGNOSTIC)


@jsii.implements(IValidation)
class StackChecks:
    """One validation per stack that runs the synth-time checks our constructs register.

    Each check is a Python callable returning a list of messages. Registering one
    validation per stack instead of one per construct saves jsii round trips at build
    time and callbacks at synth; each message names its construct itself.
    """

    def __init__(self) -> None:
        self.checks: list[Callable[[], list[str]]] = []

    def validate(self) -> list[str]:
        problems: list[str] = []
        for check in self.checks:
            problems += check()
        return problems


_CHECKS = "_tiered_training_checks"


def add_check(scope: IConstruct, check: Callable[[], list[str]]) -> None:
    """Run ``check`` when the app validates (before validation plugins such as cdk-nag)."""
    stack = stack_of(scope)
    hub = getattr(stack, _CHECKS, None)
    if hub is None:
        hub = StackChecks()
        setattr(stack, _CHECKS, hub)
        stack.node.add_validation(hub)
    hub.checks.append(check)
