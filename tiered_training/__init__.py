"""tiered-training: YAML training recipes -> plans -> SageMaker training platforms.

    from tiered_training import plan_file
    plan = plan_file("recipes/llama3-8b-fp8.yaml")
    plan.run_config()            # what the training container receives

This package imports no aws_cdk, torch or sagemaker SDK; the CDK constructs are in
``tiered_training.constructs`` and the trainer in the top-level ``training`` package.
"""

from .errors import PlanError, RecipeError
from .loader import load_recipe
from .plan import Plan
from .planner import plan_file, resolve
from .recipe import Recipe
from .runconfig import RunConfig

__version__ = "0.1.0"
__all__ = ["Plan", "PlanError", "Recipe", "RecipeError", "RunConfig", "load_recipe", "plan_file", "resolve"]
