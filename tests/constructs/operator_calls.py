"""The AWS calls a command makes, recorded with botocore's event hooks, as IAM requests.

:func:`recording` registers a ``provide-client-params.*.*`` handler on every botocore client
created inside the block: each API call (each page of a paginator too) is recorded with its
service, operation, parameters and region. :func:`requests_for` turns the calls into the
IAM requests AWS evaluates for them, after ``access/cli_calls.yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from access_world import Request, World, simulation

CALLS = Path(__file__).parent / "access" / "cli_calls.yaml"


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

    def handler(self, client: Any):
        service, region = client.meta.service_model.service_name, client.meta.region_name

        def record(params: dict[str, Any], model: Any, **_kwargs: Any) -> None:
            self.calls.append(Call(self.command, service, model.name, dict(params), region))

        return record


@contextmanager
def recording() -> Iterator[Recorder]:
    """Record the calls of every botocore client created inside the block."""
    import botocore.session

    recorder = Recorder()
    original = botocore.session.Session.create_client

    def create_client(self, *args: Any, **kwargs: Any):
        client = original(self, *args, **kwargs)
        client.meta.events.register("provide-client-params.*.*", recorder.handler(client))
        return client

    botocore.session.Session.create_client = create_client
    try:
        yield recorder
    finally:
        botocore.session.Session.create_client = original


def mapping() -> dict[str, dict[str, dict[str, Any]]]:
    return yaml.safe_load(CALLS.read_text())


def _fill(template: str, values: dict[str, Any], call: Call) -> str:
    def one(match: re.Match) -> str:
        name, _, how = match[1].partition("|")
        if name not in values:
            raise AssertionError(f"{call.describe()}: no {name!r} for the resource ARN")
        value = str(values[name])
        return value.lower() if how == "lower" else value

    return re.sub(r"\{([^}]+)\}", one, template)


def bucket_key(world: World, bucket: str) -> tuple[str, bool] | None:
    """``(key ARN, bucket key enabled)`` of a bucket of the templates that encrypts with KMS by default."""
    for stack, template in world.templates.items():
        for logical, resource in template.get("Resources", {}).items():
            if resource["Type"] != "AWS::S3::Bucket" or world.ref(stack, logical) != bucket:
                continue
            rules = (
                resource.get("Properties", {}).get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration", [])
            )
            for rule in rules:
                default = rule.get("ServerSideEncryptionByDefault", {})
                if default.get("SSEAlgorithm") == "aws:kms" and "KMSMasterKeyID" in default:
                    key = str(world.resolve(stack, default["KMSMasterKeyID"]))
                    if not key.startswith("arn:"):
                        key = f"arn:{world.partition}:kms:{world.region}:{world.account}:key/{key}"
                    return key, bool(rule.get("BucketKeyEnabled"))
    return None


def requests_for(world: World, principal: str, calls: list[Call]) -> list[Request]:
    """The IAM requests of the calls (unmapped calls fail: every call must be in cli_calls.yaml)."""
    table = mapping()
    out = []
    for call in calls:
        entry = table.get(call.service, {}).get(call.operation)
        if entry is None:
            raise AssertionError(
                f"{call.describe()}: not in {CALLS.name}; add its IAM action, resource and context keys"
            )
        values = {"partition": world.partition, "region": call.region, "account": world.account, **call.params}
        resource = _fill(entry["resource"], values, call)
        context: dict[str, Any] = {}
        for key, param in (entry.get("context") or {}).items():
            if param in call.params:
                context[key] = str(call.params[param])
        if call.service == "s3":
            context["aws:SecureTransport"] = "true"  # the CLI's clients use HTTPS
        what = f"{call.command}: {call.service}.{call.operation}"
        out.append(Request(what, principal, entry["action"], resource, context))
        if entry.get("kms_via_s3"):
            found = bucket_key(world, str(call.params["Bucket"]))
            if found is not None:
                key, bucket_keys = found
                bucket_arn = f"arn:{world.partition}:s3:::{call.params['Bucket']}"
                context = {
                    "kms:ViaService": f"s3.{call.region}.amazonaws.com",
                    "kms:CallerAccount": world.account,
                    "kms:EncryptionContext:aws:s3:arn": bucket_arn if bucket_keys else resource,
                }
                out.append(
                    Request(f"{what} (S3 decrypts with the bucket's key)", principal, "kms:Decrypt", key, context)
                )
    return out


def managed_policies(world: World, role_arn: str) -> list[dict]:
    """The managed policies of the templates attached to a role, resolved."""
    out = []
    for stack, template in world.templates.items():
        for logical, resource in template.get("Resources", {}).items():
            if resource["Type"] != "AWS::IAM::ManagedPolicy":
                continue
            props = resource.get("Properties", {})
            if role_arn in [world.role_arn(stack, r) for r in props.get("Roles", [])]:
                out.append({"name": logical, "policy": world.resolve(stack, props["PolicyDocument"])})
    return out


def simulate_with(world: World, requests: list[Request], identity: list[dict]) -> list[dict]:
    """Like access_world.simulate, for a principal whose identity policies are ``identity``."""
    import json
    import subprocess

    from access_world import ROOT, SIMULATE

    payload = []
    for request in requests:
        one = simulation(world, request)
        one["identityPolicies"] = identity
        payload.append(one)
    done = subprocess.run(
        ["node", str(SIMULATE)], input=json.dumps(payload), capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    if done.returncode != 0:
        raise AssertionError(f"{SIMULATE.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)
