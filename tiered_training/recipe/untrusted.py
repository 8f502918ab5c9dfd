"""What a recipe's bytes, characters, YAML events and tags may be, and messages that say what is wrong with them.

Each function returns a one-line message (or a :class:`Problem`) that names what was found and
what to write instead; the loader raises them as :class:`RecipeError`. :func:`check_events` bounds the nesting
and alias expansion of a recipe file and of each ``--set`` value, before either is composed.
"""

from __future__ import annotations

import re
import unicodedata

import yaml

from tiered_training.recipe.errors import Problem, RecipeError
from tiered_training.recipe.yaml12 import BOOL, FLOAT, INT, NULL, Loader
from tiered_training.text import clip

# Byte-order marks of the encodings a recipe is not in (UTF-32 first: its LE mark starts as UTF-16's).
BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)
# Line breaks to YAML 1.1 (PyYAML) but not to YAML 1.2 or an editor: lines would be counted differently.
BREAKS_11 = {"\x85": "NEXT LINE (NEL)", "\u2028": "LINE SEPARATOR", "\u2029": "PARAGRAPH SEPARATOR"}
CORE = "tag:yaml.org,2002:"
MERGE_TAG, INT_TAG, FLOAT_TAG = f"{CORE}merge", f"{CORE}int", f"{CORE}float"
# The tags a recipe may carry: the YAML 1.2 core schema's, on the kind of node each is for.
SCALAR_TAGS = {f"{CORE}{kind}": kind for kind in ("str", "int", "float", "bool", "null")}
PATTERNS = {"int": INT, "float": FLOAT, "bool": BOOL, "null": NULL}
WORDS = {"int": "integer", "float": "number", "bool": "boolean (true or false)", "null": "null"}
COLLECTION_TAGS = {f"{CORE}map": yaml.MappingNode, f"{CORE}seq": yaml.SequenceNode}
PLAIN = "a recipe holds text, numbers, true/false, lists and mappings"
# A recipe is about 100 YAML nodes, 4 levels deep; these bounds are far above that.
MAX_DEPTH = 32
MAX_NODES = 10_000  # after alias expansion
# A block-style key at the start of a line: its indent and name.
KEY_LINE = re.compile(r"^( *)(?:- +)?([A-Za-z0-9_.-]+) *:(?: |$)")


def decode(data: bytes, name: str, what: str = "file") -> tuple[str, Problem | None]:
    """The text of ``data``, or the problem that it is not UTF-8 (which encoding it seems to be, where)."""
    for bom, encoding in BOMS:
        if data.startswith(bom):
            return "", Problem(
                name, 1, "", f"the {what} is {encoding} text (its byte-order mark says so); save it as UTF-8"
            )
    head = data[:400]
    if len(head) >= 8 and max(head[0::2].count(0), head[1::2].count(0)) >= 0.8 * (len(head) // 2):
        return "", Problem(
            name,
            1,
            "",
            f"the {what} looks like UTF-16 text without a byte-order mark (a NUL byte beside each "
            "letter); save it as UTF-8",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        start = data.rfind(b"\n", 0, exc.start) + 1
        column = len(data[start : exc.start].decode("utf-8", "replace")) + 1  # in characters, as an editor counts
        return "", Problem(
            name,
            line,
            "",
            f"the {what} is not UTF-8 text: byte 0x{data[exc.start]:02X} at column {column} "
            "(Latin-1 or Windows-1252 text?); save it as UTF-8",
        )
    for char, title in BREAKS_11.items():
        at = text.find(char)
        if at >= 0:
            line, column = position(text, at)
            return "", Problem(
                name,
                line,
                key_on_line(text, line),
                f"character U+{ord(char):04X} ({title}) at column {column}: "
                "YAML 1.1 readers break the line there and YAML 1.2 readers do not; remove it",
            )
    return text, None


def position(text: str, index: int) -> tuple[int, int]:
    """The 1-based line and column of ``text[index]``."""
    return text.count("\n", 0, index) + 1, index - (text.rfind("\n", 0, index) + 1) + 1


def character_message(text: str, index: int, character: int | str) -> str:
    """A character that YAML does not allow in its text (a control character, NUL)."""
    code = character if isinstance(character, int) else ord(character)
    what = unicodedata.name(chr(code), "") or ("NUL" if code == 0 else "a control character")
    column = position(text, index)[1] if 0 <= index <= len(text) else None
    at = f" at column {column}" if column else ""
    return f"character U+{code:04X} ({what}){at} is not allowed in YAML text; remove it"


def key_on_line(text: str, line: int) -> str:
    """The dotted key that a block-style line of ``text`` sets (or lies under), or "" where none is plain to see."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return ""
    if KEY_LINE.match(lines[line - 1]) is None:
        return ""
    keys: list[str] = []
    depth = None
    for row in reversed(lines[:line]):
        match = KEY_LINE.match(row)
        if match is None:
            continue
        indent = len(match.group(1))
        if depth is None or indent < depth:
            keys.insert(0, match.group(2))
            depth = indent
        if depth == 0:
            break
    return ".".join(keys) if depth == 0 else ""


def syntax_hint(text: str, problem: str, line: int | None) -> tuple[str, str] | None:
    """A clearer message, and the key it concerns, for parser errors whose own words mislead."""
    if line is None:
        return None
    rows = text.split("\n")
    row = rows[line - 1] if 0 < line <= len(rows) else ""
    if "unicode character escape" in problem.lower():
        escape = re.search(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}", row)
        if escape:
            return (
                f"{escape.group(0)} is half of a UTF-16 surrogate pair, not a character, and YAML does not join "
                "pairs; write the character itself (or \\U0001F600 for one beyond U+FFFF)",
                key_on_line(text, line),
            )
    tagged = re.search(r"(?:^|[\s\[{,:])((?:![^\s]*|&[^\s]+)(?:\s+(?:![^\s]*|&[^\s]+))?)\s+\*([^\s,\]}]+)", row)
    if tagged:
        return (
            f"an alias (*{tagged.group(2)}) cannot carry a tag or an anchor ({clip(tagged.group(1), 40)}); "
            f"write *{tagged.group(2)} alone",
            key_on_line(text, line),
        )
    if "tab character" in problem:
        return "a tab in the indentation; indent with spaces (YAML does not take tabs there)", ""
    key = re.match(r"^ *(?:- +)?([^:#]*)", row)
    if "expected ':'" in problem and key and len(key.group(1)) > 1024:
        return (
            f"a key of {len(key.group(1)):,} characters; YAML reads a plain key of at most 1,024, and a recipe's "
            "keys are short field names",
            "",
        )
    return None


def tag_problems(node: yaml.Node, path: tuple[int | str, ...], name: str) -> list[Problem]:
    """Each node whose tag a recipe does not take (``!!python/object``, ``!!binary``, ``!!set``, ``!foo``...),
    and each core tag on a value it cannot read (``!!int nope``), with its line and field."""
    problems: list[Problem] = []
    seen: set[int] = set()

    def walk(node: yaml.Node, path: tuple[int | str, ...]) -> None:
        if id(node) in seen:  # an alias: its node was checked where its anchor is
            return
        seen.add(id(node))
        message = _tag_message(node)
        if message:
            field = ".".join(map(str, path))
            problems.append(Problem(name, node.start_mark.line + 1, clip(field, 120), message))
            return
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.tag == MERGE_TAG:
                    walk(value, path)
                    continue
                child = path + (key.value if isinstance(key, yaml.ScalarNode) else "<complex key>",)
                walk(key, child)
                walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, path + (index,))

    walk(node, path)
    return problems


def _tag_message(node: yaml.Node) -> str | None:
    tag = node.tag
    if tag in SCALAR_TAGS:
        kind = SCALAR_TAGS[tag]
        if not isinstance(node, yaml.ScalarNode):
            return f"YAML tag !!{kind} on a {_kind(node)}: it is for a single value; remove the tag"
        pattern = PATTERNS.get(kind)
        if pattern is not None and not pattern.match(node.value):
            return f"YAML tag !!{kind}: {clip(node.value)!r} cannot be read as a YAML 1.2 {WORDS[kind]}; remove the tag"
        return None
    if tag in COLLECTION_TAGS:
        if not isinstance(node, COLLECTION_TAGS[tag]):
            return f"YAML tag {_shown(tag)} on a {_kind(node)}; remove the tag"
        return None
    if tag == MERGE_TAG:
        return None
    return f"YAML tag {_shown(tag)} is not one a recipe reads: {PLAIN}; remove the tag"


def _shown(tag: str) -> str:
    if tag.startswith(CORE):
        return clip("!!" + tag[len(CORE) :], 60)
    return clip(tag if tag.startswith("!") else f"!<{tag}>", 60)


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "mapping"
    return "list" if isinstance(node, yaml.SequenceNode) else "single value"


def check_events(text: str, name: str) -> None:
    """Bound nesting depth and alias expansion on the event stream, before composing; refuse aliases that
    compose badly (recursive, undefined, as a key) and anchors defined twice, naming the field.

    The parser is iterative; only the composer and the constructor recurse. Each
    anchor's expanded size is counted when its node ends, and each alias adds that
    size, so the count is what the document would hold with every alias expanded.
    """
    loader = Loader(text)
    sizes: dict[str | None, int] = {}  # an alias event's anchor is never None
    anchors: dict[str, int | None] = {}  # each anchor defined so far, and its line
    stack: list[_Open] = [_Open(None, False)]  # the document, then each open collection
    total = 0

    def refuse(event: yaml.Event, message: str, field: str | None = None) -> RecipeError:
        where = field if field is not None else ".".join(map(str, (level.place() for level in stack[1:])))
        return RecipeError([Problem(name, _start_line(event), clip(where, 120), message)])

    try:
        while loader.check_event():
            event: yaml.Event = loader.get_event()  # type: ignore[no-untyped-call]  # unannotated in types-PyYAML
            added = 0
            version = getattr(event, "version", None) if isinstance(event, yaml.DocumentStartEvent) else None
            if version is not None and tuple(version) != (1, 2):
                raise refuse(
                    event,
                    f"a %YAML {'.'.join(map(str, version))} directive: recipes are read as YAML 1.2 only "
                    "(1.1 reads yes/no, on/off and 1:30 otherwise); remove the directive or write %YAML 1.2",
                )
            if isinstance(event, yaml.NodeEvent):
                parent = stack[-1]
                is_key = parent.mapping and parent.children % 2 == 0
                parent.children += 1
                if is_key and isinstance(event, yaml.ScalarEvent):
                    parent.key = event.value
                if is_key and isinstance(event, yaml.AliasEvent):
                    raise refuse(
                        event,
                        f"YAML alias *{event.anchor} as a key: a recipe's keys are field names, written out; "
                        "write the key itself",
                        ".".join(level.place() for level in stack[1:-1]),  # the mapping the key is in
                    )
                anchor = None if isinstance(event, yaml.AliasEvent) else event.anchor
                if anchor is not None:
                    if anchor in anchors:
                        first = anchors[anchor]
                        raise refuse(
                            event,
                            f"YAML anchor &{anchor} is defined a second time"
                            + (f" (first on line {first})" if first else "")
                            + "; give each anchor its own name",
                        )
                    anchors[anchor] = _start_line(event)
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(stack) > MAX_DEPTH:
                    raise refuse(event, f"YAML nested more than {MAX_DEPTH} levels deep; a recipe needs about 4", "")
                stack.append(_Open(event.anchor, isinstance(event, yaml.MappingStartEvent)))
                added = 1
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                level = stack.pop()
                if level.anchor is not None:
                    sizes[level.anchor] = level.count
                stack[-1].count += level.count
            elif isinstance(event, yaml.ScalarEvent):
                if event.anchor is not None:
                    sizes[event.anchor] = 1
                stack[-1].count += 1
                added = 1
            elif isinstance(event, yaml.AliasEvent):
                if any(level.anchor == event.anchor for level in stack):
                    raise refuse(
                        event,
                        f"YAML alias *{event.anchor} is inside the collection &{event.anchor} it names: "
                        "a recursive value, which no recipe field takes; copy the values instead",
                    )
                if event.anchor not in anchors:
                    raise refuse(
                        event,
                        f"YAML alias *{event.anchor} refers to no anchor; define &{event.anchor} on a value "
                        "above it (an anchor comes before its aliases), or write the value",
                    )
                added = sizes.get(event.anchor, 1)
                stack[-1].count += added
            total += added
            if total > MAX_NODES:
                raise refuse(event, f"YAML aliases expand to more than {MAX_NODES:,} values; a recipe has about 100")
    finally:
        loader.dispose()


class _Open:
    """A collection open in the event stream: its expanded node count, anchor, kind and where its items are."""

    def __init__(self, anchor: str | None, mapping: bool):
        self.count = 1
        self.anchor = anchor
        self.mapping = mapping
        self.children = 0  # the nodes seen in it: keys and values alternate in a mapping
        self.key: str | None = None

    def place(self) -> str:
        """The current item's key (a mapping) or index (a list)."""
        return str(self.key) if self.mapping else str(max(self.children - 1, 0))


def _start_line(event: yaml.Event) -> int | None:
    """The 1-based line an event starts on (the parser marks every event it makes)."""
    return event.start_mark.line + 1 if event.start_mark else None
