"""Checkpoints saved beside the training: one background thread, in order, failures kept.

`bob train` hands each invocation's checkpoint to a `BackgroundWriter` and goes
on with the next invocation. The writer saves them one at a time, in the order
given, each atomically (`Checkpoint.save` goes through `bob.files.atomic_write`:
temporary file, fsync, rename), so the file on disk is always a whole
checkpoint. At most one job waits behind the one being written: a slow disk
holds the training back rather than piling up tables in memory. A job given
with `supersede` (a save to the file the waiting one saves to) replaces the
waiting one instead: the newer checkpoint makes the older one's save pointless,
so a disk slower than the training skips states, never the last. A job given
with `keep` (one that also saves a file no later job saves again, --keep-best's)
is never replaced: a later job waits behind it.

A failure is never lost: it is kept and raised in the caller's thread at the
next `submit` or at `close`, as a one-line BobError (anything else is wrapped
in a RunFailure naming it); the jobs after a failure are dropped, so nothing
newer overwrites the last good checkpoint.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable

from bob.errors import BobError, RunFailure

Job = Callable[[], None]
_STOP = None  # the job that ends the thread


class BackgroundWriter:
    """One thread running save jobs in order; `close` waits for every one given."""

    def __init__(self, name: str = "bob-checkpoint-writer"):
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=1)
        self._failure: BobError | None = None
        self._reported = False  # the failure is raised once, in the caller's thread
        self._closed = False
        self.superseded = 0  # jobs dropped for a newer one (submit's supersede)
        self._last_kept = False  # whether the job given last may not be dropped
        # A daemon, so a writer never closed (a stop between start and the caller's try)
        # cannot hold the process open; callers close it, which waits for every save, and
        # a save cut short by an exit leaves the previous file (atomic_write).
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job, supersede: bool = False, keep: bool = False) -> None:
        """Queue `job`; raise the failure of an earlier one, if any, instead. With
        `supersede`, a job still waiting (not begun) is dropped for this one, unless it was
        given with `keep`."""
        self.raise_failure()
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise RuntimeError("the checkpoint writer is closed")
        # Only this thread puts, so a job still waiting is the one given last: what it
        # takes is a job, never the stop.
        if supersede and not self._last_kept:
            with contextlib.suppress(queue.Empty):
                self._jobs.get_nowait()
                self._jobs.task_done()
                self.superseded += 1
        self._jobs.put(job)
        self._last_kept = keep

    def drain(self) -> None:
        """Wait until every job given has run; then raise a failure, if any."""
        if not self._closed:
            self._jobs.join()
        self.raise_failure()

    def close(self) -> None:
        """Run every job given, end the thread (once), then raise a failure, if any."""
        if not self._closed:
            self._closed = True
            self._jobs.put(_STOP)
            self._thread.join()
        self.raise_failure()

    def raise_failure(self) -> None:
        failure = self._failure
        if failure is not None and not self._reported:
            self._reported = True
            raise failure

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is _STOP:
                    return
                if self._failure is not None:
                    continue  # dropped: nothing newer than a failed save is written
                try:
                    job()
                except BobError as error:
                    self._failure = error
                except BaseException as error:  # noqa: BLE001 - kept for the caller, one line
                    text = str(error).strip().splitlines()
                    detail = text[0] if text else type(error).__name__
                    self._failure = RunFailure(f"saving the checkpoint failed: {detail}")
            finally:
                self._jobs.task_done()
