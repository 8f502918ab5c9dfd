"""The container's side of the contract that is not the RunConfig: the names and paths that the pipeline
definition configures and the container reads, each written once.

SageMaker's fixed layout under ``/opt/ml`` (https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-running-container.html):
input channels at ``/opt/ml/input/data/<channel>``, the model at ``/opt/ml/model``, checkpoints where
``CheckpointConfig.LocalPath`` says, and the container's stdout in the log group below.
"""

from __future__ import annotations

# The run mode: the Probe step sets probe, the Train steps train (training/launcher.py reads it).
MODE_VARIABLE = "TIERED_TRAINING_MODE"

OPT_ML = "/opt/ml"
TRAIN_CHANNEL = "train"  # the token shards (data.uri)
MODEL_CHANNEL = "model"  # the starting checkpoint (model.init_checkpoint)
VALIDATION_CHANNEL = "validation"  # data.validation_uri


def channel_dir(channel: str) -> str:
    """Where SageMaker puts an input channel's files."""
    return f"{OPT_ML}/input/data/{channel}"


CHECKPOINT_LOCAL_PATH = f"{OPT_ML}/checkpoints"  # CheckpointConfig.LocalPath
MODEL_DIR = f"{OPT_ML}/model"  # SM_MODEL_DIR: uploaded as the job's model artefact
TENSORBOARD_DIR = f"{OPT_ML}/output/tensorboard"  # TensorBoardOutputConfig.LocalPath
HYPERPARAMETERS_FILE = f"{OPT_ML}/input/config/hyperparameters.json"

# Training jobs' stdout and stderr: one stream per host (<job>/algo-<n>-<time>); the container's EMF lines
# go there, so it is also the namespace of the per-host metrics CloudWatch extracts from them.
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
