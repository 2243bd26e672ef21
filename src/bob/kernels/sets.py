"""The CPU's kernel sets by name, every program's regions in each: the NumPy reference
(the oracle) and the Numba kernels bit for bit the same (``fast``, where Numba imports),
and the compiling of the Numba kernels ahead of their first launch."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from bob.kernels import signatures as sig
from bob.kernels.memory import Memory

Kernel = Callable[[Memory, dict], None]


def reference_kernels() -> dict[str, Kernel]:
    """The NumPy reference of the dense and the collapsed tables' regions."""
    from bob.kernels.collapsed.reference import KERNELS as collapsed
    from bob.kernels.reference import KERNELS as dense

    return {**dense, **collapsed}


def fast_kernels() -> dict[str, Kernel]:
    """The Numba kernels of both programs; ImportError without Numba."""
    from bob.kernels.collapsed.fast import KERNELS as collapsed
    from bob.kernels.fast import KERNELS as dense

    return {**dense, **collapsed}


def compiled_functions() -> dict[str, tuple]:
    """The Numba functions each region's first launch compiles (or loads from Numba's
    cache on disk, `cache=True`, where an earlier run left it), both programs'."""
    from bob.kernels import fast
    from bob.kernels.collapsed import fast as collapsed

    return {**fast.COMPILED, **collapsed.COMPILED}


def tiny_calls() -> dict:
    """Arguments of the kernels' own types for every compiled function, both programs'."""
    from bob.kernels import fast
    from bob.kernels.collapsed import fast as collapsed

    return {**fast.tiny_calls(), **collapsed.tiny_calls()}


# The kernels any session reaches, whatever it trains with: the initial loss of predict's
# forward invocation (hard targets) and of eval's (corpus), and the validation loss.
SESSION_REGIONS = (sig.LOSS_HARD, sig.LOSS_CORPUS, sig.LOSS_ONLY_CORPUS)


# The same for a session of collapsed tables: its forward invocations' losses and gather.
COLLAPSED_SESSION_REGIONS = (sig.COLLAPSED_LOSS_HARD, sig.COLLAPSED_LOSS_CORPUS,
                             sig.COLLAPSED_LOSS_ONLY, sig.COLLAPSED_GATHER)


def session_regions(regions: Iterable[str]) -> tuple[str, ...]:
    """The kernels any session reaches beside a plan of these regions: SESSION_REGIONS, and
    COLLAPSED_SESSION_REGIONS where the plan holds collapsed tables."""
    collapsed = any(region in sig.COLLAPSED_REGIONS for region in regions)
    return (*SESSION_REGIONS, *(COLLAPSED_SESSION_REGIONS if collapsed else ()))


def needs_compiling(regions: Iterable[str]) -> bool:
    """Whether a session launching these kernels compiles one (seconds to tens of seconds
    each): one of them or of their `session_regions` not yet compiled in this process, and
    no fresh code of it in Numba's cache on disk (a first run, or sources changed since).
    Either program's regions."""
    regions = list(regions)
    return bool(_uncompiled([*regions, *session_regions(regions)]))


def compile_kernels(regions: Iterable[str],
                    keep_going: Callable[[], bool] = lambda: True) -> None:
    """Compile these kernels on tiny arrays, so that Numba's cache on disk holds them and
    later processes load them; functions already compiled or cached are left alone
    (loading costs time too). `keep_going()` runs before each: False stops there (the rest
    wait for a later run)."""
    calls = tiny_calls()
    for function in _uncompiled(regions):
        if not keep_going():
            return
        function(*calls[function])


def _uncompiled(regions: Iterable[str]) -> list[Any]:
    """The compiled functions of these kernels a call would compile."""
    compiled = compiled_functions()
    functions = dict.fromkeys(function for region in sorted(set(regions))
                              for function in compiled.get(region, ()))
    return [function for function in functions
            if not function.signatures and not _cached_on_disk(function)]


_FOUND_ON_DISK: set[Any] = set()  # found in Numba's cache once: not looked for again


def _cached_on_disk(function: Any) -> bool:
    """Whether Numba's cache index for `function` lists code for these sources (Numba's
    own freshness test: the index is empty when missing, of another version or stale)."""
    if function in _FOUND_ON_DISK:
        return True
    try:
        found = bool(function._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - Numba's internals moved: claim nothing
        return True
    if found:
        _FOUND_ON_DISK.add(function)
    return found
