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
# The evaluation of the export (training/evaluation.py): in the model directory (inside model.tar.gz) and at the top
# of the checkpoint directory, which SageMaker copies to the run's prefix, where the model package points at it.
EVALUATION_FILE = "evaluation.json"
HYPERPARAMETERS_FILE = f"{OPT_ML}/input/config/hyperparameters.json"

# Training jobs' stdout and stderr: one stream per host (<job>/algo-<n>-<time>); the container's EMF lines
# go there, so it is also the namespace of the per-host metrics CloudWatch extracts from them.
LOG_GROUP = "/aws/sagemaker/TrainingJobs"

# One execution per run (tiered_training/contract/lease.py): the Train steps' Environment names the run's checkpoint
# prefix (its CheckpointConfig.S3Uri) and the pipeline execution; SageMaker itself sets TRAINING_JOB_NAME.
RUN_URI_VARIABLE = "TIERED_TRAINING_RUN_URI"
EXECUTION_VARIABLE = "TIERED_TRAINING_EXECUTION_ARN"
JOB_NAME_VARIABLE = "TRAINING_JOB_NAME"
LEASE_NAME = "lease.json"  # <run prefix>lease.json, beside the run's step-N/ checkpoints
LEASE_RENEW_SECONDS = 60  # the holder rewrites the lease this often
LEASE_STALE_RENEWALS = 5  # a lease not renewed for this many intervals (5 minutes) may be taken over
LEASE_DEADLINE_SECONDS = 150  # a holder not renewed for this long stops committing and training
LEASE_CLOCK_SKEW_SECONDS = 10  # the clock difference between two training instances allowed for
# The lease's timings, read from the training job's Environment (tiered_training/contract/lease.py: Timings); a
# rehearsal shortens them to run a takeover in seconds.
LEASE_RENEW_VARIABLE = "TIERED_TRAINING_LEASE_RENEW_SECONDS"
LEASE_DEADLINE_VARIABLE = "TIERED_TRAINING_LEASE_DEADLINE_SECONDS"
LEASE_STALE_VARIABLE = "TIERED_TRAINING_LEASE_STALE_SECONDS"
LEASE_SKEW_VARIABLE = "TIERED_TRAINING_LEASE_SKEW_SECONDS"
# The launcher's record of the lease for the workers it starts (training/components/fence.py reads it).
LEASE_STATE_VARIABLE = "TIERED_TRAINING_LEASE_STATE"
