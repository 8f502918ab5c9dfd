"""Finding recipe files: several paths at once, each bad one reported while the others are
still listed; a block device named by its kind; a recipe looked up by its pipeline name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from support import recipe_dict

from tiered_training.recipe.errors import RecipeError
from tiered_training.recipe.loader import find_recipes, read_recipe_text, recipe_by_name


def folder_with(tmp_path: Path, name: str, *files: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for file in files:
        (folder / file).write_text("x: 1\n")
    return folder


def test_every_path_is_listed_past_a_bad_one(tmp_path):
    too_long = tmp_path / ("x" * 5000)
    first = folder_with(tmp_path, "one", "a.yaml")
    second = folder_with(tmp_path, "two", "b.yaml", "c.yml")
    single = tmp_path / "single.yaml"
    files, errors = find_recipes([first, too_long, single, second])
    assert files == [first / "a.yaml", single, second / "b.yaml", second / "c.yml"]
    assert [str(e) for e in errors] == [f"{too_long}: cannot read: File name too long"]


def test_a_folder_that_cannot_be_listed_does_not_hide_the_next(tmp_path, monkeypatch):
    locked = folder_with(tmp_path, "locked", "a.yaml")
    open_ = folder_with(tmp_path, "open", "b.yaml")
    real = Path.iterdir

    def iterdir(self):
        if self == locked:
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    files, errors = find_recipes([locked, open_])
    assert files == [open_ / "b.yaml"]
    assert [str(e) for e in errors] == [f"{locked}: cannot list the directory: Permission denied"]


def test_a_block_device_is_named():
    block = next((Path("/dev", n) for n in sorted(os.listdir("/dev")) if Path("/dev", n).is_block_device()), None)
    if block is None or not os.access(block, os.R_OK):
        pytest.skip("no readable block device here")
    with pytest.raises(RecipeError) as info:
        read_recipe_text(block)
    assert str(info.value) == f"{block}: cannot read the file: a block device, not a regular file"


def write(folder: Path, file: str, data) -> Path:
    path = folder / file
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_a_recipe_by_its_pipeline_name_or_its_file_name(tmp_path):
    folder = tmp_path / "recipes"
    folder.mkdir()
    write(folder, "a-list.yaml", "- just\n- a list\n")
    write(folder, "broken.yaml", "name: [unclosed\n")
    dotted = write(folder, "qwen2.5-14b.yaml", recipe_dict(name="qwen25-14b"))
    other = write(folder, "other.yaml", recipe_dict(name="other-run"))
    assert recipe_by_name("qwen25-14b", folder) == (dotted, ["other-run", "qwen25-14b"])
    assert recipe_by_name("qwen2.5-14b", folder)[0] == dotted
    assert recipe_by_name("other", folder)[0] == other
    assert recipe_by_name("nothing", folder) == (None, ["other-run", "qwen25-14b"])


def test_a_file_is_not_a_folder_of_recipes(tmp_path):
    path = write(tmp_path, "single.yaml", recipe_dict(name="single"))
    assert recipe_by_name("single", path) == (None, [])
    assert recipe_by_name("single", tmp_path / "absent") == (None, [])


def test_file_errors_in_json(tmp_path):
    """``--format json`` lists a file that cannot be read with its file, line and message, no field."""
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: a\ndescription: caf\xe9\n")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (2 << 20))
    cases = {
        tmp_path / "absent.yaml": (None, "cannot read the file: no such file or directory"),
        tmp_path: (None, "cannot read the file: a directory, not a regular file"),
        latin: (2, "the file is not UTF-8 text: byte 0xE9 at column 17 (Latin-1 or Windows-1252 text?); save it as UTF-8"),
        big: (None, f"{2 << 20:,} bytes; a recipe is at most {1 << 20:,} bytes"),
    }
    for path, (line, message) in cases.items():
        with pytest.raises(RecipeError) as info:
            read_recipe_text(path)
        (problem,) = info.value.problems
        assert problem.to_dict() == {"file": str(path), "line": line, "field": "", "message": message, "value": None}
