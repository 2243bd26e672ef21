"""The counts file: a corpus counted once, trained on many times (safetensors).

Tensors, all little-endian:

    dense  (V <= DENSE_MAX_VOCAB)   counts  U64[V][V]   C[prev][next]
    sparse (V >  DENSE_MAX_VOCAB)   rows    U32[K]      the K non-zero counts in
                                    columns U32[K]      row-major order (COO)
                                    values  U64[K]

V runs to MAX_VOCAB (2^20): a row or column is below 2^20 and fits U32, so the layout is
the one files of V <= 65536 have always had, byte for byte. Keys are formed from rows
and columns only in 64-bit arithmetic (prev * V + next reaches 2^40), then held in the
counting's key type for that V (`counting.key_dtype`).

Metadata (strings):

    format          "bob-counts"
    format_version  "1"
    vocab           V
    layout          "dense" or "sparse"
    sources         JSON [[name, bytes], ...]: the files counted, in order
    transitions     N, the number of pairs counted (the sum of the counts)
    digest          the data digest of the weights C / N (bob.records.digest): "v2:" and
                    the sha256 hex of the sparse weights, or the legacy form, the sha256
                    hex of the dense table (the corpus input record's data_digest)
    optimum         repr() of H(next | prev) in nats per transition
    created_by      "bob <version>" (informational)

Loading checks every field and tensor and raises BadInput "<file>: <problem>".
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
from safetensors import SafetensorError, safe_open

from bob.config import require_dense_vocab
from bob.errors import BadInput, reason_of
from bob.files import StrPath, atomic_write, require_regular_file
from bob.records.corpus import optimum_of_slices, weights
from bob.records.counting import (
    COUNT_MAX_VOCAB,
    DENSE_MAX_VOCAB,
    MIN_VOCAB,
    PairCounts,
    key_dtype,
)
from bob.records.digest import DIGEST_FORMS, digest_matches, is_digest, sparse_digest
from bob.records.metadata import (
    MAX_INTEGER,
    bob_version,
    read_integers,
    read_number,
    require_fields,
)

FORMAT = "bob-counts"
FORMAT_VERSION = 1
REQUIRED_METADATA = ("format", "format_version", "vocab", "layout", "sources", "transitions",
                     "digest", "optimum")
ENTRIES_AT_A_TIME = 1 << 20  # sparse entries written at a time


def counts_optimum(counts: PairCounts) -> float:
    """H(next | prev) of the counts, the same figure as corpus.optimum.

    A slice of entries at a time: their rows' sums are looked up per slice, never
    an array as long as the table.
    """
    keys, values = counts.pairs()
    sums, vocab = counts.row_sums(), keys.dtype.type(counts.vocab)
    slices = ((values[i:i + ENTRIES_AT_A_TIME], sums[keys[i:i + ENTRIES_AT_A_TIME] // vocab])
              for i in range(0, keys.size, ENTRIES_AT_A_TIME))
    return optimum_of_slices(slices, keys.size, counts.transitions)


Parts = Callable[[], Iterator[np.ndarray]]  # a tensor's bytes, in order, as arrays


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str  # safetensors' name of the element type
    shape: list[int]
    nbytes: int
    parts: Parts


@dataclass(frozen=True, eq=False)
class CountsFile:
    """A counted corpus: its counts and where they came from."""

    counts: PairCounts
    sources: tuple[tuple[str, int], ...]  # (name, bytes) of each file counted
    digest: str  # the data digest of the weights, as stored (bob.records.digest)
    optimum: float  # H(next | prev), nats per transition

    @classmethod
    def of(cls, counts: PairCounts, sources: Sequence[tuple[str, int]]) -> CountsFile:
        """The counts with their digest and optimum, computed side by side.

        Both release the GIL (hashlib on large buffers, NumPy, the Numba optimum),
        so a second core computes the digest while this one computes the optimum.
        """
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bob-digest") as pool:
            digest = pool.submit(sparse_digest, counts)
            optimum = counts_optimum(counts)
            return cls(counts, tuple((str(n), int(s)) for n, s in sources), digest.result(),
                       optimum)

    @property
    def vocab(self) -> int:
        return self.counts.vocab

    @property
    def transitions(self) -> int:
        return self.counts.transitions

    @property
    def name(self) -> str:
        return ", ".join(name for name, _ in self.sources)

    def metadata(self) -> dict[str, str]:
        return {
            "format": FORMAT, "format_version": str(FORMAT_VERSION),
            "vocab": str(self.vocab), "layout": "sparse" if self.counts.is_sparse else "dense",
            "sources": json.dumps([list(s) for s in self.sources]),
            "transitions": str(self.transitions), "digest": self.digest,
            "optimum": repr(float(self.optimum)), "created_by": f"bob {bob_version()}",
        }

    def _tensors(self) -> list[_Tensor]:
        if not self.counts.is_sparse:
            dense = self.counts.dense.astype("<u8", copy=False)
            return [_Tensor("counts", "U64", [self.vocab, self.vocab], dense.nbytes,
                            lambda: iter((dense,)))]
        keys, values = self.counts.keys, self.counts.values
        vocab = keys.dtype.type(self.vocab)  # rows and columns below 2^20: U32 holds them

        def parts(convert: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Parts:
            # A slice at a time: a table of 10**8 entries is not converted all at once.
            return lambda: (convert(keys[i:i + ENTRIES_AT_A_TIME], values[i:i + ENTRIES_AT_A_TIME])
                            for i in range(0, keys.size, ENTRIES_AT_A_TIME))
        k = int(keys.size)
        return [
            _Tensor("rows", "U32", [k], 4 * k, parts(lambda ks, _: (ks // vocab).astype("<u4"))),
            _Tensor("columns", "U32", [k], 4 * k, parts(lambda ks, _: (ks % vocab).astype("<u4"))),
            _Tensor("values", "U64", [k], 8 * k, parts(lambda _, vs: vs.astype("<u8"))),
        ]

    def save(self, path: StrPath) -> None:
        """Write atomically (temporary file, fsync, rename)."""
        tensors = self._tensors()
        header: dict[str, object] = {"__metadata__": self.metadata()}
        offset = 0
        for tensor in tensors:
            header[tensor.name] = {"dtype": tensor.dtype, "shape": tensor.shape,
                                   "data_offsets": [offset, offset + tensor.nbytes]}
            offset += tensor.nbytes
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % 8)

        def write(file: BinaryIO) -> None:
            file.write(struct.pack("<Q", len(text)) + text)
            for tensor in tensors:
                for part in tensor.parts():
                    file.write(memoryview(np.ascontiguousarray(part).reshape(-1).view(np.uint8)))
        atomic_write(path, write)

    @classmethod
    def load(cls, path: StrPath) -> CountsFile:
        """Read and check a counts file; BadInput "<file>: <problem>" when it is not sound."""
        source = str(path)
        require_regular_file(path, "counts file")  # safetensors' open of a FIFO would block
        try:
            with safe_open(source, framework="numpy") as file:
                fields = _read_metadata(file.metadata() or {}, source)
                counts = _read_counts(file, fields, source)
        except SafetensorError as error:
            reason = reason_of(error)
            raise BadInput(f"{source}: not a readable counts file ({reason})") from None
        except FileNotFoundError:
            raise BadInput(f"{source}: no such file") from None
        except OSError as error:
            raise BadInput(f"{source}: cannot read ({error.strerror or error})") from None
        if counts.transitions != fields.transitions:
            raise BadInput(f"{source}: the counts sum to {counts.transitions}, the metadata "
                           f"says {fields.transitions} transitions")
        if counts.transitions == 0:
            raise BadInput(f"{source}: the counts are all zero")
        optimum = _checked_against_counts(counts, fields, source)
        return cls(counts, fields.sources, fields.digest, optimum)


# The stored optimum is the figure computed at the count; the same sum computed again
# agrees to rounding (compiled and Python terms), far closer than this.
OPTIMUM_REL_TOLERANCE = 1e-9


def _checked_against_counts(counts: PairCounts, fields: _Fields, source: str) -> float:
    """The optimum computed from the counts, once the stored optimum and digest agree
    with them (both computed side by side, as when the file was made)."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bob-digest") as pool:
        digest_agrees = pool.submit(digest_matches, fields.digest, counts)
        optimum = counts_optimum(counts)
        if not digest_agrees.result():
            raise BadInput(f"{source}: metadata digest {fields.digest[:15]}... is not the "
                           "digest of the stored counts (the file was altered or damaged)")
    if not math.isclose(fields.optimum, optimum, rel_tol=OPTIMUM_REL_TOLERANCE,
                        abs_tol=OPTIMUM_REL_TOLERANCE):
        raise BadInput(f"{source}: metadata optimum {fields.optimum!r} is not the "
                       f"{optimum!r} nats of the stored counts")
    return optimum


@dataclass(frozen=True)
class _Fields:
    vocab: int
    layout: str
    sources: tuple[tuple[str, int], ...]
    transitions: int
    digest: str
    optimum: float


def _read_metadata(metadata: dict[str, str], source: str) -> _Fields:
    require_fields(metadata, source, kind="counts file", format_name=FORMAT,
                   required=REQUIRED_METADATA, hint="; make one with bob count")
    if metadata["format_version"] != str(FORMAT_VERSION):
        raise BadInput(f"{source}: unsupported counts format version "
                       f"{metadata['format_version']!r} (this Bob reads {FORMAT_VERSION})")
    integers = read_integers(metadata, ("vocab", "transitions"), source)
    vocab = integers["vocab"]
    if not MIN_VOCAB <= vocab <= COUNT_MAX_VOCAB:
        raise BadInput(f"{source}: metadata vocab {vocab} is outside "
                       f"[{MIN_VOCAB}, {COUNT_MAX_VOCAB}]")
    layout = "dense" if vocab <= DENSE_MAX_VOCAB else "sparse"
    if metadata["layout"] != layout:
        raise BadInput(f"{source}: metadata layout {metadata['layout']!r}; V={vocab} is "
                       f"stored {layout}")
    sources = _read_sources(metadata["sources"], source)
    if not is_digest(metadata["digest"]):
        raise BadInput(f"{source}: metadata digest is not {DIGEST_FORMS}")
    optimum = read_number(metadata, "optimum", source)
    if not (optimum >= 0 and optimum != float("inf")):
        raise BadInput(f"{source}: metadata optimum {optimum!r} is not a finite number >= 0")
    return _Fields(vocab, layout, sources, integers["transitions"], metadata["digest"],
                   optimum)


def _read_sources(text: str, source: str) -> tuple[tuple[str, int], ...]:
    """The sources field: a JSON list of [name, bytes] pairs, nothing nested deeper."""
    refusal = BadInput(f"{source}: metadata sources is not a JSON list of [name, bytes]")
    try:
        entries = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        raise refusal from None
    if not isinstance(entries, list):
        raise refusal
    sources = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], int) and not isinstance(entry[1], bool)
                and 0 <= entry[1] <= MAX_INTEGER):
            raise refusal
        sources.append((entry[0], entry[1]))
    return tuple(sources)


def _tensor(file, name: str, dtype: str, shape: list[int] | None, source: str) -> np.ndarray:
    if name not in set(file.keys()):
        raise BadInput(f"{source}: no tensor {name!r}")
    layout = file.get_slice(name)
    if layout.get_dtype() != dtype:
        raise BadInput(f"{source}: tensor {name} is {layout.get_dtype()}, not {dtype}")
    found = list(layout.get_shape())
    if shape is not None and found != shape:
        raise BadInput(f"{source}: tensor {name} has shape {found}, expected {shape}")
    if shape is None and len(found) != 1:
        raise BadInput(f"{source}: tensor {name} has shape {found}, expected one dimension")
    return file.get_tensor(name)


def _read_counts(file, fields: _Fields, source: str) -> PairCounts:
    v = fields.vocab
    if fields.layout == "dense":
        return PairCounts(v, dense=np.ascontiguousarray(
            _tensor(file, "counts", "U64", [v, v], source), np.uint64))
    rows = _tensor(file, "rows", "U32", None, source)
    columns = _tensor(file, "columns", "U32", None, source)
    values = _tensor(file, "values", "U64", None, source).astype(np.uint64, copy=False)
    if not rows.size == columns.size == values.size:
        raise BadInput(f"{source}: rows, columns and values differ in length "
                       f"({rows.size}, {columns.size}, {values.size})")
    if rows.size and (int(rows.max()) >= v or int(columns.max()) >= v):
        raise BadInput(f"{source}: an index is not below V={v}")
    # Checked below V first, so every key is exact in u64 (below 2^40) and fits
    # key_dtype(V); formed in place, one u64 array beside the file's.
    keys = rows.astype(np.uint64)
    keys *= np.uint64(v)
    keys += columns
    keys = keys.astype(key_dtype(v), copy=False)
    if keys.size > 1 and not (keys[1:] > keys[:-1]).all():
        raise BadInput(f"{source}: entries are not in strictly increasing row-major order")
    if values.size and not values.all():
        raise BadInput(f"{source}: a stored count is zero (sparse entries are non-zero)")
    return PairCounts(v, keys=keys, values=values)


def table_weights(counts: PairCounts) -> np.ndarray:
    """T = C / N as float32 [V, V], each weight formed as corpus.weights forms it (V x V
    memory: refused past MAX_DENSE_VOCAB)."""
    require_dense_vocab(counts.vocab, "the table of weights", 4)
    if not counts.is_sparse:
        return weights(counts.dense)
    total = counts.transitions
    table = np.zeros(counts.vocab * counts.vocab, np.float32)
    table[counts.keys.astype(np.int64)] = (counts.values.astype(np.float64) / total
                                           ).astype(np.float32)
    return table.reshape(counts.vocab, counts.vocab)
