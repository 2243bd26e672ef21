"""Host memory of the read pipeline: landing buffers, the streaming ring, copies out, and
the pipeline's thresholds.

A large read (the checkpoint's tables) copied by the device straight into memory the
caller then owns costs one transfer and no copy on the host. Each backend supplies how
a buffer is made visible to its device (``Backend._register_host``: CUDA's page-locking,
the kernel driver's OS descriptor) and how that is undone; ``bob.backends.base`` decides
when a read lands, goes through a staging copy, or is read at once.

The thresholds are set here once; a backend declares which apply to it
(``Backend.read_queue_min_bytes``, ``landing_min_bytes``, ``snapshot_min_bytes``).
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bob.errors import RunFailure

LANDING_BYTES = 8 << 30  # host memory the landing buffers may take together
LANDING_MIN_BYTES = 64 << 10  # smaller reads are copied out of a staging, not landed
QUEUED_READ_MIN_BYTES = 64 << 10  # a backend that declares it: smaller reads wait and copy
DETACHED_READ_MIN_BYTES = 4 << 20  # a backend that declares it: smaller reads skip the snapshot
LANDING_BUFFERS = 4  # at most: the arena's checkpoint, the caller's, the writer's, the next
PAGE = 4096
PACKING = 256  # each tensor's start in a read packed into one buffer
SPAN_GAP = 64 << 10  # ranges of a read this close in the arena are copied as one
STREAM_CHUNK_BYTES = 64 << 20  # stream_read's default view
STREAM_RING_BUFFERS = 3  # stream_read's host buffers: one at the sink, two being filled
COPY_OUT_CHUNK_BYTES = 32 << 20  # a larger tensor leaves a staging in parallel pieces
COPY_OUT_THREADS = 8


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


def page_aligned(size: int) -> np.ndarray:
    """`size` bytes of fresh host memory starting at a page boundary."""
    raw = np.empty(size + PAGE, np.uint8)
    skip = -raw.ctypes.data % PAGE
    return raw[skip:skip + size]


def copy_out(address: int, size: int, pool: ThreadPoolExecutor | None = None,
             chunk: int = COPY_OUT_CHUNK_BYTES) -> np.ndarray:
    """`size` bytes of host memory at `address` in a new array of their own.

    With a pool, a large copy goes in `chunk`-byte pieces on its threads: NumPy's copy
    releases the GIL, and the new array's first-touch page faults spread over cores.
    """
    out = np.empty(size, dtype=np.uint8)
    if not size:
        return out
    source = np.frombuffer((ctypes.c_char * size).from_address(address), np.uint8)
    if pool is None or size <= chunk:
        np.copyto(out, source)
        return out
    pieces = [pool.submit(np.copyto, out[start:start + chunk], source[start:start + chunk])
              for start in range(0, size, chunk)]
    for piece in pieces:
        piece.result()
    return out


class Landing:
    """Host buffers the device can write (page-locked, or described to the driver) that
    reads land in and are handed out as, with no copy.

    A buffer is reused once no array of its read is alive any more (a finalizer on the
    object every such array refers to gives it back); while all are in use, or when a
    read is too large for two of them, reads take the backend's fallback.
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
        buffer = page_aligned(self.size)
        self._register(buffer.ctypes.data, self.size)
        self._made.append(buffer)
        return buffer

    def hand_out(self, buffer: np.ndarray) -> np.ndarray:
        """`buffer` as an array whose last user, when gone, gives the buffer back."""
        holder = (ctypes.c_char * self.size).from_buffer(buffer)
        weakref.finalize(holder, self.give_back, buffer)
        return np.frombuffer(holder, np.uint8)

    def give_back(self, buffer: np.ndarray) -> None:
        """`buffer` free again (its last array is gone, or it was taken and not used)."""
        if not self._closed:
            self._free.append(buffer)

    def close(self) -> None:
        """Unregister every buffer (in use or not); the first error is raised."""
        self._closed = True
        made, self._made, self._free = self._made, [], []
        _unregister_all(made, self._unregister)


class HostRing:
    """`count` registered host buffers of `size` bytes that a streamed read cycles
    through: the host memory a stream holds, whatever the tensors' size."""

    def __init__(self, size: int, count: int, register: Callable[[int, int], None],
                 unregister: Callable[[int], None]):
        self.size = size
        self._unregister = unregister
        self.buffers: list[np.ndarray] = []
        try:
            for _ in range(count):
                buffer = page_aligned(size)
                register(buffer.ctypes.data, size)
                self.buffers.append(buffer)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Unregister every buffer; the first error is raised."""
        made, self.buffers = self.buffers, []
        _unregister_all(made, self._unregister)


def _unregister_all(buffers: list[np.ndarray], unregister: Callable[[int], None]) -> None:
    errors = []
    for buffer in buffers:
        try:
            unregister(buffer.ctypes.data)
        except RunFailure as error:
            errors.append(error)
    if errors:
        raise errors[0]
