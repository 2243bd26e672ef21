"""The README's worked session runs as written, from `make run` on, and prints what it
shows; the Makefile's `run` installs only what running needs."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from bob.backends.cpu import COMPILING_NOTICE
from bob.cli.main import main
from bob.cli.progress import HEARTBEAT_PREFIX

ROOT = Path(__file__).resolve().parent.parent


def worked_session() -> list[tuple[str, list[str]]]:
    """(command, the lines shown after it) for each `$ ` line of the worked session."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## A worked session", 1)[1].split("\n## ", 1)[0]
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def make_lines(target: str) -> list[str]:
    """What `make TARGET` echoes on a machine without a GPU, from a fresh clone."""
    return subprocess.run(["make", "--no-print-directory", "-n", "-B", target, "GPU="],
                          cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.splitlines()


# A run's wall time, rates and ETA differ every time: their figures are not compared.
TIMED_ROW = re.compile(r"^(│ wall time +│) *[^│]*(│)$")
RATE = re.compile(r"\([\d.e-]+ ms/update, ETA [\d:]+\)$")


def shown(lines: list[str]) -> list[str]:
    # Trailing spaces and blank lines are not visible in the README; the compile notice
    # appears on a machine's first run only, a heartbeat line where a run is slow.
    return [RATE.sub("(... ms/update, ETA ...)", TIMED_ROW.sub(r"\1 ... \2", line.rstrip()))
            for line in lines if line.strip() and line != COMPILING_NOTICE
            and not line.startswith(HEARTBEAT_PREFIX)]


def run_python(words: list[str], cwd: Path) -> None:
    """`python ARGS [> FILE]` as a shell runs it."""
    out = None
    if ">" in words:
        at = words.index(">")
        words, out = words[:at], cwd / words[at + 1]
    done = subprocess.run([sys.executable, *words[1:]], check=True, cwd=cwd,
                          capture_output=True)
    if out is not None:
        out.write_bytes(done.stdout)


def test_the_worked_session_runs_as_written_after_make_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    steps = worked_session()
    assert steps[0][0] == "make run"
    compiled: list[str] = []  # the commands that said they compile
    for command, expected in steps:
        words = shlex.split(command)
        if words[0] == "make":
            # make's own lines as it echoes them, then its bob command, run here
            echoed = make_lines("run")
            assert expected[:len(echoed)] == echoed
            bob_words = shlex.split(echoed[-1], comments=True)
            assert bob_words[0] == ".venv/bin/bob"
            words, expected = ["bob", *bob_words[1:]], expected[len(echoed):]
        if words[0] == "python":
            run_python(words, tmp_path)
            assert expected == [], command
            continue
        assert words[0] == "bob"
        assert main(words[1:]) == 0, command
        captured = capsys.readouterr()
        # The progress lines (stderr) come before the table (stdout), as on a terminal.
        got = captured.err.splitlines() + captured.out.splitlines()
        assert shown(got) == shown(expected), command
        compiled += [command] * got.count(COMPILING_NOTICE)
    # Compiled once at most (a machine's first run), by the Makefile's own bob train.
    assert compiled in ([], [steps[0][0]]), compiled


def test_make_run_installs_only_what_running_needs():
    installs = [line for line in make_lines("run") if "pip install" in line]
    assert any("'.[fast,plot]'" in line for line in installs), installs
    assert not any("cuda" in line or "torch" in line or "test" in line for line in installs)
    with_gpu = subprocess.run(["make", "--no-print-directory", "-n", "-B", "run", "GPU=yes"],
                              cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "'.[fast,plot,cuda]'" in with_gpu
    # The tests keep the CUDA wheels: NVRTC compiles the kernels without a GPU.
    tests = "\n".join(make_lines("test"))
    assert "'.[cuda,fast,plot,test,dask,remote,tokens]'" in tests and "torch==" in tests
