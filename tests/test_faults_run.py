"""Faults at the edges of a run: contradictory flags, special files (FIFOs, devices,
sockets), directory entries that are not files, symlinked outputs, a full disk, outputs
that cannot be written. Each is refused with one line on stderr, before any work, with
nothing written."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bob.cli.main import main
from bob.host import data
from bob.records.checkpoint import Checkpoint
from conftest import contents, train_cpu


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
