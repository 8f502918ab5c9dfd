"""Trainer tests: registers the ``torch`` marker and makes the repo's ``training`` package importable."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
_loaded = sys.modules.get("training")
if _loaded is not None and Path(getattr(_loaded, "__file__", "") or "").parent != ROOT / "training":
    del sys.modules["training"]  # a namespace package made of tests/training, not the trainer


def pytest_configure(config):
    config.addinivalue_line("markers", "torch: slow multi-process trainer tests (real torchrun on gloo)")
