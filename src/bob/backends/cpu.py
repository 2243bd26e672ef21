"""The CPU backend: the oracle every other backend is compared with.

One NumPy byte buffer laid out exactly as the plan's arena. Each launch
decodes its own parameter block (the bytes a GPU would read from constant
bank 0) and runs its kernel's reference implementation on the arena.
"""

from __future__ import annotations

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


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self, plan: Plan, kernels: Mapping[str, Kernel] | None = None):
        super().__init__(plan)
        if kernels is None:
            from bob.kernels.reference import KERNELS as kernels
        missing = {launch.region for launch in plan.launches} - set(kernels)
        if missing:
            raise KeyError(f"no CPU implementation for regions {sorted(missing)}")
        self.kernels = kernels
        self.arena = np.zeros(plan.arena_bytes, dtype=np.uint8)
        self.memory = Memory(self.arena, plan.address_map.arena.base)
        self.blocks = [self.parameter_block(i) for i in range(plan.launch_count)]

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
        target = self.plan.target
        for index in submissions:
            submission = self.plan.submissions[index]
            for launch_index in submission.launches:
                region = self.plan.region(self.launches[launch_index].region)
                decoded = decode_parameter_block(target, region, self.blocks[launch_index])
                self.kernels[region.name](self.memory, kernel_arguments(decoded))
            self.last_semaphore = submission.semaphore

    def _parameter_block_changed(self, launch_index: int) -> None:
        self.blocks[launch_index] = self.parameter_block(launch_index)
