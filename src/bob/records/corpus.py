"""Corpus mode's data: transition counts over bytes, their weights and their optimum.

A corpus is one or more texts read as bytes. ``C[r][n]`` counts the adjacent
pairs (r, n) within each text; pairs never span two files. The device trains
on the weights ``T = C / total`` as binary32, and the best loss it can reach
is the conditional entropy H(next | prev) of the corpus, computed here from
the counts. Without a file, Bob trains on CPython's documentation topics
(``pydoc_data.topics``), which ship with every CPython.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bob.config import MAX_VOCAB, MIN_VOCAB, require_dense_vocab
from bob.errors import BadInput, RunFailure
from bob.files import StrPath, reading
from bob.records.binary import InputRecord
from bob.records.counting import ENGINES

BYTE_VOCAB = 256  # one row and column per byte value
CHUNK_BYTES = 1 << 24  # a file is counted 16 MiB at a time: bincount's indices take 8x that
BUILTIN_NAME = "pydoc_data.topics"
OPTIMUM_SLICE = 1 << 16  # entries turned into Python floats at a time
OPTIMUM_COMPILED_MIN = 1 << 20  # entries from which importing Numba pays for the optimum
EXACT_FLOAT_MAX = 1 << 53  # counts up to here are exact as float64
PARTIALS_MAX = 64  # non-overlapping binary64 partial sums: at most about 2098 / 53 of them


class _Counter:
    """Accumulates the transition counts of texts, one text at a time."""

    def __init__(self, vocab: int) -> None:
        if not isinstance(vocab, int) or not MIN_VOCAB <= vocab <= MAX_VOCAB:
            raise ValueError(f"V must be an integer in [{MIN_VOCAB}, {MAX_VOCAB}], not {vocab!r}")
        # These counts are a dense table; a larger V is counted sparse (records.counting).
        require_dense_vocab(vocab, "the counts of a text", 8)
        self.vocab = vocab
        self.counts = np.zeros((vocab, vocab), np.uint64)
        # Bytes reach only the first 256 rows and columns, whatever V is.
        self.span = min(vocab, BYTE_VOCAB)

    def add_text(self, chunks: Iterable[bytes], source: str) -> None:
        """Count one text given as consecutive chunks; BadInput when it is empty."""
        carry: np.ndarray | None = None  # the last byte of the previous chunk
        offset = 0
        for chunk in chunks:
            data = np.frombuffer(chunk, np.uint8)
            if data.size == 0:
                continue
            if self.vocab < BYTE_VOCAB:
                self._check_fits(data, offset, source)
            pairs = data if carry is None else np.concatenate((carry, data))
            if pairs.size >= 2:
                index = pairs[:-1].astype(np.int64) * self.span + pairs[1:]
                found = np.bincount(index, minlength=self.span * self.span)
                self.counts[: self.span, : self.span] += (
                    found.astype(np.uint64).reshape(self.span, self.span))
            carry = data[-1:]
            offset += data.size
        if offset == 0:
            raise BadInput(f"{source}: empty file, nothing to learn from")

    def _check_fits(self, data: np.ndarray, offset: int, source: str) -> None:
        too_big = data >= self.vocab
        if too_big.any():
            i = int(np.argmax(too_big))
            raise BadInput(f"{source}: byte 0x{int(data[i]):02x} at offset {offset + i} does "
                           f"not fit V={self.vocab} (V={BYTE_VOCAB} fits every byte)")


def _no_pairs(sources: Sequence[str]) -> BadInput:
    return BadInput(f"{', '.join(sources)}: no adjacent byte pairs (a corpus needs a text "
                    f"of at least 2 bytes)")


def _file_chunks(path: Path) -> Iterator[bytes]:
    with reading(path, "text file") as file:
        while chunk := file.read(CHUNK_BYTES):
            yield chunk


def counts_from_bytes(text: bytes, source: str = "corpus", vocab: int = BYTE_VOCAB,
                      ) -> np.ndarray:
    """C[r][n] (uint64, shape [V, V]) over the adjacent bytes of one text in memory."""
    counter = _Counter(vocab)
    counter.add_text((text,), source)
    if not counter.counts.any():
        raise _no_pairs((source,))
    return counter.counts


def counts_from_files(paths: Sequence[StrPath], vocab: int = BYTE_VOCAB) -> np.ndarray:
    """C[r][n] over the files' bytes, pairs within each file; BadInput naming a bad file."""
    if not paths:
        raise BadInput("a corpus needs at least one text file")
    counter = _Counter(vocab)
    for path in paths:
        counter.add_text(_file_chunks(Path(path)), str(path))
    if not counter.counts.any():
        raise _no_pairs([str(p) for p in paths])
    return counter.counts


def weights(counts: np.ndarray) -> np.ndarray:
    """T = C / total as float32 (shape [V, V]).

    Each quotient is formed in float64 and rounded to float32; as float64 has
    more than 2 * 24 + 2 bits, this double rounding still gives the correctly
    rounded float32 quotient. A dense table: refused past MAX_DENSE_VOCAB (sparse counts
    give their weights a pair at a time, records.digest.weights_of).
    """
    require_dense_vocab(len(counts), "the table of weights", 4)
    total = int(counts.sum(dtype=np.uint64))
    if total == 0:
        raise ValueError("the counts are all zero")
    return (counts.astype(np.float64) / total).astype(np.float32)


def optimum(counts: np.ndarray) -> float:
    """H(next | prev) in nats per transition: the least loss a bigram table can reach.

    H = -sum over r, n of C[r][n]/N * ln(C[r][n] / rowsum_r), each term from
    the exact integer counts in float64 and the terms summed exactly (fsum).
    """
    total = int(counts.sum(dtype=np.uint64))
    if total == 0:
        raise ValueError("the counts are all zero")
    row_sums = counts.sum(axis=1, dtype=np.uint64)
    rows, columns = np.nonzero(counts)
    return optimum_of_entries(counts[rows, columns], row_sums[rows], total)


def optimum_of_entries(values: np.ndarray, row_sums: np.ndarray, total: int) -> float:
    """H from the non-zero counts, each with its row's sum (dense and sparse tables alike)."""
    return optimum_of_slices(((values, row_sums),), len(values), total)


def optimum_of_slices(slices: Iterable[tuple[np.ndarray, np.ndarray]], entries: int,
                      total: int) -> float:
    """H from the non-zero counts given a slice at a time: (counts, their rows' sums).

    `entries` is the number of counts in all slices. Large tables are summed in
    compiled code where Numba is installed: the same terms, added into partial
    sums whose exact sum is theirs, so math.fsum gives the same figure.
    """
    if total == 0:
        raise ValueError("the counts are all zero")
    if "numba" in ENGINES and entries >= OPTIMUM_COMPILED_MIN and total <= EXACT_FLOAT_MAX:
        partials_of = _optimum_partials()
        parts: Iterable[float] = itertools.chain.from_iterable(
            partials_of(np.asarray(values, np.uint64), np.asarray(row_sums, np.uint64),
                        float(total)).tolist() for values, row_sums in slices)
    else:
        parts = itertools.chain.from_iterable(
            _optimum_terms(values, row_sums, total) for values, row_sums in slices)
    return 0.0 - math.fsum(parts)  # 0.0 - keeps a certain text's optimum at +0.0


def _optimum_terms(values: np.ndarray, row_sums: np.ndarray, total: int) -> Iterator[float]:
    """Each entry's C/N * ln(C/s), from Python integers (their quotients correctly rounded)."""
    # A slice at a time: millions of entries (a sparse table) never become one list.
    for first in range(0, len(values), OPTIMUM_SLICE):
        last = first + OPTIMUM_SLICE
        yield from (c / total * math.log(c / s) for c, s in
                    zip(values[first:last].tolist(), row_sums[first:last].tolist(),
                        strict=True))


@functools.cache
def _optimum_partials():
    """The terms of _optimum_terms, added into exact partial sums (Shewchuk's, as fsum keeps).

    The partials are non-overlapping floats whose exact sum is the exact sum of
    the terms, so math.fsum of them is fsum of the terms, bit for bit. Counts up
    to EXACT_FLOAT_MAX are exact as float64, so each quotient is the correctly
    rounded one that Python's integer division gives, and math.log is the C
    library's log that Python's math.log calls.
    """
    import numba

    @numba.njit(nogil=True, cache=True)
    def partials_of(values, row_sums, total):  # pragma: no cover - compiled
        partials = np.zeros(PARTIALS_MAX, np.float64)
        used = 0
        for k in range(values.size):
            c = float(values[k])
            x = c / total * math.log(c / float(row_sums[k]))
            kept = 0
            for j in range(used):
                y = partials[j]
                if abs(x) < abs(y):
                    x, y = y, x
                high = x + y
                low = y - (high - x)
                if low != 0.0:
                    partials[kept] = low
                    kept += 1
                x = high
            if kept == PARTIALS_MAX:
                raise OverflowError("more exact partial sums than binary64 can need")
            partials[kept] = x
            used = kept + 1
        return partials[:used].copy()

    return partials_of


def digest(counts: np.ndarray) -> str:
    """sha256 hex of the weights' dense bytes: the legacy data digest (records.digest), which
    a corpus record's `digest_matches` accepts beside its sparse one."""
    return hashlib.sha256(weights(counts).astype("<f4").tobytes()).hexdigest()


def input_record(counts: np.ndarray, prompts: object = (), source: str = "corpus",
                 ) -> InputRecord:
    """The corpus-mode input record: the weights, then the prompts."""
    return InputRecord.corpus(weights(counts), prompts, source=source)


def builtin_corpus() -> bytes:
    """CPython's documentation topics joined in sorted key order, as UTF-8.

    Every topic ends with a newline; joining with another leaves a blank line
    between topics, as a text file of them would read.
    """
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise RunFailure(f"{BUILTIN_NAME} is missing from this Python, so there is no "
                         f"built-in corpus; give a text file") from None
    return "\n".join(topics[key] for key in sorted(topics)).encode("utf-8")


@dataclass(frozen=True, eq=False)
class Corpus:
    """The counts of a corpus and the names of the texts they came from."""

    counts: np.ndarray  # u64[V][V]: adjacent pairs (previous, next)
    sources: tuple[str, ...]  # files, or BUILTIN_NAME

    @classmethod
    def from_files(cls, paths: Sequence[StrPath], vocab: int = BYTE_VOCAB) -> Corpus:
        return cls(counts_from_files(paths, vocab), tuple(str(p) for p in paths))

    @classmethod
    def builtin(cls, vocab: int = BYTE_VOCAB) -> Corpus:
        return cls(counts_from_bytes(builtin_corpus(), BUILTIN_NAME, vocab), (BUILTIN_NAME,))

    @property
    def vocab(self) -> int:
        return self.counts.shape[0]

    @property
    def transitions(self) -> int:
        """N: the number of adjacent pairs counted."""
        return int(self.counts.sum(dtype=np.uint64))

    @property
    def name(self) -> str:
        return ", ".join(self.sources)

    def weights(self) -> np.ndarray:
        return weights(self.counts)

    def optimum(self) -> float:
        return optimum(self.counts)

    def digest(self) -> str:
        return digest(self.counts)

    def input_record(self, prompts: object = ()) -> InputRecord:
        return input_record(self.counts, prompts, source=self.name)
