"""CDK constructs for tiered-training: the only package that imports aws_cdk.

- :class:`CheckpointStore`: S3 (SSE-KMS, versioned, TLS only) for checkpoints and output,
  or a bucket and key of your own.
- :class:`TrainingRoles`: least-privilege execution and pipeline roles (``iam.Role`` with
  grants, or roles of your own).
- :class:`TrainingImage`: the training image: the packaged container, an ECR repository and
  tag, a DockerImageAsset or an image URI.
- :class:`TrainingPipeline`: the SageMaker pipeline of a Plan (Probe -> Gate -> Train | Fail);
  an ``aws_sagemaker.IPipeline``.
- :class:`TrainingMetricFactory`: the recipe's CloudWatch metrics, from the metric catalogue.
- :class:`TrainingMonitoring`: alarms, failed-execution events and a dashboard.
- :class:`TrainingPlatform`, :class:`PlatformStack`, :class:`RecipeStack`: composition.
- :func:`build_app`: the app that ``app.py`` runs.
"""

from tiered_training.constructs.app import build_app, load_plans
from tiered_training.constructs.checkpoint_store import CheckpointStore, CheckpointStoreProps
from tiered_training.constructs.image import TrainingImage
from tiered_training.constructs.metric_factory import TrainingMetricFactory
from tiered_training.constructs.monitoring import NoSearchInAlarms, TrainingMonitoring
from tiered_training.constructs.pipeline import TrainingPipeline
from tiered_training.constructs.platform import PlatformProps, PlatformStack, RecipeStack, TrainingPlatform
from tiered_training.constructs.roles import TrainingRoles

__all__ = [
    "CheckpointStore",
    "CheckpointStoreProps",
    "NoSearchInAlarms",
    "PlatformProps",
    "PlatformStack",
    "RecipeStack",
    "TrainingImage",
    "TrainingMetricFactory",
    "TrainingMonitoring",
    "TrainingPipeline",
    "TrainingPlatform",
    "TrainingRoles",
    "build_app",
    "load_plans",
]
