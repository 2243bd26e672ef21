"""`bob count`, --counts/--tokens/--val on train and eval, --ids, fsspec URLs and Dask."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bob.cli.main import main
from bob.records import corpus
from bob.records.checkpoint import Checkpoint
from bob.records.counting import count_sources
from bob.records.countsfile import CountsFile
from bob.records.sources import resolve

TEXT = corpus.builtin_corpus()[:60_000]
VAL = corpus.builtin_corpus()[60_000:80_000]


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def texts(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "train.txt").write_bytes(TEXT)
    (tmp_path / "val.txt").write_bytes(VAL)
    return tmp_path / "train.txt", tmp_path / "val.txt"


def test_count_then_train_equals_training_on_the_text(tmp_path: Path, texts, capsys) -> None:
    train, val = texts
    out = tmp_path / "c.safetensors"
    status, stdout, _ = run(capsys, "count", str(train), "-o", str(out), "--json")
    assert status == 0
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["transitions"] == len(TEXT) - 1 and summary["layout"] == "dense"
    assert summary["optimum"] == corpus.optimum(corpus.counts_from_bytes(TEXT))
    common = ("--steps", "4", "-N", "2", "--backend", "cpu", "--json")
    status, stdout, _ = run(capsys, "train", "--counts", str(out), "-c",
                            str(tmp_path / "a.st"), "--val", str(val), *common)
    assert status == 0
    from_counts = json.loads(stdout.strip().splitlines()[-1])
    status, stdout, _ = run(capsys, "train", "--text", str(train), "-c", str(tmp_path / "b.st"),
                            *common)
    from_text = json.loads(stdout.strip().splitlines()[-1])
    assert from_counts["loss"] == from_text["loss"]
    assert from_counts["optimum"] == from_text["optimum"]
    a, b = Checkpoint.load(tmp_path / "a.st"), Checkpoint.load(tmp_path / "b.st")
    assert a.data_digest == b.data_digest and np.array_equal(a.parameters, b.parameters)
    # The validation loss after each invocation, and bob eval's figure for the checkpoint.
    assert [s for s, _ in a.val_history] == [0, 2, 4]
    assert a.val_history[-1][1] == from_counts["val_loss"]
    status, stdout, _ = run(capsys, "eval", "-c", str(tmp_path / "a.st"), "--text", str(val),
                            "--backend", "cpu", "--json")
    assert json.loads(stdout)["loss"] == from_counts["val_loss"]
    assert run(capsys, "count", str(val), "-o", str(tmp_path / "v.counts"))[0] == 0
    status, stdout, _ = run(capsys, "eval", "-c", str(tmp_path / "a.st"), "--counts",
                            str(tmp_path / "v.counts"), "--backend", "cpu", "--json")
    assert status == 0 and json.loads(stdout)["loss"] == from_counts["val_loss"]
    status, stdout, _ = run(capsys, "plot", "-c", str(tmp_path / "a.st"), "--counts", str(out),
                            "--out", str(tmp_path / "plots"))
    assert status == 0 and (tmp_path / "plots" / "loss.png").exists()


def test_resume_from_counts_does_not_recount(tmp_path: Path, texts, capsys,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    train, _ = texts
    out = tmp_path / "c.safetensors"
    assert run(capsys, "count", str(train), "-o", str(out))[0] == 0
    checkpoint = str(tmp_path / "r.st")
    assert run(capsys, "train", "--counts", str(out), "-c", checkpoint, "--steps", "1",
               "--backend", "cpu")[0] == 0

    def no_counting(*args, **kwargs):
        raise AssertionError("recounted")

    monkeypatch.setattr("bob.records.counting.count_sources", no_counting)
    status, _, err = run(capsys, "train", "--counts", str(out), "-c", checkpoint, "--steps",
                         "1", "--resume", "--backend", "cpu")
    assert status == 0, err
    assert Checkpoint.load(checkpoint).step == 2


def test_token_checkpoints_take_and_print_ids(tmp_path: Path, capsys) -> None:
    tokens = np.random.default_rng(0).integers(0, 300, 20_000).astype("<u2")
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    checkpoint = str(tmp_path / "tok.st")
    status, _, err = run(capsys, "train", "--tokens", str(path), "--vocab", "300", "--steps",
                         "3", "-c", checkpoint, "--backend", "cpu")
    assert status == 0, err
    status, stdout, _ = run(capsys, "predict", "-c", checkpoint, "--ids", "5 7 299",
                            "--backend", "cpu", "--json")
    assert status == 0
    [entry] = json.loads(stdout)
    state = Checkpoint.load(checkpoint)
    assert entry["prompt"] == [5, 7, 299]
    assert entry["next"] == int(np.argmax(state.parameters[299]))
    status, stdout, _ = run(capsys, "generate", "-c", checkpoint, "--ids", "1 2", "-n", "4",
                            "-t", "0", "--backend", "cpu")
    ids = [int(w) for w in stdout.split()]
    assert status == 0 and ids[:2] == [1, 2] and len(ids) == 6
    for prev, nxt in zip(ids[1:], ids[2:], strict=False):
        assert nxt == int(np.argmax(state.parameters[prev]))
    status, stdout, _ = run(capsys, "eval", "-c", checkpoint, "--tokens", str(path),
                            "--backend", "cpu", "--json")
    assert status == 0 and json.loads(stdout)["transitions"] == 19_999


@pytest.mark.parametrize(("args", "message"), [
    (["count", "{d}/none.txt", "-o", "{d}/c.st"], "bob: {d}/none.txt: no such file"),
    (["count", "--tokens", "{d}/t.bin", "-o", "{d}/c.st"],
     "bob: --tokens needs --vocab V (the tokenizer's vocabulary size)"),
    (["count", "--tokens", "{d}/t.bin", "--vocab", "10", "-o", "{d}/c.st"],
     "bob: {d}/t.bin: token 300 at offset 2 (token 1) is not in [0, V=10)"),
    (["count", "{d}/train.txt", "-o", "{d}/train.txt"],
     "bob: {d}/train.txt: exists; pass --overwrite to replace it"),
    (["count", "{d}/train.txt", "--workers", "0", "-o", "{d}/c.st"],
     "bob: --workers must be >= 1, not 0"),
    (["train", "--counts", "{d}/train.txt", "-c", "{d}/x.st"],
     "bob: {d}/train.txt: not a readable counts file"),
    (["train", "--tokens", "{d}/t.bin", "--vocab", "301", "-c", "{d}/x.st", "--counts",
      "{d}/train.txt"], "bob: give one kind of data: text inputs, --tokens files or --counts"),
    (["train", "--tokens", "{d}/t.bin", "--vocab", "1048577", "-c", "{d}/x.st"],
     "bob: --vocab 1048577 is outside [2, 1048576]: V=1048576 is the largest table Bob "
     "trains"),
    (["count", "--tokens", "{d}/t.bin", "--vocab", "1048577", "-o", "{d}/c.st"],
     "bob: --vocab 1048577 is outside [2, 1048576]: V=1048576 is the largest table Bob "
     "trains"),
    (["eval", "-c", "{d}/x.st", "--tokens", "{d}/t.bin", "--vocab", "1048577"],
     "bob: --vocab 1048577 is outside [2, 1048576]: V=1048576 is the largest table Bob "
     "trains"),
    (["count", "--tokens", "{d}/t.bin", "--vocab", "65537", "--token-dtype", "uint16", "-o",
      "{d}/c.st"], "bob: --token-dtype uint16 holds ids below 65536, and V=65537 has ids up "
                   "to 65536: write the tokens as uint32 (read so by default above V=65536)"),
    (["count", "--tokens", "{d}/t.bin", "--vocab", "65537", "-o", "{d}/c.st"],
     "bob: {d}/t.bin: 6 bytes is not a whole number of 4-byte tokens (is --token-dtype "
     "right?)"),
    # Refused from the counts, before the 10 GiB table of weights is built.
    (["train", "--tokens", "{d}/t.bin", "--vocab", "50257", "--backend", "cpu", "-c",
      "{d}/x.st", "--tables", "dense"],
     "bob: V=50257 is above the largest dense table the CPU backend trains (V=32768): it "
     "would hold about 65.9 GiB in host memory; train on a GPU (--backend cuda) or with "
     "--tables collapsed"),
    (["train", "--tokens", "{d}/t.bin", "--vocab", "16384", "--steps", "100000",
      "--backend", "cpu", "-c", "{d}/x.st"],
     "bob: V=16384 for 100000 updates on the CPU backend would take about"),
    (["train", "--val-counts", "{d}/tokc.st", "-c", "{d}/x.st", "--steps", "1"],
     "bob: {d}/tokc.st: validation data has V=301, the model V=256"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path: Path, texts, capsys,
                                                      args: list[str], message: str) -> None:
    np.array([1, 300, 2], "<u2").tofile(tmp_path / "t.bin")
    made = CountsFile.of(count_sources(resolve([str(tmp_path / "t.bin")], "uint16"), 301),
                         [(str(tmp_path / "t.bin"), 6)])
    made.save(tmp_path / "tokc.st")
    before = listing(tmp_path)
    status, out, err = run(capsys, *[a.format(d=tmp_path) for a in args])
    assert status == 2
    assert err.startswith(message.format(d=tmp_path)) and err.count("\n") == 1
    assert "Traceback" not in err + out
    assert listing(tmp_path) == before


def test_fsspec_memory_and_local_urls_count_like_paths(tmp_path: Path, texts) -> None:
    fsspec = pytest.importorskip("fsspec")
    train, val = texts
    memory = fsspec.filesystem("memory")
    memory.pipe("/corpus/a/one.txt", TEXT)
    memory.pipe("/corpus/b.txt", VAL)
    try:
        found = resolve(["memory://corpus"])
        assert [s.name for s in found] == ["memory:///corpus/a/one.txt",
                                           "memory:///corpus/b.txt"]
        by_url = count_sources(found, 256, workers=1, block_bytes=1000)
        by_path = count_sources(resolve([str(train), str(val)]), 256, workers=1)
        assert by_url.same_as(by_path)
        local = count_sources(resolve([f"file://{tmp_path}/*.txt"]), 256, workers=1)
        assert local.same_as(count_sources(resolve([str(tmp_path)]), 256, workers=1))
        with pytest.raises(Exception, match="memory://nothing/here: no such file"):
            resolve(["memory://nothing/here"])
    finally:
        memory.rm("/corpus", recursive=True)


@pytest.fixture(scope="module")
def dask_corpus(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Many small files and a few large ones (the large ones split mid-file)."""
    directory = tmp_path_factory.mktemp("dask")
    rng = np.random.default_rng(5)
    for i in range(40):
        (directory / f"small{i:02d}.txt").write_bytes(TEXT[i * 97:i * 97 + 1 + i * 13])
    for i in range(3):
        (directory / f"large{i}.bin").write_bytes(
            bytes(rng.integers(0, 256, 150_000 + i * 7, dtype=np.uint8)))
    return [str(directory)]


def test_dask_counts_are_bit_identical_for_every_partitioning(dask_corpus) -> None:
    pytest.importorskip("distributed")
    from bob.records.dask_count import count_on_dask

    found = resolve(dask_corpus)
    single = count_sources(found, 256, workers=1)
    for piece_bytes in (4096, 65_536, 10**9):
        counted = count_on_dask(found, 256, workers=3, processes=False,
                                piece_bytes=piece_bytes, block_bytes=1024)
        assert counted.same_as(single)


def test_a_task_that_keeps_failing_ends_with_one_line(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    from bob.errors import RunFailure
    from bob.records import dask_count
    from bob.records.sources import Source

    path = tmp_path / "x.txt"
    path.write_bytes(b"abcdef" * 10)
    found = resolve([str(path)])
    flaky = (Source(str(tmp_path / "vanished.txt"), 60),)  # listed, then gone
    with pytest.raises(Exception) as caught:
        dask_count.count_on_dask([*found, *flaky], 256, workers=2, processes=False,
                                 piece_bytes=25)
    assert str(caught.value) == f"{tmp_path}/vanished.txt: no such file"
    calls = []

    def broken(*args):
        calls.append(1)
        raise OSError("disk on fire")

    original = dask_count.count_piece
    dask_count.count_piece = broken
    try:
        with pytest.raises(RunFailure) as failed:
            dask_count.count_on_dask(found, 256, workers=1, processes=False, piece_bytes=1000)
    finally:
        dask_count.count_piece = original
    assert str(failed.value) == (f"{path} bytes 0-60: OSError: disk on fire "
                                 f"(failed {dask_count.RETRIES + 1} times)")
    assert len(calls) == dask_count.RETRIES + 1


def test_count_command_on_a_local_dask_cluster(tmp_path: Path, dask_corpus, capsys) -> None:
    pytest.importorskip("distributed")
    out = tmp_path / "d.st"
    status, stdout, err = run(capsys, "count", *dask_corpus, "--dask", "--dask-workers", "2",
                              "-o", str(out), "--json")
    assert run(capsys, "count", "-", "--dask", "-o", str(tmp_path / "e.st"))[2] == (
        "bob: -: standard input cannot be counted on a Dask cluster (its workers cannot read "
        "it); give files\n")
    assert status == 0, err
    loaded = CountsFile.load(out)
    assert loaded.counts.same_as(count_sources(resolve(dask_corpus), 256, workers=1))
    assert "LocalCluster" in json.loads(stdout.strip().splitlines()[-1])["where"]


def test_count_reads_standard_input(tmp_path: Path, capsys,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    class Stdin:
        buffer = io.BytesIO(b"hello hello")

    monkeypatch.setattr("sys.stdin", Stdin)
    out = tmp_path / "s.st"
    status, stdout, _ = run(capsys, "count", "-", "-o", str(out), "--json")
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert status == 0 and summary["bytes"] == 11 and summary["transitions"] == 10
    assert CountsFile.load(out).sources == (("-", 11),)
