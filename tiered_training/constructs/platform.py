"""TrainingPlatform: what many recipes share (checkpoint store, image, alarm topic), and the stacks.

A platform repo composes one :class:`PlatformStack` and one :class:`RecipeStack` per
recipe: 50 recipes, one bucket, one image, one topic. A stack of your own can hold the
same constructs directly (see ``examples/platform-repo/``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aws_cdk import Annotations, ArnFormat, Stack, Tags
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from constructs import Construct

from tiered_training.constructs.checkpoint_store import CheckpointStore, CheckpointStoreProps
from tiered_training.constructs.image import TrainingImage
from tiered_training.constructs.monitoring import TrainingMonitoring, alarm_topic
from tiered_training.constructs.pipeline import TrainingPipeline

if TYPE_CHECKING:
    from tiered_training.planning.plan import Plan

from tiered_training.recipe import names
from tiered_training.recipe.names import stack_name


class TrainingPlatform(Construct):
    """The shared pieces.

    Props (all optional):

    - ``store``: a CheckpointStore to share; default one made from ``store_props``
      (:class:`CheckpointStoreProps`: an ``IBucket`` and ``IKey`` of your own, or the
      settings of a new bucket; default a new bucket and key).
    - ``image``: a TrainingImage; default the packaged container, or the image at
      ``image_uri`` when given. ``region`` picks the packaged build's base image.
    - ``topic``: the shared alarm topic (an ``ITopic``); default a new encrypted topic, named
      ``<prefix>platform_alarms``, that this account's alarms and EventBridge rules named
      ``<prefix>*`` may publish to (``<prefix>``: ``tiered_training.recipe.names.name_prefix``).
      A topic of your own must allow what :class:`TrainingMonitoring` describes.
    - ``stage``: prefixes the topic's name and the names it admits; default none.
    - ``alarm_email``: subscribed to the shared topic; default none.
    - ``alarm_subscriptions``: more subscriptions to the shared topic (``sns.ITopicSubscription``);
      default none. Without any (and without a ``topic`` passed in), recipes that name no
      alarm address of their own notify no one: each such recipe stack carries a warning.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        store: CheckpointStore | None = None,
        store_props: CheckpointStoreProps | None = None,
        image: TrainingImage | None = None,
        image_uri: str | None = None,
        region: str | None = None,
        topic: sns.ITopic | None = None,
        alarm_email: str | None = None,
        alarm_subscriptions: list[sns.ITopicSubscription] | None = None,
        stage: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.stage = stage
        self.store = store or CheckpointStore.from_props(self, "Store", store_props)
        self.image = image or TrainingImage(self, "Image", image_uri=image_uri, region=region)
        given_topic = topic is not None
        if topic is None:
            stack, prefix = Stack.of(self), names.name_prefix(stage)
            # The recipes' alarms and rules live in their own stacks: admit them by name prefix.
            topic = alarm_topic(
                self,
                "AlarmTopic",
                display_name="tiered-training platform",
                topic_name=names.platform_topic_name(stage),
                alarm_arns=[
                    stack.format_arn(
                        service="cloudwatch",
                        resource="alarm",
                        resource_name=f"{prefix}*",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                ],
                rule_arns=[stack.format_arn(service="events", resource="rule", resource_name=f"{prefix}*")],
            )
        self.topic: sns.ITopic = topic
        subscribers = list(alarm_subscriptions or [])
        if alarm_email:
            from aws_cdk import aws_sns_subscriptions as subscriptions

            subscribers.append(subscriptions.EmailSubscription(alarm_email))
        for subscription in subscribers:
            self.topic.add_subscription(subscription)
        # A topic passed in is the caller's: assume someone listens to it.
        self.alarms_reach_someone = given_topic or bool(subscribers)
        self._recipes: list[RecipeStack] = []
        self._operators: list[Any] = []

    def grant_operate(self, grantee: iam.IRole | iam.IUser | iam.IGroup) -> iam.Grant:
        """Let ``grantee`` run the ``tiered-training`` commands on every recipe of this platform,
        those built so far and those built later: each :class:`RecipeStack` gets a managed policy
        (construct ID ``Operate``), filled by its pipeline's :meth:`TrainingPipeline.grant_operate`
        and attached to the grantee. The policy lives in the recipe's stack, which already depends on
        the platform's, so no stack depends on a recipe's. Returns the grants made so far."""
        self._operators.append(grantee)
        grant = iam.Grant.drop(grantee, "the recipes built later are granted as they are built")
        for recipe in self._recipes:
            grant = grant.combine(recipe.grant_operate(grantee))
        return grant

    def _add_recipe(self, recipe: RecipeStack) -> None:
        self._recipes.append(recipe)
        for grantee in self._operators:
            recipe.grant_operate(grantee)


@dataclass(frozen=True)
class PlatformProps:
    """What :class:`PlatformStack` (and ``build_app``) pass to its TrainingPlatform.

    - ``image_uri``: an existing ECR image; default the packaged container, built at deploy.
    - ``region``: picks the packaged build's base image; default the Dockerfile's.
    - ``alarm_email``: subscribed to the shared topic; default none.
    - ``store``: the new checkpoint store's settings; default :class:`CheckpointStoreProps`'s.
    - ``stage``: prefixes the platform's names (``cdk synth -c stage=dev``); default none.
    """

    image_uri: str | None = None
    region: str | None = None
    alarm_email: str | None = None
    store: CheckpointStoreProps = field(default_factory=CheckpointStoreProps)
    stage: str | None = None


class PlatformStack(Stack):
    """A stack that holds one TrainingPlatform (construct ID ``Platform``), made from ``props``.

    Termination protection is on by default: the stack holds the checkpoint store that every
    recipe writes to (pass ``termination_protection=False`` to turn it off).
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: PlatformProps | None = None, **kwargs: Any):
        kwargs.setdefault("termination_protection", True)
        super().__init__(scope, construct_id, **kwargs)
        props = props or PlatformProps()
        self.platform = TrainingPlatform(
            self,
            "Platform",
            store_props=props.store,
            image_uri=props.image_uri,
            region=props.region,
            alarm_email=props.alarm_email,
            stage=props.stage,
        )
        Tags.of(self).add("tiered-training:component", "platform")


class RecipeStack(Stack):
    """One recipe: its pipeline (with roles) and monitoring, on a shared platform.

    Alarms go to the recipe's ``monitoring.alarm_topic_arn`` when it names one (its policy is
    the owner's to set: see :class:`TrainingMonitoring` and docs/monitoring.md); else to
    a topic of the recipe's own when it names an ``alarm_email`` (so that the address
    gets only this recipe's alarms); else to the platform's topic. The platform's stage
    prefixes the pipeline's name and the monitoring's names.
    """

    def __init__(self, scope: Construct, construct_id: str, *, plan: Plan, platform: TrainingPlatform, **kwargs: Any):
        kwargs.setdefault("description", f"tiered-training recipe {plan.name}")
        super().__init__(scope, construct_id, **kwargs)
        plan.require_ok()
        self.plan = plan
        stage = platform.stage
        self.pipeline = TrainingPipeline(
            self,
            "Pipeline",
            plan=plan,
            store=platform.store,
            image=platform.image,
            pipeline_name=names.pipeline_name(plan.name, stage),
        )
        mon = plan.recipe.monitoring
        topic: sns.ITopic | None
        if mon.alarm_topic_arn:
            topic = sns.Topic.from_topic_arn(self, "AlarmTopic", mon.alarm_topic_arn)
        elif mon.alarm_email:
            topic = None  # TrainingMonitoring makes one and subscribes the address
        else:
            topic = platform.topic
        self.monitoring = TrainingMonitoring(self, "Monitoring", pipeline=self.pipeline, topic=topic, stage=stage)
        self._operate: iam.ManagedPolicy | None = None
        platform._add_recipe(self)
        from tiered_training.planning.alarms import routing_findings

        for finding in routing_findings(plan, platform.alarms_reach_someone):
            Annotations.of(self).add_warning_v2(
                f"tiered-training:{finding.code}", f"{finding.message}. Fix: {finding.fix}."
            )
        from tiered_training.planning.quotas import FINDING_CODE

        quota_findings = [f for f in plan.findings if f.code == FINDING_CODE]  # quotas a deploy needs raised
        self.quota_warnings: list[str] = []  # their annotation IDs
        for index, finding in enumerate(quota_findings):
            self.quota_warnings.append(f"tiered-training:{finding.code}:{index}")
            Annotations.of(self).add_warning_v2(self.quota_warnings[-1], f"{finding.message}. Fix: {finding.fix}.")
        for key, value in plan.recipe.tags.items():
            Tags.of(self).add(key, value)
        Tags.of(self).add("tiered-training:recipe", plan.name)

    def acknowledge_quota_warnings(self, reason: str) -> None:
        """Acknowledge this recipe's quota warnings (CDK's ``Annotations.acknowledge_warning``): for an app
        whose user has them already, as ``tiered-training plan``'s quota table, so synth does not repeat them."""
        for warning in self.quota_warnings:
            Annotations.of(self).acknowledge_warning(warning, reason)

    def grant_operate(self, grantee: iam.IRole | iam.IUser | iam.IGroup) -> iam.Grant:
        """Attach this recipe's operator policy (``Operate``, made on first use and filled by the
        pipeline's :meth:`TrainingPipeline.grant_operate`) to ``grantee``."""
        first = self._operate is None
        if self._operate is None:
            self._operate = iam.ManagedPolicy(
                self, "Operate", description=f"Run the tiered-training commands on recipe {self.plan.name}"
            )
        policy: Any = self._operate  # attach_to_*: a role, user or group by duck type (jsii interfaces)
        if hasattr(grantee, "role_name"):
            policy.attach_to_role(grantee)
        elif hasattr(grantee, "user_name"):
            policy.attach_to_user(grantee)
        elif hasattr(grantee, "group_name"):
            policy.attach_to_group(grantee)
        else:
            raise TypeError("grant_operate: give a role, a user or a group (an iam.ManagedPolicy: use the pipeline's)")
        if first:
            self._operate_grant = self.pipeline.grant_operate(self._operate)
        return self._operate_grant


def stack_id(recipe_name: str, stage: str | None = None) -> str:
    return stack_name(recipe_name, stage)
