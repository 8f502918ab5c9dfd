"""Llama 3.1 and Qwen2.5 chat templates: the data step's ids and masks equal transformers' own
(``apply_chat_template`` and, on a ``{% generation %}`` template, its ``assistant_masks``), tool calling
and a conversation that opens with the assistant included; no token before the first assistant turn is
a target."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers")

from chat_families import FAMILIES, conversations, family_tokenizer  # noqa: E402

from training import sft_data  # noqa: E402
from training.sft_formats import to_example  # noqa: E402

CASES = [(family, name) for family in FAMILIES for name in conversations(family)]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """Per family: the plain template (assistant turns found prefix by prefix), the marked one, and
    transformers' tokenizer of the marked one (the oracle)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("families")
    found = {}
    for family in FAMILIES:
        plain = family_tokenizer(root / family / "plain", family, marked=False)
        marked = family_tokenizer(root / family / "marked", family, marked=True)
        found[family] = {
            "plain": sft_data.SftTokenizer(plain),
            "marked": sft_data.SftTokenizer(marked),
            "oracle": AutoTokenizer.from_pretrained(marked, local_files_only=True),
        }
    return found


def oracle(hf, messages, tools):
    out = hf.apply_chat_template(
        messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return list(out["input_ids"]), list(out["assistant_masks"])


@pytest.mark.parametrize("family,name", CASES, ids=[f"{f}-{n}" for f, n in CASES])
@pytest.mark.parametrize("path", ["plain", "marked"])
def test_ids_and_masks_equal_transformers_assistant_masks(tokenizers, family, name, path):
    case = conversations(family)[name]
    tok = tokenizers[family][path]
    assert tok.marks_generation == (path == "marked")
    example = to_example(copy.deepcopy(case["record"]), "messages", "x:1", loss_on="assistant")
    assert example.messages == case["messages"] and example.tools == case.get("tools")
    ids, mask = tok.encode(example, "assistant")
    want_ids, want_mask = oracle(tokenizers[family]["oracle"], case["messages"], case.get("tools"))
    assert ids == want_ids
    assert mask == want_mask
    assert sum(mask) > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_nothing_before_the_first_assistant_turn_is_a_target(tokenizers, family):
    """A conversation that opens with the assistant: the template's BOS, its default system prompt or
    "Cutting Knowledge Date" header and the role header are context; the turn's text is the first target."""
    case = conversations(family)["assistant first"]
    hf = tokenizers[family]["oracle"]
    for path in ("plain", "marked"):
        ids, mask = tokenizers[family][path].encode(
            to_example(case["record"], "messages", "x:1", loss_on="assistant"), "assistant"
        )
        first = mask.index(1)
        before = hf.decode(ids[:first])
        assert before.endswith("assistant" + ("<|end_header_id|>\n\n" if family == "llama3.1" else "\n"))
        assert ("Cutting Knowledge Date" in before) == (family == "llama3.1")
        assert ("You are Qwen" in before) == (family == "qwen2.5")
        assert hf.decode([t for t, m in zip(ids, mask) if m]).startswith("hello there how can help you today")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tools_reach_the_prompt_and_are_no_targets(tokenizers, family):
    case = conversations(family)["tool call"]
    hf = tokenizers[family]["oracle"]
    ids, mask = tokenizers[family]["plain"].encode(
        to_example(case["record"], "messages", "x:1", loss_on="assistant"), "assistant"
    )
    context = hf.decode([t for t, m in zip(ids, mask) if not m])
    assert "the weather in a city" in context  # the tool's description, from the record's tools
    targets = hf.decode([t for t, m in zip(ids, mask) if m])
    assert '"get_weather"' in targets and "Paris" in targets  # the call is the assistant's: learned
    assert "21 degrees" not in targets  # the tool's answer is not


def test_the_header_newline_is_no_target_where_trl_would_train_it(tokenizers):
    """The one convention where trl differs: trl's ``assistant_only_loss`` on a template without
    ``{% generation %}`` markers also trains the newline after ``<|im_start|>assistant``; here (as in
    transformers' ``assistant_masks``) the target starts after it."""
    hf = tokenizers["qwen2.5"]["oracle"]
    case = conversations("qwen2.5")["system and two turns"]
    ids, mask = tokenizers["qwen2.5"]["plain"].encode(
        to_example(case["record"], "messages", "x:1", loss_on="assistant"), "assistant"
    )
    text = hf.apply_chat_template(case["messages"], tokenize=False)
    offsets = [begin for begin, _ in hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]]
    header = "<|im_start|>assistant\n"
    newlines = [offsets.index(at + len(header) - 1) for at in range(len(text)) if text.startswith(header, at)]
    assert len(newlines) == 2  # two assistant turns; the newline is a token of its own
    for i in newlines:
        assert hf.decode([ids[i]]) == "\n" and mask[i] == 0 and mask[i + 1] == 1
    trl = [int(m or i in newlines) for i, m in enumerate(mask)]
    assert sum(trl) - sum(mask) == 2  # trl's mask: one more target a turn
