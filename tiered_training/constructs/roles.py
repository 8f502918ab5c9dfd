"""TrainingRoles: the SageMaker execution role and the pipeline role, least privilege.

Execution role (the training jobs assume it):
  - read the recipe's data prefixes (``data.allowed_uris``, default ``[data.uri]``: what
    the ``DataUri`` pipeline parameter may name) and its init checkpoint;
  - decrypt with the data's KMS key, when there is one (``data.kms_key_arn``), through S3 only;
  - read and write this recipe's checkpoint and output prefixes only (delete under
    checkpoints only), and use the store's key through S3 and SageMaker to read, write and
    encrypt the job's output;
  - pull the training image;
  - write to the training-job log group and SageMaker's training metric namespace;
  - log to the recipe's SageMaker MLflow tracking server, when it names one;
  - in a VPC, create and delete the network interfaces that attach the jobs to it.

Pipeline role (the SageMaker pipeline assumes it):
  - create, describe and stop training jobs named ``pipelines-*`` (the names a
    pipeline generates), and tag them at creation;
  - with a training plan (``compute.training_plan_arn``), create them on that plan and its
    reserved capacity (``training-plan`` and ``reserved-capacity`` are resource types of
    CreateTrainingJob in the Service Authorization Reference:
    https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonsagemaker.html);
  - pass the execution role, to SageMaker only.

Both are ``iam.Role`` with grants. Either may be given as an ``IRole`` of your own; the
grants then go to it (an imported role needs ``mutable=True`` to take them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache

import jsii
from aws_cdk import ArnFormat, Aws, Stack, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from tiered_training.constructs.checkpoint_store import CheckpointStore, via_services
from tiered_training.constructs.image import TrainingImage
from tiered_training.constructs.nag import LateAcknowledgements
from tiered_training.contract.container import LOG_GROUP

SAGEMAKER = "sagemaker.amazonaws.com"
TRAINING_LOG_GROUP = LOG_GROUP
S3_URI = re.compile(r"^s3://(?P<bucket>[^/]+)/?(?P<prefix>.*)$")
PROCESSING_LOG_GROUP = "/aws/sagemaker/ProcessingJobs"
PROCESSING_JOB_ACTIONS = [
    "sagemaker:CreateProcessingJob",
    "sagemaker:DescribeProcessingJob",
    "sagemaker:StopProcessingJob",
    "sagemaker:AddTags",
]
TRAINING_JOB_ACTIONS = [
    "sagemaker:CreateTrainingJob",
    "sagemaker:DescribeTrainingJob",
    "sagemaker:StopTrainingJob",
    "sagemaker:AddTags",
]
# CreateTrainingJob with a VpcConfig: what the execution role needs (SageMaker Developer Guide,
# "CreateTrainingJob API: Execution Role Permissions"). The Describe actions have no
# resource-level permissions; the others are limited to the VPC's subnets, security groups
# and network interfaces.
VPC_DESCRIBE_ACTIONS = [
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVpcs",
    "ec2:DescribeDhcpOptions",
    "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
]
VPC_INTERFACE_ACTIONS = [
    "ec2:CreateNetworkInterfacePermission",
    "ec2:DeleteNetworkInterface",
    "ec2:DeleteNetworkInterfacePermission",
]

# What the trainer's MLflow client calls (training/components/tracking.py): experiments, runs, params,
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


def reserved_capacity_arns(training_plan_arn: str) -> str:
    """The reserved capacities of a training plan's account and region (their IDs are SageMaker's)."""
    if Token.is_unresolved(training_plan_arn) or ":training-plan/" not in training_plan_arn:
        return f"arn:{Aws.PARTITION}:sagemaker:{Aws.REGION}:{Aws.ACCOUNT_ID}:reserved-capacity/*"
    head = training_plan_arn.split(":training-plan/", 1)[0]
    return f"{head}:reserved-capacity/*"


def grant_mlflow_tracking(grantee: iam.IGrantable, server_arn: str) -> iam.Grant:
    """Log to one MLflow tracking server, and to nothing else."""
    return iam.Grant.add_to_principal(grantee=grantee, actions=MLFLOW_TRACKING_ACTIONS, resource_arns=[server_arn])


@jsii.implements(iam.IPrincipal)
class _PolicyPrincipal:
    """A managed policy as the principal of a grant: the grant's statements go into the policy."""

    def __init__(self, policy: iam.ManagedPolicy) -> None:
        self.policy = policy

    @property
    def grant_principal(self) -> iam.IPrincipal:
        return self

    @property
    def assume_role_action(self) -> str:
        return "sts:AssumeRole"

    @property
    def policy_fragment(self) -> iam.PrincipalPolicyFragment:
        raise TypeError("a managed policy is not a principal: attach it to a role, user or group")

    @property
    def principal_account(self) -> str | None:
        return None

    def add_to_policy(self, statement: iam.PolicyStatement) -> bool:
        return self.add_to_principal_policy(statement).statement_added

    def add_to_principal_policy(self, statement: iam.PolicyStatement) -> iam.AddToPrincipalPolicyResult:
        self.policy.add_statements(statement)
        return iam.AddToPrincipalPolicyResult(statement_added=True, policy_dependable=self.policy)


@jsii.implements(iam.IGrantable)
class PolicyGrantee:
    """Grant to an ``iam.ManagedPolicy``: ``pipeline.grant_operate(PolicyGrantee(policy))`` fills the
    policy, which the team attaches to its operators' roles, users or groups."""

    def __init__(self, policy: iam.ManagedPolicy) -> None:
        self.policy = policy
        self._principal = _PolicyPrincipal(policy)

    @property
    def grant_principal(self) -> iam.IPrincipal:
        return self._principal


def as_grantee(grantee: iam.IGrantable | iam.ManagedPolicy) -> iam.IGrantable:
    """A grantee, or a managed policy made one (:class:`PolicyGrantee`)."""
    return PolicyGrantee(grantee) if isinstance(grantee, iam.ManagedPolicy) else grantee


def split_s3_uri(uri: str) -> tuple[str, str]:
    match = S3_URI.match(uri)
    if not match:
        raise ValueError(f"not an S3 URI: {uri!r}")
    return match["bucket"], match["prefix"]


def prefix_arns(uri: str) -> tuple[list[str], str, list[str]]:
    """``(object ARNs, bucket ARN, s3:prefix patterns)`` for reading an S3 prefix by whole path
    segments, as ``DataSection.allows`` reads it: ``s3://b/tokens`` covers the object
    ``tokens`` and everything under ``tokens/``, not ``tokens-v2/...``. Listing may also
    name the prefix as written, as SageMaker does for an S3Uri without a trailing slash.
    The first object ARN is the wildcard one."""
    bucket, prefix = split_s3_uri(uri)
    partition = _partition()
    segment = prefix if prefix == "" or prefix.endswith("/") else prefix + "/"
    objects = [f"arn:{partition}:s3:::{bucket}/{segment}*"]
    patterns = [f"{segment}*"] if prefix else []
    if prefix != segment:
        objects.append(f"arn:{partition}:s3:::{bucket}/{prefix}")
        patterns.append(prefix)
    return objects, f"arn:{partition}:s3:::{bucket}", patterns


@cache
def _partition() -> str:
    return Aws.PARTITION


def grant_read_prefix(grantee: iam.IGrantable, uri: str) -> iam.Grant:
    """Read one S3 prefix: GetObject under it, ListBucket limited to it."""
    objects, bucket_arn, patterns = prefix_arns(uri)
    grant = iam.Grant.add_to_principal(grantee=grantee, actions=["s3:GetObject"], resource_arns=objects)
    listing = iam.Grant.add_to_principal(
        grantee=grantee,
        actions=["s3:ListBucket"],
        resource_arns=[bucket_arn],
        conditions={"StringLike": {"s3:prefix": patterns}} if patterns else None,
    )
    return grant.combine(listing)


def network_interface_arns(
    scope: Construct, subnets: Sequence[ec2.ISubnet], security_groups: Sequence[ec2.ISecurityGroup]
) -> tuple[list[str], str]:
    """``(subnet and security-group ARNs, network-interface ARN pattern)`` in ``scope``'s stack."""
    stack = Stack.of(scope)
    arns = [stack.format_arn(service="ec2", resource="subnet", resource_name=s.subnet_id) for s in subnets]
    arns += [
        stack.format_arn(service="ec2", resource="security-group", resource_name=g.security_group_id)
        for g in security_groups
    ]
    return arns, stack.format_arn(service="ec2", resource="network-interface", resource_name="*")


def grant_network_interfaces(
    grantee: iam.IGrantable,
    scope: Construct,
    *,
    vpc: ec2.IVpc,
    subnets: Sequence[ec2.ISubnet],
    security_groups: Sequence[ec2.ISecurityGroup],
) -> iam.Grant:
    """What SageMaker needs to attach training jobs to ``subnets`` with ``security_groups``."""
    resources, interfaces = network_interface_arns(scope, subnets, security_groups)
    describe = iam.Grant.add_to_principal(grantee=grantee, actions=VPC_DESCRIBE_ACTIONS, resource_arns=["*"])
    create = iam.Grant.add_to_principal(
        grantee=grantee, actions=["ec2:CreateNetworkInterface"], resource_arns=[*resources, interfaces]
    )
    manage = iam.Grant.add_to_principal(
        grantee=grantee,
        actions=VPC_INTERFACE_ACTIONS,
        resource_arns=[interfaces],
        conditions={"ArnEquals": {"ec2:Vpc": vpc.vpc_arn}},
    )
    return describe.combine(create).combine(manage)


def grant_job_logs(stack: Stack, grantee: iam.IRole, late: LateAcknowledgements, log_group: str, jobs: str) -> None:
    """Let SageMaker's ``jobs`` (training, processing) jobs of ``grantee`` write their log streams in ``log_group``."""
    logs = stack.format_arn(
        service="logs",
        resource="log-group",
        resource_name=log_group,
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )
    iam.Grant.add_to_principal(
        grantee=grantee,
        actions=["logs:CreateLogStream", "logs:PutLogEvents"],
        resource_arns=[f"{logs}:log-stream:*"],
    )
    # CreateLogGroup is authorized on the group's own ARN (log-group:<name>, no ":*"), as the managed
    # policy AmazonSageMakerFullAccess grants it on log-group:/aws/sagemaker/*; the group is created
    # by the first job in a region that writes to it.
    iam.Grant.add_to_principal(grantee=grantee, actions=["logs:CreateLogGroup"], resource_arns=[logs])
    iam.Grant.add_to_principal(grantee=grantee, actions=["logs:DescribeLogStreams"], resource_arns=[f"{logs}:*"])
    for arn in (f"{logs}:log-stream:*", f"{logs}:*"):
        late.add(grantee, arn, f"SageMaker names each {jobs} job's log streams after the generated job name")


class TrainingRoles(Construct):
    """The two roles of one recipe's pipeline.

    Props:

    - ``recipe_name``: names the store prefixes this recipe may write.
    - ``store``: the CheckpointStore.
    - ``image``: the TrainingImage (pull access).
    - ``data_uris``: S3 prefixes the jobs may read (the recipe's data prefixes and init checkpoint).
    - ``data_key``: the KMS key that encrypts the data (decrypt access); default none.
    - ``mlflow_tracking_server_arn``: a SageMaker MLflow tracking server the jobs log to; default none.
    - ``training_plan_arn``: a SageMaker training plan the jobs run on; default none.
    - ``vpc``, ``subnets``, ``security_groups``: the network the jobs run in; default none.
    - ``execution_role``: default a new role that SageMaker may assume from this account.
    - ``pipeline_role``: default a new role that SageMaker may assume from this account.
    - ``raw_uris``: S3 prefixes of raw examples that a Prepare job packs (task sft with ``data.prepare``); with
      ``tokenizer_uri`` (the init checkpoint), a third role, ``prepare_role``, for that job. Default none.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        recipe_name: str,
        store: CheckpointStore,
        image: TrainingImage,
        data_uris: Sequence[str],
        data_key: kms.IKey | None = None,
        mlflow_tracking_server_arn: str | None = None,
        training_plan_arn: str | None = None,
        vpc: ec2.IVpc | None = None,
        subnets: Sequence[ec2.ISubnet] = (),
        security_groups: Sequence[ec2.ISecurityGroup] = (),
        execution_role: iam.IRole | None = None,
        pipeline_role: iam.IRole | None = None,
        raw_uris: Sequence[str] = (),
        tokenizer_uri: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.recipe_name = recipe_name
        stack = Stack.of(self)
        sagemaker = iam.ServicePrincipal(SAGEMAKER, conditions={"StringEquals": {"aws:SourceAccount": stack.account}})
        self.execution_role: iam.IRole = execution_role or iam.Role(
            self, "ExecutionRole", assumed_by=sagemaker, description=f"SageMaker training jobs of recipe {recipe_name}"
        )
        self.pipeline_role: iam.IRole = pipeline_role or iam.Role(
            self, "PipelineRole", assumed_by=sagemaker, description=f"SageMaker pipeline of recipe {recipe_name}"
        )
        late = LateAcknowledgements()
        execution, pipeline = self.execution_role, self.pipeline_role

        # -- execution role ------------------------------------------------------------------
        for uri in data_uris:
            grant_read_prefix(execution, uri)
            late.add(
                execution,
                prefix_arns(uri)[0][0],
                f"Objects under {uri}: the training data or checkpoint, many objects named by the trainer",
            )
        if data_key is not None:
            iam.Grant.add_to_principal(
                grantee=execution,
                actions=["kms:Decrypt"],
                resource_arns=[data_key.key_arn],
                conditions=via_services("s3", key_arn=data_key.key_arn),
            )
        store.grant_recipe_read_write(execution, recipe_name)
        for arn in store.recipe_object_arns(recipe_name):
            late.add(
                execution, arn, "Objects under this recipe's own checkpoint or output prefix, named by the trainer"
            )
        image.grant_pull(execution)
        grant_job_logs(stack, execution, late, TRAINING_LOG_GROUP, "training")
        # cloudwatch:PutMetricData has no resource-level permissions (IAM requires Resource "*");
        # the condition limits it to SageMaker's training-job namespace.
        iam.Grant.add_to_principal(
            grantee=execution,
            actions=["cloudwatch:PutMetricData"],
            resource_arns=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": TRAINING_LOG_GROUP}},
        )
        if mlflow_tracking_server_arn:
            grant_mlflow_tracking(execution, mlflow_tracking_server_arn)
        star_reason = (
            "ecr:GetAuthorizationToken and cloudwatch:PutMetricData have no resource-level permissions; "
            "PutMetricData is limited by a cloudwatch:namespace condition"
        )
        if vpc is not None:
            grant_network_interfaces(execution, self, vpc=vpc, subnets=subnets, security_groups=security_groups)
            late.add(
                execution,
                network_interface_arns(self, (), ())[1],
                "SageMaker creates the training jobs' network interfaces (IDs unknown before); "
                "deleting and sharing them is limited to this VPC by an ec2:Vpc condition",
            )
            star_reason += "; nor do the ec2:Describe* actions SageMaker needs to place jobs in a VPC"
        late.add_rule(execution, "AwsSolutions-IAM5[Resource::*]", star_reason)

        # -- pipeline role -------------------------------------------------------------------
        jobs = stack.format_arn(service="sagemaker", resource="training-job", resource_name="pipelines-*")
        iam.Grant.add_to_principal(grantee=pipeline, actions=TRAINING_JOB_ACTIONS, resource_arns=[jobs])
        late.add(pipeline, jobs, "A pipeline names its training jobs pipelines-<execution>-<step>-<suffix> at run time")
        if training_plan_arn:
            self.grant_training_plan(pipeline, training_plan_arn)
            late.add(
                pipeline,
                reserved_capacity_arns(training_plan_arn),
                "SageMaker names a training plan's reserved capacities",
            )
        self.grant_pass_execution_role(pipeline)

        # -- prepare role (raw data): read the raw examples and the tokenizer, write the prepared shards ------
        self.prepare_role: iam.IRole | None = None
        if raw_uris and tokenizer_uri:
            prepare = iam.Role(
                self, "PrepareRole", assumed_by=sagemaker, description=f"SageMaker Prepare job of recipe {recipe_name}"
            )
            self.prepare_role = prepare
            for uri in [*raw_uris, tokenizer_uri]:
                grant_read_prefix(prepare, uri)
                late.add(prepare, prefix_arns(uri)[0][0], f"Objects under {uri}: the raw examples or the tokenizer")
            if data_key is not None:
                iam.Grant.add_to_principal(
                    grantee=prepare,
                    actions=["kms:Decrypt"],
                    resource_arns=[data_key.key_arn],
                    conditions=via_services("s3", key_arn=data_key.key_arn),
                )
            store.grant_prepare(prepare, recipe_name)
            for arn in store.prepare_object_arns(recipe_name):
                late.add(prepare, arn, "Objects under this recipe's prepared data, one prefix per content key")
            image.grant_pull(prepare)
            grant_job_logs(stack, prepare, late, PROCESSING_LOG_GROUP, "processing")
            prepare_star = "ecr:GetAuthorizationToken has no resource-level permissions"
            if vpc is not None:
                grant_network_interfaces(prepare, self, vpc=vpc, subnets=subnets, security_groups=security_groups)
                late.add(
                    prepare,
                    network_interface_arns(self, (), ())[1],
                    "SageMaker creates the processing job's network interfaces (IDs unknown before); "
                    "deleting and sharing them is limited to this VPC by an ec2:Vpc condition",
                )
                prepare_star += "; nor do the ec2:Describe* actions SageMaker needs to place jobs in a VPC"
            late.add_rule(prepare, "AwsSolutions-IAM5[Resource::*]", prepare_star)
            processing_jobs = stack.format_arn(
                service="sagemaker", resource="processing-job", resource_name="pipelines-*"
            )
            iam.Grant.add_to_principal(
                grantee=pipeline, actions=PROCESSING_JOB_ACTIONS, resource_arns=[processing_jobs]
            )
            late.add(
                pipeline, processing_jobs, "A pipeline names its processing jobs pipelines-<execution>-<step>-<suffix>"
            )
            iam.Grant.add_to_principal(
                grantee=pipeline,
                actions=["iam:PassRole"],
                resource_arns=[prepare.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": SAGEMAKER}},
            )
        self.node.add_validation(late)

    @staticmethod
    def grant_training_plan(grantee: iam.IGrantable, training_plan_arn: str) -> iam.Grant:
        """Create training jobs on one training plan and its reserved capacity."""
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["sagemaker:CreateTrainingJob"],
            resource_arns=[training_plan_arn, reserved_capacity_arns(training_plan_arn)],
        )

    def grant_pass_execution_role(self, grantee: iam.IGrantable) -> iam.Grant:
        """Pass the execution role, to SageMaker only (``iam:PassedToService``)."""
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["iam:PassRole"],
            resource_arns=[self.execution_role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": SAGEMAKER}},
        )
