"""TrainingPipeline: a SageMaker Pipeline (Probe -> Gate -> Train | Fail) built from a Plan.

The definition comes from :func:`tiered_training.pipeline.definition.build_definition`, a
pure function; this construct embeds it with ``Stack.to_json_string`` (which turns
role ARNs and bucket names into ``Fn::Join``) as a plain PascalCase dict, and
registers a validation that checks every Training step against botocore's
CreateTrainingJob shape, names, references and the body size at synth.

``TrainingPipeline`` is an ``aws_sagemaker.IPipeline``, so EventBridge Scheduler's
``aws_scheduler_targets.SageMakerStartPipelineExecution`` and any other integration
that takes an ``IPipeline`` can start it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jsii
from aws_cdk import ArnFormat, Aws, CfnMapping, CfnTag, Resource, Stack, Token
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk.interfaces import aws_sagemaker as sagemaker_refs
from constructs import Construct, IValidation

from tiered_training.constructs.checkpoint_store import COMMIT_MARKER, CheckpointStore, runs_prefix, via_services
from tiered_training.constructs.image import TrainingImage
from tiered_training.constructs.metric_factory import TrainingMetricFactory
from tiered_training.constructs.nag import LateAcknowledgements
from tiered_training.constructs.roles import TRAINING_LOG_GROUP, TrainingRoles, as_grantee, prefix_arns
from tiered_training.contract.container import LEASE_NAME
from tiered_training.pipeline import definition as d
from tiered_training.pipeline import validation

if TYPE_CHECKING:
    from tiered_training.planning.plan import Plan


_botocore_loader: threading.Thread | None = None


def _load_botocore_model() -> None:
    try:
        validation.validate_training_arguments({})  # imports botocore and loads the CreateTrainingJob shape (cached)
    except Exception:  # the validation at synth reports any real problem
        pass


def _prefetch_botocore_model() -> None:
    """Load botocore's SageMaker model (about 0.4 s, once per process) in a thread while the
    constructs are built: that time is mostly spent waiting for the jsii runtime, so it overlaps."""
    global _botocore_loader
    if _botocore_loader is None:
        _botocore_loader = threading.Thread(target=_load_botocore_model, name="tiered-training-botocore", daemon=True)
        _botocore_loader.start()


@jsii.implements(IValidation)
class _DefinitionValidation:
    def __init__(self, pipeline: TrainingPipeline) -> None:
        self.pipeline = pipeline
        _prefetch_botocore_model()

    def validate(self) -> list[str]:
        if _botocore_loader is not None:
            _botocore_loader.join()
        problems = validation.validate_definition(self.pipeline.definition)
        return [f"pipeline {self.pipeline.plan.name}: {p}" for p in problems]


@jsii.implements(sagemaker.IPipeline)
class TrainingPipeline(Resource):
    """One recipe's SageMaker pipeline.

    Props:

    - ``plan``: a Plan without errors (``PlanError`` otherwise).
    - ``image``: the TrainingImage.
    - ``store``: the CheckpointStore; each run's checkpoints go under
      ``<recipe>/checkpoints/runs/<run id>/`` (docs/runs.md). Or
      ``bucket`` (an ``IBucket``) and ``encryption_key`` (an ``IKey``; default the bucket's
      key). Default a new CheckpointStore.
    - ``execution_role``: the role the training jobs assume (an ``IRole``); default a new
      role. Either way it is granted what the jobs need (see :class:`TrainingRoles`).
    - ``pipeline_role``: the role the pipeline assumes; default a new role, granted the same way.
    - ``data_key``: the KMS key of the training data; default the recipe's ``data.kms_key_arn``, if any.
    - ``vpc``: run the training jobs in this VPC; default none (SageMaker's network).
    - ``vpc_subnets``: which of its subnets; default the VPC's private subnets.
    - ``security_groups``: default a new group whose members may reach each other (the
      hosts of a distributed job must), with all outbound traffic allowed.
    - ``pipeline_name``: default the recipe name (create-only: renaming replaces the pipeline).
    - ``max_parallel_steps``: ParallelismConfiguration; default 1 (the steps run one after another).

    With ``registry.enabled`` (the default) the recipe's model package group, named as the pipeline, is created
    here (``AWS::SageMaker::ModelPackageGroup``); each run chain ends with a Register step that adds a package
    to it (pending manual approval unless ``registry.approval`` says otherwise), whose inference image is the
    recipe's ``registry.serving_image``, else the LMI container of the stack's region (a ``CfnMapping`` of
    ``catalog/serving_images.yaml``). The pipeline role may create packages in this group only, with the recipe's
    approval status; :meth:`grant_models` lets operators list and approve them.

    Attributes: ``pipeline_name``, ``pipeline_arn``, ``roles`` (the :class:`TrainingRoles`),
    ``execution_role``, ``pipeline_role``, ``store``, ``connections`` (``ec2.Connections``,
    when in a VPC), ``resource`` (the ``CfnPipeline``), ``definition`` (the pipeline body),
    ``model_package_group`` (the ``CfnModelPackageGroup``, or None without registration),
    ``model_package_group_arn`` and ``model_packages_arn`` (its packages, ``model-package/<group>/*``).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        plan: Plan,
        image: TrainingImage,
        store: CheckpointStore | None = None,
        bucket: s3.IBucket | None = None,
        encryption_key: kms.IKey | None = None,
        execution_role: iam.IRole | None = None,
        pipeline_role: iam.IRole | None = None,
        data_key: kms.IKey | None = None,
        vpc: ec2.IVpc | None = None,
        vpc_subnets: ec2.SubnetSelection | None = None,
        security_groups: Sequence[ec2.ISecurityGroup] | None = None,
        pipeline_name: str | None = None,
        max_parallel_steps: int = 1,
    ) -> None:
        plan.require_ok()
        recipe = plan.recipe
        name = pipeline_name or recipe.name
        super().__init__(scope, construct_id, physical_name=name)
        if store is not None and (bucket is not None or encryption_key is not None):
            raise ValueError("TrainingPipeline: give store, or bucket (and encryption_key), not both")
        if vpc is None and (vpc_subnets is not None or security_groups):
            raise ValueError("TrainingPipeline: vpc_subnets and security_groups need a vpc")
        self.plan = plan
        self._name = name
        if store is None:
            store = CheckpointStore(self, "Store", bucket=bucket, encryption_key=encryption_key)
        self.store = store
        store.expire_pruned_checkpoints(recipe.name)
        if data_key is None and recipe.data.kms_key_arn:
            data_key = kms.Key.from_key_arn(self, "DataKey", recipe.data.kms_key_arn)

        subnet_ids: list[str] = []
        self.connections: ec2.Connections | None = None
        subnets: list[ec2.ISubnet] = []
        if vpc is not None:
            selected = vpc.select_subnets(**_selection_kwargs(vpc_subnets))
            subnets, subnet_ids = list(selected.subnets), list(selected.subnet_ids)
            if not security_groups:
                group = ec2.SecurityGroup(
                    self,
                    "SecurityGroup",
                    vpc=vpc,
                    allow_all_outbound=True,
                    description=f"SageMaker training jobs of recipe {recipe.name}",
                )
                group.add_ingress_rule(group, ec2.Port.all_traffic(), "the hosts of one training job")
                security_groups = [group]
            self.connections = ec2.Connections(security_groups=list(security_groups))

        # With data.prepare the training jobs read the prepared shards in the store, not the raw examples.
        raw = recipe.data.prepare is not None
        data_uris = [] if raw else list(recipe.data.data_prefixes)
        data_uris += [recipe.model.init_checkpoint] if recipe.model.init_checkpoint else []
        data_uris += [recipe.data.validation_uri] if recipe.data.validation_uri else []
        self._image, self._data_uris, self._data_key = image, data_uris, data_key
        self.roles = TrainingRoles(
            self,
            "Roles",
            recipe_name=recipe.name,
            store=store,
            image=image,
            data_uris=data_uris,
            data_key=data_key,
            vpc=vpc,
            subnets=subnets,
            security_groups=list(security_groups or ()),
            execution_role=execution_role,
            pipeline_role=pipeline_role,
            mlflow_tracking_server_arn=recipe.tracking.mlflow_tracking_server_arn,
            training_plan_arn=recipe.compute.training_plan_arn,
            raw_uris=recipe.data.data_prefixes if recipe.data.prepare is not None else (),
            tokenizer_uri=(recipe.data.tokenizer or recipe.model.init_checkpoint)
            if recipe.data.prepare is not None
            else None,
        )
        self.execution_role: iam.IRole = self.roles.execution_role
        self.pipeline_role: iam.IRole = self.roles.pipeline_role
        self.prepare_role: iam.IRole | None = self.roles.prepare_role
        self.model_package_group: sagemaker.CfnModelPackageGroup | None = None
        serving_image: str | None = None
        if recipe.registry.enabled:
            self.model_package_group = sagemaker.CfnModelPackageGroup(
                self,
                "ModelPackageGroup",
                model_package_group_name=name,
                model_package_group_description=f"Models trained by tiered-training recipe {recipe.name}"[:1024],
                tags=[CfnTag(key=k, value=v) for k, v in d.tags_for(plan).items()],
            )
            if recipe.registry.serving_image is None:
                serving_image = _serving_image(self)
        self.resources = d.PipelineResources(
            role_arn=self.execution_role.role_arn,
            prepare_role_arn=self.prepare_role.role_arn if self.prepare_role is not None else None,
            image_uri=image.image_uri,
            checkpoint_s3_uri=store.checkpoint_uri(recipe.name),
            output_s3_uri=store.output_uri(recipe.name),
            kms_key_id=store.encryption_key_arn,
            subnets=tuple(subnet_ids),
            security_group_ids=tuple(g.security_group_id for g in security_groups or ()),
            model_package_group=name,
            serving_image_uri=serving_image,
        )
        self.definition: dict[str, Any] = d.build_definition(plan, self.resources)
        stack = Stack.of(self)
        self.resource = sagemaker.CfnPipeline(
            self,
            "Resource",
            pipeline_name=name,
            pipeline_display_name=name,
            pipeline_description=(recipe.description or f"tiered-training recipe {recipe.name}")[:3072],
            role_arn=self.pipeline_role.role_arn,
            # Plain PascalCase dicts: the typed Property classes render camelCase keys, which CloudFormation rejects.
            pipeline_definition={"PipelineDefinitionBody": stack.to_json_string(self.definition)},
            parallelism_configuration={"MaxParallelExecutionSteps": max_parallel_steps},
            tags=[CfnTag(key=k, value=v) for k, v in d.tags_for(plan).items()],
        )
        # SageMaker lowercases the name in a pipeline's ARN.
        self._arn = stack.format_arn(
            service="sagemaker",
            resource="pipeline",
            resource_name=name.lower(),
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        )
        self.metrics = TrainingMetricFactory(recipe.name, pipeline_name=name)
        # SageMaker lowercases the group's name in its ARNs and in its packages' (model-package/<group>/<version>).
        self.model_package_group_arn = stack.format_arn(
            service="sagemaker", resource="model-package-group", resource_name=name.lower()
        )
        self.model_packages_arn = stack.format_arn(
            service="sagemaker", resource="model-package", resource_name=f"{name.lower()}/*"
        )
        if self.model_package_group is not None:
            self.grant_register(self.pipeline_role)
            self.resource.add_dependency(self.model_package_group)
            registered = LateAcknowledgements()
            registered.add(
                self.pipeline_role,
                self.model_packages_arn,
                "SageMaker numbers the packages of the recipe's group (model-package/<group>/<version>)",
            )
            self.node.add_validation(registered)
        self.node.add_validation(_DefinitionValidation(self))

    # -- IPipeline -------------------------------------------------------------------------

    @property
    def pipeline_name(self) -> str:
        return self._name

    @property
    def pipeline_arn(self) -> str:
        return self._arn

    @property
    def pipeline_ref(self) -> sagemaker_refs.PipelineReference:
        return sagemaker_refs.PipelineReference(pipeline_name=self._name)

    def grant_start_pipeline_execution(self, grantee: iam.IGrantable) -> iam.Grant:
        """Start executions of this pipeline (what EventBridge Scheduler's target needs)."""
        return iam.Grant.add_to_principal(
            grantee=grantee, actions=["sagemaker:StartPipelineExecution"], resource_arns=[self._arn]
        )

    # -- grants ----------------------------------------------------------------------------

    def grant_register(self, grantee: iam.IGrantable) -> iam.Grant:
        """Create model packages in this recipe's group only, with the recipe's approval status (what the Register
        steps do, as the pipeline role): a pipeline cannot approve its own model unless the recipe says so."""
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["sagemaker:CreateModelPackage"],
            resource_arns=[self.model_packages_arn, self.model_package_group_arn],
            conditions={"StringEquals": {"sagemaker:ModelApprovalStatus": self.plan.recipe.registry.approval}},
        )

    def grant_models(self, grantee: iam.IGrantable) -> iam.Grant:
        """List, describe and approve (or reject) the packages of this recipe's group (``tiered-training models``).
        ``sagemaker:ListModelPackages`` takes no resource that names the group: ``*`` (it lists packages' names and
        statuses; describing or changing one needs this group's ARN)."""
        grant = iam.Grant.add_to_principal(
            grantee=grantee, actions=["sagemaker:ListModelPackages"], resource_arns=["*"]
        )
        grant = grant.combine(
            iam.Grant.add_to_principal(
                grantee=grantee,
                actions=["sagemaker:DescribeModelPackage", "sagemaker:UpdateModelPackage"],
                resource_arns=[self.model_packages_arn],
            )
        )
        return grant.combine(
            iam.Grant.add_to_principal(
                grantee=grantee,
                actions=["sagemaker:DescribeModelPackageGroup"],
                resource_arns=[self.model_package_group_arn],
            )
        )

    def grant_start_execution(self, grantee: iam.IGrantable) -> iam.Grant:
        """Start, describe, list and stop executions of this pipeline (what ``tiered-training start`` does)."""
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=[
                "sagemaker:StartPipelineExecution",
                "sagemaker:DescribePipeline",
                "sagemaker:ListPipelineExecutions",
                "sagemaker:ListPipelineExecutionSteps",
                "sagemaker:DescribePipelineExecution",
                "sagemaker:StopPipelineExecution",
            ],
            resource_arns=[self._arn, f"{self._arn}/execution/*"],
        )

    def grant_operate(
        self, grantee: iam.IGrantable | iam.ManagedPolicy, *, prices: bool = True, logs: bool = True
    ) -> iam.Grant:
        """What the ``tiered-training`` commands call for this recipe, and nothing more: ``start``
        (with ``--resume``), ``status``, ``logs``, ``stop``, ``preflight`` and ``models`` (:meth:`grant_models`);
        and ``prices``
        (``pricing:GetProducts``) unless ``prices=False``. ``grantee``: a role, user or group, or an
        ``iam.ManagedPolicy`` to fill. ``logs=False`` leaves out the log reads (default: granted): they are the
        one read no condition limits to this recipe (any pipeline job's streams in the account and region).

        - the pipeline: :meth:`grant_start_execution`;
        - ``status``, ``start``: ``cloudwatch:GetMetricData`` (and ``cloudwatch:ListMetrics``: the ranks' straggler
          scores); the recipe's runs in the store
          (:meth:`CheckpointStore.grant_runs_read`); ``status``, ``explain --run`` and ``calibrate --from-runs``:
          ``sagemaker:DescribeTrainingJob`` on this recipe's jobs (tagged ``tiered-training:recipe`` by the
          pipeline; the Probe's measurements); ``calibrate --from-runs``: this recipe's overlay;
        - ``logs``: ``logs:DescribeLogStreams`` on the training jobs' log group, ``logs:GetLogEvents`` on its
          pipeline jobs' streams (``pipelines-*``: no condition narrows them to one recipe);
        - ``preflight``: the SageMaker quotas (Service Quotas), ``ecr:BatchGetImage`` on the image's
          repository, ``iam:SimulatePrincipalPolicy`` on the execution role, ``s3:ListBucket`` on the
          recipe's data prefixes (and the packed-data manifest of an sft recipe), the MLflow
          tracking server and the training plan, when the recipe names them.

        The README's IAM table lists the wildcards that remain, with the reason for each.
        """
        grantee = as_grantee(grantee)
        stack, recipe = Stack.of(self), self.plan.recipe
        grant = self.grant_start_execution(grantee)
        late = LateAcknowledgements()
        target = getattr(grantee, "policy", grantee)  # where cdk-nag reports the policy's wildcards

        def allow_wildcard(resource: str, reason: str) -> None:
            if isinstance(target, Construct):
                late.add(target, resource, reason)

        def add(actions: list[str], resources: list[str], conditions: dict | None = None) -> None:
            nonlocal grant
            grant = grant.combine(
                iam.Grant.add_to_principal(
                    grantee=grantee, actions=actions, resource_arns=resources, conditions=conditions
                )
            )

        # GetMetricData, the Service Quotas reads other than GetServiceQuota and pricing:GetProducts
        # have no resource types in IAM: Resource "*" is the only form.
        add(["cloudwatch:GetMetricData", "cloudwatch:ListMetrics"], ["*"])
        allow_wildcard(
            "*",
            "cloudwatch:GetMetricData, cloudwatch:ListMetrics, servicequotas:List*/GetAWSDefaultServiceQuota and "
            "pricing:GetProducts have no resource types in IAM; sagemaker:ListModelPackages none that names a group",
        )
        if self.model_package_group is not None:  # models: list, describe and approve this recipe's packages
            grant = grant.combine(self.grant_models(grantee))
            allow_wildcard(self.model_packages_arn, "SageMaker numbers the packages of the recipe's group")
        allow_wildcard(f"{self._arn}/execution/*", "SageMaker names each execution (a random ID)")
        # status, explain --run, calibrate --from-runs: the Probe job's final metrics. A pipeline names its jobs
        # pipelines-<execution id>-<step>-<random> (no pipeline name in them); its training steps tag each job
        # with the recipe (the step's Tags), and the training-job resource takes aws:ResourceTag conditions
        # (Service Authorization Reference, Amazon SageMaker): only this recipe's jobs.
        jobs = stack.format_arn(service="sagemaker", resource="training-job", resource_name="pipelines-*")
        add(
            ["sagemaker:DescribeTrainingJob"],
            [jobs],
            {"StringEquals": {f"aws:ResourceTag/{d.recipe_tag_key()}": self.plan.name}},
        )
        allow_wildcard(
            jobs,
            "A pipeline names its training jobs pipelines-<execution id>-<step>-<random>; "
            "an aws:ResourceTag condition limits them to this recipe's",
        )
        group = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=TRAINING_LOG_GROUP,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        # logs: the streams' names start with the job's, pipelines-*; CloudWatch Logs tags log groups, not
        # streams, and the group is SageMaker's, shared by every training job of the account and region, so
        # no condition narrows the streams to this recipe (README, IAM table).
        if logs:
            add(["logs:DescribeLogStreams"], [group, f"{group}:*"])
            streams = f"{group}:log-stream:pipelines-*"
            add(["logs:GetLogEvents"], [streams])
            allow_wildcard(f"{group}:*", "DescribeLogStreams lists the training jobs' group, the job's name as prefix")
            allow_wildcard(streams, "SageMaker names each pipeline job's log streams <job name>/algo-<n>-<epoch>")
        grant = grant.combine(self.store.grant_runs_read(grantee, recipe.name))
        allow_wildcard(
            self.store.bucket.arn_for_objects(f"{runs_prefix(recipe.name)}*/{COMMIT_MARKER}"),
            "The manifests of this recipe's runs; run IDs are the executions'",
        )
        allow_wildcard(
            self.store.bucket.arn_for_objects(f"{runs_prefix(recipe.name)}*/{LEASE_NAME}"),
            "The leases of this recipe's runs (start --resume reads the holder); run IDs are the executions'",
        )
        # preflight
        quotas = stack.format_arn(service="servicequotas", resource="sagemaker", resource_name="*")
        add(["servicequotas:GetServiceQuota"], [quotas])
        allow_wildcard(quotas, "The SageMaker quotas the plan needs, by code")
        add(
            [
                "servicequotas:GetAWSDefaultServiceQuota",
                "servicequotas:ListServiceQuotas",
                "servicequotas:ListAWSDefaultServiceQuotas",
            ],
            ["*"],
        )
        add(["ecr:BatchGetImage"], [self._image.repository.repository_arn])
        add(["iam:SimulatePrincipalPolicy"], [self.execution_role.role_arn])
        raw = recipe.data.data_prefixes if recipe.data.prepare is not None else []
        for uri in list(dict.fromkeys([*self._data_uris, *raw])):
            _objects, bucket_arn, patterns = prefix_arns(uri)
            add(["s3:ListBucket"], [bucket_arn], {"StringLike": {"s3:prefix": patterns}} if patterns else None)
        if recipe.data.sources:
            for uri in recipe.data.data_prefixes:  # preflight reads each source's first record
                objects, _bucket_arn, _patterns = prefix_arns(uri)
                add(["s3:GetObject"], [objects[0]])
                allow_wildcard(objects[0], "Preflight reads the first record of each raw source")
            if self._data_key is not None:
                add(["kms:Decrypt"], [self._data_key.key_arn], via_services("s3", key_arn=self._data_key.key_arn))
        elif recipe.fine_tuning and recipe.data.prepare is not None:
            objects, _bucket_arn, _patterns = prefix_arns(recipe.data.uri)
            add(["s3:GetObject"], [objects[0]])  # preflight reads the first raw example
            allow_wildcard(objects[0], "Preflight reads the first record of the recipe's raw examples")
            if self._data_key is not None:
                add(["kms:Decrypt"], [self._data_key.key_arn], via_services("s3", key_arn=self._data_key.key_arn))
        elif recipe.fine_tuning:
            from tiered_training.aws.preflight import PACKED_MANIFEST

            objects, _bucket_arn, _patterns = prefix_arns(recipe.data.uri)
            add(["s3:GetObject"], [objects[0].removesuffix("*") + PACKED_MANIFEST])
            if self._data_key is not None:
                add(["kms:Decrypt"], [self._data_key.key_arn], via_services("s3", key_arn=self._data_key.key_arn))
        if recipe.tracking.mlflow_tracking_server_arn:
            add(["sagemaker:DescribeMlflowTrackingServer"], [recipe.tracking.mlflow_tracking_server_arn])
        if recipe.compute.training_plan_arn:
            add(["sagemaker:DescribeTrainingPlan"], [recipe.compute.training_plan_arn])
        if prices:
            add(["pricing:GetProducts"], ["*"])
        if late.entries:
            self.node.add_validation(late)
        return grant

    # -- metrics ---------------------------------------------------------------------------

    def metric(self, name: str, **kwargs: Any) -> cloudwatch.Metric:
        """A metric of this recipe from the catalogue (``tiered_training.contract.metrics``), by name."""
        return self.metrics.metric_named(name, **kwargs)

    def metric_tokens_per_second_per_gpu(self, **kwargs: Any) -> cloudwatch.Metric:
        from tiered_training.contract import metrics as catalogue

        return self.metrics.metric(catalogue.TOKENS_PER_SECOND_PER_GPU, **kwargs)

    def metric_execution_failed(self, **kwargs: Any) -> cloudwatch.Metric:
        return self.metrics.pipeline_metric("ExecutionFailed", **kwargs)


def _serving_image(scope: Construct) -> str:
    """The LMI serving image of the stack's region (``catalog/serving_images.yaml``): the URI itself for a stack
    with a region, else a ``CfnMapping`` looked up with ``AWS::Region`` at deploy time."""
    from tiered_training.catalog.images import serving_image_uri, serving_images

    stack = Stack.of(scope)
    if not Token.is_unresolved(stack.region):
        return serving_image_uri(stack.region)
    mapping = CfnMapping(
        scope, "ServingImages", mapping={region: {"uri": uri} for region, uri in serving_images().items()}, lazy=True
    )
    return mapping.find_in_map(Aws.REGION, "uri")


def _selection_kwargs(selection: ec2.SubnetSelection | None) -> dict[str, Any]:
    """``vpc.select_subnets`` takes the SubnetSelection's fields as keyword arguments."""
    if selection is None:
        return {}
    names = ("availability_zones", "one_per_az", "subnet_filters", "subnet_group_name", "subnets", "subnet_type")
    return {n: getattr(selection, n) for n in names if getattr(selection, n, None) is not None}
