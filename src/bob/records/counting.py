"""Counting transitions of any corpus: streamed in blocks, in parallel over pieces of files.

The counts of disjoint pieces add up exactly (integers), so the corpus is cut
into pieces (`bob.records.sources`), each piece is counted on its own, and the
partial counts are summed: by worker threads here (each keeps a tally of its
own over the pieces it takes), or on a Dask cluster (`bob.records.dask_count`).
Every partitioning gives the same counts, bit for bit. A piece is read in
blocks; the last token of a block is carried to the next, so the pair across
the cut is counted once.

Up to V = DENSE_MAX_VOCAB the counts are a dense u64[V][V] table (the inner
loop is Numba where the ``fast`` extra is installed, np.bincount otherwise:
the same integers). Above, they are sparse: the sorted unique keys
prev * V + next with their counts, so memory grows with the distinct pairs
seen, never with V * V. Any V up to MAX_VOCAB (2^20) is counted: a key is u32
while V * V fits 32 bits (V <= 65536) and u64 above (`key_dtype`). The keys of a
piece's blocks are gathered (up to SORT_KEYS of them, whatever piece they came
from), sorted once, turned into runs of equal keys and merged once into the
running counts: one sort and one linear merge per SORT_KEYS pairs, however many
blocks brought them.

Small corpora (below COMPILED_MIN_BYTES) are counted with NumPy alone: importing
Numba would cost more than it saves there.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from bob.config import MAX_VOCAB, MIN_VOCAB, require_dense_vocab
from bob.errors import BadInput
from bob.records.sources import (
    TOKEN_DTYPES,
    Piece,
    Source,
    read_blocks,
    split,
    stream_blocks,
)

COUNT_MAX_VOCAB = MAX_VOCAB  # counting takes every V a table takes
DENSE_MAX_VOCAB = 2048  # a dense partial is V * V * 8 bytes: 32 MiB here
# Sparse keys prev * V + next are u32 while V * V <= 2**32, u64 above (below 2**40 at
# V = 2^20). u32 where it fits, not u64 everywhere: at V = 50257 a 50M-token count took
# 1.8 to 2.1x as long with u64 keys (the sort and the merges move twice the bytes), and
# the gather buffers would take twice the memory (dev.bench.bench_keys; BENCHMARKS.md).
NARROW_KEY_MAX_VOCAB = 1 << 16
BLOCK_BYTES = 1 << 23  # 8 MiB read at a time: the reader's memory, whatever the file
PIECE_BYTES = 1 << 26  # 64 MiB per task: enough to hide a task's start, small to balance
PARALLEL_MIN_BYTES = 1 << 24  # below this, splitting the work saves too little to matter
SORT_KEYS = 1 << 26  # keys a tally sorts at a time (256 MiB u32, 512 MiB u64): merges are rare
GATHER_KEYS = 1 << 27  # keys all workers gather at once (512 MiB u32, 1 GiB u64), however many
COMPILED_MIN_BYTES = 1 << 24  # below this, NumPy counts faster than Numba can be imported

Progress = Callable[[int], None]  # called with the bytes just counted


def key_dtype(vocab: int) -> type[np.unsignedinteger]:
    """The type of a sparse pair key prev * V + next at this V: u32 while V * V fits it."""
    return np.uint32 if vocab <= NARROW_KEY_MAX_VOCAB else np.uint64


# -- the counts ------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class PairCounts:
    """Adjacent-pair counts over V tokens: dense up to DENSE_MAX_VOCAB, sparse above."""

    vocab: int
    dense: np.ndarray | None = None  # u64[V][V], C[prev][next]
    keys: np.ndarray | None = None  # sparse: sorted unique prev * V + next, key_dtype(V)
    values: np.ndarray | None = None  # sparse: the count of each key, u64, all > 0

    @classmethod
    def zeros(cls, vocab: int) -> PairCounts:
        check_vocab(vocab)
        if vocab <= DENSE_MAX_VOCAB:
            return cls(vocab, dense=np.zeros((vocab, vocab), np.uint64))
        return cls(vocab, keys=np.zeros(0, key_dtype(vocab)), values=np.zeros(0, np.uint64))

    @classmethod
    def from_dense(cls, counts: np.ndarray) -> PairCounts:
        vocab = counts.shape[0]
        if vocab <= DENSE_MAX_VOCAB:
            return cls(vocab, dense=np.ascontiguousarray(counts, np.uint64))
        flat = counts.reshape(-1)
        keys = np.flatnonzero(flat)
        return cls(vocab, keys=keys.astype(key_dtype(vocab)),
                   values=flat[keys].astype(np.uint64))

    @property
    def is_sparse(self) -> bool:
        return self.dense is None

    @property
    def transitions(self) -> int:
        counts = self.values if self.is_sparse else self.dense
        return int(counts.sum(dtype=np.uint64))

    def entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, columns, counts) of the non-zero counts in row-major order."""
        if self.is_sparse:
            rows, columns = np.divmod(self.keys, self.keys.dtype.type(self.vocab))
            return rows.astype(np.int64), columns.astype(np.int64), self.values
        rows, columns = np.nonzero(self.dense)
        return rows, columns, self.dense[rows, columns]

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys prev * V + next, counts) of the non-zero counts, in row-major order."""
        if self.is_sparse:
            return self.keys, self.values
        flat = self.dense.reshape(-1)
        keys = np.flatnonzero(flat)
        return keys.astype(key_dtype(self.vocab)), flat[keys]

    def to_dense(self) -> np.ndarray:
        """u64[V][V]; for a sparse table, V * V * 8 bytes are allocated (refused past
        MAX_DENSE_VOCAB: BadInput naming the size)."""
        if not self.is_sparse:
            return self.dense
        require_dense_vocab(self.vocab, "the counts as a dense table", 8)
        table = np.zeros(self.vocab * self.vocab, np.uint64)
        table[self.keys.astype(np.int64)] = self.values
        return table.reshape(self.vocab, self.vocab)

    def row_sums(self) -> np.ndarray:
        if not self.is_sparse:
            return self.dense.sum(axis=1, dtype=np.uint64)
        sums = np.zeros(self.vocab, np.uint64)
        if self.keys.size:
            rows = self.keys // self.keys.dtype.type(self.vocab)
            starts = np.r_[0, np.flatnonzero(rows[1:] != rows[:-1]) + 1]
            sums[rows[starts]] = np.add.reduceat(self.values, starts)
        return sums

    def plus(self, other: PairCounts) -> PairCounts:
        """The counts of both corpora (their pairs are disjoint, so counts add)."""
        if other.vocab != self.vocab:
            raise ValueError(f"cannot add counts of V={other.vocab} to V={self.vocab}")
        if not self.is_sparse:
            return PairCounts(self.vocab, dense=self.dense + other.to_dense())
        keys, values = merge_sparse(self.keys, self.values, other.keys, other.values)
        return PairCounts(self.vocab, keys=keys, values=values)

    def same_as(self, other: PairCounts) -> bool:
        keys, values = self.pairs()
        other_keys, other_values = other.pairs()
        return (self.vocab == other.vocab and np.array_equal(keys, other_keys)
                and np.array_equal(values, other_values))


def check_vocab(vocab: int) -> None:
    if isinstance(vocab, bool) or not isinstance(vocab, int) \
            or not MIN_VOCAB <= vocab <= COUNT_MAX_VOCAB:
        raise BadInput(f"V must be an integer in [{MIN_VOCAB}, {COUNT_MAX_VOCAB}], "
                       f"not {vocab!r}")


def merge_sparse(keys_a: np.ndarray, values_a: np.ndarray, keys_b: np.ndarray,
                 values_b: np.ndarray, engine: str | None = None,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys of both (each sorted unique) and the sums of their counts (exact)."""
    if (engine or ENGINES[0]) == "numba":
        return _merge_numba()(keys_a, values_a, keys_b, values_b)
    keys = np.concatenate((keys_a, keys_b))
    values = np.concatenate((values_a, values_b))
    if keys.size == 0:
        return keys, values
    # A stable sort finds the two sorted runs and merges them: linear, as the Numba merge.
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return keys[starts], np.add.reduceat(values, starts)


@functools.cache
def _merge_numba():
    """A linear merge of two sorted unique key lists: no sort, no index array.

    A first pass counts the distinct keys, so the result is allocated once at its size.
    """
    import numba

    # One function: a jitted callee would be a closure variable, and a closure variable
    # that is a dispatcher keeps Numba's cache from ever finding the compiled merge.
    @numba.njit(nogil=True, cache=True)
    def merge(ka, va, kb, vb):  # pragma: no cover - compiled
        i = j = size = 0
        while i < ka.size and j < kb.size:
            a, b = ka[i], kb[j]
            i += a <= b
            j += b <= a
            size += 1
        keys = np.empty(size + (ka.size - i) + (kb.size - j), ka.dtype)
        values = np.empty(keys.size, np.uint64)
        i = j = n = 0
        while i < ka.size and j < kb.size:
            if ka[i] < kb[j]:
                keys[n], values[n] = ka[i], va[i]
                i += 1
            elif kb[j] < ka[i]:
                keys[n], values[n] = kb[j], vb[j]
                j += 1
            else:
                keys[n], values[n] = ka[i], va[i] + vb[j]
                i += 1
                j += 1
            n += 1
        keys[n:n + ka.size - i] = ka[i:]
        values[n:n + ka.size - i] = va[i:]
        n += ka.size - i
        keys[n:] = kb[j:]
        values[n:] = vb[j:]
        return keys, values

    return merge


# -- the inner loop ------------------------------------------------------------------
def _dense_numpy(tokens: np.ndarray, prev: int, counts: np.ndarray) -> None:
    """Add the block's pairs (and prev's pair with its first token) to counts: NumPy."""
    vocab = counts.shape[0]
    if prev >= 0:
        tokens = np.concatenate((np.array([prev], tokens.dtype), tokens))
    if tokens.size < 2:
        return
    index = tokens[:-1].astype(np.int64) * vocab + tokens[1:]
    found = np.bincount(index, minlength=vocab * vocab)
    counts += found.astype(np.uint64).reshape(vocab, vocab)


@functools.cache
def _dense_numba():
    """The Numba inner loop, compiled on first use (Numba is imported only then)."""
    import numba

    @numba.njit(nogil=True, cache=True)
    def dense_numba(tokens, prev, counts):  # pragma: no cover - compiled
        # One increment per pair; tokens were checked below V before this runs.
        p = prev
        for i in range(tokens.size):
            c = np.int64(tokens[i])
            if p >= 0:
                counts[p, c] += 1
            p = c

    return dense_numba


ENGINES = ("numba", "numpy") if importlib.util.find_spec("numba") else ("numpy",)


def pair_keys(tokens: np.ndarray, vocab: int, out: np.ndarray, engine: str) -> None:
    """out[i] = tokens[i] * V + tokens[i + 1]: the keys of the pairs within tokens, in
    out's type (key_dtype(V))."""
    if engine == "numba":
        _pair_keys_numba()(tokens, vocab, out)
        return
    # Tokens were checked in [0, V), so every key fits out's type whatever the tokens' own
    # (signed .npy tokens too): the arithmetic is done in out's type, never in float64.
    np.multiply(tokens[:-1], vocab, out=out, dtype=out.dtype, casting="unsafe")
    np.add(out, tokens[1:], out=out, dtype=out.dtype, casting="unsafe")


@functools.cache
def _pair_keys_numba():
    """One pass, where NumPy's two make a buffered cast of every token twice.

    The key is formed in u64 and stored in out's type: exact for u64 keys, and for u32
    keys (V <= 65536) below 2**32 already. One compiled loop per (tokens, out) types.
    """
    import numba

    @numba.njit(nogil=True, cache=True)
    def pair_keys(tokens, vocab, out):  # pragma: no cover - compiled
        width = np.uint64(vocab)
        for i in range(out.size):
            out[i] = np.uint64(tokens[i]) * width + np.uint64(tokens[i + 1])

    return pair_keys


def run_lengths(keys: np.ndarray, engine: str) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys of sorted keys and how often each occurs (u64)."""
    if engine == "numba":
        return _run_lengths_numba()(keys)
    if keys.size == 0:
        return np.zeros(0, keys.dtype), np.zeros(0, np.uint64)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return keys[starts], np.diff(starts, append=keys.size).astype(np.uint64)


@functools.cache
def _run_lengths_numba():
    """Two passes over the sorted keys: count the runs, then fill arrays of exactly that size.

    The second pass writes each key's run so far at the current slot and moves to the
    next slot only where the key changes: no branch on the data (runs end at random).
    """
    import numba

    @numba.njit(nogil=True, cache=True)
    def run_lengths(keys):  # pragma: no cover - compiled
        if keys.size == 0:
            return np.empty(0, keys.dtype), np.empty(0, np.uint64)
        runs = 1
        for i in range(1, keys.size):
            runs += keys[i] != keys[i - 1]
        unique = np.empty(runs, keys.dtype)
        counts = np.empty(runs, np.uint64)
        n = 0
        length = np.uint64(0)
        for i in range(1, keys.size):
            length += np.uint64(1)
            unique[n] = keys[i - 1]
            counts[n] = length
            ends = keys[i] != keys[i - 1]
            n += ends
            length = np.uint64(0) if ends else length
        unique[n] = keys[keys.size - 1]
        counts[n] = length + np.uint64(1)
        return unique, counts

    return run_lengths


# -- one piece -----------------------------------------------------------------------
class Tally:
    """Counts of blocks added one after another (a worker's or a piece's running sum).

    Sparse counts gather the blocks' pair keys and count them `sort_keys` at a
    time (`flush`); `result` counts what is still gathered.
    """

    def __init__(self, vocab: int, engine: str | None = None, sort_keys: int | None = None,
                 ) -> None:
        check_vocab(vocab)
        self.vocab = vocab
        self.engine = engine or ENGINES[0]
        if self.engine not in ENGINES:
            raise ValueError(f"engine {self.engine!r} is not one of {ENGINES}")
        self.counts = PairCounts.zeros(vocab)
        self.sort_keys = sort_keys or SORT_KEYS  # sparse: keys gathered before a sort
        self._keys: np.ndarray | None = None  # sparse: gathered pair keys, not yet counted
        self._gathered = 0

    def add_block(self, tokens: np.ndarray, prev: int) -> None:
        """The pairs within tokens, and (prev, tokens[0]) when prev >= 0."""
        if not self.counts.is_sparse:
            if self.engine == "numba":
                _dense_numba()(tokens, prev, self.counts.dense)
            else:
                _dense_numpy(tokens, prev, self.counts.dense)
            return
        if prev >= 0 and tokens.size:
            self._room()[0] = prev * self.vocab + int(tokens[0])
            self._gathered += 1
        start = 0
        while start < tokens.size - 1:
            room = self._room()
            stop = min(tokens.size - 1, start + room.size)
            pair_keys(tokens[start:stop + 1], self.vocab, room[: stop - start], self.engine)
            self._gathered += stop - start
            start = stop

    def _room(self) -> np.ndarray:
        """The free part of the key buffer, counting what it holds first when it is full."""
        if self._keys is None:
            # np.empty maps pages as they are written: a small corpus touches little of it.
            self._keys = np.empty(self.sort_keys, key_dtype(self.vocab))
        if self._gathered == self._keys.size:
            self.flush()
        return self._keys[self._gathered:]

    def flush(self) -> None:
        """Sort the gathered keys, count their runs, merge the runs into the counts."""
        if not self._gathered:
            return
        keys = self._keys[: self._gathered]
        keys.sort()
        self._gathered = 0
        self._merge(*run_lengths(keys, self.engine))

    def add(self, partial: PairCounts) -> None:
        if not self.counts.is_sparse:
            np.add(self.counts.dense, partial.to_dense(), out=self.counts.dense)
            return
        self._merge(partial.keys, partial.values)

    def _merge(self, keys: np.ndarray, values: np.ndarray) -> None:
        # Linear in the pairs seen so far: memory is the distinct pairs, twice at most.
        if self.counts.keys.size == 0:
            self.counts = PairCounts(self.vocab, keys=keys, values=values)
            return
        merged = merge_sparse(self.counts.keys, self.counts.values, keys, values, self.engine)
        self.counts = PairCounts(self.vocab, keys=merged[0], values=merged[1])

    def result(self) -> PairCounts:
        if self.counts.is_sparse:
            self.flush()
            self._keys = None
        return self.counts


def check_tokens(block: np.ndarray, vocab: int, source: Source, first: int) -> None:
    """Every token of the block below V; BadInput naming the first that is not, and where."""
    if block.dtype == np.uint8 and vocab >= 256:
        return  # bytes always fit
    if block.size == 0:
        return
    if int(block.max()) < vocab and (block.dtype.kind != "i" or int(block.min()) >= 0):
        return  # two reductions: no mask to build for a block that is fine
    bad = block >= vocab
    if block.dtype.kind == "i":
        bad |= block < 0
    if not bad.any():
        return
    i = int(np.argmax(bad))
    index = first + i
    where = source.offset + index * source.itemsize
    what = f"byte 0x{int(block[i]):02x}" if source.dtype == "|u1" else f"token {int(block[i])}"
    raise BadInput(f"{source.name}: {what} at offset {where} (token {index}) is not in "
                   f"[0, V={vocab}){_raw_type_hint(source)}")


def _raw_type_hint(source: Source) -> str:
    """For a raw token file, the type it was read as: the type is the user's word (or the
    default for V), and a file of the other type mostly yields ids out of range."""
    names = {code: name for name, code in TOKEN_DTYPES.items()}
    if source.offset or source.dtype not in names:  # text, or a .npy that names its type
        return ""
    return f" (read as {names[source.dtype]}: are --vocab and --token-dtype right?)"


def count_piece(tally: Tally, piece: Piece, block_bytes: int = BLOCK_BYTES,
                progress: Progress | None = None) -> None:
    """Add the pairs that start in the piece (the last one reaching one token past it)."""
    source = piece.source
    prev = -1
    position = piece.start
    for block in read_blocks(piece, max(2, block_bytes // source.itemsize)):
        check_tokens(block, tally.vocab, source, position)
        tally.add_block(block, prev)
        prev = int(block[-1])
        done = block.size if position + block.size <= piece.stop else piece.stop - position
        position += block.size
        if progress is not None:
            progress(done * source.itemsize)


def count_batch(pieces: Sequence[Piece], vocab: int, engine: str | None = None,
                block_bytes: int = BLOCK_BYTES) -> PairCounts:
    """The counts of some pieces: the task a worker thread or a Dask worker runs."""
    tally = Tally(vocab, engine)
    for piece in pieces:
        count_piece(tally, piece, block_bytes)
    return tally.result()


def count_stream(tally: Tally, source: Source, block_bytes: int,
                 progress: Progress | None) -> int:
    """Count a stream (standard input, a pipe, a device) as one text; its size in bytes."""
    prev, position = -1, 0
    for block in stream_blocks(source, block_bytes):
        check_tokens(block, tally.vocab, source, position)
        tally.add_block(block, prev)
        prev = int(block[-1])
        position += block.size
        if progress is not None:
            progress(block.size * source.itemsize)
    return position * source.itemsize


# -- the corpus ----------------------------------------------------------------------------
def batches(pieces: Sequence[Piece], batch_bytes: int) -> list[list[Piece]]:
    """Consecutive pieces grouped until a group reaches batch_bytes: small files share a task."""
    groups: list[list[Piece]] = []
    size = batch_bytes
    for piece in pieces:
        if size >= batch_bytes:
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += max(piece.bytes, 1)
    return groups


def plan_pieces(sources: Sequence[Source], piece_bytes: int) -> list[list[Piece]]:
    """Files cut at piece_bytes, small ones grouped: the tasks of a parallel count."""
    itemsize = max((s.itemsize for s in sources), default=1)
    return batches(split(sources, max(1, piece_bytes // itemsize)), piece_bytes)


def refuse_empty(sources: Iterable[Source]) -> None:
    """A file the user named that holds no token: say so before counting anything."""
    for source in sources:
        if source.explicit and not source.is_stream and source.tokens == 0:
            raise BadInput(f"{source.name}: empty file, nothing to learn from")


def no_pairs(sources: Sequence[Source]) -> BadInput:
    names = ", ".join(s.name for s in sources)
    unit = "byte" if all(s.dtype == "|u1" for s in sources) else "token"
    return BadInput(f"{names}: no adjacent {unit} pairs (a corpus needs a text of at least "
                    f"2 {unit}s)")


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def count_sources(sources: Sequence[Source], vocab: int, workers: int | None = None,
                  engine: str | None = None, progress: Progress | None = None,
                  block_bytes: int = BLOCK_BYTES, piece_bytes: int = PIECE_BYTES,
                  stream_bytes: dict[str, int] | None = None) -> PairCounts:
    """The counts of all sources, pairs within each; all cores unless workers says otherwise.

    Streams are counted first, one after another; `stream_bytes`, when given, receives
    each one's size (known only once it has ended)."""
    check_vocab(vocab)
    refuse_empty(sources)
    files = [s for s in sources if not s.is_stream]
    total = sum(s.size for s in files)
    tally = Tally(vocab, engine or default_engine(total, any(s.is_stream for s in sources)))
    for source in sources:
        if source.is_stream:
            size = count_stream(tally, source, block_bytes, progress)
            if stream_bytes is not None:
                stream_bytes[source.name] = size
    workers = default_workers() if workers is None else workers
    tasks = plan_pieces(files, even_piece_bytes(total, workers, piece_bytes))
    if workers <= 1 or total < PARALLEL_MIN_BYTES or len(tasks) < 2:
        for source in files:
            count_piece(tally, Piece(source, 0, source.tokens), block_bytes, progress)
    else:
        _count_in_threads(tally, tasks, workers, block_bytes, progress)
    counts = tally.result()
    if counts.transitions == 0:
        raise no_pairs(sources)
    return counts


def default_engine(total_bytes: int, reads_stream: bool = False) -> str:
    """Numba where installed, unless the corpus is too small to repay importing it."""
    if total_bytes < COMPILED_MIN_BYTES and not reads_stream:
        return "numpy"
    return ENGINES[0]


def even_piece_bytes(total_bytes: int, workers: int, piece_bytes: int) -> int:
    """At most piece_bytes, so that the pieces come in whole rounds of `workers` tasks.

    Three 64 MiB pieces on two workers would leave one idle for a third of the count.
    """
    per_round = max(1, workers) * piece_bytes
    rounds = max(1, -(-total_bytes // per_round))
    return max(1, -(-total_bytes // (max(1, workers) * rounds)))


def _count_in_threads(tally: Tally, tasks: list[list[Piece]], workers: int,
                      block_bytes: int, progress: Progress | None) -> None:
    """Count the tasks on worker threads, each with a tally of its own; add their results.

    Threads, not processes: reading, NumPy's sort and ufuncs, bincount and the Numba
    loops (nogil) all release the GIL, so threads count in parallel, and a sparse
    result (12 bytes per distinct pair) is added where it is, never pickled through a
    pipe. A worker takes tasks until none is left and sorts its keys (GATHER_KEYS
    shared among the workers, at most SORT_KEYS each) at a time whatever task they
    came from, so this thread merges one result per worker.
    Progress is reported from this thread only.
    """
    todo: queue.SimpleQueue[list[Piece]] = queue.SimpleQueue()
    for task in tasks:
        todo.put(task)
    # What the workers hand back: bytes counted, a worker's counts, or its failure.
    done: queue.SimpleQueue[int | PairCounts | BaseException] = queue.SimpleQueue()

    count = min(workers, len(tasks))
    sort_keys = min(SORT_KEYS, max(GATHER_KEYS // count, 1 << 20))

    def work() -> None:
        mine = Tally(tally.vocab, tally.engine, sort_keys)
        try:
            while (task := _next(todo)) is not None:
                for piece in task:
                    count_piece(mine, piece, block_bytes)
                done.put(sum(piece.bytes for piece in task))
            done.put(mine.result())
        except BaseException as error:  # handed to the main thread, which raises it
            done.put(error)

    threads = [threading.Thread(target=work, name=f"bob-count-{i}", daemon=True)
               for i in range(count)]
    for thread in threads:
        thread.start()
    try:
        finished = 0
        while finished < len(threads):
            item = done.get()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, PairCounts):
                tally.add(item)
                finished += 1
            elif progress is not None:
                progress(item)
        for thread in threads:
            thread.join()  # each has handed its counts back: it is ending
    finally:
        while _next(todo) is not None:  # a failure or an interrupt: no worker starts more
            pass


def _next(todo: queue.SimpleQueue[list[Piece]]) -> list[Piece] | None:
    try:
        return todo.get_nowait()
    except queue.Empty:
        return None
