"""SFT data: chat templates and loss masks, packing, bad data, the manifest and fingerprint, the reader."""

from __future__ import annotations

import json
import sys

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("transformers")

from tiny import CHAT_TEMPLATE_MARKED, run_sft_data, tiny_chat_examples, tiny_chat_jsonl, tiny_chat_tokenizer  # noqa: E402

from training import sft_data  # noqa: E402
from training.components.data import DataError, SftSequences, build_sft_dataloader, sft_validation_batches  # noqa: E402
from training.sft_data import sft_files  # noqa: E402

SEQ = 64
SHORT = 56  # the packed fixture: all of its examples fit


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    return {"prefix": tiny_chat_tokenizer(root / "prefix"), "marked": tiny_chat_tokenizer(root / "marked", template=CHAT_TEMPLATE_MARKED),
            "none": tiny_chat_tokenizer(root / "none", template=None)}


@pytest.fixture(scope="module")
def hf(tokenizers):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizers["prefix"], local_files_only=True)


def prepare(tmp_path, tokenizer, *files, **options):
    """Runs the command line; returns (exit code, stdout, stderr)."""
    options.setdefault("sequence_length", SEQ)
    return run_sft_data(tmp_path / "out", tokenizer, *files, **options)


def read_sequences(directory):
    """(tokens, mask, pos) arrays of every packed sequence, and the manifest."""
    manifest = json.loads((directory / "shards.json").read_text())
    dtype = np.dtype(manifest["token_dtype"])
    width = manifest["sequence_length"] + 1
    parts = [[], [], []]
    for entry in manifest["shards"]:
        for part, path, kind in zip(parts, sft_files(directory / entry["file"]), (dtype, np.uint8, dtype)):
            part.append(np.fromfile(path, dtype=kind).reshape(-1, width))
    return [np.concatenate(p).astype(np.int64) for p in parts], manifest


def unpack(tokens, mask, pos):
    """Every example of every sequence as (token list, mask list), by the positions' restarts."""
    examples = []
    for t, m, p in zip(tokens, mask, pos):
        starts = list(np.flatnonzero(p == 0)) + [len(p)]
        for a, b in zip(starts, starts[1:]):
            assert p[a:b].tolist() == list(range(b - a))  # positions count up within an example
            examples.append((t[a:b].tolist(), m[a:b].tolist()))
    return examples


def expected_targets(hf, messages):
    """The assistant turns' tokens with their end-of-turn token, in order: what the mask must cover."""
    end = hf.convert_tokens_to_ids("<|im_end|>")
    return [t for m in messages if m["role"] == "assistant" for t in hf.encode(m["content"], add_special_tokens=False) + [end]]


@pytest.mark.parametrize("template", ["prefix", "marked"])
def test_masks_cover_exactly_the_assistant_tokens(tokenizers, hf, template):
    tok = sft_data.SftTokenizer(tokenizers[template])
    assert tok.marks_generation == (template == "marked")  # both ways of finding the assistant turns are tested
    for example in tiny_chat_examples(12):
        ids, mask = tok.encode(sft_data.Example("x:1", messages=example["messages"]), "assistant")
        assert ids == hf.apply_chat_template(example["messages"], tokenize=True, return_dict=True)["input_ids"]
        assert [t for t, m in zip(ids, mask) if m] == expected_targets(hf, example["messages"])
        # nothing else: the user's words, the roles and the generation prompts are no targets
        assert sum(mask) == len(expected_targets(hf, example["messages"]))
        _, every = tok.encode(sft_data.Example("x:1", messages=example["messages"]), "all")
        assert every == [1] * len(ids)


def test_masks_of_a_byte_level_tokenizer_cover_the_turns_and_their_end(tmp_path):
    """Byte-level BPE (as Llama 3 and Qwen2 use) makes tokens of the newlines too: the assistant's
    turn is its text, the end-of-turn token and the newline the template puts after it."""
    from tiny import CHAT_TEMPLATE, CHAT_WORDS
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator([" ".join(CHAT_WORDS) + " please reverse you words again system user assistant"] * 10, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(tmp_path / "tok")
    tok = sft_data.SftTokenizer(tmp_path / "tok")
    for example in tiny_chat_examples(8):
        ids, mask = tok.encode(sft_data.Example("x:1", messages=example["messages"]), "assistant")
        assert ids == hf.apply_chat_template(example["messages"], tokenize=True, return_dict=True)["input_ids"]
        turns = [m["content"] + "<|im_end|>\n" for m in example["messages"] if m["role"] == "assistant"]
        assert hf.decode([t for t, m in zip(ids, mask) if m]) == "".join(turns)
        assert sum(mask) == sum(len(hf.encode(turn, add_special_tokens=False)) for turn in turns)


def test_prompt_completion_is_prompt_then_completion_then_eos(tokenizers, hf):
    tok = sft_data.SftTokenizer(tokenizers["none"])  # no chat template needed
    ids, mask = tok.encode(sft_data.Example("x:1", prompt="please reverse cat dog", completion="dog cat"), "assistant")
    prompt, completion = hf.encode("please reverse cat dog"), hf.encode("dog cat")
    assert ids == prompt + completion + [hf.eos_token_id]
    assert mask == [0] * len(prompt) + [1] * (len(completion) + 1)


def test_packing_keeps_every_example_whole_with_restarting_positions(tmp_path, tokenizers, hf):
    data = tiny_chat_jsonl(tmp_path / "chat.jsonl", 40)
    code, out, err = prepare(tmp_path, tokenizers["prefix"], data)
    assert code == 0, err
    (tokens, mask, pos), manifest = read_sequences(tmp_path / "out" / "train")
    assert tokens.shape[1] == SEQ + 1
    tok = sft_data.SftTokenizer(tokenizers["prefix"])
    wanted = [tok.encode(sft_data.Example("x", messages=e["messages"]), "assistant") for e in tiny_chat_examples(40)]
    found = unpack(tokens, mask, pos)
    padding = [e for e in found if set(e[0]) == {hf.pad_token_id}]
    examples = [e for e in found if set(e[0]) != {hf.pad_token_id}]
    assert sorted(examples) == sorted(wanted)  # each example whole, in one sequence, with its mask
    assert all(set(m) == {0} for _, m in padding)
    assert sum(len(t) for t, _ in padding) == manifest["padding_tokens"]
    assert len(tokens) < len(wanted)  # several examples share a sequence
    assert manifest["examples"] == 40 and manifest["dropped"] == manifest["truncated"] == 0
    assert manifest["kind"] == "sft-packed" and manifest["sequence_length"] == SEQ and manifest["loss_on"] == "assistant"
    assert manifest["shards"][0]["max_token"] == int(tokens.max())
    assert "40 examples" in out
    assert hf.unk_token_id not in tokens  # the helper's tokenizer knows every word of the helper's data


BAD = [
    ('{"messages": [{"role": "user", "content": "cat"}', "not JSON: "),
    ('{"prompt": "caf\xe9", "completion": "cat"}', "not UTF-8 text (invalid continuation byte at byte offset 15)"),
    ('{"text": "cat dog"}', "no messages (keys: text); the format of this input is messages; give each format its own"),
    ('{"body": "cat dog"}', "no messages (keys: body); the format of this input is messages"),
    ('[1, 2]', "a JSON list, expected an object"),
    ('{"messages": [{"role": "bot", "content": "cat"}]}',
     "messages[0].role: 'bot' is not a role; valid roles: system, user, assistant, tool, ipython"),
    ('{"messages": [{"role": "user", "content": "cat"}, {"role": "assistant", "content": " "}]}',
     "messages[1].content: an empty assistant turn; give it text or remove the turn"),
    ('{"messages": [{"role": "user"}]}', "messages[0].content: missing, expected a string"),
    ('{"messages": [{"role": "user", "content": "cat"}]}', "messages: no assistant turn, so nothing to learn"),
    ('{"prompt": "cat", "completion": ""}', "completion: empty; every example needs text to learn"),
    ('{"prompt": 3, "completion": "cat"}', "prompt: a int, expected a string"),
    ('{"prompt": "cat", "completion": "' + " ".join(["dog"] * 80) + '"}',
     "prompt: 82 tokens, longer than sequence length 64 allows (65 tokens); pass --overlong drop or --overlong truncate"),
]


@pytest.mark.parametrize("line,message", BAD, ids=[m.split(":")[0].split(" ")[0] for _, m in BAD])
def test_bad_data_names_file_line_and_field(tmp_path, tokenizers, line, message):
    data = tiny_chat_jsonl(tmp_path / "chat.jsonl", 3)
    if line.startswith('{"prompt"'):  # one format to a file: the bad line follows prompt/completion examples
        data.write_text('{"prompt": "please reverse cat dog", "completion": "dog cat"}\n' * 3)
    data.write_bytes(b"\xef\xbb\xbf" + data.read_bytes() + b"\n" + line.encode("latin-1") + b"\n")  # line 5; a BOM
    code, out, err = prepare(tmp_path, tokenizers["prefix"], data)
    assert code == 2
    assert err.startswith(f"error: {data}:5: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "out" / "train").exists()  # nothing written


def test_chat_data_without_a_chat_template_is_refused(tmp_path, tokenizers):
    code, _, err = prepare(tmp_path, tokenizers["none"], tiny_chat_jsonl(tmp_path / "chat.jsonl", 2))
    assert code == 2
    assert err.startswith(f"error: {tmp_path / 'chat.jsonl'}:1: messages: the tokenizer in {tokenizers['none']} has no "
                          "chat template; use a checkpoint whose tokenizer ships one")


def test_a_missing_tokenizer_is_named(tmp_path):
    code, _, err = prepare(tmp_path, tmp_path / "nowhere", tiny_chat_jsonl(tmp_path / "chat.jsonl", 2))
    assert code == 2 and err == (f"error: {tmp_path / 'nowhere'}: no such directory; --tokenizer is a local directory "
                                 "holding the model's tokenizer\n")


def test_the_command_exits_2_without_a_traceback(tmp_path, tokenizers, monkeypatch, capsys):
    """``python -m training.sft_data`` as a module run (in this process: a new interpreter would
    spend seconds importing torch through transformers)."""
    import runpy

    data = tmp_path / "bad.jsonl"
    data.write_text('{"messages": [{"role": "robot", "content": "cat"}]}\n')
    monkeypatch.setattr(sys, "argv", ["sft_data", str(data), "--tokenizer", str(tokenizers["prefix"]),
                                      "--sequence-length", "16", "--out", str(tmp_path / "out")])
    monkeypatch.delitem(sys.modules, "training.sft_data")  # runpy runs a fresh copy as __main__
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("training.sft_data", run_name="__main__", alter_sys=True)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"error: {data}:1: messages[0].role: 'robot' is not a role; "
                                       "valid roles: system, user, assistant, tool, ipython\n")


def test_overlong_examples_are_dropped_or_truncated_and_counted(tmp_path, tokenizers, hf):
    data = tmp_path / "mixed.jsonl"
    rows = [{"prompt": "please reverse cat", "completion": "cat"}] * 3
    rows += [{"prompt": "please reverse", "completion": " ".join(["dog"] * 80)}] * 2  # 83 tokens, targets early
    rows += [{"prompt": " ".join(["cow"] * 80), "completion": "pig"}]  # truncating it leaves no target
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = prepare(tmp_path, tokenizers["none"], data, overlong="drop")
    assert code == 0, err
    manifest = json.loads((tmp_path / "out" / "train" / "shards.json").read_text())
    assert (manifest["examples"], manifest["dropped"], manifest["truncated"], manifest["overlong"]) == (3, 3, 0, "drop")
    assert "3 examples (3 dropped, 0 truncated" in out
    code, out, err = prepare(tmp_path, tokenizers["none"], data, overlong="truncate")
    assert code == 0, err
    (tokens, mask, pos), manifest = read_sequences(tmp_path / "out" / "train")
    assert (manifest["examples"], manifest["dropped"], manifest["truncated"]) == (5, 1, 2)
    cut = [e for e in unpack(tokens, mask, pos) if len(e[0]) == SEQ + 1]
    dog = hf.convert_tokens_to_ids("dog")
    assert len(cut) == 2 and all(t[-1] == dog and m[-1] == 1 for t, m in cut)  # its first SEQ + 1 tokens


def test_validation_split_by_fraction_and_by_file(tmp_path, tokenizers):
    data = tiny_chat_jsonl(tmp_path / "chat.jsonl", 50)
    code, _, err = prepare(tmp_path, tokenizers["prefix"], data, validation_fraction=0.1)
    assert code == 0, err
    train = json.loads((tmp_path / "out" / "train" / "shards.json").read_text())
    held = json.loads((tmp_path / "out" / "validation" / "shards.json").read_text())
    assert (train["examples"], held["examples"]) == (45, 5) and held["split"] == "validation"
    assert train["fingerprint"] == held["fingerprint"]
    assert [sft_data.in_validation(i, 0.1) for i in range(20)].count(True) == 2  # every tenth: 9, 19
    other = tiny_chat_jsonl(tmp_path / "held.jsonl", 7, seed=1)
    code, _, err = prepare(tmp_path, tokenizers["prefix"], data, validation=other)
    assert code == 0, err
    held = json.loads((tmp_path / "out" / "validation" / "shards.json").read_text())
    assert json.loads((tmp_path / "out" / "train" / "shards.json").read_text())["examples"] == 50 and held["examples"] == 7


def test_fingerprint_changes_with_the_data_the_settings_and_the_tokenizer(tmp_path, tokenizers):
    data = tiny_chat_jsonl(tmp_path / "chat.jsonl", 10)

    def fingerprint(tokenizer="prefix", **options):
        code, _, err = prepare(tmp_path, tokenizers[tokenizer], data, **options)
        assert code == 0, err
        return json.loads((tmp_path / "out" / "train" / "shards.json").read_text())["fingerprint"]

    base = fingerprint()
    assert fingerprint() == base  # the same inputs and settings
    changed = {fingerprint(loss_on="all"), fingerprint(sequence_length=SEQ + 8), fingerprint(overlong="drop"),
               fingerprint(validation_fraction=0.2), fingerprint("marked")}
    data.write_text(data.read_text().replace("cat", "dog", 1))
    changed.add(fingerprint())
    assert len(changed) == 6 and base not in changed


@pytest.fixture()
def packed(tmp_path_factory, tokenizers):
    root = tmp_path_factory.mktemp("packed")
    code, _, err = prepare(root, tokenizers["prefix"], tiny_chat_jsonl(root / "chat.jsonl", 60), sequence_length=SHORT,
                         sequences_per_shard=7)
    assert code == 0, err
    assert len(json.loads((root / "out" / "train" / "shards.json").read_text())["shards"]) > 2
    return root / "out" / "train"


def test_the_reader_yields_inputs_shifted_targets_and_positions(packed):
    (tokens, mask, pos), _ = read_sequences(packed)
    data = SftSequences(packed, "uint16", SHORT, rank=0, world_size=1, seed=0, vocab_size=64)
    for index in range(len(tokens)):
        sample = data._read(index)
        assert sample["input_ids"].tolist() == tokens[index][:-1].tolist()
        assert sample["position_ids"].tolist() == pos[index][:-1].tolist()
        for j, label in enumerate(sample["labels"].tolist()):
            target = mask[index][j + 1] == 1 and pos[index][j + 1] != 0  # no target across an example's start
            assert label == (tokens[index][j + 1] if target else -100)


def test_the_reader_resumes_exactly_and_ranks_read_disjoint_sequences(packed):
    def loader(rank):
        return build_sft_dataloader(packed, "uint16", SHORT, 2, rank=rank, world_size=2, seed=5, vocab_size=64)

    first = loader(0)
    it = iter(first)
    sequences = first.dataset.windows
    for _ in range(sequences // 4 - 1):  # near the end of epoch 0: the next batches cross into epoch 1
        next(it)
    state = first.state_dict()
    expected = [next(it) for _ in range(4)]
    second = loader(0)
    second.load_state_dict(state)
    it2 = iter(second)
    for want in expected:
        got = next(it2)
        assert set(got) == {"input_ids", "labels", "position_ids"}
        assert all(torch.equal(got[k], want[k]) and got[k].dtype == torch.int64 for k in want)
    (tokens, _, _), _ = read_sequences(packed)
    assert len({tuple(t) for t in tokens}) == len(tokens)  # every packed sequence differs: contents name them
    ranks = [[tuple(b["input_ids"][i].tolist()) for b in [next(x) for _ in range(sequences // 4)] for i in range(2)]
             for x in (iter(loader(0)), iter(loader(1)))]
    seen = ranks[0] + ranks[1]
    assert len(set(seen)) == len(seen) == 4 * (sequences // 4)  # within an epoch no sequence is read twice


def test_the_reader_refuses_data_the_run_cannot_use(packed, tmp_path):
    with pytest.raises(DataError, match=r"sequence_length is 56, but the run trains on 64; prepare the data again with "
                                        r"--sequence-length 64"):
        build_sft_dataloader(packed, "uint16", 64, 1, rank=0, world_size=1, seed=0)
    with pytest.raises(DataError, match=r"token_dtype is uint16, but the run reads uint32 .*set data.token_dtype: uint16"):
        build_sft_dataloader(packed, "uint32", SHORT, 1, rank=0, world_size=1, seed=0)
    with pytest.raises(DataError, match=r"token id \d+, outside the model's vocabulary of 8 ids"):
        build_sft_dataloader(packed, "uint16", SHORT, 1, rank=0, world_size=1, seed=0, vocab_size=8)
    flat = tmp_path / "flat"
    flat.mkdir()
    np.arange(100, dtype=np.uint16).tofile(flat / "shard-00000.bin")
    (flat / "shards.json").write_text(json.dumps({"dtype": "uint16", "shards": [{"file": "shard-00000.bin"}]}))
    with pytest.raises(DataError, match=r"kind is None, not 'sft-packed': these are not packed SFT shards"):
        build_sft_dataloader(flat, "uint16", SHORT, 1, rank=0, world_size=1, seed=0)
    with pytest.raises(DataError, match=r"no shards.json.*manifests found in .*train: point the data at one of them"):
        build_sft_dataloader(packed.parent.parent, "uint16", SHORT, 1, rank=0, world_size=1, seed=0)
    mask = sft_files(packed / "shard-00000.bin")[1]
    mask.write_bytes(mask.read_bytes()[:-1])
    with pytest.raises(DataError, match=r"mask.bin: \d+ bytes, expected \d+ bytes .* the upload is incomplete"):
        build_sft_dataloader(packed, None, SHORT, 1, rank=0, world_size=1, seed=0)


def test_validation_batches_are_fixed_per_rank(packed):
    a = sft_validation_batches(packed, "uint16", SHORT, 2, rank=0, world_size=2, count=4)
    b = sft_validation_batches(packed, "uint16", SHORT, 2, rank=1, world_size=2, count=4)
    assert len(a) == len(b) == 2 and a[0]["labels"].shape == (2, SHORT)
    data = SftSequences(packed, "uint16", SHORT, rank=0, world_size=1, seed=0)
    assert torch.equal(a[1]["input_ids"][0], data._read(4)["input_ids"])  # rank 0: sequences 0, 2, 4, 6
    assert torch.equal(b[0]["input_ids"][1], data._read(3)["input_ids"])  # rank 1: sequences 1, 3, 5, 7


def test_pretraining_refuses_packed_sft_shards(packed):
    from training.components.data import build_dataloader

    with pytest.raises(DataError, match=r"packed SFT shards \(with loss masks\), not flat token shards"):
        build_dataloader(packed, "uint16", SHORT, 1, rank=0, world_size=1, seed=0)


def test_progress_lines_and_too_few_examples(tmp_path, tokenizers, monkeypatch):
    monkeypatch.setattr(sft_data, "PROGRESS_EVERY", 4)
    data = tiny_chat_jsonl(tmp_path / "chat.jsonl", 9)
    code, _, err = prepare(tmp_path, tokenizers["prefix"], data)
    assert code == 0 and err.splitlines() == [f"4 examples read ({data}:4)", f"8 examples read ({data}:8)"]
    code, _, err = prepare(tmp_path, tokenizers["prefix"], data, validation_fraction=0.1)
    assert code == 2 and err.splitlines()[-1] == ("error: validation: no examples to pack (--validation-fraction 0.1 of the "
                                                  "examples is less than one)")
    data.write_text("\n")
    code, _, err = prepare(tmp_path, tokenizers["prefix"], data)
    assert code == 2 and err == "error: train: no examples to pack (the input has none)\n"


def test_no_target_crosses_into_the_next_example(tmp_path, tokenizers):
    """With --loss-on all every token is a target, except the first of each example: it is not
    the continuation of the example before it."""
    code, _, err = prepare(tmp_path, tokenizers["prefix"], tiny_chat_jsonl(tmp_path / "chat.jsonl", 20), loss_on="all")
    assert code == 0, err
    (tokens, mask, pos), _ = read_sequences(tmp_path / "out" / "train")
    data = SftSequences(tmp_path / "out" / "train", None, SEQ, rank=0, world_size=1, seed=0)
    starts = 0
    for index in range(len(tokens)):
        labels = data._read(index)["labels"].numpy()
        inside = (pos[index][1:] != 0) & (mask[index][1:] == 1)
        assert (labels[inside] == tokens[index][1:][inside]).all()
        assert (labels[~inside] == -100).all()
        starts += int(((pos[index][1:] == 0) & (mask[index][1:] == 1)).sum())
    assert starts == 20 - len(tokens) > 0  # every example but the first of each sequence starts after another


def test_a_template_that_rewrites_earlier_turns_is_refused_unless_the_loss_is_on_all(tmp_path):
    """A template that renders a turn differently once later turns follow (as templates that drop
    earlier reasoning do) has no prefix-by-prefix spans: named, with the way out, which works."""
    rewriting = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' and not loop.last %}"
                 "again{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps(tiny_chat_examples(2)[1]) + "\n")  # two exchanges
    code, _, err = prepare(tmp_path, tiny_chat_tokenizer(tmp_path / "tok", template=rewriting), data)
    assert code == 2 and err.startswith(f"error: {data}:1: messages[1]: the chat template of {tmp_path / 'tok'} does "
                                        "not render the conversation prefix by prefix")
    code, _, err = prepare(tmp_path, tmp_path / "tok", data, loss_on="all")
    assert code == 0, err


def test_one_background_worker_resumes_exactly(packed):
    def loader(workers):
        return build_sft_dataloader(packed, "uint16", SHORT, 2, rank=1, world_size=2, seed=3, num_workers=workers)

    reference = [b for _, b in zip(range(6), loader(0))]
    first = loader(1)
    it = iter(first)
    got = [next(it) for _ in range(2)]
    state = first.state_dict()
    second = loader(1)
    second.load_state_dict(state)
    it2 = iter(second)
    got += [next(it2) for _ in range(4)]
    assert all(torch.equal(a[k], b[k]) for a, b in zip(got, reference) for k in a)
