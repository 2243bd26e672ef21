"""Host memory of a token run: no allocation on the host reaches one V x V table.

A training run in corpus mode at V = 2048 (a table is 16 MiB) goes through a backend
that keeps no arena: it counts the bytes written, answers reads with zeros of the size
asked and runs nothing. The records, the plan, the loads (zeros cleared, a checkpoint
streamed in on resume), the invocations, the device validation and the streamed saves
are then all the host does, and tracemalloc sees every allocation of it.

Counting is measured apart from it (its counts are taken from a first run): up to
`counting.DENSE_MAX_VOCAB` (2048) its tally is the dense u64 table the counts file
stores, two tables' bytes by design; above it the tally is sparse.
"""

from __future__ import annotations

import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bob.backends import choose_backend
from bob.backends.base import Backend, Patch
from bob.cli.main import main
from bob.host import data, training
from bob.host.data import CorpusSpec
from bob.plan.model import Scalar
from bob.records.countsfile import CountsFile
from bob.records.shards import open_checkpoint

VOCAB = 2048
TABLE_BYTES = 4 * VOCAB * VOCAB  # 16 MiB


class RecordingBackend(Backend):
    """A backend with no arena: writes are counted, reads are zeros, runs do nothing.

    Zero losses and zero health counts are a finite run, so the host does everything it
    does for a real one; the largest piece it ever hands over or asks for is recorded."""

    name = "cpu"  # what the run's messages and the CPU policy see
    largest_write = 0
    largest_read = 0
    runs = 0

    def _write_arena(self, offset: int, data: memoryview) -> None:
        RecordingBackend.largest_write = max(RecordingBackend.largest_write, data.nbytes)

    def _read_arena(self, offset: int, size: int) -> bytes:
        RecordingBackend.largest_read = max(RecordingBackend.largest_read, size)
        return bytes(size)

    def _run(self, submissions: range) -> None:
        RecordingBackend.runs += 1

    def _carry_patches(self, launch_index: int, values: dict[str, Scalar],
                       patches: list[Patch]) -> None:
        pass


def tokens_file(path: Path, count: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    # Mostly a few successors per token, as text has: K stays far below V * V.
    tokens = (np.cumsum(rng.integers(1, 9, count)) % VOCAB).astype("<u2")
    tokens.tofile(path)
    return path


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> None:
    counted: dict[CorpusSpec, CountsFile] = {}  # each corpus counted once, by the first run
    count = data.count_corpus

    def count_once(spec: CorpusSpec, *args, **kwargs) -> CountsFile:
        if spec not in counted:
            counted[spec] = count(spec, *args, **kwargs)
        return counted[spec]

    monkeypatch.setattr(data, "count_corpus", count_once)
    choice = replace(choose_backend("cpu"), opener=RecordingBackend)
    monkeypatch.setattr(training, "choose_backend", lambda *args, **kwargs: choice)
    # A 48 MiB checkpoint is streamed from the arena, as a token model's is.
    monkeypatch.setattr(training, "SMALL_CHECKPOINT_BYTES", 1 << 20)
    for name in ("largest_write", "largest_read", "runs"):
        monkeypatch.setattr(RecordingBackend, name, 0)


def peak_of(argv: list[str]) -> int:
    """The peak of host memory traced while `bob` runs argv."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        assert main(argv) == 0, argv
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def test_no_host_allocation_reaches_a_table(tmp_path: Path, recording: None, capsys) -> None:
    train = tokens_file(tmp_path / "train.bin", 400_000, 1)
    val = tokens_file(tmp_path / "val.bin", 50_000, 2)
    checkpoint = tmp_path / "bob.safetensors"
    common = ["train", "--tokens", str(train), "--vocab", str(VOCAB), "--val-tokens", str(val),
              "--backend", "cpu", "-N", "2", "--save-every-updates", "2", "-c",
              str(checkpoint), "--tables", "dense"]  # the dense tables' bounds
    assert main([*common, "--steps", "2"]) == 0  # counts the corpora; imports, caches
    fresh = peak_of([*common, "--steps", "6", "--overwrite"])
    state = open_checkpoint(checkpoint).state
    assert state.step == 6 and state.file_bytes > 3 * TABLE_BYTES
    assert [step for step, _ in state.val_history] == [0, 2, 4, 6]
    resumed = peak_of([*common, "--resume", "--steps", "3"])  # 2 + 1: a second plan
    assert open_checkpoint(checkpoint).state.step == 9
    capsys.readouterr()
    print(f"peak host memory: fresh {fresh / 2**20:.1f} MiB, resumed {resumed / 2**20:.1f} "
          f"MiB; largest write {RecordingBackend.largest_write / 2**20:.1f} MiB, read "
          f"{RecordingBackend.largest_read / 2**20:.1f} MiB")
    assert RecordingBackend.runs >= 5
    assert 0 < RecordingBackend.largest_write < TABLE_BYTES
    assert 0 < RecordingBackend.largest_read < TABLE_BYTES
    assert fresh < TABLE_BYTES and resumed < TABLE_BYTES
