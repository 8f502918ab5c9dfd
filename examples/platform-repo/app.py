#!/usr/bin/env python3
"""A platform repository's CDK app: tiered-training's constructs in a stack of the team's own.

The stack already holds what a platform team has: a VPC, a checkpoint bucket with its
KMS key, the role that training jobs run as, and an alarm topic. Each recipe in
``recipes/`` adds a SageMaker pipeline on them, its alarms and dashboard, and a weekly
EventBridge Scheduler run that probes the recipe for a few hundred steps.

    pip install "tiered-training[cdk]"
    cdk synth                  # or: python app.py (templates in cdk.out/)

cdk-nag (AwsSolutions) checks the whole app at synth; a finding fails it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from aws_cdk import Acknowledgment, App, Duration, RemovalPolicy, Stack, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from aws_cdk import aws_sns as sns
from cdk_nag import AwsSolutionsChecks
from constructs import Construct

from tiered_training.constructs import TrainingImage, TrainingMonitoring, TrainingPipeline, load_plans
from tiered_training.constructs.app import RecipeProblems
from tiered_training.pipeline.definition import P_MAX_STEPS

RECIPES = Path(__file__).parent / "recipes"
# The weekly short run's parameters. No RunId: each execution is a new run with a prefix of its own
# (runs/<execution id>/), so it never resumes, writes or prunes a production run's checkpoints.
WEEKLY_PARAMETERS = {P_MAX_STEPS: "200"}


class TrainingStack(Stack):
    """The team's training stack: its own network, bucket, key, role and topic, and one pipeline per recipe."""

    def __init__(self, scope: Construct, construct_id: str, *, plans: list, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)

        # -- what the team already has --------------------------------------------------------
        vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=1,  # the jobs pull the image from ECR and write logs through it
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC),
                ec2.SubnetConfiguration(name="training", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            ],
            # Checkpoints and data stay on the AWS network.
            gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
            flow_logs={"FlowLogs": ec2.FlowLogOptions(destination=ec2.FlowLogDestination.to_cloud_watch_logs())},
        )
        key = kms.Key(self, "CheckpointKey", enable_key_rotation=True, description="training checkpoints")
        access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            removal_policy=RemovalPolicy.RETAIN,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(365))],
        )
        Validations.of(access_logs).acknowledge(
            Acknowledgment(
                id="AwsSolutions-S1",
                reason="This bucket receives the checkpoint bucket's access logs; logging it into itself would loop.",
            )
        )
        bucket = s3.Bucket(
            self,
            "Checkpoints",
            encryption=s3.BucketEncryption.KMS,
            encryption_key=key,
            bucket_key_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            server_access_logs_bucket=access_logs,
            removal_policy=RemovalPolicy.RETAIN,
        )
        role = iam.Role(
            self,
            "TrainingJobRole",
            # SageMaker of this account only (the confused-deputy guard).
            assumed_by=iam.ServicePrincipal(
                "sagemaker.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": self.account}}
            ),
            description="SageMaker training jobs of the team's recipes",
        )
        # TrainingMonitoring adds to this topic's policy, and to its key's, what its alarms and
        # failed-execution rule need: publish and encrypt, for those alarms and that rule only.
        alarm_key = kms.Key(self, "AlarmKey", enable_key_rotation=True, description="training alarms")
        topic = sns.Topic(self, "Alarms", master_key=alarm_key, enforce_ssl=True)

        # The team's operators: attach this policy to their role, group or users. Each recipe's
        # grant_operate adds what the tiered-training commands (start, status, logs, stop,
        # preflight, prices) call for that recipe, and nothing more.
        operators = iam.ManagedPolicy(
            self, "Operators", description="Run the tiered-training commands on the team's recipes"
        )

        # -- tiered-training --------------------------------------------------------------------
        image = TrainingImage(self, "Image")  # the container that ships with the package, built at deploy
        for plan in plans:
            recipe = Construct(self, plan.name)
            pipeline = TrainingPipeline(
                recipe,
                "Pipeline",
                plan=plan,
                image=image,
                bucket=bucket,
                encryption_key=key,
                execution_role=role,
                vpc=vpc,
                vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            )
            pipeline.grant_operate(operators)
            TrainingMonitoring(recipe, "Monitoring", pipeline=pipeline, topic=topic)
            scheduler.Schedule(
                recipe,
                "WeeklyProbe",
                description=f"A short run of {plan.name} every Monday: probe, gate and 200 steps",
                schedule=scheduler.ScheduleExpression.cron(minute="0", hour="6", week_day="MON"),
                target=targets.SageMakerStartPipelineExecution(
                    pipeline,
                    pipeline_parameter_list=[targets.SageMakerPipelineParameter(name=name, value=value)
                                             for name, value in WEEKLY_PARAMETERS.items()],
                ),
            )


def main() -> int:
    app = App()
    try:
        plans = load_plans(app.node.try_get_context("recipes") or RECIPES)
    except RecipeProblems as problems:
        print(problems, file=sys.stderr)
        return 2
    TrainingStack(app, "MlTraining", plans=plans, description="The team's training pipelines")
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
