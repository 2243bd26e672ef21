"""The optimum H(next | prev) in compiled code is bit-equal to the Python sum of its terms."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bob.records import corpus
from bob.records.counting import PairCounts, count_sources, key_dtype
from bob.records.countsfile import counts_optimum
from bob.records.sources import resolve

pytest.importorskip("numba")

TEXTS = [b"abracadabra", b"the cat sat on the mat\n", b"aaaa", b"ab" * 50 + b"c",
         bytes(range(256)) * 3, "na\u00efve caf\u00e9 \u2014 r\u00e9sum\u00e9".encode(),
         b"x" * 2 + b"y"]


def oracle(values: np.ndarray, row_sums: np.ndarray, total: int) -> float:
    """corpus.optimum_of_entries as it is in Python: each term from Python integers, fsum."""
    def terms() -> Iterator[float]:
        for first in range(0, len(values), 1 << 16):
            last = first + (1 << 16)
            yield from (c / total * math.log(c / s) for c, s in
                        zip(values[first:last].tolist(), row_sums[first:last].tolist(),
                            strict=True))
    return 0.0 - math.fsum(terms())


def entries(counts: PairCounts) -> tuple[np.ndarray, np.ndarray, int]:
    keys, values = counts.pairs()
    return values, counts.row_sums()[keys // keys.dtype.type(counts.vocab)], counts.transitions


def compiled(values: np.ndarray, row_sums: np.ndarray, total: int) -> float:
    partials = corpus._optimum_partials()(values, row_sums, float(total))
    return 0.0 - math.fsum(partials.tolist())


def random_sparse(vocab: int, size: int, seed: int, largest: int) -> PairCounts:
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, vocab * vocab, size)).astype(key_dtype(vocab))
    values = np.minimum(rng.zipf(1.2, keys.size), largest).astype(np.uint64)
    return PairCounts(vocab, keys=keys, values=values)


def token_walk(directory: Path, vocab: int) -> PairCounts:
    """The token fixtures' walks: sparse counts with structure."""
    rng = np.random.default_rng(vocab)
    path = directory / f"walk{vocab}.bin"
    (np.cumsum(rng.integers(1, 50, 20_000)) % vocab).astype("<u2").tofile(path)
    return count_sources(resolve([str(path)], "uint16"), vocab, workers=1)


def corpora(directory: Path) -> list[tuple[str, PairCounts]]:
    found = [("builtin", PairCounts.from_dense(
        corpus.counts_from_bytes(corpus.builtin_corpus())))]
    found += [(f"text {i}", PairCounts.from_dense(corpus.counts_from_bytes(t)))
              for i, t in enumerate(TEXTS)]
    found.append(("texts", PairCounts.from_dense(
        sum(corpus.counts_from_bytes(t) for t in TEXTS))))
    uniform = np.random.default_rng(2).integers(0, 300, 5000).astype("<u2")
    uniform.tofile(directory / "train.bin")
    found.append(("tokens 300", count_sources(resolve([str(directory / "train.bin")],
                                                      "uint16"), 300, workers=1)))
    found += [(f"walk {v}", token_walk(directory, v)) for v in (3000, 50257)]
    found += [(f"random {v}", random_sparse(v, 50_000, v, 10**6))
              for v in (300, 3000, 50257, 65536)]
    found.append(("ones", PairCounts.from_dense(np.ones((256, 256), np.uint64))))
    found.append(("certain", PairCounts.from_dense(corpus.counts_from_bytes(b"abcabcabc"))))
    return found


def test_the_compiled_optimum_is_bit_equal_on_every_corpus(tmp_path: Path) -> None:
    for name, counts in corpora(tmp_path):
        values, row_sums, total = entries(counts)
        expected = oracle(values, row_sums, total)
        assert compiled(values, row_sums, total).hex() == expected.hex(), name
        assert corpus.optimum_of_entries(values, row_sums, total).hex() == expected.hex(), name
        assert counts_optimum(counts).hex() == expected.hex(), name


def test_optimum_of_entries_takes_the_compiled_path_from_its_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = corpus._optimum_partials()

    def counted(values, row_sums, total):
        calls.append(values.size)
        return original(values, row_sums, total)

    monkeypatch.setattr(corpus, "_optimum_partials", lambda: counted)
    monkeypatch.setattr(corpus, "OPTIMUM_COMPILED_MIN", 1000)
    for _, counts in corpora(tmp_path):
        values, row_sums, total = entries(counts)
        assert corpus.optimum_of_entries(values, row_sums, total) == oracle(values, row_sums,
                                                                            total)
    assert calls and min(calls) >= 1000
    certain = corpus.optimum(corpus.counts_from_bytes(b"abcabcabc"))
    assert certain == 0.0 and math.copysign(1.0, certain) == 1.0


def test_counts_past_exact_floats_keep_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above 2**53 a count is not exact as float64; Python's integer division still is."""
    monkeypatch.setattr(corpus, "OPTIMUM_COMPILED_MIN", 0)
    rng = np.random.default_rng(7)
    keys = np.unique(rng.integers(0, 3000 * 3000, 2000)).astype(key_dtype(3000))
    counts = PairCounts(3000, keys=keys, values=rng.integers(1, 2**54, keys.size, np.uint64))
    values, row_sums, total = entries(counts)
    assert total > corpus.EXACT_FLOAT_MAX
    assert corpus.optimum_of_entries(values, row_sums, total) == oracle(values, row_sums, total)


def test_a_counts_files_optimum_taken_a_slice_at_a_time_is_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bob.records import countsfile

    monkeypatch.setattr(countsfile, "ENTRIES_AT_A_TIME", 777)
    for compiled_from in (0, 10**9):  # the compiled partials, then the Python terms
        monkeypatch.setattr(corpus, "OPTIMUM_COMPILED_MIN", compiled_from)
        for name, counts in corpora(tmp_path):
            expected = oracle(*entries(counts))
            assert counts_optimum(counts).hex() == expected.hex(), name
