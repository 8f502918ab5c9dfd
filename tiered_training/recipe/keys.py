"""Which known field an unknown key was meant to be: typos and non-ASCII lookalikes.

A key typed with a Cyrillic ``а`` (U+0430) looks exactly like ``name``; the message
names the character so that the user can see what is wrong. Lookalikes are folded
to ASCII by Unicode compatibility decomposition (full-width letters, accents) and a
table of the Cyrillic and Greek letters that share a Latin letter's shape (after
Unicode's confusables list, https://www.unicode.org/Public/security/latest/confusables.txt).
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Iterable

_LOOKALIKES = str.maketrans(
    {
        # Cyrillic
        "а": "a",
        "в": "b",
        "е": "e",
        "к": "k",
        "м": "m",
        "н": "h",
        "о": "o",
        "р": "p",
        "с": "c",
        "т": "t",
        "у": "y",
        "х": "x",
        "ѕ": "s",
        "і": "i",
        "ј": "j",
        "ԁ": "d",
        "һ": "h",
        "ӏ": "l",
        "ԛ": "q",
        "ԝ": "w",
        "ь": "b",
        "г": "r",
        "п": "n",
        "А": "A",
        "В": "B",
        "Е": "E",
        "К": "K",
        "М": "M",
        "Н": "H",
        "О": "O",
        "Р": "P",
        "С": "C",
        "Т": "T",
        "У": "Y",
        "Х": "X",
        "Ѕ": "S",
        "І": "I",
        "Ј": "J",
        # Greek
        "α": "a",
        "ο": "o",
        "ρ": "p",
        "ν": "v",
        "ι": "i",
        "κ": "k",
        "τ": "t",
        "υ": "u",
        "ε": "e",
        "η": "n",
        "Α": "A",
        "Β": "B",
        "Ε": "E",
        "Ζ": "Z",
        "Η": "H",
        "Ι": "I",
        "Κ": "K",
        "Μ": "M",
        "Ν": "N",
        "Ο": "O",
        "Ρ": "P",
        "Τ": "T",
        "Υ": "Y",
        "Χ": "X",
        # punctuation that passes for an underscore or a hyphen
        "‐": "-",
        "‑": "-",
        "‒": "-",
        "–": "-",
        "—": "-",
        "−": "-",
        "＿": "_",
    }
)


def ascii_skeleton(key: str) -> str:
    """``key`` with lookalike letters replaced by the ASCII letters they resemble."""
    folded = unicodedata.normalize("NFKD", key.translate(_LOOKALIKES))
    return "".join(c for c in folded if not unicodedata.combining(c))


def non_ascii(key: str) -> list[str]:
    """The distinct non-ASCII characters of ``key``, each as ``'а' U+0430``."""
    seen: list[str] = []
    for char in key:
        if ord(char) > 127 and char not in seen:
            seen.append(char)
    return [f"{c!r} U+{ord(c):04X}" for c in seen[:4]] + (["..."] if len(seen) > 4 else [])


def closest(key: str, valid: Iterable[str]) -> str | None:
    """The valid field ``key`` was most likely meant to be, or None."""
    valid = list(valid)
    skeleton = ascii_skeleton(key)
    if skeleton in valid:
        return skeleton
    hint = difflib.get_close_matches(skeleton, valid, n=1) or difflib.get_close_matches(key, valid, n=1)
    return hint[0] if hint else None


def lookalike_hint(key: str, valid: Iterable[str]) -> tuple[str, str | None]:
    """The message for an unknown ``key``, and the field it was meant to be (or None)."""
    valid = sorted(valid)
    meant = closest(key, valid)
    chars = non_ascii(key)
    if chars:
        inside = f"contains non-ASCII {', '.join(chars)}"
        guess = f"; did you mean {meant!r}?" if meant else f"; valid fields here: {', '.join(valid)}"
        return f"unknown key {key!r} ({inside}{guess})", meant
    suggestion = f"did you mean {meant!r}? " if meant else ""
    return f"unknown field; {suggestion}valid fields here: {', '.join(valid)}", meant
