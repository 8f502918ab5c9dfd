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


# A message lists every valid name up to this many; beyond, the closest few.
LIST_LIMIT = 10


def closest_few(key: str, valid: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` valid names that look like ``key``, closest first (a looser match than :func:`closest`)."""
    valid = list(valid)
    return difflib.get_close_matches(ascii_skeleton(key), valid, n=n, cutoff=0.4) or difflib.get_close_matches(
        key, valid, n=n, cutoff=0.4
    )


def suggest(key: str, valid: Iterable[str], noun: str, listed_in: str) -> str:
    """What to say about an unknown ``key``: "did you mean ...?", then every valid name when they are few;
    when they are many and none is close, how many there are and ``listed_in``, where to see them."""
    valid = sorted(valid)
    meant = closest(key, valid)
    parts = [f"did you mean {meant!r}?"] if meant else []
    if len(valid) <= LIST_LIMIT:
        parts.append(f"valid {noun}: {', '.join(valid)}")
    elif not meant:
        near = closest_few(key, valid)
        parts.append(
            f"closest: {', '.join(near)} (of {len(valid)} {noun}; {listed_in} lists them)"
            if near
            else f"none of the {len(valid)} {noun} is close ({listed_in} lists them)"
        )
    return " ".join(parts)


def lookalike_hint(key: str, valid: Iterable[str]) -> tuple[str, str | None]:
    """The message for an unknown ``key``, and the field it was meant to be (or None)."""
    valid = sorted(valid)
    meant = closest(key, valid)
    chars = non_ascii(key)
    hint = suggest(key, valid, "fields here", "docs/recipe.md")
    if chars:
        guess = f"did you mean {meant!r}?" if meant else hint
        return f"unknown key {key!r} (contains non-ASCII {', '.join(chars)}; {guess})", meant
    return f"unknown field; {hint}", meant
