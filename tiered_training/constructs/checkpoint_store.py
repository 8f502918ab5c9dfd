"""CheckpointStore: the S3 bucket for checkpoints and model output, one prefix per recipe.

Layout: ``s3://<bucket>/<recipe>/checkpoints/`` (CheckpointConfig, shared by all hosts)
and ``s3://<bucket>/<recipe>/output/`` (model artefacts and probe output).
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from .nag import acknowledge

# Object-level actions a training job needs on its own prefixes: read and resume,
# write checkpoints, delete (SageMaker mirrors a local delete), multipart uploads.
OBJECT_READ_ACTIONS = ["s3:GetObject"]
OBJECT_WRITE_ACTIONS = ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
KMS_USE_ACTIONS = ["kms:Decrypt", "kms:GenerateDataKey"]


def checkpoint_prefix(recipe: str) -> str:
    return f"{recipe}/checkpoints/"


def output_prefix(recipe: str) -> str:
    return f"{recipe}/output/"


class CheckpointStore(Construct):
    """An S3 bucket for checkpoints and model output.

    Props (all optional):

    - ``bucket``: an existing bucket to use instead of a new one (then none of the
      bucket props below apply, and ``encryption_key`` should be the bucket's key, if any).
    - ``encryption_key``: the KMS key; default a new key with rotation.
    - ``noncurrent_version_expiration``: default 30 days. Checkpoints are rewritten
      often; old versions are only for recovering from an accidental delete.
    - ``abort_incomplete_multipart_upload_after``: default 7 days.
    - ``removal_policy``: default RETAIN (checkpoints outlive a stack).
    - ``server_access_logs_bucket``: where S3 access logs go; default a new
      log bucket (SSE-S3, which S3 log delivery requires), RETAIN.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        bucket: s3.IBucket | None = None,
        encryption_key: kms.IKey | None = None,
        noncurrent_version_expiration: Duration = Duration.days(30),
        abort_incomplete_multipart_upload_after: Duration = Duration.days(7),
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        server_access_logs_bucket: s3.IBucket | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
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
            access_logs = s3.Bucket(
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
                access_logs,
                "AwsSolutions-S1",
                "This is the access-log target of the checkpoint store; logging it into itself would loop.",
            )
            logs = access_logs
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
                    noncurrent_version_expiration=noncurrent_version_expiration,
                    abort_incomplete_multipart_upload_after=abort_incomplete_multipart_upload_after,
                    expired_object_delete_marker=True,
                )
            ],
        )

    # -- tokens, asked once (each is a jsii call; a platform shares them with every recipe) --

    @property
    def bucket_name(self) -> str:
        if "_bucket_name" not in self.__dict__:
            self._bucket_name = self.bucket.bucket_name
        return self._bucket_name

    @property
    def bucket_arn(self) -> str:
        if "_bucket_arn" not in self.__dict__:
            self._bucket_arn = self.bucket.bucket_arn
        return self._bucket_arn

    @property
    def encryption_key_arn(self) -> str | None:
        if "_key_arn" not in self.__dict__:
            self._key_arn = self.encryption_key.key_arn if self.encryption_key is not None else None
        return self._key_arn

    # -- locations -------------------------------------------------------------------------

    def checkpoint_uri(self, recipe: str) -> str:
        return f"s3://{self.bucket_name}/{checkpoint_prefix(recipe)}"

    def output_uri(self, recipe: str) -> str:
        return f"s3://{self.bucket_name}/{output_prefix(recipe)}"

    # -- grants ----------------------------------------------------------------------------

    def _objects(self, prefix: str) -> str:
        return self.bucket.arn_for_objects(f"{prefix}*")

    def recipe_statements(self, recipe: str, *, write: bool) -> list[dict]:
        """The policy statements (plain IAM JSON) of :meth:`grant_recipe_read_write` (``write``)
        or :meth:`grant_recipe_read`: objects under the recipe's prefixes, ListBucket limited
        to them, and the key. No jsii call once the store's tokens are known."""
        prefixes = [checkpoint_prefix(recipe), output_prefix(recipe)]
        bucket_arn = self.bucket_arn
        statements: list[dict] = [
            {
                "Effect": "Allow",
                "Action": OBJECT_READ_ACTIONS + (OBJECT_WRITE_ACTIONS if write else []),
                # Bucket.arn_for_objects(pattern) is f"{bucket_arn}/{pattern}".
                "Resource": [f"{bucket_arn}/{p}*" for p in prefixes],
            },
            {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [f"{p}*" for p in prefixes]}},
            },
        ]
        if self.encryption_key is not None:
            statements.append(
                {"Effect": "Allow", "Action": KMS_USE_ACTIONS if write else ["kms:Decrypt"], "Resource": self.encryption_key_arn}
            )
        return statements

    def _list(self, grantee: iam.IGrantable, prefixes: list[str]) -> iam.Grant:
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:ListBucket"],
            resource_arns=[self.bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{p}*" for p in prefixes]}},
        )

    def grant_key(self, grantee: iam.IGrantable, *, write: bool) -> iam.Grant | None:
        if self.encryption_key is None:
            return None
        actions = KMS_USE_ACTIONS if write else ["kms:Decrypt"]
        return iam.Grant.add_to_principal(grantee=grantee, actions=actions, resource_arns=[self.encryption_key.key_arn])

    def grant_recipe_read(self, grantee: iam.IGrantable, recipe: str) -> iam.Grant:
        """Read this recipe's checkpoints and output (for example, an evaluation job)."""
        prefixes = [checkpoint_prefix(recipe), output_prefix(recipe)]
        grant = iam.Grant.add_to_principal(
            grantee=grantee, actions=OBJECT_READ_ACTIONS, resource_arns=[self._objects(p) for p in prefixes]
        )
        grant = grant.combine(self._list(grantee, prefixes))
        key = self.grant_key(grantee, write=False)
        return grant.combine(key) if key else grant

    def grant_recipe_read_write(self, grantee: iam.IGrantable, recipe: str) -> iam.Grant:
        """Read and write this recipe's checkpoint and output prefixes, and nothing else in the bucket."""
        prefixes = [checkpoint_prefix(recipe), output_prefix(recipe)]
        grant = iam.Grant.add_to_principal(
            grantee=grantee,
            actions=OBJECT_READ_ACTIONS + OBJECT_WRITE_ACTIONS,
            resource_arns=[self._objects(p) for p in prefixes],
        )
        grant = grant.combine(self._list(grantee, prefixes))
        key = self.grant_key(grantee, write=True)
        return grant.combine(key) if key else grant

    @property
    def stack(self) -> Stack:
        return Stack.of(self)
