"""The AWS base layer of the commands that call AWS: the boto3 session and its clients (built here, in one
place), AWS errors as one line each, and the local checks of the AWS options.

The region is, in order: ``--region``, the recipe's ``compute.region``,
``AWS_REGION``, ``AWS_DEFAULT_REGION``, then the AWS configuration (profile).
Every AWS error becomes one line (:class:`StartError`); a region, profile, endpoint or
execution ARN that cannot work is a :class:`ParameterError` (exit 2) before any call.
boto3 is imported when a client or a check needs it, never when this module is.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tiered_training.recipe.regions import region_problem
from tiered_training.text import clip

TERMINAL = frozenset({"Succeeded", "Failed", "Stopped"})
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MISSING_EXTRA = 0, 1, 2, 3


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


class MissingExtraError(StartError):
    """boto3 is not installed (exit 3: the installation, not the input nor AWS)."""

    exit_code = EXIT_MISSING_EXTRA


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


def resolve_region(region: str | None, recipe_region: str | None = None) -> str | None:
    """``--region``, the recipe's region, ``AWS_REGION``, ``AWS_DEFAULT_REGION``; None leaves it to the profile and,
    without one there, to :func:`default_region` (the clients of :func:`aws_client` take it)."""
    return region or recipe_region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def default_region() -> str:
    """The region ``plan`` prices in when the recipe names none (the price catalogue's default): the last step of
    the region rule, so that ``start`` runs where the plan priced."""
    from tiered_training.catalog import prices

    return prices().default_region


# AWS error codes that a later call may not meet. Throttling codes after botocore's
# standard retry mode (https://docs.aws.amazon.com/sdkref/latest/guide/feature-retry-behavior.html);
# expired credentials, which a refreshing credential provider (SSO, an assumed role) renews.
THROTTLING = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)
EXPIRED = frozenset({"ExpiredToken", "ExpiredTokenException", "RequestExpired", "InvalidClientTokenId"})
SERVER = frozenset({"InternalFailure", "InternalServerError", "ServiceUnavailable", "InternalError"})
RETRIES = {"mode": "standard"}  # botocore's standard retry mode: 3 attempts, exponential backoff with jitter
EXTRA = "aws"  # the extra that installs boto3: pip install 'tiered-training[aws]'


@contextmanager
def aws_errors(action: str) -> Iterator[None]:
    """Turn every botocore error raised inside into one :class:`StartError` line."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        HTTPClientError,
        NoCredentialsError,
        NoRegionError,
        ProfileNotFound,
    )
    from botocore.exceptions import (
        ConnectionError as BotoConnectionError,
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
        raise StartError(
            f"cannot {action}: {code}: {clip(message, 300)}{hint}",
            code=code,
            transient=code in THROTTLING | EXPIRED | SERVER,
        ) from None
    except (BotoConnectionError, HTTPClientError) as error:
        raise StartError(f"cannot {action}: {clip(str(error), 300)}", transient=True) from None
    except BotoCoreError as error:
        raise StartError(f"cannot {action}: {clip(str(error), 300)}") from None
    except ValueError as error:  # botocore rejects a malformed endpoint URL with ValueError
        raise StartError(f"cannot {action}: {clip(str(error), 300)}") from None


def aws_client(
    service: str, *, region: str | None = None, endpoint_url: str | None = None, profile: str | None = None
) -> Any:
    """A boto3 client, from the profile's :func:`session`, with short connect timeouts and botocore's
    standard retry mode. Every client of the package is built here.

    The region, the profile and the endpoint are checked here first (:func:`check_aws_options`):
    a bad one is a :class:`ParameterError` and no call is made. Other errors become :class:`StartError`.
    """
    check_aws_options(region=region, endpoint_url=endpoint_url, profile=profile)
    with aws_errors(f"create a {service} client"):
        from botocore.config import Config

        profile_session = session(profile)
        if region is None:
            check_region(profile_session.region_name, "the AWS configuration's region")
            region = profile_session.region_name or default_region()
        return profile_session.client(
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
        raise MissingExtraError(
            f"{command} calls AWS and needs boto3, which the '{EXTRA}' extra installs: "
            f"pip install 'tiered-training[{EXTRA}]'"
        ) from None


@functools.cache
def session(profile: str | None) -> Any:
    """One boto3 session per profile: its clients share the loaded service models.

    ``session.cache_clear()`` forgets them: the next clients read the credentials again.
    """
    require_boto3()
    import boto3

    return boto3.Session(profile_name=profile) if profile else boto3.Session()


# -- local checks: a bad option is exit 2 and never reaches AWS -----------------------------

# PipelineExecutionArn in the SageMaker API reference (botocore's model carries the same pattern):
# https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_DescribePipelineExecution.html
EXECUTION_ARN_PATTERN = r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:pipeline/([^/]+)/execution/[^/]+$"
EXECUTION_ARN_MAX = 2048


def check_aws_options(
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    profile: str | None = None,
    execution: str | None = None,
    pipeline: str | None = None,
) -> None:
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
    problem = region_problem(region)
    if problem:
        raise ParameterError(f"{source} {problem}")


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
        raise ParameterError(
            f"--execution {clip(repr(arn))}: not a pipeline execution ARN "
            "(arn:aws:sagemaker:REGION:ACCOUNT:pipeline/NAME/execution/ID)"
        )
    if pipeline is not None and match.group(1).lower() != pipeline.lower():
        raise ParameterError(
            f"--execution: an execution of pipeline {match.group(1)!r}, not of this recipe's {pipeline!r}"
        )
