"""The counting engine: sources, pieces, blocks, dense and sparse counts, the counts file."""

from __future__ import annotations

import io
import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bob.cli.main import main
from bob.errors import BadInput
from bob.records import corpus, counting, sources
from bob.records.checkpoint import Checkpoint
from bob.records.counting import PairCounts, count_sources
from bob.records.countsfile import CountsFile, table_weights
from bob.records.digest import digest_matches, legacy_digest, sparse_digest
from bob.records.sources import Piece, resolve, split

TEXTS = [b"abracadabra", b"the cat sat on the mat\n", b"aaaa", b"ab" * 50 + b"c",
         bytes(range(256)) * 3, b"x"]


def brute(sequences: list[np.ndarray], vocab: int) -> np.ndarray:
    """Pairs within each sequence, by Python counting."""
    pairs: Counter[tuple[int, int]] = Counter()
    for seq in sequences:
        values = [int(v) for v in seq]
        pairs.update(zip(values, values[1:], strict=False))
    table = np.zeros((vocab, vocab), np.uint64)
    for (r, n), c in pairs.items():
        table[r, n] = c
    return table


def write(directory: Path, texts: list[bytes]) -> list[str]:
    names = []
    for i, text in enumerate(texts):
        path = directory / f"t{i:02d}.txt"
        path.write_bytes(text)
        names.append(str(path))
    return names


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


# -- pieces and blocks ---------------------------------------------------------------
@pytest.mark.parametrize("engine", counting.ENGINES)
@pytest.mark.parametrize(("piece", "block"), [(1, 2), (2, 2), (3, 5), (7, 64), (10**9, 3)])
def test_every_partitioning_counts_each_pair_once(tmp_path: Path, engine: str, piece: int,
                                                  block: int) -> None:
    names = write(tmp_path, TEXTS)
    found = resolve(names)
    expected = brute([np.frombuffer(t, np.uint8) for t in TEXTS], 256)
    tally = counting.Tally(256, engine)
    for p in split(found, piece):
        counting.count_piece(tally, p, block_bytes=block)
    assert np.array_equal(tally.result().dense, expected)


def test_pieces_cover_every_token_once() -> None:
    source = sources.Source("f", 10)
    pieces = split([source], 3)
    assert [(p.start, p.stop) for p in pieces] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert str(pieces[1]) == "f bytes 3-6"


def test_counts_match_the_numpy_path_and_corpus_functions(tmp_path: Path) -> None:
    names = write(tmp_path, TEXTS[:5])
    counts = count_sources(resolve(names), 256, workers=1)
    assert np.array_equal(counts.dense, corpus.counts_from_files(names))
    numpy_counts = count_sources(resolve(names), 256, workers=1, engine="numpy")
    assert counts.same_as(numpy_counts)


def test_worker_threads_give_identical_counts(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    big = bytes(np.random.default_rng(1).integers(0, 256, 300_000, dtype=np.uint8))
    names = write(tmp_path, [*TEXTS[:5], big, big[:70_001]])
    monkeypatch.setattr(counting, "PARALLEL_MIN_BYTES", 0)
    parallel = count_sources(resolve(names), 256, workers=2, piece_bytes=50_000,
                             block_bytes=4096)
    single = count_sources(resolve(names), 256, workers=1)
    assert parallel.same_as(single)
    assert parallel.transitions == sum(len(t) - 1 for t in [*TEXTS[:5], big, big[:70_001]])


def test_progress_reports_every_byte(tmp_path: Path) -> None:
    names = write(tmp_path, TEXTS)
    seen: list[int] = []
    count_sources(resolve(names), 256, workers=1, progress=seen.append, block_bytes=4)
    assert sum(seen) == sum(len(t) for t in TEXTS)


# -- inputs --------------------------------------------------------------------------
def test_directories_recursively_sorted_and_globs(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "deep").mkdir(parents=True)
    for name, text in (("b/z.txt", b"zz"), ("a/deep/y.txt", b"yy"), ("a/x.txt", b"xx"),
                       ("a/empty.txt", b"")):
        (tmp_path / name).write_bytes(text)
    found = resolve([str(tmp_path)])
    assert [Path(s.name).relative_to(tmp_path).as_posix() for s in found] == [
        "a/deep/y.txt", "a/empty.txt", "a/x.txt", "b/z.txt"]
    counts = count_sources(found, 256, workers=1)  # an empty file found in a directory is fine
    assert counts.transitions == 3
    globbed = resolve([str(tmp_path / "a" / "*.txt")])
    assert [Path(s.name).name for s in globbed] == ["empty.txt", "x.txt"]


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: [str(d / "gone.txt")], "{d}/gone.txt: no such file"),
    (lambda d: [str(d / "*.nothing")], "{d}/*.nothing: no file matches"),
    (lambda d: [str(d / "empty")], "{d}/empty: directory has no files"),
    (lambda d: ["-", "-"], "-: standard input can be read only once"),
    (lambda d: [], "give at least one input (a file, directory, glob, URL or -)"),
])
def test_bad_inputs(tmp_path: Path, make, message: str) -> None:
    (tmp_path / "empty").mkdir()
    before = listing(tmp_path)
    with pytest.raises(BadInput) as caught:
        resolve(make(tmp_path))
    assert str(caught.value) == message.format(d=tmp_path)
    assert listing(tmp_path) == before


def test_empty_and_pairless_files(tmp_path: Path) -> None:
    names = write(tmp_path, [b"ok", b""])
    with pytest.raises(BadInput, match=r"t01.txt: empty file, nothing to learn from$"):
        count_sources(resolve(names), 256)
    single = write(tmp_path, [b"a"])
    with pytest.raises(BadInput, match=r"t00.txt: no adjacent byte pairs \(a corpus needs"):
        count_sources(resolve(single), 256)


def test_stdin_is_one_text(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stdin:
        buffer = io.BytesIO(b"abracadabra")

    monkeypatch.setattr("sys.stdin", Stdin)
    counts = count_sources(resolve(["-"]), 256, block_bytes=3)
    assert np.array_equal(counts.dense, corpus.counts_from_bytes(b"abracadabra"))


# -- token files ------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "suffix"), [("uint16", ".bin"), ("uint32", ".bin"),
                                               ("uint16", ".npy")])
def test_token_files(tmp_path: Path, dtype: str, suffix: str) -> None:
    tokens = np.random.default_rng(2).integers(0, 300, 5000).astype(dtype)
    path = tmp_path / f"train{suffix}"
    if suffix == ".npy":
        np.save(path, tokens.astype("<u4"))
    else:
        tokens.astype(sources.TOKEN_DTYPES[dtype]).tofile(path)
    found = resolve([str(path)], dtype)
    assert found[0].tokens == 5000
    tally = counting.Tally(300)
    for piece in split(found, 777):
        counting.count_piece(tally, piece, block_bytes=64)
    assert np.array_equal(tally.result().dense, brute([tokens], 300))


def test_a_token_not_below_v_is_refused_with_its_offset(tmp_path: Path) -> None:
    tokens = np.arange(100, dtype="<u2")
    tokens[61] = 4000
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    with pytest.raises(BadInput) as caught:
        count_sources(resolve([str(path)], "uint16"), 1000, block_bytes=16)
    assert str(caught.value) == (f"{path}: token 4000 at offset 122 (token 61) is not in "
                                 f"[0, V=1000) (read as uint16: are --vocab and "
                                 f"--token-dtype right?)")


def test_odd_sized_raw_token_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "odd.bin"
    path.write_bytes(b"\x01\x00\x02")
    with pytest.raises(BadInput, match=r"odd.bin: 3 bytes is not a whole number of 2-byte"):
        resolve([str(path)], "uint16")


# -- sparse counts -------------------------------------------------------------------
@pytest.mark.parametrize("vocab", [4096, 65536])
def test_sparse_counts_equal_dense_ones(tmp_path: Path, vocab: int,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    sequences = [rng.integers(0, vocab, n).astype("<u4") for n in (3000, 1, 2, 500)]
    paths = []
    for i, seq in enumerate(sequences):
        path = tmp_path / f"s{i}.bin"
        seq.tofile(path)
        paths.append(str(path))
    monkeypatch.setattr(counting, "PARALLEL_MIN_BYTES", 0)
    found = resolve(paths, "uint32")
    counts = count_sources(found, vocab, workers=1, block_bytes=400)
    assert counts.is_sparse
    rows, columns, values = counts.entries()
    expected = Counter()
    for seq in sequences:
        expected.update(zip(seq.tolist(), seq[1:].tolist(), strict=False))
    assert dict(zip(zip(rows.tolist(), columns.tolist(), strict=True), values.tolist(),
                    strict=True)) == dict(expected)
    pieces = count_sources(found, vocab, workers=2, piece_bytes=1000, block_bytes=100)
    assert pieces.same_as(counts)


def test_sparse_digest_weights_and_optimum_match_the_dense_path() -> None:
    dense = corpus.counts_from_bytes(b"the quick brown fox jumps over the lazy dog" * 7,
                                     vocab=300)
    padded = np.zeros((3000, 3000), np.uint64)
    padded[:300, :300] = dense
    sparse = PairCounts.from_dense(padded)
    assert sparse.is_sparse
    assert legacy_digest(PairCounts.from_dense(dense)) == corpus.digest(dense)
    assert legacy_digest(sparse) == corpus.digest(padded)
    assert np.array_equal(table_weights(sparse), corpus.weights(padded))


# -- the counts file -----------------------------------------------------------------
@pytest.mark.parametrize("vocab", [256, 5000])
def test_counts_file_round_trips(tmp_path: Path, vocab: int) -> None:
    names = write(tmp_path, TEXTS[:4])
    found = resolve(names)
    counts = count_sources(found, vocab, workers=1)
    made = CountsFile.of(counts, [(s.name, s.size) for s in found])
    path = tmp_path / "c.safetensors"
    made.save(path)
    loaded = CountsFile.load(path)
    assert loaded.counts.same_as(counts) and loaded.counts.is_sparse == (vocab > 2048)
    assert loaded.sources == tuple((n, len(t)) for n, t in zip(names, TEXTS, strict=False))
    dense = counts.to_dense()
    assert loaded.optimum == corpus.optimum(dense) and loaded.transitions == int(dense.sum())
    assert loaded.digest == sparse_digest(counts) == made.digest
    if vocab <= 16384:
        assert digest_matches(corpus.digest(dense), loaded.counts)


@pytest.mark.parametrize(("edit", "message"), [
    ({"format": "x"}, "not a Bob counts file (format 'x' in the metadata"),
    ({"transitions": "7"}, "the counts sum to 35, the metadata says 7 transitions"),
    ({"vocab": "1"}, "metadata vocab 1 is outside [2, 1048576]"),
    ({"layout": "sparse"}, "metadata layout 'sparse'; V=256 is stored dense"),
    ({"optimum": "nan"}, "metadata optimum nan is not a finite number >= 0"),
])
def test_bad_counts_files(tmp_path: Path, edit: dict, message: str) -> None:
    import safetensors.numpy

    names = write(tmp_path, TEXTS[:3])
    made = CountsFile.of(count_sources(resolve(names), 256), [])
    path = tmp_path / "bad.safetensors"
    safetensors.numpy.save_file({"counts": made.counts.dense}, path,
                                metadata={**made.metadata(), **edit})
    with pytest.raises(BadInput) as caught:
        CountsFile.load(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
    with pytest.raises(BadInput, match="no such file"):
        CountsFile.load(tmp_path / "none")


def test_vocab_range_is_checked() -> None:
    with pytest.raises(BadInput, match=r"V must be an integer in \[2, 1048576\], not 1048577"):
        counting.Tally(1048577)
    with pytest.raises(BadInput, match=r"V must be an integer in \[2, 1048576\], not True"):
        counting.Tally(True)


def test_pairs_never_cross_files_whatever_the_order(tmp_path: Path) -> None:
    names = write(tmp_path, TEXTS[:4])
    results = [count_sources(resolve(list(order)), 256, workers=1)
               for order in itertools.permutations(names)]
    assert all(r.same_as(results[0]) for r in results)
    assert Piece(resolve(names[:1])[0], 0, 11).bytes == 11


def test_a_bad_token_found_by_a_worker_thread_is_one_line(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = np.zeros(40_000, "<u2")
    tokens[30_001] = 999
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    monkeypatch.setattr(counting, "PARALLEL_MIN_BYTES", 0)
    with pytest.raises(BadInput) as caught:
        count_sources(resolve([str(path)], "uint16"), 500, workers=2, piece_bytes=20_000)
    assert str(caught.value) == (f"{path}: token 999 at offset 60002 (token 30001) is not in "
                                 f"[0, V=500) (read as uint16: are --vocab and "
                                 f"--token-dtype right?)")


def test_plot_draws_the_checkpoints_validation_history(tmp_path: Path) -> None:
    """`bob train --val` stores val_history; `bob plot` draws it beside the training loss."""
    from bob.cli.run_cmd import validation_curve
    from bob.host.plot import loss_figure

    text = tmp_path / "a.txt"
    text.write_bytes(b"the cat sat on the mat; " * 40)
    val = tmp_path / "v.txt"
    val.write_bytes(b"a mat sat on the cat. " * 30)
    path = tmp_path / "m.safetensors"
    assert main(["train", "--text", str(text), "--val", str(val), "--steps", "20", "-N", "10",
                 "--backend", "cpu", "-c", str(path)]) == 0
    state = Checkpoint.load(path)
    assert [step for step, _ in state.val_history] == [0, 10, 20]
    assert validation_curve(state) == list(state.val_history)
    figure = loss_figure(state.history, state.optimum, validation=validation_curve(state))
    loss_axes = figure.axes[0]
    labels = [line.get_label() for line in loss_axes.get_lines()]
    assert any("validation" in label for label in labels), labels


def test_negative_tokens_in_a_npy_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "signed.npy"
    np.save(path, np.array([3, 4, -1, 2], "<i8"))
    with pytest.raises(BadInput) as caught:
        count_sources(resolve([str(path)], "uint16"), 10)
    assert str(caught.value) == (f"{path}: token -1 at offset 144 (token 2) is not in "
                                 f"[0, V=10)")


# -- the sparse path: gathered keys, one sort and one merge at a time -----------------
def token_files(directory: Path, vocab: int, dtype: str = "<u2") -> list[str]:
    """Files of skewed tokens (a heavy head, as BPE ids have), one of them a single token."""
    rng = np.random.default_rng(vocab)
    paths = []
    for i, size in enumerate((700, 1, 2, 333, 1200)):
        head = rng.integers(0, 40, size)
        tail = rng.integers(0, vocab, size)
        tokens = np.where(rng.random(size) < 0.7, head, tail).astype(dtype)
        path = directory / f"tok{i}.bin"
        tokens.tofile(path)
        paths.append(str(path))
    return paths


def brute_sparse(paths: list[str], dtype: str, vocab: int) -> PairCounts:
    pairs: Counter[int] = Counter()
    for path in paths:
        tokens = np.fromfile(path, dtype).astype(np.int64).tolist()
        pairs.update(a * vocab + b for a, b in zip(tokens, tokens[1:], strict=False))
    keys = sorted(pairs)
    return PairCounts(vocab, keys=np.array(keys, counting.key_dtype(vocab)),
                      values=np.array([pairs[k] for k in keys], np.uint64))


@pytest.mark.parametrize("engine", counting.ENGINES)
@pytest.mark.parametrize("sort_keys", [1, 7, 1000, counting.SORT_KEYS])
@pytest.mark.parametrize(("vocab", "dtype"), [(3000, "<u2"), (65536, "<u2"), (50257, "<u4"),
                                              (65537, "<u4"), (1 << 20, "<u4")])
def test_sparse_counts_are_exact_whatever_is_sorted_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, sort_keys: int,
        vocab: int, dtype: str) -> None:
    paths = token_files(tmp_path, vocab, dtype)
    expected = brute_sparse(paths, dtype, vocab)
    monkeypatch.setattr(counting, "SORT_KEYS", sort_keys)
    found = resolve(paths, "uint16" if dtype == "<u2" else "uint32")
    for piece_tokens, block_bytes in ((10**9, 1 << 20), (333, 64), (1, 4)):
        tally = counting.Tally(vocab, engine)
        for piece in split(found, piece_tokens):
            counting.count_piece(tally, piece, block_bytes=block_bytes)
        assert tally.result().same_as(expected)


@pytest.mark.parametrize("engine", counting.ENGINES)
def test_worker_threads_count_sparse_pieces_exactly(tmp_path: Path, engine: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    paths = token_files(tmp_path, 50257)
    monkeypatch.setattr(counting, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(counting, "SORT_KEYS", 500)
    found = resolve(paths, "uint16")
    counts = count_sources(found, 50257, workers=3, engine=engine, piece_bytes=1000,
                           block_bytes=256)
    assert counts.same_as(brute_sparse(paths, "<u2", 50257))


def test_text_above_the_dense_limit_and_npy_tokens_count_sparse(tmp_path: Path) -> None:
    names = write(tmp_path, TEXTS)
    expected = brute([np.frombuffer(t, np.uint8) for t in TEXTS], 256)
    for engine in counting.ENGINES:
        counts = count_sources(resolve(names), 3000, workers=1, engine=engine, block_bytes=5)
        assert counts.is_sparse and np.array_equal(counts.to_dense()[:256, :256], expected)
    signed = np.array([3, 2999, 0, 2999, 3, 2999], "<i8")
    np.save(tmp_path / "signed.npy", signed)
    for engine in counting.ENGINES:
        counts = count_sources(resolve([str(tmp_path / "signed.npy")], "uint16"), 3000,
                               workers=1, engine=engine)
        assert counts.same_as(brute_sparse_array(signed, 3000))


def brute_sparse_array(tokens: np.ndarray, vocab: int) -> PairCounts:
    pairs = Counter(int(a) * vocab + int(b) for a, b in zip(tokens, tokens[1:], strict=False))
    keys = sorted(pairs)
    return PairCounts(vocab, keys=np.array(keys, counting.key_dtype(vocab)),
                      values=np.array([pairs[k] for k in keys], np.uint64))


@pytest.mark.parametrize("engine", counting.ENGINES)
@pytest.mark.parametrize("vocab", [65536, 65537, 1 << 20])  # u32 keys, then u64 ones
def test_pair_keys_run_lengths_and_merges_agree_between_engines(engine: str,
                                                                vocab: int) -> None:
    rng = np.random.default_rng(11)
    key = counting.key_dtype(vocab)
    assert key == (np.uint32 if vocab <= 65536 else np.uint64)
    for dtype in ("<u1", "<u2", "<u4", "<i8"):
        tokens = rng.integers(0, min(vocab, np.iinfo(dtype).max + 1), 1000).astype(dtype)
        tokens[:2] = min(vocab - 1, np.iinfo(dtype).max)  # the largest key there is at V
        out = np.empty(tokens.size - 1, key)
        counting.pair_keys(tokens, vocab, out, engine)
        assert out.tolist() == [int(a) * vocab + int(b) for a, b in zip(tokens, tokens[1:],
                                                                        strict=False)]
    far = (vocab - 1) * vocab  # keys past 2**32 where V > 65536
    for keys in ([], [4], [4, 4], [1, 2, 2, 2, 9, 9, 11], [3, far, far, far + vocab - 1]):
        sorted_keys = np.array(keys, key)
        unique, counts = counting.run_lengths(sorted_keys, engine)
        assert unique.dtype == key and counts.dtype == np.uint64
        assert dict(zip(unique.tolist(), counts.tolist(), strict=True)) == dict(Counter(keys))
    for size_a, size_b in ((0, 0), (0, 5), (5, 0), (300, 1000), (1000, 1000)):
        a = np.unique(rng.integers(0, 2000, size_a) * (vocab - 1)).astype(key)
        b = np.unique(rng.integers(0, 2000, size_b) * (vocab - 1)).astype(key)
        va = rng.integers(1, 9, a.size).astype(np.uint64)
        vb = rng.integers(1, 9, b.size).astype(np.uint64)
        keys, values = counting.merge_sparse(a, va, b, vb, engine)
        expected: Counter[int] = Counter(dict(zip(a.tolist(), va.tolist(), strict=True)))
        expected.update(dict(zip(b.tolist(), vb.tolist(), strict=True)))
        assert keys.tolist() == sorted(expected)
        assert values.tolist() == [expected[k] for k in sorted(expected)]


def test_pieces_come_in_whole_rounds_of_workers() -> None:
    mib = 1 << 20
    assert counting.even_piece_bytes(200_000_000, 2, 64 * mib) == 50_000_000  # not 3 pieces
    assert counting.even_piece_bytes(100 * mib, 2, 64 * mib) == 50 * mib
    assert counting.even_piece_bytes(10 * mib, 4, 64 * mib) == 10 * mib // 4
    assert counting.even_piece_bytes(1000, 1, 64 * mib) == 1000
    for total in (1, 999, 10**6, 10**9):
        for workers in (1, 2, 3, 16):
            piece = counting.even_piece_bytes(total, workers, 50_000)
            rounds = -(-total // (workers * 50_000))  # the fewest rounds of full pieces
            assert piece <= 50_000 and -(-total // piece) <= workers * rounds


def test_a_small_corpus_is_counted_without_numba(tmp_path: Path) -> None:
    """Below COMPILED_MIN_BYTES, NumPy alone: importing Numba would cost more than it saves."""
    import os
    import subprocess
    import sys

    tokens = np.random.default_rng(4).integers(0, 50257, 200_000).astype("<u2")
    tokens.tofile(tmp_path / "train.bin")
    script = ("import sys\nfrom bob.host import api\n"
              f"api.count(api.CorpusSpec(tokens=({str(tmp_path / 'train.bin')!r},), "
              f"vocab=50257), {str(tmp_path / 'c.counts')!r})\n"
              "print('numba' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")},
                          check=True)
    assert done.stdout.strip() == "False"
    assert counting.default_engine(1 << 20) == "numpy"
    assert counting.default_engine(1 << 20, reads_stream=True) == counting.ENGINES[0]
    assert counting.default_engine(counting.COMPILED_MIN_BYTES) == counting.ENGINES[0]
