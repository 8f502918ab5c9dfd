"""The CDK app: one stack per recipe in a directory, plus the shared platform stack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aws_cdk import App, DefaultStackSynthesizer

from tiered_training.constructs.platform import PlatformProps, PlatformStack, RecipeStack, stack_id
from tiered_training.recipe import names

if TYPE_CHECKING:
    from tiered_training.planning.plan import Plan

PLATFORM_STACK = names.platform_stack_name()
# CDK's recommended feature flags for the pinned aws-cdk-lib, as `cdk init` writes them into
# cdk.json (aws-cdk-lib's recommended-feature-flags.json, copied), and the constructs' own
# choices over them. Set here so that `python app.py`, the tests and `cdk synth` agree;
# cdk.json lists the same.
RECOMMENDED_FLAGS: dict[str, Any] = json.loads((Path(__file__).parent / "feature_flags.json").read_text())
FLAG_OVERRIDES: dict[str, Any] = {
    # Recipe stacks import the platform's bucket, key and topic: keep the producer protected.
    "@aws-cdk/core:defaultCrossStackReferences": "strong",
}
FEATURE_FLAGS = {**RECOMMENDED_FLAGS, **FLAG_OVERRIDES}
# Why the quota warnings may be acknowledged (``quotas_listed``): the user has them already.
QUOTAS_LISTED = "tiered-training plan listed the quotas to raise; explain and preflight say how"


class RecipeProblems(Exception):
    """Recipes that cannot be planned; ``str()`` is the readable report (as ``tiered-training validate``)."""

    def __init__(self, reports: list[str]):
        self.reports = reports
        super().__init__("\n".join(reports))


def recipe_files(directory: str | Path) -> list[Path]:
    """The recipe files in ``directory`` (or the one file it names), as the CLI lists them.

    Raises RecipeProblems for entries that are not readable recipe files (dangling
    links, FIFOs, unreadable files are reported when read) and for no recipes at all.
    """
    from tiered_training.recipe.loader import find_recipes

    files, errors = find_recipes([directory])
    if errors:
        raise RecipeProblems([str(e) for e in errors])
    if not files:
        raise RecipeProblems([f"{directory}: no recipes found (*.yaml or *.yml)"])
    return files


def load_plans(directory: str | Path) -> list[Plan]:
    """Every recipe in ``directory``, planned. Raises RecipeProblems listing every bad one.

    The entries are the CLI's (``tiered_training.recipe.loader.find_recipes``), so ``cdk synth``
    fails on exactly the files ``tiered-training validate`` reports.
    """
    from tiered_training.planning.plan import PlanError
    from tiered_training.planning.planner import plan_file
    from tiered_training.recipe.errors import RecipeError

    plans, reports = [], []
    for path in recipe_files(directory):
        try:
            plan = plan_file(path).require_ok()
        except (RecipeError, PlanError) as error:
            reports.append(str(error))
            continue
        plans.append(plan)
    names = [p.name for p in plans]
    for name in sorted({n for n in names if names.count(n) > 1}):
        files = [str(p.source) for p in plans if p.name == name]
        reports.append(f"recipe name {name!r} is used by {', '.join(files)}: pipeline names must be unique")
    if reports:
        raise RecipeProblems(reports)
    return plans


def build_app(
    plans: list[Plan],
    *,
    app: App | None = None,
    nag: bool = True,
    platform: PlatformProps | None = None,
    bootstrap_rule: bool = True,
    cfn_validation: bool = False,
    stage: str | None = None,
    quotas_listed: bool = False,
    **app_kwargs: Any,
) -> tuple[App, PlatformStack, dict[str, RecipeStack]]:
    """An app with the platform stack and one RecipeStack per plan (environment-agnostic).

    - ``nag``: run cdk-nag AwsSolutions at synth, one pass over the app (findings fail synth).
    - ``platform``: the platform stack's :class:`PlatformProps`; default all defaults.
    - ``cfn_validation``: CDK's built-in CloudFormation validation plugin. It costs about
      1.4 s per stack, so it is off by default; the tests turn it on, and cfn-lint runs there too.
    - ``stage``: prefixes the stack, pipeline, dashboard, alarm, rule and topic names
      (``tiered_training.recipe.names``), so that stages can share an account; default
      ``platform.stage`` (none).
    - ``quotas_listed``: the user has the quotas the recipes need from ``tiered-training plan`` (``make synth``
      prints its table first): their warnings are acknowledged, not printed a second time.
    """
    if app is None:
        app_kwargs["context"] = {**FEATURE_FLAGS, **app_kwargs.get("context", {})}
        app_kwargs.setdefault("builtin_cloud_formation_validation", False)
        app = App(**app_kwargs)

    def synthesizer() -> DefaultStackSynthesizer | None:
        # One synthesizer per stack; without the bootstrap rule, templates hold only Resources (tests, moto).
        return None if bootstrap_rule else DefaultStackSynthesizer(generate_bootstrap_version_rule=False)

    problem = names.stage_problem(stage)
    if problem:
        raise ValueError(problem)
    if stage is not None or platform is None:
        from dataclasses import replace

        platform = replace(platform or PlatformProps(), stage=stage)
    stage = platform.stage
    platform_stack = PlatformStack(
        app,
        names.platform_stack_name(stage),
        props=platform,
        description="tiered-training shared platform: checkpoint store, training image, alarm topic",
        synthesizer=synthesizer(),
    )
    stacks = {
        plan.name: RecipeStack(
            app, stack_id(plan.name, stage), plan=plan, platform=platform_stack.platform, synthesizer=synthesizer()
        )
        for plan in plans
    }
    if quotas_listed:
        for stack in stacks.values():
            stack.acknowledge_quota_warnings(QUOTAS_LISTED)
    if nag:
        from tiered_training.constructs.nag import add_nag

        add_nag(app)
    if cfn_validation:
        from aws_cdk import CloudFormationValidatePlugin, Validations

        Validations.of(app).add_plugins(CloudFormationValidatePlugin())
    return app, platform_stack, stacks


EXIT_INVALID = 2


def main() -> int:
    """Entry point of the repository's ``app.py`` (see its docstring for the context keys)."""
    import sys

    # CDK's built-in CloudFormation validation is opt-in (-c cfn_validation=true), as build_app's.
    app = App(context=dict(FEATURE_FLAGS), builtin_cloud_formation_validation=False)
    context = app.node.try_get_context
    stage = context("stage") or None
    problem = names.stage_problem(stage)
    if problem:
        print(f"-c {problem}", file=sys.stderr)
        return EXIT_INVALID
    try:
        plans = load_plans(context("recipes") or "recipes")
    except RecipeProblems as problems:
        print(str(problems), file=sys.stderr)
        return EXIT_INVALID
    from tiered_training.planning.quotas import parse_account, with_account

    try:  # the account's applied quotas, for every recipe: -c quotas='{"training/ml.p5.48xlarge": 4}'
        account = parse_account(context("quotas"))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_INVALID
    plans = [with_account(plan, account) for plan in plans]
    platform = PlatformProps(
        image_uri=context("image_uri") or None,
        region=context("region") or None,
        alarm_email=context("alarm_email") or None,  # subscribed to the platform's alarm topic
        stage=stage,
    )
    build_app(
        plans,
        app=app,
        nag=str(context("nag")).lower() != "false",
        cfn_validation=str(context("cfn_validation")).lower() == "true",
        platform=platform,
        quotas_listed=str(context("quotas_listed")).lower() == "true",  # make synth: plan printed them
    )
    app.synth()
    return 0
