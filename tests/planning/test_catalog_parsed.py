"""The catalogue's parsed YAML kept beside the bytecode (tiered_training/catalog/parsed.py): used only while it
matches the file and its own checksum, never where bytecode would not be written."""

from __future__ import annotations

import datetime
import sys

import pytest
import yaml

from tiered_training import catalog
from tiered_training.catalog import parsed

TEXT = "p5:\n  gpus: 8\n  hbm: [80, 96.5]\n  spot: null\n  mxfp8: false\n  name: p5.48xlarge\n"


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    path = tmp_path / "instances.yaml"
    path.write_text(TEXT)
    return path


def test_kept_copy_serves_the_same_data(source):
    first = parsed.load(source)
    assert first == yaml.safe_load(TEXT)
    kept = parsed.cache_path(source)
    assert kept.parent == source.parent / "__pycache__" and kept.is_file()
    # the second read comes from the copy: the YAML parser is not run
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parsed.yaml, "load", lambda *a, **k: pytest.fail("parsed again"))
        assert parsed.load(source) == first


def test_an_edited_file_is_parsed_again(source):
    parsed.load(source)
    source.write_text(TEXT.replace("gpus: 8", "gpus: 4"))
    assert parsed.load(source)["p5"]["gpus"] == 4
    assert parsed.load(source)["p5"]["gpus"] == 4


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "foreign"])
def test_a_damaged_copy_is_never_used(source, damage):
    parsed.load(source)
    kept = parsed.cache_path(source)
    blob = bytearray(kept.read_bytes())
    if damage == "flip":  # the payload changed, its length kept: the checksum catches it
        blob[-3] ^= 0x01
    elif damage == "truncate":
        del blob[-5:]
    elif damage == "empty":
        blob = bytearray()
    else:  # another file's copy under this name
        other = source.with_name("other.yaml")
        other.write_text("gpus: 1\n")
        parsed.load(other)
        blob = bytearray(parsed.cache_path(other).read_bytes())
    kept.write_bytes(bytes(blob))
    assert parsed.load(source) == yaml.safe_load(TEXT)
    assert kept.read_bytes() != bytes(blob)  # replaced by a good copy


def test_no_copy_where_bytecode_is_not_written(source, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert parsed.load(source) == yaml.safe_load(TEXT)
    assert not parsed.cache_path(source).exists()


def test_the_copy_follows_pycache_prefix(source, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "prefix"))
    parsed.load(source)
    kept = parsed.cache_path(source)
    assert str(kept).startswith(str(tmp_path / "prefix")) and kept.is_file()
    assert not (source.parent / "__pycache__").exists()


def test_an_unwritable_place_still_loads(source, monkeypatch):
    blocker = source.parent / "__pycache__"
    blocker.write_text("a file where the directory would be")
    assert parsed.load(source) == yaml.safe_load(TEXT)
    assert parsed.load(source) == yaml.safe_load(TEXT)


def test_a_python_without_bytecode_keeps_no_copy(source, monkeypatch):
    monkeypatch.setattr(sys.implementation, "cache_tag", None)
    assert parsed.cache_path(source) is None
    assert parsed.load(source) == yaml.safe_load(TEXT)
    assert not (source.parent / "__pycache__").exists()


def test_values_marshal_cannot_hold_are_parsed_each_time(source):
    source.write_text("checked: 2025-06-01\n")
    assert parsed.load(source) == {"checked": datetime.date(2025, 6, 1)}
    assert not parsed.cache_path(source).exists()
    assert parsed.load(source) == {"checked": datetime.date(2025, 6, 1)}


def test_every_catalogue_file_reads_as_yaml_does():
    for path in sorted(catalog.CATALOG_DIR.glob("*.yaml")):
        assert parsed.load(path) == yaml.safe_load(path.read_text(encoding="utf-8")), path.name
