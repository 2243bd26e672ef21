"""Errors a user can act on. The CLI maps them to exit statuses."""

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
