"""``tiered-training preflight RECIPE``: check the real account before anything is paid for.

Each check passes, fails with a fix, or is skipped where it does not apply:

- ``pipeline``: the recipe's pipeline is deployed (SageMaker DescribePipeline). Its definition
  gives the image and the execution role the other checks use.
- ``quota``: every quota the plan needs (``tiered_training.planning.quotas.needs``) against the value
  applied in the account (Service Quotas GetServiceQuota by code; ListServiceQuotas by title
  where no code is published; the AWS default where none is applied).
- ``image``: the deployed image exists in ECR (BatchGetImage); before a deploy, the region's
  base image (``catalog/base_images.yaml``) exists and this identity may pull it.
- ``data``: ``data.uri``, ``data.validation_uri`` and ``model.init_checkpoint`` hold objects (S3
  ListObjectsV2), and the execution role may list and read them and decrypt them with
  ``data.kms_key_arn`` (IAM SimulatePrincipalPolicy).
- ``store``: the execution role may write, read, list and prune a run's checkpoints under the
  deployed pipeline's checkpoint prefix, write the jobs' output under each output path, and use
  the store's key for both (IAM SimulatePrincipalPolicy).
- ``mlflow``: ``tracking.mlflow_tracking_server_arn`` exists and runs.
- ``training-plan``: ``compute.training_plan_arn`` exists, is active or scheduled, serves
  training jobs on the recipe's instance type and holds ``compute.instance_count`` instances.

Every simulated request carries the context keys AWS evaluates for it
(:func:`read_accesses`, :func:`checkpoint_accesses`, :func:`output_accesses`): ``s3:prefix``
for ListBucket; for KMS, ``kms:ViaService``, ``kms:CallerAccount`` and the
encryption context S3 sends (``kms:EncryptionContext:aws:s3:arn``: the bucket with an S3 Bucket
Key, as the checkpoint store has; the object otherwise, S3's default). Without them a grant
conditioned on a key is answered implicitDeny.

An AWS error inside a check fails that check (its code and message, and what to allow); no
credentials or no region stops the command (:class:`session.StartError`, exit 1). boto3 is
imported only here, when the command runs.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tiered_training.contract.raw_data import SAVED_MARKER, sort_raw
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
    check: str  # pipeline | quota | image | data | store | mlflow | training-plan
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
    """What the deployed pipeline's definition says: the training image, the execution role, the
    runs' checkpoint prefix (``s3://.../runs/``), the jobs' output paths and their KMS key."""

    image_uri: str | None = None
    role_arn: str | None = None
    runs_uri: str | None = None
    output_paths: list[str] = field(default_factory=list)
    output_key: str | None = None


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
    checks.extend(check_data(clients["s3"], clients["iam"], plan, role_arn or deployed.role_arn, deployed, region))
    if recipe.data.sources:
        from tiered_training.aws.sources import check_sources

        checks.extend(check_sources(clients["s3"], plan))
    elif recipe.fine_tuning and recipe.data.prepare is not None:
        checks.append(_guard("data", recipe.data.uri, lambda: check_raw_data(clients["s3"], plan)))
    elif recipe.fine_tuning:
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
            checkpoint = args.get("CheckpointConfig", {}).get("S3Uri")
            head = checkpoint.get("Std:Join", {}).get("Values", [None])[0] if isinstance(checkpoint, dict) else None
            if isinstance(head, str) and head.startswith("s3://"):
                deployed.runs_uri = deployed.runs_uri or head
            output = args.get("OutputDataConfig", {})
            for path in (output.get("S3OutputPath"), args.get("TensorBoardOutputConfig", {}).get("S3OutputPath")):
                if isinstance(path, str) and path.startswith("s3://") and path not in deployed.output_paths:
                    deployed.output_paths.append(path)
            key = output.get("KmsKeyId")
            deployed.output_key = deployed.output_key or (key if isinstance(key, str) else None)


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
    for need in quota_needs.needs(plan.recipe, quota_needs.prepare_instances(plan)):
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


# A run's and a job's names, for the requests that stand for their objects: a pipeline names a run
# after its execution and a job pipelines-<execution>-<step>-<suffix>.
SAMPLE_RUN = "preflight"
SAMPLE_JOB = "pipelines-preflight-Train-check"
SAMPLE_OBJECT = "shard-00000.bin"
CHECKPOINT_ACTIONS = ("s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:AbortMultipartUpload")
OUTPUT_ACTIONS = ("s3:PutObject", "s3:AbortMultipartUpload")


@dataclass(frozen=True)
class Access:
    """One request the execution role makes at run time, with the context keys AWS evaluates."""

    action: str
    resource: str
    context: tuple[tuple[str, str], ...] = ()

    def entries(self) -> list[dict[str, Any]]:
        return [{"ContextKeyName": k, "ContextKeyValues": [v], "ContextKeyType": "string"} for k, v in self.context]

    def describe(self) -> str:
        keys = ", ".join(f"{k}={v}" for k, v in self.context)
        return f"{self.action} on {self.resource}" + (f" ({keys})" if keys else "")


def _split(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    return bucket, prefix


def _kms(action: str, key_arn: str, service: str, account: str, region: str, s3_arn: str | None) -> Access:
    """A KMS request that ``service`` makes for the role (``kms:ViaService`` in the key's region)."""
    parts = key_arn.split(":")
    where = parts[3] if len(parts) > 5 and parts[3] else region
    suffix = "amazonaws.com.cn" if parts[1:2] == ["aws-cn"] else "amazonaws.com"
    context = [("kms:ViaService", f"{service}.{where}.{suffix}"), ("kms:CallerAccount", account)]
    if s3_arn:
        context.append(("kms:EncryptionContext:aws:s3:arn", s3_arn))
    return Access(action, key_arn, tuple(context))


def read_accesses(uri: str, key: str, partition: str, account: str, region: str, data_key: str | None) -> list[Access]:
    """Reading a prefix as SageMaker does: list it as written, get an object, decrypt it through S3."""
    bucket, prefix = _split(uri)
    obj = f"arn:{partition}:s3:::{bucket}/{key}"
    out = [
        Access("s3:ListBucket", f"arn:{partition}:s3:::{bucket}", (("s3:prefix", prefix),)),
        Access("s3:GetObject", obj),
    ]
    if data_key:
        out.append(_kms("kms:Decrypt", data_key, "s3", account, region, obj))
    return out


def checkpoint_accesses(runs_uri: str, partition: str, account: str, region: str, key: str | None) -> list[Access]:
    """A run's checkpoints: list the run's prefix, write, read, prune and abort an upload, through the store's key
    (the encryption context is the bucket: the checkpoint store enables an S3 Bucket Key)."""
    bucket, prefix = _split(runs_uri)
    run = f"{prefix}{SAMPLE_RUN}/"
    obj = f"arn:{partition}:s3:::{bucket}/{run}step-1/COMMITTED"
    out = [Access("s3:ListBucket", f"arn:{partition}:s3:::{bucket}", (("s3:prefix", run),))]
    out += [Access(action, obj) for action in CHECKPOINT_ACTIONS]
    if key:
        bucket_arn = f"arn:{partition}:s3:::{bucket}"
        out += [_kms(a, key, "s3", account, region, bucket_arn) for a in ("kms:GenerateDataKey", "kms:Decrypt")]
    return out


def output_accesses(path: str, partition: str, account: str, region: str, key: str | None) -> list[Access]:
    """A job's output: SageMaker writes ``<S3OutputPath>/<job>/output/model.tar.gz`` and encrypts it with
    ``OutputDataConfig.KmsKeyId`` (kms:Encrypt through SageMaker, GenerateDataKey through S3)."""
    bucket, prefix = _split(path.rstrip("/") + "/")
    obj = f"arn:{partition}:s3:::{bucket}/{prefix}{SAMPLE_JOB}/output/model.tar.gz"
    out = [Access(action, obj) for action in OUTPUT_ACTIONS]
    if key:
        out.append(_kms("kms:Encrypt", key, "sagemaker", account, region, None))
        out.append(_kms("kms:GenerateDataKey", key, "s3", account, region, f"arn:{partition}:s3:::{bucket}"))
    return out


def read_uris(plan: Plan) -> list[str]:
    """The prefixes a run reads: its data, its validation data and its init checkpoint."""
    data, model = plan.recipe.data, plan.recipe.model
    return [u for u in (data.uri, data.validation_uri, model.init_checkpoint) if u]


def role_read_uris(plan: Plan) -> list[str]:
    """The prefixes the role must read: those a run reads, and every prefix ``DataUri`` may name; with
    ``data.prepare`` the training jobs read the prepared shards instead of the raw examples."""
    uris = list(dict.fromkeys([*read_uris(plan), *plan.recipe.data.data_prefixes]))
    if plan.recipe.data.prepare is not None:
        uris = [u for u in uris if u not in (plan.recipe.data.uri, *plan.recipe.data.data_prefixes)]
    return uris


def sample_key(uri: str) -> str:
    """An object key under a prefix, read by whole path segments as the role's grant is."""
    prefix = _split(uri)[1]
    return (prefix if prefix == "" or prefix.endswith("/") else prefix + "/") + SAMPLE_OBJECT


def _first_object(s3: Any, uri: str) -> tuple[str | None, Check]:
    bucket, prefix = _split(uri)
    try:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except _client_error() as error:
        if _code(error) == "NoSuchBucket":
            fix = "fix the URI, or create the bucket and upload the objects"
            return None, Check("data", uri, FAIL, f"no bucket {bucket}", fix)
        return None, _aws_failure("data", uri, error, f"s3:ListBucket on arn:aws:s3:::{bucket} (for this identity)")
    objects = listed.get("Contents") or []
    if not objects:
        fix = "upload the token shards (training/README.md), or fix the URI"
        return None, Check("data", uri, FAIL, "no objects under this prefix", fix)
    return objects[0]["Key"], Check("data", uri, PASS, f"holds objects (first: s3://{bucket}/{objects[0]['Key']})")


def simulate(iam: Any, role_arn: str, accesses: list[Access]) -> list[str]:
    """The accesses the role's policies do not allow: one SimulatePrincipalPolicy call each, with its context."""
    denied = []
    for access in accesses:
        result = iam.simulate_principal_policy(
            PolicySourceArn=role_arn,
            ActionNames=[access.action],
            ResourceArns=[access.resource],
            ContextEntries=access.entries(),
        )
        decision = result["EvaluationResults"][0]["EvalDecision"]
        if decision != "allowed":
            denied.append(f"{access.describe()}: {decision}")
    return denied


def _role_check(
    check: str, subject: str, iam: Any, role_arn: str, accesses: list[Access], allowed: str, fix: str
) -> Check:
    try:
        denied = simulate(iam, role_arn, accesses)
    except _client_error() as error:
        return _aws_failure(check, subject, error, "iam:SimulatePrincipalPolicy on the execution role")
    if denied:
        return Check(check, subject, FAIL, "; ".join(denied), fix)
    return Check(check, subject, PASS, f"{allowed} (IAM policy simulator; a bucket or key policy may still deny)")


def check_data(
    s3: Any,
    iam: Any,
    plan: Plan,
    role_arn: str | None,
    deployed: Deployed | None = None,
    region: str | None = None,
) -> list[Check]:
    """Each prefix a run reads holds objects; the role may read them, and may write the run's checkpoints
    and the jobs' output (from the deployed definition)."""
    deployed = deployed or Deployed()
    out: list[Check] = []
    samples: dict[str, str] = {}
    for uri in read_uris(plan):
        key, check = _first_object(s3, uri)
        out.append(check)
        if key is not None:
            samples[uri] = key
    if not role_arn:
        out.append(
            Check(
                "data", "the execution role", SKIP, "the role is known once the stack is deployed (or pass --role-arn)"
            )
        )
        return out
    parts = role_arn.split(":")
    partition, account = (parts[1], parts[4]) if len(parts) >= 6 else ("aws", "")
    where = region or ""
    data_key = plan.recipe.data.kms_key_arn
    redeploy = (
        "list the prefix in data.allowed_uris (data.kms_key_arn for its key) and redeploy; "
        "a bucket in another account must also allow the role in its bucket policy"
    )
    for uri in role_read_uris(plan):
        accesses = read_accesses(uri, samples.get(uri) or sample_key(uri), partition, account, where, data_key)
        allowed = "its policies allow s3:ListBucket and s3:GetObject" + (" and kms:Decrypt" if data_key else "")
        out.append(_role_check("data", f"{uri} by {role_arn}", iam, role_arn, accesses, allowed, redeploy))
    store_fix = "redeploy the recipe's stack: its role must write this recipe's checkpoint and output prefixes"
    if deployed.runs_uri:
        accesses = checkpoint_accesses(deployed.runs_uri, partition, account, where, deployed.output_key)
        allowed = "its policies allow a run's checkpoints to be listed, written, read and pruned"
        out.append(
            _role_check("store", f"{deployed.runs_uri} by {role_arn}", iam, role_arn, accesses, allowed, store_fix)
        )
    for path in deployed.output_paths:
        accesses = output_accesses(path, partition, account, where, deployed.output_key)
        allowed = "its policies allow the job's output to be written"
        out.append(_role_check("store", f"{path} by {role_arn}", iam, role_arn, accesses, allowed, store_fix))
    if not deployed.runs_uri and not deployed.output_paths:
        out.append(
            Check(
                "store",
                f"checkpoints by {role_arn}",
                SKIP,
                "the checkpoint and output prefixes are known once the stack is deployed",
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
        "format": recipe.data.format,
        "on_bad_example": recipe.data.on_bad_example,
        "max_bad_fraction": recipe.data.max_bad_fraction,
        "layout": "pairs" if recipe.task == "dpo" else None,  # training/dpo_data.py's preference pairs
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


RAW_SAMPLE_BYTES = 1 << 20
# The keys a record of each format has (training/sft_formats.py reads them; auto takes the first that fits).
FORMAT_KEYS = {
    "messages": (("messages",),),
    "sharegpt": (("conversations",),),
    "alpaca": (("instruction", "output"),),
    "prompt_completion": (("prompt", "completion"),),
    "text": (("text",),),
    "preference": (("chosen", "rejected"),),  # training/dpo_data.py (task dpo)
}


def check_raw_data(s3: Any, plan: Plan) -> Check:
    """Task sft with ``data.prepare``: the data prefix holds raw examples the Prepare step can read, and the first
    record of the first file parses in ``data.format`` (JSON Lines and JSON; Parquet and ``save_to_disk``
    directories are listed, and their records are read by the Prepare step)."""
    recipe = plan.recipe
    uri = recipe.data.uri
    fmt = recipe.data.format or ("preference" if recipe.task == "dpo" else "auto")
    bucket, prefix = _split(uri)
    folder = prefix if prefix == "" or prefix.endswith("/") else prefix + "/"
    fix = (
        "upload the examples as .jsonl, .json (either gzipped) or .parquet files (or a Dataset.save_to_disk "
        "directory) under data.uri"
    )
    try:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=folder, MaxKeys=1000).get("Contents", [])
    except _client_error() as error:
        if _code(error) == "NoSuchBucket":
            return Check("data", uri, FAIL, f"no bucket {bucket}", fix)
        raise
    names = sorted(item["Key"] for item in listed if not item["Key"].endswith("/"))
    if any(name == f"{folder}{SAVED_MARKER}" for name in names):
        return Check("data", uri, PASS, f"raw examples: a Dataset.save_to_disk directory ({len(names)} objects)")
    relatives, left_out, refused = sort_raw([name[len(folder) :] for name in names], recipe.data.ignore)
    inputs = [folder + name for name in relatives]
    if not inputs:
        return Check(
            "data", uri, FAIL, f"no .jsonl, .json or .parquet objects under it ({len(names)} other objects)", fix
        )
    if refused:
        shown = ", ".join(f"s3://{bucket}/{folder}{name}" for name in refused[:10])
        return Check(
            "data",
            uri,
            FAIL,
            f"{len(refused)} object(s) that no reader takes: {shown}" + (" ..." if len(refused) > 10 else ""),
            "remove them, or list them in data.ignore (globs such as '*.md')",
        )
    ignoring = (
        f"; ignoring {len(left_out)} object(s) as data.ignore says: {', '.join(left_out[:10])}" if left_out else ""
    )
    first = inputs[0]
    where = f"s3://{bucket}/{first}"
    if first.endswith(".parquet"):
        s3.head_object(Bucket=bucket, Key=first)
        return Check("data", uri, PASS, f"raw examples: {len(inputs)} file(s); {where} is readable (Parquet){ignoring}")
    body = s3.get_object(Bucket=bucket, Key=first, Range=f"bytes=0-{RAW_SAMPLE_BYTES - 1}")["Body"].read()
    if first.endswith(".gz"):  # the first bytes of the stream, as far as they go
        body = zlib.decompressobj(wbits=31).decompress(body)
    text = body.decode("utf-8", errors="replace").lstrip("\ufeff")
    record, line = _first_record(text)
    if record is None:
        return Check("data", uri, FAIL, f"{where}: no JSON record in its first {RAW_SAMPLE_BYTES:,} bytes", fix)
    if isinstance(record, str):  # why it did not parse
        return Check("data", uri, FAIL, f"{where}:{line}: not JSON ({record})", fix)
    if not isinstance(record, dict):
        return Check("data", uri, FAIL, f"{where}:{line}: a {type(record).__name__}, expected an object", fix)
    sft = {name: keys for name, keys in FORMAT_KEYS.items() if name != "preference"}
    candidates = sft if fmt == "auto" else {fmt: FORMAT_KEYS[fmt]}
    found = next(
        (name for name, shapes in candidates.items() if any(all(k in record for k in s) for s in shapes)), None
    )
    if found is None:
        keys = ", ".join(sorted(map(str, record))) or "none"
        wanted = "; ".join(f"{name}: {' and '.join(shapes[0])}" for name, shapes in candidates.items())
        return Check(
            "data",
            uri,
            FAIL,
            f"{where}:{line}: the first record (keys: {keys}) is not in data.format {fmt} ({wanted})",
            "set data.format to the examples' format, or convert them",
        )
    return Check(
        "data",
        uri,
        PASS,
        f"raw examples: {len(inputs)} file(s); the first record of {where} is {found}"
        + (" (data.format auto)" if fmt == "auto" else "")
        + ignoring,
    )


def _first_record(text: str) -> tuple[Any, int]:
    """The first record of JSON Lines or a JSON array, and its line; a string says why it does not parse."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        start = text.index("[") + 1
        rest = text[start:].lstrip()
        line = text[: len(text) - len(rest)].count("\n") + 1
        try:
            record, _ = json.JSONDecoder().raw_decode(rest)
        except ValueError as error:
            return str(error), line
        return record, line
    for number, row in enumerate(text.splitlines(), start=1):
        if row.strip():
            try:
                return json.loads(row), number
            except ValueError as error:
                return str(error), number
    return None, 0


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
