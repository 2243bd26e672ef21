"""The vendor-neutral core every backend implements: a queue contract.

A backend is opened on a certified plan and owns one arena laid out as the plan says.
The host writes tensors, patches scalar arguments (never pointers: the certificate stays
valid), starts a range of submissions and reads tensors back. Backends know the plan,
never the host. Work reaches a device in the order the host asks for it, as on one
queue: a write, clear or read is ordered after the submissions started before it and
before those started after, however the backend gets there.

This class does the checking and the bookkeeping once (which bytes of the arena a tensor
range is, whether a submission is in the plan, which scalars may be patched, the patched
parameter blocks, the last semaphore reached), and it owns the read pipeline and launch
timing: neighbouring tensors joined into few copies (`landing.read_spans`), landing
buffers handed out as the tables, the device snapshot that lets later work run while a
read crosses to the host, the fallback through a staging copy, the handle's `wait`, and
streamed reads through a bounded ring. A backend supplies primitives only, each
documented once below under "what each backend supplies", and the thresholds of the
pipeline as declared properties. Every primitive past the four abstract ones has a
synchronous default, so a backend with nothing better (cpu, nv-sim) stays correct.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import TypeVar

import numpy as np

from bob.config import ARENA_KINDS
from bob.errors import BadInput, RunFailure, size_text
from bob.plan.certificate import CertifiedPlan, require_certified
from bob.plan.model import Plan, PointerParam, Scalar, ScalarParam
from bob.plan.placement import argument_slots, encode_parameter_block

from .landing import (
    COPY_OUT_CHUNK_BYTES,
    COPY_OUT_THREADS,
    LANDING_MIN_BYTES,
    STREAM_CHUNK_BYTES,
    STREAM_RING_BUFFERS,
    HostRing,
    Landing,
    copy_out,
    read_spans,
)

_WORD = struct.Struct("<I")
MAX_PENDING_ROWS = 64  # set_scalars_many calls held before their rows go into the blocks
CLEAR_PIECE_BYTES = 1 << 20  # the default clear writes zeros in pieces of this size

# (offset in the parameter block, the 4-byte word written there)
Patch = tuple[int, bytes]
# A copy of the read pipeline: (source offset, bytes, position in the host buffer); the
# source is an arena offset, or a position in the device snapshot.
Copy = tuple[int, int, int]
# What a queued copy hands back: call it to block until its bytes are in host memory.
Completion = Callable[[], None]
# stream_read's receiver: (tensor name, byte offset in the tensor, the bytes from there)
Sink = Callable[[str, int, np.ndarray], None]
_HostMemory = TypeVar("_HostMemory", Landing, HostRing)  # the read pipeline's, by size


def require_arena_kind(arena: str) -> str:
    """`arena` if it is one of the arena placements (bob.config.ARENA_KINDS), else
    BadInput: the one check of it, for the registry and every backend."""
    if arena not in ARENA_KINDS:
        raise BadInput(f"unknown arena placement {arena!r}; choose {' or '.join(ARENA_KINDS)}")
    return arena


@cache
def zero_bytes(size: int) -> memoryview:
    """`size` zero bytes, made once (what the clears copy from)."""
    return memoryview(bytes(size))


MEMINFO = "/proc/meminfo"


def host_memory_available(path: str = MEMINFO) -> int | None:
    """The kernel's MemAvailable in bytes (what a process may take without swapping), or
    None where it is not reported."""
    try:
        with open(path) as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def require_memory(backend: str, what: str, need: int, available: int | None) -> None:
    """BadInput, before anything is allocated, when a plan needs more of some memory than
    there is: one line naming both (exit 2, nothing written)."""
    if available is not None and need > available:
        raise BadInput(f"the {backend} backend needs {size_text(need)} of {what} for this "
                       f"plan; {size_text(available)} is available")


class ReadHandle:
    """Tensors being read back: `wait()` gives name -> a flat uint8 array the caller owns.

    Without `settle` it is already complete (the synchronous default). With it, `wait`
    calls `settle` once (it blocks until the copy is done) and gives the tables `settle`
    returns, or, where it returns None, the ones the handle was made with (views of a
    buffer the copy is filling).
    """

    def __init__(self, tables: dict[str, np.ndarray],
                 settle: Callable[[], dict[str, np.ndarray] | None] | None = None):
        self._tables = tables
        self._settle = settle

    @property
    def complete(self) -> bool:
        """Whether the tensors are already on the host (`wait` will not block)."""
        return self._settle is None

    def wait(self) -> dict[str, np.ndarray]:
        if self._settle is not None:
            made = self._settle()
            self._settle = None
            if made is not None:
                self._tables = made
        return self._tables


def _nothing() -> None:
    pass


class Backend(ABC):
    name = "abstract"
    # Whether `profile` times launches here (`_timed_run`).
    can_profile = False
    # The read pipeline's thresholds, declared per backend (landing.py sets the values):
    # a read of fewer bytes than read_queue_min_bytes waits and is copied at once; one of
    # fewer than landing_min_bytes goes through the staging (where the backend has one);
    # one of fewer than snapshot_min_bytes copies from the arena in the queue's order.
    read_queue_min_bytes = 0
    landing_min_bytes = LANDING_MIN_BYTES
    snapshot_min_bytes = 0
    landing_granule = 1  # landing and ring buffers are whole multiples of this

    def __init__(self, plan: Plan | CertifiedPlan, arena: str = ARENA_KINDS[0]):
        self.certified = require_certified(plan)  # before any allocation; a no-op when done
        self.plan = self.certified.plan
        self.arena_kind = require_arena_kind(arena)  # where the backend places its arena
        # The one store of patched parameter blocks (the bytes); unpatched blocks
        # are encoded from the plan when asked for.
        self._blocks: dict[int, bytearray] = {}
        self._block_views: dict[int, np.ndarray] = {}  # uint32 views of them, where made
        # set_scalars_many's rows not yet in _blocks: (launches, word indices, words), in
        # order. Nothing reads the host blocks on the hot path (each backend carries the
        # words itself), so they are brought in only when a block is asked for.
        self._pending_rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        # The last set_scalars_many key, its launches, block offsets and word indices.
        self._many_places: tuple[tuple, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._patchable: dict[str, dict[str, tuple[str, int]]] = {}
        self.last_semaphore = 0
        # The read pipeline's host memory, each made when first needed.
        self._landing: Landing | None = None
        self._ring: HostRing | None = None
        self._staged: ReadHandle | None = None  # the last read through the staging
        self._copiers: ThreadPoolExecutor | None = None  # copies out of the staging
        # Run between two kernels the host runs itself (cpu): the session sets it to raise
        # a stop that waited out a kernel's compilation (bob.host.stops.raise_pending).
        self.between_kernels: Callable[[], None] = _nothing

    # -- what the host uses ----------------------------------------------
    def compile_ahead(self, keep_going: Callable[[], bool]) -> None:
        """Work this backend may do as it opens so that the commands after this one start
        at once (the cpu backend compiles the kernels every session reaches); each piece
        after `keep_going()`, which returns False when the run is asked to stop. Nothing
        by default."""
        return None

    def write_tensor(self, name: str, data: bytes, offset: int = 0) -> None:
        """Copy `data` (any bytes-like object: bytes, memoryview, a uint8 array) in."""
        view = memoryview(data).cast("B")
        start = self._arena_offset(name, offset, view.nbytes)
        if view.nbytes:
            self._write_arena(start, view)

    def write_tensors(self, writes: Sequence[tuple[str, bytes]]) -> None:
        """Each (name, data) copied in at the tensor's start, in order, as one batch: every
        range is checked before any byte is written."""
        places = []
        for name, data in writes:
            view = memoryview(data).cast("B")
            if view.nbytes:
                places.append((self._arena_offset(name, 0, view.nbytes), view))
        if places:
            self._write_arena_many(places)

    def clear_tensors(self, names: Sequence[str]) -> None:
        """Zero these whole tensors, as one batch where the backend can: ordered after the
        work started before it, like a write. Every name is checked first."""
        spans = [(self._arena_offset(name, 0, self.plan.tensor(name).bytes),
                  self.plan.tensor(name).bytes) for name in names]
        spans = [span for span in spans if span[1]]
        if spans:
            self._clear_arena(spans)

    def read_tensor(self, name: str, offset: int = 0, size: int | None = None) -> bytes:
        """The tensor's bytes, or `size` of them from byte `offset` (a few rows of a table
        too large to read whole)."""
        size = self.plan.tensor(name).bytes - offset if size is None else size
        return self._read_arena(self._arena_offset(name, offset, size), size)

    def run(self, submissions: range) -> None:
        """Execute these submissions in order and wait until the last completes."""
        self.start(submissions)
        self.wait()

    def start(self, submissions: range) -> None:
        """Queue these submissions in order; `wait()` blocks until the last completes.

        Between the two the host may prepare what does not touch the arena (a
        tensor write or read waits for the device's work queued before it)."""
        if self._in_plan(submissions):
            self._start_submissions(submissions)
            self.last_semaphore = self.plan.submissions[submissions[-1]].semaphore

    def wait(self) -> None:
        """Block until every submission started so far has completed."""
        self._wait_started()

    def profile(self, submissions: range) -> list[tuple[int, int]]:
        """Run these submissions with every launch timed by the device: (launch index,
        device nanoseconds) per launch run, in the order run. Each launch starts on an
        idle device, so a time is what the launch costs on its own, not overlapped."""
        if not self.can_profile:
            raise RunFailure(f"the {self.name} backend cannot time its launches")
        if not self._in_plan(submissions):
            return []
        times = self._timed_run(submissions)
        self.last_semaphore = self.plan.submissions[submissions[-1]].semaphore
        return times

    def _in_plan(self, submissions: range) -> bool:
        """Whether there is anything to run; RunFailure when a submission is not the plan's."""
        if not isinstance(submissions, range):
            raise TypeError(f"run takes a range of submissions, not {type(submissions).__name__}")
        if len(submissions) == 0:
            return False
        count = self.plan.submission_count
        for index in (submissions[0], submissions[-1]):  # a range is monotonic
            if not 0 <= index < count:
                raise RunFailure(f"submission {index} is not in the plan's {count}")
        return True

    def close(self) -> None:
        """Free what the backend holds (a backend with device memory frees it as well)."""
        self._close_reads()

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the read pipeline ---------------------------------------------------------------
    def begin_read(self, names: Sequence[str]) -> ReadHandle:
        """Start reading these tensors as they stand once the started work is done.

        Submissions started afterwards do not change what the handle gives. Tensors near
        each other in the arena go as one copy. Where the backend queues reads, the copy
        is queued behind the started work: into a landing buffer handed out as the tables
        (no copy on the host), or, for a small read or one that finds every landing
        buffer in use, into the backend's staging, copied out at `wait` (without a
        staging, such a read is made at once); from a device snapshot where the backend
        has room for one, so later work runs while the copy crosses to the host, else
        from the arena in the queue's order. Otherwise it waits and copies now.
        """
        sizes = [self.plan.tensor(name).bytes for name in names]
        spans, positions, end = read_spans(
            [(self._arena_offset(name, 0, size), size)
             for name, size in zip(names, sizes, strict=True)])
        if end < self.read_queue_min_bytes or not self._reads_queue():
            return self._read_now(names)
        layout = list(zip(names, positions, sizes, strict=True))
        buffer = self._landing_buffer(end) if end >= self.landing_min_bytes else None
        if buffer is None:
            if self._staged is not None:  # the staging is reused: its last read leaves first
                self._staged.wait()
                self._staged = None
            buffer = self._read_staging(end)
            if buffer is None:
                return self._read_now(names)
            done = self._queue_read(spans, buffer, end)
            self._staged = ReadHandle({}, lambda: self._copied_out(done, buffer, layout))
            return self._staged
        landing = self._landing
        assert landing is not None
        try:
            done = self._queue_read(spans, buffer, end)
        except BaseException:
            landing.give_back(buffer)  # nothing was handed out
            raise
        whole = landing.hand_out(buffer)
        return ReadHandle({name: whole[position:position + size]
                           for name, position, size in layout}, done)

    def stream_read(self, names: Sequence[str], sink: Sink,
                    chunk_bytes: int = STREAM_CHUNK_BYTES) -> None:
        """Deliver these tensors as they stand once the started work is done, in arena
        order, as `sink(name, offset, view)` calls: `view` (flat uint8, at most
        `chunk_bytes`) holds the tensor's bytes from `offset` and is valid only during the
        call. Host memory stays a few chunks, never a table: where the backend queues
        reads the chunks cross through a ring of STREAM_RING_BUFFERS host buffers, from a
        device snapshot where there is room for one (later submissions then need not wait
        for the stream), otherwise from the arena in the queue's order (later work waits
        for it); elsewhere each chunk is read at once."""
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be a positive integer, not {chunk_bytes!r}")
        tensors = sorted((self._arena_offset(name, 0, self.plan.tensor(name).bytes), name,
                          self.plan.tensor(name).bytes) for name in names)
        pieces = [(name, at, offset, min(chunk_bytes, size - offset))
                  for at, name, size in tensors for offset in range(0, size, chunk_bytes)]
        if not pieces:
            return
        spans, positions, end = read_spans([(at, size) for at, _, size in tensors])
        if end < self.read_queue_min_bytes or not self._reads_queue():
            for name, at, offset, size in pieces:
                sink(name, offset, np.frombuffer(self._read_arena(at + offset, size), np.uint8))
            return
        ring = self._ring_for(max(size for *_, size in pieces))
        from_snapshot = end >= self.snapshot_min_bytes and self._snapshot_room(spans, end)
        if from_snapshot:
            self._queue_snapshot(spans)
        source = dict(zip((name for _, name, _ in tensors),
                          positions if from_snapshot else (at for at, _, _ in tensors),
                          strict=True))
        free = list(ring.buffers)
        queued: deque[tuple[str, int, int, np.ndarray, Completion]] = deque()

        def deliver() -> None:
            name, offset, size, buffer, done = queued.popleft()
            done()
            view = buffer[:size]
            view.flags.writeable = False  # the ring's: the sink reads it, then it is reused
            sink(name, offset, view)
            free.append(buffer)

        for name, _, offset, size in pieces:
            if not free:
                deliver()
            buffer = free.pop()
            done = self._queue_copy_out(buffer, [(source[name] + offset, size, 0)],
                                        from_snapshot)
            queued.append((name, offset, size, buffer, done))
        while queued:
            deliver()

    def _read_now(self, names: Sequence[str]) -> ReadHandle:
        """The synchronous read: wait, then one copy of the tensors' span where they lie
        near each other (the checkpoint's tables are contiguous), else one per tensor."""
        self.wait()
        spans = [(name, self._arena_offset(name, 0, self.plan.tensor(name).bytes),
                  self.plan.tensor(name).bytes) for name in names]
        if not spans:
            return ReadHandle({})
        low = min(offset for _, offset, _ in spans)
        high = max(offset + size for _, offset, size in spans)
        if high - low > 2 * sum(size for _, _, size in spans):  # far apart: one by one
            return ReadHandle({name: np.frombuffer(self.read_tensor(name), np.uint8)
                               for name in names})
        span = np.frombuffer(self._read_arena(low, high - low), np.uint8)
        return ReadHandle({name: span[offset - low:offset - low + size]
                           for name, offset, size in spans})

    def _queue_read(self, spans: list[tuple[int, int, int]], buffer: np.ndarray,
                    end: int) -> Completion:
        """These spans queued into `buffer`: through the device snapshot where it has
        room, else from the arena in the queue's order."""
        if end >= self.snapshot_min_bytes and self._snapshot_room(spans, end):
            self._queue_snapshot(spans)
            return self._queue_copy_out(buffer, [(at, size, at) for _, size, at in spans],
                                        True)
        return self._queue_copy_out(buffer, [(offset, size, at) for offset, size, at in spans],
                                    False)

    def _copied_out(self, done: Completion, staging: np.ndarray,
                    layout: list[tuple[str, int, int]]) -> dict[str, np.ndarray]:
        """A staged read's tensors once its copy is done, each an array of its own (the
        staging is reused): a small read in one copy, its tensors views of it."""
        done()
        address = staging.ctypes.data
        end = max((position + size for _, position, size in layout), default=0)
        if end <= COPY_OUT_CHUNK_BYTES:
            whole = copy_out(address, end)
            return {name: whole[position:position + size] for name, position, size in layout}
        if self._copiers is None:
            self._copiers = ThreadPoolExecutor(COPY_OUT_THREADS,
                                               thread_name_prefix="bob-copy-out")
        return {name: copy_out(address + position, size, self._copiers)
                for name, position, size in layout}

    def _landing_buffer(self, size: int) -> np.ndarray | None:
        """A free landing buffer for a read of `size` bytes, or None."""
        landing = self._sized_host_memory("_landing", size, lambda whole: Landing(
            whole, self._register_host, self._unregister_host, minimum=self.landing_min_bytes))
        return landing.take()

    def _ring_for(self, size: int) -> HostRing:
        """stream_read's ring for chunks of `size` bytes."""
        return self._sized_host_memory("_ring", size, lambda whole: HostRing(
            whole, STREAM_RING_BUFFERS, self._register_host, self._unregister_host))

    def _sized_host_memory(self, attribute: str, size: int,
                           make: Callable[[int], _HostMemory]) -> _HostMemory:
        """The read pipeline's host memory held in `attribute` (`_landing`, `_ring`) for
        reads of `size` bytes in whole granules: made anew by `make` when the size changes,
        the old given up first, once no queued read lands in it."""
        size = -(-size // self.landing_granule) * self.landing_granule
        held = getattr(self, attribute)
        if held is None or held.size != size:
            if held is not None:
                self._wait_reads()
                setattr(self, attribute, None)  # given up even where closing fails
                held.close()
            held = make(size)
            setattr(self, attribute, held)
        return held

    def _close_reads(self) -> None:
        """The read pipeline's host memory given up (each backend calls this while its
        device is still open, once no copy lands in it); the first error is raised."""
        landing, ring, self._landing, self._ring, self._staged = \
            self._landing, self._ring, None, None, None
        if self._copiers is not None:
            self._copiers.shutdown()
            self._copiers = None
        errors = []
        for memory in (landing, ring):
            if memory is None:
                continue
            try:
                memory.close()
            except RunFailure as error:
                errors.append(error)
        if errors:
            raise errors[0]

    def set_scalars(self, launch_index: int, values: dict[str, Scalar]) -> None:
        """Rewrite scalar arguments of one launch (e.g. an update's AdamW scalars).

        Only scalars that no footprint depends on may change, so the plan's
        certificate still holds for the patched launch. The parameter block is
        patched in place (one 4-byte word per scalar), not encoded again.

        A patch affects submissions started after it; those already started run
        with the scalars they were started with (the host pipeline patches the
        next invocation while the last still runs).
        """
        region = self.plan.launches[launch_index].region
        patchable = self._patchable_scalars(region)
        patches: list[Patch] = []
        for name, value in values.items():
            if name not in patchable:
                raise KeyError(f"region {region!r} has no patchable scalar argument "
                               f"{name!r} (pointers and footprint sizes are fixed by the plan)")
            dtype, offset = patchable[name]
            if value.dtype != dtype:
                raise TypeError(f"argument {name!r} is {dtype}, not {value.dtype}")
            patches.append((offset, _WORD.pack(value.bits)))
        self._apply_pending_rows()
        block = self._blocks.get(launch_index)
        if block is None:
            block = self._blocks[launch_index] = bytearray(self.parameter_block(launch_index))
        for offset, word in patches:
            block[offset:offset + len(word)] = word
        self._carry_patches(launch_index, values, patches)

    def set_scalars_many(self, launches: Sequence[int], names: Sequence[str],
                         words: np.ndarray, dtype: str = "f32") -> None:
        """Row i of `words` (uint32[len(launches)][len(names)]) into launch launches[i]'s
        scalars `names`, all of type `dtype`: `set_scalars` for many launches in one pass.

        The same checks and the same bytes as calling `set_scalars` launch by launch.
        """
        words = np.ascontiguousarray(words, dtype=np.uint32)
        if words.shape != (len(launches), len(names)):
            raise ValueError(f"words must be {len(launches)} x {len(names)}, not "
                             f"{' x '.join(map(str, words.shape))}")
        launches = tuple(launches)
        order, offsets, indices = self._places_of(launches, tuple(names), dtype)
        row = (order, indices, words.copy())
        if self._pending_rows and self._pending_rows[-1][0] is order:
            self._pending_rows[-1] = row  # the same places: the newer words replace all
        else:
            if len(self._pending_rows) >= MAX_PENDING_ROWS:
                self._apply_pending_rows()
            self._pending_rows.append(row)
        self._carry_scalar_rows(list(launches), tuple(names), dtype, words, offsets)

    def _places_of(self, launches: tuple[int, ...], names: tuple[str, ...], dtype: str,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The launches as an array, then launches x names: each scalar's byte offset in
        its launch's block and its word index (scalars sit at 4-byte boundaries). Kept for
        the last key (the same objects while it lasts): an invocation's AdamW launches are
        the same every time."""
        key = (launches, names, dtype)
        if self._many_places is None or self._many_places[0] != key:
            by_region: dict[str, list[int]] = {}  # a region's launches share the offsets
            rows = []
            for index in launches:
                region = self.plan.launches[index].region
                if region not in by_region:
                    by_region[region] = self._scalar_offsets(region, names, dtype)
                rows.append(by_region[region])
            offsets = np.array(rows, np.int64).reshape(len(launches), len(names))
            self._many_places = (key, np.asarray(launches, np.intp), offsets, offsets // 4)
        return self._many_places[1:]

    def _apply_pending_rows(self) -> None:
        """set_scalars_many's rows into the host blocks, in the order they came."""
        pending, self._pending_rows = self._pending_rows, []
        for launches, indices, words in pending:
            for index, places, row in zip(launches.tolist(), indices, words, strict=True):
                self._block_words(index)[places] = row

    def _block_words(self, launch_index: int) -> np.ndarray:
        """Launch `launch_index`'s patched block as 4-byte words (a view, made once)."""
        view = self._block_views.get(launch_index)
        if view is None:
            block = self._blocks.get(launch_index)
            if block is None:
                block = self._blocks[launch_index] = bytearray(
                    self.parameter_block(launch_index))
            view = self._block_views[launch_index] = np.frombuffer(block, np.uint32)
        return view

    def _scalar_offsets(self, region: str, names: Sequence[str], dtype: str) -> list[int]:
        """Where each of these patchable scalars of `region` sits in a parameter block."""
        patchable = self._patchable_scalars(region)
        places = []
        for name in names:
            if name not in patchable:
                raise KeyError(f"region {region!r} has no patchable scalar argument "
                               f"{name!r} (pointers and footprint sizes are fixed by the plan)")
            declared, offset = patchable[name]
            if declared != dtype:
                raise TypeError(f"argument {name!r} is {declared}, not {dtype}")
            places.append(offset)
        return places

    def parameter_block(self, launch_index: int) -> bytes:
        """Launch `launch_index`'s parameter block as it stands (patches included)."""
        self._apply_pending_rows()
        block = self._blocks.get(launch_index)
        if block is not None:
            return bytes(block)
        launch = self.plan.launches[launch_index]
        return encode_parameter_block(self.plan.target, self.plan.region(launch.region), launch)

    def _arena_offset(self, name: str, offset: int, size: int) -> int:
        """Where bytes [offset, offset + size) of tensor `name` start in the arena."""
        tensor = self.plan.tensor(name)
        if offset < 0 or size < 0 or offset + size > tensor.bytes:
            raise RunFailure(f"{size} bytes at offset {offset} do not fit tensor {name!r} "
                             f"({tensor.bytes} bytes)")
        return tensor.address - self.plan.address_map.arena.base + offset

    def _patchable_scalars(self, region_name: str) -> dict[str, tuple[str, int]]:
        """Scalars no footprint depends on: name -> (dtype, offset in the block)."""
        if region_name not in self._patchable:
            region = self.plan.region(region_name)
            sizing = {factor for p in region.params if isinstance(p, PointerParam)
                      for factor in p.footprint.factors}
            self._patchable[region_name] = {
                slot.param.name: (slot.param.dtype, slot.offset)
                for slot in argument_slots(self.plan.target, region.params)
                if isinstance(slot.param, ScalarParam) and slot.param.name not in sizing
            }
        return self._patchable[region_name]

    # -- what each backend supplies -----------------------------------------------
    # Copy in, copy out, clear and runs. Offsets are the arena's (checked: inside one
    # tensor, or for a read the span from one tensor's start to another's end). Each is
    # ordered after the work started before it and before the work started after.
    @abstractmethod
    def _write_arena(self, offset: int, data: memoryview) -> None:
        """Copy in: `data` to the arena at byte `offset`."""

    def _write_arena_many(self, writes: list[tuple[int, memoryview]]) -> None:
        """Copy in, as one batch where the backend can (one staging slot, one queued item):
        each (offset, data), in order. The default writes them one by one."""
        for offset, data in writes:
            self._write_arena(offset, data)

    @abstractmethod
    def _read_arena(self, offset: int, size: int) -> bytes:
        """Copy out, synchronously: `size` bytes of the arena from byte `offset`, once the
        started work is done."""

    def _clear_arena(self, spans: list[tuple[int, int]]) -> None:
        """Clear: zero each (offset, bytes) range of the arena, as one batch where the
        backend can. The default writes zeros, CLEAR_PIECE_BYTES at a time."""
        zeros = zero_bytes(CLEAR_PIECE_BYTES)
        self._write_arena_many([(offset + done, zeros[:min(CLEAR_PIECE_BYTES, size - done)])
                                for offset, size in spans
                                for done in range(0, size, CLEAR_PIECE_BYTES)])

    @abstractmethod
    def _run(self, submissions: range) -> None:
        """Run these submissions (checked: non-empty, in the plan) and wait for the last."""

    def _start_submissions(self, submissions: range) -> None:
        """Start: queue these submissions and return. The default runs them to completion."""
        self._run(submissions)

    def _wait_started(self) -> None:  # noqa: B027 - the default's start already waited
        """Wait: block until every started submission is done."""

    def _timed_run(self, submissions: range) -> list[tuple[int, int]]:
        """A timed run (where `can_profile`): run these submissions, each launch on an idle
        device, and give (launch index, device ns) per launch run, in order."""
        raise NotImplementedError(f"the {self.name} backend declares no timed run")

    # Reads queued behind the started work (begin_read, stream_read). A backend that has
    # none keeps these defaults and reads synchronously.
    def _reads_queue(self) -> bool:
        """Whether reads can be queued now (the defaults: never)."""
        return False

    def _queue_copy_out(self, host: np.ndarray, copies: list[Copy],
                        from_snapshot: bool) -> Completion:
        """A queued copy of arena spans into host memory: each (source, bytes, position)
        copy to `host[position:]` (a landing, ring or staging buffer this backend
        registered or made), after the work started so far. From the device snapshot
        (`from_snapshot`, just queued by `_queue_snapshot`; later work need not wait for
        this copy), else from the arena (later work waits for it). Returns the
        completion: a call that blocks until the bytes are in `host`."""
        raise NotImplementedError(f"the {self.name} backend queues no reads")

    def _snapshot_room(self, spans: list[tuple[int, int, int]], size: int) -> bool:
        """Whether a device snapshot of these spans (arena offset, bytes, position) fits in
        `size` bytes of device memory here, made or grown now (the default: no snapshot)."""
        return False

    def _queue_snapshot(self, spans: list[tuple[int, int, int]]) -> None:
        """The device snapshot: copy each span (arena offset, bytes, position) to that
        position of the snapshot, after the work started so far and before any started
        later (only after `_snapshot_room` said yes)."""
        raise NotImplementedError(f"the {self.name} backend has no device snapshot")

    def _read_staging(self, size: int) -> np.ndarray | None:
        """The backend's staging: at least `size` bytes of host memory its copies out can
        reach, kept and reused (the caller settles the read that used it last), or None
        where it has none (such reads are made at once)."""
        return None

    def _register_host(self, address: int, size: int) -> None:
        """Make `size` bytes of host memory at `address` (page-aligned) reachable by the
        device's copies (a landing or ring buffer)."""
        raise NotImplementedError(f"the {self.name} backend lands no reads")

    def _unregister_host(self, address: int) -> None:
        """Undo `_register_host` for the buffer at `address`."""
        raise NotImplementedError(f"the {self.name} backend lands no reads")

    def _wait_reads(self) -> None:  # noqa: B027 - without queued reads nothing is in flight
        """Block until every queued copy out is in host memory."""

    # Scalar patches: the words to where the device reads them.
    def _carry_scalar_rows(self, launches: list[int], names: tuple[str, ...], dtype: str,
                           words: np.ndarray, offsets: np.ndarray) -> None:
        """`set_scalars_many`'s words to where the device reads them (`offsets`: each
        word's byte offset in its block, launches x names); the default carries them launch
        by launch."""
        for index, row, places in zip(launches, words.tolist(), offsets.tolist(),
                                      strict=True):
            values = {name: Scalar(dtype, word) for name, word in zip(names, row, strict=True)}
            patches = [(offset, _WORD.pack(word)) for offset, word in zip(places, row,
                                                                          strict=True)]
            self._carry_patches(index, values, patches)

    @abstractmethod
    def _carry_patches(self, launch_index: int, values: dict[str, Scalar],
                       patches: list[Patch]) -> None:
        """These scalars changed, their words at these block offsets: carry them to where
        the device reads launch `launch_index`'s parameter block."""
