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

Synth speed: a platform repo synthesizes one of these per recipe, and every call into
aws-cdk-lib is a round trip to the jsii runtime. So the alarms are ``CfnAlarm``s and the
dashboard a ``CfnDashboard`` whose body is plain JSON, both built from the metric
factory's plain CloudFormation dicts; each sits at the construct path the L2 would use
(``<id>/Resource``), so logical IDs are those of the L2 constructs.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import jsii
from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct, IConstruct, IValidation

from .. import metrics as catalogue
from ._scope import add_check, env_of, remember_stack, stack_of
from .metric_factory import DEFAULT_PERIOD, TrainingMetricFactory

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


KEY_SERVICES = ("cloudwatch.amazonaws.com", "events.amazonaws.com")


class _OwnTopic:
    """What :func:`alarm_topic`, ``add_subscription(EmailSubscription(email))`` and
    ``grant_publish(events.amazonaws.com)`` make, as L1 resources at the same construct paths
    (the same logical IDs and template), in about a third of the jsii calls."""

    def __init__(self, scope: Construct, construct_id: str, *, display_name: str, email: str | None) -> None:
        partition, _region, account = env_of(stack_of(scope))
        root = f"arn:{partition}:iam::{account}:root"
        key = kms.CfnKey(
            Construct(scope, f"{construct_id}Key"),
            "Resource",
            description=f"{display_name} alarms",
            enable_key_rotation=True,
            key_policy={
                "Statement": [
                    {"Action": "kms:*", "Effect": "Allow", "Principal": {"AWS": root}, "Resource": "*"},
                    # In a key policy, Resource "*" means this key.
                    {
                        "Action": ["kms:Decrypt", "kms:GenerateDataKey*"],
                        "Effect": "Allow",
                        "Principal": {"Service": list(KEY_SERVICES)},
                        "Resource": "*",
                    },
                ],
                "Version": "2012-10-17",
            },
        )
        key.apply_removal_policy(RemovalPolicy.RETAIN)  # kms.Key's default
        topic_scope = Construct(scope, construct_id)
        topic = sns.CfnTopic(topic_scope, "Resource", display_name=display_name, kms_master_key_id=key.attr_arn)
        self.topic_arn: str = topic.ref
        self.resource = topic
        sns.CfnTopicPolicy(
            Construct(topic_scope, "Policy"),
            "Resource",
            policy_document={
                "Statement": [
                    {  # enforce_ssl=True
                        "Action": "sns:Publish",
                        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                        "Effect": "Deny",
                        "Principal": "*",
                        "Resource": self.topic_arn,
                        "Sid": "AllowPublishThroughSSLOnly",
                    },
                    {  # the failed-execution rule's target (events_targets.SnsTopic)
                        "Action": "sns:Publish",
                        "Effect": "Allow",
                        "Principal": {"Service": "events.amazonaws.com"},
                        "Resource": self.topic_arn,
                        "Sid": "1",
                    },
                ],
                "Version": "2012-10-17",
            },
            topics=[self.topic_arn],
        )
        if email:
            # EmailSubscription's construct ID is the address.
            sns.CfnSubscription(Construct(topic_scope, email), "Resource", endpoint=email, protocol="email", topic_arn=self.topic_arn)


def _has_search(text: str) -> bool:
    return "SEARCH(" in text.upper().replace(" ", "")


@jsii.implements(IValidation)
class NoSearchInAlarms:
    """Synth-time check: no CloudWatch alarm uses a SEARCH expression.

    ``NoSearchInAlarms(stack)`` scans every alarm in the scope's stack (thorough; about
    70 ms a stack). ``NoSearchInAlarms(scope, queries={alarm id: alarm Metrics})`` checks
    the plain CloudFormation ``Metrics`` (MetricDataQuery dicts) a construct gave its own
    alarms, without walking the tree or calling into jsii (what TrainingMonitoring
    registers, so that 50 recipe stacks stay fast to synthesize).
    """

    def __init__(self, scope: IConstruct, queries: dict[str, list[dict]] | None = None) -> None:
        self.scope = scope
        self.queries = queries

    def validate(self) -> list[str]:
        message = (
            "uses a SEARCH expression, which CloudWatch alarms reject at deploy time; "
            "use a metric with fixed dimensions or a Metrics Insights query"
        )
        if self.queries is not None:
            problems = []
            for alarm_id, queries in self.queries.items():
                if any(_has_search(str(q.get("Expression", ""))) for q in queries):
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


def _metric_data_queries(queries: list[dict]) -> list[cloudwatch.CfnAlarm.MetricDataQueryProperty]:
    """Plain MetricDataQuery dicts as CfnAlarm's typed structs (Python objects: no jsii call)."""
    out = []
    for q in queries:
        stat = q.get("MetricStat")
        metric_stat = None
        if stat is not None:
            metric = stat["Metric"]
            metric_stat = cloudwatch.CfnAlarm.MetricStatProperty(
                metric=cloudwatch.CfnAlarm.MetricProperty(
                    dimensions=[cloudwatch.CfnAlarm.DimensionProperty(name=d["Name"], value=d["Value"]) for d in metric.get("Dimensions", [])] or None,
                    metric_name=metric.get("MetricName"),
                    namespace=metric.get("Namespace"),
                ),
                period=stat["Period"],
                stat=stat["Stat"],
                unit=stat.get("Unit"),
            )
        out.append(
            cloudwatch.CfnAlarm.MetricDataQueryProperty(
                id=q["Id"],
                expression=q.get("Expression"),
                label=q.get("Label"),
                metric_stat=metric_stat,
                period=q.get("Period"),
                return_data=q.get("ReturnData"),
            )
        )
    return out


class TrainingMonitoring(Construct):
    """Alarms, failed-execution events and a dashboard for one pipeline.

    Props:

    - ``pipeline``: the TrainingPipeline (its Plan gives the plan numbers and thresholds).
    - ``topic``: where alarms and events go; default a new encrypted topic.
    - ``alarm_email``: subscribe this address to the topic; default the recipe's
      ``monitoring.alarm_email`` (none when a topic is passed in and the recipe has none).
    - ``dashboard``: default True.
    - ``period``: alarm period for the EMF metrics; default 5 minutes.

    Attributes: ``alarms`` (alarm ID -> ``CfnAlarm``; ``alarm(id)`` gives an ``IAlarm``),
    ``failed_rule`` (``CfnRule``), ``dashboard`` (``CfnDashboard`` or None), ``topic`` (an
    ``ITopic``; ``topic_resource`` is the ``CfnTopic`` when the construct made its own),
    ``metrics`` (the TrainingMetricFactory).
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
        period: Duration = DEFAULT_PERIOD,
    ) -> None:
        super().__init__(scope, construct_id)
        remember_stack(self, stack_of(scope), scope, construct_id)
        plan: "Plan" = pipeline.plan
        assert plan.estimates is not None
        self.plan = plan
        self.pipeline = pipeline
        mon = plan.recipe.monitoring
        self.metrics = TrainingMetricFactory(plan.name, pipeline_name=pipeline.pipeline_name, period=period)
        email = alarm_email or mon.alarm_email
        self._topic_view: sns.ITopic | None = topic
        self.topic_resource: sns.CfnTopic | None = None
        if topic is None:
            own = _OwnTopic(self, "Topic", display_name=f"tiered-training {plan.name}", email=email)
            self.topic_resource = own.resource
            self._topic_arn = own.topic_arn
        else:
            if email:
                topic.add_subscription(subscriptions.EmailSubscription(email))
            self._topic_arn = topic.topic_arn
        self.alarms: dict[str, cloudwatch.CfnAlarm] = {}
        self._alarm_queries: dict[str, list[dict]] = {}
        self._alarm_arns: dict[str, str] = {}
        m = self.metrics
        plan_rate = plan.estimates.tokens_per_second_per_gpu

        self._alarm(
            "ThroughputBelowPlan",
            {"Metrics": [m.metric_query(catalogue.TOKENS_PER_SECOND_PER_GPU)]},
            threshold=round(mon.min_throughput_fraction * plan_rate, 2),
            comparison="LessThanThreshold",
            periods=3,
            description=f"tokens/s per GPU below {mon.min_throughput_fraction:g} x the plan's {plan_rate:.0f} for 15 minutes",
        )
        self._alarm(
            "GpuUtilizationLow",
            {"Metrics": m.insights_alarm_query(catalogue.GPU_UTILIZATION, "MIN")},
            threshold=mon.min_gpu_utilization,
            comparison="LessThanThreshold",
            periods=3,
            description=f"a node's GPU utilisation below {mon.min_gpu_utilization:g}% for 15 minutes",
        )
        self._alarm(
            "MemoryNearlyFull",
            {"Metrics": m.insights_alarm_query(catalogue.PEAK_MEMORY_FRACTION, "MAX")},
            threshold=round(mon.max_memory_fraction * 100, 2),
            comparison="GreaterThanThreshold",
            periods=1,
            description=f"a node's peak GPU memory above {mon.max_memory_fraction:.0%} of HBM",
        )
        loss = m.expression_query(
            f"IF(steps > FILL(losses, 0), {NAN_LOSS:.0f}, loss)",
            {
                "steps": m.metric_query(catalogue.PROGRESS, statistic="SampleCount"),
                "losses": m.metric_query(catalogue.LOSS, statistic="SampleCount"),
                "loss": m.metric_query(catalogue.LOSS, statistic="Maximum"),
            },
            label="loss (1e9 = NaN)",
        )
        self._alarm(
            "LossDiverging",
            {"Metrics": loss},
            threshold=mon.loss_ceiling,
            comparison="GreaterThanThreshold",
            periods=1,
            description=f"loss above {mon.loss_ceiling:g} or NaN",
        )
        stall_seconds = self.stall_period_minutes(mon.stall_minutes) * 60
        stall = m.expression_query(
            f"IF(FILL(reports, 0) == 0 AND FILL(step, REPEAT) < {plan.estimates.total_steps}, 1, 0)",
            {
                "reports": m.metric_query(catalogue.PROGRESS, statistic="SampleCount", period_seconds=stall_seconds),
                "step": m.metric_query(catalogue.PROGRESS, statistic="Maximum", period_seconds=stall_seconds),
            },
            label="stalled (1 = no progress)",
        )
        self._alarm(
            "Stalled",
            {"Metrics": stall},
            threshold=1,
            comparison="GreaterThanOrEqualToThreshold",
            periods=4,
            datapoints=3,
            description=f"no training step reported for {mon.stall_minutes} minutes before the last step",
        )
        self._alarm(
            "ExecutionFailed",
            m.pipeline_alarm_metric("ExecutionFailed"),
            threshold=1,
            comparison="GreaterThanOrEqualToThreshold",
            periods=1,
            description=f"an execution of pipeline {pipeline.pipeline_name} failed",
        )

        # What events_targets.SnsTopic does: let EventBridge publish (deduplicated), target the topic.
        if topic is not None:
            topic.grant_publish(iam.ServicePrincipal("events.amazonaws.com"))
        self.failed_rule = events.CfnRule(
            Construct(self, "FailedExecutions"),
            "Resource",
            description=f"Failed executions of pipeline {pipeline.pipeline_name}",
            event_pattern={
                "source": ["aws.sagemaker"],
                "detail-type": [EXECUTION_STATUS_EVENT],
                # The events carry pipelineArn, not the pipeline name.
                "detail": {"pipelineArn": [pipeline.pipeline_arn], "currentPipelineExecutionStatus": ["Failed"]},
            },
            state="ENABLED",
            targets=[events.CfnRule.TargetProperty(arn=self._topic_arn, id="Target0")],
        )

        self.dashboard = self._dashboard() if dashboard else None
        add_check(self, NoSearchInAlarms(self, self._alarm_queries).validate)

    @property
    def topic(self) -> sns.ITopic:
        """Where alarms and events go: the topic passed in, or an ``ITopic`` view of this construct's own."""
        if self._topic_view is None:
            self._topic_view = sns.Topic.from_topic_arn(self, "TopicView", self._topic_arn)
        return self._topic_view

    @staticmethod
    def stall_period_minutes(stall_minutes: int) -> int:
        """A third of the stall window, in whole minutes, so that 4 periods fit in a day."""
        minutes = max(1, math.ceil(stall_minutes / 3))
        return min(minutes, MAX_ALARM_RANGE_SECONDS // 60 // 4)

    @staticmethod
    def stall_period(stall_minutes: int) -> Duration:
        """:meth:`stall_period_minutes` as a Duration."""
        return Duration.minutes(TrainingMonitoring.stall_period_minutes(stall_minutes))

    def alarm(self, construct_id: str) -> cloudwatch.IAlarm:
        """One of this construct's alarms as an ``IAlarm`` (for composite alarms, widgets, actions)."""
        return cloudwatch.Alarm.from_alarm_arn(self, f"{construct_id}Ref", self._alarm_arns[construct_id])

    def _alarm(
        self,
        construct_id: str,
        metric: dict,
        *,
        threshold: float,
        comparison: str,
        periods: int,
        description: str,
        datapoints: int | None = None,
    ) -> cloudwatch.CfnAlarm:
        """An alarm on plain CloudFormation metric properties: ``{"Metrics": [MetricDataQuery...]}``
        or the top-level ``MetricName``/``Namespace``/``Dimensions``/``Period``/``Statistic``."""
        queries = metric.get("Metrics")
        dims = metric.get("Dimensions")
        alarm = cloudwatch.CfnAlarm(
            Construct(self, construct_id),
            "Resource",
            alarm_actions=[self._topic_arn],
            alarm_description=f"{self.plan.name}: {description}",
            comparison_operator=comparison,
            datapoints_to_alarm=datapoints or periods,
            evaluation_periods=periods,
            metrics=_metric_data_queries(queries) if queries else None,
            metric_name=metric.get("MetricName"),
            namespace=metric.get("Namespace"),
            dimensions=[cloudwatch.CfnAlarm.DimensionProperty(name=d["Name"], value=d["Value"]) for d in dims] if dims else None,
            period=metric.get("Period"),
            statistic=metric.get("Statistic"),
            threshold=threshold,
            # No datapoints means no job of this recipe is running: not an alarm.
            treat_missing_data="notBreaching",
        )
        self.alarms[construct_id] = alarm
        self._alarm_queries[construct_id] = list(queries or [])
        self._alarm_arns[construct_id] = alarm.attr_arn
        return alarm

    def _dashboard(self) -> cloudwatch.CfnDashboard:
        plan, m = self.plan, self.metrics
        assert plan.estimates is not None
        mon = plan.recipe.monitoring
        rate = plan.estimates.tokens_per_second_per_gpu
        stack = stack_of(self)
        region = env_of(stack)[1]
        text = (
            f"## {plan.name}\n{plan.model_name} ({plan.tier.name} tier) on {plan.nodes} x {plan.instance.name}, "
            f"{plan.precision}, AC {plan.activation_checkpointing}, micro-batch {plan.micro_batch_size}. "
            f"Plan: {rate:,.0f} tokens/s per GPU, MFU {plan.estimates.mfu:.0%}, "
            f"{plan.estimates.total_steps:,} steps, {plan.estimates.wall_time_hours:,.1f} h."
        )

        def annotation(value: float, label: str, color: str | None = None) -> dict:
            out: dict = {"value": value}
            if color:
                out["color"] = color
            return {**out, "label": label, "yAxis": "left"}

        def graph(title: str, metrics: list, annotations: list | None = None) -> dict:
            props: dict = {"view": "timeSeries", "title": title, "region": region, "metrics": metrics}
            if annotations:
                props["annotations"] = {"horizontal": annotations}
            props["yAxis"] = {}
            return {"type": "metric", "width": 12, "height": 6, "properties": props}

        rows = [
            [
                {"type": "text", "width": 24, "height": 2, "properties": {"markdown": text}},
                {"type": "alarm", "width": 24, "height": 3,
                 "properties": {"title": "Alarms", "alarms": list(self._alarm_arns.values())}},
            ],
            [
                graph("Tokens/s per GPU", [m.graph_metric(catalogue.TOKENS_PER_SECOND_PER_GPU)], [
                    annotation(round(rate, 2), "plan"),
                    annotation(round(rate * mon.min_throughput_fraction, 2), "alarm", "#d62728"),
                ]),
                graph("MFU (BF16-equivalent)", [m.graph_metric(catalogue.MFU)],
                      [annotation(round(plan.estimates.mfu * 100, 2), "plan")]),
            ],
            [
                graph("Loss", [m.graph_metric(catalogue.LOSS), m.graph_metric(catalogue.GRAD_NORM, right=True)]),
                graph("Progress and step time", [
                    m.graph_metric(catalogue.PROGRESS, statistic="Maximum"),
                    m.graph_metric(catalogue.STEP_TIME, right=True),
                    m.graph_metric(catalogue.DATA_WAIT_FRACTION, right=True),
                ]),
            ],
            [
                graph("GPU utilisation by node (%)",
                      [m.graph_insights(catalogue.GPU_UTILIZATION, "AVG", group_by_node=True, label="GPU utilisation")],
                      [annotation(mon.min_gpu_utilization, "alarm")]),
                graph("Peak GPU memory by node (% of HBM)",
                      [m.graph_insights(catalogue.PEAK_MEMORY_FRACTION, "MAX", group_by_node=True, label="peak memory")],
                      [annotation(round(plan.memory.fraction * 100, 2) if plan.memory else 0.0, "plan"),
                       annotation(round(mon.max_memory_fraction * 100, 2), "alarm")]),
            ],
            [
                graph("SageMaker host GPU utilisation (all training jobs)",
                      [m.graph_expression(m.host_insights_query("GPUUtilization"), label="GPUUtilization by host")]),
                graph("SageMaker host GPU memory utilisation (all training jobs)",
                      [m.graph_expression(m.host_insights_query("GPUMemoryUtilization"), label="GPUMemoryUtilization by host")]),
            ],
        ]
        widgets = []
        y = 0
        for row in rows:
            # CDK's dashboard layout: each add_widgets() call is a row, widgets left to right,
            # wrapping at 24 columns.
            x, height = 0, 0
            for widget in row:
                if x + widget["width"] > 24:
                    y, x, height = y + height, 0, 0
                widgets.append({"type": widget["type"], "width": widget["width"], "height": widget["height"],
                                "x": x, "y": y, "properties": widget["properties"]})
                x += widget["width"]
                height = max(height, widget["height"])
            y += height
        body = stack.to_json_string({"widgets": widgets})
        return cloudwatch.CfnDashboard(
            Construct(self, "Dashboard"), "Resource", dashboard_name=f"TieredTraining-{plan.name}", dashboard_body=body
        )
