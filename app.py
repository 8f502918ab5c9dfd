#!/usr/bin/env python3
"""CDK app: one stack per recipe in the recipe directory, plus the shared platform stack.

    cdk synth                      # recipes/ (cdk.json context "recipes")
    cdk synth -c recipes=other/    # another directory (or one file)
    cdk synth -c image_uri=<ecr>   # use an existing image instead of building training/Dockerfile
    cdk synth -c region=us-west-2  # base image of that region as the build arg
    cdk synth -c nag=false         # skip the cdk-nag AwsSolutions checks
    cdk synth -c alarm_email=a@b.c # subscribe an address to the platform's alarm topic
    cdk synth -c stage=dev         # prefix stack, pipeline, dashboard, alarm and topic names: dev-TieredTraining-...
    cdk synth -c cfn_validation=true  # also CDK's built-in CloudFormation validation (about 1.4 s a stack)
    cdk synth -c quotas='{"training/ml.p6-b200.48xlarge": 8}'  # the account's applied quotas, for every recipe
    cdk synth -c quotas_listed=true  # acknowledge the quota warnings: `tiered-training plan` listed them (make synth)

Synth warns (tiered-training:quota-needed) for each quota a recipe needs beyond the applied
value: the recipe's compute.quotas, else the context's quotas, else AWS's default.

Stacks are environment-agnostic: synth needs no AWS account and no Docker daemon.
A recipe with errors stops synth with the same messages as `tiered-training validate`
(on stderr, exit status 2).
"""

import sys

try:
    import aws_cdk  # noqa: F401
except ImportError:
    print(
        "error: cdk synth needs aws-cdk-lib, which the 'cdk' extra installs: pip install 'tiered-training[cdk]' "
        "(or make synth)",
        file=sys.stderr,
    )
    sys.exit(3)

from tiered_training.constructs.app import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
