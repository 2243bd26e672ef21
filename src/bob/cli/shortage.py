"""Memory running out, said in one line: a MemoryError, an ENOMEM, or a shared library
that could not be mapped (under an address-space limit, `ulimit -v`, Numba's llvmlite is
the large one, loaded on first use) is no internal error of Bob's but a limit of the
machine or of the process.

The standard library and `bob.errors` alone: the executable reads it where its own
imports ran out of memory.
"""

from __future__ import annotations

import errno
import re

from bob.errors import reason_of, size_text

# What a failed mapping says where the address space is full: dlopen's text, and NumPy's
# ImportError that quotes it for its BLAS library.
MAPPING_FAILURES = ("failed to map segment", "cannot allocate memory")


def memory_shortage(error: BaseException) -> str | None:
    """The one line for an error that memory running out caused, found along its chain of
    causes; None for any other error."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, MemoryError):
            return ran_out(_allocation_text(cause))
        if isinstance(cause, OSError | ImportError) and (
                getattr(cause, "errno", None) == errno.ENOMEM or _says_unmapped(str(cause))):
            return ran_out(f"the system refused memory ({_without_directories(cause)})")
        cause = cause.__cause__ or cause.__context__
    return None


def _says_unmapped(text: str) -> bool:
    return any(failure in text.lower() for failure in MAPPING_FAILURES)


def _without_directories(error: BaseException) -> str:
    """The line of the error's text that says what could not be mapped, each path in it
    cut to its file's name (the library is what matters, not where the environment keeps
    it); NumPy's long ImportError quotes dlopen's line after "Original error was:"."""
    lines = str(error).splitlines() or [""]
    found = next((line for line in lines if _says_unmapped(line)), lines[0])
    found = found.rsplit("Original error was:", 1)[-1]
    return reason_of(RuntimeError(re.sub(r"(?<![^\s'\"(])/\S*/", "", found)), 120)


def _allocation_text(error: MemoryError) -> str:
    """What failed to be allocated: NumPy's arrays say their size; anything else not."""
    size = getattr(error, "_total_size", None)
    if isinstance(size, int) and size > 0:
        return f"an allocation of {size_text(size)} failed"
    return "an allocation failed"


def ran_out(what: str) -> str:
    """"memory ran out: <what>", with the address-space limit where one is set."""
    try:
        import resource  # an extension module: mapping it may itself fail for want of room
    except ImportError:
        return f"memory ran out: {what}; free memory or raise the address-space limit"
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return f"memory ran out: {what}; free memory or run a smaller job"
    return (f"memory ran out: {what} under the address-space limit of {size_text(limit)} "
            "(ulimit -v); raise the limit or run a smaller job")
