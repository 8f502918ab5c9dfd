"""Stack and environment lookups without jsii round trips where the answer is already known.

``Stack.of(construct)`` and ``stack.partition``/``region``/``account`` are each a call into
the jsii runtime. The constructs here remember their stack, and each stack its three
environment tokens, so that a recipe stack asks once instead of once per construct.
"""

from __future__ import annotations

from aws_cdk import Stack
from constructs import IConstruct

_STACK = "_tiered_training_stack"
_ENV = "_tiered_training_env"


def stack_of(scope: IConstruct) -> Stack:
    """The stack of ``scope``: the scope itself, what one of our constructs remembered, or ``Stack.of``."""
    if isinstance(scope, Stack):
        return scope
    known = getattr(scope, _STACK, None)
    return known if known is not None else Stack.of(scope)


def remember_stack(construct: IConstruct, stack: Stack) -> None:
    setattr(construct, _STACK, stack)


def env_of(stack: Stack) -> tuple[str, str, str]:
    """``(partition, region, account)`` of the stack (tokens for an environment-agnostic one)."""
    env = getattr(stack, _ENV, None)
    if env is None:
        env = (stack.partition, stack.region, stack.account)
        setattr(stack, _ENV, env)
    return env
