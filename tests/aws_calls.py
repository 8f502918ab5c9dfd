"""The AWS calls the package's commands make, recorded with botocore's event hooks.

:func:`recording` registers a ``provide-client-params.*.*`` handler on each boto3 session that
``tiered_training.aws.session.session`` makes inside the block, so every client the package
builds (``aws_client``) reports each API call, and each page of a paginator, with its service,
operation, parameters and region; the tests' own clients (moto set-up) are not recorded.
``constructs/access/cli_calls.yaml`` maps each call to the IAM request AWS evaluates for it;
tests/constructs/test_operator_access.py proves those requests allowed for an operator.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CALLS = Path(__file__).parent / "constructs" / "access" / "cli_calls.yaml"


@dataclass(frozen=True)
class Call:
    command: str
    service: str  # botocore's service name (the client's)
    operation: str
    params: dict[str, Any]
    region: str

    def describe(self) -> str:
        return f"{self.command}: {self.service}.{self.operation} {self.params}"


@dataclass
class Recorder:
    command: str = ""
    calls: list[Call] = field(default_factory=list)

    def record(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_kwargs: Any) -> None:
        service = model.service_model.service_name
        self.calls.append(Call(self.command, service, model.name, dict(params), context.get("client_region") or ""))


@contextmanager
def recording(command: str = "") -> Iterator[Recorder]:
    """Record the calls of the package's clients made inside the block."""
    from tiered_training.aws import session as module

    recorder = Recorder(command)
    original = module.session
    hooked: set[int] = set()

    def session(profile: str | None) -> Any:
        made = original(profile)
        if id(made) not in hooked:
            hooked.add(id(made))
            made.events.register("provide-client-params.*.*", recorder.record)
        return made

    session.cache_clear = original.cache_clear  # type: ignore[attr-defined]
    original.cache_clear()
    module.session = session
    try:
        yield recorder
    finally:
        module.session = original
        original.cache_clear()  # its sessions carry the hook: the next clients come from a new one


def mapping() -> dict[str, dict[str, dict[str, Any]]]:
    return yaml.safe_load(CALLS.read_text())


def unmapped(calls: list[Call]) -> list[str]:
    """The calls that cli_calls.yaml does not map to an IAM request."""
    table = mapping()
    return sorted({f"{c.service}.{c.operation}" for c in calls if c.operation not in table.get(c.service, {})})
