"""What SageMaker would reject in a pipeline definition, checked before anything is deployed or run.

Each Training step's arguments against botocore's CreateTrainingJob input shape (CDK tokens and
pipeline expressions replaced by placeholders of the right type), the names, the references between
steps, parameters and execution variables, and the size of the body. ``validate_definition`` returns
the problems; an empty list means SageMaker would accept it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from tiered_training.pipeline.definition import (
    EXECUTION_VARIABLES,
    MAX_BODY_CHARS,
    MAX_ENVIRONMENT,
    MAX_METRIC_DEFINITIONS,
    PARAMETER_NAME_PATTERN,
    SCHEMA_VERSION,
    STEP_NAME_PATTERN,
    iter_steps,
    to_json,
)


def _expressions(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if set(value) == {"Get"} and isinstance(value["Get"], str):
            yield value["Get"]
        for child in value.values():
            yield from _expressions(child)
    elif isinstance(value, list):
        for child in value:
            yield from _expressions(child)


def _is_expression(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("Get", "Std:Join", "Std:JsonGet")


@cache
def _input_shape(operation: str):
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return model.operation_model(operation).input_shape


def _create_training_job_shape():
    return _input_shape("CreateTrainingJob")


def cdk_token(value: Any) -> bool:
    """A CDK token encoded in a string (a role ARN, a bucket name): known only at deploy time."""
    return isinstance(value, str) and "${Token[" in value


def placeholder_arguments(args: dict[str, Any], is_placeholder: Callable[[Any], bool] = cdk_token) -> dict[str, Any]:
    """Training arguments with every pipeline expression (and deploy-time token) replaced by a
    value of the member's type."""
    request = {"TrainingJobName": "pipelines-placeholder", **args}
    return _concretise(request, _create_training_job_shape(), is_placeholder)


def _concretise(value: Any, shape, is_placeholder: Callable[[Any], bool]) -> Any:
    if _is_expression(value) or is_placeholder(value):
        return _placeholder(shape)
    if shape is None:
        return value
    if shape.type_name == "structure" and isinstance(value, dict):
        return {k: _concretise(v, shape.members.get(k), is_placeholder) for k, v in value.items()}
    if shape.type_name == "list" and isinstance(value, list):
        return [_concretise(v, shape.member, is_placeholder) for v in value]
    if shape.type_name == "map" and isinstance(value, dict):
        return {k: _concretise(v, shape.value, is_placeholder) for k, v in value.items()}
    return value


def _placeholder(shape) -> Any:
    kind = shape.type_name if shape is not None else "string"
    if kind == "string":
        return "x" * max(1, shape.metadata.get("min", 1)) if shape is not None else "x"
    if kind in ("integer", "long"):
        return max(1, shape.metadata.get("min", 1))
    if kind in ("float", "double"):
        return 1.0
    if kind == "boolean":
        return True
    if kind == "list":
        return []
    return {}


def validate_training_arguments(args: dict[str, Any], step_name: str = "") -> list[str]:
    """Problems in one Training step's arguments, each naming the field."""
    from botocore.validate import ParamValidator

    where = f"step {step_name}: " if step_name else ""
    problems: list[str] = []
    report = ParamValidator().validate(placeholder_arguments(args), _create_training_job_shape())
    if report.has_errors():
        text = report.generate_report()
        problems += [f"{where}CreateTrainingJob {line.strip()}" for line in text.splitlines() if line.strip()]
    hp = args.get("HyperParameters") or {}
    if len(hp) > 100:
        problems.append(f"{where}HyperParameters: {len(hp)} keys; SageMaker allows 100")
    for key, text in hp.items():
        if isinstance(text, str) and len(text) > 2500:
            problems.append(f"{where}HyperParameters.{key}: {len(text)} characters; the limit is 2500")
    env = args.get("Environment") or {}
    if len(env) > MAX_ENVIRONMENT:
        problems.append(f"{where}Environment: {len(env)} entries; SageMaker allows {MAX_ENVIRONMENT}")
    for key, text in env.items():
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]{0,511}", key):
            problems.append(f"{where}Environment.{key}: not a valid variable name")
        if isinstance(text, str) and len(text) > 512:
            problems.append(f"{where}Environment.{key}: {len(text)} characters; the limit is 512")
    definitions = (args.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
    if len(definitions) > MAX_METRIC_DEFINITIONS:
        problems.append(f"{where}AlgorithmSpecification.MetricDefinitions: {len(definitions)}; the limit is 40")
    for number, definition in enumerate(definitions):
        try:
            re.compile(definition.get("Regex", ""))
        except re.error as error:
            problems.append(f"{where}AlgorithmSpecification.MetricDefinitions[{number}].Regex: {error}")
    return problems


def validate_processing_arguments(args: dict[str, Any], step_name: str = "") -> list[str]:
    """Problems in one Processing step's arguments against CreateProcessingJob's input shape."""
    from botocore.validate import ParamValidator

    where = f"step {step_name}: " if step_name else ""
    request = _concretise(
        {"ProcessingJobName": "pipelines-placeholder", **args}, _input_shape("CreateProcessingJob"), cdk_token
    )
    report = ParamValidator().validate(request, _input_shape("CreateProcessingJob"))
    problems = []
    if report.has_errors():
        text = report.generate_report()
        problems += [f"{where}CreateProcessingJob {line.strip()}" for line in text.splitlines() if line.strip()]
    env = args.get("Environment") or {}
    if len(env) > MAX_ENVIRONMENT:
        problems.append(f"{where}Environment: {len(env)} entries; SageMaker allows {MAX_ENVIRONMENT}")
    return problems


def validate_register_arguments(args: dict[str, Any], step_name: str = "") -> list[str]:
    """Problems in one RegisterModel step's arguments against CreateModelPackage's input shape, and SageMaker's
    limits on customer metadata (at most 50 keys of 1-128 characters, values of 1-256)."""
    from botocore.validate import ParamValidator

    where = f"step {step_name}: " if step_name else ""
    shape = _input_shape("CreateModelPackage")
    report = ParamValidator().validate(_concretise(dict(args), shape, cdk_token), shape)
    problems = []
    if report.has_errors():
        text = report.generate_report()
        problems += [f"{where}CreateModelPackage {line.strip()}" for line in text.splitlines() if line.strip()]
    if not args.get("ModelPackageGroupName"):
        problems.append(f"{where}ModelPackageGroupName: a registered (versioned) package names its group")
    metadata = args.get("CustomerMetadataProperties") or {}
    if len(metadata) > 50:
        problems.append(f"{where}CustomerMetadataProperties: {len(metadata)} keys; SageMaker allows 50")
    for key, value in metadata.items():
        if not re.fullmatch(r"[\w\s.:/=+\-@]{1,128}", key):  # CustomerMetadataKey: letters, digits, _.:/=+-@
            problems.append(
                f"{where}CustomerMetadataProperties.{key}: not a valid key (1-128 letters, digits, _.:/=+-@)"
            )
        if isinstance(value, str) and not 1 <= len(value) <= 256:
            problems.append(f"{where}CustomerMetadataProperties.{key}: {len(value)} characters; 1 to 256")
    return problems


def _property_file_problems(steps: list[dict[str, Any]], step: dict[str, Any]) -> list[str]:
    """Each ``Steps.S.PropertyFiles.F`` a step reads names a property file that step S declares, on one of its
    outputs; each property file a step declares names one of its outputs."""
    problems = []
    declared = {s.get("Name"): {f.get("PropertyFileName"): f for f in s.get("PropertyFiles", [])} for s in steps}
    outputs = {
        s.get("Name"): {
            o.get("OutputName")
            for o in ((s.get("Arguments") or {}).get("ProcessingOutputConfig") or {}).get("Outputs", [])
        }
        for s in steps
    }
    name = step.get("Name", "")
    for entry in step.get("PropertyFiles", []):
        if entry.get("OutputName") not in outputs.get(name, set()):
            problems.append(
                f"step {name}: property file {entry.get('PropertyFileName')!r} is on output "
                f"{entry.get('OutputName')!r}, which the step does not have"
            )
    for ref in _expressions(step.get("Arguments", {})):
        parts = ref.split(".")
        if len(parts) == 4 and parts[0] == "Steps" and parts[2] == "PropertyFiles":
            if parts[3] not in declared.get(parts[1], {}):
                problems.append(f"step {name}: {ref} names no property file of step {parts[1]}")
    return problems


METRIC_REF = re.compile(r"^Steps\.(?P<step>[A-Za-z0-9_\-]+)\.FinalMetricDataList\['(?P<metric>[^']+)'\]\.Value$")


def _metric_problems(steps: list[dict[str, Any]], step: dict[str, Any]) -> list[str]:
    """Each ``Steps.S.FinalMetricDataList['m'].Value`` a step reads names a metric that Training step S defines
    (SageMaker lists only the metrics of the job's MetricDefinitions: another name never resolves)."""
    defined = {
        s.get("Name"): {
            m.get("Name")
            for m in ((s.get("Arguments") or {}).get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
        }
        for s in steps
        if s.get("Type") == "Training"
    }
    problems = []
    for ref in _expressions(step.get("Arguments", {})):
        match = METRIC_REF.match(ref)
        if match and match.group("step") in defined and match.group("metric") not in defined[match.group("step")]:
            problems.append(
                f"step {step.get('Name', '')}: {ref} names no metric of step {match.group('step')}'s "
                f"MetricDefinitions ({', '.join(sorted(defined[match.group('step')])) or 'none'})"
            )
    return problems


def validate_definition(definition: dict[str, Any], body: str | None = None) -> list[str]:
    """Everything SageMaker would reject when the pipeline is created or run. Empty when valid."""
    problems: list[str] = []
    if definition.get("Version") != SCHEMA_VERSION:
        problems.append(f"Version: {definition.get('Version')!r}, expected {SCHEMA_VERSION!r}")
    names = []
    for parameter in definition.get("Parameters", []):
        name = parameter.get("Name", "")
        names.append(name)
        if not re.fullmatch(PARAMETER_NAME_PATTERN, name):
            problems.append(f"parameter {name!r}: does not match {PARAMETER_NAME_PATTERN}")
        if parameter.get("Type") not in ("String", "Integer", "Boolean", "Float"):
            problems.append(f"parameter {name}: unknown type {parameter.get('Type')!r}")
    if len(set(names)) != len(names):
        problems.append(f"parameters: duplicate names in {names}")
    steps = list(iter_steps(definition.get("Steps", [])))
    step_names = [s.get("Name", "") for s in steps]
    if len(set(step_names)) != len(step_names):
        problems.append(f"steps: duplicate names in {step_names}")
    for step in steps:
        name = step.get("Name", "")
        if not re.fullmatch(STEP_NAME_PATTERN, name):
            problems.append(f"step {name!r}: does not match {STEP_NAME_PATTERN}")
        if step.get("Type") == "Training":
            problems += validate_training_arguments(step.get("Arguments", {}), name)
        elif step.get("Type") == "Processing":
            problems += validate_processing_arguments(step.get("Arguments", {}), name)
        elif step.get("Type") == "RegisterModel":
            problems += validate_register_arguments(step.get("Arguments", {}), name)
        elif step.get("Type") not in ("Condition", "Fail"):
            problems.append(f"step {name}: unknown step type {step.get('Type')!r}")
        problems += _property_file_problems(steps, step)
        problems += _metric_problems(steps, step)
        for ref in _expressions(step.get("Arguments", {})):
            head, _, rest = ref.partition(".")
            target = rest.split(".")[0].split("[")[0]
            if head == "Parameters" and target not in names:
                problems.append(f"step {name}: references unknown parameter {target!r}")
            elif head == "Steps" and target not in step_names:
                problems.append(f"step {name}: references unknown step {target!r}")
            elif head == "Execution" and rest not in EXECUTION_VARIABLES:
                problems.append(f"step {name}: references unknown execution variable {rest!r}")
        for dependency in step.get("DependsOn", []):
            if dependency not in step_names:
                problems.append(f"step {name}: DependsOn names no step {dependency!r}")
    if body is None:
        body = to_json(definition)
    if len(body) > MAX_BODY_CHARS:
        problems.append(f"definition body: {len(body)} characters; the limit is {MAX_BODY_CHARS}")
    return problems
