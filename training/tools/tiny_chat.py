"""A tiny chat dataset and a word-level tokenizer for it, for tests and the rehearsal.

    python -m training.tools.tiny_chat OUT --sequence-length 32 [--examples 64] [--dtype uint16] \\
        [--loss-on assistant] [--overlong drop]

writes ``OUT/tokenizer`` (a Hugging Face tokenizer with a ChatML-style chat template),
``OUT/chat.jsonl`` (conversations: the user gives words, the assistant says them reversed) and
``OUT/prepared/train`` (packed SFT shards, by ``python -m training.sft_data``). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

CHAT_WORDS = (
    "red green blue black white gray pink brown cat dog fox owl bee ant cow pig "
    "one two three four five six seven eight nine ten up down left right in out"
).split()
CHAT_ROLES = ("system", "user", "assistant", "tool")
CHAT_SPECIALS = ("<unk>", "<pad>", "<eos>", "<|im_start|>", "<|im_end|>")
CHAT_TEXT = ("reverse", "please", "you", "reverse", "words", "and", "then", "again")
# ChatML-style: each turn is <|im_start|>role\ncontent<|im_end|>\n; the generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The same rendering, with the assistant text and its end-of-turn marked for return_assistant_tokens_mask.
CHAT_TEMPLATE_MARKED = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] }}<|im_end|>\n{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# With tools: their names in a first system turn, and an assistant tool call as the tool's name and its words.
CHAT_TEMPLATE_TOOLS = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t['function']['name'] }} {% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m.tool_calls %}"
    "{% for c in m.tool_calls %}{{ c['function']['name'] }} {{ c['function']['arguments']['words'] }}{% endfor %}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "reverse",
            "description": "reverses words",
            "parameters": {"type": "object", "properties": {"words": {"type": "string"}}, "required": ["words"]},
        },
    }
]


def tiny_chat_tokenizer(path: Path, *, template: str | None = CHAT_TEMPLATE) -> Path:
    """A word-level Hugging Face tokenizer for :func:`tiny_chat_jsonl`'s words (under 64 ids, so it fits
    the tiny model's vocabulary), with ``template`` as its chat template (None: no template), saved to ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(dict.fromkeys([*CHAT_ROLES, *CHAT_TEXT, *CHAT_WORDS]))
    vocab = {token: i for i, token in enumerate([*CHAT_SPECIALS, *words])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<eos>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    if template is not None:
        tok.chat_template = template
    tok.save_pretrained(path)
    return Path(path)


def tiny_chat_examples(n: int, *, seed: int = 0) -> list[dict]:
    """``n`` conversations: the user gives 2-8 words, the assistant says them reversed; some with a
    system turn, some with a second exchange."""
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(n):
        messages = [{"role": "system", "content": "you reverse words"}] if i % 3 == 0 else []
        for turn in range(1 + (i % 4 == 1)):
            words = [str(w) for w in rng.choice(CHAT_WORDS, size=int(rng.integers(2, 9)))]
            messages.append(
                {"role": "user", "content": ("please reverse " if turn == 0 else "again ") + " ".join(words)}
            )
            messages.append({"role": "assistant", "content": " ".join(reversed(words))})
        examples.append({"messages": messages})
    return examples


def tiny_tool_examples(n: int, *, seed: int = 0) -> list[dict]:
    """``n`` tool-calling conversations in the OpenAI form: the tools, the user's words, an assistant turn that
    calls ``reverse`` (empty content, ``arguments`` a JSON string), the tool's result, then the answer."""
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(n):
        words = " ".join(str(w) for w in rng.choice(CHAT_WORDS, size=int(rng.integers(1, 4))))
        answer = " ".join(reversed(words.split()))
        function = {"name": "reverse", "arguments": json.dumps({"words": words})}
        call = {"id": f"call{i}", "type": "function", "function": function}
        messages = [
            {"role": "user", "content": "please reverse " + words},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call{i}", "content": answer},
            {"role": "assistant", "content": answer},
        ]
        examples.append({"messages": messages, "tools": TOOLS})
    return examples


def tiny_chat_jsonl(path: Path, n: int, *, seed: int = 0) -> Path:
    """Writes :func:`tiny_chat_examples` as JSON Lines to ``path`` (for ``python -m training.sft_data``)."""
    Path(path).write_text("".join(json.dumps(example) + "\n" for example in tiny_chat_examples(n, seed=seed)))
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.tools.tiny_chat", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--sequence-length", type=int, required=True)
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--dtype", choices=["uint16", "uint32"])
    parser.add_argument("--loss-on", choices=["assistant", "all"], default="assistant")
    parser.add_argument("--overlong", choices=["error", "drop", "truncate"], default="drop")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--raw-tools",
        action="store_true",
        help="write OUT/tokenizer (with tools in its template) and OUT/chat.jsonl of tool-calling examples only",
    )
    args = parser.parse_args(argv)
    if args.raw_tools:
        tiny_chat_tokenizer(args.out / "tokenizer", template=CHAT_TEMPLATE_TOOLS)
        rows = tiny_tool_examples(args.examples, seed=args.seed)
        (args.out / "chat.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        return 0
    from training.sft_data import main as prepare

    tokenizer = tiny_chat_tokenizer(args.out / "tokenizer")
    chat = tiny_chat_jsonl(args.out / "chat.jsonl", args.examples, seed=args.seed)
    return prepare(
        [
            str(chat),
            "--tokenizer",
            str(tokenizer),
            "--out",
            str(args.out / "prepared"),
            "--sequence-length",
            str(args.sequence_length),
            "--loss-on",
            args.loss_on,
            "--overlong",
            args.overlong,
            *(["--dtype", args.dtype] if args.dtype else []),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
