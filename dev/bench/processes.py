"""A command as a user runs it: one process from start to exit, its wall time and peak RSS.

Under GNU time (``/usr/bin/time -v``, its report written to a file of its own) where it
is installed; elsewhere under a few lines of Python that do the same (`REAPER`: start the
command, reap it with ``os.wait4``, write its peak). Either way the command is the child
of a small process: Linux keeps a process's peak RSS across exec, so a child forked
straight from the bench would report the bench's own memory as its peak.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

GNU_TIME = "/usr/bin/time"
COMMAND_TIMEOUT = 600.0  # seconds one process may take in a bench
_MAX_RSS = re.compile(r"Maximum resident set size \(kbytes\):\s*(\d+)")
# argv: REPORT COMMAND...; the command's exit status is its own (128 + a signal's number).
REAPER = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as report:
    report.write(f"Maximum resident set size (kbytes): {usage.ru_maxrss}\\n")
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


@dataclass(frozen=True)
class ProcessRun:
    argv: tuple[str, ...]
    seconds: float  # start to exit, measured by the parent
    peak_rss_bytes: int | None  # the process's peak resident memory
    returncode: int
    stdout: str
    stderr: str
    rss_source: str  # "/usr/bin/time -v" or "wait4"
    timed_out: bool = False

    @property
    def failure(self) -> str:
        """Why it failed: killed at the time limit, or the last line of standard error (or
        the exit status)."""
        if self.timed_out:
            return f"killed after {self.seconds:.0f} s (the limit)"
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit status {self.returncode}"

    def checked(self) -> ProcessRun:
        """Itself, or RuntimeError naming the failure when it exited with an error."""
        if self.returncode != 0:
            raise RuntimeError(f"{Path(self.argv[0]).name} {' '.join(self.argv[1:4])}: "
                               f"{self.failure}")
        return self


@functools.cache
def bob_env() -> dict[str, str]:
    """The environment of a `bob` process run from a checkout: its sources first, then
    whatever PYTHONPATH the bench was given (packages carried beside it)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        ["src", ".", os.environ.get("PYTHONPATH", "")])}


def gnu_time() -> str | None:
    """/usr/bin/time when it is GNU time (it understands -v and -o)."""
    if not os.access(GNU_TIME, os.X_OK):
        return None
    with tempfile.NamedTemporaryFile(prefix="bob-time-") as report:
        done = subprocess.run([GNU_TIME, "-v", "-o", report.name, "true"],
                              capture_output=True, check=False)
        found = _MAX_RSS.search(Path(report.name).read_text(errors="replace"))
    return GNU_TIME if done.returncode == 0 and found else None


def run_process(argv: Sequence[str], cwd: str | Path | None = None,
                env: Mapping[str, str] | None = None,
                timeout: float = COMMAND_TIMEOUT) -> ProcessRun:
    """Run `argv` to its end (killed past `timeout`): wall seconds, peak RSS, output."""
    argv = tuple(str(word) for word in argv)
    timer = gnu_time()
    with tempfile.TemporaryDirectory(prefix="bob-process-") as scratch:
        out, err = Path(scratch) / "stdout", Path(scratch) / "stderr"
        report = Path(scratch) / "peak"
        if timer:
            wrapped = [timer, "-v", "-o", str(report), *argv]
        else:
            wrapped = [sys.executable, "-c", REAPER, str(report), *argv]
        timed_out = False
        with out.open("wb") as stdout, err.open("wb") as stderr:
            begun = time.perf_counter()
            # A session of its own: past the limit the whole group goes, the command too.
            process = subprocess.Popen(wrapped, cwd=cwd, env=None if env is None else dict(env),
                                       stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                       start_new_session=True)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            seconds = time.perf_counter() - begun
        found = _MAX_RSS.search(report.read_text(errors="replace")) if report.exists() \
            else None
        return ProcessRun(argv, seconds, int(found.group(1)) * 1024 if found else None,
                          process.returncode, out.read_text(errors="replace"),
                          err.read_text(errors="replace"),
                          "/usr/bin/time -v" if timer else "wait4 of its own reaper",
                          timed_out)
