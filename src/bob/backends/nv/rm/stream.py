"""Bob's own work on the plan's channel: copy-engine transfers, runs queued behind
one another, and launch timestamps.

The plan's command stream is fixed bytes (``encoder.encode``); what the runtime
adds goes in the runtime's own window below every plan (``addresses.py``): the
runtime block (a ring of pushbuffer segments, then the counters), the copy
channel's ring, the write slots, the staging and the profile buffer.

The runtime stream is a queue, as a CUDA stream is: every item (a batch of copies,
a staged write, a run of the plan's submissions) is a segment that begins by
acquiring the runtime counter's previous value (the channel holds there until the
item before is done) and ends by releasing the next value: the copy engine's
semaphore after a batch of copies, a host release with wait-for-idle after a run.
So items execute in the order they were queued whatever engine runs them, and the
host waits for any item by its counter value, compared as a 64-bit integer, so it
never wraps (``start`` lets a test begin just below 2**32 and run across it). A
segment, and a write slot, is written again only once the counter shows the GPU
is past the item that used it.

Copies run on the channel's copy engine: HOPPER_DMA_COPY_A is allocated on the
same channel and bound on subchannel 4 (``pushbuffer.CopyWriter``).

A large read need not hold the queue while it crosses to the host: a *detached*
read is an item of the queue that copies the tensors into a snapshot in video
memory with Bob's copy kernels (``queue_snapshot``, rm/snapshot.py: they copy at
memory bandwidth, the copy engine does not), and then copies of the snapshot to
the host on a second channel, the copy channel, whose channel group is a copy
engine's, so that they run beside the compute channel (``queue_copy_out``; a
second channel in the compute channel's group runs after it). Each copy out
waits for the snapshot's counter value and releases a second counter, the reads
counter; no item waits for it except the next snapshot, which overwrites what
they copy.

A clear (``queue_zeros``) is copies from a write slot of zeros, staged once, to
every piece of the ranges: the copy engine class Bob's headers describe has no
fill of its own.

Timestamps: a host semaphore release with RELEASE_WFI and RELEASE_TIMESTAMP
writes (payload, GPU nanoseconds) when everything before it is idle. Profiling
brackets every submission of a per-launch plan with two of them.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass

from bob.backends.nv.pushbuffer import (
    HOPPER_CHANNEL_GPFIFO_A,
    HOPPER_COMPUTE_A,
    SEMAPHORE_BITS,
    TIMESTAMP_RELEASE_BYTES,
    WORD_BYTES,
    CommandError,
    CommandWriter,
    CopyWriter,
    Pushbuffer,
    gpfifo_entry,
    words_to_bytes,
)
from bob.errors import RunFailure

from . import structs as s
from .addresses import COPY_RING_VA, PROFILE_VA, RUNTIME_BLOCK_VA, STAGING_VA, WRITES_VA
from .channel import Channel, copy_channel
from .device import RmDevice
from .ioctl import RmError
from .memory import SYSMEM_GRANULE, Allocation, allocate, host_allocation, round_up
from .snapshot import MAX_COPIES, Copy, SnapshotKernels

SEGMENT_BYTES = 4 << 10  # one queued item's commands
SEGMENTS = 63  # in flight at most; the ring's last page holds the counter
COUNTER_OFFSET = SEGMENTS * SEGMENT_BYTES  # the 64-bit runtime counter, after the segments
RUNTIME_BLOCK_BYTES = COUNTER_OFFSET + SEGMENT_BYTES
PIECES_PER_SEGMENT = 64  # copies of one segment (14 words each at most)
STAGING_BYTES = 32 << 20  # pinned once per backend; larger transfers go in chunks
WRITE_SLOT_BYTES = 1 << 20  # a write queued behind running work: staged in a slot
WRITE_SLOTS = 8
COPY_THRESHOLD = 1 << 20  # smaller reads and writes stay CPU accesses through the mapping
COPY_PIECE_BYTES = 1 << 30  # one copy line at most (the line length is a 32-bit field)
PROFILE_LIMIT = 100_000  # launches timed per fill of the profile buffer
SEGMENT_STRIDE = 32  # one timestamped release is 6 words
PROFILE_SEGMENTS = 2 * PROFILE_LIMIT * TIMESTAMP_RELEASE_BYTES  # segments after the structures
PROFILE_BYTES = round_up(PROFILE_SEGMENTS + 2 * PROFILE_LIMIT * SEGMENT_STRIDE, SYSMEM_GRANULE)
COUNTER_ADDRESS = RUNTIME_BLOCK_VA + COUNTER_OFFSET
READS_OFFSET = COUNTER_OFFSET + 16  # the detached reads' 64-bit counter
READS_ADDRESS = RUNTIME_BLOCK_VA + READS_OFFSET

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


def _commands(pushbuffer: Pushbuffer) -> CommandWriter:
    return CommandWriter(pushbuffer, HOPPER_COMPUTE_A, HOPPER_CHANNEL_GPFIFO_A)


def copy_segment(address: int, pieces: list[tuple[int, int, int]], after: int, payload: int,
                 *, bind: bool = False, release_to: int = COUNTER_ADDRESS) -> bytes:
    """Once the counter reaches `after`: copies (source, destination, size), the last
    releasing `payload` into the counter at `release_to` (the runtime counter, or for a
    detached read's copy out on the copy channel, the reads counter).

    Encoded once per pieces by the builders (`encode_copy_segment`), then only the two
    values written: the runtime stream queues the same copies again and again."""
    words = list(_copy_template(tuple(pieces), bind, release_to))
    words[ACQUIRE_VALUE] = _value_words(after)
    words[-4:-2] = _value_words(payload)  # SET_SEMAPHORE_PAYLOAD(_UPPER), then LAUNCH_DMA
    return words_to_bytes(words)


def encode_copy_segment(address: int, pieces: list[tuple[int, int, int]], after: int,
                        payload: int, *, bind: bool = False,
                        release_to: int = COUNTER_ADDRESS) -> bytes:
    """`copy_segment`'s words, written by the builders."""
    pushbuffer = Pushbuffer(address, address + SEGMENT_BYTES)
    _commands(pushbuffer).acquire_semaphore(COUNTER_ADDRESS, after)
    writer = CopyWriter(pushbuffer)
    if bind:
        writer.bind()
    for index, (source, destination, size) in enumerate(pieces):
        last = index == len(pieces) - 1
        writer.copy(source, destination, size, release=(release_to, payload) if last else None)
    return pushbuffer.to_bytes()


# A segment's leading acquire is SEM_ADDR_LO .. SEM_EXECUTE in one packet: the header, the
# address (2 words), the value (2 words), SEM_EXECUTE. A release has the same form.
ACQUIRE_VALUE = slice(3, 5)


def _value_words(value: int) -> tuple[int, int]:
    """A 64-bit semaphore value as its two words, low first (checked as the builders do)."""
    if type(value) is not int or not 0 <= value < 1 << SEMAPHORE_BITS:
        raise CommandError(f"semaphore payload {value!r} does not fit 64 bits")
    return value & 0xFFFF_FFFF, value >> 32


def _words(data: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{len(data) // WORD_BYTES}I", data)


@functools.lru_cache(maxsize=256)  # a few reads' and write slots' copies
def _copy_template(pieces: tuple[tuple[int, int, int], ...], bind: bool,
                   release_to: int) -> tuple[int, ...]:
    if not pieces:
        raise ValueError("a copy segment needs at least one copy")
    return _words(encode_copy_segment(RUNTIME_BLOCK_VA, list(pieces), 0, 0, bind=bind,
                                      release_to=release_to))


def snapshot_segment(address: int, qmds: list[int], after: int, reads_after: int,
                     payload: int) -> bytes:
    """Once the counter reaches `after` and the reads counter `reads_after` (the last copy
    out of the snapshot is done): dispatch the copy kernels' QMDs, and release `payload`
    into the counter when they are idle."""
    pushbuffer = Pushbuffer(address, address + SEGMENT_BYTES)
    commands = _commands(pushbuffer)
    commands.acquire_semaphore(COUNTER_ADDRESS, after)
    commands.acquire_semaphore(READS_ADDRESS, reads_after)
    for qmd in qmds:
        commands.dispatch(qmd)
    commands.release_semaphore(COUNTER_ADDRESS, payload)
    return pushbuffer.to_bytes()


def acquire_segment(address: int, after: int) -> bytes:
    """Hold the channel until the counter reaches `after`."""
    words = list(_ACQUIRE)
    words[ACQUIRE_VALUE] = _value_words(after)
    return words_to_bytes(words)


def release_segment(address: int, payload: int) -> bytes:
    """Release `payload` into the counter once everything before is idle."""
    words = list(_RELEASE)
    words[ACQUIRE_VALUE] = _value_words(payload)
    return words_to_bytes(words)


def encode_acquire_segment(address: int, after: int) -> bytes:
    """`acquire_segment`'s words, written by the builders."""
    pushbuffer = Pushbuffer(address, address + SEGMENT_BYTES)
    _commands(pushbuffer).acquire_semaphore(COUNTER_ADDRESS, after)
    return pushbuffer.to_bytes()


def encode_release_segment(address: int, payload: int) -> bytes:
    """`release_segment`'s words, written by the builders."""
    pushbuffer = Pushbuffer(address, address + SEGMENT_BYTES)
    _commands(pushbuffer).release_semaphore(COUNTER_ADDRESS, payload)
    return pushbuffer.to_bytes()


_ACQUIRE = _words(encode_acquire_segment(RUNTIME_BLOCK_VA, 0))
_RELEASE = _words(encode_release_segment(RUNTIME_BLOCK_VA, 0))


def _check_copy_out(out: list[tuple[int, int, int]]) -> None:
    """A detached read's copy out fits one segment of the copy channel."""
    if not out or len(out) > PIECES_PER_SEGMENT or any(
            not 0 < size <= COPY_PIECE_BYTES for *_, size in out):
        raise ValueError(f"a detached read's copy out is 1 to {PIECES_PER_SEGMENT} copies "
                         f"of 1 to {COPY_PIECE_BYTES} bytes")


def _check_snapshot(snapshot: tuple[Copy, ...]) -> None:
    if not 0 < len(snapshot) <= MAX_COPIES:
        raise ValueError(f"a snapshot is 1 to {MAX_COPIES} copies, not {len(snapshot)}")


class RuntimeStream:
    """The copy engine object, the runtime block, the write slots and the staging of one
    channel, and the queue of work on it."""

    def __init__(self, device: RmDevice, channel: Channel, wait: Wait, *, start: int = 0,
                 wait_copy: Wait | None = None):
        self.device = device
        self.channel = channel
        self._wait = wait
        self._wait_copy = wait_copy or wait  # waits on the copy channel's work
        self.counter = start  # the value the last item queued releases
        self.reads = start  # the value the last detached read releases into the reads counter
        self.last_item = "nothing"  # what the last item queued is, for waits' reports
        self._stamps = start  # timestamp payloads: their own numbering
        self.block = allocate(device, RUNTIME_BLOCK_BYTES, location="sysmem",
                              gpu_va=RUNTIME_BLOCK_VA, name="runtime block")
        self.staging: Allocation | None = None
        self.writes: Allocation | None = None  # made at the first write queued behind work
        self.profile_buffer: Allocation | None = None
        self.copy_object = 0
        self.copy_refused = ""  # why large transfers stay CPU accesses, when they do
        self.copy_channel: Channel | None = None  # made by the first detached read
        self.snapshots: SnapshotKernels | None = None
        self.detach_refused = ""  # why reads are not detached, once a set-up failed
        self._copy_bound = False  # the copy channel's first segment binds the copy class
        self._snapshot_free_after = start  # the counter value after which the QMDs may change
        self.staging_note = "process memory described to the driver"
        self._counter = self.block.u64(COUNTER_OFFSET)
        self._counter.value = start
        self._reads = self.block.u64(READS_OFFSET)
        self._reads.value = start
        # After which values each segment may be written again: (runtime counter, reads
        # counter), the second for a segment on the copy channel, which no later item of
        # the queue waits for.
        self._segment_free_after: list[tuple[int, int | None]] = [(start, None)] * SEGMENTS
        self._next_segment = 0
        self._slot_free_after = [start] * WRITE_SLOTS
        self._next_slot = 0
        self._bound = False  # the first batch of copies binds the class on its subchannel
        if s.HOPPER_DMA_COPY_A not in device.classes:
            self.copy_refused = "this GPU lists no HOPPER_DMA_COPY_A"
            return
        try:
            self.copy_object = device.client.alloc(channel.handle, s.HOPPER_DMA_COPY_A)
            self.staging = self._host_memory(STAGING_BYTES, STAGING_VA, "copy staging")
        except RmError as error:
            self.copy_refused = f"the copy engine is not available: {error}"

    def _host_memory(self, size: int, gpu_va: int, name: str) -> Allocation:
        """Memory of Bob's own described to the driver (the CPU reads it at memory speed),
        or, where the driver refuses that, RM's cached system memory."""
        try:
            return host_allocation(self.device, size, gpu_va=gpu_va, name=name)
        except RmError as error:
            self.staging_note = f"RM system memory (an OS descriptor was refused: {error})"
            return allocate(self.device, size, location="sysmem", gpu_va=gpu_va, cached=True,
                            name=name)

    @property
    def copies(self) -> bool:
        return self.staging is not None

    @property
    def completed(self) -> int:
        """The runtime counter's 64-bit value as the GPU last released it."""
        return self._counter.value

    @property
    def completed_reads(self) -> int:
        """The reads counter's 64-bit value as the copy channel last released it."""
        return self._reads.value

    @property
    def pending(self) -> bool:
        """Whether an item queued has not completed yet (detached reads' copies out aside)."""
        return self.completed < self.counter

    def wait_for(self, target: int, what: str = "") -> None:
        """Block until the item that releases `target` (and every one before) is done."""
        if self.completed < target:
            self._wait(lambda: self.completed, target, what or f"runtime item {target}")

    def wait_for_read(self, target: int, what: str = "") -> None:
        """Block until the detached read that releases `target` (and every one before) is
        on the host."""
        if self.completed_reads < target:
            self._wait_copy(lambda: self.completed_reads, target,
                            what or f"detached read {target}")

    def drain_queue(self) -> None:
        """Block until everything queued on the plan's channel is done (detached reads'
        copies out, on the copy channel, may still run)."""
        self.wait_for(self.counter, f"{self.last_item} (runtime item {self.counter})")

    def drain(self) -> None:
        """Block until everything queued is done, detached reads included."""
        self.drain_queue()
        self.wait_for_read(self.reads)

    # -- the queue ----------------------------------------------------------------------
    def _segment(self) -> tuple[int, int]:
        """The next segment of the ring (index, GPU address), once the GPU is past its
        last use."""
        index = self._next_segment
        self._next_segment = (index + 1) % SEGMENTS
        counter, reads = self._segment_free_after[index]
        self.wait_for(counter, f"runtime segment {index}")
        if reads is not None:
            self.wait_for_read(reads, f"runtime segment {index} (a detached read's copy out)")
        return index, RUNTIME_BLOCK_VA + index * SEGMENT_BYTES

    def _place(self, index: int, data: bytes, free_after: int,
               reads_after: int | None = None) -> bytes:
        """Segment `index`'s bytes in the block; its GPFIFO entry. It is written again once
        the counter reaches `free_after` (and the reads counter `reads_after`)."""
        self.block.write(index * SEGMENT_BYTES, data)
        self._segment_free_after[index] = (free_after, reads_after)
        return gpfifo_entry(HOPPER_CHANNEL_GPFIFO_A, RUNTIME_BLOCK_VA + index * SEGMENT_BYTES,
                            len(data) // WORD_BYTES)

    def queue_copies(self, pieces: list[tuple[int, int, int]]) -> int:
        """Queue copies (source, destination, bytes) between GPU addresses, each at most
        COPY_PIECE_BYTES, after everything queued before; the counter value they release."""
        if any(not 0 < size <= COPY_PIECE_BYTES for *_, size in pieces):
            raise ValueError(f"a copy piece is 1 to {COPY_PIECE_BYTES} bytes")
        if len(pieces) > PIECES_PER_SEGMENT * (SEGMENTS // 2):
            raise ValueError(f"{len(pieces)} copy pieces at once: at most "
                             f"{PIECES_PER_SEGMENT * (SEGMENTS // 2)}")
        entries = []
        for start in range(0, len(pieces), PIECES_PER_SEGMENT):
            index, address = self._segment()
            data = copy_segment(address, pieces[start:start + PIECES_PER_SEGMENT],
                                self.counter, self.counter + 1, bind=not self._bound)
            self._bound = True
            self.counter += 1
            entries.append(self._place(index, data, self.counter))
        self.last_item = f"copy-engine batch {self.counter}"
        if entries:
            self.channel.submit(entries)
        return self.counter

    def queue_entries(self, entries: list[bytes], what: str = "queued entries") -> int:
        """Queue GPFIFO entries (the plan's submissions: `what`) after everything queued
        before; the counter value released once they are done and the channel is idle."""
        first, first_address = self._segment()
        last, last_address = self._segment()
        after, self.counter = self.counter, self.counter + 1
        ring = [self._place(first, acquire_segment(first_address, after), self.counter),
                *entries,
                self._place(last, release_segment(last_address, self.counter), self.counter)]
        self.last_item = what
        self.channel.submit(ring)
        return self.counter

    # -- detached reads -------------------------------------------------------------------
    def detaches(self) -> bool:
        """Whether reads can be detached: the copy channel and the copy kernels, set up the
        first time asked; a refusal is kept (``detach_refused``) and reads stay in order."""
        if self.snapshots is not None:
            return True
        if self.detach_refused or not self.copies:
            return False
        try:
            self.copy_channel = copy_channel(self.device, COPY_RING_VA)
            self.snapshots = SnapshotKernels(self.device)
        except (RmError, RunFailure, OSError) as error:  # no copy engine, NVRTC, memory
            self.detach_refused = str(error)
            if self.copy_channel is not None:
                self.copy_channel.free()
                self.copy_channel = None
            return False
        return True

    def queue_detached_read(self, snapshot: tuple[Copy, ...],
                            out: list[tuple[int, int, int]]) -> int:
        """Queue a read that does not hold the queue: the `snapshot` copies (arena to video
        memory, by the copy kernels) as an item, then the `out` copies (snapshot to host)
        on the copy channel; both are checked before either is queued. The reads
        counter's value the copy out releases (``wait_for_read``)."""
        _check_copy_out(out)
        _check_snapshot(snapshot)
        return self.queue_copy_out(out, self.queue_snapshot(snapshot))

    def queue_snapshot(self, snapshot: tuple[Copy, ...]) -> int:
        """Queue the `snapshot` copies (GPU address to GPU address, by the copy kernels) as
        an item, once the last detached read's copies out are done (they read what it
        overwrites); the counter value it releases."""
        assert self.snapshots is not None and self.copy_channel is not None, "detaches() first"
        _check_snapshot(snapshot)
        snapshots = self.snapshots
        if snapshot == snapshots.written:
            qmds = snapshots.qmd_addresses(len(snapshot))
        else:  # the QMDs and banks change: once the GPU is past the last snapshot's
            self.wait_for(self._snapshot_free_after, "the last snapshot's copy kernels")
            qmds = snapshots.write(snapshot)
        index, address = self._segment()
        taken = snapshot_segment(address, qmds, self.counter, self.reads, self.counter + 1)
        self.counter += 1
        self._snapshot_free_after = self.counter
        self.last_item = f"the snapshot of detached read {self.reads + 1}"
        self.channel.submit([self._place(index, taken, self.counter)])
        return self.counter

    def queue_copy_out(self, out: list[tuple[int, int, int]], after: int) -> int:
        """Queue the `out` copies (source, destination, bytes) on the copy channel, once the
        runtime counter reaches `after` (the snapshot they read); the reads counter's value
        they release (``wait_for_read``). No item of the queue waits for them."""
        assert self.copy_channel is not None, "detaches() first"
        _check_copy_out(out)
        index, address = self._segment()
        self.reads += 1
        read = copy_segment(address, out, after, self.reads, bind=not self._copy_bound,
                            release_to=READS_ADDRESS)
        self._copy_bound = True
        self.copy_channel.submit([self._place(index, read, after, self.reads)])
        return self.reads

    def _free_write_slot(self) -> int:
        """The next write slot, once the copies last staged in it are done (the slots are
        made at the first write)."""
        if self.writes is None:
            self.writes = self._host_memory(WRITE_SLOTS * WRITE_SLOT_BYTES, WRITES_VA,
                                            "write slots")
        slot = self._next_slot
        self._next_slot = (slot + 1) % WRITE_SLOTS
        self.wait_for(self._slot_free_after[slot], f"write slot {slot}")
        return slot

    def queue_write(self, destination: int, data: memoryview) -> int:
        """Queue `data` (at most WRITE_SLOT_BYTES) for GPU address `destination`: staged in
        the next write slot now, copied in its turn; the counter value of the copy."""
        return self.queue_writes([(destination, data)])

    def queue_writes(self, writes: list[tuple[int, memoryview]]) -> int:
        """Queue each (GPU address, data) write, together at most WRITE_SLOT_BYTES: staged
        one after another in the next write slot now, copied in their turn as one batch;
        the counter value of the batch."""
        total = sum(len(data) for _, data in writes)
        if not writes or any(not len(data) for _, data in writes) or total > WRITE_SLOT_BYTES:
            raise ValueError(f"queued writes are 1 to {WRITE_SLOT_BYTES} bytes together, "
                             f"each at least 1, not {[len(data) for _, data in writes]}")
        slot = self._free_write_slot()
        pieces, position = [], slot * WRITE_SLOT_BYTES
        for destination, data in writes:
            self.writes.write(position, data)
            pieces.append((WRITES_VA + position, destination, len(data)))
            position += len(data)
        target = self.queue_copies(pieces)
        self._slot_free_after[slot] = target
        return target

    def queue_zeros(self, ranges: list[tuple[int, int]]) -> int:
        """Queue zeros for each (GPU address, bytes) range: the next write slot zeroed now,
        then copied from to every WRITE_SLOT_BYTES piece of the ranges, in their turn; the
        counter value of the last batch."""
        if not ranges or any(size < 1 for _, size in ranges):
            raise ValueError(f"zeros are queued for ranges of at least 1 byte, not {ranges}")
        slot = self._free_write_slot()
        source = WRITES_VA + slot * WRITE_SLOT_BYTES
        pieces = [(source, address + done, min(WRITE_SLOT_BYTES, size - done))
                  for address, size in ranges for done in range(0, size, WRITE_SLOT_BYTES)]
        self.writes.write(slot * WRITE_SLOT_BYTES, bytes(max(size for *_, size in pieces)))
        batch = PIECES_PER_SEGMENT * (SEGMENTS // 2)
        target = self.counter
        for start in range(0, len(pieces), batch):
            target = self.queue_copies(pieces[start:start + batch])
        self._slot_free_after[slot] = target
        return target

    # -- copies waited for --------------------------------------------------------------
    def _submit_copies(self, pieces: list[tuple[int, int, int]]) -> None:
        target = self.queue_copies(pieces)
        self.wait_for(target, f"copy-engine batch {target}")

    def copy_pieces(self, pieces: list[tuple[int, int, int]]) -> None:
        """Copy (source, destination, bytes) pieces between GPU addresses (memory of either
        side), each at most COPY_PIECE_BYTES, and wait for them."""
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
        """`data` to GPU address `destination`: through staging, chunk by chunk (each
        chunk waited for: the staging is reused)."""
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
        first = self._stamps + 1
        self._stamps += stamps
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
        del self._counter, self._reads
        for part in (self.staging, self.writes, self.profile_buffer, self.snapshots,
                     self.copy_channel):
            if part is not None:
                part.close()
        self.staging = self.writes = self.profile_buffer = None
        self.snapshots = self.copy_channel = None
        self.block.close()


__all__ = ["COPY_THRESHOLD", "READS_ADDRESS", "RuntimeStream", "Stamp", "acquire_segment",
           "copy_segment", "encode_acquire_segment", "encode_copy_segment",
           "encode_release_segment", "launch_nanoseconds", "read_stamps",
           "release_segment", "snapshot_segment", "timestamp_segment"]
