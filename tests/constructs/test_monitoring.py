"""TrainingMonitoring: alarms on catalogue metrics with plan thresholds, events, topic, dashboard."""

from __future__ import annotations

import json

import pytest
from cdk_helpers import only, resources

from tiered_training import metrics
from tiered_training.constructs.platform import stack_id

ALARMS = {"ThroughputBelowPlan", "GpuUtilizationLow", "MemoryNearlyFull", "LossDiverging", "Stalled", "ExecutionFailed"}


def alarms(template: dict) -> dict[str, dict]:
    out = {}
    for logical, alarm in resources(template, "AWS::CloudWatch::Alarm").items():
        (name,) = [a for a in ALARMS if a in logical]
        out[name] = alarm["Properties"]
    return out


def test_six_alarms_per_recipe_with_plan_thresholds(plans, templates):
    for name, plan in plans.items():
        found = alarms(templates[stack_id(name)])
        assert set(found) == ALARMS, name
        mon = plan.recipe.monitoring
        throughput = found["ThroughputBelowPlan"]
        (query,) = throughput["Metrics"]
        stat = query["MetricStat"]
        assert stat["Metric"]["MetricName"] == metrics.TOKENS_PER_SECOND_PER_GPU.name
        assert stat["Metric"]["Namespace"] == metrics.NAMESPACE
        assert stat["Metric"]["Dimensions"] == [{"Name": "Recipe", "Value": name}]
        assert stat["Unit"] == metrics.TOKENS_PER_SECOND_PER_GPU.unit
        assert throughput["Threshold"] == pytest.approx(mon.min_throughput_fraction * plan.estimates.tokens_per_second_per_gpu, abs=0.01)
        assert throughput["ComparisonOperator"] == "LessThanThreshold"
        gpu = found["GpuUtilizationLow"]
        (query,) = gpu["Metrics"]
        assert f'"{metrics.GPU_UTILIZATION.name}"' in query["Expression"] and f"Recipe = '{name}'" in query["Expression"]
        assert gpu["Threshold"] == mon.min_gpu_utilization
        assert found["MemoryNearlyFull"]["Threshold"] == pytest.approx(mon.max_memory_fraction * 100)
        assert found["LossDiverging"]["Threshold"] == mon.loss_ceiling
        failed = found["ExecutionFailed"]
        assert failed["Namespace"] == "AWS/Sagemaker/ModelBuildingPipeline"
        assert failed["Dimensions"] == [{"Name": "PipelineName", "Value": name}]
        for alarm in found.values():
            assert alarm["TreatMissingData"] == "notBreaching"
            assert len(alarm["AlarmActions"]) == 1
            assert "SEARCH(" not in json.dumps(alarm.get("Metrics", [])).upper()


def test_alarm_metric_names_come_from_the_catalogue(templates):
    used = set()
    for template in templates.values():
        for alarm in resources(template, "AWS::CloudWatch::Alarm").values():
            props = alarm["Properties"]
            if props.get("Namespace") == metrics.NAMESPACE:
                used.add(props["MetricName"])
            for query in props.get("Metrics", []):
                stat = query.get("MetricStat")
                if stat and stat["Metric"]["Namespace"] == metrics.NAMESPACE:
                    used.add(stat["Metric"]["MetricName"])
    assert used and used <= set(metrics.BY_NAME)


def test_failed_execution_rule_matches_pipeline_arn(templates):
    template = templates[stack_id("llama3-8b-fp8")]
    rule = only(template, "AWS::Events::Rule")["Properties"]
    pattern = rule["EventPattern"]
    assert pattern["detail-type"] == ["SageMaker Model Building Pipeline Execution Status Change"]
    assert pattern["detail"]["currentPipelineExecutionStatus"] == ["Failed"]
    assert ":pipeline/llama3-8b-fp8" in json.dumps(pattern["detail"]["pipelineArn"])
    assert len(rule["Targets"]) == 1


def test_topics(templates):
    # alarm_email -> a topic of its own with the subscription; alarm_topic_arn -> that topic; else the platform's.
    own = templates[stack_id("llama3-8b-fp8")]
    topic = only(own, "AWS::SNS::Topic")
    assert "KmsMasterKeyId" in topic["Properties"]
    assert only(own, "AWS::SNS::Subscription")["Properties"]["Endpoint"] == "ml-team@example.com"
    passed = templates[stack_id("spot-variant")]
    assert not resources(passed, "AWS::SNS::Topic")
    assert "arn:aws:sns:us-east-1:123456789012:ml-alarms" in json.dumps(resources(passed, "AWS::CloudWatch::Alarm"))


def test_dashboard_has_plan_annotation_and_insights(plans, templates):
    template = templates[stack_id("llama3-8b-fp8")]
    body = json.dumps(only(template, "AWS::CloudWatch::Dashboard")["Properties"]["DashboardBody"])
    plan_rate = round(plans["llama3-8b-fp8"].estimates.tokens_per_second_per_gpu, 2)
    assert f"{plan_rate}" in body and "plan" in body
    assert "/aws/sagemaker/TrainingJobs" in body and "SELECT" in body
    for spec in (metrics.MFU, metrics.LOSS, metrics.GPU_UTILIZATION, metrics.PEAK_MEMORY_FRACTION):
        assert spec.name in body


def test_search_in_an_alarm_fails_synth(tmp_path):
    from aws_cdk import App, Stack
    from aws_cdk import aws_cloudwatch as cloudwatch

    from tiered_training.constructs import NoSearchInAlarms

    app = App(outdir=str(tmp_path))
    stack = Stack(app, "S")
    cloudwatch.Alarm(
        stack, "Bad",
        metric=cloudwatch.MathExpression(expression="SEARCH('{TieredTraining,Recipe} GpuUtilization', 'Average')", using_metrics={}),
        threshold=1, evaluation_periods=1,
    )
    stack.node.add_validation(NoSearchInAlarms(stack))
    with pytest.raises(Exception, match="SEARCH expression"):
        app.synth()


def test_search_in_a_monitoring_alarm_fails_synth(plans, tmp_path):
    from tiered_training.constructs.app import build_app

    plan = plans["llama3-1b-bf16"]
    app, _platform, stacks = build_app([plan], nag=False, outdir=str(tmp_path))
    monitoring = stacks[plan.name].monitoring
    query = "MAX(SEARCH('{TieredTraining,Recipe,Node} GpuUtilization', 'Average'))"
    monitoring._alarm(
        "Searching",
        {"Metrics": monitoring.metrics.expression_query(query)},
        threshold=1, comparison="GreaterThanThreshold", periods=1, description="bad",
    )
    with pytest.raises(Exception, match="Searching uses a SEARCH expression"):
        app.synth()
