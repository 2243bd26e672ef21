"""The data digest: the sparse version 2 over keys and weights, the legacy dense one, and
both accepted where a checkpoint or a counts file stores one."""

from __future__ import annotations

import hashlib
import struct
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bob.cli.main import main
from bob.config import Hyper
from bob.errors import BadInput
from bob.records import corpus, digest
from bob.records.checkpoint import Checkpoint, Segment
from bob.records.counting import PairCounts, count_sources
from bob.records.countsfile import CountsFile
from bob.records.digest import digest_matches, is_digest, legacy_digest, sparse_digest
from bob.records.sources import resolve

TEXT = b"the cat sat on the mat; the rat sat on the cat. " * 20
KEY = np.uint32  # the keys' type up to V = 65536 (counting.key_dtype)


def text_counts(text: bytes = TEXT) -> PairCounts:
    return PairCounts.from_dense(corpus.counts_from_bytes(text))


def spelled_out(vocab: int, keys: list[int], values: list[int]) -> str:
    """The version 2 digest written from its definition, one entry at a time."""
    total = sum(values)
    hasher = hashlib.sha256(b"bob-data-digest sparse-weights v2\0")
    hasher.update(struct.pack("<QQ", vocab, len(keys)))
    for key in keys:
        hasher.update(struct.pack("<Q", key))
    for value in values:
        hasher.update(np.float32(np.float64(value) / total).tobytes())
    return "v2:" + hasher.hexdigest()


def test_the_sparse_digest_is_its_definition() -> None:
    keys, values = [5, 9, 3 * 4096 + 17, 4095 * 4096 + 4095], [3, 1, 7, 2]
    counts = PairCounts(4096, keys=np.array(keys, KEY), values=np.array(values, np.uint64))
    assert sparse_digest(counts) == spelled_out(4096, keys, values)
    dense = text_counts()
    found_keys, found_values = dense.pairs()
    assert sparse_digest(dense) == spelled_out(256, found_keys.tolist(), found_values.tolist())


def test_the_sparse_digest_depends_on_the_weights_and_v_alone() -> None:
    dense = text_counts()
    keys, values = dense.pairs()
    as_sparse = PairCounts(256, keys=keys, values=values)  # the same counts, the other layout
    assert sparse_digest(as_sparse) == sparse_digest(dense)
    assert sparse_digest(PairCounts.from_dense(dense.dense * np.uint64(3))) == sparse_digest(dense)
    assert sparse_digest(text_counts(TEXT + b"!")) != sparse_digest(dense)
    wider = PairCounts(300, keys=(keys // 256 * 300 + keys % 256).astype(KEY), values=values)
    assert sparse_digest(wider) != sparse_digest(dense)  # the same pairs, another V


def test_the_sparse_digest_never_builds_a_dense_table() -> None:
    counts = PairCounts(65536, keys=np.array([0, 70_000, 2**32 - 1], KEY),
                        values=np.array([1, 2, 3], np.uint64))
    tracemalloc.start()
    try:
        found = sparse_digest(counts)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # a dense table would be 16 GiB of weights
    assert found == spelled_out(65536, [0, 70_000, 2**32 - 1], [1, 2, 3])


def test_the_legacy_digest_is_the_dense_records_and_kept_apart() -> None:
    dense = corpus.counts_from_bytes(TEXT)
    padded = np.zeros((3000, 3000), np.uint64)
    padded[:256, :256] = dense
    padded[2999, 2998] = 4
    for table in (dense, padded):
        counts = PairCounts.from_dense(table)
        assert legacy_digest(counts) == corpus.digest(table)
        record = corpus.input_record(table)
        assert sparse_digest(counts) == record.data_digest
        assert record.digest_matches(legacy_digest(counts))
        assert is_digest(legacy_digest(counts)) and is_digest(sparse_digest(counts))
        assert not digest.is_sparse(legacy_digest(counts))
        assert digest.is_sparse(sparse_digest(counts))


def test_a_stored_digest_of_either_version_matches_its_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    counts, other = text_counts(), text_counts(TEXT[::-1])
    legacy = corpus.digest(counts.dense)
    assert digest_matches(legacy, counts) and not digest_matches(legacy, other)
    sparse = sparse_digest(counts)
    assert digest_matches(sparse, counts) and not digest_matches(sparse, other)

    def refuse(_: PairCounts) -> str:
        raise AssertionError("the legacy digest was computed for a version 2 digest")

    monkeypatch.setattr(digest, "legacy_digest", refuse)
    assert digest_matches(sparse, counts)
    with pytest.raises(ValueError, match="'v2:abc' is not a data digest"):
        digest_matches("v2:abc", counts)


@pytest.mark.parametrize("text", ["", "ab" * 32, "v2:" + "ab" * 32])
def test_checkpoints_and_segments_accept_both_versions(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.safetensors"
    state = Checkpoint.zeros(16, Hyper(), "corpus", data_digest=text)
    state = state.with_segments((Segment(0, text, Hyper()),))
    state.save(path)
    loaded = Checkpoint.load(path)
    assert loaded.data_digest == text and loaded.segments[0].data_digest == text


@pytest.mark.parametrize("text", ["v2:" + "ab" * 31, "v3:" + "ab" * 32, "V2:" + "ab" * 32,
                                  "AB" * 32, "v2:" + "AB" * 32])
def test_a_malformed_digest_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not 64 lowercase hex digits, alone or after 'v2:'"):
        Checkpoint.zeros(16, Hyper(), "corpus", data_digest=text)


def test_new_counts_files_store_the_sparse_digest_and_legacy_ones_still_load(
        tmp_path: Path) -> None:
    source = tmp_path / "t.txt"
    source.write_bytes(TEXT)
    counts = count_sources(resolve([str(source)]), 256, workers=1)
    made = CountsFile.of(counts, [(str(source), len(TEXT))])
    assert made.digest == sparse_digest(counts)
    legacy = CountsFile(counts, made.sources, legacy_digest(counts), made.optimum)
    legacy.save(tmp_path / "legacy.counts")
    loaded = CountsFile.load(tmp_path / "legacy.counts")
    assert loaded.digest == corpus.digest(counts.dense) and digest_matches(loaded.digest,
                                                                            loaded.counts)


def test_a_checkpoint_with_the_legacy_digest_resumes(tmp_path: Path, capsys) -> None:
    """A checkpoint stores its data's sparse digest; one that older Bob wrote stores the
    legacy dense digest of the same corpus (in its data_digest and its segment): both
    resume without --new-data, and the legacy one starts no new segment."""
    source = tmp_path / "t.txt"
    source.write_bytes(TEXT)
    checkpoint = tmp_path / "bob.safetensors"
    common = ("--steps", "2", "-N", "2", "--backend", "cpu", "-c", str(checkpoint))
    assert main(["train", "--text", str(source), *common]) == 0
    state = Checkpoint.load(checkpoint)
    counts = count_sources(resolve([str(source)]), 256, workers=1)
    assert state.data_digest == sparse_digest(counts) and digest_matches(state.data_digest,
                                                                         counts)
    assert main(["train", "--text", str(source), "--resume", *common]) == 0
    resumed = Checkpoint.load(checkpoint)
    assert resumed.step == 4 and resumed.segments == state.segments
    legacy = legacy_digest(counts)
    old = replace(resumed, data_digest=legacy,
                  segments=(replace(resumed.segments[0], data_digest=legacy),))
    old.save(checkpoint)
    assert main(["train", "--text", str(source), "--resume", *common]) == 0
    again = Checkpoint.load(checkpoint)
    assert again.step == 6 and again.data_digest == sparse_digest(counts)
    assert again.segments == old.segments  # the same data: no new segment
    capsys.readouterr()


def test_training_from_a_legacy_counts_file_resumes(tmp_path: Path, capsys) -> None:
    source = tmp_path / "t.txt"
    source.write_bytes(TEXT)
    counts = count_sources(resolve([str(source)]), 256, workers=1)
    made = CountsFile.of(counts, [(str(source), len(TEXT))])
    CountsFile(counts, made.sources, legacy_digest(counts), made.optimum).save(
        tmp_path / "legacy.counts")
    checkpoint = tmp_path / "bob.safetensors"
    common = ("--counts", str(tmp_path / "legacy.counts"), "--steps", "2", "-N", "2",
              "--backend", "cpu", "-c", str(checkpoint))
    assert main(["train", *common]) == 0
    assert main(["train", "--resume", *common]) == 0
    state = Checkpoint.load(checkpoint)
    assert state.step == 4 and digest_matches(state.data_digest, counts)
    capsys.readouterr()


def test_a_bad_counts_file_digest_is_refused(tmp_path: Path) -> None:
    import safetensors.numpy

    counts = text_counts()
    made = CountsFile.of(counts, [])
    path = tmp_path / "bad.counts"
    safetensors.numpy.save_file({"counts": counts.dense}, path,
                                metadata={**made.metadata(), "digest": "v2:xyz"})
    with pytest.raises(BadInput, match="metadata digest is not 64 lowercase hex digits, alone "
                                       "or after 'v2:'"):
        CountsFile.load(path)
