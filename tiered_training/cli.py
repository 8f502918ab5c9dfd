"""The ``tiered-training`` command line: plan, validate, explain, diff, tiers, models, run-config, start."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from .errors import RecipeError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Plan, check and compare SageMaker training recipes.",
)

EXIT_INVALID = 2


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    json = "json"


def _console(stderr: bool = False):
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=stderr, highlight=False, width=200)
    return console


def _load_plans(paths: list[Path]) -> tuple[list, list[RecipeError]]:
    from .planner import plan_file

    plans, failures = [], []
    for path in _expand(paths):
        try:
            plans.append(plan_file(path))
        except RecipeError as exc:
            failures.append(exc)
    return plans, failures


def _expand(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out += sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        else:
            out.append(path)
    return out


def _report_failures(failures: list[RecipeError]) -> None:
    err = _console(stderr=True)
    for failure in failures:
        err.print(f"[bold red]error[/]: {failure}", markup=True, highlight=False)


@app.command()
def plan(
    recipes: list[Path] = typer.Argument(..., help="recipe files or directories"),
    format: Format = typer.Option(Format.table, "--format", "-f", help="table, markdown (for a pull request) or json"),
    chart: Optional[Path] = typer.Option(None, help="draw the per-GPU memory breakdown to this PNG (needs the 'plot' extra)"),
) -> None:
    """Resolve recipes into plans and print them."""
    from . import report

    plans, failures = _load_plans(recipes)
    if format is Format.json:
        print(report.plans_json(plans))
    elif format is Format.markdown:
        print(report.plans_markdown(plans))
    else:
        _print_table(plans)
    if chart is not None:
        from .chart import memory_chart

        memory_chart(plans, chart)
        _console(stderr=True).print(f"memory chart written to {chart}")
    _report_failures(failures)
    if failures or any(not p.ok for p in plans):
        raise typer.Exit(EXIT_INVALID)


def _print_table(plans: list) -> None:
    from rich.table import Table

    from . import report

    console = _console()
    table = Table(show_lines=False, header_style="bold")
    rows = [report.summary_row(p) for p in plans]
    for column in report.COLUMNS:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(row.get(c, "") for c in report.COLUMNS))
    console.print(table)
    for plan in plans:
        for finding in plan.findings:
            if finding.severity != "info":
                style = "red" if finding.severity == "error" else "yellow"
                console.print(f"[{style}]{report.format_finding(plan, finding)}[/]")


@app.command()
def validate(
    recipes: list[Path] = typer.Argument(..., help="recipe files or directories"),
    strict: bool = typer.Option(False, help="treat warnings as errors"),
) -> None:
    """Exit 0 when every recipe is valid and plannable, 2 otherwise."""
    from . import report

    from .alarms import with_routing_findings

    plans, failures = _load_plans(recipes)
    plans = [with_routing_findings(p) for p in plans]  # alarms that reach no one (./cdk.json's context)
    _report_failures(failures)
    bad = len(failures)
    out, err = _console(), _console(stderr=True)
    for plan in plans:
        blocking = plan.errors + (plan.warnings if strict else [])
        for finding in plan.findings:
            if finding.severity != "info":
                (err if finding in blocking else out).print(report.format_finding(plan, finding), markup=False)
        if blocking:
            bad += 1
        else:
            out.print(f"{plan.source}: ok", markup=False)
    if bad:
        err.print(f"{bad} of {len(plans) + len(failures)} recipe(s) invalid", markup=False)
        raise typer.Exit(EXIT_INVALID)


@app.command()
def explain(recipe: Path = typer.Argument(..., help="a recipe file")) -> None:
    """Show every decision with its reason, the memory proof, the estimates and every finding."""
    from . import report

    plans, failures = _load_plans([recipe])
    _report_failures(failures)
    for plan in plans:
        print("\n".join(report.explain_lines(plan)))
    if failures or any(not p.ok for p in plans):
        raise typer.Exit(EXIT_INVALID)


@app.command()
def diff(
    old: Path = typer.Argument(..., help="the recipe before the change"),
    new: Path = typer.Argument(..., help="the recipe after the change"),
    format: Format = typer.Option(Format.table, "--format", "-f"),
) -> None:
    """Compare two resolved plans: changed decisions and memory, throughput, time and cost deltas."""
    from . import report

    plans, failures = _load_plans([old, new])
    if failures:
        _report_failures(failures)
        raise typer.Exit(EXIT_INVALID)
    result = report.diff(plans[0], plans[1])
    if format is Format.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    elif format is Format.markdown:
        print(report.diff_markdown(result))
    else:
        print(report.diff_text(result), end="")


@app.command()
def tiers(format: Format = typer.Option(Format.table, "--format", "-f")) -> None:
    """Print the size-tiered guidance the planner applies."""
    from . import report

    rows = report.tier_rows()
    if format is Format.json:
        print(json.dumps(rows, indent=2))
    elif format is Format.markdown:
        print(report.markdown_table(rows, report.TIER_COLUMNS))
    else:
        from rich.table import Table

        table = Table(header_style="bold", show_lines=True)
        for column in report.TIER_COLUMNS:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(row[c] for c in report.TIER_COLUMNS))
        _console().print(table)


@app.command()
def models() -> None:
    """List the model catalogue."""
    from . import catalogs

    for entry in catalogs.models().values():
        arch = entry.architecture
        print(f"{entry.id:<14} {arch.parameters / 1e9:>6.2f}B  L={arch.layers:<3} h={arch.hidden_size:<5} ctx={arch.max_sequence_length:<6} {entry.display_name}")


@app.command("instances")
def list_instances() -> None:
    """List the instance catalogue."""
    from . import catalogs

    for inst in catalogs.instances().values():
        price, source = inst.price()
        fp8 = "FP8+MXFP8" if inst.mxfp8 else ("FP8" if inst.fp8 else "-")
        print(f"{inst.name:<22} {inst.gpus}x {inst.gpu:<10} {inst.usable_hbm_gib:>6g} GiB  {fp8:<9} EFA {inst.efa_gbps:>4} Gbps  ${price:,.2f}/h ({source})")


@app.command("run-config")
def run_config(
    recipe: Path = typer.Argument(..., help="a recipe file"),
    hyperparameters: bool = typer.Option(False, help="print SageMaker hyperparameters instead of JSON"),
) -> None:
    """Print the RunConfig the training container receives (to run it outside SageMaker)."""
    from .errors import PlanError

    plans, failures = _load_plans([recipe])
    _report_failures(failures)
    if failures:
        raise typer.Exit(EXIT_INVALID)
    try:
        config = plans[0].run_config()
    except PlanError as exc:
        _console(stderr=True).print(str(exc), markup=False)
        raise typer.Exit(EXIT_INVALID)
    print(json.dumps(config.to_hyperparameters(), indent=2) if hyperparameters else config.to_json())


@app.command()
def start(
    recipe: Path = typer.Argument(..., help="a recipe file whose stack is deployed"),
    follow: bool = typer.Option(True, help="follow the execution's status until it ends"),
    skip_probe: Optional[bool] = typer.Option(None, "--skip-probe/--probe", help="start the full run without the probe"),
    max_steps: Optional[int] = typer.Option(None, help="override the number of optimiser steps"),
    instance_count: Optional[int] = typer.Option(None, help="override the number of instances"),
    data_uri: Optional[str] = typer.Option(None, help="override the data's S3 URI"),
    region: Optional[str] = typer.Option(None, help="AWS region (default: your AWS configuration)"),
    endpoint_url: Optional[str] = typer.Option(None, help="SageMaker endpoint (for testing)"),
    poll_seconds: float = typer.Option(30.0, help="seconds between status checks"),
) -> None:
    """Start the recipe's SageMaker pipeline, print the execution ARN and follow it."""
    from .start import StartError, start as start_pipeline

    try:
        result = start_pipeline(
            recipe,
            instance_count=instance_count,
            max_steps=max_steps,
            data_uri=data_uri,
            skip_probe=skip_probe,
            follow=follow,
            region=region,
            endpoint_url=endpoint_url,
            poll_seconds=poll_seconds,
        )
    except RecipeError as exc:
        _report_failures([exc])
        raise typer.Exit(EXIT_INVALID)
    except StartError as exc:
        _console(stderr=True).print(f"error: {exc}", markup=False)
        raise typer.Exit(1)
    if follow and not result.ok:
        raise typer.Exit(1)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
