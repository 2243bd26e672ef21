"""Checkpoints: the table and AdamW's moments as safetensors, written atomically.

A checkpoint holds three float32 tensors of shape [V, V], C-contiguous and in
the arena's order (``parameters``, ``first_moment``, ``second_moment``), and
string metadata:

    format          "bob-checkpoint"
    format_version  "1"
    vocab           V
    step            global AdamW update count (the next update is step + 1)
    mode            "hard" or "corpus"
    lr, beta1, beta2, eps, weight_decay   repr() of the floats: they round-trip
    warmup_steps, lr_decay_steps, min_lr  optional: the learning-rate schedule
                    (bob.config.Hyper.lr_at), present only where one is set
    data_digest     the training data's digest ("" before any training), either form of
                    bob.records.digest: "v2:" and the sha256 hex of a corpus's sparse
                    weights, or the legacy sha256 hex of the input record's table
    created_by      "bob <version>" (informational)
    history         optional: JSON [[step, loss], ...], the objective after each invocation
    optimum         optional: repr() of the data's least reachable loss (corpus mode)
    segments        optional: JSON [{"first_step": s, "data_digest": d, "lr": ..., ...}, ...]:
                    from update s + 1 on, training used data d and those hyperparameters
                    (absent in checkpoints written before Bob kept it); "sources", where
                    known, says how the data was given (bob.records.data_sources)
    val_history     optional: JSON [[step, loss], ...], the validation loss after each invocation
    successors      optional: JSON [[first, last], ...], the symbols the training data has as
                    a next symbol, as inclusive ranges (absent where the data does not say:
                    checkpoints written before Bob kept it, a run resumed on other data
                    from one of those)

Any safetensors reader loads one. Bob's own loader checks every tensor and
field and raises BadInput "<file>: <problem>"; saving refuses non-finite values
so a diverged run never replaces a good checkpoint.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import socket
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from numbers import Integral, Real
from pathlib import Path
from typing import BinaryIO

import numpy as np
from safetensors import SafetensorError, safe_open

from bob.config import (
    CHECKPOINT_TENSORS,
    HYPER_FIELDS,
    MAX_DENSE_VOCAB,
    MAX_VOCAB,
    MIN_VOCAB,
    MODES,
    SCHEDULE_FIELDS,
    TABLES,
    Hyper,
    Mode,
    Tables,
)
from bob.errors import BadInput, RunFailure, reason_of, shown
from bob.files import StrPath, atomic_write, reading, write_target
from bob.records.binary import (
    F32,
    INPUT_MAGIC,
    RESULT_MAGIC,
    arrays_identical,
    first_true,
    index_text,
)
from bob.records.data_sources import DataSources
from bob.records.digest import DIGEST_FORMS, is_digest
from bob.records.metadata import (
    MAX_INTEGER,
    bob_version,
    read_integers,
    read_number,
    require_fields,
)

FORMAT = "bob-checkpoint"
FORMAT_VERSION = 1
REQUIRED_METADATA = ("format", "format_version", "vocab", "step", "mode", *HYPER_FIELDS,
                     "data_digest")
DEFAULT_HYPER = Hyper()
MAX_STEP = MAX_INTEGER  # 2**53: every step is exact as a float64 (bias correction)


def _digest_problem(digest: object) -> str | None:
    if digest != "" and not is_digest(digest):
        return f"data_digest {shown(digest)} is not {DIGEST_FORMS} (or empty)"
    return None


def finite_number(value: object) -> bool:
    """Whether `value` is a real number (no bool) that is finite as a float64: JSON's
    integers have no bound, and float() of a 400-digit one overflows."""
    if not isinstance(value, Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _history_problem(history: Iterable[object], name: str = "history") -> str | None:
    for entry in history:
        if not (isinstance(entry, tuple | list) and len(entry) == 2
                and isinstance(entry[0], Integral) and not isinstance(entry[0], bool)
                and 0 <= entry[0] <= MAX_STEP and finite_number(entry[1])):
            return (f"{name} entry {shown(entry)} is not a [step, finite loss] pair "
                    f"(step at most 2**53)")
    return None


class History(tuple):
    """(step, loss) pairs, checked and made (int, float): a Checkpoint keeps one as it is,
    and `extended` checks only the pairs it adds. A long run extends its loss history at
    every invocation; checking all of it again each time would grow with the run."""

    __slots__ = ()

    @classmethod
    def of(cls, pairs: Iterable[object]) -> History:
        """The pairs checked ([step >= 0, finite loss] each) and made (int, float)."""
        if type(pairs) is cls:
            return pairs  # type: ignore[return-value]
        pairs = tuple(pairs)
        problem = _history_problem(pairs)
        if problem:
            raise ValueError(problem)
        return tuple.__new__(cls, ((int(step), float(loss))  # type: ignore[misc]
                                   for step, loss in pairs))

    def extended(self, pairs: Iterable[object]) -> History:
        """This history and then `pairs` (only they are checked)."""
        return tuple.__new__(History, self + History.of(pairs))


def _optimum_problem(optimum: object) -> str | None:
    if optimum is None:
        return None
    if not isinstance(optimum, Real) or not math.isfinite(optimum) or optimum < 0:
        return f"optimum {optimum!r} is not a finite number >= 0"
    return None


Ranges = tuple[tuple[int, int], ...]  # inclusive [first, last] runs of symbols, increasing


def symbol_ranges(present: np.ndarray) -> Ranges:
    """The runs of True in a mask of V symbols, as inclusive (first, last) ranges."""
    flags = np.concatenate(([False], np.asarray(present, bool), [False]))
    edges = np.flatnonzero(flags[1:] != flags[:-1])
    return tuple((int(first), int(after) - 1) for first, after in edges.reshape(-1, 2))


def ranges_mask(ranges: Ranges, vocab: int) -> np.ndarray:
    """The mask of V symbols that `ranges` hold."""
    mask = np.zeros(vocab, bool)
    for first, last in ranges:
        mask[first:last + 1] = True
    return mask


def _ranges_problem(ranges: object, vocab: int) -> str | None:
    if ranges is None:
        return None
    previous = -2
    for entry in ranges:  # type: ignore[attr-defined]
        if not (isinstance(entry, tuple | list) and len(entry) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in entry)):
            return f"successors entry {shown(entry)} is not a [first, last] pair of integers"
        first, last = entry
        if not 0 <= first <= last < vocab:
            return (f"successors range {shown(list(entry))} is not first <= last inside "
                    f"[0, V={vocab})")
        if first <= previous + 1:
            return (f"successors range {list(entry)} touches or overlaps the one before it "
                    f"(ending at {previous}): ranges increase, apart")
        previous = last
    return None


def _table_problem(name: str, array: np.ndarray) -> str | None:
    """What makes a table unfit to save or load (a value AdamW cannot continue from)."""
    finite = np.isfinite(array)
    if not finite.all():
        i = first_true(~finite)
        return f"{name}{index_text(i)} is {array[i]} (not finite)"
    if name == "second_moment":
        negative = array < 0
        if negative.any():
            i = first_true(negative)
            return f"{name}{index_text(i)} = {array[i]} is negative (it is a mean of squares)"
    return None


@dataclass(frozen=True)
class Segment:
    """A step range of a run: from update first_step + 1 on, this data and these hyperparameters.

    A resumed run with other data (--new-data) or other hyperparameters starts a new
    segment, so the checkpoint says what produced every stretch of its loss history.
    """

    first_step: int  # the checkpoint step the segment starts from
    data_digest: str  # the training data's digest (bob.records.digest)
    hyper: Hyper
    # How the data was given (--resume with no data reads it again); None where unknown:
    # checkpoints written before Bob kept it.
    sources: DataSources | None = None

    def to_json(self) -> dict[str, object]:
        return {"first_step": self.first_step, "data_digest": self.data_digest,
                **{name: float(getattr(self.hyper, name)) for name in HYPER_FIELDS},
                **schedule_fields(self.hyper),
                **({"sources": self.sources.to_json()} if self.sources is not None else {})}


def schedule_fields(hyper: Hyper) -> dict[str, int | float]:
    """The learning-rate schedule's fields where one is set (none for a constant lr, so
    such a checkpoint is written as before the schedule existed)."""
    if not hyper.scheduled:
        return {}
    fields: dict[str, int | float] = {"warmup_steps": hyper.warmup_steps}
    if hyper.lr_decay_steps is not None and hyper.min_lr is not None:
        fields.update(lr_decay_steps=hyper.lr_decay_steps, min_lr=float(hyper.min_lr))
    return fields


def _schedule_from(values: dict[str, object], where: str) -> dict[str, object] | str:
    """The schedule's fields of a JSON object or metadata (absent: none), checked for type;
    Hyper checks the rest."""
    found: dict[str, object] = {}
    for name in SCHEDULE_FIELDS:
        if name not in values:
            continue
        value = values[name]
        whole = name != "min_lr"
        if isinstance(value, bool) or not isinstance(value, Integral if whole else Real):
            return f"{where}{name} {value!r} is not {'an integer' if whole else 'a number'}"
        found[name] = int(value) if whole else float(value)  # type: ignore[arg-type]
    return found


_SEGMENT_KEYS = frozenset(("first_step", "data_digest", *HYPER_FIELDS))
_SEGMENT_OPTIONAL_KEYS = frozenset(("sources", *SCHEDULE_FIELDS))


def _segments_problem(segments: tuple[Segment, ...], step: int) -> str | None:
    previous = -1
    for segment in segments:
        if not isinstance(segment, Segment):
            return f"segment {segment!r} is not a Segment"
        first = segment.first_step
        if not isinstance(first, int) or isinstance(first, bool) or first <= previous:
            return f"segment first_step {first!r} does not follow {previous} (steps increase)"
        if first > step:
            return f"segment first_step {first} is beyond the checkpoint's step {step}"
        problem = _digest_problem(segment.data_digest) or (
            None if isinstance(segment.hyper, Hyper) else "hyper is not a Hyper") or (
            None if segment.sources is None or isinstance(segment.sources, DataSources)
            else "sources is not a DataSources")
        if problem:
            return f"segment at step {first}: {problem}"
        previous = first
    return None


def _segment_from_json(entry: object) -> Segment | str:
    """A Segment from its JSON object, or what is wrong with the object."""
    if not isinstance(entry, dict) or not (
            _SEGMENT_KEYS <= set(entry) <= _SEGMENT_KEYS | _SEGMENT_OPTIONAL_KEYS):
        return (f"segment {shown(entry)} is not an object with {', '.join(sorted(_SEGMENT_KEYS))} "
                f"(and optionally {', '.join(sorted(_SEGMENT_OPTIONAL_KEYS))})")
    first = entry["first_step"]
    if not isinstance(first, int) or isinstance(first, bool) or first < 0:
        return f"segment first_step {shown(first)} is not a non-negative integer"
    values = {name: entry[name] for name in HYPER_FIELDS}
    if not all(finite_number(v) for v in values.values()):
        return f"segment at step {first}: a hyperparameter is not a finite number"
    schedule = _schedule_from(entry, f"segment at step {first}: ")
    if isinstance(schedule, str):
        return schedule
    try:  # a Hyper checks its own values
        hyper = Hyper(**{k: float(v) for k, v in values.items()}, **schedule)
    except BadInput as error:
        return f"segment at step {first}: {error}"
    sources = None
    if "sources" in entry:
        sources = DataSources.from_json(entry["sources"])
        if isinstance(sources, str):
            return f"segment at step {first}: {sources}"
    return Segment(first, entry["data_digest"], hyper, sources)


# What a save's tables are handed to: (tensor, byte offset in it, bytes), in arena order.
TableSink = Callable[[str, int, memoryview], None]
# A source of the three tables: it calls the sink with every byte of them, in order.
TableDelivery = Callable[[TableSink, int], None]
def index_tensors(vocab: int, exceptions: int) -> tuple[tuple[str, str, int, int], ...]:
    """A collapsed checkpoint's index tensors after its tables: (name, safetensors dtype,
    bytes an element, elements)."""
    return (("row_offsets", "U64", 8, vocab + 1), ("columns", "U32", 4, exceptions))


CHUNK_BYTES = 64 << 20  # a streamed save's or load's piece: the host holds a few of them
TABLE_PIECES = 4  # and a table crosses in at least this many: no piece is a whole table


def piece_bytes(table_bytes: int, chunk_bytes: int | None = None) -> int:
    """The piece a streamed save or load moves: at most `chunk_bytes` (CHUNK_BYTES when
    None) and at most a TABLE_PIECES-th of a table, in whole float32s."""
    chunk = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    return max(4, min(chunk, table_bytes // TABLE_PIECES) // 4 * 4)


@dataclass(frozen=True)
class TrainingState:
    """Everything a checkpoint holds but its three tables: where the run stands.

    A run whose tables stay on the device carries this between its invocations; a save
    streams the tables behind its header (`save`), and a load reads them a chunk at a
    time (`CheckpointFile`).
    """

    vocab: int
    step: int  # global AdamW update count; it continues across invocations
    hyper: Hyper
    mode: Mode
    data_digest: str  # of the training data ("v2:" sparse, or legacy); "" before training
    history: tuple[tuple[int, float], ...] = ()
    optimum: float | None = None
    segments: tuple[Segment, ...] = ()
    val_history: tuple[tuple[int, float], ...] = ()
    # The symbols the training data has as a next symbol (generation's --seen-only); None
    # where the checkpoint cannot tell.
    successors: Ranges | None = None
    # How the tables are held: dense V x V, or collapsed (bob.records.collapsed: a rest
    # class per row and K exception columns, `exceptions`).
    tables: Tables = "dense"
    exceptions: int = 0  # K, collapsed tables only

    def __post_init__(self) -> None:
        top = MAX_DENSE_VOCAB if self.tables == "dense" else MAX_VOCAB
        if isinstance(self.vocab, bool) or not isinstance(self.vocab, int) \
                or not MIN_VOCAB <= self.vocab <= top:
            raise ValueError(f"V={self.vocab} is outside [{MIN_VOCAB}, {top}] ({self.tables} "
                             "tables)")
        if self.tables not in TABLES:
            raise ValueError(f"tables must be one of {', '.join(TABLES)}, not {self.tables!r}")
        cells = self.vocab * self.vocab
        if isinstance(self.exceptions, bool) or not isinstance(self.exceptions, int) or not (
                self.exceptions == 0 if self.tables == "dense" else 0 <= self.exceptions <= cells):
            raise ValueError(f"exceptions must be 0 for dense tables and in [0, V*V] for "
                             f"collapsed ones, not {self.exceptions!r}")
        if not isinstance(self.step, int) or isinstance(self.step, bool) \
                or not 0 <= self.step <= MAX_STEP:
            raise ValueError(f"step must be an integer in [0, 2**53], not {self.step!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be 'hard' or 'corpus', not {self.mode!r}")
        if not isinstance(self.hyper, Hyper):  # a Hyper checks its own values
            raise TypeError(f"hyper must be a Hyper, not {type(self.hyper).__name__}")
        problem = (_digest_problem(self.data_digest) or _optimum_problem(self.optimum)
                   or _segments_problem(tuple(self.segments), self.step)
                   or _ranges_problem(self.successors, self.vocab))
        if problem:
            raise ValueError(problem)
        if self.successors is not None:
            object.__setattr__(self, "successors",
                               tuple((int(a), int(b)) for a, b in self.successors))
        # Pairs of (int, float), so equality does not depend on how they were given; a
        # History given is already checked.
        object.__setattr__(self, "history", History.of(self.history))
        object.__setattr__(self, "segments", tuple(self.segments))
        object.__setattr__(self, "val_history", History.of(self.val_history))

    @property
    def classes(self) -> int:
        """Elements of each table: V x V dense, V + K collapsed."""
        if self.tables == "dense":
            return self.vocab * self.vocab
        return self.vocab + self.exceptions

    @property
    def table_bytes(self) -> int:
        return 4 * self.classes

    @property
    def index_bytes(self) -> int:
        """A collapsed checkpoint's index: row offsets u64[V + 1], then columns u32[K]."""
        return 0 if self.tables == "dense" else 8 * (self.vocab + 1) + 4 * self.exceptions

    @property
    def sources(self) -> DataSources | None:
        """How the last segment's data was given (None where the checkpoint does not say)."""
        return self.segments[-1].sources if self.segments else None

    @property
    def file_bytes(self) -> int:
        """The checkpoint file's size: its header, three tables and any index."""
        return len(self.header()) + 3 * self.table_bytes + self.index_bytes

    def metadata(self) -> dict[str, str]:
        return {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "vocab": str(self.vocab),
            "step": str(self.step),
            "mode": self.mode,
            **{name: repr(float(getattr(self.hyper, name))) for name in HYPER_FIELDS},
            **{name: repr(value) for name, value in schedule_fields(self.hyper).items()},
            "data_digest": self.data_digest,
            "created_by": f"bob {bob_version()}",
            **({"history": json.dumps([list(p) for p in self.history])} if self.history else {}),
            **({"optimum": repr(float(self.optimum))} if self.optimum is not None else {}),
            **({"segments": json.dumps([s.to_json() for s in self.segments])}
               if self.segments else {}),
            **({"val_history": json.dumps([list(p) for p in self.val_history])}
               if self.val_history else {}),
            **({"successors": json.dumps([list(r) for r in self.successors])}
               if self.successors is not None else {}),
            **({"tables": self.tables, "exceptions": str(self.exceptions)}
               if self.tables != "dense" else {}),
        }

    def seen(self) -> np.ndarray | None:
        """The mask of V symbols the training data has as a next symbol, or None where the
        checkpoint cannot tell."""
        return None if self.successors is None else ranges_mask(self.successors, self.vocab)

    def header(self) -> bytes:
        """The safetensors header of the checkpoint: its length, then the JSON padded."""
        header: dict[str, object] = {"__metadata__": self.metadata()}
        shape = [self.vocab, self.vocab] if self.tables == "dense" else [self.classes]
        for i, name in enumerate(CHECKPOINT_TENSORS):
            header[name] = {"dtype": "F32", "shape": shape,
                            "data_offsets": [i * self.table_bytes,
                                             (i + 1) * self.table_bytes]}
        if self.tables != "dense":  # the index after the tables (bob.records.collapsed)
            at = 3 * self.table_bytes
            for name, dtype, size, count in index_tensors(self.vocab, self.exceptions):
                header[name] = {"dtype": dtype, "shape": [count],
                                "data_offsets": [at, at + size * count]}
                at += size * count
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % 8)  # safetensors pads with spaces to align the data
        return struct.pack("<Q", len(text)) + text

    def save(self, path: StrPath, deliver: TableDelivery, *, checked: bool = False,
             chunk_bytes: int | None = None) -> None:
        """Write the checkpoint atomically (temporary, fsync, rename): the header, then the
        tables as `deliver` hands them over, each piece written as it comes.

        Every piece is checked as it passes (finite, a non-negative second moment) unless
        `checked` says the caller knows (a device's health check counted no non-finite
        element); the second moment's sign is checked always. A problem abandons the
        temporary and raises RunFailure: the previous checkpoint is kept.
        """
        expected = [(name, 0) for name in CHECKPOINT_TENSORS]

        def write(file: BinaryIO) -> None:
            file.write(self.header())
            at = [0]  # index into expected of the tensor being written

            def sink(name: str, offset: int, data: memoryview) -> None:
                while at[0] < 3 and expected[at[0]][1] == self.table_bytes:
                    at[0] += 1
                if at[0] == 3 or (name, offset) != expected[at[0]]:
                    raise RunFailure(f"{path}: checkpoint not written: the tables came out of "
                                     f"order ({name} at byte {offset}); the previous "
                                     "checkpoint is kept")
                problem = _chunk_problem(name, offset, data, self.vocab,
                                         finite=not checked)
                if problem:
                    raise RunFailure(f"{path}: checkpoint not written: {problem}; the "
                                     "previous checkpoint is kept")
                file.write(data)
                expected[at[0]] = (name, offset + len(data))

            deliver(sink, piece_bytes(self.table_bytes, chunk_bytes))
            if any(done != self.table_bytes for _, done in expected):
                raise RunFailure(f"{path}: checkpoint not written: the tables ended early; "
                                 "the previous checkpoint is kept")
        atomic_write(path, write)


@dataclass(frozen=True)
class ArrayTables:
    """Three tables in host memory, delivered in pieces (no copy)."""

    arrays: tuple[np.ndarray, np.ndarray, np.ndarray]

    def deliver(self, sink: TableSink, chunk_bytes: int = CHUNK_BYTES) -> None:
        for name, array in zip(CHECKPOINT_TENSORS, self.arrays, strict=True):
            data = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
            for offset in range(0, len(data), chunk_bytes):
                sink(name, offset, data[offset:offset + chunk_bytes])


def _chunk_problem(name: str, offset: int, data: memoryview, vocab: int, *,
                   finite: bool = True) -> str | None:
    """What makes a piece of a table unfit to save or load, named by its element."""
    values = np.frombuffer(data, F32)
    first = offset // 4
    if finite:
        bad = ~np.isfinite(values)
        if bad.any():
            i = first + int(np.argmax(bad))
            return f"{name}[{i // vocab}][{i % vocab}] is {values[i - first]} (not finite)"
    if name == "second_moment":
        negative = values < 0
        if negative.any():
            i = first + int(np.argmax(negative))
            return (f"{name}[{i // vocab}][{i % vocab}] = {values[i - first]} is negative "
                    "(it is a mean of squares)")
    return None


class CheckpointFile:
    """A checkpoint on disk, opened without reading its tables: the state from its header,
    the tables read a chunk or a few rows at a time (each piece checked as it is read).

        stored = CheckpointFile.open("bob.safetensors")
        stored.state.step
        stored.rows("parameters", [464])      # f32[1][V]: one row, nothing else read
        stored.deliver(sink)                  # every byte of the tables, in pieces
    """

    def __init__(self, path: StrPath, state: TrainingState, offsets: dict[str, int]):
        self.path = str(path)
        self.state = state
        self._offsets = offsets  # where each table's bytes begin in the file

    @classmethod
    def open(cls, path: StrPath) -> CheckpointFile:
        """Read and check the header; BadInput "<file>: <problem>" when it is not sound.
        A one-piece file only: `bob.records.shards.open_checkpoint` opens either form."""
        source = str(path)
        _check_opening_bytes(path)
        try:
            with safe_open(source, framework="numpy") as file:
                # The metadata first: a foreign safetensors file is "not a Bob checkpoint".
                state = _read_metadata(file.metadata() or {}, source)
                if state.tables != "dense":
                    raise BadInput(f"{source}: a {state.tables} checkpoint, not a dense one "
                                   "(bob.records.shards.open_checkpoint opens either)")
                names = set(file.keys())
                missing = [n for n in CHECKPOINT_TENSORS if n not in names]
                if missing:
                    raise BadInput(f"{source}: no tensor {missing[0]!r} (a Bob checkpoint has "
                                   f"{', '.join(CHECKPOINT_TENSORS)})")
                extra = sorted(names - set(CHECKPOINT_TENSORS))
                if extra:
                    raise BadInput(f"{source}: unexpected tensor {extra[0]!r} (a Bob "
                                   f"checkpoint has only {', '.join(CHECKPOINT_TENSORS)})")
                v = state.vocab
                for name in CHECKPOINT_TENSORS:
                    # From the header, before reading: NumPy has no bfloat16, say.
                    layout = file.get_slice(name)
                    dtype, shape = layout.get_dtype(), list(layout.get_shape())
                    if dtype != "F32":
                        raise BadInput(f"{source}: tensor {name} is {dtype}, not F32 (float32)")
                    if shape != [v, v]:
                        raise BadInput(f"{source}: tensor {name} has shape {shape}, expected "
                                       f"[{v}, {v}] (V={v})")
            offsets = _table_offsets(source)
        except SafetensorError as error:
            reason = reason_of(error)
            raise BadInput(f"{source}: not a readable safetensors file ({reason})") from None
        except OSError as error:
            raise BadInput(f"{source}: cannot read ({error.strerror or error})") from None
        return cls(path, state, offsets)

    def _offset(self, name: str) -> int:
        return self._offsets[name]

    def _read(self, file: BinaryIO, at: int, into: memoryview) -> None:
        file.seek(at)
        if file.readinto(into) != len(into):
            raise BadInput(f"{self.path}: truncated: the tables end before byte "
                           f"{at + len(into)}")

    def rows(self, name: str, indices: Sequence[int]) -> np.ndarray:
        """Rows `indices` of one table (f32[len][V]), read from the file alone and checked."""
        v = self.state.vocab
        out = np.empty((len(indices), v), F32)
        with reading(self.path, "checkpoint") as file:
            for i, row in enumerate(indices):
                if not 0 <= row < v:
                    raise ValueError(f"row {row} is outside the V={v} table")
                view = memoryview(out[i]).cast("B")
                self._read(file, self._offset(name) + 4 * v * row, view)
                problem = _chunk_problem(name, 4 * v * row, view, v)
                if problem:
                    raise BadInput(f"{self.path}: {problem}")
        return out

    def row_block(self, name: str, first: int, last: int) -> np.ndarray:
        """Rows [first, last) of one table (f32[last - first][V]) in one read, checked."""
        v = self.state.vocab
        if not 0 <= first <= last <= v:
            raise ValueError(f"rows [{first}, {last}) are outside the V={v} table")
        out = np.empty((last - first, v), F32)
        view = memoryview(out.reshape(-1)).cast("B")
        with reading(self.path, "checkpoint") as file:
            self._read(file, self._offset(name) + 4 * v * first, view)
        problem = _chunk_problem(name, 4 * v * first, view, v)
        if problem:
            raise BadInput(f"{self.path}: {problem}")
        return out

    def mapped(self, name: str) -> np.ndarray:
        """One table as a read-only f32[V][V] memory map of the file: its pages are read as
        they are touched, and nothing is checked (`rows` and `deliver` check what they
        read)."""
        v = self.state.vocab
        try:
            return np.memmap(self.path, F32, mode="r", offset=self._offset(name), shape=(v, v))
        except (OSError, ValueError) as error:
            raise BadInput(f"{self.path}: cannot map the {name} table ({error})") from None

    def deliver(self, sink: TableSink, chunk_bytes: int | None = None,
                names: Sequence[str] = CHECKPOINT_TENSORS) -> None:
        """Every byte of these tables (all three by default) to `sink`, a checked chunk at a
        time, through two buffers of a piece each (`piece_bytes`: the host holds no
        table)."""
        chunk_bytes = piece_bytes(self.state.table_bytes, chunk_bytes)
        buffers = [bytearray(chunk_bytes) for _ in range(2)]
        turn = 0
        with reading(self.path, "checkpoint") as file:
            for name in names:
                start = self._offset(name)
                for offset in range(0, self.state.table_bytes, chunk_bytes):
                    size = min(chunk_bytes, self.state.table_bytes - offset)
                    view = memoryview(buffers[turn])[:size]
                    turn = 1 - turn
                    self._read(file, start + offset, view)
                    problem = _chunk_problem(name, offset, view, self.state.vocab)
                    if problem:
                        raise BadInput(f"{self.path}: {problem}")
                    sink(name, offset, view)

    def load(self) -> Checkpoint:
        """The whole checkpoint in host memory (three V x V tables)."""
        tables = [np.empty((self.state.vocab, self.state.vocab), F32) for _ in range(3)]

        def keep(name: str, offset: int, data: memoryview) -> None:
            flat = tables[CHECKPOINT_TENSORS.index(name)].reshape(-1).view(np.uint8)
            flat[offset:offset + len(data)] = np.frombuffer(data, np.uint8)

        self.deliver(keep)
        return Checkpoint.of(self.state, *tables)


@dataclass(frozen=True, eq=False)
class StartingPoint:
    """A training state and where its tables come from, with no table in host memory: a
    checkpoint file (its chunks streamed into the arena) or none (every table zero)."""

    state: TrainingState
    source: CheckpointFile | None = None  # None: three zero tables

    def evolved(self, state: TrainingState, tables: dict[str, np.ndarray]) -> Checkpoint:
        """The state after an invocation from here, its tables as read back (V x V)."""
        return Checkpoint.of(state, *(_square(tables[name], state.vocab)
                                      for name in CHECKPOINT_TENSORS))

    @classmethod
    def fresh(cls, vocab: int, hyper: Hyper = DEFAULT_HYPER, mode: Mode = "hard",
              data_digest: str = "") -> StartingPoint:
        """A zero table and zero moments at step 0 (Checkpoint.zeros, without the zeros)."""
        return cls(TrainingState(vocab, 0, hyper, mode, data_digest))


PARAMETERS_FORMAT = "bob-parameters"


def export_parameters(stored: CheckpointFile, out: StrPath) -> int:
    """The checkpoint's parameters alone as a safetensors file (one F32 [V, V] tensor,
    `parameters`, and the checkpoint's metadata but its format), written atomically a
    chunk at a time; the bytes written."""
    if stored.state.vocab > MAX_DENSE_VOCAB:
        v = stored.state.vocab
        raise BadInput(f"{out}: the dense parameters of V={v} are {4 * v * v / 2**30:.0f} GiB, "
                       f"past the largest dense table Bob writes (V={MAX_DENSE_VOCAB})")
    # The dense table whatever the checkpoint's layout (a collapsed one delivers its rows
    # expanded).
    state = replace(stored.state, tables="dense", exceptions=0)
    metadata = {**state.metadata(), "format": PARAMETERS_FORMAT}
    header = {"__metadata__": metadata,
              "parameters": {"dtype": "F32", "shape": [state.vocab, state.vocab],
                             "data_offsets": [0, state.table_bytes]}}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)

    def write(file: BinaryIO) -> None:
        file.write(struct.pack("<Q", len(text)) + text)
        stored.deliver(lambda name, offset, data: file.write(data), names=("parameters",))

    atomic_write(out, write)
    return 8 + len(text) + state.table_bytes


def _table_offsets(source: str) -> dict[str, int]:
    """Where each table's bytes begin in a checkpoint file, as its header says (safetensors
    has checked the header against the file; any order of the tables is one it reads)."""
    with reading(source, "checkpoint") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    return {name: 8 + length + header[name]["data_offsets"][0] for name in CHECKPOINT_TENSORS}


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """The training state: what the arena's first three tensors hold, plus where it stands."""

    parameters: np.ndarray  # f32[V][V]: the logits table W
    first_moment: np.ndarray  # f32[V][V]: AdamW's m
    second_moment: np.ndarray  # f32[V][V]: AdamW's v
    step: int  # global AdamW update count; it continues across invocations
    hyper: Hyper
    mode: Mode
    data_digest: str  # the data's digest (bob.records.digest); "" before any training
    history: tuple[tuple[int, float], ...] = ()  # (step, objective) for the loss curve
    optimum: float | None = None  # the data's least reachable objective, where known
    segments: tuple[Segment, ...] = ()  # what trained each step range; () in old checkpoints
    val_history: tuple[tuple[int, float], ...] = ()  # (step, validation loss), with --val
    successors: Ranges | None = None  # the data's next symbols (TrainingState.successors)

    def __post_init__(self) -> None:
        shape = None
        for name in CHECKPOINT_TENSORS:
            array = getattr(self, name)
            if not isinstance(array, np.ndarray) or array.dtype != F32:
                raise TypeError(f"{name} must be a float32 array")
            if array.ndim != 2 or array.shape[0] != array.shape[1]:
                raise ValueError(f"{name} has shape {array.shape}, expected [V, V]")
            if shape is not None and array.shape != shape:
                raise ValueError(f"{name} has shape {array.shape}, parameters {shape}")
            shape = array.shape
            view = np.ascontiguousarray(array).view()
            view.flags.writeable = False
            object.__setattr__(self, name, view)
        state = self.state  # the metadata, checked by the state's own rules
        for name in ("history", "segments", "val_history", "successors"):
            object.__setattr__(self, name, getattr(state, name))

    @property
    def vocab(self) -> int:
        return self.parameters.shape[0]

    @classmethod
    def zeros(cls, vocab: int, hyper: Hyper = DEFAULT_HYPER, mode: Mode = "hard",
              data_digest: str = "") -> Checkpoint:
        """The initial state: a zero table and zero moments at step 0."""
        def table() -> np.ndarray:
            return np.zeros((vocab, vocab), F32)
        return cls(table(), table(), table(), 0, hyper, mode, data_digest)

    def with_history(self, history: tuple[tuple[int, float], ...]) -> Checkpoint:
        return replace(self, history=history)

    def with_segments(self, segments: tuple[Segment, ...]) -> Checkpoint:
        return replace(self, segments=segments)

    # -- the arena -------------------------------------------------------------
    def arena_bytes(self) -> bytes:
        """The three tables' bytes, contiguous, in arena order."""
        return b"".join(memoryview(getattr(self, name).reshape(-1).view(np.uint8))
                        for name in CHECKPOINT_TENSORS)

    @classmethod
    def from_arena(cls, data: bytes, vocab: int, *, step: int, hyper: Hyper, mode: Mode,
                   data_digest: str) -> Checkpoint:
        """A checkpoint from the three tables' bytes as arena_bytes() lays them out."""
        table_bytes = 4 * vocab * vocab
        if len(data) != 3 * table_bytes:
            raise ValueError(f"the checkpoint tables are {len(data)} bytes; V={vocab} needs "
                             f"{3 * table_bytes}")
        data = data if isinstance(data, bytes) else bytes(data)  # the arrays are views
        tables = [np.frombuffer(data, F32, vocab * vocab, i * table_bytes).reshape(vocab, vocab)
                  for i in range(3)]
        return cls(*tables, step=step, hyper=hyper, mode=mode, data_digest=data_digest)

    # -- files -----------------------------------------------------------------
    @property
    def state(self) -> TrainingState:
        """Everything but the tables."""
        return TrainingState(self.vocab, self.step, self.hyper, self.mode, self.data_digest,
                             self.history, self.optimum, self.segments, self.val_history,
                             self.successors)

    @classmethod
    def of(cls, state: TrainingState, parameters: np.ndarray, first_moment: np.ndarray,
           second_moment: np.ndarray) -> Checkpoint:
        """A state and its three tables."""
        return cls(parameters, first_moment, second_moment, step=state.step, hyper=state.hyper,
                   mode=state.mode, data_digest=state.data_digest, history=state.history,
                   optimum=state.optimum, segments=state.segments,
                   val_history=state.val_history, successors=state.successors)

    def evolved(self, state: TrainingState, tables: dict[str, np.ndarray]) -> Checkpoint:
        """The state after an invocation from here, its tables as read back (V x V)."""
        return Checkpoint.of(state, *(_square(tables[name], state.vocab)
                                      for name in CHECKPOINT_TENSORS))

    def with_state(self, state: TrainingState) -> Checkpoint:
        """These tables with another state's metadata (its histories, say)."""
        return Checkpoint.of(state, self.parameters, self.first_moment, self.second_moment)

    def metadata(self) -> dict[str, str]:
        return self.state.metadata()

    def tables(self) -> ArrayTables:
        """The three tables as a source a save or a load streams."""
        return ArrayTables(tuple(getattr(self, name) for name in CHECKPOINT_TENSORS))

    def save(self, path: StrPath) -> None:
        """Write atomically; refuse (RunFailure) a state that would not load, before any
        byte is written."""
        for name in CHECKPOINT_TENSORS:
            problem = _table_problem(name, getattr(self, name))
            if problem:
                raise RunFailure(f"{path}: checkpoint not written: {problem}; the previous "
                                 f"checkpoint is kept")
        self.state.save(path, self.tables().deliver, checked=True)

    @classmethod
    def load(cls, path: StrPath) -> Checkpoint:
        """Read and check a checkpoint; BadInput "<file>: <problem>" when it is not sound."""
        return CheckpointFile.open(path).load()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        return (self.step == other.step and self.hyper == other.hyper
                and self.mode == other.mode and self.data_digest == other.data_digest
                and self.history == other.history and self.optimum == other.optimum
                and self.segments == other.segments
                and self.val_history == other.val_history
                and self.successors == other.successors
                and all(arrays_identical(getattr(self, n), getattr(other, n))
                        for n in CHECKPOINT_TENSORS))

    __hash__ = None  # type: ignore[assignment]  # holds arrays

    def __repr__(self) -> str:
        return (f"Checkpoint(V={self.vocab}, step={self.step}, mode={self.mode!r}, "
                f"hyper={self.hyper!r}, data_digest={self.data_digest[:12]!r})")


def _square(data: np.ndarray, vocab: int) -> np.ndarray:
    """A V x V float32 table over bytes read back (read-only: the arena may hold them)."""
    table = np.asarray(data).view(F32).reshape(vocab, vocab)
    table.flags.writeable = False
    return table


def _check_opening_bytes(path: StrPath) -> None:
    """Missing, empty, or one of Bob's other files: say so before safetensors does."""
    with reading(path, "checkpoint") as file:
        head = file.read(8)
    if not head:
        raise BadInput(f"{path}: empty file, not a checkpoint")
    if head == INPUT_MAGIC:
        raise BadInput(f"{path}: this is a Bob input record, not a checkpoint")
    if head == RESULT_MAGIC:
        raise BadInput(f"{path}: this is a Bob result record, not a checkpoint")


def _read_metadata(metadata: dict[str, str], source: str) -> TrainingState:
    """Every field present and well formed, or BadInput naming the first that is not."""
    require_fields(metadata, source, kind="checkpoint", format_name=FORMAT,
                   required=REQUIRED_METADATA)
    version = read_integers(metadata, ("format_version",), source)["format_version"]
    if version != FORMAT_VERSION:
        raise BadInput(f"{source}: unsupported checkpoint format version {version} "
                       f"(this Bob reads version {FORMAT_VERSION})")
    integers = read_integers(metadata, ("vocab", "step"), source)
    tables = metadata.get("tables", "dense")
    if tables not in TABLES:
        raise BadInput(f"{source}: metadata tables {tables!r} is not one of "
                       f"{', '.join(TABLES)}")
    exceptions = 0
    if tables != "dense":
        if "exceptions" not in metadata:
            raise BadInput(f"{source}: metadata field 'exceptions' is missing (a {tables} "
                           "checkpoint names its exception columns' count)")
        exceptions = read_integers(metadata, ("exceptions",), source)["exceptions"]
    top = MAX_DENSE_VOCAB if tables == "dense" else MAX_VOCAB
    if not MIN_VOCAB <= integers["vocab"] <= top:
        raise BadInput(f"{source}: metadata vocab {integers['vocab']} is outside "
                       f"[{MIN_VOCAB}, {top}] ({tables} tables)")
    if exceptions > integers["vocab"] ** 2:
        raise BadInput(f"{source}: metadata exceptions {exceptions} is more than the "
                       f"V*V = {integers['vocab'] ** 2} cells of the table")
    if metadata["mode"] not in MODES:
        raise BadInput(f"{source}: metadata mode {metadata['mode']!r} is not 'hard' or "
                       f"'corpus'")
    values = {name: read_number(metadata, name, source) for name in HYPER_FIELDS}
    schedule: dict[str, object] = {}
    if "warmup_steps" in metadata:
        schedule["warmup_steps"] = read_integers(metadata, ("warmup_steps",),
                                                 source)["warmup_steps"]
    if "lr_decay_steps" in metadata:
        schedule["lr_decay_steps"] = read_integers(metadata, ("lr_decay_steps",),
                                                   source)["lr_decay_steps"]
    if "min_lr" in metadata:
        schedule["min_lr"] = read_number(metadata, "min_lr", source)
    try:
        hyper = Hyper(**values, **schedule)  # type: ignore[arg-type]
    except BadInput as problem:
        raise BadInput(f"{source}: metadata {problem}") from None
    problem = _digest_problem(metadata["data_digest"])
    if problem:
        raise BadInput(f"{source}: metadata {problem}")
    history = _read_history(metadata, "history", source)
    val_history = _read_history(metadata, "val_history", source)
    optimum = None
    if "optimum" in metadata:
        optimum = read_number(metadata, "optimum", source)
        problem = _optimum_problem(optimum)
        if problem:
            raise BadInput(f"{source}: metadata {problem}")
    segments = _read_segments(metadata, source, integers["step"])
    successors = _read_successors(metadata, source, integers["vocab"])
    return TrainingState(vocab=integers["vocab"], step=integers["step"],
                   mode=metadata["mode"],  # type: ignore[arg-type]  # checked against MODES
                   hyper=hyper, data_digest=metadata["data_digest"],
                   history=tuple((step, float(loss)) for step, loss in history),
                   optimum=optimum, segments=segments,
                   val_history=tuple((step, float(loss)) for step, loss in val_history),
                   successors=successors, tables=tables,  # type: ignore[arg-type]
                   exceptions=exceptions)


def _read_successors(metadata: dict[str, str], source: str, vocab: int) -> Ranges | None:
    ranges = _json_list(metadata, "successors", source, "a list of [first, last] ranges")
    if ranges is None:
        return None  # the checkpoint cannot tell
    if not ranges:  # data of two symbols or more has a next symbol: none is no training data
        raise BadInput(f"{source}: metadata successors is empty (training data has at least "
                       "one next symbol)")
    problem = _ranges_problem(ranges, vocab)
    if problem:
        raise BadInput(f"{source}: metadata {problem}")
    return tuple((first, last) for first, last in ranges)


def _read_segments(metadata: dict[str, str], source: str, step: int) -> tuple[Segment, ...]:
    entries = _json_list(metadata, "segments", source, "a list")
    if entries is None:
        return ()  # written before Bob kept segments: still a good checkpoint
    segments = []
    for entry in entries:
        segment = _segment_from_json(entry)
        if isinstance(segment, str):
            raise BadInput(f"{source}: metadata {segment}")
        segments.append(segment)
    problem = _segments_problem(tuple(segments), step)
    if problem:
        raise BadInput(f"{source}: metadata {problem}")
    return tuple(segments)


# -- one run at a time ---------------------------------------------------------
def lock_path(path: StrPath) -> Path:
    """CKPT.lock beside the checkpoint (beside the file a link points to: every name of a
    checkpoint shares one lock)."""
    return Path(f"{write_target(path)}.lock")


@contextlib.contextmanager
def checkpoint_lock(path: StrPath) -> Iterator[None]:
    """Hold CKPT.lock (flock) for a run; BadInput naming the holder when another run has it.

    The lock file says "pid P on host H". It is removed on release; a run that
    opened it just before the removal finds another inode at the path and retries,
    so two runs can never both hold the checkpoint.
    """
    where = lock_path(path)
    fd = _acquire(where, path)
    try:
        _write_holder(fd, where, path)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(where)
        os.close(fd)


def _write_holder(fd: int, where: Path, path: StrPath) -> None:
    """"pid P on host H" into the lock file; a full disk or a failing device is a
    RunFailure naming the lock file (the lock is then released and removed)."""
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    except OSError as error:
        raise RunFailure(f"{path}: cannot write the lock file {where} "
                         f"({error.strerror or error}); the checkpoint is untouched") from None


def _acquire(where: Path, path: StrPath) -> int:
    while True:
        try:
            fd = os.open(where, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise BadInput(f"{path}: cannot create the lock file {where} "
                           f"({error.strerror or error})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise BadInput(f"{path}: in use by another run ({holder}); lock file "
                           f"{where}") from None
        if _same_file(fd, where):
            return fd
        os.close(fd)  # the holder removed it as we opened it: take the new one


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", errors="replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"


def _same_file(fd: int, where: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(where).st_ino
    except FileNotFoundError:
        return False


def _read_history(metadata: dict[str, str], name: str, source: str) -> list:
    """A [[step, loss], ...] field, checked; [] when absent."""
    history = _json_list(metadata, name, source, "a list of [step, loss] pairs")
    if history is None:
        return []
    problem = _history_problem(history, name)
    if problem:
        raise BadInput(f"{source}: metadata {problem}")
    return history


def _json_list(metadata: dict[str, str], name: str, source: str, shape: str) -> list | None:
    """A metadata field holding a JSON list (`shape` says of what, for the refusal); None
    when absent."""
    if name not in metadata:
        return None
    try:
        value = json.loads(metadata[name])
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        raise BadInput(f"{source}: metadata {name} is not JSON") from None
    if not isinstance(value, list):
        raise BadInput(f"{source}: metadata {name} is not {shape}")
    return value
