"""The container's entry point: SageMaker's files in, one ``torchrun`` per host out.

SageMaker starts the image's ENTRYPOINT once on every host of a training job. This
module reads what SageMaker wrote there and runs ``torchrun`` with one worker
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
``TIERED_TRAINING_MODE=probe`` in the training job's ``Environment``; the launcher then runs one
``torchrun ... --probe --candidate=n`` per probe candidate, in order, each on port ``MASTER_PORT + n``,
and after the last the host-0 launcher prints the ``PROBE ...`` lines that the step's MetricDefinitions
parse (:mod:`training.probe`). In train mode the checks use the candidate the trainer applies
(``run.candidate``, else the checkpoint's; :mod:`training.candidates`). Hyperparameters cannot carry the
mode: they are exactly the RunConfig, and unknown keys are errors.

Errors in SageMaker's files (missing or malformed resourceconfig, invalid
hyperparameters, unknown mode) print one line ``launcher: error: ...`` on stderr
and exit with status 2, with no traceback.

The launcher stays the parent of ``torchrun`` (SageMaker's PID 1 in the container):

- **Failure reason.** On any failure it writes one line to ``/opt/ml/output/failure``,
  which SageMaker shows as the job's FailureReason: the cause first, a worker's own error
  (each worker records its exception in :data:`FAILURE_DIR_VARIABLE`) or a worker that a
  signal ended (SIGKILL: "possibly the kernel's OOM killer"; read from torchrun's stderr,
  which the launcher relays), ahead of the peers' closed connections; else torchrun's exit status.
- **SIGTERM** (stop, spot interruption) goes to the workers, not to torchrun: they finish
  the step, save, commit and exit 0, and torchrun then exits 0 (torchrun itself would
  answer a SIGTERM with a ``SignalException`` and status 1 even after a clean save).

Outside SageMaker, ``TIERED_TRAINING_OPT_ML`` moves the whole ``/opt/ml`` tree (config,
data, checkpoints, model, output: what a local rehearsal of several hosts needs), and
``TIERED_TRAINING_MASTER_ADDR`` / ``TIERED_TRAINING_MASTER_PORT`` replace the rendezvous.

:func:`build_launch` is pure (files already parsed, environment as a mapping), so
the tests cover a single P6-B200 node, four P5 nodes and the error paths without
SageMaker.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tiered_training.catalog.environment import family_environment
from tiered_training.contract.container import LEASE_STATE_VARIABLE, MODE_VARIABLE
from tiered_training.contract.container import OPT_ML as SAGEMAKER_OPT_ML
from tiered_training.contract.failures import causes_first
from tiered_training.contract.lease import Timings
from training.candidates import apply as apply_candidate
from training.components.run_lease import LeaseRefused, RunLease
from training.probe import FAILED, PROBE_DIR_VARIABLE, read_results, result_file, summary_lines

OPT_ML = Path(SAGEMAKER_OPT_ML)
CONFIG_DIR = OPT_ML / "input/config"
MASTER_PORT = 29500
OPT_ML_VARIABLE = "TIERED_TRAINING_OPT_ML"
FAILURE_DIR_VARIABLE = "TIERED_TRAINING_FAILURE_DIR"
MODES = ("train", "probe")
EXIT_USAGE = 2
EXIT_HELD = 3  # another execution holds the run's lease


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
    run_id: str = ""
    candidates: int = 1  # probe.count: the launches of a probe
    save_seconds: float = 0.0  # checkpoint.shutdown_deadline_seconds: the longest save (the lease's timings)

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
        from tiered_training.catalog import instances

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

    from tiered_training.contract.runconfig import RunConfig

    try:
        return RunConfig.from_hyperparameters(dict(hyperparameters))
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(root)"
        raise LaunchError(
            f"hyperparameters.json is not a valid RunConfig: {where}: {first['msg']} ({error.error_count()} error(s))"
        ) from None


def _resumable(cfg, checkpoint_dir: Path | None) -> tuple[int, dict] | None:
    """The checkpoint the trainer would resume: ``(step, manifest)``, or None. Committed, its manifest naming
    its step and (for a run) this run, every file present at its size (checksums are the trainer's); a leftover
    marker, a misnamed copy or another run's checkpoint is skipped, as the trainer skips it. No torch."""
    if checkpoint_dir is None or not checkpoint_dir.is_dir() or not any(checkpoint_dir.glob("step-*")):
        return None
    from training.components.checkpoint_files import find_resumable, read_manifest, step_dir
    from training.components.identity import same_run

    run_id = cfg.run.id if cfg is not None else None
    accept = same_run({"run_id": run_id}) if run_id else None
    step, _ = find_resumable(checkpoint_dir, checksums=False, metadata=False, accept=accept)
    if step is None:
        return None
    return step, read_manifest(step_dir(checkpoint_dir, step)) or {}


def _check_world(cfg, world: int, checkpoint_dir: Path | None, hosts: int | None = None) -> None:
    """Refuse, before torchrun starts, to resume on a host count that new runs of the plan may not use, or that
    cannot keep the global batch of the checkpoint the trainer would resume (tiered_training/contract/world.py)."""
    found = _resumable(cfg, checkpoint_dir)
    if found is None:
        return
    saved_world = found[1].get("world_size")
    if not isinstance(saved_world, int) or saved_world == world:
        return
    from tiered_training.contract.world import check_instance_count

    gpus = max(1, cfg.hardware.gpus_per_node or 1)
    problem = check_instance_count(cfg, world, hosts or max(1, world // gpus), saved_world)
    if problem:
        raise LaunchError(problem)


def _check_run(cfg, world: int, hosts: int, checkpoint_dir: Path | None, data_dir: Path | None) -> None:
    """Refuse, before torchrun starts, a job that would not continue its run as planned: a resume whose
    checkpoint is of another run, model or data (training/components/identity.py), or a new run on a host count
    the plan does not support (tiered_training/contract/world.py; a resume's count is _check_world's)."""
    if not cfg.run.id:  # not started by the pipeline: no run to check
        return
    from training.components.identity import check_resume

    problem = check_resume(cfg, checkpoint_dir, data_dir, world)
    if problem:
        raise LaunchError(problem)
    if _resumable(cfg, checkpoint_dir) is not None:
        return  # a resume: _check_world decides on the host count
    from tiered_training.contract.world import check_instance_count

    problem = check_instance_count(cfg, world, hosts)
    if problem:
        raise LaunchError(problem)


# -- the pure function -------------------------------------------------------------------


def build_launch(
    resourceconfig: Mapping[str, Any],
    hyperparameters: Mapping[str, Any],
    environ: Mapping[str, str],
    *,
    extra_args: Sequence[str] = (),
    checkpoint_dir: Path | None = None,
    data_dir: Path | None = None,
    candidate: int = 1,
    checks: bool = True,
) -> Launch:
    """argv and environment of the ``torchrun`` that this host runs.

    ``checkpoint_dir``: this host's checkpoints (downloaded at job start); a committed one saved on
    another world size that the plan's global batch cannot be resumed on is refused here.
    ``candidate``: in probe mode, the candidate this launch measures (``--candidate``), on its own rendezvous
    port (the base port + the candidate), so a late host cannot join the previous candidate's store. In train
    mode the checks use the candidate the trainer will apply (training/candidates.py). ``checks=False`` leaves
    out the run's checks (host count, resume): a probe records a candidate they refuse as failed.
    """
    hosts, current = _hosts(resourceconfig)
    cfg = load_run_config(hyperparameters)
    mode = run_mode(environ)
    count = cfg.probe.count
    try:
        if mode == "probe":
            if not 1 <= candidate <= count:
                raise LaunchError(f"probe candidate {candidate} does not exist: the probe has {count}")
            cfg = cfg.with_candidate(candidate)
        else:
            cfg = apply_candidate(cfg, checkpoint_dir)[0]
    except ValueError as error:
        raise LaunchError(str(error)) from None
    instance_type = resourceconfig.get("current_instance_type") or environ.get("SM_CURRENT_INSTANCE_TYPE")
    gpus = _gpus(environ, instance_type, cfg.hardware.gpus_per_node)

    nnodes, node_rank = len(hosts), hosts.index(current)
    if checks:
        _check_run(cfg, nnodes * gpus, nnodes, checkpoint_dir, data_dir)
        _check_world(cfg, nnodes * gpus, checkpoint_dir, nnodes)
    master_addr = environ.get("TIERED_TRAINING_MASTER_ADDR") or hosts[0]
    base_port = environ.get("TIERED_TRAINING_MASTER_PORT") or str(MASTER_PORT)
    try:
        master_port = str(int(base_port) + (candidate if mode == "probe" else 0))
    except ValueError:
        raise LaunchError(f"TIERED_TRAINING_MASTER_PORT={base_port!r} is not a port number") from None
    argv = [
        "torchrun",
        f"--nnodes={nnodes}",
        f"--node_rank={node_rank}",
        f"--nproc_per_node={gpus}",
        f"--master_addr={master_addr}",
        f"--master_port={master_port}",
        "--max_restarts=0",  # SageMaker's RetryStrategy restarts the job from the checkpoint store
        "--module",
        "training",
    ]
    if mode == "probe":
        argv += ["--probe", f"--candidate={candidate}"]
    argv += list(extra_args)

    added: dict[str, str] = {
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(max(30, cfg.checkpoint.shutdown_deadline_seconds)),
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
        "PYTHONUNBUFFERED": "1",  # EMF lines reach CloudWatch Logs as they are printed
        "SM_CURRENT_HOST": current,  # the node dimension of the metrics, the host in failure reasons
        MODE_VARIABLE: mode,
    }
    added.update(family_environment(instance_type, resourceconfig.get("network_interface_name")))
    env = {**added, **{k: v for k, v in environ.items() if k != MODE_VARIABLE}}
    env[MODE_VARIABLE] = mode
    return Launch(
        argv=argv,
        env=env,
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=gpus,
        mode=mode,
        run_id=cfg.run.id,
        candidates=count,
        save_seconds=float(cfg.checkpoint.shutdown_deadline_seconds),
    )


def opt_ml_paths(root: Path) -> tuple[dict[str, str], list[str]]:
    """Environment and trainer arguments that point the workers at an ``/opt/ml`` tree under ``root``."""
    env = {
        "TT_DATA_DIR": str(root / "input/data/train"),
        "TT_CHECKPOINT_DIR": str(root / "checkpoints"),
        "TT_MODEL_DIR": str(root / "model"),
        "TT_INIT_DIR": str(root / "input/data/model"),
    }
    return env, ["--config", str(root / "input/config/hyperparameters.json")]


def launch_from_files(
    config_dir: Path = CONFIG_DIR,
    environ: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    checkpoint_dir: Path | None = None,
    data_dir: Path | None = None,
    candidate: int = 1,
    checks: bool = True,
) -> Launch:
    environ = os.environ if environ is None else environ
    resourceconfig = read_json(config_dir / "resourceconfig.json", "resourceconfig.json")
    hyperparameters = read_json(config_dir / "hyperparameters.json", "hyperparameters.json")
    return build_launch(
        resourceconfig,
        hyperparameters,
        environ,
        extra_args=extra_args,
        checkpoint_dir=checkpoint_dir,
        data_dir=data_dir,
        candidate=candidate,
        checks=checks,
    )


# -- running torchrun: signals and the failure file --------------------------------------


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc): torchrun's workers."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses; split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def failure_reason(failure_dir: Path, status: int, host: str, killed: str | None = None) -> str:
    """One line: the first error a worker recorded that is not a consequence of another
    worker's exit (a peer's closed connection, an aborted communicator), else the first
    recorded, else torchrun's status. ``killed``: the worker that torchrun saw fail first, when a
    signal ended it (:func:`signalled_worker`); it records nothing itself, and its peers' errors
    are consequences of it."""
    recorded = sorted((p for p in failure_dir.glob("rank-*") if p.is_file()), key=lambda p: (p.stat().st_mtime, p.name))
    lines: dict[str, None] = {}  # first lines, in order, once each
    # SIGKILL comes from outside (the OOM killer) and is the cause; a worker that aborts (SIGABRT, as the
    # communicator does when a peer exits) or is stopped comes after what a worker recorded itself.
    outside = bool(killed) and "SIGKILL" in str(killed)
    if killed and outside:
        lines[f"{host} {killed}"] = None
    for path in recorded:
        text = path.read_text(errors="replace").strip()
        if text:
            lines[f"{host} {path.name}: {text.splitlines()[0]}"] = None
    if killed and not outside:
        lines[f"{host} {killed}"] = None
    if lines:
        return causes_first(list(lines))[0][:1000]
    if status < 0:
        name = _signal_name(-status)
        hint = f": {OOM_HINT}" if -status == signal.SIGKILL else ""
        return f"{host}: torchrun was killed by {name} (exit {status}, {128 - status} from a shell){hint}"
    return (
        f"{host}: training exited with status {status} and no worker recorded an error "
        "(a worker killed by a signal, or out of host memory?)"
    )


OOM_HINT = "possibly the kernel's OOM killer: check the host's memory"
# torchrun's agent, on the first worker that failed (torch.distributed.elastic.multiprocessing.api)
_WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")


def signalled_worker(line: str, node_rank: int, nproc_per_node: int) -> str | None:
    """From torchrun's line about the first worker that failed, when a signal ended that worker: which worker
    (global rank, local rank, pid) and which signal, in words; else None."""
    match = _WORKER_FAILED.search(line)
    if match is None or int(match.group(1)) >= 0:
        return None
    code, local, pid = (int(group) for group in match.groups())
    text = (
        f"rank {node_rank * nproc_per_node + local} (local rank {local}, pid {pid}): the worker process was killed by "
        f"{_signal_name(-code)} (exit {code}, {128 - code} from a shell)"
    )
    return f"{text}, {OOM_HINT}" if -code == signal.SIGKILL else text


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _relay(stream, watch: Callable[[str], None]) -> threading.Thread:
    """Copy torchrun's stderr (its workers' too) to ours, line by line, showing each line to ``watch``."""
    out = getattr(sys.stderr, "buffer", None)

    def work() -> None:
        for raw in iter(stream.readline, b""):
            if out is not None:
                out.write(raw)
                out.flush()
            else:
                sys.stderr.write(raw.decode(errors="replace"))
                sys.stderr.flush()
            watch(raw.decode(errors="replace"))
        stream.close()

    thread = threading.Thread(target=work, name="torchrun-stderr", daemon=True)
    thread.start()
    return thread


def write_failure(output_dir: Path, reason: str) -> None:
    """``<output>/failure``, where SageMaker reads FailureReason; nothing outside an /opt/ml tree."""
    if not output_dir.parent.is_dir():
        return
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "failure").write_text(reason.strip() + "\n")
    except OSError as error:
        print(f"launcher: cannot write {output_dir / 'failure'}: {error.strerror}", file=sys.stderr)


def run_torchrun(launch: Launch, output_dir: Path, lease: RunLease | None = None) -> int:
    """Run torchrun as a child, send SIGTERM to its workers, write the failure file; its exit status.

    ``lease``: the run's lease this host holds; released when torchrun exits. Should it be lost (not renewed within
    its deadline, or taken over), the workers get SIGTERM: they stop, their last save is not committed (rank 0's
    fence refuses it), and the job fails with the lease's reason (its URI, last renewal and deadline, or the taker).
    """
    status, reason = run_workers(launch, lease)
    if reason is not None:
        write_failure(output_dir, reason)
    return status


_stopped = False  # a SIGTERM reached this launcher (a probe then starts no further candidate)


def run_workers(launch: Launch, lease: RunLease | None = None) -> tuple[int, str | None]:
    """Run torchrun as a child, sending SIGTERM to its workers: its exit status, and the failure reason if any."""
    failure_dir = Path(tempfile.mkdtemp(prefix="tt-failures-"))
    env = {**launch.env, FAILURE_DIR_VARIABLE: str(failure_dir)}
    argv = list(launch.argv)
    if shutil.which(argv[0], path=env.get("PATH")) is None:
        argv[:1] = [sys.executable, "-m", "torch.distributed.run"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
    killed: list[str] = []  # torchrun's first failed worker, when a signal ended it

    def watch(line: str) -> None:
        if not killed and (found := signalled_worker(line, launch.node_rank, launch.nproc_per_node)):
            killed.append(found)

    relay = _relay(proc.stderr, watch)

    def forward(signum, frame):
        global _stopped
        _stopped = _stopped or frame is not None  # a real signal, not a lost lease
        workers = children(proc.pid)
        for pid in workers or [proc.pid]:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        print(f"launcher: {signal.Signals(signum).name} sent to {len(workers) or 'torchrun, no'} worker(s)", flush=True)

    signal.signal(signal.SIGTERM, forward)
    lost = None
    try:
        while True:
            try:
                status = proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if lease is not None and lease.lost and lost is None:
                    lost = lease.lost
                    forward(signal.SIGTERM, None)
    finally:
        if lease is not None:
            lease.release()
    relay.join(timeout=5)  # torchrun's last lines
    reason = None
    if lost is not None:  # the workers' own errors (a fenced commit) follow from it
        reason = f"launcher: {lost}; the workers were stopped"
        status = status or 1
    elif status != 0:
        time.sleep(0.2)  # a worker's last words
        host = launch.env.get("SM_CURRENT_HOST", "this host")
        reason = failure_reason(failure_dir, status, host, killed[0] if killed else None)
    shutil.rmtree(failure_dir, ignore_errors=True)
    return (status if status >= 0 else 128 - status), reason


def health_launch(first: Launch) -> Launch:
    """The probe's health check (``training.health_check``) on candidate 1's hosts and ranks, on the base
    rendezvous port (candidate N uses the base + N)."""
    argv: list[str] = []
    for arg in first.argv:
        if arg == "--probe" or arg.startswith("--candidate="):
            continue
        if arg.startswith("--master_port="):
            arg = f"--master_port={int(arg.split('=', 1)[1]) - 1}"
        argv.append(arg)
    argv[argv.index("--module") + 1] = "training.health_check"
    return replace(first, argv=argv)


def run_health_check(first: Launch) -> str | None:
    """Run the health check; the reason it failed (naming the host, GPU and figure), or None."""
    launch = health_launch(first)
    print(launch.summary(), flush=True)
    status, reason = run_workers(launch)
    if status == 0:
        return None
    host = first.env.get("SM_CURRENT_HOST", "this host")
    return reason or f"{host}: the health check exited with status {status}"


def run_probe_launches(
    first: Launch,
    make_launch: Callable[[int], Launch],
    probe_dir: Path,
    output_dir: Path,
    cfg,
    first_refused: LaunchError | None = None,
) -> int:
    """Probe mode: one torchrun per candidate, in order; then, on host 0, the PROBE lines and the choice.

    A candidate whose launch fails (for a reason other than running out of memory, which is a result) is
    recorded as failed with its reason and the others still run, as is one the launcher's checks refuse
    (``first_refused``: candidate 1's refusal). The job fails when no candidate ran and some failed (the failure
    file names each)."""
    host = first.env.get("SM_CURRENT_HOST", "this host")
    if first.node_rank == 0:
        for number in range(1, first.candidates + 1):
            result_file(probe_dir, number).unlink(missing_ok=True)
    unhealthy = run_health_check(first)
    if unhealthy is not None:  # no candidate runs on these instances; the gate never starts training
        write_failure(output_dir, f"probe: {unhealthy}")
        return 1
    failed: dict[int, str] = {}
    for number in range(1, first.candidates + 1):
        if _stopped:
            failed[number] = "not run: the probe job was stopped"
            continue
        try:
            if number == 1 and first_refused is not None:
                raise first_refused
            launch = first if number == 1 else make_launch(number)
        except LaunchError as error:
            failed[number] = f"{host}: launcher: {error}"
            print(f"launcher: probe candidate {number} not launched: {error}", flush=True)
            continue
        print(launch.summary(), flush=True)
        status, reason = run_workers(launch)
        if status != 0:
            failed[number] = reason or f"{host}: torchrun exited with status {status}"
            print(f"launcher: probe candidate {number} failed: {failed[number]}", flush=True)
    if first.node_rank != 0:
        if len(failed) == first.candidates:
            write_failure(output_dir, "probe: every candidate failed on this host: " + _listed(failed))
            return 1
        return 0
    results = read_results(probe_dir, first.candidates, failed)
    for line in summary_lines(results, cfg):
        print(line, flush=True)
    if all(r.status == FAILED for r in results):
        write_failure(output_dir, "probe: every candidate failed: " + _listed(failed))
        return 1
    return 0


def _listed(failed: Mapping[int, str]) -> str:
    return "; ".join(f"candidate {number}: {reason}" for number, reason in sorted(failed.items()))[:1000]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m training.launcher [extra trainer args]``; runs torchrun (found on PATH).

    ``TIERED_TRAINING_OPT_ML`` moves the /opt/ml tree; ``TIERED_TRAINING_CONFIG_DIR`` only the config.
    """
    extra = list(sys.argv[1:] if argv is None else argv)
    if extra[:1] == ["train"]:  # SageMaker runs `docker run <image> train`
        extra = extra[1:]
    root = Path(os.environ.get(OPT_ML_VARIABLE) or OPT_ML)
    environ = dict(os.environ)
    if os.environ.get(OPT_ML_VARIABLE):
        paths_env, paths_args = opt_ml_paths(root)
        environ = {**paths_env, **environ}
        extra = paths_args + extra
    config_dir = Path(os.environ.get("TIERED_TRAINING_CONFIG_DIR") or root / "input/config")
    probe_dir = Path(environ.get(PROBE_DIR_VARIABLE) or root / "output/data/probe")
    environ[PROBE_DIR_VARIABLE] = str(probe_dir)

    def make_launch(candidate: int, checks: bool = True) -> Launch:
        return launch_from_files(
            config_dir,
            environ,
            extra,
            checkpoint_dir=Path(environ.get("TT_CHECKPOINT_DIR") or root / "checkpoints"),
            data_dir=Path(environ.get("TT_DATA_DIR") or environ.get("SM_CHANNEL_TRAIN") or root / "input/data/train"),
            candidate=candidate,
            checks=checks,
        )

    refused = None
    try:
        try:
            launch = make_launch(1)
        except LaunchError as error:
            if run_mode(environ) != "probe":
                raise
            refused = error  # a probe records candidate 1 as failed if only the run's checks refuse it
            launch = make_launch(1, checks=False)
    except LaunchError as error:
        print(f"launcher: error: {error}", file=sys.stderr)
        write_failure(root / "output", f"launcher: {error}")
        return EXIT_USAGE
    if launch.mode == "probe":
        cfg = load_run_config(read_json(config_dir / "hyperparameters.json", "hyperparameters.json"))
        return run_probe_launches(launch, make_launch, probe_dir, root / "output", cfg, refused)
    lease = None
    if launch.mode == "train":
        try:
            lease = take_lease(launch, environ)
        except ValueError as error:  # the lease's timings in the Environment
            print(f"launcher: error: {error}", file=sys.stderr, flush=True)
            write_failure(root / "output", f"launcher: {error}")
            return EXIT_USAGE
        except LeaseRefused as error:
            print(f"launcher: error: {error}", file=sys.stderr, flush=True)
            write_failure(root / "output", f"launcher: {error}")
            return EXIT_HELD
    print(launch.summary(), flush=True)
    sys.stderr.flush()
    return run_torchrun(launch, root / "output", lease)


def take_lease(launch: Launch, environ: Mapping[str, str]) -> RunLease | None:
    """The run's lease (training/components/run_lease.py): taken by the first host, checked by the others. The
    first host's workers get :data:`LEASE_STATE_VARIABLE`, the file where the launcher keeps the lease's state for
    their commits (training/components/fence.py). ValueError: the lease's timings in the Environment are invalid."""
    timings = Timings.from_environment(environ, launch.save_seconds)
    state = Path(tempfile.mkdtemp(prefix="tt-lease-")) / "lease-state.json"
    lease = RunLease.from_environment(
        environ,
        launch.run_id,
        launch.env.get("SM_CURRENT_HOST", ""),
        timings=timings,
        state_path=state if launch.node_rank == 0 else None,
        say=lambda text: print(text, flush=True),
    )
    if lease is None:
        return None
    if launch.node_rank == 0:
        lease.take()
        launch.env[LEASE_STATE_VARIABLE] = str(state)
        return lease
    lease.check()
    return None


if __name__ == "__main__":
    sys.exit(main())
