"""The pipeline definition against an oracle: the SageMaker Python SDK v3.

For every template in ``recipes/`` (and a few variants that reach the branches no template
takes: a training plan, a validation channel, no TensorBoard, no probe, a VPC), the SDK builds
the same pipeline from the same inputs that :func:`tiered_training.definition.build_definition`
reads: the Plan, its RunConfig, the PipelineResources and the module's named constants. It never
reads our definition dict. Training steps go through ``sagemaker.train.ModelTrainer.train()``
under a ``PipelineSession`` (so the CreateTrainingJob request is serialised by the SDK's
``sagemaker.core.shapes``), wrapped in ``sagemaker.mlops.workflow`` TrainingStep, ConditionStep
and FailStep, with ``Pipeline.definition()`` writing the JSON. Both definitions are then
normalised (below) and compared; a difference fails with one line per differing path.

Normalisation: only what is equal by the API's rules.

- Key order, and ``null`` for an absent member (the SDK writes ``PipelineExperimentConfig``
  and ``MlflowConfig`` as ``null``).
- Hyperparameter values are compared as the container reads them
  (``RunConfig.from_hyperparameters``): the SDK writes a string as it is and anything else as
  JSON; ours writes every value as JSON.

What the comparison proves is the rendering: member names and nesting, value types, pipeline
expressions (``Get``, ``Std:Join``, step properties), conditions, retry policies and the step
graph. The decisions (which members the probe gets, runtimes, channels) are restated here from
the design, so a change of policy is made in both places, and
:func:`test_the_oracle_builds_every_training_step_of_ours` names a Training step the oracle lacks.

Judged differences, not compared:

- ``Metadata``: free-form strings (the definition schema allows any ``{name: string}``); ours
  names the generator and the recipe, the SDK writes ``{}``.
- Step ``Description``: free text for people; no expression or API field depends on it.
- ``PipelineExperimentConfig``: the SDK's default creates a SageMaker Experiment per pipeline
  and a trial per execution; ours creates none (runs are tracked in MLflow and CloudWatch), so
  the oracle passes ``pipeline_experiment_config=None``.
- Fail message text: the oracle renders the same parts (:func:`definition.throughput_failure`,
  :func:`definition.memory_failure`), so the text is equal by construction; what is checked is
  how the probe metrics are referenced inside ``Std:Join``.

Which side is right where the encoding differs: the hyperparameters. The SDK's
``safe_serialize`` leaves a string bare, so a string that reads as JSON (``"1"``, ``"true"``)
comes back as a number or a boolean; ours JSON-encodes every value, so each decodes to its
own type. Ours stays; the comparison holds because no RunConfig string is JSON-like, which the
test checks.

The SDK is a test-only dependency (``requirements-oracle.txt``); ``tests/test_imports.py``
checks that nothing in the synth or runtime paths imports it.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from support import RECIPES, recipe_dict, write_yaml
from tiered_training import definition as d
from tiered_training import metrics
from tiered_training.planner import plan_file
from tiered_training.runconfig import TENSORBOARD_DIR, VALIDATION_CHANNEL, RunConfig

# The SDK's own notices (moved modules, "no job is started in a PipelineSession") are not ours.
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:sagemaker"),
    pytest.mark.filterwarnings("ignore:Running within a PipelineSession:UserWarning"),
]

REGION = "us-east-1"
RESOURCES = d.PipelineResources(
    role_arn="arn:aws:iam::123456789012:role/exec",
    image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/tiered-training:1",
    checkpoint_s3_uri="s3://store/r/checkpoints/",
    output_s3_uri="s3://store/r/output/",
    kms_key_id="arn:aws:kms:us-east-1:123456789012:key/abc",
    subnets=("subnet-0a", "subnet-0b"),
    security_group_ids=("sg-0a",),
    extra_tags={"team": "research"},
)
TRAINING_PLAN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p6-reserved"

# Branches no template takes, on a small recipe.
VARIANTS = {
    "variant-plan-validation": {
        "compute.training_plan_arn": TRAINING_PLAN,
        "data.validation_uri": "s3://bucket-for-tests/held-out/",
        "data.allowed_uris": ["s3://bucket-for-tests/"],
        "data.input_mode": "File",
        "tracking.tensorboard": False,
        "probe.enabled": False,
        "tags": {"cost-centre": "42"},
    },
    "variant-spot-wait": {"compute.spot": True, "compute.max_wait_hours": 30, "compute.max_runtime_hours": 20},
}


# -- the SDK ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sdk(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """The SDK's classes, imported with no AWS config files, no telemetry and no network."""
    empty = tmp_path_factory.mktemp("sagemaker-config") / "config.yaml"
    empty.write_text("{}\n")
    with pytest.MonkeyPatch.context() as mp:
        # No config file of the machine's may add defaults (tags, VPC, KMS) to the SDK's side.
        mp.setenv("SAGEMAKER_ADMIN_CONFIG_OVERRIDE", str(empty))
        mp.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(empty))
        # Role validation would call IAM; the role is a plain ARN here.
        mp.setenv("SAGEMAKER_VALIDATE_ROLE", "false")
        mp.setenv("AWS_DEFAULT_REGION", REGION)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.delenv("AWS_PROFILE", raising=False)
        attempts: list[Any] = []

        def no_network(sock, address, *args, **kwargs):
            attempts.append(address)  # recorded: the SDK may swallow the error
            raise OSError(f"the SDK oracle must build the definition offline; it tried {address!r}")

        mp.setattr(socket.socket, "connect", no_network)

        started = time.perf_counter()
        try:
            import boto3
            from sagemaker.core import shapes
            from sagemaker.core.telemetry import telemetry_logging
            from sagemaker.core.training.configs import CheckpointConfig, Compute, Networking, TensorBoardOutputConfig
            from sagemaker.core.workflow import conditions, functions, parameters
            from sagemaker.core.workflow.pipeline_context import PipelineSession
            from sagemaker.mlops.workflow import retry
            from sagemaker.mlops.workflow.condition_step import ConditionStep
            from sagemaker.mlops.workflow.fail_step import FailStep
            from sagemaker.mlops.workflow.pipeline import Pipeline
            from sagemaker.mlops.workflow.steps import TrainingStep
            from sagemaker.train.model_trainer import ModelTrainer
        except ImportError as error:  # pragma: no cover - an install problem, not a skip
            pytest.fail(
                f"the SageMaker SDK is missing ({error}): make test installs it, or"
                " pip install --no-deps -c constraints.txt -r requirements-oracle.txt"
            )
        import_seconds = time.perf_counter() - started
        print(f"sagemaker SDK import: {import_seconds:.1f} s")

        # Telemetry is sent from a thread after each train(); never from a test.
        mp.setattr(telemetry_logging, "_send_telemetry_request", lambda *args, **kwargs: None)
        session = PipelineSession(boto_session=boto3.Session(region_name=REGION), default_bucket="unused-default-bucket")
        assert session.sagemaker_config in (None, {}), session.sagemaker_config
        yield SimpleNamespace(
            shapes=shapes, Compute=Compute, Networking=Networking, CheckpointConfig=CheckpointConfig,
            TensorBoardOutputConfig=TensorBoardOutputConfig, conditions=conditions, functions=functions,
            parameters=parameters, retry=retry, ConditionStep=ConditionStep, FailStep=FailStep, Pipeline=Pipeline,
            TrainingStep=TrainingStep, ModelTrainer=ModelTrainer, session=session,
        )
        assert not attempts, f"the SDK tried to reach the network: {attempts}"


# -- the SDK's pipeline, from the same inputs ------------------------------------------------


@dataclass(frozen=True)
class TrainingSpec:
    """One Training step the plan runs: its name and whether it is the probe."""

    name: str
    probe: bool


def training_specs(plan) -> list[TrainingSpec]:
    """The Training steps a plan declares, in definition order (one spec per step)."""
    return [TrainingSpec(d.S_PROBE, True), TrainingSpec(d.S_TRAIN, False), TrainingSpec(d.S_TRAIN_WITHOUT_PROBE, False)]


def sdk_parameters(sdk, plan) -> dict[str, Any]:
    p = sdk.parameters
    return {
        d.P_INSTANCE_COUNT: p.ParameterInteger(name=d.P_INSTANCE_COUNT, default_value=plan.nodes),
        d.P_MAX_STEPS: p.ParameterInteger(name=d.P_MAX_STEPS, default_value=plan.estimates.total_steps),
        d.P_DATA_URI: p.ParameterString(name=d.P_DATA_URI, default_value=plan.recipe.data.uri),
        d.P_SKIP_PROBE: p.ParameterBoolean(name=d.P_SKIP_PROBE, default_value=not plan.recipe.probe.enabled),
    }


def runconfig_values(plan) -> dict[str, Any]:
    """The RunConfig's fields, flat (``section.field``), as values: the SDK encodes them."""
    values: dict[str, Any] = {}
    for section, value in plan.run_config().model_dump(mode="json").items():
        if isinstance(value, dict):
            values.update({f"{section}.{key}": leaf for key, leaf in value.items()})
        else:
            values[section] = value
    return values


def sdk_hyperparameters(plan, params) -> dict[str, Any]:
    """The RunConfig as hyperparameters; the step count follows MaxSteps (a string, as the API wants)."""
    return {**runconfig_values(plan), "batch.total_steps": params[d.P_MAX_STEPS].to_string()}


def _channel(sdk, name: str, uri: Any, mode: str):
    s = sdk.shapes
    source = s.S3DataSource(s3_data_type="S3Prefix", s3_uri=uri, s3_data_distribution_type="FullyReplicated")
    return s.Channel(channel_name=name, data_source=s.DataSource(s3_data_source=source), input_mode=mode)


def _join(prefix: str, leaf: str) -> str:
    return prefix.rstrip("/") + "/" + leaf


def sdk_training_step(sdk, plan, resources: d.PipelineResources, params, spec: TrainingSpec):
    """One TrainingStep, through ModelTrainer.train() as the SDK's documentation builds one."""
    s = sdk.shapes
    recipe, compute = plan.recipe, plan.recipe.compute
    probe = spec.probe

    channels = [_channel(sdk, d.TRAIN_CHANNEL, params[d.P_DATA_URI], recipe.data.input_mode)]
    if recipe.model.init_checkpoint:
        channels.append(_channel(sdk, d.MODEL_CHANNEL, recipe.model.init_checkpoint, "File"))
    if recipe.data.validation_uri and not probe:
        channels.append(_channel(sdk, VALIDATION_CHANNEL, recipe.data.validation_uri, recipe.data.input_mode))

    runtime = int(compute.max_runtime_hours * 3600)
    if probe:
        runtime = min(runtime, d.PROBE_MAX_RUNTIME_SECONDS)
    wait = max(runtime, int((compute.max_wait_hours or compute.max_runtime_hours) * 3600)) if compute.spot else None

    environment = {**d.family_environment(plan), d.MODE_VARIABLE: "probe" if probe else "train"}

    trainer = sdk.ModelTrainer(
        sagemaker_session=sdk.session,
        role=resources.role_arn,
        base_job_name=f"{plan.name}-{spec.name}".lower(),
        training_image=resources.image_uri,
        training_input_mode=recipe.data.input_mode,
        compute=sdk.Compute(
            instance_type=plan.instance.name,
            instance_count=params[d.P_INSTANCE_COUNT],
            volume_size_in_gb=d.VOLUME_SIZE_GB,
            training_plan_arn=compute.training_plan_arn,
            keep_alive_period_in_seconds=d.WARM_POOL_SECONDS if probe and not compute.spot else None,
            enable_managed_spot_training=True if compute.spot else None,
        ),
        networking=(
            sdk.Networking(subnets=list(resources.subnets), security_group_ids=list(resources.security_group_ids))
            if resources.subnets
            else None
        ),
        stopping_condition=s.StoppingCondition(max_runtime_in_seconds=runtime, max_wait_time_in_seconds=wait),
        output_data_config=s.OutputDataConfig(
            s3_output_path=_join(resources.output_s3_uri, "probe" if probe else "model"), kms_key_id=resources.kms_key_id
        ),
        input_data_config=channels,
        checkpoint_config=(
            None if probe else sdk.CheckpointConfig(s3_uri=resources.checkpoint_s3_uri, local_path=d.CHECKPOINT_LOCAL_PATH)
        ),
        environment=environment,
        hyperparameters=sdk_hyperparameters(plan, params),
        tags=[s.Tag(key=k, value=v) for k, v in d.tags_for(plan, resources.extra_tags).items()],
    )
    if probe:
        trainer = trainer.with_metric_definitions(
            [s.MetricDefinition(name=name, regex=regex) for name, (_fmt, regex) in metrics.PROBE_METRICS.items()]
        )
    else:
        trainer = trainer.with_retry_strategy(s.RetryStrategy(maximum_retry_attempts=d.JOB_RETRY_ATTEMPTS))
        if recipe.tracking.tensorboard:
            trainer = trainer.with_tensorboard_output_config(
                sdk.TensorBoardOutputConfig(
                    s3_output_path=_join(resources.output_s3_uri, "tensorboard"), local_path=TENSORBOARD_DIR
                )
            )
    return sdk.TrainingStep(name=spec.name, step_args=trainer.train(), retry_policies=sdk_retry_policies(sdk))


def sdk_retry_policies(sdk) -> list:
    r = sdk.retry
    job = {e.value: e for e in r.SageMakerJobExceptionTypeEnum}
    step = {e.value: e for e in r.StepExceptionTypeEnum}
    policies = []
    for policy, kind, enum in (
        (d.CAPACITY_RETRY, r.SageMakerJobStepRetryPolicy, job),
        (d.SERVICE_RETRY, r.StepRetryPolicy, step),
    ):
        policies.append(
            kind(
                exception_types=[enum[name] for name in policy["ExceptionType"]],
                interval_seconds=policy["IntervalSeconds"],
                backoff_rate=policy["BackoffRate"],
                max_attempts=policy["MaxAttempts"],
            )
        )
    return policies


def sdk_definition(sdk, plan, resources: d.PipelineResources) -> dict[str, Any]:
    """The whole pipeline, built by the SDK: parameters, training steps, gate and fail steps."""
    plan.require_ok()
    params = sdk_parameters(sdk, plan)
    steps = {spec.name: sdk_training_step(sdk, plan, resources, params, spec) for spec in training_specs(plan)}
    probe = steps[d.S_PROBE]

    def metric(name: str):
        return probe.properties.FinalMetricDataList[name].Value

    def fail(name: str, parts: list) -> Any:
        values = [metric(part.name) if isinstance(part, d.ProbeMetric) else part for part in parts]
        return sdk.FailStep(name=name, error_message=sdk.functions.Join(on="", values=values))

    c = sdk.conditions
    memory_ok = c.ConditionLessThanOrEqualTo(left=metric(d.PROBE_MEMORY), right=d.memory_limit(plan))
    throughput_ok = c.ConditionGreaterThanOrEqualTo(left=metric(d.PROBE_TOKENS), right=d.probe_threshold(plan))
    reason = sdk.ConditionStep(
        name=d.S_GATE_REASON,
        conditions=[memory_ok],
        if_steps=[fail(d.S_FAIL_THROUGHPUT, d.throughput_failure(plan))],
        else_steps=[fail(d.S_FAIL_MEMORY, d.memory_failure(plan))],
    )
    gate = sdk.ConditionStep(
        name=d.S_GATE, conditions=[throughput_ok, memory_ok], if_steps=[steps[d.S_TRAIN]], else_steps=[reason]
    )
    root = sdk.ConditionStep(
        name=d.S_PROBE_OR_SKIP,
        conditions=[c.ConditionEquals(left=params[d.P_SKIP_PROBE], right=True)],
        if_steps=[steps[d.S_TRAIN_WITHOUT_PROBE]],
        else_steps=[probe, gate],
    )
    pipeline = sdk.Pipeline(
        name=plan.name,
        parameters=list(params.values()),
        steps=[root],
        sagemaker_session=sdk.session,
        pipeline_experiment_config=None,  # ours creates no experiment either
    )
    return json.loads(pipeline.definition())


# -- normalising and comparing ---------------------------------------------------------------


def normalise(definition: dict[str, Any]) -> dict[str, Any]:
    """The definition with only the equivalences in the module docstring applied."""
    out = _drop_nulls(json.loads(json.dumps(definition)))
    out.pop("Metadata", None)
    for step in d.iter_steps(out["Steps"]):
        step.pop("Description", None)
        if step["Type"] != "Training":
            continue
        args = step["Arguments"]
        args["HyperParameters"] = decoded_hyperparameters(args.get("HyperParameters", {}))
    return out


def decoded_hyperparameters(hp: dict[str, Any]) -> dict[str, Any]:
    """Each value as the container decodes it; pipeline expressions stay as they are."""
    plain = {k: v for k, v in hp.items() if isinstance(v, str)}
    # RunConfig.from_hyperparameters is the container's reader; it must accept the lot.
    RunConfig.from_hyperparameters({**plain, **{k: "1" for k in hp if k not in plain}})
    return {k: (json.loads(v) if _is_json(v) else v) if isinstance(v, str) else v for k, v in hp.items()}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def differences(ours: Any, sdk: Any, path: str = "") -> list[str]:
    """One line per path where the two differ."""
    if isinstance(ours, dict) and isinstance(sdk, dict):
        lines = []
        for key in sorted(set(ours) | set(sdk), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in sdk:
                lines.append(f"{where}: only ours has it: {_short(ours[key])}")
            elif key not in ours:
                lines.append(f"{where}: only the SDK has it: {_short(sdk[key])}")
            else:
                lines += differences(ours[key], sdk[key], where)
        return lines
    if isinstance(ours, list) and isinstance(sdk, list):
        if len(ours) != len(sdk):
            return [f"{path}: {len(ours)} items in ours, {len(sdk)} in the SDK's: {_short(ours)} vs {_short(sdk)}"]
        lines = []
        for number, (a, b) in enumerate(zip(ours, sdk)):
            same_name = isinstance(a, dict) and isinstance(b, dict) and a.get("Name") == b.get("Name")
            lines += differences(a, b, f"{path}[{a.get('Name') if same_name and a.get('Name') else number}]")
        return lines
    if ours != sdk or type(ours) is not type(sdk):
        return [f"{path}: ours {_short(ours)}, the SDK's {_short(sdk)}"]
    return []


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- fixtures and tests ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Any]:
    """Every template's plan, and the variants', planned once for the module."""
    folder = tmp_path_factory.mktemp("oracle-variants")
    paths = {path.stem: path for path in RECIPES}
    for name, overrides in VARIANTS.items():
        paths[name] = write_yaml(folder / f"{name}.yaml", recipe_dict(name=name, **overrides))
    return {name: plan_file(path) for name, path in paths.items()}


@pytest.fixture(scope="module")
def pairs(sdk, plans) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    return {name: (d.build_definition(plan, RESOURCES), sdk_definition(sdk, plan, RESOURCES)) for name, plan in plans.items()}


def test_every_template_matches_the_sdk(pairs):
    assert {path.stem for path in RECIPES} <= set(pairs), "every template is compared"
    report = []
    for name, (ours, theirs) in pairs.items():
        # Our validator must accept what the SDK writes (no false alarms at synth).
        lines = [f"validate_definition rejects the SDK's: {problem}" for problem in d.validate_definition(theirs)]
        lines += differences(normalise(ours), normalise(theirs))
        if lines:
            report.append(f"{name}:\n  " + "\n  ".join(lines))
    if report:
        pytest.fail("pipeline definition differs from the SageMaker SDK's:\n" + "\n".join(report), pytrace=False)


def test_the_oracle_builds_every_training_step_of_ours(pairs, plans):
    """A new Training step in the definition needs a spec here; otherwise the comparison above
    would report it as 'only ours', which names the step but not the fix."""
    for name, (ours, _sdk) in pairs.items():
        training = [s["Name"] for s in d.iter_steps(ours["Steps"]) if s["Type"] == "Training"]
        assert sorted(training) == sorted(spec.name for spec in training_specs(plans[name])), name


def test_the_variants_reach_the_branches_no_template_takes(pairs):
    _ours, theirs = pairs["variant-plan-validation"]
    train = d.find_step(theirs, d.S_TRAIN)["Arguments"]
    assert train["ResourceConfig"]["TrainingPlanArn"] == TRAINING_PLAN
    assert [c["ChannelName"] for c in train["InputDataConfig"]] == [d.TRAIN_CHANNEL, VALIDATION_CHANNEL]
    assert "TensorBoardOutputConfig" not in train
    assert train["VpcConfig"]["Subnets"] == list(RESOURCES.subnets)
    _ours, theirs = pairs["variant-spot-wait"]
    train = d.find_step(theirs, d.S_TRAIN)["Arguments"]
    assert train["EnableManagedSpotTraining"] is True
    assert train["StoppingCondition"] == {"MaxRuntimeInSeconds": 20 * 3600, "MaxWaitTimeInSeconds": 30 * 3600}
    assert "KeepAlivePeriodInSeconds" not in d.find_step(theirs, d.S_PROBE)["Arguments"]["ResourceConfig"]


def test_no_runconfig_string_reads_as_json(plans):
    """The one place the SDK's encoding is weaker than ours: a bare string that parses as JSON
    changes type in the container. None of ours does, so the SDK's form decodes the same."""
    for name, plan in plans.items():
        for key, value in runconfig_values(plan).items():
            if isinstance(value, str):
                assert not _is_json(value), f"{name}: {key}={value!r}"


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda step: step["Arguments"]["ResourceConfig"].update(VolumeSizeInGb=200), "VolumeSizeInGb: only ours"),
        (lambda step: step["Arguments"]["StoppingCondition"].update(MaxRuntimeInSeconds=1), "MaxRuntimeInSeconds: ours 1"),
        (
            lambda step: step["Arguments"]["HyperParameters"].update({"batch.total_steps": {"Get": "Parameters.MaxSteps"}}),
            "batch.total_steps",
        ),
        (lambda step: step["RetryPolicies"].pop(), "RetryPolicies: 1 items in ours, 2"),
    ],
    ids=["misspelt-member", "wrong-value", "integer-where-a-string-goes", "missing-retry-policy"],
)
def test_the_comparison_catches_a_wrong_definition(pairs, mutate: Callable, expected: str):
    ours, theirs = pairs["llama3-8b-fp8"]
    broken = json.loads(json.dumps(ours))
    mutate(d.find_step(broken, d.S_TRAIN))
    lines = differences(normalise(broken), normalise(theirs))
    assert any(expected in line and "Train" in line for line in lines), lines
