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
    lines = (r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r)).encode() for r in records)
    path.write_bytes(b"".join(line + b"\n" for line in lines))
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


# line 5 is not UTF-8 (Latin-1 "é"), line 6 is not JSON, the other 8 are good pairs
UNREADABLE = [GOOD] * 4 + [b'{"prompt": "caf\xe9", "chosen": " red", "rejected": " green"}', "{not json"] + [GOOD] * 4


def test_skip_counts_lines_that_are_not_utf8_or_not_json_as_sft_does(tmp_path):
    code, out, err, path = run(tmp_path, UNREADABLE, "--on-bad-example", "skip", "--max-bad-fraction", "0.2")
    assert code == 0, err
    assert "skipped 2 of 10 examples (not UTF-8: 1, not JSON: 1)" in err
    assert f"{path}:5: not UTF-8 text (invalid continuation byte at byte offset 15)" in err
    assert f"{path}:6: not JSON: " in err
    assert "train: 8 pairs" in out
    manifest = json.loads((tmp_path / "out" / "train" / "shards.json").read_text())
    assert manifest["pairs"] == 8 and manifest["examples"] == 16
    assert manifest["skipped"] == {"not UTF-8": 1, "not JSON": 1}
    assert manifest["on_bad_example"] == "skip" and manifest["max_bad_fraction"] == 0.2


def test_error_stops_at_the_first_unreadable_line_naming_file_line_and_reason(tmp_path):
    code, out, err, path = run(tmp_path, UNREADABLE)
    assert code == 2 and not out
    assert err == f"error: {path}:5: not UTF-8 text (invalid continuation byte at byte offset 15)\n"
    assert not (tmp_path / "out" / "train").exists()


def test_skip_fails_when_more_than_the_bad_fraction_is_unreadable(tmp_path):
    code, _, err, _ = run(tmp_path, UNREADABLE, "--on-bad-example", "skip", "--max-bad-fraction", "0.1")
    assert code == 2
    assert err.splitlines()[-1] == (
        "error: 2 of 10 examples are bad (20.00%), more than --max-bad-fraction 0.1 allows (not UTF-8: 1, not JSON: 1)"
    )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing written


def test_a_line_that_is_not_an_object_names_the_pair_forms(tmp_path):
    code, _, err, path = run(tmp_path, [GOOD, "[1, 2]"])
    assert code == 2
    assert err == f"error: {path}:2: a JSON list, expected an object: {dpo_data.PAIR_FORM}\n"


@pytest.mark.parametrize("fraction", ["1.5", "-0.1", "nan"])
@pytest.mark.parametrize("command", ["dpo_data", "sft_data"])
def test_a_bad_fraction_outside_0_to_1_is_refused_before_the_data_is_read(tmp_path, capsys, command, fraction):
    from training import sft_data

    main = {"dpo_data": dpo_data.main, "sft_data": sft_data.main}[command]
    missing = tmp_path / "missing.jsonl"  # never opened: the arguments are refused first
    args = [str(missing), "--tokenizer", str(tmp_path / "tok"), "--sequence-length", "32", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--on-bad-example", "skip", f"--max-bad-fraction={fraction}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"python -m training.{command}: error: --max-bad-fraction must be in [0, 1], not {fraction}"
    )
    assert "missing.jsonl" not in err


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
