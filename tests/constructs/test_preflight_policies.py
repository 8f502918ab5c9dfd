"""`preflight` against a deployed recipe's own policies, answered by the IAM policy simulator.

A recipe stack of the synthesized app (conftest.py) is "deployed" into moto server: its pipeline
definition (resolved from the template) and buckets holding the recipe's data. IAM's
SimulatePrincipalPolicy is not in moto; the iam client answers it with @cloud-copilot/iam-simulate
over the execution role's identity policies from the template (access_world.answer_simulations),
after botocore has validated the request. So a request without the context keys that a grant's
condition needs is denied here as AWS denies it.
"""

from __future__ import annotations

import copy
import json

import pytest
from access_world import Simulator, World, answer_simulations
from support import moto_server, offline_aws_env

from tiered_training.aws import preflight as pf

ACCOUNT, REGION = "123456789012", "us-east-1"
# A recipe with an init checkpoint, one with validation shards and a training plan, one with a data key
# and several allowed prefixes.
RECIPES = ["llama31-8b-sft", "spot-variant", "data-variant"]
GRANTS = ("s3:", "kms:")  # the role's data, checkpoint and KMS grants


@pytest.fixture(scope="module")
def world(templates) -> World:
    world = World(ACCOUNT, REGION)
    for name, template in templates.items():
        world.add(name, template)
    return world


@pytest.fixture(scope="module")
def simulator():
    simulator = Simulator()
    yield simulator
    simulator.close()


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        offline_aws_env(mp, tmp_path_factory.mktemp("home"), REGION)
        with moto_server() as url:
            yield url


def _read_uris(plan) -> list[str]:
    """What a run reads: the data, the validation shards and the init checkpoint."""
    data, model = plan.recipe.data, plan.recipe.model
    return [u for u in (data.uri, data.validation_uri, model.init_checkpoint) if u]


class Deployment:
    """One recipe deployed into moto: its pipeline, its data, and its execution role's policies."""

    def __init__(self, world: World, stack, plan, endpoint: str) -> None:
        import boto3

        self.plan, self.endpoint = plan, endpoint
        name = stack.stack_name
        (pipeline,) = [
            r for r in world.templates[name]["Resources"].values() if r["Type"] == "AWS::SageMaker::Pipeline"
        ]
        props = pipeline["Properties"]
        self.definition = world.resolve(name, props["PipelineDefinition"]["PipelineDefinitionBody"])
        self.role_arn = world.resolve(name, stack.resolve(stack.pipeline.execution_role.role_arn))
        self.policies = world.identity_policies(self.role_arn)
        sm = boto3.client("sagemaker", endpoint_url=endpoint, region_name=REGION)
        sm.create_pipeline(
            PipelineName=world.resolve(name, props["PipelineName"]),
            PipelineDefinition=self.definition,
            RoleArn=f"arn:aws:iam::{ACCOUNT}:role/pipeline",
        )
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION)
        for uri in _read_uris(plan):
            bucket, _, prefix = uri.removeprefix("s3://").partition("/")
            if bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
                s3.create_bucket(Bucket=bucket)
            s3.put_object(Bucket=bucket, Key=prefix.rstrip("/") + "/shard-00000.bin", Body=b"\0" * 64)
        recipe = plan.recipe
        if recipe.task == "sft":  # packed example shards, as training/sft_data.py describes them
            manifest = {
                "kind": "sft-packed",
                "sequence_length": recipe.sequence_length,
                "token_dtype": recipe.data.token_dtype,
                "loss_on": recipe.data.loss_on,
                "overlong": recipe.data.overlong,
                "shards": [],
            }
            bucket, _, prefix = recipe.data.uri.removeprefix("s3://").partition("/")
            s3.put_object(
                Bucket=bucket, Key=prefix.rstrip("/") + "/" + "shards.json", Body=json.dumps(manifest).encode()
            )

    def preflight(self, simulator: Simulator, policies: list[dict] | None = None) -> tuple[list[pf.Check], list[dict]]:
        """The data and store checks of a preflight run, and the SimulatePrincipalPolicy calls it made."""
        from tiered_training.aws.session import aws_client

        clients = {s: aws_client(s, region=REGION, endpoint_url=self.endpoint) for s in pf.SERVICES}
        calls: list[dict] = []
        held = self.policies if policies is None else policies
        answer_simulations(clients["iam"], lambda arn: held if arn == self.role_arn else [], simulator, calls)
        report = pf.run(self.plan, clients, region=REGION)
        return [c for c in report.checks if c.check in ("data", "store")], calls


@pytest.fixture(scope="module")
def deployments(world, synthesized, plans, endpoint) -> dict[str, Deployment]:
    _app, _platform, stacks, _assembly = synthesized
    by_recipe = {s.pipeline.plan.recipe.name: s for s in stacks.values()}
    return {name: Deployment(world, by_recipe[name], plans[name], endpoint) for name in RECIPES}


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_freshly_deployed_recipe_passes(deployments, simulator, recipe):
    checks, calls = deployments[recipe].preflight(simulator)
    bad = [c.line() for c in checks if c.status != "pass"]
    assert not bad, "\n".join(bad)
    subjects = " ".join(c.subject for c in checks)
    plan = deployments[recipe].plan
    for uri in _read_uris(plan) + plan.recipe.data.data_prefixes:
        assert f"{uri} by " in subjects
    # The run's checkpoints and every job's output path, from the deployed definition.
    assert "/checkpoints/runs/ by " in subjects and "/output/model by " in subjects and "/output/probe by " in subjects
    listed = [c for c in calls if c["ActionNames"] == ["s3:ListBucket"]]
    assert listed and all(e["ContextKeyName"] == "s3:prefix" for c in listed for e in c["ContextEntries"])
    kms = [c for c in calls if c["ActionNames"][0].startswith("kms:")]
    assert kms and all("kms:ViaService" in {e["ContextKeyName"] for e in c["ContextEntries"]} for c in kms)
    if plan.recipe.data.kms_key_arn:
        assert any(c["ResourceArns"] == [plan.recipe.data.kms_key_arn] for c in kms)


def _statements(policies: list[dict]) -> list[tuple[int, int, dict]]:
    out = []
    for i, policy in enumerate(policies):
        for j, statement in enumerate(policy["policy"]["Statement"]):
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            # the grants: a Deny (the execution role may not write the prepared shards) is not one to take away
            if statement.get("Effect", "Allow") == "Allow" and any(a.startswith(GRANTS) for a in actions):
                out.append((i, j, {**statement, "Action": actions}))
    return out


@pytest.mark.parametrize("recipe", RECIPES)
def test_without_any_one_data_checkpoint_or_key_grant_preflight_names_it(deployments, simulator, recipe):
    deployment = deployments[recipe]
    statements = _statements(deployment.policies)
    granted = {a for _i, _j, statement in statements for a in statement["Action"]}
    assert {"s3:ListBucket", "s3:GetObject", "s3:PutObject", "s3:DeleteObject", "kms:Encrypt"} <= granted, granted
    wrong = []
    for i, j, statement in statements:
        policies = copy.deepcopy(deployment.policies)
        del policies[i]["policy"]["Statement"][j]
        checks, _calls = deployment.preflight(simulator, policies)
        failed = [c for c in checks if c.failed]
        denied = [part.split(" on ", 1)[0] for c in failed for part in c.detail.split("; ")]
        label = json.dumps({k: statement[k] for k in ("Action", "Resource") if k in statement})[:300]
        if not failed:
            wrong.append(f"passed without {label}")
        elif not set(denied) <= set(statement["Action"]) or not all(c.fix for c in failed):
            wrong.append(f"without {label} it named {denied}")
    assert not wrong, "\n".join(wrong)
