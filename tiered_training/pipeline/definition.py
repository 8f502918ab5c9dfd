"""The SageMaker pipeline definition of a Plan, as a plain dict (no aws_cdk here).

:func:`build_definition` is a pure function from a Plan (plus the names of the
resources it runs on) to the pipeline-definition JSON that
``AWS::SageMaker::Pipeline`` takes as ``PipelineDefinitionBody``. The constructs
embed it with ``Stack.to_json_string``; tests check it without CDK.

Shape of every pipeline (schema version 2020-12-01)::

    Parameters: InstanceCount, MaxSteps, DataUri, SkipProbe, RunId
    NewRunOrResume (Condition: RunId == "new")
      if:   ProbeOrSkip (Condition: SkipProbe == true); the run id is the execution id
              if:   TrainWithoutProbe, TrainWithoutProbe-2 ... (one Training step per segment)
              else: Probe (Training, TIERED_TRAINING_MODE=probe: each of the plan's K candidates in its own
                          launch; MetricDefinitions from probe_metric_definitions(K))
                    Gate  (Condition: the chosen candidate's tokens/s per GPU >= fraction x plan AND its peak
                           reserved memory <= headroom)
                      if:   Train, Train-2 ... (one Training step per segment, each with run.candidate = the
                            Probe's probe:best_candidate)
                      else: GateReason (Condition: memory check alone)
                              if:   FailThroughput (Fail)
                              else: FailMemory (Fail; also when no candidate fits at all)
      else: Resume, Resume-2 ... (the run named by RunId, from its checkpoints; no probe)

The probe measures the plan's candidates (``Plan.candidates``: the plan's own configuration first, then the
next fastest that fit) and names the fastest measured one under the memory limit in ``probe:best_candidate``;
the Train chain's ``run.candidate`` hyperparameter is that metric, rendered as a string, so the container runs
that candidate (``RunConfig.with_candidate``). TrainWithoutProbe and Resume keep ``run.candidate`` 0: the
candidate the run's checkpoints record, else the plan's own.

``SkipProbe`` defaults to ``not recipe.probe.enabled``, so every pipeline has the
same parameters and steps, and a probe can still be forced (or skipped) per
execution. Both Fail messages name the failed check and give the measured value
next to the limit (``Std:Join``), so "by how much" is in the execution's failure
reason.

Runs (docs/runs.md): every execution starts a new run unless ``RunId`` names one to resume.
A run's checkpoints live under ``<checkpoint prefix>runs/<run id>/``; the run id, whether the
execution resumes, and the data URI travel in the ``run.*`` hyperparameters, and the launcher
refuses a resume whose checkpoint does not match the run before any compute.

Segments (tiered_training/planning/segments.py): a run longer than one training job may run is a chain of
Training steps, each with ``DependsOn`` its predecessor, ``run.segment`` and ``run.segments`` in its
hyperparameters, and the same checkpoint prefix; each trains its share of the steps and saves.

Warm pools: without managed spot (which warm pools do not support), a job that another one
follows keeps its instances for :data:`WARM_POOL_SECONDS` after it ends
(``ResourceConfig.KeepAlivePeriodInSeconds``): the Probe, and every segment but the last. The
next job asks for the same role, instance type and count, volume and network settings, and sets
a ``KeepAlivePeriodInSeconds`` of its own (the matching criteria of SageMaker managed warm
pools), so it starts on those instances instead of queueing again for capacity. A job that
follows another but that nothing follows (Train after the Probe, a run's last segment) asks for
:data:`LAST_WARM_POOL_SECONDS` only. The account's warm-pool quota (per instance type, 0 by
default) must allow it; a pool idles, billed, for its keep-alive when nothing takes it (a failed
gate, the run's end).

``tiered_training.pipeline.validation`` checks what SageMaker would reject at execution time:
step and parameter names, references to unknown parameters or steps, each
Training step's arguments against botocore's CreateTrainingJob input shape (with
pipeline expressions replaced by typed placeholders), SageMaker's limits on
hyperparameters, environment and metric definitions, and the body size.

``tests/pipeline/test_sdk_oracle.py`` builds the same pipeline with the SageMaker Python SDK v3 from the
same inputs and compares the two; its docstring lists the differences and which side is right.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tiered_training.catalog import environment
from tiered_training.contract import metrics
from tiered_training.contract.container import (
    CHECKPOINT_LOCAL_PATH,
    EVALUATION_FILE,
    EXECUTION_VARIABLE,
    MODE_VARIABLE,
    MODEL_CHANNEL,
    RUN_URI_VARIABLE,
    TENSORBOARD_DIR,
    TRAIN_CHANNEL,
    VALIDATION_CHANNEL,
)
from tiered_training.planning.probe import probe_seconds
from tiered_training.planning.segments import (
    JOB_RETRY_ATTEMPTS,
    LAST_WARM_POOL_SECONDS,
    PROBE_RUNTIME_SECONDS,
    PROBE_SPOT_WAIT_SECONDS,
    WARM_POOL_SECONDS,
    probe_runtime_seconds,
)

if TYPE_CHECKING:
    from tiered_training.planning.plan import Plan

SCHEMA_VERSION = "2020-12-01"
MAX_BODY_CHARS = 1_048_576
STEP_NAME_PATTERN = r"^[A-Za-z0-9\-_]{1,64}$"
PARAMETER_NAME_PATTERN = r"^[A-Za-z0-9\-_]{1,64}$"
MAX_ENVIRONMENT = 100
MAX_METRIC_DEFINITIONS = 40

# The container contract (training/launcher.py): the run mode travels in the environment.

# Parameter names: stable, they are the pipeline's public interface.
P_INSTANCE_COUNT = "InstanceCount"
P_MAX_STEPS = "MaxSteps"
P_DATA_URI = "DataUri"
P_SKIP_PROBE = "SkipProbe"
P_RUN_ID = "RunId"
PARAMETERS = (P_INSTANCE_COUNT, P_MAX_STEPS, P_DATA_URI, P_SKIP_PROBE, P_RUN_ID)
NEW_RUN = "new"  # RunId's default: start a new run, named after the execution
EXECUTION_ID = {"Get": "Execution.PipelineExecutionId"}
# The SageMaker SDK's ExecutionVariables (sagemaker.workflow.execution_variables).
EXECUTION_VARIABLES = (
    "StartDateTime",
    "CurrentDateTime",
    "PipelineName",
    "PipelineArn",
    "PipelineExecutionId",
    "PipelineExecutionArn",
)  # the SageMaker SDK's ExecutionVariables.PIPELINE_EXECUTION_ID

# Step names: stable, they appear in job names, metrics and EventBridge events.
S_NEW_OR_RESUME = "NewRunOrResume"
S_PROBE_OR_SKIP = "ProbeOrSkip"
S_PROBE = "Probe"
S_GATE = "Gate"
S_GATE_REASON = "GateReason"
S_TRAIN = "Train"
S_TRAIN_WITHOUT_PROBE = "TrainWithoutProbe"
S_FAIL_THROUGHPUT = "FailThroughput"
S_FAIL_MEMORY = "FailMemory"
S_RESUME = "Resume"
S_PREPARE = "Prepare"
# Each chain's last segment is followed by its Register step (a model package in the recipe's group).
S_REGISTER = "Register"
REGISTER_STEPS = {S_TRAIN: S_REGISTER, S_TRAIN_WITHOUT_PROBE: "RegisterWithoutProbe", S_RESUME: "RegisterResume"}
TRAIN_CHAINS = (S_TRAIN, S_TRAIN_WITHOUT_PROBE, S_RESUME)  # each a chain of segments
TRAINING_STEPS = (S_PROBE, S_TRAIN, S_TRAIN_WITHOUT_PROBE, S_RESUME)

# The Prepare step (task sft with data.prepare): a Processing job that packs the raw examples under DataUri
# (training/sft_prepare.py) and names the prepared shards in a property file the training steps read.
PREPARE_MODULE = "training.sft_prepare"
PREPARE_OUTPUT = "prepared"  # the ProcessingOutput that holds the property file
PREPARE_LOCAL_PATH = "/opt/ml/processing/output/prepared"
PREPARED_PROPERTY_FILE = "PreparedData"
PREPARED_JSON = "prepared.json"  # {"key", "uri", "reused"}
PREPARED_URI = "uri"
PREPARED_VALIDATION_URI = "validation_uri"  # data.sources: the held-out shards (prepared.json)
# data.sources: the Prepare step runs training.corpus_prepare with the CorpusSpec as JSON after --spec. SageMaker
# takes at most 100 ContainerArguments of 256 characters each (botocore's AppSpecification), and one spec is
# longer: it travels as consecutive arguments of at most 256 characters that the module joins.
CORPUS_PREPARE_MODULE = "training.corpus_prepare"
MAX_ARGUMENTS, MAX_ARGUMENT_CHARS = 100, 256

PROBE_TOKENS = metrics.PROBE_TOKENS
PROBE_MEMORY = metrics.PROBE_MEMORY
PROBE_CANDIDATE = metrics.PROBE_BEST_CANDIDATE

# Retry: capacity and internal errors are worth retrying (the job resumes from the
# checkpoint store); a bug in the recipe or the image is not.
CAPACITY_RETRY = {
    "ExceptionType": ["SageMaker.CAPACITY_ERROR", "SageMaker.JOB_INTERNAL_ERROR"],
    "IntervalSeconds": 300,
    "BackoffRate": 2.0,
    "MaxAttempts": 5,
}
# A job refused for an account limit (SageMaker.RESOURCE_LIMIT: the instances or warm pools that the
# quota allows are all in use, e.g. by another execution's job) waits for them to free up: tried again
# after 30 minutes, then after twice as long each time; the step fails after at most 7.5 hours of waiting.
RESOURCE_LIMIT_RETRY = {
    "ExceptionType": ["SageMaker.RESOURCE_LIMIT"],
    "IntervalSeconds": 1800,
    "BackoffRate": 2.0,
    "MaxAttempts": 4,
}
SERVICE_RETRY = {
    "ExceptionType": ["Step.SERVICE_FAULT", "Step.THROTTLING"],
    "IntervalSeconds": 30,
    "BackoffRate": 2.0,
    "MaxAttempts": 5,
}
VOLUME_SIZE_GB = 200  # P4/P5/P6 use their NVMe instance store; the EBS volume holds the image and logs
PROBE_MAX_RUNTIME_SECONDS = PROBE_RUNTIME_SECONDS


@dataclass(frozen=True)
class PipelineResources:
    """Where a pipeline runs. Values may be CDK tokens (plain strings here).

    - ``role_arn``: the SageMaker execution role the training jobs assume.
    - ``image_uri``: the training image (its entry point is ``training/launcher.py``).
    - ``checkpoint_s3_uri``: this recipe's checkpoint prefix (all hosts share it).
    - ``output_s3_uri``: this recipe's output prefix (model artefacts, probe output).
    - ``prepare_role_arn``: the Prepare job's role (task sft with ``data.prepare``); default ``role_arn``.
    - ``kms_key_id``: key for the job's output; default none (the bucket's default encryption).
    - ``subnets`` / ``security_group_ids``: optional VPC for the jobs.
    - ``extra_tags``: tags on every training job, after the recipe's own.
    - ``model_package_group``: the model package group the Register steps add to; default the recipe's name.
    - ``serving_image_uri``: the inference image of the packages when the recipe names none (the constructs pass
      the stack region's LMI image); default the catalogue's for ``compute.region`` (us-east-1 without one).
    """

    role_arn: str
    image_uri: str
    checkpoint_s3_uri: str
    output_s3_uri: str
    prepare_role_arn: str | None = None  # the Prepare job's role; default role_arn
    kms_key_id: str | None = None
    subnets: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    extra_tags: dict[str, str] = field(default_factory=dict)
    model_package_group: str | None = None  # the recipe's model package group; default: the recipe's name
    serving_image_uri: str | None = None  # default: registry.serving_image, else the catalogue's for compute.region


def get(path: str) -> dict[str, str]:
    return {"Get": path}


def param(name: str) -> dict[str, str]:
    return get(f"Parameters.{name}")


def as_string(expression: Any) -> dict[str, Any]:
    """A pipeline expression rendered as a string (what the SageMaker SDK's ``to_string`` does)."""
    return {"Std:Join": {"On": "", "Values": [expression]}}


def probe_metric(name: str) -> dict[str, str]:
    return get(f"Steps.{S_PROBE}.FinalMetricDataList['{name}'].Value")


def recipe_tag_key() -> str:
    return "tiered-training:recipe"


def tags_for(plan: Plan, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Tags on the pipeline and its training jobs: the recipe's, plus one that names the recipe."""
    return {**plan.recipe.tags, **(extra or {}), recipe_tag_key(): plan.name}


def family_environment(plan: Plan) -> dict[str, str]:
    """EFA and NCCL settings for the instance family (tiered_training.catalog.environment, which the launcher
    also reads).

    The launcher sets the same values itself; writing them into the job's Environment
    makes them visible in the pipeline definition and in DescribeTrainingJob.
    """
    env = environment.family_environment(plan.instance.name)
    return {k: v for k, v in sorted(env.items()) if k not in environment.HOST_SPECIFIC}


# -- the definition ------------------------------------------------------------------------


def parameters(plan: Plan) -> list[dict[str, Any]]:
    assert plan.estimates is not None
    return [
        {"Name": P_INSTANCE_COUNT, "Type": "Integer", "DefaultValue": plan.nodes},
        {"Name": P_MAX_STEPS, "Type": "Integer", "DefaultValue": plan.estimates.total_steps},
        {"Name": P_DATA_URI, "Type": "String", "DefaultValue": plan.recipe.data.uri},
        {"Name": P_SKIP_PROBE, "Type": "Boolean", "DefaultValue": not plan.recipe.probe.enabled},
        {"Name": P_RUN_ID, "Type": "String", "DefaultValue": NEW_RUN},
    ]


def prepared_data_uri(path: str = PREPARED_URI) -> dict[str, Any]:
    """The packed shards the Prepare step made or reused: its property file's ``uri`` (or ``validation_uri``)."""
    return {
        "Std:JsonGet": {
            "PropertyFile": get(f"Steps.{S_PREPARE}.PropertyFiles.{PREPARED_PROPERTY_FILE}"),
            "Path": path,
        }
    }


def training_data_uri(plan: Plan) -> Any:
    """What the training steps read: the DataUri parameter, or with ``data.prepare`` the Prepare step's shards."""
    return prepared_data_uri() if plan.recipe.data.prepare is not None else param(P_DATA_URI)


def prepared_s3_uri(resources: PipelineResources) -> str:
    """Where Prepare keeps packed shards, one prefix per content key: ``<output prefix>/prepared/``."""
    return _join_uri(resources.output_s3_uri, "prepared/")


def json_string(expression: Any) -> dict[str, Any]:
    """A pipeline expression as a JSON string literal (a hyperparameter value the RunConfig decodes)."""
    return {"Std:Join": {"On": "", "Values": ['"', expression, '"']}}


@dataclass(frozen=True)
class Segment:
    """One Training step of a run's chain: which run (an expression), whether it resumes, which segment."""

    run_id: Any
    resume: bool
    number: int = 1
    count: int = 1
    seconds: float = 0.0
    after_probe: bool = False  # the chain starts after the Probe (Train), whose warm pool its first segment takes
    candidate: Any = None  # run.candidate: the Probe's choice (an expression) after the Probe; None: the default 0

    @property
    def follows_a_job(self) -> bool:
        return self.number > 1 or self.after_probe


def hyperparameters(plan: Plan, segment: Segment | None = None) -> dict[str, Any]:
    """The RunConfig as hyperparameters; ``batch.total_steps`` follows the MaxSteps parameter, and the
    ``run.*`` keys name the run and the segment (the probe's are the defaults: no run)."""
    hp: dict[str, Any] = dict(plan.run_config().to_hyperparameters())
    # json.dumps(int) is the bare number, so the parameter's string form decodes the same way.
    hp["batch.total_steps"] = as_string(param(P_MAX_STEPS))
    if segment is not None:
        hp["run.id"] = json_string(segment.run_id)
        hp["run.resume"] = json.dumps(segment.resume)
        hp["run.data_uri"] = json_string(training_data_uri(plan))
        hp["run.segment"] = json.dumps(segment.number)
        hp["run.segments"] = json.dumps(segment.count)
        hp["run.segment_seconds"] = json.dumps(segment.seconds)
        if segment.candidate is not None:
            hp["run.candidate"] = as_string(segment.candidate)
    return hp


def run_checkpoint_uri(resources: PipelineResources, run_id: Any) -> dict[str, Any]:
    """The run's own checkpoint prefix: ``<recipe's checkpoint prefix>runs/<run id>/``."""
    return {"Std:Join": {"On": "", "Values": [resources.checkpoint_s3_uri.rstrip("/") + "/runs/", run_id, "/"]}}


def probe_threshold(plan: Plan) -> float:
    """Tokens/s per GPU the probe must reach: the recipe's fraction of the plan."""
    assert plan.estimates is not None
    return round(plan.recipe.probe.min_throughput_fraction * plan.estimates.tokens_per_second_per_gpu, 2)


def candidate_count(plan: Plan) -> int:
    """Candidates the probe measures (the RunConfig's ``probe.count``)."""
    return max(1, len(plan.candidates))


def probe_job_seconds(plan: Plan) -> int:
    """MaxRuntimeInSeconds of the Probe job: the probe's limit, or the estimate of its K launches where that
    is longer (``planning.probe.probe_seconds``), within the account's job runtime."""
    return probe_runtime_seconds(plan.recipe, probe_seconds(plan))


def memory_limit(plan: Plan) -> float:
    """Peak memory fraction (0-1) the probe may reach: the tier's headroom, or all of the HBM for a
    pinned configuration that the plan keeps over the headroom (its "tight" warning)."""
    return plan.probe_memory_limit


def training_arguments(
    plan: Plan, resources: PipelineResources, *, probe: bool = False, segment: Segment | None = None
) -> dict[str, Any]:
    """CreateTrainingJob arguments (less TrainingJobName, which the pipeline generates): the probe's,
    or one segment's of a run (a new run's first by default)."""
    assert plan.estimates is not None
    if not probe and segment is None:
        segment = Segment(EXECUTION_ID, False, 1, plan.segments, plan.segment_seconds)
    recipe = plan.recipe
    compute = recipe.compute
    env: dict[str, Any] = dict(family_environment(plan))
    env[MODE_VARIABLE] = "probe" if probe else "train"

    channels = [_channel(TRAIN_CHANNEL, training_data_uri(plan), recipe.data.input_mode)]
    if recipe.model.init_checkpoint:
        # A Hugging Face checkpoint is read once at start: File mode copies it locally.
        channels.append(_channel(MODEL_CHANNEL, recipe.model.init_checkpoint, "File"))
    if recipe.data.validation_uri and not probe:
        # Held-out shards for the validation loss (training/components/validation.py).
        channels.append(_channel(VALIDATION_CHANNEL, recipe.data.validation_uri, recipe.data.input_mode))
    elif recipe.data.sources and recipe.data.validation_fraction > 0 and not probe:
        # data.sources: the Prepare step's held-out shards, per source.
        channels.append(
            _channel(VALIDATION_CHANNEL, prepared_data_uri(PREPARED_VALIDATION_URI), recipe.data.input_mode)
        )

    # MaxRuntimeInSeconds bounds every attempt of the job together (RetryStrategy included).
    max_runtime = probe_job_seconds(plan) if probe else plan.job_runtime_seconds
    stopping: dict[str, Any] = {"MaxRuntimeInSeconds": max_runtime}
    if compute.spot:
        wait = max_runtime + PROBE_SPOT_WAIT_SECONDS if probe else (plan.spot_wait_seconds or max_runtime)
        stopping["MaxWaitTimeInSeconds"] = max(max_runtime, wait)

    resource_config: dict[str, Any] = {
        "InstanceType": plan.instance.name,
        "InstanceCount": param(P_INSTANCE_COUNT),
        "VolumeSizeInGB": VOLUME_SIZE_GB,
    }
    if compute.training_plan_arn:
        resource_config["TrainingPlanArn"] = compute.training_plan_arn
    hands_over = probe or (segment is not None and segment.number < segment.count)
    takes_over = segment is not None and segment.follows_a_job
    if not compute.spot:  # warm pools cannot be used with spot instances
        if hands_over:
            resource_config["KeepAlivePeriodInSeconds"] = WARM_POOL_SECONDS
        elif takes_over:  # matching needs a keep-alive on the job that takes the pool
            resource_config["KeepAlivePeriodInSeconds"] = LAST_WARM_POOL_SECONDS

    output: dict[str, Any] = {"S3OutputPath": _join_uri(resources.output_s3_uri, "probe" if probe else "model")}
    if resources.kms_key_id:
        output["KmsKeyId"] = resources.kms_key_id

    algorithm: dict[str, Any] = {
        "TrainingImage": resources.image_uri,
        "TrainingInputMode": recipe.data.input_mode,
    }
    if probe:
        algorithm["MetricDefinitions"] = [
            {"Name": name, "Regex": regex}
            for name, (_fmt, regex) in metrics.probe_metric_definitions(candidate_count(plan)).items()
        ]
    elif segment is not None and segment.number == segment.count and plan.recipe.registry.enabled:
        # the run's final metrics, which the Register step copies into the model package
        algorithm["MetricDefinitions"] = [
            {"Name": name, "Regex": metrics.final_metric_regex(name)} for name in final_metrics(plan)
        ]

    args: dict[str, Any] = {
        "AlgorithmSpecification": algorithm,
        "RoleArn": resources.role_arn,
        # The probe names the run it probes for: the launcher then checks its InstanceCount too.
        "HyperParameters": hyperparameters(plan, Segment(EXECUTION_ID, False) if probe else segment),
        "InputDataConfig": channels,
        "OutputDataConfig": output,
        "ResourceConfig": resource_config,
        "StoppingCondition": stopping,
        "Environment": env,
        "Tags": [{"Key": k, "Value": v} for k, v in tags_for(plan, resources.extra_tags).items()],
    }
    if compute.spot:
        args["EnableManagedSpotTraining"] = True
    if not probe and segment is not None:  # a run's segment, set above when not given
        # Checkpoints only for the real run: the probe must not touch them (a local delete deletes in S3).
        args["CheckpointConfig"] = {
            "S3Uri": run_checkpoint_uri(resources, segment.run_id),
            "LocalPath": CHECKPOINT_LOCAL_PATH,
        }
        # The launcher takes the run's lease there, naming this execution (tiered_training/contract/lease.py).
        env[RUN_URI_VARIABLE] = run_checkpoint_uri(resources, segment.run_id)
        env[EXECUTION_VARIABLE] = {"Get": "Execution.PipelineExecutionArn"}
        args["RetryStrategy"] = {"MaximumRetryAttempts": JOB_RETRY_ATTEMPTS}
        if recipe.tracking.tensorboard:
            # SageMaker uploads the event files the trainer writes there (training/components/tracking.py).
            args["TensorBoardOutputConfig"] = {
                "S3OutputPath": _join_uri(resources.output_s3_uri, "tensorboard"),
                "LocalPath": TENSORBOARD_DIR,
            }
    if resources.subnets:
        args["VpcConfig"] = {"Subnets": list(resources.subnets), "SecurityGroupIds": list(resources.security_group_ids)}
    return args


def spec_arguments(plan: Plan) -> list[str]:
    """``--spec`` and the CorpusSpec's compact JSON in pieces of at most 256 characters (joined by the module)."""
    spec = plan.corpus_spec()
    assert spec is not None
    return ["--spec", *spec_pieces(spec.model_dump_json())]


def spec_pieces(text: str) -> list[str]:
    """``text`` cut into pieces of at most 256 characters, none starting with "-" (which an argument parser would
    take for an option)."""
    pieces, start = [], 0
    while start < len(text):
        end = min(len(text), start + MAX_ARGUMENT_CHARS)
        while end < len(text) and text[end] == "-" and end > start + 1:
            end -= 1
        pieces.append(text[start:end])
        start = end
    return pieces


def corpus_prepare_arguments(plan: Plan, resources: PipelineResources) -> list[str]:
    """The ContainerArguments of the pretraining Prepare step (``training.corpus_prepare``)."""
    arguments = [
        *spec_arguments(plan),
        "--prepared",
        prepared_s3_uri(resources),
        "--property-file",
        f"{PREPARE_LOCAL_PATH}/{PREPARED_JSON}",
    ]
    if len(arguments) > MAX_ARGUMENTS:
        raise ValueError(
            f"data.sources: the corpus spec takes {len(arguments)} container arguments of {MAX_ARGUMENT_CHARS} "
            f"characters; SageMaker allows {MAX_ARGUMENTS}: use fewer sources or shorter URIs and ignore globs"
        )
    return arguments


def prepare_arguments(plan: Plan, resources: PipelineResources) -> dict[str, Any]:
    """CreateProcessingJob arguments (less ProcessingJobName) of the Prepare step: the training image runs
    ``python -m training.sft_prepare`` (the local command's code) on one CPU instance, or with ``data.sources``
    ``python -m training.corpus_prepare`` on the plan's Prepare hosts. It reads S3 itself (no ProcessingInput):
    the content key needs the inputs' ETags, and a rerun whose key exists downloads nothing."""
    recipe = plan.recipe
    data, prepare = recipe.data, recipe.data.prepare
    assert prepare is not None
    if plan.corpus is not None:
        return _processing_arguments(
            plan,
            resources,
            CORPUS_PREPARE_MODULE,
            corpus_prepare_arguments(plan, resources),
            plan.corpus.prepare.instance_count,
        )
    assert recipe.model.init_checkpoint
    arguments: list[Any] = [
        "--input",
        param(P_DATA_URI),
        "--tokenizer",
        recipe.model.init_checkpoint,
        "--prepared",
        prepared_s3_uri(resources),
        "--property-file",
        f"{PREPARE_LOCAL_PATH}/{PREPARED_JSON}",
        "--sequence-length",
        str(recipe.sequence_length),
        "--dtype",
        data.token_dtype,
        "--loss-on",
        data.loss_on or "assistant",
        "--overlong",
        data.overlong or "error",
        "--format",
        data.format or ("preference" if recipe.task == "dpo" else "auto"),
        "--on-bad-example",
        data.on_bad_example or "error",
    ]
    if data.max_bad_fraction is not None:
        arguments += ["--max-bad-fraction", f"{data.max_bad_fraction:g}"]
    for glob in data.ignore:
        arguments += ["--ignore", glob]
    return _processing_arguments(plan, resources, PREPARE_MODULE, arguments, 1)


def _processing_arguments(
    plan: Plan, resources: PipelineResources, module: str, arguments: list[Any], count: int
) -> dict[str, Any]:
    prepare = plan.recipe.data.prepare
    assert prepare is not None
    cluster: dict[str, Any] = {
        "InstanceCount": count,
        "InstanceType": prepare.instance_type,
        "VolumeSizeInGB": prepare.volume_gb,
    }
    output: dict[str, Any] = {
        "Outputs": [
            {
                "OutputName": PREPARE_OUTPUT,
                "AppManaged": False,
                "S3Output": {
                    "S3Uri": {
                        "Std:Join": {"On": "", "Values": [_join_uri(resources.output_s3_uri, "prepare/"), EXECUTION_ID]}
                    },
                    "LocalPath": PREPARE_LOCAL_PATH,
                    "S3UploadMode": "EndOfJob",
                },
            }
        ]
    }
    if resources.kms_key_id:
        output["KmsKeyId"] = resources.kms_key_id
    args: dict[str, Any] = {
        "ProcessingResources": {"ClusterConfig": cluster},
        "AppSpecification": {
            "ImageUri": resources.image_uri,
            "ContainerEntrypoint": ["python", "-m", module],
            "ContainerArguments": arguments,
        },
        "ProcessingOutputConfig": output,
        "StoppingCondition": {"MaxRuntimeInSeconds": int(prepare.max_runtime_hours * 3600)},
        "Environment": {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"},
        "RoleArn": resources.prepare_role_arn or resources.role_arn,
        "Tags": [{"Key": k, "Value": v} for k, v in tags_for(plan, resources.extra_tags).items()],
    }
    if resources.subnets:
        args["NetworkConfig"] = {
            "EnableNetworkIsolation": False,  # the job reads S3 itself
            "VpcConfig": {"Subnets": list(resources.subnets), "SecurityGroupIds": list(resources.security_group_ids)},
        }
    return args


def prepare_step(plan: Plan, resources: PipelineResources) -> dict[str, Any]:
    return {
        "Name": S_PREPARE,
        "Type": "Processing",
        "Description": (
            "Tokenizes the raw sources into shards on N hosts, or reuses those of unchanged inputs"
            if plan.corpus is not None
            else "Packs the raw examples under DataUri into shards, or reuses those of an unchanged input"
        ),
        "Arguments": prepare_arguments(plan, resources),
        "PropertyFiles": [
            {"PropertyFileName": PREPARED_PROPERTY_FILE, "OutputName": PREPARE_OUTPUT, "FilePath": PREPARED_JSON}
        ],
        "RetryPolicies": [dict(CAPACITY_RETRY), dict(RESOURCE_LIMIT_RETRY), dict(SERVICE_RETRY)],
    }


def _channel(name: str, uri: Any, mode: str) -> dict[str, Any]:
    return {
        "ChannelName": name,
        "DataSource": {
            "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri, "S3DataDistributionType": "FullyReplicated"}
        },
        "InputMode": mode,
    }


def _join_uri(prefix: str, leaf: str) -> str:
    return prefix.rstrip("/") + "/" + leaf


def training_step(name: str, args: dict[str, Any], description: str, depends_on: str | None = None) -> dict[str, Any]:
    step = {
        "Name": name,
        "Type": "Training",
        "Description": description,
        "Arguments": args,
        "RetryPolicies": [dict(CAPACITY_RETRY), dict(RESOURCE_LIMIT_RETRY), dict(SERVICE_RETRY)],
    }
    if depends_on:
        step["DependsOn"] = [depends_on]
    return step


def segment_name(chain: str, number: int) -> str:
    return chain if number == 1 else f"{chain}-{number}"


def segment_chain(
    plan: Plan,
    resources: PipelineResources,
    chain: str,
    run_id: Any,
    resume: bool,
    description: str,
    *,
    after_probe: bool = False,
) -> list[dict[str, Any]]:
    """The Training steps of one run, a segment each, each after the one before (the first after the
    Probe with ``after_probe``, every segment then training the candidate the Probe chose)."""
    count = plan.segments
    candidate = probe_metric(PROBE_CANDIDATE) if after_probe else None
    steps = []
    for number in range(1, count + 1):
        segment = Segment(
            run_id, resume, number, count, plan.segment_seconds, after_probe=after_probe, candidate=candidate
        )
        part = f" (segment {number} of {count})" if count > 1 else ""
        steps.append(
            training_step(
                segment_name(chain, number),
                training_arguments(plan, resources, segment=segment),
                description + part,
                depends_on=segment_name(chain, number - 1) if number > 1 else None,
            )
        )
    return steps


def chain_steps(definition: dict[str, Any], chain: str) -> list[str]:
    """The names of a chain's segments in a definition, in order."""
    names = {step["Name"] for step in iter_steps(definition["Steps"])}
    found, number = [], 1
    while segment_name(chain, number) in names:
        found.append(segment_name(chain, number))
        number += 1
    return found


@dataclass(frozen=True)
class ProbeMetric:
    """A probe metric inside a Fail message: rendered as the Probe step's FinalMetricDataList value."""

    name: str


def candidates_text(plan: Plan) -> str:
    """The probe's candidates, as a Fail message lists them."""
    found = plan.candidates
    return "; ".join(f"{c.number} = {c.describe()}" for c in found) if found else "1 = the plan's configuration"


def throughput_failure(plan: Plan) -> list[str | ProbeMetric]:
    """The FailThroughput message: text, and the measured values where they go."""
    assert plan.estimates is not None
    threshold = probe_threshold(plan)
    limit = memory_limit(plan)
    planned = round(plan.estimates.tokens_per_second_per_gpu, 2)
    fraction = plan.recipe.probe.min_throughput_fraction
    return [
        f"{plan.name}: probe throughput check failed: the fastest candidate under the memory limit, ",
        ProbeMetric(PROBE_CANDIDATE),
        ", measured ",
        ProbeMetric(PROBE_TOKENS),
        f" tokens/s per GPU, needs at least {threshold} ({fraction:g} x the plan's {planned})",
        "; its peak reserved memory fraction ",
        ProbeMetric(PROBE_MEMORY),
        f" (limit {limit}). Candidates: {candidates_text(plan)}.",
        " Fix the recipe or rerun with SkipProbe=true.",
    ]


def memory_failure(plan: Plan) -> list[str | ProbeMetric]:
    """The FailMemory message (also when no candidate fits at all)."""
    threshold = probe_threshold(plan)
    limit = memory_limit(plan)
    return [
        f"{plan.name}: probe memory check failed: best candidate ",
        ProbeMetric(PROBE_CANDIDATE),
        " (0: none fits under the limit), peak reserved memory fraction ",
        ProbeMetric(PROBE_MEMORY),
        f" is above the limit {limit} (plan {plan.memory.fraction:.3f})" if plan.memory else f" is above {limit}",
        "; throughput ",
        ProbeMetric(PROBE_TOKENS),
        f" tokens/s per GPU (needs {threshold}). Candidates: {candidates_text(plan)}.",
        " Lower tuning.micro_batch_size or raise activation checkpointing.",
    ]


def _fail(name: str, message: list[str | ProbeMetric]) -> dict[str, Any]:
    values = [probe_metric(part.name) if isinstance(part, ProbeMetric) else part for part in message]
    return {"Name": name, "Type": "Fail", "Arguments": {"ErrorMessage": {"Std:Join": {"On": "", "Values": values}}}}


def gate_steps(plan: Plan, train: list[dict[str, Any]]) -> dict[str, Any]:
    threshold = probe_threshold(plan)
    limit = memory_limit(plan)
    throughput_ok = {"Type": "GreaterThanOrEqualTo", "LeftValue": probe_metric(PROBE_TOKENS), "RightValue": threshold}
    memory_ok = {"Type": "LessThanOrEqualTo", "LeftValue": probe_metric(PROBE_MEMORY), "RightValue": limit}
    fail_throughput = _fail(S_FAIL_THROUGHPUT, throughput_failure(plan))
    fail_memory = _fail(S_FAIL_MEMORY, memory_failure(plan))
    reason = {
        "Name": S_GATE_REASON,
        "Type": "Condition",
        "Description": "Which gate check failed (memory first: nothing else matters when the model does not fit)",
        "Arguments": {"Conditions": [memory_ok], "IfSteps": [fail_throughput], "ElseSteps": [fail_memory]},
    }
    return {
        "Name": S_GATE,
        "Type": "Condition",
        "Description": f"Probe tokens/s per GPU >= {threshold} and peak memory fraction <= {limit}",
        "Arguments": {"Conditions": [throughput_ok, memory_ok], "IfSteps": train, "ElseSteps": [reason]},
    }


# -- registration --------------------------------------------------------------------------

DEFAULT_SERVING_REGION = "us-east-1"


def final_metrics(plan: Plan) -> tuple[str, ...]:
    """The final metrics every run of the recipe's task prints, which the Register step records
    (``contract.metrics.final_metric_names``); the held-out scores are in the evaluation the package points at."""
    return metrics.final_metric_names(plan.recipe.task)


def serving_image(plan: Plan, resources: PipelineResources) -> str:
    """The package's inference image: the recipe's choice, else the one the resources name, else the catalogue's
    LMI image for the recipe's region (``catalog/serving_images.yaml``)."""
    from tiered_training.catalog.images import serving_image_uri

    return (
        plan.recipe.registry.serving_image
        or resources.serving_image_uri
        or serving_image_uri(plan.recipe.compute.region or DEFAULT_SERVING_REGION)
    )


def model_package_group(plan: Plan, resources: PipelineResources) -> str:
    return resources.model_package_group or plan.name


def evaluation_uri(resources: PipelineResources, run_id: Any) -> dict[str, Any]:
    """The run's ``evaluation.json`` (written at the top of its checkpoint prefix by the last segment)."""
    return {
        "Std:Join": {
            "On": "",
            "Values": [resources.checkpoint_s3_uri.rstrip("/") + "/runs/", run_id, "/" + EVALUATION_FILE],
        }
    }


def register_arguments(plan: Plan, resources: PipelineResources, last: str, run_id: Any) -> dict[str, Any]:
    """CreateModelPackage arguments of a chain's Register step: a versioned package in the recipe's group, the
    export (``last``'s model artefact) served by the serving image, the run's evaluation as its model quality
    statistics, and the recipe, plan hash, run id, data and final metrics as customer metadata."""
    recipe = plan.recipe
    run_config = plan.run_config()
    export = get(f"Steps.{last}.ModelArtifacts.S3ModelArtifacts")
    metadata: dict[str, Any] = {
        "recipe": plan.name,
        "task": recipe.task,
        "plan_hash": run_config.plan_hash(),
        "run_id": as_string(run_id),
        "export_uri": export,
        "export_format": recipe.export.format,
        "evaluation_uri": evaluation_uri(resources, run_id),
        "data_uri": as_string(training_data_uri(plan)),
    }
    if recipe.data.prepare is not None:  # the prepared shards' content key (their manifests' checksums in it)
        metadata["data_key"] = as_string(prepared_data_uri("key"))
    for name in final_metrics(plan):
        metadata[name] = as_string(get(f"Steps.{last}.FinalMetricDataList['{name}'].Value"))
    return {
        "ModelPackageGroupName": model_package_group(plan, resources),
        "ModelPackageDescription": (
            f"{plan.name}: {recipe.task} of {recipe.model.name or recipe.model.catalog or 'the model'}, "
            f"plan {run_config.plan_hash()}"
        )[:1024],
        "ModelApprovalStatus": recipe.registry.approval,
        "InferenceSpecification": {
            "Containers": [
                {
                    "Image": serving_image(plan, resources),
                    "ModelDataUrl": export,
                    "Environment": {"HF_MODEL_ID": "/opt/ml/model", "OPTION_ROLLING_BATCH": "vllm"},
                }
            ],
            "SupportedContentTypes": ["application/json"],
            "SupportedResponseMIMETypes": ["application/json"],
        },
        "ModelMetrics": {
            "ModelQuality": {
                "Statistics": {"ContentType": "application/json", "S3Uri": evaluation_uri(resources, run_id)}
            }
        },
        "CustomerMetadataProperties": metadata,
        "SkipModelValidation": "None",  # the API's default, as the SageMaker SDK writes it
    }


def register_step(plan: Plan, resources: PipelineResources, chain: list[dict[str, Any]], run_id: Any) -> dict:
    """The Register step after a chain's last segment."""
    last = chain[-1]["Name"]
    name = REGISTER_STEPS[chain[0]["Name"]]
    return {
        "Name": name,
        "Type": "RegisterModel",
        "Description": f"Registers the export of {last} in model package group {model_package_group(plan, resources)}",
        "DependsOn": [last],
        "Arguments": register_arguments(plan, resources, last, run_id),
    }


def with_register(plan: Plan, resources: PipelineResources, chain: list[dict[str, Any]], run_id: Any) -> list:
    """A chain, followed by its Register step when the recipe registers."""
    if not plan.recipe.registry.enabled:
        return chain
    return [*chain, register_step(plan, resources, chain, run_id)]


def build_definition(plan: Plan, resources: PipelineResources) -> dict[str, Any]:
    """The pipeline definition of a Plan without errors (``PlanError`` otherwise)."""
    plan.require_ok()
    steps = plan.estimates.total_steps if plan.estimates else "?"
    count = candidate_count(plan)
    probe = training_step(
        S_PROBE,
        training_arguments(plan, resources, probe=True),
        f"Short run of {count} candidate configuration(s), {plan.recipe.probe.steps} steps each in its own launch: "
        "measures tokens/s and peak memory, names the fastest under the memory limit",
    )
    train = segment_chain(
        plan,
        resources,
        S_TRAIN,
        EXECUTION_ID,
        False,
        f"Full run: {steps} steps, a new run, of the candidate the Probe chose",
        after_probe=True,
    )
    unprobed = segment_chain(
        plan,
        resources,
        S_TRAIN_WITHOUT_PROBE,
        EXECUTION_ID,
        False,
        "Full run without a probe (SkipProbe=true), a new run",
    )
    resume = segment_chain(
        plan, resources, S_RESUME, param(P_RUN_ID), True, "Resumes the run named by RunId from its checkpoints"
    )
    train = with_register(plan, resources, train, EXECUTION_ID)
    unprobed = with_register(plan, resources, unprobed, EXECUTION_ID)
    resume = with_register(plan, resources, resume, param(P_RUN_ID))
    probe_or_skip = {
        "Name": S_PROBE_OR_SKIP,
        "Type": "Condition",
        "Description": "Skip the probe when SkipProbe is true",
        "Arguments": {
            "Conditions": [{"Type": "Equals", "LeftValue": param(P_SKIP_PROBE), "RightValue": True}],
            "IfSteps": unprobed,
            "ElseSteps": [probe, gate_steps(plan, train)],
        },
    }
    root: dict[str, Any] = {
        "Name": S_NEW_OR_RESUME,
        "Type": "Condition",
        "Description": f"A new run (RunId={NEW_RUN}, named after the execution), or resume the run RunId names",
        "Arguments": {
            "Conditions": [{"Type": "Equals", "LeftValue": param(P_RUN_ID), "RightValue": NEW_RUN}],
            "IfSteps": [probe_or_skip],
            "ElseSteps": resume,
        },
    }
    top = [root]
    if plan.recipe.data.prepare is not None:  # before either branch: a resume reads the same prepared shards
        root["DependsOn"] = [S_PREPARE]
        top = [prepare_step(plan, resources), root]
    return {
        "Version": SCHEMA_VERSION,
        "Metadata": {"GeneratedBy": "tiered-training", "Recipe": plan.name},
        "Parameters": parameters(plan),
        "Steps": top,
    }


def to_json(definition: dict[str, Any]) -> str:
    return json.dumps(definition, separators=(",", ":"), sort_keys=False)


# -- walking -------------------------------------------------------------------------------


def iter_steps(steps: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every step, including those nested in Condition branches."""
    for step in steps:
        yield step
        if step.get("Type") == "Condition":
            args = step.get("Arguments", {})
            yield from iter_steps(args.get("IfSteps", []))
            yield from iter_steps(args.get("ElseSteps", []))


def find_step(definition: dict[str, Any], name: str) -> dict[str, Any]:
    for step in iter_steps(definition["Steps"]):
        if step["Name"] == name:
            return step
    raise KeyError(name)
