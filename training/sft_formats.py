"""Fine-tuning examples in the formats teams hold.

Inputs (a path):

- JSON Lines (``.jsonl``, or ``.json`` whose first character is not ``[``), read line by line with the json
  module, and JSON arrays (``.json``), read whole with the json module (the file's records in memory: give
  large inputs as JSON Lines), either gzipped (``.jsonl.gz``, ``.json.gz``): each record exactly as the file
  wrote it, so tool schemas reach the chat template unchanged (``1`` stays ``1``, keys keep their order,
  ``"default": null`` stays). A line that is not UTF-8, not JSON or not an object is a bad example: fatal, or
  with ``on_bad`` (``--on-bad-example skip``) left out and counted, named by file and line;
- Parquet (``.parquet``): ``datasets.load_dataset("parquet", ..., streaming=True)``;
- a directory written by ``Dataset.save_to_disk``: ``datasets.load_from_disk``. (Arrow gives these one type
  per column: tool schemas stored as structs come back with Arrow's types; store them as a JSON string to
  keep them exact.)

Formats (``--format``, the recipe's ``data.format``; ``auto`` decides per file from the first valid record):

- ``messages``: ``{"messages": [{"role": ..., "content": ...}, ...], "tools": [...]}`` as OpenAI and trl
  write them: roles system, user, assistant, tool and Llama's ipython; assistant ``tool_calls`` with empty
  or null content (``arguments`` as an object or as a JSON string, parsed to the object chat templates
  expect); ``tool`` messages with ``tool_call_id``; content as a string or a list of ``{"type": "text",
  "text": ...}`` parts (joined; other part types are refused by name); ``tools`` (a list, or a JSON string)
  goes to the chat template as ``tools=``.
- ``sharegpt``: ``{"conversations": [{"from": "human"|"gpt"|"system"|"tool", "value": ...}], "system": ...,
  "tools": ...}``; ``user``, ``assistant`` and ``observation`` (a tool result) are accepted as well.
- ``alpaca``: ``{"instruction": ..., "input": ..., "output": ..., "system": ...}``: a user turn (the
  instruction, then a blank line and the input when there is one) and an assistant turn; ``history``
  (``[[instruction, output], ...]``) gives the earlier turns, their outputs targets as well.
- ``prompt_completion``: ``{"prompt": "...", "completion": "..."}`` (strings: BOS, prompt, completion, EOS),
  or trl's conversational form with lists of messages: only the completion's assistant turns are targets.
- ``text``: ``{"text": "..."}``, continued pretraining: BOS (if the tokenizer adds one), the text, EOS;
  every token is a target.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tiered_training.contract.raw_data import JSON_SUFFIXES
from training.json_lines import json_lines

FORMATS = ("auto", "messages", "sharegpt", "alpaca", "prompt_completion", "text")
ROLES = ("system", "user", "assistant", "tool", "ipython")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "observation": "tool",
}
FORMS = (
    '{"messages": [...]}, {"conversations": [...]}, {"instruction": ..., "output": ...}, '
    '{"prompt": ..., "completion": ...} or {"text": ...}'
)


class BadData(ValueError):
    """Input the preparation cannot use; the message is one line naming file, line and field.

    ``reason`` is a short key that groups the example with others bad for the same reason."""

    def __init__(self, message: str, reason: str = "other"):
        super().__init__(message)
        self.reason = reason


@dataclass
class Example:
    where: str  # "file:line", "file: record N" or "file: row N"
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    train_from: int = 0  # assistant turns before this message are context, never targets
    prompt: str | None = None
    completion: str | None = None
    text: str | None = None


# ---- reading ------------------------------------------------------------------------------------


class Source:
    """One input: its records with where each came from, and its SHA-256 once read."""

    def __init__(self, path: str | Path, check=None, on_bad=None, form: str = FORMS):
        self.path = Path(path)
        self.digest = hashlib.sha256()
        self.check = check  # kept for callers; records are checked as they are read
        self.on_bad = on_bad  # on_bad(BadData): a line that is not JSON is left out; None: raised
        self.form = form  # the records' forms, named when one is not an object
        if "://" in str(path):
            raise BadData(f"{path}: a URI; the data step reads local paths: copy the data here first", "input")
        if self.path.is_dir():
            if not (self.path / "state.json").is_file():
                splits = self.path / "dataset_dict.json"
                raise BadData(
                    f"{self.path}: a DatasetDict; give one split's directory ({', '.join(_splits(splits))})"
                    if splits.is_file()
                    else f"{self.path}: a directory that Dataset.save_to_disk did not write (no state.json)",
                    "input",
                )
            self.kind = "saved"
        elif not self.path.is_file():
            raise BadData(f"{self.path}: no such file or directory", "input")
        elif self.path.suffix == ".parquet":
            self.kind = "parquet"
        elif self.path.name.endswith(JSON_SUFFIXES):
            self.kind = "array" if _first_character(self.path) == "[" else "jsonl"
        else:
            raise BadData(
                f"{self.path}: {self.path.suffix or 'no suffix'}: not a format the reader knows; give JSON Lines "
                "(.jsonl), a JSON array (.json), either gzipped (.gz), Parquet (.parquet) or a Dataset.save_to_disk "
                "directory",
                "input",
            )

    def __iter__(self) -> Iterator[tuple[str, dict]]:
        if self.kind == "jsonl":
            yield from self._json_lines()
            return
        if self.kind == "array":
            yield from self._json_array()
            return
        import datasets

        datasets.disable_progress_bars()
        quiet = logging.getLogger("datasets")
        level, quiet.level = quiet.level, logging.CRITICAL
        try:
            self._hash_files()
            try:
                if self.kind == "saved":
                    rows = datasets.load_from_disk(str(self.path))
                else:
                    rows = datasets.load_dataset("parquet", data_files=str(self.path), split="train", streaming=True)
                for index, record in enumerate(rows):
                    yield f"{self.path}: record {index}", _without_nulls(record)
            except BadData:
                raise
            except Exception as error:  # Arrow's or datasets' refusal of the file
                first = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise BadData(f"{self.path}: the datasets library cannot read it: {first}", "unreadable") from None
        finally:
            quiet.level = level

    def _bad(self, error: BadData) -> None:
        """A line that is not UTF-8, not JSON or not an object: raised, or passed to ``on_bad`` and left out."""
        if self.on_bad is None:
            raise error
        self.on_bad(error)

    def _hashed(self, lines: Iterable[bytes]) -> Iterator[bytes]:
        for raw in lines:
            self.digest.update(raw)
            yield raw

    def _json_lines(self) -> Iterator[tuple[str, dict]]:
        """JSON Lines read line by line with the json module (one line in memory): each record exactly as
        written (integers stay integers, keys keep their order, nulls stay), each line named by number."""
        with _open(self.path) as handle:
            for number, data in json_lines(self._hashed(handle)):
                where = f"{self.path}:{number}"
                if isinstance(data, UnicodeDecodeError):
                    self._bad(
                        BadData(f"{where}: not UTF-8 text ({data.reason} at byte offset {data.start})", "not UTF-8")
                    )
                    continue
                if isinstance(data, ValueError):
                    self._bad(BadData(f"{where}: not JSON: {data}", "not JSON"))
                    continue
                if not isinstance(data, dict):
                    self._bad(
                        BadData(f"{where}: a JSON {_json_type(data)}, expected an object: {self.form}", "not an object")
                    )
                    continue
                yield where, data

    def _json_array(self) -> Iterator[tuple[str, dict]]:
        """A JSON array read whole with the json module (it holds the file's records in memory: give large
        inputs as JSON Lines), each record exactly as written, named by its index."""
        with _open(self.path) as handle:
            raw = handle.read()
        self.digest.update(raw)
        try:
            records = json.loads(raw.decode("utf-8-sig"))
        except UnicodeDecodeError as bad:
            raise BadData(
                f"{self.path}: not UTF-8 text ({bad.reason} at byte offset {bad.start})", "not UTF-8"
            ) from None
        except ValueError as bad:
            raise BadData(f"{self.path}: not JSON: {bad}", "not JSON") from None
        if not isinstance(records, list):
            raise BadData(f"{self.path}: a JSON {_json_type(records)}, expected an array of records", "not an array")
        for index, data in enumerate(records):
            where = f"{self.path}: record {index}"
            if not isinstance(data, dict):
                self._bad(
                    BadData(f"{where}: a JSON {_json_type(data)}, expected an object: {self.form}", "not an object")
                )
                continue
            yield where, data

    def _hash_files(self) -> None:
        files = sorted(p for p in self.path.rglob("*") if p.is_file()) if self.path.is_dir() else [self.path]
        for file in files:
            self.digest.update(str(file.relative_to(self.path)).encode() + b"\0" if self.path.is_dir() else b"")
            with open(file, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    self.digest.update(block)


def _splits(path: Path) -> list[str]:
    try:
        return [str(name) for name in json.loads(path.read_text()).get("splits", [])]
    except (OSError, ValueError, AttributeError):
        return []


def _open(path: Path) -> BinaryIO | gzip.GzipFile:
    """The file's bytes, decompressed when it is gzipped (``.gz``, as the datasets library reads it)."""
    if path.name.endswith(".gz"):
        return gzip.GzipFile(path, "rb")
    return open(path, "rb")  # noqa: SIM115


def _first_character(path: Path) -> str:
    with _open(path) as handle:
        head = handle.read(4096).decode("utf-8-sig", errors="replace").lstrip()
    return head[:1]


def _json_type(value) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), type(value).__name__
    )


def _without_nulls(value):
    """A record with the nulls that Arrow adds for absent keys taken out (a message's content stays)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None or k == "content"}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


# ---- formats ------------------------------------------------------------------------------------


def checker(fmt: str, *, loss_on: str):
    """A check of records of format ``fmt``; with auto, the format of the first record that has one."""
    chosen = [None if fmt == "auto" else fmt]

    def check(record, where: str) -> None:
        if chosen[0] is None:
            chosen[0] = detect_format(record)
            if chosen[0] is None:
                return
        to_example(record, chosen[0], where, loss_on=loss_on)

    return check


def detect_format(record) -> str | None:
    """The format a record's keys say, or None."""
    if not isinstance(record, dict):
        return None
    if "messages" in record:
        return "messages"
    if "conversations" in record:
        return "sharegpt"
    if "instruction" in record and "output" in record:
        return "alpaca"
    if "prompt" in record or "completion" in record:
        return "prompt_completion"
    if "text" in record:
        return "text"
    return None


def to_example(record, fmt: str, where: str, *, loss_on: str) -> Example:
    """The record as an example of format ``fmt`` (not auto), or BadData naming the field."""
    if not isinstance(record, dict):
        raise BadData(f"{where}: a JSON {_json_type(record)}, expected an object: {FORMS}", "not an object")
    if fmt == "messages":
        if "messages" not in record:
            raise _missing(record, where, "messages", fmt)
        tools = _tools(record.get("tools"), where, "tools")
        return Example(where, messages=_messages(record["messages"], where, loss_on=loss_on), tools=tools)
    if fmt == "sharegpt":
        return _sharegpt(record, where, loss_on=loss_on)
    if fmt == "alpaca":
        return _alpaca(record, where)
    if fmt == "prompt_completion":
        return _prompt_completion(record, where, loss_on=loss_on)
    if fmt == "text":
        if "text" not in record:
            raise _missing(record, where, "text", fmt)
        text = record["text"]
        if not isinstance(text, str):
            raise BadData(f"{where}: text: {_found(record, 'text')}, expected a string", "text: not a string")
        if not text.strip():
            raise BadData(f"{where}: text: empty; every example needs text to learn", "text: empty")
        return Example(where, text=text)
    raise ValueError(f"unknown format {fmt!r}")


def _missing(record: dict, where: str, key: str, fmt: str) -> BadData:
    keys = ", ".join(sorted(map(str, record))) or "none"
    return BadData(
        f"{where}: no {key} (keys: {keys}); the format of this input is {fmt}; give each format its own file",
        f"not {fmt}",
    )


def _found(record: dict, key: str) -> str:
    return "missing" if key not in record else f"a {type(record[key]).__name__}"


def _messages(messages, where: str, *, loss_on: str, field: str = "messages") -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise BadData(
            f'{where}: {field}: expected a non-empty list of {{"role": ..., "content": ...}}', f"{field}: not a list"
        )
    out = []
    for i, message in enumerate(messages):
        name = f"{field}[{i}]"
        if not isinstance(message, dict):
            raise BadData(
                f'{where}: {name}: a {type(message).__name__}, expected {{"role": ..., "content": ...}}',
                "message: not an object",
            )
        role = message.get("role")
        if role == "function":
            raise BadData(
                f"{where}: {name}.role: 'function' is the deprecated form of a tool result, not read here; "
                'write it as {"role": "tool", "tool_call_id": ..., "content": ...}',
                "function_call",
            )
        if role not in ROLES:
            found = "missing" if "role" not in message else repr(role)
            raise BadData(f"{where}: {name}.role: {found} is not a role; valid roles: {', '.join(ROLES)}", "role")
        message = dict(message)
        if message.get("function_call") is not None:  # OpenAI writes "function_call": null beside tool_calls
            raise BadData(
                f"{where}: {name}.function_call: function_call is the deprecated form of tool_calls, not read here; "
                'write it as "tool_calls": [{"type": "function", "function": {"name": ..., "arguments": ...}}] '
                'and its result as a "tool" message',
                "function_call",
            )
        if "weight" in message and message["weight"] is None:  # null: as absent
            del message["weight"]
        if "weight" in message:
            if role != "assistant" or message["weight"] not in (0, 1) or isinstance(message["weight"], bool):
                raise BadData(
                    f"{where}: {name}.weight: {message['weight']!r}; weight is 0 or 1, on an assistant turn only "
                    "(0: the turn is context, not a target)",
                    "weight",
                )
        calls = message.get("tool_calls")
        if calls is not None:
            if role != "assistant":
                raise BadData(f"{where}: {name}.tool_calls: only an assistant turn calls tools", "tool_calls")
            message["tool_calls"] = _tool_calls(calls, where, f"{name}.tool_calls")
            if not message["tool_calls"]:
                del message["tool_calls"]
        content = message.get("content")
        if "tool_calls" in message and (content is None or content == ""):
            message["content"] = ""
        elif isinstance(content, list):
            message["content"] = _text_parts(content, where, f"{name}.content")
        elif not isinstance(content, str):
            found = "missing" if content is None else f"a {type(content).__name__}"  # Arrow reads absent as null
            raise BadData(f"{where}: {name}.content: {found}, expected a string", "content: not a string")
        if role == "assistant" and "tool_calls" not in message and not message["content"].strip():
            raise BadData(
                f"{where}: {name}.content: an empty assistant turn; give it text or remove the turn",
                "empty assistant turn",
            )
        out.append(message)
    if loss_on == "assistant" and not any(m["role"] == "assistant" and m.get("weight", 1) for m in out):
        raise BadData(
            f"{where}: {field}: no assistant turn, so nothing to learn with --loss-on assistant", "no assistant turn"
        )
    return out


def _text_parts(parts: list, where: str, name: str) -> str:
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            what = repr(kind) if kind is not None else f"a {type(part).__name__} without a type"
            raise BadData(
                f"{where}: {name}[{j}].type: {what} parts are not supported; only text parts "
                '({"type": "text", "text": ...})',
                f"content part {kind}",
            )
        if not isinstance(part.get("text"), str):
            raise BadData(f"{where}: {name}[{j}].text: {_found(part, 'text')}, expected a string", "content part text")
        texts.append(part["text"])
    return "".join(texts)


def _tool_calls(calls, where: str, name: str) -> list[dict]:
    if not isinstance(calls, list):
        raise BadData(f"{where}: {name}: a {type(calls).__name__}, expected a list of tool calls", "tool_calls")
    out = []
    for j, call in enumerate(calls):
        if not isinstance(call, dict):
            raise BadData(f"{where}: {name}[{j}]: a {type(call).__name__}, expected an object", "tool_calls")
        call = dict(call)
        function = call.get("function", call)
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadData(f"{where}: {name}[{j}].function.name: missing, expected a string", "tool_calls")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):  # OpenAI's form; chat templates render an object
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as error:
                raise BadData(
                    f"{where}: {name}[{j}].function.arguments: not JSON: {error}", "tool_calls: arguments"
                ) from None
        if not isinstance(arguments, dict):
            raise BadData(
                f"{where}: {name}[{j}].function.arguments: a {_json_type(arguments)}, expected an object",
                "tool_calls: arguments",
            )
        function = {**function, "arguments": arguments}
        out.append({**call, "function": function} if "function" in call else function)
    return out


def _tools(tools, where: str, name: str) -> list[dict] | None:
    if tools is None:
        return None
    if isinstance(tools, str):  # some datasets keep the schemas as a JSON string
        try:
            tools = json.loads(tools) if tools.strip() else []
        except ValueError as error:
            raise BadData(f"{where}: {name}: not JSON: {error}", "tools") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadData(f"{where}: {name}: expected a list of tool schemas (objects)", "tools")
    return tools or None


def _sharegpt(record: dict, where: str, *, loss_on: str) -> Example:
    turns = record.get("conversations")
    if "conversations" not in record:
        raise _missing(record, where, "conversations", "sharegpt")
    if not isinstance(turns, list) or not turns:
        raise BadData(
            f'{where}: conversations: expected a non-empty list of {{"from": ..., "value": ...}}',
            "conversations: not a list",
        )
    messages = []
    system = record.get("system")
    if isinstance(system, str) and system.strip():
        messages.append({"role": "system", "content": system})
    for i, turn in enumerate(turns):
        name = f"conversations[{i}]"
        if not isinstance(turn, dict):
            raise BadData(f'{where}: {name}: a {type(turn).__name__}, expected {{"from": ..., "value": ...}}', "turn")
        speaker = turn.get("from")
        if speaker not in SHAREGPT_ROLES:
            found = "missing" if "from" not in turn else repr(speaker)
            raise BadData(f"{where}: {name}.from: {found} is not a speaker; valid: {', '.join(SHAREGPT_ROLES)}", "from")
        if not isinstance(turn.get("value"), str):
            raise BadData(f"{where}: {name}.value: {_found(turn, 'value')}, expected a string", "value: not a string")
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": turn["value"]})
    messages = _messages(messages, where, loss_on=loss_on, field="conversations")
    return Example(where, messages=messages, tools=_tools(record.get("tools"), where, "tools"))


def _alpaca(record: dict, where: str) -> Example:
    for key in ("instruction", "output"):
        if not isinstance(record.get(key), str):
            raise BadData(f"{where}: {key}: {_found(record, key)}, expected a string", f"{key}: not a string")
    extra = record.get("input") or ""  # absent or null: no input
    if not isinstance(extra, str):
        raise BadData(f"{where}: input: a {type(extra).__name__}, expected a string", "input: not a string")
    if not record["output"].strip():
        raise BadData(f"{where}: output: empty; every example needs text to learn", "output: empty")
    messages = []
    if isinstance(record.get("system"), str) and record["system"].strip():
        messages.append({"role": "system", "content": record["system"]})
    messages += _history(record.get("history"), where)
    user = record["instruction"] + (f"\n\n{extra}" if extra.strip() else "")
    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": record["output"]}]
    return Example(where, messages=messages)


def _history(history, where: str) -> list[dict]:
    """Alpaca's ``history`` (LLaMA-Factory's form): ``[[instruction, output], ...]``, the earlier turns, in order;
    their outputs are targets as the last one is."""
    if history is None:
        return []
    if not isinstance(history, list):
        raise BadData(f"{where}: history: a {_json_type(history)}, expected a list of [instruction, output]", "history")
    turns = []
    for i, pair in enumerate(history):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise BadData(f"{where}: history[{i}]: expected [instruction, output], two strings", "history")
        turns += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    return turns


def _prompt_completion(record: dict, where: str, *, loss_on: str) -> Example:
    prompt, completion = record.get("prompt"), record.get("completion")
    if isinstance(prompt, list) and isinstance(completion, list):  # trl's conversational form
        prompt = _messages(prompt, where, loss_on="all", field="prompt")
        completion = _messages(completion, where, loss_on=loss_on, field="completion")
        tools = _tools(record.get("tools"), where, "tools")
        return Example(where, messages=prompt + completion, tools=tools, train_from=len(prompt))
    for key in ("prompt", "completion"):
        if not isinstance(record.get(key), str):
            raise BadData(
                f"{where}: {key}: {_found(record, key)}, expected a string (or both prompt and completion as "
                "lists of messages)",
                f"{key}: not a string",
            )
    if not record["completion"].strip():
        raise BadData(f"{where}: completion: empty; every example needs text to learn", "completion: empty")
    return Example(where, prompt=record["prompt"], completion=record["completion"])
