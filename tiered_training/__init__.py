"""tiered-training: YAML training recipes -> plans -> SageMaker training platforms.

    from tiered_training import plan_file
    plan = plan_file("recipes/llama3-8b-fp8.yaml")
    plan.run_config()            # what the training container receives

This package imports no aws_cdk, torch or sagemaker SDK; the CDK constructs are in
``tiered_training.constructs`` and the trainer in the top-level ``training`` package.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from tiered_training import _moved

__version__ = "0.2.0"

# name -> the module that defines it, imported on first use: the training container's processes
# read only ``tiered_training.contract.runconfig`` and need not load the recipe loader and the planner.
_EXPORTS = {
    "PlanError": "planning.plan",
    "RecipeError": "recipe.errors",
    "load_recipe": "recipe.loader",
    "Plan": "planning.plan",
    "plan_file": "planning.planner",
    "resolve": "planning.planner",
    "Recipe": "recipe",
    "RunConfig": "contract.runconfig",
}
__all__ = ["load_recipe", "Plan", "plan_file", "PlanError", "Recipe", "RecipeError", "resolve", "RunConfig"]

if TYPE_CHECKING:
    from tiered_training.contract.runconfig import RunConfig
    from tiered_training.planning.plan import Plan, PlanError
    from tiered_training.planning.planner import plan_file, resolve
    from tiered_training.recipe import Recipe
    from tiered_training.recipe.errors import RecipeError
    from tiered_training.recipe.loader import load_recipe


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


_moved.install()
