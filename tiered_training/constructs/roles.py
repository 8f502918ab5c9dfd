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

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from .checkpoint_store import CheckpointStore, checkpoint_prefix, output_prefix
from .image import TrainingImage
from .nag import LateAcknowledgements, acknowledge_all

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
        # Synth speed: every aws-cdk-lib call is a jsii round trip, and a platform repo has a
        # role pair per recipe. So the statements are plain IAM JSON, each turned into a
        # PolicyStatement with one call and added to the role's default policy in one call;
        # CDK still merges and sorts them (@aws-cdk/aws-iam:minimizePolicies) as it would grants.
        stack = Stack.of(self)
        self.recipe_name = recipe_name
        partition, region, account = stack.partition, stack.region, stack.account
        sagemaker = iam.ServicePrincipal(SAGEMAKER, conditions={"StringEquals": {"aws:SourceAccount": account}})

        self.execution_role = iam.Role(
            self,
            "ExecutionRole",
            assumed_by=sagemaker,
            description=f"SageMaker training jobs of recipe {recipe_name}",
        )
        self.pipeline_role = iam.Role(
            self,
            "PipelineRole",
            assumed_by=sagemaker,
            description=f"SageMaker pipeline of recipe {recipe_name}",
        )

        # -- execution role ------------------------------------------------------------------
        logs = f"arn:{partition}:logs:{region}:{account}:log-group:{TRAINING_LOG_GROUP}"
        execution: list[dict] = []
        object_arns: list[tuple[str, str]] = []  # (ARN with a wildcard, why), for cdk-nag
        for uri in data_uris:
            statements, arn = self.read_s3_statements(uri, partition)
            execution += statements
            object_arns.append((arn, f"the training data and checkpoint under {uri} are many objects"))
        store_statements = store.recipe_statements(recipe_name, write=True)
        execution += store_statements
        prefixes = (checkpoint_prefix(recipe_name), output_prefix(recipe_name))
        object_arns += [(arn, f"this recipe's {prefix} prefix only") for arn, prefix in zip(store_statements[0]["Resource"], prefixes)]
        execution += image.pull_statements()
        execution += [
            {"Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"], "Resource": f"{logs}:log-stream:*"},
            {"Effect": "Allow", "Action": ["logs:CreateLogGroup", "logs:DescribeLogStreams"], "Resource": f"{logs}:*"},
            # cloudwatch:PutMetricData has no resource-level permissions (IAM requires Resource "*");
            # the condition limits it to SageMaker's own training-job namespace.
            {
                "Effect": "Allow",
                "Action": "cloudwatch:PutMetricData",
                "Resource": "*",
                "Condition": {"StringEquals": {"cloudwatch:namespace": TRAINING_LOG_GROUP}},
            },
        ]
        execution_policy = _add_statements(self.execution_role, execution)
        if data_key is not None:
            data_key.grant_decrypt(self.execution_role)

        # -- pipeline role -------------------------------------------------------------------
        jobs = f"arn:{partition}:sagemaker:{region}:{account}:training-job/pipelines-*"
        pipeline_policy = _add_statements(
            self.pipeline_role,
            [
                {
                    "Effect": "Allow",
                    "Action": [
                        "sagemaker:CreateTrainingJob",
                        "sagemaker:DescribeTrainingJob",
                        "sagemaker:StopTrainingJob",
                        "sagemaker:AddTags",
                    ],
                    "Resource": jobs,
                },
                # What execution_role.grant_pass_role(pipeline_role) adds.
                {"Effect": "Allow", "Action": "iam:PassRole", "Resource": self.execution_role.role_arn},
            ],
        )
        self._acknowledge(execution_policy, pipeline_policy, object_arns)

    @staticmethod
    def read_s3_statements(uri: str, partition: str) -> tuple[list[dict], str]:
        """Read one S3 prefix (plain IAM JSON): GetObject under it, ListBucket limited to it; and the object ARN."""
        bucket, prefix = split_s3_uri(uri)
        arn = f"arn:{partition}:s3:::{bucket}/{prefix}*"
        return [
            {"Effect": "Allow", "Action": "s3:GetObject", "Resource": arn},
            {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:{partition}:s3:::{bucket}",
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
            },
        ], arn

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
            late = LateAcknowledgements()
            late.add(policy, arn, f"Objects under one prefix: {what}, named by the trainer")
            policy.node.add_validation(late)

    def _acknowledge(self, execution_policy: Construct, pipeline_policy: Construct, object_arns: list[tuple[str, str]]) -> None:
        """cdk-nag acknowledgements, each with its exact finding ID: one call per policy, plus
        one validation that names the object ARNs (they hold tokens until synth)."""
        late = LateAcknowledgements()
        for arn, what in object_arns:
            late.add(execution_policy, arn, f"Objects under one prefix: {what}, named by the trainer")
        execution_policy.node.add_validation(late)
        acknowledge_all(execution_policy, [
            ("AwsSolutions-IAM5[Resource::*]",
             "ecr:GetAuthorizationToken and cloudwatch:PutMetricData have no resource-level permissions; "
             "PutMetricData is limited by a cloudwatch:namespace condition"),
            (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:{TRAINING_LOG_GROUP}:*]",
             "SageMaker names each training job's log streams after the generated job name"),
            (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:{TRAINING_LOG_GROUP}:log-stream:*]",
             "SageMaker names each training job's log streams after the generated job name"),
        ])
        acknowledge_all(pipeline_policy, [(
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>:training-job/pipelines-*]",
            "A pipeline names its training jobs pipelines-<execution>-<step>-<suffix> at run time",
        )])


def _add_statements(role: iam.Role, statements: list[dict]) -> Construct:
    """Add plain-JSON statements to the role's default policy (created by the first); return that policy."""
    first, *rest = [iam.PolicyStatement.from_json(s) for s in statements]
    role.add_to_principal_policy(first)
    policy = role.node.find_child("DefaultPolicy")
    if rest:
        policy.add_statements(*rest)
    return policy
