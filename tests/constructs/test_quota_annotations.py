"""cdk synth warns about the quotas a deploy needs raised; the app's context quotas state the account's."""

from __future__ import annotations


def test_synth_warns_for_each_quota_the_account_lacks_and_context_quotas_silence_it(plans, tmp_path):
    from aws_cdk.assertions import Annotations, Match

    from tiered_training.constructs.app import build_app
    from tiered_training.planning.quotas import parse_account, with_account

    plan = plans["llama3-8b-128k"]  # one p6-b200 node for 120 h: the per-type quotas only
    _, _, stacks = build_app([plan], nag=False, outdir=str(tmp_path / "default"))
    warnings = Annotations.from_stack(stacks[plan.name])
    warnings.has_warning("*", Match.string_like_regexp("'ml.p6-b200.48xlarge for training job usage'"))
    warnings.has_warning("*", Match.string_like_regexp("'ml.p6-b200.48xlarge for training warm pool usage'"))

    account = parse_account('{"training/ml.p6-b200.48xlarge": 2, "warm-pool/ml.p6-b200.48xlarge": 2}')
    _, _, stacks = build_app([with_account(plan, account)], nag=False, outdir=str(tmp_path / "raised"))
    Annotations.from_stack(stacks[plan.name]).has_no_warning("*", Match.string_like_regexp("quota"))


def test_make_synth_acknowledges_the_quota_warnings_that_plan_listed(plans, tmp_path):
    """`make synth` prints plan's quota table, then synthesises with quotas_listed: CDK does not repeat them."""
    from aws_cdk.assertions import Annotations, Match
    from support import ROOT

    from tiered_training.constructs.app import build_app

    plan = plans["llama3-8b-128k"]
    _, _, stacks = build_app([plan], nag=False, quotas_listed=True, outdir=str(tmp_path))
    stack = stacks[plan.name]
    assert len(stack.quota_warnings) == len(plan.account_findings) > 0
    Annotations.from_stack(stack).has_no_warning("*", Match.string_like_regexp("quota"))
    makefile = (ROOT / "Makefile").read_text()
    assert "-c quotas_listed=true" in makefile.split("\nsynth:", 1)[0].rsplit("CDK_SYNTH :=", 1)[1].split("\n", 1)[0]
    assert "cdk synth $(CDK_SYNTH)" in makefile.split("\nsynth:", 1)[1].split("\n\n", 1)[0]
