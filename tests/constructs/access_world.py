"""Synthesized templates as one account's policies, for the access-matrix test.

:class:`World` resolves the CloudFormation intrinsics of a set of templates (``Ref``,
``Fn::GetAtt``, ``Fn::Join``, ``Fn::Sub``, ``Fn::ImportValue``, ``Fn::Select``,
``Fn::Split``) to concrete values for one test account and region, the way CloudFormation
would name the resources, and collects what decides a request: each role's identity
policies and trust policy, and each bucket's, key's and topic's resource policy.
:func:`simulate` sends requests to ``@cloud-copilot/iam-simulate`` (a Node script).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SIMULATE = Path(__file__).parent / "access" / "simulate.mjs"


def _digest(*parts: str, length: int = 12) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


@dataclass
class World:
    account: str
    region: str
    partition: str = "aws"
    templates: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._memo: dict[tuple, Any] = {}

    def add(self, stack_name: str, template: dict) -> None:
        self.templates[stack_name] = template
        self.__dict__.pop("_exports", None)
        self._memo: dict[tuple, Any] = {}

    def _cached(self, key: tuple, compute):
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    # -- intrinsics --------------------------------------------------------------------------

    @property
    def exports(self) -> dict[str, tuple[str, Any]]:
        if "_exports" not in self.__dict__:
            found = {}
            for stack, template in self.templates.items():
                for output in template.get("Outputs", {}).values():
                    if "Export" in output:
                        found[self.resolve(stack, output["Export"]["Name"])] = (stack, output["Value"])
            self.__dict__["_exports"] = found
        return self.__dict__["_exports"]

    def resolve(self, stack: str, value: Any) -> Any:
        if isinstance(value, list):
            return [self.resolve(stack, v) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (key, arg), = value.items()
            if key == "Ref":
                return self.ref(stack, arg)
            if key == "Fn::GetAtt":
                logical, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
                return self.attribute(stack, logical, attribute)
            if key == "Fn::Join":
                separator, parts = arg
                return separator.join(str(self.resolve(stack, p)) for p in self.resolve(stack, parts))
            if key == "Fn::Sub":
                text, variables = (arg, {}) if isinstance(arg, str) else arg
                return self._sub(stack, text, variables)
            if key == "Fn::ImportValue":
                source, expression = self.exports[self.resolve(stack, arg)]
                return self.resolve(source, expression)
            if key == "Fn::Select":
                index, items = arg
                return self.resolve(stack, items)[int(self.resolve(stack, index))]
            if key == "Fn::Split":
                separator, text = arg
                return str(self.resolve(stack, text)).split(separator)
            if key == "Fn::FindInMap":  # a mapping of the template (the serving image per region)
                name, top, second = (self.resolve(stack, part) for part in arg)
                return self.resolve(stack, self.templates[stack]["Mappings"][name][top][second])
            if key.startswith("Fn::"):
                raise AssertionError(f"{stack}: intrinsic {key} is not resolved by this test")
        return {k: self.resolve(stack, v) for k, v in value.items()}

    def _sub(self, stack: str, text: str, variables: dict) -> str:
        def one(match: re.Match) -> str:
            name = match[1]
            if name in variables:
                return str(self.resolve(stack, variables[name]))
            if "." in name and not name.startswith("AWS::"):
                logical, attribute = name.split(".", 1)
                return str(self.attribute(stack, logical, attribute))
            return str(self.ref(stack, name))

        return re.sub(r"\$\{([^}!]+)\}", one, text)

    def ref(self, stack: str, name: str) -> Any:
        pseudo = {
            "AWS::AccountId": self.account,
            "AWS::Region": self.region,
            "AWS::Partition": self.partition,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackName": stack,
        }
        if name in pseudo:
            return pseudo[name]
        template = self.templates[stack]
        if name in template.get("Parameters", {}):
            return template["Parameters"][name].get("Default", name)
        return self._physical(stack, name)["Ref"]

    def attribute(self, stack: str, logical: str, attribute: str) -> Any:
        attributes = self._physical(stack, logical)
        if attribute not in attributes:
            raise AssertionError(f"{stack}: {logical}.{attribute} is not modelled by this test")
        return attributes[attribute]

    def _physical(self, stack: str, logical: str) -> dict[str, Any]:
        return self._cached(("physical", stack, logical), lambda: self._make_physical(stack, logical))

    def _make_physical(self, stack: str, logical: str) -> dict[str, Any]:
        """A resource's Ref and attributes as CloudFormation would make them (names: the given
        name, else ``<stack>-<logical id>-<suffix>`` as CloudFormation generates)."""
        resource = self.templates[stack]["Resources"][logical]
        kind, props = resource["Type"], resource.get("Properties", {})
        generated = f"{stack}-{logical}-{_digest(stack, logical, length=8).upper()}"
        a, r, p = self.account, self.region, self.partition

        def given(prop: str, default: str) -> str:
            return str(self.resolve(stack, props[prop])) if prop in props else default

        if kind == "AWS::IAM::Role":
            name = given("RoleName", generated[:64])
            return {"Ref": name, "Arn": f"arn:{p}:iam::{a}:role/{name}", "RoleId": "AROA" + _digest(name).upper()}
        if kind == "AWS::S3::Bucket":
            name = given("BucketName", generated.lower()[:63])
            return {"Ref": name, "Arn": f"arn:{p}:s3:::{name}", "DomainName": f"{name}.s3.amazonaws.com"}
        if kind == "AWS::KMS::Key":
            key_id = str(uuid.UUID(_digest(stack, logical, length=32)))
            return {"Ref": key_id, "KeyId": key_id, "Arn": f"arn:{p}:kms:{r}:{a}:key/{key_id}"}
        if kind == "AWS::SNS::Topic":
            name = given("TopicName", generated[:256])
            arn = f"arn:{p}:sns:{r}:{a}:{name}"
            return {"Ref": arn, "TopicArn": arn, "TopicName": name}
        if kind == "AWS::CloudWatch::Alarm":
            name = given("AlarmName", generated)
            return {"Ref": name, "Arn": f"arn:{p}:cloudwatch:{r}:{a}:alarm:{name}"}
        if kind == "AWS::Events::Rule":
            name = given("Name", generated[:64])
            return {"Ref": name, "Arn": f"arn:{p}:events:{r}:{a}:rule/{name}"}
        if kind == "AWS::Scheduler::Schedule":
            name = given("Name", generated[:64])
            return {"Ref": name, "Arn": f"arn:{p}:scheduler:{r}:{a}:schedule/default/{name}"}
        if kind == "AWS::SageMaker::Pipeline":
            return {"Ref": given("PipelineName", generated)}
        if kind == "AWS::EC2::VPC":
            return {"Ref": "vpc-" + _digest(stack, logical, length=17), "CidrBlock": "10.0.0.0/16"}
        if kind == "AWS::EC2::Subnet":
            return {"Ref": "subnet-" + _digest(stack, logical, length=17)}
        if kind == "AWS::EC2::SecurityGroup":
            group = "sg-" + _digest(stack, logical, length=17)
            return {"Ref": group, "GroupId": group}
        if kind == "AWS::Logs::LogGroup":
            name = given("LogGroupName", generated)
            return {"Ref": name, "Arn": f"arn:{p}:logs:{r}:{a}:log-group:{name}:*"}
        return {"Ref": f"{logical}-{_digest(stack, logical)}", "Arn": f"arn:{p}:{kind.split('::')[1].lower()}:{r}:{a}:{logical}"}

    # -- policies ----------------------------------------------------------------------------

    def _resources(self, kind: str):
        for stack, template in self.templates.items():
            for logical, resource in template.get("Resources", {}).items():
                if resource["Type"] == kind:
                    yield stack, logical, resource.get("Properties", {})

    def role_arn(self, stack: str, reference: Any) -> str:
        value = self.resolve(stack, reference)
        return value if value.startswith("arn:") else f"arn:{self.partition}:iam::{self.account}:role/{value}"

    def identity_policies(self, role_arn: str) -> list[dict]:
        return self._cached(("identity", role_arn), lambda: self._identity_policies(role_arn))

    def _identity_policies(self, role_arn: str) -> list[dict]:
        out = []
        for stack, logical, props in self._resources("AWS::IAM::Policy"):
            if role_arn in [self.role_arn(stack, r) for r in props.get("Roles", [])]:
                out.append({"name": logical, "policy": self.resolve(stack, props["PolicyDocument"])})
        for stack, logical, props in self._resources("AWS::IAM::Role"):
            if self.attribute(stack, logical, "Arn") == role_arn:
                for inline in props.get("Policies", []):
                    out.append({"name": inline["PolicyName"], "policy": self.resolve(stack, inline["PolicyDocument"])})
        return out

    def roles(self) -> set[str]:
        known = {self.attribute(s, logical, "Arn") for s, logical, _ in self._resources("AWS::IAM::Role")}
        for stack, _logical, props in self._resources("AWS::IAM::Policy"):
            known |= {self.role_arn(stack, r) for r in props.get("Roles", [])}
        return known

    def resource_policy(self, action: str, resource: str) -> tuple[bool, dict | None]:
        """``(known, policy)``: whether the resource is one of these templates' (or an external
        key, whose policy is taken to be KMS's default), and its resource policy."""
        if resource.startswith(f"arn:{self.partition}:s3:::"):
            resource = resource.split("/", 1)[0]  # a bucket's policy covers its objects
        return self._cached(("resource", action == "sts:AssumeRole", resource), lambda: self._resource_policy(action, resource))

    def _resource_policy(self, action: str, resource: str) -> tuple[bool, dict | None]:
        if resource.startswith(f"arn:{self.partition}:s3:::"):
            bucket = resource.split(":::", 1)[1].split("/", 1)[0]
            for stack, logical, _props in self._resources("AWS::S3::Bucket"):
                if self.ref(stack, logical) == bucket:
                    for s, _l, props in self._resources("AWS::S3::BucketPolicy"):
                        if self.resolve(s, props["Bucket"]) == bucket:
                            return True, self.resolve(s, props["PolicyDocument"])
                    return True, None
            return False, None
        if ":kms:" in resource:
            for stack, logical, props in self._resources("AWS::KMS::Key"):
                if self.attribute(stack, logical, "Arn") == resource:
                    return True, self.resolve(stack, props["KeyPolicy"])
            # A key of the account's own that these templates do not hold: KMS's default key
            # policy (the account may use it through IAM policies).
            account = resource.split(":")[4]
            return False, {"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"AWS": f"arn:{self.partition}:iam::{account}:root"},
                "Action": "kms:*", "Resource": "*",
            }]}
        if ":sns:" in resource:
            for stack, logical, _props in self._resources("AWS::SNS::Topic"):
                if self.ref(stack, logical) == resource:
                    for s, _l, props in self._resources("AWS::SNS::TopicPolicy"):
                        if resource in self.resolve(s, props["Topics"]):
                            return True, self.resolve(s, props["PolicyDocument"])
                    return True, None
            return False, None
        if action == "sts:AssumeRole" and ":iam::" in resource:
            for stack, logical, props in self._resources("AWS::IAM::Role"):
                if self.attribute(stack, logical, "Arn") == resource:
                    return True, self.resolve(stack, props["AssumeRolePolicyDocument"])
            return False, None
        return True, None

    def is_known_topic(self, arn: str) -> bool:
        return self._cached(("topic", arn), lambda: self._is_known_topic(arn))

    def _is_known_topic(self, arn: str) -> bool:
        return any(self.ref(s, logical) == arn for s, logical, _ in self._resources("AWS::SNS::Topic"))


@dataclass(frozen=True)
class Request:
    what: str
    principal: str
    action: str
    resource: str
    context: dict[str, Any]

    def describe(self) -> str:
        return f"{self.what}: {self.principal} {self.action} {self.resource} {json.dumps(self.context, sort_keys=True)}"


def simulation(world: World, request: Request) -> dict:
    """The iam-simulate input for one request, with the policies the world holds for it."""
    _known, policy = world.resource_policy(request.action, request.resource)
    arn_account = request.resource.split(":")[4] if request.resource.count(":") >= 5 else ""
    identity = world.identity_policies(request.principal) if request.principal.startswith("arn:") else []
    simulation: dict[str, Any] = {
        "request": {
            "principal": request.principal,
            "action": request.action,
            "resource": {"resource": request.resource, "accountId": arn_account or world.account},
            "contextVariables": dict(request.context),
        },
        "identityPolicies": identity,
    }
    if policy is not None:
        simulation["resourcePolicy"] = policy
    if request.resource.startswith(f"arn:{world.partition}:s3:::"):
        simulation["additionalSettings"] = {"s3": {"blockPublicAccess": True}}
    return simulation


def simulate(world: World, requests: list[Request]) -> list[dict]:
    """``{result, errors}`` for each request: Allowed, ExplicitlyDenied, ImplicitlyDenied or Error."""
    payload = json.dumps([simulation(world, r) for r in requests])
    done = subprocess.run(["node", str(SIMULATE)], input=payload, capture_output=True, text=True, cwd=ROOT, timeout=120)
    if done.returncode != 0:
        raise AssertionError(
            f"{SIMULATE.name} failed (is @cloud-copilot/iam-simulate installed? run `npm ci`):\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout)


# -- IAM's SimulatePrincipalPolicy, answered by the simulator ----------------------------------

DECISIONS = {"Allowed": "allowed", "ExplicitlyDenied": "explicitDeny", "ImplicitlyDenied": "implicitDeny"}


class Simulator:
    """One ``simulate.mjs --lines`` process for many small batches (node starts in about 0.5 s)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None

    def run(self, simulations: list[dict]) -> list[dict]:
        if self._process is None:
            self._process = subprocess.Popen(
                ["node", str(SIMULATE), "--lines"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
            )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(simulations) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise AssertionError(f"{SIMULATE.name} --lines ended (is @cloud-copilot/iam-simulate installed?)")
        return json.loads(line)

    def close(self) -> None:
        if self._process is not None:
            self._process.stdin.close()  # type: ignore[union-attr]
            self._process.wait(timeout=30)
            self._process = None


def default_key_policy(partition: str, account: str) -> dict:
    """KMS's default key policy: the account's IAM policies decide who may use the key."""
    return {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"AWS": f"arn:{partition}:iam::{account}:root"}, "Action": "kms:*", "Resource": "*",
    }]}


def simulate_principal_policy(params: dict, policies: list[dict], simulator: Simulator) -> dict:
    """IAM's answer to SimulatePrincipalPolicy ``params`` for a principal whose identity policies are
    ``policies``: each action on each resource, with the request's ContextEntries, and the request's
    ResourcePolicy if it gives one (IAM evaluates none otherwise)."""
    source = params["PolicySourceArn"]
    context = {}
    for entry in params.get("ContextEntries", []):
        values = entry["ContextKeyValues"]
        context[entry["ContextKeyName"]] = values[0] if len(values) == 1 else values
    pairs = [(a, r) for a in params["ActionNames"] for r in params.get("ResourceArns", ["*"])]
    simulations = []
    for action, resource in pairs:
        one: dict[str, Any] = {
            "request": {
                "principal": source,
                "action": action,
                "resource": {"resource": resource, "accountId": source.split(":")[4]},
                "contextVariables": context,
            },
            "identityPolicies": policies,
        }
        if "ResourcePolicy" in params:
            one["resourcePolicy"] = json.loads(params["ResourcePolicy"])
        elif ":kms:" in resource:
            # iam-simulate requires a key policy for KMS; KMS's default one leaves the decision to
            # the identity policies, as IAM's simulator without a ResourcePolicy does.
            one["resourcePolicy"] = default_key_policy(resource.split(":")[1], resource.split(":")[4])
        simulations.append(one)
    results = []
    for (action, resource), outcome in zip(pairs, simulator.run(simulations), strict=True):
        if outcome["result"] not in DECISIONS:
            raise AssertionError(f"the simulator could not evaluate {action} on {resource}: {outcome['errors']}")
        results.append({"EvalActionName": action, "EvalResourceName": resource, "EvalDecision": DECISIONS[outcome["result"]]})
    return {"EvaluationResults": results, "IsTruncated": False, "ResponseMetadata": {"HTTPStatusCode": 200}}


def answer_simulations(client, policies_for, simulator: Simulator, calls: list[dict]) -> None:
    """Make an iam client answer SimulatePrincipalPolicy from the simulator over ``policies_for(role ARN)``,
    after botocore has validated the request against the service model. Each call's parameters go to ``calls``."""
    from botocore.awsrequest import AWSResponse

    def keep(params, context, **_):
        context["simulate_principal_policy"] = json.loads(json.dumps(params))

    def answer(context, **_):
        params = context["simulate_principal_policy"]
        calls.append(params)
        parsed = simulate_principal_policy(params, policies_for(params["PolicySourceArn"]), simulator)
        return AWSResponse("https://iam.amazonaws.com/", 200, {}, None), parsed

    client.meta.events.register("before-parameter-build.iam.SimulatePrincipalPolicy", keep)
    client.meta.events.register("before-call.iam.SimulatePrincipalPolicy", answer)
