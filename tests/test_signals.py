"""SIGINT and SIGTERM at twenty moments of a `bob train` process on the cpu backend:
start-up, the imports, Numba's compilation, training, a save, and a second signal. Every
time the process ends with 128 + the signal's number and its last line on stderr is the
one-line report (nothing started yet; no checkpoint written; or the update reached and
the checkpoint kept), with nothing but progress lines before it, no traceback, no lock or
temporary left, and the checkpoint named is on disk and loadable (or there is none).

Moments are chosen by time where any outcome of the race is one of those reports, and by
an event the test sees (a line on stderr, a file appearing) where the moment must be hit.
Start-up counts from the moment Bob's handler is set (the process catches SIGTERM, as
/proc shows): before it, in the interpreter's own start-up (its site import, a few tens
of milliseconds), no code of Bob's runs and the signals do what they do to any Python.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bob.backends.cpu import COMPILING_NOTICE
from bob.files import TEMP_SUFFIX
from bob.records.checkpoint import Checkpoint

CHECKPOINT = "bob.safetensors"
REPORTS = re.compile(r"bob: interrupted"
                     r"|bob: interrupted at update (\d+); no checkpoint written by this run"
                     r"|bob: interrupted at update (\d+); checkpoint at update (\d+) kept")
# the progress lines a run prints before: its plan, a line per eval point, a heartbeat
PROGRESS = re.compile(r"plan: updates |step \d+: train \d|\.\.\. \d+:\d\d: ")
DEADLINE_SECONDS = 60  # for an event to happen, and for the process to end after a signal


@dataclass(frozen=True)
class Moment:
    name: str
    event: str  # "handler", "compiling", "lock", "checkpoint", "saving"
    after: float  # seconds after the event
    signals: tuple[int, ...] = (signal.SIGINT,)
    compile: bool = False  # a Numba cache of its own, empty: the kernels compile


INT, TERM = signal.SIGINT, signal.SIGTERM
MOMENTS = [
    *(Moment(f"start-up +{t}s", "handler", t, (s,))
      for t, s in [(0.0, INT), (0.0, TERM), (0.01, INT), (0.03, TERM), (0.06, INT),
                   (0.1, TERM), (0.2, INT), (0.4, TERM)]),
    Moment("compiling", "compiling", 0.0, (TERM,), compile=True),
    Moment("compiling +1s", "compiling", 1.0, (INT,), compile=True),
    Moment("training begins", "lock", 0.0, (INT,)),
    Moment("training begins +0.05s", "lock", 0.05, (TERM,)),
    Moment("training", "checkpoint", 0.0, (TERM,)),
    Moment("training +0.1s", "checkpoint", 0.1, (INT,)),
    Moment("training +0.3s", "checkpoint", 0.3, (TERM,)),
    Moment("saving", "saving", 0.0, (INT,)),
    Moment("saving, SIGTERM", "saving", 0.0, (TERM,)),
    Moment("saving, twice", "saving", 0.0, (INT, INT)),
    Moment("training, SIGINT twice", "checkpoint", 0.0, (INT, INT)),
    Moment("training, SIGTERM twice", "checkpoint", 0.0, (TERM, TERM)),
]


class Watched:
    """A `bob train` process and what the test watches of it: its stderr lines as they
    come, and the files of its directory."""

    def __init__(self, directory: Path, text: Path, numba_cache: Path | None):
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "src")}
        if numba_cache is not None:
            env["NUMBA_CACHE_DIR"] = str(numba_cache)
        self.directory = directory
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bob", "train", "--backend", "cpu", "--text", str(text),
             "-N", "1", "--steps", "100000", "-c", CHECKPOINT],
            cwd=directory, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, event: str) -> None:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while not self._happened(event):
            assert self.process.poll() is None, "\n".join(self.lines)
            assert time.monotonic() < deadline, f"no {event} seen"
            time.sleep(0.0005)

    def _happened(self, event: str) -> bool:
        if event == "handler":
            return self._catches(signal.SIGTERM)
        if event == "compiling":
            return COMPILING_NOTICE in self.lines
        names = os.listdir(self.directory)
        if event == "lock":
            return f"{CHECKPOINT}.lock" in names
        if event == "checkpoint":
            return CHECKPOINT in names
        return any(name.endswith(TEMP_SUFFIX) for name in names)  # "saving"

    def _catches(self, signum: int) -> bool:
        """Whether the process has a handler of its own for `signum` (SigCgt in /proc)."""
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
        return False

    def end(self) -> tuple[int, list[str]]:
        try:
            status = self.process.wait(timeout=DEADLINE_SECONDS)
        finally:
            if self.process.poll() is None:
                self.process.kill()
        self.reader.join(timeout=DEADLINE_SECONDS)
        return status, self.lines


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "a.txt"
    path.write_bytes(b"the cat sat on the mat; the rat ate the hat. " * 200)
    return path


@pytest.mark.parametrize("moment", MOMENTS, ids=[m.name for m in MOMENTS])
def test_a_stop_signal_at_any_moment_ends_in_its_one_line(tmp_path, corpus, moment):
    run = tmp_path / "run"
    run.mkdir()
    watched = Watched(run, corpus, tmp_path / "numba" if moment.compile else None)
    watched.wait_for(moment.event)
    time.sleep(moment.after)
    for number, signum in enumerate(moment.signals):
        if number:
            time.sleep(0.05)
        watched.process.send_signal(signum)
    status, lines = watched.end()
    shown = "\n".join(lines)
    assert status == 128 + moment.signals[0], shown
    assert lines and REPORTS.fullmatch(lines[-1]), shown
    assert all(PROGRESS.match(line) or line in (COMPILING_NOTICE, "")
               for line in lines[:-1]), shown
    found = REPORTS.fullmatch(lines[-1])
    kept = found.group(3)
    if kept is None:
        assert os.listdir(run) == [], shown  # nothing kept: nothing written
    else:
        assert os.listdir(run) == [CHECKPOINT], shown  # no lock, no temporary
        assert Checkpoint.load(run / CHECKPOINT).step == int(kept), shown
    if moment.event in ("checkpoint", "saving"):
        assert kept is not None, shown  # a checkpoint was on disk: it is the one kept
