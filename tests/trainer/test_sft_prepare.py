"""The Prepare step's command (``python -m training.sft_prepare``) against a local S3: it packs raw examples into the
same shards as the local command, keys them by content, and an unchanged rerun reuses them and says so."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")
pytest.importorskip("moto")

from tiny import run_sft_data  # noqa: E402

from tiered_training.rehearse.s3 import LocalS3, list_keys, upload_dir  # noqa: E402
from training import sft_prepare  # noqa: E402
from training.tools.tiny_chat import CHAT_TEMPLATE_TOOLS, tiny_chat_tokenizer, tiny_tool_examples  # noqa: E402

SEQ = 64
SETTINGS = ["--sequence-length", str(SEQ), "--format", "messages", "--overlong", "drop", "--dtype", "uint16"]


@pytest.fixture
def s3(tmp_path, monkeypatch):
    with LocalS3() as local:
        client = local.client()
        for bucket in ("raw", "model", "store"):
            local.ensure_bucket(client, bucket)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", str(local.endpoint))
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        tokenizer = tiny_chat_tokenizer(tmp_path / "tokenizer", template=CHAT_TEMPLATE_TOOLS)
        upload_dir(client, tokenizer, "s3://model/hf/")
        client.put_object(Bucket="model", Key="hf/model.safetensors", Body=b"weights, never read")
        rows = tiny_tool_examples(24)
        (tmp_path / "chat.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        client.upload_file(str(tmp_path / "chat.jsonl"), "raw", "tools/chat.jsonl")
        yield client


def prepare(tmp_path, capsys, *extra: str, name: str = "prepared.json") -> tuple[int, dict, str]:
    code = sft_prepare.main(
        [
            "--input",
            "s3://raw/tools/",
            "--tokenizer",
            "s3://model/hf/",
            "--prepared",
            "s3://store/recipe/output/prepared/",
            "--property-file",
            str(tmp_path / name),
            *SETTINGS,
            *extra,
        ]
    )
    out = capsys.readouterr()
    found = json.loads((tmp_path / name).read_text()) if code == 0 else {}
    return code, found, out.out + out.err


def test_prepare_packs_what_the_local_command_packs_and_a_rerun_reuses_it(s3, tmp_path, capsys):
    code, first, log = prepare(tmp_path, capsys)
    assert code == 0, log
    assert not first["reused"] and f"preparing data {first['key']}" in log
    assert first["uri"] == f"s3://store/recipe/output/prepared/{first['key']}/train/"
    keys = list_keys(s3, first["uri"])
    assert {k.rsplit("/", 1)[-1] for k in keys} == {
        "shards.json",
        "shard-00000.bin",
        "shard-00000.mask.bin",
        "shard-00000.pos.bin",
    }
    done = json.loads(
        s3.get_object(Bucket="store", Key=f"recipe/output/prepared/{first['key']}/manifest.json")["Body"].read()
    )
    assert [i["key"] for i in done["inputs"]] == ["chat.jsonl"] and done["train"]["examples"] > 0

    # The same code as the local command: equal shards from the same file and tokenizer.
    local = tmp_path / "local"
    code, _, err = run_sft_data(
        local,
        tmp_path / "tokenizer",
        tmp_path / "chat.jsonl",
        sequence_length=SEQ,
        format="messages",
        overlong="drop",
        dtype="uint16",
    )
    assert code == 0, err
    for name in ("shard-00000.bin", "shard-00000.mask.bin", "shard-00000.pos.bin"):
        body = s3.get_object(Bucket="store", Key=f"recipe/output/prepared/{first['key']}/train/{name}")["Body"].read()
        assert body == (local / "train" / name).read_bytes(), name

    before = list_keys(s3, "s3://store/")
    code, again, log = prepare(tmp_path, capsys, name="again.json")
    assert code == 0 and again == {**first, "reused": True}
    assert f"reusing prepared data {first['key']}" in log
    assert list_keys(s3, "s3://store/") == before  # nothing written


def test_the_key_changes_with_the_inputs_the_tokenizer_and_the_settings(s3, tmp_path, capsys):
    _, base, _ = prepare(tmp_path, capsys)
    _, other_setting, _ = prepare(tmp_path, capsys, "--loss-on", "all", name="b.json")
    s3.put_object(
        Bucket="raw", Key="tools/more.jsonl", Body=(json.dumps(tiny_tool_examples(1, seed=5)[0]) + "\n").encode()
    )
    _, more_input, log = prepare(tmp_path, capsys, name="c.json")
    assert "2 input object(s)" in log
    tokenizer = json.loads(s3.get_object(Bucket="model", Key="hf/tokenizer_config.json")["Body"].read())
    template = CHAT_TEMPLATE_TOOLS.replace("<|im_end|>\n{% endfor %}", "<|im_end|>{% endfor %}")
    assert template != CHAT_TEMPLATE_TOOLS
    tokenizer["chat_template"] = template
    s3.put_object(Bucket="model", Key="hf/tokenizer_config.json", Body=json.dumps(tokenizer).encode())
    s3.delete_object(Bucket="model", Key="hf/chat_template.jinja")  # transformers reads it before the config
    _, other_template, _ = prepare(tmp_path, capsys, name="d.json")
    keys = [base["key"], other_setting["key"], more_input["key"], other_template["key"]]
    assert len(set(keys)) == 4 and not any(f["reused"] for f in (other_setting, more_input, other_template))


def test_bad_input_is_one_line_and_exit_2(s3, tmp_path, capsys):
    s3.put_object(Bucket="raw", Key="tools/chat.jsonl", Body=b'{"messages": [{"role": "user"}]}\n')
    code, _, log = prepare(tmp_path, capsys)
    error = log.splitlines()[-1]
    assert (
        code == 2
        and error.startswith("error: s3://raw/tools/chat.jsonl:1: messages[0].content")
        and "Traceback" not in log
    )
    code, _, log = prepare(tmp_path, capsys, "--input", "s3://raw/nothing-here/")
    assert code == 2 and "no .jsonl, .json or .parquet objects" in log


def _key(first: dict, name: str) -> str:
    return f"recipe/output/prepared/{first['key']}/train/{name}"


@pytest.mark.parametrize("damage", ["same size", "deleted"])
def test_damaged_prepared_shards_are_named_and_prepared_again(s3, tmp_path, capsys, damage):
    code, first, log = prepare(tmp_path, capsys)
    assert code == 0, log
    name = "shard-00000.mask.bin"
    body = s3.get_object(Bucket="store", Key=_key(first, name))["Body"].read()
    if damage == "deleted":
        s3.delete_object(Bucket="store", Key=_key(first, name))
    else:  # the loss mask flipped where it was 0: as many bytes, other targets
        s3.put_object(Bucket="store", Key=_key(first, name), Body=bytes(1 - b for b in body))
    code, again, log = prepare(tmp_path, capsys, name="again.json")
    assert code == 0 and again == first, log  # the same key, prepared again, not reused
    assert f"prepared data {first['key']} is damaged, preparing it again: s3://store/{_key(first, name)}" in log
    assert s3.get_object(Bucket="store", Key=_key(first, name))["Body"].read() == body
    code, third, log = prepare(tmp_path, capsys, name="third.json")
    assert third == {**first, "reused": True} and "damaged" not in log


def test_other_preparing_code_prepares_again(s3, tmp_path, capsys, monkeypatch):
    _, first, _ = prepare(tmp_path, capsys)
    done = json.loads(
        s3.get_object(Bucket="store", Key=f"recipe/output/prepared/{first['key']}/manifest.json")["Body"].read()
    )
    assert done["code_version"] == sft_prepare.code_version()
    monkeypatch.setattr(sft_prepare, "code_version", lambda: "a-later-version")
    code, again, log = prepare(tmp_path, capsys, name="again.json")
    assert code == 0 and again["key"] != first["key"] and not again["reused"], log


def test_code_version_is_a_hash_of_the_preparing_modules(tmp_path, monkeypatch):
    before = sft_prepare.code_version()
    source = tmp_path / "sft_formats.py"
    source.write_text("# another version\n")

    class Spec:
        origin = str(source)

    real = sft_prepare.importlib.util.find_spec
    monkeypatch.setattr(
        sft_prepare.importlib.util, "find_spec", lambda name: Spec() if name == "training.sft_formats" else real(name)
    )
    assert sft_prepare.code_version() != before


def test_objects_no_reader_takes_are_refused_unless_ignored(s3, tmp_path, capsys):
    s3.put_object(Bucket="raw", Key="tools/README.md", Body=b"# the examples")
    s3.put_object(Bucket="raw", Key="tools/.DS_Store", Body=b"\0")
    code, _, log = prepare(tmp_path, capsys)
    assert code == 2 and "Traceback" not in log
    error = log.splitlines()[-1]
    assert "s3://raw/tools/.DS_Store, s3://raw/tools/README.md" in error and "data.ignore" in error
    code, found, log = prepare(tmp_path, capsys, "--ignore", "*.md", "--ignore", ".DS_Store", name="b.json")
    assert code == 0, log
    assert "ignoring 2 object(s) under s3://raw/tools/ as data.ignore says" in log and "1 input object(s)" in log


def test_gzipped_json_lines_are_read(s3, tmp_path, capsys):
    import gzip

    _, plain, _ = prepare(tmp_path, capsys)
    body = s3.get_object(Bucket="raw", Key="tools/chat.jsonl")["Body"].read()
    s3.delete_object(Bucket="raw", Key="tools/chat.jsonl")
    s3.put_object(Bucket="raw", Key="tools/chat.jsonl.gz", Body=gzip.compress(body))
    code, zipped, log = prepare(tmp_path, capsys, name="b.json")
    assert code == 0, log
    done = json.loads(
        s3.get_object(Bucket="store", Key=f"recipe/output/prepared/{zipped['key']}/manifest.json")["Body"].read()
    )
    first = json.loads(
        s3.get_object(Bucket="store", Key=f"recipe/output/prepared/{plain['key']}/manifest.json")["Body"].read()
    )
    assert done["checksums"]["shard-00000.bin"] == first["checksums"]["shard-00000.bin"]  # the same tokens


def test_preference_pairs_skip_lines_that_are_not_utf8_or_not_json(s3, tmp_path, capsys):
    """Task dpo's Prepare step: with skip, an unreadable line is counted in the manifest, not the end of the run."""
    from training.tools.tiny_pairs import tiny_pairs

    good = [json.dumps(r).encode() for r in tiny_pairs(8, seed=2)]
    body = b"\n".join([*good[:4], b'{"prompt": "caf\xe9"}', b"{not json", *good[4:]]) + b"\n"
    s3.delete_object(Bucket="raw", Key="tools/chat.jsonl")
    s3.put_object(Bucket="raw", Key="tools/pairs.jsonl", Body=body)
    skip = ["--format", "preference", "--on-bad-example", "skip", "--max-bad-fraction", "0.2"]
    code, found, log = prepare(tmp_path, capsys, *skip)
    assert code == 0, log
    assert "skipped 2 of 10 examples (not UTF-8: 1, not JSON: 1)" in log
    manifest = json.loads(s3.get_object(Bucket="store", Key=_key(found, "shards.json"))["Body"].read())
    assert manifest["layout"] == "pairs" and manifest["pairs"] == 8
    assert manifest["skipped"] == {"not UTF-8": 1, "not JSON": 1}
    code, _, log = prepare(tmp_path, capsys, "--format", "preference", name="b.json")
    assert code == 2 and log.splitlines()[-1].startswith("error: s3://raw/tools/pairs.jsonl:5: not UTF-8 text"), log


@pytest.mark.parametrize("fraction", ["1.5", "-0.1"])
def test_a_bad_fraction_outside_0_to_1_is_refused_before_s3_is_read(tmp_path, capsys, fraction):
    with pytest.raises(SystemExit) as exit_:
        prepare(tmp_path, capsys, "--on-bad-example", "skip", f"--max-bad-fraction={fraction}")
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"python -m training.sft_prepare: error: --max-bad-fraction must be in [0, 1], not {fraction}"
    )
