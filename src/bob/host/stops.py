"""Stopping on SIGINT/SIGTERM without misreporting what was kept.

The command line's signal handler calls `request_stop`; it raises `Interrupted`
at once, except while `held()` is active (a checkpoint being saved and its step
recorded), where the stop waits until the block ends, and inside `finishing()` (a
training run), where the first signal only asks the run to stop at the next
invocation boundary (`stop_requested`): the invocation in flight finishes and is
saved. A second signal stops it at once, keeping the last file. Blocking the signals
alone is not enough: one that arrived just before the block has already set
Python's flag, and its handler would run somewhere inside the block.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from bob.errors import Interrupted

STOP_SIGNALS = frozenset((signal.SIGINT, signal.SIGTERM))

_depth = 0  # how many held() blocks are active
_pending: list[int] = []  # signals that arrived while held
_finishing = 0  # how many finishing() blocks are active
_requested: list[int] = []  # the signal that asked a finishing run to stop


def request_stop(signum: int) -> bool:
    """Ask a finishing run to stop at its next boundary (the first signal: True, a later
    signal may still stop it at once), or stop now (raise Interrupted), or at the end of
    the held block (False)."""
    if _finishing and not _requested:
        _requested.append(signum)
        return True
    if _depth:
        _pending.append(signum)
        return False
    raise Interrupted(signum)


def stop_requested() -> int | None:
    """The signal that asked the finishing run to stop, or None."""
    return _requested[0] if _requested else None


@contextlib.contextmanager
def finishing() -> Iterator[None]:
    """Inside, the first SIGINT/SIGTERM asks the run to stop (`stop_requested`) rather
    than stopping it; the request is forgotten when the block ends."""
    global _finishing
    _finishing += 1
    try:
        yield
    finally:
        _finishing -= 1
        if not _finishing:
            _requested.clear()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """SIGINT/SIGTERM wait until the block ends; then the first of them stops the run."""
    global _depth
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # also for Python's own
    _depth += 1                                                    # KeyboardInterrupt
    try:
        yield
    finally:
        _depth -= 1
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if not _depth and _pending:
            signum = _pending[0]
            _pending.clear()
            raise Interrupted(signum)
