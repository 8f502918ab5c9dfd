"""Shared fixtures for the library's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import write_yaml


@pytest.fixture
def write_recipe(tmp_path):
    def write(data: dict | str, name: str = "recipe.yaml") -> Path:
        return write_yaml(tmp_path / name, data)

    return write
