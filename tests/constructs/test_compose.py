"""Composing the constructs with things of one's own: roles, a bucket, an image, an IPipeline.

The full composition (a VPC, a bucket and key, a role, a topic and an EventBridge Scheduler
trigger, synthesised from the installed wheel) is examples/platform-repo, checked in
tests/test_packaging.py. These are the small cases around it.
"""

from __future__ import annotations

import json

import pytest
from cdk_helpers import pipeline_definition, resources

ECR_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer:1.0"


@pytest.fixture(scope="module")
def composed(plans, tmp_path_factory):
    """One stack: an imported role for each of the two roles, an existing bucket, an ECR repository and tag."""
    from aws_cdk import App, Stack, assertions
    from aws_cdk import aws_ecr as ecr
    from aws_cdk import aws_iam as iam
    from aws_cdk import aws_s3 as s3
    from aws_cdk import aws_sagemaker as sagemaker

    from tiered_training.constructs import TrainingImage, TrainingPipeline

    stack = Stack(App(outdir=str(tmp_path_factory.mktemp("composed"))), "Composed")
    repository = ecr.Repository.from_repository_name(stack, "Repo", "ml/trainer")
    image = TrainingImage(stack, "Image", repository=repository, tag="2026-11-01")
    execution = iam.Role.from_role_arn(stack, "Execution", "arn:aws:iam::123456789012:role/team-training", mutable=True)
    pipeline_role = iam.Role.from_role_arn(stack, "PipelineRole", "arn:aws:iam::123456789012:role/team-pipelines", mutable=True)
    bucket = s3.Bucket.from_bucket_name(stack, "Bucket", "team-checkpoints")
    pipeline = TrainingPipeline(
        stack, "Pipeline", plan=plans["llama3-1b-bf16"], image=image, bucket=bucket,
        execution_role=execution, pipeline_role=pipeline_role,
    )
    interface: sagemaker.IPipeline = pipeline  # what EventBridge Scheduler and others take
    return pipeline, interface, assertions.Template.from_stack(stack).to_json()


def test_roles_of_ones_own_take_the_grants(composed):
    _pipeline, _interface, template = composed
    assert not resources(template, "AWS::IAM::Role")
    policies = list(resources(template, "AWS::IAM::Policy").values())
    by_role = {json.dumps(p["Properties"]["Roles"]): json.dumps(p["Properties"]["PolicyDocument"]) for p in policies}
    assert set(by_role) == {'["team-training"]', '["team-pipelines"]'}
    assert "team-checkpoints/llama3-1b-bf16/checkpoints/*" in by_role['["team-training"]']
    assert "repository/ml/trainer" in by_role['["team-training"]']
    passed = by_role['["team-pipelines"]']
    assert "iam:PassRole" in passed and "role/team-training" in passed and "iam:PassedToService" in passed


def test_the_pipeline_runs_as_those_roles_with_the_repository_image(composed):
    _pipeline, _interface, template = composed
    (cfn,) = resources(template, "AWS::SageMaker::Pipeline").values()
    assert cfn["Properties"]["RoleArn"] == "arn:aws:iam::123456789012:role/team-pipelines"
    text = json.dumps(pipeline_definition(template))
    assert "arn:aws:iam::123456789012:role/team-training" in text
    assert "ml/trainer:2026-11-01" in text
    assert "s3://team-checkpoints/llama3-1b-bf16/checkpoints/" in text


def test_the_pipeline_is_an_ipipeline(composed, tmp_path):
    from aws_cdk import App, Stack, assertions
    from aws_cdk import aws_iam as iam

    pipeline, interface, _template = composed
    assert interface.pipeline_name == "llama3-1b-bf16"
    assert pipeline.pipeline_ref.pipeline_name == "llama3-1b-bf16"
    stack = Stack(App(outdir=str(tmp_path)), "Starter")
    starter = iam.Role(stack, "Starter", assumed_by=iam.AccountRootPrincipal())
    assert interface.grant_start_pipeline_execution(starter).success
    (policy,) = resources(assertions.Template.from_stack(stack).to_json(), "AWS::IAM::Policy").values()
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Action"] == "sagemaker:StartPipelineExecution"
    assert ":pipeline/llama3-1b-bf16" in json.dumps(statement["Resource"])


def test_props_that_contradict_each_other_are_refused(plans):
    from aws_cdk import App, Stack
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk import aws_ecr as ecr
    from aws_cdk import aws_s3 as s3

    from tiered_training.constructs import CheckpointStore, TrainingImage, TrainingPipeline

    stack = Stack(App(), "Refused")
    repository = ecr.Repository.from_repository_name(stack, "Repo", "ml/trainer")
    with pytest.raises(ValueError, match="one of repository, asset and image_uri"):
        TrainingImage(stack, "Both", repository=repository, image_uri=ECR_IMAGE)
    with pytest.raises(ValueError, match="not an ECR image URI"):
        TrainingImage(stack, "NotEcr", image_uri="docker.io/library/python:3.12")
    image = TrainingImage(stack, "Image", image_uri=ECR_IMAGE)
    store = CheckpointStore(stack, "Store", bucket=s3.Bucket.from_bucket_name(stack, "B", "team-checkpoints"))
    plan = plans["llama3-1b-bf16"]
    with pytest.raises(ValueError, match="store, or bucket"):
        TrainingPipeline(stack, "P1", plan=plan, image=image, store=store, bucket=store.bucket)
    with pytest.raises(ValueError, match="need a vpc"):
        TrainingPipeline(stack, "P2", plan=plan, image=image, store=store,
                         vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED))
