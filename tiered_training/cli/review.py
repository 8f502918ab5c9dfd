"""The review commands: ``plan``, ``validate``, ``explain``, ``diff``, ``tiers``, ``models``,
``instances``, ``run-config`` and ``schema``. They read recipes and the catalogues and call no AWS.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from tiered_training.cli.base import (
    _STAGE,
    EXIT_INVALID,
    AwsOptions,
    Commands,
    Failure,
    Format,
    JsonFormat,
    TextFormat,
    _err,
    _out,
    _print,
    _recipe_path,
    _run_recipe,
    need_extra,
    set_option,
)
from tiered_training.recipe.errors import Problem, RecipeError
from tiered_training.text import escape

commands = Commands()


def _load_plans(
    paths: list[Path], overrides: list[str] | None = None, *, unique: bool = True
) -> tuple[list, list[RecipeError]]:
    """Plans of the recipes ``paths`` name (with ``--set`` overrides), and the recipes that failed to load.

    No recipe at all is a failure too ("no recipes found"); so is a name that two recipes share.
    Every plan carries the findings of the app it deploys with (:func:`_with_app_findings`), so that
    plan, validate, explain and diff report the same set.
    """
    from tiered_training.planning.alarms import app_context
    from tiered_training.planning.overlay import cached, legacy_notice
    from tiered_training.planning.planner import plan_file
    from tiered_training.recipe.loader import find_recipes

    named, failures = [], []
    for path in paths:
        try:
            named.append(_recipe_path(path))
        except RecipeError as exc:
            failures.append(exc)
    files, unreadable = find_recipes(named)
    failures += unreadable
    context = app_context()
    account = _account_quotas(context, failures)
    plans = []
    for path in files:
        try:
            # each recipe's own calibration (`calibrate --from-runs`), if any
            plans.append(_with_app_findings(plan_file(path, overrides or (), cached), context, account))
        except RecipeError as exc:
            failures.append(exc)
    notice = legacy_notice([p.name for p in plans])
    if notice:
        print(f"note: {notice}", file=sys.stderr)
    if not plans and not failures:
        where = ", ".join(map(str, paths)) or "."
        failures.append(RecipeError([Problem(where, None, "", "no recipes found (*.yaml or *.yml)")]))
    return plans, failures + (_shared_names(plans) if unique else [])


def _shared_names(plans: list) -> list[RecipeError]:
    """A pipeline name that two recipes share: one stack and one pipeline per name, so both are refused."""
    by_name: dict[str, list] = {}
    for plan in plans:
        by_name.setdefault(plan.name, []).append(plan)
    errors = []
    for name, same in by_name.items():
        if len(same) > 1:
            files = [escape(p.source or p.name) for p in same]
            for plan in same:
                others = ", ".join(f for f in files if f != escape(plan.source or plan.name)) or files[0]
                line = plan.locations.get("name")
                message = f"{name!r} is also the name of {others}: each recipe needs its own name (its pipeline's)"
                errors.append(RecipeError([Problem(plan.source or plan.name, line, "name", message)]))
    return errors


def _with_app_findings(plan, context: dict, account: dict[str, float]):
    """The plan with the findings that depend on the app (./cdk.json's context) as well as the recipe:
    its quotas against the account's applied ones, and alarms that reach no one."""
    from tiered_training.planning.alarms import with_routing_findings
    from tiered_training.planning.quotas import with_account

    return with_routing_findings(with_account(plan, account), context)


def _account_quotas(context: dict, failures: list[RecipeError]) -> dict[str, float]:
    """The applied quotas in ./cdk.json's context (``"quotas": {name: value}``), shared by every recipe."""
    from tiered_training.planning.quotas import parse_account

    try:
        return parse_account(context.get("quotas"), "cdk.json: context.quotas")
    except ValueError as exc:
        failures.append(RecipeError([Problem("cdk.json", None, "context.quotas", str(exc).split(": ", 2)[-1])]))
        return {}


def _report_failures(failures: list[RecipeError]) -> None:
    from tiered_training.report.render import print_lines

    err = _err()
    lines = []
    for failure in failures:  # one line per problem, as every error is
        lines += [f"error: {problem}" for problem in [str(p) for p in failure.problems] or [str(failure)]]
    print_lines(err, lines)


def _report_findings(plans: list, *, strict: bool = False) -> None:
    """Errors (and warnings under ``strict``) on stderr, one line each; other warnings on stdout, wrapped
    to 100 columns under their first line; the ``account:`` findings that block nothing as one line per
    recipe counting the quotas to raise (``explain`` names each, with its fix)."""
    from dataclasses import replace

    from tiered_training import report
    from tiered_training.report.render import print_lines, print_report

    out, err = _out(), _err()
    for plan in plans:
        blocking = plan.errors + (plan.warnings if strict else [])
        quotas = [f for f in plan.findings if f.severity == "account" and f not in blocking]
        for finding in plan.findings:
            if finding.severity == "info" or finding in quotas[1:]:
                continue
            if finding in quotas[:1]:  # the account's quotas in one line; explain names each
                many = f"{len(quotas)} quotas" if len(quotas) > 1 else "a quota"
                finding = replace(finding, field="", message=f"{many} to raise; `explain` names them", fix="")
            line = report.format_finding(plan, finding)
            if finding in blocking:
                print_lines(err, [line])
            else:
                print_report(out, [line])


def _exit_code(plans: list, failures: list) -> int:
    return EXIT_INVALID if failures or any(not p.ok for p in plans) else 0


def _exit_for(plans: list, failures: list) -> None:
    if _exit_code(plans, failures):
        raise typer.Exit(EXIT_INVALID)


def _emit_plans(command: str, plans: list, failures: list[RecipeError], code: int, **fields) -> None:
    """``plan``'s, ``explain``'s and ``diff``'s JSON: the plans, the recipes that did not load, their errors."""
    from tiered_training import report
    from tiered_training.cli.output import emit, finding_errors, plan_errors

    data = report.plans_data(plans, failures)
    errors = finding_errors(data["invalid"]) + plan_errors(data["plans"])
    emit(command, code, plans=data["plans"], invalid=data["invalid"], errors=errors, **fields)


def _check_chart_path(name: str) -> Path:
    """``--chart`` names the PNG file to write: not an empty name, not a directory, and ending in .png (matplotlib
    would otherwise add the suffix and write a file the message does not name)."""
    if not name.strip():
        raise Failure([f"--chart {name!r}: an empty name; give a file name ending in .png"], EXIT_INVALID)
    chart = Path(name)
    shown = escape(name)
    if chart.is_dir():
        raise Failure([f"--chart {shown}: a directory; give a file name ending in .png"], EXIT_INVALID)
    if chart.suffix.lower() != ".png":
        raise Failure([f"--chart {shown}: give a file name ending in .png (e.g. memory.png)"], EXIT_INVALID)
    return chart


@commands.command()
def plan(
    recipes: list[Path] = typer.Argument(..., help="recipe files or directories"),
    format: Format = typer.Option(Format.table, "--format", "-f", help="table, markdown (for a pull request) or json"),
    chart_name: str | None = typer.Option(
        None, "--chart", metavar="PATH", help="draw the per-GPU memory breakdown to this PNG (needs the 'plot' extra)"
    ),
    overrides: list[str] = set_option(),
    wide: bool = typer.Option(False, "--wide", help="the table with every column: precision, sharding, batch, MFU"),
) -> None:
    """Resolve recipes into plans and print them: one line each, then the quotas they need raised."""
    from tiered_training import report

    chart = None if chart_name is None else _check_chart_path(chart_name)
    if chart is not None:
        need_extra("matplotlib", "plot", "plan --chart")
    plans, failures = _load_plans(recipes, overrides)
    if format is Format.json:
        _emit_plans("plan", plans, failures, _exit_code(plans, failures))
    elif format is Format.markdown:
        _print(report.plans_markdown(plans))
    else:
        _print_table(plans, wide)
    if chart is not None and plans:
        from tiered_training.report.chart import memory_chart

        try:
            memory_chart(plans, chart)
        except OSError as exc:
            raise Failure(
                [f"--chart {escape(str(chart))}: cannot write it: {exc.strerror or exc}"], EXIT_INVALID
            ) from None
        _err().print(f"memory chart written to {chart}")
    if format is not Format.json:
        _report_failures(failures)
    _exit_for(plans, failures)


def _print_table(plans: list, wide: bool = False) -> None:
    """The plans, one line each; the legend and the prices' sources; the findings but the quotas, which
    follow as one table (their fixes are explain's and preflight's); how to see more."""
    from tiered_training import report
    from tiered_training.report.render import print_lines, print_notes, print_report, print_table

    if not plans:
        return
    out = _out()
    if wide:
        print_table(
            out, [report.summary_row(p) for p in plans], report.COLUMNS, numeric=report.NUMERIC_COLUMNS, wide=True
        )
    else:
        print_table(out, [report.brief_row(p) for p in plans], report.BRIEF_COLUMNS, numeric=report.BRIEF_NUMERIC)
    print_notes(out, [*(report.WIDE_LEGEND if wide else report.BRIEF_LEGEND), *report.price_lines(plans)])
    for p in plans:  # an error in one line, as every error is; a warning wrapped to 100 columns
        for f in p.findings:
            if f.severity not in ("info", "account"):
                (print_lines if f.severity == "error" else print_report)(out, [report.format_finding(p, f)])
    from tiered_training.planning.alarms import app_context

    quotas = report.quota_rows(plans, _account_quotas(app_context(), []))
    if quotas:
        needing = sum(bool(p.account_findings) for p in plans)
        print_notes(out, ["", f"quotas to raise before a deploy ({needing} of {len(plans)} recipes):"])
        print_table(out, quotas, report.QUOTA_COLUMNS, numeric=report.QUOTA_NUMERIC)
        print_notes(out, report.QUOTA_NOTES)
    print_notes(out, [report.more_line(plans, wide)])


def _note_region_check(plans: list, format: TextFormat) -> None:
    """Say so when recipes' regions were checked against the pattern only (no botocore)."""
    from tiered_training.recipe.regions import WITHOUT_BOTOCORE, known_regions

    if format is TextFormat.text and any(p.recipe.compute.region for p in plans) and known_regions() is None:
        _err().print(f"note: {WITHOUT_BOTOCORE}", soft_wrap=True)


@commands.command()
def validate(
    recipes: list[Path] = typer.Argument(..., help="recipe files or directories"),
    strict: bool = typer.Option(False, help="treat warnings as errors"),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
    overrides: list[str] = set_option(),
) -> None:
    """Exit 0 when every recipe is valid and plannable, 2 otherwise."""
    from tiered_training import report
    from tiered_training.report.render import print_lines

    plans, failures = _load_plans(recipes, overrides)
    _note_region_check(plans, format)
    data = report.validate_data(plans, failures, strict)
    if format is TextFormat.json:
        from tiered_training.cli.output import emit, finding_errors

        errors = finding_errors([r for r in data["recipes"] if not r["ok"]], warnings=strict)
        emit("validate", 0 if data["ok"] else EXIT_INVALID, strict=strict, recipes=data["recipes"], errors=errors)
    else:
        _report_failures(failures)
        verdicts = {r["source"]: r["ok"] for r in data["recipes"]}
        for plan in plans:  # each recipe's verdict, then what it needs of the account and its warnings
            if verdicts.get(plan.source):
                print_lines(_out(), [f"{escape(plan.source)}: ok"])
            _report_findings([plan], strict=strict)
        bad = sum(not r["ok"] for r in data["recipes"])
        if bad and len(data["recipes"]) > 1:
            print_lines(_err(), [f"{bad} of {len(data['recipes'])} recipes invalid"])
    if not data["ok"]:
        raise typer.Exit(EXIT_INVALID)


@commands.command()
def explain(
    recipe: Path = typer.Argument(..., help="a recipe file, or a recipe's name in ./recipes"),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
    overrides: list[str] = set_option(),
    run: str | None = typer.Option(
        None,
        "--run",
        metavar="RUN_OR_EXECUTION",
        help="also show that run's probe: each candidate predicted against measured (an execution ARN or a run id)",
    ),
    stage: str | None = _STAGE,
    aws: AwsOptions = AwsOptions(),
) -> None:
    """Show every decision with its reason, the memory proof, the estimates and every finding."""
    from tiered_training import report
    from tiered_training.report.render import print_notes, print_report

    if recipe.is_dir():
        message = "a directory: explain takes one recipe file or name (plan takes directories)"
        plans: list = []
        failures = [RecipeError([Problem(str(recipe), None, "", message)])]
    else:
        plans, failures = _load_plans([recipe], overrides)
    measured: dict = {}
    probe_lines: list[str] = []
    if run is not None and plans and plans[0].ok and not failures:
        from tiered_training.cli.run import probe_of_run

        arn, probe, probe_lines = probe_of_run(plans[0], run, aws, stage)
        measured = {"execution_arn": arn, "probe": probe}
    if format is TextFormat.json:
        _emit_plans("explain", plans, failures, _exit_code(plans, failures), **measured)
    else:
        _report_failures(failures)
        out = _out()
        for plan in plans:
            print_report(out, report.explain_lines(plan))
        if probe_lines:
            print_report(out, ["", *probe_lines])
        if plans:
            print_notes(out, ["", report.explain_more_line(recipe)])
    _exit_for(plans, failures)


@commands.command()
def diff(
    old: Path = typer.Argument(..., help="the recipe before the change (or a directory of them)"),
    new: Path = typer.Argument(..., help="the recipe after the change (or a directory: recipes pair by name)"),
    format: Format = typer.Option(Format.table, "--format", "-f"),
    overrides: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="override a field of NEW (repeatable)"),
) -> None:
    """Compare two resolved plans: changed decisions and memory, throughput, time and cost deltas.

    Two directories compare the recipes of the same name. Exit 2, and no comparison, when a recipe is
    invalid or its plan has errors.
    """
    from tiered_training import report
    from tiered_training.recipe.loader import STDIN
    from tiered_training.report.render import print_report

    if str(old) == str(new) == STDIN:
        raise Failure(
            ["diff - -: standard input can be read only once; give one of the two recipes as a file"], EXIT_INVALID
        )
    if old.is_dir() or new.is_dir():
        _diff_directories(old, new, overrides, format)
        return
    before, failures = _load_plans([old], unique=False)
    after, more = _load_plans([new], overrides, unique=False)
    plans, failures = before + after, failures + more
    broken = [p for p in plans if not p.ok]
    if failures or broken or len(plans) != 2:
        if format is Format.json:
            _emit_plans("diff", broken, failures, EXIT_INVALID)
        else:
            _report_failures(failures)
            _report_findings(broken)
        raise typer.Exit(EXIT_INVALID)
    result = report.diff(plans[0], plans[1])
    if format is Format.json:
        from tiered_training.cli.output import emit

        emit("diff", 0, diffs=[_without_version(result)])
    elif format is Format.markdown:
        _print(report.diff_markdown(result))
    else:
        print_report(_out(), [*report.diff_text(result).splitlines(), "", report.diff_more_line(old, new)])


def _diff_directories(old: Path, new: Path, overrides: list[str], format: Format) -> None:
    """``diff DIR DIR``: the recipes of each name compared; those in one directory only are listed."""
    from tiered_training import report
    from tiered_training.report.render import print_lines, print_report

    if not (old.is_dir() and new.is_dir()):
        problem = Problem(f"{old} {new}", None, "", "diff takes two recipe files or two directories, not one of each")
        before: list = []
        after: list = []
        failures = [RecipeError([problem])]
    else:
        before, failures = _load_plans([old])
        after, more = _load_plans([new], overrides)
        failures += more
    olds, news = {p.name: p for p in before}, {p.name: p for p in after}
    names = sorted(olds.keys() & news.keys())
    broken = [p for name in names for p in (olds[name], news[name]) if not p.ok]
    pairs = [(name, report.diff(olds[name], news[name])) for name in names if olds[name].ok and news[name].ok]
    removed, added = sorted(olds.keys() - news.keys()), sorted(news.keys() - olds.keys())
    code = EXIT_INVALID if failures or broken or not (pairs or added or removed) else 0
    if format is Format.json:
        diffs = [_without_version(d) for _, d in pairs]
        _emit_plans("diff", broken, failures, code, diffs=diffs, added=added, removed=removed)
    else:
        _report_failures(failures)
        _report_findings(broken)
        for name, result in pairs:
            if format is Format.markdown:
                _print(f"### {name}\n\n{report.diff_markdown(result)}")
            else:
                print_report(_out(), [f"== {name}", *report.diff_text(result).splitlines(), ""])
        lines = [f"only in {old}: {name}" for name in removed] + [f"only in {new}: {name}" for name in added]
        print_lines(_out(), lines)
        if pairs:
            print_report(_out(), ["", report.diff_more_line(old, new)])
    if code:
        raise typer.Exit(code)


def _without_version(result: dict) -> dict:
    """A comparison as ``diff``'s JSON lists it (the output carries the schema version once)."""
    return {k: v for k, v in result.items() if k != "schema_version"}


@commands.command()
def tiers(format: Format = typer.Option(Format.table, "--format", "-f")) -> None:
    """Print the size-tiered guidance the planner applies."""
    from tiered_training import report
    from tiered_training.report.render import print_table

    if format is Format.json:
        from tiered_training.cli.output import emit

        emit("tiers", 0, tiers=report.tiers_data()["tiers"])
    elif format is Format.markdown:
        _print(report.markdown_table(report.tier_rows(), report.TIER_COLUMNS))
    else:
        print_table(_out(), report.tier_rows(), report.TIER_COLUMNS, show_lines=True)


MODEL_COLUMNS = ("id", "parameters", "layers", "hidden", "context", "name")
INSTANCE_COLUMNS = ("instance", "GPUs", "HBM/GPU", "FP8", "EFA", "on-demand", "spot (est.)")


@commands.command()
def models(
    format: Format = typer.Option(Format.table, "--format", "-f"),
    from_config: Path | None = typer.Option(
        None,
        "--from-config",
        help="a Hugging Face checkpoint directory or its config.json: print the catalogue entry it gives (YAML)",
    ),
) -> None:
    """List the model catalogue, or (--from-config) print the catalogue entry a Hugging Face config gives."""
    from tiered_training import report
    from tiered_training.report.render import print_table

    if from_config is not None:
        from tiered_training.contract import hf_config

        try:
            text = hf_config.catalog_entry(from_config)
        except hf_config.ConfigError as exc:
            raise Failure([str(exc)], EXIT_INVALID) from None
        if format is Format.json:
            import yaml

            from tiered_training.cli.output import emit

            emit("models", 0, models=yaml.safe_load(text))
        else:
            _print(text.rstrip("\n"))
        return
    data = report.models_data()
    if format is Format.json:
        from tiered_training.cli.output import emit

        emit("models", 0, models=data["models"])
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
        _out().print("more: models --format json (every field, each source)")


def _price_region(value: str | None) -> str | None:
    from tiered_training.recipe.regions import region_problem

    problem = value and region_problem(value)
    if problem:
        raise typer.BadParameter(problem)
    return value


@commands.command("instances")
def list_instances(
    format: Format = typer.Option(Format.table, "--format", "-f"),
    region: str | None = typer.Option(
        None,
        callback=_price_region,
        help="the region whose SageMaker training prices to show (default: the price catalogue's, us-east-1)",
    ),
) -> None:
    """List the instance catalogue with SageMaker training prices (spot: the catalogue's expected discount,
    an estimate)."""
    from tiered_training import report
    from tiered_training.catalog import PriceError
    from tiered_training.report.render import print_notes, print_table

    try:
        data = report.instances_data(region)
    except PriceError as error:
        raise Failure([str(error)], EXIT_INVALID) from None
    if format is Format.json:
        from tiered_training.cli.output import emit

        emit("instances", 0, region=data["region"], instances=data["instances"])
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
        }
        for i in data["instances"]
    ]
    # Where the prices come from: one note per source, naming its instances.
    sources: dict[tuple[str, str], list[str]] = {}
    for i in data["instances"]:
        if i["price_per_hour"] is not None:
            key = ("price of", i["price_source"])
        else:
            key = (f"no price in {data['region']} for", f"run `tiered-training prices --region {data['region']}`")
        sources.setdefault(key, []).append(i["name"])
    notes = [f"{head} {', '.join(names)}: {source}" for (head, source), names in sources.items()]
    if format is Format.markdown:
        _print(report.markdown_table(rows, INSTANCE_COLUMNS) + "\n\n" + "\n".join(notes))
    else:
        print_table(_out(), rows, INSTANCE_COLUMNS, numeric=("HBM/GPU", "EFA", "on-demand", "spot (est.)"))
        more = "more: instances --format json (every field)"
        print_notes(_out(), ["GPUs: per instance; spot (est.): the catalogue's expected discount", *notes, more])


@commands.command("run-config")
def run_config(
    recipe: Path = typer.Argument(..., help="a recipe file, or a recipe's name in ./recipes"),
    hyperparameters: bool = typer.Option(False, help="print SageMaker hyperparameters instead of the RunConfig"),
    format: JsonFormat = typer.Option(JsonFormat.json, "--format", "-f", help="json (the only format)"),
    overrides: list[str] = set_option(),
) -> None:
    """Print the RunConfig the training container receives, under run_config (python -m training --config FILE
    reads this output as it is, to run outside SageMaker)."""
    from tiered_training.cli.output import emit
    from tiered_training.planning.plan import PlanError

    plan = _run_recipe(recipe, overrides)
    try:
        config = plan.run_config()
    except PlanError as exc:
        raise Failure.of(exc, EXIT_INVALID) from None
    flat = config.to_hyperparameters() if hyperparameters else None
    emit("run-config", 0, recipe_name=plan.name, run_config=config.model_dump(mode="json"), hyperparameters=flat)


@commands.command()
def schema(
    format: JsonFormat = typer.Option(JsonFormat.json, "--format", "-f", help="json (the only format)"),
) -> None:
    """Print the recipe's JSON Schema (docs/recipe.schema.json; the templates name it for editor completion)."""
    from tiered_training.recipe.schema import schema_text

    _print(schema_text())


@commands.command("templates")
def list_templates(
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """List the recipe templates, one line each (start one with: tiered-training init NAME --from TEMPLATE)."""
    from tiered_training.recipe.templates import templates
    from tiered_training.report.render import print_table

    rows = [{"template": t.id, "about": t.about()} for t in templates()]
    if format is TextFormat.json:
        from tiered_training.cli.output import emit

        emit("templates", 0, templates=rows)
        return
    print_table(_out(), rows, ("template", "about"))
    _out().print("start one: tiered-training init NAME --from TEMPLATE")


@commands.command()
def init(
    name: str = typer.Argument(..., help="the new recipe's name (its pipeline's name)"),
    template: str = typer.Option(..., "--from", help="a template (tiered-training templates lists them)"),
    directory: Path = typer.Option(Path("recipes"), "--dir", help="where to write NAME.yaml"),
    force: bool = typer.Option(False, help="overwrite an existing file"),
    format: TextFormat = typer.Option(TextFormat.text, "--format", "-f", help="text or json"),
) -> None:
    """Write a new recipe from a template: its name set, its editor schema line kept, checked before it is written.

    Example: tiered-training init my-8b --from llama3-8b-fp8, then tiered-training plan recipes/my-8b.yaml
    """
    import os

    from tiered_training.recipe.loader import parse_recipe
    from tiered_training.recipe.templates import find_template, new_recipe_text, templates_dir

    target = directory / f"{name}.yaml"
    try:
        found = find_template(template)
        checkout = templates_dir().parent
        schema_file = checkout / "docs" / "recipe.schema.json"
        inside = directory.resolve().is_relative_to(checkout)
        schema = os.path.relpath(schema_file, directory.resolve()) if schema_file.is_file() and inside else None
        text = new_recipe_text(found, name, schema)
        parse_recipe(text, str(target))
    except RecipeError as exc:
        raise Failure.of(exc, EXIT_INVALID) from None
    if target.exists() and not force:
        raise Failure([f"{escape(str(target))} exists: choose another NAME or --dir, or pass --force"], EXIT_INVALID)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise Failure([f"cannot write {escape(str(target))}: {exc.strerror or exc}"], EXIT_INVALID) from None
    if format is TextFormat.json:
        from tiered_training.cli.output import emit

        emit("init", 0, path=str(target), template=found.id, name=name)
        return
    lines = [
        f"wrote {escape(str(target))} from the template {found.id}",
        f"next: tiered-training plan {escape(str(target))}",
    ]
    if schema is None:
        lines.append(
            "editor checks: tiered-training schema > recipe.schema.json, then add to the recipe's first line "
            "'# yaml-language-server: $schema=recipe.schema.json'"
        )
    _print("\n".join(lines))
