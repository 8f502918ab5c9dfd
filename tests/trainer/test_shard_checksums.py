"""Shards that prove themselves when the trainer opens them: every file a manifest lists has its bytes, tokens and
SHA-256, a shard cut short or changed in place is refused by its S3 URI, and a manifest without checksums is
refused with the command that adds them."""

from __future__ import annotations

import json

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("torch")

from training.components import shard_manifest  # noqa: E402
from training.components.data import DataError, PackedTokenWindows, find_shards, read_sft_manifest  # noqa: E402
from training.tools import tokenize_to_shards as tts  # noqa: E402

URI = "s3://corpus/tokens/"


@pytest.fixture
def data(tmp_path):
    docs = [f"document {i} " * (20 + i) for i in range(6)]
    tts.write_shards(docs, tts.ByteTokenizer(), tmp_path / "data", tokens_per_shard=400)
    return tmp_path / "data"


def test_the_manifest_lists_bytes_and_checksums_and_the_shards_open(data):
    manifest = json.loads((data / "shards.json").read_text())
    for entry in manifest["shards"]:
        body = (data / entry["file"]).read_bytes()
        assert entry["bytes"] == len(body) == 2 * entry["tokens"]
        assert entry["sha256"] == shard_manifest.file_sha256(data / entry["file"])
    assert len(find_shards(data, "uint16", data_uri=URI)) == len(manifest["shards"]) > 2


def test_a_shard_cut_to_a_whole_number_of_tokens_is_refused_naming_it(data):
    shard = data / "shard-00001.bin"
    shard.write_bytes(shard.read_bytes()[:-20])  # 10 tokens fewer: still whole uint16 tokens
    with pytest.raises(DataError) as raised:
        PackedTokenWindows(data, "uint16", 16, rank=0, world_size=1, seed=0, data_uri=URI)
    message = str(raised.value)
    assert message.startswith(f"{URI}shard-00001.bin (local copy {shard}): 780 bytes, but {URI}shards.json")
    assert "says 800 (400 tokens)" in message and "cut short" in message


def test_a_same_size_change_is_refused_naming_the_shard(data):
    shard = data / "shard-00002.bin"
    body = bytearray(shard.read_bytes())
    body[100] ^= 1
    shard.write_bytes(bytes(body))
    with pytest.raises(DataError) as raised:
        find_shards(data, "uint16", data_uri=URI)
    message = str(raised.value)
    assert message.startswith(f"{URI}shard-00002.bin (local copy {shard}): its SHA-256 is ")
    assert f"but {URI}shards.json says" in message and "same size" in message


def test_a_deleted_shard_is_named(data):
    (data / "shard-00000.bin").unlink()
    with pytest.raises(DataError, match=rf"^{URI}shard-00000.bin \(local copy .*\): missing; {URI}shards.json lists"):
        find_shards(data, "uint16", data_uri=URI)


def test_local_ranks_share_the_hashing(data, monkeypatch):
    body = bytearray((data / "shard-00001.bin").read_bytes())
    body[0] ^= 1
    (data / "shard-00001.bin").write_bytes(bytes(body))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    find_shards(data, "uint16")  # rank 0 hashes shards 0, 2, ...: not the changed one
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(DataError, match="shard-00001.bin: its SHA-256"):
        find_shards(data, "uint16")


def test_hashes_are_remembered_per_path_size_and_mtime(data, monkeypatch):
    calls = []
    real = shard_manifest.hashlib.sha256
    monkeypatch.setattr(shard_manifest.hashlib, "sha256", lambda *a: calls.append(1) or real(*a))
    shard_manifest._hashes.clear()
    find_shards(data, "uint16")
    first = len(calls)
    find_shards(data, "uint16")
    assert first == len(json.loads((data / "shards.json").read_text())["shards"]) and len(calls) == first


def test_a_manifest_without_checksums_is_refused_with_the_command_that_adds_them(data):
    manifest = json.loads((data / "shards.json").read_text())
    for entry in manifest["shards"]:
        del entry["sha256"], entry["bytes"]
    (data / "shards.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError) as raised:
        find_shards(data, "uint16", data_uri=URI)
    assert str(raised.value).startswith(f"{URI}shards.json (local copy {data / 'shards.json'}): shard-00000.bin has no sha256")
    assert f"add them with python -m training.tools.tokenize_to_shards --add-checksums {data}" in str(raised.value)
    assert tts.main(["--add-checksums", str(data)]) == 0
    assert len(find_shards(data, "uint16")) == len(manifest["shards"])


def test_add_checksums_refuses_a_shard_of_another_size(data, capsys):
    manifest = json.loads((data / "shards.json").read_text())
    del manifest["shards"][0]["sha256"]
    (data / "shards.json").write_text(json.dumps(manifest))
    (data / "shard-00000.bin").write_bytes(b"\0\0")
    assert tts.main(["--add-checksums", str(data)]) == 2
    assert "shard-00000.bin: 2 bytes, but" in capsys.readouterr().err


def test_an_empty_data_prefix_names_its_s3_uri(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(FileNotFoundError, match=rf"^no \*.bin token shards under {URI} \(copied to "):
        find_shards(tmp_path / "train", "uint16", data_uri=URI)


def test_shards_without_a_manifest_are_read_as_they_are(tmp_path):
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "a.bin")
    assert find_shards(tmp_path, "uint16")[0].tokens == 100


# ---- packed SFT shards -------------------------------------------------------------------------


@pytest.fixture
def packed(tmp_path):
    pytest.importorskip("transformers")
    from tiny import run_sft_data

    from training.tools.tiny_chat import CHAT_TEMPLATE_TOOLS, tiny_chat_tokenizer, tiny_tool_examples

    tokenizer = tiny_chat_tokenizer(tmp_path / "tokenizer", template=CHAT_TEMPLATE_TOOLS)
    rows = tiny_tool_examples(12)
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, _, err = run_sft_data(
        tmp_path / "out", tokenizer, tmp_path / "chat.jsonl", sequence_length=64, format="messages", overlong="drop"
    )
    assert code == 0, err
    return tmp_path / "out" / "train"


def test_packed_shards_carry_checksums_and_a_flipped_mask_is_refused(packed):
    manifest = read_sft_manifest(packed, None, 64, data_uri=URI)
    sums = manifest["shards"][0]["sha256"]
    assert set(sums) == {"shard-00000.bin", "shard-00000.mask.bin", "shard-00000.pos.bin"}
    mask = packed / "shard-00000.mask.bin"
    mask.write_bytes(bytes(1 - b for b in mask.read_bytes()))  # same size, other targets
    with pytest.raises(DataError, match=rf"^{URI}shard-00000.mask.bin \(local copy .*\): its SHA-256 is "):
        read_sft_manifest(packed, None, 64, data_uri=URI)


def test_packed_shards_without_checksums_are_refused(packed):
    manifest = json.loads((packed / "shards.json").read_text())
    del manifest["shards"][0]["sha256"]
    (packed / "shards.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="no sha256 .packed by a version before checksums.; prepare the data"):
        read_sft_manifest(packed, None, 64)


# ---- the trainer, as it runs ---------------------------------------------------------------------

TRAIN = """
import sys
from pathlib import Path
sys.path[:0] = [{root!r}, {here!r}]
from tiny import tiny_config
from training.paths import Paths
from training.trainer import run
root = Path({tmp!r})
cfg = tiny_config(parallel={{"sharding": "full", "shard_group_size": 1}}, batch={{"total_steps": 2, "global_batch_tokens": 64}},
                  run={{"data_uri": {uri!r}}})
run(cfg, Paths(root / "data", root / "ck", root / "model"), resume=False, save_checkpoints=False, export=False,
    hooks=[lambda *a, **k: print("STEP", flush=True)])
"""


@pytest.mark.torch
def test_the_trainer_stops_before_step_1_on_a_truncated_shard_naming_its_s3_uri(tmp_path):
    """A token shard cut by whole tokens after its manifest was written: the run fails when it opens the data,
    with one line naming the object, and trains no step."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tiny import write_learnable_shards

    here = Path(__file__).resolve().parent
    root = here.parents[1]
    data = tmp_path / "data"
    write_learnable_shards(data, tokens=6000)
    files = sorted(data.glob("*.bin"))
    entries = [{"file": f.name, "tokens": f.stat().st_size // 2, "max_token_id": 255} for f in files]
    (data / "shards.json").write_text(json.dumps({"dtype": "uint16", "shards": entries}))
    assert tts.main(["--add-checksums", str(data)]) == 0
    files[1].write_bytes(files[1].read_bytes()[:-128])  # 64 tokens fewer
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    env.pop("RANK", None)
    script = TRAIN.format(root=str(root), here=str(here), tmp=str(tmp_path), uri=URI)
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "STEP" not in proc.stdout
    assert f"DataError: {URI}{files[1].name} (local copy {files[1]}): " in proc.stderr, proc.stderr[-3000:]
    assert "cut short or changed" in proc.stderr
