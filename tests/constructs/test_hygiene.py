"""What a platform team expects of the app: CDK's recommended feature flags, stages, a protected platform stack."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from cdk_helpers import only, resources

from tiered_training.constructs.app import FEATURE_FLAGS, FLAG_OVERRIDES, PLATFORM_STACK, RECOMMENDED_FLAGS
from tiered_training.recipe import names

ROOT = Path(__file__).resolve().parents[2]


def test_feature_flags_are_the_ones_cdk_recommends_for_the_pinned_aws_cdk_lib():
    import aws_cdk

    (bundle,) = (Path(aws_cdk.__file__).parent / "_jsii").glob("aws-cdk-lib@*.jsii.tgz")
    with tarfile.open(bundle) as archive:
        recommended = json.load(archive.extractfile("package/recommended-feature-flags.json"))
    assert RECOMMENDED_FLAGS == recommended, f"feature_flags.json is not {bundle.name}'s recommended-feature-flags.json"
    # cdk.json (read by `cdk synth`) and build_app (the tests, `python app.py`) agree.
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    assert {k: v for k, v in context.items() if k.startswith("@aws-cdk")} == FEATURE_FLAGS
    assert set(FLAG_OVERRIDES) <= set(RECOMMENDED_FLAGS)
    example = json.loads((ROOT / "examples" / "platform-repo" / "cdk.json").read_text())["context"]
    assert example == RECOMMENDED_FLAGS


def test_the_platform_stack_is_protected_from_deletion(synthesized, assembly_dir):
    _app, platform, _stacks, _assembly = synthesized
    assert platform.termination_protection
    manifest = json.loads((assembly_dir / "manifest.json").read_text())
    assert manifest["artifacts"][PLATFORM_STACK]["properties"]["terminationProtection"] is True


def test_a_stage_name_must_be_short_lowercase_letters_and_digits(plans):
    from tiered_training.constructs.app import build_app

    assert names.stage_problem("dev") is None and names.stage_problem("prod2") is None
    for bad in ("Dev", "dev-1", "1dev", "a" * 11, ""):
        assert names.stage_problem(bad)
    with pytest.raises(ValueError, match="stage 'Dev'"):
        build_app([plans["llama3-1b-bf16"]], stage="Dev", nag=False)


def test_every_derived_name_fits_with_the_longest_stage():
    longest = "r" * names.longest_name()
    assert names.name_problem(longest) is None and names.name_problem(longest + "r")
    for stage in (None, names.LONGEST_STAGE):
        assert len(names.failed_rule_name(longest, stage)) <= names.RULE_NAME_LIMIT
        assert len(names.stack_name(longest, stage)) <= 128
    # Two long names that share their first characters keep rules of their own.
    assert names.failed_rule_name("a" * 80) != names.failed_rule_name("a" * 79 + "b")


def test_a_stage_prefixes_the_stack_pipeline_dashboard_alarm_rule_and_topic_names(staged):
    _app, platform, stacks, templates = staged
    assert platform.stack_name == "dev-TieredTraining-Platform"
    assert sorted(stacks) == ["llama3-1b-bf16", "llama3-8b-128k"]
    topic = only(templates[platform.stack_name], "AWS::SNS::Topic")
    assert topic["Properties"]["TopicName"] == "dev-TieredTraining-platform_alarms"
    for recipe, stack in stacks.items():
        assert stack.stack_name == f"dev-TieredTraining-{recipe}"
        template = templates[stack.stack_name]
        assert only(template, "AWS::SageMaker::Pipeline")["Properties"]["PipelineName"] == f"dev-{recipe}"
        assert only(template, "AWS::CloudWatch::Dashboard")["Properties"]["DashboardName"] == f"dev-TieredTraining-{recipe}"
        assert only(template, "AWS::Events::Rule")["Properties"]["Name"] == f"dev-TieredTraining-{recipe}-failed"
        for alarm in resources(template, "AWS::CloudWatch::Alarm").values():
            assert alarm["Properties"]["AlarmName"].startswith(f"dev-TieredTraining-{recipe}-")
    own = only(templates[stacks["llama3-1b-bf16"].stack_name], "AWS::SNS::Topic")
    assert own["Properties"]["TopicName"] == "dev-TieredTraining-llama3-1b-bf16-alarms"
