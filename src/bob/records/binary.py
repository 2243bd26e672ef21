"""Bob's binary records: the input record and the result record.

A record file is a 24-byte header, then the payload, all little-endian:

    magic     8 bytes  b"BOBINPUT" (input) or b"BOBRESLT" (result)
    version   u32      FORMAT_VERSION (1), or SPARSE_VERSION (2) for a sparse corpus record
    mode      u32      0 hard targets, 1 corpus weights
    V         u32      vocabulary: rows and columns of the table, in [2, 2^20]
    P         u32      prompts, in [0, 4096]
    K         u64      version 2 only: the corpus pairs

Input payload, exactly the arena's ``input`` tensor: hard mode targets u32[V]
then prompts u32[P]; corpus mode (version 2) keys u64[K] (row * V + column, strictly
increasing), their weights f32[K], then prompts u32[P]. A version 1 corpus record
(weights f32[V][V], then prompts) is still read: its cells that are not zero become the
pairs. Bob writes version 1 for hard records and version 2 for corpus records. A
version 1 corpus record is a dense table, so its V is at most MAX_DENSE_VOCAB (65536);
one that declares more is refused from its header, before any weight is read. Nothing
else in a record grows with V * V: targets are u32[V], keys u64 (below 2^40 at V = 2^20).
Result payload, the arena's result tensors in order: initial_loss f32[V],
training_loss f32[V], logit_rows f32[P][V], predictions u32[P].

Reading a record checks everything a kernel relies on (sizes, every target and
prompt below V, every key a cell of the table and each once, finite non-negative weights
summing to 1) and raises BadInput
"<file>: <problem>" otherwise.
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from bob.config import (
    MAX_DENSE_VOCAB,
    MAX_PROMPTS,
    MAX_VOCAB,
    MIN_VOCAB,
    MODES,
    RESULT_TENSORS,
    Mode,
    require_dense_vocab,
)
from bob.errors import BadInput
from bob.files import (
    StrPath,
    atomic_write,
    read_bytes,
    reading_input,
    require_named,
    stream_kind,
)
from bob.records.digest import is_sparse, legacy_matches, sparse_digest_of

INPUT_MAGIC = b"BOBINPUT"
RESULT_MAGIC = b"BOBRESLT"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIIII")  # magic, version, mode, V, P

U32 = np.dtype("<u4")
U64 = np.dtype("<u8")
F32 = np.dtype("<f4")
SPARSE_VERSION = 2  # a corpus record's weights as K sparse pairs (K: u64 after the header)
PAIRS = struct.Struct("<Q")

# C/N rounded to binary32 is within 2**-24 of C/N, so exact weights sum to
# within 6e-8 of 1; the slack admits weights normalized in float32 elsewhere.
WEIGHT_SUM_TOLERANCE = 1e-5


# -- helpers shared with the checkpoint ----------------------------------------
def first_true(mask: np.ndarray) -> tuple[int, ...]:
    """Index of the first True of a non-empty mask, in C order."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


def index_text(index: tuple[int, ...]) -> str:
    return "".join(f"[{i}]" for i in index)


def arrays_identical(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes (so NaN equals the same NaN, and -0.0 differs from 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a_bytes = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    b_bytes = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    return bool(np.array_equal(a_bytes, b_bytes))


def _readonly(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


def _raw(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1).view(np.uint8))


def _as_indices(values: object, name: str) -> np.ndarray:
    """An integer array (bytes count as byte values); the range is checked by the caller."""
    if isinstance(values, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(values), dtype=np.uint8)
    array = np.asarray(values)
    if array.size == 0:
        return array.astype(U32)  # np.asarray(()) is float64
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, not {array.dtype}")
    return array


def _check_indices(array: np.ndarray, vocab: int, name: str, source: str) -> None:
    """Every entry in [0, V): a target or prompt indexes a row or column."""
    if array.size == 0:
        return
    negative = array < 0
    if negative.any():
        i = first_true(negative)
        raise BadInput(f"{source}: {name}{index_text(i)} = {array[i]} is negative")
    too_big = array >= vocab
    if too_big.any():
        i = first_true(too_big)
        raise BadInput(f"{source}: {name}{index_text(i)} = {array[i]} is not below V={vocab}")


def _cell(keys: np.ndarray, i: tuple[int, ...], vocab: int) -> str:
    """Where pair i's weight sits in the table, as weights[row][column]."""
    row, column = divmod(int(keys[i]), vocab)
    return f"weights[{row}][{column}]"


def _check_keys(keys: np.ndarray, vocab: int, source: str) -> None:
    """Every key a cell of the V x V table (row * V + column), strictly increasing: the
    scatter writes each cell once, and a key outside the table is refused here, before
    anything runs."""
    if keys.size == 0:
        raise BadInput(f"{source}: no pairs: a corpus record needs at least one transition")
    if keys.min() < 0:
        i = first_true(keys < 0)
        raise BadInput(f"{source}: keys{index_text(i)} = {keys[i]} is negative")
    outside = keys.astype(U64) >= vocab * vocab
    if outside.any():
        i = first_true(outside)
        raise BadInput(f"{source}: keys{index_text(i)} = {keys[i]} is outside the V x V table "
                       f"(V={vocab}: keys below {vocab * vocab})")
    if keys.size > 1:
        wide = keys.astype(U64, copy=False)
        order = wide[1:] <= wide[:-1]  # not np.diff: an unsigned difference wraps around
        if order.any():
            i = int(np.argmax(order)) + 1
            raise BadInput(f"{source}: keys[{i}] = {keys[i]} does not follow keys[{i - 1}] = "
                           f"{keys[i - 1]}: keys must be strictly increasing")


def _check_weights(weights: np.ndarray, source: str, keys: np.ndarray, vocab: int) -> None:
    """Finite, non-negative and summing to 1: a distribution over transitions."""
    finite = np.isfinite(weights)
    if not finite.all():
        i = first_true(~finite)
        raise BadInput(f"{source}: {_cell(keys, i, vocab)} is {weights[i]} (not finite)")
    negative = weights < 0
    if negative.any():
        i = first_true(negative)
        raise BadInput(f"{source}: {_cell(keys, i, vocab)} = {weights[i]} is negative")
    total = float(weights.sum(dtype=np.float64))
    if not abs(total - 1.0) <= WEIGHT_SUM_TOLERANCE:
        raise BadInput(f"{source}: weights sum to {total!r}, not 1 (within "
                       f"{WEIGHT_SUM_TOLERANCE:g}); they must be C / total")


def _check_sizes(mode: Mode, vocab: int, prompts: int) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be 'hard' or 'corpus', not {mode!r}")
    if not MIN_VOCAB <= vocab <= MAX_VOCAB:
        raise ValueError(f"V={vocab} is outside [{MIN_VOCAB}, {MAX_VOCAB}]")
    if not 0 <= prompts <= MAX_PROMPTS:
        raise ValueError(f"P={prompts} is outside [0, {MAX_PROMPTS}]")


def _check_shape(array: np.ndarray, shape: tuple[int, ...], name: str) -> None:
    if array.shape != shape:
        raise ValueError(f"{name} has shape {array.shape}, expected {shape}")


# -- the header ----------------------------------------------------------------
def _looks_like_text(data: bytes) -> bool:
    head = data[:512]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 3:  # only a character cut at the end is forgiven
            return False
        text = head[: error.start].decode("utf-8")
    return bool(text) and all(c.isprintable() or c in "\t\n\r\f" for c in text)


def _what_it_is(data: bytes) -> str:
    """A guess at what a file with the wrong magic is, for the error message."""
    head = data[:8]
    if head == INPUT_MAGIC:
        return "this is a Bob input record"
    if head == RESULT_MAGIC:
        return "this is a Bob result record"
    if len(data) >= 9 and data[8:9] == b"{":
        return "this looks like a safetensors file (a checkpoint?)"
    if head.startswith(b"\x93NUMPY"):
        return "this looks like a NumPy .npy file"
    if _looks_like_text(data):
        return "this looks like text (a corpus?), not a record"
    return "this is not a Bob file"


def _read_header(data: bytes, source: str, magic: bytes, what: str,
                 versions: tuple[int, ...] = (1,)) -> tuple[Mode, int, int, int]:
    """Mode, V, P and the format version from a record's header, every field checked."""
    if not data:
        raise BadInput(f"{source}: empty file, not a Bob {what}")
    head = data[:8]
    if head != magic[: len(head)]:  # a short prefix of the magic is a truncated header
        raise BadInput(f"{source}: not a Bob {what}: starts with {head!r}, not "
                       f"{magic!r} ({_what_it_is(data)})")
    if len(data) < HEADER.size:
        raise BadInput(f"{source}: truncated header: {len(data)} bytes, a Bob {what} "
                       f"starts with {HEADER.size}")
    _, version, mode_code, vocab, prompts = HEADER.unpack_from(data)
    if version not in versions:
        readable = " and ".join(map(str, versions))
        raise BadInput(f"{source}: unsupported format version {version} "
                       f"(this Bob reads version {readable})")
    if mode_code >= len(MODES):
        raise BadInput(f"{source}: unknown mode {mode_code} (0 hard, 1 corpus)")
    if not MIN_VOCAB <= vocab <= MAX_VOCAB:
        raise BadInput(f"{source}: V={vocab} is outside [{MIN_VOCAB}, {MAX_VOCAB}]")
    if prompts > MAX_PROMPTS:
        raise BadInput(f"{source}: P={prompts} is outside [0, {MAX_PROMPTS}]")
    return MODES[mode_code], vocab, prompts, version


def _read_input_header(data: bytes, source: str) -> tuple[Mode, int, int, int]:
    """An input record's header: `_read_header`'s checks, and a dense (version 1) corpus
    record no larger than MAX_DENSE_VOCAB, refused before its V x V weights are read."""
    mode, vocab, prompts, version = _read_header(data, source, INPUT_MAGIC, "input record",
                                                 versions=(FORMAT_VERSION, SPARSE_VERSION))
    if mode == "corpus" and version == FORMAT_VERSION and vocab > MAX_DENSE_VOCAB:
        raise BadInput(f"{source}: a dense (version {FORMAT_VERSION}) corpus record of V={vocab} "
                       f"would hold {4 * vocab * vocab:,} bytes of weights; dense records go up "
                       f"to V={MAX_DENSE_VOCAB} (larger ones are sparse, version "
                       f"{SPARSE_VERSION})")
    return mode, vocab, prompts, version


def _check_length(data: bytes, source: str, what: str, mode: Mode, vocab: int,
                  prompts: int, payload_bytes: int, *, start: int = HEADER.size,
                  pairs: int | None = None) -> None:
    expected = start + payload_bytes
    shape = f"{mode} {what} with V={vocab}, " + ("" if pairs is None else f"K={pairs}, ") \
        + f"P={prompts}"
    if len(data) < expected:
        raise BadInput(f"{source}: truncated: {len(data)} bytes, a {shape} has {expected}")
    if len(data) > expected:
        raise BadInput(f"{source}: {len(data) - expected} trailing bytes after a {shape} "
                       f"({expected} bytes)")


def _header(magic: bytes, mode: Mode, vocab: int, prompts: int,
            version: int = FORMAT_VERSION) -> bytes:
    return HEADER.pack(magic, version, MODES.index(mode), vocab, prompts)


def _as_bytes(data: bytes | bytearray | memoryview) -> bytes:
    # Arrays are views into the data: it must not change under them.
    return data if isinstance(data, bytes) else bytes(data)


# -- the input record ----------------------------------------------------------
@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class InputRecord:
    """What one invocation reads: the training targets and the prompts.

    Hard mode: `targets[r]`, the byte that follows byte r. Corpus mode: the K cells of the
    V x V table of weights C / total that are not zero, sparse: `keys` (row * V + column,
    strictly increasing) and their binary32 `values`; the device scatters them into its
    table. Build one with `InputRecord.hard(targets, prompts)`,
    `InputRecord.sparse(vocab, keys, values, prompts)` or, from a dense table,
    `InputRecord.corpus(weights, prompts)`. Shapes and dtypes that do not fit raise
    ValueError/TypeError (a caller's mistake); values that do not fit (a target, prompt or
    key out of range, bad weights) raise BadInput naming `source`.
    """

    mode: Mode
    vocab: int  # V
    targets: np.ndarray | None = None  # u32[V], hard mode: row r's next byte
    keys: np.ndarray | None = None  # u64[K], corpus mode: row * V + column, increasing
    values: np.ndarray | None = None  # f32[K], corpus mode: C / total of each key's pair
    prompts: np.ndarray  # u32[P]: rows whose next byte is predicted
    source: str = field(default="input record", repr=False)  # names the file in errors

    def __post_init__(self) -> None:
        v = self.vocab
        prompts = _as_indices(self.prompts, "prompts")
        if prompts.ndim != 1:
            raise ValueError(f"prompts must be one-dimensional, not of shape {prompts.shape}")
        _check_sizes(self.mode, v, len(prompts))
        _check_indices(prompts, v, "prompts", self.source)
        object.__setattr__(self, "prompts", _readonly(prompts.astype(U32, copy=False)))
        if self.mode == "hard":
            if self.targets is None or self.keys is not None or self.values is not None:
                raise ValueError("a hard-mode record has targets and no keys or values")
            targets = _as_indices(self.targets, "targets")
            _check_shape(targets, (v,), "targets")
            _check_indices(targets, v, "targets", self.source)
            object.__setattr__(self, "targets", _readonly(targets.astype(U32, copy=False)))
            return
        if self.keys is None or self.values is None or self.targets is not None:
            raise ValueError("a corpus-mode record has keys and values and no targets")
        keys = _as_indices(self.keys, "keys")
        values = np.asarray(self.values)
        if values.dtype.kind != "f":
            raise TypeError(f"values must be floating point, not {values.dtype}")
        if keys.ndim != 1 or values.shape != keys.shape:
            raise ValueError(f"keys {keys.shape} and values {values.shape} must be one "
                             "entry per pair")
        _check_keys(keys, v, self.source)
        values = np.ascontiguousarray(values, dtype=F32)
        _check_weights(values, self.source, keys, v)
        object.__setattr__(self, "keys", _readonly(keys.astype(U64, copy=False)))
        object.__setattr__(self, "values", _readonly(values))

    @classmethod
    def hard(cls, targets: object, prompts: object = (), source: str = "input record",
             ) -> InputRecord:
        """Hard targets: targets[r] is the byte that follows byte r."""
        targets = _as_indices(targets, "targets")
        return cls(mode="hard", vocab=len(targets), targets=targets, prompts=prompts,
                   source=source)

    @classmethod
    def sparse(cls, vocab: int, keys: object, values: object, prompts: object = (),
               source: str = "input record") -> InputRecord:
        """Corpus weights, sparse: values[i] is the share of transitions keys[i] // V ->
        keys[i] % V; every other transition has none."""
        return cls(mode="corpus", vocab=vocab, keys=keys, values=values, prompts=prompts,
                   source=source)

    @classmethod
    def corpus(cls, weights: object, prompts: object = (), source: str = "input record",
               ) -> InputRecord:
        """Corpus weights from a dense table: weights[r][n] is the share of transitions
        r -> n. Its cells whose bits are not zero become the pairs (a -0.0 stays one)."""
        weights = np.asarray(weights)
        if weights.dtype.kind != "f":
            raise TypeError(f"weights must be floating point, not {weights.dtype}")
        if weights.ndim != 2 or weights.shape[0] != weights.shape[1]:
            raise ValueError(f"weights must be a square table, not of shape {weights.shape}")
        flat = np.ascontiguousarray(weights, dtype=F32).reshape(-1)
        keys = np.flatnonzero(flat.view(U32)).astype(U64)
        return cls.sparse(len(weights), keys, flat[keys.astype(np.intp)], prompts, source)

    @property
    def prompt_count(self) -> int:
        return len(self.prompts)

    @property
    def pairs(self) -> int:
        """K: the corpus pairs the record carries (0 in hard mode)."""
        return 0 if self.keys is None else len(self.keys)

    def named_keys(self) -> np.ndarray:
        """The cells the record's data names, row * V + column (int64, sorted, unique): the
        targets' cells (hard), the pairs' (corpus)."""
        if self.mode == "hard":
            assert self.targets is not None
            rows = np.arange(self.vocab, dtype=np.int64)
            return rows * self.vocab + self.targets.astype(np.int64)
        assert self.keys is not None
        return self.keys.astype(np.int64)

    def dense_weights(self) -> np.ndarray:
        """The corpus weights as the V x V table the device scatters them into (V x V
        memory: for small tables and tests; refused past MAX_DENSE_VOCAB)."""
        if self.mode != "corpus":
            raise ValueError("a hard-mode record has no weights")
        require_dense_vocab(self.vocab, f"{self.source}: the weights as a table", 4)
        assert self.keys is not None and self.values is not None
        table = np.zeros(self.vocab * self.vocab, F32)
        table[self.keys.astype(np.intp)] = self.values
        return table.reshape(self.vocab, self.vocab)

    def _training_parts(self) -> tuple[memoryview, ...]:
        """The payload before the prompts: targets (hard), or keys then values (corpus)."""
        if self.mode == "hard":
            assert self.targets is not None  # __post_init__ guarantees it
            return (_raw(self.targets),)
        assert self.keys is not None and self.values is not None
        return (_raw(self.keys), _raw(self.values))

    @functools.cached_property
    def data_digest(self) -> str:
        """What the record trains on (prompts do not affect training): the sha256 hex of
        the targets (hard), the sparse digest of the weights (corpus, records.digest)."""
        if self.mode == "hard":
            return hashlib.sha256(_raw(self.targets)).hexdigest()
        assert self.keys is not None and self.values is not None
        return sparse_digest_of(self.vocab, self.keys, self.values)

    def digest_matches(self, stored: str) -> bool:
        """Whether a stored data digest (either version) names this record's data."""
        if self.mode == "hard" or is_sparse(stored):
            return stored == self.data_digest
        assert self.keys is not None and self.values is not None
        return legacy_matches(stored, self.vocab, self.keys, self.values)

    def payload(self) -> bytes:
        """Exactly the arena's input tensor."""
        return b"".join((*self._training_parts(), _raw(self.prompts)))

    def header(self) -> bytes:
        if self.mode == "hard":
            return _header(INPUT_MAGIC, self.mode, self.vocab, self.prompt_count)
        return (_header(INPUT_MAGIC, self.mode, self.vocab, self.prompt_count, SPARSE_VERSION)
                + PAIRS.pack(self.pairs))

    def to_bytes(self) -> bytes:
        return b"".join((self.header(), self.payload()))

    def write(self, path: StrPath) -> None:
        """Write the record atomically."""
        def write_parts(file: BinaryIO) -> None:
            for part in (self.header(), *self._training_parts(), _raw(self.prompts)):
                file.write(part)
        atomic_write(path, write_parts)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, source_name: str,
                   ) -> InputRecord:
        data = _as_bytes(data)
        mode, v, p, version = _read_input_header(data, source_name)
        if mode == "hard" or version == FORMAT_VERSION:
            table_bytes = 4 * v if mode == "hard" else 4 * v * v
            _check_length(data, source_name, "input record", mode, v, p,
                          _payload_bytes(mode, v, p, version))
            prompts = np.frombuffer(data, U32, p, HEADER.size + table_bytes)
            if mode == "hard":
                if version != FORMAT_VERSION:
                    raise BadInput(f"{source_name}: a hard-mode record is format version "
                                   f"{FORMAT_VERSION}, not {version}")
                targets = np.frombuffer(data, U32, v, HEADER.size)
                return cls.hard(targets, prompts, source=source_name)
            weights = np.frombuffer(data, F32, v * v, HEADER.size).reshape(v, v)
            return cls.corpus(weights, prompts, source=source_name)
        if len(data) < HEADER.size + PAIRS.size:
            raise BadInput(f"{source_name}: truncated header: {len(data)} bytes, a sparse "
                           f"corpus record starts with {HEADER.size + PAIRS.size}")
        (k,) = PAIRS.unpack_from(data, HEADER.size)
        if k > v * v:
            raise BadInput(f"{source_name}: K={k} pairs, more than the {v * v} cells of a "
                           f"V={v} table")
        start = HEADER.size + PAIRS.size
        _check_length(data, source_name, "input record", mode, v, p,
                      _payload_bytes(mode, v, p, version, k), start=start, pairs=k)
        keys = np.frombuffer(data, U64, k, start)
        values = np.frombuffer(data, F32, k, start + 8 * k)
        prompts = np.frombuffer(data, U32, p, start + 12 * k)
        return cls.sparse(v, keys, values, prompts, source=source_name)

    @classmethod
    def read(cls, path: StrPath) -> InputRecord:
        """The record in a file, or in a stream (a pipe, a FIFO, a character device): read
        as far as its header says and no further (`_read_record_stream`)."""
        require_named(path, "input record")
        if stream_kind(path) is None:
            # The header first: one that is refused (a dense table past MAX_DENSE_VOCAB,
            # say) costs its 32 bytes, not the gigabytes it declares. Its open meets
            # read_bytes's ladder (missing, a directory, permission) with the same words.
            with reading_input(path) as file:
                _declared_length(file.read(HEADER.size + PAIRS.size), str(path))
            return cls.from_bytes(read_bytes(path), str(path))
        with reading_input(path, "input record") as stream:
            return cls.from_bytes(_read_record_stream(stream, str(path)), str(path))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InputRecord):
            return NotImplemented
        if (self.mode, self.vocab) != (other.mode, other.vocab) \
                or not arrays_identical(self.prompts, other.prompts):
            return False
        if self.mode == "hard":
            return arrays_identical(self.targets, other.targets)
        return arrays_identical(self.keys, other.keys) \
            and arrays_identical(self.values, other.values)

    __hash__ = None  # type: ignore[assignment]  # holds arrays

    def __repr__(self) -> str:
        pairs = f", K={self.pairs}" if self.mode == "corpus" else ""
        return f"InputRecord(mode={self.mode!r}, V={self.vocab}{pairs}, P={self.prompt_count})"


def _read_record_stream(stream: BinaryIO, source: str) -> bytes:
    """An input record from a stream, which has no size up front: the header, then as many
    bytes as the header declares (at most a V=MAX_VOCAB table and MAX_PROMPTS prompts, or
    K <= V * V pairs) and one more, to refuse a stream that goes on. A header that is not
    an input record's is refused after its first bytes (/dev/zero's, say)."""
    head = stream.read(HEADER.size + PAIRS.size)
    declared = _declared_length(head, source)
    if declared is None:
        return head  # a cut header or too many pairs: from_bytes says which
    data = head + stream.read(max(0, declared + 1 - len(head)))
    if len(data) > declared:
        raise BadInput(f"{source}: the stream goes on past the {declared:,} bytes its header "
                       "declares")
    return data


def _declared_length(head: bytes, source: str) -> int | None:
    """The bytes of the whole input record whose header is `head`; None where `head` stops
    inside the pair count or the count does not fit V (from_bytes refuses both)."""
    mode, v, p, version = _read_input_header(head, source)
    if mode == "hard" or version == FORMAT_VERSION:
        return HEADER.size + _payload_bytes(mode, v, p, version)
    if len(head) < HEADER.size + PAIRS.size:
        return None
    (k,) = PAIRS.unpack_from(head, HEADER.size)
    if k > v * v:
        return None
    return HEADER.size + PAIRS.size + _payload_bytes(mode, v, p, version, k)


def _payload_bytes(mode: Mode, vocab: int, prompts: int, version: int, pairs: int = 0) -> int:
    """The bytes after an input record's header (and pair count): the targets (hard), the
    dense table (corpus, version 1) or K keys and values (sparse), then the prompts."""
    if mode == "hard":
        return 4 * vocab + 4 * prompts
    if version == FORMAT_VERSION:
        return 4 * vocab * vocab + 4 * prompts
    return 12 * pairs + 4 * prompts


# -- the result record ---------------------------------------------------------
@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class ResultRecord:
    """What one invocation produced, read back from the arena's result tensors."""

    mode: Mode
    vocab: int  # V
    initial_loss: np.ndarray  # f32[V]: row losses before the first update
    training_loss: np.ndarray  # f32[V]: row losses after the last update
    logit_rows: np.ndarray  # f32[P][V]: each prompt's row of the table
    predictions: np.ndarray  # u32[P]: each prompt's greedy next byte
    source: str = field(default="result record", repr=False)  # names the file in errors

    def __post_init__(self) -> None:
        v = self.vocab
        predictions = _as_indices(self.predictions, "predictions")
        if predictions.ndim != 1:
            raise ValueError(f"predictions must be one-dimensional, not {predictions.shape}")
        p = len(predictions)
        _check_sizes(self.mode, v, p)
        for name, shape in (("initial_loss", (v,)), ("training_loss", (v,)),
                            ("logit_rows", (p, v))):
            array = np.asarray(getattr(self, name))
            if array.dtype.kind != "f":
                raise TypeError(f"{name} must be floating point, not {array.dtype}")
            array = np.ascontiguousarray(array, dtype=F32)
            _check_shape(array, shape, name)
            object.__setattr__(self, name, _readonly(array))
        _check_indices(predictions, v, "predictions", self.source)
        object.__setattr__(self, "predictions", _readonly(predictions.astype(U32, copy=False)))

    @property
    def prompt_count(self) -> int:
        return len(self.predictions)

    @staticmethod
    def objective(mode: Mode, row_losses: np.ndarray) -> float:
        """The objective from row losses: their mean (hard), their sum (corpus).

        Summed exactly (math.fsum) so every reader gets the same number. tolist gives
        the same float64 values as an astype would, and fsum reads a list faster than
        NumPy scalars.
        """
        total = math.fsum(np.asarray(row_losses, np.float64).tolist())
        return total / len(row_losses) if mode == "hard" else total

    @property
    def initial_objective(self) -> float:
        return self.objective(self.mode, self.initial_loss)

    @property
    def training_objective(self) -> float:
        return self.objective(self.mode, self.training_loss)

    def _parts(self) -> tuple[memoryview, ...]:
        return tuple(_raw(getattr(self, name)) for name in RESULT_TENSORS)

    def payload(self) -> bytes:
        """The result tensors' bytes, in arena order."""
        return b"".join(self._parts())

    def header(self) -> bytes:
        return _header(RESULT_MAGIC, self.mode, self.vocab, self.prompt_count)

    def to_bytes(self) -> bytes:
        return b"".join((self.header(), *self._parts()))

    def write(self, path: StrPath) -> None:
        """Write the record atomically."""
        atomic_write(path, self.to_bytes())

    @classmethod
    def from_arena(cls, mode: Mode, vocab: int, *, initial_loss: bytes, training_loss: bytes,
                   logit_rows: bytes, predictions: bytes) -> ResultRecord:
        """A record from the result tensors' bytes (P follows from the predictions)."""
        if len(predictions) % 4:
            raise ValueError(f"predictions are {len(predictions)} bytes, not whole u32s")
        p = len(predictions) // 4
        sizes = {"initial_loss": 4 * vocab, "training_loss": 4 * vocab,
                 "logit_rows": 4 * p * vocab}
        given = {"initial_loss": initial_loss, "training_loss": training_loss,
                 "logit_rows": logit_rows}
        for name, size in sizes.items():
            if len(given[name]) != size:
                raise ValueError(f"{name} is {len(given[name])} bytes; V={vocab}, P={p} "
                                 f"needs {size}")
        return cls(
            mode=mode, vocab=vocab,
            initial_loss=np.frombuffer(_as_bytes(initial_loss), F32),
            training_loss=np.frombuffer(_as_bytes(training_loss), F32),
            logit_rows=np.frombuffer(_as_bytes(logit_rows), F32).reshape(p, vocab),
            predictions=np.frombuffer(_as_bytes(predictions), U32),
            source="arena")

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, source_name: str,
                   ) -> ResultRecord:
        data = _as_bytes(data)
        mode, v, p, _ = _read_header(data, source_name, RESULT_MAGIC, "result record")
        _check_length(data, source_name, "result record", mode, v, p, 4 * (2 * v + p * v + p))
        offset = HEADER.size

        def take(dtype: np.dtype, count: int) -> np.ndarray:
            nonlocal offset
            array = np.frombuffer(data, dtype, count, offset)
            offset += 4 * count
            return array

        return cls(mode=mode, vocab=v, initial_loss=take(F32, v), training_loss=take(F32, v),
                   logit_rows=take(F32, p * v).reshape(p, v), predictions=take(U32, p),
                   source=source_name)

    @classmethod
    def read(cls, path: StrPath) -> ResultRecord:
        return cls.from_bytes(read_bytes(path), str(path))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResultRecord):
            return NotImplemented
        return (self.mode == other.mode and self.vocab == other.vocab
                and all(arrays_identical(getattr(self, n), getattr(other, n))
                        for n in RESULT_TENSORS))

    __hash__ = None  # type: ignore[assignment]  # holds arrays

    def __repr__(self) -> str:
        return f"ResultRecord(mode={self.mode!r}, V={self.vocab}, P={self.prompt_count})"
