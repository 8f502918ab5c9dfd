"""The catalogue's YAML parsed once and kept beside the bytecode, as Python keeps a module's.

Parsing the files a plan reads costs every command a few milliseconds; their parsed data, marshalled, loads in a
tenth of that. The copy lives where Python would put bytecode for ``<file>.yaml.py`` (``__pycache__`` beside it,
or under ``PYTHONPYCACHEPREFIX``), is written only where bytecode would be (not under
``PYTHONDONTWRITEBYTECODE``), and is keyed on the YAML's own bytes: an edited file is parsed again. Each copy
carries the SHA-256 of its payload, checked at every read; a damaged, truncated or foreign copy is parsed anew
and replaced, never used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import sys
from pathlib import Path
from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DIGEST = hashlib.sha256().digest_size


def cache_path(path: Path) -> Path | None:
    """Where the parsed copy of ``path`` lives (Python's bytecode location for ``<path>.py``); None on a Python
    that keeps no bytecode (no ``sys.implementation.cache_tag``)."""
    try:
        return Path(importlib.util.cache_from_source(f"{path}.py")).with_suffix(".marshal")
    except NotImplementedError:
        return None


def load(path: Path) -> Any:
    """``path``'s YAML, parsed (safe loader), from the kept copy when it matches the file's bytes."""
    text = path.read_bytes()
    key = hashlib.sha256(text + marshal.dumps(marshal.version)).digest()
    kept = cache_path(path)
    data = _read(kept, key) if kept is not None else None
    if data is not None:
        return data[0]
    value = yaml.load(text, Loader=_LOADER)  # noqa: S506 (the C safe loader)
    if kept is not None and not sys.dont_write_bytecode:
        _write(kept, key, value)
    return value


def _read(kept: Path, key: bytes) -> tuple[Any] | None:
    try:
        blob = kept.read_bytes()
    except OSError:
        return None
    payload = blob[2 * _DIGEST :]
    if blob[:_DIGEST] != key or blob[_DIGEST : 2 * _DIGEST] != hashlib.sha256(payload).digest():
        return None
    try:
        return (marshal.loads(payload),)
    except (EOFError, ValueError, TypeError):
        return None


def _write(kept: Path, key: bytes, value: Any) -> None:
    """Write the copy atomically; a value marshal cannot hold, or a directory that cannot be written, keeps none."""
    try:
        payload = marshal.dumps(value)
    except ValueError:
        return
    import tempfile  # only when writing: its imports cost every start

    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=kept.parent, prefix=f".{kept.name}.")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(key + hashlib.sha256(payload).digest() + payload)
            os.replace(temporary, kept)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError:
        return
