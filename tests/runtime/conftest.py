"""Fixtures and markers for the container runtime tests."""

from __future__ import annotations

import pytest

from .helpers import RunConfig, tiny_config


def pytest_configure(config):
    config.addinivalue_line("markers", "torch: runs torch (multi-process torchrun on the CPU); slower")


@pytest.fixture
def tiny_cfg() -> RunConfig:
    return tiny_config()
