"""Prepare supervised fine-tuning (SFT) data: examples to packed shards with loss masks.

    python -m training.sft_data --tokenizer /path/to/checkpoint --sequence-length 4096 \\
        [--format auto|messages|sharegpt|alpaca|prompt_completion|text] \\
        [--on-bad-example error|skip] [--max-bad-fraction F] \\
        [--loss-on assistant|all] [--overlong error|drop|truncate] \\
        [--validation-fraction 0.02 | --validation held-out.jsonl] --out prepared/ train.jsonl ...

The inputs (JSON Lines, JSON arrays, Parquet files, ``Dataset.save_to_disk`` directories) are
read with the ``datasets`` library, in the formats of :mod:`training.sft_formats`. Chat examples
are rendered with the tokenizer's own chat template (``tokenizer.apply_chat_template``, with the
example's ``tools``); a tokenizer without one is refused for them. A string prompt/completion
example is the tokenizer's BOS token (if it has one), the prompt's tokens, the completion's tokens,
then EOS (tokenised separately, nothing put between them); a text example is the text as the
tokenizer encodes it, then EOS, every token a target.

Loss masks (``--loss-on assistant``, the default): the targets are the assistant turns' tokens
(with the template's end-of-turn token) or the completion's tokens and EOS. Where the chat template
marks assistant text with ``{% generation %}``, those spans are the targets (the spans of
``return_assistant_tokens_mask``); otherwise the conversation is rendered prefix by prefix, and
assistant turn ``i`` is the text between the rendering of messages ``[:i]`` with the generation
prompt and that of messages ``[:i+1]`` (a template that does not render a conversation prefix by
prefix is refused); a first turn that is the assistant's starts where its content does, so nothing
the template puts first (a BOS, a default system prompt) is a target. A token that starts inside a
span, by the tokenizer's character offsets, is a target. In trl's conversational prompt/completion
form only the completion's assistant turns are targets. ``--loss-on all``: every token is a target.

Packing: examples go, in input order, into the first of the last 64 open sequences of
``sequence_length + 1`` tokens with room for them (first fit); a sequence is written once full or
pushed out. The rest of a sequence is padding (the pad token, else EOS) with mask 0, counted as
one more example. An example longer than ``sequence_length + 1`` tokens is an error (exit 2)
unless ``--overlong drop`` (skipped) or ``truncate`` (cut to its first ``sequence_length + 1``
tokens; one left with no target is dropped); both are counted.

Output: ``OUT/train/`` and, with a validation split, ``OUT/validation/``, each with its own
``shards.json`` (format in training/README.md). ``--validation-fraction F`` sends example ``i``
(counting from 0 in input order) to validation when ``floor((i + 1) F) > floor(i F)``: an even
spread of ``round(n F)`` examples. Bad data stops the run before anything is written, with one
line naming the file, the line and the field, and exit status 2; ``--on-bad-example skip`` leaves
bad examples out, prints their counts by reason and the first few, and fails (exit 2) when more
than ``--max-bad-fraction`` of the examples are bad. Nothing is downloaded: the
tokenizer is read from a local directory (``local_files_only``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np

from training.sft_formats import FORMATS, FORMS, BadData, Example, Source, checker, detect_format, to_example

SFT_KIND = "sft-packed"
MANIFEST = "shards.json"
OPEN_SEQUENCES = 64  # first-fit packing looks at this many open sequences
PROGRESS_EVERY = 10_000  # examples between progress lines
FORMAT_VERSION = "sft-packed/1"
GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")  # as transformers detects it


def sft_files(base: Path) -> tuple[Path, Path, Path]:
    """A shard's three files: tokens (``shard-00000.bin``), mask (``.mask.bin``), positions (``.pos.bin``)."""
    base = Path(base)
    stem = base.name[: -len(".bin")] if base.name.endswith(".bin") else base.name
    return base, base.with_name(f"{stem}.mask.bin"), base.with_name(f"{stem}.pos.bin")


# ---- tokenising ---------------------------------------------------------------------------------


class SftTokenizer:
    """A Hugging Face tokenizer from a local directory, with its chat template."""

    def __init__(self, path: str | Path):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise BadData(
                "preparing SFT data needs transformers: install the train extra (pip install 'tiered-training[train]')"
            ) from None

        if not Path(path).is_dir():
            raise BadData(f"{path}: no such directory; --tokenizer is a local directory holding the model's tokenizer")
        try:
            self.tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as error:
            raise BadData(f"{path}: no Hugging Face tokenizer could be loaded ({str(error).splitlines()[0]})") from None
        if self.tok.eos_token_id is None:
            raise BadData(f"{path}: the tokenizer has no eos_token; it ends each prompt/completion example")
        if not getattr(self.tok, "is_fast", False):
            raise BadData(
                f"{path}: a slow tokenizer; the loss masks need a fast one (tokenizer.json) for character offsets"
            )
        self.path = str(path)
        self.vocab_size = len(self.tok)
        self.eos_token_id = self.tok.eos_token_id
        self.pad_token_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        self.template = self.tok.chat_template if isinstance(self.tok.chat_template, str) else None
        self.marks_generation = self.template is not None and GENERATION_BLOCK.search(self.template) is not None

    def fingerprint_material(self) -> bytes:
        """What decides the tokens: the tokenizer's full definition, its chat template and special ids."""
        special = {"eos": self.eos_token_id, "pad": self.pad_token_id, "bos": self.tok.bos_token_id}
        return b"\0".join(
            [
                self.tok.backend_tokenizer.to_str().encode(),
                json.dumps(self.tok.chat_template).encode(),
                json.dumps(special, sort_keys=True).encode(),
            ]
        )

    def encode(self, example: Example, loss_on: str) -> tuple[list[int], list[int]]:
        """The example's token ids and their loss mask (1: a target)."""
        if example.text is not None:
            return self._text(example)
        if example.messages is None:
            return self._pair(example, loss_on)
        if self.template is None:
            raise BadData(
                f"{example.where}: messages: the tokenizer in {self.path} has no chat template; use a "
                "checkpoint whose tokenizer ships one (tokenizer_config.json or chat_template.jinja), "
                "or give the examples as prompt/completion",
                "no chat template",
            )
        if loss_on == "all":
            ids, _ = self._tokens_with_mask(self._render(example, example.messages, tokenize=False), [])
            return ids, [1] * len(ids)
        text, spans = self._spans_marked(example) if self.marks_generation else self._spans_by_prefix(example)
        if example.train_from:
            prompt = self._render(example, _messages_of(example)[: example.train_from], tokenize=False)
            if not text.startswith(prompt):
                raise BadData(
                    f"{example.where}: prompt: the chat template renders the prompt differently once the "
                    "completion follows, so the completion cannot be found; use --loss-on all",
                    "template: prompt",
                )
            spans = [(a, b) for a, b in spans if a >= len(prompt)]
        ids, mask = self._tokens_with_mask(text, spans)
        if not any(mask):
            raise BadData(
                f"{example.where}: messages: the chat template of {self.path} rendered no assistant tokens",
                "template: no assistant tokens",
            )
        return ids, mask

    def _text(self, example: Example) -> tuple[list[int], list[int]]:
        """Continued pretraining: the text as the tokenizer encodes it (with its BOS, if any), then EOS."""
        ids = list(self.tok(example.text)["input_ids"]) + [self.eos_token_id]
        return ids, [1] * len(ids)

    def _pair(self, example: Example, loss_on: str) -> tuple[list[int], list[int]]:
        bos = [self.tok.bos_token_id] if self.tok.bos_token_id is not None else []
        prompt = bos + self.tok.encode(example.prompt, add_special_tokens=False)
        completion = self.tok.encode(example.completion, add_special_tokens=False) + [self.eos_token_id]
        if len(completion) == 1:
            raise BadData(
                f"{example.where}: completion: gives no tokens; every example needs text to learn", "completion: empty"
            )
        return prompt + completion, [int(loss_on == "all")] * len(prompt) + [1] * len(completion)

    def _render(self, example: Example, messages: list[dict], **options):
        if example.tools:
            options["tools"] = example.tools
        try:
            return self.tok.apply_chat_template(messages, **options)
        except Exception as error:  # jinja's TemplateError, or the template's own raise_exception
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise BadData(
                f"{example.where}: messages: the chat template refused the conversation: {first}", "template refused"
            ) from None

    def _spans_marked(self, example: Example) -> tuple[str, list[tuple[int, int]]]:
        """The ``{% generation %}`` spans, as transformers' ``render_jinja_template`` reports them for
        ``return_assistant_tokens_mask``. (transformers' own ``assistant_masks`` marks every token to
        the end when a span ends in text that no token covers, such as a newline a pre-tokenizer drops;
        here a token is a target when it starts inside a span.)"""
        from transformers.utils import chat_template_utils

        render: Any = chat_template_utils.render_jinja_template
        messages = _messages_of(example)
        text = self._render(example, messages, tokenize=False)
        try:
            rendered, spans = render(
                conversations=[messages],
                tools=example.tools,
                chat_template=self.template,
                return_assistant_tokens_mask=True,
                **self.tok.special_tokens_map,
            )
        except Exception as error:
            raise BadData(
                f"{example.where}: messages: the chat template refused the conversation: {error}", "template refused"
            ) from None
        if rendered[0] != text:
            raise BadData(
                f"{example.where}: messages: the chat template renders differently with its {{% generation %}} "
                "markers; use --loss-on all",
                "template: generation markers",
            )
        spans = spans[0]
        turns = [m for m in messages if m["role"] == "assistant"]
        if any(m.get("weight", 1) == 0 for m in turns):
            if len(spans) != len(turns):
                raise BadData(
                    f"{example.where}: messages: weight 0 needs one {{% generation %}} span per assistant turn; the "
                    f"template of {self.path} marks {len(spans)} for {len(turns)} turns",
                    "template: weight",
                )
            spans = [span for span, m in zip(spans, turns) if m.get("weight", 1) != 0]
        return text, spans

    def _spans_by_prefix(self, example: Example) -> tuple[str, list[tuple[int, int]]]:
        """Assistant turn ``i`` is the text between the rendering of ``messages[:i]`` with the generation
        prompt and that of ``messages[:i+1]``. A first turn that is the assistant's starts where its
        content does (found by rendering the turn with a stand-in content): what the template puts
        before it (a BOS, a default system prompt, a header) is never a target."""
        messages = _messages_of(example)
        text = self._render(example, messages, tokenize=False)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant" or message.get("weight", 1) == 0:
                continue
            start = self._turn_start(example) if i == 0 else None
            if start is None:
                start = self._render(example, messages[:i], tokenize=False, add_generation_prompt=True)
            end = self._render(example, messages[: i + 1], tokenize=False)
            if not (text.startswith(start) and text.startswith(end) and len(start) < len(end)):
                raise BadData(
                    f"{example.where}: messages[{i}]: the chat template of {self.path} does not render the "
                    "conversation prefix by prefix, so its assistant tokens cannot be found; use a template "
                    "with {% generation %} markers or --loss-on all",
                    "template: not prefix by prefix",
                )
            spans.append((len(start), len(end)))
        return text, spans

    def _turn_start(self, example: Example) -> str:
        """What the template renders before the content of a conversation's first turn."""
        stand_in = "\x00turn\x00"
        rendered = self._render(example, [{**_messages_of(example)[0], "content": stand_in}], tokenize=False)
        if stand_in not in rendered:
            raise BadData(
                f"{example.where}: messages[0]: the chat template of {self.path} does not render the first turn's "
                "content, so where the turn starts cannot be found; use a template with {% generation %} markers "
                "or --loss-on all",
                "template: not prefix by prefix",
            )
        return rendered[: rendered.index(stand_in)]

    def _tokens_with_mask(self, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
        """``text`` tokenised as ``apply_chat_template`` does; a token is a target when it starts inside a span or
        holds a span's first character (as transformers' ``char_to_token`` of the span's start: a token that
        joins the header's newline to a reply's leading space is a target)."""
        encoded = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [
            int(any(a <= begin < b or begin < a < end for a, b in spans)) for begin, end in encoded["offset_mapping"]
        ]
        return list(encoded["input_ids"]), mask


def _messages_of(example: Example) -> list[dict]:
    if example.messages is None:
        raise ValueError(f"{example.where}: not a conversation")
    return example.messages


# ---- packing and writing ------------------------------------------------------------------------


def token_dtype(vocab_size: int, sequence_length: int) -> str:
    """uint16 when both the token ids and the positions (up to ``sequence_length``) fit, else uint32."""
    return "uint16" if max(vocab_size - 1, sequence_length) < 2**16 else "uint32"


@dataclass
class Counts:
    examples: int = 0
    dropped: int = 0
    truncated: int = 0
    tokens: int = 0
    targets: int = 0
    padding: int = 0


class ShardWriter:
    """Packed sequences to ``shard-XXXXX.bin`` / ``.mask.bin`` / ``.pos.bin`` files in ``out``, each
    sequence appended as it comes (memory stays one sequence)."""

    def __init__(self, out: Path, width: int, dtype: str, sequences_per_shard: int):
        self.out, self.width, self.sequences_per_shard = out, width, sequences_per_shard
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.shards: list[dict] = []
        self._files: list[BinaryIO] | None = None
        self._digests: list[Any] = []
        self._count = self._max = 0

    def add(self, tokens: list[int], mask: list[int], pos: list[int]) -> None:
        if self._files is None:
            self._files = [open(path, "wb") for path in sft_files(self.out / f"shard-{len(self.shards):05d}.bin")]
            self._digests = [hashlib.sha256() for _ in self._files]
        dtypes = (self.dtype, np.dtype(np.uint8), self.dtype)
        for handle, digest, values, dtype in zip(self._files, self._digests, (tokens, mask, pos), dtypes):
            data = np.asarray(values, dtype=dtype).tobytes()
            handle.write(data)
            digest.update(data)
        self._count += 1
        self._max = max(self._max, max(tokens))
        if self._count == self.sequences_per_shard:
            self.flush()

    def flush(self) -> None:
        if self._files is None:
            return
        for handle in self._files:
            handle.close()
        files = sft_files(self.out / f"shard-{len(self.shards):05d}.bin")
        self.shards.append(
            {
                "file": files[0].name,
                "sequences": self._count,
                "max_token": self._max,
                "sha256": {path.name: digest.hexdigest() for path, digest in zip(files, self._digests)},
            }
        )
        self._files, self._count, self._max = None, 0, 0


class Packer:
    """First-fit packing of examples into sequences of ``width`` tokens (see the module docstring); an example
    is packed whole, with its own positions (a DPO pair's: two sequences) or positions from 0."""

    def __init__(self, writer: ShardWriter, pad_token_id: int, counts: Counts):
        self.writer, self.pad, self.counts = writer, pad_token_id, counts
        self.width = writer.width
        self.open: list[list[tuple[list[int], list[int], Sequence[int]]]] = []  # each: the examples in one sequence
        self.used: list[int] = []

    def add(self, ids: list[int], mask: list[int], pos: Sequence[int] | None = None) -> None:
        for i, used in enumerate(self.used):  # noqa: B007 (i is the sequence the loop found)
            if used + len(ids) <= self.width:
                break
        else:
            self.open.append([])
            self.used.append(0)
            i = len(self.open) - 1
        self.open[i].append((ids, mask, range(len(ids)) if pos is None else pos))
        self.used[i] += len(ids)
        if self.used[i] == self.width:
            self._write(i)
        elif len(self.open) > OPEN_SEQUENCES:
            self._write(0)

    def _write(self, i: int) -> None:
        examples, used = self.open.pop(i), self.used.pop(i)
        pad = self.width - used
        tokens = [t for ids, _, _ in examples for t in ids] + [self.pad] * pad
        mask = [m for _, mask, _ in examples for m in mask] + [0] * pad
        pos = [p for _, _, pos in examples for p in pos] + list(range(pad))
        self.counts.padding += pad
        self.writer.add(tokens, mask, pos)

    def close(self) -> None:
        while self.open:
            self._write(0)
        self.writer.flush()


@dataclass
class Settings:
    sequence_length: int
    loss_on: str = "assistant"
    overlong: str = "error"
    validation_fraction: float = 0.0
    dtype: str | None = None
    sequences_per_shard: int | None = None
    format: str = "auto"
    on_bad_example: str = "error"
    max_bad_fraction: float = 0.0

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fixed) -> Settings:
        """The settings of a command's arguments (each by its field's name, the default where there is none)."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        return cls(**{**given, **fixed})


SHOWN_BAD = 5  # skipped examples shown by name


@dataclass
class BadExamples:
    """``--on-bad-example skip``: the examples left out, counted by reason, the first few by name."""

    skipped: Counter = field(default_factory=Counter)
    shown: list[str] = field(default_factory=list)

    def add(self, error: BadData) -> None:
        self.skipped[error.reason] += 1
        if len(self.shown) < SHOWN_BAD:
            self.shown.append(str(error))

    def take(self, error: BadData, settings: Settings) -> None:
        """Count ``error`` with ``--on-bad-example skip``; else (or for a tokenizer with no chat template) raise it."""
        if settings.on_bad_example == "error" or error.reason == "no chat template":
            raise error
        self.add(error)

    def check(self, good: int, max_fraction: float, log) -> None:
        bad = sum(self.skipped.values())
        if not bad:
            return
        reasons = ", ".join(f"{reason}: {count:,}" for reason, count in self.skipped.most_common())
        log(f"skipped {bad:,} of {good + bad:,} examples ({reasons})", file=sys.stderr)
        for line in self.shown:
            log(f"  {line}", file=sys.stderr)
        if bad > max_fraction * (good + bad):
            raise BadData(
                f"{bad:,} of {good + bad:,} examples are bad ({bad / (good + bad):.2%}), more than "
                f"--max-bad-fraction {max_fraction} allows ({reasons})",
                "too many bad examples",
            )


class Split:
    """One output directory (train or validation): its packer, writer and counts."""

    def __init__(self, name: str, out: Path, settings: Settings, tokenizer: SftTokenizer, dtype: str):
        self.name, self.out = name, out
        out.mkdir(parents=True)
        width = settings.sequence_length + 1
        per_shard = settings.sequences_per_shard or max(1, 100_000_000 // width)
        self.counts = Counts()
        self.writer = ShardWriter(out, width, dtype, per_shard)
        self.packer = Packer(self.writer, tokenizer.pad_token_id, self.counts)

    def add(self, example: Example, ids: list[int], mask: list[int], settings: Settings) -> None:
        width = settings.sequence_length + 1
        if len(ids) > width:
            if settings.overlong == "error":
                raise BadData(
                    f"{example.where}: {'messages' if example.messages is not None else 'prompt'}: "
                    f"{len(ids)} tokens, longer than sequence length {settings.sequence_length} allows "
                    f"({width} tokens); pass --overlong drop or --overlong truncate"
                )
            if settings.overlong == "drop" or not any(mask[1:width]):
                self.counts.dropped += 1
                return
            ids, mask = ids[:width], mask[:width]
            self.counts.truncated += 1
        self.counts.examples += 1
        self.counts.tokens += len(ids)
        self.counts.targets += sum(mask[1:])
        self.packer.add(ids, mask)

    def close(self, settings: Settings, tokenizer: SftTokenizer, dtype: str, fingerprint: str, extra: dict) -> dict:
        self.packer.close()
        if not self.writer.shards:
            why = (
                f"all {self.counts.dropped} dropped as longer than sequence length {settings.sequence_length}"
                if self.counts.dropped
                else "the input has none"
                if self.name == "train"
                else f"--validation-fraction {settings.validation_fraction} of the examples is less than one"
            )
            raise BadData(f"{self.name}: no examples to pack ({why})")
        c = self.counts
        manifest = {
            "kind": SFT_KIND,
            "split": self.name,
            "sequence_length": settings.sequence_length,
            "token_dtype": dtype,
            "fingerprint": fingerprint,
            "loss_on": settings.loss_on,
            "overlong": settings.overlong,
            "format": settings.format,
            "on_bad_example": settings.on_bad_example,
            "max_bad_fraction": settings.max_bad_fraction,
            "examples": c.examples,
            "dropped": c.dropped,
            "truncated": c.truncated,
            "tokens": c.tokens,
            "target_tokens": c.targets,
            "padding_tokens": c.padding,
            "tokenizer": tokenizer.path,
            "vocab_size": tokenizer.vocab_size,
            "pad_token_id": tokenizer.pad_token_id,
            "shards": self.writer.shards,
            **extra,
        }
        (self.out / MANIFEST).write_text(json.dumps(manifest, indent=1))
        return manifest


def in_validation(index: int, fraction: float) -> bool:
    return fraction > 0 and math.floor((index + 1) * fraction) > math.floor(index * fraction)


def checked_dtype(settings: Settings, tokenizer: SftTokenizer) -> str:
    """``--dtype``, else the smallest that fits; BadData when the token ids or positions do not fit it."""
    dtype = settings.dtype or token_dtype(tokenizer.vocab_size, settings.sequence_length)
    largest = max(tokenizer.vocab_size - 1, settings.sequence_length)
    if np.iinfo(dtype).max < largest:
        raise BadData(f"--dtype {dtype} cannot hold token ids and positions up to {largest}; use uint32")
    return dtype


S = TypeVar("S", bound=Split)


@contextmanager
def staged_splits(out: Path, validation: bool, new: Callable[[str, Path], S]) -> Iterator[dict[str, S]]:
    """The train (and with ``validation`` the validation) split, ``new(name, directory)``, written under
    ``out/.partial`` and moved to ``out/<name>`` when the block ends; an error removes what was written."""
    partial = out / ".partial"
    if partial.exists():
        shutil.rmtree(partial)
    splits = {"train": new("train", partial / "train")}
    if validation:
        splits["validation"] = new("validation", partial / "validation")
    try:
        yield splits
    except BaseException:
        for open_split in splits.values():
            open_split.writer.flush()  # closes its files
        shutil.rmtree(partial, ignore_errors=True)
        raise
    for name in ("train", "validation"):
        if (out / name).exists():
            shutil.rmtree(out / name)
        if name in splits:
            (partial / name).rename(out / name)
    partial.rmdir()


def fingerprint(header: str, options: dict, tokenizer: SftTokenizer, sources: list[tuple[str, Source]]) -> str:
    """The prepared data's identity: its format, the settings, the tokenizer and every input's bytes."""
    digest = hashlib.sha256(header.encode())
    digest.update(json.dumps(options, sort_keys=True).encode())
    digest.update(tokenizer.fingerprint_material())
    for role, source in sources:
        digest.update(f"\0{role}\0".encode() + source.digest.digest())
    return digest.hexdigest()


def prepare_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """``main``'s parser with the inputs, the tokenizer, the sequence length and the output folder."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("inputs", nargs="+", help="JSON Lines, JSON, Parquet files or Dataset.save_to_disk directories")
    parser.add_argument("--tokenizer", required=True, help="local directory of the model's Hugging Face tokenizer")
    parser.add_argument("--sequence-length", required=True, type=int, help="the run's sequence length")
    parser.add_argument("--out", required=True, type=Path, help="writes OUT/train (and OUT/validation)")
    return parser


def bad_example_arguments(parser: argparse.ArgumentParser, unit: str) -> None:
    """``--on-bad-example`` and ``--max-bad-fraction`` for ``unit`` (examples, pairs), checked by
    :func:`check_bad_fraction`."""
    parser.add_argument(
        "--on-bad-example",
        choices=["error", "skip"],
        default="error",
        help=f"error (default): stop at the first bad one of the {unit}; skip: leave it out and count it",
    )
    parser.add_argument(
        "--max-bad-fraction",
        type=float,
        default=0.0,
        help=f"with --on-bad-example skip: fail when more than this fraction of the {unit} is bad (default 0)",
    )


def check_bad_fraction(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit 2 with the usage and one line unless ``--max-bad-fraction`` is in [0, 1]."""
    if not 0 <= args.max_bad_fraction <= 1:
        parser.error(f"--max-bad-fraction must be in [0, 1], not {args.max_bad_fraction:g}")


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str] | None, unit: str) -> argparse.Namespace:
    """``argv`` parsed after adding the validation split, token type, shard size and bad-example handling of
    ``unit`` (examples, pairs), and checked."""
    bad_example_arguments(parser, unit)
    split = parser.add_mutually_exclusive_group()
    split.add_argument("--validation-fraction", type=float, default=0.0, help=f"hold out this fraction of the {unit}")
    split.add_argument("--validation", action="append", default=[], help=f"an input of validation {unit}")
    parser.add_argument("--dtype", choices=["uint16", "uint32"], help="token type (default: uint16 if it fits)")
    parser.add_argument("--sequences-per-shard", type=int, help="default: about 100 million tokens per shard")
    args = parser.parse_args(argv)
    if args.sequence_length < 1:
        parser.error("--sequence-length must be at least 1")
    if not 0 <= args.validation_fraction < 1:
        parser.error("--validation-fraction must be in [0, 1)")
    check_bad_fraction(parser, args)
    return args


def prepare_inputs(
    prepare_fn: Callable[..., dict[str, dict]], args: argparse.Namespace, settings: Settings
) -> dict[str, dict] | None:
    """``main``'s work: the inputs named (a missing or unknown one before the tokenizer loads), then prepared; the
    manifests, or None after printing the error of bad data."""
    try:
        for path in [*args.inputs, *args.validation]:
            Source(path)
        tokenizer = SftTokenizer(args.tokenizer)
        return prepare_fn(args.inputs, tokenizer, args.out, settings, validation_files=args.validation)
    except BadData as error:
        print(f"error: {error}", file=sys.stderr)
        return None


def prepare(
    inputs: Sequence[str | Path],
    tokenizer: SftTokenizer,
    out: Path,
    settings: Settings,
    *,
    validation_files: Sequence[str | Path] = (),
    log=print,
) -> dict[str, dict]:
    """Tokenise, check and pack ``inputs`` into ``out/train`` (and ``out/validation``); returns the manifests.

    Everything is written to ``out/.partial`` first and moved into place only when all of it is
    good: bad data raises BadData and leaves ``out`` as it was."""
    out = Path(out)
    width = settings.sequence_length + 1
    dtype = checked_dtype(settings, tokenizer)
    sources: list[tuple[str, Source]] = []
    bad = BadExamples()
    formats: dict[str, str] = {}
    validation = bool(settings.validation_fraction or validation_files)
    with staged_splits(out, validation, lambda name, path: Split(name, path, settings, tokenizer, dtype)) as splits:
        index = 0
        for role, files in (("train", inputs), ("validation", validation_files)):
            for path in files:
                source = Source(
                    path,
                    checker(settings.format, loss_on=settings.loss_on),
                    on_bad=bad.add if settings.on_bad_example == "skip" else None,
                )
                sources.append((role, source))
                fmt = settings.format
                for where, record in source:
                    try:
                        if fmt == "auto":
                            found = detect_format(record)
                            if found is None and isinstance(record, dict):
                                keys = ", ".join(sorted(map(str, record))) or "none"
                                raise BadData(f"{where}: no format fits (keys: {keys}); expected {FORMS}", "no format")
                            example = to_example(record, found or "messages", where, loss_on=settings.loss_on)
                            fmt = found or "messages"
                        else:
                            example = to_example(record, fmt, where, loss_on=settings.loss_on)
                        ids, mask = tokenizer.encode(example, settings.loss_on)
                    except BadData as error:
                        bad.take(error, settings)
                        continue
                    formats.setdefault(str(path), fmt)
                    split = (
                        role
                        if role == "validation" or not in_validation(index, settings.validation_fraction)
                        else "validation"
                    )
                    splits[split].add(example, ids, mask, settings)
                    index += 1
                    if index % PROGRESS_EVERY == 0:
                        log(f"{index:,} examples read ({example.where})", file=sys.stderr)
        bad.check(index, settings.max_bad_fraction, log)
        options = {
            "sequence_length": settings.sequence_length,
            "loss_on": settings.loss_on,
            "overlong": settings.overlong,
            "validation_fraction": settings.validation_fraction,
            "format": settings.format,
            "on_bad_example": settings.on_bad_example,
            "max_bad_fraction": settings.max_bad_fraction,
            "token_dtype": dtype,
            "open_sequences": OPEN_SEQUENCES,
            "width": width,
        }
        key = fingerprint(FORMAT_VERSION, options, tokenizer, sources)
        extra = {"formats": formats, "skipped": dict(bad.skipped)}
        manifests = {name: s.close(settings, tokenizer, dtype, key, extra) for name, s in splits.items()}
    return manifests


def main(argv: list[str] | None = None) -> int:
    parser = prepare_parser("python -m training.sft_data", __doc__.split("\n\n")[0])
    parser.add_argument(
        "--loss-on",
        choices=["assistant", "all"],
        default="assistant",
        help="assistant (default): loss on assistant turns / completions only; all: on every token",
    )
    parser.add_argument(
        "--overlong",
        choices=["error", "drop", "truncate"],
        default="error",
        help="an example longer than the sequence length: error (default), drop it, or truncate it",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="the examples' format; auto (default) decides per file from its first valid record",
    )
    args = parse_arguments(parser, argv, "examples")
    settings = Settings.from_args(args)
    manifests = prepare_inputs(prepare, args, settings)
    if manifests is None:
        return 2
    for name, m in manifests.items():
        print(
            f"{name}: {m['examples']:,} examples ({m['dropped']:,} dropped, {m['truncated']:,} truncated as longer "
            f"than {m['sequence_length']} tokens) in {sum(s['sequences'] for s in m['shards']):,} sequences of "
            f"{m['sequence_length'] + 1} {m['token_dtype']} tokens, {m['padding_tokens']:,} of them padding, "
            f"{m['target_tokens']:,} loss targets, under {args.out / name}"
        )
    if settings.format == "auto":
        for path, fmt in manifests["train"]["formats"].items():
            print(f"{path}: read as {fmt} (--format auto, from its first valid record)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
