"""Errors a user can act on, one family: the CLI prints the one-line message after "bob: "
and exits with the error's status (2 for bad input, 1 for a failure at run time).

Ground floor: it imports nothing of Bob's.
"""

from __future__ import annotations

import re

# A reason quoted from elsewhere (a library's error, a header's text) is cut to this many
# characters: the line names the problem, it does not reprint the file.
REASON_CHARACTERS = 200


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


def one_line(message: str) -> str:
    """`message` on one line: each line break, with the spaces around it, becomes a space."""
    return re.sub(r"\s*\n\s*", " ", message.strip())


def reason_of(error: BaseException, limit: int = REASON_CHARACTERS) -> str:
    """A foreign error's text as the reason in Bob's one line: on one line, cut to `limit`
    characters, or the error's type where it says nothing."""
    text = one_line(str(error))
    if not text:
        return type(error).__name__
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def shown(value: object, limit: int = 80) -> str:
    """A value read from a file as a refusal quotes it: its repr, cut to `limit`
    characters (a hostile file's value may be a megabyte long)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def size_text(size: int) -> str:
    """A size in the binary unit that fits, so a small one never rounds to zero: 512 B,
    1.5 KiB, 16 MiB, 64 GiB. Every size a refusal prints goes through it."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.3g} {unit}"
    return f"{size} B"
