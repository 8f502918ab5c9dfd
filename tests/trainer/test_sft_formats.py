"""Every format, from every kind of input, through ``python -m training.sft_data``: each example's ids and
mask equal the chat-template oracle's; bad examples are named, or skipped and counted."""

from __future__ import annotations

import json

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from chat_families import conversations, family_tokenizer  # noqa: E402
from tiny import run_sft_data  # noqa: E402

from training.sft_data import sft_files  # noqa: E402

SEQ = 1024  # every example fits


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("qwen")
    path = family_tokenizer(root / "marked", "qwen2.5", marked=True)
    return {
        "marked": path,
        "plain": family_tokenizer(root / "plain", "qwen2.5", marked=False),
        "hf": AutoTokenizer.from_pretrained(path, local_files_only=True),
    }


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("llama")
    path = family_tokenizer(root / "marked", "llama3.1", marked=True)
    return {
        "marked": path,
        "plain": family_tokenizer(root / "plain", "llama3.1", marked=False),
        "hf": AutoTokenizer.from_pretrained(path, local_files_only=True),
    }


def run(tmp_path, tokenizer, *inputs, **options):
    """Runs the command line; returns (exit code, stdout, stderr)."""
    options.setdefault("sequence_length", SEQ)
    return run_sft_data(tmp_path / "out", tokenizer, *inputs, **options)


def examples_written(directory):
    """Every packed example as (ids, mask), by the positions' restarts; padding left out."""
    manifest = json.loads((directory / "shards.json").read_text())
    width = manifest["sequence_length"] + 1
    found = []
    for entry in manifest["shards"]:
        tokens, mask, pos = (
            np.fromfile(path, dtype=kind).reshape(-1, width).astype(np.int64)
            for path, kind in zip(sft_files(directory / entry["file"]), (manifest["token_dtype"], np.uint8, manifest["token_dtype"]))
        )
        for t, m, p in zip(tokens, mask, pos):
            starts = [*np.flatnonzero(p == 0), len(p)]
            found += [(t[a:b].tolist(), m[a:b].tolist()) for a, b in zip(starts, starts[1:])]
    pad = manifest["pad_token_id"]
    return [e for e in found if set(e[0]) != {pad}], manifest


def write(path, records, kind):
    """``records`` as one kind of input: jsonl, array (a JSON array), parquet or saved (save_to_disk)."""
    if kind == "jsonl":
        path = path.with_suffix(".jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif kind == "array":
        path = path.with_suffix(".json")
        path.write_text(json.dumps(records, indent=1))
    elif kind == "parquet":
        path = path.with_suffix(".parquet")
        datasets.Dataset.from_list(records).to_parquet(str(path))
    else:
        datasets.Dataset.from_list(records).save_to_disk(str(path))
    return path


def chat_oracle(hf, messages, tools=None, prompt_messages=0):
    """transformers' ids and assistant_masks; with a conversational prompt, only the completion's."""
    out = hf.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    if prompt_messages:
        prompt = len(hf.apply_chat_template(messages[:prompt_messages], tools=tools, tokenize=True, return_dict=True)["input_ids"])
        mask = [m if i >= prompt else 0 for i, m in enumerate(mask)]
    return ids, mask


def pair(hf, prompt, completion):
    """BOS (if the tokenizer has one), the prompt's tokens, the completion's, EOS; the completion and EOS are targets."""
    bos = [hf.bos_token_id] if hf.bos_token_id is not None else []
    first = bos + hf.encode(prompt, add_special_tokens=False)
    second = hf.encode(completion, add_special_tokens=False) + [hf.eos_token_id]
    return first + second, [0] * len(first) + [1] * len(second)


def formats(hf):
    """Per format: records and each one's oracle (ids, mask)."""
    reverse = [{"role": "user", "content": "please reverse cat dog"}, {"role": "assistant", "content": "dog cat"}]
    system = {"role": "system", "content": "You are a helpful assistant."}
    eos = hf.eos_token_id
    return {
        "messages": [
            ({"messages": reverse}, chat_oracle(hf, reverse)),
            ({"messages": [system, *reverse]}, chat_oracle(hf, [system, *reverse])),
        ],
        "sharegpt": [
            (
                {"conversations": [{"from": "human", "value": "please reverse cat dog"}, {"from": "gpt", "value": "dog cat"}]},
                chat_oracle(hf, reverse),
            ),
            (
                {"conversations": [{"from": "system", "value": system["content"]}, {"from": "human", "value": "please reverse cat dog"},
                                   {"from": "gpt", "value": "dog cat"}]},
                chat_oracle(hf, [system, *reverse]),
            ),
        ],
        "alpaca": [
            ({"instruction": "please reverse", "input": "cat dog", "output": "dog cat"},
             chat_oracle(hf, [{"role": "user", "content": "please reverse\n\ncat dog"}, reverse[1]])),
            ({"instruction": "please reverse cat dog", "input": "", "output": "dog cat"}, chat_oracle(hf, reverse)),
        ],
        "prompt_completion": [
            ({"prompt": "please reverse cat dog", "completion": " dog cat"}, pair(hf, "please reverse cat dog", " dog cat")),
            ({"prompt": "what is the weather in Paris", "completion": " sunny"}, pair(hf, "what is the weather in Paris", " sunny")),
        ],
        "prompt_completion conversational": [
            ({"prompt": [system, reverse[0]], "completion": [reverse[1]]}, chat_oracle(hf, [system, *reverse], prompt_messages=2)),
            # an earlier assistant turn in the prompt is context, not a target
            ({"prompt": [*reverse, {"role": "user", "content": "again"}], "completion": [{"role": "assistant", "content": "cat dog"}]},
             chat_oracle(hf, [*reverse, {"role": "user", "content": "again"}, {"role": "assistant", "content": "cat dog"}], prompt_messages=3)),
        ],
        "text": [
            ({"text": "the weather in Paris is sunny"}, (hf("the weather in Paris is sunny")["input_ids"] + [eos], None)),
            ({"text": "hello there how can help you today"}, (hf("hello there how can help you today")["input_ids"] + [eos], None)),
        ],
    }


FORMATS = ["messages", "sharegpt", "alpaca", "prompt_completion", "prompt_completion conversational", "text"]


@pytest.mark.parametrize("kind", ["jsonl", "array", "parquet", "saved"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", ["qwen2.5", "llama3.1"])
def test_every_format_from_every_input_gives_the_oracles_ids_and_masks(tmp_path, qwen, llama, family, fmt, kind):
    tok = qwen if family == "qwen2.5" else llama
    cases = formats(tok["hf"])[fmt]
    data = write(tmp_path / "data", [record for record, _ in cases], kind)
    for tokenizer in ("marked", "plain"):  # {% generation %} spans, and the prefix-by-prefix rendering
        code, out, err = run(tmp_path, tok[tokenizer], data)
        assert code == 0, err
        name = fmt.split(" ")[0]
        assert f"{data}: read as {name} (--format auto, from its first valid record)\n" in out  # auto says its choice
        found, manifest = examples_written(tmp_path / "out" / "train")
        want = [(ids, mask if mask is not None else [1] * len(ids)) for _, (ids, mask) in cases]
        assert sorted(found) == sorted(want)
        assert manifest["formats"] == {str(data): name} and manifest["examples"] == len(cases)


def test_text_is_continued_pretraining_with_bos_and_eos(tmp_path, llama):
    """Llama's tokenizer puts BOS before plain text: the example is BOS, the text, EOS, all targets."""
    hf = llama["hf"]
    data = write(tmp_path / "data", [{"text": "the weather in Paris is sunny"}], "jsonl")
    code, _, err = run(tmp_path, llama["plain"], data, format="text")
    assert code == 0, err
    (ids, mask), = examples_written(tmp_path / "out" / "train")[0]
    assert ids[0] == hf.bos_token_id and ids[-1] == hf.eos_token_id
    assert hf.decode(ids[1:-1]) == "the weather in Paris is sunny" and mask == [1] * len(ids)


def test_tool_calling_records_from_parquet_keep_their_shape(tmp_path, qwen):
    """Arrow gives every record of a Parquet file every key any record has (absent ones as null): those
    nulls are taken out again, so a tool call, its result and the tools render as in JSON Lines."""
    cases = conversations("qwen2.5")
    records = [cases[name]["record"] for name in ("tool call", "plain")]  # from_list takes the first one's keys
    for kind in ("jsonl", "parquet"):
        data = write(tmp_path / kind, records, kind)
        code, _, err = run(tmp_path, qwen["marked"], data)
        assert code == 0, err
        found, _ = examples_written(tmp_path / "out" / "train")
        want = [chat_oracle(qwen["hf"], cases[n]["messages"], cases[n].get("tools")) for n in ("plain", "tool call")]
        assert sorted(found) == sorted(want), kind


def bad_lines(tmp_path):
    good = json.dumps({"messages": [{"role": "user", "content": "please reverse cat dog"}, {"role": "assistant", "content": "dog cat"}]})
    lines = [good] * 8
    lines[2] = json.dumps({"messages": [{"role": "user", "content": "cat"}]})  # line 3: no assistant turn
    lines[5] = json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                                        {"role": "assistant", "content": "a cat"}]})  # line 6: an image part
    lines[6] = json.dumps({"messages": [{"role": "user", "content": "dog"}]})  # line 7: no assistant turn
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(lines) + "\n")
    return data


def test_error_names_the_file_the_line_and_the_reason(tmp_path, qwen):
    data = bad_lines(tmp_path)
    code, _, err = run(tmp_path, qwen["marked"], data)
    assert code == 2 and err == f"error: {data}:3: messages: no assistant turn, so nothing to learn with --loss-on assistant\n"
    assert not (tmp_path / "out" / "train").exists()


def test_skip_counts_by_reason_shows_the_first_and_fails_above_the_fraction(tmp_path, qwen):
    data = bad_lines(tmp_path)
    code, out, err = run(tmp_path, qwen["marked"], data, on_bad_example="skip", max_bad_fraction=0.4)
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0] == "skipped 3 of 8 examples (no assistant turn: 2, content part image_url: 1)"
    assert lines[1:] == [
        f"  {data}:3: messages: no assistant turn, so nothing to learn with --loss-on assistant",
        f"  {data}:6: messages[0].content[0].type: 'image_url' parts are not supported; only text parts "
        '({"type": "text", "text": ...})',
        f"  {data}:7: messages: no assistant turn, so nothing to learn with --loss-on assistant",
    ]
    manifest = json.loads((tmp_path / "out" / "train" / "shards.json").read_text())
    assert manifest["examples"] == 5 and manifest["skipped"] == {"no assistant turn": 2, "content part image_url": 1}
    code, _, err = run(tmp_path, qwen["marked"], data, on_bad_example="skip", max_bad_fraction=0.3)
    assert code == 2
    assert err.splitlines()[-1] == ("error: 3 of 8 examples are bad (37.50%), more than --max-bad-fraction 0.3 allows "
                                    "(no assistant turn: 2, content part image_url: 1)")


def test_inputs_the_reader_cannot_use_are_named(tmp_path, qwen):
    other = tmp_path / "chat.csv"
    other.write_text("a,b\n")
    code, _, err = run(tmp_path, qwen["marked"], other)
    assert code == 2 and err == (f"error: {other}: .csv: not a format the reader knows; give JSON Lines (.jsonl), a JSON array "
                                 "(.json), either gzipped (.gz), Parquet (.parquet) or a Dataset.save_to_disk "
                                 "directory\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    code, _, err = run(tmp_path, qwen["marked"], folder)
    assert code == 2 and err == f"error: {folder}: a directory that Dataset.save_to_disk did not write (no state.json)\n"
    code, _, err = run(tmp_path, qwen["marked"], tmp_path / "nowhere.jsonl")
    assert code == 2 and err == f"error: {tmp_path / 'nowhere.jsonl'}: no such file or directory\n"
    code, _, err = run(tmp_path, qwen["marked"], "s3://bucket/chat.jsonl")
    assert code == 2 and err == "error: s3://bucket/chat.jsonl: a URI; the data step reads local paths: copy the data here first\n"


def test_a_record_of_no_format_and_a_forced_format_are_named(tmp_path, qwen):
    data = tmp_path / "odd.jsonl"
    data.write_text(json.dumps({"question": "cat", "answer": "dog"}) + "\n")
    code, _, err = run(tmp_path, qwen["marked"], data)
    assert code == 2 and err.startswith(f"error: {data}:1: no format fits (keys: answer, question); expected ")
    data.write_text(json.dumps({"instruction": "please reverse cat dog", "output": "dog cat"}) + "\n")
    code, _, err = run(tmp_path, qwen["marked"], data, format="sharegpt")
    assert code == 2 and err.startswith(f"error: {data}:1: no conversations (keys: instruction, output); the format of "
                                        "this input is sharegpt")


def test_records_of_a_json_array_or_a_saved_dataset_are_named_by_index(tmp_path, qwen):
    good = {"messages": [{"role": "user", "content": "please reverse cat dog"}, {"role": "assistant", "content": "dog cat"}]}
    bad = {"messages": [{"role": "user", "content": "cat"}, {"role": "user", "content": "dog"}]}
    for kind in ("array", "saved"):
        data = write(tmp_path / kind, [good, good, bad], kind)
        code, _, err = run(tmp_path, qwen["marked"], data)
        assert code == 2 and err == f"error: {data}: record 2: messages: no assistant turn, so nothing to learn with --loss-on assistant\n"
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list([good]), "test": datasets.Dataset.from_list([good])})
    splits.save_to_disk(str(tmp_path / "splits"))
    code, _, err = run(tmp_path, qwen["marked"], tmp_path / "splits")
    assert code == 2 and err == f"error: {tmp_path / 'splits'}: a DatasetDict; give one split's directory (train, test)\n"
    code, _, err = run(tmp_path, qwen["marked"], tmp_path / "splits" / "train")
    assert code == 0, err


# ---- the edges of the data teams hold (OpenAI fine-tuning files, LLaMA-Factory's Alpaca, Qwen2.5) ----


def test_openai_weight_0_turn_is_context_and_weight_1_a_target(tmp_path, qwen):
    """OpenAI's fine-tuning files mark an assistant reply not to learn with ``"weight": 0``."""
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "please reverse cat dog"},
        {"role": "assistant", "content": "cat dog", "weight": 0},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "dog cat", "weight": 1, "function_call": None},  # null: as OpenAI writes it
    ]
    data = write(tmp_path / "openai", [{"messages": messages}], "jsonl")
    want = chat_oracle(qwen["hf"], messages, prompt_messages=4)  # only the last turn's tokens
    for tokenizer in ("marked", "plain"):
        code, _, err = run(tmp_path, qwen[tokenizer], data)
        assert code == 0, err
        found, _ = examples_written(tmp_path / "out" / "train")
        assert found == [want] and sum(want[1]) > 0, tokenizer
    messages[4]["weight"] = 0  # nothing left to learn
    data = write(tmp_path / "openai", [{"messages": messages}], "jsonl")
    code, _, err = run(tmp_path, qwen["marked"], data)
    assert code == 2 and err == f"error: {data}:1: messages: no assistant turn, so nothing to learn with --loss-on assistant\n"
    messages[4]["weight"] = 0.5
    data = write(tmp_path / "openai", [{"messages": messages}], "jsonl")
    code, _, err = run(tmp_path, qwen["marked"], data)
    assert code == 2 and err.startswith(f"error: {data}:1: messages[4].weight: 0.5; weight is 0 or 1")


def test_a_json_array_of_tool_calling_records_reads_as_json_lines_does(tmp_path, qwen):
    """A JSON array of OpenAI tool-calling records (string arguments, null content, parallel calls, tools as a
    list and as a JSON string): the ids and masks of transformers, as from JSON Lines."""
    cases = conversations("qwen2.5")
    names = ["tool call", "text and two calls", "plain", "system and two turns"]
    want = sorted(chat_oracle(qwen["hf"], cases[n]["messages"], cases[n].get("tools")) for n in names)
    for kind in ("array", "jsonl"):
        data = write(tmp_path / kind, [cases[n]["record"] for n in names], kind)
        code, _, err = run(tmp_path, qwen["marked"], data)
        assert code == 0, err
        found, _ = examples_written(tmp_path / "out" / "train")
        assert sorted(found) == want, kind


def test_tool_schemas_reach_the_template_as_the_file_wrote_them(tmp_path, qwen):
    """Integers stay integers, properties keep their order, ``"default": null`` stays: the prompt learned is the
    prompt served (transformers given the file's own schema is the oracle)."""
    tool = {"type": "function", "function": {"name": "book", "description": "book a table", "parameters": {
        "type": "object", "properties": {"time": {"type": "string"}, "people": {"type": "integer", "minimum": 1},
                                         "note": {"type": "string", "default": None}}, "required": ["time"]}}}
    messages = [{"role": "user", "content": "a table for two"}, {"role": "assistant", "content": "sunny"}]
    want = chat_oracle(qwen["hf"], messages, [tool])
    prompt = qwen["hf"].decode(want[0])
    assert '"minimum": 1}' in prompt and '"default": null' in prompt and prompt.index('"time"') < prompt.index('"people"')
    for kind in ("jsonl", "array"):
        data = write(tmp_path / kind, [{"messages": messages, "tools": [tool]}], kind)
        code, _, err = run(tmp_path, qwen["marked"], data)
        assert code == 0, err
        found, _ = examples_written(tmp_path / "out" / "train")
        assert found == [want], kind


def test_skip_leaves_out_a_line_that_is_not_json_or_not_utf8(tmp_path, qwen):
    good = json.dumps({"messages": [{"role": "user", "content": "please reverse cat dog"}, {"role": "assistant", "content": "dog cat"}]})
    data = tmp_path / "chat.jsonl"
    data.write_bytes(b"\n".join([good.encode(), b'{"messages": [', good.encode(), b'{"text": "caf\xe9"}', good.encode()]) + b"\n")
    code, _, err = run(tmp_path, qwen["marked"], data)
    assert code == 2 and err.startswith(f"error: {data}:2: not JSON: ")
    code, _, err = run(tmp_path, qwen["marked"], data, on_bad_example="skip", max_bad_fraction=0.5)
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0] == "skipped 2 of 5 examples (not JSON: 1, not UTF-8: 1)"
    assert lines[1].startswith(f"  {data}:2: not JSON: ")
    assert lines[2] == f"  {data}:4: not UTF-8 text (invalid continuation byte at byte offset 13)"
    manifest = json.loads((tmp_path / "out" / "train" / "shards.json").read_text())
    assert manifest["examples"] == 3 and manifest["skipped"] == {"not JSON": 1, "not UTF-8": 1}


def test_alpaca_history_gives_the_earlier_turns(tmp_path, qwen):
    """LLaMA-Factory's Alpaca form: ``history`` is ``[[instruction, output], ...]`` before this turn."""
    record = {"instruction": "again", "input": "", "output": "dog cat", "system": "You are a helpful assistant.",
              "history": [["please reverse cat dog", "dog cat"], ["how can you help", "hello there"]]}
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "please reverse cat dog"}, {"role": "assistant", "content": "dog cat"},
                {"role": "user", "content": "how can you help"}, {"role": "assistant", "content": "hello there"},
                {"role": "user", "content": "again"}, {"role": "assistant", "content": "dog cat"}]
    data = write(tmp_path / "alpaca", [record], "jsonl")
    code, _, err = run(tmp_path, qwen["marked"], data)
    assert code == 0, err
    found, _ = examples_written(tmp_path / "out" / "train")
    assert found == [chat_oracle(qwen["hf"], messages)]
    data = write(tmp_path / "alpaca", [{**record, "history": [["only an instruction"]]}], "jsonl")
    code, _, err = run(tmp_path, qwen["marked"], data)
    assert code == 2 and err == f"error: {data}:1: history[0]: expected [instruction, output], two strings\n"


def test_openai_function_call_is_refused_by_name(tmp_path, qwen):
    record = {"messages": [{"role": "user", "content": "what is the weather in Paris"},
                           {"role": "assistant", "content": None,
                            "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                           {"role": "function", "name": "get_weather", "content": "sunny"},
                           {"role": "assistant", "content": "sunny"}]}
    data = write(tmp_path / "legacy", [record], "jsonl")
    code, _, err = run(tmp_path, qwen["marked"], data)
    assert code == 2 and err.startswith(f"error: {data}:1: messages[1].function_call: function_call is the deprecated "
                                        "form of tool_calls, not read here; write it as \"tool_calls\"")


def test_a_token_joining_the_qwen_header_and_a_reply_starting_with_space_is_a_target(tmp_path, monkeypatch):
    """Qwen2.5's byte-level BPE has a token for "\\n " (the header's newline and the reply's first space):
    transformers' ``assistant_masks`` marks it (its ``char_to_token`` of the reply's start), so the mask does too."""
    import chat_families
    from transformers import AutoTokenizer

    monkeypatch.setattr(chat_families, "CORPUS", chat_families.CORPUS + "<|im_start|>assistant\n  dog cat<|im_end|>\n" * 50)
    marked = family_tokenizer(tmp_path / "marked", "qwen2.5", marked=True)
    plain = family_tokenizer(tmp_path / "plain", "qwen2.5", marked=False)
    hf = AutoTokenizer.from_pretrained(marked, local_files_only=True)
    messages = [{"role": "user", "content": "please reverse cat dog"}, {"role": "assistant", "content": "  dog cat"}]
    ids, mask = chat_oracle(hf, messages)
    header = hf.convert_tokens_to_ids(hf.tokenize("\n "))
    assert len(header) == 1 and ids[mask.index(1)] == header[0]  # the target starts with the joined token
    data = write(tmp_path / "space", [{"messages": messages}], "jsonl")
    for tokenizer in (marked, plain):
        code, _, err = run(tmp_path, tokenizer, data)
        assert code == 0, err
        found, _ = examples_written(tmp_path / "out" / "train")
        assert found == [(ids, mask)], tokenizer
