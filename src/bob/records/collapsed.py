"""Collapsed tables: one rest class per row and the row's exception columns.

From a zero start every column of a row that the data never names receives the same
inputs to the same operations at every update, so its w, m and v stay bitwise equal to
the row's other such columns. A collapsed table keeps that once per row (the *rest
class*) and lists the other columns (the *exceptions*, CSR): the data's columns, and
any column whose state differs from the rest (a resume onto new data, a converted
dense table). It converts to and from the dense table exactly, both ways.

A table of classes is f32[V + K]: class r < V is row r's rest, class V + i exception i,
row r's exceptions being i in [offsets[r], offsets[r + 1]) at columns[i] (sorted, unique,
< V). A row whose every column is an exception keeps a rest class that stands for no
column (its kernels update it as a column the data never names, and it joins no sum).

A collapsed checkpoint is a safetensors file of three F32 [V + K] tables (parameters,
first_moment, second_moment), then ``row_offsets`` U64 [V + 1] and ``columns`` U32 [K],
with the dense checkpoint's metadata plus ``tables`` = "collapsed" and ``exceptions`` =
K (``bob.records.checkpoint``). Loading checks every tensor and the index (offsets from
0, non-decreasing, ending at K; each row's columns strictly increasing and below V) and
raises BadInput "<file>: <problem>".
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import BinaryIO

import numpy as np
from safetensors import SafetensorError, safe_open

from bob.config import CHECKPOINT_TENSORS, MAX_DENSE_VOCAB
from bob.errors import BadInput, RunFailure
from bob.files import StrPath, atomic_write, reading
from bob.records.binary import F32, arrays_identical
from bob.records.checkpoint import (
    Checkpoint,
    TableSink,
    TrainingState,
    _check_opening_bytes,
    _read_metadata,
    _table_problem,
    index_tensors,
    piece_bytes,
)

LANES = 256  # Bob's reductions run over 256 lanes (ARITHMETIC.md section 6)
# The device reads row offsets as u32: K stays below this.
MAX_EXCEPTIONS = (1 << 32) - 1
INDEX_NAMES = ("row_offsets", "columns")


@dataclass(frozen=True, eq=False)
class ClassIndex:
    """Which columns of each row are exceptions: offsets int64[V + 1], columns uint32[K].

    Made from parts it checks (`checked`) or from sorted unique keys (`from_keys`)."""

    vocab: int
    offsets: np.ndarray
    columns: np.ndarray

    def __post_init__(self) -> None:
        offsets = np.ascontiguousarray(self.offsets, np.int64)
        columns = np.ascontiguousarray(self.columns, np.uint32)
        for array in (offsets, columns):
            array.flags.writeable = False
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "columns", columns)

    @classmethod
    def from_keys(cls, vocab: int, keys: np.ndarray) -> ClassIndex:
        """The index whose exceptions are `keys` (row * V + column, sorted, unique)."""
        keys = np.asarray(keys, np.int64)
        rows = keys // vocab
        offsets = np.searchsorted(rows, np.arange(vocab + 1, dtype=np.int64))
        return cls(vocab, offsets, (keys - rows * vocab).astype(np.uint32))

    @classmethod
    def empty(cls, vocab: int) -> ClassIndex:
        return cls(vocab, np.zeros(vocab + 1, np.int64), np.zeros(0, np.uint32))

    @property
    def exceptions(self) -> int:
        return int(self.columns.size)

    @property
    def classes(self) -> int:
        return self.vocab + self.exceptions

    def counts(self) -> np.ndarray:
        """Exceptions per row (int64[V])."""
        return np.diff(self.offsets)

    def rows(self) -> np.ndarray:
        """The row of each exception (int64[K])."""
        return np.repeat(np.arange(self.vocab, dtype=np.int64), self.counts())

    def keys(self) -> np.ndarray:
        """row * V + column of each exception, increasing (int64[K])."""
        return self.rows() * self.vocab + self.columns.astype(np.int64)

    def problem(self) -> str | None:
        """What makes the index unsound, or None: its sizes, offsets from 0 non-decreasing
        to K, every row's columns strictly increasing and below V."""
        vocab, offsets, columns = self.vocab, self.offsets, self.columns
        if offsets.shape != (vocab + 1,):
            return f"row_offsets has {offsets.size} entries, V + 1 = {vocab + 1} expected"
        if columns.size > MAX_EXCEPTIONS:
            return f"{columns.size} exception columns, more than {MAX_EXCEPTIONS}"
        if offsets[0] != 0 or offsets[-1] != columns.size:
            return (f"row_offsets run from {offsets[0]} to {offsets[-1]}, not from 0 to the "
                    f"{columns.size} columns")
        falling = np.flatnonzero(np.diff(offsets) < 0)
        if falling.size:
            r = int(falling[0])
            return f"row_offsets decrease at row {r} ({offsets[r]} then {offsets[r + 1]})"
        outside = np.flatnonzero(columns >= vocab)
        if outside.size:
            i = int(outside[0])
            return f"columns[{i}] = {columns[i]} is not below V={vocab}"
        keys = self.keys()
        repeated = np.flatnonzero(np.diff(keys) <= 0)
        if repeated.size:
            i = int(repeated[0]) + 1
            row = int(keys[i] // vocab)
            return (f"row {row}'s columns are not strictly increasing (column "
                    f"{columns[i]} at exception {i} follows {columns[i - 1]})")
        return None

    def checked(self, source: str) -> ClassIndex:
        problem = self.problem()
        if problem:
            raise BadInput(f"{source}: {problem}")
        return self

    def position(self, keys: np.ndarray) -> np.ndarray:
        """The exception index of each key (row * V + column), -1 where it is no
        exception (int64)."""
        mine = self.keys()
        keys = np.asarray(keys, np.int64)
        at = np.searchsorted(mine, keys)
        found = np.zeros(keys.shape, bool)
        inside = at < mine.size
        found[inside] = mine[at[inside]] == keys[inside]
        return np.where(found, at, -1)

    def lane_order(self) -> np.ndarray:
        """Each row's exceptions in the order of the reductions' lanes: by column mod 256,
        then by column (uint32[K], indices into the exceptions). A lane's chain of
        exceptions is then contiguous, in the order the chain meets them."""
        key = self.rows() * LANES + (self.columns % LANES)
        return np.argsort(key, kind="stable").astype(np.uint32)

    def device_offsets(self) -> np.ndarray:
        """row_offsets as the arena holds them (u32: K <= MAX_EXCEPTIONS)."""
        return self.offsets.astype(np.uint32)

    def expand(self, classes: np.ndarray, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """Dense rows `rows` of a table of classes (f32[len(rows)][V], bits kept)."""
        rows = np.asarray(rows, np.int64)
        out = np.repeat(classes[rows][:, None], self.vocab, axis=1)
        for i, r in enumerate(rows.tolist()):
            first, last = int(self.offsets[r]), int(self.offsets[r + 1])
            out[i, self.columns[first:last]] = classes[self.vocab + first:self.vocab + last]
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClassIndex):
            return NotImplemented
        return (self.vocab == other.vocab and np.array_equal(self.offsets, other.offsets)
                and np.array_equal(self.columns, other.columns))

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class CollapsedCheckpoint:
    """A training state with collapsed tables: the index and three f32[V + K] tables.

    O(V + K) bytes: it is always held in host memory whole. The session writes it to the
    arena by the names the collapsed program's layout gives (the tables, then
    ``row_offsets``, ``columns`` and ``lane_order`` in the arena's dtypes)."""

    state: TrainingState
    index: ClassIndex
    parameters: np.ndarray
    first_moment: np.ndarray
    second_moment: np.ndarray
    path: str = "checkpoint"  # the file it was read from, where it was: errors name it

    def __post_init__(self) -> None:
        state, index = self.state, self.index
        if state.tables != "collapsed" or state.exceptions != index.exceptions \
                or state.vocab != index.vocab:
            raise ValueError(f"the state ({state.tables}, V={state.vocab}, K="
                             f"{state.exceptions}) does not describe the index (V="
                             f"{index.vocab}, K={index.exceptions})")
        for name in CHECKPOINT_TENSORS:
            array = getattr(self, name)
            if not isinstance(array, np.ndarray) or array.dtype != F32 \
                    or array.shape != (index.classes,):
                raise ValueError(f"{name} must be float32[{index.classes}] (V + K)")
            view = np.ascontiguousarray(array).view()
            view.flags.writeable = False
            object.__setattr__(self, name, view)

    # -- made ---------------------------------------------------------------------------
    @classmethod
    def zeros(cls, state: TrainingState, index: ClassIndex) -> CollapsedCheckpoint:
        """Zero tables over `index` (a fresh run: its exceptions are the data's columns)."""
        state = replace(state, tables="collapsed", exceptions=index.exceptions)
        return cls(state, index, *(np.zeros(index.classes, F32) for _ in range(3)))

    @classmethod
    def of_dense(cls, state: TrainingState, parameters: np.ndarray, first_moment: np.ndarray,
                 second_moment: np.ndarray, named: np.ndarray | None = None,
                 ) -> CollapsedCheckpoint:
        """Dense tables in host memory (V x V) collapsed exactly (`collapsed_from_rows`)."""
        tables = (parameters, first_moment, second_moment)
        return collapsed_from_rows(state, lambda first, last: tuple(t[first:last]
                                                                   for t in tables), named)

    def reindexed(self, named: np.ndarray) -> CollapsedCheckpoint:
        """The same tables over the exceptions a run on data naming `named` (keys, sorted,
        unique) needs: the named columns (a new one takes its row's rest state) and every
        exception whose state differs from its row's rest; an exception equal to its rest
        and not named becomes rest again. Lossless: every expanded row is unchanged."""
        index, vocab = self.index, self.index.vocab
        keys, rows = index.keys(), index.rows()
        own = [t.view(np.uint32) for t in self.tables()]
        differs = np.zeros(index.exceptions, bool)
        for table in own:
            differs |= table[vocab:] != table[rows]
        named = np.asarray(named, np.int64)
        wanted = np.union1d(keys[differs | np.isin(keys, named)], named)
        new = ClassIndex.from_keys(vocab, wanted)
        if new == index:
            return self
        at = index.position(wanted)
        wanted_rows = wanted // vocab
        arrays = []
        for table in own:
            values = np.where(at >= 0, table[vocab + np.maximum(at, 0)], table[wanted_rows])
            arrays.append(np.concatenate([table[:vocab], values]).view(F32))
        state = replace(self.state, exceptions=new.exceptions)
        return CollapsedCheckpoint(state, new, *arrays)

    def evolved(self, state: TrainingState, tables: dict[str, np.ndarray]) -> CollapsedCheckpoint:
        """The state after an invocation: its tables as read back from the arena (bytes or
        arrays of V + K floats), over this index."""
        arrays = [np.frombuffer(np.ascontiguousarray(tables[name]).data, F32)
                  for name in CHECKPOINT_TENSORS]
        state = replace(state, tables="collapsed", exceptions=self.index.exceptions)
        return CollapsedCheckpoint(state, self.index, *arrays)

    def with_state(self, state: TrainingState) -> CollapsedCheckpoint:
        return replace(self, state=replace(state, tables="collapsed",
                                           exceptions=self.index.exceptions))

    # -- what the arena takes -----------------------------------------------------------
    @property
    def row_offsets(self) -> np.ndarray:
        return self.index.device_offsets()

    @property
    def columns(self) -> np.ndarray:
        return self.index.columns

    @property
    def lane_order(self) -> np.ndarray:
        return self.index.lane_order()

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.parameters, self.first_moment, self.second_moment

    # -- read as a dense table ----------------------------------------------------------
    @property
    def vocab(self) -> int:
        return self.index.vocab

    @property
    def step(self) -> int:
        return self.state.step

    def rows(self, name: str, indices: Sequence[int]) -> np.ndarray:
        """Dense rows `indices` of one table (f32[len][V])."""
        for row in indices:
            if not 0 <= row < self.vocab:
                raise ValueError(f"row {row} is outside the V={self.vocab} table")
        return self.index.expand(getattr(self, name), indices)

    def row_block(self, name: str, first: int, last: int) -> np.ndarray:
        """Dense rows [first, last) of one table."""
        if not 0 <= first <= last <= self.vocab:
            raise ValueError(f"rows [{first}, {last}) are outside the V={self.vocab} table")
        return self.index.expand(getattr(self, name), np.arange(first, last))

    def deliver(self, sink: TableSink, chunk_bytes: int | None = None,
                names: Sequence[str] = CHECKPOINT_TENSORS) -> None:
        """The dense tables' bytes to `sink`, a block of rows at a time (a dense run started
        from this state; an export): the host holds a piece, never a dense table."""
        vocab = self.vocab
        piece = piece_bytes(4 * vocab * vocab, chunk_bytes)
        rows = max(1, piece // (4 * vocab))
        for name in names:
            for first in range(0, vocab, rows):
                block = self.row_block(name, first, min(vocab, first + rows))
                sink(name, 4 * vocab * first, memoryview(block.reshape(-1).view(np.uint8)))

    def mapped(self, name: str) -> np.ndarray:
        """One table expanded, f32[V][V] in host memory (read-only), where a dense table of
        V exists (`CheckpointFile.mapped` maps a dense file's instead)."""
        if self.vocab > MAX_DENSE_VOCAB:
            v = self.vocab
            raise BadInput(f"{self.path}: the dense {name} table of V={v} would be "
                           f"{4 * v * v / 2**30:.0f} GiB, past the largest dense table "
                           f"(V={MAX_DENSE_VOCAB}); read rows instead")
        table = self.row_block(name, 0, self.vocab)
        table.flags.writeable = False
        return table

    def dense(self) -> Checkpoint:
        """The dense checkpoint of the same state (V x V tables in host memory)."""
        state = replace(self.state, tables="dense", exceptions=0)
        everything = np.arange(self.vocab)
        return Checkpoint.of(state, *(self.index.expand(t, everything) for t in self.tables()))

    # -- files --------------------------------------------------------------------------
    def save(self, path: StrPath) -> None:
        """Write atomically; refuse (RunFailure) a state that would not load, before any
        byte is written."""
        for name in CHECKPOINT_TENSORS:
            problem = _table_problem(name, getattr(self, name))
            if problem:
                raise RunFailure(f"{path}: checkpoint not written: {problem}; the previous "
                                 "checkpoint is kept")
        offsets = self.index.offsets.astype("<u8")
        columns = self.index.columns.astype("<u4")

        def write(file: BinaryIO) -> None:
            file.write(self.state.header())
            for array in (*self.tables(), offsets, columns):
                file.write(memoryview(np.ascontiguousarray(array).view(np.uint8)))

        atomic_write(path, write)

    @classmethod
    def load(cls, path: StrPath) -> CollapsedCheckpoint:
        """Read and check a collapsed checkpoint; BadInput "<file>: <problem>"."""
        source = str(path)
        _check_opening_bytes(path)
        try:
            with safe_open(source, framework="numpy") as file:
                state = _read_metadata(file.metadata() or {}, source)
                if state.tables != "collapsed":
                    raise BadInput(f"{source}: a {state.tables} checkpoint, not a collapsed "
                                   "one")
                expected = {name: ("F32", [state.classes]) for name in CHECKPOINT_TENSORS}
                expected.update({name: (dtype, [count]) for name, dtype, _, count
                                 in index_tensors(state.vocab, state.exceptions)})
                _require_tensors(file, source, expected, state)
                arrays = {name: file.get_tensor(name) for name in expected}
        except SafetensorError as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise BadInput(f"{source}: not a readable safetensors file ({reason})") from None
        except OSError as error:
            raise BadInput(f"{source}: cannot read ({error.strerror or error})") from None
        offsets = arrays["row_offsets"]
        if offsets.size and int(offsets.max()) > state.exceptions:
            raise BadInput(f"{source}: row_offsets reach {int(offsets.max())}, past the "
                           f"{state.exceptions} exceptions")
        index = ClassIndex(state.vocab, offsets.astype(np.int64),
                           arrays["columns"]).checked(source)
        for name in CHECKPOINT_TENSORS:
            problem = _table_problem(name, arrays[name])
            if problem:
                raise BadInput(f"{source}: {problem}")
        return cls(state, index, *(np.ascontiguousarray(arrays[name], F32)
                                   for name in CHECKPOINT_TENSORS), path=source)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CollapsedCheckpoint):
            return NotImplemented
        return (self.state == other.state and self.index == other.index
                and all(arrays_identical(a, b)
                        for a, b in zip(self.tables(), other.tables(), strict=True)))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"CollapsedCheckpoint(V={self.vocab}, K={self.index.exceptions}, "
                f"step={self.step}, mode={self.state.mode!r})")


ROWS_AT_ONCE_BYTES = 64 << 20  # a conversion reads this much of each dense table at a time


def collapsed_from_rows(state: TrainingState, row_blocks, named: np.ndarray | None = None,
                        ) -> CollapsedCheckpoint:
    """Dense tables collapsed exactly, read a block of rows at a time: `row_blocks(first,
    last)` gives rows [first, last) of the parameters and both moments (f32[n][V] each;
    a `CheckpointFile`'s or a `ShardedCheckpoint`'s row_block serves).

    Each row's rest is the state of a column that `named` (keys row * V + column, sorted)
    does not name: its first such column when that state holds at least half the row,
    else the state of the first column holding the row's most frequent w. The exceptions
    are the named columns and every column whose (w, m, v) bits differ from the rest."""
    vocab = state.vocab
    named = np.zeros(0, np.int64) if named is None else np.asarray(named, np.int64)
    bounds = np.searchsorted(named, np.arange(vocab + 1, dtype=np.int64) * vocab)
    step = max(1, ROWS_AT_ONCE_BYTES // (4 * vocab))
    rests: list[np.ndarray] = []
    keys: list[np.ndarray] = []
    values: list[list[np.ndarray]] = []
    for first in range(0, vocab, step):
        last = min(vocab, first + step)
        block = [np.ascontiguousarray(t, F32).view(np.uint32) for t in row_blocks(first, last)]
        free = np.ones((last - first, vocab), bool)
        listed = named[bounds[first]:bounds[last]]
        free[listed // vocab - first, listed % vocab] = False
        choice = np.argmax(free, axis=1)  # the first free column (0 where none is free)
        rest = np.stack([t[np.arange(last - first), choice] for t in block])
        same = np.ones_like(free)
        for i, t in enumerate(block):
            same &= t == rest[i][:, None]
        for row in np.flatnonzero(free.any(axis=1) & (same.sum(axis=1) * 2 < vocab)):
            candidates = np.flatnonzero(free[row])
            _, at, counts = np.unique(block[0][row, candidates], return_index=True,
                                      return_counts=True)
            column = candidates[at[int(np.argmax(counts))]]
            rest[:, row] = [t[row, column] for t in block]
            same[row] = True
            for i, t in enumerate(block):
                same[row] &= t[row] == rest[i, row]
        none_free = ~free.any(axis=1)
        rest[:, none_free] = 0  # a rest class standing for no column: zeros
        rows, columns = np.nonzero(~same | ~free)  # row-major: the keys' order
        keys.append((rows + first).astype(np.int64) * vocab + columns)
        values.append([t[rows, columns] for t in block])
        rests.append(rest)
        if sum(k.size for k in keys) > MAX_EXCEPTIONS:
            raise BadInput(f"the table has more than {MAX_EXCEPTIONS} columns that differ "
                           "from their row's rest: it cannot be collapsed")
    index = ClassIndex.from_keys(vocab, np.concatenate(keys))
    rest_all = np.concatenate(rests, axis=1)
    arrays = [np.concatenate([rest_all[i], *(v[i] for v in values)]) for i in range(3)]
    state = replace(state, tables="collapsed", exceptions=index.exceptions)
    return CollapsedCheckpoint(state, index, *(a.view(F32) for a in arrays))


def _require_tensors(file, source: str, expected: dict[str, tuple[str, list[int]]],
                     state: TrainingState) -> None:
    """Exactly the expected tensors, each of its dtype and shape (from the header)."""
    names = set(file.keys())
    for name, (dtype, shape) in expected.items():
        if name not in names:
            raise BadInput(f"{source}: no tensor {name!r} (a collapsed Bob checkpoint has "
                           f"{', '.join(expected)})")
        layout = file.get_slice(name)
        if layout.get_dtype() != dtype:
            raise BadInput(f"{source}: tensor {name} is {layout.get_dtype()}, not {dtype}")
        if list(layout.get_shape()) != shape:
            raise BadInput(f"{source}: tensor {name} has shape {list(layout.get_shape())}, "
                           f"expected {shape} (V={state.vocab}, K={state.exceptions})")
    extra = sorted(names - set(expected))
    if extra:
        raise BadInput(f"{source}: unexpected tensor {extra[0]!r} (a collapsed Bob checkpoint "
                       f"has only {', '.join(expected)})")


def checkpoint_tables(path: StrPath) -> str:
    """"dense" or "collapsed": how the one-piece checkpoint at `path` holds its tables (its
    metadata; a file that is no Bob checkpoint reads as dense, whose reader refuses it)."""
    try:
        with reading(path, "checkpoint") as file:
            head = file.read(8)
            if len(head) < 8:
                return "dense"
            (length,) = struct.unpack("<Q", head)
            if length > 100 << 20:
                return "dense"
            header = json.loads(file.read(length))
        tables = header.get("__metadata__", {}).get("tables", "dense")
    except (BadInput, ValueError, AttributeError, UnicodeDecodeError):
        return "dense"  # the dense reader says what is wrong
    return tables if tables == "collapsed" else "dense"
