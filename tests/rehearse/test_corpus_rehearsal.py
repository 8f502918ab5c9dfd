"""Pretraining from raw corpora in the rehearsal: the raw sources and the tokenizer it puts in the local S3, the
Prepare step scaled to the rehearsal's hosts and budget, and (once the Prepare engine, training/corpus_prepare.py,
is in the tree) the template recipes/llama3-1b-raw-mixture.yaml from raw Parquet and JSON Lines through a Prepare
job on 2 simulated instances to training, then a rerun that reuses the prepared shards."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest

pytest.importorskip("moto")
pq = pytest.importorskip("pyarrow.parquet")

from tiered_training.contract.corpus import CorpusSpec  # noqa: E402
from tiered_training.pipeline import definition as d  # noqa: E402
from tiered_training.planning.planner import plan_file  # noqa: E402
from tiered_training.rehearse.data import put_raw_corpus  # noqa: E402
from tiered_training.rehearse.run import _scale_corpus  # noqa: E402
from tiered_training.rehearse.s3 import LocalS3, list_keys  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "recipes/llama3-1b-raw-mixture.yaml"
RESOURCES = d.PipelineResources(
    role_arn="arn:aws:iam::123456789012:role/exec",
    image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/tiered-training:1",
    checkpoint_s3_uri="s3://store/r/checkpoints/",
    output_s3_uri="s3://store/r/output/",
)


def test_the_raw_sources_and_the_tokenizer_are_put_in_their_formats(tmp_path):
    spec = plan_file(TEMPLATE).corpus_spec()
    with LocalS3() as s3:
        client = s3.client()
        for uri in [spec.tokenizer, *(s.uri for s in spec.sources)]:
            s3.ensure_bucket(client, uri.split("/")[2])
        put = put_raw_corpus(client, spec.sources, spec.tokenizer, workdir=tmp_path, repo=REPO)
        assert "tokenizer.json" in list_keys(client, spec.tokenizer)
        web, code = spec.sources
        parquet = put["files"]["web"][0]
        local = tmp_path / "web.parquet"
        client.download_file(parquet.split("/")[2], parquet.split("/", 3)[3], str(local))
        table = pq.read_table(local)
        assert table.column_names == [web.field] and table.num_rows == put["documents"]["web"] // 2
        assert pq.ParquetFile(local).num_row_groups == 2  # units smaller than a file
        body = client.get_object(Bucket=code.uri.split("/")[2], Key=put["files"]["code"][0].split("/", 3)[3])["Body"]
        records = [json.loads(line) for line in body.read().decode().splitlines()]
        assert all(set(r) == {code.field} and r[code.field] for r in records)


def test_the_prepare_step_is_scaled_to_the_rehearsals_hosts_and_budget():
    plan = plan_file(TEMPLATE)
    definition = d.build_definition(plan, RESOURCES)
    before = copy.deepcopy(definition)
    said = _scale_corpus(definition, 2, 1_000_000)
    assert said and "-> 2 instance(s)" in said
    step = next(s for s in definition["Steps"] if s["Name"] == d.S_PREPARE)
    assert step["Arguments"]["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 2
    values = step["Arguments"]["AppSpecification"]["ContainerArguments"]
    spec = CorpusSpec.model_validate_json("".join(values[values.index("--spec") + 1 : values.index("--prepared")]))
    assert spec.total_tokens == 1_000_000 and spec.sources == plan.corpus_spec().sources
    assert all(len(v) <= 256 for v in values)
    assert before != definition


@pytest.mark.torch
@pytest.mark.skipif(
    not (REPO / "training/corpus_prepare.py").is_file(), reason="the Prepare engine (training/corpus_prepare.py)"
)
def test_the_template_rehearses_from_raw_corpora_and_a_rerun_reuses_them(tmp_path):
    from tiered_training.rehearse.run import Options, rehearse

    out = io.StringIO()
    result = rehearse(
        Options(
            TEMPLATE,
            hosts=2,
            workers=1,
            steps=2,
            params={"SkipProbe": "true"},
            workdir=tmp_path,
            then={"SkipProbe": "true"},
        ),
        out,
    )
    log = out.getvalue()
    assert result.ok, log[-6000:]
    first, second = result.executions
    prepare = first.jobs["Prepare"][0]
    assert set(prepare.detail["hosts"]) == {"algo-1", "algo-2"}
    assert first.property_files["Prepare"]["PreparedData"]["reused"] is False
    assert second.property_files["Prepare"]["PreparedData"]["reused"] is True
    assert (
        second.property_files["Prepare"]["PreparedData"]["uri"]
        == first.property_files["Prepare"]["PreparedData"]["uri"]
    )
