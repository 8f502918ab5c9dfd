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

The region, the clients and the AWS errors (one line each, :class:`StartError`) are
:mod:`tiered_training.aws.session`'s.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from tiered_training.aws import runs
from tiered_training.aws.run_list import list_runs, runs_uri
from tiered_training.aws.session import (
    ExecutionResult,
    ParameterError,
    StartError,
    aws_client,
    aws_errors,
    resolve_region,
    session,
)
from tiered_training.pipeline.definition import (
    NEW_RUN,
    P_DATA_URI,
    P_INSTANCE_COUNT,
    P_MAX_STEPS,
    P_RUN_ID,
    P_SKIP_PROBE,
)
from tiered_training.text import clip, escape

if TYPE_CHECKING:
    from tiered_training.planning.plan import Plan
    from tiered_training.recipe import Recipe

MAX_INSTANCE_COUNT = 512  # as compute.instance_count
MAX_STEPS_LIMIT = 10**9


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
    recipe: Recipe,
    *,
    instance_count: int | None = None,
    max_steps: int | None = None,
    data_uri: str | None = None,
    resume: str | None = None,
    plan: Plan | None = None,
    typed: dict[str, str] | None = None,
) -> None:
    """Raise :class:`ParameterError` naming every override that the pipeline would run wrongly with, as the
    user gave it: ``typed`` maps an option (``--instance-count``) to what stood for it (``--set ...=3``)."""
    from tiered_training.contract.runconfig import RUN_ID_PATTERN
    from tiered_training.recipe import S3_URI_MAX, S3_URI_PATTERN

    def said(option: str, value: object) -> str:
        return (typed or {}).get(option) or f"{option} {value}"

    problems = []
    if instance_count is not None and not 1 <= instance_count <= MAX_INSTANCE_COUNT:
        problems.append(f"{said('--instance-count', instance_count)}: must be 1 to {MAX_INSTANCE_COUNT}")
    elif (
        instance_count is not None
        and plan is not None
        and plan.instance_counts
        and instance_count not in plan.instance_counts
    ):
        # A resume is held to the counts a new run may use: the launcher refuses any other before compute.
        resuming = f" (resuming {resume})" if resume else ""
        problems.append(
            f"{said('--instance-count', instance_count)}{resuming}: the plan's global batch of "
            f"{recipe.budget.global_batch_tokens:,} tokens "
            f"cannot be kept on {instance_count} x {plan.instance.gpus} GPUs at the planned memory; the plan supports "
            f"{', '.join(map(str, plan.instance_counts))} (`tiered-training explain` shows compute.instance_counts)"
        )
    if resume is not None and (resume == NEW_RUN or not re.fullmatch(RUN_ID_PATTERN, resume)):
        problems.append(
            f"--resume {clip(repr(resume))}: not a run id (letters, digits, '.', '_', '-'); "
            "`tiered-training status RECIPE` lists the recipe's runs"
        )
    if max_steps is not None and not 1 <= max_steps <= MAX_STEPS_LIMIT:
        problems.append(f"{said('--max-steps', max_steps)}: must be 1 to {MAX_STEPS_LIMIT:,} steps")
    if data_uri is not None:
        allowed = ", ".join(recipe.data.data_prefixes)
        if len(data_uri) > S3_URI_MAX or not re.match(S3_URI_PATTERN, data_uri):
            problems.append(f"{said('--data-uri', clip(repr(data_uri)))}: not an S3 URI (s3://bucket/prefix/)")
        elif not recipe.data.allows(data_uri):
            problems.append(
                f"{said('--data-uri', clip(repr(data_uri)))}: not under the recipe's data.allowed_uris ({allowed}); "
                "the pipeline's role may read only those"
            )
    if problems:
        raise ParameterError("; ".join(problems))


def _recipe_and_plan(plan_or_recipe_path: Plan | str | Path) -> tuple[Recipe, Plan | None]:
    """The recipe, and its plan when it has no errors (for progress against the plan)."""
    from tiered_training.planning.plan import Plan

    if isinstance(plan_or_recipe_path, (str, Path)):
        from tiered_training.planning.planner import plan_file

        plan = plan_file(plan_or_recipe_path)
    else:
        plan = plan_or_recipe_path
    return plan.recipe, (plan if isinstance(plan, Plan) and plan.ok else None)  # a FailedPlan is never ok


def start(
    plan_or_recipe_path: Plan | str | Path,
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
    out = out or sys.stdout
    from tiered_training.recipe.names import pipeline_name

    recipe, plan = _recipe_and_plan(plan_or_recipe_path)
    name = pipeline_name(recipe.name, stage)
    check_parameters(
        recipe, instance_count=instance_count, max_steps=max_steps, data_uri=data_uri, resume=resume, plan=plan
    )
    region = resolve_region(region, recipe.compute.region)
    if client is not None:
        sm = client
    else:
        sm = aws_client("sagemaker", region=region, endpoint_url=endpoint_url, profile=profile)
    request: dict[str, Any] = {
        "PipelineName": name,
        "PipelineParameters": pipeline_parameters(
            instance_count=instance_count, max_steps=max_steps, data_uri=data_uri, skip_probe=skip_probe, resume=resume
        ),
    }
    if resume is not None and (s3 is not None or client is None):
        check_resumable(
            sm,
            s3 if s3 is not None else aws_client("s3", region=region, endpoint_url=endpoint_url, profile=profile),
            name,
            resume,
            data_uri,
        )
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
            session.cache_clear()
            return (
                aws_client("sagemaker", region=region, endpoint_url=endpoint_url, profile=profile),
                aws_client("cloudwatch", region=region, endpoint_url=endpoint_url, profile=profile),
            )

    target = runs.Target.of(recipe, plan, instance_count=instance_count, max_steps=max_steps)
    return runs.follow(
        sm,
        arn,
        target=target,
        cloudwatch=cloudwatch,
        poll_seconds=poll_seconds,
        timeout_seconds=timeout_seconds,
        reporter=reporter or runs.reporter_for(out),
        sleep=sleep,
        renew=renew,
    )


def check_resumable(sm: Any, s3: Any, pipeline_name: str, run_id: str, data_uri: str | None) -> None:
    """Refuse, before the execution starts (and instances are paid for), a resume of a run that has no committed
    checkpoint in the store, or with other data than the run's. A store this caller cannot read is left to the
    launcher, which checks the same before compute."""
    try:
        uri = runs_uri(sm, pipeline_name)
        listed = {run.run_id: run for run in list_runs(s3, uri)}
    except StartError:
        return
    run = listed.get(run_id)
    if run is None or run.last_step is None:
        known = ", ".join(sorted(r for r, v in listed.items() if v.last_step is not None)) or "none"
        raise ParameterError(
            f"--resume {run_id}: the run has no committed checkpoint in the store "
            f"(runs that can be resumed: {known}; `tiered-training status` lists them)"
        )
    if data_uri is not None and run.data_uri and data_uri != run.data_uri:
        raise ParameterError(
            f"--resume {run_id} --data-uri {data_uri}: the run trains on {run.data_uri}; resume it "
            "without --data-uri, or start a new run on the other data"
        )
    check_lease(s3, f"{uri.rstrip('/')}/{run_id}/", run_id)


def check_lease(s3: Any, run_uri: str, run_id: str, now: Callable[[], float] = time.time) -> None:
    """Refuse to resume a run while another execution holds its lease (tiered_training/contract/lease.py), naming
    that execution. A stale lease (not renewed for ``STALE_SECONDS``) is left for the new job to take over; a lease
    this caller cannot read is left to the launcher, which takes it before compute."""
    from tiered_training.contract import lease

    try:
        held = lease.read(s3, lease.lease_uri(run_uri))
    except Exception:  # noqa: BLE001 - botocore's errors (access denied, no connection): the launcher decides
        return
    if held is not None and held.live(now()):
        raise StartError(
            f"--resume {run_id}: {held.describe(now())}; one execution trains a run at a time. Wait for it to end "
            f"or stop it (`tiered-training stop`); a lease not renewed for {lease.STALE_SECONDS} s is stale",
            code="RunLeased",
        )
