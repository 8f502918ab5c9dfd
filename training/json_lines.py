"""Lines of bytes as the Prepare steps read them (``training.sft_formats``, ``training.corpus_readers``): numbered
from 1, UTF-8 with a byte-order mark allowed on the first, JSON Lines skipping blank lines."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def decoded_lines(lines: Iterable[bytes]) -> Iterator[tuple[int, str | UnicodeDecodeError]]:
    """Each line's number and text, or the UnicodeDecodeError of a line that is not UTF-8."""
    for number, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as bad:
            yield number, bad
            continue
        yield number, text


def json_lines(lines: Iterable[bytes]) -> Iterator[tuple[int, Any]]:
    """Each non-blank line's number and JSON value, or the error of a line that is not UTF-8
    (UnicodeDecodeError) or not JSON (ValueError)."""
    for number, text in decoded_lines(lines):
        if isinstance(text, UnicodeDecodeError):
            yield number, text
            continue
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except ValueError as bad:
            yield number, bad
            continue
        yield number, value
