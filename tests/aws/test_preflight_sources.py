"""Preflight of data.sources against moto's S3 on loopback: each source listed, its first records read
(JSON Lines, gzip, Parquet through ranged reads), its field checked, its tokens estimated from a sample, and
a budget that repeats a source beyond max_epochs refused."""

from __future__ import annotations

import gzip
import io
import json
import math
import random

import pytest
from support import write_yaml

pytest.importorskip("moto")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from tiered_training.aws.sources import check_sources  # noqa: E402
from tiered_training.planning.planner import plan_file  # noqa: E402
from tiered_training.rehearse.s3 import LocalS3  # noqa: E402

BUCKET = "corpora-preflight"
WORDS = "the a model learns from text code data web page line token of and to in".split()


def _texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 150))) for _ in range(count)]


@pytest.fixture(scope="module")
def s3():
    with LocalS3() as server:
        client = server.client()
        server.ensure_bucket(client, BUCKET)
        yield client


def _sources(checks):
    """The per-source checks (the Prepare check, when every source was sampled, comes last)."""
    return [c for c in checks if c.subject != "prepare"]


def _put(client, key: str, body: bytes) -> None:
    client.put_object(Bucket=BUCKET, Key=key, Body=body)


def _plan(tmp_path, sources, total=1_000_000, ignore=(), prepare=None):
    recipe = {
        "name": "preflight-sources",
        "model": {"catalog": "llama-3.2-1b"},
        "data": {
            "tokenizer": f"s3://{BUCKET}/tok/",
            "sources": sources,
            "ignore": list(ignore),
            **({"prepare": prepare} if prepare else {}),
        },
        "sequence_length": 4096,
        "budget": {"total_tokens": total, "global_batch_tokens": 4096 * 8},
        "compute": {"instance_type": "ml.p6-b200.48xlarge"},
    }
    path = write_yaml(tmp_path / "r.yaml", recipe)
    return plan_file(path)


def test_parquet_and_gzip_json_lines_pass_with_an_estimate(s3, tmp_path):
    web = _texts(200, 1)
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": web, "id": list(range(200))}), buffer, row_group_size=50)
    _put(s3, "ok/web/part-0.parquet", buffer.getvalue())
    code = _texts(200, 2)
    _put(s3, "ok/code/a.jsonl.gz", gzip.compress("".join(json.dumps({"content": t}) + "\n" for t in code).encode()))
    _put(s3, "ok/code/README.md", b"not data")
    sources = [
        {"name": "web", "uri": f"s3://{BUCKET}/ok/web/", "format": "parquet", "weight": 1, "max_epochs": 1000},
        {
            "name": "code",
            "uri": f"s3://{BUCKET}/ok/code/",
            "format": "jsonl",
            "field": "content",
            "weight": 1,
            "max_epochs": 1000,
        },
    ]
    every = check_sources(s3, _plan(tmp_path, sources, ignore=["README.md"]))
    checks = _sources(every)
    assert [c.status for c in every] == ["pass", "pass", "pass"], [c.line() for c in every]
    assert every[-1].subject == "prepare" and "Prepare tokenizes about " in every[-1].detail
    for check, texts in zip(checks, (web, code), strict=True):
        _assert_estimate(check, texts)
    assert "1 file(s)" in checks[1].detail  # README.md left out by data.ignore

    # Without the ignore glob, the Prepare step would stop at README.md: preflight says so first.
    (check, _) = _sources(check_sources(s3, _plan(tmp_path, sources[1:] + sources[:1])))
    assert check.status == "fail" and f"s3://{BUCKET}/ok/code/README.md" in check.detail, check.line()
    assert "fit no format (jsonl)" in check.detail and "data.ignore" in check.fix


def _assert_estimate(check, texts) -> None:
    estimated = int(check.detail.split("about ")[1].split(" tokens")[0].replace(",", ""))
    expected = sum(len(t.encode()) for t in texts) / 4  # the catalogue's 4 bytes per token
    assert 0.8 * expected <= estimated <= 1.25 * expected, check.detail


def _zstd(data: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as stream:
        stream.write(data)
    return sink.getvalue().to_pybytes()


def test_zstd_json_lines_a_saved_dataset_and_ndjson_gz_are_sampled_as_prepare_reads_them(s3, tmp_path):
    """The formats the Prepare step reads and preflight used to refuse or misread: zstd JSON Lines (sampled from a
    frame cut at 1 MiB), a saved dataset (its first Arrow record batch, by ranged reads; its state.json and
    dataset_info.json are no JSON records), and .ndjson.gz."""
    datasets = pytest.importorskip("datasets")
    big = _texts(12_000, 4)  # about 5 MB of JSON Lines: the 1 MiB sample ends inside a zstd frame
    _put(s3, "fmt/zst/part-0.jsonl.zst", _zstd("".join(json.dumps({"text": t}) + "\n" for t in big).encode()))
    saved = _texts(3000, 5)
    folder = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": saved, "n": list(range(3000))}).save_to_disk(str(folder))
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            _put(s3, f"fmt/saved/{path.relative_to(folder).as_posix()}", path.read_bytes())
    nd = _texts(300, 6)
    _put(s3, "fmt/nd/a.ndjson.gz", gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in nd).encode()))
    sources = [
        {"name": "zst", "uri": f"s3://{BUCKET}/fmt/zst/", "weight": 1, "max_epochs": 1000},
        {"name": "saved", "uri": f"s3://{BUCKET}/fmt/saved/", "weight": 1, "max_epochs": 1000},
        {"name": "nd", "uri": f"s3://{BUCKET}/fmt/nd/", "format": "jsonl", "weight": 1, "max_epochs": 1000},
    ]
    checks = _sources(check_sources(s3, _plan(tmp_path, sources)))
    assert [c.status for c in checks] == ["pass"] * 3, [c.line() for c in checks]
    zst, saved_check, nd_check = checks
    # zstd: the estimate scales the sample's text per stored (compressed) byte to the whole file
    _assert_estimate(zst, big)
    assert "1 file(s) (1 saved dataset(s))" in saved_check.detail, saved_check.detail
    _assert_estimate(saved_check, saved)
    _assert_estimate(nd_check, nd)


def test_a_saved_dataset_source_without_one_is_refused(s3, tmp_path):
    _put(s3, "nosaved/a.jsonl", b'{"text": "x"}\n')
    sources = [{"name": "s", "uri": f"s3://{BUCKET}/nosaved/", "format": "saved_dataset", "weight": 1}]
    (check,) = check_sources(s3, _plan(tmp_path, sources))
    assert check.status == "fail" and "no saved dataset (no state.json) under it" in check.detail, check.line()


@pytest.mark.parametrize(
    ("key", "body", "source", "expected"),
    [
        ("bad/a.jsonl", b'{"text": "fine"}\n{"txt": "typo"}\n', {}, "line 2: no field 'text' (keys: txt)"),
        ("bad/b.jsonl", b'{"text": 3}\n', {}, "line 1: field 'text' is a int, not text"),
        ("bad/c.jsonl", b'{"text": "x"}\nnot json\n', {}, "line 2: not JSON"),
        ("bad/d.parquet", None, {"format": "parquet"}, "no column 'text' (columns: body)"),
    ],
)
def test_a_bad_first_record_names_the_source_file_and_line(s3, tmp_path, key, body, source, expected):
    if body is None:
        buffer = io.BytesIO()
        pq.write_table(pa.table({"body": ["x"]}), buffer)
        body = buffer.getvalue()
    prefix = key.rsplit(".", 1)[0] + "/"
    _put(s3, prefix + key.rsplit("/", 1)[1], body)
    sources = [{"name": "bad", "uri": f"s3://{BUCKET}/{prefix}", "weight": 1, **source}]
    (check,) = check_sources(s3, _plan(tmp_path, sources))
    assert check.status == "fail" and expected in check.detail and "source bad" in check.detail
    assert f"s3://{BUCKET}/{prefix}" in check.detail


def test_a_budget_that_repeats_a_source_beyond_max_epochs_is_refused(s3, tmp_path):
    _put(s3, "small/a.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in _texts(20, 3)).encode())
    sources = [{"name": "small", "uri": f"s3://{BUCKET}/small/", "weight": 1}]
    (check,) = _sources(check_sources(s3, _plan(tmp_path, sources)))
    assert check.status == "fail" and "above max_epochs 4" in check.detail and "repeat it" in check.detail


def test_ignored_and_empty_sources(s3, tmp_path):
    _put(s3, "ignored/skip-me.jsonl", b'{"text": "x"}\n')
    sources = [{"name": "only", "uri": f"s3://{BUCKET}/ignored/", "weight": 1}]
    (check,) = check_sources(s3, _plan(tmp_path, sources, ignore=["skip-*"]))
    assert check.status == "fail" and "no data files under it" in check.detail


def test_prepare_is_sized_again_on_the_samples_and_refused_past_its_runtime(s3, tmp_path):
    """A source larger than the recipe's tokens_estimate says (the plan sized Prepare on the estimate): the deployed
    Prepare job, on its pinned host, would run past max_runtime_hours; preflight says so with the sampled tokens and
    the hosts that would fit."""
    texts = _texts(3000, 7)
    _put(s3, "large/a.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    sources = [
        {"name": "large", "uri": f"s3://{BUCKET}/large/", "weight": 1, "max_epochs": 1000, "tokens_estimate": 100_000}
    ]
    fits = check_sources(s3, _plan(tmp_path, sources, prepare={"instance_count": 1}))
    assert [c.status for c in fits] == ["pass", "pass"], [c.line() for c in fits]
    plan = _plan(tmp_path, sources, prepare={"instance_count": 1, "max_runtime_hours": 1.1e-5})
    source, prepare = check_sources(s3, plan)
    sampled = int(source.detail.split("about ")[1].split(" tokens")[0].replace(",", ""))
    assert prepare.status == "fail" and f"Prepare tokenizes about {sampled:,} tokens (sampled; the plan sized it on 100,000)" in prepare.detail
    assert "above data.prepare.max_runtime_hours 1.1e-05" in prepare.detail and "1 x ml.m5.4xlarge" in prepare.detail
    rate = plan.corpus.prepare.tokens_per_vcpu_second * plan.corpus.prepare.vcpus
    needed = math.ceil(sampled / (rate * 3600 * 1.1e-5))
    assert f"set data.prepare.instance_count: {needed} " in prepare.fix, prepare.fix
