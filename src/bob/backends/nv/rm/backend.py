"""``NvBackend``: a certified plan submitted to a Hopper GPU through the kernel driver.

    backend = NvBackend(plan)           # plan built for sm_90 with compiled regions
    backend.write_tensor("input", record)
    backend.run(range(plan.submission_count))
    backend.read_tensor("predictions")

What the GPU runs is Bob's command stream, ``encoder.encode(plan)``: the same
bytes ``nv-sim`` executes, ``bob plan --disasm`` lists and ``bob plan --emit``
writes. Each component of the plan's address map (program, QMD table,
pushbuffer, semaphores, arena) becomes one allocation mapped at exactly the
plan's address, and the encoded components are copied there unchanged: the
driver areas and pointer words in the parameter blocks, the QMDs' program,
constant-bank and release addresses and the GPFIFO entries are already right.
Program, QMD table and arena sit in video memory (the arena in system memory
with ``arena="host"``); pushbuffer and semaphores in uncached system memory,
so the CPU sees releases without flushes.

Opening runs GPFIFO entry 0 (the set-up: compute class, memory windows) once.
``run(submissions)`` zeroes the submissions' 64-bit semaphore slots (consecutive
slots in one copy, slot 0's launch-progress half left alone), copies
the submissions' encoded GPFIFO entries into the channel's ring, advances
GP_PUT once and rings the doorbell once (up to half the ring per doorbell:
every run of a chained plan, whose invocation is at most three submissions,
is one doorbell), and waits for the last slot to reach its value. A chained
plan needs nothing else here: its later launches are scheduled by the QMDs
the encoder linked. ``set_scalars`` writes into the launch's parameter block
in the mapped program component only the 4-byte words whose value changed
(an AdamW update changes two of its seven scalars), adjacent ones in one copy;
``set_scalars_many`` (an invocation's AdamW launches) compares all of them
with a host shadow of the component in one numpy pass and stores only the
changed words through the mapping, in one indexed store.

Once work is queued, ``start`` queues runs on the runtime stream
(``rm/stream.py``), and small writes, clears and reads queue behind them: a clear
is copies from a zeroed write slot; a read lands in host memory described to the
driver, from a snapshot the copy kernels take in video memory (a detached read,
copied out on a copy engine's channel while later runs go on) or from the arena
in the queue's order. The read pipeline itself is the base class's; this backend
supplies its primitives. A timed run (``profile``) brackets every submission with
timestamped releases.

Bob's plans run here bit-identical to the CPU backend (docs/RAW-HOPPER.md).
Chained plans are the faster policy here, so ``--submission auto`` (the command
line's and the API's default) builds chained plans for this backend
(``bob.backends.registry``: it runs Bob's command stream).
"""

from __future__ import annotations

import contextlib
import struct
import time

import numpy as np

from bob.backends.base import CLEAR_PIECE_BYTES, Backend, Completion, Copy, Patch, zero_bytes
from bob.backends.landing import DETACHED_READ_MIN_BYTES, QUEUED_READ_MIN_BYTES
from bob.backends.nv.encoder import (
    LAUNCH_PROGRESS_OFFSET,
    SEMAPHORE_SLOT_BYTES,
    SETUP_ENTRIES,
    EncodedProgram,
    encode,
)
from bob.config import ARENA_KINDS
from bob.errors import BackendUnavailable, BadInput, RunFailure, size_text
from bob.plan.certificate import CertifiedPlan
from bob.plan.model import Component, Plan, Scalar

from .addresses import SNAPSHOT_VA
from .channel import Channel
from .device import SUBMITTED_TARGET, RmClient, RmDevice
from .ioctl import ChannelError, RmError, SubmissionTimeout, Transport
from .memory import (
    SYSMEM_GRANULE,
    VIDMEM_GRANULE,
    Allocation,
    allocate,
    describe_host,
    release,
    round_up,
)
from .snapshot import MAX_COPIES
from .stream import (
    COPY_PIECE_BYTES,
    COPY_THRESHOLD,
    PIECES_PER_SEGMENT,
    WRITE_SLOT_BYTES,
    RuntimeStream,
)

DEFAULT_DEADLINE_S = 30.0  # without progress; the clock restarts whenever GP_GET moves
SEMAPHORE_BYTES = 8  # each submission releases a 64-bit value into its slot
COPY_WAIT_SLICE_S = 0.5  # a copy-out wait looks at the compute channel this often


def nv_available() -> tuple[bool, str]:
    """Whether a Hopper GPU answers through the kernel driver here, and why not."""
    client = None
    try:
        client = RmClient()
        device = RmDevice(client)
        device.close()
        return True, f"HOPPER_COMPUTE_A through the kernel driver ({device.driver_version})"
    except (BackendUnavailable, RmError) as error:
        return False, str(error)
    finally:
        if client is not None:
            client.close()


def _require_code(plan: Plan) -> None:
    for placed in plan.placed_regions:
        if not plan.region(placed.name).code:
            raise RunFailure(f"region {placed.name!r} has no machine code: build the plan with "
                             "compiled sm_90 regions (bob.kernels.cuda.regions.compiled_regions)")


class NvBackend(Backend):
    name = "nv"
    can_profile = True
    # Small reads wait and read the mapping; large ones are detached through a snapshot
    # in video memory, so that the next run waits for that, not for the copy to the host.
    read_queue_min_bytes = QUEUED_READ_MIN_BYTES
    landing_min_bytes = QUEUED_READ_MIN_BYTES
    snapshot_min_bytes = DETACHED_READ_MIN_BYTES
    landing_granule = SYSMEM_GRANULE  # host memory is described to the driver in pages
    # Runs queued on the runtime stream (start returns at once). False: every run is
    # submitted and waited for by its last submission's own semaphore slot.
    queue_runs = True

    def __init__(self, plan: Plan | CertifiedPlan, arena: str = ARENA_KINDS[0], *,
                 transport: Transport | None = None, deadline_s: float = DEFAULT_DEADLINE_S,
                 counter_start: int = 0):
        super().__init__(plan, arena)
        plan = self.plan
        if plan.target.name != SUBMITTED_TARGET:
            raise BackendUnavailable(f"the nv backend submits {SUBMITTED_TARGET} plans (QMD "
                                     f"V04, HOPPER_COMPUTE_A); this plan targets "
                                     f"{plan.target.name}")
        _require_code(plan)
        self.deadline_s = deadline_s
        self._stream: RuntimeStream | None = None  # made on first use (copies, profiling)
        self._counter_start = counter_start
        self._failure = ""  # why the backend closed itself (a channel error)
        self._no_stream = ""  # why the runtime stream could not be set up, if it could not
        self._described: dict[int, Allocation] = {}  # host buffer address -> its mapping
        self._snapshot: Allocation | None = None  # video memory detached reads go through
        self._no_snapshot = 0  # the size at which a snapshot could not be had
        self._snapshot_value = 0  # the runtime counter's value after the last snapshot
        self.encoded: EncodedProgram = encode(self.certified)
        self.client = RmClient(transport)
        self.blocks: dict[str, Allocation] = {}
        self.channel: Channel | None = None
        try:
            self.device = RmDevice(self.client)
            where = {"program": "vidmem", "qmd-table": "vidmem", "pushbuffer": "sysmem",
                     "semaphores": "sysmem", "arena": "vidmem" if arena == "device" else "sysmem"}
            for component in plan.address_map.components:
                try:
                    self.blocks[component.name] = self._map(component, where[component.name])
                except RmError as error:
                    if "NO_MEMORY" not in str(error):
                        raise
                    place = "device memory" if where[component.name] == "vidmem" \
                        else "host memory"
                    raise BadInput(f"the nv backend needs {size_text(component.bytes)} of "
                                   f"{place} for this plan's {component.name}; the driver "
                                   f"has no room for it ({error})") from None
            for encoded in self.encoded.components:
                if encoded.base is not None:  # the GPFIFO entries go to the channel's ring
                    self._upload(encoded.name, encoded.base, encoded.data)
            # What the program component holds on the device: set_scalars compares with it.
            self._program = bytearray(self.encoded.program.data)
            # The same bytes as 4-byte words (scalars sit at 4-byte boundaries): one numpy
            # pass compares and applies many launches' scalars.
            self._program_words = np.frombuffer(
                memoryview(self._program)[:len(self._program) // 4 * 4], np.uint32)
            self._patched_words: tuple[np.ndarray, np.ndarray] | None = None  # _word_indices
            self.channel = Channel(self.device)
            self.channel.submit([self.encoded.entry(i) for i in range(SETUP_ENTRIES)])
            self.channel.wait(lambda: self.channel.gp_get, SETUP_ENTRIES, deadline_s,
                              "channel set-up")
        except BaseException:
            self.close()
            raise

    def _map(self, component: Component, location: str) -> Allocation:
        granule = VIDMEM_GRANULE if location == "vidmem" else SYSMEM_GRANULE
        size = round_up(max(component.bytes, 1), granule)
        later = [c.base for c in self.plan.address_map.components if c.base > component.base]
        if later and component.base + size > min(later):
            raise RunFailure(f"the {component.name} component needs {size} bytes at "
                             f"0x{component.base:x} and would overlap the next component at "
                             f"0x{min(later):x}")
        return allocate(self.device, size, location=location, gpu_va=component.base,
                        name=component.name)

    def _upload(self, name: str, address: int, data: bytes | memoryview) -> None:
        """Copy encoded bytes to their plan address inside the component `name`."""
        block = self.blocks[name]
        assert block.gpu_va is not None
        block.write(address - block.gpu_va, data)

    # -- the runtime stream: copies and timestamps -------------------------------------------
    @property
    def stream(self) -> RuntimeStream:
        """The copy engine, staging buffer and timestamps; set up the first time asked."""
        self._require_open()
        assert self.channel is not None
        if self._stream is None:
            self._stream = RuntimeStream(self.device, self.channel, self._wait_for,
                                         start=self._counter_start,
                                         wait_copy=self._wait_for_copy)
        return self._stream

    def _stream_ready(self) -> bool:
        """Whether the runtime stream, with its copy engine, can queue work."""
        if self._no_stream:
            return False
        try:
            return self.stream.copies
        except RmError as error:  # the runtime area could not be set up: BAR1 still works
            self._no_stream = str(error)
            return False

    def _copies(self, size: int) -> bool:
        """Whether `size` bytes of the arena move by copy engine (else CPU through BAR1)."""
        return self.arena_kind == "device" and size >= COPY_THRESHOLD and self._stream_ready()

    def _in_flight(self) -> bool:
        """Whether work queued on the runtime stream may still be running."""
        return self._stream is not None and self._stream.pending

    def _drain(self) -> None:
        """Wait for everything queued on the compute channel (before the CPU touches the
        arena or the parameter blocks). A detached read's copy out is not waited for: it
        reads only its snapshot."""
        if self._in_flight():
            assert self._stream is not None
            self._guarded(self._stream.drain_queue)

    def _drain_all(self) -> None:
        """Wait for everything queued, detached reads' copies out included (before the
        landing buffers or the snapshot go)."""
        stream = self._stream
        if stream is not None and (stream.pending or stream.completed_reads < stream.reads):
            self._guarded(stream.drain)

    # -- the arena and submission ------------------------------------------------------------
    def _write_arena(self, offset: int, data: memoryview) -> None:
        """Behind queued work a small write is staged and queued after it (the host need
        not wait); otherwise the queue is drained and the bytes go as before."""
        self._require_open()
        arena = self.blocks["arena"]
        if self._in_flight() and len(data) <= WRITE_SLOT_BYTES:
            assert arena.gpu_va is not None
            self._guarded(lambda: self.stream.queue_write(arena.gpu_va + offset, data))
            return
        self._drain()
        if self._copies(len(data)):
            assert arena.gpu_va is not None
            self._guarded(lambda: self.stream.write(arena.gpu_va + offset, data))
            return
        arena.write(offset, data)  # the caller's bytes straight into the mapping

    def _write_arena_many(self, writes: list[tuple[int, memoryview]]) -> None:
        """Small writes behind queued work: one slot and one copy item for them all."""
        self._require_open()
        arena = self.blocks["arena"]
        if (len(writes) < 2 or not self._in_flight()
                or sum(len(data) for _, data in writes) > WRITE_SLOT_BYTES):
            super()._write_arena_many(writes)
            return
        assert arena.gpu_va is not None
        self._guarded(lambda: self.stream.queue_writes(
            [(arena.gpu_va + offset, data) for offset, data in writes]))

    def _read_arena(self, offset: int, size: int) -> bytes:
        self._require_open()
        self._drain()
        arena = self.blocks["arena"]
        if self._copies(size):
            assert arena.gpu_va is not None
            return self._guarded(lambda: self.stream.read(arena.gpu_va + offset, size))
        return arena.read(offset, size)

    def _clear_arena(self, spans: list[tuple[int, int]]) -> None:
        """Behind queued work, or large in a device arena: zeros queued from a write slot
        (the host need not wait); otherwise the queue is drained and zeros go through the
        mapping."""
        self._require_open()
        arena = self.blocks["arena"]
        total = sum(size for _, size in spans)
        if self._in_flight() or self._copies(total):
            assert arena.gpu_va is not None
            self._guarded(lambda: self.stream.queue_zeros(
                [(arena.gpu_va + offset, size) for offset, size in spans]))
            return
        self._drain()
        zeros = zero_bytes(CLEAR_PIECE_BYTES)
        for offset, size in spans:
            for done in range(0, size, CLEAR_PIECE_BYTES):
                arena.write(offset + done, zeros[:min(CLEAR_PIECE_BYTES, size - done)])

    # -- reads queued on the runtime stream ---------------------------------------------
    def _reads_queue(self) -> bool:
        self._require_open()
        return self.arena_kind == "device" and self._stream_ready()

    def _snapshot_room(self, spans: list[tuple[int, int, int]], size: int) -> bool:
        """A detached read: whole 4-byte words, few enough copies, the copy channel and
        kernels set up, and video memory for the snapshot."""
        if (len(spans) > MAX_COPIES or -(-size // COPY_PIECE_BYTES) > PIECES_PER_SEGMENT
                or any(value % 4 for span in spans for value in span)):
            return False
        if not self._guarded(self.stream.detaches):
            return False
        return self._snapshot_for(size) is not None

    def _queue_snapshot(self, spans: list[tuple[int, int, int]]) -> None:
        """The copy kernels, as an item of the queue."""
        arena = self.blocks["arena"]
        assert arena.gpu_va is not None
        taken = tuple((arena.gpu_va + offset, SNAPSHOT_VA + position, size)
                      for offset, size, position in spans)
        self._snapshot_value = self._guarded(lambda: self.stream.queue_snapshot(taken))

    def _queue_copy_out(self, host: np.ndarray, copies: list[Copy],
                        from_snapshot: bool) -> Completion:
        """From the snapshot on the copy channel (its own counter), else copy-engine copies
        from the arena in the queue's order."""
        self._require_open()
        arena = self.blocks["arena"]
        destination = self._described[host.ctypes.data].gpu_va
        assert arena.gpu_va is not None and destination is not None
        stream = self.stream
        source = SNAPSHOT_VA if from_snapshot else arena.gpu_va
        pieces = [(source + at + done, destination + position + done,
                   min(COPY_PIECE_BYTES, size - done))
                  for at, size, position in _joined(copies)
                  for done in range(0, size, COPY_PIECE_BYTES)]
        if from_snapshot:
            after = self._snapshot_value
            target = self._guarded(lambda: stream.queue_copy_out(pieces, after))
            return lambda: self._settle_read(
                lambda: stream.wait_for_read(target, f"detached read {target}"))
        target = self._guarded(lambda: stream.queue_copies(pieces))
        return lambda: self._settle_read(
            lambda: stream.wait_for(target, f"copy-engine read {target}"))

    def _settle_read(self, wait) -> None:
        self._require_open()
        self._guarded(wait)

    def _snapshot_for(self, size: int) -> int | None:
        """The GPU address of video memory for a detached read of `size` bytes (made, or
        made larger, when first needed), or None where there is none to be had."""
        size = round_up(size, VIDMEM_GRANULE)
        if self._snapshot is not None and self._snapshot.size >= size:
            return SNAPSHOT_VA
        lowest = min(component.base for component in self.plan.address_map.components)
        if (self._no_snapshot and size >= self._no_snapshot) or SNAPSHOT_VA + size > lowest:
            return None
        if self._snapshot is not None:
            self._drain_all()  # the last detached read may still be copying out of it
            release(self.device, self._snapshot)
            self._snapshot = None
        try:
            self._snapshot = allocate(self.device, size, location="vidmem", gpu_va=SNAPSHOT_VA,
                                      map_cpu=False, name="read snapshot")
        except RmError:  # out of video memory beside the arena: no snapshot at this size
            self._no_snapshot = size
            return None
        return SNAPSHOT_VA

    def _register_host(self, address: int, size: int) -> None:
        """Host memory described to the driver once, when a buffer is made."""
        assert self.device is not None
        self._described[address] = describe_host(self.device, address, size,
                                                 name="host buffer")

    def _unregister_host(self, address: int) -> None:
        block = self._described.pop(address)
        if self.device is not None:
            release(self.device, block)

    def _wait_reads(self) -> None:
        self._drain_all()

    def _run(self, submissions: range) -> None:
        self._require_open()
        self._drain()
        self._guarded(lambda: self._submit(submissions))

    def _start_submissions(self, submissions: range) -> None:
        """Queue the submissions on the runtime stream and return: they run after the
        work queued before them (copies included) and before the work queued after. A
        run too long for half the ring, or one without the stream, is submitted and
        waited for."""
        self._require_open()
        assert self.channel is not None
        if (not self.queue_runs or len(submissions) + 2 > self.channel.entries // 2
                or not self._stream_ready()):
            self._run(submissions)
            return
        entries = [self.encoded.submission_entry(index) for index in submissions]
        what = f"submissions {submissions[0]} to {submissions[-1]}"
        self._guarded(lambda: self.stream.queue_entries(entries, what))

    def _wait_started(self) -> None:
        self._require_open()
        self._drain()

    def _timed_run(self, submissions: range) -> list[tuple[int, int]]:
        self._require_open()
        self._drain()
        return self._guarded(lambda: self._profile(submissions))

    def _guarded(self, work):
        """Run `work`; a channel error closes the backend (the channel is dead) and is
        reported as one line naming the launch and the error."""
        try:
            return work()
        except ChannelError as error:
            self._failure = str(error)
            self.close()
            raise ChannelError(f"{error}; the nv backend closed its channel and memory") \
                from None

    def _require_open(self) -> None:
        if self.channel is None:
            raise RunFailure("the nv backend is closed" + (f" after: {self._failure}"
                                                          if self._failure else ""))

    def _submit(self, submissions: range) -> None:
        assert self.channel is not None
        room = self.channel.entries // 2
        for start in range(0, len(submissions), room):
            batch = submissions[start:start + room]
            self._zero_semaphores(batch)  # a slot may hold its value from an earlier run
            self.channel.submit([self.encoded.submission_entry(index) for index in batch])
            self._wait(batch[-1])

    def _profile(self, submissions: range) -> list[tuple[int, int]]:
        """Every submission bracketed by timestamped releases: one launch each."""
        launches = []
        for index in submissions:
            submission = self.plan.submissions[index]
            if submission.count != 1:
                raise RunFailure(f"profiling times one launch per submission; submission "
                                 f"{index} has {submission.count} (build the plan with the "
                                 "per-launch submission policy)")
            launches.append(submission.first_launch)
        self._zero_semaphores(submissions)
        times = self.stream.profile([self.encoded.submission_entry(i) for i in submissions])
        return list(zip(launches, times, strict=True))

    def _zero_semaphores(self, submissions: range) -> None:
        """Zero these submissions' slots, consecutive slots in one copy: the spare half of
        each slot between them is zero and stays so, but slot 0's, where each QMD releases
        the launch progress, is left as it is."""
        for address, size in semaphore_spans(self.encoded.submission_semaphore(0), submissions):
            self._upload("semaphores", address, bytes(size))

    def semaphore(self, submission: int) -> int:
        """The 64-bit value in submission `submission`'s semaphore slot."""
        block = self.blocks["semaphores"]
        assert block.gpu_va is not None
        offset = self.encoded.submission_semaphore(submission) - block.gpu_va
        return struct.unpack("<Q", block.read(offset, SEMAPHORE_BYTES))[0]

    def launch_progress(self) -> int:
        """Launch index + 1 of the last grid that completed (its QMD's release)."""
        block = self.blocks["semaphores"]
        assert block.gpu_va is not None
        offset = self.encoded.launch_progress_address - block.gpu_va
        return struct.unpack("<I", block.read(offset, 4))[0]

    def _wait(self, submission: int) -> None:
        target = self.plan.submissions[submission].semaphore
        self._wait_for(lambda: self.semaphore(submission), target,
                       f"submission {submission}'s semaphore")

    def _wait_for(self, read_value, target: int, what: str) -> None:
        """Every wait: a deadline that restarts while the channel makes progress (GP_GET
        moves, or, within one long chained submission fetched at once, the launch-progress
        word does), and one report of a channel error (a copy that faults is named as the
        copy, anything else by the launch after the last completed)."""
        assert self.channel is not None
        while True:
            before = (self.channel.gp_get, self.launch_progress())
            try:
                self.channel.wait(read_value, target, self.deadline_s, what)
                return
            except ChannelError as error:
                subject = what if what.startswith("copy-engine") else None
                raise ChannelError(f"{self._fault(subject)}: {error}; {self._progress()}") \
                    from None
            except SubmissionTimeout as error:
                if (self.channel.gp_get, self.launch_progress()) == before:
                    raise SubmissionTimeout(f"{error}; {self._progress()}") from None

    def _wait_for_copy(self, read_value, target: int, what: str) -> None:
        """A wait on the copy channel's work (a detached read's copy out). The copy waits for
        the compute channel's snapshot, so the deadline restarts while either channel makes
        progress, and a compute channel's error ends the wait as a run's would, within a
        slice (COPY_WAIT_SLICE_S), not at the deadline."""
        assert self._stream is not None and self._stream.copy_channel is not None
        assert self.channel is not None
        channel, compute = self._stream.copy_channel, self.channel
        progress = (channel.gp_get, compute.gp_get, self.launch_progress())
        since = time.monotonic()
        while True:
            try:
                channel.wait(read_value, target, COPY_WAIT_SLICE_S, what)
                return
            except ChannelError as error:
                raise ChannelError(f"the copy of a read to the host (copy channel): {error}") \
                    from None
            except SubmissionTimeout as error:
                if compute.state().error:
                    raise ChannelError(f"{self._fault()}: the driver stopped the channel "
                                       f"while {what} waited for it: "
                                       f"{compute.state().describe()}") from None
                now = (channel.gp_get, compute.gp_get, self.launch_progress())
                if now != progress:
                    progress, since = now, time.monotonic()
                elif time.monotonic() - since > self.deadline_s:
                    raise SubmissionTimeout(f"{error}; {self._progress()}") from None

    def _launch_label(self, index: int) -> str:
        if not 0 <= index < self.plan.launch_count:
            return "not in the plan"
        launch = self.plan.launches[index]
        return launch.label or launch.region

    def _fault(self, subject: str | None = None) -> str:
        """What the channel stopped in (by default the launch after the last whose release
        landed) and the error the driver wrote in the channel's error notifier."""
        assert self.channel is not None
        if subject is None:
            failed = self.launch_progress()
            subject = f"launch {failed} ({self._launch_label(failed)})"
        return f"{subject} failed with {self.channel.state().reason()}"

    def _progress(self) -> str:
        done = self.launch_progress()
        if done == 0:
            return "no launch has completed"
        return f"the last launch completed is {done - 1} ({self._launch_label(done - 1)})"

    def _carry_patches(self, launch_index: int, values: dict[str, Scalar],
                       patches: list[Patch]) -> None:
        """The changed words go straight into the mapped program component, where the
        launch's QMD points constant buffer 0; the driver area there stays. A word that
        already holds its value is not written (every write crosses BAR1)."""
        self._require_open()
        self._drain()  # queued launches may still read the block
        base = self.plan.parameter_block_address(launch_index) - self.plan.address_map.program.base
        changed = sorted((base + offset, word) for offset, word in patches
                         if self._program[base + offset:base + offset + len(word)] != word)
        for start, data in _runs(changed):
            self._upload("program", self.plan.address_map.program.base + start, data)
            self._program[start:start + len(data)] = data

    def _carry_scalar_rows(self, launches: list[int], names: tuple[str, ...], dtype: str,
                           words: np.ndarray, offsets: np.ndarray) -> None:
        """Every launch's words compared with the program shadow in one numpy pass, and
        only the changed ones stored, shadow and device, in one indexed store each: the
        same bytes on the device as `_carry_patches` launch by launch, without a copy
        through BAR1 per launch or of the unchanged bytes between them."""
        self._require_open()
        if not launches:
            return
        indices = self._word_indices(launches, offsets)
        changed = self._program_words[indices] != words
        if not changed.any():
            return
        self._drain()  # queued launches may still read the blocks
        where, values = indices[changed], words[changed]
        self._program_words[where] = values
        block = self.blocks["program"]
        assert block.gpu_va is not None
        block.store_words(self.plan.address_map.program.base - block.gpu_va, where, values)

    def _word_indices(self, launches: list[int], offsets: np.ndarray) -> np.ndarray:
        """launches x names: where each scalar's word is in the program component.

        Kept for the offsets asked last: the base class hands the same array for as long
        as an invocation patches the same launches (``Backend._places_of``)."""
        if self._patched_words is None or self._patched_words[0] is not offsets:
            program = self.plan.address_map.program.base
            blocks = np.array([self.plan.parameter_block_address(index) - program
                               for index in launches], np.int64)
            places = blocks[:, None] + np.asarray(offsets, np.int64)
            self._patched_words = (offsets, places // 4)  # scalars sit at 4-byte boundaries
        return self._patched_words[1]

    def close(self) -> None:
        # Queued work may still write memory about to go: let it finish (or fail) first.
        if self._stream is not None and self.channel is not None and not self._failure:
            with contextlib.suppress(RunFailure):
                self._stream.drain()
        # Before the channel and the client go: the buffers' arrays stay valid as memory.
        with contextlib.suppress(RmError):
            self._close_reads()
        self._described.clear()
        if self._snapshot is not None and self.device is not None:
            with contextlib.suppress(RmError):
                release(self.device, self._snapshot)
        self._snapshot = None
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        for block in self.blocks.values():
            block.close()
        self.blocks.clear()
        device = getattr(self, "device", None)
        if device is not None:
            device.close()
            self.device = None
        if self.client is not None:
            self.client.close()
            self.client = None


def semaphore_spans(first_slot: int, submissions: range) -> list[tuple[int, int]]:
    """(address, bytes) to zero these submissions' 64-bit slots (SEMAPHORE_SLOT_BYTES apart
    from `first_slot`): one span over consecutive slots, the unused spare halves between
    them included, except the slot whose spare half holds the launch progress (slot 0's),
    which is zeroed alone: every QMD releases the progress there."""
    if submissions.step != 1:
        return [(first_slot + SEMAPHORE_SLOT_BYTES * index, SEMAPHORE_BYTES)
                for index in submissions]
    progress = LAUNCH_PROGRESS_OFFSET // SEMAPHORE_SLOT_BYTES
    pieces = (range(submissions.start, min(submissions.stop, progress)),
              range(max(submissions.start, progress), min(submissions.stop, progress + 1)),
              range(max(submissions.start, progress + 1), submissions.stop))
    return [(first_slot + SEMAPHORE_SLOT_BYTES * piece.start,
             SEMAPHORE_SLOT_BYTES * (len(piece) - 1) + SEMAPHORE_BYTES)
            for piece in pieces if len(piece)]


def _joined(copies: list[Copy]) -> list[Copy]:
    """Copies laid out alike at both ends (the snapshot's packing is the host buffer's) as
    the one window from the first to the last; others as they are."""
    if len(copies) < 2 or len({source - position for source, _, position in copies}) != 1:
        return copies
    start = min(position for _, _, position in copies)
    end = max(position + size for _, size, position in copies)
    delta = copies[0][0] - copies[0][2]
    return [(start + delta, end - start, start)]


def _runs(words: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """Sorted (offset, bytes) pieces joined where one ends at the next's offset."""
    runs: list[tuple[int, bytearray]] = []
    for offset, data in words:
        if runs and runs[-1][0] + len(runs[-1][1]) == offset:
            runs[-1][1].extend(data)
        else:
            runs.append((offset, bytearray(data)))
    return [(offset, bytes(data)) for offset, data in runs]


__all__ = ["NvBackend", "nv_available"]
