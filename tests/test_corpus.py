"""Corpus counts, weights, optimum, digest and the built-in corpus."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from bob.errors import BadInput
from bob.kernels.exact import f32_bits, f32_bits_from_fraction
from bob.records import corpus
from bob.records.binary import InputRecord
from bob.records.corpus import (
    Corpus,
    builtin_corpus,
    counts_from_bytes,
    counts_from_files,
    digest,
    input_record,
    optimum,
    weights,
)
from bob.records.counting import PairCounts
from bob.records.digest import sparse_digest
from conftest import listing

TEXTS = [b"abracadabra", b"the cat sat on the mat\n", b"aaaa", b"ab" * 50 + b"c",
         bytes(range(256)) * 3, "na\u00efve caf\u00e9 \u2014 r\u00e9sum\u00e9".encode()]


def brute_pairs(texts: list[bytes]) -> Counter[tuple[int, int]]:
    pairs: Counter[tuple[int, int]] = Counter()
    for text in texts:
        pairs.update(zip(text, text[1:], strict=False))
    return pairs


def brute_optimum(texts: list[bytes]) -> float:
    """H(next | prev) straight from the definition, in Python floats."""
    pairs = brute_pairs(texts)
    total = sum(pairs.values())
    rows: Counter[int] = Counter()
    for (r, _), c in pairs.items():
        rows[r] += c
    return -math.fsum(c / total * math.log(c / rows[r]) for (r, _), c in pairs.items())


def count_transitions(texts: list[bytes], vocab: int = 256) -> np.ndarray:
    """Counts of several texts: pairs never span two texts, so the counts add up."""
    return sum(counts_from_bytes(t, vocab=vocab) for t in texts)  # type: ignore[return-value]


def write_files(directory: Path, texts: list[bytes]) -> list[Path]:
    paths = []
    for i, text in enumerate(texts):
        path = directory / f"text{i}.txt"
        path.write_bytes(text)
        paths.append(path)
    return paths


# -- counts --------------------------------------------------------------------
@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_counts_match_brute_force(text: bytes) -> None:
    counts = count_transitions([text])
    assert counts.dtype == np.uint64 and counts.shape == (256, 256)
    expected = np.zeros((256, 256), np.uint64)
    for (r, n), c in brute_pairs([text]).items():
        expected[r, n] = c
    assert np.array_equal(counts, expected)


def test_files_are_not_joined(tmp_path: Path) -> None:
    counts = counts_from_files(write_files(tmp_path, [b"ab", b"cd"]))
    assert counts[ord("a"), ord("b")] == 1 and counts[ord("c"), ord("d")] == 1
    assert counts[ord("b"), ord("c")] == 0
    assert int(counts.sum()) == 2


def test_files_are_counted_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "CHUNK_BYTES", 3)  # pairs straddle every chunk boundary
    texts = TEXTS[:4]
    counts = counts_from_files(write_files(tmp_path, texts))
    assert np.array_equal(counts, count_transitions(texts))
    assert int(counts.sum()) == sum(len(t) - 1 for t in texts)


def test_vocabularies_other_than_256(tmp_path: Path) -> None:
    ascii_counts = count_transitions([b"hello"], vocab=128)
    assert ascii_counts.shape == (128, 128) and ascii_counts[ord("l"), ord("l")] == 1
    wide = count_transitions([b"\xff\x00"], vocab=300)
    assert wide.shape == (300, 300) and wide[255, 0] == 1 and int(wide.sum()) == 1
    path = tmp_path / "utf8.txt"
    path.write_bytes("ok \u2014 no".encode())
    with pytest.raises(BadInput) as caught:
        counts_from_files([path], vocab=128)
    assert str(caught.value) == (f"{path}: byte 0xe2 at offset 3 does not fit V=128 "
                                 f"(V=256 fits every byte)")


# -- weights, optimum, digest --------------------------------------------------
@pytest.mark.parametrize("texts", [[t] for t in TEXTS] + [TEXTS], ids=repr)
def test_optimum_equals_brute_force(texts: list[bytes]) -> None:
    counts = count_transitions(texts)
    assert optimum(counts) == brute_optimum(texts)
    # and an independent formula: H = (sum_r s_r ln s_r - sum c ln c) / N
    c = counts[counts > 0].astype(np.float64)
    s = counts.sum(axis=1)
    s = s[s > 0].astype(np.float64)
    other = (np.sum(s * np.log(s)) - np.sum(c * np.log(c))) / c.sum()
    assert optimum(counts) == pytest.approx(other, rel=1e-12, abs=1e-12)


def test_optimum_of_certain_texts_is_zero() -> None:
    for text in (b"aaaa", b"abcabcabc", b"ab"):
        h = optimum(count_transitions([text]))
        assert h == 0.0 and math.copysign(1.0, h) == 1.0


def test_optimum_of_uniform_transitions() -> None:
    # Every byte is followed by each of the 256 bytes once: H = ln 256.
    counts = np.ones((256, 256), np.uint64)
    assert optimum(counts) == pytest.approx(math.log(256), rel=1e-15)


@pytest.mark.parametrize("texts", [[t] for t in TEXTS] + [TEXTS], ids=repr)
def test_weights_are_correctly_rounded_and_sum_to_one(texts: list[bytes]) -> None:
    counts = count_transitions(texts)
    table = weights(counts)
    assert table.dtype == np.float32 and table.shape == (256, 256)
    total = int(counts.sum())
    # Each weight within half an ulp of C/N, so the sum is within 2**-24 of 1.
    assert abs(float(table.sum(dtype=np.float64)) - 1.0) <= 2.0**-24
    for r, n in zip(*np.nonzero(counts), strict=True):
        exact = f32_bits_from_fraction(Fraction(int(counts[r, n]), total))
        assert f32_bits(float(table[r, n])) == exact
    assert not table[counts == 0].any()


def test_digest_is_the_legacy_form_of_the_records_data_digest() -> None:
    counts = count_transitions(TEXTS)
    record = input_record(counts, b"th")
    assert record.data_digest == sparse_digest(PairCounts.from_dense(counts))
    assert record.digest_matches(digest(counts)) and digest(counts) != record.data_digest
    assert len(digest(counts)) == 64
    assert not record.digest_matches(digest(count_transitions(TEXTS[:2])))
    assert digest(counts) != digest(count_transitions(TEXTS[:2]))
    # The same proportions train the same model: the same digest.
    assert digest(counts * np.uint64(3)) == digest(counts)


def test_input_record_round_trips() -> None:
    counts = count_transitions(TEXTS)
    record = input_record(counts, b"the")
    assert record.mode == "corpus" and record.vocab == 256 and record.prompt_count == 3
    assert np.array_equal(record.dense_weights(), weights(counts))
    assert record.pairs == int(np.count_nonzero(counts))
    assert InputRecord.from_bytes(record.to_bytes(), "memory") == record
    with pytest.raises(BadInput, match=r"^corpus: prompts\[0\] = 256 is not below V=256$"):
        input_record(counts, [256])


# -- the built-in corpus -------------------------------------------------------
def test_builtin_corpus() -> None:
    from pydoc_data.topics import topics
    text = builtin_corpus()
    assert text == "\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    assert text.startswith(topics[min(topics)].encode())
    assert text == builtin_corpus()
    built = Corpus.builtin()
    assert built.sources == ("pydoc_data.topics",) and built.vocab == 256
    assert built.transitions == len(text) - 1
    assert 0.5 < built.optimum() < math.log(256)
    assert built.input_record(b"a").digest_matches(built.digest())


def test_corpus_from_files(tmp_path: Path) -> None:
    paths = write_files(tmp_path, TEXTS[:3])
    loaded = Corpus.from_files(paths)
    assert loaded.transitions == sum(len(t) - 1 for t in TEXTS[:3])
    assert loaded.optimum() == brute_optimum(TEXTS[:3])
    assert loaded.name == ", ".join(str(p) for p in paths)


# -- bad corpora ---------------------------------------------------------------
@pytest.mark.parametrize(("texts", "fragment"), [
    ([b""], "text0.txt: empty file, nothing to learn from"),
    ([b"abc", b""], "text1.txt: empty file, nothing to learn from"),
    ([b"a"], "text0.txt: no adjacent byte pairs (a corpus needs a text of at least 2 bytes)"),
    ([b"a", b"b"], "text1.txt: no adjacent byte pairs"),
])
def test_bad_corpus_files(texts: list[bytes], fragment: str, tmp_path: Path) -> None:
    paths = write_files(tmp_path, texts)
    before = listing(tmp_path)
    with pytest.raises(BadInput) as caught:
        counts_from_files(paths)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"{tmp_path}/text")
    assert listing(tmp_path) == before


def test_missing_corpus_file(tmp_path: Path) -> None:
    paths = write_files(tmp_path, [b"fine text"])
    with pytest.raises(BadInput, match=f"^{tmp_path / 'gone.txt'}: no such file$"):
        counts_from_files([*paths, tmp_path / "gone.txt"])
    with pytest.raises(BadInput, match=f"^{tmp_path}: is a directory, not a text file$"):
        counts_from_files([tmp_path])
    assert listing(tmp_path) == ["text0.txt"]


def test_unreadable_corpus_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (path,) = write_files(tmp_path, [b"secret"])

    def denied(self: Path, *args: object) -> None:
        raise PermissionError(13, "Permission denied")  # chmod 0 does not stop root

    monkeypatch.setattr(Path, "open", denied)
    with pytest.raises(BadInput, match=r"text0.txt: cannot read the file \(permission denied\)$"):
        counts_from_files([path])


def test_in_memory_texts() -> None:
    with pytest.raises(BadInput, match="^corpus: no adjacent byte pairs"):
        counts_from_bytes(b"x")
    with pytest.raises(BadInput, match="^notes: empty file"):
        counts_from_bytes(b"", "notes")
    with pytest.raises(ValueError, match="V must be"):
        counts_from_bytes(b"ok", vocab=1)
