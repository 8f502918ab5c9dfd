"""Prepare preference (DPO) data: pairs of answers to packed shards, chosen then rejected.

    python -m training.dpo_data --tokenizer /path/to/checkpoint --sequence-length 4096 \\
        [--on-bad-example error|skip] [--max-bad-fraction F] [--overlong error|drop] \\
        [--validation-fraction 0.02 | --validation held-out.jsonl] --out prepared/ pairs.jsonl ...

The inputs are read as SFT data is (``training/sft_formats.py``: JSON Lines, JSON arrays, Parquet,
``Dataset.save_to_disk`` directories, through the ``datasets`` library), in trl's preference formats
(https://huggingface.co/docs/trl/dataset_formats#preference):

- explicit prompt: ``{"prompt": ..., "chosen": ..., "rejected": ...}``, each a string, or each a list of
  messages (``{"role": ..., "content": ...}``, the prompt's turns, then the answers' assistant turns);
- implicit prompt: ``{"chosen": ..., "rejected": ...}`` whose shared beginning is the prompt (trl's
  ``extract_prompt``: the longest common prefix of characters, or of messages);
- ``tools`` (a list, or a JSON string) goes to the chat template as ``tools=``.

Tokens, as trl's ``DPOTrainer`` makes them: a conversation is rendered with the tokenizer's chat template,
the prompt alone with the generation prompt; strings are tokenised with the tokenizer's special tokens, the
EOS text appended to an answer that lacks it. The completion starts where the prompt's tokens and those of
prompt + answer first differ (the shorter for the two answers), and only its tokens are targets.

A pair is two sequences, prompt + chosen then prompt + rejected, each with positions from 0 (the decoder
masks attention per sequence), packed whole, first fit, into rows of ``sequence_length + 1`` tokens with
the SFT shard files (``shards.json`` with ``layout: pairs``). Bad records (a line that is not UTF-8, not
JSON or not an object, a missing or empty answer, identical answers, an empty prompt, a prompt of another
type than its answers) stop the run naming the file, line and reason, or with ``--on-bad-example skip`` are
counted and left out, as for SFT (``--max-bad-fraction``, in [0, 1], the most that may be bad).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.sft_data import (
    FORMAT_VERSION,
    OPEN_SEQUENCES,
    PROGRESS_EVERY,
    BadExamples,
    Settings,
    SftTokenizer,
    Split,
    checked_dtype,
    fingerprint,
    in_validation,
    parse_arguments,
    prepare_inputs,
    prepare_parser,
    staged_splits,
)
from training.sft_formats import BadData, Source, _messages, _tools

LAYOUT = "pairs"
PAIR_FORM = '{"prompt": ..., "chosen": ..., "rejected": ...} or {"chosen": ..., "rejected": ...}'


@dataclass
class Pair:
    where: str
    prompt: str | list[dict]
    chosen: str | list[dict]
    rejected: str | list[dict]
    tools: list[dict] | None = None

    @property
    def conversational(self) -> bool:
        return isinstance(self.prompt, list)


# ---- records ------------------------------------------------------------------------------------


def _answer(record: dict, key: str, where: str) -> str | list[dict]:
    if key not in record:
        keys = ", ".join(sorted(map(str, record))) or "none"
        raise BadData(f"{where}: {key}: missing (keys: {keys}); a preference pair is {PAIR_FORM}", f"{key}: missing")
    value = record[key]
    if isinstance(value, str):
        if not value.strip():
            raise BadData(f"{where}: {key}: an empty answer; both answers need text", f"{key}: empty")
        return value
    if isinstance(value, list):
        return _messages(value, where, loss_on="all", field=key)
    raise BadData(
        f"{where}: {key}: a {type(value).__name__}, expected a string or a list of messages", f"{key}: wrong type"
    )


def _shared_prefix(chosen, rejected):
    """trl's ``extract_prompt``: the longest common prefix, a space before the split going to the answers."""
    index = 0
    for index in range(min(len(chosen), len(rejected))):
        if chosen[index] != rejected[index]:
            if index and chosen[index - 1] == " ":
                index -= 1
            break
    else:
        index = min(len(chosen), len(rejected))
    return chosen[:index], chosen[index:], rejected[index:]


def check_record(record, where: str) -> None:
    to_pair(record, where)


def to_pair(record, where: str) -> Pair:
    """A preference pair from a record, or BadData naming the field and the reason."""
    if not isinstance(record, dict):
        raise BadData(f"{where}: a {type(record).__name__}, expected an object: {PAIR_FORM}", "not an object")
    chosen = _answer(record, "chosen", where)
    rejected = _answer(record, "rejected", where)
    if type(chosen) is not type(rejected):
        raise BadData(
            f"{where}: chosen and rejected: one is a string, the other a list of messages; give both alike",
            "answers of different types",
        )
    if chosen == rejected:
        raise BadData(
            f"{where}: chosen and rejected are identical; a pair needs two different answers", "identical answers"
        )
    prompt = record.get("prompt")
    if prompt is None or (isinstance(prompt, str) and isinstance(chosen, list)):
        # implicit prompt (trl also extracts it when the prompt is a string but the answers are conversations)
        prompt, chosen, rejected = _shared_prefix(chosen, rejected)
        field = "prompt (the answers' shared beginning)"
    else:
        field = "prompt"
        if isinstance(prompt, list):
            if not prompt:
                raise BadData(f"{where}: prompt: an empty list; a pair needs a prompt", "prompt: empty")
            prompt = _messages(prompt, where, loss_on="all", field="prompt")
        elif not isinstance(prompt, str):
            raise BadData(
                f"{where}: prompt: a {type(prompt).__name__}, expected a string or a list of messages",
                "prompt: wrong type",
            )
        if type(prompt) is not type(chosen):
            raise BadData(
                f"{where}: prompt: a {'list of messages' if isinstance(prompt, list) else 'string'}, but the answers "
                f"are {'lists of messages' if isinstance(chosen, list) else 'strings'}; give all three alike",
                "prompt: wrong type",
            )
    if not prompt or (isinstance(prompt, str) and not prompt.strip()):
        raise BadData(f"{where}: {field}: empty; a pair answers a prompt", "prompt: empty")
    if not chosen or not rejected:
        empty = "chosen" if not chosen else "rejected"
        raise BadData(f"{where}: {empty}: nothing after the prompt; each answer needs text", f"{empty}: empty")
    tools = _tools(record.get("tools"), where, "tools")
    return Pair(where, prompt, chosen, rejected, tools)


# ---- tokens -------------------------------------------------------------------------------------


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def encode_pair(tokenizer: SftTokenizer, pair: Pair) -> tuple[list[int], list[int], list[int]]:
    """``(prompt_ids, chosen_ids, rejected_ids)`` as trl's ``DPOTrainer._prepare_dataset`` makes them."""
    tok = tokenizer.tok
    if pair.conversational:
        if tokenizer.template is None:
            raise BadData(
                f"{pair.where}: messages: the tokenizer in {tokenizer.path} has no chat template; give the pairs "
                "as strings, or use a checkpoint whose tokenizer ships one",
                "no chat template",
            )

        def render(messages, **options):
            try:
                tools: Any = pair.tools
                out: Any = tok.apply_chat_template(messages, tokenize=True, return_dict=True, tools=tools, **options)
            except Exception as error:  # jinja's TemplateError, or the template's own raise_exception
                first = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise BadData(
                    f"{pair.where}: the chat template refused the conversation: {first}", "template refused"
                ) from None
            return list(out["input_ids"])

        assert isinstance(pair.chosen, list) and isinstance(pair.rejected, list) and isinstance(pair.prompt, list)
        prompt = render(pair.prompt, add_generation_prompt=True)
        with_chosen = render(pair.prompt + pair.chosen)
        with_rejected = render(pair.prompt + pair.rejected)
    else:
        eos = str(tok.eos_token)
        assert isinstance(pair.chosen, str) and isinstance(pair.rejected, str) and isinstance(pair.prompt, str)
        chosen = pair.chosen if pair.chosen.endswith(eos) else pair.chosen + eos
        rejected = pair.rejected if pair.rejected.endswith(eos) else pair.rejected + eos
        prompt = list(tok(text=pair.prompt)["input_ids"])
        with_chosen = list(tok(text=pair.prompt + chosen)["input_ids"])
        with_rejected = list(tok(text=pair.prompt + rejected)["input_ids"])
    start = min(_common(prompt, with_chosen), _common(prompt, with_rejected))
    chosen_ids, rejected_ids = with_chosen[start:], with_rejected[start:]
    if start == 0:
        raise BadData(f"{pair.where}: prompt: gives no tokens before the answers", "prompt: empty")
    for name, ids in (("chosen", chosen_ids), ("rejected", rejected_ids)):
        if not ids:
            raise BadData(f"{pair.where}: {name}: gives no tokens after the prompt", f"{name}: empty")
    if chosen_ids == rejected_ids:
        raise BadData(
            f"{pair.where}: chosen and rejected give the same tokens; a pair needs two different answers",
            "identical answers",
        )
    return prompt[:start], chosen_ids, rejected_ids


def pair_sequences(prompt: list[int], chosen: list[int], rejected: list[int]) -> tuple[list[int], list[int], list[int]]:
    """One pair's tokens, loss mask and positions: prompt + chosen, then prompt + rejected, positions from 0."""
    ids = prompt + chosen + prompt + rejected
    mask = [0] * len(prompt) + [1] * len(chosen) + [0] * len(prompt) + [1] * len(rejected)
    pos = list(range(len(prompt) + len(chosen))) + list(range(len(prompt) + len(rejected)))
    return ids, mask, pos


# ---- packing ------------------------------------------------------------------------------------


class PairSplit(Split):
    """A split of pairs: each packed whole, first fit, as the SFT packer packs an example."""

    def __init__(self, name: str, out: Path, settings: Settings, tokenizer: SftTokenizer, dtype: str):
        super().__init__(name, out, settings, tokenizer, dtype)
        self.pairs = 0

    def add_pair(self, pair: Pair, ids: list[int], mask: list[int], pos: list[int], settings: Settings) -> None:
        width = settings.sequence_length + 1
        if len(ids) > width:
            if settings.overlong != "drop":
                raise BadData(
                    f"{pair.where}: the pair is {len(ids)} tokens (prompt + chosen, prompt + rejected), longer than "
                    f"sequence length {settings.sequence_length} allows ({width} tokens); raise sequence_length or "
                    "pass --overlong drop",
                    "overlong",
                )
            self.counts.dropped += 1
            return
        self.pairs += 1
        self.counts.examples += 2
        self.counts.tokens += len(ids)
        self.counts.targets += sum(mask)
        self.packer.add(ids, mask, pos)


def prepare(
    inputs: Sequence[str | Path],
    tokenizer: SftTokenizer,
    out: Path,
    settings: Settings,
    *,
    validation_files: Sequence[str | Path] = (),
    log=print,
) -> dict[str, dict]:
    """Tokenise, check and pack the pairs of ``inputs`` into ``out/train`` (and ``out/validation``), written to
    ``out/.partial`` first and moved into place when all is good; returns the manifests."""
    if settings.overlong == "truncate":
        raise BadData("--overlong truncate: a truncated pair would compare cut answers; use error or drop")
    out = Path(out)
    dtype = checked_dtype(settings, tokenizer)
    sources: list[tuple[str, Source]] = []
    bad = BadExamples()
    validation = bool(settings.validation_fraction or validation_files)
    with staged_splits(out, validation, lambda name, path: PairSplit(name, path, settings, tokenizer, dtype)) as splits:
        index = 0
        for role, files in (("train", inputs), ("validation", validation_files)):
            for path in files:
                source = Source(
                    path,
                    check_record,
                    on_bad=bad.add if settings.on_bad_example == "skip" else None,
                    form=PAIR_FORM,
                )
                sources.append((role, source))
                for where, record in source:
                    try:
                        pair = to_pair(record, where)
                        ids, mask, pos = pair_sequences(*encode_pair(tokenizer, pair))
                    except BadData as error:
                        bad.take(error, settings)
                        continue
                    train = role == "train" and not in_validation(index, settings.validation_fraction)
                    splits["train" if train else "validation"].add_pair(pair, ids, mask, pos, settings)
                    index += 1
                    if index % PROGRESS_EVERY == 0:
                        log(f"{index:,} pairs read ({where})", file=sys.stderr)
        bad.check(index, settings.max_bad_fraction, log)
        options = {
            "sequence_length": settings.sequence_length,
            "overlong": settings.overlong,
            "validation_fraction": settings.validation_fraction,
            "on_bad_example": settings.on_bad_example,
            "max_bad_fraction": settings.max_bad_fraction,
            "token_dtype": dtype,
            "open_sequences": OPEN_SEQUENCES,
        }
        key = fingerprint(f"{FORMAT_VERSION}/{LAYOUT}", options, tokenizer, sources)
        manifests = {}
        for name, split in splits.items():
            extra = {"layout": LAYOUT, "pairs": split.pairs, "skipped": dict(bad.skipped)}
            manifests[name] = split.close(settings, tokenizer, dtype, key, extra)
    return manifests


def main(argv: list[str] | None = None) -> int:
    parser = prepare_parser("python -m training.dpo_data", __doc__.split("\n\n")[0])
    parser.add_argument("--overlong", choices=["error", "drop"], default="error", help="a pair longer than a row")
    args = parse_arguments(parser, argv, "pairs")
    settings = Settings.from_args(args, format="preference")
    manifests = prepare_inputs(prepare, args, settings)
    if manifests is None:
        return 2
    for name, m in manifests.items():
        print(
            f"{name}: {m['pairs']:,} pairs ({m['dropped']:,} dropped as longer than {m['sequence_length']} tokens) "
            f"in {sum(s['sequences'] for s in m['shards']):,} rows of {m['sequence_length'] + 1} tokens, "
            f"{m['target_tokens']:,} completion targets, under {args.out / name}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
