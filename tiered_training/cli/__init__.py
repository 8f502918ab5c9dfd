"""The ``tiered-training`` command line: the typer app and its shared options, the review commands
(plan, validate, explain, diff...) and the run commands (start, status, logs, stop, preflight)."""
