"""TrainingPipeline: a SageMaker Pipeline (Probe -> Gate -> Train | Fail) built from a Plan.

The definition comes from :func:`tiered_training.definition.build_definition`, a
pure function; this construct embeds it with ``Stack.to_json_string`` (which turns
role ARNs and bucket names into ``Fn::Join``) as a plain PascalCase dict, and
registers a validation that checks every Training step against botocore's
CreateTrainingJob shape, names, references and the body size at synth.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import jsii
from aws_cdk import CfnTag
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct, IValidation

from .. import definition as d
from .checkpoint_store import CheckpointStore
from .image import TrainingImage
from .metric_factory import TrainingMetricFactory
from ._scope import add_check, env_of, remember_stack, stack_of
from .roles import TrainingRoles

if TYPE_CHECKING:
    from ..plan import Plan


_botocore_loader: threading.Thread | None = None


def _load_botocore_model() -> None:
    try:
        d.validate_training_arguments({})  # imports botocore and loads the CreateTrainingJob shape (cached)
    except Exception:  # the validation at synth reports any real problem
        pass


def _prefetch_botocore_model() -> None:
    """Load botocore's SageMaker model (about 0.4 s) in a thread while the constructs are
    built: that time is mostly spent waiting for the jsii runtime, so it overlaps."""
    global _botocore_loader
    if _botocore_loader is None:
        _botocore_loader = threading.Thread(target=_load_botocore_model, name="tiered-training-botocore", daemon=True)
        _botocore_loader.start()


@jsii.implements(IValidation)
class _DefinitionValidation:
    def __init__(self, pipeline: "TrainingPipeline") -> None:
        self.pipeline = pipeline
        _prefetch_botocore_model()

    def validate(self) -> list[str]:
        if _botocore_loader is not None:
            _botocore_loader.join()
        problems = d.validate_definition(self.pipeline.definition)
        return [f"pipeline {self.pipeline.plan.name}: {p}" for p in problems]


class TrainingPipeline(Construct):
    """One recipe's SageMaker pipeline.

    Props:

    - ``plan``: a Plan without errors (``PlanError`` otherwise).
    - ``store``: the CheckpointStore; checkpoints go under ``<recipe>/checkpoints/``.
    - ``image``: the TrainingImage.
    - ``roles``: TrainingRoles; default new roles for this recipe.
    - ``pipeline_name``: default the recipe name (create-only: renaming replaces the pipeline).
    - ``subnets`` / ``security_group_ids``: optional VPC for the training jobs.
    - ``max_parallel_steps``: ParallelismConfiguration; default 1 (the steps run one after another).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        plan: "Plan",
        store: CheckpointStore,
        image: TrainingImage,
        roles: TrainingRoles | None = None,
        pipeline_name: str | None = None,
        subnets: list[str] | None = None,
        security_group_ids: list[str] | None = None,
        max_parallel_steps: int = 1,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = stack_of(scope)
        remember_stack(self, stack, scope, construct_id)
        plan.require_ok()
        self.plan = plan
        recipe = plan.recipe
        self.pipeline_name = pipeline_name or recipe.name
        data_uris = [recipe.data.uri] + ([recipe.model.init_checkpoint] if recipe.model.init_checkpoint else [])
        data_uris += [recipe.data.validation_uri] if recipe.data.validation_uri else []
        self.roles = roles or TrainingRoles(
            self, "Roles", recipe_name=recipe.name, store=store, image=image, data_uris=data_uris,
            mlflow_tracking_server_arn=recipe.tracking.mlflow_tracking_server_arn,
        )
        key = store.encryption_key
        self.resources = d.PipelineResources(
            role_arn=self.roles.execution_role_arn,
            image_uri=image.image_uri,
            checkpoint_s3_uri=store.checkpoint_uri(recipe.name),
            output_s3_uri=store.output_uri(recipe.name),
            kms_key_id=store.encryption_key_arn if key is not None else None,
            subnets=tuple(subnets or ()),
            security_group_ids=tuple(security_group_ids or ()),
        )
        self.definition: dict[str, Any] = d.build_definition(plan, self.resources)
        self.resource = sagemaker.CfnPipeline(
            self,
            "Resource",
            pipeline_name=self.pipeline_name,
            pipeline_display_name=self.pipeline_name,
            pipeline_description=(recipe.description or f"tiered-training recipe {recipe.name}")[:3072],
            role_arn=self.roles.pipeline_role_arn,
            # Plain PascalCase dicts: the typed Property classes render camelCase keys, which CloudFormation rejects.
            pipeline_definition={"PipelineDefinitionBody": stack.to_json_string(self.definition)},
            parallelism_configuration={"MaxParallelExecutionSteps": max_parallel_steps},
            tags=[CfnTag(key=k, value=v) for k, v in d.tags_for(plan).items()],
        )
        partition, region, account = env_of(stack)
        # What stack.format_arn(service="sagemaker", resource="pipeline", resource_name=...) renders.
        self.pipeline_arn = f"arn:{partition}:sagemaker:{region}:{account}:pipeline/{self.pipeline_name.lower()}"
        self.metrics = TrainingMetricFactory(recipe.name, pipeline_name=self.pipeline_name)
        add_check(self, _DefinitionValidation(self).validate)

    # -- grants ----------------------------------------------------------------------------

    def grant_start_execution(self, grantee: iam.IGrantable) -> iam.Grant:
        """Start, describe, list and stop executions of this pipeline."""
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
            resource_arns=[self.pipeline_arn, f"{self.pipeline_arn}/execution/*"],
        )

    # -- metrics ---------------------------------------------------------------------------

    def metric(self, name: str, **kwargs: Any) -> cloudwatch.Metric:
        """A metric of this recipe from the catalogue (``tiered_training.metrics``), by name."""
        return self.metrics.metric_named(name, **kwargs)

    def metric_tokens_per_second_per_gpu(self, **kwargs: Any) -> cloudwatch.Metric:
        from .. import metrics as catalogue

        return self.metrics.metric(catalogue.TOKENS_PER_SECOND_PER_GPU, **kwargs)

    def metric_execution_failed(self, **kwargs: Any) -> cloudwatch.Metric:
        return self.metrics.pipeline_metric("ExecutionFailed", **kwargs)
