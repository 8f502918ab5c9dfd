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

Synth speed: a platform repo has a role pair per recipe, and every aws-cdk-lib call is a
jsii round trip. So the roles are ``CfnRole`` and ``CfnPolicy`` at the construct paths
the L2 ``iam.Role`` and its default policy would use (``ExecutionRole/Resource``,
``ExecutionRole/DefaultPolicy/Resource``: the same logical IDs and policy names), with
policy documents written as plain IAM JSON and merged the way CDK's
``@aws-cdk/aws-iam:minimizePolicies`` merges grants (:func:`minimize_statements`).
``execution_role`` and ``pipeline_role`` are ``iam.IRole`` views of them, made on first
use, so grants to them still work (as extra policies on the role).
"""

from __future__ import annotations

import re

from typing import Any

from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from .checkpoint_store import CheckpointStore, checkpoint_prefix, output_prefix
from .image import TrainingImage
from ._scope import add_check, env_of, logical_id, path_in_stack, remember_stack, stack_of
from .nag import LateAcknowledgements

SAGEMAKER = "sagemaker.amazonaws.com"
TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
S3_URI = re.compile(r"^s3://(?P<bucket>[^/]+)/?(?P<prefix>.*)$")


# What the trainer's MLflow client calls (training/tracking.py): experiments, runs, params,
# metrics and tags. IAM service prefix sagemaker-mlflow (Service Authorization Reference,
# "Actions, resources, and condition keys for Amazon SageMaker with MLflow"); each is
# scoped to the mlflow-tracking-server resource.
MLFLOW_TRACKING_ACTIONS = [
    "sagemaker-mlflow:CreateExperiment",
    "sagemaker-mlflow:GetExperiment",
    "sagemaker-mlflow:GetExperimentByName",
    "sagemaker-mlflow:SearchExperiments",
    "sagemaker-mlflow:CreateRun",
    "sagemaker-mlflow:GetRun",
    "sagemaker-mlflow:SearchRuns",
    "sagemaker-mlflow:UpdateRun",
    "sagemaker-mlflow:LogBatch",
    "sagemaker-mlflow:LogMetric",
    "sagemaker-mlflow:LogParam",
    "sagemaker-mlflow:SetTag",
    "sagemaker-mlflow:GetMetricHistory",
]


def mlflow_tracking_statement(server_arn: str) -> dict:
    """The execution role's access to one MLflow tracking server, and to nothing else."""
    return {"Effect": "Allow", "Action": list(MLFLOW_TRACKING_ACTIONS), "Resource": server_arn}


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
    - ``mlflow_tracking_server_arn``: a SageMaker MLflow tracking server the jobs log to;
      default none (see :func:`mlflow_tracking_statement`).
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
        mlflow_tracking_server_arn: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = stack_of(scope)
        remember_stack(self, stack, scope, construct_id)
        self.recipe_name = recipe_name
        self._imports: dict[str, iam.IRole] = {}
        partition, region, account = env_of(stack)
        trust = {
            "Statement": [
                {
                    "Action": "sts:AssumeRole",
                    "Condition": {"StringEquals": {"aws:SourceAccount": account}},
                    "Effect": "Allow",
                    "Principal": {"Service": SAGEMAKER},
                }
            ],
            "Version": "2012-10-17",
        }
        execution_scope = Construct(self, "ExecutionRole")
        self.execution_role_resource = iam.CfnRole(
            execution_scope, "Resource", assume_role_policy_document=trust,
            description=f"SageMaker training jobs of recipe {recipe_name}",
        )
        pipeline_scope = Construct(self, "PipelineRole")
        self.pipeline_role_resource = iam.CfnRole(
            pipeline_scope, "Resource", assume_role_policy_document=trust,
            description=f"SageMaker pipeline of recipe {recipe_name}",
        )
        self.execution_role_arn: str = self.execution_role_resource.attr_arn
        self.pipeline_role_arn: str = self.pipeline_role_resource.attr_arn

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
        if mlflow_tracking_server_arn:
            execution.append(mlflow_tracking_statement(mlflow_tracking_server_arn))
        if data_key is not None:
            # What data_key.grant_decrypt(role) adds to the role's policy.
            execution.append({"Effect": "Allow", "Action": "kms:Decrypt", "Resource": data_key.key_arn})
        path = path_in_stack(self)
        execution_policy = _default_policy(execution_scope, self.execution_role_resource, execution,
                                           None if path is None else [*path, "ExecutionRole"])

        # -- pipeline role -------------------------------------------------------------------
        jobs = f"arn:{partition}:sagemaker:{region}:{account}:training-job/pipelines-*"
        pipeline_policy = _default_policy(
            pipeline_scope,
            self.pipeline_role_resource,
            role_path=None if path is None else [*path, "PipelineRole"],
            statements=[
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
                {"Effect": "Allow", "Action": "iam:PassRole", "Resource": self.execution_role_arn},
            ],
        )
        self.execution_policy_resource = execution_policy
        self.pipeline_policy_resource = pipeline_policy
        self._acknowledge(object_arns)

    # -- the roles as IRole (made on first use) -------------------------------------------

    def _imported(self, key: str, resource: iam.CfnRole) -> iam.IRole:
        if key not in self._imports:
            # Ref of an AWS::IAM::Role is its name; a mutable import takes grants as extra policies.
            self._imports[key] = iam.Role.from_role_name(self, f"{key}View", resource.ref, mutable=True)
        return self._imports[key]

    @property
    def execution_role(self) -> iam.IRole:
        """The execution role as an ``IRole`` (grantable; grants become extra policies on it)."""
        return self._imported("ExecutionRole", self.execution_role_resource)

    @property
    def pipeline_role(self) -> iam.IRole:
        """The pipeline role as an ``IRole`` (grantable; grants become extra policies on it)."""
        return self._imported("PipelineRole", self.pipeline_role_resource)

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
        partition = env_of(stack_of(self))[0]
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
        view = self._imports.get("ExecutionRole")
        policy = view.node.try_find_child("Policy") if view is not None and grantee is view else None
        if policy is not None:
            late = LateAcknowledgements()
            late.add(policy, arn, f"Objects under one prefix: {what}, named by the trainer")
            add_check(self, late.validate)

    def _acknowledge(self, object_arns: list[tuple[str, str]]) -> None:
        """cdk-nag acknowledgements, each with its exact finding ID. The object ARNs hold tokens
        until synth, so all are recorded at validation, in one call on this construct (an
        acknowledgement covers the construct's children: here the two default policies)."""
        late = LateAcknowledgements(stack_of(self))
        for arn, what in object_arns:
            late.add(self, arn, f"Objects under one prefix: {what}, named by the trainer")
        for rule, reason in [
            ("AwsSolutions-IAM5[Resource::*]",
             "ecr:GetAuthorizationToken and cloudwatch:PutMetricData have no resource-level permissions; "
             "PutMetricData is limited by a cloudwatch:namespace condition"),
            (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:{TRAINING_LOG_GROUP}:*]",
             "SageMaker names each training job's log streams after the generated job name"),
            (f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:{TRAINING_LOG_GROUP}:log-stream:*]",
             "SageMaker names each training job's log streams after the generated job name"),
        ]:
            late.add_rule(self, rule, reason)
        late.add_rule(
            self,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>:training-job/pipelines-*]",
            "A pipeline names its training jobs pipelines-<execution>-<step>-<suffix> at run time",
        )
        add_check(self, late.validate)


def _default_policy(
    role_scope: Construct, role: iam.CfnRole, statements: list[dict], role_path: list[str] | None = None
) -> iam.CfnPolicy:
    """The role's ``DefaultPolicy`` (as ``iam.Role`` would make it): the statements, minimized.

    iam.Policy names itself after its resource's logical ID: computed here when the role's
    path in its stack is known, else the logical ID token (resolved at synth)."""
    known = role_path is not None
    policy = iam.CfnPolicy(
        Construct(role_scope, "DefaultPolicy"),
        "Resource",
        policy_document={"Statement": minimize_statements(statements), "Version": "2012-10-17"},
        policy_name=logical_id([*role_path, "DefaultPolicy", "Resource"])[-128:] if known else "placeholder",
        roles=[role.ref],
    )
    if not known:
        policy.policy_name = policy.logical_id
    return policy


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _render(values: list) -> Any:
    """CDK's rendering of Action and Resource: unique, sorted, a scalar when there is one."""
    unique = sorted(set(values))
    return unique[0] if len(unique) == 1 else unique


def minimize_statements(statements: list[dict]) -> list[dict]:
    """Merge statements as CDK does with ``@aws-cdk/aws-iam:minimizePolicies``.

    Two statements with the same Effect, Principal and Condition merge when their actions
    are the same (the resources are unioned) or their resources are the same (the actions
    are unioned); repeated until nothing merges, each merge kept at the earlier statement.
    Actions and resources are then sorted (tokens by their encoded string, as CDK sorts them).
    """
    work = [
        {
            "Effect": s.get("Effect", "Allow"),
            "Action": set(_as_list(s["Action"])),
            "Resource": set(_as_list(s["Resource"])),
            "Condition": s.get("Condition"),
            "Principal": s.get("Principal"),
        }
        for s in statements
    ]
    merged = True
    while merged:
        merged = False
        for i in range(len(work)):
            for j in range(i + 1, len(work)):
                a, b = work[i], work[j]
                if (a["Effect"], a["Condition"], a["Principal"]) != (b["Effect"], b["Condition"], b["Principal"]):
                    continue
                if a["Action"] == b["Action"]:
                    a["Resource"] |= b["Resource"]
                elif a["Resource"] == b["Resource"]:
                    a["Action"] |= b["Action"]
                else:
                    continue
                del work[j]
                merged = True
                break
            if merged:
                break
    out = []
    for s in work:
        rendered: dict[str, Any] = {"Action": _render(list(s["Action"]))}
        if s["Condition"] is not None:
            rendered["Condition"] = s["Condition"]
        rendered["Effect"] = s["Effect"]
        if s["Principal"] is not None:
            rendered["Principal"] = s["Principal"]
        rendered["Resource"] = _render(list(s["Resource"]))
        out.append(rendered)
    return out
