"""A local interpreter of SageMaker pipeline definitions (schema 2020-12-01), the subset this project emits.

It walks the very dict that :func:`tiered_training.pipeline.definition.build_definition` returns:

- **Parameters**: their ``DefaultValue``, overridden by the execution's parameters (typed
  as declared: ``Integer``, ``Float``, ``Boolean``, ``String``).
- **Expressions**: ``{"Get": "Parameters.X"}``, ``{"Get": "Steps.S.FinalMetricDataList['m'].Value"}``,
  ``{"Get": "Execution.PipelineExecutionId"}`` (and ``PipelineName``, ``PipelineExecutionArn``) and
  ``{"Std:Join": {"On": ..., "Values": [...]}}``. Anything else shaped like an
  expression, or a reference that does not resolve, is a :class:`PipelineError` naming it.
- **Condition steps**: ``Equals``, ``GreaterThan``, ``GreaterThanOrEqualTo``, ``LessThan``,
  ``LessThanOrEqualTo``, ``In``, ``Not``, ``Or``; all conditions must hold for ``IfSteps``.
- **Fail steps**: the execution fails with the rendered ``ErrorMessage``.
- **DependsOn**: a step runs after the steps it names; here steps run in the order listed, so
  a step whose dependency has not succeeded is a :class:`PipelineError` (a definition whose
  order SageMaker would not keep).
- **Processing steps**: arguments rendered, then run by the runner's ``process``; each of the step's
  ``PropertyFiles`` is read from the output it names, for ``{"Std:JsonGet": {"PropertyFile": {"Get":
  "Steps.S.PropertyFiles.F"}, "Path": "a.b[0]"}}`` in later steps (a file that is missing, not JSON, or
  without the path is a :class:`PipelineError`, as SageMaker fails the step that reads it).
- **Training steps**: arguments rendered (a metric of an earlier step, such as Train's ``run.candidate`` from the
  Probe's ``probe:best_candidate``, joined into a string as SageMaker renders a Float: "2.0"), then run by a
  :class:`JobRunner`. The job's
  ``FinalMetricDataList`` comes from its log through its own ``MetricDefinitions``: for
  each metric, the last value the regex matched (SageMaker lists "the metric values that it
  computes in its final iteration"). A job that fails on an instance (``InternalServerError``)
  is restarted by its ``RetryStrategy``; a spot interruption restarts it; a step that fails
  is retried by the first of its ``RetryPolicies`` whose ``ExceptionType`` matches.
- **RegisterModel steps**: arguments rendered (``Steps.S.ModelArtifacts.S3ModelArtifacts`` is the Training job's
  ``<S3OutputPath>/<job name>/output/model.tar.gz``), checked against botocore's CreateModelPackage shape, then
  sent by the runner's ``register`` (the rehearsal's: moto's SageMaker model registry).
- **Warm pools**: a job with ``ResourceConfig.KeepAlivePeriodInSeconds`` leaves its
  instances to the next job that matches SageMaker's criteria (role, instance type and
  count, volume, VPC, network isolation, traffic encryption, and a keep-alive of its own).

Waits (retry intervals, queueing) are reported, not slept.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

EXPRESSION_KEYS = ("Get", "Std:Join", "Std:JsonGet")
PROPERTY_FILE_REF = re.compile(r"^Steps\.(?P<step>[A-Za-z0-9_\-]+)\.PropertyFiles\.(?P<file>[A-Za-z0-9_\-]+)$")
ARTIFACT_REF = re.compile(r"^Steps\.(?P<step>[A-Za-z0-9_\-]+)\.ModelArtifacts\.S3ModelArtifacts$")
STEP_REF = re.compile(r"^Steps\.(?P<step>[A-Za-z0-9_\-]+)\.FinalMetricDataList\['(?P<metric>[^']+)'\]\.Value$")
COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "Equals": lambda a, b: a == b,
    "GreaterThan": lambda a, b: a > b,
    "GreaterThanOrEqualTo": lambda a, b: a >= b,
    "LessThan": lambda a, b: a < b,
    "LessThanOrEqualTo": lambda a, b: a <= b,
}
SYMBOLS = {"Equals": "==", "GreaterThan": ">", "GreaterThanOrEqualTo": ">=", "LessThan": "<", "LessThanOrEqualTo": "<="}
WARM_POOL_MATCH = (
    ("RoleArn",),
    ("ResourceConfig", "InstanceCount"),
    ("ResourceConfig", "InstanceType"),
    ("ResourceConfig", "VolumeKmsKeyId"),
    ("ResourceConfig", "VolumeSizeInGB"),
    ("VpcConfig",),
    ("EnableInterContainerTrafficEncryption",),
    ("EnableNetworkIsolation",),
)


class PipelineError(Exception):
    """The definition asks for something this interpreter cannot evaluate, or that does not resolve."""


@dataclass
class JobAttempt:
    """What one run of a training job (one attempt) ended with."""

    status: str  # "Completed", "Failed" or "Interrupted" (a spot interruption: SageMaker starts it again)
    failure_reason: str = ""
    internal: bool = False  # an instance failed (InternalServerError): the RetryStrategy restarts the job
    error: str = ""  # the step's exception type when SageMaker names one (e.g. "SageMaker.RESOURCE_LIMIT")
    log: list[tuple[float, str, str]] = field(default_factory=list)  # (time, host, line)
    detail: dict[str, Any] = field(default_factory=dict)


class JobRunner(Protocol):
    def __call__(
        self, step: str, job_name: str, args: dict[str, Any], attempt: int, *, warm_from: str | None
    ) -> JobAttempt: ...

    def process(self, step: str, job_name: str, args: dict[str, Any]) -> JobAttempt:
        """A processing job; ``detail["outputs"]`` maps each OutputName to the local directory it uploaded."""
        ...


@dataclass
class TraceEvent:
    kind: str  # step, condition, retry, warm-pool, fail, job, metrics
    step: str
    text: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Execution:
    execution_id: str = ""  # Execution.PipelineExecutionId
    status: str = "Executing"  # then "Succeeded" or "Failed"
    failure: str = ""
    failed_step: str | None = None
    trace: list[TraceEvent] = field(default_factory=list)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # step -> FinalMetricDataList
    jobs: dict[str, list[JobAttempt]] = field(default_factory=dict)  # step -> attempts, all jobs
    property_files: dict[str, dict[str, Any]] = field(default_factory=dict)  # step -> file name -> parsed JSON
    artifacts: dict[str, str] = field(default_factory=dict)  # Training step -> ModelArtifacts.S3ModelArtifacts
    packages: dict[str, dict[str, Any]] = field(default_factory=dict)  # RegisterModel step -> request, arn


class _Failed(Exception):
    def __init__(self, step: str, message: str):
        super().__init__(message)
        self.step = step


def final_metrics(definitions: list[dict[str, str]], log: list[tuple[float, str, str]]) -> dict[str, float]:
    """``FinalMetricDataList`` from a job's log (every host, in time order): the last match of each regex."""
    found: dict[str, float] = {}
    for _, _, line in sorted(log, key=lambda entry: entry[0]):
        for definition in definitions:
            match = re.search(definition["Regex"], line)
            if match:
                try:
                    found[definition["Name"]] = float(match.group(1))
                except (IndexError, ValueError):
                    continue
    return found


class Interpreter:
    """Executes one pipeline definition with ``runner`` for its Training steps."""

    def __init__(
        self,
        definition: dict[str, Any],
        runner: JobRunner,
        *,
        report: Callable[[TraceEvent], None] | None = None,
        limits: dict[str, tuple[float, str]] | None = None,
        execution_id: str | None = None,
    ):
        """``limits``: per probe metric, a (value, why) that replaces the literal it is compared with
        in a Condition (a plan figure that does not carry over to the rehearsal's hardware)."""
        self.definition = definition
        self.runner = runner
        self.report = report or (lambda event: None)
        self.limits = limits or {}
        self.parameters: dict[str, Any] = {}
        self.execution = Execution()
        self._warm: dict[str, Any] | None = None
        self._job_counter = 0
        if execution_id is None:
            import uuid

            execution_id = uuid.uuid4().hex[:12]
        self.execution_id = execution_id  # what SageMaker's PipelineExecutionId looks like: 12 lower-case alphanumerics
        self.execution.execution_id = execution_id
        self.pipeline_name = str((definition.get("Metadata") or {}).get("Recipe", "pipeline"))
        self._succeeded: set[str] = set()

    # -- events ------------------------------------------------------------------------

    def _event(self, kind: str, step: str, text: str, **data: Any) -> None:
        event = TraceEvent(kind, step, text, data)
        self.execution.trace.append(event)
        self.report(event)

    # -- parameters and expressions ----------------------------------------------------

    def _bind(self, overrides: dict[str, Any]) -> None:
        declared = {p["Name"]: p for p in self.definition.get("Parameters", [])}
        unknown = sorted(set(overrides) - set(declared))
        if unknown:
            raise PipelineError(f"unknown parameter(s) {', '.join(unknown)}; the pipeline has {', '.join(declared)}")
        for name, spec in declared.items():
            value = overrides.get(name, spec.get("DefaultValue"))
            if value is None:
                raise PipelineError(f"parameter {name} has no default and no value")
            self.parameters[name] = _typed(name, spec.get("Type", "String"), value)

    def evaluate(self, value: Any, where: str = "") -> Any:
        """A value with every pipeline expression in it resolved."""
        if isinstance(value, dict):
            if len(value) == 1 and next(iter(value)) in EXPRESSION_KEYS:
                return self._expression(value, where)
            if any(isinstance(k, str) and (k.startswith("Std:") or k == "Get") for k in value):
                raise PipelineError(f"{where}: cannot evaluate the expression {value!r}")
            return {k: self.evaluate(v, f"{where}.{k}" if where else k) for k, v in value.items()}
        if isinstance(value, list):
            return [self.evaluate(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    def _expression(self, expr: dict[str, Any], where: str) -> Any:
        ((key, body),) = expr.items()
        if key == "Get":
            return self._get(body, where)
        if key == "Std:Join":
            if not isinstance(body, dict) or set(body) != {"On", "Values"}:
                raise PipelineError(f"{where}: Std:Join needs On and Values, got {body!r}")
            return str(body["On"]).join(_as_text(self.evaluate(v, where)) for v in body["Values"])
        if key == "Std:JsonGet":
            return self._json_get(body, where)
        raise PipelineError(f"{where}: cannot evaluate the expression {key} ({expr!r})")

    def _json_get(self, body: Any, where: str) -> Any:
        ref = body.get("PropertyFile") if isinstance(body, dict) else None
        path = body.get("Path") if isinstance(body, dict) else None
        match = PROPERTY_FILE_REF.match(str(ref.get("Get", ""))) if isinstance(ref, dict) else None
        if match is None or not isinstance(path, str) or not isinstance(ref, dict):
            raise PipelineError(f"{where}: Std:JsonGet needs PropertyFile (Get Steps.S.PropertyFiles.F) and Path")
        step, name = match.group("step"), match.group("file")
        files = self.execution.property_files.get(step)
        if files is None:
            raise PipelineError(f"{where}: {ref['Get']}: step {step} has not run")
        if name not in files:
            raise PipelineError(f"{where}: {ref['Get']}: step {step} has no property file {name!r}")
        value = files[name]
        for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
            try:
                value = value[int(part[1:-1])] if part.startswith("[") else value[part]
            except (KeyError, IndexError, TypeError):
                raise PipelineError(f"{where}: property file {name} of step {step} has no {path!r}") from None
        return value

    def _get(self, path: Any, where: str) -> Any:
        if not isinstance(path, str):
            raise PipelineError(f"{where}: Get needs a path string, got {path!r}")
        if path.startswith("Parameters."):
            name = path.split(".", 1)[1]
            if name not in self.parameters:
                raise PipelineError(f"{where}: {path} names no parameter of this pipeline")
            return self.parameters[name]
        if path.startswith("Execution."):
            variables = {
                "PipelineExecutionId": self.execution_id,
                "PipelineName": self.pipeline_name,
                "PipelineExecutionArn": f"arn:aws:sagemaker:local:000000000000:pipeline/{self.pipeline_name}/"
                f"execution/{self.execution_id}",
            }
            name = path.split(".", 1)[1]
            if name not in variables:
                raise PipelineError(
                    f"{where}: {path}: the rehearsal knows the execution variables {', '.join(variables)}"
                )
            return variables[name]
        artifact = ARTIFACT_REF.match(path)
        if artifact:
            if artifact.group("step") not in self.execution.artifacts:
                raise PipelineError(f"{where}: {path}: training step {artifact.group('step')} has not completed")
            return self.execution.artifacts[artifact.group("step")]
        match = STEP_REF.match(path)
        if match:
            step, metric = match.group("step"), match.group("metric")
            if step not in self.execution.metrics:
                raise PipelineError(f"{where}: {path}: step {step} has not run")
            values = self.execution.metrics[step]
            if metric not in values:
                raise PipelineError(
                    f"{where}: {path} is unresolved: the {step} job's log has no line that its MetricDefinitions "
                    f"regex for {metric!r} matches (found: {', '.join(sorted(values)) or 'none'})"
                )
            return values[metric]
        raise PipelineError(f"{where}: cannot evaluate the expression Get {path!r}")

    # -- steps -------------------------------------------------------------------------

    def run(self, parameters: dict[str, Any] | None = None) -> Execution:
        self._bind(parameters or {})
        self._event(
            "start",
            "",
            "parameters: " + ", ".join(f"{k}={v}" for k, v in self.parameters.items()),
            parameters=dict(self.parameters),
        )
        try:
            self._steps(self.definition.get("Steps", []))
            self.execution.status = "Succeeded"
        except _Failed as failed:
            self.execution.status, self.execution.failed_step, self.execution.failure = (
                "Failed",
                failed.step,
                str(failed),
            )
        self._event(
            "end",
            self.execution.failed_step or "",
            f"execution {self.execution.status}"
            + (f" at {self.execution.failed_step}: {self.execution.failure}" if self.execution.failure else ""),
        )
        return self.execution

    def _steps(self, steps: list[dict[str, Any]]) -> None:
        for step in steps:
            kind: Any = step.get("Type")  # the definition's JSON: any value, or none
            handler = {
                "Condition": self._condition_step,
                "Fail": self._fail_step,
                "Training": self._training_step,
                "Processing": self._processing_step,
                "RegisterModel": self._register_step,
            }.get(kind)
            if handler is None:
                raise PipelineError(f"step {step.get('Name')}: steps of type {kind!r} are not supported")
            missing = [name for name in step.get("DependsOn", []) if name not in self._succeeded]
            if missing:
                raise PipelineError(
                    f"step {step.get('Name')}: DependsOn {', '.join(missing)}, which has not succeeded "
                    "before it in this branch"
                )
            handler(step)
            self._succeeded.add(step["Name"])

    def _condition_step(self, step: dict[str, Any]) -> None:
        name, args = step["Name"], step.get("Arguments", {})
        results = [self._condition(c, f"{name}.Conditions[{i}]") for i, c in enumerate(args.get("Conditions", []))]
        outcome = all(ok for ok, _ in results)
        self._event(
            "condition",
            name,
            f"{name}: {' and '.join(text for _, text in results)} -> {outcome}",
            outcome=outcome,
            checks=[text for _, text in results],
        )
        self._steps(args.get("IfSteps" if outcome else "ElseSteps", []))

    def _condition(self, condition: dict[str, Any], where: str) -> tuple[bool, str]:
        kind = condition.get("Type")
        if kind in COMPARISONS:
            left = self.evaluate(condition.get("LeftValue"), where + ".LeftValue")
            right_raw = condition.get("RightValue")
            right = self.evaluate(right_raw, where + ".RightValue")
            note = ""
            metric = _metric_of(condition.get("LeftValue"))
            if metric in self.limits and not isinstance(right_raw, dict):
                limit, why = self.limits[metric]
                note = f" (the definition's limit {right} {why}; the rehearsal compares with {limit})"
                right = limit
            try:
                ok = COMPARISONS[kind](left, right)
            except TypeError:
                raise PipelineError(f"{where}: cannot compare {left!r} with {right!r}") from None
            label = metric or _label(condition.get("LeftValue"))
            return ok, f"{label} {left} {SYMBOLS[kind]} {right}{note}"
        if kind == "In":
            value = self.evaluate(condition.get("QueryValue"), where + ".QueryValue")
            values = self.evaluate(condition.get("Values", []), where + ".Values")
            return value in values, f"{value} in {values}"
        if kind == "Not":
            ok, text = self._condition(condition.get("Condition", {}), where + ".Condition")
            return not ok, f"not ({text})"
        if kind == "Or":
            parts = [
                self._condition(c, f"{where}.Conditions[{i}]") for i, c in enumerate(condition.get("Conditions", []))
            ]
            return any(ok for ok, _ in parts), "(" + " or ".join(text for _, text in parts) + ")"
        raise PipelineError(f"{where}: conditions of type {kind!r} are not supported")

    def _fail_step(self, step: dict[str, Any]) -> None:
        name = step["Name"]
        message = self.evaluate(step.get("Arguments", {}).get("ErrorMessage", ""), f"{name}.ErrorMessage")
        self._event("fail", name, f"{name}: {message}", message=message)
        raise _Failed(name, str(message))

    # -- training ----------------------------------------------------------------------

    def _training_step(self, step: dict[str, Any]) -> None:
        name = step["Name"]
        args = self.evaluate(step.get("Arguments", {}), f"{name}.Arguments")
        policies = step.get("RetryPolicies", [])
        tries: dict[int, int] = {}
        while True:
            error_type, reason = self._training_job(name, args)
            if error_type is None:
                return
            policy = next((i for i, p in enumerate(policies) if error_type in p.get("ExceptionType", [])), None)
            if policy is not None and tries.get(policy, 0) + 1 < policies[policy].get("MaxAttempts", 1):
                tries[policy] = tries.get(policy, 0) + 1
                spec = policies[policy]
                wait = spec.get("IntervalSeconds", 1) * spec.get("BackoffRate", 1.0) ** (tries[policy] - 1)
                self._event(
                    "retry",
                    name,
                    f"{name}: {error_type}; retry policy {policy + 1}: job "
                    f"{tries[policy] + 1} of {spec.get('MaxAttempts')} after {wait:g} s",
                    error=error_type,
                )
                continue
            raise _Failed(name, f"{name} failed ({error_type}): {reason}")

    def _processing_step(self, step: dict[str, Any]) -> None:
        import json
        from pathlib import Path

        name = step["Name"]
        args = self.evaluate(step.get("Arguments", {}), f"{name}.Arguments")
        self._job_counter += 1
        job_name = f"pipelines-{self.execution_id}-{self._job_counter:02d}-{name}"[:63]
        cluster = (args.get("ProcessingResources") or {}).get("ClusterConfig", {})
        self._event(
            "job",
            name,
            f"{name}: processing job {job_name}, {cluster.get('InstanceCount')} x {cluster.get('InstanceType')}",
            job=job_name,
        )
        result = self.runner.process(name, job_name, args)
        self.execution.jobs.setdefault(name, []).append(result)
        if result.status != "Completed":
            self._event("job", name, f"{name}: job {job_name} failed: {result.failure_reason}")
            raise _Failed(name, f"{name} failed: {result.failure_reason or 'the processing job failed'}")
        outputs = result.detail.get("outputs", {})
        files: dict[str, Any] = {}
        for entry in step.get("PropertyFiles", []):
            local = outputs.get(entry.get("OutputName"))
            path = Path(local) / entry.get("FilePath", "") if local else None
            try:
                files[entry["PropertyFileName"]] = json.loads(path.read_text()) if path else None
            except (OSError, ValueError) as error:
                raise _Failed(
                    name, f"{name}: property file {entry.get('PropertyFileName')} ({path}) is unreadable: {error}"
                ) from None
        self.execution.property_files[name] = files
        self._event("job", name, f"{name}: job {job_name} completed", job=job_name)

    def _register_step(self, step: dict[str, Any]) -> None:
        """CreateModelPackage with the rendered arguments, checked against botocore's shape first (SageMaker
        fails the step on a request it refuses); the runner's ``register`` sends it to the local stand-in."""
        from tiered_training.pipeline.validation import validate_register_arguments

        name = step["Name"]
        args = self.evaluate(step.get("Arguments", {}), f"{name}.Arguments")
        problems = validate_register_arguments(args, name)
        if problems:
            raise _Failed(name, f"{name}: CreateModelPackage would be refused: " + "; ".join(problems))
        register = getattr(self.runner, "register", None)
        arn = ""
        if register is not None:
            try:
                arn = register(name, args)
            except Exception as error:  # the stand-in's refusal, as SageMaker's would fail the step
                raise _Failed(name, f"{name}: CreateModelPackage failed: {error}") from None
        self.execution.packages[name] = {"request": args, "arn": arn}
        metadata = args.get("CustomerMetadataProperties") or {}
        self._event(
            "register",
            name,
            f"{name}: model package {arn or '(no registry in this runner)'} in {args.get('ModelPackageGroupName')}, "
            f"{args.get('ModelApprovalStatus')}; "
            + ", ".join(f"{k}={v}" for k, v in metadata.items() if ":" in k),
            arn=arn,
        )

    def _training_job(self, step: str, args: dict[str, Any]) -> tuple[str | None, str]:
        """One training job, with its own restarts; (None, "") when it completed, else (exception type, reason)."""
        self._job_counter += 1
        job_name = f"pipelines-{self.execution_id}-{self._job_counter:02d}-{step}"[:63]
        resources = args.get("ResourceConfig", {})
        warm_from = self._take_warm_pool(step, args)
        retries_left = int((args.get("RetryStrategy") or {}).get("MaximumRetryAttempts", 0))
        attempts = self.execution.jobs.setdefault(step, [])
        attempt = len(attempts)  # numbered over the step's jobs: "<step> attempt N" names one attempt everywhere
        self._event(
            "job",
            step,
            f"{step}: training job {job_name}, {resources.get('InstanceCount')} x "
            f"{resources.get('InstanceType')}" + (f", on the warm pool of {warm_from}" if warm_from else ""),
            job=job_name,
        )
        while True:
            attempt += 1
            result = self.runner(step, job_name, args, attempt, warm_from=warm_from)
            warm_from = None
            attempts.append(result)
            if result.status == "Completed":
                break
            if result.status == "Interrupted":
                self._event(
                    "restart",
                    step,
                    f"{step}: attempt {attempt} interrupted ({result.failure_reason}); "
                    "SageMaker starts the job again, with the checkpoint prefix on every host",
                )
                continue
            if result.internal and retries_left > 0:
                retries_left -= 1
                self._event(
                    "restart",
                    step,
                    f"{step}: attempt {attempt} failed on an instance ({result.failure_reason}); "
                    f"RetryStrategy starts it again ({retries_left} retries left), with the checkpoint prefix "
                    "on every host",
                )
                continue
            error = result.error or ("SageMaker.JOB_INTERNAL_ERROR" if result.internal else "Algorithm")
            self._event("job", step, f"{step}: job {job_name} failed: {result.failure_reason}", error=error)
            return error, result.failure_reason or "the training job failed"
        output = (args.get("OutputDataConfig") or {}).get("S3OutputPath")
        if output:  # where SageMaker uploads the model directory
            self.execution.artifacts[step] = f"{str(output).rstrip('/')}/{job_name}/output/model.tar.gz"
        log = [entry for a in attempts for entry in a.log]
        definitions = (args.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
        self.execution.metrics[step] = final_metrics(definitions, log)
        if definitions:
            found = self.execution.metrics[step]
            self._event(
                "metrics",
                step,
                f"{step}: FinalMetricDataList " + ", ".join(f"{k}={v:g}" for k, v in found.items()),
                metrics=dict(found),
            )
        keep = int(resources.get("KeepAlivePeriodInSeconds") or 0)
        self._warm = {"step": step, "args": args, "seconds": keep} if keep > 0 else None
        if keep > 0:
            self._event("warm-pool", step, f"{step}: instances kept warm for {keep} s (KeepAlivePeriodInSeconds)")
        self._event("job", step, f"{step}: job {job_name} completed", job=job_name)
        return None, ""

    def _take_warm_pool(self, step: str, args: dict[str, Any]) -> str | None:
        pool, self._warm = self._warm, None
        if pool is None:
            return None
        if int(_dig(args, ("ResourceConfig", "KeepAlivePeriodInSeconds")) or 0) <= 0:
            self._event(
                "warm-pool",
                step,
                f"{step}: cannot reuse the warm pool of {pool['step']}: it sets no "
                "ResourceConfig.KeepAlivePeriodInSeconds (SageMaker matches only a job that asks for a warm "
                "pool of its own)",
            )
            return None
        differ = [".".join(path) for path in WARM_POOL_MATCH if _dig(pool["args"], path) != _dig(args, path)]
        if differ:
            self._event(
                "warm-pool", step, f"{step}: cannot reuse the warm pool of {pool['step']}: {', '.join(differ)} differ"
            )
            return None
        self._event(
            "warm-pool",
            step,
            f"{step}: reuses the warm pool of {pool['step']} (no new capacity needed)",
            reused=pool["step"],
        )
        return pool["step"]


def _dig(value: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _typed(name: str, kind: str, value: Any) -> Any:
    try:
        if kind == "Integer":
            return int(value)
        if kind == "Float":
            return float(value)
        if kind == "Boolean":
            if isinstance(value, str):
                if value.lower() not in ("true", "false"):
                    raise ValueError(value)
                return value.lower() == "true"
            return bool(value)
        if kind == "String":
            return str(value)
    except (TypeError, ValueError):
        raise PipelineError(f"parameter {name}: {value!r} is not a valid {kind}") from None
    raise PipelineError(f"parameter {name}: unknown type {kind!r}")


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return repr(value)
    return str(value)


def _metric_of(expr: Any) -> str | None:
    if isinstance(expr, dict) and isinstance(expr.get("Get"), str):
        match = STEP_REF.match(expr["Get"])
        if match:
            return match.group("metric")
    return None


def _label(expr: Any) -> str:
    if isinstance(expr, dict) and isinstance(expr.get("Get"), str):
        return expr["Get"]
    return repr(expr)
