"""TrainingMonitoring: alarms, an EventBridge rule and a dashboard for one recipe's pipeline.

Alarms read the container's EMF metrics (names, units, dimensions from
:mod:`tiered_training.metrics`, through :class:`TrainingMetricFactory`) with the
stable ``Recipe`` dimension, plus SageMaker's own pipeline metric:

- ``ThroughputBelowPlan``: tokens/s per GPU below ``min_throughput_fraction`` of the plan;
- ``GpuUtilizationLow``: the least-busy node's NVML utilisation below ``min_gpu_utilization``
  (a Metrics Insights query: nodes are ``algo-1..N`` and N is a parameter);
- ``MemoryNearlyFull``: the fullest node's peak memory above ``max_memory_fraction`` of HBM;
- ``LossDiverging``: loss above ``loss_ceiling``, or NaN. The container drops a
  non-finite loss from its EMF line (CloudWatch rejects NaN), so a period with more
  progress datapoints than loss datapoints counts as NaN;
- ``Stalled``: a run that had been reporting progress reports none for ``stall_minutes``
  before reaching its last step. It needs earlier datapoints in its window, so an idle
  recipe does not alarm; it also fires after an execution fails or stops mid-run;
- ``ExecutionFailed``: AWS/Sagemaker/ModelBuildingPipeline ExecutionFailed.

No alarm may use a SEARCH expression (CloudWatch rejects them at deploy time although
synth, cfn-lint and moto accept them): :class:`NoSearchInAlarms` fails synth if one does.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import jsii
from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct, IConstruct, IValidation

from .. import metrics as catalogue
from .metric_factory import TrainingMetricFactory

if TYPE_CHECKING:
    from ..plan import Plan
    from .pipeline import TrainingPipeline

EXECUTION_STATUS_EVENT = "SageMaker Model Building Pipeline Execution Status Change"
NAN_LOSS = 1.0e9  # what a NaN loss counts as in the LossDiverging expression
MAX_ALARM_RANGE_SECONDS = 86_400


def alarm_topic(scope: Construct, construct_id: str, *, display_name: str) -> sns.Topic:
    """An SNS topic encrypted with its own key, which CloudWatch and EventBridge may use."""
    key = kms.Key(scope, f"{construct_id}Key", description=f"{display_name} alarms", enable_key_rotation=True)
    for service in ("cloudwatch.amazonaws.com", "events.amazonaws.com"):
        # In a key policy, Resource "*" means this key.
        key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal(service)],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
            )
        )
    return sns.Topic(scope, construct_id, display_name=display_name, master_key=key, enforce_ssl=True)


def _has_search(text: str) -> bool:
    return "SEARCH(" in text.upper().replace(" ", "")


@jsii.implements(IValidation)
class NoSearchInAlarms:
    """Synth-time check: no CloudWatch alarm uses a SEARCH expression.

    ``NoSearchInAlarms(stack)`` scans every alarm in the scope's stack (thorough; about
    70 ms a stack). ``NoSearchInAlarms(scope, metrics={alarm id: metric})`` checks the
    metrics a construct gave its own alarms, without walking the tree (what
    TrainingMonitoring registers, so that 50 recipe stacks stay fast to synthesize).
    """

    def __init__(self, scope: IConstruct, metrics: dict[str, cloudwatch.IMetric] | None = None) -> None:
        self.scope = scope
        self.metrics = metrics

    def validate(self) -> list[str]:
        message = (
            "uses a SEARCH expression, which CloudWatch alarms reject at deploy time; "
            "use a metric with fixed dimensions or a Metrics Insights query"
        )
        if self.metrics is not None:
            problems = []
            for alarm_id, metric in self.metrics.items():
                texts = []
                if isinstance(metric, cloudwatch.MathExpression):
                    texts.append(metric.expression)
                    texts += [getattr(m, "expression", "") for m in (metric.using_metrics or {}).values()]
                if any(_has_search(t) for t in texts):
                    problems.append(f"alarm {self.scope.node.path}/{alarm_id} {message}")
            return problems
        stack = Stack.of(self.scope)
        problems = []
        for child in stack.node.find_all():
            if isinstance(child, cloudwatch.CfnAlarm):
                text = json.dumps(stack.resolve(child.metrics)) if child.metrics is not None else ""
                if _has_search(text):
                    problems.append(f"alarm {child.node.path} {message}")
        return problems


class TrainingMonitoring(Construct):
    """Alarms, failed-execution events and a dashboard for one pipeline.

    Props:

    - ``pipeline``: the TrainingPipeline (its Plan gives the plan numbers and thresholds).
    - ``topic``: where alarms and events go; default a new encrypted topic.
    - ``alarm_email``: subscribe this address to the topic; default the recipe's
      ``monitoring.alarm_email`` (none when a topic is passed in and the recipe has none).
    - ``dashboard``: default True.
    - ``period``: alarm period for the EMF metrics; default 5 minutes.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        pipeline: "TrainingPipeline",
        topic: sns.ITopic | None = None,
        alarm_email: str | None = None,
        dashboard: bool = True,
        period: Duration = Duration.minutes(5),
    ) -> None:
        super().__init__(scope, construct_id)
        plan: "Plan" = pipeline.plan
        assert plan.estimates is not None
        self.plan = plan
        self.pipeline = pipeline
        mon = plan.recipe.monitoring
        self.metrics = TrainingMetricFactory(plan.name, pipeline_name=pipeline.pipeline_name, period=period)
        self.topic: sns.ITopic = topic or alarm_topic(self, "Topic", display_name=f"tiered-training {plan.name}")
        email = alarm_email or mon.alarm_email
        if email:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        self._alarm_metrics: dict[str, cloudwatch.IMetric] = {}
        m = self.metrics
        plan_rate = plan.estimates.tokens_per_second_per_gpu

        self._alarm(
            "ThroughputBelowPlan",
            m.tokens_per_second_per_gpu(),
            threshold=round(mon.min_throughput_fraction * plan_rate, 2),
            comparison=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            periods=3,
            description=f"tokens/s per GPU below {mon.min_throughput_fraction:g} x the plan's {plan_rate:.0f} for 15 minutes",
        )
        self._alarm(
            "GpuUtilizationLow",
            m.gpu_utilization("MIN"),
            threshold=mon.min_gpu_utilization,
            comparison=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            periods=3,
            description=f"a node's GPU utilisation below {mon.min_gpu_utilization:g}% for 15 minutes",
        )
        self._alarm(
            "MemoryNearlyFull",
            m.peak_memory_fraction("MAX"),
            threshold=round(mon.max_memory_fraction * 100, 2),
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            periods=1,
            description=f"a node's peak GPU memory above {mon.max_memory_fraction:.0%} of HBM",
        )
        loss = cloudwatch.MathExpression(
            expression=f"IF(steps > FILL(losses, 0), {NAN_LOSS:.0f}, loss)",
            using_metrics={
                "steps": m.progress("SampleCount"),
                "losses": m.loss("SampleCount"),
                "loss": m.loss("Maximum"),
            },
            period=period,
            label="loss (1e9 = NaN)",
        )
        self._alarm(
            "LossDiverging",
            loss,
            threshold=mon.loss_ceiling,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            periods=1,
            description=f"loss above {mon.loss_ceiling:g} or NaN",
        )
        stall_period = self.stall_period(mon.stall_minutes)
        stall = cloudwatch.MathExpression(
            expression=f"IF(FILL(reports, 0) == 0 AND FILL(step, REPEAT) < {plan.estimates.total_steps}, 1, 0)",
            using_metrics={
                "reports": m.progress("SampleCount", period=stall_period),
                "step": m.progress("Maximum", period=stall_period),
            },
            period=stall_period,
            label="stalled (1 = no progress)",
        )
        self._alarm(
            "Stalled",
            stall,
            threshold=1,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            periods=4,
            datapoints=3,
            description=f"no training step reported for {mon.stall_minutes} minutes before the last step",
        )
        self._alarm(
            "ExecutionFailed",
            m.pipeline_metric("ExecutionFailed"),
            threshold=1,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            periods=1,
            description=f"an execution of pipeline {pipeline.pipeline_name} failed",
        )

        self.failed_rule = events.Rule(
            self,
            "FailedExecutions",
            description=f"Failed executions of pipeline {pipeline.pipeline_name}",
            event_pattern=events.EventPattern(
                source=["aws.sagemaker"],
                detail_type=[EXECUTION_STATUS_EVENT],
                # The events carry pipelineArn, not the pipeline name.
                detail={"pipelineArn": [pipeline.pipeline_arn], "currentPipelineExecutionStatus": ["Failed"]},
            ),
        )
        self.failed_rule.add_target(targets.SnsTopic(self.topic))

        self.dashboard = self._dashboard() if dashboard else None
        self.node.add_validation(NoSearchInAlarms(self, self._alarm_metrics))

    @staticmethod
    def stall_period(stall_minutes: int) -> Duration:
        """A third of the stall window, in whole minutes, so that 4 periods fit in a day."""
        minutes = max(1, math.ceil(stall_minutes / 3))
        minutes = min(minutes, MAX_ALARM_RANGE_SECONDS // 60 // 4)
        return Duration.minutes(minutes)

    def _alarm(
        self,
        construct_id: str,
        metric: cloudwatch.IMetric,
        *,
        threshold: float,
        comparison: cloudwatch.ComparisonOperator,
        periods: int,
        description: str,
        datapoints: int | None = None,
    ) -> cloudwatch.Alarm:
        alarm = cloudwatch.Alarm(
            self,
            construct_id,
            metric=metric,
            threshold=threshold,
            comparison_operator=comparison,
            evaluation_periods=periods,
            datapoints_to_alarm=datapoints or periods,
            # No datapoints means no job of this recipe is running: not an alarm.
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"{self.plan.name}: {description}",
        )
        alarm.add_alarm_action(cw_actions.SnsAction(self.topic))
        self.alarms[construct_id] = alarm
        self._alarm_metrics[construct_id] = metric
        return alarm

    def _dashboard(self) -> cloudwatch.Dashboard:
        plan, m = self.plan, self.metrics
        assert plan.estimates is not None
        mon = plan.recipe.monitoring
        rate = plan.estimates.tokens_per_second_per_gpu
        board = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"TieredTraining-{plan.name}")
        board.add_widgets(
            cloudwatch.TextWidget(
                markdown=(
                    f"## {plan.name}\n{plan.model_name} ({plan.tier.name} tier) on {plan.nodes} x {plan.instance.name}, "
                    f"{plan.precision}, AC {plan.activation_checkpointing}, micro-batch {plan.micro_batch_size}. "
                    f"Plan: {rate:,.0f} tokens/s per GPU, MFU {plan.estimates.mfu:.0%}, "
                    f"{plan.estimates.total_steps:,} steps, {plan.estimates.wall_time_hours:,.1f} h."
                ),
                width=24,
                height=2,
            ),
            cloudwatch.AlarmStatusWidget(alarms=list(self.alarms.values()), title="Alarms", width=24, height=3),
        )
        board.add_widgets(
            cloudwatch.GraphWidget(
                title="Tokens/s per GPU",
                left=[m.tokens_per_second_per_gpu()],
                left_annotations=[
                    cloudwatch.HorizontalAnnotation(value=round(rate, 2), label="plan"),
                    cloudwatch.HorizontalAnnotation(
                        value=round(rate * mon.min_throughput_fraction, 2), label="alarm", color="#d62728"
                    ),
                ],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="MFU (BF16-equivalent)",
                left=[m.metric(catalogue.MFU)],
                left_annotations=[cloudwatch.HorizontalAnnotation(value=round(plan.estimates.mfu * 100, 2), label="plan")],
                width=12,
            ),
        )
        board.add_widgets(
            cloudwatch.GraphWidget(
                title="Loss",
                left=[m.loss("Average")],
                right=[m.metric(catalogue.GRAD_NORM)],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Progress and step time",
                left=[m.progress("Maximum")],
                right=[m.metric(catalogue.STEP_TIME), m.metric(catalogue.DATA_WAIT_FRACTION)],
                width=12,
            ),
        )
        board.add_widgets(
            cloudwatch.GraphWidget(
                title="GPU utilisation by node (%)",
                left=[m.insights(catalogue.GPU_UTILIZATION, "AVG", group_by_node=True, label="GPU utilisation")],
                left_annotations=[cloudwatch.HorizontalAnnotation(value=mon.min_gpu_utilization, label="alarm")],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Peak GPU memory by node (% of HBM)",
                left=[m.insights(catalogue.PEAK_MEMORY_FRACTION, "MAX", group_by_node=True, label="peak memory")],
                left_annotations=[
                    cloudwatch.HorizontalAnnotation(
                        value=round(plan.memory.fraction * 100, 2) if plan.memory else 0.0, label="plan"
                    ),
                    cloudwatch.HorizontalAnnotation(value=round(mon.max_memory_fraction * 100, 2), label="alarm"),
                ],
                width=12,
            ),
        )
        board.add_widgets(
            cloudwatch.GraphWidget(
                title="SageMaker host GPU utilisation (all training jobs)",
                left=[m.host_insights("GPUUtilization")],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="SageMaker host GPU memory utilisation (all training jobs)",
                left=[m.host_insights("GPUMemoryUtilization")],
                width=12,
            ),
        )
        return board
