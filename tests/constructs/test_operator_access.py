"""An operator whose only permissions are the platform's operator grant can make every call of
the commands, and no other.

The platform grants a role ``grant_operate``; the app is synthesized (recipe stacks with their
``Operate`` policies). Each recipe's pipeline, store and data are deployed to a moto server as
the templates name them, and ``start`` (new, ``--resume``, followed), ``status``, ``logs``,
``stop`` and ``preflight`` run against it while botocore's hooks record every call
(operator_calls.py). Each call, as the IAM request AWS evaluates (access/cli_calls.yaml),
must be allowed by @cloud-copilot/iam-simulate for the operator role with only its managed
policies; calls outside the commands must be denied.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from access_world import Request, World
from aws_calls import Call, mapping, recording
from operator_calls import bucket_key, managed_policies, requests_for, simulate_with
from support import moto_server, offline_aws_env
from typer.testing import CliRunner

from tiered_training.pipeline.definition import S_TRAIN, find_step

ACCOUNT, REGION = "123456789012", "us-east-1"
# MLflow and a training plan; sft's packed-data manifest; raw examples for a Prepare step (preflight reads one)
RECIPES = ("spot-variant", "llama31-8b-sft", "llama31-8b-tools-sft")
RUN = "run-1"


@pytest.fixture(scope="module")
def operated(plans, tmp_path_factory):
    """(world, operator role ARN): the platform and two recipes, the platform's operator grant to a role."""
    from aws_cdk import aws_iam as iam

    from tiered_training.constructs.app import build_app

    outdir = tmp_path_factory.mktemp("operated")
    app, platform, stacks = build_app([plans[name] for name in RECIPES], nag=True, outdir=str(outdir))
    operator = iam.Role(platform, "Operator", assumed_by=iam.AccountRootPrincipal())
    platform.platform.grant_operate(operator)
    assembly = app.synth()
    world = World(ACCOUNT, REGION)
    for stack in [platform, *stacks.values()]:
        world.add(stack.stack_name, assembly.get_stack_by_name(stack.stack_name).template)
    logical = next(
        k
        for k, r in world.templates[platform.stack_name]["Resources"].items()
        if r["Type"] == "AWS::IAM::Role" and k.startswith("Operator")
    )
    return world, world.attribute(platform.stack_name, logical, "Arn"), stacks


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    from aws import test_preflight, test_runs  # their moto additions: steps, stop, quotas, IAM simulation

    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        offline_aws_env(mp, home, REGION)
        test_runs.add_missing_actions(mp)
        test_preflight.add_missing_actions(mp)
        with moto_server() as url:
            yield url


def client(service: str, endpoint: str):
    import boto3

    return boto3.client(service, endpoint_url=endpoint, region_name=REGION)


def deploy(world: World, stack_name: str, plan, endpoint: str) -> list[dict]:
    """The recipe's pipeline as its template defines it, its store with one committed checkpoint, its data.
    Returns the tags its training steps put on their jobs (the steps' Arguments)."""
    template = world.templates[stack_name]
    logical, pipeline = next(
        (k, r) for k, r in template["Resources"].items() if r["Type"] == "AWS::SageMaker::Pipeline"
    )
    props = world.resolve(stack_name, pipeline["Properties"])
    body = props["PipelineDefinition"]["PipelineDefinitionBody"]
    sm, s3 = client("sagemaker", endpoint), client("s3", endpoint)
    sm.create_pipeline(PipelineName=props["PipelineName"], PipelineDefinition=body, RoleArn=props["RoleArn"])
    train = find_step(json.loads(body), S_TRAIN)
    store = train["Arguments"]["CheckpointConfig"]["S3Uri"]["Std:Join"]["Values"][0]
    bucket, _, runs = store[len("s3://") :].partition("/")
    for name in (bucket, plan.recipe.data.uri[len("s3://") :].split("/")[0]):
        try:
            s3.create_bucket(Bucket=name)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
    manifest = {"step": 4, "committed_at": 1.0, "files": {}, "run": {"run_id": RUN, "data_uri": plan.recipe.data.uri}}
    s3.put_object(Bucket=bucket, Key=f"{runs}{RUN}/step-4/COMMITTED", Body=json.dumps(manifest).encode())
    data_bucket, _, prefix = plan.recipe.data.uri[len("s3://") :].partition("/")
    if plan.recipe.data.prepare is not None:  # raw examples: preflight checks that the first one is readable (HeadObject)
        s3.put_object(Bucket=data_bucket, Key=f"{prefix}chat.parquet", Body=b"PAR1")
    else:  # token shards (under a raw prefix preflight would refuse a .bin, which no reader takes)
        s3.put_object(Bucket=data_bucket, Key=f"{prefix}shard-000.bin", Body=b"\0" * 64)
    register_package(sm, json.loads(body))
    return train["Arguments"]["Tags"]


def register_package(sm, definition: dict) -> None:
    """The model package group the template creates and version 1 in it, as the Register step asks."""
    args = dict(find_step(definition, "Register")["Arguments"])
    group = args["ModelPackageGroupName"]
    sm.create_model_package_group(ModelPackageGroupName=group)
    container = dict(args["InferenceSpecification"]["Containers"][0], ModelDataUrl=f"s3://store/{group}/model.tar.gz")
    sm.create_model_package(
        ModelPackageGroupName=group,
        ModelApprovalStatus=args["ModelApprovalStatus"],
        InferenceSpecification={**args["InferenceSpecification"], "Containers": [container]},
        CustomerMetadataProperties={"run_id": RUN, "plan_hash": args["CustomerMetadataProperties"]["plan_hash"],
                                    "train:loss": "2.5"},
    )


def execution_with_logs(endpoint: str, name: str) -> str:
    """The latest execution marked Executing, its Train step's job with a log stream."""
    from aws import test_runs

    listed = client("sagemaker", endpoint).list_pipeline_executions(PipelineName=name)["PipelineExecutionSummaries"]
    arn = max(listed, key=lambda e: e["StartTime"])["PipelineExecutionArn"]
    test_runs.moto_execution(arn).pipeline_execution_status = "Executing"
    test_runs.ran(arn, ("Train", "Executing"))
    logs = client("logs", endpoint)
    try:
        logs.create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    stream = f"pipelines-{arn[-12:]}-train/algo-1-1700000000"
    logs.create_log_stream(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream)
    now = int(datetime.now(UTC).timestamp() * 1000)
    logs.put_log_events(
        logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream, logEvents=[{"timestamp": now, "message": "x"}]
    )
    return arn


def execution_with_probe(endpoint: str, name: str, tags: list[dict]) -> str:
    """The latest execution with a finished Probe step and its job's measurements, the job tagged as the
    pipeline's training steps tag theirs."""
    from aws import test_runs

    listed = client("sagemaker", endpoint).list_pipeline_executions(PipelineName=name)["PipelineExecutionSummaries"]
    arn = max(listed, key=lambda e: e["StartTime"])["PipelineExecutionArn"]
    test_runs.ran(arn, ("Probe", "Succeeded"))
    job = test_runs.probe_job(endpoint, arn, best_candidate=1, candidate1_tokens_per_second=1000.0)
    sm = client("sagemaker", endpoint)
    sm.add_tags(ResourceArn=sm.describe_training_job(TrainingJobName=job)["TrainingJobArn"], Tags=tags)
    return arn


COMMANDS = [
    ("start", ["--no-follow"]),
    ("start --resume", ["--no-follow", "--resume", RUN]),
    ("start (follow)", ["--poll-seconds", "0", "-f", "json"]),
    ("status", []),
    ("logs", []),
    ("stop", []),
    ("preflight", []),
    ("calibrate", ["--from-runs"]),
    ("registry", []),
    ("registry --approve", ["--approve", "1", "--note", "reviewed"]),
]


def steady_run(endpoint: str, plan) -> None:
    """Per-minute tokens/s per GPU of a finished run, 0.9 times the plan's: what calibrate reads."""
    from datetime import timedelta

    from tiered_training.contract import metrics as catalogue

    now = datetime.now(UTC).replace(second=0, microsecond=0)
    value = 0.9 * plan.estimates.tokens_per_second_per_gpu
    client("cloudwatch", endpoint).put_metric_data(
        Namespace=catalogue.NAMESPACE,
        MetricData=[
            {
                "MetricName": catalogue.TOKENS_PER_SECOND_PER_GPU.name,
                "Dimensions": [{"Name": "Recipe", "Value": plan.name}],
                "Value": value,
                "Timestamp": now - timedelta(minutes=m),
            }
            for m in range(1, 13)
        ],
    )


def run_commands(world: World, stack_name: str, plan, endpoint: str) -> list[Call]:
    """Deploy the recipe as its template says, run each command on it, and return their calls."""
    from tiered_training.cli.app import app

    tags = deploy(world, stack_name, plan, endpoint)
    calls = []
    for command, args in COMMANDS:
        if command == "logs":  # the latest execution runs (stop stops it) and has logged
            execution_with_logs(endpoint, plan.name)
        if command == "calibrate":
            steady_run(endpoint, plan)
        if command == "status":  # the latest execution's probe ran: status reads its job's measurements
            execution_with_probe(endpoint, plan.name, tags)
        with recording(command) as recorder:
            result = CliRunner().invoke(app, [command.split()[0], plan.source, "--endpoint-url", endpoint, *args])
        # preflight fails its checks here (no quotas raised, no image): its calls are made all the same
        assert result.exit_code == 0 or command == "preflight", (command, result.output)
        calls += recorder.calls
    return calls


def job_tags(endpoint: str, calls: list[Call]) -> dict[str, dict[str, str]]:
    """The tags of the training jobs the calls describe, by ARN, as SageMaker holds them."""
    sm, out = client("sagemaker", endpoint), {}
    for call in calls:
        if call.operation == "DescribeTrainingJob":
            arn = sm.describe_training_job(TrainingJobName=call.params["TrainingJobName"])["TrainingJobArn"]
            out[arn.lower()] = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=arn)["Tags"]}
    return out


@pytest.fixture(scope="module")
def by_recipe(operated, endpoint, plans):
    """Every call of each command, for each recipe; and the tags of the jobs they describe."""
    world, _operator, stacks = operated
    calls = {name: run_commands(world, stacks[name].stack_name, plans[name], endpoint) for name in RECIPES}
    return calls, job_tags(endpoint, [c for each in calls.values() for c in each])


@pytest.fixture(scope="module")
def recorded(by_recipe):
    """Every call of each command, for each recipe."""
    return [call for name in RECIPES for call in by_recipe[0][name]]


@pytest.fixture(scope="module")
def tags(by_recipe):
    return by_recipe[1]


def test_every_command_makes_calls_and_each_is_mapped(recorded):
    by_command: dict[str, set[str]] = {}
    for call in recorded:
        by_command.setdefault(call.command, set()).add(f"{call.service}.{call.operation}")
    assert {"sagemaker.StartPipelineExecution"} <= by_command["start"]
    assert {"cloudwatch.GetMetricData", "sagemaker.DescribePipelineExecution"} <= by_command["start (follow)"]
    assert {"s3.ListObjectsV2", "s3.GetObject", "cloudwatch.GetMetricData", "sagemaker.DescribeTrainingJob"} <= (
        by_command["status"]
    )
    assert {"logs.DescribeLogStreams", "logs.GetLogEvents"} <= by_command["logs"]
    assert "sagemaker.StopPipelineExecution" in by_command["stop"]
    assert {"cloudwatch.GetMetricData", "s3.PutObject"} <= by_command["calibrate"]
    assert {"iam.SimulatePrincipalPolicy", "ecr.BatchGetImage", "service-quotas.GetServiceQuota"} <= by_command[
        "preflight"
    ]
    assert {"sagemaker.ListModelPackages", "sagemaker.DescribeModelPackage"} <= by_command["registry"]
    assert "sagemaker.UpdateModelPackage" in by_command["registry --approve"]
    table = mapping()
    for call in recorded:
        assert call.operation in table.get(call.service, {}), call.describe()
    # Each entry of the mapping is proved here: made by a command (prices: test_the_operator_may_read_prices).
    made = {(c.service, c.operation) for c in recorded} | {("pricing", "GetProducts")}
    listed = {(service, operation) for service, operations in table.items() for operation in operations}
    assert listed <= made, f"cli_calls.yaml entries that no command made here: {sorted(listed - made)}"


def test_an_operator_with_only_the_grant_can_make_every_call(operated, recorded, tags):
    world, operator, _stacks = operated
    identity = managed_policies(world, operator)
    assert identity, "the operator role has no managed policy"
    requests = list({r.describe(): r for r in requests_for(world, operator, recorded, tags)}.values())
    assert any(r.action == "kms:Decrypt" for r in requests)  # status reads SSE-KMS manifests
    assert any(r.action == "kms:GenerateDataKey" for r in requests)  # calibrate writes an SSE-KMS overlay
    described = [r for r in requests if r.action == "sagemaker:DescribeTrainingJob"]
    assert described and all("aws:ResourceTag/tiered-training:recipe" in r.context for r in described)
    results = simulate_with(world, requests, identity)
    refused = [
        f"{r.describe()}: {res['result']} {res['errors'] or ''}"
        for r, res in zip(requests, results)
        if res["result"] != "Allowed"
    ]
    assert not refused, "\n".join(refused)


def test_grant_start_execution_alone_cannot_run_the_commands(operated, recorded, tags):
    """The grant before grant_operate (its sagemaker statements only) refuses the metrics, logs and store reads."""
    world, operator, _stacks = operated
    identity = managed_policies(world, operator)
    pipeline_only = [
        {
            "name": p["name"],
            "policy": {
                **p["policy"],
                "Statement": [
                    s
                    for s in p["policy"]["Statement"]
                    if all(
                        str(a).startswith("sagemaker:") and "Pipeline" in str(a)
                        for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
                    )
                ],
            },
        }
        for p in identity
    ]
    requests = list({r.describe(): r for r in requests_for(world, operator, recorded, tags)}.values())
    results = simulate_with(world, requests, pipeline_only)
    refused = {r.action for r, res in zip(requests, results) if res["result"] != "Allowed"}
    assert {
        "cloudwatch:GetMetricData",
        "logs:DescribeLogStreams",
        "logs:GetLogEvents",
        "s3:ListBucket",
        "s3:GetObject",
        "kms:Decrypt",
    } <= refused


def recipe_policies(world: World, stack_name: str, role_arn: str) -> list[dict]:
    """The managed policies of one recipe's stack attached to the role: an operator of that recipe only."""
    out = []
    for logical, resource in world.templates[stack_name]["Resources"].items():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::IAM::ManagedPolicy" and role_arn in [
            world.role_arn(stack_name, r) for r in props.get("Roles", [])
        ]:
            out.append({"name": logical, "policy": world.resolve(stack_name, props["PolicyDocument"])})
    return out


# What an operator of one recipe can still read of another's: the training jobs' log streams (CloudWatch Logs tags
# log groups, not streams; SageMaker's group is shared). README, "IAM": the reads that remain.
REMAINING = {"logs:GetLogEvents", "logs:DescribeLogStreams", "cloudwatch:GetMetricData", "cloudwatch:ListMetrics"}


def test_an_operator_of_one_recipe_reads_its_jobs_and_overlay_and_not_anothers(operated, by_recipe):
    """Recipe A's operator: every call of A's commands allowed; of B's, the job's measurements, the overlay (read
    and write) and the runs are denied; only the reads in REMAINING are allowed."""
    world, operator, stacks = operated
    calls, tags = by_recipe
    mine, other = RECIPES[0], RECIPES[1]
    identity = recipe_policies(world, stacks[mine].stack_name, operator)
    assert identity, f"{mine}: no operator policy"
    own = list({r.describe(): r for r in requests_for(world, operator, calls[mine], tags)}.values())
    theirs = [
        r
        for r in {r.describe(): r for r in requests_for(world, operator, calls[other], tags)}.values()
        if r.action.startswith(("sagemaker:DescribeTrainingJob", "logs:", "s3:", "cloudwatch:"))
    ]
    put = next(r for r in theirs if r.action == "s3:PutObject")  # calibrate writes B's overlay
    theirs.append(Request("read B's overlay", operator, "s3:GetObject", put.resource, put.context))
    results = simulate_with(world, own + theirs, identity)
    refused = [f"{r.describe()}: {res['result']}" for r, res in zip(own, results) if res["result"] != "Allowed"]
    assert not refused, "\n".join(refused)
    outcome = {r.describe(): (r, res["result"]) for r, res in zip(theirs, results[len(own) :])}
    allowed = sorted(d for d, (r, result) in outcome.items() if result == "Allowed" and r.action not in REMAINING)
    assert not allowed, "\n".join(allowed)
    denied = {r.action for r, result in outcome.values() if result != "Allowed"}
    assert {"sagemaker:DescribeTrainingJob", "s3:GetObject", "s3:PutObject", "s3:ListBucket"} <= denied
    overlay = [r for r, _ in outcome.values() if r.resource.endswith(f"calibration/{other}/overlay.json")]
    assert {r.action for r in overlay} == {"s3:GetObject", "s3:PutObject"}
    assert all(outcome[r.describe()][1] == "ImplicitlyDenied" for r in overlay)
    # the remaining reads, as the README states them
    assert {r.action for r, result in outcome.values() if result == "Allowed"} <= REMAINING


def test_the_store_key_is_used_through_s3_only_and_for_the_operators_objects(operated, recorded):
    """Each KMS statement of the operator grant says kms:ViaService: a direct call with the overlay's encryption
    context is denied; the same through S3 is allowed; through S3 for another bucket, denied."""
    world, operator, _stacks = operated
    put = next(c for c in recorded if c.operation == "PutObject")
    bucket, key_name = put.params["Bucket"], put.params["Key"]
    found = bucket_key(world, bucket)
    assert found is not None, "the store encrypts with a KMS key"
    key = found[0]
    base = {"kms:CallerAccount": ACCOUNT, "kms:EncryptionContext:aws:s3:arn": f"arn:aws:s3:::{bucket}/{key_name}"}
    via_s3 = {**base, "kms:ViaService": f"s3.{REGION}.amazonaws.com"}
    requests = [
        *(
            Request(f"direct {a}", operator, a, key, base)
            for a in ("kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey")
        ),
        Request(
            "direct, naming another service",
            operator,
            "kms:Decrypt",
            key,
            {**base, "kms:ViaService": f"sagemaker.{REGION}.amazonaws.com"},
        ),
        Request(
            "through S3, another bucket",
            operator,
            "kms:Decrypt",
            key,
            {**via_s3, "kms:EncryptionContext:aws:s3:arn": "arn:aws:s3:::someone-elses-bucket"},
        ),
        Request("through S3, the overlay", operator, "kms:GenerateDataKey", key, via_s3),
    ]
    results = [res["result"] for res in simulate_with(world, requests, managed_policies(world, operator))]
    assert results == ["ImplicitlyDenied"] * 5 + ["Allowed"], list(zip([r.what for r in requests], results))


def test_the_prepare_role_uses_the_store_key_for_its_prefixes_only(operated, recorded):
    """The Prepare role's store-key grant: through S3 for the recipe's prepared data and its output only (the
    aws:s3:arn encryption context), through SageMaker for kms:Encrypt only; denied elsewhere and directly."""
    from access_world import simulate

    world, _operator, stacks = operated
    (recipe,) = [name for name in RECIPES if name.endswith("tools-sft")]
    stack = stacks[recipe].stack_name
    (role,) = [
        world.attribute(stack, logical, "Arn")
        for logical, r in world.templates[stack]["Resources"].items()
        if r["Type"] == "AWS::IAM::Role" and "PrepareRole" in logical
    ]
    bucket = next(c.params["Bucket"] for c in recorded if c.operation == "PutObject")  # the store
    key = bucket_key(world, bucket)[0]  # type: ignore[index]

    def use(what: str, action: str, arn: str | None, service: str | None = "s3") -> Request:
        context = {"kms:CallerAccount": ACCOUNT}
        if service:
            context["kms:ViaService"] = f"{service}.{REGION}.amazonaws.com"
        if arn:
            context["kms:EncryptionContext:aws:s3:arn"] = arn
        return Request(what, role, action, key, context)

    objects = f"arn:aws:s3:::{bucket}/{recipe}"
    allowed = [
        use("a prepared shard", "kms:GenerateDataKey", f"{objects}/output/prepared/k1/train/shard-00000.bin"),
        use("a prepared manifest", "kms:Decrypt", f"{objects}/output/prepared/k1/manifest.json"),
        use("the property file", "kms:GenerateDataKey", f"{objects}/output/prepare/e1/prepared.json"),
        use("the store, with S3 Bucket Keys", "kms:GenerateDataKey", f"arn:aws:s3:::{bucket}"),
        use("SageMaker encrypts the job's output", "kms:Encrypt", None, "sagemaker"),
    ]
    denied = [
        use("a checkpoint of the recipe", "kms:Decrypt", f"{objects}/checkpoints/runs/r1/step-4/COMMITTED"),
        use("another recipe's prepared data", "kms:GenerateDataKey", f"arn:aws:s3:::{bucket}/other/output/prepared/k"),
        use("an overlay", "kms:GenerateDataKey", f"arn:aws:s3:::{bucket}/calibration/{recipe}/overlay.json"),
        use("another bucket", "kms:Decrypt", "arn:aws:s3:::someone-elses-bucket"),
        use("directly", "kms:Decrypt", f"{objects}/output/prepared/k1/manifest.json", None),
        use("SageMaker decrypts", "kms:Decrypt", None, "sagemaker"),
    ]
    results = [res["result"] for res in simulate(world, allowed + denied)]
    named = list(zip([r.what for r in allowed + denied], results))
    assert results == ["Allowed"] * len(allowed) + ["ImplicitlyDenied"] * len(denied), named


def test_calls_outside_the_commands_are_denied(operated, recorded):
    world, operator, stacks = operated
    identity = managed_policies(world, operator)
    store = next(c for c in recorded if c.operation == "GetObject" and c.params["Key"].endswith("/COMMITTED"))
    bucket, key = store.params["Bucket"], store.params["Key"]
    pipeline = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:pipeline/{RECIPES[0]}"
    denied = [
        Request("delete the pipeline", operator, "sagemaker:DeletePipeline", pipeline, {}),
        Request("update the pipeline", operator, "sagemaker:UpdatePipeline", pipeline, {}),
        Request(
            "delete a manifest",
            operator,
            "s3:DeleteObject",
            f"arn:aws:s3:::{bucket}/{key}",
            {"aws:SecureTransport": "true"},
        ),
        Request(
            "read a checkpoint's shards",
            operator,
            "s3:GetObject",
            f"arn:aws:s3:::{bucket}/{key.removesuffix('COMMITTED')}__0_0.distcp",
            {"aws:SecureTransport": "true"},
        ),
        Request(
            "write into a run",
            operator,
            "s3:PutObject",
            f"arn:aws:s3:::{bucket}/{key}",
            {"aws:SecureTransport": "true"},
        ),
        Request(
            "list another recipe's runs",
            operator,
            "s3:ListBucket",
            f"arn:aws:s3:::{bucket}",
            {"s3:prefix": "other-recipe/checkpoints/runs/", "aws:SecureTransport": "true"},
        ),
        Request(
            "start a training job",
            operator,
            "sagemaker:CreateTrainingJob",
            f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/pipelines-x-train",
            {},
        ),
        Request(
            "approve another recipe's model",
            operator,
            "sagemaker:UpdateModelPackage",
            f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package/other-recipe/1",
            {"sagemaker:ModelApprovalStatus": "Approved"},
        ),
        Request(
            "describe another recipe's model",
            operator,
            "sagemaker:DescribeModelPackage",
            f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package/other-recipe/1",
            {},
        ),
        Request(
            "register a model by hand",
            operator,
            "sagemaker:CreateModelPackage",
            f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package/{RECIPES[0]}/2",
            {"sagemaker:ModelApprovalStatus": "Approved"},
        ),
        Request(
            "delete the log group",
            operator,
            "logs:DeleteLogGroup",
            f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/TrainingJobs",
            {},
        ),
        Request(
            "pass the execution role",
            operator,
            "iam:PassRole",
            next(c.params["PolicySourceArn"] for c in recorded if c.operation == "SimulatePrincipalPolicy"),
            {"iam:PassedToService": "sagemaker.amazonaws.com"},
        ),
    ]
    results = simulate_with(world, denied, identity)
    allowed = [r.describe() for r, res in zip(denied, results) if res["result"] != "ImplicitlyDenied"]
    assert not allowed, "\n".join(allowed)


def test_the_operator_may_read_prices(operated):
    """``prices`` calls pricing:GetProducts, which has no resource type."""
    world, operator, _stacks = operated
    call = Call("prices", "pricing", "GetProducts", {"ServiceCode": "AmazonSageMaker"}, REGION)
    requests = requests_for(world, operator, [call])
    assert [r["result"] for r in simulate_with(world, requests, managed_policies(world, operator))] == ["Allowed"]


def test_grant_operate_fills_a_managed_policy_and_prices_and_logs_are_optional(plans, tmp_path_factory):
    from aws_cdk import App, Stack
    from aws_cdk import aws_iam as iam

    from tiered_training.constructs import TrainingImage, TrainingPipeline

    stack = Stack(App(outdir=str(tmp_path_factory.mktemp("policy"))), "Operated")
    image = TrainingImage(stack, "Image", image_uri=f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/trainer:1")
    policies = {}
    for prices in (True, False):
        policy = iam.ManagedPolicy(stack, f"Operators{prices}")
        pipeline = TrainingPipeline(
            stack, f"Pipeline{prices}", plan=plans["llama3-1b-bf16"], image=image, pipeline_name=f"p-{prices}".lower()
        )
        assert pipeline.grant_operate(policy, prices=prices).success
        policies[prices] = stack.resolve(policy.document.to_json())
    no_logs = iam.ManagedPolicy(stack, "OperatorsNoLogs")
    TrainingPipeline(
        stack, "PipelineNoLogs", plan=plans["llama3-1b-bf16"], image=image, pipeline_name="p-no-logs"
    ).grant_operate(no_logs, logs=False)
    without = {
        a
        for s in stack.resolve(no_logs.document.to_json())["Statement"]
        for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
    }
    actions = {
        prices: {a for s in doc["Statement"] for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}
        for prices, doc in policies.items()
    }
    assert "pricing:GetProducts" in actions[True] and "pricing:GetProducts" not in actions[False]
    assert actions[True] - actions[False] == {"pricing:GetProducts"}
    assert {"cloudwatch:GetMetricData", "logs:GetLogEvents", "sagemaker:StopPipelineExecution"} <= actions[False]
    assert actions[True] - without == {"logs:DescribeLogStreams", "logs:GetLogEvents"}


def test_the_example_platform_repos_operators_policy_allows_every_call(endpoint, tmp_path_factory):
    """examples/platform-repo: a role with only its managed policy Operators can make every call of the
    commands on the example's recipe, and cannot delete the pipeline."""
    import importlib.util
    from pathlib import Path

    from aws_cdk import App

    from tiered_training.constructs import load_plans

    example = Path(__file__).resolve().parents[2] / "examples" / "platform-repo"
    spec = importlib.util.spec_from_file_location("platform_repo_operators", example / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = App(
        outdir=str(tmp_path_factory.mktemp("example")),
        context=json.loads((example / "cdk.json").read_text())["context"],
    )
    (plan,) = load_plans(example / "recipes")
    stack = module.TrainingStack(app, "MlTraining", plans=[plan])
    world = World(ACCOUNT, REGION)
    world.add(stack.stack_name, app.synth().get_stack_by_name(stack.stack_name).template)
    resources = world.templates[stack.stack_name]["Resources"]
    (logical,) = [
        k for k, r in resources.items() if r["Type"] == "AWS::IAM::ManagedPolicy" and k.startswith("Operators")
    ]
    identity = [
        {"name": logical, "policy": world.resolve(stack.stack_name, resources[logical]["Properties"]["PolicyDocument"])}
    ]
    operator = f"arn:aws:iam::{ACCOUNT}:role/team-operator"
    calls = run_commands(world, stack.stack_name, plan, endpoint)
    requests = list({r.describe(): r for r in requests_for(world, operator, calls, job_tags(endpoint, calls))}.values())
    pipeline = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:pipeline/{plan.name}"
    requests.append(Request("delete the pipeline", operator, "sagemaker:DeletePipeline", pipeline, {}))
    results = [res["result"] for res in simulate_with(world, requests, identity)]
    refused = [r.describe() for r, res in zip(requests[:-1], results[:-1]) if res != "Allowed"]
    assert not refused, "\n".join(refused)
    assert results[-1] == "ImplicitlyDenied"
