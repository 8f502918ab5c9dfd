"""``tiered-training rehearse``: the recipe's own pipeline, run on this machine as SageMaker runs it on N hosts."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..definition import PipelineResources, build_definition, find_step, validate_definition
from ..runconfig import RunConfig
from .hosts import Interrupt, JobRunner
from .interpreter import Execution, Interpreter, PipelineError, TraceEvent
from .scale import Scaled, scale
from .s3 import LocalS3, checkpoints_in, list_keys, split_uri

STORE = "s3://rehearsal-checkpoint-store"
ROLE = "arn:aws:iam::000000000000:role/rehearsal-execution"
IMAGE = "tiered-training:rehearsal (training/launcher.py of this checkout)"


class RehearsalError(Exception):
    """Bad input to a rehearsal (parameters, interrupt, a machine without the trainer); one line for the user."""


@dataclass
class Options:
    recipe: Path
    hosts: int = 2
    workers: int = 2
    steps: int | None = None  # enough for the interrupt and a checkpoint, at least MIN_STEPS
    params: dict[str, str] = field(default_factory=dict)
    interrupt: str | None = None
    workdir: Path | None = None  # kept when given; a temporary directory otherwise
    then: dict[str, str] | None = None  # a second execution with these parameters, on the same S3 (a restart)


@dataclass
class Rehearsal:
    execution: Execution
    scaled: Scaled
    checkpoint_uri: str
    keep_last: int
    max_checkpoints: int
    checkpoints_at_end: list[str]
    uploads_by_host: dict[str, int]
    exported: dict[str, Any]
    workdir: Path
    then: Execution | None = None
    interrupt: str | None = None  # what was asked for
    interrupted: str | None = None  # what happened

    @property
    def executions(self) -> list[Execution]:
        return [self.execution] + ([self.then] if self.then is not None else [])

    @property
    def ok(self) -> bool:
        """Every execution succeeded, and the interrupt asked for happened."""
        return all(e.status == "Succeeded" for e in self.executions) and (self.interrupt is None or bool(self.interrupted))

    def train_attempts(self) -> list:
        for name in ("Train", "TrainWithoutProbe"):
            if name in self.execution.jobs:
                return self.execution.jobs[name]
        return []

    def losses(self, key: str = "losses") -> dict[int, float]:
        """The full run's loss per step: a restarted attempt's steps replace the ones it redid."""
        merged: dict[int, float] = {}
        for attempt in self.train_attempts():
            merged.update(attempt.detail.get(key, {}))
        return dict(sorted(merged.items()))

    def validation_losses(self) -> dict[int, float]:
        """The validation loss after the steps that had a validation pass (the last attempt's where redone)."""
        return self.losses("validation_losses")


MIN_STEPS = 12


def steps_for(interrupt: Interrupt | None, interval: int) -> int:
    """Steps enough for a checkpoint every ``interval`` steps to be saved, and for the interrupt to happen."""
    if interrupt is None:
        return max(MIN_STEPS, interval + 1)
    if interrupt.kind == "sigterm":
        return max(MIN_STEPS, interrupt.step + 2, interval + 1)
    save = 2 * interval if interrupt.step is None else -(-interrupt.step // interval) * interval
    return max(MIN_STEPS, save + 1)


def repo_root(library: Path | None = None) -> Path:
    """A directory whose ``training/`` is the trainer the simulated hosts run: the checkout's
    ``training/`` beside the package, or the container that an installed wheel ships as
    ``tiered_training/container/`` (linked as ``training`` in a temporary directory)."""
    library = library or Path(__file__).resolve().parents[1]
    if (library.parent / "training" / "launcher.py").is_file():
        return library.parent
    packaged = library / "container"
    if (packaged / "launcher.py").is_file():
        root = Path(tempfile.mkdtemp(prefix="tt-rehearse-trainer-"))
        atexit.register(shutil.rmtree, root, True)
        (root / "training").symlink_to(packaged, target_is_directory=True)
        return root
    raise RehearsalError(f"rehearse runs the training container's code, and neither {library.parent / 'training'} "
                         f"nor {packaged} holds it; reinstall tiered-training")


def parse_params(pairs: list[str]) -> dict[str, str]:
    params = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise RehearsalError(f"--param {pair!r}: expected Name=Value")
        params[name] = value
    return params


def rehearse(options: Options, out: IO[str] | None = None) -> Rehearsal:
    out = out or sys.stdout

    def say(text: str = "") -> None:
        out.write(text + "\n")
        out.flush()

    from ..planner import plan_file

    plan = plan_file(options.recipe)
    if not plan.ok:
        from ..errors import PlanError

        raise PlanError(plan)
    interrupt = Interrupt.parse(options.interrupt) if options.interrupt else None
    if options.hosts < 1 or options.workers < 1 or (options.steps is not None and options.steps < 2):
        raise RehearsalError("--hosts and --workers must be at least 1, --steps at least 2")
    assert plan.estimates is not None
    memory = _memory_bytes() // max(1, options.hosts * options.workers)
    repo = repo_root()
    context_parallel = (repo / "training" / "context_parallel.py").is_file()

    def scaled_for(hp: dict[str, Any]) -> Scaled:
        cfg = RunConfig.from_hyperparameters(hp)
        return scale(cfg, hosts=options.hosts, workers=options.workers, plan_step_seconds=plan.estimates.step_time_seconds,
                     plan_total_steps=plan.estimates.total_steps, memory_per_worker=memory,
                     context_parallel=context_parallel)

    interval = scaled_for(plan.run_config().to_hyperparameters()).config.checkpoint.interval_steps
    steps = options.steps if options.steps is not None else steps_for(interrupt, interval)
    problem = interrupt.unreachable(steps, interval) if interrupt else None
    if problem:
        raise RehearsalError(f"--interrupt {options.interrupt}: {problem}")
    params = {"InstanceCount": str(options.hosts), "MaxSteps": str(steps), **options.params}
    data_uri = params.get("DataUri", plan.recipe.data.uri)
    if not plan.recipe.data.allows(data_uri):
        raise RehearsalError(f"--param DataUri={data_uri}: not under the recipe's data.allowed_uris "
                             f"({', '.join(plan.recipe.data.data_prefixes)}); the pipeline's role could not read it")
    resources = PipelineResources(role_arn=ROLE, image_uri=IMAGE,
                                  checkpoint_s3_uri=f"{STORE}/{plan.name}/checkpoints/",
                                  output_s3_uri=f"{STORE}/{plan.name}/output")
    definition = build_definition(plan, resources)
    problems = validate_definition(json.loads(json.dumps(definition)))
    if problems:
        raise RehearsalError("the pipeline definition is invalid: " + "; ".join(problems))
    checkpoint_uri = find_step(definition, "Train")["Arguments"]["CheckpointConfig"]["S3Uri"]

    preview_hp = dict(plan.run_config().to_hyperparameters(), **{"batch.total_steps": params["MaxSteps"]})
    scaled = scaled_for(preview_hp)
    say(f"rehearsal of {plan.name} ({options.recipe}): its pipeline definition, {options.hosts} simulated host(s) of "
        f"{options.workers} CPU worker(s), S3 on a local moto server")
    _print_scaling(say, scaled, plan)
    if interrupt:
        say(f"interrupt: {interrupt.describe()}")
    say("")

    workdir = Path(options.workdir) if options.workdir else Path(tempfile.mkdtemp(prefix="tt-rehearse-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with LocalS3() as s3:
            client = s3.client()
            store_bucket, _ = split_uri(STORE)
            s3.ensure_bucket(client, store_bucket, versioned=True)
            bucket, _ = split_uri(data_uri)
            s3.ensure_bucket(client, bucket)
            from .data import put_shards

            manifest = put_shards(client, data_uri, token_dtype=scaled.config.data.token_dtype)
            say(f"data: {manifest['tokens']:,} {manifest['dtype']} tokens in {len(manifest['shards'])} shards at {data_uri} (local S3)")
            init_uri = model_channel_uri(definition)
            if init_uri:
                files = put_init_checkpoint(s3, client, init_uri, scaled.config, workdir, repo)
                say(f"init checkpoint: a random Hugging Face checkpoint of the rehearsal's shape ({files} files) at "
                    f"{init_uri} (local S3), in the model channel")
            runner = JobRunner(s3, workdir, workers=options.workers, repo=repo,
                               hyperparameters=lambda hp: scaled_for(hp).config.to_hyperparameters(),
                               interrupt=interrupt, say=say)
            limits = {"probe:tokens_per_second": (0.0, "is tokens/s per GPU on the plan's hardware, which a CPU cannot show")}
            interpreter = Interpreter(definition, runner, report=lambda event: _print_event(say, event), limits=limits)
            say("pipeline trace:")
            try:
                execution = interpreter.run(params)
                then = None
                if options.then is not None:
                    runner.interrupt = None
                    later = {**params, **options.then}
                    say("")
                    say("a second execution on the same checkpoint prefix: " + ", ".join(f"{k}={v}" for k, v in options.then.items()))
                    then = Interpreter(definition, runner, report=lambda event: _print_event(say, event), limits=limits).run(later)
            except PipelineError as error:
                raise RehearsalError(f"the pipeline cannot run: {error}") from None
            end_keys = list_keys(client, checkpoint_uri) if _exists(client, checkpoint_uri) else {}
            uploads: dict[str, int] = {}
            for attempt in [a for attempts in execution.jobs.values() for a in attempts]:
                for host, keys in attempt.detail.get("uploads", {}).items():
                    uploads[host] = uploads.get(host, 0) + len(keys)
            result = Rehearsal(execution, scaled, checkpoint_uri, scaled.config.checkpoint.keep_last, runner.max_checkpoints,
                               sorted(checkpoints_in(end_keys), key=lambda s: int(s.split("-")[1])), uploads, {}, workdir,
                               then, options.interrupt, runner.interrupted)
            attempts = result.train_attempts()
            if attempts and attempts[-1].status == "Completed":
                result.exported = describe_export(Path(attempts[-1].detail["model_dir"]))
            _print_summary(say, result)
            return result
    finally:
        if options.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


_init_checkpoints: dict[tuple[str, int], Path] = {}


def model_channel_uri(definition: dict[str, Any]) -> str | None:
    """The S3 URI of the training steps' ``model`` channel (the recipe's model.init_checkpoint), if any."""
    from ..definition import MODEL_CHANNEL, iter_steps

    for step in iter_steps(definition["Steps"]):
        for channel in (step.get("Arguments") or {}).get("InputDataConfig", []):
            if channel.get("ChannelName") == MODEL_CHANNEL:
                uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
                if isinstance(uri, str):
                    return uri
    return None


def put_init_checkpoint(s3: LocalS3, client, uri: str, cfg: RunConfig, workdir: Path, repo: Path) -> int:
    """A random Hugging Face checkpoint of the rehearsal's model shape under ``uri`` (made by the
    trainer's ``training.random_checkpoint``, so that this process imports no torch); its file count."""
    import subprocess

    from .s3 import upload_dir

    model = cfg.model.model_copy(update={"name": "rehearsal", "init_checkpoint": None}).model_dump_json()
    key = (model, cfg.data.seed)
    local = _init_checkpoints.get(key)
    if local is None or not local.is_dir():  # made once per shape in a process (rehearsals of several recipes)
        local = Path(workdir) / "init-checkpoint"
        model_json = Path(workdir) / "init-checkpoint-model.json"
        model_json.write_text(model)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        proc = subprocess.run([sys.executable, "-m", "training.random_checkpoint", str(model_json), str(local),
                               "--seed", str(cfg.data.seed + 1)], cwd=repo, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RehearsalError(f"could not write the rehearsal's init checkpoint: {tail}")
        _init_checkpoints[key] = local  # while its workdir lasts
    bucket, _ = split_uri(uri)
    s3.ensure_bucket(client, bucket)
    return upload_dir(client, local, uri)


def _exists(client, uri: str) -> bool:
    bucket, _ = split_uri(uri)
    return bucket in {b["Name"] for b in client.list_buckets().get("Buckets", [])}


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def describe_export(model_dir: Path) -> dict[str, Any]:
    """Files, dtypes and shapes of an exported model, from the safetensors headers (no torch needed)."""
    tensors: dict[str, dict] = {}
    files = sorted(p.name for p in model_dir.glob("*") if p.is_file())
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, info in header.items():
            if name != "__metadata__":
                tensors[name] = {"dtype": info["dtype"], "shape": info["shape"], "file": path.name}
    return {"dir": str(model_dir), "files": files, "tensors": tensors}


def _print_scaling(say, scaled: Scaled, plan) -> None:
    say("scaled down (plan -> rehearsal):")
    for change in scaled.changes:
        say(f"  {change.field}: {change.plan} -> {change.rehearsal}  ({change.why})")
    say("kept as planned:")
    say("  " + "; ".join(f"{name} {value}" for name, value in scaled.kept))


def _print_event(say, event: TraceEvent) -> None:
    marks = {"condition": "?", "fail": "x", "retry": "~", "restart": "~", "warm-pool": "*", "metrics": "=", "job": "-",
             "start": ">", "end": "<"}
    say(f"  {marks.get(event.kind, '-')} {event.text}")


def _emf_summary(lines: list[str]) -> str:
    if not lines:
        return "none (this host's node GPU metrics need a GPU; the job metrics come from global rank 0)"
    heartbeats = sum('"Heartbeat": true' in line for line in lines)
    events = [line for line in lines if '"Heartbeat": true' not in line]
    text = f"{len(events)} event(s) and {heartbeats} heartbeat(s)"
    return text + (f"; last event: {events[-1][:300]}" if events else "")


def _print_summary(say, result: Rehearsal) -> None:
    execution = result.execution
    say("")
    say("gate:")
    for event in execution.trace:
        if event.kind == "condition" and event.step in ("Gate", "GateReason"):
            for check in event.data.get("checks", []):
                say(f"  {event.step}: {check}")
    restarts = [e for e in execution.trace if e.kind in ("retry", "restart")]
    say(f"retries and restarts: {len(restarts) or 'none'}")
    for event in restarts:
        say(f"  {event.text}")
    say("EMF lines per host (CloudWatch metrics from stdout):")
    for run in result.executions:
        for step, attempts in run.jobs.items():
            for number, attempt in enumerate(attempts, start=1):
                for host, lines in attempt.detail.get("emf", {}).items():
                    say(f"  {step} attempt {number} {host}: {_emf_summary(lines)}")
    say(f"checkpoints: {result.checkpoint_uri}")
    for host, count in sorted(result.uploads_by_host.items()):
        say(f"  {host} uploaded {count} file(s)")
    say(f"  the prefix held at most {result.max_checkpoints} checkpoint(s) at once (keep_last {result.keep_last}: "
        f"at most {result.keep_last + 1}); at the end: {', '.join(result.checkpoints_at_end) or 'none'}")
    attempts = result.train_attempts()
    for number, attempt in enumerate(attempts, start=1):
        resumed = attempt.detail.get("resumed_from")
        losses = attempt.detail.get("losses", {})
        span = f"steps {min(losses)}-{max(losses)}" if losses else "no steps"
        say(f"  Train attempt {number}: {attempt.status}" + (f", resumed from step {resumed}" if resumed else "")
            + f", {span}" + (f": {attempt.failure_reason}" if attempt.failure_reason else ""))
    losses = result.losses()
    if losses:
        say("loss: " + " ".join(f"{step}:{value:.4f}" for step, value in losses.items()))
    validation = result.validation_losses()
    if validation:
        say("validation loss (held-out windows): " + " ".join(f"{step}:{value:.4f}" for step, value in validation.items()))
    elif result.scaled.config.validation.source == "none":
        say("validation loss: none (the recipe holds out no data: data.validation_fraction 0 and no validation_uri)")
    if result.exported:
        exported = result.exported
        say(f"exported model: {exported['dir']}")
        say(f"  files: {', '.join(exported['files'])}")
        for name, info in list(exported["tensors"].items())[:4]:
            say(f"  {name}: {info['dtype']} {tuple(info['shape'])} in {info['file']}")
        if len(exported["tensors"]) > 4:
            say(f"  ... {len(exported['tensors'])} tensors")
    if result.interrupt:
        say(f"interrupt {result.interrupt}: " + (result.interrupted or "it never happened (the run ended first): NOT rehearsed"))
    for number, run in enumerate(result.executions, start=1):
        say(f"execution {number}: {run.status}" + (f" at {run.failed_step}: {run.failure}" if run.failure else ""))
