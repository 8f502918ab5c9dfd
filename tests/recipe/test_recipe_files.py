"""Reading recipe files: which files a path names, and one readable line for each file that cannot be read."""

from __future__ import annotations

import os

import pytest
import yaml
from support import recipe_dict

from tiered_training.recipe.errors import RecipeError
from tiered_training.recipe.loader import MAX_BYTES, find_recipes, parse_recipe, read_recipe_text


def error_of(path) -> str:
    with pytest.raises(RecipeError) as info:
        read_recipe_text(path)
    return str(info.value)


def test_a_directory_names_its_yaml_files_in_order(tmp_path):
    for name in ("b.yaml", "a.yml", ".hidden.yaml", "notes.txt", "c.YAML"):
        (tmp_path / name).write_text("x: 1\n")
    (tmp_path / "sub.yaml").mkdir()
    files, errors = find_recipes([tmp_path, tmp_path / "single.yaml"])
    assert files == [tmp_path / "a.yml", tmp_path / "b.yaml", tmp_path / "sub.yaml", tmp_path / "single.yaml"]
    assert errors == []


def test_a_directory_that_cannot_be_listed(tmp_path, monkeypatch):
    from pathlib import Path

    def refuse(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "iterdir", refuse)
    files, errors = find_recipes([tmp_path])
    assert files == [] and [str(e) for e in errors] == [f"{tmp_path}: cannot list the directory: Permission denied"]


def test_files_that_cannot_be_read(tmp_path):
    assert error_of(tmp_path / "nope.yaml") == f"{tmp_path / 'nope.yaml'}: cannot read the file: no such file or directory"
    link = tmp_path / "link.yaml"
    link.symlink_to("gone.yaml")  # relative: the message names the target as the link holds it, whatever tmp_path is
    assert error_of(link) == f"{link}: cannot read the file: a dangling symbolic link (to gone.yaml)"
    assert error_of(tmp_path) == f"{tmp_path}: cannot read the file: a directory, not a regular file"
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    assert error_of(fifo) == f"{fifo}: cannot read the file: a FIFO, not a regular file"
    assert error_of("/dev/null") == "/dev/null: cannot read the file: a character device, not a regular file"


def test_size_and_encoding(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_BYTES + 1))
    assert error_of(big) == f"{big}: {MAX_BYTES + 1:,} bytes; a recipe is at most {MAX_BYTES:,} bytes"
    edge = tmp_path / "edge.yaml"
    edge.write_bytes(b"#" * MAX_BYTES)
    assert read_recipe_text(edge) == "#" * MAX_BYTES
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: a\ndescription: caf\xe9\n")
    assert error_of(latin) == f"{latin}:2: the file is not UTF-8 text: byte 0xE9 at column 17 (Latin-1 or Windows-1252 text?); save it as UTF-8"


def test_an_unknown_field_suggests_the_closest_and_lists_the_valid_ones():
    with pytest.raises(RecipeError) as info:
        parse_recipe(yaml.safe_dump(recipe_dict(**{"compute.instance_cuont": 2})), "r.yaml")
    (problem,) = info.value.problems
    assert problem.field == "compute.instance_cuont"
    assert problem.message == (
        "unknown field; did you mean 'instance_count'? valid fields here: compile, instance_count, instance_type, "
        "max_runtime_hours, max_wait_hours, price_per_hour, quotas, region, spot, training_plan_arn")
    with pytest.raises(RecipeError) as info:
        parse_recipe(yaml.safe_dump(recipe_dict(**{"compute.zzz": 2})), "r.yaml")
    assert info.value.problems[0].message.startswith("unknown field; valid fields here: compile, ")


def test_a_pattern_mismatch_names_the_pattern():
    with pytest.raises(RecipeError) as info:
        parse_recipe(yaml.safe_dump(recipe_dict(**{"compute.region": "Mars"})), "r.yaml")
    assert info.value.problems[0].message == "must be an AWS region name, such as us-east-1"


def test_merge_keys_bring_in_what_a_mapping_does_not_set():
    body = yaml.safe_dump(recipe_dict())
    one = body + "checkpointing:\n  <<: {interval_minutes: 20, keep_last: 4}\n  keep_last: 6\n"
    recipe, lines = parse_recipe(one, "r.yaml")
    assert (recipe.checkpointing.interval_minutes, recipe.checkpointing.keep_last) == (20, 6)
    assert "checkpointing.keep_last" in lines and "checkpointing.interval_minutes" in lines
    # Of several merged mappings, the earlier wins; the mapping's own keys win over all.
    several = body + "checkpointing:\n  <<: [{interval_minutes: 20}, {interval_minutes: 40, keep_last: 4}]\n"
    recipe, _ = parse_recipe(several, "r.yaml")
    assert (recipe.checkpointing.interval_minutes, recipe.checkpointing.keep_last) == (20, 4)


def test_no_message_quotes_a_regular_expression():
    """Every pattern a recipe field has is said in words, with an example that the pattern accepts."""
    import re

    from tiered_training.recipe import PATTERN_MEANING, Recipe

    def patterns(model) -> set[str]:
        found = set()
        for field in model.model_fields.values():
            for meta in field.metadata:
                if getattr(meta, "pattern", None):
                    found.add(meta.pattern)
            for arg in getattr(field.annotation, "__args__", ()):
                if isinstance(arg, type) and hasattr(arg, "model_fields"):
                    found |= patterns(arg)
        return found

    every = patterns(Recipe)
    assert every and every <= set(PATTERN_MEANING), every - set(PATTERN_MEANING)
    for pattern, meaning in PATTERN_MEANING.items():
        example = meaning.rsplit("such as ", 1)[1]
        assert re.fullmatch(pattern, example), (pattern, example)
