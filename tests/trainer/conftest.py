"""Trainer tests: registers the ``torch`` marker."""

from __future__ import annotations


def pytest_configure(config):
    config.addinivalue_line("markers", "torch: slow multi-process trainer tests (real torchrun on gloo)")
