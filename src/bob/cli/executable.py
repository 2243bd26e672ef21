"""The `bob` executable (and `python -m bob`): the CUDA driver's start-up begun on a
thread of its own (`warmup`), then the command line, then the process ends without
tearing its interpreter down where nothing else still runs.

Freeing every object of a process that imported NumPy, CUDA's bindings and rich one by
one cost about 0.1 s on the H200's host and 0.2-0.3 s on the 2-core machine; by the
time a command returns, Bob has written, fsynced and closed every file it makes. The
terminal's buffered output is flushed first. This module imports only the standard
library and `warmup` before the thread starts: the command line's imports run beside
the driver's start-up.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import NoReturn

from bob.cli import warmup
from bob.errors import Interrupted
from bob.host import stops


def entry(argv: list[str] | None = None) -> NoReturn:
    stops.install()  # before anything else is imported or started
    words = sys.argv[1:] if argv is None else argv
    try:
        warmup.start_for(words)
        from bob.cli.main import main  # the command line's imports, beside the driver's

        stops.raise_pending()  # a stop that waited for the imports
        status = main(words)
        flush_output()
    except Interrupted as stop:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"bob: {stop}\n")
        flush_output()
        status = stop.exit_status
    except Exception as error:  # memory ran out while the command line was imported
        from bob.cli.shortage import memory_shortage

        shortage = memory_shortage(error)
        if shortage is None:
            raise
        with contextlib.suppress(Exception):
            sys.stderr.write(f"bob: {shortage}\n")
        flush_output()
        status = 1
    if nothing_left_running():
        os._exit(status)
    sys.exit(status)


def flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream has nothing to give
            stream.flush()


def nothing_left_running() -> bool:
    """Whether the process is down to its main thread and has no child process: anything
    else (a thread a library left, a worker process, the driver's start-up not yet done)
    gets the interpreter's own exit, which waits for it or cleans it up."""
    multiprocessing = sys.modules.get("multiprocessing")  # not imported: nothing started
    return threading.active_count() == 1 and not (
        multiprocessing is not None and multiprocessing.active_children())


if __name__ == "__main__":  # pragma: no cover
    entry()
