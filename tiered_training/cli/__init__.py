"""The ``tiered-training`` command line: ``app.py`` (the typer app), ``base.py`` (what the commands share:
options, formats, exit codes), ``review.py`` (plan, validate, explain, diff, ...) and ``run.py`` (start,
rehearse, status, logs, stop, preflight). :func:`main` is the script; it imports the app when called, so the
package stays light."""

from __future__ import annotations

import gc


def main(argv: list[str] | None = None) -> None:
    """The ``tiered-training`` script: the app, imported without the cyclic garbage collector.

    What the imports build (classes, validators, the commands' options) lives as long as the process, so
    no collection during them frees anything, and each one walks everything built so far: a tenth of the
    start's CPU time. After the imports the collector runs again, over what the command itself makes
    (``gc.freeze`` sets the imports' objects aside)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        from tiered_training.cli.app import main as run
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
    run(argv)
