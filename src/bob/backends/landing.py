"""Landing buffers: host memory a backend's read-back lands in and is handed out as.

A large read (the checkpoint's tables) copied by the device straight into memory the
caller then owns costs one transfer and no copy on the host. Each backend supplies how
a buffer is made visible to its device (``register``: CUDA's page-locking, the kernel
driver's OS descriptor) and how that is undone.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable

import numpy as np

from bob.errors import RunFailure

LANDING_BYTES = 8 << 30  # page-locked memory the landing buffers may take together
# Smaller reads are copied out of the staging (a few microseconds). Larger ones land: at
# V = 256 an invocation's read is 0.8 MB, whose copy out cost 80 us of an H200 host's
# Python, against a 0.47 ms device program.
LANDING_MIN_BYTES = 64 << 10
LANDING_BUFFERS = 4  # at most: the arena's checkpoint, the caller's, the writer's, the next
PAGE = 4096
PACKING = 256  # each tensor's start in a read packed into one buffer
SPAN_GAP = 64 << 10  # ranges of a read this close in the arena are copied as one


def packed(sizes: list[int]) -> tuple[list[int], int]:
    """Where each of tensors of these sizes starts when one read packs them into one
    buffer (each at a PACKING boundary), and the bytes the buffer needs."""
    positions, end = [], 0
    for size in sizes:
        positions.append(end)
        end += -(-size // PACKING) * PACKING
    return positions, end


def read_spans(ranges: list[tuple[int, int]], gap: int = SPAN_GAP,
               ) -> tuple[list[tuple[int, int, int]], list[int], int]:
    """A read of these (offset, bytes) ranges of the arena as few copies: in offset order,
    a range starting within `gap` bytes of the current span's end joins it (the bytes
    between are copied too). Returns the spans (arena offset, bytes, position in the
    buffer, packed as `packed` packs tensors), each range's position in the buffer, and
    the buffer's bytes. An empty range reads nothing (position 0)."""
    spans: list[list[int]] = []  # [start, stop) in the arena
    for offset, size in sorted(r for r in ranges if r[1]):
        if spans and offset <= spans[-1][1] + gap:
            spans[-1][1] = max(spans[-1][1], offset + size)
        else:
            spans.append([offset, offset + size])
    starts, end = packed([stop - start for start, stop in spans])
    positions = []
    for offset, size in ranges:
        at = 0
        for (start, stop), start_at in zip(spans, starts, strict=True):
            if size and start <= offset and offset + size <= stop:
                at = start_at + offset - start
                break
        positions.append(at)
    return ([(start, stop - start, at) for (start, stop), at in zip(spans, starts, strict=True)],
            positions, end)


class Landing:
    """Host buffers the device can write (page-locked, or described to the driver) that
    reads land in and are handed out as, with no copy.

    A buffer is reused once no array of its read is alive any more (a finalizer on the
    object every such array refers to gives it back); while all are in use, or when a
    read is too large for two of them, reads go through the staging and are copied out.
    Closing unregisters every buffer: arrays still alive stay valid, as ordinary memory.
    """

    def __init__(self, size: int, register: Callable[[int, int], None],
                 unregister: Callable[[int], None], *, minimum: int = LANDING_MIN_BYTES):
        self.size = size
        self.minimum = minimum  # smaller reads are not worth a buffer of their own
        self.limit = min(LANDING_BUFFERS, LANDING_BYTES // max(1, size))
        self._register, self._unregister = register, unregister
        self._free: list[np.ndarray] = []
        self._made: list[np.ndarray] = []
        self._closed = False

    @property
    def usable(self) -> bool:
        return self.size >= self.minimum and self.limit >= 2 and not self._closed

    def take(self) -> np.ndarray | None:
        """A free buffer of `size` bytes (page-aligned, registered), or None."""
        if not self.usable:
            return None
        if self._free:
            return self._free.pop()
        if len(self._made) >= self.limit:
            return None
        raw = np.empty(self.size + PAGE, np.uint8)
        skip = -raw.ctypes.data % PAGE
        buffer = raw[skip:skip + self.size]
        self._register(buffer.ctypes.data, self.size)
        self._made.append(buffer)
        return buffer

    def hand_out(self, buffer: np.ndarray) -> np.ndarray:
        """`buffer` as an array whose last user, when gone, gives the buffer back."""
        holder = (ctypes.c_char * self.size).from_buffer(buffer)
        weakref.finalize(holder, self._give_back, buffer)
        return np.frombuffer(holder, np.uint8)

    def _give_back(self, buffer: np.ndarray) -> None:
        if not self._closed:
            self._free.append(buffer)

    def close(self) -> None:
        """Unregister every buffer (in use or not); the first error is raised."""
        self._closed = True
        made, self._made, self._free = self._made, [], []
        errors = []
        for buffer in made:
            try:
                self._unregister(buffer.ctypes.data)
            except RunFailure as error:
                errors.append(error)
        if errors:
            raise errors[0]
