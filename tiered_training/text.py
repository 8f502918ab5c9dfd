"""Quoting a user's values in messages: one line, bounded length, unprintable characters escaped."""

from __future__ import annotations

from typing import Any

# A message quotes at most this many characters of a user's value.
QUOTE_LIMIT = 80


def clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` on one line, cut to ``limit`` characters with a note of how much was left out."""
    text = " ".join(str(text).split()) if ("\n" in text or "\r" in text) else str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def escape(text: str) -> str:
    """``text`` with every unprintable character (newline, tab, escape...) written as Python escapes it.

    For names the user chose (a file name may hold a newline): the message stays on one line,
    and the name stays recognisable.
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` cut to ``limit`` characters (a 50 MB string is never quoted whole)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit for str()
        return f"<an integer of more than {limit} digits>"
    return clip(text, limit)
