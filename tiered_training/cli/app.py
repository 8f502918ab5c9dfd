"""The ``tiered-training`` command line.

Review: ``plan``, ``validate``, ``explain``, ``diff``, ``tiers``, ``models``,
``instances``, ``run-config``, ``schema``. The account: ``preflight``, ``calibrate``. Runs: ``rehearse``,
``start``, ``status``, ``logs``, ``stop``. A command that takes one recipe takes its file or its
name (the pipeline name, its ``name:``) in ./recipes.

Every command takes ``--format json``, and its errors appear in the JSON too (``"ok": false``,
``exit_code`` and ``errors``, in the command's one shape: :mod:`tiered_training.cli.output`) as well
as one line each on stderr.
Exit codes: 0 when everything is fine; 1 when AWS refuses or a run fails; 2 for invalid
input: a recipe that does not load or whose plan has errors (``diff`` included), a bad
option or value (checked here: no AWS call is made), or no recipes at all; 3 when the command
needs an extra that is not installed.

This module is the app: the typer plumbing (one-line or JSON usage errors, :class:`Failure`
reporting, ``--version``) and :func:`main`, which runs it (the ``tiered-training`` script,
:func:`tiered_training.cli.main`, imports this module and calls it). The commands are
:mod:`tiered_training.cli.review`'s and :mod:`tiered_training.cli.run`'s, registered here in
``--help``'s order; what they share is :mod:`tiered_training.cli.base`'s.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# The command line uses no pydantic plugins, and looking for them (pydantic does on its first model) reads
# every installed package's entry points: tens of milliseconds of each command's start. A value set stays.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

import typer  # noqa: E402
import typer.core  # noqa: E402
from typer.main import get_command_name  # noqa: E402

from tiered_training.cli import review, run  # noqa: E402
from tiered_training.cli.base import (  # noqa: E402
    _STAGE,
    EXIT_FAILED,
    EXIT_INVALID,
    PROG,
    AwsOptions,
    Failure,
    TextFormat,
    _emit_failure,
    _out,
    _reports_failures,
    _run_recipe,
    with_aws_options,
)

if TYPE_CHECKING:
    from typer._click.exceptions import UsageError  # the installed typer's


def _json_requested(args) -> bool:
    """Whether a command line asks for ``--format json`` (read before click parses it)."""
    args = list(args or [])
    for index, arg in enumerate(args):
        if arg in ("--format", "-f") and index + 1 < len(args) and args[index + 1] == "json":
            return True
        if arg in ("--format=json", "-fjson"):
            return True
    return False


# click's UsageError (typer vendors click from 0.22 on): the base of typer.BadParameter.
_UsageError: type[UsageError] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _usage_message(exc: Exception) -> str:
    """click's message on one line, without the "Value error, " its enum conversion puts before the reason."""
    return " ".join(exc.format_message().split()).replace("Value error, ", "")  # type: ignore[attr-defined]


class _Command(typer.core.TyperCommand):
    """A command whose usage errors (bad option value, missing argument) are one line, or JSON."""

    def make_context(self, info_name, args, parent=None, **extra):
        as_json = _json_requested(args)
        try:
            return super().make_context(info_name, list(args), parent=parent, **extra)
        except _UsageError as exc:
            message = _usage_message(exc)
            hint = f" (see {PROG} {info_name} --help)"
            _emit_failure(Failure([{"message": message + hint}], EXIT_INVALID), as_json, info_name)
            raise typer.Exit(EXIT_INVALID) from None


class _Group(typer.core.TyperGroup):
    """The app: an unknown command or option is one line too."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, list(args), parent=parent, **extra)
        except _UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # no arguments: the help, as click shows it
                raise
            message = _usage_message(exc)
            _emit_failure(Failure([{"message": f"{message} (see {PROG} --help)"}], EXIT_INVALID), _json_requested(args))
            raise typer.Exit(EXIT_INVALID) from None

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except _UsageError as exc:
            message = _usage_message(exc)
            _emit_failure(Failure([{"message": f"{message} (see {PROG} --help)"}], EXIT_INVALID), _json_requested(args))
            raise typer.Exit(EXIT_INVALID) from None


class _App(typer.Typer):
    """Every command gets one-line (or JSON) usage errors and :class:`Failure` reporting; a parameter
    ``aws: AwsOptions`` becomes ``--region``, ``--endpoint-url`` and ``--profile``."""

    def command(self, *args, cls=None, **kwargs):
        register = super().command(*args, cls=cls or _Command, **kwargs)

        def decorator(fn):
            name = args[0] if args else kwargs.get("name") or fn.__name__.replace("_", "-")
            register(_reports_failures(with_aws_options(fn), name))
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


def _version(value: bool) -> None:
    if value:
        typer.echo(f"{PROG} {version()}")
        raise typer.Exit()


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(PROG)
    except PackageNotFoundError:
        from tiered_training import __version__

        return __version__


@app.callback()
def _main(
    _show_version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    """Plan, check and compare SageMaker training recipes; start and follow their runs."""


def _register(*modules) -> None:
    """The modules' commands on the app, in the order ``--help`` lists them: module by module, each's in its order."""
    for module in modules:
        for args, kwargs, command in module.commands.defined:
            app.command(*args, **kwargs)(command)


_register(review, run)


@app.command()
def calibrate(
    recipes: list[Path] = typer.Argument(..., help="recipes whose deployed runs to read (files or names)"),
    from_runs: bool = typer.Option(False, "--from-runs", help="fit the account's overlay on its runs' metrics"),
    stage: str | None = _STAGE,
    aws: AwsOptions = AwsOptions(),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """Calibrate the planner on this account's runs and their probes' candidates: per instance type and precision,
    measured over predicted tokens/s, stored as each recipe's own overlay in its checkpoint store and cached for `plan`
    (tiered_training/aws/calibrate.py)."""
    from tiered_training.aws import calibrate as account
    from tiered_training.aws.run_list import runs_uri
    from tiered_training.aws.session import StartError
    from tiered_training.cli.output import emit
    from tiered_training.planning import overlay as overlays
    from tiered_training.recipe.names import pipeline_name
    from tiered_training.report.render import print_lines

    if not from_runs:
        raise Failure(
            [{"message": "calibrate needs --from-runs (the only source of measurements so far)"}], EXIT_INVALID
        )
    plans = [_run_recipe(r) for r in recipes]
    sm, cw, s3 = run._clients(plans[0], aws, "sagemaker", "cloudwatch", "s3", services_for="calibrate", stage=stage)
    try:
        found, skipped = account.measurements(cw, plans)
        probed, unread = account.probe_measurements(sm, plans, [pipeline_name(p.name, stage) for p in plans])
        found, skipped = found + probed, skipped + unread
        fitted = overlays.fit(found)
        uris = []
        for plan in plans:  # each recipe's own overlay, in its own store
            bucket = runs_uri(sm, pipeline_name(plan.name, stage))[len("s3://") :].split("/", 1)[0]
            uris.append(account.store(s3, bucket, plan.name, fitted))
    except overlays.OverlayRefused as exc:
        raise Failure([{"message": f"overlay refused: {exc}"}], EXIT_FAILED) from None
    except StartError as exc:
        raise run._aws_failure(exc) from None
    points = {"probe": len(probed), "run": len(found) - len(probed)}
    if format is TextFormat.json:
        emit("calibrate", 0, overlay=fitted.to_dict(), uris=uris, skipped=skipped, points=points)
        return
    lines = [
        *overlays.report(fitted).splitlines(),
        f"  points: {points['probe']} from probes (one per measured candidate), {points['run']} from full runs",
        *(f"stored: {uri}; cached: {overlays.cache_path(p.name)}" for uri, p in zip(uris, plans, strict=True)),
    ]
    print_lines(_out(), lines + [f"left out: {line}" for line in skipped])


def _name(command: typer.models.CommandInfo) -> str | None:
    """A registered command's name, as typer gives it (the function's, with dashes, unless named)."""
    return command.name or (get_command_name(command.callback.__name__) if command.callback else None)


def _for(args: list[str]) -> typer.Typer:
    """The app to run ``args``: with only the command they name, when they start with one (building each of the
    twenty commands' options costs every start a little; --help, a typo and shell completion get them all)."""
    if not args or f"_{PROG.upper().replace('-', '_')}_COMPLETE" in os.environ:
        return app
    named = [c for c in app.registered_commands if _name(c) == args[0]]
    if not named:
        return app
    one = copy.copy(app)
    one.registered_commands = named
    return one


def main(argv: list[str] | None = None) -> None:
    try:
        _for(sys.argv[1:] if argv is None else list(argv))(args=argv, prog_name=PROG)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
