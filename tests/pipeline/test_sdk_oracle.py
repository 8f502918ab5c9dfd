"""The pipeline definition against an oracle: the SageMaker Python SDK v3.

For every template in ``recipes/`` (and a few variants that reach the branches no template
takes: a training plan, a validation channel, no TensorBoard, no probe, a VPC, a run in
segments on spot with a stated wait, and one in segments under a small stated runtime quota, with
warm pools between them), the SDK builds
the same pipeline from the same inputs that :func:`tiered_training.pipeline.definition.build_definition`
reads: the Plan, its RunConfig, the PipelineResources and the module's named constants. It never
reads our definition dict. Training steps go through ``sagemaker.train.ModelTrainer.train()``
under a ``PipelineSession`` (so the CreateTrainingJob request is serialised by the SDK's
``sagemaker.core.shapes``), wrapped in ``sagemaker.mlops.workflow`` TrainingStep, ConditionStep
and FailStep, with ``Pipeline.definition()`` writing the JSON: the ``RunId`` parameter and the root
``NewRunOrResume`` condition on it, and each chain (``Train``, ``TrainWithoutProbe``, ``Resume``)
as one TrainingStep per segment with ``depends_on`` the one before. A new run is named by
``ExecutionVariables.PIPELINE_EXECUTION_ID``, a resume by the ``RunId`` parameter. Both definitions are then
normalised (below) and compared; a difference fails with one line per differing path.

Normalisation: only what is equal by the API's rules.

- Key order, and ``null`` for an absent member (the SDK writes ``PipelineExperimentConfig``
  and ``MlflowConfig`` as ``null``).
- Hyperparameter values are compared as the container reads them
  (``RunConfig.from_hyperparameters``): the SDK writes a string as it is and anything else as
  JSON; ours writes every value as JSON.

What the comparison proves is the rendering: member names and nesting, value types, pipeline
expressions (``Get``, ``Std:Join``, step properties), conditions, retry policies and the step
graph. The decisions (which members the probe gets, channels, the run's checkpoint prefix, the
warm pools) are restated here from the design (docs/runs.md), and the numbers come from
``tiered_training.planning.segments`` applied to the recipe and the plan's wall time (the segment count,
each job's runtime, spot wait and segment time limit), not from the Plan's copies of them. A
change of policy is made in both places, and
:func:`test_the_oracle_builds_every_training_step_of_ours` names a Training step the oracle lacks.

Each chain ends with its registration: the SDK's ``create_model_package_from_containers`` under the
PipelineSession (the request ``ModelBuilder.register()`` hands it) in a ``ModelStep``, after the last segment,
whose MetricDefinitions parse the final metrics the package records. The package carries no Tags: the SDK's
request has none, and the operators' access is scoped by the group's ARN, not by tag.

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

The same holds for the values only known at run time, ``run.id`` and ``run.data_uri``. Passed
as they are (``ExecutionVariables.PIPELINE_EXECUTION_ID``, the ``RunId`` parameter), the SDK
writes the bare expression, and the container reads the id it resolves to as JSON: a ``RunId``
such as ``2024`` (or an execution id such as ``3e1234567890``) becomes a number, and the
RunConfig refuses it (``run.id`` is a string), so the job fails before training. Ours wraps both
between double quotes (``Std:Join``), so each is a JSON string whatever it reads as. Ours is
right; the oracle builds the same with the SDK's ``Join``, and
:func:`test_the_comparison_catches_a_wrong_definition` shows the reader refusing the bare form.

After the probe, ``run.candidate`` is the Probe step's ``FinalMetricDataList['probe:best_candidate'].Value``
joined into a string (the SDK's ``Join`` over ``properties.FinalMetricDataList[...]``, what its ``to_string`` makes);
the value SageMaker renders is a float's text ("2.0"), which the container reads as candidate 2.

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
from pydantic import ValidationError
from support import RECIPES, recipe_dict, write_yaml

from tiered_training.contract import metrics
from tiered_training.contract.container import EXECUTION_VARIABLE, RUN_URI_VARIABLE
from tiered_training.contract.runconfig import TENSORBOARD_DIR, VALIDATION_CHANNEL, RunConfig
from tiered_training.pipeline import definition as d
from tiered_training.pipeline import validation
from tiered_training.planning import segments
from tiered_training.planning.planner import plan_file
from tiered_training.planning.probe import probe_seconds

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
    # A stated job runtime under the wall time: a spot run in segments, each with the stated wait.
    "variant-spot-wait": {"compute.spot": True, "compute.max_wait_hours": 30, "compute.max_runtime_hours": 4},
    # A small stated runtime quota (no max_runtime_hours): segments with warm pools between them.
    "variant-segments": {"compute.quotas": {segments.RUNTIME_QUOTA: 4 * 3600}},
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
            from sagemaker.core.model_registry import create_model_package_from_containers
            from sagemaker.core.network import NetworkConfig
            from sagemaker.core.processing import Processor
            from sagemaker.core.telemetry import telemetry_logging
            from sagemaker.core.training.configs import CheckpointConfig, Compute, Networking, TensorBoardOutputConfig
            from sagemaker.core.workflow import conditions, functions, parameters
            from sagemaker.core.workflow.execution_variables import ExecutionVariables
            from sagemaker.core.workflow.pipeline_context import PipelineSession
            from sagemaker.core.workflow.properties import PropertyFile
            from sagemaker.mlops.workflow import retry
            from sagemaker.mlops.workflow.condition_step import ConditionStep
            from sagemaker.mlops.workflow.fail_step import FailStep
            from sagemaker.mlops.workflow.model_step import ModelStep
            from sagemaker.mlops.workflow.pipeline import Pipeline
            from sagemaker.mlops.workflow.steps import ProcessingStep, TrainingStep
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
            TrainingStep=TrainingStep, ModelTrainer=ModelTrainer, ExecutionVariables=ExecutionVariables,
            session=session, Processor=Processor, ProcessingStep=ProcessingStep, PropertyFile=PropertyFile,
            NetworkConfig=NetworkConfig, ModelStep=ModelStep,
            create_model_package_from_containers=create_model_package_from_containers,
        )
        assert not attempts, f"the SDK tried to reach the network: {attempts}"


# -- the SDK's pipeline, from the same inputs ------------------------------------------------


@dataclass(frozen=True)
class TrainingSpec:
    """One Training step the plan runs: the probe, or segment ``number`` of ``count`` of a run's chain.

    ``resume``: the run is the one the RunId parameter names (else the execution's own, a new run).
    """

    name: str
    probe: bool = False
    resume: bool = False
    number: int = 1
    count: int = 1


def segment_plan(plan) -> segments.Segments:
    """How many jobs the run takes and how long each may run, from the recipe and the plan's wall time."""
    # The training's hours: the wall time less the probe's, which runs as its own job before them.
    return segments.plan_segments(plan.recipe, plan.estimates.wall_time_hours - plan.estimates.probe_hours)


def chain_specs(plan) -> dict[str, list[TrainingSpec]]:
    """Each chain's segments (``Train``, ``Train-2``...), in order: a new run's with and without the
    probe, and the resume of the run RunId names."""
    count = segment_plan(plan).count
    return {
        chain: [
            TrainingSpec(chain if number == 1 else f"{chain}-{number}", resume=chain == d.S_RESUME, number=number,
                         count=count)
            for number in range(1, count + 1)
        ]
        for chain in (d.S_TRAIN, d.S_TRAIN_WITHOUT_PROBE, d.S_RESUME)
    }


def training_specs(plan) -> list[TrainingSpec]:
    """The Training steps a plan declares (one spec per step)."""
    return [TrainingSpec(d.S_PROBE, probe=True), *(spec for chain in chain_specs(plan).values() for spec in chain)]


def sdk_parameters(sdk, plan) -> dict[str, Any]:
    p = sdk.parameters
    return {
        d.P_INSTANCE_COUNT: p.ParameterInteger(name=d.P_INSTANCE_COUNT, default_value=plan.nodes),
        d.P_MAX_STEPS: p.ParameterInteger(name=d.P_MAX_STEPS, default_value=plan.estimates.total_steps),
        d.P_DATA_URI: p.ParameterString(name=d.P_DATA_URI, default_value=plan.recipe.data.uri),
        d.P_SKIP_PROBE: p.ParameterBoolean(name=d.P_SKIP_PROBE, default_value=not plan.recipe.probe.enabled),
        d.P_RUN_ID: p.ParameterString(name=d.P_RUN_ID, default_value=d.NEW_RUN),
    }


def runconfig_values(plan) -> dict[str, Any]:
    """The RunConfig's fields, flat (``section.field``), as values: the SDK encodes them."""
    values: dict[str, Any] = {}
    for section, value in plan.run_config().model_dump(mode="json").items():
        if isinstance(value, dict):
            # data.mixture is optional: a run without a mixture has no key for it (RunConfig.to_hyperparameters)
            values.update(
                {f"{section}.{key}": leaf for key, leaf in value.items() if (section, key, leaf) != ("data", "mixture", None)}
            )
        elif (section, value) != ("dpo", None):  # dpo is optional too: only a preference run has the key
            values[section] = value
    return values


def prepared_data(sdk, plan, params):
    """What the training steps read: DataUri, or with data.prepare the Prepare step's property file."""
    if plan.recipe.data.prepare is None:
        return params[d.P_DATA_URI]
    prepared = sdk.PropertyFile(name=d.PREPARED_PROPERTY_FILE, output_name=d.PREPARE_OUTPUT, path=d.PREPARED_JSON)
    return sdk.functions.JsonGet(step_name=d.S_PREPARE, property_file=prepared, json_path=d.PREPARED_URI)


def sdk_prepare_step(sdk, plan, resources: d.PipelineResources, params):
    """The Prepare step (task sft with data.prepare): a Processor running the image's sft_prepare module on one
    CPU instance, its property file on the one output, as the SDK's documentation builds a ProcessingStep."""
    s = sdk.shapes
    recipe = plan.recipe
    prepare = recipe.data.prepare
    corpus = plan.corpus is not None  # data.sources: training.corpus_prepare on the plan's hosts
    processor = sdk.Processor(
        role=resources.prepare_role_arn or resources.role_arn,
        image_uri=resources.image_uri,
        instance_count=plan.corpus.prepare.instance_count if corpus else 1,
        instance_type=prepare.instance_type,
        entrypoint=["python", "-m", "training.corpus_prepare" if corpus else "training.sft_prepare"],
        volume_size_in_gb=prepare.volume_gb,
        output_kms_key=resources.kms_key_id,
        max_runtime_in_seconds=int(prepare.max_runtime_hours * 3600),
        sagemaker_session=sdk.session,
        env={"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"},
        tags=[s.Tag(key=k, value=v) for k, v in d.tags_for(plan, resources.extra_tags).items()],
        network_config=(
            sdk.NetworkConfig(subnets=list(resources.subnets), security_group_ids=list(resources.security_group_ids))
            if resources.subnets
            else None
        ),
    )
    local = "/opt/ml/processing/output/prepared"
    output = s.ProcessingOutput(
        output_name="prepared",
        s3_output=s.ProcessingS3Output(
            s3_uri=sdk.functions.Join(
                on="", values=[_join(resources.output_s3_uri, "prepare/"), sdk.ExecutionVariables.PIPELINE_EXECUTION_ID]
            ),
            local_path=local,
            s3_upload_mode="EndOfJob",
        ),
        app_managed=False,
    )
    if corpus:  # the spec's JSON in pieces of at most 256 characters (ContainerArguments' limit)
        spec = plan.corpus_spec().model_dump_json()
        pieces = d.spec_pieces(spec)
        arguments = ["--spec", *pieces, "--prepared", _join(resources.output_s3_uri, "prepared/"),
                     "--property-file", f"{local}/prepared.json"]
    else:
        arguments = _sft_prepare_arguments(params, recipe, resources, local)
    prepared = sdk.PropertyFile(name="PreparedData", output_name="prepared", path="prepared.json")
    return sdk.ProcessingStep(
        name="Prepare",
        step_args=processor.run(outputs=[output], arguments=arguments),
        property_files=[prepared],
        retry_policies=sdk_retry_policies(sdk),
    )


def _sft_prepare_arguments(params, recipe, resources, local):
    data = recipe.data
    arguments = [
        "--input", params[d.P_DATA_URI], "--tokenizer", recipe.model.init_checkpoint,
        "--prepared", _join(resources.output_s3_uri, "prepared/"), "--property-file", f"{local}/prepared.json",
        "--sequence-length", str(recipe.sequence_length), "--dtype", data.token_dtype,
        "--loss-on", data.loss_on or "assistant", "--overlong", data.overlong or "error",
        "--format", data.format or ("preference" if recipe.task == "dpo" else "auto"),
        "--on-bad-example", data.on_bad_example or "error",
    ]
    if data.max_bad_fraction is not None:
        arguments += ["--max-bad-fraction", f"{data.max_bad_fraction:g}"]
    for glob in data.ignore:
        arguments += ["--ignore", glob]
    return arguments


def run_id(sdk, params, spec: TrainingSpec):
    """A new run is named after the execution; a resume names its run in RunId."""
    return params[d.P_RUN_ID] if spec.resume else sdk.ExecutionVariables.PIPELINE_EXECUTION_ID


def quoted(sdk, expression):
    """A string expression as a JSON string literal, so that the container decodes it as a string
    whatever it reads as (see the module docstring)."""
    return sdk.functions.Join(on="", values=['"', expression, '"'])


def sdk_hyperparameters(sdk, plan, params, spec: TrainingSpec, candidate=None) -> dict[str, Any]:
    """The RunConfig as hyperparameters; the step count follows MaxSteps (a string, as the API wants),
    and the ``run.*`` keys name the run and the segment (the probe names the run it probes for, and
    is no segment: no time limit); after the probe, ``run.candidate`` is the one it chose."""
    return {
        **runconfig_values(plan),
        "batch.total_steps": params[d.P_MAX_STEPS].to_string(),
        "run.id": quoted(sdk, run_id(sdk, params, spec)),
        "run.resume": spec.resume,
        "run.data_uri": quoted(sdk, prepared_data(sdk, plan, params)),
        "run.segment": spec.number,
        "run.segments": spec.count,
        "run.segment_seconds": 0.0 if spec.probe else segment_plan(plan).segment_seconds(),
        **({"run.candidate": candidate} if candidate is not None else {}),
    }


def _channel(sdk, name: str, uri: Any, mode: str):
    s = sdk.shapes
    source = s.S3DataSource(s3_data_type="S3Prefix", s3_uri=uri, s3_data_distribution_type="FullyReplicated")
    return s.Channel(channel_name=name, data_source=s.DataSource(s3_data_source=source), input_mode=mode)


def _join(prefix: str, leaf: str) -> str:
    return prefix.rstrip("/") + "/" + leaf


def stopping(plan, spec: TrainingSpec) -> tuple[int, int | None, int | None]:
    """MaxRuntimeInSeconds, MaxWaitTimeInSeconds (spot only) and the warm pool's keep-alive of a job."""
    recipe = plan.recipe
    if spec.probe:
        runtime = segments.probe_runtime_seconds(recipe, probe_seconds(plan))
        wait = runtime + segments.PROBE_SPOT_WAIT_SECONDS
    else:
        runtime = segments.job_runtime_seconds(recipe)
        wait = segments.spot_wait_seconds(recipe, runtime)
    spot = recipe.compute.spot
    # A job that another follows keeps its instances; one that follows another (Train after the Probe, a later
    # segment) asks for a warm pool too, or SageMaker does not match it; warm pools do not work with spot.
    followed = spec.probe or spec.number < spec.count
    follows = spec.number > 1 or spec.name == d.S_TRAIN
    keep = d.WARM_POOL_SECONDS if followed else d.LAST_WARM_POOL_SECONDS if follows else None
    return runtime, max(runtime, wait) if spot else None, None if spot else keep


def sdk_training_step(
    sdk, plan, resources: d.PipelineResources, params, spec: TrainingSpec, depends_on=None, candidate=None
):
    """One TrainingStep, through ModelTrainer.train() as the SDK's documentation builds one; ``candidate``: the
    expression of the probe candidate it trains (after the probe)."""
    s = sdk.shapes
    recipe, compute = plan.recipe, plan.recipe.compute
    probe = spec.probe

    channels = [_channel(sdk, d.TRAIN_CHANNEL, prepared_data(sdk, plan, params), recipe.data.input_mode)]
    if recipe.model.init_checkpoint:
        channels.append(_channel(sdk, d.MODEL_CHANNEL, recipe.model.init_checkpoint, "File"))
    if recipe.data.validation_uri and not probe:
        channels.append(_channel(sdk, VALIDATION_CHANNEL, recipe.data.validation_uri, recipe.data.input_mode))
    elif recipe.data.sources and recipe.data.validation_fraction > 0 and not probe:  # each source's held-out share
        prepared = sdk.PropertyFile(name=d.PREPARED_PROPERTY_FILE, output_name=d.PREPARE_OUTPUT, path=d.PREPARED_JSON)
        held_out = sdk.functions.JsonGet(step_name=d.S_PREPARE, property_file=prepared, json_path="validation_uri")
        channels.append(_channel(sdk, VALIDATION_CHANNEL, held_out, recipe.data.input_mode))

    runtime, wait, keep_alive = stopping(plan, spec)
    environment = {**d.family_environment(plan), d.MODE_VARIABLE: "probe" if probe else "train"}
    # Each run keeps its checkpoints under a prefix of its own: <checkpoint prefix>runs/<run id>/.
    checkpoints = sdk.functions.Join(on="", values=[_join(resources.checkpoint_s3_uri, "runs/"), run_id(sdk, params, spec), "/"])
    if not probe:  # the launcher takes the run's lease in its prefix, naming the execution
        environment[RUN_URI_VARIABLE] = checkpoints
        environment[EXECUTION_VARIABLE] = sdk.ExecutionVariables.PIPELINE_EXECUTION_ARN

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
            keep_alive_period_in_seconds=keep_alive,
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
        checkpoint_config=None if probe else sdk.CheckpointConfig(s3_uri=checkpoints, local_path=d.CHECKPOINT_LOCAL_PATH),
        environment=environment,
        hyperparameters=sdk_hyperparameters(sdk, plan, params, spec, candidate),
        tags=[s.Tag(key=k, value=v) for k, v in d.tags_for(plan, resources.extra_tags).items()],
    )
    if probe:
        trainer = trainer.with_metric_definitions(
            [
                s.MetricDefinition(name=name, regex=regex)
                for name, (_fmt, regex) in metrics.probe_metric_definitions(len(plan.candidates)).items()
            ]
        )
    else:
        if spec.number == spec.count and recipe.registry.enabled:  # the run's final metrics, for the package
            trainer = trainer.with_metric_definitions(
                [
                    s.MetricDefinition(name=name, regex=metrics.final_metric_regex(name))
                    for name in metrics.final_metric_names(recipe.task)
                ]
            )
        trainer = trainer.with_retry_strategy(s.RetryStrategy(maximum_retry_attempts=d.JOB_RETRY_ATTEMPTS))
        if recipe.tracking.tensorboard:
            trainer = trainer.with_tensorboard_output_config(
                sdk.TensorBoardOutputConfig(
                    s3_output_path=_join(resources.output_s3_uri, "tensorboard"), local_path=TENSORBOARD_DIR
                )
            )
    return sdk.TrainingStep(
        name=spec.name, step_args=trainer.train(), retry_policies=sdk_retry_policies(sdk), depends_on=depends_on
    )


def sdk_chain(sdk, plan, resources: d.PipelineResources, params, specs: list[TrainingSpec], candidate=None) -> list:
    """A run's segments, each after the one before (``depends_on`` the previous TrainingStep)."""
    steps: list = []
    for spec in specs:
        steps.append(
            sdk_training_step(sdk, plan, resources, params, spec, depends_on=steps[-1:] or None, candidate=candidate)
        )
    return steps


REGISTER_NAMES = {d.S_TRAIN: "Register", d.S_TRAIN_WITHOUT_PROBE: "RegisterWithoutProbe", d.S_RESUME: "RegisterResume"}


def sdk_register_step(sdk, plan, resources: d.PipelineResources, params, chain: list, spec: TrainingSpec):
    """The chain's registration: a versioned model package in the recipe's group, as the SDK's
    ``create_model_package_from_containers`` writes the CreateModelPackage request under a PipelineSession, in a
    ``ModelStep`` after the chain's last segment. The export is the last segment's model artefact, the evaluation
    the run's ``evaluation.json`` at the top of its checkpoint prefix, and the metrics its FinalMetricDataList."""
    from tiered_training.catalog.images import serving_image_uri

    recipe, run_config = plan.recipe, plan.run_config()
    f = sdk.functions
    last = chain[-1]
    export = last.properties.ModelArtifacts.S3ModelArtifacts
    run = run_id(sdk, params, spec)
    evaluation = f.Join(on="", values=[_join(resources.checkpoint_s3_uri, "runs/"), run, "/evaluation.json"])
    metadata = {
        "recipe": plan.name,
        "task": recipe.task,
        "plan_hash": run_config.plan_hash(),
        "run_id": f.Join(on="", values=[run]),
        "export_uri": export,
        "export_format": recipe.export.format,
        "evaluation_uri": evaluation,
        "data_uri": f.Join(on="", values=[prepared_data(sdk, plan, params)]),
    }
    if recipe.data.prepare is not None:
        prepared = sdk.PropertyFile(name=d.PREPARED_PROPERTY_FILE, output_name=d.PREPARE_OUTPUT, path=d.PREPARED_JSON)
        key = sdk.functions.JsonGet(step_name=d.S_PREPARE, property_file=prepared, json_path="key")
        metadata["data_key"] = f.Join(on="", values=[key])
    for name in metrics.final_metric_names(recipe.task):
        metadata[name] = f.Join(on="", values=[last.properties.FinalMetricDataList[name].Value])
    image = recipe.registry.serving_image or resources.serving_image_uri or serving_image_uri(recipe.compute.region or REGION)
    model = SimpleNamespace(sagemaker_session=sdk.session)
    sdk.session.init_model_step_arguments(model)
    step_args = sdk.create_model_package_from_containers(
        sdk.session,
        containers=[{"Image": image, "ModelDataUrl": export,
                     "Environment": {"HF_MODEL_ID": "/opt/ml/model", "OPTION_ROLLING_BATCH": "vllm"}}],
        content_types=["application/json"],
        response_types=["application/json"],
        model_package_group_name=plan.name,
        model_metrics={"ModelQuality": {"Statistics": {"ContentType": "application/json", "S3Uri": evaluation}}},
        approval_status=recipe.registry.approval,
        description=f"{plan.name}: {recipe.task} of {recipe.model.name or recipe.model.catalog or 'the model'}, "
        f"plan {run_config.plan_hash()}",
        customer_metadata_properties=metadata,
    )
    sdk.session.context = None
    return sdk.ModelStep(name=REGISTER_NAMES[chain[0].name], step_args=step_args, depends_on=[last])


def sdk_retry_policies(sdk) -> list:
    r = sdk.retry
    job = {e.value: e for e in r.SageMakerJobExceptionTypeEnum}
    step = {e.value: e for e in r.StepExceptionTypeEnum}
    policies = []
    for policy, kind, enum in (
        (d.CAPACITY_RETRY, r.SageMakerJobStepRetryPolicy, job),
        (d.RESOURCE_LIMIT_RETRY, r.SageMakerJobStepRetryPolicy, job),
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
    """The whole pipeline, built by the SDK: parameters, the run condition, training chains, gate and fail steps."""
    plan.require_ok()
    params = sdk_parameters(sdk, plan)
    probe = sdk_training_step(sdk, plan, resources, params, TrainingSpec(d.S_PROBE, probe=True))

    def metric(name: str):
        return probe.properties.FinalMetricDataList[name].Value

    # After the probe, every segment trains the candidate it chose: its metric value rendered as a string.
    chosen = sdk.functions.Join(on="", values=[metric("probe:best_candidate")])
    chains = {
        name: sdk_chain(sdk, plan, resources, params, specs, candidate=chosen if name == d.S_TRAIN else None)
        for name, specs in chain_specs(plan).items()
    }
    if plan.recipe.registry.enabled:  # each chain ends with its registration
        for name, specs in chain_specs(plan).items():
            chains[name].append(sdk_register_step(sdk, plan, resources, params, chains[name], specs[-1]))

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
        name=d.S_GATE, conditions=[throughput_ok, memory_ok], if_steps=chains[d.S_TRAIN], else_steps=[reason]
    )
    probe_or_skip = sdk.ConditionStep(
        name=d.S_PROBE_OR_SKIP,
        conditions=[c.ConditionEquals(left=params[d.P_SKIP_PROBE], right=True)],
        if_steps=chains[d.S_TRAIN_WITHOUT_PROBE],
        else_steps=[probe, gate],
    )
    prepare = [sdk_prepare_step(sdk, plan, resources, params)] if plan.recipe.data.prepare is not None else []
    root = sdk.ConditionStep(
        name=d.S_NEW_OR_RESUME,
        conditions=[c.ConditionEquals(left=params[d.P_RUN_ID], right=d.NEW_RUN)],
        if_steps=[probe_or_skip],
        else_steps=chains[d.S_RESUME],
        depends_on=prepare or None,
    )
    pipeline = sdk.Pipeline(
        name=plan.name,
        parameters=list(params.values()),
        steps=[*prepare, root],
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
    # RunConfig.from_hyperparameters is the container's reader; it must accept the lot, with each
    # expression standing for what it renders: a JSON string literal when it is quoted, else a number.
    rendered = {k: '"x"' if _quoted(v) else "1" for k, v in hp.items() if k not in plain}
    unreadable: dict[str, str] = {}
    try:
        RunConfig.from_hyperparameters({**plain, **rendered})
    except ValidationError as error:  # reported as a difference at the key
        unreadable = {".".join(map(str, e["loc"])): f"the container cannot read it: {e['msg']}" for e in error.errors()}
    decoded = {k: (json.loads(v) if _is_json(v) else v) if isinstance(v, str) else v for k, v in hp.items()}
    return {**decoded, **unreadable}


def _quoted(expression: Any) -> bool:
    """A ``Std:Join`` that renders its values between double quotes."""
    values = expression.get("Std:Join", {}).get("Values", []) if isinstance(expression, dict) else []
    return len(values) >= 2 and values[0] == '"' and values[-1] == '"'


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
        lines = [f"validate_definition rejects the SDK's: {problem}" for problem in validation.validate_definition(theirs)]
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


def test_the_variants_reach_the_branches_no_template_takes(pairs, plans):
    _ours, theirs = pairs["variant-plan-validation"]
    train = d.find_step(theirs, d.S_TRAIN)["Arguments"]
    assert train["ResourceConfig"]["TrainingPlanArn"] == TRAINING_PLAN
    assert [c["ChannelName"] for c in train["InputDataConfig"]] == [d.TRAIN_CHANNEL, VALIDATION_CHANNEL]
    assert "TensorBoardOutputConfig" not in train
    assert train["VpcConfig"]["Subnets"] == list(RESOURCES.subnets)

    # Spot in segments: every segment has the stated runtime and wait, and none a warm pool.
    _ours, theirs = pairs["variant-spot-wait"]
    count = plans["variant-spot-wait"].segments
    assert count >= 2
    for name in [d.S_TRAIN] + [f"{d.S_TRAIN}-{n}" for n in range(2, count + 1)]:
        args = d.find_step(theirs, name)["Arguments"]
        assert args["EnableManagedSpotTraining"] is True
        assert args["StoppingCondition"] == {"MaxRuntimeInSeconds": 4 * 3600, "MaxWaitTimeInSeconds": 30 * 3600}
        assert "KeepAlivePeriodInSeconds" not in args["ResourceConfig"]
    probe = d.find_step(theirs, d.S_PROBE)["Arguments"]
    assert probe["StoppingCondition"] == {"MaxRuntimeInSeconds": 2 * 3600, "MaxWaitTimeInSeconds": 3 * 3600}
    assert "KeepAlivePeriodInSeconds" not in probe["ResourceConfig"]

    # Segments under a stated runtime quota: chains with DependsOn, warm pools on all but the last.
    _ours, theirs = pairs["variant-segments"]
    count = plans["variant-segments"].segments
    assert count >= 2
    for chain in (d.S_TRAIN, d.S_TRAIN_WITHOUT_PROBE, d.S_RESUME):
        names = [chain] + [f"{chain}-{n}" for n in range(2, count + 1)]
        steps = [d.find_step(theirs, name) for name in names]
        assert [step.get("DependsOn") for step in steps] == [None] + [[name] for name in names[:-1]]
        keep = [step["Arguments"]["ResourceConfig"].get("KeepAlivePeriodInSeconds") for step in steps]
        assert keep == [d.WARM_POOL_SECONDS] * (count - 1) + [d.LAST_WARM_POOL_SECONDS]
        assert {step["Arguments"]["StoppingCondition"]["MaxRuntimeInSeconds"] for step in steps} == {4 * 3600}
        run = {"Get": f"Parameters.{d.P_RUN_ID}"} if chain == d.S_RESUME else {"Get": "Execution.PipelineExecutionId"}
        assert steps[-1]["Arguments"]["CheckpointConfig"]["S3Uri"]["Std:Join"]["Values"][1] == run
    root = theirs["Steps"][0]
    assert root["Name"] == d.S_NEW_OR_RESUME
    assert root["Arguments"]["Conditions"] == [
        {"Type": "Equals", "LeftValue": {"Get": f"Parameters.{d.P_RUN_ID}"}, "RightValue": d.NEW_RUN}
    ]


def test_no_runconfig_string_reads_as_json(plans):
    """The one place the SDK's encoding is weaker than ours: a bare string that parses as JSON
    changes type in the container. None of ours does, so the SDK's form decodes the same."""
    for name, plan in plans.items():
        for key, value in runconfig_values(plan).items():
            if isinstance(value, str):
                assert not _is_json(value), f"{name}: {key}={value!r}"


@pytest.mark.parametrize(
    "recipe, step, mutate, expected",
    [
        ("llama3-8b-fp8", d.S_TRAIN, lambda step: step["Arguments"]["ResourceConfig"].update(VolumeSizeInGb=200),
         "VolumeSizeInGb: only ours"),
        ("llama3-8b-fp8", d.S_TRAIN, lambda step: step["Arguments"]["StoppingCondition"].update(MaxRuntimeInSeconds=1),
         "MaxRuntimeInSeconds: ours 1"),
        (
            "llama3-8b-fp8", d.S_TRAIN,
            lambda step: step["Arguments"]["HyperParameters"].update({"batch.total_steps": {"Get": "Parameters.MaxSteps"}}),
            "batch.total_steps",
        ),
        ("llama3-8b-fp8", d.S_TRAIN, lambda step: step["RetryPolicies"].pop(), "RetryPolicies: 2 items in ours, 3"),
        ("variant-segments", "Train-2", lambda step: step.pop("DependsOn"), "[Train-2].DependsOn: only the SDK"),
        ("variant-segments", "Resume-2", lambda step: step.update(DependsOn=["Train"]), "[Resume-2].DependsOn[0]: ours \"Train\""),
        ("variant-segments", "Train", lambda step: step["Arguments"]["ResourceConfig"].pop("KeepAlivePeriodInSeconds"),
         "KeepAlivePeriodInSeconds: only the SDK"),
        ("llama3-8b-fp8", d.S_TRAIN, lambda step: step["Arguments"]["ResourceConfig"].pop("KeepAlivePeriodInSeconds"),
         "KeepAlivePeriodInSeconds: only the SDK"),
        (
            "variant-segments", "Resume",
            lambda step: step["Arguments"]["HyperParameters"].update({"run.id": d.json_string(d.EXECUTION_ID)}),
            "run.id.Std:Join.Values[1].Get: ours \"Execution.PipelineExecutionId\"",
        ),
        (
            "variant-segments", "Resume",
            lambda step: step["Arguments"]["HyperParameters"].update({"run.id": d.param(d.P_RUN_ID)}),
            "run.id: ours \"the container cannot read it",
        ),
        ("variant-segments", "TrainWithoutProbe-2",
         lambda step: step["Arguments"]["HyperParameters"].update({"run.segment": "1"}), "run.segment: ours 1"),
    ],
    ids=["misspelt-member", "wrong-value", "integer-where-a-string-goes", "missing-retry-policy", "missing-depends-on",
         "wrong-depends-on", "missing-warm-pool", "train-after-probe-without-keep-alive", "resume-of-a-new-run",
         "unquoted-run-id", "wrong-segment-number"],
)
def test_the_comparison_catches_a_wrong_definition(pairs, recipe: str, step: str, mutate: Callable, expected: str):
    ours, theirs = pairs[recipe]
    broken = json.loads(json.dumps(ours))
    mutate(d.find_step(broken, step))
    lines = differences(normalise(broken), normalise(theirs))
    assert any(expected in line and step in line for line in lines), lines
