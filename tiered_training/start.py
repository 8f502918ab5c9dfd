"""``tiered-training start RECIPE``: start a recipe's pipeline execution and follow it.

A thin boto3 wrapper: ``StartPipelineExecution`` on the pipeline named after the
recipe (``recipe.name``), print the execution ARN, then poll
``DescribePipelineExecution`` (and ``ListPipelineExecutionSteps`` where the
endpoint has it) with a rich progress display until the execution ends.

Parameters are the pipeline's (``tiered_training.definition.PARAMETERS``):
``InstanceCount``, ``MaxSteps``, ``DataUri`` and ``SkipProbe``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

from .definition import P_DATA_URI, P_INSTANCE_COUNT, P_MAX_STEPS, P_SKIP_PROBE

if TYPE_CHECKING:
    from .plan import Plan

TERMINAL = frozenset({"Succeeded", "Failed", "Stopped"})
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class StartError(Exception):
    """A problem a user can fix (no such pipeline, no credentials, bad parameter); one line."""


@dataclass
class ExecutionResult:
    arn: str
    status: str
    failure_reason: str | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "Succeeded"


def pipeline_parameters(
    *,
    instance_count: int | None = None,
    max_steps: int | None = None,
    data_uri: str | None = None,
    skip_probe: bool | None = None,
) -> list[dict[str, str]]:
    """``PipelineParameters`` for the overrides given (the pipeline's defaults otherwise)."""
    values: dict[str, Any] = {
        P_INSTANCE_COUNT: instance_count,
        P_MAX_STEPS: max_steps,
        P_DATA_URI: data_uri,
        P_SKIP_PROBE: skip_probe,
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


def _pipeline_name(plan_or_recipe_path: "Plan | str | Path") -> str:
    if isinstance(plan_or_recipe_path, (str, Path)):
        from .loader import load_recipe

        return load_recipe(plan_or_recipe_path).name
    return plan_or_recipe_path.name


def _client(client: Any, region: str | None, endpoint_url: str | None, profile: str | None) -> Any:
    if client is not None:
        return client
    import boto3

    session = boto3.Session(profile_name=profile, region_name=region) if profile else boto3.Session(region_name=region)
    return session.client("sagemaker", endpoint_url=endpoint_url)


def start(
    plan_or_recipe_path: "Plan | str | Path",
    *,
    instance_count: int | None = None,
    max_steps: int | None = None,
    data_uri: str | None = None,
    skip_probe: bool | None = None,
    display_name: str | None = None,
    follow: bool = True,
    poll_seconds: float = 30.0,
    timeout_seconds: float | None = None,
    region: str | None = None,
    endpoint_url: str | None = None,
    profile: str | None = None,
    client: Any = None,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ExecutionResult:
    """Start the recipe's pipeline; print the execution ARN; follow it to the end when ``follow``.

    Raises :class:`StartError` for errors a user can fix (one readable line), and
    ``RecipeError`` for a recipe that does not load.
    """
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

    out = out or sys.stdout
    name = _pipeline_name(plan_or_recipe_path)
    try:
        sm = _client(client, region, endpoint_url, profile)
        request: dict[str, Any] = {
            "PipelineName": name,
            "PipelineParameters": pipeline_parameters(
                instance_count=instance_count, max_steps=max_steps, data_uri=data_uri, skip_probe=skip_probe
            ),
        }
        if display_name:
            request["PipelineExecutionDisplayName"] = display_name
        arn = sm.start_pipeline_execution(**request)["PipelineExecutionArn"]
    except NoRegionError:
        raise StartError("no AWS region: set AWS_REGION or pass --region") from None
    except NoCredentialsError:
        raise StartError("no AWS credentials: configure a profile or the AWS_* environment variables") from None
    except ClientError as error:
        info = error.response.get("Error", {})
        code, message = info.get("Code", "Error"), info.get("Message", str(error))
        hint = " (deploy the recipe's stack first: cdk deploy)" if "ResourceNotFound" in code or "does not exist" in message else ""
        raise StartError(f"cannot start pipeline {name}: {code}: {message}{hint}") from None
    except BotoCoreError as error:
        raise StartError(f"cannot start pipeline {name}: {error}") from None
    print(arn, file=out, flush=True)
    if not follow:
        return ExecutionResult(arn=arn, status="Executing")
    return follow_execution(sm, arn, poll_seconds=poll_seconds, timeout_seconds=timeout_seconds, out=out, sleep=sleep)


def _steps(sm: Any, arn: str) -> list[dict[str, Any]] | None:
    """The execution's steps, or None where the endpoint cannot list them."""
    from botocore.exceptions import ClientError

    try:
        return sm.list_pipeline_execution_steps(PipelineExecutionArn=arn, SortOrder="Ascending").get(
            "PipelineExecutionSteps", []
        )
    except ClientError:
        return None


def follow_execution(
    sm: Any,
    arn: str,
    *,
    poll_seconds: float = 30.0,
    timeout_seconds: float | None = None,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ExecutionResult:
    """Poll an execution until it ends, showing its status and steps as a rich progress display."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=out or sys.stdout, soft_wrap=True)
    started = time.monotonic()
    status, reason, steps = "Executing", None, []
    can_list = True
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("execution", total=None, detail="")
        step_tasks: dict[str, Any] = {}
        while True:
            described = sm.describe_pipeline_execution(PipelineExecutionArn=arn)
            status = described.get("PipelineExecutionStatus", "Unknown")
            reason = described.get("FailureReason")
            progress.update(task, description=f"execution {status}", detail=reason or "")
            if can_list:
                listed = _steps(sm, arn)
                if listed is None:
                    can_list = False
                else:
                    steps = listed
                    for step in steps:
                        step_name = step.get("StepName", "?")
                        detail = step.get("StepStatus", "")
                        if step.get("FailureReason"):
                            detail += f": {step['FailureReason']}"
                        if step_name not in step_tasks:
                            step_tasks[step_name] = progress.add_task(f"  {step_name}", total=None, detail=detail)
                        progress.update(step_tasks[step_name], detail=detail)
            if status in TERMINAL:
                progress.update(task, completed=1, total=1)
                for task_id in step_tasks.values():
                    progress.update(task_id, completed=1, total=1)
                break
            if timeout_seconds is not None and time.monotonic() - started > timeout_seconds:
                break
            sleep(poll_seconds)
    console.print(f"{status}: {arn}" + (f" ({reason})" if reason else ""))
    return ExecutionResult(arn=arn, status=status, failure_reason=reason, steps=steps)


def main(argv: list[str] | None = None) -> int:
    """``python -m tiered_training.start RECIPE [--no-follow]`` (the CLI wires the same function)."""
    import argparse

    from .errors import RecipeError

    parser = argparse.ArgumentParser(prog="tiered-training start")
    parser.add_argument("recipe")
    parser.add_argument("--instance-count", type=int)
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--data-uri")
    parser.add_argument("--skip-probe", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--no-follow", action="store_true")
    parser.add_argument("--region")
    parser.add_argument("--endpoint-url")
    parser.add_argument("--poll-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        result = start(
            args.recipe,
            instance_count=args.instance_count,
            max_steps=args.max_steps,
            data_uri=args.data_uri,
            skip_probe=args.skip_probe,
            follow=not args.no_follow,
            region=args.region,
            endpoint_url=args.endpoint_url,
            poll_seconds=args.poll_seconds,
        )
    except RecipeError as error:
        print(str(error), file=sys.stderr)
        return EXIT_USAGE
    except StartError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    if args.no_follow:
        return EXIT_OK
    return EXIT_OK if result.ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
