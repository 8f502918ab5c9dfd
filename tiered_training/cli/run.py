"""The run commands: ``start``, ``rehearse``, ``status``, ``logs``, ``stop``, ``registry``, ``preflight`` and
``prices``.

All but ``rehearse`` call AWS, through :mod:`tiered_training.aws` (the clients come from
:func:`_clients`, after the options are checked here, with no call, exit 2 for a bad one).
``rehearse`` runs the recipe's pipeline on this machine as SageMaker would, a run too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from tiered_training.cli.base import (
    _EXECUTION,
    _RUN_RECIPE,
    _STAGE,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_MISSING_EXTRA,
    PROG,
    AwsOptions,
    Commands,
    Failure,
    TextFormat,
    _err,
    _out,
    _recipe_path,
    _run_recipe,
    set_option,
)
from tiered_training.recipe.errors import RecipeError
from tiered_training.recipe.names import pipeline_name

commands = Commands()


def _aws_failure(exc: Exception) -> Failure:
    from tiered_training.aws.session import StartError

    return Failure.of(exc, exc.exit_code if isinstance(exc, StartError) else EXIT_FAILED)


def _region(plan, aws: AwsOptions) -> tuple[str, str]:
    """The region of a recipe's commands and where it came from: ``--region``, the recipe's ``compute.region``,
    ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the AWS configuration's, else the recipe's default region, the one
    ``plan`` prices in."""
    from tiered_training import catalog as catalogs
    from tiered_training.aws.session import StartError, resolve_region, session

    resolved = resolve_region(aws.region, plan.recipe.compute.region)
    if resolved:
        source = "--region" if aws.region else "compute.region" if plan.recipe.compute.region else "the environment"
        return resolved, source
    try:
        configured = session(aws.profile).region_name
    except StartError:  # no boto3 (a dry run needs none): no AWS configuration to read
        configured = None
    if configured:
        return configured, "the AWS configuration"
    return catalogs.prices().default_region, "the recipe's default region, which plan prices in"


def _clients(
    plan,
    aws: AwsOptions,
    *services: str,
    execution: str | None = None,
    services_for: str = "this command",
    stage: str | None = None,
) -> list:
    """Clients for ``services``, after the options are checked locally (exit 2, no call, for a bad one)."""
    from tiered_training.aws.session import (
        ParameterError,
        StartError,
        aws_client,
        check_aws_options,
        check_region,
        require_boto3,
        resolve_region,
    )

    try:
        require_boto3(f"{PROG} {services_for}")
        check_aws_options(
            region=aws.region,
            endpoint_url=aws.endpoint_url,
            profile=aws.profile,
            execution=execution,
            pipeline=pipeline_name(plan.name, stage),
        )
        resolved = resolve_region(aws.region, plan.recipe.compute.region)
        if resolved is None:  # no region named: the AWS configuration's, else the one plan priced in
            resolved = _region(plan, aws)[0]
        elif aws.region is None:
            source = (
                "compute.region"
                if plan.recipe.compute.region
                else "AWS_REGION"
                if resolved == _env("AWS_REGION")
                else "AWS_DEFAULT_REGION"
            )
            check_region(resolved, source)
        arn_region = execution.split(":")[3] if execution else ""
        if arn_region and resolved and arn_region != resolved:
            raise ParameterError(
                f"--execution: an execution in {arn_region}, but the region is {resolved}; pass --region {arn_region}"
            )
        clients = [aws_client(s, region=resolved, endpoint_url=aws.endpoint_url, profile=aws.profile) for s in services]
        return clients
    except StartError as exc:  # ParameterError (exit 2) included
        raise _aws_failure(exc) from None


def _renewed(plan, aws: AwsOptions) -> tuple:
    """New sagemaker and cloudwatch clients, from a new session: they read the credentials again."""
    from tiered_training.aws.session import StartError, session

    session.cache_clear()
    try:
        sm, cw = _clients(plan, aws, "sagemaker", "cloudwatch", services_for="start")
    except Failure as failure:
        raise StartError(str(failure)) from None
    return sm, cw


def _env(name: str) -> str | None:
    import os

    return os.environ.get(name) or None


@commands.command()
def start(
    recipe: Path = _RUN_RECIPE,
    follow: bool = typer.Option(
        True, help="follow the execution until it ends: steps, loss, tokens/s against the plan, ETA"
    ),
    skip_probe: bool | None = typer.Option(None, "--skip-probe/--probe", help="start the full run without the probe"),
    max_steps: int | None = typer.Option(None, help="override the number of optimiser steps"),
    instance_count: int | None = typer.Option(None, help="override the number of instances"),
    data_uri: str | None = typer.Option(
        None, help="override the data's S3 URI (one of the recipe's data.allowed_uris)"
    ),
    resume: str | None = typer.Option(
        None, "--resume", metavar="RUN", help="resume this run (its id, from `status`) instead of starting a new one"
    ),
    aws: AwsOptions = AwsOptions(),
    poll_seconds: float = typer.Option(30.0, min=0, max=3600, help="seconds between status checks"),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json (one object at the end)"),
    stage: str | None = _STAGE,
    overrides: list[str] = typer.Option(
        [],
        "--set",
        metavar="KEY=VALUE",
        help="a field the pipeline takes as a parameter: compute.instance_count, data.uri, probe.enabled or "
        "budget.total_tokens (repeatable; checked as the file is)",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="print the pipeline and parameters it would start; no AWS call"
    ),
) -> None:
    """Start the recipe's SageMaker pipeline (a new run, or --resume RUN; the pipeline is named by the recipe's
    name: field), print the execution ARN and follow it.

    Example: tiered-training start llama3-8b-fp8 --set compute.instance_count=2 --dry-run
    """
    from tiered_training.aws import runs
    from tiered_training.aws.session import StartError
    from tiered_training.aws.start import check_parameters
    from tiered_training.aws.start import start as start_pipeline

    plan = _run_recipe(recipe)
    typed: dict[str, str] = {}
    if overrides:
        instance_count, max_steps, data_uri, skip_probe, typed = _start_overrides(
            recipe,
            overrides,
            instance_count=instance_count,
            max_steps=max_steps,
            data_uri=data_uri,
            skip_probe=skip_probe,
        )
    try:
        check_parameters(
            plan.recipe,
            instance_count=instance_count,
            max_steps=max_steps,
            data_uri=data_uri,
            resume=resume,
            plan=plan if plan.ok else None,
            typed=typed,
        )
        if dry_run:
            _print_dry_run(plan, aws, stage, format, instance_count, max_steps, data_uri, skip_probe, resume)
            return
        extra = (["cloudwatch"] if follow else []) + (["s3"] if resume else [])  # s3: the run's checkpoints and lease
        sm, *rest = _clients(plan, aws, "sagemaker", *extra, services_for="start")
        result = start_pipeline(
            plan,
            instance_count=instance_count,
            max_steps=max_steps,
            data_uri=data_uri,
            skip_probe=skip_probe,
            resume=resume,
            follow=follow,
            poll_seconds=poll_seconds,
            client=sm,
            cloudwatch=rest[0] if follow else None,
            s3=rest[-1] if resume else None,
            reporter=runs.QuietReporter() if format is TextFormat.json else None,
            stage=stage,
            renew=lambda: _renewed(plan, aws),
        )
    except StartError as exc:
        raise _aws_failure(exc) from None
    code = EXIT_FAILED if follow and not result.ok else 0
    if format is TextFormat.json:
        from tiered_training.cli.output import emit

        errors = [{"message": f"{result.status}: {result.failure_reason or 'the execution did not succeed'}"}]
        emit("start", code, pipeline=pipeline_name(plan.name, stage), errors=errors if code else [], **result.to_dict())
    if code:
        raise typer.Exit(code)


# The recipe fields a started pipeline takes as parameters (pipeline/definition.py ``parameters``); any other
# field is fixed by the deployed definition.
START_FIELDS = ("compute.instance_count", "data.uri", "probe.enabled", "budget.total_tokens")


def _start_overrides(
    recipe: Path,
    overrides: list[str],
    *,
    instance_count: int | None,
    max_steps: int | None,
    data_uri: str | None,
    skip_probe: bool | None,
) -> tuple[int | None, int | None, str | None, bool | None, dict[str, str]]:
    """``start --set``: each override checked as the file is, then given to the pipeline as its parameter;
    also, for each option an override stands for, the override as typed (for messages)."""
    from tiered_training.recipe.overrides import parse_overrides

    if str(recipe) == "-":  # read once already, for the deployed recipe
        raise Failure(["--set on start takes a recipe file or name, not standard input"], EXIT_INVALID)
    changed = _run_recipe(recipe, overrides)  # a bad override fails here, named
    problems = []
    for override in parse_overrides(overrides):
        if override.dotted not in START_FIELDS:
            problems.append(
                f"--set {override.text}: the deployed pipeline fixes {override.dotted}; start sets only "
                f"{', '.join(START_FIELDS)} (deploy the change with cdk deploy, or rehearse it)"
            )
    if problems:
        raise Failure(problems, EXIT_INVALID)
    given = {o.dotted: o for o in parse_overrides(overrides)}
    values: dict[str, tuple[str, Any, Any]] = {
        "compute.instance_count": ("--instance-count", instance_count, changed.recipe.compute.instance_count),
        "data.uri": ("--data-uri", data_uri, changed.recipe.data.uri),
        "probe.enabled": ("--skip-probe/--probe", skip_probe, not changed.recipe.probe.enabled),
        "budget.total_tokens": (
            "--max-steps",
            max_steps,
            changed.estimates.total_steps if changed.ok and changed.estimates else None,
        ),
    }
    out: list[Any] = []
    typed: dict[str, str] = {}
    for field, (option, explicit, value) in values.items():
        if field not in given:
            out.append(explicit)
            continue
        typed[option] = f"--set {given[field].text}" + (f" ({value:,} steps)" if option == "--max-steps" else "")
        if value is None:
            raise Failure(
                [f"--set {given[field].text}: the recipe's plan has errors (run tiered-training explain)"], EXIT_INVALID
            )
        if explicit is not None and explicit != value:
            raise Failure([f"--set {given[field].text} and {option} disagree: give one"], EXIT_INVALID)
        out.append(value)
    instance, uri, skip, steps = out
    return instance, steps, uri, skip, typed


def _print_dry_run(
    plan, aws: AwsOptions, stage, format, instance_count, max_steps, data_uri, skip_probe, resume
) -> None:
    """What ``start`` would start, with no AWS call: the pipeline, its region and every parameter."""
    from tiered_training.aws.session import check_aws_options
    from tiered_training.aws.start import pipeline_parameters
    from tiered_training.pipeline.definition import parameters
    from tiered_training.report.render import print_lines

    given = {
        p["Name"]: p["Value"]
        for p in pipeline_parameters(
            instance_count=instance_count, max_steps=max_steps, data_uri=data_uri, skip_probe=skip_probe, resume=resume
        )
    }
    defaults = {p["Name"]: p["DefaultValue"] for p in parameters(plan)} if plan.ok and plan.estimates else {}
    rows = [
        {"name": name, "value": given.get(name, _parameter_text(default)), "given": name in given}
        for name, default in defaults.items()
    ] + [{"name": name, "value": value, "given": True} for name, value in given.items() if name not in defaults]
    name = pipeline_name(plan.name, stage)
    check_aws_options(region=aws.region, endpoint_url=aws.endpoint_url, profile=aws.profile, pipeline=name)
    region, source = _region(plan, aws)
    if format is TextFormat.json:
        from tiered_training.cli.output import emit

        emit("start", 0, dry_run=True, pipeline=name, region=region, parameters=rows, resume=resume)
        return
    lines = [f"dry run: would start the pipeline {name} in {region}" + ("" if aws.region else f" ({source})")]
    lines += [f"  {r['name']} = {r['value']}" + ("" if r["given"] else "  (the pipeline's default)") for r in rows]
    if resume:
        lines.append(f"  (not checked without AWS: that run {resume} exists and is not running)")
    print_lines(_out(), lines)


def _parameter_text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


@commands.command()
def rehearse(
    recipe: Path = typer.Argument(..., help="a recipe file, or a recipe's name in ./recipes"),
    hosts: int = typer.Option(2, help="simulated hosts (the plan's InstanceCount is scaled to this); 1 to 8"),
    workers: int = typer.Option(2, help="CPU workers per simulated host (its 'GPUs'); 1 to 8"),
    steps: int | None = typer.Option(
        None,
        help="optimiser steps of the full run (the MaxSteps parameter), "
        "2 to 1000; default: enough for two checkpoints and the interrupt, "
        "at least 12",
    ),
    param: list[str] = typer.Option([], "--param", help="a pipeline parameter, Name=Value (repeatable)"),
    interrupt: str | None = typer.Option(
        None, help="sigterm@STEP, kill-host@save or kill-host@STEP (STEP within the run)"
    ),
    workdir: Path | None = typer.Option(
        None,
        help="the work directory: the trace, the summary, each host's /opt/ml tree and log, the exported model "
        "(default ./rehearse-out/RECIPE-UTCTIME; kept)",
    ),
    clean: bool = typer.Option(
        False, "--clean", help="remove what the rehearsal wrote in the work directory at the end"
    ),
    restart_with: list[str] = typer.Option(
        [],
        "--restart-with",
        help="then resume the same run in a second execution with this parameter, Name=Value (e.g. InstanceCount=1)",
    ),
    slow_candidate: str | None = typer.Option(
        None,
        "--slow-candidate",
        help="N[:SECONDS]: the Probe's candidate N takes SECONDS (default 0.5) longer a step, to rehearse the "
        "probe's choice by measurement (the Probe job's TIERED_TRAINING_SLOW_CANDIDATE)",
    ),
    slow_host: str | None = typer.Option(
        None,
        "--slow-host",
        help="N[:FACTOR]: simulated host N's forward/backward runs at FACTOR (default 0.5) of its speed in the "
        "training jobs, to rehearse the straggler score and its alarm (TIERED_TRAINING_SLOW_HOST)",
    ),
    data: Path | None = typer.Option(
        None,
        "--data",
        help="a file or folder of your raw examples (a fine-tuning recipe with data.prepare), rehearsed instead of "
        "the built-in ones, with the recipe's tokenizer (model.hf_id, from the local Hugging Face cache)",
    ),
    tokenizer: Path | None = typer.Option(
        None, "--tokenizer", help="with --data: the local directory of the tokenizer and chat template to use"
    ),
    format: TextFormat = typer.Option(
        TextFormat.text, "--format", "-f", help="text, or json (the summary on stdout; the trace on stderr)"
    ),
    overrides: list[str] = set_option(),
) -> None:
    """Run the recipe's pipeline on this machine as SageMaker would on N hosts (scaled-down model; exit 0 only on
    success)."""
    from tiered_training.planning.plan import PlanError
    from tiered_training.rehearse.run import (
        MissingExtra,
        Options,
        RehearsalError,
        Stopped,
        parse_params,
    )
    from tiered_training.rehearse.run import (
        rehearse as run_rehearsal,
    )

    as_json = format is TextFormat.json
    try:
        options = Options(
            _recipe_path(recipe),
            hosts=hosts,
            workers=workers,
            steps=steps,
            params=parse_params(param),
            interrupt=interrupt,
            workdir=workdir,
            clean=clean,
            then=parse_params(restart_with, "--restart-with") if restart_with else None,
            overrides=tuple(overrides),
            slow_candidate=slow_candidate,
            slow_host=slow_host,
            data=data,
            tokenizer=tokenizer,
        )
        result = run_rehearsal(options, out=sys.stderr if as_json else None)
    except Stopped as stopped:  # SIGTERM or SIGINT: the hosts are stopped; 143 or 130
        raise Failure([f"rehearse stopped by {stopped}"], stopped.exit_code) from None
    except MissingExtra as exc:
        raise Failure.of(exc, EXIT_MISSING_EXTRA) from None
    except (RecipeError, RehearsalError, PlanError, ValueError) as exc:
        raise Failure.of(exc, EXIT_INVALID) from None
    code = 0 if result.ok else EXIT_FAILED
    if as_json:
        from tiered_training.cli.output import emit

        summary = {k: v for k, v in result.to_dict().items() if k != "ok"}
        emit("rehearse", code, errors=[] if result.ok else _rehearsal_errors(summary), **summary)
    if code:
        raise typer.Exit(code)


def _rehearsal_errors(summary: dict) -> list[dict]:
    """Why a rehearsal failed: each execution that did not succeed, or the interrupt that did not happen."""
    errors = [
        {
            "message": f"execution {n}: {e['status']}"
            + (f" at {e['failed_step']}" if e.get("failed_step") else "")
            + (f": {e['failure']}" if e.get("failure") else "")
        }
        for n, e in enumerate(summary["executions"], 1)
        if e["status"] != "Succeeded"
    ]
    if not errors and summary.get("interrupt"):
        errors.append({"message": f"the interrupt {summary['interrupt']} did not happen"})
    return errors or [{"message": "the rehearsal did not succeed"}]


@commands.command()
def status(
    recipe: Path = _RUN_RECIPE,
    execution: str | None = _EXECUTION,
    stage: str | None = _STAGE,
    aws: AwsOptions = AwsOptions(),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """The status of the recipe's latest execution (or --execution), its steps, its training progress, and the
    recipe's runs with their last checkpoints."""
    from tiered_training.aws import runs
    from tiered_training.aws.run_list import list_runs, runs_uri
    from tiered_training.aws.session import StartError
    from tiered_training.report.render import print_lines

    plan = _run_recipe(recipe)
    sm, cw, s3 = _clients(
        plan, aws, "sagemaker", "cloudwatch", "s3", execution=execution, services_for="status", stage=stage
    )
    try:
        arn = execution or runs.latest_execution(sm, pipeline_name(plan.name, stage))
        snap = runs.snapshot(sm, arn, target=runs.Target.of(plan.recipe, plan if plan.ok else None), cloudwatch=cw)
    except StartError as exc:
        raise _aws_failure(exc) from None
    result = snap.result()
    probe, probe_lines, probe_problem = _probe_comparison(sm, plan, snap.steps)
    try:  # the recipe's runs: a store the caller may not read is a line, not a failure
        uri = runs_uri(sm, pipeline_name(plan.name, stage))
        listed, runs_problem = list_runs(s3, uri), None
    except StartError as exc:
        uri, listed, runs_problem = None, None, str(exc)
    if format is TextFormat.json:
        from tiered_training.cli.output import emit

        emit(
            "status",
            0,
            **result.to_dict(),
            pipeline=pipeline_name(plan.name, stage),
            runs_uri=uri,
            runs=[r.to_dict() for r in listed] if listed is not None else None,
            runs_error=runs_problem,
            probe=probe,
            probe_error=probe_problem,
        )
        return
    lines = [f"{snap.arn}", f"status: {snap.status}" + (f": {snap.failure_reason}" if snap.failure_reason else "")]
    for step in snap.steps or []:
        job = f" ({step['training_job']})" if step.get("training_job") else ""
        reason = f": {step['failure_reason']}" if step.get("failure_reason") else ""
        lines.append(f"  {step['name']}: {step['status']}{job}{reason}")
    if snap.steps is None:
        lines.append("  (the endpoint could not list the steps)")
    lines += probe_lines
    if snap.progress is not None:
        lines.append(f"training: {snap.progress.describe()}")
    if listed is not None:
        lines.append(
            f"runs ({uri}; resume one with `start --resume RUN`):" if listed else f"runs: none yet under {uri}"
        )
        lines += [f"  {run.describe()}" for run in listed]
    else:
        lines.append(f"runs: cannot list them: {runs_problem}")
    print_lines(_out(), lines)


def _probe_comparison(sm: Any, plan: Any, steps: list | None) -> tuple[dict | None, list[str], str | None]:
    """(JSON, text lines, problem) of the Probe job's measurements against the plan's candidates; a job that
    cannot be described is a line, not a failure."""
    from tiered_training.aws import probe_runs

    found, problem = probe_runs.read_for_steps(sm, steps)
    if problem is not None:
        return None, [f"probe: cannot read its measurements: {problem}"], problem
    if found is None or not plan.ok:
        return None, [], None
    rows = probe_runs.compare(plan.candidates, found)
    data = {
        "training_job": found.training_job,
        "best_candidate": found.best_candidate,
        "candidates": [r.to_dict() for r in rows],
    }
    return data, probe_runs.lines(found, rows), None


def probe_of_run(plan: Any, run: str, aws: AwsOptions, stage: str | None) -> tuple[str, dict | None, list[str]]:
    """``explain --run``: (execution ARN, JSON, text lines) of a run's probe against ``plan``'s candidates.
    ``run``: an execution ARN, or a run's id (an execution's, the last part of its ARN)."""
    from tiered_training.aws import runs
    from tiered_training.aws.session import StartError

    name = pipeline_name(plan.name, stage)
    execution = run if run.startswith("arn:") else None
    (sm,) = _clients(plan, aws, "sagemaker", execution=execution, services_for="explain --run", stage=stage)
    try:
        arn = execution or _execution_of_run(sm, name, run)
        steps = [runs.step_summary(s) for s in runs.execution_steps(sm, arn)]
    except StartError as exc:
        raise _aws_failure(exc) from None
    data, lines, problem = _probe_comparison(sm, plan, steps)
    if problem is not None:
        raise _aws_failure(StartError(problem))
    if data is None:
        lines = [f"probe: execution {arn} has no Probe job (skipped, or not started yet)"]
    return arn, data, lines


def _execution_of_run(sm: Any, pipeline: str, run: str) -> str:
    from tiered_training.aws.session import StartError, aws_errors

    with aws_errors(f"list the executions of pipeline {pipeline}"):
        pages = sm.get_paginator("list_pipeline_executions").paginate(PipelineName=pipeline)
        arns = [e["PipelineExecutionArn"] for page in pages for e in page.get("PipelineExecutionSummaries", [])]
    for arn in arns:
        if arn.rsplit("/", 1)[-1] == run:
            return arn
    raise StartError(
        f"--run {run}: pipeline {pipeline} has no execution with that id; pass an execution ARN, or a run id "
        "that `status` lists"
    )


@commands.command()
def logs(
    recipe: Path = _RUN_RECIPE,
    execution: str | None = _EXECUTION,
    stage: str | None = _STAGE,
    lines: int = typer.Option(50, "--lines", "-n", min=1, max=10_000, help="how many of the last log lines"),
    aws: AwsOptions = AwsOptions(),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """The last log lines of the training jobs of the recipe's latest execution (or --execution)."""
    from tiered_training.aws import runs
    from tiered_training.aws.session import StartError
    from tiered_training.report.render import print_lines

    plan = _run_recipe(recipe)
    sm, cwl = _clients(plan, aws, "sagemaker", "logs", execution=execution, services_for="logs", stage=stage)
    try:
        arn = execution or runs.latest_execution(sm, pipeline_name(plan.name, stage))
        steps = [runs.step_summary(s) for s in runs.execution_steps(sm, arn)]
        jobs = runs.training_jobs(steps)
        events = runs.tail_logs(cwl, jobs, lines=lines)
    except StartError as exc:
        raise _aws_failure(exc) from None
    if format is TextFormat.json:
        from tiered_training.cli.output import emit

        emit("logs", 0, execution_arn=arn, training_jobs=jobs, log_group=runs.LOG_GROUP, events=events)
        return
    if not jobs:
        print_lines(_err(), [f"{arn}: no training job has started yet"])
        return
    if not events:
        print_lines(_err(), [f"no log lines yet in {runs.LOG_GROUP} for {', '.join(jobs)}"])
        return
    print_lines(_out(), [runs.format_event(e) for e in events])


@commands.command()
def stop(
    recipe: Path = _RUN_RECIPE,
    execution: str | None = _EXECUTION,
    stage: str | None = _STAGE,
    aws: AwsOptions = AwsOptions(),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """Stop the recipe's latest execution (or --execution). Training jobs get SIGTERM and save a checkpoint."""
    from tiered_training.aws import runs
    from tiered_training.aws.session import StartError
    from tiered_training.report.render import print_lines

    plan = _run_recipe(recipe)
    (sm,) = _clients(plan, aws, "sagemaker", execution=execution, services_for="stop", stage=stage)
    try:
        arn = execution or runs.latest_execution(sm, pipeline_name(plan.name, stage))
        state = runs.stop(sm, arn)
    except StartError as exc:
        raise _aws_failure(exc) from None
    if format is TextFormat.json:
        from tiered_training.cli.output import emit

        emit("stop", 0, execution_arn=arn, status=state)
    else:
        print_lines(_out(), [f"{state}: {arn}"])


@commands.command()
def registry(
    recipe: Path = _RUN_RECIPE,
    approve: int | None = typer.Option(None, "--approve", metavar="VERSION", help="approve this version"),
    reject: int | None = typer.Option(None, "--reject", metavar="VERSION", help="reject this version"),
    note: str | None = typer.Option(None, "--note", help="the approval's description (who, why)"),
    stage: str | None = _STAGE,
    aws: AwsOptions = AwsOptions(),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """The recipe's registered models (its model package group): each version's run, plan, final metrics,
    evaluation and approval; --approve VERSION or --reject VERSION sets one's approval status."""
    from tiered_training.aws import models
    from tiered_training.aws.session import StartError
    from tiered_training.report.render import print_lines

    if approve is not None and reject is not None:
        raise Failure([{"message": "--approve and --reject: give one", "field": "--approve"}], EXIT_INVALID)
    plan = _run_recipe(recipe)
    group = pipeline_name(plan.name, stage)  # the group is named as the pipeline
    (sm,) = _clients(plan, aws, "sagemaker", services_for="registry", stage=stage)
    changed = None
    try:
        if approve is not None or reject is not None:
            version = approve if approve is not None else reject
            assert version is not None
            changed = models.set_approval(sm, group, version, "Approved" if approve is not None else "Rejected", note)
        packages = models.list_packages(sm, group)
    except StartError as exc:
        raise _aws_failure(exc) from None
    if format is TextFormat.json:
        from tiered_training.cli.output import emit

        emit("registry", 0, group=group, packages=packages, changed=changed)
        return
    lines = [f"{changed['approval']}: version {changed['version']} ({changed['arn']})"] if changed else []
    lines.append(f"model package group {group}: " + (f"{len(packages)} version(s)" if packages else "no versions yet"))
    for package in packages:
        metrics = ", ".join(f"{k}={v}" for k, v in package["metrics"].items())
        lines.append(
            f"  {package['version']}: {package['approval']}, run {package['run_id']}, plan {package['plan_hash']}"
            + (f", {metrics}" if metrics else "")
        )
        lines.append(f"     export {package['export']}; evaluation {package['evaluation']}")
    print_lines(_out(), lines)


@commands.command()
def preflight(
    recipe: Path = _RUN_RECIPE,
    image_uri: str | None = typer.Option(
        None,
        help="the training image to look for in ECR (default: the deployed "
        "pipeline's; before a deploy, the region's base image)",
    ),
    role_arn: str | None = typer.Option(
        None, help="the execution role whose read of data.uri to check (default: the deployed pipeline's)"
    ),
    stage: str | None = _STAGE,
    aws: AwsOptions = AwsOptions(),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """Check the AWS account for the recipe: quotas, image, data, MLflow, training plan, pipeline
    (exit 0 when all pass)."""
    from tiered_training.aws.preflight import preflight as run_preflight
    from tiered_training.aws.session import StartError, check_aws_options, require_boto3
    from tiered_training.report.render import print_lines

    plan = _run_recipe(recipe)
    try:
        require_boto3(f"{PROG} preflight")
        check_aws_options(region=aws.region, endpoint_url=aws.endpoint_url, profile=aws.profile)
        report = run_preflight(
            plan,
            region=aws.region,
            endpoint_url=aws.endpoint_url,
            profile=aws.profile,
            image_uri=image_uri,
            role_arn=role_arn,
            stage=stage,
        )
    except StartError as exc:  # ParameterError (exit 2) included
        raise _aws_failure(exc) from None
    if format is TextFormat.json:
        from tiered_training.cli.output import emit

        errors = [
            {"message": f"{c.check}: {c.subject}: {c.detail}", "fix": c.fix or None} for c in report.checks if c.failed
        ]
        summary = {k: v for k, v in report.to_dict().items() if k != "ok"}
        emit("preflight", 0 if report.ok else EXIT_FAILED, errors=errors, **summary)
    else:
        failed = sum(c.failed for c in report.checks)
        lines = [f"preflight {report.recipe} in {report.region}"] + [c.line() for c in report.checks]
        lines.append("all checks pass" if report.ok else f"{failed} of {len(report.checks)} checks failed")
        print_lines(_out(), lines)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


PRICE_COLUMNS = ("instance", "on-demand", "SKU", "effective", "read")


@commands.command()
def prices(
    aws: AwsOptions = AwsOptions(),
    refresh: bool = typer.Option(False, "--refresh", help="read AWS's price list again, even where it is cached"),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """SageMaker on-demand training prices in a region (--region; default: AWS_REGION, AWS_DEFAULT_REGION,
    us-east-1) from AWS's Price List API (pricing:GetProducts), kept in the user's cache for plan, explain
    and diff. Read once; --refresh reads them again."""
    from tiered_training import catalog as catalogs
    from tiered_training.catalog import price_cache
    from tiered_training.report.render import print_lines

    region = aws.region or _env("AWS_REGION") or _env("AWS_DEFAULT_REGION") or catalogs.prices().default_region
    cached: dict = {}
    try:
        cached = price_cache.load().get(region, {})
    except price_cache.PriceCacheError as error:
        if not refresh:
            raise Failure([f"{error}; pass --refresh to read the prices again"], EXIT_FAILED) from None
    if refresh or not cached:
        from tiered_training.aws import prices as price_list
        from tiered_training.aws.session import StartError, check_aws_options, require_boto3

        try:
            require_boto3(f"{PROG} prices")
            check_aws_options(region=region, endpoint_url=aws.endpoint_url, profile=aws.profile)
            client = price_list.pricing_client(endpoint_url=aws.endpoint_url, profile=aws.profile)
            found = price_list.read_prices(client, region)
        except StartError as exc:  # ParameterError (exit 2) included
            raise _aws_failure(exc) from None
        price_cache.save_region(region, found)
        cached, how = {p.instance: p for p in found}, "read from AWS's price list"
    else:
        how = "from the cache (--refresh reads them again)"
    known = catalogs.instances()
    shown = [p for name, p in sorted(cached.items()) if name in known]
    if format is TextFormat.json:
        from tiered_training.cli.output import emit

        emit(
            "prices",
            0,
            region=region,
            cache=str(price_cache.cache_path()),
            source=price_cache.SOURCE,
            prices=[vars(p) for p in sorted(cached.values(), key=lambda p: p.instance)],
        )
        return
    from tiered_training.report.render import print_table

    rows = [
        {
            "instance": p.instance,
            "on-demand": f"${p.price_per_hour:,.2f}/h",
            "SKU": p.sku,
            "effective": p.effective[:10],
            "read": p.read[:10],
        }
        for p in shown
    ]
    if rows:
        print_table(_out(), rows, PRICE_COLUMNS, numeric=("on-demand",))
    missing = sorted(set(known) - set(cached))
    lines = [
        f"SageMaker on-demand training prices in {region}, {how}: {len(cached)} instance types, "
        f"{len(shown)} of them in the instance catalogue; {price_cache.SOURCE}; cached in {price_cache.cache_path()}"
    ]
    if missing:
        lines.append(f"no price in {region} for {', '.join(missing)}")
    print_lines(_out(), lines)
