"""TrainingRoles: the SageMaker execution role and the pipeline role, least privilege.

Execution role (the training jobs assume it):
  - read the recipe's data prefix (and its init checkpoint, when given);
  - read and write this recipe's checkpoint and output prefixes only;
  - pull the training image;
  - write to the training-job log group;
  - use the store's KMS key.

Pipeline role (the SageMaker pipeline assumes it):
  - create, describe and stop training jobs named ``pipelines-*`` (the names a
    pipeline generates), and tag them at creation;
  - pass the execution role to SageMaker, and nothing else.
"""

from __future__ import annotations

import re

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from .checkpoint_store import CheckpointStore
from .image import TrainingImage
from .checkpoint_store import checkpoint_prefix, output_prefix
from .nag import LateAcknowledgements, acknowledge

SAGEMAKER = "sagemaker.amazonaws.com"
TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
S3_URI = re.compile(r"^s3://(?P<bucket>[^/]+)/?(?P<prefix>.*)$")


def split_s3_uri(uri: str) -> tuple[str, str]:
    match = S3_URI.match(uri)
    if not match:
        raise ValueError(f"not an S3 URI: {uri!r}")
    return match["bucket"], match["prefix"]


class TrainingRoles(Construct):
    """The two roles of one recipe's pipeline.

    Props:

    - ``recipe_name``: names the store prefixes this recipe may write.
    - ``store``: the CheckpointStore.
    - ``image``: the TrainingImage (pull access).
    - ``data_uris``: S3 prefixes the jobs may read (the recipe's data and init checkpoint).
    - ``data_key``: a KMS key that encrypts the data, if any; default none.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        recipe_name: str,
        store: CheckpointStore,
        image: TrainingImage,
        data_uris: list[str],
        data_key: kms.IKey | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.recipe_name = recipe_name
        source = {"StringEquals": {"aws:SourceAccount": stack.account}}

        self.execution_role = iam.Role(
            self,
            "ExecutionRole",
            assumed_by=iam.ServicePrincipal(SAGEMAKER, conditions=source),
            description=f"SageMaker training jobs of recipe {recipe_name}",
        )
        self.pipeline_role = iam.Role(
            self,
            "PipelineRole",
            assumed_by=iam.ServicePrincipal(SAGEMAKER, conditions=source),
            description=f"SageMaker pipeline of recipe {recipe_name}",
        )

        # -- execution role ------------------------------------------------------------------
        self._late = LateAcknowledgements()
        self.node.add_validation(self._late)
        for uri in data_uris:
            self.grant_read_s3(self.execution_role, uri)
        if data_key is not None:
            data_key.grant_decrypt(self.execution_role)
        store.grant_recipe_read_write(self.execution_role, recipe_name)
        image.grant_pull(self.execution_role)
        log_group = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"{TRAINING_LOG_GROUP}:log-stream:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self.execution_role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[log_group],
            )
        )
        self.execution_role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogGroup", "logs:DescribeLogStreams"],
                resources=[
                    stack.format_arn(
                        service="logs",
                        resource="log-group",
                        resource_name=f"{TRAINING_LOG_GROUP}:*",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                ],
            )
        )
        # cloudwatch:PutMetricData has no resource-level permissions (IAM requires Resource "*");
        # the condition limits it to SageMaker's own training-job namespace.
        self.execution_role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": TRAINING_LOG_GROUP}},
            )
        )

        # -- pipeline role -------------------------------------------------------------------
        jobs = stack.format_arn(service="sagemaker", resource="training-job", resource_name="pipelines-*")
        self.pipeline_role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=[
                    "sagemaker:CreateTrainingJob",
                    "sagemaker:DescribeTrainingJob",
                    "sagemaker:StopTrainingJob",
                    "sagemaker:AddTags",
                ],
                resources=[jobs],
            )
        )
        self.execution_role.grant_pass_role(self.pipeline_role)
        self._acknowledge(store, image)

    def grant_read_s3(self, grantee: iam.IGrantable, uri: str) -> iam.Grant:
        """Read one S3 prefix: GetObject under it, ListBucket limited to it."""
        bucket, prefix = split_s3_uri(uri)
        partition = Stack.of(self).partition
        arn = f"arn:{partition}:s3:::{bucket}/{prefix}*"
        objects = iam.Grant.add_to_principal(grantee=grantee, actions=["s3:GetObject"], resource_arns=[arn])
        self._acknowledge_objects(grantee, arn, f"the training data and checkpoint under {uri} are many objects")
        listing = iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:ListBucket"],
            resource_arns=[f"arn:{partition}:s3:::{bucket}"],
            conditions={"StringLike": {"s3:prefix": [f"{prefix}*"]}},
        )
        return objects.combine(listing)

    def _acknowledge_objects(self, grantee: iam.IGrantable, arn: str, what: str) -> None:
        policy = self.execution_role.node.try_find_child("DefaultPolicy") if grantee is self.execution_role else None
        if policy is not None:
            self._late.add(policy.node.default_child, arn, f"Objects under one prefix: {what}, named by the trainer")

    def _acknowledge(self, store: CheckpointStore, image: TrainingImage) -> None:
        for prefix in (checkpoint_prefix(self.recipe_name), output_prefix(self.recipe_name)):
            self._acknowledge_objects(
                self.execution_role, store.bucket.arn_for_objects(f"{prefix}*"), f"this recipe's {prefix} prefix only"
            )
        policy = self.execution_role.node.try_find_child("DefaultPolicy")
        reasons = [
            ("AwsSolutions-IAM5[Resource::*]",
             "ecr:GetAuthorizationToken and cloudwatch:PutMetricData have no resource-level permissions; "
             "PutMetricData is limited by a cloudwatch:namespace condition"),
            (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:{TRAINING_LOG_GROUP}:*]",
             "SageMaker names each training job's log streams after the generated job name"),
            (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:{TRAINING_LOG_GROUP}:log-stream:*]",
             "SageMaker names each training job's log streams after the generated job name"),
        ]
        if policy is not None:
            for rule, reason in reasons:
                acknowledge(policy, rule, reason)
        pipeline_policy = self.pipeline_role.node.try_find_child("DefaultPolicy")
        if pipeline_policy is not None:
            acknowledge(
                pipeline_policy,
                "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>:training-job/pipelines-*]",
                "A pipeline names its training jobs pipelines-<execution>-<step>-<suffix> at run time",
            )
