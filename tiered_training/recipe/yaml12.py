"""YAML 1.2 core-schema scalars on PyYAML's fast parser, and the YAML 1.1 readings it refuses.

PyYAML resolves plain scalars as YAML 1.1 does: ``1:30`` is 90 (base 60), ``yes``,
``no``, ``on`` and ``off`` are booleans, ``010`` is 8 and ``2024-01-01`` a date. A
recipe is read with the YAML 1.2 core schema instead
(https://yaml.org/spec/1.2.2/#1032-tag-resolution): only ``true``/``false`` are
booleans, only ``null``/``~``/empty are null, integers are decimal, ``0o`` octal or
``0x`` hexadecimal, everything else that is not a float is a string. An integer's digits
may be grouped by thousands with underscores (``50_000_000_000``): the recipe's JSON Schema
takes the same form (:data:`GROUPED`) as a string, which is what a YAML 1.2 parser in an
editor reads it as. No other underscore is a number (``1_0``, ``1_000.5``).

:func:`yaml11_reading` says what YAML 1.1 would have made of a string, so that a
field expecting a number or a boolean can say why ``1:30`` or ``yes`` is refused.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:  # the C loader where libyaml is built in; both have the methods used here
    _Base = yaml.SafeLoader
else:
    _Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
# An unsigned integer with its digits grouped by thousands; the schema's pattern for the same form.
GROUPED = r"^[0-9]{1,3}(_[0-9]{3})+$"
INT = re.compile(rf"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$|{GROUPED}")
FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
# Digits and underscores that are not grouped by thousands: text, with a hint.
MISGROUPED = re.compile(r"^[-+]?[0-9_.]*_[0-9_.]*$")
MERGE = re.compile(r"^(?:<<)$")

# What YAML 1.1 (PyYAML) reads differently: booleans and sexagesimal numbers.
YAML11_BOOLS = dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "on", "On", "ON"), True) | dict.fromkeys(
    ("n", "N", "no", "No", "NO", "off", "Off", "OFF"), False
)
SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")


class Loader(_Base):
    """PyYAML's safe loader with the YAML 1.2 core schema's implicit types."""

    yaml_implicit_resolvers: dict[str | None, list[tuple[str, re.Pattern[str]]]] = {}


for _tag, _pattern, _first in (
    ("bool", BOOL, "tTfF"),
    ("null", NULL, ["~", "n", "N", ""]),
    ("int", INT, "-+0123456789"),
    ("float", FLOAT, "-+.0123456789"),
    ("merge", MERGE, "<"),
):
    Loader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", _pattern, list(_first))


def _scalar(loader: Loader, node: yaml.ScalarNode) -> str:
    return loader.construct_scalar(node)


def _bool(loader: Loader, node: yaml.ScalarNode) -> bool:
    value = _scalar(loader, node)
    if not BOOL.match(value):
        raise ValueError(f"{value!r} is not a YAML 1.2 boolean (true or false)")
    return value.lower() == "true"


def _int(loader: Loader, node: yaml.ScalarNode) -> int:
    value = _scalar(loader, node)
    if not INT.match(value):
        raise ValueError(f"{value!r} is not a YAML 1.2 integer")
    if value.startswith(("0o", "0x")):
        return int(value, 0)
    return int(value.replace("_", ""), 10)


def _float(loader: Loader, node: yaml.ScalarNode) -> float:
    value = _scalar(loader, node)
    if not FLOAT.match(value):
        raise ValueError(f"{value!r} is not a YAML 1.2 number")
    lowered = value.lower()
    if lowered.endswith((".inf", ".nan")):
        return float(lowered.replace(".", ""))
    return float(value)


Loader.add_constructor("tag:yaml.org,2002:bool", _bool)
Loader.add_constructor("tag:yaml.org,2002:int", _int)
Loader.add_constructor("tag:yaml.org,2002:float", _float)


def yaml11_reading(value: Any, *, boolean: bool = True) -> str | None:
    """Why a string that YAML 1.1 would read as a boolean or a number is not one here, or None; ``boolean``:
    the field takes true or false (else the message does not suggest them)."""
    if not isinstance(value, str):
        return None
    if value in YAML11_BOOLS:
        return f"{value!r} is text in YAML 1.2 (YAML 1.1 read it as {str(YAML11_BOOLS[value]).lower()})" + (
            "; write true or false" if boolean else ""
        )
    if SEXAGESIMAL.match(value):
        return (
            f"{value!r} is text in YAML 1.2 (YAML 1.1 read it as {_base60(value):g}, base 60); "
            "write a decimal number, e.g. 1.5 for an hour and a half"
        )
    if MISGROUPED.match(value) and any(c.isdigit() for c in value):
        plain = value.replace("_", "")
        return (
            f"{value!r} is text: an underscore may only group an unsigned integer's digits by thousands, "
            "such as 50_000_000_000" + (f"; write {plain}" if re.fullmatch(r"[-+]?[0-9]+(\.[0-9]*)?", plain) else "")
        )
    return None


# pydantic's error types of a field that takes a number, and of one that takes a boolean.
NUMBER_ERRORS = frozenset({"int_type", "int_parsing", "float_type", "float_parsing"})
BOOL_ERRORS = frozenset({"bool_type", "bool_parsing"})


def quoted_reading(value: Any, kinds: set[str] | frozenset[str]) -> str | None:
    """Why a quoted number (``"2"``) or boolean (``"true"``) is not one, for a field whose errors are ``kinds``."""
    if not isinstance(value, str) or not value:
        return None
    if kinds & NUMBER_ERRORS and (INT.match(value) or FLOAT.match(value)):
        return f"{value!r} is text, being quoted (or tagged !!str); write {value} without quotes"
    if kinds & BOOL_ERRORS and BOOL.match(value):
        return f"{value!r} is text, being quoted (or tagged !!str); write {value.lower()} without quotes"
    return None


def _base60(value: str) -> float:
    sign = -1 if value.startswith("-") else 1
    total = 0.0
    for part in value.lstrip("+-").replace("_", "").split(":"):
        total = total * 60 + float(part)
    return sign * total
