"""The ``tiered-training`` command line: ``app.py`` (the typer app), ``base.py`` (what the commands share:
options, formats, exit codes), ``review.py`` (plan, validate, explain, diff, ...) and ``run.py`` (start,
rehearse, status, logs, stop, preflight). ``main`` is imported on first use, so the package stays light."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "main":
        from tiered_training.cli.app import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
