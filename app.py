#!/usr/bin/env python3
"""CDK app: one stack per recipe in the recipe directory, plus the shared platform stack.

    cdk synth                      # recipes/ (cdk.json context "recipes")
    cdk synth -c recipes=other/    # another directory (or one file)
    cdk synth -c image_uri=<ecr>   # use an existing image instead of building training/Dockerfile
    cdk synth -c region=us-west-2  # base image of that region as the build arg
    cdk synth -c nag=false         # skip the cdk-nag AwsSolutions checks
    cdk synth -c cfn_validation=true  # also CDK's built-in CloudFormation validation (about 1.4 s a stack)

Stacks are environment-agnostic: synth needs no AWS account and no Docker daemon.
A recipe with errors stops synth with the same messages as `tiered-training validate`
(on stderr, exit status 2).
"""

import sys

from aws_cdk import App

from tiered_training.constructs.app import FEATURE_FLAGS, RecipeProblems, build_app, load_plans

EXIT_INVALID = 2


def main() -> int:
    app = App(context=dict(FEATURE_FLAGS), builtin_cloud_formation_validation=False)
    context = app.node.try_get_context
    try:
        plans = load_plans(context("recipes") or "recipes")
    except RecipeProblems as problems:
        print(str(problems), file=sys.stderr)
        return EXIT_INVALID
    platform_props = {"image_uri": context("image_uri") or None, "region": context("region") or None}
    build_app(
        plans,
        app=app,
        nag=str(context("nag")).lower() != "false",
        cfn_validation=str(context("cfn_validation")).lower() == "true",
        platform_props=platform_props,
    )
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
