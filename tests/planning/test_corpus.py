"""Pretraining from raw corpora (data.sources): the recipe's rules, each source's share and epochs, the Prepare
job's hosts, time and cost, its quota, the CorpusSpec and the pipeline's Prepare step."""

from __future__ import annotations

import json

import pytest
from support import write_yaml

from tiered_training.catalog import processing
from tiered_training.contract.corpus import CorpusSpec
from tiered_training.pipeline import definition as d
from tiered_training.pipeline import validation
from tiered_training.planning.planner import plan_file
from tiered_training.recipe.errors import RecipeError
from tiered_training.recipe.loader import load_recipe
from tiered_training.report import explain_lines

BUCKET = "s3://corpora-for-tests/"
RESOURCES = d.PipelineResources(
    role_arn="arn:aws:iam::123456789012:role/exec",
    image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/tiered-training:1",
    checkpoint_s3_uri="s3://store/r/checkpoints/",
    output_s3_uri="s3://store/r/output/",
)


def _recipe(**data) -> dict:
    base = {
        "tokenizer": f"{BUCKET}tokenizer/",
        "sources": [
            {"name": "web", "uri": f"{BUCKET}web/", "format": "parquet", "weight": 3, "tokens_estimate": 10**9},
            {"name": "code", "uri": f"{BUCKET}code/", "format": "jsonl", "field": "content", "weight": 1},
        ],
    }
    return {
        "name": "raw-mixture",
        "model": {"catalog": "llama-3.2-1b"},
        "data": {**base, **data},
        "sequence_length": 4096,
        "budget": {"total_tokens": 8_000_000_000, "global_batch_tokens": 4096 * 256},
        "compute": {"instance_type": "ml.p6-b200.48xlarge", "instance_count": 1},
    }


def _write(tmp_path, recipe):
    path = tmp_path / "r.yaml"
    write_yaml(path, recipe)
    return path


def test_shares_epochs_and_the_prepare_job(tmp_path):
    plan = plan_file(_write(tmp_path, _recipe()))
    assert plan.ok, plan.errors
    web, code = plan.corpus.sources
    assert (web.share, web.budget_tokens, web.held_tokens, web.epochs) == (0.75, 6 * 10**9, 10**9, 6.0)
    assert code.held_tokens is None and code.epochs is None  # unknown: said so, never guessed
    warning = next(f for f in plan.findings if f.code == "source-epochs")
    assert "web" in warning.message and "Muennighoff" in warning.message and warning.severity == "warning"
    assert any(f.code == "source-size-unknown" and "code" in f.message for f in plan.findings)
    prepare = plan.corpus.prepare
    catalogue = processing()
    vcpus = catalogue.instances["ml.m5.4xlarge"].vcpus
    tokens = 10**9 + 2 * 10**9  # web in full; code's budget share, its size unknown
    assert prepare.tokens == tokens
    one_host = tokens / (catalogue.tokens_per_vcpu_second * vcpus) / 3600
    training = plan.estimates.wall_time_hours - plan.estimates.probe_hours
    assert prepare.instance_count >= 1
    assert prepare.hours == pytest.approx(one_host / prepare.instance_count)
    assert prepare.hours <= 0.1 * training or prepare.instance_count == 100
    if prepare.instance_count > 1:  # the fewest that do it
        assert one_host / (prepare.instance_count - 1) > 0.1 * training
    assert plan.total_hours == pytest.approx(plan.estimates.wall_time_hours + prepare.hours)
    assert plan.decision("data.prepare.instance_count").source == "auto"
    text = "\n".join(map(str, explain_lines(plan)))
    assert "Prepare" in text and "ml.m5.4xlarge" in text and "epochs" in text


def test_a_smaller_share_takes_more_hosts_and_a_pinned_count_is_kept(tmp_path):
    wide = plan_file(_write(tmp_path, _recipe(prepare={"max_share": 0.01})))
    narrow = plan_file(_write(tmp_path, _recipe(prepare={"max_share": 0.5})))
    assert wide.corpus.prepare.instance_count > narrow.corpus.prepare.instance_count
    pinned = plan_file(_write(tmp_path, _recipe(prepare={"instance_count": 7, "instance_type": "ml.c5.9xlarge"})))
    assert pinned.corpus.prepare.instance_count == 7
    assert pinned.corpus.prepare.cost_usd == pytest.approx(pinned.corpus.prepare.hours * 7 * 1.836)
    quota = [f for f in pinned.findings if f.code == "quota-needed" and "processing" in f.message]
    assert quota and "7" in quota[0].message and quota[0].field == "data.prepare.instance_count"


def test_a_prepare_too_slow_for_its_runtime_is_an_error(tmp_path):
    recipe = _recipe(prepare={"instance_count": 1, "instance_type": "ml.m5.xlarge", "max_runtime_hours": 0.1})
    plan = plan_file(_write(tmp_path, recipe))
    assert not plan.ok and any(f.code == "prepare-runtime" for f in plan.errors)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"sources": [{"name": "a", "uri": f"{BUCKET}a/"}]}, "give exactly one of weight"),
        (
            {
                "sources": [
                    {"name": "a", "uri": f"{BUCKET}a/", "weight": 1},
                    {"name": "a", "uri": f"{BUCKET}b/", "weight": 1},
                ]
            },
            "names repeat",
        ),
        (
            {
                "sources": [
                    {"name": "a", "uri": f"{BUCKET}a/", "tokens": 5},
                    {"name": "b", "uri": f"{BUCKET}b/", "weight": 1},
                ]
            },
            "some sources give a weight",
        ),
        ({"sources": [{"name": "a", "uri": f"{BUCKET}a/", "tokens": 5}]}, "add up to 5"),
        ({"tokenizer": None}, "data.tokenizer"),
        ({"validation_uri": f"{BUCKET}val/"}, "data.validation_uri"),
        ({"prepare": {"instance_count": 0}}, "data.prepare.instance_count"),
        ({"sources": [{"name": "Web!", "uri": f"{BUCKET}a/", "weight": 1}]}, "data.sources.0.name"),
    ],
)
def test_bad_sources_name_the_line_and_field(tmp_path, data, expected):
    recipe = _recipe(**data)
    if data.get("tokenizer", "") is None:
        del recipe["data"]["tokenizer"]
    with pytest.raises(RecipeError) as caught:
        load_recipe(_write(tmp_path, recipe))
    text = str(caught.value)
    assert expected in text and "r.yaml:" in text


def test_ignore_without_sources_is_an_error(tmp_path):
    recipe = _recipe()
    recipe["data"] = {"uri": f"{BUCKET}tokens/", "ignore": ["*.md"]}
    with pytest.raises(RecipeError, match="data.ignore"):
        load_recipe(_write(tmp_path, recipe))


def test_the_corpus_spec_and_the_mixture_come_from_the_plan(tmp_path):
    plan = plan_file(_write(tmp_path, _recipe(ignore=["*.md"], on_bad_example="skip", max_bad_fraction=0.01)))
    spec = plan.corpus_spec()
    assert isinstance(spec, CorpusSpec)
    assert [s.name for s in spec.sources] == ["web", "code"] and spec.sources[1].field == "content"
    assert (spec.tokenizer, spec.ignore, spec.on_bad_example, spec.total_tokens) == (
        f"{BUCKET}tokenizer/",
        ["*.md"],
        "skip",
        8_000_000_000,
    )
    mixture = plan.run_config().data.mixture
    assert [(m.name, m.weight) for m in mixture] == [("web", 0.75), ("code", 0.25)]
    assert plan.run_config().validation.source == "channel"


def test_the_prepare_step_runs_corpus_prepare_on_n_hosts(tmp_path):
    sources = [
        {"name": f"s{i}", "uri": f"{BUCKET}{'long-prefix/' * 8}{i}/", "format": "parquet", "weight": 1}
        for i in range(6)
    ]
    plan = plan_file(_write(tmp_path, _recipe(sources=sources, prepare={"instance_count": 3})))
    definition = d.build_definition(plan, RESOURCES)
    assert validation.validate_definition(definition) == []
    step = next(s for s in definition["Steps"] if s["Name"] == d.S_PREPARE)
    args = step["Arguments"]
    assert args["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 3
    app = args["AppSpecification"]
    assert app["ContainerEntrypoint"] == ["python", "-m", "training.corpus_prepare"]
    arguments = app["ContainerArguments"]
    assert all(len(a) <= 256 for a in arguments) and len(arguments) <= 100
    end = arguments.index("--prepared")
    pieces = arguments[arguments.index("--spec") + 1 : end]
    assert len(pieces) > 1  # longer than one argument may be
    assert CorpusSpec.model_validate_json("".join(pieces)) == plan.corpus_spec()
    assert arguments[end + 1] == "s3://store/r/output/prepared/"
    body = json.dumps(definition)
    assert '"Path": "validation_uri"' in body  # the training step reads the held-out shards of prepared.json


def test_no_piece_of_the_spec_starts_with_a_dash():
    """An argument parser takes an argument that starts with "-" for an option: the cut moves before it."""
    text = "x" * 256 + "--a" + "y" * 300 + "-b"
    pieces = d.spec_pieces(text)
    assert "".join(pieces) == text
    assert all(0 < len(p) <= 256 and not p.startswith("-") for p in pieces)
    assert len(d.spec_pieces("a" * 600)) == 3
