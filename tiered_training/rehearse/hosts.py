"""One SageMaker training job, run as N simulated hosts on this machine.

Each host gets what SageMaker gives an instance: its own ``/opt/ml`` tree in a temporary
directory (``input/config/resourceconfig.json`` naming it, ``hyperparameters.json``,
``inputdataconfig.json``, ``input/data/<channel>``, ``checkpoints``, ``model``,
``output``), its channels downloaded from S3 (``FullyReplicated``), the whole checkpoint
prefix downloaded at job start, and the image's entry point (``python -m training.launcher
train``) started with the job's ``Environment``. The launchers join one torchrun job over
the loopback interface (gloo on the CPU, ``SM_NUM_GPUS`` workers per host). While the job
runs, each host's checkpoint directory is mirrored to ``CheckpointConfig.S3Uri``
(:class:`~tiered_training.rehearse.s3.CheckpointSync`); at its end the first host's model
directory is uploaded as ``model.tar.gz`` under ``S3OutputPath``, and each host's
``/opt/ml/output/failure`` becomes the job's failure reason.

When a host exits with an error or is lost, the job is over: SageMaker stops the other
hosts. Here they get :data:`GRACE_S` seconds to fail on their own, then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiered_training.contract.failures import causes_first
from tiered_training.contract.ports import loopback_port
from tiered_training.rehearse.interpreter import JobAttempt
from tiered_training.rehearse.s3 import CheckpointSync, LocalS3, checkpoints_in, download_prefix, list_keys, split_uri
from tiered_training.text import quote

GRACE_S = 45.0
JOB_TIMEOUT_S = 900.0
STOP_GRACE_S = 2.0  # when the rehearsal itself is stopped: SIGTERM, then SIGKILL this much later
PROGRESS = (
    "straggler: ",
    "health check: ",
    "step ",
    "probe candidate",
    "PROBE ",
    "checkpoint step-",
    "resuming",
    "resumed",
    "skipping checkpoint",
    "pruned",
    "SIGTERM",
    "stopped by",
    "exported",
    "launcher: error",
    "Error",
    "error:",
)


@dataclass(frozen=True)
class Interrupt:
    """``sigterm@STEP``: SIGTERM to every host once step STEP is logged. ``kill-host@save``: SIGKILL
    the last host while it writes its second checkpoint (one is committed before it);
    ``kill-host@STEP``: while it writes the first checkpoint at or after STEP."""

    kind: str  # "sigterm" or "kill-host"
    step: int | None  # None: the second save

    @classmethod
    def parse(cls, text: str) -> Interrupt:
        what, _, when = text.partition("@")
        if what not in ("sigterm", "kill-host") or not when:
            raise ValueError(f"--interrupt {quote(text, 60)}: expected sigterm@STEP, kill-host@save or kill-host@STEP")
        if when == "save" and what == "kill-host":
            return cls(what, None)
        if not when.isdigit() or len(when) > 4000 or int(when) < 1:  # int() refuses 4,300 digits and more
            raise ValueError(
                f"--interrupt {quote(text, 60)}: {quote(when, 30)} is not a step number"
                + (" (or 'save')" if what == "kill-host" else "")
            )
        return cls(what, int(when))

    def unreachable(self, steps: int, interval: int) -> str | None:
        """Why a run of ``steps`` steps with a checkpoint every ``interval`` never reaches this interrupt, or None."""
        if self.kind == "sigterm" and self.step is not None:  # a sigterm always has its step
            return None if self.step < steps else f"a run of {steps} steps ends before step {self.step}"
        save = 2 * interval if self.step is None else -(-self.step // interval) * interval
        if save <= steps:
            return None
        which = "the second" if self.step is None else f"the first at or after step {self.step}"
        return (
            f"{which} checkpoint save is at step {save} (a checkpoint every {interval} steps); "
            f"a run of {steps} steps ends before it (raise --steps)"
        )

    def describe(self) -> str:
        if self.kind == "sigterm":
            return f"SIGTERM to every host after step {self.step} (a spot interruption)"
        at = (
            "its second checkpoint save"
            if self.step is None
            else f"the first checkpoint save at or after step {self.step}"
        )
        return f"SIGKILL of the last host during {at} (an instance lost)"


@dataclass
class Host:
    name: str
    root: Path  # this host's /opt/ml
    proc: subprocess.Popen[str] | None = None
    lines: list[tuple[float, str]] = field(default_factory=list)
    reader: threading.Thread | None = None
    sync: CheckpointSync | None = None
    killed: str | None = None

    @property
    def process(self) -> subprocess.Popen[str]:
        """The host's training process, once JobRunner has started it."""
        if self.proc is None:
            raise RuntimeError(f"host {self.name} was never started")
        return self.proc


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), deepest last."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) > 1:
                parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    for target in [pid, *descendants(pid)]:
        try:
            os.kill(target, sig)
        except ProcessLookupError:
            pass


def _started(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None once it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def stop_trees(pids: list[int], grace_s: float) -> None:
    """SIGTERM to every process under ``pids`` (them included), SIGKILL to those alive ``grace_s`` later.
    torchrun starts each worker in a session of its own, so the tree is walked, not a process group."""
    found = {target: _started(target) for pid in pids for target in [pid, *descendants(pid)]}
    for target in found:
        try:
            os.kill(target, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_started(t) == s is not None for t, s in found.items()):
        time.sleep(0.05)
    for pid in pids:  # children started meanwhile
        found.update({target: _started(target) for target in descendants(pid) if target not in found})
    for target, start in found.items():
        if start is not None and _started(target) == start:  # the same process, not a reused id
            try:
                os.kill(target, signal.SIGKILL)
            except ProcessLookupError:
                pass


class JobRunner:
    """Runs the Training steps of a rehearsal (the interpreter's ``runner``)."""

    def __init__(
        self,
        s3: LocalS3,
        workdir: Path,
        *,
        workers: int,
        repo: Path,
        hyperparameters: Callable[[dict[str, Any]], dict[str, str]],
        interrupt: Interrupt | None = None,
        say: Callable[[str], None] = print,
        environment: dict[str, dict[str, str]] | None = None,
    ):
        """``environment``: per step name, variables added to its jobs' environment (a rehearsal's own, such as
        the Probe's slowed candidate), after the step's ``Environment``."""
        self.s3 = s3
        self.environment = dict(environment or {})
        self.client = s3.client()
        self.workdir = Path(workdir)
        self.workers = workers
        self.repo = Path(repo)
        self.hyperparameters = hyperparameters
        self.interrupt = interrupt
        self.say = say
        self._sync_lock = threading.Lock()
        self.max_checkpoints = 0  # most step-N prefixes the checkpoint prefix held at once, over all jobs
        self.interrupted: str | None = None  # what the interrupt did, once it happened
        self._live: list[Host] = []  # the hosts of the jobs running now (several when executions run at once)
        self._live_lock = threading.RLock()  # reentrant: stop() may run in the main thread while it holds it
        self.stopping = False  # stop() of every host was called: no host starts any more

    def stop(self, hosts: list[Host] | None = None, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the hosts (default: every host of every running job), with their torchrun and workers:
        SIGTERM, then SIGKILL ``grace_s`` later."""
        if hosts is None:
            with self._live_lock:
                self.stopping = True
                hosts = list(self._live)
        for host in hosts:
            if host.sync is not None:
                host.sync.halt()  # no last pass: the rehearsal is ending
        stop_trees([h.proc.pid for h in hosts if h.proc is not None], grace_s)
        for host in hosts:
            if host.proc is not None:
                try:
                    host.proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    pass

    # -- the model registry --------------------------------------------------------------

    def register(self, step: str, args: dict[str, Any]) -> str:
        """CreateModelPackage on moto's SageMaker, in the group the stack would have created; the package's ARN.
        The evaluation it names must be in S3, as SageMaker reads the model quality statistics it is given."""
        sagemaker = self.s3.client("sagemaker")
        group = args["ModelPackageGroupName"]
        listed = sagemaker.list_model_package_groups().get("ModelPackageGroupSummaryList", [])
        known = [g["ModelPackageGroupName"] for g in listed]
        if group not in known:  # the construct's AWS::SageMaker::ModelPackageGroup
            sagemaker.create_model_package_group(ModelPackageGroupName=group)
        statistics = ((args.get("ModelMetrics") or {}).get("ModelQuality") or {}).get("Statistics") or {}
        if statistics.get("S3Uri"):
            bucket, key = split_uri(statistics["S3Uri"])
            self.client.head_object(Bucket=bucket, Key=key)  # a missing evaluation fails the step, by its URI
        return sagemaker.create_model_package(**args)["ModelPackageArn"]

    # -- the job -----------------------------------------------------------------------

    def __call__(
        self, step: str, job_name: str, args: dict[str, Any], attempt: int, *, warm_from: str | None
    ) -> JobAttempt:
        resources = args["ResourceConfig"]
        count = int(resources["InstanceCount"])
        names = [f"algo-{i + 1}" for i in range(count)]
        job_dir = self.workdir / job_name / f"attempt-{attempt}"
        checkpoint_uri = (args.get("CheckpointConfig") or {}).get("S3Uri")
        interrupt = self.interrupt if (checkpoint_uri and attempt == 1 and not self.interrupted) else None
        hyperparameters = self.hyperparameters(args.get("HyperParameters") or {})
        port = loopback_port()  # torchrun's rendezvous
        hosts = [Host(name, job_dir / name / "opt/ml") for name in names]
        self.say(
            f"  {step} attempt {attempt}: {count} host(s) x {self.workers} CPU worker(s); /opt/ml trees under {job_dir}"
        )
        for host in hosts:
            self._prepare(host, names, resources, args, hyperparameters, checkpoint_uri)
        started = time.monotonic()
        with self._live_lock:
            self._live.extend(hosts)
        try:
            return self._run(step, job_name, args, hosts, port, started, interrupt, checkpoint_uri)
        except BaseException:
            self.stop(hosts)  # a signal to the rehearsal, or an error here: none of this job's hosts outlives it
            raise
        finally:
            with self._live_lock:
                self._live = [h for h in self._live if all(h is not mine for mine in hosts)]

    def _run(self, step, job_name, args, hosts: list[Host], port, started, interrupt, checkpoint_uri) -> JobAttempt:
        for host in hosts:
            self._start(host, args, port, step, job_name)
        interrupted_by: str | None = None
        watch = _Watch(interrupt, hosts) if interrupt else None
        first_failure: float | None = None
        while True:
            running = [h for h in hosts if h.process.poll() is None]
            if not running:
                break
            if watch is not None and interrupted_by is None:
                interrupted_by = watch.check(self.say)
                if interrupted_by:
                    self.interrupted = interrupted_by
            failed = [h for h in hosts if h.process.poll() not in (None, 0) or h.killed]
            if failed and first_failure is None:
                first_failure = time.monotonic()
            if first_failure is not None and time.monotonic() - first_failure > GRACE_S:
                for h in running:  # SageMaker stops the job
                    h.killed = h.killed or "stopped: another host failed"
                    kill_tree(h.process.pid, signal.SIGTERM)
                time.sleep(5)
                for h in running:
                    kill_tree(h.process.pid, signal.SIGKILL)
            if time.monotonic() - started > JOB_TIMEOUT_S:
                for h in running:
                    h.killed = f"the rehearsal's job timeout of {JOB_TIMEOUT_S:.0f} s"
                    kill_tree(h.process.pid, signal.SIGKILL)
            time.sleep(0.05)
        for host in hosts:
            if host.reader is not None:  # every host was started
                host.reader.join(timeout=10)
        stats = {}
        for host in hosts:
            if host.sync is not None:
                stats[host.name] = host.sync.stop()
        return self._result(
            step, job_name, args, hosts, stats, interrupted_by, time.monotonic() - started, checkpoint_uri
        )

    def process(self, step: str, job_name: str, args: dict[str, Any]) -> JobAttempt:
        """A processing job on ``InstanceCount`` simulated instances, run at once: each its own ``/opt/ml`` tree
        in the workdir (``/opt/ml/config/resourceconfig.json`` naming ``current_host`` algo-i and ``hosts``;
        ``TIERED_TRAINING_OPT_ML`` points at the tree), the image's entry point and arguments (``/opt/ml`` paths
        mapped into the tree); the job fails if any instance fails, naming it. Then each output directory of
        every instance is uploaded to its ``S3Uri``, as SageMaker does; two instances that write one file with
        different bytes fail the job (SageMaker would keep either)."""
        from tiered_training.rehearse.s3 import upload_dir

        cluster = (args.get("ProcessingResources") or {}).get("ClusterConfig") or {}
        count = int(cluster.get("InstanceCount") or 1)
        names = [f"algo-{i + 1}" for i in range(count)]
        base = self.workdir / job_name
        roots = {name: (base if count == 1 else base / name) / "opt/ml" for name in names}
        app = args.get("AppSpecification") or {}
        template = [
            str(part) for part in (app.get("ContainerEntrypoint") or []) + (app.get("ContainerArguments") or [])
        ]
        if template and template[0] == "python":
            template[0] = sys.executable
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERED_TRAINING_", "TT_", "SM_"))}
        env.pop("AWS_PROFILE", None)
        env.pop("AWS_SESSION_TOKEN", None)
        env.update({str(k): str(v) for k, v in (args.get("Environment") or {}).items()})
        env.update(
            {
                "AWS_ENDPOINT_URL_S3": str(self.s3.endpoint),
                "AWS_ACCESS_KEY_ID": "rehearsal",
                "AWS_SECRET_ACCESS_KEY": "rehearsal",
                "AWS_DEFAULT_REGION": env.get("AWS_DEFAULT_REGION") or "us-east-1",
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([str(self.repo), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            }
        )
        specs = (args.get("ProcessingOutputConfig") or {}).get("Outputs", [])
        procs: dict[str, subprocess.Popen[str]] = {}
        where = base if count == 1 else f"{base}/algo-*"
        self.say(f"  {step}: {count} instance{'s' * (count != 1)}; /opt/ml trees under {where}")
        started = time.monotonic()
        for name, root in roots.items():
            for output in specs:
                _in_tree(root, output["S3Output"]["LocalPath"]).mkdir(parents=True, exist_ok=True)
            config = root / "config"
            config.mkdir(parents=True, exist_ok=True)
            resource = {"current_host": name, "hosts": names, "current_instance_type": cluster.get("InstanceType")}
            (config / "resourceconfig.json").write_text(json.dumps(resource))
            command = [str(_in_tree(root, part)) if part.startswith("/opt/ml/") else part for part in template]
            procs[name] = subprocess.Popen(
                command,
                cwd=root,
                env={**env, "TIERED_TRAINING_OPT_ML": str(root)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        outputs_by_host = {
            name: {o["OutputName"]: str(_in_tree(root, o["S3Output"]["LocalPath"])) for o in specs}
            for name, root in roots.items()
        }
        codes, log = self._wait_all(step, procs, started)
        seconds = round(time.monotonic() - started, 1)
        first = outputs_by_host[names[0]]
        detail: dict[str, Any] = {"outputs": first, "exit_code": max(codes.values(), key=abs), "seconds": seconds}
        detail["hosts"] = {name: {"exit_code": codes[name], "outputs": outputs_by_host[name]} for name in names}
        failed = [name for name in names if codes[name] != 0]
        if failed:
            name = failed[0]
            lines = [line for _, host, line in log if host == name]
            reason = exit_reason(codes[name], lines)
            hosts = ", ".join(failed)
            said = f"{hosts} failed: {reason}" if len(names) > 1 else reason  # one instance: no host to name
            return JobAttempt("Failed", _short(said, 500), log=log, detail=detail)
        for output in specs:
            merged = base / "merged" / output["OutputName"] if count > 1 else Path(first[output["OutputName"]])
            if count > 1:
                clash = _merge({name: Path(outputs_by_host[name][output["OutputName"]]) for name in names}, merged)
                if clash:
                    return JobAttempt("Failed", clash, log=log, detail=detail)
                detail["outputs"] = {**detail["outputs"], output["OutputName"]: str(merged)}
            s3_output = output["S3Output"]
            self.s3.ensure_bucket(self.client, split_uri(s3_output["S3Uri"])[0])
            upload_dir(self.client, merged, s3_output["S3Uri"])
        return JobAttempt("Completed", log=log, detail=detail)

    def _wait_all(
        self, step: str, procs: dict[str, subprocess.Popen[str]], started: float
    ) -> tuple[dict[str, int], list[tuple[float, str, str]]]:
        """Each instance's exit code and log; past the rehearsal's job timeout every instance still running is
        killed and fails."""
        results: dict[str, tuple[int, list[str]]] = {}

        def read(name: str, proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if line.startswith(("reusing prepared data", "preparing data", "prepared data", "error:", "skipped")):
                    self.say(f"    [{step} {name}] {_short(line.rstrip())}")
            results[name] = (proc.wait(), lines)

        threads = [threading.Thread(target=read, args=item, daemon=True) for item in procs.items()]
        for thread in threads:
            thread.start()
        for thread, proc in zip(threads, procs.values(), strict=True):
            thread.join(max(0.0, JOB_TIMEOUT_S - (time.monotonic() - started)))
            if thread.is_alive():
                kill_tree(proc.pid)
                thread.join(10)
        now = time.time()
        codes: dict[str, int] = {}
        log: list[tuple[float, str, str]] = []
        for name in procs:
            code, lines = results.get(name, (-1, [f"the rehearsal's job timeout of {JOB_TIMEOUT_S:.0f} s"]))
            codes[name] = code
            log += [(now, name, line) for line in lines]
        return codes, log

    def _prepare(
        self, host: Host, names: list[str], resources: dict, args: dict, hyperparameters: dict, checkpoint_uri
    ) -> None:
        root = host.root
        for sub in ("input/config", "input/data", "checkpoints", "model", "output/data"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        resourceconfig = {
            "current_host": host.name,
            "hosts": names,
            "current_instance_type": resources["InstanceType"],
            "current_group_name": "homogeneousCluster",
            "network_interface_name": "lo",
            "instance_groups": [
                {
                    "instance_group_name": "homogeneousCluster",
                    "instance_type": resources["InstanceType"],
                    "hosts": names,
                }
            ],
        }
        config = root / "input/config"
        (config / "resourceconfig.json").write_text(json.dumps(resourceconfig, indent=1))
        (config / "hyperparameters.json").write_text(json.dumps(hyperparameters, indent=1))
        channels = {}
        for channel in args.get("InputDataConfig", []):
            source = channel["DataSource"]["S3DataSource"]
            if source.get("S3DataDistributionType", "FullyReplicated") != "FullyReplicated":
                raise ValueError(f"channel {channel['ChannelName']}: only FullyReplicated is rehearsed")
            download_prefix(self.client, source["S3Uri"], root / "input/data" / channel["ChannelName"])
            channels[channel["ChannelName"]] = {
                "TrainingInputMode": channel.get("InputMode", "File"),
                "S3DistributionType": "FullyReplicated",
                "RecordWrapperType": "None",
            }
        (config / "inputdataconfig.json").write_text(json.dumps(channels, indent=1))
        if checkpoint_uri:
            bucket, _ = split_uri(checkpoint_uri)
            self.s3.ensure_bucket(self.client, bucket, versioned=True)
            known = set(list_keys(self.client, checkpoint_uri))
            download_prefix(self.client, checkpoint_uri, root / "checkpoints")  # every host gets the whole prefix
            host.sync = CheckpointSync(
                self.client,
                root / "checkpoints",
                checkpoint_uri,
                host.name,
                known=known,
                lock=self._sync_lock,
                observe=self._observe,
            )

    def _observe(self, held: int) -> None:
        self.max_checkpoints = max(self.max_checkpoints, held)

    def _start(self, host: Host, args: dict, port: int, step: str, job_name: str) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TIERED_TRAINING_", "TT_", "SM_")) and k not in ("AWS_PROFILE", "AWS_SESSION_TOKEN")
        }
        env.update({str(k): str(v) for k, v in (args.get("Environment") or {}).items()})
        env.update(
            {
                "TIERED_TRAINING_OPT_ML": str(host.root),
                "TIERED_TRAINING_MASTER_ADDR": "127.0.0.1",
                "TIERED_TRAINING_MASTER_PORT": str(port),
                "SM_NUM_GPUS": str(self.workers),
                "TRAINING_JOB_NAME": job_name,  # SageMaker sets it in the container
                # The launcher's S3 calls (the run's lease) reach the local S3, as the job's role reaches the store.
                "AWS_ENDPOINT_URL_S3": str(self.s3.endpoint),
                "AWS_ACCESS_KEY_ID": "rehearsal",
                "AWS_SECRET_ACCESS_KEY": "rehearsal",
                "AWS_DEFAULT_REGION": env.get("AWS_DEFAULT_REGION") or "us-east-1",
                "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([str(self.repo), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            }
        )
        env.update(self.environment.get(step.split("-")[0], {}))  # a chain's variables reach its segments
        env.update(self.environment.get(step, {}))
        for channel in args.get("InputDataConfig", []):  # SageMaker names each channel's directory
            name = channel["ChannelName"]
            env[f"SM_CHANNEL_{name.upper()}"] = str(host.root / "input/data" / name)
        tensorboard = (args.get("TensorBoardOutputConfig") or {}).get("LocalPath")
        if tensorboard:  # the step's /opt/ml path, inside this host's tree
            env["TT_TENSORBOARD_DIR"] = str(_in_tree(host.root, tensorboard))
        if host.sync is not None:
            host.sync.start()
        with self._live_lock:  # a host starts before stop() looks, or not at all
            if self.stopping:
                raise RuntimeError("the rehearsal is stopping: no host starts")
            host.proc = subprocess.Popen(
                [sys.executable, "-m", "training.launcher", "train"],
                cwd=host.root,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
        log = open(host.root.parent.parent / f"{host.name}.log", "w")
        tag = f"[{step} {host.name}]"

        def read() -> None:
            with log:
                for line in host.process.stdout or ():  # stdout=PIPE: never None
                    line = line.rstrip("\n")
                    host.lines.append((time.time(), line))
                    log.write(line + "\n")
                    if any(marker in line for marker in PROGRESS) and not line.startswith("{"):
                        self.say(f"    {tag} {_short(line)}")

        host.reader = threading.Thread(target=read, daemon=True)
        host.reader.start()

    # -- the outcome -------------------------------------------------------------------

    def _result(
        self, step, job_name, args, hosts: list[Host], stats, interrupted_by, seconds, checkpoint_uri
    ) -> JobAttempt:
        codes = {h.name: h.process.returncode for h in hosts}
        reasons = {}
        for h in hosts:
            failure = h.root / "output/failure"
            if failure.is_file():
                reasons[h.name] = failure.read_text().strip()
        log = [(t, h.name, line) for h in hosts for t, line in h.lines]
        detail: dict[str, Any] = {
            "exit_codes": codes,
            "failure_files": reasons,
            "seconds": round(seconds, 1),
            "emf": {h.name: [line for _, line in h.lines if _is_emf(line)] for h in hosts},
            "losses": _losses(hosts[0].lines),
            "validation_losses": _validation_losses(hosts[0].lines),
            "resumed_from": _resumed_from(hosts[0].lines),
            "model_dir": str(hosts[0].root / "model"),
            "hosts": [h.name for h in hosts],
            "uploads": {name: sorted(s.uploaded_keys) for name, s in stats.items()},
            "interrupt": interrupted_by,
            "checkpoint_uri": checkpoint_uri,
            "run_candidate": _run_candidate(args),
            "candidate_lines": [_short(line, 400) for _, line in hosts[0].lines if _says_candidate(line)],
        }
        killed = [h for h in hosts if h.killed and h.killed.startswith("SIGKILL")]
        if checkpoint_uri:
            detail["checkpoints_in_s3"] = sorted(
                checkpoints_in(list_keys(self.client, checkpoint_uri)), key=lambda s: int(s.split("-")[1])
            )
        self._upload_tensorboard(args, job_name, hosts)
        if all(code == 0 for code in codes.values()) and not killed:
            self._upload_model(args, job_name, hosts[0])
            status = "Interrupted" if interrupted_by else "Completed"
            return JobAttempt(status, interrupted_by or "", log=log, detail=detail)
        if killed:
            reason = f"{killed[0].name} was lost ({killed[0].killed})"
            others = causes_first([text for name, text in reasons.items() if name != killed[0].name])
            if others:
                reason += "; " + "; ".join(others)
            return JobAttempt("Failed", reason, internal=True, log=log, detail=detail)
        # SageMaker reports one reason; the host whose error is not a consequence of another's exit comes first
        reason = "; ".join(causes_first(list(reasons.values()))) or "; ".join(
            f"{n} exited with status {c}" for n, c in codes.items() if c
        )
        return JobAttempt("Failed", reason, log=log, detail=detail)

    def _upload_model(self, args: dict, job_name: str, host: Host) -> None:
        output = (args.get("OutputDataConfig") or {}).get("S3OutputPath")
        if not output:
            return
        bucket, prefix = split_uri(output)
        self.s3.ensure_bucket(self.client, bucket)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for path in sorted((host.root / "model").rglob("*")):
                if path.is_file():
                    archive.add(path, arcname=path.relative_to(host.root / "model").as_posix())
        buffer.seek(0)
        key = f"{prefix.rstrip('/')}/{job_name}/output/model.tar.gz".lstrip("/")
        self.client.upload_fileobj(buffer, bucket, key)

    def _upload_tensorboard(self, args: dict, job_name: str, hosts: list[Host]) -> None:
        config = args.get("TensorBoardOutputConfig") or {}
        if not config.get("S3OutputPath") or not config.get("LocalPath"):
            return
        bucket, prefix = split_uri(config["S3OutputPath"])
        self.s3.ensure_bucket(self.client, bucket)
        for host in hosts:
            local = _in_tree(host.root, config["LocalPath"])
            for path in sorted(local.rglob("*")) if local.is_dir() else []:
                if path.is_file():
                    relative = path.relative_to(local).as_posix()
                    key = f"{prefix.rstrip('/')}/{job_name}/tensorboard-output/{relative}".lstrip("/")
                    self.client.upload_file(str(path), bucket, key)


def _in_tree(root: Path, path: str) -> Path:
    """``/opt/ml/...`` inside a simulated host's tree ``root``."""
    relative = Path(path).relative_to("/opt/ml") if Path(path).is_relative_to("/opt/ml") else Path(path.lstrip("/"))
    return root / relative


class _Watch:
    """Fires the interrupt once its moment has come; returns what it did."""

    def __init__(self, interrupt: Interrupt, hosts: list[Host]):
        self.interrupt, self.hosts = interrupt, hosts
        self.target = hosts[-1]
        root = self.target.root / "checkpoints"
        self.before = {p.name for p in root.iterdir()} if root.is_dir() else set()
        self.saves: list[str] = []

    def check(self, say) -> str | None:
        if self.interrupt.kind == "sigterm" and self.interrupt.step is not None:  # a sigterm always has its step
            if any(_step_of(line) >= self.interrupt.step for _, line in list(self.hosts[0].lines)):
                for host in self.hosts:
                    if host.process.poll() is None:
                        os.kill(host.process.pid, signal.SIGTERM)  # SageMaker signals each container's entry point
                say(f"    >>> interrupt: SIGTERM to every host after step {self.interrupt.step}")
                return f"SIGTERM after step {self.interrupt.step}"
            return None
        root = self.target.root / "checkpoints"
        if not root.is_dir():
            return None
        for entry in sorted(root.iterdir()):
            if entry.name in self.before or entry.name in self.saves or not entry.name.startswith("step-"):
                continue
            if not any(entry.iterdir()):
                continue
            self.saves.append(entry.name)
            number = int(entry.name.split("-")[1])
            due = len(self.saves) == 2 if self.interrupt.step is None else number >= self.interrupt.step
            if due and not (entry / "COMMITTED").exists():
                kill_tree(self.target.process.pid, signal.SIGKILL)
                self.target.killed = f"SIGKILL while writing checkpoint {entry.name}"
                say(f"    >>> interrupt: SIGKILL of {self.target.name} while it writes {entry.name}")
                return f"SIGKILL of {self.target.name} during the save of {entry.name}"
        return None


def _run_candidate(args: dict[str, Any]) -> int | None:
    """The job's ``run.candidate`` hyperparameter as the container reads it ("2.0", a metric rendered, is 2)."""
    raw = (args.get("HyperParameters") or {}).get("run.candidate")
    try:
        return int(float(json.loads(raw))) if isinstance(raw, str) else None
    except (ValueError, TypeError):
        return None


CANDIDATE_LINE = re.compile(r"\bprobe: |\bprobe candidate \d+ \(|\btraining candidate \d+ of \d+")


def _says_candidate(line: str) -> bool:
    """The container's readable lines about candidates: the probe's choice, the trainer's candidate."""
    return bool(CANDIDATE_LINE.search(line)) and not line.lstrip().startswith("PROBE ")


def _step_of(line: str) -> int:
    """The step a rank-0 progress line reports (``metrics: step N/TOTAL``), or 0."""
    found = _STEP.search(line)
    return int(found.group(1)) if found else 0


_STEP = re.compile(r"metrics: step (\d+)/")


def exit_reason(code: int, lines: list[str]) -> str:
    """Why a process failed: the signal that ended it (with the OOM killer named for SIGKILL) ahead of its last
    output line, else its last output line, else its status."""
    last = next((line for line in reversed(lines) if line.strip()), "")
    number = -code if code < 0 else code - 128 if code == 128 + signal.SIGKILL else 0
    if not number:
        return last or f"exited with status {code}"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    reason = f"the process was killed by {name} (exit {-number}, {128 + number} from a shell)"
    if number == signal.SIGKILL:
        reason += ": possibly the kernel's OOM killer: check the instance's memory"
    return f"{reason}; its last output: {last}" if last else reason


def _merge(trees: dict[str, Path], into: Path) -> str:
    """Every instance's output tree copied into one, as their uploads to one S3 prefix land; a message naming the
    file and the instances where two wrote one path with different bytes, else ''."""
    import shutil

    written: dict[Path, tuple[str, bytes]] = {}
    into.mkdir(parents=True, exist_ok=True)
    for host, tree in trees.items():
        for path in sorted(p for p in tree.rglob("*") if p.is_file()):
            relative = path.relative_to(tree)
            data = path.read_bytes()
            if relative in written and written[relative][1] != data:
                return (
                    f"{written[relative][0]} and {host} both wrote {relative} with different bytes: uploaded to one "
                    "S3 prefix, SageMaker keeps either"
                )
            written[relative] = (host, data)
            (into / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, into / relative)
    return ""


def _short(line: str, width: int = 160) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


def _is_emf(line: str) -> bool:
    return line.startswith("{") and '"_aws"' in line


_STEP_LINE = re.compile(r"training INFO: step +(\d+) \| loss (\S+) \|")
_SKIPPED = "| SKIPPED"  # training/step_stats.py's mark of a skipped attempt


def _losses(lines: list[tuple[float, str]]) -> dict[int, float]:
    """Each step's loss: the trainer's step line (4 decimals), replaced by the EMF event's Loss
    (every digit) where that event holds this one step. An EMF event's Loss is the mean over the
    steps since the event before it; the rehearsal's metrics interval gives each step its own."""
    logged: dict[int, float] = {}
    exact: dict[int, float] = {}
    previous = None
    for _, line in lines:
        found = _STEP_LINE.search(line)
        if found:
            if _SKIPPED not in line:  # a skipped attempt repeats the last step's number with its non-finite loss
                logged[int(found.group(1))] = float(found.group(2))
            continue
        if not _is_emf(line):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "Step" not in record or record.get("Heartbeat"):
            continue
        step = int(record["Step"])
        if "Loss" in record and (previous is None or step == previous + 1):
            exact[step] = float(record["Loss"])
        previous = step
    return {
        step: exact[step] if step in exact and abs(exact[step] - value) <= 0.5e-4 + 1e-9 else value
        for step, value in sorted(logged.items())
    }


def _validation_losses(lines: list[tuple[float, str]]) -> dict[int, float]:
    """The validation loss after each step that had a validation pass, from the EMF events."""
    found = {}
    for _, line in lines:
        if _is_emf(line) and '"ValidationLoss"' in line:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "ValidationLoss" in record and "Step" in record:
                found[int(record["Step"])] = float(record["ValidationLoss"])
    return found


def _resumed_from(lines: list[tuple[float, str]]) -> int | None:
    for _, line in lines:
        if "resumed at step " in line:
            try:
                return int(line.rsplit("resumed at step ", 1)[1].split()[0])
            except (IndexError, ValueError):
                return None
    return None
