"""Faults in arguments and data files: each one line on stderr starting "bob", its exit
status, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from bob.cli.main import main


def listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def refused(capsys, directory: Path, argv: list[str], status: int = 2) -> str:
    """Run `bob argv`; check the status, one line on stderr, nothing written; the line."""
    before = listing(directory)
    got = main(argv)
    err = capsys.readouterr().err
    assert got == status, err
    assert err.startswith("bob") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert listing(directory) == before
    return err.strip()


# -- usage errors: one line ----------------------------------------------------
@pytest.mark.parametrize(("argv", "line"), [
    (["train", "--backend", "cpu", "--lr", "-1", "-c", "{d}/m.st"],
     "bob train: Invalid value for '--lr': lr = -1.0 is negative (see bob train --help)"),
    (["train", "--backend", "cpu", "--text", "{d}", "-c", "{d}/m.st"],
     "bob train: Invalid value for '--text': File '{d}' is a directory. "
     "(see bob train --help)"),
    (["predict", "-c", "{d}"],
     "bob predict: Invalid value for '--checkpoint' / '-c': File '{d}' is a directory. "
     "(see bob predict --help)"),
    (["train", "--no-such-option"],
     "bob train: No such option '--no-such-option'. (see bob train --help)"),
    (["no-such-command"], "bob: No such command 'no-such-command'. (see bob --help)"),
    (["train", "--steps", "x"], "bob train: Invalid value for '--steps': 'x' is not a "
                                "valid integer range. (see bob train --help)"),
])
def test_a_usage_error_is_one_line(tmp_path, capsys, argv, line):
    err = refused(capsys, tmp_path, [w.format(d=tmp_path) for w in argv])
    assert err == line.format(d=tmp_path)


def test_help_keeps_click_usage_form(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: bob train [OPTIONS]")
