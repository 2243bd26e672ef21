"""The README's worked session runs as written and prints what it shows; the
Makefile's `run` installs only what running needs."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from bob.cli.main import main

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


# A run's wall time and rate differ every time: their figures are not compared.
TIMED_ROW = re.compile(r"^(│ wall time +│) *[^│]*(│)$")


def shown(lines: list[str]) -> list[str]:
    # Trailing spaces and blank lines are not visible in the README.
    return [TIMED_ROW.sub(r"\1 ... \2", line.rstrip()) for line in lines if line.strip()]


def test_the_worked_session_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    steps = worked_session()
    assert [command.split()[0] for command, _ in steps].count("python") == 1  # makes if.txt
    for command, expected in steps:
        words = shlex.split(command)
        if words[0] == "python":
            subprocess.run([sys.executable, *words[1:]], check=True, cwd=tmp_path)
            continue
        assert words[0] == "bob"
        assert main(words[1:]) == 0, command
        assert shown(capsys.readouterr().out.splitlines()) == shown(expected), command


def test_make_run_installs_only_what_running_needs():
    plan = subprocess.run(["make", "-n", "-B", "run"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line]
    assert any("'.[cuda,fast,plot]'" in line for line in installs), plan
    assert not any("torch" in line or "test" in line for line in installs), plan
    tests = subprocess.run(["make", "-n", "-B", "test"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    assert "'.[cuda,fast,plot,test,dask,remote]'" in tests and "torch==" in tests
