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

__version__ = "0.1.0"

# name -> the module that defines it, imported on first use: the training container's processes
# read only ``tiered_training.runconfig`` and need not load the recipe loader and the planner.
_EXPORTS = {"PlanError": "errors", "RecipeError": "errors", "load_recipe": "loader", "Plan": "plan",
            "plan_file": "planner", "resolve": "planner", "Recipe": "recipe", "RunConfig": "runconfig"}
__all__ = sorted(_EXPORTS, key=str.lower)

if TYPE_CHECKING:
    from .errors import PlanError, RecipeError
    from .loader import load_recipe
    from .plan import Plan
    from .planner import plan_file, resolve
    from .recipe import Recipe
    from .runconfig import RunConfig


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
