"""Errors a user can act on, one family: the CLI prints the one-line message after "bob: "
and exits with the error's status (2 for bad input, 1 for a failure at run time).

Ground floor: it imports nothing of Bob's.
"""

from __future__ import annotations


class BobError(Exception):
    """Base of Bob's own errors; the message is one line for the user."""

    exit_status = 1


class BadInput(BobError):
    """A file or argument is malformed: nothing was written (exit status 2)."""

    exit_status = 2


class RunFailure(BobError):
    """Something failed while running (exit status 1)."""

    exit_status = 1


class BackendUnavailable(RunFailure):
    """A backend cannot run here; the message says why."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the command: exit 128 + the signal's number.

    A KeyboardInterrupt, so code that stops cleanly on Ctrl-C stops on it too.
    """

    def __init__(self, signum: int, message: str = "interrupted") -> None:
        super().__init__(message)
        self.signum = int(signum)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum
