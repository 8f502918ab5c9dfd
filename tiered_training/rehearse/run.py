"""``tiered-training rehearse``: the recipe's own pipeline, run on this machine as SageMaker runs it on N hosts."""

from __future__ import annotations

import atexit
import copy
import functools
import json
import os
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tiered_training.aws import probe_runs
from tiered_training.contract.runconfig import MAX_PROBE_CANDIDATES, RunConfig
from tiered_training.pipeline.definition import TRAIN_CHAINS, PipelineResources, build_definition, iter_steps
from tiered_training.pipeline.validation import validate_definition
from tiered_training.rehearse.errors import (  # noqa: F401 (the CLI imports them from here)
    MissingExtra,
    RehearsalError,
    Stopped,
)
from tiered_training.rehearse.hosts import Interrupt, JobRunner
from tiered_training.rehearse.interpreter import Execution, Interpreter, PipelineError, TraceEvent
from tiered_training.rehearse.s3 import LocalS3, checkpoints_in, list_keys, split_uri
from tiered_training.rehearse.scale import Scaled, scale
from tiered_training.text import clip, escape

STORE = "s3://rehearsal-checkpoint-store"
ROLE = "arn:aws:iam::000000000000:role/rehearsal-execution"
IMAGE = "tiered-training:rehearsal (training/launcher.py of this checkout)"


# What a rehearsal imports beyond the base install, and the extra that provides it.
NEEDS = {"torch": "train", "transformers": "train", "moto": "rehearse", "boto3": "rehearse"}


def check_installed() -> None:
    import importlib.util

    missing = sorted({extra for module, extra in NEEDS.items() if importlib.util.find_spec(module) is None})
    if missing:
        modules = ", ".join(m for m, e in NEEDS.items() if e in missing and importlib.util.find_spec(m) is None)
        checkout = Path(__file__).resolve().parents[2]
        make = (
            f"make rehearse-deps in {checkout} (make test installs them too), or "
            if "rehearse-deps:" in _read(checkout / "Makefile")
            else ""
        )
        raise MissingExtra(
            f"rehearse runs the trainer on a local S3 and needs {modules}, which the "
            f"{' and '.join(repr(e) for e in missing)} extra{'s install' if len(missing) > 1 else ' installs'}: "
            f"{make}pip install 'tiered-training[{','.join(missing)}]'"
        )


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


@dataclass
class Options:
    recipe: Path
    hosts: int = 2
    workers: int = 2
    steps: int | None = None  # enough for the interrupt and a checkpoint, at least MIN_STEPS
    params: dict[str, str] = field(default_factory=dict)
    interrupt: str | None = None
    workdir: Path | None = None  # default: ./rehearse-out/<name>-<UTC time>; kept unless clean
    clean: bool = False  # remove what the rehearsal wrote in the work directory when it ends
    # Later executions on the same S3: parameters (a restart), or Then entries.
    then: dict[str, str] | list[Then] | None = None
    overrides: tuple[str, ...] = ()  # --set key.path=value on the recipe
    slow_candidate: str | None = None  # N[:SECONDS]: the Probe slows candidate N's steps (SlowCandidate)
    slow_host: str | None = None  # N[:FACTOR]: host algo-N's forward/backward at FACTOR of its speed (SlowHost)
    # The Probe's health check compares this machine's figures with these (TIERED_TRAINING_HEALTH_EXPECT,
    # training/health_check.py), e.g. "matmul_tflops=1000000" to fail it; none: CPU figures are not compared.
    health_expect: str | None = None
    # Variables added to the named steps' jobs (a training chain's name stands for its segments), after the
    # rehearsal's own: fault hooks of tests, e.g. TIERED_TRAINING_NVML_STANDIN.
    environment: dict[str, dict[str, str]] = field(default_factory=dict)
    # --data: the user's raw examples (a file or folder) instead of the built-in ones, prepared with the
    # recipe's tokenizer (model.hf_id from the local Hugging Face cache) or --tokenizer DIR.
    data: Path | None = None
    tokenizer: Path | None = None


SLOW_VARIABLE = "TIERED_TRAINING_SLOW_CANDIDATE"  # the container's rehearsal-only slow-down (docs/container.md)
DEFAULT_SLOW_SECONDS = 0.5  # per step: many times a scaled-down step on a CPU


@dataclass(frozen=True)
class SlowCandidate:
    """``--slow-candidate N[:SECONDS]``: the Probe job's candidate N takes SECONDS longer a step, so the probe's
    choice by measurement can be rehearsed (set in the Probe job's environment only)."""

    number: int
    seconds: float = DEFAULT_SLOW_SECONDS

    @classmethod
    def parse(cls, text: str) -> SlowCandidate:
        number, sep, seconds = text.partition(":")
        bad = f"--slow-candidate {clip(repr(text), 60)}: expected N or N:SECONDS (a candidate number, seconds > 0)"
        if not number.isdigit() or len(number) > 2:
            raise ValueError(bad)
        try:
            value = float(seconds) if sep else DEFAULT_SLOW_SECONDS
        except ValueError:
            raise ValueError(bad) from None
        if not 1 <= int(number) <= MAX_PROBE_CANDIDATES or not 0 < value <= 60:
            raise ValueError(
                f"--slow-candidate {clip(repr(text), 60)}: a candidate from 1 to {MAX_PROBE_CANDIDATES}, "
                "and from more than 0 to 60 seconds"
            )
        return cls(int(number), value)

    @property
    def value(self) -> str:
        return f"{self.number}:{self.seconds:g}"


HEALTH_EXPECT_VARIABLE = "TIERED_TRAINING_HEALTH_EXPECT"  # training.health_check reads it (rehearsals only)
SLOW_HOST_VARIABLE = "TIERED_TRAINING_SLOW_HOST"  # training.components.straggler reads it (rehearsals only)
DEFAULT_SLOW_FACTOR = 0.5
# The straggler scores are gathered every 5 steps (training.components.straggler.GATHER_EVERY_STEPS), the
# process's first step left out, and published at the last step at the latest: a slowed host is named within
# this many steps of a training job.
SLOW_HOST_NAMED_WITHIN_STEPS = 10


@dataclass(frozen=True)
class SlowHost:
    """``--slow-host N[:FACTOR]``: simulated host algo-N's forward and backward run at FACTOR of their speed in the
    training jobs (not the Probe), so that the straggler score, its metrics and the alarm can be rehearsed."""

    number: int
    factor: float = DEFAULT_SLOW_FACTOR

    @classmethod
    def parse(cls, text: str, hosts: int) -> SlowHost:
        number, sep, factor = text.partition(":")
        bad = (
            f"--slow-host {clip(repr(text), 60)}: expected N or N:FACTOR (a simulated host from 1 to {hosts}, "
            "its speed as a fraction of the others', more than 0 and less than 1)"
        )
        if not number.isdigit() or len(number) > 2:
            raise ValueError(bad)
        try:
            value = float(factor) if sep else DEFAULT_SLOW_FACTOR
        except ValueError:
            raise ValueError(bad) from None
        if not 1 <= int(number) <= hosts or not 0 < value < 1:
            raise ValueError(bad)
        return cls(int(number), value)

    @property
    def host(self) -> str:
        return f"algo-{self.number}"

    @property
    def value(self) -> str:
        return f"{self.host}:{self.factor:g}"


@dataclass
class Then:
    """A later execution of the pipeline on the same local S3 and store.

    ``params``: its parameters, over the first execution's; ``recipe``: the pipeline redeployed from
    another recipe file (the same name: the same store prefix); ``before``: called with the S3 client
    and the rehearsal so far before it starts (to damage a prefix, say); ``resume``: the execution
    resumes the first execution's run by name; ``environment``: variables added to its training jobs' Environment
    (the lease's timings, a rehearsal's fault); ``start_when``: with ``alongside``, it starts once this returns True
    (asked every second with the S3 client)."""

    params: dict[str, str] = field(default_factory=dict)
    recipe: Path | None = None
    before: Callable[[Any, Rehearsal], None] | None = None
    resume: bool = False  # resume the first execution's run (RunId = its execution id)
    alongside: bool = False  # start at the same moment as the execution before it, not after it ends
    environment: dict[str, str] = field(default_factory=dict)
    start_when: Callable[[Any], bool] | None = None


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
    then: Execution | None = None  # the first later execution
    interrupt: str | None = None  # what was asked for
    interrupted: str | None = None  # what happened
    later: list[Execution] = field(default_factory=list)  # every later execution, in order
    store: str = STORE  # the checkpoint store; a run's checkpoints are under run_prefix(run id)
    recipe_name: str = ""
    candidates: tuple[Any, ...] = ()  # the plan's probe candidates (planning.plan.Candidate), predicted figures
    memory_limit: float = 1.0  # the probe's peak reserved memory limit (a fraction of the worker's memory)
    slowed: SlowCandidate | None = None  # --slow-candidate
    writers_at_end: dict[str, str] = field(default_factory=dict)  # step-N at the end: the job its manifest names
    packages: list[dict[str, Any]] = field(default_factory=list)  # the model packages registered (model_packages)

    @property
    def executions(self) -> list[Execution]:
        return [self.execution] + self.later

    def run_prefix(self, run_id: str) -> str:
        return f"{self.store}/{self.recipe_name}/checkpoints/runs/{run_id}/"

    @property
    def ok(self) -> bool:
        """Every execution succeeded, and the interrupt asked for happened."""
        return all(e.status == "Succeeded" for e in self.executions) and (
            self.interrupt is None or bool(self.interrupted)
        )

    def train_attempts(self, execution: Execution | None = None) -> list:
        """Every attempt of the execution's training jobs (all segments), in the order they ran."""
        return train_attempts(execution or self.execution)

    def losses(self, key: str = "losses", execution: Execution | None = None) -> dict[int, float]:
        """The full run's loss per step: a restarted attempt's steps replace the ones it redid."""
        merged: dict[int, float] = {}
        for attempt in self.train_attempts(execution):
            merged.update(attempt.detail.get(key, {}))
        return dict(sorted(merged.items()))

    def exported_of(self, execution: Execution) -> dict[str, Any]:
        """The model the execution's last training job exported (empty when none completed)."""
        attempts = self.train_attempts(execution)
        if attempts and attempts[-1].status == "Completed" and Path(attempts[-1].detail["model_dir"]).is_dir():
            return describe_export(Path(attempts[-1].detail["model_dir"]))
        return {}

    def candidate_record(self, execution: Execution) -> dict[str, Any]:
        """Why each training job ran the candidate it ran: the probe's measurements of every candidate beside the
        plan's predictions (``probe``, None without a probe), then each Train, TrainWithoutProbe or Resume
        segment's candidate and why (``train``)."""
        return candidate_record(execution, self.candidates, self.memory_limit, self.slowed)

    def validation_losses(self) -> dict[int, float]:
        """The validation loss after the steps that had a validation pass (the last attempt's where redone)."""
        return self.losses("validation_losses")

    def to_dict(self) -> dict[str, Any]:
        """For ``--format json``: each execution's status and steps, the losses, checkpoints and export."""

        def execution(e: Execution) -> dict[str, Any]:
            return {
                "status": e.status,
                "failure": e.failure or None,
                "failed_step": e.failed_step,
                "metrics": e.metrics,
                "jobs": {
                    step: [{"status": a.status, "failure_reason": a.failure_reason or None} for a in attempts]
                    for step, attempts in e.jobs.items()
                },
                "candidates": self.candidate_record(e),
                "stragglers": {name: s.to_dict() for name, s in stragglers(e)},
            }

        return {
            "ok": self.ok,
            "executions": [execution(e) for e in self.executions],
            "interrupt": self.interrupt,
            "interrupted": self.interrupted,
            "losses": {str(k): v for k, v in self.losses().items()},
            "validation_losses": {str(k): v for k, v in self.validation_losses().items()},
            "checkpoint_uri": self.checkpoint_uri,
            "checkpoints_at_end": self.checkpoints_at_end,
            "writers_at_end": self.writers_at_end,
            "keep_last": self.keep_last,
            "uploads_by_host": self.uploads_by_host,
            "exported": self.exported,
            "packages": self.packages,
            "workdir": str(self.workdir),
            "scaled": [
                {"field": c.field, "plan": c.plan, "rehearsal": c.rehearsal, "why": c.why} for c in self.scaled.changes
            ],
        }


def model_packages(s3: LocalS3, executions: list[Execution]) -> list[dict[str, Any]]:
    """Each package the executions registered, as the local registry describes it, with the evaluation it
    points at read from S3 (its checksum checked)."""
    from tiered_training.contract.evaluation import EVALUATION_FILE, verified

    sagemaker, client = s3.client("sagemaker"), s3.client()
    found = []
    for execution in executions:
        for step, package in execution.packages.items():
            if not package.get("arn"):
                continue
            described = sagemaker.describe_model_package(ModelPackageName=package["arn"])
            entry: dict[str, Any] = {
                "step": step,
                "arn": package["arn"],
                "group": described.get("ModelPackageGroupName"),
                "version": described.get("ModelPackageVersion"),
                "approval": described.get("ModelApprovalStatus"),
                "metadata": described.get("CustomerMetadataProperties", {}),
            }
            uri = (((described.get("ModelMetrics") or {}).get("ModelQuality") or {}).get("Statistics") or {}).get(
                "S3Uri", ""
            )
            entry["evaluation_uri"] = uri
            try:
                bucket, key = split_uri(uri)
                entry["evaluation"] = verified(client.get_object(Bucket=bucket, Key=key)["Body"].read(), uri)
            except Exception as error:  # shown in the summary, by URI
                entry["evaluation"] = None
                entry["evaluation_problem"] = f"{uri or EVALUATION_FILE}: {error}"
            found.append(entry)
    return found


def probe_candidates(
    execution: Execution, candidates: tuple[Any, ...], memory_limit: float, slowed: SlowCandidate | None
) -> dict[str, Any] | None:
    """The Probe's measurement of each candidate (its FinalMetricDataList) beside the plan's prediction, and the
    one it chose; None when no Probe ran."""
    found = execution.metrics.get("Probe")
    if found is None:
        return None
    # The same reading of the Probe's FinalMetricDataList as `status` makes of a real execution's.
    measured = probe_runs.parse("Probe", [{"MetricName": name, "Value": value} for name, value in found.items()])
    chosen = measured.best_candidate or 0
    rows = []
    for row in probe_runs.compare(candidates, measured):
        n, tokens = row.number, row.measured_tokens_per_second_per_gpu
        reserved = row.measured_peak_reserved_fraction
        if tokens is None:
            status = "no result (its launch failed)"
        elif tokens == 0 and (reserved or 0) >= 1:
            status = "out of memory"
        elif n == chosen:
            status = "chosen"
        elif reserved is not None and reserved > memory_limit:
            status = f"over the memory limit ({reserved:.2f} > {memory_limit:g})"
        else:
            status = "slower"
        rows.append(
            {
                "number": n,
                "configuration": row.configuration,
                "predicted_tokens_per_second_per_gpu": row.predicted_tokens_per_second_per_gpu,
                "predicted_memory_fraction": row.predicted_memory_fraction,
                "measured_tokens_per_second": tokens,
                "peak_allocated_fraction": row.measured_peak_allocated_fraction,
                "peak_reserved_fraction": reserved,
                "slowed": slowed is not None and slowed.number == n,
                "status": status,
            }
        )
    return {"chosen": chosen, "memory_limit": memory_limit, "candidates": rows}


def candidate_record(
    execution: Execution, candidates: tuple[Any, ...], memory_limit: float, slowed: SlowCandidate | None
) -> dict[str, Any]:
    """What :meth:`Rehearsal.candidate_record` returns."""
    probe = probe_candidates(execution, candidates, memory_limit, slowed)
    train = []
    for name, attempt in attempt_names(execution):
        number = attempt.detail.get("run_candidate")
        step = name.split(" attempt ")[0]
        train.append(
            {
                "job": name,
                "candidate": number,
                "why": _why_candidate(step, number, probe, slowed),
                "said": attempt.detail.get("candidate_lines", []),
            }
        )
    return {"probe": probe, "train": train}


def _why_candidate(step: str, number: int | None, probe: dict[str, Any] | None, slowed: SlowCandidate | None) -> str:
    chain = step.split("-")[0]
    if not number:
        if chain == "Resume":
            return "run.candidate 0: the candidate the run's checkpoints record (a resume measures nothing)"
        return "run.candidate 0, no probe (SkipProbe=true): the plan's own configuration, candidate 1"
    if probe is None:
        return f"run.candidate {number}"
    rows = {row["number"]: row for row in probe["candidates"]}
    mine = rows.get(number, {})
    others = [
        f"{row['measured_tokens_per_second']:,.0f} for candidate {n}"
        + (" (slowed on purpose)" if row["slowed"] else "")
        + (f" ({row['status']})" if row["status"] not in ("slower", "chosen") else "")
        for n, row in rows.items()
        if n != number and row["measured_tokens_per_second"] is not None
    ]
    measured = mine.get("measured_tokens_per_second")
    text = (
        f"the probe's choice: the fastest measured under the memory limit {probe['memory_limit']:g}"
        + (f", {measured:,.0f} tokens/s per worker" if measured is not None else "")
        + (f" against {', '.join(others)}" if others else "")
        + (
            f"; the plan predicted {mine['predicted_tokens_per_second_per_gpu']:,.0f} tokens/s per GPU for it"
            if mine
            else ""
        )
    )
    if slowed is not None and number != 1 and slowed.number == 1:
        text += " (the plan's first choice, candidate 1, was slowed on purpose by --slow-candidate)"
    return text


MIN_STEPS = 12


def train_attempts(execution: Execution) -> list:
    """The attempts of an execution's Train, TrainWithoutProbe or Resume segments, in the order they ran."""
    chains = tuple(TRAIN_CHAINS)
    return [
        attempt for step, attempts in execution.jobs.items() if step.split("-")[0] in chains for attempt in attempts
    ]


def attempt_names(execution: Execution, train_only: bool = True) -> list[tuple[str, Any]]:
    """``("<step> attempt N", attempt)`` for the execution's training jobs' attempts (the Train, TrainWithoutProbe and
    Resume segments only, unless ``train_only`` is false), in the order they ran: the names the trace uses."""
    chains = tuple(TRAIN_CHAINS)
    return [
        (f"{step} attempt {number}", attempt)
        for step, attempts in execution.jobs.items()
        if not train_only or step.split("-")[0] in chains
        for number, attempt in enumerate(attempts, start=1)
    ]


def steps_for(interrupt: Interrupt | None, interval: int) -> int:
    """Steps enough for a checkpoint every ``interval`` steps to be saved, and for the interrupt to happen."""
    if interrupt is None:
        return max(MIN_STEPS, interval + 1)
    if interrupt.kind == "sigterm" and interrupt.step is not None:  # a sigterm always has its step
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
    raise RehearsalError(
        f"rehearse runs the training container's code, and neither {library.parent / 'training'} "
        f"nor {packaged} holds it; reinstall tiered-training"
    )


# Stated bounds: each simulated host is a torchrun of `workers` CPU processes on this machine.
MAX_HOSTS = 8
MAX_WORKERS = 8
MAX_REHEARSAL_STEPS = 1000


def parse_params(pairs: list[str], option: str = "--param") -> dict[str, str]:
    """``Name=Value`` pairs; every name a parameter of the pipeline, every value one it accepts."""
    from tiered_training.pipeline.definition import P_INSTANCE_COUNT, P_MAX_STEPS, P_SKIP_PROBE, PARAMETERS

    params = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise RehearsalError(f"{option} {clip(repr(pair))}: expected Name=Value")
        if name not in PARAMETERS:
            raise RehearsalError(
                f"{option} {clip(repr(pair))}: the pipeline has no parameter {clip(repr(name))}; "
                f"its parameters: {', '.join(PARAMETERS)}"
            )
        bounds = {P_INSTANCE_COUNT: MAX_HOSTS, P_MAX_STEPS: MAX_REHEARSAL_STEPS}
        if name in bounds and not (value.isdigit() and len(value) <= 9 and 1 <= int(value) <= bounds[name]):
            raise RehearsalError(
                f"{option} {clip(repr(pair))}: {name} is a whole number from 1 to {bounds[name]} in a rehearsal"
            )
        if name == P_SKIP_PROBE and value not in ("true", "false"):
            raise RehearsalError(f"{option} {clip(repr(pair))}: {name} is true or false")
        params[name] = value
    return params


def check_options(options: Options) -> Interrupt | None:
    """Refuse, before anything starts, options that cannot make a rehearsal on this machine."""
    problems = []
    if not 1 <= options.hosts <= MAX_HOSTS:
        problems.append(f"--hosts {options.hosts}: 1 to {MAX_HOSTS} simulated hosts")
    if not 1 <= options.workers <= MAX_WORKERS:
        problems.append(f"--workers {options.workers}: 1 to {MAX_WORKERS} CPU workers per host")
    if options.steps is not None and not 2 <= options.steps <= MAX_REHEARSAL_STEPS:
        problems.append(f"--steps {options.steps}: 2 to {MAX_REHEARSAL_STEPS}")
    interrupt = None
    if options.interrupt is not None:
        try:
            interrupt = Interrupt.parse(options.interrupt)
        except ValueError as error:
            problems.append(clip(str(error), 200))
        else:
            last = options.steps if options.steps is not None else MAX_REHEARSAL_STEPS
            if interrupt.step is not None and interrupt.step >= last:
                within = (
                    f"the run's {options.steps} steps"
                    if options.steps is not None
                    else f"a rehearsal's {MAX_REHEARSAL_STEPS} steps"
                )
                problems.append(
                    f"--interrupt {clip(options.interrupt, 60)}: step {clip(str(interrupt.step), 30)} is not within "
                    f"{within}"
                )
    if options.slow_candidate is not None:
        try:
            SlowCandidate.parse(options.slow_candidate)
        except ValueError as error:
            problems.append(str(error))
    if options.slow_host is not None:
        try:
            SlowHost.parse(options.slow_host, max(1, options.hosts))
        except ValueError as error:
            problems.append(str(error))
    if options.workdir is not None:
        problem = _workdir_problem(Path(options.workdir))
        if problem:
            problems.append(f"--workdir {escape(clip(str(options.workdir), 200))}: {problem}")
    if problems:
        raise RehearsalError("; ".join(problems))
    return interrupt


def _workdir_problem(workdir: Path) -> str | None:
    try:
        if workdir.exists() or workdir.is_symlink():
            if not workdir.is_dir():
                return "exists and is not a directory"
        else:
            workdir.mkdir(parents=True)
        if not os.access(workdir, os.W_OK | os.X_OK):
            return "not writable"
    except OSError as error:
        return f"cannot be made a directory: {error.strerror or error}"
    return None


def rehearse(options: Options, out: IO[str] | None = None) -> Rehearsal:
    out = out or sys.stdout

    trace: IO[str] | None = None  # the work directory's copy of every line, once it exists
    trace_lock = threading.RLock()  # the hosts' reader threads say too; reentrant: a signal may stop a say()

    def say(text: str = "") -> None:
        out.write(text + "\n")
        out.flush()
        with trace_lock:
            if trace is not None:
                trace.write(text + "\n")
                trace.flush()

    from tiered_training.planning.plan import Plan
    from tiered_training.planning.planner import plan_file

    existed = options.workdir is not None and Path(options.workdir).is_dir()  # --clean keeps such a directory
    interrupt = check_options(options)
    check_installed()
    parse_params([f"{k}={v}" for k, v in options.params.items()])
    if options.then is not None:
        for then in [Then(dict(options.then))] if isinstance(options.then, dict) else options.then:
            parse_params([f"{k}={v}" for k, v in then.params.items()], "--restart-with")
    plan = plan_file(options.recipe, options.overrides)
    if not plan.ok:
        from tiered_training.planning.plan import PlanError

        raise PlanError(plan)
    assert plan.estimates is not None
    slowed = SlowCandidate.parse(options.slow_candidate) if options.slow_candidate is not None else None
    if slowed is not None and slowed.number > len(plan.candidates):
        raise RehearsalError(
            f"--slow-candidate {options.slow_candidate}: the plan's probe measures {len(plan.candidates)} "
            f"candidate(s) (tuning.probe_candidates), 1 to {len(plan.candidates)}"
        )
    skipped = options.params.get("SkipProbe", "false" if plan.recipe.probe.enabled else "true") == "true"
    if slowed is not None and skipped:
        raise RehearsalError(
            f"--slow-candidate {options.slow_candidate} slows a candidate of the Probe, and this execution runs no "
            "probe (SkipProbe=true, or probe.enabled false in the recipe)"
        )
    user_tokenizer_dir: Path | None = None
    if options.data is not None:
        from tiered_training.rehearse.data import data_files, tokenizer_vocab, user_tokenizer

        if plan.recipe.data.prepare is None or plan.corpus_spec() is not None:
            raise RehearsalError(
                f"--data {options.data}: the recipe has no Prepare step for raw examples (data.prepare, with "
                "task sft); --data rehearses a fine-tuning recipe's own raw examples"
            )
        data_files(options.data)  # a missing or empty path is named before anything starts
        user_tokenizer_dir = user_tokenizer(options.tokenizer, plan.recipe.model.hf_id)
    elif options.tokenizer is not None:
        raise RehearsalError("--tokenizer goes with --data (the tokenizer of your raw examples)")
    data_shape: dict[str, int] = {}
    if user_tokenizer_dir is not None:
        from tiered_training.rehearse.data import DATA_WINDOW

        data_shape = {"vocab_size": tokenizer_vocab(user_tokenizer_dir), "sequence_length": DATA_WINDOW}
    memory = _memory_bytes() // max(1, options.hosts * options.workers)
    repo = repo_root()
    context_parallel = (repo / "training" / "context_parallel.py").is_file()

    def scaled_for(hp: dict[str, Any]) -> Scaled:
        cfg = RunConfig.from_hyperparameters(hp)
        return scale(
            cfg,
            hosts=options.hosts,
            workers=options.workers,
            plan_step_seconds=plan.estimates.step_time_seconds,
            plan_total_steps=plan.estimates.total_steps,
            memory_per_worker=memory,
            context_parallel=context_parallel,
            **data_shape,
        )

    interval = scaled_for(plan.run_config().to_hyperparameters()).config.checkpoint.interval_steps
    steps = options.steps if options.steps is not None else steps_for(interrupt, interval)
    problem = interrupt.unreachable(steps, interval) if interrupt else None
    if problem:
        raise RehearsalError(f"--interrupt {options.interrupt}: {problem}")
    params = {"InstanceCount": str(options.hosts), "MaxSteps": str(steps), **options.params}
    data_uri = params.get("DataUri", plan.recipe.data.uri)
    if not plan.recipe.data.allows(data_uri):
        raise RehearsalError(
            f"--param DataUri={data_uri}: not under the recipe's data.allowed_uris "
            f"({', '.join(plan.recipe.data.data_prefixes)}); the pipeline's role could not read it"
        )
    resources = PipelineResources(
        role_arn=ROLE,
        image_uri=IMAGE,
        checkpoint_s3_uri=f"{STORE}/{plan.name}/checkpoints/",
        output_s3_uri=f"{STORE}/{plan.name}/output",
    )
    definition = build_definition(plan, resources)
    problems = validate_definition(json.loads(json.dumps(definition)))
    if problems:
        raise RehearsalError("the pipeline definition is invalid: " + "; ".join(problems))
    runs_uri = f"{STORE}/{plan.name}/checkpoints/runs/"
    # A dict of parameters is a restart: the first run resumed by name.
    later = [Then(dict(options.then), resume=True)] if isinstance(options.then, dict) else list(options.then or [])

    preview_hp = dict(plan.run_config().to_hyperparameters(), **{"batch.total_steps": params["MaxSteps"]})
    scaled = scaled_for(preview_hp)
    workdir = Path(options.workdir).resolve() if options.workdir else _default_workdir(plan.name)
    workdir.mkdir(parents=True, exist_ok=True)
    before = {entry.name for entry in workdir.iterdir()}  # what --clean leaves
    trace = open(workdir / TRACE_FILE, "w")
    runner: JobRunner | None = None
    corpus = plan.corpus_spec()  # data.sources: the Prepare step tokenizes raw corpora
    raw = plan.recipe.data.prepare is not None and corpus is None  # the Prepare step packs raw examples
    prepared_length = _scale_prepare(definition, scaled.config.batch.sequence_length)
    corpus_tokens = scaled.config.batch.global_batch_tokens * int(params["MaxSteps"])
    corpus_scaling = _scale_corpus(definition, options.hosts, corpus_tokens)
    say(
        f"rehearsal of {plan.name} ({options.recipe}): its pipeline definition, {options.hosts} simulated host(s) of "
        f"{options.workers} CPU worker(s), S3 on a local moto server"
    )
    say(
        f"work directory: {workdir} (the trace, the summary, each host's /opt/ml tree and log, the exported model; "
        + ("removed at the end: --clean)" if options.clean else "kept)")
    )
    _print_scaling(say, scaled, plan)
    if prepared_length is not None:
        say(
            f"  Prepare --sequence-length: {prepared_length} -> {scaled.config.batch.sequence_length}  "
            "(the shards it packs fit the tiny windows)"
        )
    if corpus_scaling is not None:
        say(f"  Prepare: {corpus_scaling}")
    if interrupt:
        say(f"interrupt: {interrupt.describe()}")
    if slowed is not None:
        say(
            f"slowed: the Probe's candidate {slowed.number} takes {slowed.seconds:g} s longer a step "
            f"({SLOW_VARIABLE}={slowed.value} in the Probe job's environment only)"
        )
    slow_host = SlowHost.parse(options.slow_host, options.hosts) if options.slow_host is not None else None
    if slow_host is not None:
        say(
            f"slowed: {slow_host.host}'s forward/backward runs at {slow_host.factor:g} of its speed in the training "
            f"jobs ({SLOW_HOST_VARIABLE}={slow_host.value}); the straggler score names it within "
            f"{SLOW_HOST_NAMED_WITHIN_STEPS} steps"
        )
    say("")

    previous = _stop_on_signals()
    try:
        with LocalS3() as s3:
            client = s3.client()
            store_bucket, _ = split_uri(STORE)
            s3.ensure_bucket(client, store_bucket, versioned=True)
            bucket, _ = split_uri(data_uri)
            s3.ensure_bucket(client, bucket)
            from tiered_training.rehearse.data import put_raw_chat, put_sft_shards, put_shards

            def put_data(uri: str, seed: int = 0) -> dict:
                if options.data is not None and user_tokenizer_dir is not None:
                    from tiered_training.rehearse.data import put_user_data

                    return {**put_user_data(client, uri, options.data), "tokenizer": str(user_tokenizer_dir)}
                if scaled.config.dpo is not None:  # preference pairs: raw for the Prepare step, or packed
                    from tiered_training.rehearse.data import put_pairs

                    length = None if raw else scaled.config.batch.sequence_length
                    dtype = scaled.config.data.token_dtype
                    return put_pairs(
                        client, uri, workdir=workdir, repo=repo, seed=seed, sequence_length=length, token_dtype=dtype
                    )
                if raw:  # raw examples, which the pipeline's Prepare step packs
                    return put_raw_chat(client, uri, workdir=workdir, repo=repo, seed=seed)
                if scaled.config.sft is not None:  # fine-tuning: packed chat examples with loss masks
                    return put_sft_shards(
                        client,
                        uri,
                        sequence_length=scaled.config.batch.sequence_length,
                        token_dtype=scaled.config.data.token_dtype,
                        loss_on=plan.recipe.data.loss_on,
                        overlong=plan.recipe.data.overlong,
                        workdir=workdir,
                        repo=repo,
                        seed=seed,
                    )
                return put_shards(client, uri, token_dtype=scaled.config.data.token_dtype, seed=seed)

            if corpus is not None:
                from tiered_training.rehearse.data import put_raw_corpus

                for uri in [corpus.tokenizer, *(source.uri for source in corpus.sources)]:
                    s3.ensure_bucket(client, split_uri(uri)[0])
                put = put_raw_corpus(client, corpus.sources, corpus.tokenizer, workdir=workdir, repo=repo)
                for source in corpus.sources:
                    say(
                        f"data: {put['documents'][source.name]} raw documents of source {source.name} "
                        f"({source.format}, field {source.field}) at {source.uri} (local S3)"
                    )
                say(f"tokenizer: the tiny word-level tokenizer at {corpus.tokenizer} (local S3); Prepare tokenizes")
                manifest = {"tokenizer": put["tokenizer"]}
            else:
                manifest = put_data(data_uri)
            if options.data is not None:
                say(
                    f"data: your raw examples, {manifest['files']} file(s) of {manifest['bytes']:,} bytes from "
                    f"{options.data}, at {data_uri} (local S3); the Prepare step packs them with the tokenizer and "
                    f"chat template of {user_tokenizer_dir}"
                )
            elif corpus is None and scaled.config.dpo is not None:
                say(
                    f"data: {manifest.get('pairs', 0):,} preference pairs (prompt, chosen, rejected conversations) at "
                    f"{data_uri} (local S3)" + ("; the Prepare step packs them" if raw else ", packed")
                )
            elif corpus is None and raw:
                say(
                    f"data: {manifest['examples']:,} raw tool-calling chat examples (JSON Lines, messages with tools) "
                    f"at {data_uri} (local S3); the Prepare step packs them"
                )
            elif corpus is None and scaled.config.sft is not None:
                say(
                    f"data: {manifest['examples']:,} chat examples packed into "
                    f"{sum(s['sequences'] for s in manifest['shards']):,} sequences of "
                    f"{manifest['sequence_length'] + 1} "
                    f"{manifest['token_dtype']} tokens (loss on {manifest['loss_on']}, overlong "
                    f"{manifest['overlong']}: "
                    f"{manifest['dropped']} dropped, {manifest['truncated']} truncated) at {data_uri} (local S3)"
                )
            elif corpus is None:
                say(
                    f"data: {manifest['tokens']:,} {manifest['dtype']} tokens in {len(manifest['shards'])} shards at "
                    f"{data_uri} (local S3)"
                )
            data_uris = [data_uri]
            init_uri = model_channel_uri(definition)
            if init_uri:
                tokenizer = Path(manifest["tokenizer"]) if raw or scaled.config.dpo is not None else None
                files = put_init_checkpoint(s3, client, init_uri, scaled.config, workdir, repo, tokenizer)
                say(
                    f"init checkpoint: a random Hugging Face checkpoint of the rehearsal's shape ({files} files) at "
                    f"{init_uri} (local S3), in the model channel"
                )
            runner = JobRunner(
                s3,
                workdir,
                workers=options.workers,
                repo=repo,
                hyperparameters=lambda hp: scaled_for(hp).config.to_hyperparameters(),
                interrupt=interrupt,
                say=say,
                environment=_environment(slowed, slow_host, options.health_expect, options.environment),
            )
            limits = {
                "probe:tokens_per_second": (0.0, "is tokens/s per GPU on the plan's hardware, which a CPU cannot show")
            }
            interpreter = Interpreter(definition, runner, report=lambda event: _print_event(say, event), limits=limits)
            say("pipeline trace:")
            result = Rehearsal(
                interpreter.execution,
                scaled,
                "",
                scaled.config.checkpoint.keep_last,
                0,
                [],
                {},
                {},
                workdir,
                None,
                options.interrupt,
                None,
                [],
                STORE,
                plan.name,
                plan.candidates,
                plan.probe_memory_limit,
                slowed,
            )
            try:
                execution = interpreter.run(params)
                result.checkpoint_uri = result.run_prefix(execution.execution_id)
                runner.interrupt = None
                ready: list[tuple[dict[str, Any], dict[str, str], Callable[[], bool] | None]] = []  # start together

                def start_ready() -> None:
                    result.later.extend(_run_together(ready, runner, say, limits))
                    ready.clear()

                for number, step in enumerate(later, start=2):
                    if not step.alongside:
                        start_ready()
                    if step.before is not None:
                        step.before(client, result)
                    later_plan, later_definition = plan, definition
                    if step.recipe is not None:
                        found = plan_file(step.recipe)
                        # A FailedPlan is never ok.
                        if not isinstance(found, Plan) or not found.ok or found.name != plan.name:
                            raise RehearsalError(
                                f"{step.recipe}: a later execution needs a valid recipe named {plan.name}"
                            )
                        later_plan = found
                        later_definition = build_definition(later_plan, resources)
                        _scale_prepare(later_definition, scaled.config.batch.sequence_length)
                        _scale_corpus(later_definition, options.hosts, corpus_tokens)
                    values = {**params, **({"RunId": execution.execution_id} if step.resume else {}), **step.params}
                    uri = values.get("DataUri", plan.recipe.data.uri)
                    if uri not in data_uris:
                        if not plan.recipe.data.allows(uri):
                            raise RehearsalError(f"DataUri={uri}: not under the recipe's data.allowed_uris")
                        s3.ensure_bucket(client, split_uri(uri)[0])
                        put_data(uri, seed=len(data_uris))
                        say(
                            f"data: other {'examples' if scaled.config.sft is not None else 'tokens'} at {uri} "
                            "(local S3)"
                        )
                        data_uris.append(uri)
                    say("")
                    say(
                        f"execution {number}, on the same store: "
                        + (", ".join(f"{k}={v}" for k, v in step.params.items()) or "defaults")
                        + (f"; the pipeline redeployed from {step.recipe}" if step.recipe else "")
                        + (f"; at the same time as execution {number - 1}" if step.alongside else "")
                    )
                    if step.environment:
                        later_definition = _with_environment(later_definition, step.environment)
                    waits: Callable[[], bool] | None = (
                        functools.partial(step.start_when, client) if step.start_when else None
                    )
                    ready.append((later_definition, values, waits))
                start_ready()
                result.then = result.later[0] if result.later else None
            except PipelineError as error:
                raise RehearsalError(f"the pipeline cannot run: {error}") from None
            result.execution = execution
            checkpoint_uri = result.checkpoint_uri
            end_keys = list_keys(client, checkpoint_uri) if _exists(client, checkpoint_uri) else {}
            uploads: dict[str, int] = {}
            for attempt in [a for attempts in execution.jobs.values() for a in attempts]:
                for host, keys in attempt.detail.get("uploads", {}).items():
                    uploads[host] = uploads.get(host, 0) + len(keys)
            result.max_checkpoints = runner.max_checkpoints
            result.checkpoints_at_end = sorted(checkpoints_in(end_keys), key=lambda s: int(s.split("-")[1]))
            result.writers_at_end = _writers(client, checkpoint_uri, result.checkpoints_at_end)
            result.uploads_by_host = uploads
            result.interrupted = runner.interrupted
            result.exported = result.exported_of(execution)
            result.packages = model_packages(s3, result.executions)
            say(f"runs under {runs_uri}: " + ", ".join(e.execution_id for e in result.executions))
            _print_summary(say, result, clean=options.clean)
            _write_json(workdir / SUMMARY_FILE, result.to_dict())
            return result
    except Stopped as stopped:
        if runner is not None:
            runner.stop()  # the hosts of executions running in other threads; a job in this thread stopped its own
        kept = "removed (--clean)" if options.clean else f"kept: {workdir} (the trace and the hosts' logs)"
        say(f"stopped by {stopped.name}: every host is stopped; the work directory is {kept}")
        raise Stopped(stopped.signum, f"{stopped.name}; the work directory is {kept}") from None
    finally:
        with trace_lock:
            trace.close()
            trace = None
        if options.clean:
            _remove_new(workdir, before, keep_dir=existed)
        _restore_signals(previous)


TRACE_FILE = "trace.txt"  # every line the rehearsal printed
SUMMARY_FILE = "summary.json"  # what --format json prints


def _default_workdir(name: str) -> Path:
    """``./rehearse-out/<name>-<UTC time>``, made here (a second rehearsal in the same second gets ``-2``)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    parent = Path("rehearse-out").resolve()
    for number in range(1, 1000):
        path = parent / (f"{name}-{stamp}" + (f"-{number}" if number > 1 else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
        except OSError as error:
            raise RehearsalError(
                f"cannot make the work directory {escape(str(path))}: {error.strerror or error}; pass --workdir DIR"
            ) from None
    raise RehearsalError(f"{parent} holds 999 work directories of {name} at {stamp}; pass --workdir DIR")


def _remove_new(workdir: Path, before: set[str], keep_dir: bool) -> None:
    """--clean: remove what the rehearsal wrote in the work directory, and the directory unless it existed before."""
    if not keep_dir:
        shutil.rmtree(workdir, ignore_errors=True)
        return
    for entry in workdir.iterdir():
        if entry.name not in before:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Written whole or not at all (a temporary file renamed)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    partial.replace(path)


def _stop_on_signals() -> dict[int, Any] | None:
    """SIGTERM and SIGINT raise :class:`Stopped` in this (the main) thread, once; later ones are ignored while
    the rehearsal stops its hosts. The previous handlers, or None off the main thread (nothing installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if not fired:
            fired.append(signum)
            raise Stopped(signum)

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}


def _restore_signals(previous: dict[int, Any] | None) -> None:
    for sig, handler in (previous or {}).items():
        signal.signal(sig, handler)


def _run_later(definition: dict[str, Any], runner: JobRunner, say, limits, values: dict[str, str]) -> Execution:
    return Interpreter(definition, runner, report=lambda event: _print_event(say, event), limits=limits).run(values)


def _run_together(
    ready: list[tuple[dict[str, Any], dict[str, str], Callable[[], bool] | None]], runner: JobRunner, say, limits
) -> list[Execution]:
    """Run the executions at once (one thread each), as two starts a second apart would, each once its gate (if any)
    opens; in the order given."""
    if len(ready) <= 1:
        return [_run_later(definition, runner, say, limits, values) for definition, values, _ in ready]
    found: list[Execution | BaseException | None] = [None] * len(ready)
    ungated = [index for index, (_, _, gate) in enumerate(ready) if gate is None]

    def run(index: int, definition: dict[str, Any], values: dict[str, str], gate) -> None:
        try:
            waited = after = 0
            while gate is not None and not gate():
                # The others' last writes may open it (a lease going stale): asked for a while after they ended.
                if bool(ungated) and all(found[other] is not None for other in ungated):
                    after += 1
                if runner.stopping or waited >= GATE_SECONDS or after > GATE_AFTER_SECONDS:
                    why = (
                        f"{GATE_AFTER_SECONDS} s after the executions beside it ended"
                        if after > GATE_AFTER_SECONDS
                        else f"within {GATE_SECONDS} s"
                    )
                    raise RehearsalError(
                        f"execution {index + 1} of these did not start: its start condition was not met {why}"
                    )
                time.sleep(1)
                waited += 1
            found[index] = _run_later(definition, runner, say, limits, values)
        except BaseException as error:  # noqa: BLE001 - raised below, in this thread
            found[index] = error

    threads = [threading.Thread(target=run, args=(i, *entry), daemon=True) for i, entry in enumerate(ready)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for outcome in found:
        if isinstance(outcome, BaseException):
            raise outcome
    return [outcome for outcome in found if isinstance(outcome, Execution)]


def _writers(client: Any, prefix: str, steps: list[str]) -> dict[str, str]:
    """``{step-N: the training job its COMMITTED manifest names}`` (``not committed`` without a marker)."""
    from botocore.exceptions import ClientError

    bucket, key = split_uri(prefix)
    found: dict[str, str] = {}
    for step in steps:
        try:
            body = client.get_object(Bucket=bucket, Key=f"{key.rstrip('/')}/{step}/COMMITTED")["Body"].read()
            found[step] = str(json.loads(body).get("writer", {}).get("job") or "unnamed")
        except (ValueError, AttributeError):
            found[step] = "unreadable manifest"
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            found[step] = "not committed" if code in ("NoSuchKey", "404") else f"unread ({code})"
    return found


GATE_SECONDS = 600  # the longest a Then's start_when is waited for
GATE_AFTER_SECONDS = 60  # and the longest once the executions beside it have ended


def _with_environment(definition: dict[str, Any], environment: dict[str, str]) -> dict[str, Any]:
    """A copy of the pipeline definition whose training steps' Environment also holds ``environment``."""
    copied = copy.deepcopy(definition)
    for step in iter_steps(copied.get("Steps", [])):
        if step.get("Type") == "Training":
            step["Arguments"].setdefault("Environment", {}).update(environment)
    return copied


_init_checkpoints: dict[tuple[str, int, str], Path] = {}


def model_channel_uri(definition: dict[str, Any]) -> str | None:
    """The S3 URI of the training steps' ``model`` channel (the recipe's model.init_checkpoint), if any."""
    from tiered_training.pipeline.definition import MODEL_CHANNEL, iter_steps

    for step in iter_steps(definition["Steps"]):
        for channel in (step.get("Arguments") or {}).get("InputDataConfig", []):
            if channel.get("ChannelName") == MODEL_CHANNEL:
                uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
                if isinstance(uri, str):
                    return uri
    return None


def _scale_corpus(definition: dict[str, Any], hosts: int, total_tokens: int) -> str | None:
    """data.sources: the Prepare step on the rehearsal's ``hosts`` instances, its CorpusSpec's budget the scaled
    run's tokens; what changed, or None without such a step."""
    from tiered_training.contract.corpus import CorpusSpec
    from tiered_training.pipeline.definition import CORPUS_PREPARE_MODULE, iter_steps, spec_pieces

    for step in iter_steps(definition["Steps"]):
        arguments = step.get("Arguments", {})
        app = arguments.get("AppSpecification", {})
        if step.get("Type") != "Processing" or CORPUS_PREPARE_MODULE not in app.get("ContainerEntrypoint", []):
            continue
        values = app["ContainerArguments"]
        start = values.index("--spec") + 1
        end = next(i for i in range(start, len(values)) if values[i].startswith("--"))
        spec = CorpusSpec.model_validate_json("".join(values[start:end]))
        text = spec.model_copy(update={"total_tokens": total_tokens}).model_dump_json()
        values[start:end] = spec_pieces(text)
        cluster = arguments["ProcessingResources"]["ClusterConfig"]
        count, cluster["InstanceCount"] = cluster["InstanceCount"], hosts
        return (
            f"{count} -> {hosts} instance(s); the spec's total_tokens {spec.total_tokens:,} -> {total_tokens:,} "
            "(the rehearsal's steps)"
        )
    return None


def _scale_prepare(definition: dict[str, Any], sequence_length: int) -> str | None:
    """The Prepare step's ``--sequence-length`` set to the rehearsal's; the definition's value, or None
    without a Prepare step."""
    from tiered_training.pipeline.definition import iter_steps

    for step in iter_steps(definition["Steps"]):
        if step.get("Type") == "Processing":
            arguments = step["Arguments"]["AppSpecification"]["ContainerArguments"]
            if "--sequence-length" not in arguments:  # data.sources: tokenized, not packed (_scale_corpus)
                return None
            index = arguments.index("--sequence-length") + 1
            old, arguments[index] = arguments[index], str(sequence_length)
            return str(old)
    return None


def put_init_checkpoint(
    s3: LocalS3, client, uri: str, cfg: RunConfig, workdir: Path, repo: Path, tokenizer: Path | None = None
) -> int:
    """A random Hugging Face checkpoint of the rehearsal's model shape under ``uri`` (made by the
    trainer's ``training.models.random_checkpoint``, so that this process imports no torch), with the
    files of ``tokenizer`` beside it when given; its file count."""
    import subprocess

    from tiered_training.rehearse.s3 import upload_dir

    model = cfg.model.model_copy(update={"name": "rehearsal", "init_checkpoint": None}).model_dump_json()
    key = (model, cfg.data.seed, str(tokenizer))
    local = _init_checkpoints.get(key)
    if local is None or not local.is_dir():  # made once per shape in a process (rehearsals of several recipes)
        local = Path(workdir) / ("init-checkpoint" if tokenizer is None else "init-checkpoint-tokenizer")
        model_json = Path(workdir) / "init-checkpoint-model.json"
        model_json.write_text(model)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "training.models.random_checkpoint",
                str(model_json),
                str(local),
                "--seed",
                str(cfg.data.seed + 1),
            ],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RehearsalError(f"could not write the rehearsal's init checkpoint: {tail}")
        for path in sorted(Path(tokenizer).iterdir()) if tokenizer is not None else []:
            weights = path.suffix in (".safetensors", ".bin", ".pt", ".pth") or path.name.endswith(".index.json")
            if path.is_file() and not weights and path.name != "config.json":  # the random checkpoint's stay
                shutil.copy2(path, local / path.name)
        _init_checkpoints[key] = local  # while its workdir lasts
    bucket, object_key = split_uri(uri)
    s3.ensure_bucket(client, bucket)
    if uri.endswith((".tar.gz", ".tgz")):  # an earlier run's export, as a training job uploads it
        import tarfile

        archive = Path(workdir) / "init-export.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for path in sorted(local.iterdir()):
                tar.add(path, arcname=path.name)
        client.upload_file(str(archive), bucket, object_key)
        return len(list(local.iterdir()))
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
    marks = {
        "condition": "?",
        "fail": "x",
        "retry": "~",
        "restart": "~",
        "warm-pool": "*",
        "metrics": "=",
        "job": "-",
        "start": ">",
        "end": "<",
    }
    say(f"  {marks.get(event.kind, '-')} {event.text}")


def _emf_summary(lines: list[str]) -> str:
    if not lines:
        return "none (this host's node GPU metrics need a GPU; the job metrics come from global rank 0)"
    heartbeats = sum('"Heartbeat": true' in line for line in lines)
    events = [line for line in lines if '"Heartbeat": true' not in line]
    text = f"{len(events)} event(s) and {heartbeats} heartbeat(s)"
    return text + (f"; last event: {events[-1][:300]}" if events else "")


def _environment(
    slowed: SlowCandidate | None,
    slow_host: SlowHost | None,
    health_expect: str | None = None,
    extra: dict[str, dict[str, str]] | None = None,
) -> dict[str, dict[str, str]]:
    """The rehearsal's own variables, per step name (a training chain's name stands for its segments)."""
    found: dict[str, dict[str, str]] = {}
    if slowed is not None:
        found["Probe"] = {SLOW_VARIABLE: slowed.value}
    if health_expect is not None:
        found.setdefault("Probe", {})[HEALTH_EXPECT_VARIABLE] = health_expect
    for step, variables in (extra or {}).items():
        found.setdefault(step, {}).update(variables)
    if slow_host is not None:
        for chain in TRAIN_CHAINS:
            found[chain] = {SLOW_HOST_VARIABLE: slow_host.value}
    return found


def stragglers(execution: Execution) -> list[tuple[str, Any]]:
    """``(job attempt, the last straggler its rank 0 published)`` for each training attempt that published one."""
    from tiered_training.aws.runs import Straggler

    found = []
    for name, attempt in attempt_names(execution):
        events = [json.loads(line) for lines in attempt.detail.get("emf", {}).values() for line in lines]
        straggler = Straggler.from_emf(events)
        if straggler is not None:
            found.append((name, straggler))
    return found


def _print_candidates(say, result: Rehearsal, execution: Execution) -> None:
    """The probe's candidates, predicted (the plan, per GPU) against measured (here, per CPU worker), and the
    candidate each training job ran, with why."""
    record = result.candidate_record(execution)
    probe = record["probe"]
    if probe is not None:
        say(
            f"probe candidates (predicted: the plan's tokens/s per GPU; measured: this rehearsal's per CPU worker; "
            f"memory limit {probe['memory_limit']:g} of the reserved peak):"
        )
        for row in probe["candidates"]:
            measured = row["measured_tokens_per_second"]
            reserved = row["peak_reserved_fraction"]
            predicted = row["predicted_tokens_per_second_per_gpu"]
            say(
                f"  {row['number']}: {row['configuration']}: predicted {predicted:,.0f}, measured "
                + (f"{measured:,.1f}" if measured is not None else "none")
                + (f", reserved {reserved:.3f}" if reserved is not None else "")
                + f"; {row['status']}"
                + (" (slowed on purpose: --slow-candidate)" if row["slowed"] else "")
            )
        said = [line for a in execution.jobs.get("Probe", []) for line in a.detail.get("candidate_lines", [])]
        for line in dict.fromkeys(said):
            say(f"  the probe said: {line}")
    for entry in record["train"]:
        trainer = f"; the trainer said: {entry['said'][0]}" if entry["said"] else ""
        say(f"{entry['job']}: candidate {entry['candidate']} ({entry['why']}){trainer}")


def _print_packages(say, packages: list[dict[str, Any]]) -> None:
    """The model packages registered, with their metrics and the evaluation they carry."""
    for package in packages:
        meta = package.get("metadata", {})
        say(
            f"model package: {package['arn']} (group {package['group']}, version {package['version']}, "
            f"{package['approval']}), from {package['step']}"
        )
        say("  " + ", ".join(f"{k}={v}" for k, v in meta.items()))
        report = package.get("evaluation")
        if report is None:
            say(f"  evaluation: unreadable: {package.get('evaluation_problem')}")
            continue
        say(f"  evaluation: {package['evaluation_uri']} (sha256 {report['sha256'][:12]}, checked)")
        held = report.get("held_out") or {}
        say("  held-out: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in held.items()))
        generations = report.get("generations")
        if isinstance(generations, list):
            for item in generations:
                say(f"  prompt {item['prompt']!r} -> {item['answer'][:120]!r}")
        elif generations:
            say(f"  generations: {generations.get('skipped')}")
        if report.get("error"):
            say(f"  evaluation error: {report['error']}")


def _print_summary(say, result: Rehearsal, clean: bool = False) -> None:
    execution = result.execution
    say("")
    say("gate:")
    for event in execution.trace:
        if event.kind == "condition" and event.step in ("Gate", "GateReason"):
            for check in event.data.get("checks", []):
                say(f"  {event.step}: {check}")
    _print_candidates(say, result, execution)
    restarts = [e for e in execution.trace if e.kind in ("retry", "restart")]
    say(f"retries and restarts: {len(restarts) or 'none'}")
    for event in restarts:
        say(f"  {event.text}")
    say("EMF lines per host (CloudWatch metrics from stdout):")
    for run in result.executions:
        for name, attempt in attempt_names(run, train_only=False):
            for host, lines in attempt.detail.get("emf", {}).items():
                say(f"  {name} {host}: {_emf_summary(lines)}")
    for run in result.executions:
        for name, straggler in stragglers(run):
            say(f"straggler: {name}: {straggler.describe()}")
    say(f"checkpoints: {result.checkpoint_uri}")
    for host, count in sorted(result.uploads_by_host.items()):
        say(f"  {host} uploaded {count} file(s)")
    say(
        f"  the prefix held at most {result.max_checkpoints} checkpoint(s) at once (keep_last {result.keep_last}: "
        f"at most {result.keep_last + 1} once every host has synced, {result.keep_last + 2} while one lags); at the "
        f"end: {', '.join(result.checkpoints_at_end) or 'none'}"
    )
    writers = sorted(set(result.writers_at_end.values()))
    if writers:
        say(f"  written by: {', '.join(writers)}")
    for name, attempt in attempt_names(execution):
        resumed = attempt.detail.get("resumed_from")
        losses = attempt.detail.get("losses", {})
        span = f"steps {min(losses)}-{max(losses)}" if losses else "no steps"
        say(
            f"  {name}: {attempt.status}"
            + (f", resumed from step {resumed}" if resumed else "")
            + f", {span}"
            + (f": {attempt.failure_reason}" if attempt.failure_reason else "")
        )
    losses = result.losses()
    if losses:
        say("loss: " + " ".join(f"{step}:{value:.4f}" for step, value in losses.items()))
    validation = result.validation_losses()
    if validation:
        say(
            "validation loss (held-out windows): "
            + " ".join(f"{step}:{value:.4f}" for step, value in validation.items())
        )
    elif result.scaled.config.validation.source == "none":
        say("validation loss: none (the recipe holds out no data: data.validation_fraction 0 and no validation_uri)")
    if result.exported:
        exported = result.exported
        say(f"exported model: {exported['dir']}" + (" (removed with the work directory: --clean)" if clean else ""))
        say(f"  files: {', '.join(exported['files'])}")
        for name, info in list(exported["tensors"].items())[:4]:
            say(f"  {name}: {info['dtype']} {tuple(info['shape'])} in {info['file']}")
        if len(exported["tensors"]) > 4:
            say(f"  ... {len(exported['tensors'])} tensors")
    _print_packages(say, result.packages)
    if result.interrupt:
        say(
            f"interrupt {result.interrupt}: "
            + (result.interrupted or "it never happened (the run ended first): NOT rehearsed")
        )
    for number, run in enumerate(result.executions, start=1):
        say(f"execution {number}: {run.status}" + (f" at {run.failed_step}: {run.failure}" if run.failure else ""))
