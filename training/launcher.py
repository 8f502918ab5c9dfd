"""The container's entry point: SageMaker's files in, one ``torchrun`` per host out.

SageMaker starts the image's ENTRYPOINT once on every host of a training job. This
module reads what SageMaker wrote there and ``exec``s ``torchrun`` with one worker
per GPU, all hosts joined into one job:

- ``/opt/ml/input/config/resourceconfig.json``: ``hosts`` and ``current_host``
  give ``--nnodes`` and ``--node_rank`` (the index of ``current_host`` in the
  sorted host list); the first host is the rendezvous (``--master_addr``, port
  :data:`MASTER_PORT`). ``current_instance_type`` selects the family settings.
- ``/opt/ml/input/config/hyperparameters.json``: the :class:`RunConfig`, read with
  :meth:`RunConfig.from_hyperparameters` (validated here, once, so a bad config
  fails with one line instead of one traceback per GPU).
- ``SM_NUM_GPUS`` (else the instance catalogue's GPU count, else the RunConfig's
  ``hardware.gpus_per_node``) gives ``--nproc_per_node``.

Environment the launcher adds (a variable already set, for example in the training
job's ``Environment``, always wins):

- ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` = ``checkpoint.shutdown_deadline_seconds``:
  torchrun forwards SIGTERM (stop, spot interruption) and would kill its workers
  30 s later; raising it gives them time to write the final checkpoint.
- ``PYTORCH_ALLOC_CONF=expandable_segments:True`` (less fragmentation).
- EFA families (p4, p5, p6): ``FI_PROVIDER=efa``, ``FI_EFA_FORK_SAFE=1`` and,
  where the catalogue says the family has GPUDirect RDMA, ``FI_EFA_USE_DEVICE_RDMA=1``.
- NCCL for p5 and p6: ``NCCL_SOCKET_IFNAME`` (bootstrap interface, from
  ``network_interface_name``), ``NCCL_BUFFSIZE``/``NCCL_P2P_NET_CHUNKSIZE`` as
  AWS's distributed-training samples set them for P5, ``NCCL_DEBUG=WARN``.
  ``NCCL_PROTO`` is left to NCCL (SageMaker SDK v3 forces ``simple``; we do not).

Run mode: the environment variable :data:`MODE_VARIABLE` (``TIERED_TRAINING_MODE``)
is ``train`` (default) or ``probe``. The pipeline's Probe step sets
``TIERED_TRAINING_MODE=probe`` in the training job's ``Environment``; the workers then
run ``python -m training --probe``, which sweeps micro-batch sizes and prints the
``PROBE ...`` lines that the step's MetricDefinitions parse
(``tiered_training.metrics.PROBE_METRICS``). Hyperparameters cannot carry the mode:
they are exactly the RunConfig, and unknown keys are errors.

Errors in SageMaker's files (missing or malformed resourceconfig, invalid
hyperparameters, unknown mode) print one line ``launcher: error: ...`` on stderr
and exit with status 2, with no traceback.

:func:`build_launch` is pure (files already parsed, environment as a mapping), so
the tests cover a single P6-B200 node, four P5 nodes and the error paths without
SageMaker.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from tiered_training.environment import family_environment

CONFIG_DIR = Path("/opt/ml/input/config")
MASTER_PORT = 29500
MODE_VARIABLE = "TIERED_TRAINING_MODE"
MODES = ("train", "probe")
EXIT_USAGE = 2

class LaunchError(Exception):
    """A problem with SageMaker's files or environment; reported as one line, exit 2."""


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    nnodes: int
    node_rank: int
    nproc_per_node: int
    mode: str

    def summary(self) -> str:
        return (
            f"launcher: mode={self.mode} nnodes={self.nnodes} node_rank={self.node_rank} "
            f"nproc_per_node={self.nproc_per_node}: {' '.join(self.argv)}"
        )


# -- reading SageMaker's files -----------------------------------------------------------


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LaunchError(f"{what} not found at {path}; is this running as a SageMaker training job?") from None
    except OSError as error:
        raise LaunchError(f"cannot read {what} at {path}: {error.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise LaunchError(f"{what} at {path} is not valid JSON: {error.msg} (line {error.lineno})") from None
    if not isinstance(data, dict):
        raise LaunchError(f"{what} at {path} must be a JSON object, not {type(data).__name__}")
    return data


def _hosts(resourceconfig: Mapping[str, Any]) -> tuple[list[str], str]:
    hosts = resourceconfig.get("hosts")
    current = resourceconfig.get("current_host")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise LaunchError("resourceconfig.json: 'hosts' must be a non-empty list of host names")
    if not isinstance(current, str) or not current:
        raise LaunchError("resourceconfig.json: 'current_host' is missing")
    ordered = sorted(hosts, key=_host_key)
    if current not in ordered:
        raise LaunchError(f"resourceconfig.json: current_host {current!r} is not in hosts {ordered}")
    return ordered, current


def _host_key(host: str) -> tuple[str, int]:
    # algo-2 before algo-10: SageMaker names hosts algo-1..algo-N.
    stem, _, number = host.rpartition("-")
    return (stem, int(number)) if number.isdigit() else (host, -1)


def _gpus(environ: Mapping[str, str], instance_type: str | None, config_gpus: int | None) -> int:
    raw = environ.get("SM_NUM_GPUS")
    if raw not in (None, ""):
        try:
            gpus = int(raw)
        except ValueError:
            raise LaunchError(f"SM_NUM_GPUS={raw!r} is not an integer") from None
        if gpus < 1:
            raise LaunchError(f"SM_NUM_GPUS={raw!r}: this container needs at least one GPU per host")
        return gpus
    if instance_type:
        from tiered_training.catalogs import instances

        entry = instances().get(instance_type)
        if entry is not None:
            return entry.gpus
    if config_gpus:
        return config_gpus
    raise LaunchError(f"cannot tell how many GPUs {instance_type or 'this host'} has: SM_NUM_GPUS is not set")


def run_mode(environ: Mapping[str, str]) -> str:
    mode = (environ.get(MODE_VARIABLE) or "train").strip().lower()
    if mode not in MODES:
        raise LaunchError(f"{MODE_VARIABLE}={environ.get(MODE_VARIABLE)!r}; expected one of {', '.join(MODES)}")
    return mode


def load_run_config(hyperparameters: Mapping[str, Any]):
    from pydantic import ValidationError

    from tiered_training.runconfig import RunConfig

    try:
        return RunConfig.from_hyperparameters(dict(hyperparameters))
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(root)"
        raise LaunchError(
            f"hyperparameters.json is not a valid RunConfig: {where}: {first['msg']} ({error.error_count()} error(s))"
        ) from None


# -- the pure function -------------------------------------------------------------------


def build_launch(
    resourceconfig: Mapping[str, Any],
    hyperparameters: Mapping[str, Any],
    environ: Mapping[str, str],
    *,
    extra_args: Sequence[str] = (),
) -> Launch:
    """argv and environment of the ``torchrun`` that this host runs."""
    hosts, current = _hosts(resourceconfig)
    cfg = load_run_config(hyperparameters)
    mode = run_mode(environ)
    instance_type = resourceconfig.get("current_instance_type") or environ.get("SM_CURRENT_INSTANCE_TYPE")
    gpus = _gpus(environ, instance_type, cfg.hardware.gpus_per_node)

    nnodes, node_rank = len(hosts), hosts.index(current)
    argv = [
        "torchrun",
        f"--nnodes={nnodes}",
        f"--node_rank={node_rank}",
        f"--nproc_per_node={gpus}",
        f"--master_addr={hosts[0]}",
        f"--master_port={MASTER_PORT}",
        "--max_restarts=0",  # SageMaker's RetryStrategy restarts the job from the checkpoint store
        "--module",
        "training",
    ]
    if mode == "probe":
        argv.append("--probe")
    argv += list(extra_args)

    added: dict[str, str] = {
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(max(30, cfg.checkpoint.shutdown_deadline_seconds)),
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
        "PYTHONUNBUFFERED": "1",  # EMF lines reach CloudWatch Logs as they are printed
        MODE_VARIABLE: mode,
    }
    added.update(family_environment(instance_type, resourceconfig.get("network_interface_name")))
    env = {**added, **{k: v for k, v in environ.items() if k != MODE_VARIABLE}}
    env[MODE_VARIABLE] = mode
    return Launch(argv=argv, env=env, nnodes=nnodes, node_rank=node_rank, nproc_per_node=gpus, mode=mode)


def launch_from_files(
    config_dir: Path = CONFIG_DIR, environ: Mapping[str, str] | None = None, extra_args: Sequence[str] = ()
) -> Launch:
    environ = os.environ if environ is None else environ
    resourceconfig = read_json(config_dir / "resourceconfig.json", "resourceconfig.json")
    hyperparameters = read_json(config_dir / "hyperparameters.json", "hyperparameters.json")
    return build_launch(resourceconfig, hyperparameters, environ, extra_args=extra_args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m training.launcher [extra trainer args]``; execs torchrun (found on PATH).

    ``TIERED_TRAINING_CONFIG_DIR`` overrides ``/opt/ml/input/config`` (smoke tests outside SageMaker).
    """
    extra = list(sys.argv[1:] if argv is None else argv)
    if extra[:1] == ["train"]:  # SageMaker runs `docker run <image> train`
        extra = extra[1:]
    config_dir = Path(os.environ.get("TIERED_TRAINING_CONFIG_DIR", str(CONFIG_DIR)))
    try:
        launch = launch_from_files(config_dir, os.environ, extra)
    except LaunchError as error:
        print(f"launcher: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(launch.summary(), flush=True)
    sys.stderr.flush()
    os.execvpe(launch.argv[0], launch.argv, launch.env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
