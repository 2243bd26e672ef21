"""A view of the arena as the kernels see it: virtual addresses over one buffer."""

from __future__ import annotations

import numpy as np

from bob.errors import RunFailure

_DTYPES = {"f32": np.float32, "u32": np.uint32, "u64": np.uint64, "u8": np.uint8}


class Memory:
    """Maps the plan's arena addresses onto a NumPy byte buffer."""

    def __init__(self, buffer: np.ndarray, base: int):
        if buffer.dtype != np.uint8 or buffer.ndim != 1:
            raise TypeError("the arena buffer must be a flat uint8 array")
        self.buffer = buffer
        self.base = base

    def array(self, address: int, dtype: str, count: int) -> np.ndarray:
        """A writable view of `count` elements of `dtype` at `address`."""
        size = np.dtype(_DTYPES[dtype]).itemsize
        offset = address - self.base
        if offset < 0 or offset + count * size > self.buffer.size:
            raise RunFailure(  # a certified plan never reaches outside
                f"{count} x {dtype} at 0x{address:x} is outside the arena "
                f"[0x{self.base:x}, 0x{self.base + self.buffer.size:x})"
            )
        return self.buffer[offset:offset + count * size].view(_DTYPES[dtype])
