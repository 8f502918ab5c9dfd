"""What a rehearsal reports to its user."""

from __future__ import annotations


class RehearsalError(Exception):
    """Bad input to a rehearsal (parameters, interrupt, a machine without the trainer); one line for the user."""


class MissingExtra(RehearsalError):
    """A package the rehearsal needs is not installed (exit 3: the installation, not the input)."""
