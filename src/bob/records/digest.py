"""The data digest: which data a model trained on, as a checkpoint and a counts file record it.

Two versions exist, told apart by their form:

    sparse (version 2)  "v2:" + sha256 hex of, in order:
                        SPARSE_DOMAIN, then V and K as little-endian u64,
                        then the K keys prev * V + next of the non-zero counts in
                        row-major order as little-endian u64,
                        then their weights C / N as little-endian binary32.
                        O(K) work for K distinct pairs, whatever V is.
    legacy              sha256 hex of the dense V x V table of weights, row-major
                        binary32 (the corpus input record's bytes): O(V * V) work.

Each weight is formed as `corpus.weights` forms it: the float64 quotient C / N
rounded to float32. Proportional counts have equal weights, so equal digests.
`digest_matches` checks a stored digest of either version against counts,
computing the legacy digest only for a legacy one.

Every V up to MAX_VOCAB (2^20) has a version 2 digest, by the one definition above:
a key prev * V + next is hashed as u64 whatever type the counts hold it in (u32 up to
V = 65536, u64 above, where keys reach 2^40), so the digest of data at V <= 65536 is
the one it has always been, and a larger V needs no other form. The legacy digest
hashes a dense table, which exists only up to MAX_DENSE_VOCAB: above it no legacy
digest names any data (`legacy_digest_of` refuses the V x V pass, and a stored legacy
digest matches nothing).
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

import numpy as np

from bob.config import MAX_DENSE_VOCAB

if TYPE_CHECKING:
    from bob.records.counting import PairCounts

SPARSE_PREFIX = "v2:"
SPARSE_DOMAIN = b"bob-data-digest sparse-weights v2\0"
LEGACY_DIGEST = re.compile(r"[0-9a-f]{64}")
SPARSE_DIGEST = re.compile(re.escape(SPARSE_PREFIX) + r"[0-9a-f]{64}")
DIGEST_FORMS = f"64 lowercase hex digits, alone or after {SPARSE_PREFIX!r}"  # for messages
ENTRIES_AT_A_TIME = 1 << 20  # sparse entries hashed at a time (12 MiB of keys and weights)
LEGACY_ELEMENTS = 1 << 22  # legacy weights hashed at a time (32 MiB of float64)


def is_digest(text: object) -> bool:
    """A data digest of either version."""
    return isinstance(text, str) and bool(SPARSE_DIGEST.fullmatch(text)
                                          or LEGACY_DIGEST.fullmatch(text))


def is_sparse(digest: str) -> bool:
    return digest.startswith(SPARSE_PREFIX)



def weights_of(values: np.ndarray, total: int) -> np.ndarray:
    """C / N as corpus.weights forms it: the float64 quotient rounded to float32."""
    return (values.astype(np.float64) / total).astype("<f4")




def sparse_digest(counts: PairCounts) -> str:
    """The version 2 digest of the counts: their keys and weights, never a dense table."""
    return sparse_digest_of(*_sparse_weights(counts))


def sparse_digest_of(vocab: int, keys: np.ndarray, weights: np.ndarray | _Weights) -> str:
    """The version 2 digest of K sparse weights: their keys (row-major order) and binary32
    weights, as a sparse corpus input record holds them."""
    hasher = hashlib.sha256(SPARSE_DOMAIN)
    hasher.update(np.array([vocab, keys.size], "<u8").tobytes())
    for first in range(0, keys.size, ENTRIES_AT_A_TIME):
        wide = keys[first:first + ENTRIES_AT_A_TIME].astype("<u8")
        hasher.update(memoryview(wide).cast("B"))
    for first in range(0, keys.size, ENTRIES_AT_A_TIME):
        part = weights[first:first + ENTRIES_AT_A_TIME]
        hasher.update(memoryview(np.ascontiguousarray(part, "<f4")).cast("B"))
    return SPARSE_PREFIX + hasher.hexdigest()


def _sparse_weights(counts: PairCounts) -> tuple[int, np.ndarray, _Weights]:
    """V, the keys and the weights C / N of non-zero counts, as both digests read them."""
    if counts.transitions == 0:
        raise ValueError("the counts are all zero")
    keys, values = counts.pairs()
    return counts.vocab, keys, _Weights(values, counts.transitions)


class _Weights:
    """C / N of counts, formed a slice at a time as the digests read them."""

    def __init__(self, values: np.ndarray, total: int):
        self.values, self.total = values, total

    def __getitem__(self, where: slice) -> np.ndarray:
        return weights_of(self.values[where], self.total)


def legacy_digest(counts: PairCounts) -> str:
    """The legacy digest: sha256 of (C / N) as float32, row-major, a block of rows at a time.

    Equal to a dense corpus input record's digest without building the V x V table at
    once; its work is still V * V.
    """
    return legacy_digest_of(*_sparse_weights(counts))


def legacy_digest_of(vocab: int, keys: np.ndarray, weights: np.ndarray | _Weights) -> str:
    """The legacy digest of K sparse weights: the sha256 of the dense V x V table they
    fill (zeros elsewhere), row-major binary32, a block of rows at a time. Defined up to
    MAX_DENSE_VOCAB (ValueError above: 2^40 cells at V = 2^20)."""
    if vocab > MAX_DENSE_VOCAB:
        raise ValueError(f"V={vocab} has no legacy digest (dense tables go up to "
                         f"V={MAX_DENSE_VOCAB})")
    hasher = hashlib.sha256()
    step = max(1, LEGACY_ELEMENTS // vocab)  # rows at a time
    starts = np.searchsorted(keys, np.arange(0, vocab + step, step, dtype=np.int64) * vocab)
    block = np.zeros(step * vocab, "<f4")  # reused: only the counted cells are written
    for k, first in enumerate(range(0, vocab, step)):
        last = min(first + step, vocab)
        lo, hi = starts[k], starts[k + 1]
        at = keys[lo:hi].astype(np.int64) - first * vocab
        block[at] = weights[lo:hi]
        hasher.update(memoryview(block[: (last - first) * vocab]).cast("B"))
        block[at] = 0
    return hasher.hexdigest()


def digest_matches(stored: str, counts: PairCounts) -> bool:
    """Whether `stored` (either version) is the digest of the counts' weights.

    Only a legacy digest costs the V x V pass; ValueError when `stored` is not a digest.
    """
    if SPARSE_DIGEST.fullmatch(stored):
        return stored == sparse_digest(counts)
    if LEGACY_DIGEST.fullmatch(stored):
        return legacy_matches(stored, *_sparse_weights(counts))
    raise ValueError(f"{stored!r} is not a data digest ({DIGEST_FORMS})")


def legacy_matches(stored: str, vocab: int, keys: np.ndarray,
                   weights: np.ndarray | _Weights) -> bool:
    """Whether a stored legacy digest is that of these sparse weights: never above
    MAX_DENSE_VOCAB, where no dense table (so no legacy digest) was ever made."""
    return vocab <= MAX_DENSE_VOCAB and stored == legacy_digest_of(vocab, keys, weights)
