"""What every command of the ``tiered-training`` command line shares, and nothing else.

:class:`Failure` and its reporting, the exit codes, the ``--format`` choices, the output
helpers, a recipe by its file or its name, the options of the commands that call AWS
(``--region``, ``--endpoint-url`` and ``--profile`` as one :class:`AwsOptions` parameter;
``--execution``, ``--stage``, the deployed recipe), and :class:`Commands`, the list a command
module adds its commands to.

The command modules (:mod:`tiered_training.cli.review`, :mod:`tiered_training.cli.run`) import
this module and :mod:`tiered_training.cli.app` imports them: the app registers their commands in
one place, in ``--help``'s order, and no module of the command line imports one that imports it.
"""

from __future__ import annotations

import functools
import inspect
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import typer

from tiered_training.recipe.errors import Problem, RecipeError
from tiered_training.recipe.names import stage_problem

PROG = "tiered-training"
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_MISSING_EXTRA = 3  # the installation lacks an extra the command needs (the message names it)


def need_extra(module: str, extra: str, what: str) -> None:
    """Fail with :data:`EXIT_MISSING_EXTRA` when ``module``, which the ``extra`` installs, cannot be imported."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise Failure(
            [f"{what} needs {module}, which the {extra!r} extra installs: pip install 'tiered-training[{extra}]'"],
            EXIT_MISSING_EXTRA,
        ) from None


class Failure(Exception):
    """What a command reports instead of its result: one or more one-line errors and an exit code.

    A command raises it; :func:`_reports_failures` prints it as ``error: ...`` lines on
    stderr and, under ``--format json``, as the command's output with ``"ok": false``, ``exit_code``
    and ``errors`` on stdout too, so that every error a command can meet reaches a machine reader.
    """

    def __init__(self, errors: list, code: int):
        self.errors: list[dict[str, Any]] = [e if isinstance(e, dict) else {"message": str(e)} for e in errors]
        self.code = code
        super().__init__("; ".join(e.get("text", e["message"]) for e in self.errors))

    @classmethod
    def of(cls, exc: Exception, code: int) -> Failure:
        """From a RecipeError (one entry per problem), a PlanError (per finding) or any one-line error."""
        from tiered_training.planning.plan import PlanError

        if isinstance(exc, RecipeError):
            return cls([p.to_dict() | {"text": str(p)} for p in exc.problems], code)
        if isinstance(exc, PlanError):
            from tiered_training.planning.plan import finding_place
            from tiered_training.report import format_finding

            plan = exc.plan
            return cls(
                [
                    {
                        "file": finding_place(plan, f)[0],
                        "code": f.code,
                        "field": f.field,
                        "message": f.message,
                        "fix": f.fix,
                        "text": format_finding(plan, f).removeprefix("error: "),  # lines() adds it
                    }
                    for f in plan.errors
                ],
                code,
            )
        return cls([{"message": " ".join(str(exc).split())}], code)

    def data(self) -> dict:
        return {
            "ok": False,
            "exit_code": self.code,
            "errors": [{k: v for k, v in e.items() if k != "text"} for e in self.errors],
        }

    def lines(self) -> list[str]:
        return [f"error: {e.get('text', e['message'])}" for e in self.errors]


def _emit_failure(failure: Failure, as_json: bool, command: str | None = None) -> None:
    """The errors on stderr, one line each; under ``--format json`` also on stdout, as the command's
    output (:mod:`tiered_training.cli.output`) with its own keys empty."""
    from tiered_training.report.render import console, print_json, print_lines

    if as_json:
        from tiered_training.cli.output import failure_data

        print_json(failure_data(command, failure.code, failure.data()["errors"]))
    print_lines(console(stderr=True), failure.lines())


def _reports_failures(fn, command: str | None = None):
    """Run a command; a :class:`Failure` is reported in the command's ``--format`` and ends it with its code."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Failure as failure:
            fmt = kwargs.get("format")
            _emit_failure(failure, getattr(fmt, "value", fmt) == "json", command)
            raise typer.Exit(failure.code) from None

    return run


class Commands:
    """A command module's commands, in the order it defines them.

    ``@commands.command(...)`` takes what ``app.command(...)`` takes and records the command;
    :mod:`tiered_training.cli.app` registers every module's on the app.
    """

    def __init__(self) -> None:
        self.defined: list[tuple[tuple, dict, Callable]] = []

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable], Callable]:
        def decorator(fn: Callable) -> Callable:
            self.defined.append((args, kwargs, fn))
            return fn

        return decorator


class Format(str, Enum):  # noqa: UP042 (a StrEnum's str() and format() differ)
    table = "table"
    markdown = "markdown"
    json = "json"


class TextFormat(str, Enum):  # noqa: UP042 (a StrEnum's str() and format() differ)
    text = "text"
    json = "json"


class JsonFormat(str, Enum):  # noqa: UP042 (a StrEnum's str() and format() differ)
    json = "json"


def _out():
    from tiered_training.report.render import console

    return console()


def _err():
    from tiered_training.report.render import console

    return console(stderr=True)


def _print(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


# -- recipes by name ---------------------------------------------------------------------

RECIPES_DIR = Path("recipes")


def _recipe_path(recipe: Path) -> Path:
    """``recipe`` itself, or the recipe in ./recipes that ``recipe`` names (its pipeline name or file stem)."""
    from tiered_training.recipe.loader import recipe_by_name

    if (
        str(recipe) == "-"
        or recipe.exists()
        or recipe.is_symlink()
        or recipe.suffix in (".yaml", ".yml")
        or len(recipe.parts) != 1
    ):
        return recipe
    found, names = recipe_by_name(str(recipe), RECIPES_DIR)
    if found is not None:
        return found
    from tiered_training.recipe.keys import suggest

    known = (
        suggest(str(recipe), names, "recipe names", f"ls {RECIPES_DIR}/") if names else f"no recipes in {RECIPES_DIR}/"
    )
    raise RecipeError([Problem(str(recipe), None, "", f"no such recipe file, nor a recipe of that name ({known})")])


SET_HELP = (
    "override a recipe field, key.path=value, checked as the file is (repeatable); '-' reads the recipe from stdin"
)


def set_option() -> Any:
    """``--set key.path=value`` (repeatable): a recipe field overridden for this command."""
    return typer.Option([], "--set", metavar="KEY=VALUE", help=SET_HELP)


def _run_recipe(recipe: Path, overrides: list[str] | None = None):
    """The recipe's plan (or RecipeError, reported as invalid input)."""
    from tiered_training.planning.planner import plan_file

    try:
        return plan_file(_recipe_path(recipe), overrides or ())
    except RecipeError as exc:
        raise Failure.of(exc, EXIT_INVALID) from None


# -- the options of the commands that call AWS -------------------------------------------

_REGION = typer.Option(
    None,
    help="AWS region (default: the recipe's compute.region, AWS_REGION, AWS_DEFAULT_REGION, your AWS configuration)",
)
_ENDPOINT = typer.Option(None, help="AWS endpoint URL for every service (for testing)")
_PROFILE = typer.Option(None, help="AWS profile")
_EXECUTION = typer.Option(None, "--execution", help="an execution ARN (default: the pipeline's latest)")


def _check_stage(value: str | None) -> str | None:
    problem = stage_problem(value)
    if problem:
        raise typer.BadParameter(problem)
    return value


_STAGE = typer.Option(
    None,
    "--stage",
    callback=_check_stage,
    help="the stage the app was deployed with (cdk -c stage=...): its pipeline is <stage>-<recipe>",
)
_RUN_RECIPE = typer.Argument(
    ..., help="a recipe file whose stack is deployed, or its name (the pipeline's) in ./recipes"
)


@dataclass(frozen=True)
class AwsOptions:
    """``--region``, ``--endpoint-url`` and ``--profile``: one parameter of a command, ``aws: AwsOptions``.

    :func:`with_aws_options` turns that parameter into the three options, in its place among the
    command's options, and gives the command their values as one AwsOptions.
    """

    region: str | None = None
    endpoint_url: str | None = None
    profile: str | None = None


_AWS_OPTIONS = {"region": _REGION, "endpoint_url": _ENDPOINT, "profile": _PROFILE}  # AwsOptions' fields, in order


def with_aws_options(fn: Callable) -> Callable:
    """``fn`` as typer is to see it: its parameter annotated :class:`AwsOptions` (one at most) becomes the
    ``--region``, ``--endpoint-url`` and ``--profile`` options, in its place, and ``fn`` gets their values
    back as one AwsOptions. ``fn`` itself when it has no such parameter."""
    if not any(a is AwsOptions or "AwsOptions" in str(a) for a in fn.__annotations__.values()):
        return fn  # resolving the annotations of every command costs each start time
    hints = typing.get_type_hints(fn)
    signature = inspect.signature(fn)
    names = [name for name in signature.parameters if hints.get(name) is AwsOptions]
    if not names:
        return fn
    (name,) = names
    parameters = []
    for parameter in signature.parameters.values():
        if parameter.name != name:
            parameters.append(parameter.replace(annotation=hints.get(parameter.name, parameter.annotation)))
            continue
        parameters += [
            inspect.Parameter(option, parameter.kind, default=info, annotation=str | None)
            for option, info in _AWS_OPTIONS.items()
        ]

    @functools.wraps(fn)
    def command(*args, **kwargs):
        aws = AwsOptions(**{option: kwargs.pop(option) for option in _AWS_OPTIONS})
        return fn(*args, **kwargs, **{name: aws})

    returns = hints.get("return", signature.return_annotation)
    command.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=returns
    )
    command.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": returns}
    return command
