"""``tiered-training preflight RECIPE``: check the real account before anything is paid for.

Each check passes, fails with a fix, or is skipped where it does not apply:

- ``pipeline``: the recipe's pipeline is deployed (SageMaker DescribePipeline). Its definition
  gives the image and the execution role the other checks use.
- ``quota``: every quota the plan needs (``tiered_training.planning.quotas.needs``) against the value
  applied in the account (Service Quotas GetServiceQuota by code; ListServiceQuotas by title
  where no code is published; the AWS default where none is applied).
- ``image``: the deployed image exists in ECR (BatchGetImage); before a deploy, the region's
  base image (``catalog/base_images.yaml``) exists and this identity may pull it.
- ``data``: ``data.uri`` holds objects (S3 ListObjectsV2), and the execution role may list and
  read them (IAM SimulatePrincipalPolicy).
- ``mlflow``: ``tracking.mlflow_tracking_server_arn`` exists and runs.
- ``training-plan``: ``compute.training_plan_arn`` exists, is active or scheduled, serves
  training jobs on the recipe's instance type and holds ``compute.instance_count`` instances.

An AWS error inside a check fails that check (its code and message, and what to allow); no
credentials or no region stops the command (:class:`session.StartError`, exit 1). boto3 is
imported only here, when the command runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tiered_training.planning import quotas as quota_needs
from tiered_training.text import clip

if TYPE_CHECKING:
    from tiered_training.catalog import Quota
    from tiered_training.planning.plan import Plan

PASS, FAIL, SKIP = "pass", "fail", "skip"
ECR_URI = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?/(?P<repo>[^:@]+)(:(?P<tag>[^@]+))?(@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
MLFLOW_RUNNING = {"Created", "Updated", "Started", "MaintenanceComplete"}
TRAINING_PLAN_USABLE = {"Active", "Scheduled"}
SERVICES = ("sagemaker", "service-quotas", "ecr", "s3", "iam")


@dataclass(frozen=True)
class Check:
    check: str  # pipeline | quota | image | data | mlflow | training-plan
    subject: str
    status: str  # pass | fail | skip
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def line(self) -> str:
        fix = f". Fix: {self.fix}" if self.fix else ""
        return f"{self.status.upper():4}  {self.check}: {self.subject}: {self.detail}{fix}"


@dataclass
class Report:
    recipe: str
    region: str | None
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "region": self.region, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


@dataclass
class Deployed:
    """What the deployed pipeline's definition says: the training image and the execution role."""

    image_uri: str | None = None
    role_arn: str | None = None


# -- the checks ----------------------------------------------------------------------------


def run(
    plan: Plan,
    clients: dict[str, Any],
    *,
    region: str | None,
    image_uri: str | None = None,
    role_arn: str | None = None,
    client_for: Callable[[str, str], Any] | None = None,
    stage: str | None = None,
) -> Report:
    """Every check, in order. ``clients`` maps each of :data:`SERVICES` to a boto3 client;
    ``client_for(service, region)`` makes one for another region (an image in another region's ECR);
    ``stage``: the stage the app was deployed with (its pipeline is ``<stage>-<recipe>``)."""
    recipe = plan.recipe
    checks: list[Check] = []
    deployed = Deployed()
    checks.append(
        _guard("pipeline", recipe.name, lambda: check_pipeline(clients["sagemaker"], plan, deployed, region, stage))
    )
    checks.extend(check_quotas(clients["service-quotas"], plan))
    image = image_uri or deployed.image_uri
    checks.append(
        _guard(
            "image", image or f"base image in {region}", lambda: check_image(clients["ecr"], image, region, client_for)
        )
    )
    checks.extend(check_data(clients["s3"], clients["iam"], plan, role_arn or deployed.role_arn))
    if recipe.task == "sft":
        checks.append(_guard("data", recipe.data.uri, lambda: check_packed_data(clients["s3"], plan)))
    checks.append(
        _guard(
            "mlflow",
            recipe.tracking.mlflow_tracking_server_arn or "-",
            lambda: check_mlflow(clients["sagemaker"], plan),
        )
    )
    checks.append(
        _guard(
            "training-plan",
            recipe.compute.training_plan_arn or "-",
            lambda: check_training_plan(clients["sagemaker"], plan),
        )
    )
    return Report(recipe=recipe.name, region=region, checks=checks)


def check_pipeline(
    sm: Any, plan: Plan, deployed: Deployed, region: str | None = None, stage: str | None = None
) -> Check:
    from tiered_training.recipe.names import pipeline_name, stack_name

    name = pipeline_name(plan.recipe.name, stage)
    try:
        described = sm.describe_pipeline(PipelineName=name)
    except _client_error() as error:
        if _code(error) in ("ResourceNotFound", "ValidationException") or "does not exist" in _message(error):
            return Check(
                "pipeline",
                name,
                FAIL,
                "not deployed in this account and region",
                f"deploy it: cdk deploy {stack_name(plan.recipe.name, stage)} -c region={region or '<region>'}"
                + (f" -c stage={stage}" if stage else "")
                + " (README, Deploy)",
            )
        raise
    status = described.get("PipelineStatus", "unknown")
    _read_definition(described.get("PipelineDefinition") or "{}", deployed)
    if status != "Active":
        return Check(
            "pipeline", name, FAIL, f"status {status}", f"redeploy: cdk deploy {stack_name(plan.recipe.name, stage)}"
        )
    return Check("pipeline", name, PASS, "deployed (Active)")


def _read_definition(text: str, deployed: Deployed) -> None:
    import json

    try:
        steps = json.loads(text).get("Steps", [])
    except (ValueError, AttributeError):
        return
    for step in _walk_steps(steps):
        if step.get("Type") == "Training":
            args = step.get("Arguments", {})
            image = args.get("AlgorithmSpecification", {}).get("TrainingImage")
            deployed.image_uri = deployed.image_uri or (image if isinstance(image, str) else None)
            role = args.get("RoleArn")
            deployed.role_arn = deployed.role_arn or (role if isinstance(role, str) else None)


def _walk_steps(steps: list) -> Iterator[dict]:
    for step in steps if isinstance(steps, list) else []:
        if isinstance(step, dict):
            yield step
            for branch in ("IfSteps", "ElseSteps"):
                yield from _walk_steps(step.get("Arguments", {}).get(branch, []))


class _Quotas:
    """The account's quota values: by code, or by title from one listing."""

    def __init__(self, client: Any):
        self.client = client
        self._listed: dict[str, dict[str, dict]] = {}

    def value(self, quota: Quota) -> tuple[float, str]:
        """(value, where it came from). Raises LookupError when the account has no such quota."""
        if quota.code:
            try:
                found = self.client.get_service_quota(ServiceCode=quota.service, QuotaCode=quota.code)["Quota"]
                source = "applied"
            except _client_error() as error:
                if _code(error) != "NoSuchResourceException":
                    raise
                found = self.client.get_aws_default_service_quota(ServiceCode=quota.service, QuotaCode=quota.code)[
                    "Quota"
                ]
                source = "AWS default"
            name = found.get("QuotaName")
            if name and name != quota.title:
                raise LookupError(
                    f"code {quota.code} names '{name}', not '{quota.title}' "
                    "(tiered_training/catalog/quotas.yaml is wrong)"
                )
            return float(found["Value"]), source
        for operation, source in (
            ("list_service_quotas", "applied"),
            ("list_aws_default_service_quotas", "AWS default"),
        ):
            found = self._listing(operation, quota.service).get(quota.title)
            if found is not None:
                return float(found["Value"]), f"{source} (the account's code: {found.get('QuotaCode', '?')})"
        raise LookupError(
            f"no quota named '{quota.title}' in this region (is {quota.instance_type or 'it'} offered here?)"
        )

    def _listing(self, operation: str, service: str) -> dict[str, dict]:
        key = f"{operation}:{service}"
        if key not in self._listed:
            pages = self.client.get_paginator(operation).paginate(ServiceCode=service)
            self._listed[key] = {q["QuotaName"]: q for page in pages for q in page.get("Quotas", [])}
        return self._listed[key]


def check_quotas(client: Any, plan: Plan) -> list[Check]:
    account = _Quotas(client)
    out = []
    for need in quota_needs.needs(plan.recipe):
        quota = need.quota
        subject = quota_needs.label(quota)
        try:
            value, source = account.value(quota)
        except LookupError as error:
            out.append(
                Check(
                    "quota",
                    subject,
                    FAIL,
                    str(error),
                    "check the region, or the quota's title and code in the Service Quotas console",
                )
            )
            continue
        except _client_error() as error:
            out.append(
                _aws_failure(
                    "quota",
                    subject,
                    error,
                    "servicequotas:GetServiceQuota, servicequotas:GetAWSDefaultServiceQuota and "
                    "servicequotas:ListServiceQuotas",
                )
            )
            continue
        kind, _, code = source.partition(" (")
        detail = (
            f"{kind} {quota_needs.amount(quota, value)}; needs {quota_needs.amount(quota, need.needed)} for {need.why}"
        )
        detail += f" ({code}" if code else ""
        if value >= need.needed:
            out.append(Check("quota", subject, PASS, detail))
            continue
        found = re.search(r"L-[0-9A-F]{8}", code)
        known = quota.model_copy(update={"code": found.group(0)}) if found and not quota.code else quota
        out.append(Check("quota", subject, FAIL, detail, quota_needs.raise_fix(known, need.needed)))
    return out


def check_image(
    ecr: Any, image_uri: str | None, region: str | None, client_for: Callable[[str, str], Any] | None = None
) -> Check:
    """The deployed image in ECR; before a deploy, the region's base image and the right to pull it."""
    from tiered_training.catalog.images import base_image_uri

    if image_uri:
        subject, before_deploy = image_uri, False
    else:
        try:
            subject, before_deploy = base_image_uri(region or ""), True
        except ValueError as error:
            return Check(
                "image",
                f"base image in {region}",
                FAIL,
                str(error).split(";")[0],
                "deploy to a region in tiered_training/catalog/base_images.yaml, or pass -c image_uri=<your image>",
            )
    match = ECR_URI.match(subject)
    if not match:
        return Check("image", subject, SKIP, "not an ECR image URI; the preflight checks ECR images only")
    image_id = {"imageDigest": match["digest"]} if match["digest"] else {"imageTag": match["tag"] or "latest"}
    client = ecr if match["region"] == region or client_for is None else client_for("ecr", match["region"])
    login = image_login_command(match["region"], match["account"])
    try:
        got = client.batch_get_image(registryId=match["account"], repositoryName=match["repo"], imageIds=[image_id])
    except _client_error() as error:
        if _code(error) == "RepositoryNotFoundException":
            return Check(
                "image",
                subject,
                FAIL,
                f"no repository {match['repo']} in registry {match['account']}",
                "deploy the platform stack, which builds and pushes the image"
                if not before_deploy
                else "regenerate tiered_training/catalog/base_images.yaml (scripts/regenerate_base_images.py)",
            )
        return _aws_failure(
            "image",
            subject,
            error,
            f"ecr:BatchGetImage on arn:aws:ecr:{match['region']}:{match['account']}:repository/{match['repo']}",
        )
    if got.get("images"):
        where = f"pullable; before cdk deploy log Docker in: {login}" if before_deploy else "in ECR"
        return Check("image", subject, PASS, where)
    reason = (got.get("failures") or [{}])[0]
    detail = f"{reason.get('failureCode', 'ImageNotFound')}: {reason.get('failureReason', 'not found')}"
    fix = (
        (
            "no such base tag in this region: deploy to another region, or regenerate "
            "tiered_training/catalog/base_images.yaml (scripts/regenerate_base_images.py)"
        )
        if before_deploy
        else "cdk deploy builds and pushes it (README, Deploy), or push it yourself and pass -c image_uri=..."
    )
    return Check("image", subject, FAIL, detail, fix)


def image_login_command(region: str, account: str) -> str:
    return (
        f"aws ecr get-login-password --region {region} | docker login --username AWS "
        f"--password-stdin {account}.dkr.ecr.{region}.amazonaws.com"
    )


def check_data(s3: Any, iam: Any, plan: Plan, role_arn: str | None) -> list[Check]:
    uri = plan.recipe.data.uri
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    try:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except _client_error() as error:
        if _code(error) == "NoSuchBucket":
            return [
                Check(
                    "data", uri, FAIL, f"no bucket {bucket}", "fix data.uri, or create the bucket and upload the shards"
                )
            ]
        return [_aws_failure("data", uri, error, f"s3:ListBucket on arn:aws:s3:::{bucket} (for this identity)")]
    objects = listed.get("Contents") or []
    if not objects:
        return [
            Check(
                "data",
                uri,
                FAIL,
                "no objects under this prefix",
                "upload the token shards (training/README.md), or fix data.uri",
            )
        ]
    out = [Check("data", uri, PASS, f"holds objects (first: s3://{bucket}/{objects[0]['Key']})")]
    if not role_arn:
        out.append(
            Check(
                "data",
                f"{uri} by the execution role",
                SKIP,
                "the role is known once the stack is deployed (or pass --role-arn)",
            )
        )
        return out
    partition = role_arn.split(":")[1] if role_arn.count(":") >= 5 else "aws"
    resources = {
        "s3:ListBucket": f"arn:{partition}:s3:::{bucket}",
        "s3:GetObject": f"arn:{partition}:s3:::{bucket}/{objects[0]['Key']}",
    }
    denied = []
    try:
        for action, resource in resources.items():
            result = iam.simulate_principal_policy(
                PolicySourceArn=role_arn, ActionNames=[action], ResourceArns=[resource]
            )
            decision = result["EvaluationResults"][0]["EvalDecision"]
            if decision != "allowed":
                denied.append(f"{action} on {resource}: {decision}")
    except _client_error() as error:
        out.append(
            _aws_failure("data", f"{uri} by {role_arn}", error, "iam:SimulatePrincipalPolicy on the execution role")
        )
        return out
    if denied:
        out.append(
            Check(
                "data",
                f"{uri} by {role_arn}",
                FAIL,
                "; ".join(denied),
                "list the prefix in data.allowed_uris and redeploy; a bucket in another account must also allow "
                "the role in its bucket policy",
            )
        )
    else:
        out.append(
            Check(
                "data",
                f"{uri} by {role_arn}",
                PASS,
                "its policies allow s3:ListBucket and s3:GetObject "
                "(IAM policy simulator; a bucket policy may still deny)",
            )
        )
    return out


PACKED_MANIFEST = "shards.json"  # training/sft_data.py writes it beside the packed shards
MAX_MANIFEST_BYTES = 1 << 22


def check_packed_data(s3: Any, plan: Plan) -> Check:
    """Task sft: the data prefix holds packed example shards made for this recipe (their manifest)."""
    recipe = plan.recipe
    uri = recipe.data.uri
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    key = (prefix.rstrip("/") + "/" if prefix.strip("/") else "") + PACKED_MANIFEST
    where = f"s3://{bucket}/{key}"
    prepare = (
        "pack the JSONL examples with `python -m training.sft_data --tokenizer DIR --sequence-length "
        f"{recipe.sequence_length} --out OUT FILE.jsonl` and upload OUT/train to data.uri"
    )
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read(MAX_MANIFEST_BYTES)
    except _client_error() as error:
        if _code(error) in ("NoSuchKey", "NoSuchBucket", "404"):
            return Check("data", uri, FAIL, f"no {where}: task sft trains on packed example shards", prepare)
        raise
    try:
        manifest = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Check("data", uri, FAIL, f"{where} is not JSON", prepare)
    if not isinstance(manifest, dict) or manifest.get("kind") != "sft-packed":
        return Check(
            "data",
            uri,
            FAIL,
            f"{where} does not describe packed SFT shards "
            f"(kind {manifest.get('kind') if isinstance(manifest, dict) else None!r})",
            prepare,
        )
    expected = {
        "sequence_length": recipe.sequence_length,
        "token_dtype": recipe.data.token_dtype,
        "loss_on": recipe.data.loss_on,
        "overlong": recipe.data.overlong,
    }
    wrong = [
        f"{key} {manifest.get(key)!r}, the recipe {value!r}"
        for key, value in expected.items()
        if value is not None and manifest.get(key) != value
    ]
    if wrong:
        return Check(
            "data",
            uri,
            FAIL,
            f"{where} was packed otherwise: {'; '.join(wrong)}",
            "pack the data again with the recipe's settings, or set the recipe to the data's",
        )
    shards = manifest.get("shards") or []
    sequences = sum(s.get("sequences", 0) for s in shards if isinstance(s, dict))
    return Check(
        "data",
        uri,
        PASS,
        (
            f"packed SFT shards: {manifest.get('examples', 0):,} examples in {sequences:,} sequences "
            f"of {recipe.sequence_length:,} tokens, "
            f"loss on {manifest.get('loss_on')}, overlong {manifest.get('overlong')} "
            f"({manifest.get('dropped', 0):,} dropped, "
            f"{manifest.get('truncated', 0):,} truncated)"
        ),
    )


def check_mlflow(sm: Any, plan: Plan) -> Check:
    arn = plan.recipe.tracking.mlflow_tracking_server_arn
    if not arn:
        return Check("mlflow", "-", SKIP, "the recipe sets no tracking.mlflow_tracking_server_arn")
    name = arn.rsplit("/", 1)[-1]
    try:
        server = sm.describe_mlflow_tracking_server(TrackingServerName=name)
    except _client_error() as error:
        if _code(error) in ("ResourceNotFound", "ValidationException"):
            return Check(
                "mlflow",
                arn,
                FAIL,
                "no such tracking server in this account and region",
                f"create it (aws sagemaker create-mlflow-tracking-server --tracking-server-name {name} ...), "
                "or remove tracking.mlflow_tracking_server_arn",
            )
        raise
    status = server.get("TrackingServerStatus", "unknown")
    if status in MLFLOW_RUNNING:
        return Check("mlflow", arn, PASS, f"status {status}")
    return Check(
        "mlflow",
        arn,
        FAIL,
        f"status {status}",
        f"start it: aws sagemaker start-mlflow-tracking-server --tracking-server-name {name}",
    )


def check_training_plan(sm: Any, plan: Plan) -> Check:
    compute = plan.recipe.compute
    arn = compute.training_plan_arn
    if not arn:
        return Check("training-plan", "-", SKIP, "the recipe sets no compute.training_plan_arn")
    name = arn.rsplit("/", 1)[-1]
    try:
        described = sm.describe_training_plan(TrainingPlanName=name)
    except _client_error() as error:
        if _code(error) in ("ResourceNotFound", "ValidationException"):
            return Check(
                "training-plan",
                arn,
                FAIL,
                "no such training plan in this account and region",
                "fix compute.training_plan_arn, or create a plan "
                "(aws sagemaker search-training-plan-offerings, create-training-plan)",
            )
        raise
    problems = []
    status = described.get("Status", "unknown")
    if status not in TRAINING_PLAN_USABLE:
        problems.append(f"status {status}")
    targets = described.get("TargetResources") or []
    if "training-job" not in targets:
        problems.append(f"serves {', '.join(targets) or 'nothing'}, not training jobs")
    types = {c.get("InstanceType") for c in described.get("ReservedCapacitySummaries") or [] if c.get("InstanceType")}
    if types and compute.instance_type not in types:
        problems.append(f"reserves {', '.join(sorted(types))}, not {compute.instance_type}")
    total = described.get("TotalInstanceCount", 0)
    if total < compute.instance_count:
        problems.append(f"holds {total} instances; the recipe needs {compute.instance_count}")
    detail = f"status {status}, {total} instances" + (f" of {', '.join(sorted(types))}" if types else "")
    if problems:
        return Check(
            "training-plan",
            arn,
            FAIL,
            "; ".join(problems),
            "use a plan that is active or scheduled, for training jobs, with enough instances of the recipe's type",
        )
    return Check("training-plan", arn, PASS, detail)


# -- AWS errors -----------------------------------------------------------------------------


def _client_error():
    from botocore.exceptions import ClientError

    return ClientError


def _code(error: Exception) -> str:
    return getattr(error, "response", {}).get("Error", {}).get("Code", "")


def _message(error: Exception) -> str:
    return getattr(error, "response", {}).get("Error", {}).get("Message", str(error))


def _aws_failure(check: str, subject: str, error: Exception, allow: str) -> Check:
    code = _code(error) or "Error"
    fix = f"allow {allow}" if "denied" in code.lower() or "unauthorized" in code.lower() else "see the AWS error"
    return Check(check, subject, FAIL, f"AWS refused: {code}: {clip(_message(error), 200)}", fix)


def _guard(check: str, subject: str, body: Callable[[], Check]) -> Check:
    """A check's unexpected AWS error becomes that check's failure, not the command's."""
    try:
        return body()
    except _client_error() as error:
        return _aws_failure(check, subject, error, "the read-only calls this check makes")


# -- the command ----------------------------------------------------------------------------


def preflight(
    plan: Plan,
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    profile: str | None = None,
    image_uri: str | None = None,
    role_arn: str | None = None,
    stage: str | None = None,
) -> Report:
    """Create the clients (errors become :class:`session.StartError`) and run every check."""
    from tiered_training.aws.session import StartError, aws_client, aws_errors, resolve_region

    region = resolve_region(region, plan.recipe.compute.region)
    clients = {s: aws_client(s, region=region, endpoint_url=endpoint_url, profile=profile) for s in SERVICES}
    region = region or clients["sagemaker"].meta.region_name
    if not region:
        raise StartError("no AWS region: pass --region, or set AWS_REGION or AWS_DEFAULT_REGION")
    with aws_errors("run the preflight"):
        return run(
            plan,
            clients,
            region=region,
            image_uri=image_uri,
            role_arn=role_arn,
            stage=stage,
            client_for=lambda service, where: aws_client(
                service, region=where, endpoint_url=endpoint_url, profile=profile
            ),
        )
