"""Stopping on SIGINT/SIGTERM at any moment, in one line, without misreporting what was
kept.

The executable installs the handler first thing (`install`, before its heavy imports);
`handling()` does it for each `bob.cli.main.main` where nothing has. A signal raises
`Interrupted` at once in Bob's own code, except:

- inside `finishing()` (a training run), where the first signal only asks the run to
  stop at the next invocation boundary (`stop_requested`): the invocation in flight
  finishes and is saved. A later signal stops it at once, keeping the last file.
- inside `held()` (a checkpoint being saved and its step recorded), where the stop
  waits until the block ends. Blocking the signals alone is not enough: one that arrived
  just before the block has already set Python's flag, and its handler would run
  somewhere inside the block.
- inside an import, or in Numba or llvmlite (the compiler, the ctypes callbacks LLVM
  makes into Numba's cache), where an exception does not stop the command: an import
  turns it into an ImportError ("numba._devicearray failed to import"), ctypes prints
  and drops it ("Exception ignored on calling ctypes callback function"). There the stop
  is deferred: SIGALRM retries it every RETRY_SECONDS, and it is raised as soon as the
  main thread is back in Bob's code (`deferred_stop` names it meanwhile).

Once a stop is raised, later signals are ignored: the cleanup (a save finishing, the
checkpoint lock released) runs whole.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from bob.errors import Interrupted

STOP_SIGNALS = frozenset((signal.SIGINT, signal.SIGTERM))
RETRY_SIGNAL = signal.SIGALRM
RETRY_SECONDS = 0.02  # how often a deferred stop is tried again
# Code an exception must not be raised in: top-level package names, and the frozen import
# machinery (its frames name these modules).
DEFERRING_PACKAGES = frozenset(("numba", "llvmlite", "importlib", "_frozen_importlib",
                                "_frozen_importlib_external"))

_depth = 0  # how many held() blocks are active
_finishing = 0  # how many finishing() blocks are active
_requested: list[int] = []  # the signal that asked a finishing run to stop
_pending: list[int] = []  # a stop not raised yet: it arrived while held, or was deferred
_raised: list[int] = []  # the stop already raised: later signals are ignored
_installed: list[dict[int, object]] = []  # the handlers ours replaced, while ours are set


def request_stop(signum: int, frame: FrameType | None = None, *,
                 inspect_frame: bool = False) -> bool:
    """What a stop signal does now: ask a finishing run to stop at its next boundary
    (True), wait for the end of the held block or, with `inspect_frame`, for the main
    thread to leave an import or Numba (False), or stop now (raise Interrupted)."""
    if _finishing and not _requested:
        _requested.append(signum)
        return True
    if not _pending:
        _pending.append(signum)
    if _depth:
        return False
    if inspect_frame and not safe_to_raise(frame):
        _retry_later()
        return False
    raise_pending()
    return False  # pragma: no cover (raise_pending raised)


def raise_pending() -> None:
    """Raise the stop waiting to be raised, if any, unless a held block still holds it."""
    if _pending and not _depth:
        signum = _pending[0]
        _pending.clear()
        _cancel_retry()
        _raised.append(signum)
        raise Interrupted(signum)


def deferred_stop() -> int | None:
    """The signal of a stop received but not raised yet, or None."""
    return _pending[0] if _pending else None


def stop_requested() -> int | None:
    """The signal that asked the finishing run to stop, or None."""
    return _requested[0] if _requested else None


def safe_to_raise(frame: FrameType | None) -> bool:
    """Whether an exception raised at `frame` reaches Bob's own handlers: no frame of
    the import machinery, Numba or llvmlite is on the main thread's stack."""
    if frame is None:
        return False  # no Python frame to raise in: leave it to the retry
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if (module.partition(".")[0] in DEFERRING_PACKAGES
                or frame.f_code.co_filename.startswith("<frozen importlib")):
            return False
        frame = frame.f_back
    return True


def install() -> None:
    """Our handler for SIGINT and SIGTERM, from now on (the process starts afresh)."""
    if _installed or threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    _reset()
    previous = {number: signal.signal(number, _on_signal) for number in STOP_SIGNALS}
    previous[RETRY_SIGNAL] = signal.signal(RETRY_SIGNAL, _on_retry)
    _installed.append(previous)


def uninstall() -> None:
    """The handlers `install` replaced, back."""
    if not _installed:
        return
    _cancel_retry()
    for number, handler in _installed.pop().items():
        signal.signal(number, handler)  # type: ignore[arg-type]


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """Our handler inside the block, unless it is already set (by the executable): then
    the block changes nothing."""
    if _installed:
        yield
        return
    install()
    try:
        yield
    finally:
        uninstall()


def _reset() -> None:
    for state in (_requested, _pending, _raised):
        state.clear()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if not _raised:  # a signal while stopping must not interrupt the cleanup
        request_stop(signum, frame, inspect_frame=True)


def _on_retry(signum: int, frame: FrameType | None) -> None:
    if not _pending:
        return
    if _depth or not safe_to_raise(frame):
        _retry_later()
        return
    raise_pending()


def _retry_later() -> None:
    if _installed:
        signal.setitimer(signal.ITIMER_REAL, RETRY_SECONDS)


def _cancel_retry() -> None:
    if _installed:
        signal.setitimer(signal.ITIMER_REAL, 0)


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
        raise_pending()
