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
from collections.abc import Callable, Mapping

import numpy as np

from bob.kernels.memory import Memory
from bob.plan.model import Address, Plan, Scalar
from bob.plan.placement import decode_parameter_block

from .base import Backend

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
            from bob.kernels.fast import KERNELS as fast
        except ImportError:  # numba is an optional dependency
            pass
        else:
            return "fast", fast
    from bob.kernels.reference import KERNELS as reference

    return "reference", reference


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self, plan: Plan, kernels: Mapping[str, Kernel] | None = None):
        super().__init__(plan)
        if kernels is None:
            self.kernel_set, kernels = default_kernels()
        else:
            self.kernel_set = "given"
        missing = {launch.region for launch in plan.launches} - set(kernels)
        if missing:
            raise KeyError(f"no CPU implementation for regions {sorted(missing)}")
        self.kernels = kernels
        self.arena = np.zeros(plan.arena_bytes, dtype=np.uint8)
        self.memory = Memory(self.arena, plan.address_map.arena.base)
        self.blocks = [self.parameter_block(i) for i in range(plan.launch_count)]
        self._arguments = [self._decode(i) for i in range(plan.launch_count)]

    def _decode(self, launch_index: int) -> dict[str, int | np.float32]:
        """What launch `launch_index`'s kernel reads from its parameter block."""
        region = self.plan.region(self.launches[launch_index].region)
        decoded = decode_parameter_block(self.plan.target, region, self.blocks[launch_index])
        return kernel_arguments(decoded)

    def _tensor_slice(self, name: str, offset: int, size: int) -> slice:
        tensor = self.plan.tensor(name)
        if offset < 0 or offset + size > tensor.bytes:
            raise ValueError(
                f"{size} bytes at offset {offset} do not fit tensor {name!r} ({tensor.bytes} bytes)"
            )
        start = tensor.address - self.plan.address_map.arena.base + offset
        return slice(start, start + size)

    def write_tensor(self, name: str, data: bytes, offset: int = 0) -> None:
        self.arena[self._tensor_slice(name, offset, len(data))] = np.frombuffer(data, np.uint8)

    def read_tensor(self, name: str) -> bytes:
        return self.arena[self._tensor_slice(name, 0, self.plan.tensor(name).bytes)].tobytes()

    def run(self, submissions: range) -> None:
        for index in submissions:
            submission = self.plan.submissions[index]
            for launch_index in submission.launches:
                region = self.launches[launch_index].region
                self.kernels[region](self.memory, self._arguments[launch_index])
            self.last_semaphore = submission.semaphore

    def _scalars_patched(self, launch_index: int, values: dict[str, Scalar],
                         patches: list[tuple[int, bytes]]) -> None:
        self.blocks[launch_index] = self.parameter_block(launch_index)
        self._arguments[launch_index].update(kernel_arguments(values))

    def _parameter_block_changed(self, launch_index: int) -> None:
        self.blocks[launch_index] = self.parameter_block(launch_index)
        self._arguments[launch_index] = self._decode(launch_index)
