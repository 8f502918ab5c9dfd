"""TrainingPipeline: the CfnPipeline, its embedded definition, validation at synth, grants."""

from __future__ import annotations

import pytest
from cdk_helpers import only, pipeline_definition, resources

from tiered_training.constructs.platform import stack_id
from tiered_training.pipeline import definition as d
from tiered_training.pipeline import validation


def test_one_pipeline_per_recipe_named_after_it(plans, templates):
    for name in plans:
        pipeline = only(templates[stack_id(name)], "AWS::SageMaker::Pipeline")
        props = pipeline["Properties"]
        assert props["PipelineName"] == name
        # Plain PascalCase dicts, not the camelCase the typed Property classes render.
        assert set(props["PipelineDefinition"]) == {"PipelineDefinitionBody"}
        assert props["ParallelismConfiguration"] == {"MaxParallelExecutionSteps": 1}
        assert "Fn::GetAtt" in props["RoleArn"]
        assert {"Key": "tiered-training:recipe", "Value": name} in props["Tags"]


def test_embedded_definition_is_valid(plans, templates):
    for name in plans:
        body = pipeline_definition(templates[stack_id(name)])
        assert validation.validate_definition(body) == [], name
        assert [p["Name"] for p in body["Parameters"]] == list(d.PARAMETERS)
        train = d.find_step(body, d.S_TRAIN)["Arguments"]
        # The role and bucket are deploy-time references, not literals.
        assert train["RoleArn"].startswith("TOKEN-")
        head, run_id, tail = train["CheckpointConfig"]["S3Uri"]["Std:Join"]["Values"]  # the run's own prefix
        assert head.startswith("s3://TOKEN-") and head.endswith(f"/{name}/checkpoints/runs/")
        assert run_id == {"Get": "Execution.PipelineExecutionId"} and tail == "/"


def test_spot_training_plan_and_tags_reach_the_train_step(templates):
    body = pipeline_definition(templates[stack_id("spot-variant")])
    train = d.find_step(body, d.S_TRAIN)["Arguments"]
    assert train["EnableManagedSpotTraining"] is True
    assert train["StoppingCondition"] == {"MaxRuntimeInSeconds": 36000, "MaxWaitTimeInSeconds": 108000}
    assert train["ResourceConfig"]["TrainingPlanArn"].endswith(":training-plan/p6-reserved")
    assert {"Key": "team", "Value": "research"} in train["Tags"]
    skip = next(p for p in body["Parameters"] if p["Name"] == d.P_SKIP_PROBE)
    assert skip["DefaultValue"] is True  # probe.enabled: false


def test_a_bad_training_argument_fails_synth_naming_the_field(plans, tmp_path):
    from tiered_training.constructs.app import build_app

    plan = plans["llama3-1b-bf16"]
    app, _platform, stacks = build_app([plan], nag=False, outdir=str(tmp_path))
    train = d.find_step(stacks[plan.name].pipeline.definition, d.S_TRAIN)
    train["Arguments"]["ResourceConfig"]["InstanceTyp"] = train["Arguments"]["ResourceConfig"].pop("InstanceType")
    with pytest.raises(Exception) as raised:
        app.synth()
    text = str(raised.value)
    assert "InstanceTyp" in text and "step Train" in text and plan.name in text


def test_grant_start_execution(plans, tmp_path):
    from aws_cdk import assertions
    from aws_cdk import aws_iam as iam

    from tiered_training.constructs.app import build_app

    plan = plans["llama3-1b-bf16"]
    app, _platform, stacks = build_app([plan], nag=False, outdir=str(tmp_path))
    stack = stacks[plan.name]
    user = iam.Role(stack, "Starter", assumed_by=iam.AccountRootPrincipal())
    grant = stack.pipeline.grant_start_execution(user)
    assert grant.success
    template = assertions.Template.from_stack(stack).to_json()
    policy = next(
        r for r in resources(template, "AWS::IAM::Policy").values()
        if any(role == {"Ref": k} for role in r["Properties"]["Roles"] for k in resources(template, "AWS::IAM::Role") if "Starter" in k)
    )
    statement = policy["Properties"]["PolicyDocument"]["Statement"][0]
    assert "sagemaker:StartPipelineExecution" in statement["Action"]
    arns = [str(r) for r in statement["Resource"]]
    assert any(f":pipeline/{plan.name}" in a and "execution" not in a for a in arns)


def test_metric_helpers_use_the_catalogue(synthesized):
    from tiered_training.contract import metrics

    stack = synthesized[2]["llama3-8b-fp8"]
    metric = stack.pipeline.metric_tokens_per_second_per_gpu()
    assert metric.namespace == metrics.NAMESPACE
    assert metric.metric_name == metrics.TOKENS_PER_SECOND_PER_GPU.name
    assert metric.dimensions == {"Recipe": "llama3-8b-fp8"}
    assert stack.pipeline.metric_execution_failed().namespace == "AWS/Sagemaker/ModelBuildingPipeline"
