"""Stopping on SIGINT/SIGTERM without misreporting what was kept.

The command line's signal handler calls `request_stop`; it raises `Interrupted`
at once, except while `held()` is active (a checkpoint being saved and its step
recorded), where the stop waits until the block ends. Blocking the signals
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


def request_stop(signum: int) -> None:
    """Stop now (raise Interrupted), or at the end of the held block."""
    if _depth:
        _pending.append(signum)
        return
    raise Interrupted(signum)


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
