"""Prepare supervised fine-tuning (SFT) data: JSON Lines examples to packed shards with loss masks.

    python -m training.sft_data --tokenizer /path/to/checkpoint --sequence-length 4096 \\
        [--loss-on assistant|all] [--overlong error|drop|truncate] \\
        [--validation-fraction 0.02 | --validation held-out.jsonl] --out prepared/ train.jsonl ...

Each non-empty line of an input file is one example, in one of two forms:

- chat: ``{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]}``,
  rendered with the tokenizer's own chat template (``tokenizer.apply_chat_template``); a
  tokenizer without one is refused for chat data;
- ``{"prompt": "...", "completion": "..."}``: the tokenizer's BOS token (if it has one), the
  prompt's tokens, the completion's tokens, then EOS. Prompt and completion are tokenised
  separately and nothing is put between them (end the prompt with the separator the model needs).

Loss masks (``--loss-on assistant``, the default): the targets are the assistant turns' tokens
(with the template's end-of-turn token) or the completion's tokens and EOS. Where the chat template
marks assistant text with ``{% generation %}``, those spans are the targets (the spans of
``return_assistant_tokens_mask``); otherwise the conversation is rendered prefix by prefix, and
assistant turn ``i`` is the text between the rendering of messages ``[:i]`` with the generation
prompt and that of messages ``[:i+1]`` (a template that does not render a conversation prefix by
prefix is refused). A token that starts inside a span, by the tokenizer's character offsets, is a
target. ``--loss-on all``: every token is a target.

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
line naming the file, the line and the field, and exit status 2. Nothing is downloaded: the
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np

SFT_KIND = "sft-packed"
MANIFEST = "shards.json"
ROLES = ("system", "user", "assistant", "tool")
OPEN_SEQUENCES = 64  # first-fit packing looks at this many open sequences
PROGRESS_EVERY = 10_000  # examples between progress lines
FORMAT_VERSION = "sft-packed/1"
GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")  # as transformers detects it


class BadData(ValueError):
    """Input the preparation cannot use; the message is one line naming file, line and field."""


def sft_files(base: Path) -> tuple[Path, Path, Path]:
    """A shard's three files: tokens (``shard-00000.bin``), mask (``.mask.bin``), positions (``.pos.bin``)."""
    base = Path(base)
    stem = base.name[: -len(".bin")] if base.name.endswith(".bin") else base.name
    return base, base.with_name(f"{stem}.mask.bin"), base.with_name(f"{stem}.pos.bin")


# ---- reading and checking examples -------------------------------------------------------------


@dataclass
class Example:
    where: str  # "file:line"
    messages: list[dict] | None = None
    prompt: str | None = None
    completion: str | None = None


class HashedLines:
    """The lines of one JSONL file with their numbers; the file's SHA-256 once it has been read."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.digest = hashlib.sha256()

    def __iter__(self) -> Iterator[tuple[int, str]]:
        with open(self.path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                self.digest.update(raw)
                try:
                    text = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a byte order mark is allowed
                except UnicodeDecodeError as error:
                    raise BadData(
                        f"{self.path}:{number}: not UTF-8 text ({error.reason} at byte offset {error.start})"
                    ) from None
                yield number, text


def read_examples(lines: HashedLines, *, loss_on: str) -> Iterator[Example]:
    for number, text in lines:
        if not text.strip():
            continue
        where = f"{lines.path}:{number}"
        try:
            data = json.loads(text)
        except ValueError as error:
            raise BadData(f"{where}: not JSON: {error}") from None
        yield parse_example(data, where, loss_on=loss_on)


def parse_example(data, where: str, *, loss_on: str) -> Example:
    forms = 'either {"messages": [{"role": ..., "content": ...}, ...]} or {"prompt": ..., "completion": ...}'
    if not isinstance(data, dict):
        raise BadData(f"{where}: a JSON {type(data).__name__}, expected an object: {forms}")
    if "messages" in data:
        return Example(where, messages=_messages(data["messages"], where, loss_on=loss_on))
    if "prompt" in data or "completion" in data:
        for key in ("prompt", "completion"):
            if not isinstance(data.get(key), str):
                found = "missing" if key not in data else f"a {type(data[key]).__name__}"
                raise BadData(f"{where}: {key}: {found}, expected a string")
        if not data["completion"].strip():
            raise BadData(f"{where}: completion: empty; every example needs text to learn")
        return Example(where, prompt=data["prompt"], completion=data["completion"])
    keys = ", ".join(sorted(map(str, data))) or "none"
    raise BadData(f"{where}: neither form (keys: {keys}); expected {forms}")


def _messages(messages, where: str, *, loss_on: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise BadData(f'{where}: messages: expected a non-empty list of {{"role": ..., "content": ...}}')
    for i, message in enumerate(messages):
        field_ = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadData(f'{where}: {field_}: a {type(message).__name__}, expected {{"role": ..., "content": ...}}')
        role = message.get("role")
        if role not in ROLES:
            found = "missing" if "role" not in message else repr(role)
            raise BadData(f"{where}: {field_}.role: {found} is not a role; valid roles: {', '.join(ROLES)}")
        if not isinstance(message.get("content"), str):
            found = "missing" if "content" not in message else f"a {type(message['content']).__name__}"
            raise BadData(f"{where}: {field_}.content: {found}, expected a string")
        if role == "assistant" and not message["content"].strip():
            raise BadData(f"{where}: {field_}.content: an empty assistant turn; give it text or remove the turn")
    if loss_on == "assistant" and not any(m["role"] == "assistant" for m in messages):
        raise BadData(f"{where}: messages: no assistant turn, so nothing to learn with --loss-on assistant")
    return messages


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
        if example.messages is None:
            return self._pair(example, loss_on)
        if self.template is None:
            raise BadData(
                f"{example.where}: messages: the tokenizer in {self.path} has no chat template; use a "
                "checkpoint whose tokenizer ships one (tokenizer_config.json or chat_template.jinja), "
                "or give the examples as prompt/completion"
            )
        if loss_on == "all":
            ids, _ = self._tokens_with_mask(self._render(example, example.messages, tokenize=False), [])
            return ids, [1] * len(ids)
        ids, mask = self._chat_with_generation(example) if self.marks_generation else self._chat_by_prefix(example)
        if not any(mask):
            raise BadData(f"{example.where}: messages: the chat template of {self.path} rendered no assistant tokens")
        return ids, mask

    def _pair(self, example: Example, loss_on: str) -> tuple[list[int], list[int]]:
        bos = [self.tok.bos_token_id] if self.tok.bos_token_id is not None else []
        prompt = bos + self.tok.encode(example.prompt, add_special_tokens=False)
        completion = self.tok.encode(example.completion, add_special_tokens=False) + [self.eos_token_id]
        if len(completion) == 1:
            raise BadData(f"{example.where}: completion: gives no tokens; every example needs text to learn")
        return prompt + completion, [int(loss_on == "all")] * len(prompt) + [1] * len(completion)

    def _render(self, example: Example, messages: list[dict], **options):
        try:
            return self.tok.apply_chat_template(messages, **options)
        except Exception as error:  # jinja's TemplateError, or the template's own raise_exception
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise BadData(f"{example.where}: messages: the chat template refused the conversation: {first}") from None

    def _chat_with_generation(self, example: Example) -> tuple[list[int], list[int]]:
        """The ``{% generation %}`` spans, as transformers' ``render_jinja_template`` reports them for
        ``return_assistant_tokens_mask``, mapped to tokens by character offsets. (transformers' own
        ``assistant_masks`` marks every token to the end when a span ends in text that no token covers,
        such as a newline a pre-tokenizer drops.)"""
        from transformers.utils.chat_template_utils import render_jinja_template

        messages = example.messages
        assert messages is not None  # encode renders only conversations
        text = self._render(example, messages, tokenize=False)
        try:
            special: dict[str, Any] = self.tok.special_tokens_map  # token names, none a parameter's
            rendered, spans = cast(  # transformers types the result str: with the mask it is (texts, spans)
                "tuple[list[str], list[list[tuple[int, int]]]]",
                render_jinja_template(
                    conversations=[messages],
                    chat_template=self.template,
                    return_assistant_tokens_mask=True,
                    **special,
                ),
            )
        except Exception as error:
            raise BadData(f"{example.where}: messages: the chat template refused the conversation: {error}") from None
        if rendered[0] != text:
            raise BadData(
                f"{example.where}: messages: the chat template renders differently with its {{% generation %}} "
                "markers; use --loss-on all"
            )
        return self._tokens_with_mask(text, spans[0])

    def _chat_by_prefix(self, example: Example) -> tuple[list[int], list[int]]:
        messages = example.messages
        assert messages is not None  # encode renders only conversations
        text = self._render(example, messages, tokenize=False)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            try:
                start = self._render(example, messages[:i], tokenize=False, add_generation_prompt=True)
            except BadData:
                if i:
                    raise
                start = ""  # a conversation that opens with the assistant, and a template that needs a message
            end = self._render(example, messages[: i + 1], tokenize=False)
            if not (text.startswith(start) and text.startswith(end) and len(start) < len(end)):
                raise BadData(
                    f"{example.where}: messages[{i}]: the chat template of {self.path} does not render the "
                    "conversation prefix by prefix, so its assistant tokens cannot be found; use a template "
                    "with {% generation %} markers or --loss-on all"
                )
            spans.append((len(start), len(end)))
        return self._tokens_with_mask(text, spans)

    def _tokens_with_mask(self, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
        """``text`` tokenised as ``apply_chat_template`` does; a token is a target when it starts inside a span."""
        encoded = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [int(any(a <= begin < b for a, b in spans)) for begin, _ in encoded["offset_mapping"]]
        return list(encoded["input_ids"]), mask


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
        self._count = self._max = 0

    def add(self, tokens: list[int], mask: list[int], pos: list[int]) -> None:
        if self._files is None:
            self._files = [open(path, "wb") for path in sft_files(self.out / f"shard-{len(self.shards):05d}.bin")]
        for handle, values, dtype in zip(self._files, (tokens, mask, pos), (self.dtype, np.dtype("uint8"), self.dtype)):
            handle.write(np.asarray(values, dtype=dtype).tobytes())
        self._count += 1
        self._max = max(self._max, max(tokens))
        if self._count == self.sequences_per_shard:
            self.flush()

    def flush(self) -> None:
        if self._files is None:
            return
        for handle in self._files:
            handle.close()
        self.shards.append(
            {"file": f"shard-{len(self.shards):05d}.bin", "sequences": self._count, "max_token": self._max}
        )
        self._files, self._count, self._max = None, 0, 0


class Packer:
    """First-fit packing of examples into sequences of ``width`` tokens (see the module docstring)."""

    def __init__(self, writer: ShardWriter, pad_token_id: int, counts: Counts):
        self.writer, self.pad, self.counts = writer, pad_token_id, counts
        self.width = writer.width
        self.open: list[list[tuple[list[int], list[int]]]] = []  # each: the examples in one sequence
        self.used: list[int] = []

    def add(self, ids: list[int], mask: list[int]) -> None:
        for i, used in enumerate(self.used):  # noqa: B007 (i is the sequence the loop found)
            if used + len(ids) <= self.width:
                break
        else:
            self.open.append([])
            self.used.append(0)
            i = len(self.open) - 1
        self.open[i].append((ids, mask))
        self.used[i] += len(ids)
        if self.used[i] == self.width:
            self._write(i)
        elif len(self.open) > OPEN_SEQUENCES:
            self._write(0)

    def _write(self, i: int) -> None:
        examples, used = self.open.pop(i), self.used.pop(i)
        pad = self.width - used
        tokens = [t for ids, _ in examples for t in ids] + [self.pad] * pad
        mask = [m for _, mask in examples for m in mask] + [0] * pad
        pos = [p for ids, _ in examples for p in range(len(ids))] + list(range(pad))
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

    def close(self, settings: Settings, tokenizer: SftTokenizer, dtype: str, fingerprint: str) -> dict:
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
        }
        (self.out / MANIFEST).write_text(json.dumps(manifest, indent=1))
        return manifest


def in_validation(index: int, fraction: float) -> bool:
    return fraction > 0 and math.floor((index + 1) * fraction) > math.floor(index * fraction)


def prepare(
    inputs: list[Path],
    tokenizer: SftTokenizer,
    out: Path,
    settings: Settings,
    *,
    validation_files: Sequence[Path] = (),
    log=print,
) -> dict[str, dict]:
    """Tokenise, check and pack ``inputs`` into ``out/train`` (and ``out/validation``); returns the manifests.

    Everything is written to ``out/.partial`` first and moved into place only when all of it is
    good: bad data raises BadData and leaves ``out`` as it was."""
    out = Path(out)
    width = settings.sequence_length + 1
    dtype = settings.dtype or token_dtype(tokenizer.vocab_size, settings.sequence_length)
    largest = max(tokenizer.vocab_size - 1, settings.sequence_length)
    if np.iinfo(dtype).max < largest:
        raise BadData(f"--dtype {dtype} cannot hold token ids and positions up to {largest}; use uint32")
    partial = out / ".partial"
    if partial.exists():
        shutil.rmtree(partial)
    splits = {"train": Split("train", partial / "train", settings, tokenizer, dtype)}
    if settings.validation_fraction or validation_files:
        splits["validation"] = Split("validation", partial / "validation", settings, tokenizer, dtype)
    hashed: list[tuple[str, HashedLines]] = []
    try:
        index = 0
        for role, files in (("train", inputs), ("validation", validation_files)):
            for path in files:
                lines = HashedLines(path)
                hashed.append((role, lines))
                for example in read_examples(lines, loss_on=settings.loss_on):
                    ids, mask = tokenizer.encode(example, settings.loss_on)
                    split = (
                        role
                        if role == "validation" or not in_validation(index, settings.validation_fraction)
                        else "validation"
                    )
                    splits[split].add(example, ids, mask, settings)
                    index += 1
                    if index % PROGRESS_EVERY == 0:
                        log(f"{index:,} examples read ({example.where})", file=sys.stderr)
        digest = hashlib.sha256(FORMAT_VERSION.encode())
        digest.update(
            json.dumps(
                {
                    "sequence_length": settings.sequence_length,
                    "loss_on": settings.loss_on,
                    "overlong": settings.overlong,
                    "validation_fraction": settings.validation_fraction,
                    "token_dtype": dtype,
                    "open_sequences": OPEN_SEQUENCES,
                    "width": width,
                },
                sort_keys=True,
            ).encode()
        )
        digest.update(tokenizer.fingerprint_material())
        for role, lines in hashed:
            digest.update(f"\0{role}\0".encode() + lines.digest.digest())
        fingerprint = digest.hexdigest()
        manifests = {name: split.close(settings, tokenizer, dtype, fingerprint) for name, split in splits.items()}
    except BaseException:
        for unfinished in splits.values():
            unfinished.writer.flush()  # closes its files
        shutil.rmtree(partial, ignore_errors=True)
        raise
    for name in ("train", "validation"):
        if (out / name).exists():
            shutil.rmtree(out / name)
        if name in splits:
            (partial / name).rename(out / name)
    partial.rmdir()
    return manifests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.sft_data", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="JSON Lines files of chat or prompt/completion examples")
    parser.add_argument("--tokenizer", required=True, help="local directory of the model's Hugging Face tokenizer")
    parser.add_argument("--sequence-length", required=True, type=int, help="the run's sequence length")
    parser.add_argument("--out", required=True, type=Path, help="writes OUT/train (and OUT/validation)")
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
    split = parser.add_mutually_exclusive_group()
    split.add_argument("--validation-fraction", type=float, default=0.0, help="hold out this fraction of the examples")
    split.add_argument(
        "--validation", type=Path, action="append", default=[], help="a JSONL file of validation examples"
    )
    parser.add_argument("--dtype", choices=["uint16", "uint32"], help="token type (default: uint16 if it fits)")
    parser.add_argument("--sequences-per-shard", type=int, help="default: about 100 million tokens per shard")
    args = parser.parse_args(argv)
    if args.sequence_length < 1:
        parser.error("--sequence-length must be at least 1")
    if not 0 <= args.validation_fraction < 1:
        parser.error("--validation-fraction must be in [0, 1)")
    settings = Settings(
        args.sequence_length,
        args.loss_on,
        args.overlong,
        args.validation_fraction,
        args.dtype,
        args.sequences_per_shard,
    )
    try:
        for path in [*args.inputs, *args.validation]:
            if not path.is_file():
                raise BadData(f"{path}: no such file")
        tokenizer = SftTokenizer(args.tokenizer)
        manifests = prepare(args.inputs, tokenizer, args.out, settings, validation_files=args.validation)
    except BadData as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for name, m in manifests.items():
        print(
            f"{name}: {m['examples']:,} examples ({m['dropped']:,} dropped, {m['truncated']:,} truncated as longer "
            f"than {m['sequence_length']} tokens) in {sum(s['sequences'] for s in m['shards']):,} sequences of "
            f"{m['sequence_length'] + 1} {m['token_dtype']} tokens, {m['padding_tokens']:,} of them padding, "
            f"{m['target_tokens']:,} loss targets, under {args.out / name}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
