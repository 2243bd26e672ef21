"""Sharded checkpoints: row shards of the three tables in several safetensors files and an
index, in the Hugging Face convention (``model-00001-of-00004.safetensors`` ... and
``model.safetensors.index.json``).

For a checkpoint named CKPT.safetensors trained in K row shards:

    CKPT.safetensors.index.json                     the index, written last
    CKPT.step<S>-00001-of-0000K.safetensors ...     shard i: rows [a_i, b_i) at step S

Shard i's file holds three F32 tensors of shape [b_i - a_i, V], named by their rows:
``parameters[a:b]``, ``first_moment[a:b]``, ``second_moment[a:b]``, and the metadata
``format`` = "bob-checkpoint-shard", ``format_version``, ``vocab``, ``step`` and ``rows``
("a:b"). The index is JSON:

    {"metadata": {"total_size": <bytes of the shards' tensors>,
                  <every field of a one-piece checkpoint's metadata, as strings>,
                  "shards": [{"file": ..., "rows": [a, b], "sha256": ..., "bytes": ...}]},
     "weight_map": {"parameters[0:2048]": "CKPT.step200-00001-of-00004.safetensors", ...}}

The step in the shard names is what keeps the last checkpoint whole: a save writes the
new shards beside the old ones (each atomically), then the index (atomically: the commit),
and only then removes the files the old index named. A run stopped at any point leaves an
index whose every shard is on disk as it names it. Reading checks the index against the
files: every shard present, rows covering [0, V) exactly once, each file's header, and each
file's sha256 (read once as the checkpoint is opened).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from safetensors import SafetensorError, safe_open

from bob.config import CHECKPOINT_TENSORS
from bob.errors import BadInput, RunFailure, reason_of, shown
from bob.files import StrPath, atomic_write, reading, require_named
from bob.records.binary import F32
from bob.records.checkpoint import (
    Checkpoint,
    CheckpointFile,
    TableSink,
    TrainingState,
    _chunk_problem,
    _read_metadata,
    piece_bytes,
)
from bob.records.collapsed import CollapsedCheckpoint, checkpoint_tables

SHARD_FORMAT = "bob-checkpoint-shard"
SHARD_FORMAT_VERSION = 1
INDEX_SUFFIX = ".index.json"
HASH_PIECE_BYTES = 16 << 20  # a digest reads a file in pieces of this size
PARALLEL_PIECE_BYTES = 1 << 20  # a saved piece this large is written, hashed, checked at once

# Rows [first, last) of the V x V table.
Rows = tuple[int, int]
# What a shard save hands its tables to: (table, byte offset in the shard's table, bytes).
ShardDelivery = Callable[[TableSink, int], None]


def index_path(checkpoint: StrPath) -> str:
    """The index of a sharded checkpoint named `checkpoint` (its own name if it is one)."""
    text = str(checkpoint)
    return text if text.endswith(INDEX_SUFFIX) else text + INDEX_SUFFIX


def is_sharded(checkpoint: StrPath) -> bool:
    """Whether `checkpoint` names a sharded checkpoint: an index, or a name whose one-piece
    file is absent and whose index is present."""
    text = str(checkpoint)
    if text.endswith(INDEX_SUFFIX):
        return True
    return not os.path.lexists(text) and os.path.exists(index_path(text))


def checkpoint_exists(checkpoint: StrPath) -> bool:
    """A one-piece file or a sharded checkpoint's index under this name."""
    return os.path.lexists(str(checkpoint)) or os.path.exists(index_path(checkpoint))


def one_piece_path(checkpoint: StrPath) -> str:
    """The one-piece name of a checkpoint given by its index or its own name."""
    text = str(checkpoint)
    return text[:-len(INDEX_SUFFIX)] if text.endswith(INDEX_SUFFIX) else text


def shard_file(checkpoint: StrPath, step: int, index: int, count: int) -> str:
    """Shard `index` (from 0) of `count` at `step`: beside the index, the checkpoint's stem
    then the step and the Hugging Face ``-00001-of-00004.safetensors``."""
    base = one_piece_path(checkpoint)
    stem = base[:-len(".safetensors")] if base.endswith(".safetensors") else base
    return f"{stem}.step{step}-{index + 1:05d}-of-{count:05d}.safetensors"


def tensor_name(table: str, rows: Rows) -> str:
    return f"{table}[{rows[0]}:{rows[1]}]"


def _shard_header(vocab: int, step: int, rows: Rows) -> bytes:
    first, last = rows
    table_bytes = 4 * (last - first) * vocab
    header: dict[str, object] = {"__metadata__": {
        "format": SHARD_FORMAT, "format_version": str(SHARD_FORMAT_VERSION),
        "vocab": str(vocab), "step": str(step), "rows": f"{first}:{last}"}}
    for i, table in enumerate(CHECKPOINT_TENSORS):
        header[tensor_name(table, rows)] = {
            "dtype": "F32", "shape": [last - first, vocab],
            "data_offsets": [i * table_bytes, (i + 1) * table_bytes]}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the index names it."""

    file: str  # its name, beside the index
    rows: Rows
    sha256: str
    bytes: int  # the file's size

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "rows": list(self.rows), "sha256": self.sha256,
                "bytes": self.bytes}


class _HashingFile:
    """Writes through to a file and hashes what passes: a large piece is written, hashed
    and checked at once on three threads (each releases the GIL), so a shard streams out
    at the pace of the slowest of them rather than of their sum."""

    def __init__(self, file: BinaryIO, pool: ThreadPoolExecutor):
        self.file, self.digest, self.size, self.pool = file, hashlib.sha256(), 0, pool

    def write(self, data: bytes | memoryview, check: Callable[[], None] | None = None) -> None:
        if len(data) < PARALLEL_PIECE_BYTES:
            if check is not None:
                check()
            self.file.write(data)
            self.digest.update(data)
        else:
            hashed = self.pool.submit(self.digest.update, data)
            checked = self.pool.submit(check) if check is not None else None
            try:
                self.file.write(data)
            finally:  # the piece's buffer is the caller's again only once both are done
                hashed.result()
                if checked is not None:
                    checked.result()
        self.size += len(data)


def write_shard(path: StrPath, vocab: int, step: int, rows: Rows,
                deliver: ShardDelivery) -> ShardEntry:
    """Shard file `path` for rows [first, last) at `step`, written atomically from
    `deliver` (the three tables' bytes in order, a piece at a time); each piece is checked
    as it passes (finite, a non-negative second moment), a problem raising RunFailure with
    nothing written. The entry the index names it by."""
    first, last = rows
    table_bytes = 4 * (last - first) * vocab
    written: list[_HashingFile] = []

    def write(file: BinaryIO) -> None:
        with ThreadPoolExecutor(2, thread_name_prefix="bob-shard-save") as pool:
            out = _HashingFile(file, pool)
            written.append(out)
            out.write(_shard_header(vocab, step, rows))
            expected = [0, 0, 0]

            def sink(table: str, offset: int, data: memoryview) -> None:
                at = CHECKPOINT_TENSORS.index(table)
                if any(done != table_bytes for done in expected[:at]) or offset != expected[at]:
                    raise RunFailure(f"{path}: shard not written: its tables came out of "
                                     f"order ({table} at byte {offset}); the previous "
                                     "checkpoint is kept")

                def check() -> None:  # a problem leaves nothing: the write is atomic
                    problem = _chunk_problem(table, offset + 4 * first * vocab, data, vocab)
                    if problem:
                        raise RunFailure(f"{path}: shard not written: {problem}; the "
                                         "previous checkpoint is kept")

                out.write(data, check)
                expected[at] += len(data)

            deliver(sink, piece_bytes(table_bytes))
        if expected != [table_bytes] * 3:
            raise RunFailure(f"{path}: shard not written: its tables ended early; the "
                             "previous checkpoint is kept")

    atomic_write(path, write)
    return ShardEntry(os.path.basename(str(path)), rows, written[-1].digest.hexdigest(),
                      written[-1].size)


def write_index(checkpoint: StrPath, state: TrainingState,
                shards: Sequence[ShardEntry]) -> str:
    """The index over `shards` (written), atomically: the commit of a sharded save. Then
    the shard files of the index it replaces that it does not name are removed (only
    those `old_shard_files` admits). The path."""
    where = index_path(checkpoint)
    previous = {os.path.basename(path) for path in old_shard_files(checkpoint)}
    table_bytes = sum(3 * 4 * (s.rows[1] - s.rows[0]) * state.vocab for s in shards)
    index = {"metadata": {"total_size": table_bytes, **state.metadata(),
                          "shards": [s.to_json() for s in shards]},
             "weight_map": {tensor_name(table, s.rows): s.file
                            for s in shards for table in CHECKPOINT_TENSORS}}
    atomic_write(where, (json.dumps(index, indent=1) + "\n").encode("utf-8"))
    kept = {s.file for s in shards}
    directory = Path(where).parent
    for name in previous - kept:
        with contextlib.suppress(OSError):
            os.unlink(directory / name)
    return where


def old_shard_files(checkpoint: StrPath) -> list[str]:
    """The shard files of the sharded checkpoint now under this name that a new save may
    remove once its own commit is on disk: those its index names where the index is
    sound (`_read_index`: its metadata, shards covering the rows once, its weight map),
    and only those named as Bob names a shard of this checkpoint at the index's step
    (`shard_file`). An index nobody here wrote may name any file beside it (a text, a
    counts file); none of those is removed, and neither is anything of an index that is
    not sound. Paths beside the index, in row order."""
    where = index_path(checkpoint)
    try:
        state, shards = _read_index(where)
    except BadInput:
        return []
    directory = os.path.dirname(where)
    ours = {os.path.basename(shard_file(checkpoint, state.step, i, len(shards)))
            for i in range(len(shards))}
    return [os.path.join(directory, s.file) for s in shards if s.file in ours]


def remove_sharded(checkpoint: StrPath) -> list[str]:
    """Remove the sharded checkpoint under this name, as far as it is Bob's: its shard
    files (`old_shard_files`) and its index, where the index is sound; a one-piece
    checkpoint written over the name has replaced it. The paths removed."""
    where = index_path(checkpoint)
    files = old_shard_files(checkpoint)
    if not files:
        return []  # no index, or one that is not sound: nothing of it is known to be Bob's
    removed = []
    for path in (where, *files):  # the index first: no index is left naming missing shards
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(path)
    return removed


def _read_index(where: str) -> tuple[TrainingState, tuple[ShardEntry, ...]]:
    """The index's state and shards, checked as far as the index alone tells: JSON, its
    metadata, shards covering [0, V) once and the weight map that follows from them.
    BadInput "<index>: <problem>" otherwise."""
    try:
        with reading(where, "checkpoint index") as file:
            text = file.read()
        index = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BadInput(f"{where}: not a JSON checkpoint index") from None
    metadata = index.get("metadata") if isinstance(index, dict) else None
    if not isinstance(metadata, dict) or not isinstance(index.get("weight_map"), dict):
        raise BadInput(f"{where}: not a checkpoint index (it needs \"metadata\" and "
                       "\"weight_map\" objects)")
    state = _read_metadata({k: v for k, v in metadata.items() if isinstance(v, str)}, where)
    shards = _read_entries(metadata.get("shards"), where, state.vocab)
    _check_weight_map(index["weight_map"], shards, where)
    return state, shards


def file_sha256(path: StrPath) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while piece := file.read(HASH_PIECE_BYTES):
            digest.update(piece)
    return digest.hexdigest()


class ShardedCheckpoint:
    """A sharded checkpoint on disk, opened and checked without reading its tables into
    memory: the same reads as `CheckpointFile` (state, rows, row blocks, deliver, load).

        stored = ShardedCheckpoint.open("bob.safetensors.index.json")
        stored.row_block("parameters", 0, 100)   # f32[100][V], from whichever shards
    """

    def __init__(self, path: str, state: TrainingState, shards: tuple[ShardEntry, ...],
                 offsets: tuple[dict[str, int], ...]):
        self.path = path
        self.state = state
        self.shards = shards
        self._offsets = offsets  # per shard: where each table's bytes begin in its file

    @classmethod
    def written(cls, path: StrPath, state: TrainingState,
                shards: tuple[ShardEntry, ...]) -> ShardedCheckpoint:
        """The checkpoint a save just wrote, known without reading it back: its tables'
        offsets follow from the headers `write_shard` writes."""
        offsets = []
        for shard in shards:
            header = len(_shard_header(state.vocab, state.step, shard.rows))
            table_bytes = 4 * (shard.rows[1] - shard.rows[0]) * state.vocab
            offsets.append({table: header + i * table_bytes
                            for i, table in enumerate(CHECKPOINT_TENSORS)})
        return cls(index_path(path), state, shards, tuple(offsets))

    @property
    def boundaries(self) -> tuple[Rows, ...]:
        return tuple(s.rows for s in self.shards)

    @classmethod
    def open(cls, path: StrPath) -> ShardedCheckpoint:
        """Read and check the index and every shard it names; BadInput "<index>: <problem>"
        (one line) when the checkpoint is not sound."""
        where = index_path(path)
        state, shards = _read_index(where)
        directory = Path(where).parent
        offsets = tuple(_check_shard_file(directory / s.file, s, state, where)
                        for s in shards)
        return cls(where, state, shards, offsets)

    def _shard_path(self, shard: ShardEntry) -> Path:
        return Path(self.path).parent / shard.file

    def row_block(self, name: str, first: int, last: int) -> np.ndarray:
        """Rows [first, last) of one table, f32[last - first][V], read from the shards that
        hold them and checked."""
        v = self.state.vocab
        out = np.empty((last - first, v), F32)
        for shard, offsets in zip(self.shards, self._offsets, strict=True):
            low, high = max(first, shard.rows[0]), min(last, shard.rows[1])
            if low >= high:
                continue
            view = memoryview(out[low - first:high - first].reshape(-1)).cast("B")
            at = offsets[name] + 4 * v * (low - shard.rows[0])
            with reading(self._shard_path(shard), "checkpoint shard") as file:
                file.seek(at)
                if file.readinto(view) != len(view):
                    raise BadInput(f"{self.path}: shard {shard.file} is truncated")
            problem = _chunk_problem(name, 4 * v * low, view, v)
            if problem:
                raise BadInput(f"{self.path}: {problem}")
        return out

    def rows(self, name: str, indices: Sequence[int]) -> np.ndarray:
        """Rows `indices` of one table (f32[len][V]), each read from its shard."""
        v = self.state.vocab
        out = np.empty((len(indices), v), F32)
        for i, row in enumerate(indices):
            if not 0 <= row < v:
                raise ValueError(f"row {row} is outside the V={v} table")
            out[i] = self.row_block(name, row, row + 1)[0]
        return out

    def mapped(self, name: str) -> np.ndarray:
        """One whole table, read from the shards (a sharded checkpoint has no one file to
        map): f32[V][V] in host memory."""
        return self.row_block(name, 0, self.state.vocab)

    def deliver(self, sink: TableSink, chunk_bytes: int | None = None,
                names: Sequence[str] = CHECKPOINT_TENSORS) -> None:
        """Every byte of these tables to `sink` in the one-piece order (table by table,
        row by row), a piece of whole rows at a time: the host holds no table."""
        v = self.state.vocab
        rows_each = max(1, piece_bytes(self.state.table_bytes, chunk_bytes) // (4 * v))
        for name in names:
            for first in range(0, v, rows_each):
                last = min(v, first + rows_each)
                block = self.row_block(name, first, last)
                sink(name, 4 * v * first, memoryview(block.reshape(-1)).cast("B"))

    def load(self) -> Checkpoint:
        """The whole checkpoint in host memory (three V x V tables)."""
        tables = [self.row_block(name, 0, self.state.vocab) for name in CHECKPOINT_TENSORS]
        return Checkpoint.of(self.state, *tables)


def _read_entries(entries: object, where: str, vocab: int) -> tuple[ShardEntry, ...]:
    """The index's shards, in row order, covering [0, V) exactly once."""
    if not isinstance(entries, list) or not entries:
        raise BadInput(f"{where}: metadata shards is not a non-empty list")
    shards = []
    for entry in entries:
        if not (isinstance(entry, dict) and set(entry) == {"file", "rows", "sha256", "bytes"}
                and isinstance(entry["file"], str) and entry["file"]
                and os.path.basename(entry["file"]) == entry["file"]
                and isinstance(entry["rows"], list) and len(entry["rows"]) == 2
                and all(isinstance(r, int) and not isinstance(r, bool) for r in entry["rows"])
                and isinstance(entry["sha256"], str) and isinstance(entry["bytes"], int)):
            raise BadInput(f"{where}: shard entry {shown(entry)} is not {{file (a name beside the "
                           "index), rows [first, last), sha256, bytes}")
        shards.append(ShardEntry(entry["file"], tuple(entry["rows"]), entry["sha256"],
                                 entry["bytes"]))
    shards.sort(key=lambda s: s.rows)
    covered = 0
    for shard in shards:
        first, last = shard.rows
        if not first < last <= vocab:
            raise BadInput(f"{where}: shard {shard.file} holds rows [{first}, {last}), not "
                           f"a range inside the V={vocab} table")
        if first < covered:
            raise BadInput(f"{where}: shard {shard.file}'s rows [{first}, {last}) overlap "
                           f"the rows before it (to {covered})")
        if first > covered:
            raise BadInput(f"{where}: rows [{covered}, {first}) are in no shard")
        covered = last
    if covered != vocab:
        raise BadInput(f"{where}: rows [{covered}, {vocab}) are in no shard")
    return tuple(shards)


def _check_weight_map(weight_map: dict, shards: tuple[ShardEntry, ...], where: str) -> None:
    """BadInput naming the first tensor (in name order) that `weight_map` maps otherwise
    than the shards' rows do. Its values are compared, never hashed: an index nobody here
    wrote may map a tensor to a list or an object."""
    wanted = {tensor_name(table, s.rows): s.file for s in shards for table in CHECKPOINT_TENSORS}
    if weight_map == wanted:
        return
    # JSON's keys are strings, so every name sorts.
    for name in sorted(set(weight_map) | set(wanted)):
        if name not in weight_map:
            raise BadInput(f"{where}: weight_map has no entry for {name!r} (the shards' "
                           f"rows put it in {wanted[name]!r})")
        if name not in wanted:
            raise BadInput(f"{where}: weight_map names {name!r}, a tensor of no shard "
                           "the index lists")
        if weight_map[name] != wanted[name]:
            raise BadInput(f"{where}: weight_map disagrees with the shards' rows at "
                           f"{name!r} -> {shown(weight_map[name])} (the shards' rows "
                           f"put it in {wanted[name]!r})")



def _check_shard_file(path: Path, shard: ShardEntry, state: TrainingState,
                      where: str) -> dict[str, int]:
    """The shard file as the index names it: present, its size and digest, its header's
    metadata and tensors. Where each table's bytes begin."""
    if not path.is_file():
        raise BadInput(f"{where}: shard file {shard.file} is missing")
    size = path.stat().st_size
    if size != shard.bytes or file_sha256(path) != shard.sha256:
        raise BadInput(f"{where}: shard file {shard.file} does not match its sha256 in the "
                       "index (changed or damaged since it was written)")
    v, (first, last) = state.vocab, shard.rows
    try:
        with safe_open(str(path), framework="numpy") as file:
            metadata = file.metadata() or {}
            wanted = {"format": SHARD_FORMAT, "format_version": str(SHARD_FORMAT_VERSION),
                      "vocab": str(v), "step": str(state.step), "rows": f"{first}:{last}"}
            for key, value in wanted.items():
                if metadata.get(key) != value:
                    raise BadInput(f"{where}: shard file {shard.file} has {key} "
                                   f"{metadata.get(key)!r}, the index says {value!r}")
            names = {tensor_name(table, shard.rows) for table in CHECKPOINT_TENSORS}
            if set(file.keys()) != names:
                raise BadInput(f"{where}: shard file {shard.file} holds tensors "
                               f"{sorted(file.keys())}, not {sorted(names)}")
            for name in names:
                layout = file.get_slice(name)
                if layout.get_dtype() != "F32" or list(layout.get_shape()) != [last - first, v]:
                    raise BadInput(f"{where}: shard file {shard.file}: tensor {name} is not "
                                   f"F32 [{last - first}, {v}]")
    except SafetensorError as error:
        reason = reason_of(error)
        raise BadInput(f"{where}: shard file {shard.file} is not readable safetensors "
                       f"({reason})") from None
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    return {table: 8 + length + header[tensor_name(table, shard.rows)]["data_offsets"][0]
            for table in CHECKPOINT_TENSORS}


def open_checkpoint(path: StrPath) -> CheckpointFile | ShardedCheckpoint | CollapsedCheckpoint:
    """A checkpoint in any form, its header checked: a sharded one (its index, or a name
    with only an index beside it) as a `ShardedCheckpoint`, which reads as a
    `CheckpointFile` does; a collapsed one whole (`CollapsedCheckpoint`, O(V + K) bytes,
    its rows read expanded); else the one-piece dense file."""
    require_named(path, "checkpoint")  # "" would look for the index ".index.json"
    if is_sharded(path):
        return ShardedCheckpoint.open(path)
    if checkpoint_tables(path) == "collapsed":
        return CollapsedCheckpoint.load(path)
    return CheckpointFile.open(path)
