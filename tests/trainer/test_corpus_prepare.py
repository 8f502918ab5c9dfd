"""The pretraining Prepare step (``python -m training.corpus_prepare``): every format read and tokenized exactly as
the tokenizer's own ``encode``, bad records named, and on a local S3 two hosts sharing the units, a rerun reusing
everything, a changed file redoing only its units, a stopped job redoing only unfinished ones."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

from corpus_fixtures import bpe_tokenizer, documents, write_format  # noqa: E402

from tiered_training.contract.corpus import CorpusSpec  # noqa: E402
from training import corpus_prepare  # noqa: E402
from training.corpus_readers import BadData  # noqa: E402

FORMATS = {  # fixture format -> the source's format
    "parquet": "parquet",
    "jsonl": "jsonl",
    "json": "json",
    "text": "text",
    "text_lines": "text_lines",
    "saved_dataset": "saved_dataset",
    "gz": "auto",
    "zst": "text_lines",
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return bpe_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


def spec(tokenizer, sources: list[dict], **extra) -> CorpusSpec:
    return CorpusSpec.model_validate(
        {"sources": sources, "tokenizer": str(tokenizer), "total_tokens": 10_000, "validation_fraction": 0, **extra}
    )


def shard_ids(base: Path, split: str, source: str) -> list[int]:
    """The source's tokens in input order (units by file and row group)."""
    markers = [json.loads(p.read_text()) for p in (base / "units" / source).glob("*.json")]
    markers.sort(key=lambda m: (m["file"], m["row_group"] or 0))
    ids: list[int] = []
    for marker in markers:
        if marker["shards"][split]:
            ids.extend(np.fromfile(base / split / source / marker["shards"][split]["file"], dtype="<u4").tolist())
    return ids


def test_every_format_gives_the_tokenizers_own_ids_with_an_eos_after_each_document(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    docs = documents(40, seed=3)
    sources = []
    for fixture, fmt in FORMATS.items():
        write_format(tmp_path / "raw" / fixture, fixture, docs)
        sources.append(
            {"name": fixture.replace("_", "-"), "uri": str(tmp_path / "raw" / fixture), "format": fmt, "weight": 1}
        )
    found = corpus_prepare.prepare(
        spec(tokenizer, sources), str(tmp_path / "prepared"), processes=2, log=lambda _: None
    )
    base = tmp_path / "prepared" / found["key"]
    hf = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
    eos = hf.eos_token_id

    def expected(texts: list[str]) -> list[int]:
        return [i for text in texts for i in [*hf.encode(text, add_special_tokens=False), eos]]

    text_docs = sorted(zip([f"doc-{i:04d}.txt" for i in range(len(docs))], docs))  # a file per document, by name
    for fixture in FORMATS:
        texts = [d.replace("\n", " ") for d in docs] if fixture in ("text_lines", "zst") else docs
        if fixture == "text":
            texts = [d for _, d in text_docs]
        assert shard_ids(base, "train", fixture.replace("_", "-")) == expected(texts), fixture
    manifest = json.loads((base / "manifest.json").read_text())
    assert manifest["sources"]["parquet"]["units"] == 2  # a unit per row group
    listing = json.loads((base / "train" / "jsonl" / "shards.json").read_text())
    assert set(listing["shards"][0]) == {"file", "tokens", "bytes", "sha256", "max_token_id", "source"}
    assert listing["tokens"] == len(expected(docs))


def test_validation_documents_are_held_out_per_source_and_the_same_on_a_second_run(tokenizer, tmp_path):
    write_format(tmp_path / "raw", "jsonl", documents(400, seed=4))
    corpus = spec(tokenizer, [{"name": "web", "uri": str(tmp_path / "raw"), "weight": 1}], validation_fraction=0.1)
    first = corpus_prepare.prepare(corpus, str(tmp_path / "a"), processes=1, log=lambda _: None)
    second = corpus_prepare.prepare(corpus, str(tmp_path / "b"), processes=1, log=lambda _: None)
    manifest = json.loads((tmp_path / "a" / first["key"] / "manifest.json").read_text())
    held = manifest["sources"]["web"]["documents"]["validation"]
    assert 20 <= held <= 65 and manifest["sources"]["web"]["documents"]["train"] + held == 400
    for split in ("train", "validation"):
        assert shard_ids(tmp_path / "a" / first["key"], split, "web") == shard_ids(
            tmp_path / "b" / second["key"], split, "web"
        )


BAD_LINES = [
    (b'{"text": "fine"}\n{"text": "also fine"}\n{"body": "no text field"}\n', ":3: missing field"),
    (b'{"text": "fine"}\n{"text": "  "}\n', ":2: empty text"),
    (b'{"text": "fine"}\nnot json at all\n', ":2: not JSON"),
    (b'{"text": "fine"}\n{"text": "caf\xe9"}\n', ":2: not UTF-8"),
    (b'{"text": 7}\n', ":1: not text"),
]


@pytest.mark.parametrize(("content", "said"), BAD_LINES)
def test_a_bad_record_names_the_source_file_line_and_reason(tokenizer, tmp_path, content, said):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.jsonl").write_bytes(content)
    corpus = spec(tokenizer, [{"name": "web", "uri": str(tmp_path / "raw"), "weight": 1}])
    with pytest.raises(BadData) as error:
        corpus_prepare.prepare(corpus, str(tmp_path / "prepared"), processes=1, log=lambda _: None)
    assert str(error.value).startswith(f"source web: {tmp_path / 'raw' / 'a.jsonl'}{said}")


def test_skipped_bad_records_are_counted_per_source_and_too_many_refused(tokenizer, tmp_path):
    good = "".join(json.dumps({"text": d}) + "\n" for d in documents(18, seed=5))
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.jsonl").write_text(good + "oops\n" + '{"text": ""}\n')
    sources = [{"name": "web", "uri": str(tmp_path / "raw"), "weight": 1}]
    found = corpus_prepare.prepare(
        spec(tokenizer, sources, on_bad_example="skip", max_bad_fraction=0.1),
        str(tmp_path / "ok"),
        processes=1,
        log=lambda _: None,
    )
    manifest = json.loads((tmp_path / "ok" / found["key"] / "manifest.json").read_text())
    assert manifest["sources"]["web"]["bad"] == {"not JSON": 1, "empty text": 1}
    assert manifest["sources"]["web"]["documents"]["train"] == 18
    with pytest.raises(
        BadData, match=r"source web: 2 of 20 records are bad \(10.00%\), more than max_bad_fraction 0.05"
    ):
        corpus_prepare.prepare(
            spec(tokenizer, sources, on_bad_example="skip", max_bad_fraction=0.05),
            str(tmp_path / "few"),
            processes=1,
            log=lambda _: None,
        )
    assert not list((tmp_path / "few").rglob("manifest.json"))


def test_an_unknown_file_is_refused_unless_ignored(tokenizer, tmp_path):
    write_format(tmp_path / "raw", "jsonl", documents(5))
    (tmp_path / "raw" / "_SUCCESS").write_text("")
    sources = [{"name": "web", "uri": str(tmp_path / "raw"), "weight": 1}]
    with pytest.raises(BadData, match=r"source web: 1 file\(s\) fit no format \(auto\): .*_SUCCESS; .*ignore"):
        corpus_prepare.prepare(spec(tokenizer, sources), str(tmp_path / "p"), processes=1, log=lambda _: None)
    corpus_prepare.prepare(
        spec(tokenizer, sources, ignore=["_SUCCESS"]), str(tmp_path / "p"), processes=1, log=lambda _: None
    )


@pytest.fixture
def s3(tmp_path, monkeypatch, tokenizer):
    pytest.importorskip("moto")
    from tiered_training.rehearse.s3 import LocalS3, upload_dir

    with LocalS3() as local:
        client = local.client()
        for bucket in ("raw", "model", "store"):
            local.ensure_bucket(client, bucket)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", str(local.endpoint))
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        upload_dir(client, tokenizer, "s3://model/tok/")
        write_format(tmp_path / "web", "parquet", documents(60, seed=6))
        write_format(tmp_path / "code", "jsonl", documents(20, seed=7))
        write_format(tmp_path / "code", "gz", documents(20, seed=8))
        upload_dir(client, tmp_path / "web", "s3://raw/web/")
        upload_dir(client, tmp_path / "code", "s3://raw/code/")
        yield client


S3_SPEC = {
    "sources": [
        {"name": "web", "uri": "s3://raw/web/", "weight": 3},
        {"name": "code", "uri": "s3://raw/code/", "weight": 1},
    ],
    "tokenizer": "s3://model/tok/",
    "total_tokens": 5000,
    "validation_fraction": 0.05,
}


def host(tmp_path, capsys, index: int, *extra: str) -> tuple[int, dict, str]:
    out = tmp_path / f"host{index}" / "prepared.json"
    code = corpus_prepare.main(
        [
            "--spec",
            json.dumps(S3_SPEC),
            "--prepared",
            "s3://store/recipe/prepared/",
            "--property-file",
            str(out),
            "--host-index",
            str(index),
            "--host-count",
            "2",
            "--processes",
            "1",
            "--poll-seconds",
            "0.2",
            *extra,
        ]
    )
    said = capsys.readouterr()
    return code, (json.loads(out.read_text()) if code == 0 else {}), said.out + said.err


def test_two_hosts_share_the_units_and_reruns_redo_only_what_changed_or_is_unfinished(s3, tmp_path, capsys):
    from tiered_training.rehearse.s3 import list_keys

    # Host 0 alone: it tokenizes its units, then waits for host 1's and names them when it gives up.
    code, _, log = host(tmp_path, capsys, 0, "--wait-timeout", "0.5")
    assert code == 2 and "no done-marker after 0 s, on host(s) 1 (" in log, log
    # Host 1 does its share; host 0 again: its own units are done, so it only writes the manifests.
    code, second, log = host(tmp_path, capsys, 1)
    assert code == 0 and "1 of 2" not in log and "(2 of 2)" in log, log
    code, first, log = host(tmp_path, capsys, 0)
    assert code == 0, log
    assert "already done, 0 copied from an earlier key, 0 to tokenize" in log
    assert first["key"] == second["key"] and not first["reused"]
    base = f"s3://store/recipe/prepared/{first['key']}/"
    assert first["uri"] == base + "train/" and first["validation_uri"] == base + "validation/"
    manifest = json.loads(
        s3.get_object(Bucket="store", Key=f"recipe/prepared/{first['key']}/manifest.json")["Body"].read()
    )
    assert manifest["hosts"] == 2 and manifest["sources"]["web"]["units"] == 2
    assert (
        manifest["sources"]["code"]["documents"]["train"] + manifest["sources"]["code"]["documents"]["validation"] == 40
    )
    keys = list_keys(s3, base)
    assert any(k.endswith("train/web/shards.json") for k in keys) and any(
        k.endswith("train/code/shards.json") for k in keys
    )

    # Unchanged: reused on every host, nothing read.
    code, again, log = host(tmp_path, capsys, 1)
    assert code == 0 and again["reused"] and f"reusing prepared corpus {first['key']}" in log

    # One input changed: a new key, and only that file's unit is tokenized; the others are copied.
    s3.put_object(Bucket="raw", Key="code/a.jsonl", Body=json.dumps({"text": "a new document"}).encode() + b"\n")
    logs = ""
    for index in (1, 0):
        code, changed, log = host(tmp_path, capsys, index)
        assert code == 0, log
        logs += log
    assert changed["key"] != first["key"]
    assert logs.count("tokenized,") == 1 and "1/1 units tokenized" in logs, logs

    # A stopped job: one unit's marker gone and another unit's shard damaged; a rerun redoes those two only.
    new = f"recipe/prepared/{changed['key']}/"
    markers = sorted(list_keys(s3, f"s3://store/{new}units/"))
    s3.delete_object(Bucket="store", Key=f"{new}manifest.json")
    s3.delete_object(Bucket="store", Key=f"{new}units/{markers[0]}")
    damaged = json.loads(s3.get_object(Bucket="store", Key=f"{new}units/{markers[1]}")["Body"].read())
    shard = damaged["shards"]["train"]
    s3.put_object(Bucket="store", Key=f"{new}train/{damaged['source']}/{shard['file']}", Body=b"\0" * shard["bytes"])
    logs = ""
    for index in (1, 0):
        code, _, log = host(tmp_path, capsys, index)
        assert code == 0, log
        logs += log
    counts = np.array(
        [
            [int(n) for n in m]
            for m in re.findall(r"(\d+) unit\(s\) already done, (\d+) copied .*, (\d+) to tokenize", logs)
        ]
    ).sum(axis=0)
    assert counts.tolist()[0] == 2 and counts[1] + counts[2] == 2, logs  # the two others kept; the damaged one redone
    assert counts[2] >= 1  # the damaged shard's unit is the changed file's or is copied from the first key


def test_the_local_tool_writes_the_same_shard_entries(tmp_path):
    import hashlib

    from training.tools import tokenize_to_shards as tts

    manifest = tts.write_shards(["one doc", "two"], tts.ByteTokenizer(), tmp_path, tokens_per_shard=6)
    entry = manifest["shards"][0]
    assert set(entry) == {"file", "tokens", "bytes", "sha256", "max_token_id", "source"}
    data = (tmp_path / entry["file"]).read_bytes()
    assert entry["bytes"] == len(data) == 2 * entry["tokens"] and entry["sha256"] == hashlib.sha256(data).hexdigest()


def test_parquet_nulls_and_a_missing_column_are_bad_rows(tokenizer, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "raw").mkdir()
    pq.write_table(pa.table({"text": ["fine", None, "also fine"]}), tmp_path / "raw" / "a.parquet")
    pq.write_table(pa.table({"body": ["x", "y"]}), tmp_path / "raw" / "b.parquet")
    sources = [{"name": "web", "uri": str(tmp_path / "raw"), "weight": 1}]
    with pytest.raises(BadData, match=r"source web: .*a.parquet: row 1: missing field \(text is null\)"):
        corpus_prepare.prepare(spec(tokenizer, sources), str(tmp_path / "p"), processes=1, log=lambda _: None)
    found = corpus_prepare.prepare(
        spec(tokenizer, sources, on_bad_example="skip", max_bad_fraction=0.6),
        str(tmp_path / "p"),
        processes=1,
        log=lambda _: None,
    )
    manifest = json.loads((tmp_path / "p" / found["key"] / "manifest.json").read_text())
    assert manifest["sources"]["web"]["bad"] == {"missing field": 3} and manifest["sources"]["web"]["records"] == 5


def test_the_host_comes_from_sagemakers_resource_config_and_a_bad_spec_is_one_line(tmp_path, monkeypatch, capsys):
    config = tmp_path / "config" / "resourceconfig.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"current_host": "algo-10", "hosts": ["algo-10", "algo-2", "algo-1"]}))
    monkeypatch.setenv("TIERED_TRAINING_OPT_ML", str(tmp_path))
    args = argparse.Namespace(host_index=None, host_count=None, resource_config=None)
    assert corpus_prepare.host_identity(args) == (2, 3, "algo-10")
    code = corpus_prepare.main(["--spec", '{"sources": []}', "--prepared", str(tmp_path), "--property-file", "x"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --spec: sources: ") and "Traceback" not in err
