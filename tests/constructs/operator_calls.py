"""The recorded calls of the commands (tests/aws_calls.py) as the IAM requests AWS evaluates.

:func:`requests_for` turns each call into its IAM request after ``access/cli_calls.yaml``; a
call that reads (writes) an object of a bucket encrypted with KMS also makes S3 call ``kms:Decrypt``
(``kms:GenerateDataKey``); a call on a tagged resource carries its tags (``aws:ResourceTag/<key>``).
:func:`simulate_with` evaluates requests for a principal with the given identity policies only.
"""

from __future__ import annotations

import re
from typing import Any

from access_world import Request, World, simulation
from aws_calls import CALLS, Call, mapping


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


def requests_for(
    world: World, principal: str, calls: list[Call], tags: dict[str, dict[str, str]] | None = None
) -> list[Request]:
    """The IAM requests of the calls (unmapped calls fail: every call must be in cli_calls.yaml). ``tags``: each
    resource ARN's tags, for the calls whose entry says ``resource_tags`` (an untagged resource has none)."""
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
        if entry.get("resource_tags"):
            for key, value in (tags or {}).get(resource, {}).items():
                context[f"aws:ResourceTag/{key}"] = value
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
                action = entry["kms_via_s3"]
                out.append(
                    Request(f"{what} (S3 calls {action} with the bucket's key)", principal, action, key, context)
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
