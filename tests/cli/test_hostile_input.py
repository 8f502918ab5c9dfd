"""Hostile and careless input: every case is exit 2 with one clear line, fast, never a hang or a crash.

Cases run in-process through the CLI (typer's CliRunner) so that the time measured is
the command's, not Python's start-up; a few run as subprocesses where a segfault or a
blocking read would take the test process down with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support import ROOT, recipe_dict, unwrapped, write_yaml
from typer.testing import CliRunner

from tiered_training.cli.app import app
from tiered_training.recipe.errors import RecipeError
from tiered_training.recipe.loader import find_recipes, parse_recipe
from tiered_training.recipe.untrusted import MAX_DEPTH
from tiered_training.text import clip

RUNNER = CliRunner()


def invoke(*args, env=None):
    """The command's result and the CPU seconds it took. CPU time, not wall time: the test machines
    are shared, and a busy neighbour would stretch the wall time of a command that does little. A
    wait (a retry's sleep, a blocked read) shows in the wall-time bound here instead."""
    started, cpu_started = time.perf_counter(), time.process_time()
    result = RUNNER.invoke(app, [str(a) for a in args], prog_name="tiered-training", env=env)
    cpu, wall = time.process_time() - cpu_started, time.perf_counter() - started
    assert wall < 10.0, f"{' '.join(map(str, args))[:200]}: {wall:.1f} s of wall time for {cpu:.2f} s of CPU: it waited"
    return result, cpu


def alias_bomb(levels: int = 9, fan: int = 10) -> str:
    lines = ["a0: &a0 [" + ",".join(["lol"] * fan) + "]"]
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * fan) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def with_text(base: dict, old: str, new: str) -> str:
    text = yaml.safe_dump(base, sort_keys=False)
    assert old in text
    return text.replace(old, new)


# The table of the hostile inputs: (label, file text, words the one line must hold).
CASES = [
    ("YAML 1.1 directive", "%YAML 1.1\n---\nname: x\n", [":1:", "%YAML 1.1 directive", "YAML 1.2 only"]),
    ("nesting 2,000 deep", "name: " + "[" * 2000 + "]" * 2000 + "\n", ["nested more than"]),
    ("nesting 50,000 deep", "name: " + "[" * 50_000 + "]" * 50_000 + "\n", ["nested more than"]),
    ("deep mapping", "".join(" " * i + f"k{i}:\n" for i in range(200)), ["nested more than"]),
    ("400-digit total_tokens", recipe_dict(**{"budget.total_tokens": int("9" * 400)}), ["budget.total_tokens", "less than or equal", "400 characters"]),
    ("price_per_hour .inf", with_text(recipe_dict(**{"compute.price_per_hour": 1.5}), "price_per_hour: 1.5", "price_per_hour: .inf"), ["compute.price_per_hour", "finite"]),
    ("price_per_hour .nan", with_text(recipe_dict(**{"compute.price_per_hour": 1.5}), "price_per_hour: 1.5", "price_per_hour: .nan"), ["compute.price_per_hour", "finite"]),
    ("grad_clip .inf", with_text(recipe_dict(**{"optimizer.grad_clip": 1.5}), "grad_clip: 1.5", "grad_clip: .inf"), ["optimizer.grad_clip", "finite"]),
    ("rope_theta -.inf", recipe_dict(**{"model.catalog": None, "model.dimensions": {"layers": 2, "hidden_size": 64, "attention_heads": 1, "kv_heads": 1, "ffn_size": 64, "vocab_size": 256, "rope_theta": float("-inf")}}), ["rope_theta", "finite"]),
    ("seed 2**64", recipe_dict(**{"data.seed": 2**64}), ["data.seed", "4_294_967_295"]),
    ("name of 130 characters", recipe_dict(name="n" * 130), ["name", "at most 84", "130 characters"]),
    ("name of 256 characters", recipe_dict(name="n" * 256), ["name", "at most 84"]),
    ("name of 85 characters", recipe_dict(name="n" * 85), ["SNS topic display name", "at most 100"]),
    ("instance type of 10,000 characters", recipe_dict(**{"compute.instance_type": "x" * 10_000}), ["compute.instance_type", "10,000 characters"]),
    ("5,000-digit integer", "name: unit-test\nsequence_length: " + "9" * 5000 + "\n", ["YAML", "cannot be read"]),
    ("unhashable key", "? [a, b]\n: 1\nname: x\n", ["YAML syntax"]),
    ("two documents", "name: a\n---\nname: b\n", ["YAML syntax"]),
    ("tags over the limit", recipe_dict(tags={f"k{i}": "v" for i in range(60)}), ["tags", "at most 49"]),
    ("a value of 300 tag characters", recipe_dict(tags={"team": "t" * 300}), ["tags", "256"]),
    # YAML 1.1 readings: YAML 1.2 reads these as text, and the message says what 1.1 would have read.
    ("sexagesimal runtime", with_text(recipe_dict(**{"compute.max_runtime_hours": 2}), "max_runtime_hours: 2", "max_runtime_hours: 1:30"),
     ["compute.max_runtime_hours", "'1:30'", "90, base 60", "decimal number"]),
    ("sexagesimal integer", with_text(recipe_dict(**{"probe.steps": 20}), "steps: 20", "steps: 1:00"), ["probe.steps", "60, base 60"]),
    ("yes as a boolean", with_text(recipe_dict(**{"compute.spot": False}), "spot: false", "spot: yes"), ["compute.spot", "'yes'", "true or false"]),
    ("off as a boolean", with_text(recipe_dict(**{"tracking.tensorboard": True}), "tensorboard: true", "tensorboard: off"), ["tracking.tensorboard", "'off'", "as false"]),
    ("boolean instance count", recipe_dict(**{"compute.instance_count": True}), ["compute.instance_count", "valid integer", "not a boolean"]),
    ("boolean runtime", recipe_dict(**{"compute.max_runtime_hours": False}), ["compute.max_runtime_hours", "valid number", "not a boolean"]),
    ("a fraction in exponent notation", with_text(recipe_dict(), "total_tokens: 10000000000", "total_tokens: 1.00000000005e10"),
     ["budget.total_tokens", "valid integer", "10000000000.5"]),
    # A key spelt with a lookalike letter is one problem that names the letter.
    ("Cyrillic a in a key", yaml.safe_dump(recipe_dict(), sort_keys=False, allow_unicode=True).replace("name:", "n\u0430me:", 1),
     ["unknown key 'n\u0430me'", "non-ASCII '\u0430' U+0430", "did you mean 'name'?"]),
    ("Greek o in a nested key", yaml.safe_dump(recipe_dict(), sort_keys=False, allow_unicode=True).replace("instance_count:", "instance_c\u03bfunt:"),
     ["compute.instance_c\u03bfunt", "U+03BF", "did you mean 'instance_count'?"]),
    ("full-width key", yaml.safe_dump(recipe_dict(), sort_keys=False, allow_unicode=True).replace("sequence_length:", "sequence\uff3flength:"),
     ["U+FF3F", "did you mean 'sequence_length'?"]),
]


@pytest.mark.parametrize("label,text,words", CASES, ids=[c[0] for c in CASES])
def test_hostile_recipe_is_exit_2_with_one_clear_line_within_a_second(tmp_path, label, text, words):
    path = write_yaml(tmp_path / "recipe.yaml", text)
    result, seconds = invoke("validate", path)
    assert result.exit_code == 2, (label, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {path}"), lines[0]
    assert len(lines[0]) < 600, len(lines[0])
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert seconds < 1.0, f"{label}: {seconds:.2f} s"


# -- the families of hostile recipe text: aliases, tags, encodings, numbers --------------------------
#
# Each case is (label, the file's text or bytes, the line, the field, words the line must hold). Every
# command that reads a recipe refuses it the same way: exit 2, one line `error: recipe.yaml:LINE: FIELD: ...`
# that says what would be valid, nothing on stdout, and no file written.

BASE_TEXT = yaml.safe_dump(recipe_dict(), sort_keys=False)  # name on line 1, compute.instance_count on 12


class Absent(str):
    """Words the line must not hold."""


def edited(old: str, new: str, at: str | None = None) -> tuple[str, int]:
    """The base recipe with ``old`` replaced by ``new``, and the line where ``at`` (default: ``new``) is."""
    text = with_text(recipe_dict(), old, new)
    return text, text[: text.index(at or new)].count("\n") + 1


def case(label: str, edit: tuple[str, int], field: str, words: list[str]) -> tuple:
    text, line = edit
    return (label, text, line, field, words)


def count_is(value: str) -> tuple[str, int]:
    return edited("instance_count: 1", f"instance_count: {value}")


ALIAS_CASES = [
    ("self-referencing list", "d: &d [*d]\nname: x\n", 1, "d.0", ["alias *d is inside the collection &d", "recursive", "copy the values"]),
    ("self-referencing mapping", "a: &a {b: {c: *a}}\nname: x\n", 1, "a.b.c", ["alias *a is inside", "recursive"]),
    ("cycle through two anchors", "p: &p {q: &q [1, {r: *p}]}\nname: x\n", 1, "p.q.1.r", ["alias *p is inside the collection &p"]),
    case("merge-key cycle", edited("compute:\n", "compute: &c\n  <<: *c\n", at="<<"), "compute.<<", ["alias *c is inside", "recursive"]),
    case("alias to an undefined anchor", edited("name: unit-test", "name: *nope"), "name", ["*nope refers to no anchor", "define &nope"]),
    case("alias before its anchor", edited("  instance_count: 1", "  instance_count: *n\nx: &n 2", at="  instance_count"),
         "compute.instance_count", ["*n refers to no anchor", "an anchor comes before its aliases"]),
    ("alias bomb (billion laughs)", alias_bomb(), 4, "a3.7", ["aliases expand to more than 10,000 values", "about 100"]),
    case("alias as a key", edited("name: unit-test", "name: &n unit-test\n*n : 3", at="*n :"), "", ["alias *n as a key", "write the key itself"]),
    case("alias as a nested key", edited("  instance_type: ml.p6-b200.48xlarge", "  instance_type: &t ml.p6-b200.48xlarge\n  *t : 2", at="  *t"),
         "compute", ["alias *t as a key"]),
    case("anchor defined twice", edited("name: unit-test", "name: &a unit-test\nx: &a 2", at="x:"), "x",
         ["anchor &a is defined a second time (first on line 1)", "give each anchor its own name"]),
]

TAG_CASES = [
    case("!!python/object", edited("name: unit-test", "name: !!python/object:os.system x"), "name",
         ["YAML tag !!python/object:os.system is not one a recipe reads", "text, numbers, true/false, lists and mappings", "remove the tag"]),
    case("!!python/object/apply", edited("  instance_type: ml.p6-b200.48xlarge", "  instance_type: !!python/object/apply:os.system [ls]"),
         "compute.instance_type", ["!!python/object/apply:os.system", "remove the tag"]),
    case("!!binary", edited("name: unit-test", "name: !!binary aGVsbG8="), "name", ["YAML tag !!binary", "remove the tag"]),
    case("unknown local tag", edited("name: unit-test", "name: !foo unit-test"), "name", ["YAML tag !foo", "remove the tag"]),
    case("local tag on a section", edited("compute:\n", "compute: !foo\n", at="compute:"), "compute", ["YAML tag !foo"]),
    case("global tag of another schema", edited("name: unit-test", "name: !<tag:example.com,2000:x> unit-test"), "name", ["!<tag:example.com,2000:x>"]),
    case("!!set", edited("name: unit-test", "name: unit-test\ntags: !!set {team, ml}", at="tags"), "tags", ["YAML tag !!set", "remove the tag"]),
    case("!!omap", edited("compute:\n", "compute: !!omap\n", at="compute:"), "compute", ["YAML tag !!omap"]),
    case("!!timestamp on a text field", edited("  uri: s3://bucket-for-tests/tokens/", "  uri: !!timestamp 2024-01-01", at="  uri"), "data.uri", ["YAML tag !!timestamp"]),
    case("tag on an alias", edited("name: unit-test", "name: &n unit-test\ndescription: !!str *n", at="description"), "description",
         ["an alias (*n) cannot carry a tag or an anchor (!!str)", "write *n alone"]),
    case("!!int on text", count_is("!!int two"), "compute.instance_count", ["YAML tag !!int", "'two' cannot be read as a YAML 1.2 integer"]),
    case("!!float on a list", count_is("!!float [1]"), "compute.instance_count", ["YAML tag !!float on a list", "remove the tag"]),
    case("!!str on a number", count_is("!!str 2"), "compute.instance_count", ["valid integer", "'2' is text", "write 2"]),
]


def encoded(text: str, encoding: str) -> bytes:
    return text.encode(encoding)


LATIN1 = BASE_TEXT.replace("name: unit-test", "name: caf\xe9").encode("latin-1")
ENCODING_CASES = [
    ("UTF-16 with a byte-order mark", encoded(BASE_TEXT, "utf-16"), 1, "", ["UTF-16 text (its byte-order mark says so)", "save it as UTF-8"]),
    ("UTF-16 without a byte-order mark", encoded(BASE_TEXT, "utf-16-le"), 1, "", ["looks like UTF-16 text without a byte-order mark", "save it as UTF-8"]),
    ("UTF-16 big-endian without a mark", encoded(BASE_TEXT, "utf-16-be"), 1, "", ["looks like UTF-16"]),
    ("UTF-32 with a byte-order mark", encoded(BASE_TEXT, "utf-32"), 1, "", ["UTF-32 text", "save it as UTF-8"]),
    ("Latin-1 byte", LATIN1, 1, "", ["not UTF-8 text: byte 0xE9 at column 10", "Latin-1", "save it as UTF-8"]),
    ("Latin-1 byte in a comment", encoded(BASE_TEXT.replace("instance_count: 1", "instance_count: 1  # d\xe9j\xe0"), "latin-1"), 12, "",
     ["byte 0xE9 at column 25"]),
    ("NUL byte", encoded(BASE_TEXT.replace("name: unit-test", "name: unit\x00test"), "utf-8"), 1, "name",
     ["character U+0000 (NUL) at column 11 is not allowed", "remove it"]),
    ("escape byte", encoded(BASE_TEXT.replace("instance_count: 1", "instance_count: 1\x1b"), "utf-8"), 12, "compute.instance_count", ["U+001B", "remove it"]),
    ("NEL, a line break to YAML 1.1 only", encoded(BASE_TEXT.replace("name: unit-test", "name: unit\x85test"), "utf-8"), 1, "name",
     ["U+0085", "remove it"]),
    ("line separator", encoded(BASE_TEXT.replace("  instance_count: 1", "  instance_count: 1\u2028"), "utf-8"), 12, "compute.instance_count",
     ["U+2028 (LINE SEPARATOR)"]),
    ("lone surrogate escape", encoded(BASE_TEXT.replace("name: unit-test", 'name: "unit\\ud800"'), "utf-8"), 1, "name",
     ["\\ud800 is half of a UTF-16 surrogate pair", "write the character itself"]),
    ("surrogate pair as two escapes", encoded(BASE_TEXT.replace("name: unit-test", 'name: "\\ud83d\\ude00"'), "utf-8"), 1, "name",
     ["\\ud83d is half of a UTF-16 surrogate pair"]),
    ("zero-width space in a key", encoded(BASE_TEXT.replace("instance_count:", "instance\u200b_count:"), "utf-8"), 12,
     "compute.instance\\u200b_count", ["U+200B", "did you mean 'instance_count'?"]),
    ("zero-width space in the name", encoded(BASE_TEXT.replace("name: unit-test", "name: unit\u200b-test"), "utf-8"), 1, "name",
     ["letters, digits and hyphens", "'unit\\u200b-test'"]),
    ("right-to-left override in a key", encoded(BASE_TEXT.replace("name:", "na\u202eme:"), "utf-8"), 1, "na\\u202eme",
     ["U+202E", "did you mean 'name'?"]),
    ("right-to-left override in the name", encoded(BASE_TEXT.replace("name: unit-test", "name: unit\u202e-test"), "utf-8"), 1, "name",
     ["letters, digits and hyphens", "\\u202e"]),
    ("a key of 2,000 characters", encoded(BASE_TEXT.replace("name: unit-test", "name: unit-test\n" + "k" * 2000 + ": 1"), "utf-8"), 2, "",
     ["a key of 2,000 characters", "at most 1,024"]),
    ("a value of 200,000 characters", encoded(BASE_TEXT.replace("name: unit-test", "name: " + "n" * 200_000), "utf-8"), 1, "name",
     ["200,000 characters", "at most 84"]),
    ("tab in the indentation", encoded(BASE_TEXT.replace("  instance_count: 1", "\tinstance_count: 1"), "utf-8"), 12, "",
     ["tab", "indent with spaces"]),
    # Accepted encodings keep the lines right: a mistake on line 12 is reported on line 12.
    ("UTF-8 with a byte-order mark, a mistake on line 12", b"\xef\xbb\xbf" + encoded(BASE_TEXT.replace("instance_count: 1", "instance_count: 0"), "utf-8"),
     12, "compute.instance_count", ["greater than or equal to 1"]),
    ("CRLF lines, a mistake on line 12", encoded(BASE_TEXT.replace("instance_count: 1", "instance_count: 0").replace("\n", "\r\n"), "utf-8"),
     12, "compute.instance_count", ["greater than or equal to 1"]),
]

NUMBER_CASES = [
    case("1.5 for an integer", count_is("1.5"), "compute.instance_count", ["valid integer", "(got 1.5)"]),
    case(".nan for an integer", count_is(".nan"), "compute.instance_count", ["valid integer", "(got .nan)"]),
    case(".inf for an integer", count_is(".inf"), "compute.instance_count", ["valid integer", "(got .inf)"]),
    case("-.inf for an integer", count_is("-.inf"), "compute.instance_count", ["valid integer", "(got -.inf)"]),
    case(".nan for a number", edited("name: unit-test", "name: unit-test\noptimizer: {lr: .nan}", at="optimizer"), "optimizer.lr", ["finite"]),
    case("100_000 above a maximum of 512", count_is("100_000"), "compute.instance_count", ["less than or equal to 512", "(got 100_000)"]),
    case("000_000 below a minimum of 1", count_is("000_000"), "compute.instance_count", ["greater than or equal to 1", "(got 000_000)"]),
    case("lr 1_000", edited("name: unit-test", "name: unit-test\noptimizer: {lr: 1_000}", at="optimizer"), "optimizer.lr",
         ["less than or equal to 1", "(got 1_000)"]),
    case("0x201 above a maximum", count_is("0x201"), "compute.instance_count", ["less than or equal to 512", "(got 0x201 = 513)"]),
    case("0o0 below a minimum", count_is("0o0"), "compute.instance_count", ["greater than or equal to 1", "(got 0o0 = 0)"]),
    case("1e400 for an integer", edited("total_tokens: 10000000000", "total_tokens: 1e400"), "budget.total_tokens",
         ["valid integer", "1e400, beyond a float's range"]),
    case("negative zero", count_is("-0"), "compute.instance_count", ["greater than or equal to 1", "(got -0)"]),
    case("negative zero float", count_is("-0.0"), "compute.instance_count", ["greater than or equal to 1", "(got -0.0)"]),
    case("10**30 for a count", count_is(str(10**30)), "compute.instance_count", ["less than or equal to 512"]),
    case("10**30 tokens", edited("total_tokens: 10000000000", f"total_tokens: {10**30}"), "budget.total_tokens",
         ["less than or equal to 1_000_000_000_000_000"]),
    case("yes for an integer", count_is("yes"), "compute.instance_count", ["valid integer", "'yes' is text in YAML 1.2", Absent("true or false")]),
    case("on for an integer", count_is("on"), "compute.instance_count", ["valid integer", "'on' is text in YAML 1.2", Absent("true or false")]),
    case("true for an integer", count_is("true"), "compute.instance_count", ["valid integer, not a boolean"]),
    case("a number in single quotes", count_is("'2'"), "compute.instance_count", ["valid integer", "'2' is text", "write 2 without quotes"]),
    case("a number in double quotes", count_is('"2"'), "compute.instance_count", ["'2' is text", "write 2 without quotes"]),
    case("a boolean in quotes", edited("  instance_count: 1", "  instance_count: 1\n  spot: 'true'", at="  spot"), "compute.spot",
         ["'true' is text", "write true without quotes"]),
    case("digits grouped by twos", count_is("1_0"), "compute.instance_count", ["underscore may only group", "write 10"]),
]

FAMILIES = {"alias": ALIAS_CASES, "tag": TAG_CASES, "encoding": ENCODING_CASES, "number": NUMBER_CASES}
FAMILY_CASES = [(family, *c) for family, cases in FAMILIES.items() for c in cases]


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("command", [("validate",), ("plan", "--chart", "memory.png"), ("explain",)], ids=["validate", "plan", "explain"])
@pytest.mark.parametrize("family,label,text,line,field,words", FAMILY_CASES, ids=[f"{c[0]}: {c[1]}" for c in FAMILY_CASES])
def test_a_hostile_recipe_family_is_exit_2_one_line_naming_line_and_field_and_writes_nothing(
    tmp_path, monkeypatch, command, family, label, text, line, field, words
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    before = listing(tmp_path)
    result, seconds = invoke(*command, "recipe.yaml")
    assert result.exit_code == 2, (label, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    (message,) = result.stderr.strip().splitlines()
    assert message.startswith(f"error: recipe.yaml:{line}: " + (f"{field}: " if field else "")), message
    for word in words:
        assert (word not in message) if isinstance(word, Absent) else (word in message), (word, message)
    assert len(message) < 400, message
    assert result.stdout == ""
    assert listing(tmp_path) == before  # no .png, no .json, nothing
    assert seconds < 1.0, f"{label}: {seconds:.2f} s"


# Hostile-looking input that is fine: (label, the file's bytes, the field and the value it reads as).
ACCEPTED_CASES = [
    ("UTF-8 with a byte-order mark", b"\xef\xbb\xbf" + BASE_TEXT.encode(), "name", "unit-test"),
    ("CRLF line endings", BASE_TEXT.replace("\n", "\r\n").encode(), "compute.instance_count", 1),
    ("a right-to-left override in a comment", BASE_TEXT.replace("name: unit-test", "name: unit-test  # \u202eevil").encode(), "name", "unit-test"),
    ("a comment of 100,000 characters", (BASE_TEXT + "# " + "x" * 100_000 + "\n").encode(), "name", "unit-test"),
    ("1.0 for an integer", count_is("1.0")[0].encode(), "compute.instance_count", 1),
    ("8.192e3 for an integer", BASE_TEXT.replace("sequence_length: 4096", "sequence_length: 8.192e3").encode(), "sequence_length", 8192),
    ("0x2 for an integer", count_is("0x2")[0].encode(), "compute.instance_count", 2),
    ("0o2 for an integer", count_is("0o2")[0].encode(), "compute.instance_count", 2),
    ("+2 for an integer", count_is("+2")[0].encode(), "compute.instance_count", 2),
    ("!!int 2", count_is("!!int 2")[0].encode(), "compute.instance_count", 2),
    ("grouped digits within the bounds", BASE_TEXT.replace("10000000000", "10_000_000_000").encode(), "budget.total_tokens", 10_000_000_000),
    ("an alias within bounds", BASE_TEXT.replace("name: unit-test", "name: &n unit-test\ndescription: *n").encode(), "description", "unit-test"),
]


@pytest.mark.parametrize("label,data,field,value", ACCEPTED_CASES, ids=[c[0] for c in ACCEPTED_CASES])
def test_hostile_looking_but_valid_input_is_accepted_and_read_right(tmp_path, monkeypatch, label, data, field, value):
    from tiered_training.recipe.loader import load_recipe

    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.yaml").write_bytes(data)
    result, _ = invoke("validate", "recipe.yaml")
    assert result.exit_code == 0, (label, result.output)
    assert result.stdout.splitlines()[0] == "recipe.yaml: ok", result.stdout
    node = load_recipe("recipe.yaml")
    for part in field.split("."):
        node = getattr(node, part)
    assert node == value and type(node) is type(value), (field, node)
    assert listing(tmp_path) == ["recipe.yaml"]


def test_yaml_12_reads_grouped_digits_octal_hex_and_leaves_dates_as_text():
    from tiered_training.recipe.yaml12 import Loader

    text = "a: 50_000\nb: 0o17\nc: 0x1f\nd: 010\ne: 2024-01-01\nf: 1e3\ng: .inf\nh: on\ni: ~\nj: True\n"
    assert yaml.load(text, Loader=Loader) == {
        "a": 50_000, "b": 15, "c": 31, "d": 10, "e": "2024-01-01", "f": 1000.0, "g": float("inf"), "h": "on", "i": None, "j": True,
    }


def test_a_file_name_with_a_newline_is_one_line(tmp_path):
    path = write_yaml(tmp_path / "new\nline.yaml", recipe_dict(**{"compute.instance_count": 0}))
    result, _ = invoke("validate", path)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "new\\nline.yaml:" in lines[0] and "compute.instance_count" in lines[0], lines
    good = write_yaml(tmp_path / "ok\nfine.yaml", recipe_dict(**{"monitoring.alarm_email": "ops@example.com"}))
    result, _ = invoke("validate", good)
    lines = unwrapped(result.stdout).strip().splitlines()  # the verdict, then the quotas a default account lacks
    assert result.exit_code == 0 and lines[0] == f"{tmp_path}/ok\\nfine.yaml: ok", result.output
    assert all(line.removeprefix("account: ").startswith(f"{tmp_path}/ok\\nfine.yaml") for line in lines), lines


def test_the_longest_name_fits_every_derived_name():
    from tiered_training.recipe import names

    longest = "n" * names.longest_name()
    recipe, _ = parse_recipe(yaml.safe_dump(recipe_dict(name=longest)), "long.yaml")
    for derived in names.DERIVED:
        assert len(derived.derive(recipe.name)) <= derived.limit, derived.what
    assert names.longest_name() == 100 - len("tiered-training ")  # the SNS display name binds


def test_a_50_mb_name_is_refused_by_size_without_reading_it(tmp_path):
    path = tmp_path / "huge.yaml"
    with open(path, "w") as handle:
        handle.write("name: ")
        handle.truncate(50_000_000)  # sparse: as big as a 50 MB name, nothing to write
    result, seconds = invoke("plan", path)
    assert result.exit_code == 2
    assert "at most 1,048,576 bytes" in result.stderr and result.stderr.count("\n") == 1
    assert seconds < 1.0


def test_depth_bound_triggers_before_any_recursion():
    text = "a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n"
    with pytest.raises(RecipeError, match="nested more than"):
        parse_recipe(text, "deep.yaml")
    ok = "a: " + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2) + "\n"
    with pytest.raises(RecipeError) as info:  # within the bound: an ordinary schema error
        parse_recipe(ok, "shallow.yaml")
    assert "nested" not in str(info.value)


def test_a_few_aliases_are_fine():
    text = yaml.safe_dump(recipe_dict(), sort_keys=False)
    text = text.replace("data:\n  uri: s3://bucket-for-tests/tokens/", "data:\n  uri: &u s3://bucket-for-tests/tokens/\n  allowed_uris: [*u]")
    recipe, _ = parse_recipe(text, "aliases.yaml")
    assert recipe.data.allowed_uris == ["s3://bucket-for-tests/tokens/"]


def test_merge_key_with_an_override_is_not_a_duplicate():
    text = """\
name: merged
model: {catalog: llama-3.2-1b}
data: {uri: "s3://bucket-for-tests/tokens/"}
sequence_length: 4096
budget: {total_tokens: 10000000000, global_batch_tokens: 1048576}
compute: {instance_type: ml.p6-b200.48xlarge}
monitoring: &mon {stall_minutes: 45, loss_ceiling: 9.0}
checkpointing:
  <<: [{interval_minutes: 20, keep_last: 4}, {keep_last: 9, shutdown_deadline_seconds: 100}]
  keep_last: 5
"""
    recipe, lines = parse_recipe(text, "merge.yaml")
    # Explicit keys override merged ones; of the merged mappings, the first wins.
    assert recipe.checkpointing.keep_last == 5
    assert recipe.checkpointing.interval_minutes == 20
    assert recipe.checkpointing.shutdown_deadline_seconds == 100
    assert lines["checkpointing.keep_last"] == 10
    assert recipe.monitoring.stall_minutes == 45


def test_merged_key_errors_point_at_the_merged_line():
    text = "base: &b {keep_last: 0}\n" + "checkpointing:\n  <<: *b\n"
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "m.yaml")
    problem = next(p for p in info.value.problems if p.field == "checkpointing.keep_last")
    assert problem.line == 1


def test_a_real_duplicate_is_still_reported():
    with pytest.raises(RecipeError, match="duplicate key"):
        parse_recipe("name: a\nname: b\n", "dup.yaml")


def test_messages_quote_at_most_80_characters_of_a_value(tmp_path):
    path = write_yaml(tmp_path / "r.yaml", recipe_dict(**{"data.uri": "s3://" + "b" * 900}))
    result, _ = invoke("validate", path)
    assert result.exit_code == 2
    assert "b" * 81 not in result.stderr and "905 characters" in result.stderr


# -- the recipes directory: synth and the CLI agree -------------------------------------


def recipes_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "recipes"
    folder.mkdir()
    write_yaml(folder / "good.yaml", recipe_dict(name="good"))
    return folder


def special_entries(folder: Path) -> dict[str, str]:
    """Entries that are not readable recipe files, and the words their error holds."""
    (folder / "gone.yaml").symlink_to(folder / "missing-target.yaml")
    os.mkfifo(folder / "pipe.yaml")
    (folder / "dir.yaml").mkdir()
    return {"gone.yaml": "dangling symbolic link", "pipe.yaml": "FIFO", "dir.yaml": "directory"}


def test_fifo_dangling_link_and_directory_are_errors_in_validate_and_synth(tmp_path):
    from tiered_training.constructs.app import RecipeProblems, load_plans

    folder = recipes_dir(tmp_path)
    expected = special_entries(folder)
    (folder / ".hidden.yaml").symlink_to(folder / "editor-lock")  # editors' lock files are skipped
    (folder / "notes.txt").write_text("not a recipe")

    files, errors = find_recipes([folder])
    assert sorted(p.name for p in files) == sorted(["good.yaml", *expected])

    result, seconds = invoke("validate", folder)
    assert result.exit_code == 2 and seconds < 1.0
    for name, words in expected.items():
        line = next(x for x in result.stderr.splitlines() if name in x)
        assert words in line
    assert "good.yaml: ok" in result.stdout
    assert ".hidden" not in result.output and "notes.txt" not in result.output

    with pytest.raises(RecipeProblems) as info:
        load_plans(folder)
    reported = str(info.value)
    for name, words in expected.items():
        assert name in reported and words in reported


def test_unreadable_file_is_an_error_in_validate_and_synth(tmp_path, monkeypatch):
    from tiered_training.constructs.app import RecipeProblems, load_plans
    from tiered_training.recipe import loader

    folder = recipes_dir(tmp_path)
    secret = write_yaml(folder / "secret.yaml", recipe_dict(name="secret"))
    secret.chmod(0)
    if os.geteuid() == 0:  # root reads whatever the mode: refuse the open as the kernel would
        real_open = os.open

        def refuse(path, *args, **kwargs):
            if Path(path).name == "secret.yaml":
                raise PermissionError(13, "Permission denied")
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(loader.os, "open", refuse)
    result, _ = invoke("validate", folder)
    assert result.exit_code == 2 and "secret.yaml" in result.stderr and "Permission denied" in result.stderr
    with pytest.raises(RecipeProblems, match="secret.yaml: cannot read the file: Permission denied"):
        load_plans(folder)


def test_synth_app_exits_2_on_a_bad_entry(tmp_path, monkeypatch, capsys):
    from tiered_training.constructs import app as cdk_app

    folder = recipes_dir(tmp_path)
    (folder / "gone.yaml").symlink_to(folder / "nowhere.yaml")
    real_app = cdk_app.App
    # The app's context as `cdk synth -c recipes=<folder>` gives it.
    monkeypatch.setattr(cdk_app, "App", lambda **kw: real_app(**{**kw, "context": {**kw.get("context", {}), "recipes": str(folder)}, "outdir": str(tmp_path / "out")}))
    monkeypatch.setattr(cdk_app, "build_app", lambda *a, **k: pytest.fail("synth went ahead"))
    assert cdk_app.main() == 2
    err = capsys.readouterr().err
    assert "gone.yaml" in err and "dangling symbolic link" in err


@pytest.mark.parametrize("name", ["", ".", "FOLDER", "memory.jpg", "memory"])
def test_plan_chart_refuses_a_folder_an_empty_name_and_other_suffixes_writing_nothing(tmp_path, monkeypatch, name):
    recipe = write_yaml(tmp_path / "r.yaml", recipe_dict())
    (tmp_path / "FOLDER").mkdir()
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result, _ = invoke("plan", recipe, "--chart", name)
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --chart ") and (".png" in line), line
    if not name:
        assert line == "error: --chart '': an empty name; give a file name ending in .png"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no ./.png, no FOLDER.png


def test_a_recursive_alias_in_one_file_leaves_the_verdict_on_the_others(tmp_path):
    write_yaml(tmp_path / "a-loop.yaml", "d: &d [*d]\nname: x\n")
    write_yaml(tmp_path / "b-good.yaml", recipe_dict())
    result, _ = invoke("validate", tmp_path)
    assert result.exit_code == 2, result.output
    assert f"{tmp_path}/b-good.yaml: ok" in result.output
    assert "recursive" in result.stderr and "Traceback" not in result.output


def test_validate_with_standard_input_closed_is_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "tiered_training.cli.app", "validate", "-"],
        capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=60,
        preexec_fn=lambda: os.close(0),
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == "error: <stdin>: standard input is closed: pipe a recipe into the command"


def test_cdk_app_without_the_cdk_extra_names_it(tmp_path):
    """``python app.py`` (what cdk synth runs) in an interpreter that cannot import aws_cdk: exit 3, one line."""
    blocker = tmp_path / "aws_cdk.py"
    blocker.write_text("raise ImportError('no aws_cdk here')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "app.py"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: cdk synth needs aws-cdk-lib, which the 'cdk' extra installs: pip install 'tiered-training[cdk]' "
        "(or make synth)"
    ]


def test_empty_input_is_exit_2_no_recipes_found(tmp_path):
    for command in ("plan", "validate"):
        result, _ = invoke(command, tmp_path)
        assert result.exit_code == 2
        assert "no recipes found" in result.stderr
    from tiered_training.constructs.app import RecipeProblems, load_plans

    with pytest.raises(RecipeProblems, match="no recipes found"):
        load_plans(tmp_path)


# -- as a user runs it: a separate process, for what would crash or block a process -------


def run_cli(*args, timeout=20):
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "tiered_training.cli.app", *map(str, args)], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    return result, time.perf_counter() - started


def test_subprocess_deep_nesting_bomb_and_fifo_never_crash_or_hang(tmp_path):
    deep = write_yaml(tmp_path / "deep.yaml", "name: " + "[" * 50_000 + "]" * 50_000 + "\n")
    bomb = write_yaml(tmp_path / "bomb.yaml", alias_bomb())
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    result, seconds = run_cli("validate", deep, bomb, fifo)
    assert result.returncode == 2, result.stderr  # not 139 (segfault), not a timeout
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 3, result.stderr
    # Python's start-up and imports are most of this; the in-process checks above bound the work itself.
    assert seconds < 10, seconds


# -- command-line options: checked locally, exit 2, one line, in the command's format ---------

@pytest.fixture(scope="module")
def aws_sandbox(tmp_path_factory):
    """Fake credentials, no profiles, and an endpoint where nothing listens: a command that
    reached AWS would fail there with exit 1, so exit 2 shows that no call was made."""
    from support import free_port

    home = tmp_path_factory.mktemp("home")
    (home / "config").write_text("[profile dev]\nregion = eu-west-1\n")
    env = {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": None, "AWS_PROFILE": None, "AWS_CONFIG_FILE": str(home / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "none"), "AWS_MAX_ATTEMPTS": "1",
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            if value is None:
                mp.delenv(key, raising=False)
            else:
                mp.setenv(key, value)
        yield f"http://127.0.0.1:{free_port()}"


def option_cases(recipe: Path, tmp: Path) -> list[tuple[str, list, list[str]]]:
    a_file = tmp / "not-a-dir.yaml"
    if tmp.is_dir():
        write_yaml(a_file, "x")
    other = "arn:aws:sagemaker:us-east-1:123456789012:pipeline/someone-else/execution/abc123"
    cases = [
        ("region path", ["status", recipe, "--region", "../../etc"], ["--region '../../etc'", "not an AWS region name"]),
        ("region typo", ["logs", recipe, "--region", "eu-wset-1"], ["--region 'eu-wset-1'", "did you mean 'eu-west-1'?"]),
        ("region env", ["stop", recipe], ["AWS_REGION 'mars-1'", "not an AWS region name"]),
        ("unknown profile", ["status", recipe, "--profile", "no-such"], ["--profile 'no-such'", "no such profile", "dev"]),
        ("execution not an ARN", ["stop", recipe, "--execution", "not-an-arn"], ["--execution 'not-an-arn'", "pipeline execution ARN"]),
        ("execution of another pipeline", ["status", recipe, "--execution", other], ["pipeline 'someone-else'", "unit-test"]),
        ("execution in another region", ["logs", recipe, "--execution", other.replace("us-east-1", "eu-west-1").replace("someone-else", "unit-test")],
         ["an execution in eu-west-1", "pass --region eu-west-1"]),
        ("endpoint not a URL", ["logs", recipe, "--endpoint-url", "not a url"], ["not an http(s) URL"]),
        ("negative steps", ["start", recipe, "--max-steps", "-5"], ["--max-steps -5"]),
        ("zero lines", ["logs", recipe, "-n", "0"], ["--lines", "greater than or equal to 1", "--help"]),
        ("not a number", ["start", recipe, "--instance-count", "two"], ["--instance-count", "valid integer"]),
        ("unknown option", ["status", recipe, "--regoin", "us-east-1"], ["--regoin"]),
        ("no recipe", ["status"], ["Missing argument"]),
        ("unknown command", ["plna", recipe], ["No such command 'plna'", "Did you mean 'plan'?"]),
        ("unknown global option", ["--bogus"], ["No such option: --bogus"]),
        ("no such recipe name", ["status", "no-such-recipe"], ["no-such-recipe: no such recipe file", "nor a recipe of that name"]),
        ("hosts 100000", ["rehearse", recipe, "--hosts", "100000"], ["--hosts 100000", "1 to 8"]),
        ("workers 0", ["rehearse", recipe, "--workers", "0"], ["--workers 0"]),
        ("steps 10**9", ["rehearse", recipe, "--steps", "1000000000"], ["--steps 1000000000", "2 to 1000"]),
        ("interrupt beyond the run", ["rehearse", recipe, "--interrupt", "sigterm@99999999999999999999"], ["not within", "1000 steps"]),
        ("interrupt after --steps", ["rehearse", recipe, "--steps", "20", "--interrupt", "sigterm@20"], ["not within the run's 20 steps"]),
        ("interrupt garbage", ["rehearse", recipe, "--interrupt", "sigkill@now"], ["expected sigterm@STEP"]),
        ("interrupt of 5,000 digits", ["rehearse", recipe, "--interrupt", "sigterm@" + "9" * 5000], ["is not a step number"]),
        ("parameter of 5,000 digits", ["rehearse", recipe, "--param", "MaxSteps=" + "9" * 5000], ["MaxSteps", "1 to 1000"]),
        ("unknown parameter", ["rehearse", recipe, "--param", "NoSuch=1"], ["no parameter 'NoSuch'", "InstanceCount"]),
        ("parameter out of range", ["rehearse", recipe, "--param", "InstanceCount=100000"], ["InstanceCount", "1 to 8"]),
        ("restart with an unknown parameter", ["rehearse", recipe, "--restart-with", "Foo=1"], ["--restart-with", "'Foo'"]),
        ("workdir is a file", ["rehearse", recipe, "--workdir", a_file], ["--workdir", "not a directory"]),
        ("slow candidate garbage", ["rehearse", recipe, "--slow-candidate", "first:x"], ["--slow-candidate", "N:SECONDS"]),
        ("slow candidate the plan lacks", ["rehearse", recipe, "--slow-candidate", "5"], ["measures 3 candidate(s)", "1 to 3"]),
        ("slow candidate without a probe", ["rehearse", recipe, "--slow-candidate", "1", "--param", "SkipProbe=true"],
         ["--slow-candidate 1", "runs no probe"]),
        ("slow host garbage", ["rehearse", recipe, "--slow-host", "2:fast"], ["--slow-host '2:fast'", "N:FACTOR"]),
        ("slow host beyond --hosts", ["rehearse", recipe, "--hosts", "2", "--slow-host", "3:0.5"],
         ["--slow-host '3:0.5'", "from 1 to 2"]),
    ]
    if Path("/proc/version").is_file():
        cases.append(("workdir /proc/version", ["rehearse", recipe, "--workdir", "/proc/version"], ["--workdir /proc/version", "not a directory"]))
    return cases


@pytest.fixture(scope="module")
def option_table(tmp_path_factory, aws_sandbox):
    tmp = tmp_path_factory.mktemp("options")
    recipe = write_yaml(tmp / "recipe.yaml", recipe_dict())
    invoke("plan", recipe)  # warm the catalogues: the time below is the command's own
    return {label: (args, words) for label, args, words in option_cases(recipe, tmp)}


OPTION_LABELS = [label for label, _, _ in option_cases(Path("recipe.yaml"), Path("/nonexistent"))]


@pytest.mark.parametrize("label", OPTION_LABELS)
def test_a_bad_option_is_exit_2_one_line_no_call_within_2_seconds(option_table, aws_sandbox, label):
    args, words = option_table[label]
    env = {"AWS_REGION": "mars-1"} if label == "region env" else None
    endpoint = ["--endpoint-url", aws_sandbox] if args[0] in ("start", "status", "logs", "stop") and "--endpoint-url" not in args and len(args) > 1 else []
    result, seconds = invoke(*args, *endpoint, env=env)
    assert result.exit_code == 2, (label, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert seconds < 2.0, f"{label}: {seconds:.2f} s"

    as_json, _ = invoke(*args, *endpoint, "--format", "json", env=env)
    assert as_json.exit_code == 2
    data = json.loads(as_json.stdout)
    assert data["ok"] is False and data["exit_code"] == 2
    assert any(words[-1] in error["message"] for error in data["errors"]), data


def test_every_command_has_json_and_reports_usage_errors_in_it():
    import typer

    from tiered_training.cli.output import OUTPUTS

    group = typer.main.get_command(app)
    names = sorted(group.commands)
    assert {"plan", "validate", "explain", "diff", "run-config", "start", "status", "logs", "stop", "rehearse", "schema"} <= set(names)
    for name in names:
        choices, _ = invoke(name, "--format", "xml")  # the refusal lists the formats the command has
        assert choices.exit_code == 2 and "'json'" in choices.stderr and "--format" in choices.stderr, (name, choices.stderr)
        result, _ = invoke(name, "--format", "json", "--no-such-option")
        assert result.exit_code == 2, (name, result.output)
        data = json.loads(result.stdout)
        assert (data["ok"], data["exit_code"], len(data["errors"])) == (False, 2, 1), data  # and the command's keys
        if name in OUTPUTS:
            assert sorted(data) == sorted(OUTPUTS[name].model_fields), (name, data)
        assert "--no-such-option" in data["errors"][0]["message"]


def test_a_run_command_without_boto3_names_the_extra(aws_sandbox, tmp_path, monkeypatch):
    from tiered_training.aws import session

    recipe = write_yaml(tmp_path / "r.yaml", recipe_dict())
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 raises ImportError
    session.session.cache_clear()
    for command in ("start", "status", "logs", "stop"):
        result, _ = invoke(command, recipe, "--endpoint-url", aws_sandbox)
        assert result.exit_code == 3, result.output  # a missing extra: neither bad input (2) nor AWS (1)
        assert result.stderr.strip() == (
            f"error: tiered-training {command} calls AWS and needs boto3, which the 'aws' extra installs: "
            "pip install 'tiered-training[aws]'"
        )
    session.session.cache_clear()


def test_rehearse_without_its_extras_names_them(tmp_path, monkeypatch):
    recipe = write_yaml(tmp_path / "r.yaml", recipe_dict())
    monkeypatch.setitem(sys.modules, "moto", None)
    result, seconds = invoke("rehearse", recipe)
    assert result.exit_code == 3, result.output
    assert result.stderr.strip() == (
        "error: rehearse runs the trainer on a local S3 and needs moto, which the 'rehearse' extra installs: "
        f"make rehearse-deps in {ROOT.resolve()} (make test installs them too), "
        "or pip install 'tiered-training[rehearse]'"
    )
    assert seconds < 2.0


def test_plan_chart_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    recipe = write_yaml(tmp_path / "r.yaml", recipe_dict())
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    for fmt in ("table", "json"):
        result, _ = invoke("plan", recipe, "--chart", tmp_path / "memory.png", "--format", fmt)
        assert result.exit_code == 3, result.output
        assert result.stderr.strip() == (
            "error: plan --chart needs matplotlib, which the 'plot' extra installs: pip install 'tiered-training[plot]'"
        )
        assert not (tmp_path / "memory.png").exists()
    assert json.loads(result.stdout)["exit_code"] == 3


def test_plan_chart_to_a_folder_that_does_not_exist_is_one_line(tmp_path):
    recipe = write_yaml(tmp_path / "r.yaml", recipe_dict())
    result, _ = invoke("plan", recipe, "--chart", tmp_path / "no-such" / "memory.png")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --chart {tmp_path}/no-such/memory.png: cannot write it: No such file or directory"
    )


def test_a_recipe_name_is_looked_up_safely_beside_hostile_files(tmp_path, monkeypatch):
    folder = tmp_path / "recipes"
    folder.mkdir()
    write_yaml(folder / "bomb.yaml", alias_bomb())
    write_yaml(folder / "deep.yaml", "name: " + "[" * 50_000 + "]" * 50_000 + "\n")
    os.mkfifo(folder / "pipe.yaml")
    write_yaml(folder / "my-file.yaml", recipe_dict(name="my-pipeline"))
    monkeypatch.chdir(tmp_path)
    for name in ("my-pipeline", "my-file"):
        result, seconds = invoke("run-config", name)
        assert result.exit_code == 0 and '"recipe_name": "my-pipeline"' in result.stdout, result.output
        assert seconds < 2.0
    result, _ = invoke("explain", "no-such")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: no-such: no such recipe file, nor a recipe of that name (valid recipe names: my-pipeline)"


# --set: (override, words its one line must hold). Each is refused before any plan, with what would be valid.
SET_CASES = [
    ("data.allowed_uris[0]=s3://x/", ["a list item cannot be set alone", "data.allowed_uris=[first, second]"]),
    ("data.allowed_uris.0=s3://x/", ["a list item cannot be set alone", "data.allowed_uris=[first, second]"]),
    ("compute.\u0456nstance_count=2", ["non-ASCII '\u0456' U+0456", "did you mean 'compute.instance_count'?"]),
    ("tuning.precisi\u03bfn=fp8", ["U+03BF", "did you mean 'tuning.precision'?"]),
    ("compute.instance_count", ["no '='", "key.path=value"]),
    ("=3", ["no field before '='"]),
    ("a..b=1", ["letters, digits and _ joined by '.'"]),
    ("tuning.precision=fp16", ["must be one of 'bf16', 'fp8', 'fp32', 'auto'"]),
    ("compute.instance_count=[1", ["the value is not YAML"]),
    ("name.x=1", ["name is not a section"]),
    # The value is read as a file's values are: the same tags, aliases, bounds and numbers as written.
    ("name=!!python/object/apply:os.system [ls]", ["YAML tag !!python/object/apply:os.system", "remove the tag"]),
    ("compute.instance_count=!!int two", ["'two' cannot be read as a YAML 1.2 integer"]),
    ("compute.instance_count=*a", ["alias *a refers to no anchor"]),
    ("data.allowed_uris=&a [*a]", ["alias *a is inside the collection &a", "recursive"]),
    ("data.allowed_uris=" + alias_bomb(5, 10).replace("\n", ", ").join("{}"), ["aliases expand to more than 10,000 values"]),
    ("name=" + "[" * 5000, ["nested more than 32 levels"]),
    ('name="\\ud800"', ["half of a UTF-16 surrogate pair"]),
    ("compute.instance_count=0x201", ["less than or equal to 512", "(got 0x201 = 513)"]),
    ("compute.instance_count=100_000", ["less than or equal to 512", "(got 100_000)"]),
    ("compute.instance_count=.nan", ["valid integer", "(got .nan)"]),
    ("compute.instance_count='2'", ["'2' is text", "write 2 without quotes"]),
]


@pytest.mark.parametrize("command", ["plan", "validate", "run-config"])
@pytest.mark.parametrize("override,words", SET_CASES, ids=[clip(c[0], 60) for c in SET_CASES])
def test_a_bad_set_is_exit_2_one_line_naming_it_and_writes_nothing(tmp_path, monkeypatch, command, override, words):
    path = write_yaml(tmp_path / "recipe.yaml", recipe_dict())
    monkeypatch.chdir(tmp_path)
    result, _ = invoke(command, path, "--set", override)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: --set {clip(override, 100)}"), line
    for word in words:
        assert word in line, (word, line)
    assert [p.name for p in tmp_path.iterdir()] == ["recipe.yaml"]


# Standard input: (label, bytes, words). Each command that reads a recipe reads "-" the same way.
STDIN_CASES = [
    ("empty", b"", ["<stdin>", "standard input is empty"]),
    ("UTF-16", "name: a\n".encode("utf-16"), ["<stdin>:1", "UTF-16", "save it as UTF-8"]),
    ("UTF-16 without a byte-order mark", "name: a\n".encode("utf-16-le"), ["<stdin>:1", "looks like UTF-16"]),
    ("Latin-1", "name: caf\xe9\n".encode("latin-1"), ["<stdin>:1", "byte 0xE9 at column 10"]),
    ("tag", b"name: !!python/object:os.system x\n", ["<stdin>:1: name:", "!!python/object:os.system"]),
    ("control bytes", b"\x00\x01\x02", ["<stdin>:1", "not allowed"]),
    ("broken YAML", b"name: [\n", ["<stdin>:2", "YAML syntax"]),
    ("recursive alias", b"d: &d [*d]\n", ["<stdin>:1", "alias *d is inside", "recursive"]),
    ("YAML 1.1 directive", b"%YAML 1.1\n---\nname: x\n", ["<stdin>:1", "YAML 1.2 only"]),
]


@pytest.mark.parametrize("command", ["validate", "plan", "explain", "run-config"])
@pytest.mark.parametrize("label,data,words", STDIN_CASES, ids=[c[0] for c in STDIN_CASES])
def test_bad_standard_input_is_exit_2_one_line_and_writes_nothing(tmp_path, monkeypatch, command, label, data, words):
    monkeypatch.chdir(tmp_path)
    result = RUNNER.invoke(app, [command, "-"], input=data, prog_name="tiered-training")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    for word in words:
        assert word in line, (word, line)
    assert list(tmp_path.iterdir()) == []


# diff: (label, its arguments, words). The recipe at fault is named in the one line.
DIFF_CASES = [
    ("missing file", ["good.yaml", "missing.yaml"], ["missing.yaml", "no such file"]),
    ("no second recipe", ["good.yaml"], ["Missing argument 'new'"]),
    ("broken second on stdin", ["good.yaml", "-"], ["<stdin>:2", "YAML syntax"]),
    ("bad --set", ["good.yaml", "good.yaml", "--set", "compute.instance_count[0]=1"], ["a list item cannot be set alone"]),
    ("unknown option", ["good.yaml", "good.yaml", "--no-such"], ["No such option", "--no-such"]),
    ("standard input twice", ["-", "-"], ["diff - -: standard input can be read only once", "as a file"]),
    ("a file and a directory", ["good.yaml", "."], ["two recipe files or two directories"]),
]


@pytest.mark.parametrize("label,args,words", DIFF_CASES, ids=[c[0] for c in DIFF_CASES])
def test_a_bad_diff_is_exit_2_one_line_and_writes_nothing(tmp_path, monkeypatch, label, args, words):
    write_yaml(tmp_path / "good.yaml", recipe_dict())
    monkeypatch.chdir(tmp_path)
    result = RUNNER.invoke(app, ["diff", *args], input=b"name: [\n", prog_name="tiered-training")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and result.stdout == "", result.output
    for word in words:
        assert word in line, (word, line)
    assert [p.name for p in tmp_path.iterdir()] == ["good.yaml"]


# init: (label, NAME, --from, words). Nothing is written unless the new recipe passes validate.
INIT_CASES = [
    ("space in the name", "bad name", "llama3-8b-fp8", ["name:", "letters, digits and hyphens"]),
    ("a path as the name", "../evil", "llama3-8b-fp8", ["name:", "letters, digits and hyphens"]),
    ("name too long", "n" * 200, "llama3-8b-fp8", ["200 characters", "at most 84"]),
    ("lookalike letter", "my-8b-\u0430", "llama3-8b-fp8", ["name:"]),
    ("unknown template", "mine", "nope", ["--from: no template 'nope'", "llama3-8b-fp8"]),
    ("empty name", "", "llama3-8b-fp8", ["name"]),
]


@pytest.mark.parametrize("label,name,template,words", INIT_CASES, ids=[c[0] for c in INIT_CASES])
def test_a_bad_init_is_exit_2_one_line_and_writes_nothing(tmp_path, monkeypatch, label, name, template, words):
    monkeypatch.chdir(tmp_path)
    result = RUNNER.invoke(app, ["init", name, "--from", template, "--dir", "out"], prog_name="tiered-training")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    for word in words:
        assert word in line, (word, line)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
