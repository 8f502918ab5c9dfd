"""Rehearsal tests: the ``torch`` marker (they start real torchrun jobs) and the repo's ``training`` package."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config):
    config.addinivalue_line("markers", "torch: runs torch (multi-process torchrun on the CPU); slower")
