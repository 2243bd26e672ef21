"""Faults at the edges of a run: contradictory flags, special files (FIFOs, devices,
sockets), directory entries that are not files, symlinked outputs, a full disk, outputs
that cannot be written. Each is refused with one line on stderr, before any work, with
nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bob.cli.main import main
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
def run_bounded(argv: list[str], seconds: float = 20) -> subprocess.CompletedProcess:
    """`python -m bob` with a time limit: a command that blocks on open fails the test."""
    return subprocess.run([sys.executable, "-m", "bob", *argv], capture_output=True,
                          text=True, timeout=seconds, env={**os.environ, "COLUMNS": "200"})


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
