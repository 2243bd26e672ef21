"""The CPU backend: the oracle every other backend is compared with.

One NumPy byte buffer laid out exactly as the plan's arena. Each launch
decodes its own parameter block (the bytes a GPU would read from constant
bank 0; decoded again only when the block changes) and runs its kernel on the
arena: the Numba-compiled kernels of ``bob.kernels.fast`` where Numba is
installed, else the NumPy reference (``bob.kernels.reference``). The two are
bit-identical (tests/test_cpu_fast.py); ``BOB_CPU_KERNELS=reference`` picks
the reference anyway.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping

import numpy as np

from bob.kernels.memory import Memory
from bob.kernels.sets import fast_kernels, reference_kernels
from bob.plan.certificate import CertifiedPlan
from bob.plan.model import Address, Plan, Scalar
from bob.plan.placement import decode_parameter_block

from .base import Backend, Patch, host_memory_available, require_memory

Kernel = Callable[[Memory, dict], None]


def kernel_arguments(decoded: Mapping[str, Address | Scalar]) -> dict[str, int | np.float32]:
    """Parameter-block values as the reference kernels take them."""
    args: dict[str, int | np.float32] = {}
    for name, value in decoded.items():
        if isinstance(value, Address):
            args[name] = value.address
        elif value.dtype == "f32":
            args[name] = np.uint32(value.bits).view(np.float32)
        else:
            args[name] = int(value.bits)
    return args


KERNEL_SETS = ("fast", "reference")


def default_kernels() -> tuple[str, Mapping[str, Kernel]]:
    """("fast", Numba kernels) where Numba imports, else ("reference", NumPy kernels).

    ``BOB_CPU_KERNELS`` (fast or reference) asks for one; fast falls back to the
    reference where Numba is missing.
    """
    wanted = os.environ.get("BOB_CPU_KERNELS", "fast")
    if wanted not in KERNEL_SETS:
        raise ValueError(f"BOB_CPU_KERNELS must be one of {KERNEL_SETS}, not {wanted!r}")
    if wanted == "fast":
        try:
            fast = fast_kernels()
        except ImportError:  # numba is an optional dependency
            pass
        else:
            return "fast", fast
    return "reference", reference_kernels()


COMPILING_NOTICE = "compiling the CPU kernels (first run only) ..."


def compile_kernels(regions: set[str]) -> None:
    """Before a first launch would compile a Numba kernel: one line on stderr (tens of
    seconds on a small machine, which would otherwise look like a hang), then this plan's
    kernels compiled. The line is said where any kernel a session reaches needs compiling
    (predict's, eval's and validation's losses too): `CpuBackend.compile_ahead` compiles
    those next, so that the commands after a first `bob train` compile nothing and say
    nothing. Later runs load them from Numba's cache on disk."""
    from bob.kernels import sets

    if sets.needs_compiling(regions):
        print(COMPILING_NOTICE, file=sys.stderr, flush=True)
        sets.compile_kernels(regions)


class HostArenaBackend(Backend):
    """A backend whose arena is one NumPy byte buffer laid out as the plan's, in host
    memory (cpu, nv-sim): its kernels run on it through `memory`."""

    def __init__(self, plan: Plan | CertifiedPlan):
        super().__init__(plan)
        arena = self.plan.address_map.arena
        # The arena, and working arrays the size of its largest tensor beside it (the
        # reference kernels' largest temporary, a V x V table in a dense plan; the Numba
        # kernels take a row at a time).
        largest = max((tensor.bytes for tensor in self.plan.tensors), default=0)
        require_memory(self.name, "host memory", arena.bytes + largest,
                       host_memory_available())
        self.arena = np.zeros(arena.bytes, dtype=np.uint8)
        self.memory = Memory(self.arena, arena.base)

    def _write_arena(self, offset: int, data: memoryview) -> None:
        self.arena[offset:offset + data.nbytes] = np.frombuffer(data, np.uint8)

    def _read_arena(self, offset: int, size: int) -> bytes:
        return self.arena[offset:offset + size].tobytes()

    def _clear_arena(self, spans: list[tuple[int, int]]) -> None:
        for offset, size in spans:
            self.arena[offset:offset + size] = 0


class CpuBackend(HostArenaBackend):
    name = "cpu"

    def __init__(self, plan: Plan | CertifiedPlan, kernels: Mapping[str, Kernel] | None = None):
        super().__init__(plan)
        plan = self.plan
        if kernels is None:
            self.kernel_set, kernels = default_kernels()
        else:
            self.kernel_set = "given"
        missing = {launch.region for launch in plan.launches} - set(kernels)
        if missing:
            raise KeyError(f"no CPU implementation for regions {sorted(missing)}")
        self.kernels = kernels
        self._arguments = [self._decode(i) for i in range(plan.launch_count)]
        if self.kernel_set == "fast":
            compile_kernels({launch.region for launch in plan.launches})

    def compile_ahead(self, keep_going: Callable[[], bool]) -> None:
        """The Numba kernels every session reaches (predict's, eval's and validation's
        losses), compiled now where they are not yet, each after `keep_going()` (a run
        asked to stop leaves the rest for a later run)."""
        if self.kernel_set == "fast":
            from bob.kernels import sets

            regions = {launch.region for launch in self.plan.launches}
            sets.compile_kernels(sets.session_regions(regions), keep_going)

    def _decode(self, launch_index: int) -> dict[str, int | np.float32]:
        """What launch `launch_index`'s kernel reads from its parameter block."""
        launch = self.plan.launches[launch_index]
        region = self.plan.region(launch.region)
        block = self.parameter_block(launch_index)
        args = kernel_arguments(decode_parameter_block(self.plan.target, region, block))
        # A block-per-row kernel handles the rows of its grid, as on the device (a row
        # shard's loss runs R blocks over an R x V table).
        args["grid.x"] = launch.grid.x
        return args

    def _run(self, submissions: range) -> None:
        for index in submissions:
            for launch_index in self.plan.submissions[index].launches:
                region = self.plan.launches[launch_index].region
                self.kernels[region](self.memory, self._arguments[launch_index])
                self.between_kernels()

    def _carry_scalar_rows(self, launches: list[int], names: tuple[str, ...], dtype: str,
                           words: np.ndarray, offsets: np.ndarray) -> None:
        """The decoded arguments take the new values directly: no Scalar per word."""
        if dtype != "f32":
            super()._carry_scalar_rows(launches, names, dtype, words, offsets)
            return
        for index, row in zip(launches, words.view(np.float32), strict=True):
            self._arguments[index].update(zip(names, row, strict=True))  # np.float32 each

    def _carry_patches(self, launch_index: int, values: dict[str, Scalar],
                       patches: list[Patch]) -> None:
        """The kernel reads its arguments decoded: the patched values replace theirs."""
        self._arguments[launch_index].update(kernel_arguments(values))
