"""The access matrix (tests/constructs/access/matrix.yaml), evaluated by an IAM policy simulator.

Every access a deployed recipe performs at run time must be allowed, and every access in the
denied list refused, by the synthesized templates' identity, bucket, key, topic and trust
policies together, as AWS evaluates them (@cloud-copilot/iam-simulate, see access_world.py).
Two apps: the repository's (every template recipe and the variants of conftest.py, on one
platform) and examples/platform-repo (a VPC, a role, bucket and topic of the team's own, an
EventBridge Scheduler schedule).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from access_world import ROOT, Request, World, simulate

from tiered_training.contract.container import LOG_GROUP
from tiered_training.pipeline import definition as d
from training.components.checkpoint_files import COMMITTED, METADATA, step_dir

MATRIX = Path(__file__).parent / "access" / "matrix.yaml"
EXAMPLE = ROOT / "examples" / "platform-repo"
ACCOUNT, REGION, OTHER_ACCOUNT = "123456789012", "us-east-1", "210987654321"
EXECUTION = "0a1b2c3d4e5f"  # a pipeline execution's id: the id of the run it starts
RESUMED_RUN = "9f8e7d6c5b4a"  # the RunId an execution resumes
JOB = f"pipelines-{EXECUTION}-Train-AbCdEf1234"
PROBE_JOB = f"pipelines-{EXECUTION}-Probe-AbCdEf1234"
PREPARE_JOB = f"pipelines-{EXECUTION}-Prepare-AbCdEf1234"
STEP = 100
PREPARED_KEY = "0123456789abcdef0123456789abcdef"  # a content key of prepared data
EXPRESSIONS = {"Execution.PipelineExecutionId": EXECUTION, f"Parameters.{d.P_RUN_ID}": RESUMED_RUN}
PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


def _rendered(expression: Any) -> str:
    """A pipeline expression's value in one execution (EXPRESSIONS): Std:Join of strings and Gets."""
    if isinstance(expression, str):
        return expression
    if "Std:Join" in expression:
        body = expression["Std:Join"]
        return body["On"].join(_rendered(v) for v in body["Values"])
    return EXPRESSIONS[expression["Get"]]


def _key(uri: str, bucket: str) -> str:
    found, _, key = uri.removeprefix("s3://").partition("/")
    assert found == bucket, f"{uri} is not in the store bucket {bucket}"
    return key


def _store_paths(world: World, pipeline, bucket: str) -> dict[str, str]:
    """The object keys a run writes and reads in the store, from the definition's own builders: a new
    run's checkpoint (COMMITTED and DCP's .metadata of step-N), a resumed run's, the job's model output,
    the probe's and the TensorBoard files."""
    resources = dataclasses.replace(
        pipeline.resources,
        checkpoint_s3_uri=_value(world, pipeline.resources.checkpoint_s3_uri, pipeline),
        output_s3_uri=_value(world, pipeline.resources.output_s3_uri, pipeline),
    )
    plan = pipeline.plan
    train = d.training_arguments(plan, resources)
    probe = d.training_arguments(plan, resources, probe=True)
    resume = d.training_arguments(plan, resources, segment=d.Segment(d.param(d.P_RUN_ID), True))
    run = _key(_rendered(train["CheckpointConfig"]["S3Uri"]), bucket)
    resumed = _key(_rendered(resume["CheckpointConfig"]["S3Uri"]), bucket)
    assert run.endswith(f"/runs/{EXECUTION}/") and resumed.endswith(f"/runs/{RESUMED_RUN}/")
    paths = {
        "checkpoint_list": run,
        "checkpoint_object": str(step_dir(Path(run), STEP) / COMMITTED),
        "checkpoint_metadata": str(step_dir(Path(run), STEP) / METADATA),
        "resume_object": str(step_dir(Path(resumed), STEP) / COMMITTED),
        "model_output": f"{_key(train['OutputDataConfig']['S3OutputPath'], bucket)}/{JOB}/output/model.tar.gz",
        "probe_output": f"{_key(probe['OutputDataConfig']['S3OutputPath'], bucket)}/{PROBE_JOB}/output/model.tar.gz",
    }
    if plan.recipe.data.prepare is not None:  # the Prepare job's shards (one content key) and property file
        prepare = d.prepare_arguments(plan, resources)
        prepared = f"{_key(d.prepared_s3_uri(resources), bucket)}{PREPARED_KEY}/"
        paths["prepared_list"] = prepared
        paths["prepared_object"] = f"{prepared}train/shard-00000.bin"
        paths["prepared_manifest"] = f"{prepared}manifest.json"
        output = prepare["ProcessingOutputConfig"]["Outputs"][0]["S3Output"]["S3Uri"]
        paths["prepare_output"] = f"{_key(_rendered(output), bucket)}/{d.PREPARED_JSON}"
        if plan.recipe.data.sources:  # the corpus layout (tiered_training/contract/corpus.py)
            source = plan.recipe.data.sources[-1].name
            paths["corpus_unit_marker"] = f"{prepared}units/{source}/part-0.json"
            paths["corpus_train_object"] = f"{prepared}train/{source}/part-0.bin"
            paths["corpus_validation_object"] = f"{prepared}validation/{source}/part-0.bin"
    if "TensorBoardOutputConfig" in train:
        tensorboard = _key(train["TensorBoardOutputConfig"]["S3OutputPath"], bucket)
        paths["tensorboard_object"] = f"{tensorboard}/{JOB}/tensorboard-output/events.out.tfevents"
    return paths


def _uri_group(uri: str) -> dict[str, str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    folder = prefix if prefix == "" or prefix.endswith("/") else prefix + "/"
    return {"data_bucket": bucket, "data_list": folder, "data_object": f"{folder}shard-00000.bin"}


class Recipe:
    """One recipe's bindings: scalar values and the groups ``for_each`` iterates."""

    def __init__(self, app: str, name: str) -> None:
        self.app, self.name = app, name
        self.values: dict[str, str] = {
            "account": ACCOUNT, "region": REGION, "partition": "aws", "other_account": OTHER_ACCOUNT,
            "recipe": name, "job": JOB, "repository": f"cdk-hnb659fds-container-assets-{ACCOUNT}-{REGION}",
            "log_group": LOG_GROUP,
        }
        self.groups: dict[str, list[dict[str, str]]] = {}


def _value(world: World, token: Any, scope) -> Any:
    from aws_cdk import Stack

    stack = Stack.of(scope)
    return world.resolve(stack.stack_name, stack.resolve(token))


def _topic_key(world: World, topic_arn: str) -> str | None:
    for stack, template in world.templates.items():
        for logical, resource in template["Resources"].items():
            if resource["Type"] == "AWS::SNS::Topic" and world.ref(stack, logical) == topic_arn:
                key = world.resolve(stack, resource["Properties"]["KmsMasterKeyId"])
                return key if key.startswith("arn:") else f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{key}"
    return None


def _recipe_bindings(world: World, app: str, pipeline, monitoring) -> Recipe:
    plan = pipeline.plan
    recipe = Recipe(app, plan.recipe.name)
    v = recipe.values
    v["execution_role"] = _value(world, pipeline.execution_role.role_arn, pipeline)
    v["pipeline_role"] = _value(world, pipeline.pipeline_role.role_arn, pipeline)
    v["pipeline_arn"] = _value(world, pipeline.pipeline_arn, pipeline)
    if pipeline.model_package_group is not None:  # a package of the recipe's group, as SageMaker numbers it
        v["model_package"] = _value(world, pipeline.model_packages_arn, pipeline).removesuffix("*") + "1"
        v["approval"] = plan.recipe.registry.approval
    if pipeline.prepare_role is not None:
        v["prepare_role"] = _value(world, pipeline.prepare_role.role_arn, pipeline)
        v["prepare_job"] = PREPARE_JOB
    store = pipeline.store
    v["store_bucket"] = _value(world, store.bucket.bucket_name, store.bucket)
    v["store_key"] = _value(world, store.encryption_key.key_arn, store.encryption_key)
    v.update(_store_paths(world, pipeline, v["store_bucket"]))
    compute, data = plan.recipe.compute, plan.recipe.data
    if compute.training_plan_arn:
        v["training_plan"] = compute.training_plan_arn
        v["reserved_capacity"] = re.sub(r":training-plan/.*", ":reserved-capacity/rc-0123456789abcdef", compute.training_plan_arn)
    if plan.recipe.tracking.mlflow_tracking_server_arn:
        v["mlflow"] = plan.recipe.tracking.mlflow_tracking_server_arn
    if data.kms_key_arn:
        v["data_key"] = data.kms_key_arn
    # With data.prepare the training jobs read the prepared shards; the Prepare job reads the raw examples.
    raw = data.data_prefixes if data.prepare is not None else []
    uris = [u for u in data.data_prefixes if u not in raw]
    uris += [u for u in (plan.recipe.model.init_checkpoint, data.validation_uri) if u]
    recipe.groups["data"] = [_uri_group(u) for u in uris]
    recipe.groups["raw"] = [_uri_group(u) for u in raw]
    tokenizer_uri = data.tokenizer or plan.recipe.model.init_checkpoint
    tokenizer = [tokenizer_uri] if raw and tokenizer_uri else []
    recipe.groups["prepare_input"] = [_uri_group(u) for u in raw + tokenizer]
    topic = _value(world, monitoring.topic.topic_arn, monitoring)
    key = _topic_key(world, topic)
    known = world.is_known_topic(topic) and key is not None
    recipe.groups["alarm"] = [
        {"alarm_arn": _value(world, alarm.alarm_arn, alarm), "topic": topic, "topic_key": key}
        for name, alarm in monitoring.alarms.items()
        if known and monitoring.fit.alarms[name].notifies
    ]
    recipe.groups["rule"] = (
        [{"rule_arn": _value(world, monitoring.failed_rule.rule_arn, monitoring), "topic": topic, "topic_key": key}]
        if known else []
    )
    return recipe


def _find(stack, kind) -> list:
    return [c for c in stack.node.find_all() if isinstance(c, kind)]


@pytest.fixture(scope="module")
def recipes_world(synthesized, templates) -> tuple[World, list[Recipe]]:
    from tiered_training.constructs import TrainingMonitoring

    _app, _platform, stacks, _assembly = synthesized
    world = World(ACCOUNT, REGION)
    for name, template in templates.items():
        world.add(name, template)
    recipes = []
    for stack in stacks.values():
        (monitoring,) = _find(stack, TrainingMonitoring)
        recipes.append(_recipe_bindings(world, "recipes", stack.pipeline, monitoring))
    for recipe in recipes:
        _bind_other(recipe, next(r for r in recipes if r.name != recipe.name))
    return world, recipes


def _bind_other(recipe: Recipe, other: Recipe) -> None:
    """Another recipe of the same store: its name and its run's checkpoint."""
    recipe.values["other_recipe"] = other.name
    recipe.values["other_checkpoint_object"] = other.values["checkpoint_object"]
    recipe.values["other_checkpoint_list"] = other.values["checkpoint_list"]
    if "model_package" in other.values:
        recipe.values["other_model_package"] = other.values["model_package"]


@pytest.fixture(scope="module")
def example_world(tmp_path_factory) -> tuple[World, list[Recipe]]:
    """examples/platform-repo's app, synthesized in this process from the checkout."""
    from aws_cdk import App
    from aws_cdk import aws_ec2 as ec2

    from tiered_training.constructs import TrainingMonitoring, TrainingPipeline, load_plans

    spec = importlib.util.spec_from_file_location("platform_repo_app", EXAMPLE / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    context = json.loads((EXAMPLE / "cdk.json").read_text())["context"]
    app = App(outdir=str(tmp_path_factory.mktemp("example.out")), context=context)
    stack = module.TrainingStack(app, "MlTraining", plans=load_plans(EXAMPLE / "recipes"))
    assembly = app.synth()
    world = World(ACCOUNT, REGION)
    world.add(stack.stack_name, assembly.get_stack_by_name(stack.stack_name).template)
    template = world.templates[stack.stack_name]
    schedules = [r["Properties"]["Target"] for r in template["Resources"].values() if r["Type"] == "AWS::Scheduler::Schedule"]
    (vpc,) = _find(stack, ec2.Vpc)
    recipes = []
    for pipeline in _find(stack, TrainingPipeline):
        (monitoring,) = [m for m in _find(stack, TrainingMonitoring) if m.pipeline is pipeline]
        recipe = _recipe_bindings(world, "example", pipeline, monitoring)
        (target,) = [t for t in schedules if world.resolve(stack.stack_name, t["Arn"]) == recipe.values["pipeline_arn"]]
        recipe.values["scheduler_role"] = world.resolve(stack.stack_name, target["RoleArn"])
        recipe.values["vpc_arn"] = _value(world, vpc.vpc_arn, vpc)
        subnets = vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets
        recipe.groups["subnet"] = [
            {"subnet_arn": f"arn:aws:ec2:{REGION}:{ACCOUNT}:subnet/{_value(world, s.subnet_id, vpc)}"} for s in subnets
        ]
        groups = pipeline.connections.security_groups
        recipe.groups["security_group"] = [
            {"security_group_arn": f"arn:aws:ec2:{REGION}:{ACCOUNT}:security-group/{_value(world, g.security_group_id, g)}"}
            for g in groups
        ]
        recipes.append(recipe)
    assert recipes, "examples/platform-repo has no recipes"
    return world, recipes


def _fill(text: Any, values: dict[str, str]) -> Any:
    if isinstance(text, dict):
        return {_fill(k, values): _fill(v, values) for k, v in text.items()}
    if not isinstance(text, str):
        return text
    return PLACEHOLDER.sub(lambda m: values[m[1]], text)


def requests_for(entry: dict, recipe: Recipe) -> list[Request]:
    """The requests of one matrix entry for one recipe; none where the recipe lacks a value."""
    if recipe.app not in entry["app"]:
        return []
    groups = [recipe.groups.get(entry["for_each"], [])] if "for_each" in entry else [[{}]]
    out = []
    for (group,) in itertools.product(*groups):
        values = {**recipe.values, **group}
        fields = [entry["principal"], entry["resource"], json.dumps(entry.get("context", {}))]
        if any(name not in values or values[name] is None for f in fields for name in PLACEHOLDER.findall(f)):
            continue
        out.append(Request(
            what=f"{recipe.app}/{recipe.name}: {entry['what']}",
            principal=_fill(entry["principal"], values),
            action=entry["action"],
            resource=_fill(entry["resource"], values),
            context=_fill(entry.get("context", {}), values),
        ))
    return out


def _evaluate(world: World, recipes: list[Recipe], app: str) -> tuple[list[str], list[str]]:
    matrix = yaml.safe_load(MATRIX.read_text())
    batch: list[tuple[str, Request]] = []
    unused = []
    for expected, entries in (("Allowed", matrix["allowed"]), ("Denied", matrix["denied"])):
        for entry in entries:
            if app not in entry["app"]:
                continue
            requests = [r for recipe in recipes for r in requests_for(entry, recipe)]
            if not requests:
                unused.append(entry["what"])
            batch += [(expected, r) for r in requests]
    # One line per matrix entry that failed: how many requests, and the first one in full.
    wrong: dict[tuple[str, str], list[tuple[Request, dict]]] = {}
    for (expected, request), outcome in zip(batch, simulate(world, [r for _e, r in batch]), strict=True):
        result = outcome["result"]
        if result == "Error" or (result == "Allowed") != (expected == "Allowed"):
            what = request.what.split(": ", 1)[1]
            wrong.setdefault((f"{result}, expected {expected}", what), []).append((request, outcome))
    failures = []
    for (verdict, what), cases in wrong.items():
        request, outcome = cases[0]
        errors = f" errors: {json.dumps(outcome['errors'])[:600]}" if outcome["errors"] else ""
        failures.append(f"{verdict}: {what} ({len(cases)} requests), e.g. {request.describe()}{errors}")
    return failures, unused


def test_every_run_time_access_is_allowed_and_every_forbidden_one_denied(recipes_world):
    failures, unused = _evaluate(*recipes_world, "recipes")
    assert not unused, f"matrix entries that no recipe of the app exercises: {unused}"
    assert not failures, f"{len(failures)} requests decided wrongly:\n" + "\n".join(failures)


def test_the_example_platform_repo_allows_and_denies_the_same(example_world):
    failures, unused = _evaluate(*example_world, "example")
    assert not unused, f"matrix entries that the example does not exercise: {unused}"
    assert not failures, f"{len(failures)} requests decided wrongly:\n" + "\n".join(failures)


def test_a_stage_admits_its_own_alarms_and_rules_only(staged):
    """The same matrix for an app in stage "dev"; an unstaged recipe's alarm may not publish to dev's topic."""
    _app, platform, stacks, templates = staged
    world = World(ACCOUNT, REGION)
    for name, template in templates.items():
        world.add(name, template)
    recipes = [_recipe_bindings(world, "recipes", s.pipeline, s.monitoring) for s in stacks.values()]
    for recipe, other in zip(recipes, reversed(recipes)):
        _bind_other(recipe, other)
    failures, _unused = _evaluate(world, recipes, "recipes")
    assert not failures, "\n".join(failures)
    topic = _value(world, platform.platform.topic.topic_arn, platform)
    assert topic.endswith(":dev-TieredTraining-platform_alarms")
    foreign = [
        f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:TieredTraining-llama3-8b-128k-Stalled",
        f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:prod-TieredTraining-llama3-8b-128k-Stalled",
    ]
    requests = [
        Request("another stage's alarm", "cloudwatch.amazonaws.com", "sns:Publish", topic,
                {"aws:SourceArn": arn, "aws:SourceAccount": ACCOUNT, "aws:SecureTransport": "true"})
        for arn in foreign
    ]
    assert [o["result"] for o in simulate(world, requests)] == ["ImplicitlyDenied", "ImplicitlyDenied"]
