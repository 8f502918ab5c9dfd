"""What a rehearsal reports to its user."""

from __future__ import annotations

import signal


class RehearsalError(Exception):
    """Bad input to a rehearsal (parameters, interrupt, a machine without the trainer); one line for the user."""


class MissingExtra(RehearsalError):
    """A package the rehearsal needs is not installed (exit 3: a missing extra)."""


class Stopped(BaseException):
    """SIGTERM or SIGINT reached the rehearsal (a BaseException, as KeyboardInterrupt, so that no
    ``except Exception`` swallows it). Its exit status is 128 + the signal's number: 143 and 130."""

    def __init__(self, signum: int, message: str = ""):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(message or f"stopped by {self.name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
