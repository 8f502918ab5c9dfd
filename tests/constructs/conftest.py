"""One synthesized app for the construct tests: every template recipe, the platform, cdk-nag on.

Synth costs about 3-4 s the first time in a process, so the app is built once per session.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import ROOT, recipe_dict, write_yaml

EXTRA = {
    # Variants the templates do not cover: spot with MaxWait, a training plan, a passed-in topic,
    # an MLflow tracking server and validation shards of their own; several allowed data
    # prefixes and a KMS key for the data.
    "spot-variant": recipe_dict(
        name="spot-variant",
        **{
            "compute.spot": True,
            "compute.max_runtime_hours": 10,
            "compute.max_wait_hours": 30,
            "compute.training_plan_arn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p6-reserved",
            "monitoring.alarm_topic_arn": "arn:aws:sns:us-east-1:123456789012:ml-alarms",
            "tracking.mlflow_tracking_server_arn": "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/research",
            "data.validation_uri": "s3://bucket-for-tests/held-out/",
            "probe.enabled": False,
            "tags": {"team": "research"},
        },
    ),
    "data-variant": recipe_dict(
        name="data-variant",
        **{
            "data.uri": "s3://bucket-a/tokens/v2/",
            "data.allowed_uris": ["s3://bucket-a/tokens", "s3://bucket-b/shared/"],
            "data.kms_key_arn": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        },
    ),
}


@pytest.fixture(scope="session")
def plans(tmp_path_factory):
    from tiered_training.constructs.app import load_plans

    extra = tmp_path_factory.mktemp("extra-recipes")
    for name, data in EXTRA.items():
        write_yaml(extra / f"{name}.yaml", data)
    return {p.name: p for p in load_plans(ROOT / "recipes") + load_plans(extra)}


@pytest.fixture(scope="session")
def template_names():
    from tiered_training.constructs.app import load_plans

    return [p.name for p in load_plans(ROOT / "recipes")]


@pytest.fixture(scope="session")
def synthesized(plans, tmp_path_factory):
    """(app, platform stack, recipe stacks, assembly); synth raises if cdk-nag or a validation fails."""
    from tiered_training.constructs.app import build_app

    outdir = tmp_path_factory.mktemp("cdk.out")
    app, platform, stacks = build_app(list(plans.values()), nag=True, cfn_validation=True, outdir=str(outdir))
    assembly = app.synth()
    return app, platform, stacks, assembly


@pytest.fixture(scope="session")
def templates(synthesized) -> dict[str, dict]:
    """Stack name -> template dict, read from the cloud assembly."""
    _app, _platform, _stacks, assembly = synthesized
    out = {}
    for path in Path(assembly.directory).glob("*.template.json"):
        out[path.name.removesuffix(".template.json")] = json.loads(path.read_text())
    return out


@pytest.fixture(scope="session")
def assembly_dir(synthesized) -> Path:
    return Path(synthesized[3].directory)


@pytest.fixture(scope="session")
def staged(plans, tmp_path_factory):
    """Two recipes (one on the platform topic, one with its own) in stage "dev"."""
    from tiered_training.constructs.app import build_app

    chosen = [plans["llama3-8b-128k"], plans["llama3-1b-bf16"]]
    app, platform, stacks = build_app(chosen, nag=False, stage="dev", outdir=str(tmp_path_factory.mktemp("staged")))
    assembly = app.synth()
    templates = {s.stack_name: assembly.get_stack_by_name(s.stack_name).template for s in [platform, *stacks.values()]}
    return app, platform, stacks, templates
