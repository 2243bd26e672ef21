"""The CUDA driver's start-up, begun before the command line's imports.

Initialising the driver (cuInit) and creating the device's primary context take about
as long as a `bob train` spends importing NumPy, rich and Bob itself. Both driver calls
release the GIL, so `start_for(argv)` makes them on a thread of its own as the process
starts, when the command will open a backend that may be CUDA's (train, predict, generate
or eval, with a --backend that may open the CUDA driver); the backend's own cuInit and
cuDevicePrimaryCtxRetain (of device 0, as the backend's) then find them done. The
thread's retain of the primary context is kept until the process ends, so the backend's
close does not destroy the context: the process's exit does.

This module imports nothing beyond the standard library before the thread starts, so it
names the backends that may open the CUDA driver itself (`CUDA_BACKENDS`); a test holds
them to the backend registry's (`bob.backends.registry.CUDA_DRIVER_NAMES`). A driver that
is missing or refuses leaves no trace here: the backend reports it itself.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Sequence

COMMANDS = frozenset({"train", "predict", "generate", "eval"})  # those with --backend
CUDA_BACKENDS = frozenset({"cuda", "auto"})  # registry.CUDA_DRIVER_NAMES, without its import
SKIP_WORDS = frozenset({"-h", "--help", "--version"})

_started: list[threading.Thread] = []


def wanted(argv: Sequence[str]) -> bool:
    """Whether the command `argv` (without the program name) may open the cuda backend."""
    words = list(argv)
    if SKIP_WORDS.intersection(words):
        return False
    command = next((word for word in words if not word.startswith("-")), None)
    if command not in COMMANDS:
        return False
    backend = "auto"
    for index, word in enumerate(words):
        if word == "--backend" and index + 1 < len(words):
            backend = words[index + 1]
        elif word.startswith("--backend="):
            backend = word.partition("=")[2]
    return backend in CUDA_BACKENDS


def warm_up() -> bool:
    """cuInit, then a retain of device 0's primary context, kept: whether both were made.
    Any failure is left for the backend to meet and report."""
    try:
        from cuda.bindings import driver

        success = driver.CUresult.CUDA_SUCCESS
        if driver.cuInit(0)[0] != success:
            return False
        status, device = driver.cuDeviceGet(0)
        return status == success and driver.cuDevicePrimaryCtxRetain(device)[0] == success
    except Exception:  # no bindings, no driver library: the backend says so itself
        return False


def start_for(argv: Sequence[str]) -> threading.Thread | None:
    """Start `warm_up` on its own thread if the command wants it (once a process)."""
    if _started or not wanted(argv):
        return None
    thread = threading.Thread(target=warm_up, name="bob-cuda-warm-up", daemon=True)
    thread.start()
    _started.append(thread)
    # A command refused at once must not leave the interpreter while the driver is in
    # the middle of setting itself up.
    atexit.register(thread.join)
    return thread
