"""Faults at the edges of a run: contradictory flags, special files (FIFOs, devices,
sockets), directory entries that are not files, symlinked outputs, a full disk, outputs
that cannot be written. Each is refused with one line on stderr, before any work, with
nothing written."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bob.cli.main import main
from bob.host import data
from bob.records import corpus, sources
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint
from bob.records.counting import PairCounts
from bob.records.countsfile import CountsFile
from bob.records.digest import sparse_digest
from conftest import contents, train_cpu


def text_digest(text: bytes) -> str:
    """The data digest a checkpoint stores for a text: the sparse one of its counts."""
    return sparse_digest(PairCounts.from_dense(corpus.counts_from_bytes(text)))


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bob"), err
    return lines[0]


@pytest.fixture
def trained(tmp_path: Path, text: Path, capsys) -> Path:
    path = tmp_path / "bob.safetensors"
    assert train_cpu("--text", str(text), "--steps", "5", "-c", str(path)) == 0
    capsys.readouterr()
    return path


# -- contradictory flags -------------------------------------------------------
def test_resume_with_overwrite_is_refused(tmp_path, text, trained, capsys):
    before = contents(tmp_path)
    status = train_cpu("--text", str(text), "--resume", "--overwrite", "--steps", "5",
                       "-c", str(trained))
    line = one_line(capsys.readouterr().err)
    assert status == 2
    assert "--resume" in line and "--overwrite" in line
    assert contents(tmp_path) == before
    assert Checkpoint.load(trained).step == 5


# -- special files where a regular file is needed ------------------------------
def source_env() -> dict[str, str]:
    """This environment with this checkout's src first on the path (a Python of its own
    would import an installed Bob), and a wide terminal."""
    return {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "src"),
            "COLUMNS": "200"}


def run_bounded(argv: list[str], seconds: float = 20) -> subprocess.CompletedProcess:
    """`python -m bob` with a time limit: a command that blocks on open fails the test."""
    return subprocess.run([sys.executable, "-m", "bob", *argv], capture_output=True,
                          text=True, timeout=seconds, env=source_env())


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "f"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("argv", [
    ["predict", "--backend", "cpu", "-c", "{f}", "x"],
    ["certify", "--plan", "{f}"],
    ["generate", "--backend", "cpu", "-c", "{f}", "-p", "x"],
])
def test_a_fifo_where_a_regular_file_is_needed_is_refused_unopened(tmp_path, fifo, argv):
    before = sorted(p.name for p in tmp_path.iterdir())
    done = run_bounded([word.format(f=fifo) for word in argv])
    line = one_line(done.stderr)
    assert done.returncode == 2
    assert f"{fifo}: not a regular file" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_fifo_tokenizer_is_refused(tmp_path, fifo, capsys):
    status = main(["predict", "--backend", "cpu", "-c", str(tmp_path / "none"),
                   "--tokenizer", str(fifo), "x"])
    line = one_line(capsys.readouterr().err)
    assert status == 2 and f"{fifo}: not a regular file" in line


def test_a_device_checkpoint_is_refused(capsys):
    status = main(["predict", "--backend", "cpu", "-c", "/dev/zero", "x"])
    line = one_line(capsys.readouterr().err)
    assert status == 2 and "/dev/zero: not a regular file" in line


# -- streams: pipes, FIFOs and devices as data inputs ---------------------------
class Feeder:
    """Writes `data` into a FIFO from a thread, as a shell's `cat x > fifo &` would; `close`
    lets a writer still waiting for its reader go (the command refused before opening)."""

    def __init__(self, fifo: Path, data: bytes) -> None:
        self.fifo = fifo
        self.thread = threading.Thread(target=self._write, args=(data,), daemon=True)
        self.thread.start()

    def _write(self, data: bytes) -> None:
        with contextlib.suppress(BrokenPipeError), open(self.fifo, "wb") as pipe:
            pipe.write(data)

    def close(self) -> None:
        # A reader of its own, drained until the writer is done: the writer may reach its
        # open only after this one.
        fd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            deadline = time.monotonic() + 10
            while self.thread.is_alive() and time.monotonic() < deadline:
                with contextlib.suppress(BlockingIOError):
                    os.read(fd, 1 << 16)
                time.sleep(0.01)
        finally:
            os.close(fd)
        self.thread.join(1)
        assert not self.thread.is_alive()


@pytest.fixture
def feed(tmp_path: Path):
    """feed(data) -> a FIFO in tmp_path/pipes that a thread fills with `data`."""
    feeders = []
    (tmp_path / "pipes").mkdir()

    def start(data: bytes, name: str = "in") -> Path:
        fifo = tmp_path / "pipes" / f"{name}{len(feeders)}"
        os.mkfifo(fifo)
        feeders.append(Feeder(fifo, data))
        return fifo

    yield start
    for feeder in feeders:
        feeder.close()


def refused_line(capsys, directory: Path, argv: list[str], status: int = 2) -> str:
    """`bob argv` in this process: its status, one line on stderr, nothing written under
    `directory`; the line."""
    before = contents(directory)
    got = main(argv)
    err = capsys.readouterr().err
    assert got == status, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert contents(directory) == before
    return one_line(err)


def test_a_text_from_a_fifo_trains_as_the_file_does(tmp_path, text, feed, capsys):
    by_file, by_pipe = tmp_path / "file.safetensors", tmp_path / "pipe.safetensors"
    assert train_cpu("--text", str(text), "--steps", "5", "-c", str(by_file)) == 0
    pipe = feed(text.read_bytes())
    assert train_cpu("--text", str(pipe), "--steps", "5",
                     "-c", str(by_pipe)) == 0, capsys.readouterr().err
    assert_same_but_the_sources(by_pipe, by_file, pipe, capsys)


def assert_same_but_the_sources(by_pipe: Path, by_file: Path, pipe: Path, capsys) -> None:
    """The two runs' checkpoints are one but for how the data was given: the pipe's
    records a stream, which a --resume naming no data refuses (it cannot be read again,
    and opening the FIFO would wait for a writer)."""
    def unsourced(path: Path) -> Checkpoint:
        stored = Checkpoint.load(path)
        return stored.with_segments(tuple(replace(s, sources=None) for s in stored.segments))

    assert unsourced(by_pipe) == unsourced(by_file)
    recorded = Checkpoint.load(by_pipe).state.sources
    assert recorded.stream and recorded.paths == (str(pipe),)
    capsys.readouterr()
    assert train_cpu("--resume", "--steps", "5", "-c", str(by_pipe)) == 2
    assert capsys.readouterr().err == (f"bob: {by_pipe}: trained on {pipe}, which cannot be "
                                       "read again; name the data to train on (--text, "
                                       "--tokens, --counts or --input)\n")


def test_a_process_substitution_is_a_text_input(tmp_path, text):
    path = tmp_path / "bob.safetensors"
    command = (f"{shlex.quote(sys.executable)} -m bob train --backend cpu -N 5 --steps 5 "
               f"--text <(cat {shlex.quote(str(text))}) -c {shlex.quote(str(path))} --json")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120,
                          env=source_env())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["data"].startswith("/dev/fd/")
    assert Checkpoint.load(path).data_digest == text_digest(text.read_bytes())


def test_tokens_from_a_fifo_count_as_the_file_does(tmp_path, feed, capsys):
    tokens = np.random.default_rng(0).integers(0, 512, 5000).astype("<u2")
    (tmp_path / "t.bin").write_bytes(tokens.tobytes())
    for name, source in (("file", tmp_path / "t.bin"), ("pipe", feed(tokens.tobytes()))):
        assert main(["count", "--tokens", str(source), "--vocab", "512",
                     "-o", str(tmp_path / f"{name}.counts")]) == 0, capsys.readouterr().err
    by_file, by_pipe = (CountsFile.load(tmp_path / f"{n}.counts") for n in ("file", "pipe"))
    assert by_pipe.digest == by_file.digest and by_pipe.transitions == 4999
    assert by_pipe.sources[0][1] == by_file.sources[0][1] == 10_000  # the stream's bytes


def test_a_fifo_named_twice_is_refused_before_it_is_read(tmp_path, text, feed, capsys):
    fifo = feed(text.read_bytes())
    line = refused_line(capsys, tmp_path, ["count", str(fifo), str(fifo),
                                           "-o", str(tmp_path / "c.counts")])
    assert line == f"bob: {fifo}: a stream (a FIFO) can be read only once"


def record_file(directory: Path) -> Path:
    path = directory / "r.bin"
    InputRecord.hard(np.arange(1, 65, dtype=np.uint32) % 64, ()).write(path)
    return path


def test_an_input_record_from_a_fifo_trains_as_the_file_does(tmp_path, feed, capsys):
    record = record_file(tmp_path)
    by_file, by_pipe = tmp_path / "file.safetensors", tmp_path / "pipe.safetensors"
    assert train_cpu("--input", str(record), "--steps", "5", "-c", str(by_file)) == 0
    pipe = feed(record.read_bytes())
    assert train_cpu("--input", str(pipe), "--steps", "5",
                     "-c", str(by_pipe)) == 0, capsys.readouterr().err
    assert_same_but_the_sources(by_pipe, by_file, pipe, capsys)


def test_an_input_record_stream_that_goes_on_is_refused(tmp_path, feed, capsys):
    record = record_file(tmp_path)
    fifo = feed(record.read_bytes() + b"\0" * 100_000)
    line = refused_line(capsys, tmp_path, ["train", "--backend", "cpu", "--input", str(fifo),
                                           "--steps", "5", "-c", str(tmp_path / "m.st")])
    assert line == (f"bob: {fifo}: the stream goes on past the {record.stat().st_size:,} "
                    "bytes its header declares")


def test_dev_zero_as_an_input_record_is_refused_at_its_first_bytes(tmp_path, capsys):
    line = refused_line(capsys, tmp_path, ["train", "--backend", "cpu", "--input", "/dev/zero",
                                           "--steps", "5", "-c", str(tmp_path / "m.st")])
    assert line.startswith("bob: /dev/zero: not a Bob input record: starts with b'\\x00")


@pytest.mark.parametrize("argv", [
    ["train", "--backend", "cpu", "--text", "/dev/zero", "--steps", "5", "-c", "{d}/m.st"],
    ["train", "--backend", "cpu", "--tokens", "/dev/zero", "--vocab", "512", "--steps", "5",
     "-c", "{d}/m.st"],
    ["count", "/dev/zero", "-o", "{d}/c.counts"],
    ["eval", "--backend", "cpu", "-c", "{d}/m.st", "--text", "/dev/zero"],
])
def test_an_endless_stream_is_refused_at_the_bound(tmp_path, capsys, monkeypatch, argv):
    if argv[0] == "eval":
        Checkpoint.zeros(256).save(tmp_path / "m.st")
    monkeypatch.setattr(sources, "STREAM_MAX_BYTES", 1 << 24)  # 16 MiB: the test's, not 64 GiB
    line = refused_line(capsys, tmp_path, [word.format(d=tmp_path) for word in argv])
    assert line == ("bob: /dev/zero: the stream goes on past 16,777,216 bytes (16 MiB), the "
                    "most Bob counts from a stream (standard input, a pipe, a device); count "
                    "a larger corpus from a file")


def test_the_stream_bound_is_64_gib_and_counts_standard_input(tmp_path, capsys, monkeypatch):
    assert sources.STREAM_MAX_BYTES == 64 << 30
    monkeypatch.setattr(sources, "STREAM_MAX_BYTES", 1000)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ab" * 501)))
    line = refused_line(capsys, tmp_path, ["count", "-", "-o", str(tmp_path / "c.counts")])
    assert line.startswith("bob: -: the stream goes on past 1,000 bytes (1000 B), the most")


@pytest.mark.parametrize("argv", [
    ["train", "--backend", "cpu", "--counts", "{f}", "--steps", "5", "-c", "{d}/m.st"],
    ["train", "--backend", "cpu", "--resume", "--steps", "5", "-c", "{f}"],
])
def test_a_fifo_counts_file_or_checkpoint_is_still_refused_unopened(tmp_path, fifo, argv):
    done = run_bounded([word.format(f=fifo, d=tmp_path) for word in argv])
    line = one_line(done.stderr)
    assert done.returncode == 2 and f"{fifo}: not a regular file (a FIFO" in line


# -- a directory's entries: every one a file, or refused ----------------------------
@pytest.fixture
def corpus_dir(tmp_path: Path, text: Path) -> Path:
    directory = tmp_path / "corpus"
    (directory / "deeper").mkdir(parents=True)
    (directory / "deeper" / "a.txt").write_bytes(text.read_bytes())
    return directory


def odd_entry(directory: Path, kind: str) -> Path:
    path = directory / "deeper" / f"odd-{kind}"
    if kind == "broken link":
        path.symlink_to(directory / "gone")
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()  # the socket file stays
    else:
        path.symlink_to("/dev/null")  # a character device, reached by a link
    return path


@pytest.mark.parametrize(("kind", "says"), [
    ("broken link", "a broken symbolic link (to {c}/gone) in {d}"),
    ("FIFO", "not a regular file (a FIFO) in {d}"),
    ("socket", "not a regular file (a socket) in {d}"),
    ("device", "not a regular file (a character device) in {d}"),
])
@pytest.mark.parametrize("glob", [False, True], ids=["directory", "glob"])
def test_a_directory_entry_that_is_not_a_file_is_refused_by_name(tmp_path, corpus_dir, capsys,
                                                                   kind, says, glob):
    entry = odd_entry(corpus_dir, kind)
    given = f"{corpus_dir}/**/*" if glob else str(corpus_dir)
    line = refused_line(capsys, tmp_path, ["count", given, "-o", str(tmp_path / "c.counts")])
    assert line.startswith(f"bob: {entry}: {says.format(c=corpus_dir, d=given)}")
    entry.unlink()
    assert main(["count", given, "-o", str(tmp_path / "c.counts")]) == 0  # the rest is sound


# -- outputs checked before any work -------------------------------------------
def never_counted(*args, **kwargs):
    raise AssertionError("counted before the output was checked")


@pytest.mark.parametrize(("out", "says"), [
    ("/proc/bob.counts", "/proc/bob.counts: cannot write the counts file in /proc ("),
    ("{d}/a.txt/c.counts", "{d}/a.txt/c.counts: {d}/a.txt is a file, not a directory"),
    ("{d}/pipe", "{d}/pipe: not a regular file (a FIFO, not a counts file); Bob writes its "
                 "outputs as regular files"),
    ("{d}/ro/c.counts", "{d}/ro/c.counts: cannot write the counts file in {d}/ro (read-only: "
                        "mode 0555)"),
])
def test_count_refuses_an_output_it_cannot_write_before_counting(tmp_path, text, capsys,
                                                                 monkeypatch, out, says):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "ro").mkdir(mode=0o555)
    monkeypatch.setattr(data, "count_corpus", never_counted)
    line = refused_line(capsys, tmp_path, ["count", str(text), "-o", out.format(d=tmp_path)])
    assert line.startswith(f"bob: {says.format(d=tmp_path)}")
    assert stat.S_ISFIFO(os.stat(tmp_path / "pipe").st_mode)


def read_only(tmp_path: Path, checkpoint: Path) -> Path:
    """The checkpoint moved into a directory, both made read-only (0444 in 0555)."""
    directory = tmp_path / "ro"
    directory.mkdir()
    moved = directory / checkpoint.name
    checkpoint.rename(moved)
    moved.chmod(0o444)
    directory.chmod(0o555)
    return moved


@pytest.mark.parametrize("extra", [["--resume"], ["--overwrite"]])
def test_a_read_only_checkpoint_is_refused_before_training(tmp_path, text, trained, capsys,
                                                           extra):
    path = read_only(tmp_path, trained)
    line = refused_line(capsys, tmp_path, ["train", "--backend", "cpu", "--text", str(text),
                                           "--steps", "5", "-c", str(path), *extra])
    assert line == (f"bob: {path}: the checkpoint is read-only (mode 0444); Bob does not "
                    "replace a read-only file")
    assert Checkpoint.load(path).step == 5


def test_a_new_checkpoint_in_a_read_only_directory_is_refused(tmp_path, text, capsys):
    (tmp_path / "ro").mkdir(mode=0o555)
    path = tmp_path / "ro" / "bob.safetensors"
    line = refused_line(capsys, tmp_path, ["train", "--backend", "cpu", "--text", str(text),
                                           "--steps", "5", "-c", str(path)])
    assert line == (f"bob: {path}: cannot write the checkpoint in {path.parent} (read-only: "
                    "mode 0555)")


@pytest.fixture
def immutable(trained: Path):
    """The trained checkpoint made immutable (chattr +i); skips where chattr cannot."""
    done = subprocess.run(["chattr", "+i", str(trained)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"chattr +i does not work here: {done.stderr.strip()}")
    yield trained
    subprocess.run(["chattr", "-i", str(trained)], check=True)


def test_an_immutable_checkpoint_is_refused_before_training(tmp_path, text, immutable, capsys):
    line = refused_line(capsys, tmp_path, ["train", "--backend", "cpu", "--text", str(text),
                                           "--resume", "--steps", "5", "-c", str(immutable)])
    assert line == (f"bob: {immutable}: the checkpoint is immutable (chattr +i); Bob cannot "
                    "replace it")


@pytest.mark.parametrize("argv", [
    ["plan", "-N", "1", "--emit", "/proc/bob-emit"],
    ["bench", "--save", "/proc/bob-bench.json"],
    ["export", "-c", "{d}/bob.safetensors", "-o", "/proc/bob-parameters"],
])
def test_every_command_that_writes_checks_its_output_first(tmp_path, trained, capsys, argv):
    line = refused_line(capsys, tmp_path, [word.format(d=tmp_path) for word in argv])
    assert line.startswith(f"bob: {argv[-1]}: cannot ")
    assert line.endswith("(No such file or directory)"), line  # /proc takes no new file


# -- the lock file on a full disk ------------------------------------------------
def test_a_full_disk_at_the_lock_write_is_one_line_naming_it(tmp_path, text, monkeypatch,
                                                            capsys):
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".lock"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    path = tmp_path / "bob.safetensors"
    line = refused_line(capsys, tmp_path, ["train", "--backend", "cpu", "--text", str(text),
                                           "--steps", "5", "-c", str(path)], status=1)
    assert line == (f"bob: {path}: cannot write the lock file {path}.lock (No space left on "
                    "device); the checkpoint is untouched")


# -- plan --emit: all the files or none ----------------------------------------------
def failing_fsync(monkeypatch, nth: int) -> None:
    """os.fsync fails with ENOSPC at the nth temporary a write syncs (a full disk found at
    the sync, as delayed allocation finds it)."""
    real_fsync = os.fsync
    synced = []

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
            synced.append(fd)
            if len(synced) == nth:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("existing", [True, False], ids=["over-an-emit", "new-directory"])
def test_an_emit_that_fails_midway_leaves_the_directory_as_it_was(tmp_path, capsys,
                                                                   monkeypatch, existing):
    out = tmp_path / "components"
    if existing:
        assert main(["plan", "-N", "1", "--emit", str(out)]) == 0
        capsys.readouterr()
    failing_fsync(monkeypatch, 3)  # program.bin and qmd-table.bin are written, then not
    line = refused_line(capsys, tmp_path, ["plan", "-N", "2", "--emit", str(out)], status=1)
    assert line == (f"bob: {out}/pushbuffer.bin: cannot write (No space left on device); "
                    "the old file is untouched")
    assert out.is_dir() == existing


# -- a symlinked checkpoint ------------------------------------------------------
def test_a_symlinked_checkpoint_stays_a_link_and_its_target_moves_on(tmp_path, text, trained,
                                                                     capsys):
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / trained.name
    trained.rename(target)
    link = tmp_path / "latest.safetensors"
    link.symlink_to(target)
    assert train_cpu("--text", str(text), "--resume", "--steps", "5", "-c", str(link)) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert Checkpoint.load(target).step == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "latest.safetensors", "runs"]
    assert os.listdir(tmp_path / "runs") == [trained.name]  # no lock, no temporary left


@pytest.mark.parametrize(("extra", "says"), [
    ([], "{c}: exists; pass --resume to continue it or --overwrite to start again"),
    (["--resume", "-c", "{d}/none.safetensors"], "{d}/none.safetensors: no checkpoint to "
                                                 "resume from"),
])
def test_the_checkpoint_is_held_against_resume_before_the_data_is_counted(
        tmp_path, text, trained, capsys, monkeypatch, extra, says):
    monkeypatch.setattr(data, "count_corpus", never_counted)
    argv = ["train", "--backend", "cpu", "--text", str(text), "--steps", "5",
            "-c", str(trained), *extra]
    line = refused_line(capsys, tmp_path, [word.format(d=tmp_path) for word in argv])
    assert line == "bob: " + says.format(c=trained, d=tmp_path)
