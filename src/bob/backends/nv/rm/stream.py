"""Bob's own work on the plan's channel: copy-engine transfers and launch timestamps.

The plan's command stream is fixed bytes (``encoder.encode``); what the runtime
adds goes in a second, runtime-owned area of uncached system memory mapped
below every plan::

    RUNTIME_VA_BASE + 1 MiB   runtime block: pushbuffer segments, then the counter slot
    RUNTIME_VA_BASE + 256 MiB staging: process memory pinned for copy-engine transfers
    RUNTIME_VA_BASE + 512 MiB profile: timestamp structures and their segments

Copies run on the channel's copy engine: HOPPER_DMA_COPY_A is allocated on the
same channel and bound on subchannel 4 (``pushbuffer.CopyWriter``), so a copy
is ordered after every launch the channel ran before it. A batch of copies
ends with a 64-bit semaphore release of the runtime counter; the CPU waits
for the counter's value, compared as a 64-bit integer, so it never wraps
(``start`` lets a test begin just below 2**32 and run across it).

Timestamps: a host semaphore release with RELEASE_WFI and RELEASE_TIMESTAMP
writes (payload, GPU nanoseconds) when everything before it is idle. Profiling
brackets every submission of a per-launch plan with two of them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from bob.backends.nv.pushbuffer import (
    HOPPER_CHANNEL_GPFIFO_A,
    HOPPER_COMPUTE_A,
    TIMESTAMP_RELEASE_BYTES,
    WORD_BYTES,
    CommandWriter,
    CopyWriter,
    Pushbuffer,
    gpfifo_entry,
)
from bob.errors import RunFailure

from . import structs as s
from .channel import RUNTIME_VA_BASE, Channel
from .device import RmDevice
from .ioctl import RmError
from .memory import SYSMEM_GRANULE, Allocation, allocate, host_allocation, round_up

RUNTIME_BLOCK_VA = RUNTIME_VA_BASE + (1 << 20)
STAGING_VA = RUNTIME_VA_BASE + (256 << 20)
PROFILE_VA = RUNTIME_VA_BASE + (512 << 20)
RUNTIME_PUSHBUFFER_BYTES = 60 << 10
COUNTER_OFFSET = RUNTIME_PUSHBUFFER_BYTES  # the 64-bit runtime counter, after the segments
RUNTIME_BLOCK_BYTES = 64 << 10
STAGING_BYTES = 32 << 20  # pinned once per backend; larger transfers go in chunks
COPY_THRESHOLD = 1 << 20  # smaller reads and writes stay CPU accesses through the mapping
COPY_PIECE_BYTES = 1 << 30  # one copy line at most (the line length is a 32-bit field)
PROFILE_LIMIT = 100_000  # launches timed per fill of the profile buffer
SEGMENT_STRIDE = 32  # one timestamped release is 6 words
PROFILE_SEGMENTS = 2 * PROFILE_LIMIT * TIMESTAMP_RELEASE_BYTES  # segments after the structures
PROFILE_BYTES = round_up(PROFILE_SEGMENTS + 2 * PROFILE_LIMIT * SEGMENT_STRIDE, SYSMEM_GRANULE)

Wait = Callable[[Callable[[], int], int, str], None]


@dataclass(frozen=True)
class Stamp:
    """One timestamped release as the GPU wrote it."""

    payload: int
    nanoseconds: int


def read_stamps(data: bytes) -> list[Stamp]:
    """The 16-byte (payload, timestamp) structures of a profile buffer."""
    return [Stamp(*struct.unpack_from("<QQ", data, offset))
            for offset in range(0, len(data) - len(data) % TIMESTAMP_RELEASE_BYTES,
                                TIMESTAMP_RELEASE_BYTES)]


def launch_nanoseconds(stamps: list[Stamp], first: int) -> list[int]:
    """Each launch's device time from its (before, after) pair of stamps.

    The payloads must be `first`, `first + 1`, ... in order: a pair the GPU did
    not write (or wrote out of order) is an error, not a time.
    """
    if len(stamps) % 2:
        raise RunFailure(f"{len(stamps)} timestamps do not pair up")
    times = []
    for index in range(0, len(stamps), 2):
        before, after = stamps[index], stamps[index + 1]
        if (before.payload, after.payload) != (first + index, first + index + 1):
            raise RunFailure(f"launch {index // 2}'s timestamps carry {before.payload}, "
                             f"{after.payload}, not {first + index}, {first + index + 1}")
        if after.nanoseconds < before.nanoseconds:
            raise RunFailure(f"launch {index // 2} ended at {after.nanoseconds} ns, before it "
                             f"began at {before.nanoseconds} ns")
        times.append(after.nanoseconds - before.nanoseconds)
    return times


def timestamp_segment(address: int, slot_address: int, payload: int) -> bytes:
    """The pushbuffer words of one timestamped release (for a GPFIFO entry of its own)."""
    pushbuffer = Pushbuffer(address, address + 64)
    CommandWriter(pushbuffer, HOPPER_COMPUTE_A, HOPPER_CHANNEL_GPFIFO_A).release_semaphore(
        slot_address, payload, timestamp=True)
    return pushbuffer.to_bytes()


def copy_segment(address: int, pieces: list[tuple[int, int, int]], semaphore: int,
                 payload: int, *, bind: bool = False) -> bytes:
    """Copies (source, destination, size), the last releasing `payload` at `semaphore`."""
    pushbuffer = Pushbuffer(address, address + RUNTIME_PUSHBUFFER_BYTES)
    writer = CopyWriter(pushbuffer)
    if bind:
        writer.bind()
    for index, (source, destination, size) in enumerate(pieces):
        last = index == len(pieces) - 1
        writer.copy(source, destination, size, release=(semaphore, payload) if last else None)
    return pushbuffer.to_bytes()


class RuntimeStream:
    """The copy engine object, the runtime block and the staging buffer of one channel."""

    def __init__(self, device: RmDevice, channel: Channel, wait: Wait, *, start: int = 0):
        self.device = device
        self.channel = channel
        self._wait = wait
        self.counter = start
        self.block = allocate(device, RUNTIME_BLOCK_BYTES, location="sysmem",
                              gpu_va=RUNTIME_BLOCK_VA, name="runtime block")
        self.staging: Allocation | None = None
        self.profile_buffer: Allocation | None = None
        self.copy_object = 0
        self.copy_refused = ""  # why large transfers stay CPU accesses, when they do
        self.staging_note = "process memory described to the driver"
        self._counter = self.block.u64(COUNTER_OFFSET)
        self._counter.value = start
        if s.HOPPER_DMA_COPY_A not in device.classes:
            self.copy_refused = "this GPU lists no HOPPER_DMA_COPY_A"
            return
        try:
            self.copy_object = device.client.alloc(channel.handle, s.HOPPER_DMA_COPY_A)
            self.staging = self._staging_memory(device)
        except RmError as error:
            self.copy_refused = f"the copy engine is not available: {error}"
        self._bound = False  # the first batch of copies binds the class on its subchannel

    def _staging_memory(self, device: RmDevice) -> Allocation:
        """Memory of Bob's own described to the driver (the CPU reads it at memory speed),
        or, where the driver refuses that, RM's cached system memory."""
        try:
            return host_allocation(device, STAGING_BYTES, gpu_va=STAGING_VA, name="copy staging")
        except RmError as error:
            self.staging_note = f"RM system memory (an OS descriptor was refused: {error})"
            return allocate(device, STAGING_BYTES, location="sysmem", gpu_va=STAGING_VA,
                            cached=True, name="copy staging")

    @property
    def copies(self) -> bool:
        return self.staging is not None

    @property
    def completed(self) -> int:
        """The runtime counter's 64-bit value as the GPU last released it."""
        return self._counter.value

    # -- copies -------------------------------------------------------------------------
    def _submit_copies(self, pieces: list[tuple[int, int, int]]) -> None:
        self.counter += 1
        target = self.counter
        semaphore = RUNTIME_BLOCK_VA + COUNTER_OFFSET
        data = copy_segment(RUNTIME_BLOCK_VA, pieces, semaphore, target, bind=not self._bound)
        self._bound = True
        self.block.write(0, data)
        self.channel.submit([gpfifo_entry(HOPPER_CHANNEL_GPFIFO_A, RUNTIME_BLOCK_VA,
                                          len(data) // WORD_BYTES)])
        self._wait(lambda: self.completed, target, f"copy-engine batch {target}")

    def copy_pieces(self, pieces: list[tuple[int, int, int]]) -> None:
        """Copy (source, destination, bytes) pieces between GPU addresses (memory of either
        side), each at most COPY_PIECE_BYTES, in one batch."""
        if any(not 0 < size <= COPY_PIECE_BYTES for *_, size in pieces):
            raise ValueError(f"a copy piece is 1 to {COPY_PIECE_BYTES} bytes")
        if pieces:
            self._submit_copies(pieces)

    def read(self, source: int, size: int) -> bytes:
        """`size` bytes from GPU address `source`: copied into staging, chunk by chunk."""
        assert self.staging is not None and self.staging.cpu is not None
        out = bytearray(size)
        staged = memoryview(self.staging.cpu)
        try:
            for done in range(0, size, STAGING_BYTES):
                chunk = min(STAGING_BYTES, size - done)
                self._submit_copies([(source + done, STAGING_VA, chunk)])
                out[done:done + chunk] = staged[:chunk]
        finally:
            staged.release()
        return bytes(out)

    def write(self, destination: int, data: memoryview) -> None:
        """`data` to GPU address `destination`: through staging, chunk by chunk."""
        assert self.staging is not None
        for done in range(0, len(data), STAGING_BYTES):
            chunk = data[done:done + STAGING_BYTES]
            self.staging.write(0, chunk)
            self._submit_copies([(STAGING_VA, destination + done, len(chunk))])

    # -- timestamps ---------------------------------------------------------------------
    def profile(self, entries: list[bytes]) -> list[int]:
        """Run each GPFIFO entry between two timestamped releases; its device nanoseconds.

        Every bracket's releases wait for idle (RELEASE_WFI), so a launch's time is
        from the channel being idle before it to being idle after it.
        """
        times: list[int] = []
        for start in range(0, len(entries), PROFILE_LIMIT):  # the buffer holds this many
            times += self._profile_chunk(entries[start:start + PROFILE_LIMIT])
        return times

    def _profile_chunk(self, entries: list[bytes]) -> list[int]:
        if self.profile_buffer is None:  # once per backend, the first time it profiles
            self.profile_buffer = allocate(self.device, PROFILE_BYTES, location="sysmem",
                                           gpu_va=PROFILE_VA, name="profile")
        buffer = self.profile_buffer
        stamps = 2 * len(entries)
        first = self.counter + 1
        self.counter += stamps
        buffer.write(0, bytes(stamps * TIMESTAMP_RELEASE_BYTES))
        ring: list[bytes] = []
        for stamp in range(stamps):
            offset = PROFILE_SEGMENTS + stamp * SEGMENT_STRIDE
            data = timestamp_segment(PROFILE_VA + offset,
                                     PROFILE_VA + stamp * TIMESTAMP_RELEASE_BYTES, first + stamp)
            buffer.write(offset, data)
            ring.append(gpfifo_entry(HOPPER_CHANNEL_GPFIFO_A, PROFILE_VA + offset,
                                     len(data) // WORD_BYTES))
        room = max(1, (self.channel.entries // 2) // 3)  # three entries a launch
        for start in range(0, len(entries), room):
            batch = range(start, min(start + room, len(entries)))
            self.channel.submit([item for i in batch
                                 for item in (ring[2 * i], entries[i], ring[2 * i + 1])])
            last = 2 * batch[-1] + 1
            offset = last * TIMESTAMP_RELEASE_BYTES
            self._wait(lambda offset=offset: struct.unpack("<Q", buffer.read(offset, 8))[0],
                       first + last, f"the timestamp after launch {batch[-1]}")
        found = read_stamps(buffer.read(0, stamps * TIMESTAMP_RELEASE_BYTES))
        return launch_nanoseconds(found, first)

    def close(self) -> None:
        del self._counter
        for block in (self.staging, self.profile_buffer):
            if block is not None:
                block.close()
        self.staging = self.profile_buffer = None
        self.block.close()


__all__ = ["COPY_THRESHOLD", "RuntimeStream", "Stamp", "copy_segment", "launch_nanoseconds",
           "read_stamps", "timestamp_segment"]
