"""The cuda backend's host-device transfers: pinned chunks, small-write slots, and its own
part of the read pipeline (a copy stream beside the graph's, the device snapshot, the
pinned staging).

Writes to a device arena go through pinned host memory allocated once
(``cuMemHostAlloc``) and copied with ``cuMemcpyHtoDAsync`` on the graph's stream: a write
of up to SMALL_WRITE_BYTES takes the next of a ring of small slots (a slot's last copy
was queued writes ago, so the host does not wait for the graph still running), a larger
one goes through two large chunks, one filled while the other's copy runs. Reads cross
on a second, non-blocking stream (`ReadPath`), so they run beside the next graph: from
the device snapshot, which the graph's stream fills in its order, or from the arena
itself, in which case the graph's stream waits for the copy.
"""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import driver
from .driver import CudaError

UPLOAD_CHUNK_BYTES = 16 << 20  # each of the two pinned chunks a large write goes through
SMALL_WRITE_BYTES = 1 << 20  # writes up to this size take a small-write slot
SMALL_WRITE_SLOTS = 8
COPY_OUT_EVENTS = 8  # copies out in flight whose completions are told apart


@dataclass(frozen=True)
class PinnedChunk:
    host: int  # pinned host memory: UPLOAD_CHUNK_BYTES, or SMALL_WRITE_BYTES for a slot
    copied: Any  # CUevent recorded after this chunk's last copy was queued


def disabled_timing() -> int:
    return int(driver.bindings().CUevent_flags.CU_EVENT_DISABLE_TIMING)


def pinned(sizes: tuple[int, ...]) -> list[PinnedChunk]:
    """Pinned chunks of these sizes, each with its event: all made, or none kept."""
    flags = disabled_timing()
    made: list[PinnedChunk] = []
    try:
        for size in sizes:
            host = int(driver.call("cuMemHostAlloc", size, 0))
            try:
                made.append(PinnedChunk(host, driver.call("cuEventCreate", flags)))
            except BaseException:
                driver.call("cuMemFreeHost", host)
                raise
    except BaseException:
        for chunk in made:  # the first error is the one to report
            with contextlib.suppress(CudaError):
                driver.call("cuEventDestroy", chunk.copied)
                driver.call("cuMemFreeHost", chunk.host)
        raise
    return made


def upload(chunk: PinnedChunk, pieces: list[tuple[int, int, int]], stream: Any) -> None:
    """Each (device address, host address, bytes) piece to the device through `chunk`, one
    after another in it (its own last copy waited for first)."""
    driver.call("cuEventSynchronize", chunk.copied)  # an event never recorded is complete
    position = chunk.host
    for destination, source, count in pieces:
        ctypes.memmove(position, source, count)
        driver.call("cuMemcpyHtoDAsync", destination, position, count, stream)
        position += count
    driver.call("cuEventRecord", chunk.copied, stream)


@dataclass
class ReadPath:
    """What reads cross to the host through: the copy stream (non-blocking, beside the
    graph's), its events, the device snapshot and the pinned staging, each made when
    first needed and kept, grown when a larger read asks.

    Where the device has no room for a snapshot beside the arena, reads copy from the
    arena itself and the graph's stream waits for them (`copied`); a size refused once
    is not asked for again, nor any larger.
    """

    stream: Any = None  # CUstream
    snapped: Any = None  # CUevent on the graph's stream: what a copy out waits for
    copied: Any = None  # CUevent on the copy stream: what the graph's stream waits for
    done: list[Any] = field(default_factory=list)  # CUevents, a ring: each copy's completion
    next_done: int = 0
    snapshot: int = 0  # device memory
    snapshot_bytes: int = 0
    no_room: int = 0  # the snapshot size cuMemAlloc refused (out of memory)
    staging: np.ndarray | None = None  # pinned host memory, as bytes
    snapshot_read: Any = None  # the completion event of the last copy out of the snapshot

    def open(self) -> None:
        """The copy stream and its events (once)."""
        if self.stream is not None:
            return
        flags = disabled_timing()
        api = driver.bindings()
        made = ReadPath()
        try:
            made.stream = driver.call("cuStreamCreate",
                                      int(api.CUstream_flags.CU_STREAM_NON_BLOCKING))
            made.snapped = driver.call("cuEventCreate", flags)
            made.copied = driver.call("cuEventCreate", flags)
            for _ in range(COPY_OUT_EVENTS):
                made.done.append(driver.call("cuEventCreate", flags))
        except BaseException:
            with contextlib.suppress(CudaError):  # the first error is the one to report
                made.free()
            raise
        self.stream, self.snapped, self.copied, self.done = \
            made.stream, made.snapped, made.copied, made.done

    def next_event(self) -> Any:
        event = self.done[self.next_done]
        self.next_done = (self.next_done + 1) % len(self.done)
        return event

    def room(self, size: int) -> bool:
        """Whether the snapshot holds `size` bytes: made, or made larger, now (once no copy
        out of the old one runs); False where the device has no room for it."""
        if self.snapshot_bytes >= size:
            return True
        if self.no_room and size >= self.no_room:
            return False
        if self.snapshot:
            driver.call("cuStreamSynchronize", self.stream)
            self.snapshot_read = None
            snapshot, self.snapshot, self.snapshot_bytes = self.snapshot, 0, 0
            driver.call("cuMemFree", snapshot)
        try:
            self.snapshot = int(driver.call("cuMemAlloc", size))
        except CudaError as error:
            if error.status != "CUDA_ERROR_OUT_OF_MEMORY":
                raise
            self.no_room = size  # no room beside the arena: reads copy from it, in order
            return False
        self.snapshot_bytes = size
        return True

    def staging_for(self, size: int) -> np.ndarray:
        """At least `size` bytes of pinned host memory (the caller settled its last read)."""
        if self.staging is None or self.staging.size < size:
            if self.staging is not None:
                driver.call("cuStreamSynchronize", self.stream)
                staging, self.staging = self.staging, None
                driver.call("cuMemFreeHost", staging.ctypes.data)
            host = int(driver.call("cuMemHostAlloc", max(1, size), 0))
            self.staging = np.frombuffer((ctypes.c_char * max(1, size)).from_address(host),
                                         np.uint8)
        return self.staging

    def free(self) -> list[CudaError]:
        """Free all of it, whatever fails (the copy stream synchronized first); the errors."""
        calls = [("cuStreamSynchronize", self.stream), ("cuEventDestroy", self.snapped),
                 ("cuEventDestroy", self.copied),
                 *(("cuEventDestroy", event) for event in self.done),
                 ("cuStreamDestroy", self.stream),
                 ("cuMemFreeHost", 0 if self.staging is None else self.staging.ctypes.data),
                 ("cuMemFree", self.snapshot)]
        self.stream = self.snapped = self.copied = self.staging = self.snapshot_read = None
        self.done, self.snapshot, self.snapshot_bytes = [], 0, 0
        errors = []
        for name, handle in calls:
            if handle is None or (isinstance(handle, int) and handle == 0):
                continue  # never made (pointers are ints, streams and events objects)
            try:
                driver.call(name, handle)
            except CudaError as error:
                errors.append(error)
        return errors
