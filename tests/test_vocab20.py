"""Vocabularies up to 2^20 in the data layer: counting, counts files, digests, token files,
tokenizers and input records, with nothing V x V allocated.

Past V = 65536 a pair key prev * V + next needs more than 32 bits (it reaches 2^40 at
V = 2^20) and a dense table is no longer made: every V x V array is refused in one line.
Below, every byte the data layer wrote before is still written, and every digest is the
same (pinned below, computed by the 32-bit code these tests replaced).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bob.cli.main import main
from bob.config import MAX_DENSE_VOCAB, MAX_VOCAB
from bob.errors import BadInput
from bob.host import api, data
from bob.records import corpus, counting, digest, sources
from bob.records.binary import HEADER, INPUT_MAGIC, InputRecord
from bob.records.counting import PairCounts, count_sources
from bob.records.countsfile import CountsFile, table_weights
from bob.records.digest import digest_matches, legacy_digest, sparse_digest
from bob.records.sources import resolve
from bob.records.tokenizer import load_tokenizer
from conftest import listing

LLAMA3 = 128256  # Llama 3's vocabulary: past 65536, below 2^17
BIG = [65537, 1 << 20]  # the first V with 64-bit keys, and the largest V there is


def spread_tokens(vocab: int, count: int = 4000, seed: int = 7) -> np.ndarray:
    """Ids spread over [0, V) with a heavy head (repeated pairs), and the corner pairs
    (V-1, V-1), (V-1, 0), (0, V-1): the largest key there is, V * V - 1."""
    rng = np.random.default_rng(seed)
    head = rng.integers(0, 30, count)
    tail = rng.integers(0, vocab, count)
    tokens = np.where(rng.random(count) < 0.5, head, tail).astype(np.int64)
    tokens[:6] = [vocab - 1, vocab - 1, vocab - 1, 0, vocab - 1, 0]
    return tokens


def brute(tokens: np.ndarray, vocab: int) -> dict[int, int]:
    values = [int(t) for t in tokens]
    return dict(Counter(a * vocab + b for a, b in zip(values, values[1:], strict=False)))


def as_dict(counts: PairCounts) -> dict[int, int]:
    keys, values = counts.pairs()
    return dict(zip(keys.tolist(), values.tolist(), strict=True))


def spelled_out(vocab: int, keys: list[int], values: list[int]) -> str:
    """The version 2 digest from its definition (records.digest): V and K, the keys as u64,
    the weights C / N as binary32."""
    total = sum(values)
    hasher = hashlib.sha256(b"bob-data-digest sparse-weights v2\0")
    hasher.update(struct.pack("<QQ", vocab, len(keys)))
    for key in keys:
        hasher.update(struct.pack("<Q", key))
    for value in values:
        hasher.update(np.float32(np.float64(value) / total).tobytes())
    return "v2:" + hasher.hexdigest()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


# -- counting ----------------------------------------------------------------------------
def test_keys_are_u32_up_to_65536_and_u64_above() -> None:
    assert MAX_VOCAB == 1 << 20 and MAX_DENSE_VOCAB == 65536
    assert counting.key_dtype(65536) == np.uint32  # (V - 1) * V + V - 1 = 2^32 - 1
    assert counting.key_dtype(65537) == np.uint64
    assert counting.key_dtype(MAX_VOCAB) == np.uint64  # keys below 2^40
    assert PairCounts.zeros(MAX_VOCAB).keys.dtype == np.uint64


@pytest.mark.parametrize("engine", counting.ENGINES)
@pytest.mark.parametrize("vocab", BIG)
def test_counting_past_65536_is_exact_with_keys_past_2_32(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, vocab: int) -> None:
    tokens = spread_tokens(vocab)
    path = tmp_path / "t.bin"
    tokens.astype("<u4").tofile(path)
    found = resolve([str(path)], "uint32")
    expected = brute(tokens, vocab)
    assert max(expected) == vocab * vocab - 1 > 2**32
    monkeypatch.setattr(counting, "SORT_KEYS", 777)  # many sorts and merges
    counts = count_sources(found, vocab, workers=1, engine=engine, block_bytes=1000)
    assert counts.is_sparse and counts.keys.dtype == np.uint64
    assert as_dict(counts) == expected
    rows, columns, _ = counts.entries()
    assert (rows.max(), columns.max()) == (vocab - 1, vocab - 1)
    assert counts.row_sums()[vocab - 1] == sum(v for k, v in expected.items()
                                               if k // vocab == vocab - 1)
    monkeypatch.setattr(counting, "PARALLEL_MIN_BYTES", 0)
    threads = count_sources(found, vocab, workers=2, engine=engine, piece_bytes=3000,
                            block_bytes=256)
    assert threads.same_as(counts)
    # In memory (a tokenizer's ids, signed), as `bob eval --tokenizer` counts text: the
    # pairs within each sequence, none across the two.
    sequences = data.count_sequences([("ids", tokens[:2000]), ("more", tokens[2000:])], vocab)
    pairs = Counter(brute(tokens[:2000], vocab)) + Counter(brute(tokens[2000:], vocab))
    assert as_dict(sequences.counts) == dict(pairs)


def test_dask_counts_past_65536_equal_the_threads(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    from bob.records.dask_count import count_on_dask

    vocab = MAX_VOCAB
    for i in range(3):
        spread_tokens(vocab, 3000, seed=i).astype("<u4").tofile(tmp_path / f"t{i}.bin")
    found = resolve([str(tmp_path)], "uint32")
    single = count_sources(found, vocab, workers=1)
    counted = count_on_dask(found, vocab, workers=2, processes=False, piece_bytes=5000,
                            block_bytes=1024)
    assert counted.same_as(single) and counted.keys.dtype == np.uint64


def test_a_dense_table_past_65536_is_refused_in_one_line() -> None:
    counts = PairCounts(MAX_VOCAB, keys=np.array([0, MAX_VOCAB**2 - 1], np.uint64),
                        values=np.array([1, 2], np.uint64))
    with pytest.raises(BadInput) as caught:
        counts.to_dense()
    assert str(caught.value) == (
        "the counts as a dense table at V=1048576 would be a V x V array of "
        "8,796,093,022,208 bytes (8,192 GiB); dense tables go up to V=65536")
    with pytest.raises(BadInput, match=r"^the table of weights at V=65537 would be a V x V "
                                       r"array of 17,180,393,476 bytes \(16 GiB\); dense "
                                       r"tables go up to V=65536$"):
        table_weights(PairCounts(65537, keys=np.array([5], np.uint64),
                                 values=np.array([1], np.uint64)))
    # A view of one element that claims V x V: refused before anything is built from it.
    claimed = np.broadcast_to(np.uint64(1), (65537, 65537))
    with pytest.raises(BadInput, match="^the table of weights at V=65537 would be"):
        corpus.weights(claimed)
    with pytest.raises(BadInput, match="^the counts of a text at V=65537 would be a V x V "
                                       "array of 34,360,786,952 bytes"):
        corpus.counts_from_bytes(b"abc", vocab=65537)


# -- counts files ----------------------------------------------------------------------
@pytest.mark.parametrize("vocab", BIG)
def test_counts_files_round_trip_past_65536(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            vocab: int) -> None:
    tokens = spread_tokens(vocab)
    path = tmp_path / "t.bin"
    tokens.astype("<u4").tofile(path)
    monkeypatch.setattr(counting, "SORT_KEYS", 1 << 16)  # a small gather buffer to trace
    tracemalloc.start()
    try:
        counts = count_sources(resolve([str(path)], "uint32"), vocab, workers=1)
        made = CountsFile.of(counts, [(str(path), tokens.size * 4)])
        made.save(tmp_path / "c.counts")
        loaded = CountsFile.load(tmp_path / "c.counts")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # O(V + K): a V x V table would be terabytes
    assert loaded.counts.same_as(counts) and loaded.counts.keys.dtype == np.uint64
    keys, values = counts.pairs()
    assert loaded.digest == made.digest == spelled_out(vocab, keys.tolist(), values.tolist())
    assert loaded.optimum == made.optimum and loaded.transitions == tokens.size - 1
    assert loaded.vocab == vocab and loaded.sources == ((str(path), tokens.size * 4),)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "c.counts"), framework="numpy") as file:
        assert file.metadata()["layout"] == "sparse"
        rows, columns = file.get_tensor("rows"), file.get_tensor("columns")
    assert rows.dtype == columns.dtype == np.uint32  # the layout V <= 65536 files have
    assert (int(rows[-1]), int(columns[-1])) == (vocab - 1, vocab - 1)


def test_a_counts_file_past_max_vocab_is_refused(tmp_path: Path) -> None:
    import safetensors.numpy

    made = CountsFile.of(PairCounts(MAX_VOCAB, keys=np.array([7], np.uint64),
                                    values=np.array([3], np.uint64)), [("x", 8)])
    made.save(tmp_path / "ok.counts")
    assert CountsFile.load(tmp_path / "ok.counts").counts.keys.tolist() == [7]
    path = tmp_path / "bad.counts"
    tensors = {"rows": np.array([0], np.uint32), "columns": np.array([7], np.uint32),
               "values": np.array([3], np.uint64)}
    safetensors.numpy.save_file(tensors, path, metadata={**made.metadata(),
                                                         "vocab": str(MAX_VOCAB + 1)})
    with pytest.raises(BadInput, match=r"metadata vocab 1048577 is outside \[2, 1048576\]$"):
        CountsFile.load(path)
    legacy = {**made.metadata(), "digest": "ab" * 32}  # no legacy digest exists past 65536
    safetensors.numpy.save_file(tensors, path, metadata=legacy)
    with pytest.raises(BadInput, match="metadata digest abababababababa... is not the digest "
                                       "of the stored counts"):
        CountsFile.load(path)
    tensors["columns"] = np.array([MAX_VOCAB], np.uint32)
    safetensors.numpy.save_file(tensors, path, metadata=made.metadata())
    with pytest.raises(BadInput, match="an index is not below V=1048576"):
        CountsFile.load(path)


# What the data layer computed before keys became 64-bit: digests and counts files of the
# same data must stay these bytes (a checkpoint records its data's digest).
TEXT = b"the cat sat on the mat; the rat sat on the cat. " * 20
PINNED_TEXT = ("v2:41d9505d3a0c3dab822ce79dbf6b02edd86985a0b260cf8e50f68affac52581b",
               "0007ea897b153bfb898f97f1f7ccfec35c72f533a3437c65918d2074e8e02aef")
PINNED_WALKS = {  # V: (dtype, sparse digest, legacy digest, K, sha256 of the tensors' bytes)
    3000: ("<u2", "v2:396d4f86a269e97bfa3de50df2ba081015d4f9c06b095a681db50120fc236ca7",
           "4f821756f217004aeaefe3a6a21b5b44c3a40c9514b206c44e76e0d681f15593", 4909,
           "f7abb13e23ee090b4ded80b336104ac9e0fab881adab8b813e151cc35382a61b"),
    50257: ("<u4", "v2:ac79410f82d5fd19faa32c03b2c17b2a86bb60d05d06ebc1caa3634104d2084b", None,
            4994, "f69ef2c4be4bb9edcf472739c62aa4a7c333a442a6bc1850bd95720f3ea0a90d"),
    65536: ("<u2", "v2:52a344a2445b5b7ec42426c4ea79f57417fddcc249b007591e5c2d5758179f9f", None,
            4995, "a6cb274b7a155771de2cb7a4323c3a0914746357eb14a75500bf8a21f1615394"),
}
PINNED_OPTIMA = {3000: "0.8278171402892088", 50257: "0.04679814942101835",
                 65536: "0.02728147540178312"}
PINNED_65536_CORNERS = "v2:3afdae1a0c3d1acd255142f48425ee0053f8e25e62b2f5deec4cb152c0aaf893"


def walk(vocab: int, dtype: str) -> np.ndarray:
    """A walk of small steps over [0, V) from V's own seed, its first three ids V - 1."""
    rng = np.random.default_rng(vocab)
    tokens = (np.cumsum(rng.integers(1, 50, 5000)) % vocab).astype(dtype)
    tokens[:3] = vocab - 1
    return tokens


def test_digests_below_65537_are_the_ones_recorded_before() -> None:
    text = PairCounts.from_dense(corpus.counts_from_bytes(TEXT))
    assert (sparse_digest(text), legacy_digest(text)) == PINNED_TEXT
    corners = PairCounts(65536, keys=np.array([0, 70_000, 2**32 - 1], np.uint32),
                         values=np.array([1, 2, 3], np.uint64))
    assert sparse_digest(corners) == PINNED_65536_CORNERS
    # The same data held with u64 keys has the same digest: the key type is not hashed.
    wide = PairCounts(65536, keys=corners.keys.astype(np.uint64), values=corners.values)
    assert sparse_digest(wide) == PINNED_65536_CORNERS


@pytest.mark.parametrize("vocab", list(PINNED_WALKS))
def test_counts_files_below_65537_are_the_bytes_written_before(tmp_path: Path,
                                                               vocab: int) -> None:
    dtype, sparse, legacy, pairs, payload = PINNED_WALKS[vocab]
    tokens = walk(vocab, dtype)
    tokens.tofile(tmp_path / "w.bin")
    found = resolve([str(tmp_path / "w.bin")], "uint16" if dtype == "<u2" else "uint32")
    counts = count_sources(found, vocab, workers=1)
    assert counts.keys.dtype == np.uint32 and counts.keys.size == pairs
    assert sparse_digest(counts) == sparse
    if legacy is not None:
        assert legacy_digest(counts) == legacy
    made = CountsFile.of(counts, [(f"w{vocab}.bin", tokens.nbytes)])
    made.save(tmp_path / "w.counts")
    written = (tmp_path / "w.counts").read_bytes()
    length = struct.unpack("<Q", written[:8])[0]
    metadata = json.loads(written[8:8 + length])["__metadata__"]
    assert hashlib.sha256(written[8 + length:]).hexdigest() == payload
    assert {k: metadata[k] for k in ("vocab", "layout", "transitions", "digest", "optimum")} \
        == {"vocab": str(vocab), "layout": "sparse", "transitions": "4999", "digest": sparse,
            "optimum": PINNED_OPTIMA[vocab]}
    assert CountsFile.load(tmp_path / "w.counts").counts.same_as(counts)


def test_digests_past_65536_are_defined_with_64_bit_keys() -> None:
    vocab = MAX_VOCAB
    keys = [0, 2**32, 2**32 + 5, vocab * vocab - 1]  # each past what u32 holds but the first
    counts = PairCounts(vocab, keys=np.array(keys, np.uint64),
                        values=np.array([4, 1, 2, 3], np.uint64))
    assert sparse_digest(counts) == spelled_out(vocab, keys, [4, 1, 2, 3])
    # One count narrowed to u32 would be another key, and another digest.
    narrowed = PairCounts(vocab, keys=np.array([0, 0, 5, 2**32 - 1], np.uint64)[[0, 2, 3]],
                          values=np.array([5, 2, 3], np.uint64))
    assert sparse_digest(narrowed) != sparse_digest(counts)
    with pytest.raises(ValueError, match="V=1048576 has no legacy digest"):
        legacy_digest(counts)

    def no_dense_pass(*args: object) -> str:
        raise AssertionError("the legacy digest was computed past MAX_DENSE_VOCAB")

    original = digest.legacy_digest_of
    digest.legacy_digest_of = no_dense_pass
    try:
        assert not digest_matches("ab" * 32, counts)
    finally:
        digest.legacy_digest_of = original


# -- input records -----------------------------------------------------------------------
@pytest.mark.parametrize("vocab", BIG)
def test_the_corpus_record_past_65536_is_its_pairs(tmp_path: Path, vocab: int) -> None:
    tokens = spread_tokens(vocab)
    counted = data.count_sequences([("ids", tokens)], vocab)
    record = data.corpus_record(counted, "ids")
    assert record.vocab == vocab and record.pairs == counted.counts.keys.size
    assert int(record.keys[-1]) == vocab * vocab - 1 and record.keys.dtype == np.uint64
    assert digest_matches(record.data_digest, counted.counts)
    assert record.data_digest == counted.digest
    record.write(tmp_path / "r.bob")
    assert InputRecord.read(tmp_path / "r.bob") == record
    seen = data.successor_ranges(record)
    assert seen[-1][1] == vocab - 1  # the last column is a successor (inclusive ranges)
    with pytest.raises(BadInput, match=rf"^ids: the weights as a table at V={vocab} would "
                                       rf"be a V x V array of {4 * vocab * vocab:,} bytes"):
        record.dense_weights()
    assert not record.digest_matches("ab" * 32)  # a legacy digest names no data past 65536
    targets = np.arange(vocab, dtype=np.uint32)[::-1].copy()
    hard = InputRecord.hard(targets, [vocab - 1], source="hard")
    hard.write(tmp_path / "h.bob")
    assert InputRecord.read(tmp_path / "h.bob") == hard


def test_a_dense_corpus_record_past_65536_is_refused_from_its_header(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dense.bob"
    # A header that declares V = 2^20 and then some weights: refused before any is read.
    path.write_bytes(HEADER.pack(INPUT_MAGIC, 1, 1, MAX_VOCAB, 0) + bytes(1 << 16))
    before = listing(tmp_path)
    status, out, err = run(capsys, "train", "--input", str(path), "-c",
                           str(tmp_path / "x.st"), "--backend", "cpu")
    assert status == 2 and out == ""
    assert err == (f"bob: {path}: a dense (version 1) corpus record of V=1048576 would hold "
                   "4,398,046,511,104 bytes of weights; dense records go up to V=65536 "
                   "(larger ones are sparse, version 2)\n")
    assert listing(tmp_path) == before


# -- token files ---------------------------------------------------------------------------
def test_the_token_type_follows_v_unless_given() -> None:
    assert sources.token_dtype(300) == "uint16"
    assert sources.token_dtype(65536) == "uint16"  # ids up to 65535: nanoGPT's train.bin
    assert sources.token_dtype(65537) == "uint32"
    assert sources.token_dtype(LLAMA3, "uint32") == "uint32"
    assert sources.token_dtype(300, "uint32") == "uint32"
    with pytest.raises(BadInput, match=r"^--token-dtype uint16 holds ids below 65536, and "
                                       r"V=128256 has ids up to 128255: write the tokens as "
                                       r"uint32 \(read so by default above V=65536\)$"):
        sources.token_dtype(LLAMA3, "uint16")
    spec = data.CorpusSpec(tokens=("t.bin",), vocab=LLAMA3)
    assert spec.tokens_read_as(LLAMA3) == "uint32 tokens, the default above V=65536"
    assert spec.tokens_read_as(300) == "uint16 tokens, the default up to V=65536"
    assert data.CorpusSpec(tokens=("t.bin",), token_dtype="uint32").tokens_read_as(300) \
        == "uint32 tokens"
    assert data.CorpusSpec(tokens=("t.npy",)).tokens_read_as(LLAMA3) is None
    assert data.CorpusSpec(texts=("a.txt",)).tokens_read_as(256) is None


def test_bob_count_reads_uint32_tokens_past_65536_by_default(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = spread_tokens(LLAMA3)
    tokens.astype("<u4").tofile(tmp_path / "t.bin")
    status, out, err = run(capsys, "count", "--tokens", str(tmp_path / "t.bin"), "--vocab",
                           str(LLAMA3), "-o", str(tmp_path / "c.counts"), "--json")
    assert status == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["vocab"] == LLAMA3 and summary["layout"] == "sparse"
    assert summary["tokens_read_as"] == "uint32 tokens, the default above V=65536"
    assert "read as" in err and summary["transitions"] == tokens.size - 1  # the table
    loaded = CountsFile.load(tmp_path / "c.counts")
    assert as_dict(loaded.counts) == brute(tokens, LLAMA3)
    # The same ids in a .npy file (its header names the type) count the same.
    np.save(tmp_path / "t.npy", tokens.astype("<u4"))
    assert count_sources(resolve([str(tmp_path / "t.npy")], "uint32"), LLAMA3,
                         workers=1).same_as(loaded.counts)
    # Training data from them: the sparse record, its description saying how it was read.
    found = api.training_data(spec=api.CorpusSpec(tokens=(str(tmp_path / "t.bin"),),
                                                  vocab=LLAMA3))
    assert found.description == f"{tmp_path / 't.bin'} (uint32 tokens, the default above " \
                                "V=65536)"
    assert found.record.vocab == LLAMA3 and found.record.pairs == loaded.counts.keys.size


def test_a_training_run_says_how_its_tokens_were_read(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    np.random.default_rng(1).integers(0, 300, 5000).astype("<u2").tofile(tmp_path / "t.bin")
    status, out, err = run(capsys, "train", "--tokens", str(tmp_path / "t.bin"), "--vocab",
                           "300", "--steps", "1", "-N", "1", "--backend", "cpu", "-c",
                           str(tmp_path / "m.st"), "--json")
    assert status == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["data"] == f"{tmp_path / 't.bin'} (uint16 tokens, the default up to V=65536)"


@pytest.mark.parametrize(("args", "message"), [
    # A nanoGPT uint16 file given a V past 65536: read as uint32 by default, its ids (two
    # uint16 ids each) are out of range, or its size is no whole number of them.
    (["count", "--tokens", "{d}/u16.bin", "--vocab", "128256", "-o", "{d}/c.counts"],
     "bob: {d}/u16.bin: token 19660801 at offset 0 (token 0) is not in [0, V=128256) (read "
     "as uint32: are --vocab and --token-dtype right?)"),
    (["count", "--tokens", "{d}/odd.bin", "--vocab", "128256", "-o", "{d}/c.counts"],
     "bob: {d}/odd.bin: 6 bytes is not a whole number of 4-byte tokens (is --token-dtype "
     "right?)"),
    (["count", "--tokens", "{d}/u16.bin", "--vocab", "128256", "--token-dtype", "uint16",
      "-o", "{d}/c.counts"],
     "bob: --token-dtype uint16 holds ids below 65536, and V=128256 has ids up to 128255: "
     "write the tokens as uint32 (read so by default above V=65536)"),
    # Refused with the options, before a backend is chosen or a file read.
    (["train", "--tokens", "{d}/u16.bin", "--vocab", "128256", "--token-dtype", "uint16",
      "--backend", "cuda", "-c", "{d}/x.st"],
     "bob: --token-dtype uint16 holds ids below 65536, and V=128256 has ids up to 128255"),
    (["eval", "-c", "{d}/x.st", "--tokens", "{d}/u16.bin", "--vocab", "128256",
      "--token-dtype", "uint16"],
     "bob: --token-dtype uint16 holds ids below 65536, and V=128256 has ids up to 128255"),
    (["count", "--tokens", "{d}/u16.bin", "--vocab", "1048577", "-o", "{d}/c.counts"],
     "bob: --vocab 1048577 is outside [2, 1048576]: V=1048576 is the largest table Bob "
     "trains"),
])
def test_token_file_refusals_are_one_line_exit_2_nothing_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
        message: str) -> None:
    np.array([1, 300, 2, 7], "<u2").tofile(tmp_path / "u16.bin")
    np.array([1, 300, 2], "<u2").tofile(tmp_path / "odd.bin")
    before = listing(tmp_path)
    status, out, err = run(capsys, *[a.format(d=tmp_path) for a in args])
    assert status == 2
    assert err.startswith(message.format(d=tmp_path)) and err.count("\n") == 1, err
    assert "Traceback" not in err + out
    assert listing(tmp_path) == before


# -- tokenizers ----------------------------------------------------------------------------
@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None,
                    reason="the tokenizers package (bob[tokens]) is not installed here")
def test_a_tokenizers_json_of_llama3_size_gives_v_128256(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    built = Tokenizer(models.WordLevel({f"w{i}": i for i in range(LLAMA3)}, unk_token="w0"))
    built.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    built.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert (loaded.kind, loaded.vocab) == ("tokenizers", LLAMA3)
    assert loaded.encode("w128255 w0 w70000") == [LLAMA3 - 1, 0, 70000]
    tokens = spread_tokens(LLAMA3, 2000)
    tokens.astype("<u4").tofile(tmp_path / "t.bin")
    status, out, err = run(capsys, "count", "--tokens", str(tmp_path / "t.bin"),
                           "--tokenizer", str(tmp_path / "tokenizer.json"), "-o",
                           str(tmp_path / "c.counts"), "--json")
    assert status == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["vocab"] == LLAMA3 and summary["transitions"] == tokens.size - 1
    assert as_dict(CountsFile.load(tmp_path / "c.counts").counts) == brute(tokens, LLAMA3)
