"""``python -m training`` (run it under ``torchrun``).

    torchrun --nproc_per_node 8 -m training --config run.json
    torchrun ... -m training            # SageMaker: /opt/ml/input/config/hyperparameters.json
    torchrun ... -m training --probe --candidate 2   # measure probe candidate 2 (training.probe.run_probe)

The RunConfig comes from ``--config`` (a RunConfig JSON file, or a hyperparameters JSON
of flat ``section.field`` keys), else from SageMaker's hyperparameters file. Paths
default to SageMaker's and can be overridden by flags or ``TT_*`` environment variables.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from tiered_training.contract.runconfig import RunConfig
from training.paths import HYPERPARAMETERS_FILE, Paths


def load_config(path: str | Path) -> RunConfig:
    """A RunConfig JSON (nested sections), SageMaker hyperparameters (flat dotted keys), or the output of
    ``tiered-training run-config`` (the RunConfig under ``run_config``)."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict) and isinstance(data.get("run_config"), dict) and "schema_version" in data:
        data = data["run_config"]
    if isinstance(data, dict) and any("." in key for key in data):
        return RunConfig.from_hyperparameters(data)
    return RunConfig.model_validate(data)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help=f"RunConfig JSON or hyperparameters JSON (default: {HYPERPARAMETERS_FILE})")
    parser.add_argument(
        "--data-dir", help="token shards (default: $TT_DATA_DIR, $SM_CHANNEL_TRAIN, /opt/ml/input/data/train)"
    )
    parser.add_argument("--checkpoint-dir", help="checkpoints (default: $TT_CHECKPOINT_DIR, /opt/ml/checkpoints)")
    parser.add_argument("--model-dir", help="final HF model (default: $TT_MODEL_DIR, $SM_MODEL_DIR, /opt/ml/model)")
    parser.add_argument(
        "--init-dir",
        help="HF checkpoint to start from (default: $TT_INIT_DIR, $SM_CHANNEL_MODEL, /opt/ml/input/data/model)",
    )
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps in this run")
    parser.add_argument(
        "--probe", action="store_true", help="run a probe (training.probe.run_probe) instead of training"
    )
    parser.add_argument(
        "--candidate", type=int, default=1, help="with --probe: the probe candidate to measure (1-based, default 1)"
    )
    return parser.parse_args(argv)


def record_failure(error: BaseException) -> None:
    """One line for the launcher's failure file (``/opt/ml/output/failure``, SageMaker's FailureReason)."""
    where = os.environ.get("TIERED_TRAINING_FAILURE_DIR")
    if not where:
        return
    text = str(error).strip().splitlines()
    line = f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
    try:
        Path(where, f"rank-{os.environ.get('RANK', '0')}").write_text(line + "\n")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BaseException as error:
        if not (isinstance(error, SystemExit) and error.code in (0, None)):
            record_failure(error)
        raise


def _main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = load_config(args.config or HYPERPARAMETERS_FILE)
    paths = Paths.resolve(
        data_dir=args.data_dir, checkpoint_dir=args.checkpoint_dir, model_dir=args.model_dir, init_dir=args.init_dir
    )
    if args.probe:
        from training.distributed.dist import shut_down
        from training.probe import run_probe

        run_probe(cfg, paths, candidate=args.candidate)
        shut_down()
        return 0
    from training.candidates import apply
    from training.components.metrics import MetricsHook
    from training.components.tracking import build_sinks
    from training.distributed.dist import shut_down
    from training.trainer import run

    cfg, line = apply(cfg, paths.checkpoint_dir)  # the candidate this job trains (run.candidate)
    if os.environ.get("RANK", "0") == "0":
        print(line, flush=True)
    from training.components.gpu_health import start_monitor
    from training.components.metrics import node_name
    from training.components.straggler import StragglerHook, slowdown

    metrics = MetricsHook(cfg, sinks=build_sinks(cfg, int(os.environ.get("RANK", "0")))).start()
    gpus = start_monitor(cfg, int(os.environ.get("LOCAL_RANK", "0")))  # None without NVML or a GPU
    try:
        run(
            cfg,
            paths,
            hooks=[metrics, StragglerHook(cfg)],
            max_steps=args.max_steps,
            slowdown=slowdown(os.environ, node_name()),
        )
    finally:
        metrics.close()  # the heartbeat stops with the run: a finished or shortened run goes quiet
        if gpus is not None:
            gpus.stop()
    shut_down()
    return 0


if __name__ == "__main__":
    from training.distributed.dist import exit_process

    exit_process(main())
