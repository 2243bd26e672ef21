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


class NonFiniteLoss(RunFailure):
    """Training produced a non-finite loss; the last good checkpoint is kept."""
