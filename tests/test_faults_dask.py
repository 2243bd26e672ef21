"""A Dask count that loses its scheduler or its workers: `bob count --dask ADDRESS` in a
process of its own ends in one line naming what was lost, exit 1, nothing else on stderr
(no CancelledError traceback, no log of Dask's), and writes nothing.

The cluster is a LocalCluster of worker processes in this process; a preload makes each
piece announce its worker's pid and then take its time, so the test strikes while a task
is surely running.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import contents

distributed = pytest.importorskip("distributed")

SLOW_PRELOAD = '''
import os, time
from bob.records import dask_count

def slow(tally, piece, block_bytes):
    open(os.path.join({marks!r}, f"started-{{os.getpid()}}"), "w").close()
    time.sleep(60)

dask_count.count_piece = slow
'''


@pytest.fixture
def slow_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import dask

    marks = tmp_path / "marks"
    marks.mkdir()
    preload = tmp_path / "slow_preload.py"
    preload.write_text(SLOW_PRELOAD.format(marks=str(marks)))
    # The worker processes' Bob: this checkout's.
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent.parent / "src"))
    # A worker that dies running a task ends it at once (KilledWorker), not after retries.
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                           dashboard_address=None, preload=[str(preload)])
    try:
        yield cluster, marks
    finally:
        cluster.close()


def counting(tmp_path: Path, address: str) -> subprocess.Popen:
    corpus = tmp_path / "data"
    corpus.mkdir()
    (corpus / "a.txt").write_bytes(b"abcdef" * 100)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "src")}
    return subprocess.Popen([sys.executable, "-m", "bob", "count", str(corpus / "a.txt"),
                             "--dask", address, "-o", str(corpus / "a.counts")],
                            cwd=corpus, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def started_worker(marks: Path, process: subprocess.Popen) -> int:
    """The pid of the worker running the first task, once it runs."""
    deadline = time.monotonic() + 120
    while not any(marks.iterdir()):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no task started"
        time.sleep(0.05)
    return int(next(marks.iterdir()).name.removeprefix("started-"))


def one_line(process: subprocess.Popen, directory: Path, before: dict) -> str:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 1, err
    assert out == "" and len(err.splitlines()) == 1, err
    assert contents(directory) == before
    return err.strip()


def test_a_killed_worker_is_named_in_one_line(tmp_path, slow_cluster):
    cluster, marks = slow_cluster
    process = counting(tmp_path, cluster.scheduler_address)
    before = contents(tmp_path / "data")
    os.kill(started_worker(marks, process), 9)
    err = one_line(process, tmp_path / "data", before)
    text = re.escape(str(tmp_path / "data" / "a.txt"))
    assert re.fullmatch(rf"bob: {text} bytes 0-600: every Dask worker that ran it died "
                        r"\(1 workers, the last tcp://127\.0\.0\.1:\d+\)", err), err


def test_a_lost_scheduler_is_named_in_one_line_without_a_traceback(tmp_path, slow_cluster):
    cluster, marks = slow_cluster
    address = cluster.scheduler_address
    process = counting(tmp_path, address)
    before = contents(tmp_path / "data")
    started_worker(marks, process)
    cluster.sync(cluster.scheduler.close)
    err = one_line(process, tmp_path / "data", before)
    assert err == (f"bob: {tmp_path / 'data' / 'a.txt'} bytes 0-600: lost the Dask scheduler "
                   f"({address}); the count stopped")
