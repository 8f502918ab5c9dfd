"""Preference pairs prepared for DPO (training/dpo_data.py): bad records named by file, line and reason;
the packed rows hold whole pairs, chosen then rejected, targets on the completions only."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from tiny import run_sft_data  # noqa: E402,F401  (the tiny module puts training on the path)

from training import dpo_data  # noqa: E402
from training.tools.tiny_chat import tiny_chat_tokenizer  # noqa: E402

GOOD = {"prompt": "red green", "chosen": " green red", "rejected": " red"}


def run(tmp_path, records, *options):
    import contextlib
    import io

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    tok = tiny_chat_tokenizer(tmp_path / "tok")
    out, err = io.StringIO(), io.StringIO()
    args = [str(path), "--tokenizer", str(tok), "--sequence-length", "32", "--out", str(tmp_path / "out"), *options]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = dpo_data.main(args)
    return code, out.getvalue(), err.getvalue(), path


@pytest.mark.parametrize(
    "record,reason",
    [
        ({"prompt": "red green", "chosen": " green red"}, "rejected: missing"),
        ({"prompt": "red green", "chosen": " red", "rejected": " red"}, "chosen and rejected are identical"),
        ({"prompt": "", "chosen": " green red", "rejected": " red"}, "prompt: empty"),
        ({"prompt": [], "chosen": [{"role": "assistant", "content": "red"}],
          "rejected": [{"role": "assistant", "content": "green"}]}, "prompt: an empty list"),
        ({"chosen": "red green", "rejected": "blue cat"}, "prompt (the answers' shared beginning): empty"),
        ({"prompt": "red", "chosen": " green", "rejected": [{"role": "assistant", "content": "red"}]},
         "one is a string, the other a list of messages"),
    ],
    ids=["missing-rejected", "identical", "empty-prompt", "empty-prompt-list", "no-shared-prefix", "mixed-types"],
)
def test_a_bad_record_is_named_by_file_line_and_reason(tmp_path, record, reason):
    code, _, err, path = run(tmp_path, [GOOD, GOOD, record])
    assert code == 2
    assert f"{path}:3: " in err and reason in err, err
    assert not (tmp_path / "out" / "train").exists()  # nothing written


def test_skip_counts_the_bad_records_by_reason(tmp_path):
    bad = {"prompt": "red", "chosen": " red", "rejected": " red"}
    code, out, err, _ = run(tmp_path, [GOOD] * 9 + [bad], "--on-bad-example", "skip", "--max-bad-fraction", "0.2")
    assert code == 0, err
    assert "skipped 1 of 10 examples (identical answers: 1)" in err
    assert "train: 9 pairs" in out


def test_a_line_that_is_not_json_is_named(tmp_path):
    code, _, err, path = run(tmp_path, [GOOD, "{not json"])
    assert code == 2 and f"{path}:2: not JSON" in err, err


def test_rows_hold_whole_pairs_with_targets_on_the_completions(tmp_path):
    import numpy as np

    code, _, err, _ = run(tmp_path, [GOOD] * 3)
    assert code == 0, err
    manifest = json.loads((tmp_path / "out" / "train" / "shards.json").read_text())
    assert manifest["layout"] == "pairs" and manifest["pairs"] == 3
    tokens = np.fromfile(tmp_path / "out" / "train" / "shard-00000.bin", dtype=np.uint16).reshape(-1, 33)
    mask = np.fromfile(tmp_path / "out" / "train" / "shard-00000.mask.bin", dtype=np.uint8).reshape(-1, 33)
    pos = np.fromfile(tmp_path / "out" / "train" / "shard-00000.pos.bin", dtype=np.uint16).reshape(-1, 33)
    # red green | green red <eos> ; red green | red <eos>: 5 + 4 tokens a pair, three pairs in one row of 33
    assert tokens.shape[0] == 1
    assert pos[0, :9].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert mask[0, :9].tolist() == [0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert mask[0, 27:].sum() == 0  # padding


@pytest.mark.parametrize("form", ["parquet", "saved", "array"])
def test_parquet_saved_datasets_and_json_arrays_pack_as_json_lines_do(tmp_path, form):
    """The same pairs (conversations, explicit prompt) read by datasets from each container give the same shards."""
    import datasets

    from training.dpo_data import prepare
    from training.sft_data import Settings, SftTokenizer
    from training.tools.tiny_pairs import tiny_pairs

    records = tiny_pairs(12, seed=3)
    tok = SftTokenizer(tiny_chat_tokenizer(tmp_path / "tok"))
    lines = tmp_path / "pairs.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in records))
    if form == "parquet":
        other = tmp_path / "pairs.parquet"
        datasets.Dataset.from_list(records).to_parquet(str(other))
    elif form == "saved":
        other = tmp_path / "saved"
        datasets.Dataset.from_list(records).save_to_disk(str(other))
    else:
        other = tmp_path / "pairs.json"
        other.write_text(json.dumps(records))
    settings = Settings(sequence_length=32, format="preference")
    a = prepare([lines], tok, tmp_path / "a", settings)["train"]
    b = prepare([other], tok, tmp_path / "b", settings)["train"]
    assert a["pairs"] == b["pairs"] == 12
    assert [s["sha256"] for s in a["shards"]] == [s["sha256"] for s in b["shards"]]
