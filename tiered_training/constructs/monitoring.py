"""TrainingMonitoring: alarms fitted to the plan, a failed-execution rule and a dashboard for one pipeline.

The alarms read the container's EMF metrics (names, units and dimensions from
:mod:`tiered_training.contract.metrics`, through :class:`TrainingMetricFactory`) with the stable
``Recipe`` dimension, plus SageMaker's own pipeline metric. Their periods, datapoints and
thresholds come from :func:`tiered_training.planning.alarms.fit_alarms` (the plan's step time and
the container's 60-second cadence); each states how soon it fires in its description.
See ``docs/monitoring.md``.

- ``ThroughputBelowPlan``: tokens/s per GPU below ``min_throughput_fraction`` of the plan;
- ``GpuUtilizationLow``: the least busy node's GPU utilisation during steps below
  ``min_gpu_utilization`` (a Metrics Insights query: nodes are ``algo-1..N``, N a parameter);
- ``MemoryNearlyFull``: the fullest node's peak memory above ``max_memory_fraction`` of HBM;
- ``LossDiverging``: loss above the ceiling (ln V + margin by default) or not finite;
- ``ValidationLossDiverging``: validation loss above the training loss by ``max_validation_gap``;
- ``Stalled``: the heartbeat says the run is alive, and no step has ended for the stall window;
- ``ExecutionFailed``: AWS/Sagemaker/ModelBuildingPipeline ExecutionFailed, on the dashboard
  only: the failed-execution rule sends the one notification of a failure, with the
  execution's ARN.

Missing data is *not breaching* everywhere: no datapoint means no run of this recipe.
No alarm may use a SEARCH expression (CloudWatch rejects them at deploy time although
synth, cfn-lint and moto accept them): :class:`NoSearchInAlarms` fails synth if one does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jsii
from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct, IConstruct, IValidation

from tiered_training.constructs.metric_factory import TrainingMetricFactory
from tiered_training.contract import metrics as catalogue
from tiered_training.planning import alarms as fitting
from tiered_training.recipe import names

if TYPE_CHECKING:
    from aws_cdk.interfaces.aws_events import IRuleRef

    from tiered_training.constructs.pipeline import TrainingPipeline
    from tiered_training.planning.plan import Plan

EXECUTION_STATUS_EVENT = "SageMaker Model Building Pipeline Execution Status Change"
CLOUDWATCH = "cloudwatch.amazonaws.com"
EVENTS = "events.amazonaws.com"
KEY_ACTIONS = ["kms:Decrypt", "kms:GenerateDataKey*"]
COMPARISON = {
    "GreaterThanThreshold": cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
    "GreaterThanOrEqualToThreshold": cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
    "LessThanThreshold": cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
}
MISSING = {
    "notBreaching": cloudwatch.TreatMissingData.NOT_BREACHING,
    "breaching": cloudwatch.TreatMissingData.BREACHING,
    "ignore": cloudwatch.TreatMissingData.IGNORE,
    "missing": cloudwatch.TreatMissingData.MISSING,
}


def grant_alarm_notifications(
    topic: sns.ITopic,
    *,
    alarm_arns: Sequence[str] = (),
    rule_arns: Sequence[str] = (),
    key: kms.IKey | None = None,
    topic_arns: Sequence[str] | None = None,
) -> None:
    """Let CloudWatch alarms and EventBridge rules of this account publish to ``topic``.

    The topic policy lets ``cloudwatch.amazonaws.com`` publish for ``alarm_arns`` and
    ``events.amazonaws.com`` for ``rule_arns`` (``aws:SourceArn``, wildcards allowed), both for
    this account only (``aws:SourceAccount``). With ``key`` (the topic's KMS key, when it is a
    key of this stack), its key policy lets both services use the key for SNS topics matching
    ``topic_arns`` only (default this account's topics in this region): SNS encrypts a
    topic's messages under the encryption context ``aws:sns:topicArn``
    (https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html). The key statements do
    not depend on the ``aws:Source*`` keys reaching KMS with the data-key requests of a
    delivery; the topic policy already admits only these alarms and rules.

    Imported topics and keys take no statements: their owner must allow the same.
    """
    stack = Stack.of(topic)
    this_account = {"aws:SourceAccount": stack.account}
    for service, sources in ((CLOUDWATCH, alarm_arns), (EVENTS, rule_arns)):
        if sources:
            topic.add_to_resource_policy(
                iam.PolicyStatement(
                    principals=[iam.ServicePrincipal(service)],
                    actions=["sns:Publish"],
                    resources=[topic.topic_arn],
                    conditions={"StringEquals": this_account, "ArnLike": {"aws:SourceArn": list(sources)}},
                )
            )
    services = [service for service, sources in ((CLOUDWATCH, alarm_arns), (EVENTS, rule_arns)) if sources]
    if key is None or not services:
        return
    context = {
        "kms:EncryptionContext:aws:sns:topicArn": list(topic_arns or [stack.format_arn(service="sns", resource="*")])
    }
    # In a key policy, Resource "*" means this key.
    key.add_to_resource_policy(
        iam.PolicyStatement(
            principals=[iam.ServicePrincipal(s) for s in services],
            actions=KEY_ACTIONS,
            resources=["*"],
            conditions={"StringLike": context},
        )
    )


def alarm_topic(
    scope: Construct,
    construct_id: str,
    *,
    display_name: str,
    topic_name: str,
    alarm_arns: Sequence[str],
    rule_arns: Sequence[str],
) -> sns.Topic:
    """An SNS topic named ``topic_name``, encrypted with its own key, that the given alarms and
    rules may publish to (:func:`grant_alarm_notifications`), over TLS only."""
    key = kms.Key(scope, f"{construct_id}Key", description=f"{display_name} alarms", enable_key_rotation=True)
    topic = sns.Topic(
        scope, construct_id, display_name=display_name, topic_name=topic_name, master_key=key, enforce_ssl=True
    )
    arn = Stack.of(scope).format_arn(service="sns", resource=topic_name)
    grant_alarm_notifications(topic, alarm_arns=alarm_arns, rule_arns=rule_arns, key=key, topic_arns=[arn])
    return topic


@jsii.implements(events.IRuleTarget)
class _TopicTarget:
    """An SNS topic as a rule target, without the unconditioned publish grant that
    ``aws_events_targets.SnsTopic`` adds (:func:`grant_alarm_notifications` scopes it to the rule)."""

    def __init__(self, topic: sns.ITopic, message: events.RuleTargetInput) -> None:
        self.topic, self.message = topic, message

    def bind(self, _rule: IRuleRef, _id: str | None = None) -> events.RuleTargetConfig:
        return events.RuleTargetConfig(arn=self.topic.topic_arn, input=self.message)


def _has_search(text: str) -> bool:
    return "SEARCH(" in text.upper().replace(" ", "")


@jsii.implements(IValidation)
class NoSearchInAlarms:
    """Synth-time check: no CloudWatch alarm under ``scope`` uses a SEARCH expression."""

    def __init__(self, scope: IConstruct) -> None:
        self.scope = scope

    def validate(self) -> list[str]:
        stack = Stack.of(self.scope)
        problems = []
        for child in self.scope.node.find_all():
            if isinstance(child, cloudwatch.CfnAlarm) and child.metrics is not None:
                if _has_search(json.dumps(stack.resolve(child.metrics))):
                    problems.append(
                        f"alarm {child.node.path} uses a SEARCH expression, which CloudWatch alarms reject at "
                        "deploy time; use a metric with fixed dimensions or a Metrics Insights query"
                    )
        return problems


class TrainingMonitoring(Construct):
    """Alarms, the failed-execution rule and a dashboard for one pipeline.

    :param pipeline: the TrainingPipeline; its Plan gives the plan numbers and thresholds.
    :param topic: where alarms and the failed-execution rule send; default a new encrypted topic
        (named ``<prefix><recipe>-alarms``) that only these alarms and this rule may publish to.
        A ``sns.Topic`` of this stack is given the same statements, and its key too when the
        key is a ``kms.Key`` of this stack (:func:`grant_alarm_notifications`). A topic of
        another stack or account (``sns.Topic.from_topic_arn``, ``monitoring.alarm_topic_arn``)
        is left as it is: its policy must let ``cloudwatch.amazonaws.com`` publish with
        ``aws:SourceArn`` one of ``alarm_arns`` and ``events.amazonaws.com`` with ``aws:SourceArn``
        ``failed_rule_arn`` (both ``aws:SourceAccount`` this account), and an encrypting key
        must let both services use ``kms:Decrypt`` and ``kms:GenerateDataKey*``
        (docs/monitoring.md, "A topic of your own").
    :param stage: prefixes the alarm, rule, dashboard and topic names (``tiered_training.recipe.names``);
        default none.
    :param alarm_email: subscribe this address to the topic; default the recipe's
        ``monitoring.alarm_email``.
    :param dashboard: make a CloudWatch dashboard; default True.
    :param cadence_seconds: the container's metric cadence the alarms are fitted to;
        default the RunConfig's (60 s).

    Attributes: ``alarms`` (alarm ID -> ``cloudwatch.Alarm``), ``fit`` (the
    :class:`tiered_training.planning.alarms.AlarmPlan`), ``failed_rule`` (``events.Rule``),
    ``dashboard`` (``cloudwatch.Dashboard`` or None), ``topic`` (``sns.ITopic``),
    ``metrics`` (the TrainingMetricFactory), ``alarm_arns`` (of the alarms that notify),
    ``failed_rule_arn``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        pipeline: TrainingPipeline,
        topic: sns.ITopic | None = None,
        alarm_email: str | None = None,
        dashboard: bool = True,
        cadence_seconds: float = catalogue.DEFAULT_INTERVAL_SECONDS,
        stage: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        plan: Plan = pipeline.plan
        assert plan.estimates is not None
        self.plan = plan
        self.pipeline = pipeline
        self.fit = fitting.fit_alarms(plan, cadence_seconds)
        self.metrics = TrainingMetricFactory(plan.name, pipeline_name=pipeline.pipeline_name)
        self.stage = stage
        stack = Stack.of(self)
        recipe = plan.name
        self.alarm_arns = [
            stack.format_arn(
                service="cloudwatch",
                resource="alarm",
                resource_name=names.alarm_name(recipe, name, stage),
                arn_format=ArnFormat.COLON_RESOURCE_NAME,
            )
            for name, alarm_fit in self.fit.alarms.items()
            if alarm_fit.notifies
        ]
        rule_name = names.failed_rule_name(recipe, stage)
        self.failed_rule_arn = stack.format_arn(service="events", resource="rule", resource_name=rule_name)
        if topic is None:
            topic = alarm_topic(
                self,
                "Topic",
                display_name=names.topic_display_name(recipe),
                topic_name=names.topic_name(recipe, stage),
                alarm_arns=self.alarm_arns,
                rule_arns=[self.failed_rule_arn],
            )
        elif isinstance(topic, sns.Topic) and Stack.of(topic) is stack:
            key = topic.master_key
            grant_alarm_notifications(
                topic,
                alarm_arns=self.alarm_arns,
                rule_arns=[self.failed_rule_arn],
                key=key if isinstance(key, kms.Key) and Stack.of(key) is stack else None,
            )
        self.topic: sns.ITopic = topic
        email = alarm_email or plan.recipe.monitoring.alarm_email
        if email:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        action = cloudwatch_actions.SnsAction(self.topic)

        m, fit = self.metrics, self.fit

        def period(name: str) -> Duration:
            return Duration.seconds(fit[name].period_seconds)

        watched: dict[str, cloudwatch.IMetric] = {
            fitting.THROUGHPUT: m.tokens_per_second_per_gpu(period=period(fitting.THROUGHPUT)),
            fitting.GPU_UTILIZATION: m.least_gpu_utilization(period=period(fitting.GPU_UTILIZATION)),
            fitting.MEMORY: m.most_memory(period=period(fitting.MEMORY)),
            fitting.LOSS: m.loss_or_nan(period=period(fitting.LOSS)),
            fitting.STALLED: m.stalled(fit.stall_min_reports, period=period(fitting.STALLED)),
            fitting.EXECUTION_FAILED: m.execution_failed(period=period(fitting.EXECUTION_FAILED)),
            # the window's highest score: below the threshold only when the slow rank stayed slow throughout
            fitting.GPU_FAULT: m.gpu_xid_events(period=period(fitting.GPU_FAULT)),
            fitting.GPU_SLOWDOWN: m.insights(
                catalogue.GPU_SLOWDOWN, "MAX", period=period(fitting.GPU_SLOWDOWN), label="slowdown, any GPU"
            ),
            fitting.STRAGGLER: m.metric(
                catalogue.STRAGGLER_SCORE, statistic="Maximum", period=period(fitting.STRAGGLER)
            ),
        }
        if fitting.VALIDATION in fit.alarms:
            watched[fitting.VALIDATION] = m.validation_gap(period=period(fitting.VALIDATION))
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        for name, alarm_fit in fit.alarms.items():
            alarm = cloudwatch.Alarm(
                self,
                name,
                alarm_name=names.alarm_name(recipe, name, stage),
                metric=watched[name],
                threshold=alarm_fit.threshold,
                comparison_operator=COMPARISON[alarm_fit.comparison],
                evaluation_periods=alarm_fit.evaluation_periods,
                datapoints_to_alarm=alarm_fit.datapoints_to_alarm,
                treat_missing_data=MISSING[alarm_fit.treat_missing_data],
                alarm_description=(
                    f"{plan.name}: {alarm_fit.condition}; fires within "
                    f"{alarm_fit.fires_within_seconds // 60} min of the condition (docs/monitoring.md)"
                ),
            )
            if alarm_fit.notifies:
                alarm.add_alarm_action(action)
            self.alarms[name] = alarm

        # One notification per failed execution, naming it.
        self.failed_rule = events.Rule(
            self,
            "FailedExecutions",
            rule_name=rule_name,
            description=f"Failed executions of pipeline {pipeline.pipeline_name}",
            event_pattern=events.EventPattern(
                source=["aws.sagemaker"],
                detail_type=[EXECUTION_STATUS_EVENT],
                # The events carry pipelineArn, not the pipeline name.
                detail={"pipelineArn": [pipeline.pipeline_arn], "currentPipelineExecutionStatus": ["Failed"]},
            ),
        )
        self.failed_rule.add_target(
            _TopicTarget(
                self.topic,
                events.RuleTargetInput.from_text(
                    f"tiered-training {plan.name}: pipeline execution "
                    f"{events.EventField.from_path('$.detail.pipelineExecutionArn')} failed."
                ),
            )
        )
        self.dashboard = self._dashboard() if dashboard else None
        self.node.add_validation(NoSearchInAlarms(self))

    def alarm(self, construct_id: str) -> cloudwatch.IAlarm:
        """One of this construct's alarms (for composite alarms, widgets, actions)."""
        return self.alarms[construct_id]

    def _dashboard(self) -> cloudwatch.Dashboard:
        plan, m = self.plan, self.metrics
        assert plan.estimates is not None
        mon = plan.recipe.monitoring
        rate = plan.estimates.tokens_per_second_per_gpu
        text = (
            f"## {plan.name}\n{plan.model_name} ({plan.tier.name} tier) on {plan.nodes} x {plan.instance.name}, "
            f"{plan.precision}, AC {plan.activation_checkpointing}, micro-batch {plan.micro_batch_size}. "
            f"Plan: {rate:,.0f} tokens/s per GPU, MFU {plan.estimates.mfu:.0%}, step "
            f"{plan.estimates.step_time_seconds:,.1f} s, "
            f"{plan.estimates.total_steps:,} steps, {plan.estimates.wall_time_hours:,.1f} h."
        )

        def line(value: float, label: str, color: str | None = None) -> cloudwatch.HorizontalAnnotation:
            return cloudwatch.HorizontalAnnotation(value=value, label=label, color=color)

        def graph(
            title: str, left: list, right: list | None = None, annotations: list | None = None
        ) -> cloudwatch.GraphWidget:
            return cloudwatch.GraphWidget(
                title=title, left=left, right=right or [], left_annotations=annotations or [], width=12, height=6
            )

        dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=names.dashboard_name(plan.name, self.stage))
        dashboard.add_widgets(
            cloudwatch.TextWidget(markdown=text, width=24, height=2),
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms.values()), width=24, height=3),
        )
        dashboard.add_widgets(
            graph(
                "Tokens/s per GPU",
                [m.tokens_per_second_per_gpu()],
                annotations=[
                    line(round(rate, 2), "plan"),
                    line(round(rate * mon.min_throughput_fraction, 2), "alarm", "#d62728"),
                ],
            ),
            graph(
                "MFU (BF16-equivalent)",
                [m.metric(catalogue.MFU)],
                annotations=[line(round(plan.estimates.mfu * 100, 2), "plan")],
            ),
        )
        dashboard.add_widgets(
            graph(
                "Loss",
                [m.metric(catalogue.LOSS), m.metric(catalogue.VALIDATION_LOSS)],
                right=[m.metric(catalogue.GRAD_NORM)],
                annotations=[line(self.fit.loss_ceiling, "ceiling", "#d62728")],
            ),
            graph(
                "Progress and step time",
                [m.metric(catalogue.PROGRESS, statistic="Maximum")],
                right=[m.metric(catalogue.STEP_TIME), m.metric(catalogue.DATA_WAIT_FRACTION)],
            ),
        )
        dashboard.add_widgets(
            graph(
                "GPU utilisation during steps, by node (%)",
                [m.insights(catalogue.GPU_UTILIZATION, "AVG", group_by_node=True, label="GPU utilisation")],
                annotations=[line(mon.min_gpu_utilization, "alarm")],
            ),
            graph(
                "Peak GPU memory by node (% of HBM)",
                [m.insights(catalogue.PEAK_MEMORY_FRACTION, "MAX", group_by_node=True, label="peak memory")],
                annotations=[
                    line(round(plan.memory.fraction * 100, 2) if plan.memory else 0.0, "plan"),
                    line(round(mon.max_memory_fraction * 100, 2), "alarm"),
                ],
            ),
        )
        dashboard.add_widgets(
            graph(
                "Straggler score by host (fastest rank's step time over the host's slowest rank's)",
                [m.insights(catalogue.HOST_STRAGGLER_SCORE, "MIN", group_by_node=True, label="straggler score")],
                annotations=[line(fitting.STRAGGLER_THRESHOLD, "alarm", "#d62728")],
            ),
            graph(
                "Slowest rank's straggler score",
                [m.metric(catalogue.STRAGGLER_SCORE, statistic="Minimum")],
                annotations=[line(fitting.STRAGGLER_THRESHOLD, "alarm", "#d62728")],
            ),
        )
        dashboard.add_widgets(
            graph(
                "SM clock by host (% of max, slowest GPU) and throttling (1 = held)",
                [m.insights(catalogue.GPU_SM_CLOCK, "MIN", group_by_node=True, label="SM clock")],
                right=[
                    m.insights(catalogue.GPU_THROTTLE_THERMAL, "MAX", group_by_node=True, label="thermal"),
                    m.insights(catalogue.GPU_THROTTLE_POWER, "MAX", group_by_node=True, label="power"),
                    m.insights(catalogue.GPU_THROTTLE_HARDWARE, "MAX", group_by_node=True, label="hardware"),
                    m.insights(catalogue.GPU_SLOWDOWN, "MAX", group_by_node=True, label="slowdown (alarm)"),
                ],
            ),
            graph(
                "GPU temperature (hottest GPU, C) and errors by host",
                [m.insights(catalogue.GPU_TEMPERATURE, "MAX", group_by_node=True, label="temperature")],
                right=[
                    m.insights(catalogue.GPU_XID, "SUM", group_by_node=True, label="XID events"),
                    m.insights(catalogue.GPU_ECC_UNCORRECTED, "MAX", group_by_node=True, label="uncorrected ECC"),
                    m.insights(catalogue.GPU_REMAP_FAILED, "MAX", group_by_node=True, label="row remap failed"),
                ],
            ),
        )
        dashboard.add_widgets(
            graph("SageMaker host GPU utilisation (all training jobs)", [m.host_insights("GPUUtilization")]),
            graph(
                "SageMaker host GPU memory utilisation (all training jobs)", [m.host_insights("GPUMemoryUtilization")]
            ),
        )
        return dashboard
