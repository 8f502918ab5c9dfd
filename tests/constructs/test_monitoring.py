"""TrainingMonitoring: L2 alarms fitted to the plan, one notification per failure, topic routing, dashboard."""

from __future__ import annotations

import json
import math

import pytest
from cdk_helpers import only, resources

from tiered_training.constructs.platform import stack_id
from tiered_training.contract import metrics
from tiered_training.planning import alarms as fitting

ALARMS = {
    "ThroughputBelowPlan", "GpuUtilizationLow", "MemoryNearlyFull", "LossDiverging", "ValidationLossDiverging",
    "Stalled", "ExecutionFailed", "Straggler", "GpuFault", "GpuSlowdown",
}


def alarms(template: dict) -> dict[str, dict]:
    """Alarm construct ID -> properties (logical IDs are MonitoringThroughputBelowPlan<hash>)."""
    out = {}
    for logical, alarm in resources(template, "AWS::CloudWatch::Alarm").items():
        name = logical.removeprefix("Monitoring")[:-8]
        out[name] = alarm["Properties"]
    return out


def test_alarms_carry_the_fitted_periods_and_plan_thresholds(plans, templates):
    for name, plan in plans.items():
        found = alarms(templates[stack_id(name)])
        assert set(found) == ALARMS, name
        fit = fitting.fit_alarms(plan)
        for alarm_id, props in found.items():
            expected = fit[alarm_id]
            period = props.get("Period") or {q.get("Period") or q.get("MetricStat", {}).get("Period") for q in props["Metrics"]} - {None}
            assert period in (expected.period_seconds, {expected.period_seconds}), (name, alarm_id, period)
            assert props["EvaluationPeriods"] == expected.evaluation_periods
            assert props["DatapointsToAlarm"] == expected.datapoints_to_alarm
            assert props["TreatMissingData"] == "notBreaching"
            assert props["Threshold"] == pytest.approx(expected.threshold)
            assert f"fires within {expected.fires_within_seconds // 60} min" in props["AlarmDescription"]
            assert "SEARCH(" not in json.dumps(props.get("Metrics", [])).upper()
            # One failure, one notification: the failed-execution rule notifies, the alarm does not.
            assert len(props.get("AlarmActions", [])) == (0 if alarm_id == "ExecutionFailed" else 1), alarm_id
        mon = plan.recipe.monitoring
        (query,) = found["ThroughputBelowPlan"]["Metrics"]
        stat = query["MetricStat"]
        assert stat["Metric"]["MetricName"] == metrics.TOKENS_PER_SECOND_PER_GPU.name
        assert stat["Metric"]["Namespace"] == metrics.NAMESPACE
        assert stat["Metric"]["Dimensions"] == [{"Name": "Recipe", "Value": name}]
        assert stat["Unit"] == metrics.TOKENS_PER_SECOND_PER_GPU.unit
        assert found["ThroughputBelowPlan"]["Threshold"] == pytest.approx(
            mon.min_throughput_fraction * plan.estimates.tokens_per_second_per_gpu, abs=0.01
        )
        (query,) = found["GpuUtilizationLow"]["Metrics"]
        assert query["Expression"].startswith(f'SELECT MIN("{metrics.GPU_UTILIZATION.name}")')
        assert f"Recipe = '{name}'" in query["Expression"]
        straggler = found["Straggler"]  # the window's highest score: the slowest rank stayed slow throughout
        (query,) = straggler["Metrics"]
        assert (query["MetricStat"]["Metric"]["MetricName"], query["MetricStat"]["Stat"]) == (
            metrics.STRAGGLER_SCORE.name, "Maximum")
        assert query["MetricStat"]["Metric"]["Dimensions"] == [{"Name": "Recipe", "Value": name}]
        assert "HostStragglerScore" in straggler["AlarmDescription"]
        failed = found["ExecutionFailed"]
        assert failed["Namespace"] == "AWS/Sagemaker/ModelBuildingPipeline"
        assert failed["Dimensions"] == [{"Name": "PipelineName", "Value": name}]


def test_loss_ceiling_defaults_to_ln_vocabulary_plus_margin(plans, templates):
    qwen = plans["qwen25-32b-hybrid"]
    assert qwen.architecture.vocab_size == 152_064
    ceiling = alarms(templates[stack_id(qwen.name)])["LossDiverging"]["Threshold"]
    assert ceiling == pytest.approx(math.log(152_064) + 1.0, abs=0.01) == pytest.approx(12.93, abs=0.01)
    llama = plans["llama3-8b-fp8"]
    assert alarms(templates[stack_id(llama.name)])["LossDiverging"]["Threshold"] == pytest.approx(12.76, abs=0.01)


def test_stall_window_covers_the_longest_healthy_pause(plans):
    for plan in plans.values():
        fit = fitting.fit_alarms(plan)
        pause = 2 * plan.estimates.step_time_seconds + plan.recipe.checkpointing.shutdown_deadline_seconds
        assert fit.stall_seconds >= max(pause, plan.recipe.monitoring.stall_minutes * 60)
        assert fit.stall_seconds % 60 == 0 and fit.window_seconds % 60 == 0


def test_failed_execution_rule_sends_one_readable_message(templates):
    template = templates[stack_id("llama3-8b-fp8")]
    rule = only(template, "AWS::Events::Rule")["Properties"]
    pattern = rule["EventPattern"]
    assert pattern["detail-type"] == ["SageMaker Model Building Pipeline Execution Status Change"]
    assert pattern["detail"]["currentPipelineExecutionStatus"] == ["Failed"]
    assert ":pipeline/llama3-8b-fp8" in json.dumps(pattern["detail"]["pipelineArn"])
    (target,) = rule["Targets"]
    transformer = target["InputTransformer"]
    assert "$.detail.pipelineExecutionArn" in json.dumps(transformer["InputPathsMap"])
    assert "llama3-8b-fp8: pipeline execution" in transformer["InputTemplate"]


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
    for spec in (metrics.MFU, metrics.LOSS, metrics.VALIDATION_LOSS, metrics.GPU_UTILIZATION, metrics.PEAK_MEMORY_FRACTION):
        assert spec.name in body


def test_platform_topic_takes_a_subscription_and_unrouted_recipes_warn(plans, tmp_path):
    from aws_cdk import App
    from aws_cdk.assertions import Annotations, Match

    from tiered_training.constructs.app import build_app
    from tiered_training.constructs.platform import PlatformProps

    quiet = plans["data-variant"]  # names no alarm address
    assert not quiet.recipe.monitoring.alarm_email and not quiet.recipe.monitoring.alarm_topic_arn
    app, platform, stacks = build_app([quiet], nag=False, outdir=str(tmp_path / "a"))
    Annotations.from_stack(stacks[quiet.name]).has_warning("*", Match.string_like_regexp("notifies no one"))
    assert not platform.platform.alarms_reach_someone

    app, platform, stacks = build_app(
        [quiet], nag=False, outdir=str(tmp_path / "b"), platform=PlatformProps(alarm_email="oncall@example.com")
    )
    Annotations.from_stack(stacks[quiet.name]).has_no_warning("*", Match.string_like_regexp("notifies no one"))
    template = app.synth().get_stack_by_name(platform.stack_name).template
    assert only(template, "AWS::SNS::Subscription")["Properties"]["Endpoint"] == "oncall@example.com"
    assert isinstance(app, App)


def test_routing_findings_for_validate(plans):
    quiet = plans["data-variant"]
    (finding,) = fitting.routing_findings(quiet, platform_has_subscriber=False)
    assert finding.severity == "warning" and finding.code == "alarms-unrouted" and finding.field == "monitoring"
    assert fitting.routing_findings(quiet, platform_has_subscriber=True) == []
    assert fitting.routing_findings(plans["llama3-8b-fp8"], platform_has_subscriber=False) == []
    assert fitting.platform_subscribed({"alarm_email": "x@example.com"}) and not fitting.platform_subscribed({})


def test_search_in_an_alarm_fails_synth(plans, tmp_path):
    from aws_cdk import aws_cloudwatch as cloudwatch

    from tiered_training.constructs.app import build_app

    plan = plans["llama3-1b-bf16"]
    app, _platform, stacks = build_app([plan], nag=False, outdir=str(tmp_path))
    monitoring = stacks[plan.name].monitoring
    cloudwatch.Alarm(
        monitoring, "Searching",
        metric=cloudwatch.MathExpression(
            expression="MAX(SEARCH('{TieredTraining,Recipe,Node} GpuUtilization', 'Average'))", using_metrics={}
        ),
        threshold=1, evaluation_periods=1,
    )
    with pytest.raises(Exception, match="Searching/Resource uses a SEARCH expression"):
        app.synth()


def test_tracking_and_validation_in_the_train_step_and_the_role(plans, templates):
    from cdk_helpers import pipeline_definition

    from tiered_training.pipeline import definition as d

    template = templates[stack_id("spot-variant")]
    body = pipeline_definition(template)
    train = d.find_step(body, d.S_TRAIN_WITHOUT_PROBE)["Arguments"]  # the variant skips the probe
    assert train["TensorBoardOutputConfig"]["LocalPath"] == "/opt/ml/output/tensorboard"
    assert train["TensorBoardOutputConfig"]["S3OutputPath"].endswith("/tensorboard")
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in train["InputDataConfig"]}
    assert channels["validation"] == "s3://bucket-for-tests/held-out/"
    assert train["HyperParameters"]["validation.source"] == '"channel"'
    assert "mlflow-tracking-server/research" in train["HyperParameters"]["tracking.mlflow_tracking_uri"]
    probe = d.find_step(body, d.S_PROBE)["Arguments"]
    assert "TensorBoardOutputConfig" not in probe
    assert "validation" not in {c["ChannelName"] for c in probe["InputDataConfig"]}
    # The execution role may log to that one tracking server, and read the validation shards.
    policies = json.dumps([p["Properties"] for p in resources(template, "AWS::IAM::Policy").values()])
    statements = [s for p in resources(template, "AWS::IAM::Policy").values() for s in p["Properties"]["PolicyDocument"]["Statement"]]
    mlflow = [s for s in statements if any(str(a).startswith("sagemaker-mlflow:") for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]]))]
    assert len(mlflow) == 1
    assert mlflow[0]["Resource"] == "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/research"
    assert "sagemaker-mlflow:LogBatch" in mlflow[0]["Action"] and "sagemaker-mlflow:*" not in mlflow[0]["Action"]
    assert "held-out" in policies
