"""The CPU's kernel sets by name, every program's regions in each: the NumPy reference
(the oracle) and the Numba kernels bit for bit the same (``fast``, where Numba imports)."""

from __future__ import annotations

from collections.abc import Callable

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
    """The Numba functions each region's first launch compiles, both programs'."""
    from bob.kernels import fast
    from bob.kernels.collapsed import fast as collapsed

    return {**fast.COMPILED, **collapsed.COMPILED}


def tiny_calls() -> dict:
    """Arguments of the kernels' own types for every compiled function, both programs'."""
    from bob.kernels import fast
    from bob.kernels.collapsed import fast as collapsed

    return {**fast.tiny_calls(), **collapsed.tiny_calls()}
