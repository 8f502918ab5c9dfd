"""`tiered-training preflight` against moto server on 127.0.0.1 (started and stopped here).

moto 5.2.5 answers what the preflight asks of S3 (ListObjectsV2), ECR (BatchGetImage) and
SageMaker (DescribePipeline) itself. It lacks the rest, and only that is added to moto's
responses in this process, as tests/aws/test_runs.py does, so every call still goes over HTTP to
the one endpoint and through botocore's parsers, and the command runs end to end:

- Service Quotas: moto knows VPC quotas only and has no ListServiceQuotas or
  GetAWSDefaultServiceQuota; the SageMaker quotas here are the test's account (:data:`APPLIED`).
- IAM SimulatePrincipalPolicy (not in moto): the decision is the test's (:data:`DENIED`). The
  decisions of a deployed role's real policies are tests/constructs/test_preflight_policies.py's.
- SageMaker DescribeTrainingPlan and DescribeMlflowTrackingServer (not in moto): the test's
  plans and servers (:data:`TRAINING_PLANS`, :data:`MLFLOW`).

botocore's Stubber was the alternative; it replaces a client's whole HTTP layer, so the
SageMaker client could no longer reach moto's DescribePipeline.
"""

from __future__ import annotations

import json
import zlib

import pytest
from support import json_output, moto_server, offline_aws_env, recipe_dict, write_yaml
from typer.testing import CliRunner

from tiered_training import catalog as catalogs
from tiered_training.catalog.images import base_image_uri
from tiered_training.cli.app import app
from tiered_training.pipeline import definition as d
from tiered_training.planning.planner import plan_file

ACCOUNT = "123456789012"
REGION = "us-east-1"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/exec"
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/tiered-training:v1"
PLAN_ARN = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-plan/reserved-b200"
MLFLOW_ARN = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:mlflow-tracking-server/team-mlflow"
RUNNER = CliRunner()

# The account's applied SageMaker quotas, by title: (code, value). Titles without a published
# code in the catalogue get a code here, as the real account has one.
APPLIED: dict[str, tuple[str, float]] = {}
TRAINING_PLANS: dict[str, dict] = {}
MLFLOW: dict[str, dict] = {}
DENIED: set[tuple[str, str]] = set()  # (action, resource) the role's policies do not allow


def account_code(quota) -> str:
    return quota.code or "L-7E57" + format(zlib.crc32(quota.title.encode()) % 0xFFFF, "04X")


def add_missing_actions(mp) -> None:
    from moto.core.responses import ActionResult
    from moto.iam.responses import IamResponse
    from moto.sagemaker.exceptions import ResourceNotFound
    from moto.sagemaker.responses import SageMakerResponse
    from moto.servicequotas.exceptions import NoSuchResource
    from moto.servicequotas.responses import ServiceQuotasResponse

    def entry(title: str, code: str, value: float) -> dict:
        return {"ServiceCode": "sagemaker", "QuotaName": title, "QuotaCode": code, "Value": value, "Adjustable": True}

    def defaults() -> list[dict]:
        return [entry(q.title, account_code(q), q.default) for q in catalogs.quotas().values()]

    def applied() -> list[dict]:
        return [entry(title, code, value) for title, (code, value) in APPLIED.items()]

    def get_service_quota(self):
        code = json.loads(self.body)["QuotaCode"]
        for quota in applied():
            if quota["QuotaCode"] == code:
                return json.dumps({"Quota": quota})
        raise NoSuchResource

    def get_aws_default_service_quota(self):
        code = json.loads(self.body)["QuotaCode"]
        for quota in defaults():
            if quota["QuotaCode"] == code:
                return json.dumps({"Quota": quota})
        raise NoSuchResource

    def list_service_quotas(self):
        return json.dumps({"Quotas": applied()})

    def list_aws_default_service_quotas(self):
        return json.dumps({"Quotas": defaults()})

    def simulate_principal_policy(self):
        action, resource = self._get_param("ActionNames")[0], self._get_param("ResourceArns")[0]
        decision = "implicitDeny" if (action, resource) in DENIED else "allowed"
        return ActionResult({"EvaluationResults": [{"EvalActionName": action, "EvalResourceName": resource, "EvalDecision": decision}],
                             "IsTruncated": False})

    def describe_training_plan(self):
        name = self._get_param("TrainingPlanName")
        if name not in TRAINING_PLANS:
            raise ResourceNotFound(f"Training plan {name} does not exist")
        return ActionResult(TRAINING_PLANS[name])

    def describe_mlflow_tracking_server(self):
        name = self._get_param("TrackingServerName")
        if name not in MLFLOW:
            raise ResourceNotFound(f"Tracking server {name} does not exist")
        return ActionResult(MLFLOW[name])

    for cls, name, fn in [
        (ServiceQuotasResponse, "get_service_quota", get_service_quota),
        (ServiceQuotasResponse, "get_aws_default_service_quota", get_aws_default_service_quota),
        (ServiceQuotasResponse, "list_service_quotas", list_service_quotas),
        (ServiceQuotasResponse, "list_aws_default_service_quotas", list_aws_default_service_quotas),
        (IamResponse, "simulate_principal_policy", simulate_principal_policy),
        (SageMakerResponse, "describe_training_plan", describe_training_plan),
        (SageMakerResponse, "describe_mlflow_tracking_server", describe_mlflow_tracking_server),
    ]:
        mp.setattr(cls, name, fn, raising=False)


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        offline_aws_env(mp, home, REGION)
        add_missing_actions(mp)
        with moto_server() as url:
            yield url


@pytest.fixture(autouse=True)
def clean_world():
    for world in (APPLIED, TRAINING_PLANS, MLFLOW, DENIED):
        world.clear()


def client(service: str, endpoint: str, region: str = REGION):
    import boto3

    return boto3.client(service, endpoint_url=endpoint, region_name=region)


def preflight(endpoint: str, recipe, *args: str):
    result = RUNNER.invoke(app, ["preflight", str(recipe), "--endpoint-url", endpoint, "--format", "json", *args])
    return result.exit_code, (json_output("preflight", result.stdout) if result.stdout.startswith("{") else result.output)


def by_check(report: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for check in report["checks"]:
        out.setdefault(check["check"], []).append(check)
    return out


def write_recipe(tmp_path, name: str, **overrides):
    data = recipe_dict(name=name, **{"data.uri": f"s3://{name}-data/tokens/", **overrides})
    return write_yaml(tmp_path / f"{name}.yaml", data)


def deploy(endpoint: str, path, region: str = REGION) -> None:
    plan = plan_file(path)
    resources = d.PipelineResources(role_arn=ROLE, image_uri=IMAGE, checkpoint_s3_uri="s3://b/c/", output_s3_uri="s3://b/o/")
    client("sagemaker", endpoint, region).create_pipeline(
        PipelineName=plan.name, PipelineDefinition=d.to_json(d.build_definition(plan, resources)),
        RoleArn=f"arn:aws:iam::{ACCOUNT}:role/pipeline",
    )


def push_image(endpoint: str, repository: str, tag: str, region: str = REGION) -> None:
    ecr = client("ecr", endpoint, region)
    ecr.create_repository(repositoryName=repository)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 1, "digest": "sha256:" + "0" * 64},
                "layers": []}
    ecr.put_image(repositoryName=repository, imageManifest=json.dumps(manifest), imageTag=tag)


def upload_data(endpoint: str, bucket: str, key: str = "tokens/shard-000.bin") -> None:
    s3 = client("s3", endpoint)
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key=key, Body=b"\0" * 64)


def raise_quotas(plan) -> None:
    from tiered_training.planning.quotas import needs

    for need in needs(plan.recipe):
        APPLIED[need.quota.title] = (account_code(need.quota), need.needed)


def test_a_ready_account_passes_every_check(endpoint, tmp_path):
    path = write_recipe(tmp_path, "ready", **{"compute.instance_count": 2, "compute.training_plan_arn": PLAN_ARN,
                                              "tracking.mlflow_tracking_server_arn": MLFLOW_ARN})
    deploy(endpoint, path)
    push_image(endpoint, "tiered-training", "v1")
    upload_data(endpoint, "ready-data")
    raise_quotas(plan_file(path))
    TRAINING_PLANS["reserved-b200"] = {
        "TrainingPlanArn": PLAN_ARN, "TrainingPlanName": "reserved-b200", "Status": "Active", "TotalInstanceCount": 2,
        "TargetResources": ["training-job"],
        "ReservedCapacitySummaries": [{"ReservedCapacityArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:reserved-capacity/rc-1" + "0" * 20,
                                       "InstanceType": "ml.p6-b200.48xlarge", "TotalInstanceCount": 2, "Status": "Active"}],
    }
    MLFLOW["team-mlflow"] = {"TrackingServerArn": MLFLOW_ARN, "TrackingServerName": "team-mlflow", "TrackingServerStatus": "Started"}

    code, report = preflight(endpoint, path)
    assert code == 0, report
    checks = by_check(report)
    assert report["ok"] and {c["status"] for c in report["checks"]} == {"pass"}
    assert set(checks) == {"pipeline", "quota", "image", "data", "store", "mlflow", "training-plan"}
    titles = {c["subject"] for c in checks["quota"]}
    assert "'ml.p6-b200.48xlarge for training job usage' (code not published)" in titles
    # Found by its title (no published code): the detail names the account's code.
    b200 = next(c for c in checks["quota"] if "ml.p6-b200.48xlarge for training job usage" in c["subject"])
    assert "(the account's code: L-7E57" in b200["detail"]
    assert checks["image"][0]["subject"] == IMAGE and checks["data"][1]["subject"].endswith(ROLE)


def test_a_fresh_account_fails_each_check_with_its_fix(endpoint, tmp_path):
    path = write_recipe(tmp_path, "fresh", **{"compute.instance_count": 2, "compute.training_plan_arn": PLAN_ARN,
                                              "tracking.mlflow_tracking_server_arn": MLFLOW_ARN})
    code, report = preflight(endpoint, path)
    assert code == 1 and not report["ok"]
    checks = by_check(report)
    assert checks["pipeline"][0]["status"] == "fail" and "cdk deploy TieredTraining-fresh" in checks["pipeline"][0]["fix"]
    failed = {c["subject"]: c for c in checks["quota"] if c["status"] == "fail"}
    b200 = failed["'ml.p6-b200.48xlarge for training job usage' (code not published)"]
    assert "AWS default 0; needs 2" in b200["detail"] and "request-service-quota-increase" in b200["fix"]
    # Found by its title: the fix names the account's code for it.
    assert f"--quota-code {account_code(catalogs.quotas()['training/ml.p6-b200.48xlarge'])} --desired-value 2" in b200["fix"]
    # The account-wide quotas hold at their defaults (4 instances, 20 per job): they pass.
    assert all(c["status"] == "pass" for c in checks["quota"] if "across all" in c["subject"])
    # Not deployed: the image check looks for the region's base image, which moto does not hold.
    assert checks["image"][0]["subject"] == base_image_uri(REGION) and checks["image"][0]["status"] == "fail"
    assert checks["data"][0]["status"] == "fail" and "no bucket fresh-data" in checks["data"][0]["detail"]
    assert checks["mlflow"][0]["status"] == "fail" and "create-mlflow-tracking-server" in checks["mlflow"][0]["fix"]
    assert checks["training-plan"][0]["status"] == "fail" and "no such training plan" in checks["training-plan"][0]["detail"]


def test_before_a_deploy_the_base_image_and_its_registry_login_are_the_regions(endpoint, tmp_path):
    region = "eu-south-1"  # its DLC registry is not 763104351884
    path = write_recipe(tmp_path, "italy", **{"compute.region": region})
    uri = base_image_uri(region)
    account, repository_tag = uri.split(".dkr.ecr.")[0], uri.split("/", 1)[1]
    push_image(endpoint, *repository_tag.split(":"), region=region)
    code, report = preflight(endpoint, path)
    image = by_check(report)["image"][0]
    assert image["subject"] == uri and image["status"] == "pass"
    assert account == "692866216735" and f"--password-stdin {account}.dkr.ecr.{region}.amazonaws.com" in image["detail"]
    assert report["region"] == region


def test_a_short_training_plan_an_empty_prefix_and_a_denied_role_fail(endpoint, tmp_path):
    path = write_recipe(tmp_path, "short", **{"compute.instance_count": 2, "compute.training_plan_arn": PLAN_ARN})
    deploy(endpoint, path)
    client("s3", endpoint).create_bucket(Bucket="short-data")
    TRAINING_PLANS["reserved-b200"] = {"TrainingPlanArn": PLAN_ARN, "TrainingPlanName": "reserved-b200", "Status": "Expired",
                                       "TotalInstanceCount": 1, "TargetResources": ["hyperpod-cluster"]}
    code, report = preflight(endpoint, path)
    checks = by_check(report)
    plan_check = checks["training-plan"][0]
    assert code == 1 and plan_check["status"] == "fail"
    for problem in ("status Expired", "not training jobs", "holds 1 instances; the recipe needs 2"):
        assert problem in plan_check["detail"]
    assert checks["data"][0]["detail"] == "no objects under this prefix"

    upload_data(endpoint, "short-data")
    DENIED.add(("s3:GetObject", "arn:aws:s3:::short-data/tokens/shard-000.bin"))
    code, report = preflight(endpoint, path)
    role = by_check(report)["data"][1]
    assert role["status"] == "fail" and "s3:GetObject" in role["detail"] and "data.allowed_uris" in role["fix"]


def test_text_output_and_exit_codes(endpoint, tmp_path):
    path = write_recipe(tmp_path, "texty")
    result = RUNNER.invoke(app, ["preflight", str(path), "--endpoint-url", endpoint])
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"preflight texty in {REGION}" and lines[-1].endswith("checks failed")
    assert any(line.startswith("FAIL  pipeline: texty: not deployed") for line in lines)
    bad = write_yaml(tmp_path / "bad.yaml", recipe_dict(**{"compute.instance_count": 0}))
    assert RUNNER.invoke(app, ["preflight", str(bad), "--endpoint-url", endpoint]).exit_code == 2
    assert RUNNER.invoke(app, ["preflight", str(path), "--endpoint-url", "not a url"]).exit_code == 2


def test_a_staged_deploy_is_looked_up_by_its_stages_pipeline(endpoint, tmp_path):
    path = write_recipe(tmp_path, "texty")
    result = RUNNER.invoke(app, ["preflight", str(path), "--stage", "dev", "--endpoint-url", endpoint])
    assert result.exit_code == 1
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("FAIL  pipeline:")]
    assert line.startswith("FAIL  pipeline: dev-texty: not deployed") and "-c stage=dev" in line
    assert RUNNER.invoke(app, ["preflight", str(path), "--stage", "Dev!", "--endpoint-url", endpoint]).exit_code == 2


class _Quotas:
    """A Service Quotas client that answers every GetServiceQuota with one reply (or error)."""

    def __init__(self, reply):
        self.reply = reply

    def get_service_quota(self, **_):
        if isinstance(self.reply, Exception):
            raise self.reply
        return {"Quota": self.reply}

    def get_paginator(self, _operation):
        raise AssertionError("not used for quotas with a code")


def test_a_code_that_names_another_quota_and_a_refusal_fail_only_the_quota_check(tmp_path):
    from botocore.exceptions import ClientError

    from tiered_training.aws.preflight import check_quotas

    plan = plan_file(write_recipe(tmp_path, "p5", **{"compute.instance_type": "ml.p5.48xlarge", "compute.spot": True}))
    wrong = check_quotas(_Quotas({"QuotaName": "ml.g5.xlarge for training job usage", "Value": 8}), plan)
    runtime = next(c for c in wrong if "Longest run time" in c.subject)
    assert runtime.status == "fail" and "names 'ml.g5.xlarge for training job usage'" in runtime.detail
    denied = ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not authorized"}}, "GetServiceQuota")
    refused = check_quotas(_Quotas(denied), plan)
    assert all(c.status == "fail" for c in refused)
    assert "AWS refused: AccessDeniedException" in refused[0].detail and "servicequotas:GetServiceQuota" in refused[0].fix


def test_an_sft_recipe_checks_the_packed_shards_manifest(endpoint, tmp_path):
    """Task sft reads packed example shards: preflight reads their manifest and compares it with the recipe."""
    path = write_recipe(tmp_path, "sft-check", **{"task": "sft", "model.init_checkpoint": "s3://sft-check-models/base/",
                                                  "data.loss_on": "assistant", "data.overlong": "truncate"})
    manifest = {"kind": "sft-packed", "sequence_length": 4096, "token_dtype": "uint32", "fingerprint": "0" * 64,
                "loss_on": "assistant", "overlong": "drop", "examples": 1200, "dropped": 3, "truncated": 0,
                "tokenizer": "base", "shards": [{"file": "shard-00000.bin", "sequences": 310, "max_token": 128000}]}
    s3 = client("s3", endpoint)
    upload_data(endpoint, "sft-check-data")  # a bucket with a shard, but no manifest yet
    code, report = preflight(endpoint, path)
    sft = [c for c in by_check(report)["data"] if "shards.json" in c["detail"] or "packed" in c["detail"]]
    assert code == 1 and sft[0]["status"] == "fail" and "no s3://sft-check-data/tokens/shards.json" in sft[0]["detail"]
    assert "python -m training.sft_data" in sft[0]["fix"] and "--sequence-length 4096" in sft[0]["fix"]

    s3.put_object(Bucket="sft-check-data", Key="tokens/shards.json", Body=json.dumps(manifest).encode())
    _, report = preflight(endpoint, path)
    sft = [c for c in by_check(report)["data"] if "packed" in c["detail"]]
    assert sft[0]["status"] == "fail" and "overlong 'drop', the recipe 'truncate'" in sft[0]["detail"]

    s3.put_object(Bucket="sft-check-data", Key="tokens/shards.json", Body=json.dumps({**manifest, "overlong": "truncate"}).encode())
    _, report = preflight(endpoint, path)
    sft = [c for c in by_check(report)["data"] if "packed" in c["detail"]]
    assert sft[0]["status"] == "pass" and "1,200 examples in 310 sequences" in sft[0]["detail"]


def test_an_sft_recipe_checks_the_format_and_the_bad_examples_the_shards_were_prepared_with(endpoint, tmp_path):
    path = write_recipe(tmp_path, "sft-format", **{"task": "sft", "model.init_checkpoint": "s3://sft-format-models/base/",
                                                   "data.format": "sharegpt", "data.on_bad_example": "skip",
                                                   "data.max_bad_fraction": 0.01})
    manifest = {"kind": "sft-packed", "sequence_length": 4096, "token_dtype": "uint32", "fingerprint": "0" * 64,
                "loss_on": "assistant", "overlong": "error", "format": "auto", "on_bad_example": "error",
                "max_bad_fraction": 0.0, "examples": 10, "dropped": 0, "truncated": 0, "tokenizer": "base",
                "shards": [{"file": "shard-00000.bin", "sequences": 3, "max_token": 100}]}
    upload_data(endpoint, "sft-format-data")
    s3 = client("s3", endpoint)
    s3.put_object(Bucket="sft-format-data", Key="tokens/shards.json", Body=json.dumps(manifest).encode())
    _, report = preflight(endpoint, path)
    sft, = [c for c in by_check(report)["data"] if "packed" in c["detail"]]
    assert sft["status"] == "fail" and sft["detail"].endswith(
        "was packed otherwise: format 'auto', the recipe 'sharegpt'; on_bad_example 'error', the recipe 'skip'; "
        "max_bad_fraction 0.0, the recipe 0.01")
    prepared = {**manifest, "format": "sharegpt", "on_bad_example": "skip", "max_bad_fraction": 0.01}
    s3.put_object(Bucket="sft-format-data", Key="tokens/shards.json", Body=json.dumps(prepared).encode())
    _, report = preflight(endpoint, path)
    sft, = [c for c in by_check(report)["data"] if "packed" in c["detail"]]
    assert sft["status"] == "pass"


def test_a_dpo_recipe_refuses_packed_sft_examples_and_takes_packed_pairs(endpoint, tmp_path):
    """Task dpo reads preference pairs (python -m training.dpo_data, layout pairs): SFT shards are named as wrong."""
    path = write_recipe(tmp_path, "dpo-check", **{"task": "dpo", "model.init_checkpoint": "s3://dpo-check-models/base/"})
    manifest = {"kind": "sft-packed", "sequence_length": 4096, "token_dtype": "uint32", "fingerprint": "0" * 64,
                "loss_on": "assistant", "overlong": "error", "examples": 20, "dropped": 0, "truncated": 0,
                "tokenizer": "base", "shards": [{"file": "shard-00000.bin", "sequences": 5, "max_token": 100}]}
    upload_data(endpoint, "dpo-check-data")
    s3 = client("s3", endpoint)
    s3.put_object(Bucket="dpo-check-data", Key="tokens/shards.json", Body=json.dumps(manifest).encode())
    _, report = preflight(endpoint, path)
    found, = [c for c in by_check(report)["data"] if "packed" in c["detail"]]
    assert found["status"] == "fail" and "layout None, the recipe 'pairs'" in found["detail"]
    pairs = {**manifest, "layout": "pairs", "pairs": 10}
    s3.put_object(Bucket="dpo-check-data", Key="tokens/shards.json", Body=json.dumps(pairs).encode())
    _, report = preflight(endpoint, path)
    found, = [c for c in by_check(report)["data"] if "packed" in c["detail"]]
    assert found["status"] == "pass", found


def test_a_recipe_with_raw_data_checks_its_first_record_in_the_declared_format(endpoint, tmp_path):
    """data.prepare: the data prefix holds raw examples for the Prepare step; preflight lists them and parses the first
    record of the first file in data.format, instead of reading a packed manifest."""
    path = write_recipe(tmp_path, "sft-raw", **{"task": "sft", "model.init_checkpoint": "s3://sft-raw-models/base/",
                                                "data.format": "messages", "data.prepare": {}})
    s3 = client("s3", endpoint)
    s3.create_bucket(Bucket="sft-raw-data")
    s3.put_object(Bucket="sft-raw-data", Key="tokens/readme.txt", Body=b"not examples")
    code, report = preflight(endpoint, path)
    raw, = [c for c in by_check(report)["data"] if "no .jsonl" in c["detail"]]
    assert code == 1 and raw["status"] == "fail" and "no .jsonl, .json or .parquet objects under it (1 other" in raw["detail"]

    s3.put_object(Bucket="sft-raw-data", Key="tokens/a.jsonl", Body=b'{"conversations": [{"from": "human", "value": "hi"}]}\n')
    _, report = preflight(endpoint, path)
    raw, = [c for c in by_check(report)["data"] if "no reader takes" in c["detail"]]
    assert raw["status"] == "fail" and raw["detail"].endswith("1 object(s) that no reader takes: s3://sft-raw-data/tokens/readme.txt")
    assert "data.ignore" in raw["fix"]
    path = write_recipe(tmp_path, "sft-raw", **{"task": "sft", "model.init_checkpoint": "s3://sft-raw-models/base/",
                                                "data.format": "messages", "data.prepare": {}, "data.ignore": ["*.txt"]})
    _, report = preflight(endpoint, path)
    raw, = [c for c in by_check(report)["data"] if "a.jsonl:" in c["detail"] or "raw examples" in c["detail"]]
    assert raw["status"] == "fail" and raw["detail"].endswith(
        "s3://sft-raw-data/tokens/a.jsonl:1: the first record (keys: conversations) is not in data.format messages "
        "(messages: messages)")

    s3.put_object(Bucket="sft-raw-data", Key="tokens/a.jsonl", Body=b'\n{"messages": [{"role": "user", "content": "hi"}]\n')
    _, report = preflight(endpoint, path)
    raw, = [c for c in by_check(report)["data"] if "a.jsonl:" in c["detail"] or "raw examples" in c["detail"]]
    assert raw["status"] == "fail" and "a.jsonl:2: not JSON" in raw["detail"]

    s3.put_object(Bucket="sft-raw-data", Key="tokens/a.jsonl",
                  Body=b'{"messages": [{"role": "user", "content": "hi"}], "tools": []}\n')
    _, report = preflight(endpoint, path)
    raw, = [c for c in by_check(report)["data"] if "a.jsonl:" in c["detail"] or "raw examples" in c["detail"]]
    assert raw["status"] == "pass" and "the first record of s3://sft-raw-data/tokens/a.jsonl is messages" in raw["detail"]
    assert raw["detail"].endswith("; ignoring 1 object(s) as data.ignore says: readme.txt")
    assert not any("shards.json" in c["detail"] for c in by_check(report)["data"])  # no packed manifest is asked for
