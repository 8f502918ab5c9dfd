"""Experiment tracking beside CloudWatch: MLflow (SageMaker managed MLflow) and TensorBoard.

Both are sinks of :class:`training.components.metrics.MetricsHook` on global rank 0: every job event
(once a minute) goes to them with the step count as the step, under the catalogue's
metric names (``Loss``, ``TokensPerSecond``, ``MFU``, ``LearningRate``, ``GradNorm``,
``ValidationLoss``, ...). Per-node memory and utilisation stay in CloudWatch.

- **MLflow** (``cfg.tracking.mlflow_tracking_uri``, the recipe's
  ``tracking.mlflow_tracking_server_arn``; ``$MLFLOW_TRACKING_URI`` overrides it): the
  sagemaker-mlflow plugin in the image accepts the tracking server's ARN as the URI and
  signs requests with the job's role. The experiment is ``cfg.tracking.experiment_name``
  (the recipe), the run is named after the training job (``$TRAINING_JOB_NAME``), so an
  in-job restart continues the same run. The plan's decisions, which the RunConfig holds
  resolved (precision, sharding, micro-batch, ...), are the run's parameters.
- **TensorBoard** (``cfg.tracking.tensorboard_dir``, ``/opt/ml/output/tensorboard``, which
  the Training step's TensorBoardOutputConfig uploads to the checkpoint store's output
  prefix; ``$TT_TENSORBOARD_DIR`` overrides it): scalars through
  ``torch.utils.tensorboard.SummaryWriter``, and the RunConfig as text.

A tracking failure never stops training: it is reported once and the sink goes quiet.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from tiered_training.contract.runconfig import RunConfig

MLFLOW_PARAM_LIMIT = 6000  # characters per parameter value
MLFLOW_BATCH = 100  # parameters per log_batch call


def _warn(what: str, error: BaseException) -> None:
    print(f"tracking: warning: {what} failed, carrying on without it: {error!r}", file=sys.stderr, flush=True)


def run_name(cfg: RunConfig) -> str:
    """The training job's name on SageMaker, else the recipe name and the start time."""
    return os.environ.get("TRAINING_JOB_NAME") or f"{cfg.recipe_name}-{time.strftime('%Y%m%d-%H%M%S')}"


class MlflowSink:
    """Params at the start, metrics at every job event, the run ended at close."""

    def __init__(self, cfg: RunConfig, tracking_uri: str, *, name: str | None = None) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        experiment_name = cfg.tracking.experiment_name or cfg.recipe_name
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
        name = name or run_name(cfg)
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`mlflow.runName` = '{name}'", max_results=1
        )
        if found:
            self.run_id = found[0].info.run_id
        else:
            tags = {"recipe": cfg.recipe_name, "instance_type": cfg.hardware.instance_type, "model": cfg.model.name}
            self.run_id = self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
            params = [Param(k, v[:MLFLOW_PARAM_LIMIT]) for k, v in sorted(cfg.to_hyperparameters().items())]
            for i in range(0, len(params), MLFLOW_BATCH):
                self.client.log_batch(self.run_id, params=params[i : i + MLFLOW_BATCH])
        self._failed = False

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        if self._failed:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        try:
            self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, int(step)) for k, v in values.items()])
        except Exception as error:
            self._failed = True
            _warn("MLflow logging", error)

    def close(self) -> None:
        if not self._failed:
            try:
                self.client.set_terminated(self.run_id)
            except Exception as error:
                _warn("ending the MLflow run", error)


class TensorBoardSink:
    """Scalars per job event; the RunConfig as text at the start."""

    def __init__(self, cfg: RunConfig, log_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir)
        self.writer.add_text("run_config", "```\n" + json.dumps(cfg.model_dump(mode="json"), indent=1) + "\n```")
        self.writer.flush()

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, float(value), global_step=int(step))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def build_sinks(cfg: RunConfig, rank: int) -> list[Any]:
    """The tracking sinks the RunConfig asks for, on global rank 0 (none elsewhere)."""
    if rank != 0:
        return []
    sinks: list[Any] = []
    uri = os.environ.get("MLFLOW_TRACKING_URI") or cfg.tracking.mlflow_tracking_uri
    if uri:
        try:
            sinks.append(MlflowSink(cfg, uri))
        except Exception as error:
            _warn("starting the MLflow run", error)
    log_dir = os.environ.get("TT_TENSORBOARD_DIR") or cfg.tracking.tensorboard_dir
    if log_dir:
        try:
            sinks.append(TensorBoardSink(cfg, log_dir))
        except Exception as error:
            _warn("starting TensorBoard", error)
    return sinks
