"""Faults at the edges of a run: contradictory flags, special files (FIFOs, devices,
sockets), directory entries that are not files, symlinked outputs, a full disk, outputs
that cannot be written. Each is refused with one line on stderr, before any work, with
nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from bob.cli.main import main
from bob.records.checkpoint import Checkpoint


def listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bob"), err
    return lines[0]


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "a.txt"
    path.write_bytes(b"the cat sat on the mat; the rat ate the hat. " * 20)
    return path


def train(*argv: str) -> int:
    return main(["train", "--backend", "cpu", "-N", "5", *argv])


@pytest.fixture
def trained(tmp_path: Path, text: Path, capsys) -> Path:
    path = tmp_path / "bob.safetensors"
    assert train("--text", str(text), "--steps", "5", "-c", str(path)) == 0
    capsys.readouterr()
    return path


# -- contradictory flags -------------------------------------------------------
def test_resume_with_overwrite_is_refused(tmp_path, text, trained, capsys):
    before = listing(tmp_path)
    status = train("--text", str(text), "--resume", "--overwrite", "--steps", "5",
                   "-c", str(trained))
    line = one_line(capsys.readouterr().err)
    assert status == 2
    assert "--resume" in line and "--overwrite" in line
    assert listing(tmp_path) == before
    assert Checkpoint.load(trained).step == 5
