"""CheckpointStore: the S3 bucket for checkpoints and model output, one prefix per recipe.

Layout: ``s3://<bucket>/<recipe>/checkpoints/runs/<run id>/`` (each run's CheckpointConfig, shared by
all hosts) and ``s3://<bucket>/<recipe>/output/`` (model artefacts and probe output).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from aws_cdk import Aws, Duration, RemovalPolicy, Token
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from tiered_training.constructs.nag import acknowledge
from tiered_training.contract.container import LEASE_NAME
from tiered_training.planning.overlay import store_key as calibration_key

# Object-level actions a training job needs on its own prefixes: read and resume, write
# checkpoints and output, multipart uploads. Delete only under checkpoints/ (SageMaker mirrors
# the trainer's pruning there); nothing deletes model output.
OBJECT_READ_ACTIONS = ["s3:GetObject"]
OBJECT_WRITE_ACTIONS = ["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
CHECKPOINT_DELETE_ACTIONS = ["s3:DeleteObject"]
# Writing through SSE-KMS needs GenerateDataKey; CreateTrainingJob with OutputDataConfig.KmsKeyId
# also needs kms:Encrypt on the execution role (CreateTrainingJob API reference, KmsKeyId).
KMS_READ_ACTIONS = ["kms:Decrypt"]
KMS_WRITE_ACTIONS = ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"]


def via_services(*services: str, key_arn: str | None = None) -> dict:
    """A ``kms:ViaService`` condition: the key may be used only through these services, in the
    key's region (a literal ``key_arn``'s, else this stack's):
    https://docs.aws.amazon.com/kms/latest/developerguide/conditions-kms.html#conditions-kms-via-service"""
    region = Aws.REGION
    if key_arn and not Token.is_unresolved(key_arn) and key_arn.count(":") >= 5:
        region = key_arn.split(":")[3]
    return {"StringEquals": {"kms:ViaService": [f"{service}.{region}.{Aws.URL_SUFFIX}" for service in services]}}


def via_s3_for(key_arn: str | None, objects: list[str]) -> dict:
    """Through S3 only, for these objects: ``kms:ViaService`` and the encryption context S3 passes,
    ``aws:s3:arn`` (the object's ARN; with S3 Bucket Keys, the bucket's, so list the bucket's ARN too):
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingKMSEncryption.html#encryption-context"""
    return {
        "StringEquals": via_services("s3", key_arn=key_arn)["StringEquals"],
        "StringLike": {"kms:EncryptionContext:aws:s3:arn": objects},
    }


def checkpoint_prefix(recipe: str) -> str:
    return f"{recipe}/checkpoints/"


def runs_prefix(recipe: str) -> str:
    """Where each run's checkpoints go (``runs/<run id>/``, pipeline/definition.py's run prefix)."""
    return f"{checkpoint_prefix(recipe)}runs/"


COMMIT_MARKER = "COMMITTED"  # each committed checkpoint's manifest: <run>/step-N/COMMITTED


def output_prefix(recipe: str) -> str:
    return f"{recipe}/output/"


def prepared_prefix(recipe: str) -> str:
    """The Prepare step's packed shards, one prefix per content key (pipeline/definition.py's prepared_s3_uri)."""
    return f"{output_prefix(recipe)}prepared/"


def prepare_output_prefix(recipe: str) -> str:
    """The Prepare step's ProcessingOutput (its property file), one prefix per execution."""
    return f"{output_prefix(recipe)}prepare/"


@dataclass(frozen=True)
class CheckpointStoreProps:
    """Settings of a new CheckpointStore (the keyword arguments of :class:`CheckpointStore`).

    - ``bucket``: an existing bucket instead of a new one; default a new bucket.
    - ``encryption_key``: the KMS key; default the bucket's key, or a new key with rotation.
    - ``noncurrent_version_expiration``: default 30 days.
    - ``pruned_checkpoint_expiration``: how long a pruned checkpoint's old versions stay; default 1 day.
    - ``abort_incomplete_multipart_upload_after``: default 7 days.
    - ``removal_policy``: default RETAIN.
    - ``server_access_logs_bucket``: default a new access-log bucket.
    """

    bucket: s3.IBucket | None = None
    encryption_key: kms.IKey | None = None
    noncurrent_version_expiration: Duration | None = None
    pruned_checkpoint_expiration: Duration | None = None
    abort_incomplete_multipart_upload_after: Duration | None = None
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    server_access_logs_bucket: s3.IBucket | None = None


class CheckpointStore(Construct):
    """An S3 bucket for checkpoints and model output.

    Props (all optional):

    - ``bucket``: an existing bucket (``IBucket``) to use instead of a new one. None of the
      bucket props below apply then; ``encryption_key`` defaults to the bucket's key, if any.
    - ``encryption_key``: the KMS key (``IKey``); default a new key with rotation.
    - ``noncurrent_version_expiration``: default 30 days. Checkpoints are rewritten
      often; old versions are only for recovering from an accidental delete.
    - ``pruned_checkpoint_expiration``: default 1 day. The trainer prunes to the recipe's
      ``checkpointing.keep_last`` and SageMaker deletes the pruned files in S3 too; in a
      versioned bucket they would stay as noncurrent versions (hundreds of GB each for a
      large model), so each recipe's checkpoint prefix gets a rule of its own
      (:meth:`expire_pruned_checkpoints`). With ``bucket`` given, add that rule yourself.
    - ``abort_incomplete_multipart_upload_after``: default 7 days.
    - ``removal_policy``: default RETAIN (checkpoints outlive a stack).
    - ``server_access_logs_bucket``: where S3 access logs go; default a new
      log bucket (SSE-S3, which S3 log delivery requires), with the same removal policy.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        bucket: s3.IBucket | None = None,
        encryption_key: kms.IKey | None = None,
        noncurrent_version_expiration: Duration | None = None,
        pruned_checkpoint_expiration: Duration | None = None,
        abort_incomplete_multipart_upload_after: Duration | None = None,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        server_access_logs_bucket: s3.IBucket | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self._object_arns: dict[str, list[str]] = {}
        self._pruned_expiration = pruned_checkpoint_expiration or Duration.days(1)
        self._expiring: set[str] = set()
        self.bucket: s3.IBucket
        self.encryption_key: kms.IKey | None
        if bucket is not None:
            self.bucket = bucket
            self.encryption_key = encryption_key or bucket.encryption_key
            return
        self.encryption_key = encryption_key or kms.Key(
            self,
            "Key",
            description="tiered-training checkpoint store",
            enable_key_rotation=True,
            removal_policy=removal_policy,
        )
        logs = server_access_logs_bucket
        if logs is None:
            logs = s3.Bucket(
                self,
                "AccessLogs",
                encryption=s3.BucketEncryption.S3_MANAGED,
                block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                enforce_ssl=True,
                object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
                removal_policy=removal_policy,
                lifecycle_rules=[s3.LifecycleRule(id="expire-logs", expiration=Duration.days(365))],
            )
            acknowledge(
                logs,
                "AwsSolutions-S1",
                "This is the access-log target of the checkpoint store; logging it into itself would loop.",
            )
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.encryption_key,
            bucket_key_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            removal_policy=removal_policy,
            server_access_logs_bucket=logs,
            server_access_logs_prefix="checkpoint-store/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="noncurrent-and-multipart",
                    noncurrent_version_expiration=noncurrent_version_expiration or Duration.days(30),
                    abort_incomplete_multipart_upload_after=abort_incomplete_multipart_upload_after or Duration.days(7),
                    expired_object_delete_marker=True,
                )
            ],
        )

    @classmethod
    def from_props(
        cls, scope: Construct, construct_id: str, props: CheckpointStoreProps | None = None
    ) -> CheckpointStore:
        """A store made from :class:`CheckpointStoreProps` (default: all defaults)."""
        props = props or CheckpointStoreProps()
        return cls(
            scope,
            construct_id,
            bucket=props.bucket,
            encryption_key=props.encryption_key,
            noncurrent_version_expiration=props.noncurrent_version_expiration,
            pruned_checkpoint_expiration=props.pruned_checkpoint_expiration,
            abort_incomplete_multipart_upload_after=props.abort_incomplete_multipart_upload_after,
            removal_policy=props.removal_policy,
            server_access_logs_bucket=props.server_access_logs_bucket,
        )

    # -- the bucket's tokens, asked once (a platform shares them with every recipe) ---------

    @cached_property
    def bucket_name(self) -> str:
        return self.bucket.bucket_name

    @cached_property
    def bucket_arn(self) -> str:
        return self.bucket.bucket_arn

    @cached_property
    def encryption_key_arn(self) -> str | None:
        return self.encryption_key.key_arn if self.encryption_key is not None else None

    def expire_pruned_checkpoints(self, recipe: str) -> bool:
        """Expire the noncurrent versions under ``recipe``'s checkpoint prefix after
        ``pruned_checkpoint_expiration``, so pruned checkpoints do not pile up as versions.

        Only a bucket this store created can take the rule; returns whether it did.
        """
        if not isinstance(self.bucket, s3.Bucket):
            return False
        if recipe not in self._expiring:
            self._expiring.add(recipe)
            self.bucket.add_lifecycle_rule(
                id=f"pruned-checkpoints-{recipe}",
                prefix=checkpoint_prefix(recipe),
                noncurrent_version_expiration=self._pruned_expiration,
            )
        return True

    # -- locations -------------------------------------------------------------------------

    def checkpoint_uri(self, recipe: str) -> str:
        return f"s3://{self.bucket_name}/{checkpoint_prefix(recipe)}"

    def output_uri(self, recipe: str) -> str:
        return f"s3://{self.bucket_name}/{output_prefix(recipe)}"

    def recipe_object_arns(self, recipe: str) -> list[str]:
        """The object ARNs (with a trailing wildcard) of the recipe's checkpoint and output prefixes."""
        if recipe not in self._object_arns:
            self._object_arns[recipe] = [
                self.bucket.arn_for_objects(f"{prefix}*")
                for prefix in (checkpoint_prefix(recipe), output_prefix(recipe))
            ]
        return list(self._object_arns[recipe])

    # -- grants ----------------------------------------------------------------------------

    def _grant(
        self,
        grantee: iam.IGrantable,
        recipe: str,
        object_actions: list[str],
        key_actions: list[str],
        *,
        delete: bool = False,
    ) -> iam.Grant:
        prefixes = [checkpoint_prefix(recipe), output_prefix(recipe)]
        grant = iam.Grant.add_to_principal(
            grantee=grantee, actions=object_actions, resource_arns=self.recipe_object_arns(recipe)
        )
        if delete:
            grant = grant.combine(
                iam.Grant.add_to_principal(
                    grantee=grantee,
                    actions=CHECKPOINT_DELETE_ACTIONS,
                    resource_arns=self.recipe_object_arns(recipe)[:1],
                )
            )
        grant = grant.combine(
            iam.Grant.add_to_principal(
                grantee=grantee,
                actions=["s3:ListBucket"],
                resource_arns=[self.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{p}*" for p in prefixes]}},
            )
        )
        if self.encryption_key_arn is not None:
            # Through S3 (SSE-KMS objects), and through SageMaker for kms:Encrypt of the job's output.
            services = ("s3", "sagemaker") if "kms:Encrypt" in key_actions else ("s3",)
            grant = grant.combine(
                iam.Grant.add_to_principal(
                    grantee=grantee,
                    actions=key_actions,
                    resource_arns=[self.encryption_key_arn],
                    conditions=via_services(*services, key_arn=self.encryption_key_arn),
                )
            )
        return grant

    def grant_recipe_read(self, grantee: iam.IGrantable, recipe: str) -> iam.Grant:
        """Read this recipe's checkpoints and output (for example, an evaluation job)."""
        return self._grant(grantee, recipe, OBJECT_READ_ACTIONS, KMS_READ_ACTIONS)

    def grant_recipe_read_write(self, grantee: iam.IGrantable, recipe: str) -> iam.Grant:
        """Read and write this recipe's checkpoint and output prefixes, and nothing else in the
        bucket; delete under its checkpoint prefix only; use the key, through S3 and SageMaker
        only (``kms:ViaService``), to read, write and encrypt the job's output.

        The key is granted in the grantee's policy: its key policy must let the account's IAM
        policies allow its use (KMS's default key policy, and CDK's, do)."""
        grant = self._grant(grantee, recipe, OBJECT_READ_ACTIONS + OBJECT_WRITE_ACTIONS, KMS_WRITE_ACTIONS, delete=True)
        # The prepared shards and the Prepare job's property file are the Prepare role's to write: a training job
        # reads them only (the output prefix holds them, so the allow above covers them).
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                effect=iam.Effect.DENY,
                actions=OBJECT_WRITE_ACTIONS + CHECKPOINT_DELETE_ACTIONS,
                resources=self.prepare_object_arns(recipe),
            )
        )
        return grant

    def prepare_object_arns(self, recipe: str) -> list[str]:
        """The object ARNs (with a trailing wildcard) the Prepare job writes: its shards and its property file."""
        return [
            self.bucket.arn_for_objects(f"{prefix}*")
            for prefix in (prepared_prefix(recipe), prepare_output_prefix(recipe))
        ]

    def grant_prepare(self, grantee: iam.IGrantable, recipe: str) -> iam.Grant:
        """The Prepare job: read and write the recipe's prepared shards (a key's manifest is read to reuse it),
        write its property file, list the prepared prefix; the key through S3 and SageMaker (its output)."""
        shards, outputs = self.prepare_object_arns(recipe)
        grant = iam.Grant.add_to_principal(
            grantee=grantee, actions=OBJECT_READ_ACTIONS + OBJECT_WRITE_ACTIONS, resource_arns=[shards]
        ).combine(iam.Grant.add_to_principal(grantee=grantee, actions=OBJECT_WRITE_ACTIONS, resource_arns=[outputs]))
        grant = grant.combine(
            iam.Grant.add_to_principal(
                grantee=grantee,
                actions=["s3:ListBucket"],
                resource_arns=[self.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{prepared_prefix(recipe)}*"]}},
            )
        )
        if self.encryption_key_arn is not None:
            # Through S3, for the bucket (S3 Bucket Keys) and the objects of its prefixes only.
            grant = grant.combine(
                iam.Grant.add_to_principal(
                    grantee=grantee,
                    actions=KMS_WRITE_ACTIONS,
                    resource_arns=[self.encryption_key_arn],
                    conditions=via_s3_for(self.encryption_key_arn, [self.bucket_arn, shards, outputs]),
                )
            )
            # SageMaker encrypts the job's output with the key (ProcessingOutputConfig.KmsKeyId): kms:Encrypt,
            # through SageMaker, which passes no aws:s3:arn context.
            grant = grant.combine(
                iam.Grant.add_to_principal(
                    grantee=grantee,
                    actions=["kms:Encrypt"],
                    resource_arns=[self.encryption_key_arn],
                    conditions=via_services("sagemaker", key_arn=self.encryption_key_arn),
                )
            )
        return grant

    def grant_runs_read(self, grantee: iam.IGrantable, recipe: str) -> iam.Grant:
        """List this recipe's runs and read their checkpoints' manifests (``COMMITTED``) and leases, not the
        checkpoints: what ``tiered-training status`` and ``start --resume`` read. The key only
        through S3, for this bucket's objects (the encryption context S3 passes: the bucket's ARN
        with S3 Bucket Keys, else the object's)."""
        runs = runs_prefix(recipe)
        grant = iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:ListBucket"],
            resource_arns=[self.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{runs}*"]}},
        ).combine(
            iam.Grant.add_to_principal(
                grantee=grantee,
                actions=OBJECT_READ_ACTIONS,
                resource_arns=[
                    self.bucket.arn_for_objects(f"{runs}*/{COMMIT_MARKER}"),
                    self.bucket.arn_for_objects(f"{runs}*/{LEASE_NAME}"),
                ],
            )
        )
        # This recipe's calibration overlay (``calibrate --from-runs`` writes it, tiered_training/aws/calibrate.py).
        overlay = self.bucket.arn_for_objects(calibration_key(recipe))
        grant = grant.combine(
            iam.Grant.add_to_principal(
                grantee=grantee, actions=["s3:GetObject", "s3:PutObject"], resource_arns=[overlay]
            )
        )
        if self.encryption_key_arn is not None:
            grant = grant.combine(
                iam.Grant.add_to_principal(
                    grantee=grantee,
                    actions=KMS_WRITE_ACTIONS,
                    resource_arns=[self.encryption_key_arn],
                    conditions=via_s3_for(self.encryption_key_arn, [self.bucket_arn, overlay]),
                )
            )
            grant = grant.combine(
                iam.Grant.add_to_principal(
                    grantee=grantee,
                    actions=KMS_READ_ACTIONS,
                    resource_arns=[self.encryption_key_arn],
                    conditions=via_s3_for(
                        self.encryption_key_arn, [self.bucket_arn, self.bucket.arn_for_objects(f"{runs}*")]
                    ),
                )
            )
        return grant
