"""A regular expression for an integer with its digits grouped by thousands (``50_000_000_000``), within a range.

A YAML 1.2 parser, such as an editor's, reads ``50_000_000_000`` as text; the recipe loader reads it as the
integer. The recipe's JSON Schema takes such text where a number goes, and only when the integer it stands for
is within the field's bounds, so that the editor and the CLI give the same verdict. The grouped form is at least
two groups, the first of one to three digits, each other of three (:data:`~tiered_training.recipe.yaml12.GROUPED`);
leading zeros are allowed (``0_096`` is 96).
"""

from __future__ import annotations

import math

from tiered_training.recipe.yaml12 import GROUPED as ANY

# A first group, and a group of three, with a digit other than 0.
_NONZERO_FIRST = "(?:[0-9]{0,2}[1-9]|[0-9]?[1-9][0-9]|[1-9][0-9]{2})"
_NONZERO_GROUP = "(?:[0-9]{2}[1-9]|[0-9][1-9][0-9]|[1-9][0-9]{2})"
_ZERO_GROUPS = "0{1,3}(?:_000)*"


def integer_bounds(schema: dict[str, float | int]) -> tuple[int, int | None] | None:
    """The least and greatest integers a numeric schema's bounds allow (None: no greatest), or None for none.

    A field without a lower bound is taken from 0: a grouped form has no sign."""
    low, high = 0, None
    if "minimum" in schema:
        low = max(low, math.ceil(schema["minimum"]))
    if "exclusiveMinimum" in schema:
        low = max(low, math.floor(schema["exclusiveMinimum"]) + 1)
    if "maximum" in schema:
        high = math.floor(schema["maximum"])
    if "exclusiveMaximum" in schema:
        bound = math.ceil(schema["exclusiveMaximum"]) - 1
        high = bound if high is None else min(high, bound)
    if high is not None and high < low:
        return None
    return low, high


def grouped_pattern(low: int, high: int | None) -> str:
    """The grouped forms of the integers from ``low`` to ``high`` (None: no greatest), ``low >= 0``."""
    if low <= 0 and high is None:
        return ANY
    if high is not None:
        parts = _bounded(low, high)
    else:  # up to `groups` groups of digits by their value; more, when those before the last `groups` are not all 0
        groups = max(2, -(-len(str(low)) // 3))
        parts = _bounded(low, 10 ** (3 * groups) - 1)
        parts.append(f"(?:{_NONZERO_FIRST}|{_ZERO_GROUPS}_{_NONZERO_GROUP})(?:_[0-9]{{3}})*(?:_[0-9]{{3}}){{{groups}}}")
    return f"^(?:{'|'.join(parts)})$" if parts else ""


def _bounded(low: int, high: int) -> list[str]:
    """By the count of significant digits: the zeros a form may start with, then the digits grouped from the right."""
    parts = [_ZERO_GROUPS[:-1] + "+"] if low <= 0 else []  # 0: zero groups only, two at least
    for digits in range(len(str(max(low, 1))), len(str(high)) + 1):
        ranges = _fixed(max(low, 10 ** (digits - 1)), min(high, 10**digits - 1), digits)
        if not ranges:
            continue
        pad = (3 - digits % 3) % 3  # zeros that fill the first group to three digits
        if digits <= 3:  # two groups at least
            zeros = f"{_ZERO_GROUPS}_{'0' * pad}"
        else:
            zeros = f"(?:{_ZERO_GROUPS}_{'0' * pad}|0{{0,{pad}}})" if pad else f"(?:{_ZERO_GROUPS}_)?"
        parts.append(zeros + f"(?:{'|'.join(_render(classes) for classes in ranges)})")
    return parts


def _fixed(low: int, high: int, width: int) -> list[list[tuple[int, int]]]:
    """Digit ranges, one per position, covering the integers low..high written with ``width`` digits."""
    if low > high:
        return []
    if width == 0:
        return [[]]
    unit = 10 ** (width - 1)
    first, rest_low = divmod(low, unit)
    last, rest_high = divmod(high, unit)
    if first == last:
        return [[(first, first)] + tail for tail in _fixed(rest_low, rest_high, width - 1)]
    out = []
    if rest_low:
        out += [[(first, first)] + tail for tail in _fixed(rest_low, unit - 1, width - 1)]
        first += 1
    if rest_high != unit - 1:
        middle_end = last - 1
    else:
        middle_end = last
    if first <= middle_end:
        out.append([(first, middle_end)] + [(0, 9)] * (width - 1))
    if rest_high != unit - 1:
        out += [[(last, last)] + tail for tail in _fixed(0, rest_high, width - 1)]
    return out


def _render(classes: list[tuple[int, int]]) -> str:
    """Digit ranges as a pattern, with an underscore between groups of three counted from the right."""
    groups: list[list[tuple[int, int]]] = []
    for index, digit in enumerate(classes):
        if index == 0 or (len(classes) - index) % 3 == 0:
            groups.append([])
        groups[-1].append(digit)
    return "_".join(_run(group) for group in groups)


def _run(group: list[tuple[int, int]]) -> str:
    out, index = "", 0
    while index < len(group):
        end = index
        while end + 1 < len(group) and group[end + 1] == group[index]:
            end += 1
        low, high = group[index]
        text = str(low) if low == high else "[0-9]" if (low, high) == (0, 9) else f"[{low}-{high}]"
        count = end - index + 1
        out += text * count if low == high and count < 3 else text + (f"{{{count}}}" if count > 1 else "")
        index = end + 1
    return out
