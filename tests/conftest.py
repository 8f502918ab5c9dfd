"""Shared fixtures for the library's tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from support import write_yaml

# Property tests stay fast: few examples, no per-example deadline (2 shared CPUs). The
# mutation runs (scripts/mutation.py) use fewer, in a fixed order, so a verdict repeats.
settings.register_profile("default", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("mutation", max_examples=10, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def write_recipe(tmp_path):
    def write(data: dict | str, name: str = "recipe.yaml") -> Path:
        return write_yaml(tmp_path / name, data)

    return write
