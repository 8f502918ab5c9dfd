"""An earlier run's export as the starting checkpoint (training/init_archive.py): the model.tar.gz a training job
uploads, unpacked once and loaded; an adapter export and a damaged archive are refused by name."""

from __future__ import annotations

import tarfile

import pytest

from training.init_archive import ArchiveError, unpacked
from training.paths import Paths


def _archive(tmp_path, files: dict[str, str], *, folder: str = ""):
    source = tmp_path / "export"
    for name, text in files.items():
        (source / folder / name).parent.mkdir(parents=True, exist_ok=True)
        (source / folder / name).write_text(text)
    channel = tmp_path / "channel"
    channel.mkdir()
    with tarfile.open(channel / "model.tar.gz", "w:gz") as tar:
        for path in sorted(source.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(source)))
    return channel


@pytest.mark.parametrize("folder", ["", "model"])
def test_a_merged_export_archive_is_the_starting_checkpoint(tmp_path, folder):
    channel = _archive(tmp_path, {"config.json": "{}", "tokenizer.json": "{}"}, folder=folder)
    paths = Paths(tmp_path / "data", tmp_path / "ckpt", tmp_path / "out", channel)
    init = paths.init_checkpoint()
    assert init is not None and (init / "config.json").is_file() and (init / "tokenizer.json").is_file()
    assert unpacked(channel) == init  # once: the second call reuses the extraction


def test_an_adapter_export_is_refused_by_name(tmp_path):
    channel = _archive(tmp_path, {"adapter_config.json": "{}", "adapter_model.safetensors": ""})
    with pytest.raises(ArchiveError, match=r"model.tar.gz: an adapter export .*export.format: merged"):
        unpacked(channel, tmp_path / "x")


def test_a_damaged_archive_is_named(tmp_path):
    channel = tmp_path / "channel"
    channel.mkdir()
    (channel / "model.tar.gz").write_bytes(b"not a tar")
    with pytest.raises(ArchiveError, match=r"model.tar.gz: not a readable tar.gz archive"):
        unpacked(channel, tmp_path / "x")


def test_a_checkpoint_directory_is_used_as_it_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert unpacked(tmp_path) == tmp_path
