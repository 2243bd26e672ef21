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


def test_worker_processes_give_identical_counts(tmp_path: Path,
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
                                 f"[0, V=1000)")


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
    ({"vocab": "1"}, "metadata vocab 1 is outside [2, 65536]"),
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
    with pytest.raises(BadInput, match=r"V must be an integer in \[2, 65536\], not 65537"):
        counting.Tally(65537)


def test_pairs_never_cross_files_whatever_the_order(tmp_path: Path) -> None:
    names = write(tmp_path, TEXTS[:4])
    results = [count_sources(resolve(list(order)), 256, workers=1)
               for order in itertools.permutations(names)]
    assert all(r.same_as(results[0]) for r in results)
    assert Piece(resolve(names[:1])[0], 0, 11).bytes == 11


def test_a_bad_token_found_by_a_worker_process_is_one_line(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = np.zeros(40_000, "<u2")
    tokens[30_001] = 999
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    monkeypatch.setattr(counting, "PARALLEL_MIN_BYTES", 0)
    with pytest.raises(BadInput) as caught:
        count_sources(resolve([str(path)], "uint16"), 500, workers=2, piece_bytes=20_000)
    assert str(caught.value) == (f"{path}: token 999 at offset 60002 (token 30001) is not in "
                                 f"[0, V=500)")


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
