"""The ``tiered-training`` command line.

Review: ``plan``, ``validate``, ``explain``, ``diff``, ``tiers``, ``models``,
``instances``, ``run-config``, ``schema``. The account: ``preflight``. Runs: ``rehearse``,
``start``, ``status``, ``logs``, ``stop``. A command that takes one recipe takes its file or its
name (the pipeline name, its ``name:``) in ./recipes.

Every command takes ``--format json``, and its errors appear in the JSON too
(``{"ok": false, "exit_code": N, "errors": [...]}``) as well as one line each on stderr.
Exit codes: 0 when everything is fine; 1 when AWS refuses or a run fails; 2 for invalid
input: a recipe that does not load or whose plan has errors (``diff`` included), a bad
option or value (checked here: no AWS call is made), or no recipes at all.
"""

from __future__ import annotations

import functools
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
import typer.core

from tiered_training.recipe.errors import Problem, RecipeError
from tiered_training.text import escape
from tiered_training.recipe.names import pipeline_name, stage_problem

PROG = "tiered-training"


class Failure(Exception):
    """What a command reports instead of its result: one or more one-line errors and an exit code.

    A command raises it; :func:`_reports_failures` prints it as ``error: ...`` lines on
    stderr and, under ``--format json``, as ``{"ok": false, "exit_code": N, "errors": [...]}``
    on stdout too, so that every error a command can meet reaches a machine reader.
    """

    def __init__(self, errors: list, code: int):
        self.errors = [e if isinstance(e, dict) else {"message": str(e)} for e in errors]
        self.code = code
        super().__init__("; ".join(e.get("text", e["message"]) for e in self.errors))

    @classmethod
    def of(cls, exc: Exception, code: int) -> "Failure":
        """From a RecipeError (one entry per problem), a PlanError (per finding) or any one-line error."""
        from tiered_training.planning.plan import PlanError

        if isinstance(exc, RecipeError):
            return cls([p.to_dict() | {"text": str(p)} for p in exc.problems], code)
        if isinstance(exc, PlanError):
            from tiered_training.report import format_finding

            plan = exc.plan
            return cls([{"file": plan.source, "code": f.code, "field": f.field, "message": f.message, "fix": f.fix,
                         "text": format_finding(plan, f)} for f in plan.errors], code)
        return cls([{"message": " ".join(str(exc).split())}], code)

    def data(self) -> dict:
        return {"ok": False, "exit_code": self.code, "errors": [{k: v for k, v in e.items() if k != "text"} for e in self.errors]}

    def lines(self) -> list[str]:
        return [f"error: {e.get('text', e['message'])}" for e in self.errors]


def _json_requested(args) -> bool:
    """Whether a command line asks for ``--format json`` (read before click parses it)."""
    args = list(args or [])
    for index, arg in enumerate(args):
        if arg in ("--format", "-f") and index + 1 < len(args) and args[index + 1] == "json":
            return True
        if arg in ("--format=json", "-fjson"):
            return True
    return False


def _emit_failure(failure: Failure, as_json: bool) -> None:
    """The errors on stderr, one line each; under ``--format json`` also as JSON on stdout."""
    from tiered_training.report.render import console, print_json, print_lines

    if as_json:
        print_json(failure.data())
    print_lines(console(stderr=True), failure.lines())


# click's UsageError (typer vendors click from 0.22 on): the base of typer.BadParameter.
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class _Command(typer.core.TyperCommand):
    """A command whose usage errors (bad option value, missing argument) are one line, or JSON."""

    def make_context(self, info_name, args, parent=None, **extra):
        as_json = _json_requested(args)
        try:
            return super().make_context(info_name, list(args), parent=parent, **extra)
        except _UsageError as exc:
            message = " ".join(exc.format_message().split())
            hint = f" (see {PROG} {info_name} --help)"
            _emit_failure(Failure([{"message": message + hint}], EXIT_INVALID), as_json)
            raise typer.Exit(EXIT_INVALID) from None


class _Group(typer.core.TyperGroup):
    """The app: an unknown command or option is one line too."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, list(args), parent=parent, **extra)
        except _UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # no arguments: the help, as click shows it
                raise
            message = " ".join(exc.format_message().split())
            _emit_failure(Failure([{"message": f"{message} (see {PROG} --help)"}], EXIT_INVALID), _json_requested(args))
            raise typer.Exit(EXIT_INVALID) from None

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except _UsageError as exc:
            message = " ".join(exc.format_message().split())
            _emit_failure(Failure([{"message": f"{message} (see {PROG} --help)"}], EXIT_INVALID), _json_requested(args))
            raise typer.Exit(EXIT_INVALID) from None


def _reports_failures(fn):
    """Run a command; a :class:`Failure` is reported in the command's ``--format`` and ends it with its code."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Failure as failure:
            fmt = kwargs.get("format")
            _emit_failure(failure, getattr(fmt, "value", fmt) == "json")
            raise typer.Exit(failure.code) from None

    return run


class _App(typer.Typer):
    """Every command gets one-line (or JSON) usage errors and :class:`Failure` reporting."""

    def command(self, *args, cls=None, **kwargs):
        register = super().command(*args, cls=cls or _Command, **kwargs)

        def decorator(fn):
            register(_reports_failures(fn))
            return fn

        return decorator


app = _App(
    cls=_Group,
    name=PROG,
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Plan, check and compare SageMaker training recipes; start and follow their runs.",
)

EXIT_FAILED = 1
EXIT_INVALID = 2


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    json = "json"


class TextFormat(str, Enum):
    text = "text"
    json = "json"


class JsonFormat(str, Enum):
    json = "json"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"{PROG} {version()}")
        raise typer.Exit()


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        return installed(PROG)
    except PackageNotFoundError:
        from tiered_training import __version__

        return __version__


@app.callback()
def _main(
    _show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version and exit"),
) -> None:
    """Plan, check and compare SageMaker training recipes; start and follow their runs."""


def _out():
    from tiered_training.report.render import console

    return console()


def _err():
    from tiered_training.report.render import console

    return console(stderr=True)


def _load_plans(paths: list[Path]) -> tuple[list, list[RecipeError]]:
    """Plans of the recipes ``paths`` name, and the recipes that failed to load.

    No recipe at all is a failure too ("no recipes found").
    """
    from tiered_training.recipe.loader import find_recipes
    from tiered_training.planning.planner import plan_file
    from tiered_training.planning.quotas import with_account

    named, failures = [], []
    for path in paths:
        try:
            named.append(_recipe_path(path))
        except RecipeError as exc:
            failures.append(exc)
    files, unreadable = find_recipes(named)
    failures += unreadable
    account = _account_quotas(failures)
    plans = []
    for path in files:
        try:
            plans.append(with_account(plan_file(path), account))
        except RecipeError as exc:
            failures.append(exc)
    if not plans and not failures:
        where = ", ".join(map(str, paths)) or "."
        failures.append(RecipeError([Problem(where, None, "", "no recipes found (*.yaml or *.yml)")]))
    return plans, failures


def _account_quotas(failures: list[RecipeError]) -> dict[str, float]:
    """The applied quotas in ./cdk.json's context (``"quotas": {name: value}``), shared by every recipe."""
    from tiered_training.planning.alarms import app_context
    from tiered_training.planning.quotas import parse_account

    try:
        return parse_account(app_context().get("quotas"), "cdk.json: context.quotas")
    except ValueError as exc:
        failures.append(RecipeError([Problem("cdk.json", None, "context.quotas", str(exc).split(": ", 2)[-1])]))
        return {}


def _report_failures(failures: list[RecipeError]) -> None:
    from tiered_training.report.render import print_lines

    err = _err()
    lines = []
    for failure in failures:
        text = str(failure).splitlines()
        lines += [f"error: {text[0]}"] + text[1:]
    print_lines(err, lines)


def _report_findings(plans: list, *, strict: bool = False) -> None:
    """Errors (and warnings under ``strict``) on stderr; other warnings on stdout."""
    from tiered_training import report
    from tiered_training.report.render import print_lines

    out, err = _out(), _err()
    for plan in plans:
        blocking = plan.errors + (plan.warnings if strict else [])
        for finding in plan.findings:
            if finding.severity != "info":
                print_lines(err if finding in blocking else out, [report.format_finding(plan, finding)])


def _print(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def _exit_for(plans: list, failures: list) -> None:
    if failures or any(not p.ok for p in plans):
        raise typer.Exit(EXIT_INVALID)


@app.command()
def plan(
    recipes: list[Path] = typer.Argument(..., help="recipe files or directories"),
    format: Format = typer.Option(Format.table, "--format", "-f", help="table, markdown (for a pull request) or json"),
    chart: Optional[Path] = typer.Option(None, help="draw the per-GPU memory breakdown to this PNG (needs the 'plot' extra)"),
) -> None:
    """Resolve recipes into plans and print them."""
    from tiered_training import report
    from tiered_training.report.render import print_json

    plans, failures = _load_plans(recipes)
    if format is Format.json:
        print_json(report.plans_data(plans, failures))
    elif format is Format.markdown:
        _print(report.plans_markdown(plans))
    else:
        _print_table(plans)
    if chart is not None and plans:
        from tiered_training.report.chart import memory_chart

        memory_chart(plans, chart)
        _err().print(f"memory chart written to {chart}")
    if format is not Format.json:
        _report_failures(failures)
    _exit_for(plans, failures)


def _print_table(plans: list) -> None:
    from tiered_training import report
    from tiered_training.report.render import print_lines, print_table

    if not plans:
        return
    out = _out()
    print_table(out, [report.summary_row(p) for p in plans], report.COLUMNS, numeric=report.NUMERIC_COLUMNS)
    lines = [report.format_finding(p, f) for p in plans for f in p.findings if f.severity != "info"]
    print_lines(out, lines)


@app.command()
def validate(
    recipes: list[Path] = typer.Argument(..., help="recipe files or directories"),
    strict: bool = typer.Option(False, help="treat warnings as errors"),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """Exit 0 when every recipe is valid and plannable, 2 otherwise."""
    from tiered_training import report
    from tiered_training.planning.alarms import with_routing_findings
    from tiered_training.report.render import print_json, print_lines

    plans, failures = _load_plans(recipes)
    plans = [with_routing_findings(p) for p in plans]  # alarms that reach no one (./cdk.json's context)
    data = report.validate_data(plans, failures, strict)
    if format is TextFormat.json:
        print_json(data)
    else:
        _report_failures(failures)
        _report_findings(plans, strict=strict)
        print_lines(_out(), [f"{escape(p.source)}: ok" for p in plans if next(r for r in data["recipes"] if r["source"] == p.source)["ok"]])
        bad = sum(not r["ok"] for r in data["recipes"])
        if bad and len(data["recipes"]) > 1:
            print_lines(_err(), [f"{bad} of {len(data['recipes'])} recipes invalid"])
    if not data["ok"]:
        raise typer.Exit(EXIT_INVALID)


@app.command()
def explain(
    recipe: Path = typer.Argument(..., help="a recipe file"),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """Show every decision with its reason, the memory proof, the estimates and every finding."""
    from tiered_training import report
    from tiered_training.report.render import print_json, print_lines

    plans, failures = _load_plans([recipe])
    if format is TextFormat.json:
        print_json(report.plans_data(plans, failures))
    else:
        _report_failures(failures)
        out = _out()
        for plan in plans:
            print_lines(out, report.explain_lines(plan))
    _exit_for(plans, failures)


@app.command()
def diff(
    old: Path = typer.Argument(..., help="the recipe before the change"),
    new: Path = typer.Argument(..., help="the recipe after the change"),
    format: Format = typer.Option(Format.table, "--format", "-f"),
) -> None:
    """Compare two resolved plans: changed decisions and memory, throughput, time and cost deltas.

    Exit 2, and no comparison, when either recipe is invalid or its plan has errors.
    """
    from tiered_training import report
    from tiered_training.report.render import dumps, print_lines

    plans, failures = _load_plans([old, new])
    broken = [p for p in plans if not p.ok]
    if failures or broken or len(plans) != 2:
        if format is Format.json:
            _print(dumps(report.plans_data(plans, failures) | {"diff": None}))
        else:
            _report_failures(failures)
            _report_findings(broken)
        raise typer.Exit(EXIT_INVALID)
    result = report.diff(plans[0], plans[1])
    if format is Format.json:
        _print(dumps(result))
    elif format is Format.markdown:
        _print(report.diff_markdown(result))
    else:
        print_lines(_out(), report.diff_text(result).splitlines())


@app.command()
def tiers(format: Format = typer.Option(Format.table, "--format", "-f")) -> None:
    """Print the size-tiered guidance the planner applies."""
    from tiered_training import report
    from tiered_training.report.render import print_json, print_table

    if format is Format.json:
        print_json(report.tiers_data())
    elif format is Format.markdown:
        _print(report.markdown_table(report.tier_rows(), report.TIER_COLUMNS))
    else:
        print_table(_out(), report.tier_rows(), report.TIER_COLUMNS, show_lines=True)


MODEL_COLUMNS = ("id", "parameters", "layers", "hidden", "context", "name")
INSTANCE_COLUMNS = ("instance", "GPUs", "HBM/GPU", "FP8", "EFA", "on-demand", "spot (est.)", "price source")


@app.command()
@_reports_failures
def models(
    format: Format = typer.Option(Format.table, "--format", "-f"),
    from_config: Path | None = typer.Option(
        None, "--from-config", help="a Hugging Face checkpoint directory or its config.json: print the catalogue entry it gives (YAML)"
    ),
) -> None:
    """List the model catalogue, or (--from-config) print the catalogue entry a Hugging Face config gives."""
    from tiered_training import report
    from tiered_training.report.render import print_json, print_table

    if from_config is not None:
        from tiered_training.contract import hf_config

        try:
            text = hf_config.catalog_entry(from_config)
        except hf_config.ConfigError as exc:
            raise Failure([str(exc)], EXIT_INVALID) from None
        if format is Format.json:
            import yaml

            print_json({"schema_version": report.SCHEMA_VERSION, "models": yaml.safe_load(text)})
        else:
            _print(text.rstrip("\n"))
        return
    data = report.models_data()
    if format is Format.json:
        print_json(data)
        return
    rows = [
        {
            "id": m["id"],
            "parameters": f"{m['parameters'] / 1e9:,.2f}B",
            "layers": str(m["architecture"]["layers"]),
            "hidden": str(m["architecture"]["hidden_size"]),
            "context": f"{m['architecture']['max_sequence_length']:,}",
            "name": m["display_name"],
        }
        for m in data["models"]
    ]
    if format is Format.markdown:
        _print(report.markdown_table(rows, MODEL_COLUMNS))
    else:
        print_table(_out(), rows, MODEL_COLUMNS, numeric=("parameters", "layers", "hidden", "context"))


def _price_region(value: Optional[str]) -> Optional[str]:
    import re

    from tiered_training.aws.start import REGION_PATTERN

    if value is not None and (len(value) > 32 or not re.match(REGION_PATTERN, value)):
        raise typer.BadParameter(f"{value[:40]!r}: not an AWS region name (like us-east-1)")
    return value


@app.command("instances")
def list_instances(
    format: Format = typer.Option(Format.table, "--format", "-f"),
    region: Optional[str] = typer.Option(None, callback=_price_region,
                                         help="the region whose SageMaker training prices to show (default: the price catalogue's, us-east-1)"),
) -> None:
    """List the instance catalogue with SageMaker training prices (spot: the catalogue's expected discount, an estimate)."""
    from tiered_training import report
    from tiered_training.report.render import print_json, print_table

    data = report.instances_data(region)
    if format is Format.json:
        print_json(data)
        return
    rows = [
        {
            "instance": i["name"],
            "GPUs": f"{i['gpus']}x {i['gpu']}",
            "HBM/GPU": f"{i['usable_hbm_gib']:g} GiB",
            "FP8": "FP8+MXFP8" if i["mxfp8"] else ("FP8" if i["peak_fp8_tflops"] else "-"),
            "EFA": f"{i['efa_gbps']:,} Gbps",
            "on-demand": "-" if i["price_per_hour"] is None else f"${i['price_per_hour']:,.2f}/h",
            "spot (est.)": "-" if i["spot_price_per_hour"] is None else f"${i['spot_price_per_hour']:,.2f}/h",
            "price source": i["price_source"] if i["price_per_hour"] is not None else f"no SageMaker training price for {data['region']} in the catalogue",
        }
        for i in data["instances"]
    ]
    if format is Format.markdown:
        _print(report.markdown_table(rows, INSTANCE_COLUMNS))
    else:
        print_table(_out(), rows, INSTANCE_COLUMNS, numeric=("HBM/GPU", "EFA", "on-demand", "spot (est.)"))


@app.command("run-config")
def run_config(
    recipe: Path = typer.Argument(..., help="a recipe file, or a recipe's name in ./recipes"),
    hyperparameters: bool = typer.Option(False, help="print SageMaker hyperparameters instead of the RunConfig"),
    format: JsonFormat = typer.Option(JsonFormat.json, "--format", "-f", help="json (the only format)"),
) -> None:
    """Print the RunConfig the training container receives (to run it outside SageMaker)."""
    from tiered_training.planning.plan import PlanError
    from tiered_training.report.render import dumps

    plan = _run_recipe(recipe)
    try:
        config = plan.run_config()
    except PlanError as exc:
        raise Failure.of(exc, EXIT_INVALID)
    _print(dumps(config.to_hyperparameters()) if hyperparameters else config.to_json())


@app.command()
def schema(
    format: JsonFormat = typer.Option(JsonFormat.json, "--format", "-f", help="json (the only format)"),
) -> None:
    """Print the recipe's JSON Schema (docs/recipe.schema.json; the templates name it for editor completion)."""
    from tiered_training.recipe.schema import schema_text

    _print(schema_text())


# -- recipes by name ---------------------------------------------------------------------

RECIPES_DIR = Path("recipes")


def _recipe_path(recipe: Path) -> Path:
    """``recipe`` itself, or the recipe in ./recipes that ``recipe`` names (its pipeline name or file stem)."""
    from tiered_training.recipe.loader import recipe_by_name

    if recipe.exists() or recipe.is_symlink() or recipe.suffix in (".yaml", ".yml") or len(recipe.parts) != 1:
        return recipe
    found, names = recipe_by_name(str(recipe), RECIPES_DIR)
    if found is not None:
        return found
    known = f"the recipes in {RECIPES_DIR}/ are named {', '.join(names)}" if names else f"no recipes in {RECIPES_DIR}/"
    raise RecipeError([Problem(str(recipe), None, "", f"no such recipe file, nor a recipe of that name ({known})")])


# -- runs ----------------------------------------------------------------------------

_REGION = typer.Option(None, help="AWS region (default: the recipe's compute.region, AWS_REGION, AWS_DEFAULT_REGION, your AWS configuration)")
_ENDPOINT = typer.Option(None, help="AWS endpoint URL for every service (for testing)")
_PROFILE = typer.Option(None, help="AWS profile")
_EXECUTION = typer.Option(None, "--execution", help="an execution ARN (default: the pipeline's latest)")
def _check_stage(value: Optional[str]) -> Optional[str]:
    problem = stage_problem(value)
    if problem:
        raise typer.BadParameter(problem)
    return value


_STAGE = typer.Option(None, "--stage", callback=_check_stage, help="the stage the app was deployed with (cdk -c stage=...): its pipeline is <stage>-<recipe>")


_RUN_RECIPE = typer.Argument(..., help="a recipe file whose stack is deployed, or its name (the pipeline's) in ./recipes")


def _run_recipe(recipe: Path):
    """The recipe's plan (or RecipeError, reported as invalid input)."""
    from tiered_training.planning.planner import plan_file

    try:
        return plan_file(_recipe_path(recipe))
    except RecipeError as exc:
        raise Failure.of(exc, EXIT_INVALID)


def _aws_failure(exc: Exception) -> Failure:
    from tiered_training.aws.start import StartError

    return Failure.of(exc, exc.exit_code if isinstance(exc, StartError) else EXIT_FAILED)


def _clients(plan, region: Optional[str], endpoint_url: Optional[str], profile: Optional[str], *services: str,
             execution: Optional[str] = None, services_for: str = "this command", stage: Optional[str] = None) -> list:
    """Clients for ``services``, after the options are checked locally (exit 2, no call, for a bad one)."""
    from tiered_training.aws.start import ParameterError, StartError, aws_client, check_aws_options, check_region, resolve_region, require_boto3

    try:
        require_boto3(f"{PROG} {services_for}")
        check_aws_options(region=region, endpoint_url=endpoint_url, profile=profile, execution=execution, pipeline=pipeline_name(plan.name, stage))
        resolved = resolve_region(region, plan.recipe.compute.region)
        if region is None and resolved is not None:
            source = "compute.region" if plan.recipe.compute.region else "AWS_REGION" if resolved == _env("AWS_REGION") else "AWS_DEFAULT_REGION"
            check_region(resolved, source)
        arn_region = execution.split(":")[3] if execution else ""
        if arn_region and resolved and arn_region != resolved:
            raise ParameterError(f"--execution: an execution in {arn_region}, but the region is {resolved}; pass --region {arn_region}")
        return [aws_client(s, region=resolved, endpoint_url=endpoint_url, profile=profile) for s in services]
    except StartError as exc:  # ParameterError (exit 2) included
        raise _aws_failure(exc) from None


def _renewed(plan, region: Optional[str], endpoint_url: Optional[str], profile: Optional[str]) -> tuple:
    """New sagemaker and cloudwatch clients, from a new session: they read the credentials again."""
    from tiered_training.aws.start import StartError, _session

    _session.cache_clear()
    try:
        sm, cw = _clients(plan, region, endpoint_url, profile, "sagemaker", "cloudwatch", services_for="start")
    except Failure as failure:
        raise StartError(str(failure)) from None
    return sm, cw


def _env(name: str) -> Optional[str]:
    import os

    return os.environ.get(name) or None


@app.command()
def start(
    recipe: Path = _RUN_RECIPE,
    follow: bool = typer.Option(True, help="follow the execution until it ends: steps, loss, tokens/s against the plan, ETA"),
    skip_probe: Optional[bool] = typer.Option(None, "--skip-probe/--probe", help="start the full run without the probe"),
    max_steps: Optional[int] = typer.Option(None, help="override the number of optimiser steps"),
    instance_count: Optional[int] = typer.Option(None, help="override the number of instances"),
    data_uri: Optional[str] = typer.Option(None, help="override the data's S3 URI (one of the recipe's data.allowed_uris)"),
    resume: Optional[str] = typer.Option(None, "--resume", metavar="RUN",
                                         help="resume this run (its id, from `status`) instead of starting a new one"),
    region: Optional[str] = _REGION,
    endpoint_url: Optional[str] = _ENDPOINT,
    profile: Optional[str] = _PROFILE,
    poll_seconds: float = typer.Option(30.0, min=0, max=3600, help="seconds between status checks"),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json (one object at the end)"),
    stage: Optional[str] = _STAGE,
) -> None:
    """Start the recipe's SageMaker pipeline (a new run, or --resume RUN; the pipeline is named by the recipe's name: field), print the execution ARN and follow it."""
    from tiered_training.aws import runs
    from tiered_training.report.render import print_json
    from tiered_training.aws.start import StartError, check_parameters, start as start_pipeline

    plan = _run_recipe(recipe)
    try:
        check_parameters(plan.recipe, instance_count=instance_count, max_steps=max_steps, data_uri=data_uri)
        sm, *rest = _clients(plan, region, endpoint_url, profile, "sagemaker", *(["cloudwatch"] if follow else []), services_for="start")
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
            cloudwatch=rest[0] if rest else None,
            reporter=runs.QuietReporter() if format is TextFormat.json else None,
            stage=stage,
            renew=lambda: _renewed(plan, region, endpoint_url, profile),
        )
    except StartError as exc:
        raise _aws_failure(exc)
    if format is TextFormat.json:
        print_json(result.to_dict() | {"ok": result.ok or not follow, "pipeline": plan.name})
    if follow and not result.ok:
        raise typer.Exit(EXIT_FAILED)


@app.command()
def rehearse(
    recipe: Path = typer.Argument(..., help="a recipe file, or a recipe's name in ./recipes"),
    hosts: int = typer.Option(2, help="simulated hosts (the plan's InstanceCount is scaled to this); 1 to 8"),
    workers: int = typer.Option(2, help="CPU workers per simulated host (its 'GPUs'); 1 to 8"),
    steps: Optional[int] = typer.Option(None, help="optimiser steps of the full run (the MaxSteps parameter), 2 to 1000; "
                                        "default: enough for two checkpoints and the interrupt, at least 12"),
    param: list[str] = typer.Option([], "--param", help="a pipeline parameter, Name=Value (repeatable)"),
    interrupt: Optional[str] = typer.Option(None, help="sigterm@STEP, kill-host@save or kill-host@STEP (STEP within the run)"),
    workdir: Optional[Path] = typer.Option(None, help="keep each host's /opt/ml tree and logs here (a directory)"),
    restart_with: list[str] = typer.Option([], "--restart-with", help="then resume the same run in a second execution with this parameter, Name=Value (e.g. InstanceCount=1)"),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text, or json (the summary on stdout; the trace on stderr)"),
) -> None:
    """Run the recipe's pipeline on this machine as SageMaker would on N hosts (scaled-down model; exit 0 only on success)."""
    from tiered_training.planning.plan import PlanError
    from tiered_training.rehearse.run import MissingExtra, Options, RehearsalError, parse_params, rehearse as run_rehearsal
    from tiered_training.report.render import print_json

    as_json = format is TextFormat.json
    try:
        options = Options(_recipe_path(recipe), hosts=hosts, workers=workers, steps=steps, params=parse_params(param),
                          interrupt=interrupt, workdir=workdir,
                          then=parse_params(restart_with, "--restart-with") if restart_with else None)
        result = run_rehearsal(options, out=sys.stderr if as_json else None)
    except MissingExtra as exc:
        raise Failure.of(exc, EXIT_FAILED)
    except (RecipeError, RehearsalError, PlanError, ValueError) as exc:
        raise Failure.of(exc, EXIT_INVALID)
    if as_json:
        print_json(result.to_dict())
    if not result.ok:
        raise typer.Exit(EXIT_FAILED)


@app.command()
def status(
    recipe: Path = _RUN_RECIPE,
    execution: Optional[str] = _EXECUTION,
    stage: Optional[str] = _STAGE,
    region: Optional[str] = _REGION,
    endpoint_url: Optional[str] = _ENDPOINT,
    profile: Optional[str] = _PROFILE,
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """The status of the recipe's latest execution (or --execution), its steps, its training progress, and the
    recipe's runs with their last checkpoints."""
    from tiered_training.aws import runs
    from tiered_training.report.render import print_json, print_lines
    from tiered_training.aws.start import StartError

    from tiered_training.aws.run_list import list_runs, runs_uri

    plan = _run_recipe(recipe)
    sm, cw, s3 = _clients(plan, region, endpoint_url, profile, "sagemaker", "cloudwatch", "s3", execution=execution,
                          services_for="status", stage=stage)
    try:
        arn = execution or runs.latest_execution(sm, pipeline_name(plan.name, stage))
        snap = runs.snapshot(sm, arn, target=runs.Target.of(plan.recipe, plan if plan.ok else None), cloudwatch=cw)
    except StartError as exc:
        raise _aws_failure(exc)
    result = snap.result()
    try:  # the recipe's runs: a store the caller may not read is a line, not a failure
        uri = runs_uri(sm, pipeline_name(plan.name, stage))
        listed, runs_problem = list_runs(s3, uri), None
    except StartError as exc:
        uri, listed, runs_problem = None, None, str(exc)
    if format is TextFormat.json:
        print_json({**result.to_dict(), "ok": True, "pipeline": pipeline_name(plan.name, stage), "runs_uri": uri,
                    "runs": [r.to_dict() for r in listed] if listed is not None else None, "runs_error": runs_problem})
        return
    lines = [f"{snap.arn}", f"status: {snap.status}" + (f": {snap.failure_reason}" if snap.failure_reason else "")]
    for step in snap.steps or []:
        job = f" ({step['training_job']})" if step.get("training_job") else ""
        reason = f": {step['failure_reason']}" if step.get("failure_reason") else ""
        lines.append(f"  {step['name']}: {step['status']}{job}{reason}")
    if snap.steps is None:
        lines.append("  (the endpoint could not list the steps)")
    if snap.progress is not None:
        lines.append(f"training: {snap.progress.describe()}")
    if listed is not None:
        lines.append(f"runs ({uri}; resume one with `start --resume RUN`):" if listed else f"runs: none yet under {uri}")
        lines += [f"  {run.describe()}" for run in listed]
    else:
        lines.append(f"runs: cannot list them: {runs_problem}")
    print_lines(_out(), lines)


@app.command()
def logs(
    recipe: Path = _RUN_RECIPE,
    execution: Optional[str] = _EXECUTION,
    stage: Optional[str] = _STAGE,
    lines: int = typer.Option(50, "--lines", "-n", min=1, max=10_000, help="how many of the last log lines"),
    region: Optional[str] = _REGION,
    endpoint_url: Optional[str] = _ENDPOINT,
    profile: Optional[str] = _PROFILE,
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """The last log lines of the training jobs of the recipe's latest execution (or --execution)."""
    from tiered_training.aws import runs
    from tiered_training.report.render import print_json, print_lines
    from tiered_training.aws.start import StartError

    plan = _run_recipe(recipe)
    sm, cwl = _clients(plan, region, endpoint_url, profile, "sagemaker", "logs", execution=execution, services_for="logs",
                       stage=stage)
    try:
        arn = execution or runs.latest_execution(sm, pipeline_name(plan.name, stage))
        steps = [runs.step_summary(s) for s in runs.execution_steps(sm, arn)]
        jobs = runs.training_jobs(steps)
        events = runs.tail_logs(cwl, jobs, lines=lines)
    except StartError as exc:
        raise _aws_failure(exc)
    if format is TextFormat.json:
        print_json({"ok": True, "execution_arn": arn, "training_jobs": jobs, "log_group": runs.LOG_GROUP, "events": events})
        return
    if not jobs:
        print_lines(_err(), [f"{arn}: no training job has started yet"])
        return
    if not events:
        print_lines(_err(), [f"no log lines yet in {runs.LOG_GROUP} for {', '.join(jobs)}"])
        return
    print_lines(_out(), [runs.format_event(e) for e in events])


@app.command()
def stop(
    recipe: Path = _RUN_RECIPE,
    execution: Optional[str] = _EXECUTION,
    stage: Optional[str] = _STAGE,
    region: Optional[str] = _REGION,
    endpoint_url: Optional[str] = _ENDPOINT,
    profile: Optional[str] = _PROFILE,
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """Stop the recipe's latest execution (or --execution). Training jobs get SIGTERM and save a checkpoint."""
    from tiered_training.aws import runs
    from tiered_training.report.render import print_json, print_lines
    from tiered_training.aws.start import StartError

    plan = _run_recipe(recipe)
    (sm,) = _clients(plan, region, endpoint_url, profile, "sagemaker", execution=execution, services_for="stop", stage=stage)
    try:
        arn = execution or runs.latest_execution(sm, pipeline_name(plan.name, stage))
        state = runs.stop(sm, arn)
    except StartError as exc:
        raise _aws_failure(exc)
    if format is TextFormat.json:
        print_json({"ok": True, "execution_arn": arn, "status": state})
    else:
        print_lines(_out(), [f"{state}: {arn}"])


@app.command()
def preflight(
    recipe: Path = _RUN_RECIPE,
    image_uri: Optional[str] = typer.Option(None, help="the training image to look for in ECR (default: the deployed pipeline's; before a deploy, the region's base image)"),
    role_arn: Optional[str] = typer.Option(None, help="the execution role whose read of data.uri to check (default: the deployed pipeline's)"),
    stage: Optional[str] = _STAGE,
    region: Optional[str] = _REGION,
    endpoint_url: Optional[str] = _ENDPOINT,
    profile: Optional[str] = _PROFILE,
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """Check the AWS account for the recipe: quotas, image, data, MLflow, training plan, pipeline (exit 0 when all pass)."""
    from tiered_training.aws.preflight import preflight as run_preflight
    from tiered_training.report.render import print_json, print_lines
    from tiered_training.aws.start import StartError, check_aws_options, require_boto3

    plan = _run_recipe(recipe)
    try:
        require_boto3(f"{PROG} preflight")
        check_aws_options(region=region, endpoint_url=endpoint_url, profile=profile)
        report = run_preflight(plan, region=region, endpoint_url=endpoint_url, profile=profile, image_uri=image_uri, role_arn=role_arn,
                               stage=stage)
    except StartError as exc:  # ParameterError (exit 2) included
        raise _aws_failure(exc) from None
    if format is TextFormat.json:
        print_json(report.to_dict())
    else:
        failed = sum(c.failed for c in report.checks)
        lines = [f"preflight {report.recipe} in {report.region}"] + [c.line() for c in report.checks]
        lines.append("all checks pass" if report.ok else f"{failed} of {len(report.checks)} checks failed")
        print_lines(_out(), lines)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, prog_name=PROG)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
