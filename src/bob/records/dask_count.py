"""Counting on a Dask cluster: byte ranges of files as tasks, partial counts added by the client.

    bob count --dask corpus/            # a LocalCluster on this machine
    bob count --dask tcp://host:8786 s3://bucket/crawl/

The tasks are pieces of files, as the worker threads here count them
(`counting.count_batch` over them), so the counts are bit-identical to the
single-machine path for every partitioning: integers add exactly, in any
order. Workers open the files themselves, so on a cluster of many machines the
paths must be shared or remote (fsspec URLs). Dask retries a task whose worker
died; a task that keeps failing ends the count with one line naming its file
and byte range.

Dask is the optional extra ``bob-bigram[dask]``; it is imported only here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

from bob.errors import BadInput, BobError, RunFailure
from bob.records.counting import (
    BLOCK_BYTES,
    PIECE_BYTES,
    PairCounts,
    Progress,
    Tally,
    check_vocab,
    count_piece,
    no_pairs,
    plan_pieces,
    refuse_empty,
)
from bob.records.sources import Piece, Source

RETRIES = 2  # a task is tried 1 + RETRIES times before the count gives up
# The loggers whose records a count keeps off stderr: Dask's (a lost scheduler is logged
# with its reconnection's CancelledError traceback, a dead worker in a few lines) and the
# event loops' it runs on. The count's own line says what was lost.
QUIET_LOGGERS = ("distributed", "tornado", "asyncio")


def _distributed():
    try:
        import distributed
    except ImportError:
        raise BadInput("--dask needs Dask: pip install 'bob-bigram[dask]'") from None
    return distributed


def count_task(pieces: Sequence[Piece], vocab: int, engine: str | None,
               block_bytes: int) -> PairCounts:
    """One Dask task: the pieces' counts; a failure re-raised as one line naming its piece."""
    tally = Tally(vocab, engine)
    for piece in pieces:
        try:
            count_piece(tally, piece, block_bytes)
        except BobError:
            raise  # already one line naming the file
        except Exception as error:  # any other failure of a worker becomes one line too
            raise RunFailure(f"{piece}: {type(error).__name__}: {error}") from None
    return tally.result()


def _task_text(task: Sequence[Piece]) -> str:
    if len(task) == 1:
        return str(task[0])
    return f"{task[0]} .. {task[-1]} ({len(task)} pieces)"


def count_on_dask(sources: Sequence[Source], vocab: int, address: str | None = None,
                  workers: int = 2, processes: bool = False, engine: str | None = None,
                  progress: Progress | None = None, piece_bytes: int = PIECE_BYTES,
                  block_bytes: int = BLOCK_BYTES) -> PairCounts:
    """The counts of the sources, counted by the scheduler at `address` (None: a LocalCluster).

    The LocalCluster's workers are threads of this process unless `processes`:
    the counting loop (Numba, nogil) and file reads release the GIL, so threads
    count in parallel without the seconds a worker process takes to start.
    """
    check_vocab(vocab)
    for source in sources:
        if source.is_stdin:
            raise BadInput("-: standard input cannot be counted on a Dask cluster (its "
                           "workers cannot read it); give files")
        if source.is_stream:
            raise BadInput(f"{source.name}: a stream cannot be counted on a Dask cluster (its "
                           "workers cannot read it); give files")
    refuse_empty(sources)
    distributed = _distributed()
    tasks = plan_pieces(sources, piece_bytes)
    with quiet_dask_logs():
        cluster = (distributed.LocalCluster(n_workers=workers, threads_per_worker=1,
                                            processes=processes, dashboard_address=None)
                   if address is None else None)
        try:
            try:
                client = distributed.Client(cluster if cluster is not None else address,
                                            timeout="20s")
            except (OSError, TimeoutError) as error:
                raise RunFailure(f"{address}: cannot reach the Dask scheduler "
                                 f"({error})") from None
            with client:
                return _gather(client, distributed, tasks, vocab, engine, block_bytes,
                               progress, sources)
        finally:
            if cluster is not None:
                cluster.close()


def _gather(client, distributed, tasks: list[list[Piece]], vocab: int, engine: str | None,
            block_bytes: int, progress: Progress | None, sources: Sequence[Source],
            ) -> PairCounts:
    """Submit every task, add each partial as it arrives (so memory holds one sum)."""
    futures = {}
    for task in tasks:
        future = client.submit(count_task, task, vocab, engine, block_bytes,
                               retries=RETRIES, pure=False)
        futures[future] = task
    tally = Tally(vocab, engine)
    try:
        for future in distributed.as_completed(futures):
            task = futures.pop(future)
            if future.status != "finished":
                raise _failure(future, task, client, distributed)
            tally.add(future.result())
            future.release()
            if progress is not None:
                progress(sum(piece.bytes for piece in task))
    finally:
        client.cancel(list(futures))
    counts = tally.result()
    if counts.transitions == 0:
        raise no_pairs(sources)
    return counts


def _failure(future, task: Sequence[Piece], client, distributed) -> BobError:
    """One line for a task that did not finish: its own error, the workers that died
    running it, or the scheduler the client lost."""
    if future.status != "error":  # cancelled or lost: no error of the task's own
        return RunFailure(f"{_task_text(task)}: {_lost_what(client)}; the count stopped")
    error = future.exception()
    if isinstance(error, distributed.KilledWorker):
        worker = getattr(error.last_worker, "address", error.last_worker)
        return RunFailure(f"{_task_text(task)}: every Dask worker that ran it died "
                          f"({error.allowed_failures + 1} workers, the last {worker})")
    if isinstance(error, BobError):
        text = str(error)
        kind = type(error) if isinstance(error, BadInput) else RunFailure
    else:
        text = f"{_task_text(task)}: {type(error).__name__}: {error}"
        kind = RunFailure
    message = text.splitlines()[0] if text else _task_text(task)
    if kind is RunFailure:
        message += f" (failed {RETRIES + 1} times)"
    return kind(message)


class _DropDaskRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.partition(".")[0] not in QUIET_LOGGERS


@contextlib.contextmanager
def quiet_dask_logs() -> Iterator[None]:
    """Inside, no record of QUIET_LOGGERS reaches a handler (Dask gives each of its
    loggers a stderr handler of its own, so every handler is filtered, the root's too)."""
    drop = _DropDaskRecords()
    names = [name for name in logging.root.manager.loggerDict
             if name.partition(".")[0] in QUIET_LOGGERS]
    handlers = {handler for logger in (logging.root, *map(logging.getLogger, names))
                for handler in logger.handlers}
    for handler in handlers:
        handler.addFilter(drop)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(drop)


def _lost_what(client) -> str:
    """What took a task away: the scheduler, where the client no longer reaches it."""
    scheduler = getattr(client.scheduler, "address", None) or "address unknown"
    if client.status != "running":
        return f"lost the Dask scheduler ({scheduler})"
    return f"the Dask scheduler ({scheduler}) cancelled the task"
