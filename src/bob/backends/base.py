"""The vendor-neutral core every backend implements.

A backend is opened on a certified plan and owns one arena laid out as the
plan says. The host writes tensors, patches scalar arguments (never pointers:
the certificate stays valid), runs a range of submissions and reads tensors
back. Backends know the plan, never the host.

This class does the checking and the bookkeeping once: which bytes of the
arena a tensor range is, whether a submission is in the plan, which scalars
may be patched, the patched parameter blocks, the last semaphore reached. A
backend supplies only its arena access (``_write_arena``, ``_read_arena``),
``_run`` and ``_carry_patches`` (the patched words to where its device reads
the parameter block).

What a backend may add, each with a synchronous default here so a backend that
has nothing better stays correct:

- ``_start_submissions``/``_wait_started``: ``start`` queues submissions and returns, ``wait``
  blocks until they are done (``run`` is both). The default runs at ``start``.
- ``begin_read``: the tables of this moment, collected while the next
  submissions run. The default copies them at once.
- ``_carry_scalar_rows``: many launches' patched scalars in one pass (the seed
  schedule's AdamW launches). The default carries them launch by launch.
- ``_write_arena_many``: several small writes as one batch (an invocation's AdamW
  table and cleared counters: one staging slot, one queued item). The default
  writes them one by one.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np

from bob.errors import RunFailure
from bob.plan.certificate import CertifiedPlan, require_certified
from bob.plan.model import Plan, PointerParam, Scalar, ScalarParam
from bob.plan.placement import argument_slots, encode_parameter_block

_WORD = struct.Struct("<I")
MAX_PENDING_ROWS = 64  # set_scalars_many calls held before their rows go into the blocks

# (offset in the parameter block, the 4-byte word written there)
Patch = tuple[int, bytes]


class ArenaRangeError(RunFailure):
    """A tensor byte range or a submission the plan does not have."""


class ReadHandle:
    """Tensors being read back: `wait()` gives name -> a flat uint8 array the caller owns.

    Without `settle` it is already complete (the synchronous default). A backend whose
    copy into these arrays is still running passes `settle`, which `wait` calls once
    (it blocks until the copy is done); one that makes the arrays only at the end
    returns its own kind.
    """

    def __init__(self, tables: dict[str, np.ndarray],
                 settle: Callable[[], None] | None = None):
        self._tables = tables
        self._settle = settle

    def wait(self) -> dict[str, np.ndarray]:
        if self._settle is not None:
            self._settle()
            self._settle = None
        return self._tables


class Backend(ABC):
    name = "abstract"

    def __init__(self, plan: Plan | CertifiedPlan):
        self.certified = require_certified(plan)  # before any allocation; a no-op when done
        self.plan = self.certified.plan
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

    # -- what the host uses ----------------------------------------------
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

    def read_tensor(self, name: str) -> bytes:
        size = self.plan.tensor(name).bytes
        return self._read_arena(self._arena_offset(name, 0, size), size)

    def run(self, submissions: range) -> None:
        """Execute these submissions in order and wait until the last completes."""
        self.start(submissions)
        self.wait()

    def start(self, submissions: range) -> None:
        """Queue these submissions in order; `wait()` blocks until the last completes.

        Between the two the host may prepare what does not touch the arena (a
        tensor write or read waits for the device's work queued before it)."""
        if not isinstance(submissions, range):
            raise TypeError(f"run takes a range of submissions, not {type(submissions).__name__}")
        if len(submissions) == 0:
            return
        count = self.plan.submission_count
        for index in (submissions[0], submissions[-1]):  # a range is monotonic
            if not 0 <= index < count:
                raise ArenaRangeError(f"submission {index} is not in the plan's {count}")
        self._start_submissions(submissions)
        self.last_semaphore = self.plan.submissions[submissions[-1]].semaphore

    def wait(self) -> None:
        """Block until every submission started so far has completed."""
        self._wait_started()

    def begin_read(self, names: Sequence[str]) -> ReadHandle:
        """Start reading these tensors as they stand once the started work is done.

        Submissions started afterwards do not change what the handle gives. The
        default waits and copies now; a backend with a copy engine snapshots
        the tensors on the device and copies them to the host in the background.
        """
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
        # Near each other (the checkpoint's tables are contiguous): one copy, then views.
        span = np.frombuffer(self._read_arena(low, high - low), np.uint8)
        return ReadHandle({name: span[offset - low:offset - low + size]
                           for name, offset, size in spans})

    def close(self) -> None:  # noqa: B027 - a backend with nothing to free keeps this
        """Free what the backend holds."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        if offset < 0 or offset + size > tensor.bytes:
            raise ArenaRangeError(f"{size} bytes at offset {offset} do not fit tensor {name!r} "
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
    @abstractmethod
    def _write_arena(self, offset: int, data: memoryview) -> None:
        """Copy `data` to the arena at byte `offset` (checked: inside one tensor)."""

    def _write_arena_many(self, writes: list[tuple[int, memoryview]]) -> None:
        """Copy each (offset, data) to the arena, in order (checked: each inside one
        tensor)."""
        for offset, data in writes:
            self._write_arena(offset, data)

    @abstractmethod
    def _read_arena(self, offset: int, size: int) -> bytes:
        """`size` bytes of the arena from byte `offset` (checked: inside the arena; one
        tensor, or the span from one tensor's start to another's end)."""

    @abstractmethod
    def _run(self, submissions: range) -> None:
        """Run these submissions (checked: non-empty, in the plan) and wait for the last."""

    def _start_submissions(self, submissions: range) -> None:
        """Queue these submissions; the default runs them to completion now."""
        self._run(submissions)

    def _wait_started(self) -> None:  # noqa: B027 - the default's start already waited
        """Block until the started submissions are done."""

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
