"""The host out of the way. Resident state between invocations, the read-back
pipeline, the background checkpoint writer, scalars in one pass, train's wall time."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bob.backends import BackendChoice, choose_backend
from bob.backends.base import ReadHandle
from bob.backends.cpu import CpuBackend
from bob.cli.main import main
from bob.config import CHECKPOINT_TENSORS, Hyper
from bob.errors import BobError, RunFailure
from bob.host import api
from bob.host.check import random_record
from bob.host.session import Session, train
from bob.host.writer import BackgroundWriter
from bob.plan.model import Scalar
from bob.program.bob import ADAM_SCALAR_NAMES, BobConfig, adam_scalar_table, typical_pairs
from bob.records.checkpoint import Checkpoint


def corpus_config(vocab: int, **fields) -> BobConfig:
    """A corpus-mode configuration of the K pairs `random_record` draws for it."""
    return BobConfig(vocab=vocab, mode="corpus", pairs=typical_pairs(vocab) // 2, **fields)


class CountingCpu(CpuBackend):
    """The CPU backend, counting the host's tensor writes by name and its reads."""

    def __init__(self, plan, *args, **kwargs):
        super().__init__(plan, *args, **kwargs)
        self.writes: Counter[str] = Counter()
        self.begun_reads = 0

    def write_tensor(self, name, data, offset=0):
        self.writes[name] += 1
        super().write_tensor(name, data, offset)

    def write_tensors(self, writes):
        self.writes.update(name for name, _ in writes)
        super().write_tensors(writes)

    def begin_read(self, names):
        self.begun_reads += 1
        return super().begin_read(names)


def counting_choice() -> BackendChoice:
    return replace(choose_backend("cpu"), opener=CountingCpu)


def arena_bytes(backend) -> dict[str, bytes]:
    """Every tensor of the arena (in corpus mode the scattered `weights` among them)."""
    return {tensor.name: backend.read_tensor(tensor.name) for tensor in backend.plan.tensors}


# -- resident state -------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_a_resident_checkpoint_gives_the_bytes_of_a_loaded_one(schedule, mode):
    config = BobConfig(vocab=64, prompts=2, updates=4, mode=mode, schedule=schedule,
                       pairs=typical_pairs(64) // 2 if mode == "corpus" else 0)
    record = random_record(config, 3)
    start = Checkpoint.zeros(64, Hyper(), mode)
    with Session(counting_choice()) as resident, Session(counting_choice()) as loaded:
        first = resident.invoke(config, start, record, "train")
        assert resident.holds(config, first.checkpoint)
        assert not resident.holds(config, replace(first.checkpoint))  # by identity only
        again = resident.invoke(config, first.checkpoint, record, "train")
        # The same state as a copy the session never saw: loaded afresh.
        copy = replace(first.checkpoint, **{name: np.array(getattr(first.checkpoint, name))
                                             for name in CHECKPOINT_TENSORS})
        fresh = loaded.invoke(config, copy, record, "train")
        assert arena_bytes(resident.last_backend) == arena_bytes(loaded.last_backend)
        if mode == "corpus":  # the scatter left the record's table where the loss reads it
            weights = np.frombuffer(resident.last_backend.read_tensor("weights"), np.float32)
            assert weights.tobytes() == record.dense_weights().tobytes()
        for name in CHECKPOINT_TENSORS:
            assert getattr(again.checkpoint, name).tobytes() == \
                getattr(fresh.checkpoint, name).tobytes(), name
        assert (again.loss, again.initial_loss, again.checkpoint.step) == \
            (fresh.loss, fresh.initial_loss, fresh.checkpoint.step) == (again.loss,
                                                                         again.initial_loss, 8)
        writes = resident.last_backend.writes
        # The second invocation wrote no table and not the unchanged input: only the loss.
        assert {name: writes[name] for name in (*CHECKPOINT_TENSORS, "input", "gradients")} \
            == {name: 1 for name in (*CHECKPOINT_TENSORS, "input", "gradients")}
        assert writes["training_loss"] == 2
        assert loaded.last_backend.writes["parameters"] == 1


def test_a_changed_input_is_written_and_any_other_checkpoint_loaded():
    config = BobConfig(vocab=32, prompts=1, updates=3)
    record, other = random_record(config, 1), random_record(config, 2)
    with Session(counting_choice()) as session:
        first = session.invoke(config, Checkpoint.zeros(32), record, "train")
        session.invoke(config, first.checkpoint, other, "train")
        writes = session.last_backend.writes
        assert (writes["input"], writes["parameters"]) == (2, 1)
        # Not the state the arena holds now (it moved on): loaded again.
        session.invoke(config, first.checkpoint, other, "train")
        assert (writes["input"], writes["parameters"]) == (3, 2)


def test_a_failed_invocation_leaves_nothing_resident():
    config = BobConfig(vocab=16, prompts=0, updates=2)
    record = random_record(config, 1)
    with Session(counting_choice(), Hyper(lr=1e38)) as session:
        with pytest.raises(RunFailure, match=r"became non-finite .*by step 2; the last "
                                             "good checkpoint is kept"):
            session.invoke(config, Checkpoint.zeros(16, Hyper(lr=1e38)), record, "train")
        assert session._arenas[config].checkpoint is None


def test_predict_from_a_resident_state_keeps_it():
    config = BobConfig(vocab=16, prompts=2, updates=0)
    record = random_record(config, 1)
    with Session(counting_choice()) as session:
        state = Checkpoint.zeros(16)
        session.invoke(config, state, record, "predict")
        session.invoke(config, state, record, "predict")
        # A caller's checkpoint is never taken as resident: its arrays may have changed.
        assert session.last_backend.writes["parameters"] == 2


# -- the pipeline ----------------------------------------------------------------
def test_pipelined_training_is_invoke_after_invoke():
    config = corpus_config(48, prompts=2, updates=4, schedule="fused")
    record = random_record(config, 5)
    start = Checkpoint.zeros(48, Hyper(), "corpus")
    seen = []
    with Session(counting_choice()) as session:
        runs = train(session, config, start, record, 14,
                     lambda invocation, done: seen.append((invocation.checkpoint.step, done)))
        backends = {id(b) for _, b in session._open.values()}
        assert len(backends) == 2  # 4 + 4 + 4 in one arena, the remainder 2 in another
    assert seen == [(4, 4), (8, 8), (12, 12), (14, 14)]
    state = start
    with Session(choose_backend("cpu")) as plain:
        for updates, run in zip((4, 4, 4, 2), runs, strict=True):
            copy = replace(state)  # never resident: loaded every time
            expected = plain.invoke(replace(config, updates=updates), copy, record, "train")
            for name in CHECKPOINT_TENSORS:
                assert getattr(run.checkpoint, name).tobytes() == \
                    getattr(expected.checkpoint, name).tobytes()
            assert (run.loss, run.initial_loss) == (expected.loss, expected.initial_loss)
            state = expected.checkpoint


class StreamCpu(CountingCpu):
    """The CPU backend run as a GPU stream runs: `start`, tensor writes, scalar patches and
    reads queue in order and happen only when something waits on them. `log` records the
    order in which the host asked for each, and when queued work actually ran."""

    def __init__(self, plan, *args, **kwargs):
        super().__init__(plan, *args, **kwargs)
        self.queue: list = []
        self.done = 0
        self.log: list[str] = []

    def _drain(self, upto: int) -> None:
        while self.done < upto:
            self.done += 1
            self.queue[self.done - 1]()

    def _start_submissions(self, submissions):
        self.log.append(f"start {len(self.queue)}")
        self.queue.append(lambda: self._run(submissions))

    def _wait_started(self):
        self._drain(len(self.queue))

    def write_tensor(self, name, data, offset=0):
        data = bytes(memoryview(data).cast("B"))  # the host may reuse its buffer at once
        self.queue.append(lambda: CountingCpu.write_tensor(self, name, data, offset))

    def write_tensors(self, writes):
        writes = [(name, bytes(memoryview(data).cast("B"))) for name, data in writes]
        self.queue.append(lambda: CountingCpu.write_tensors(self, writes))

    def read_tensor(self, name):
        self._drain(len(self.queue))
        return super().read_tensor(name)

    def _carry_scalar_rows(self, launches, names, dtype, words, offsets):
        words = words.copy()  # a launch already queued keeps the scalars it was given
        self.queue.append(lambda: CpuBackend._carry_scalar_rows(self, launches, names, dtype,
                                                                words, offsets))

    def begin_read(self, names):
        self.begun_reads += 1
        got: dict = {}
        self.queue.append(lambda: got.update({name: np.frombuffer(
            CpuBackend.read_tensor(self, name), np.uint8) for name in names}))
        position = len(self.queue)
        backend = self

        class Queued(ReadHandle):
            def wait(self):
                backend.log.append(f"read {position - 1}")
                backend._drain(position)
                return got
        return Queued({})


@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_the_next_invocation_is_queued_before_the_last_is_read(schedule):
    config = corpus_config(32, prompts=1, updates=3, schedule=schedule)
    record = random_record(config, 2)
    seen = []
    with Session(replace(choose_backend("cpu"), opener=StreamCpu)) as streamed, \
            Session(choose_backend("cpu")) as plain:
        got = train(streamed, config, Checkpoint.zeros(32, Hyper(), "corpus"), record, 12,
                    lambda invocation, done: seen.append(streamed.last_backend.log[-1]))
        want = train(plain, config, Checkpoint.zeros(32, Hyper(), "corpus"), record, 12)
        log = streamed.last_backend.log
    for mine, theirs in zip(got, want, strict=True):  # the bytes of the unpipelined run
        assert (mine.loss, mine.initial_loss, mine.checkpoint.step) == \
            (theirs.loss, theirs.initial_loss, theirs.checkpoint.step)
        for name in CHECKPOINT_TENSORS:
            assert getattr(mine.checkpoint, name).tobytes() == \
                getattr(theirs.checkpoint, name).tobytes()
    # Each read is asked for only once the next invocation is started (queued after it).
    starts = [entry for entry in log if entry.startswith("start")]
    reads = [entry for entry in log if entry.startswith("read")]
    assert len(starts) == len(reads) == 4  # one arena: 12 updates, 3 per invocation
    for k in range(3):
        assert log.index(starts[k + 1]) < log.index(reads[k])
        assert int(starts[k + 1].split()[1]) > int(reads[k].split()[1])  # queued behind it
    assert seen == reads  # each callback after its own read


def test_a_failed_invocation_abandons_the_next_and_forgets_the_arena(monkeypatch):
    config = BobConfig(vocab=16, prompts=0, updates=2)
    record = random_record(config, 1)
    from bob.host import session as module
    checked, calls = module.require_finite_counts, [0]

    def finite_twice(health, step):
        calls[0] += 1
        if calls[0] == 3:
            raise RunFailure(f"the table became non-finite by step {step}")
        checked(health, step)

    monkeypatch.setattr(module, "require_finite_counts", finite_twice)
    kept = []
    with Session(replace(choose_backend("cpu"), opener=StreamCpu)) as session:
        with pytest.raises(RunFailure, match="by step 6"):
            train(session, config, Checkpoint.zeros(16), record, 10,
                  lambda invocation, done: kept.append(invocation.checkpoint))
        backend = session.last_backend
        assert backend.done == len(backend.queue)  # the started invocation 4 was waited for
        assert not session.holds(config, kept[-1])  # the arena holds invocation 4's state
        again = session.invoke(config, kept[-1], record, "train")  # loaded afresh
    with Session(choose_backend("cpu")) as fresh:
        want = fresh.invoke(config, kept[-1], record, "train")
    assert again.checkpoint.parameters.tobytes() == want.checkpoint.parameters.tobytes()


def test_the_pipeline_loads_the_tables_once():
    config = BobConfig(vocab=32, prompts=0, updates=3)
    record = random_record(config, 2)
    with Session(counting_choice()) as session:
        train(session, config, Checkpoint.zeros(32), record, 15)
        backend = session.last_backend
        assert backend.writes["parameters"] == 1 and backend.writes["input"] == 1
        assert backend.begun_reads == 5


def test_a_non_finite_table_stops_training_after_the_last_good_callback(monkeypatch):
    config = BobConfig(vocab=16, prompts=0, updates=2)
    record = random_record(config, 1)
    seen = []
    calls = [0]
    from bob.host import session as module
    checked = module.require_finite_counts

    def finite_twice(health, step):
        calls[0] += 1
        if calls[0] > 2:
            raise RunFailure(f"the table became non-finite by step {step}")
        checked(health, step)

    monkeypatch.setattr(module, "require_finite_counts", finite_twice)
    with Session(choose_backend("cpu")) as session, \
            pytest.raises(RunFailure, match="by step 6"):
        train(session, config, Checkpoint.zeros(16), record, 10,
              lambda invocation, done: seen.append(done))
    assert seen == [2, 4]


def test_a_resident_arena_clears_the_health_counts():
    """The health check adds to its counts: every invocation, resident or not, zeroes them
    first, so a finite table is never taken for a non-finite one left over."""
    config = BobConfig(vocab=16, prompts=0, updates=2)
    record = random_record(config, 1)
    with Session(counting_choice()) as session:
        state = Checkpoint.zeros(16)
        for _ in range(4):
            state = session.invoke(config, state, record, "train").checkpoint
        writes = session.last_backend.writes
        assert writes["health"] == 4 and writes["parameters"] == 1


def test_the_default_read_is_a_snapshot():
    config = BobConfig(vocab=16, prompts=0, updates=2)
    record = random_record(config, 1)
    with Session(choose_backend("cpu")) as session:
        session.invoke(config, Checkpoint.zeros(16), record, "train")
        backend = session.last_backend
        handle = backend.begin_read(["parameters"])
        assert isinstance(handle, ReadHandle)
        before = backend.read_tensor("parameters")
        backend.run(range(backend.plan.submission_count))  # moves the table on
        assert backend.read_tensor("parameters") != before
        assert handle.wait()["parameters"].tobytes() == before


# -- scalars in one pass -----------------------------------------------------------
def test_set_scalars_many_gives_set_scalars_bytes():
    config = BobConfig(vocab=32, prompts=1, updates=5)
    hyper = Hyper(lr=0.03)
    table = adam_scalar_table(hyper, 11, 5).view(np.uint32)[:, :len(ADAM_SCALAR_NAMES)]
    launches = [config.adamw_launch(k) for k in range(5)]
    with Session(choose_backend("cpu"), hyper) as one, Session(choose_backend("cpu"),
                                                               hyper) as many:
        a, b = one._backend_for(config)[1], many._backend_for(config)[1]
        for launch, row in zip(launches, table.tolist(), strict=True):
            a.set_scalars(launch, {name: Scalar("f32", word)
                                   for name, word in zip(ADAM_SCALAR_NAMES, row, strict=True)})
        b.set_scalars_many(launches, ADAM_SCALAR_NAMES, table)
        for launch in range(a.plan.launch_count):
            assert a.parameter_block(launch) == b.parameter_block(launch), launch
            assert a._arguments[launch] == b._arguments[launch]
            assert {type(v) for v in b._arguments[launch].values()} == \
                {type(v) for v in a._arguments[launch].values()}


def test_rows_held_back_from_the_host_blocks_keep_the_order_of_every_patch(monkeypatch):
    """set_scalars_many's rows reach the host copies of the blocks only when a block is
    asked for; whatever the interleaving, the bytes are those of patching in order."""
    from bob.backends import base

    monkeypatch.setattr(base, "MAX_PENDING_ROWS", 3)
    config = BobConfig(vocab=16, prompts=0, updates=4)
    launches = [config.adamw_launch(k) for k in range(4)]
    rng = np.random.default_rng(5)
    names = ADAM_SCALAR_NAMES
    with Session(choose_backend("cpu")) as one, Session(choose_backend("cpu")) as many:
        a, b = one._backend_for(config)[1], many._backend_for(config)[1]
        for round_ in range(9):
            chosen = launches if round_ % 3 else launches[round_ % 4:][:2]  # keys alternate
            words = rng.integers(0, 2**32, (len(chosen), len(names)), np.uint32)
            for launch, row in zip(chosen, words.tolist(), strict=True):
                a.set_scalars(launch, {n: Scalar("f32", w) for n, w in zip(names, row,
                                                                           strict=True)})
            b.set_scalars_many(chosen, names, words)
            assert len(b._pending_rows) <= 3
            if round_ == 4:  # a single patch between batches lands on the rows before it
                single = {"decay": Scalar("f32", 0x3F000000)}
                a.set_scalars(launches[1], single)
                b.set_scalars(launches[1], single)
        words[:] = 0  # the caller's array is its own again: the rows were copied
        for launch in range(a.plan.launch_count):
            assert a.parameter_block(launch) == b.parameter_block(launch), launch
        assert b._pending_rows == []


def test_set_scalars_many_refuses_what_set_scalars_refuses():
    config = BobConfig(vocab=32, prompts=0, updates=2)
    with Session(choose_backend("cpu")) as session:
        backend = session._backend_for(config)[1]
        before = [backend.parameter_block(i) for i in range(backend.plan.launch_count)]
        with pytest.raises(KeyError, match="no patchable scalar argument 'count'"):
            backend.set_scalars_many([config.adamw_launch(0)], ["count"],
                                     np.zeros((1, 1), np.uint32), "u32")
        with pytest.raises(TypeError, match="is f32, not u32"):
            backend.set_scalars_many([config.adamw_launch(0)], ["decay"],
                                     np.zeros((1, 1), np.uint32), "u32")
        with pytest.raises(ValueError, match="must be 2 x 1, not 1 x 1"):
            backend.set_scalars_many([2, 4], ["decay"], np.zeros((1, 1), np.uint32))
        assert before == [backend.parameter_block(i) for i in range(backend.plan.launch_count)]


def test_the_seed_schedule_patches_every_update_in_one_call(monkeypatch):
    config = BobConfig(vocab=16, prompts=0, updates=7)
    calls = []
    original = CpuBackend.set_scalars_many

    def counted(self, launches, names, words, dtype="f32"):
        calls.append(len(launches))
        original(self, launches, names, words, dtype)

    monkeypatch.setattr(CpuBackend, "set_scalars_many", counted)
    monkeypatch.setattr(CpuBackend, "set_scalars", lambda *a: pytest.fail("one by one"))
    with Session(choose_backend("cpu")) as session:
        session.invoke(config, Checkpoint.zeros(16), random_record(config, 1), "train")
    assert calls == [7]


# -- the background writer ------------------------------------------------------------
def test_the_writer_runs_jobs_in_order_and_reports_a_failure_once():
    done = []
    writer = BackgroundWriter()
    for i in range(5):
        writer.submit(lambda i=i: done.append(i))
    writer.close()
    assert done == [0, 1, 2, 3, 4]

    def fail():
        raise RunFailure("disk full")

    writer = BackgroundWriter()
    writer.submit(fail)
    writer._thread.join(0.01)
    time.sleep(0.05)
    with pytest.raises(RunFailure, match="disk full"):
        writer.submit(lambda: done.append("late"))
    writer.close()  # already reported: not raised twice
    assert done[-1] == 4


def test_the_writer_wraps_an_unexpected_error_in_one_line():
    writer = BackgroundWriter()

    def broken():
        raise OSError("No space left on device\nmore")

    writer.submit(broken)
    writer.submit(lambda: pytest.fail("a job after a failure must be dropped"))
    with pytest.raises(RunFailure) as caught:
        writer.close()
    assert str(caught.value) == "saving the checkpoint failed: No space left on device"
    assert isinstance(caught.value, BobError)


def test_a_superseding_job_replaces_the_waiting_one_never_the_one_begun():
    started, release = threading.Event(), threading.Event()
    done = []
    writer = BackgroundWriter()
    writer.submit(lambda: (started.set(), release.wait(5), done.append(0)))
    assert started.wait(5)
    for i in range(1, 5):
        writer.submit(lambda i=i: done.append(i), supersede=True)
    release.set()
    writer.close()
    assert done == [0, 4] and writer.superseded == 3  # the begun one and the newest


def test_a_kept_job_is_never_replaced_by_a_superseding_one():
    started, release, finish_best = threading.Event(), threading.Event(), threading.Event()
    done = []
    writer = BackgroundWriter()
    writer.submit(lambda: (started.set(), release.wait(5), done.append(0)))
    assert started.wait(5)
    # Waits behind the one begun, then runs until finish_best.
    writer.submit(lambda: (finish_best.wait(5), done.append("best")), keep=True)
    releaser = threading.Timer(0.2, release.set)
    releaser.start()
    writer.submit(lambda: done.append(1), supersede=True)  # waits for room: best is kept
    writer.submit(lambda: done.append(2), supersede=True)  # replaces 1, waiting
    finish_best.set()
    writer.close()
    releaser.join()
    assert done == [0, "best", 2] and writer.superseded == 1  # 1 replaced, the kept one not


def test_the_writer_runs_beside_the_caller():
    started, release = threading.Event(), threading.Event()
    writer = BackgroundWriter()
    writer.submit(lambda: (started.set(), release.wait(5)))
    assert started.wait(5)  # the caller is free while the job runs
    release.set()
    writer.close()


def cli_train(*argv: str) -> int:
    return main(["train", "--backend", "cpu", "-N", "3", *argv])


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "a.txt"
    path.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 10)
    return path


def test_a_failing_save_is_one_line_and_keeps_the_previous_file(tmp_path, text, capsys,
                                                                 monkeypatch):
    path = tmp_path / "bob.safetensors"
    saves = [0]
    saved: list[int] = []  # the steps saved (a save still waiting may be superseded)
    original = Checkpoint.save

    def second_fails(self, where):
        saves[0] += 1
        if saves[0] == 2:
            raise RunFailure(f"{where}: cannot write (injected)")
        original(self, where)
        saved.append(self.step)

    monkeypatch.setattr(Checkpoint, "save", second_fails)
    assert cli_train("--text", str(text), "--steps", "30", "-c", str(path), "--json") == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # no report after a failure
    lines = captured.err.strip().splitlines()
    assert lines[-1] == f"bob: {path}: cannot write (injected)", lines
    assert "Traceback" not in captured.err
    assert len(saved) == 1 and Checkpoint.load(path).step == saved[0]  # the first save's
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "bob.safetensors"]  # no temp, no lock
    assert saves[0] == 2  # nothing saved after the failure


def test_a_checkpoint_is_the_state_after_its_invocation(tmp_path, text):
    path = tmp_path / "bob.safetensors"
    states = []
    original = Checkpoint.save

    def keep(self, where):
        original(self, where)
        states.append(Checkpoint.load(where))

    try:
        Checkpoint.save = keep
        report = api.train([str(text)], steps=10, checkpoint=str(path), backend="cpu",
                           updates_per_invocation=4)
    finally:
        Checkpoint.save = original
    # A save still waiting when a newer checkpoint comes is dropped (the writer's
    # supersede): the last is always saved, and each saved one is its invocation's state.
    steps = [s.step for s in states]
    assert steps[-1] == 10 and steps == sorted(set(steps)) and set(steps) <= {4, 8, 10}
    data = api.training_data([str(text)])
    config = BobConfig(prompts=0, updates=4, mode="corpus", pairs=data.record.pairs)
    state = Checkpoint.zeros(256, Hyper(), "corpus")
    expected = {}
    with Session(choose_backend("cpu")) as session:
        for updates in (4, 4, 2):
            state = session.invoke(replace(config, updates=updates), replace(state),
                                   data.record, "train").checkpoint
            expected[state.step] = state
    for saved in states:
        for name in CHECKPOINT_TENSORS:
            assert getattr(saved, name).tobytes() == \
                getattr(expected[saved.step], name).tobytes()
    assert report.global_step == 10


def test_a_killed_run_leaves_a_whole_checkpoint(tmp_path, text):
    """SIGKILL at a moment while checkpoints are being replaced: the file on disk loads and
    is exactly the state after its invocation."""
    path = tmp_path / "bob.safetensors"
    process = subprocess.Popen(
        [sys.executable, "-m", "bob.cli.main", "train", "--text", str(text), "--backend",
         "cpu", "-N", "2", "--steps", "1000000", "-c", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "src")})
    try:
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.02)
        time.sleep(0.7)  # several saves later, somewhere inside one
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    saved = Checkpoint.load(path)
    assert saved.step >= 2 and saved.step % 2 == 0
    data = api.training_data([str(text)])
    with Session(choose_backend("cpu")) as session:
        expected = train(session, BobConfig(prompts=0, updates=2, mode="corpus",
                                            pairs=data.record.pairs),
                         Checkpoint.zeros(256, Hyper(), "corpus"), data.record,
                         saved.step)[-1].checkpoint
    for name in CHECKPOINT_TENSORS:
        assert getattr(saved, name).tobytes() == getattr(expected, name).tobytes(), name


# -- train --json: wall time and updates per second ------------------------------------
def test_train_json_reports_wall_seconds_and_updates_per_second(tmp_path, text, capsys):
    path = tmp_path / "bob.safetensors"
    begun = time.perf_counter()
    assert cli_train("--text", str(text), "--steps", "9", "-c", str(path), "--json") == 0
    elapsed = time.perf_counter() - begun
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert 0 < summary["wall_seconds"] <= elapsed
    assert summary["updates_per_second"] == pytest.approx(9 / summary["wall_seconds"])
    # The table (on stderr with --json) shows the same figures.
    assert f"{summary['wall_seconds']:.2f} s, {summary['updates_per_second']:,.1f} updates/s" \
        in captured.err
    assert cli_train("--text", str(text), "--steps", "0", "-c", str(path), "--resume",
                     "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["updates_per_second"] == 0.0 and summary["wall_seconds"] > 0


def test_train_table_shows_updates_per_second(tmp_path, text, capsys):
    assert cli_train("--text", str(text), "--steps", "6", "-c",
                     str(tmp_path / "bob.safetensors")) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "updates/s" in line]
    assert len(rows) == 1 and rows[0].startswith("│ wall time ")
    seconds, rate = re.search(r"([\d.]+) s, ([\d,.]+) updates/s", rows[0]).groups()
    shown_seconds, rate = float(seconds), float(rate.replace(",", ""))
    # 6 updates over the wall time, which the row shows rounded to 10 ms
    assert 6 / (shown_seconds + 0.005) - 0.05 <= rate <= 6 / max(shown_seconds - 0.005, 1e-9) + 0.05


def test_keep_all_false_holds_only_the_last_invocation():
    config = BobConfig(vocab=16, prompts=0, updates=3)
    record = random_record(config, 4)
    seen = []
    with Session(choose_backend("cpu")) as session:
        every = train(session, config, Checkpoint.zeros(16), record, 10)
        (last,) = train(session, config, Checkpoint.zeros(16), record, 10,
                        lambda invocation, done: seen.append(invocation), keep_all=False)
    assert [i.checkpoint.step for i in seen] == [i.checkpoint.step for i in every] == [3, 6, 9,
                                                                                        10]
    assert last is seen[-1]
    assert last.checkpoint.parameters.tobytes() == every[-1].checkpoint.parameters.tobytes()
    assert seen[0].initial_loss == every[0].initial_loss


class ScalarWatchingCpu(CpuBackend):
    """The CPU backend, keeping every AdamW table written to any of its arenas."""

    tables: list[bytes] = []

    def write_tensors(self, writes):
        self.tables += [bytes(data) for name, data in writes if name == "adam_scalars"]
        super().write_tensors(writes)


def test_a_training_run_computes_adam_rows_ahead_and_writes_each_invocation_its_own(
        monkeypatch):
    """Rows for the run's coming invocations are computed with the first that needs them
    (at most SCALAR_ROWS_AHEAD at once); each invocation still gets exactly its own."""
    import bob.host.session as session_module

    computed: list[tuple[int, int]] = []
    monkeypatch.setattr(session_module, "SCALAR_ROWS_AHEAD", 25)
    monkeypatch.setattr(session_module, "adam_scalar_table", lambda hyper, first, count: (
        computed.append((first, count)) or adam_scalar_table(hyper, first, count)))
    config = BobConfig(vocab=16, prompts=0, updates=10, schedule="fused")
    record = random_record(config, 4)
    start = Checkpoint.zeros(16, Hyper(), "hard")
    with Session(replace(choose_backend("cpu"), opener=ScalarWatchingCpu)) as ahead, \
            Session(choose_backend("cpu")) as alone:
        monkeypatch.setattr(ScalarWatchingCpu, "tables", [])
        got = train(ahead, config, start, record, 45)  # 10 x 4 in one arena, 5 in another
        tables = ScalarWatchingCpu.tables
        # Steps 1-25 with the first invocation, 21-45 with the third; 46 never is.
        assert computed == [(1, 25), (21, 25)]
        want, state = [], start
        for count in (10, 10, 10, 10, 5):  # one invocation at a time: nothing ahead
            want.append(alone.invoke(replace(config, updates=count), state, record, "train"))
            state = want[-1].checkpoint
        assert computed[2:] == [(1, 10), (11, 10), (21, 10), (31, 10), (41, 5)]
    assert tables == [adam_scalar_table(Hyper(), first, count).tobytes()
                      for first, count in ((1, 10), (11, 10), (21, 10), (31, 10), (41, 5))]
    for mine, theirs in zip(got, want, strict=True):
        for name in CHECKPOINT_TENSORS:
            assert getattr(mine.checkpoint, name).tobytes() == \
                getattr(theirs.checkpoint, name).tobytes(), (name, mine.checkpoint.step)
