"""``tiered-training start RECIPE``: start a recipe's pipeline execution and follow it.

A thin boto3 wrapper: ``StartPipelineExecution`` on the pipeline named after the
recipe (``recipe.name``), print the execution ARN, then follow it with
:func:`tiered_training.aws.runs.follow` (status, steps, and the training metrics from
CloudWatch: step, loss, tokens/s against the plan, ETA).

Parameters are the pipeline's (``tiered_training.pipeline.definition.PARAMETERS``):
``InstanceCount``, ``MaxSteps``, ``DataUri``, ``SkipProbe`` and ``RunId`` (``--resume RUN``;
without it the execution starts a new run). They are checked here, before any call,
against the same rules the recipe obeys: counts and steps positive, an instance count the
plan supports (it keeps the planned global batch), the data URI an S3 URI under the
recipe's ``data.allowed_uris``, a run id that can name a prefix.

The region is, in order: ``--region``, the recipe's ``compute.region``,
``AWS_REGION``, ``AWS_DEFAULT_REGION``, then the AWS configuration (profile).
Every AWS error becomes one line (:class:`StartError`).
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, TextIO

from tiered_training.pipeline.definition import NEW_RUN, P_DATA_URI, P_INSTANCE_COUNT, P_MAX_STEPS, P_RUN_ID, P_SKIP_PROBE
from tiered_training.text import clip, escape

if TYPE_CHECKING:
    from tiered_training.planning.plan import Plan
    from tiered_training.recipe import Recipe

TERMINAL = frozenset({"Succeeded", "Failed", "Stopped"})
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MAX_INSTANCE_COUNT = 512  # as compute.instance_count
MAX_STEPS_LIMIT = 10**9


class StartError(Exception):
    """A problem a user can fix (no such pipeline, no credentials, endpoint down); one line.

    ``code`` is AWS's error code where AWS answered; ``transient`` is true for an error that
    a later call may not meet (throttling, expired credentials, a lost connection).
    """

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, code: str | None = None, transient: bool = False):
        super().__init__(message)
        self.code = code
        self.transient = transient


class ParameterError(StartError):
    """A parameter that is wrong before any call is made (exit 2, like invalid input)."""

    exit_code = EXIT_USAGE


@dataclass
class ExecutionResult:
    arn: str
    status: str
    failure_reason: str | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    progress: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "Succeeded"

    def to_dict(self) -> dict[str, Any]:
        return {
            "execution_arn": self.arn,
            "status": self.status,
            "failure_reason": self.failure_reason,
            "steps": self.steps,
            "progress": self.progress,
        }


def pipeline_parameters(
    *,
    instance_count: int | None = None,
    max_steps: int | None = None,
    data_uri: str | None = None,
    skip_probe: bool | None = None,
    resume: str | None = None,
) -> list[dict[str, str]]:
    """``PipelineParameters`` for the overrides given (the pipeline's defaults otherwise)."""
    values: dict[str, Any] = {
        P_INSTANCE_COUNT: instance_count,
        P_MAX_STEPS: max_steps,
        P_DATA_URI: data_uri,
        P_SKIP_PROBE: skip_probe,
        P_RUN_ID: resume,
    }
    out = []
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        out.append({"Name": name, "Value": text})
    return out


def check_parameters(
    recipe: "Recipe",
    *,
    instance_count: int | None = None,
    max_steps: int | None = None,
    data_uri: str | None = None,
    resume: str | None = None,
    plan: "Plan | None" = None,
) -> None:
    """Raise :class:`ParameterError` naming every override that the pipeline would run wrongly with."""
    from tiered_training.recipe import S3_URI_MAX, S3_URI_PATTERN
    from tiered_training.contract.runconfig import RUN_ID_PATTERN

    problems = []
    if instance_count is not None and not 1 <= instance_count <= MAX_INSTANCE_COUNT:
        problems.append(f"--instance-count {instance_count}: must be 1 to {MAX_INSTANCE_COUNT}")
    elif instance_count is not None and plan is not None and plan.instance_counts and resume is None \
            and instance_count not in plan.instance_counts:
        problems.append(
            f"--instance-count {instance_count}: the plan's global batch of {recipe.budget.global_batch_tokens:,} tokens "
            f"cannot be kept on {instance_count} x {plan.instance.gpus} GPUs at the planned memory; the plan supports "
            f"{', '.join(map(str, plan.instance_counts))} (`tiered-training explain` shows compute.instance_counts)"
        )
    if resume is not None and (resume == NEW_RUN or not re.fullmatch(RUN_ID_PATTERN, resume)):
        problems.append(f"--resume {clip(repr(resume))}: not a run id (letters, digits, '.', '_', '-'); "
                        "`tiered-training status RECIPE` lists the recipe's runs")
    if max_steps is not None and not 1 <= max_steps <= MAX_STEPS_LIMIT:
        problems.append(f"--max-steps {max_steps}: must be 1 to {MAX_STEPS_LIMIT:,}")
    if data_uri is not None:
        allowed = ", ".join(recipe.data.data_prefixes)
        if len(data_uri) > S3_URI_MAX or not re.match(S3_URI_PATTERN, data_uri):
            problems.append(f"--data-uri {clip(repr(data_uri))}: not an S3 URI (s3://bucket/prefix/)")
        elif not recipe.data.allows(data_uri):
            problems.append(
                f"--data-uri {clip(repr(data_uri))}: not under the recipe's data.allowed_uris ({allowed}); "
                "the pipeline's role may read only those"
            )
    if problems:
        raise ParameterError("; ".join(problems))


def resolve_region(region: str | None, recipe_region: str | None = None) -> str | None:
    """``--region``, the recipe's region, ``AWS_REGION``, ``AWS_DEFAULT_REGION``; None leaves it to the profile."""
    return region or recipe_region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


# AWS error codes that a later call may not meet. Throttling codes after botocore's
# standard retry mode (https://docs.aws.amazon.com/sdkref/latest/guide/feature-retry-behavior.html);
# expired credentials, which a refreshing credential provider (SSO, an assumed role) renews.
THROTTLING = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException", "TooManyRequestsException",
    "ProvisionedThroughputExceededException", "TransactionInProgressException", "RequestLimitExceeded",
    "BandwidthLimitExceeded", "LimitExceededException", "RequestThrottled", "SlowDown", "PriorRequestNotComplete",
    "EC2ThrottledException",
})
EXPIRED = frozenset({"ExpiredToken", "ExpiredTokenException", "RequestExpired", "InvalidClientTokenId"})
SERVER = frozenset({"InternalFailure", "InternalServerError", "ServiceUnavailable", "InternalError"})
RETRIES = {"mode": "standard"}  # botocore's standard retry mode: 3 attempts, exponential backoff with jitter
EXTRA = "aws"  # the extra that installs boto3: pip install 'tiered-training[aws]'


@contextmanager
def aws_errors(action: str) -> Iterator[None]:
    """Turn every botocore error raised inside into one :class:`StartError` line."""
    from botocore.exceptions import (
        BotoCoreError, ClientError, ConnectionError as BotoConnectionError, HTTPClientError, NoCredentialsError,
        NoRegionError, ProfileNotFound,
    )

    try:
        yield
    except NoRegionError:
        raise ParameterError("no AWS region: pass --region, or set AWS_REGION or AWS_DEFAULT_REGION") from None
    except ProfileNotFound as error:
        raise ParameterError(f"{error}; {_profiles_hint()}") from None
    except NoCredentialsError:
        raise StartError("no AWS credentials: configure a profile or the AWS_* environment variables") from None
    except ClientError as error:
        info = error.response.get("Error", {})
        code, message = info.get("Code", "Error"), info.get("Message", str(error))
        missing = "ResourceNotFound" in code or re.search(r"does not exist|could not find|not found", message, re.I)
        hint = " (deploy the recipe's stack first: cdk deploy)" if missing and "pipeline" in action else ""
        if code in EXPIRED:
            hint = " (the AWS credentials have expired: renew them, e.g. aws sso login)"
        raise StartError(f"cannot {action}: {code}: {clip(message, 300)}{hint}", code=code,
                         transient=code in THROTTLING | EXPIRED | SERVER) from None
    except (BotoConnectionError, HTTPClientError) as error:
        raise StartError(f"cannot {action}: {clip(str(error), 300)}", transient=True) from None
    except BotoCoreError as error:
        raise StartError(f"cannot {action}: {clip(str(error), 300)}") from None
    except ValueError as error:  # botocore rejects a malformed endpoint URL with ValueError
        raise StartError(f"cannot {action}: {clip(str(error), 300)}") from None


def aws_client(service: str, *, region: str | None = None, endpoint_url: str | None = None, profile: str | None = None) -> Any:
    """A boto3 client with short connect timeouts and botocore's standard retry mode.

    The region, the profile and the endpoint are checked here first (:func:`check_aws_options`):
    a bad one is a :class:`ParameterError` and no call is made. Other errors become :class:`StartError`.
    """
    check_aws_options(region=region, endpoint_url=endpoint_url, profile=profile)
    with aws_errors(f"create a {service} client"):
        from botocore.config import Config

        session = _session(profile)
        if region is None:
            check_region(session.region_name, "the AWS configuration's region")
        return session.client(
            service,
            region_name=region,
            endpoint_url=endpoint_url,
            config=Config(connect_timeout=10, read_timeout=60, retries=dict(RETRIES)),
        )


def require_boto3(command: str = "this command") -> None:
    """Raise :class:`StartError` naming the extra to install when boto3 is missing."""
    try:
        import boto3  # noqa: F401
    except ImportError:
        raise StartError(f"{command} calls AWS and needs boto3, which the '{EXTRA}' extra installs: "
                         f"pip install 'tiered-training[{EXTRA}]'") from None


@functools.lru_cache(maxsize=None)
def _session(profile: str | None) -> Any:
    """One boto3 session per profile: its clients share the loaded service models."""
    require_boto3()
    import boto3

    return boto3.Session(profile_name=profile) if profile else boto3.Session()


# -- local checks: a bad option is exit 2 and never reaches AWS -----------------------------

# https://docs.aws.amazon.com/general/latest/gr/rande.html: a partition's prefix, a place, a number.
REGION_PATTERN = r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$"
# PipelineExecutionArn in the SageMaker API reference (botocore's model carries the same pattern):
# https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_DescribePipelineExecution.html
EXECUTION_ARN_PATTERN = r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:pipeline/([^/]+)/execution/[^/]+$"
EXECUTION_ARN_MAX = 2048


def check_aws_options(*, region: str | None = None, endpoint_url: str | None = None, profile: str | None = None,
                      execution: str | None = None, pipeline: str | None = None) -> None:
    """Raise :class:`ParameterError` for a region, profile, endpoint or execution ARN that cannot work."""
    if endpoint_url is not None and not re.match(r"^https?://[^\s/]+", endpoint_url):
        raise ParameterError(f"--endpoint-url {clip(repr(endpoint_url))}: not an http(s) URL")
    if region is not None:
        check_region(region)
    if profile is not None:
        check_profile(profile)
    if execution is not None:
        check_execution_arn(execution, pipeline)


def check_region(region: str | None, source: str = "--region") -> None:
    if region is None:
        return
    known = known_regions()
    if region in known:
        return
    if not re.match(REGION_PATTERN, region) or len(region) > 32:
        raise ParameterError(f"{source} {clip(repr(region))}: not an AWS region name (like us-east-1)")
    import difflib

    import botocore

    close = difflib.get_close_matches(region, sorted(known), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ParameterError(f"{source} {region!r}: not a region where SageMaker runs; {hint}"
                         f"botocore {botocore.__version__} knows {len(known)} (a newer botocore may know more)")


@functools.lru_cache(maxsize=1)
def known_regions() -> frozenset[str]:
    """The regions of SageMaker in every partition, from botocore's endpoint data (offline)."""
    require_boto3()
    import botocore.session

    session = botocore.session.Session()
    return frozenset(r for p in session.get_available_partitions() for r in session.get_available_regions("sagemaker", p))


def check_profile(profile: str) -> None:
    require_boto3()
    import botocore.session

    if profile not in botocore.session.Session().available_profiles:
        raise ParameterError(f"--profile {clip(repr(profile))}: no such profile; {_profiles_hint()}")


def _profiles_hint() -> str:
    import botocore.session

    profiles = botocore.session.Session().available_profiles
    where = "~/.aws/config and ~/.aws/credentials (or AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE)"
    return f"the profiles in {where}: {', '.join(sorted(profiles)[:20])}" if profiles else f"{where} define no profiles"


def check_execution_arn(arn: str, pipeline: str | None = None) -> None:
    match = re.match(EXECUTION_ARN_PATTERN, arn) if len(arn) <= EXECUTION_ARN_MAX else None
    if not match:
        raise ParameterError(f"--execution {clip(repr(arn))}: not a pipeline execution ARN "
                             "(arn:aws:sagemaker:REGION:ACCOUNT:pipeline/NAME/execution/ID)")
    if pipeline is not None and match.group(1).lower() != pipeline.lower():
        raise ParameterError(f"--execution: an execution of pipeline {match.group(1)!r}, not of this recipe's {pipeline!r}")


def _recipe_and_plan(plan_or_recipe_path: "Plan | str | Path") -> tuple["Recipe", "Plan | None"]:
    """The recipe, and its plan when it has no errors (for progress against the plan)."""
    if isinstance(plan_or_recipe_path, (str, Path)):
        from tiered_training.planning.planner import plan_file

        plan = plan_file(plan_or_recipe_path)
    else:
        plan = plan_or_recipe_path
    return plan.recipe, (plan if plan.ok else None)


def start(
    plan_or_recipe_path: "Plan | str | Path",
    *,
    instance_count: int | None = None,
    max_steps: int | None = None,
    data_uri: str | None = None,
    skip_probe: bool | None = None,
    resume: str | None = None,
    display_name: str | None = None,
    follow: bool = True,
    poll_seconds: float = 30.0,
    timeout_seconds: float | None = None,
    region: str | None = None,
    endpoint_url: str | None = None,
    profile: str | None = None,
    client: Any = None,
    cloudwatch: Any = None,
    s3: Any = None,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
    reporter: Any = None,
    stage: str | None = None,
    renew: Callable[[], tuple[Any, Any]] | None = None,
) -> ExecutionResult:
    """Start the recipe's pipeline (of ``stage``, when the app was deployed with one); print
    the execution ARN; follow it to the end when ``follow``.

    Raises :class:`ParameterError` for a bad override (before any call),
    :class:`StartError` for errors a user can fix (one readable line), and
    ``RecipeError`` for a recipe that does not load.
    """
    from tiered_training.aws import runs

    out = out or sys.stdout
    from tiered_training.recipe.names import pipeline_name

    recipe, plan = _recipe_and_plan(plan_or_recipe_path)
    name = pipeline_name(recipe.name, stage)
    check_parameters(recipe, instance_count=instance_count, max_steps=max_steps, data_uri=data_uri, resume=resume, plan=plan)
    region = resolve_region(region, recipe.compute.region)
    sm = client if client is not None else aws_client("sagemaker", region=region, endpoint_url=endpoint_url, profile=profile)
    request: dict[str, Any] = {
        "PipelineName": name,
        "PipelineParameters": pipeline_parameters(
            instance_count=instance_count, max_steps=max_steps, data_uri=data_uri, skip_probe=skip_probe, resume=resume
        ),
    }
    if resume is not None and (s3 is not None or client is None):
        check_resumable(sm, s3 if s3 is not None else aws_client("s3", region=region, endpoint_url=endpoint_url,
                                                                   profile=profile), name, resume, data_uri)
    if display_name:
        request["PipelineExecutionDisplayName"] = display_name
    source = plan_or_recipe_path if isinstance(plan_or_recipe_path, (str, Path)) else plan_or_recipe_path.source
    named = f" (the name: of {escape(str(source))})" if source else ""
    with aws_errors(f"start pipeline {name}{named}"):
        arn = sm.start_pipeline_execution(**request)["PipelineExecutionArn"]
    if reporter is None:
        print(arn, file=out, flush=True)
    if not follow:
        return ExecutionResult(arn=arn, status="Executing")
    if cloudwatch is None and client is None:
        cloudwatch = aws_client("cloudwatch", region=region, endpoint_url=endpoint_url, profile=profile)
    if renew is None and client is None:

        def renew() -> tuple[Any, Any]:
            _session.cache_clear()
            return (aws_client("sagemaker", region=region, endpoint_url=endpoint_url, profile=profile),
                    aws_client("cloudwatch", region=region, endpoint_url=endpoint_url, profile=profile))

    target = runs.Target.of(recipe, plan, instance_count=instance_count, max_steps=max_steps)
    return runs.follow(
        sm, arn, target=target, cloudwatch=cloudwatch, poll_seconds=poll_seconds, timeout_seconds=timeout_seconds,
        reporter=reporter or runs.reporter_for(out), sleep=sleep, renew=renew,
    )


def check_resumable(sm: Any, s3: Any, pipeline_name: str, run_id: str, data_uri: str | None) -> None:
    """Refuse, before the execution starts (and instances are paid for), a resume of a run that has no committed
    checkpoint in the store, or with other data than the run's. A store this caller cannot read is left to the
    launcher, which checks the same before compute."""
    from tiered_training.aws.run_list import list_runs, runs_uri

    try:
        listed = {run.run_id: run for run in list_runs(s3, runs_uri(sm, pipeline_name))}
    except StartError:
        return
    run = listed.get(run_id)
    if run is None or run.last_step is None:
        known = ", ".join(sorted(r for r, v in listed.items() if v.last_step is not None)) or "none"
        raise ParameterError(f"--resume {run_id}: the run has no committed checkpoint in the store "
                             f"(runs that can be resumed: {known}; `tiered-training status` lists them)")
    if data_uri is not None and run.data_uri and data_uri != run.data_uri:
        raise ParameterError(f"--resume {run_id} --data-uri {data_uri}: the run trains on {run.data_uri}; resume it "
                             "without --data-uri, or start a new run on the other data")


def follow_execution(
    sm: Any,
    arn: str,
    *,
    poll_seconds: float = 30.0,
    timeout_seconds: float | None = None,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ExecutionResult:
    """Poll an execution until it ends, showing its status and steps (no metrics)."""
    from tiered_training.aws import runs

    return runs.follow(sm, arn, poll_seconds=poll_seconds, timeout_seconds=timeout_seconds, reporter=runs.reporter_for(out or sys.stdout), sleep=sleep)


def main(argv: list[str] | None = None) -> int:
    """``python -m tiered_training.aws.start RECIPE ...``: the CLI's ``start`` command."""
    from tiered_training.cli.app import main as cli_main

    try:
        cli_main(["start", *(sys.argv[1:] if argv is None else argv)])
    except SystemExit as done:
        return int(done.code or 0) if not isinstance(done.code, str) else EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
