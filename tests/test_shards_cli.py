"""Row shards from the command line: `bob train --shards/--workers/--device-memory/--gpus/
--dask`, shards side by side on Dask workers (a lost worker ends the run in one line, the
last checkpoint intact), `bob plan --shards/--device-memory`, and the GPUs `bob doctor`
lists."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from bob.cli.main import main
from bob.errors import RunFailure
from bob.host import doctor, sharded
from bob.host.api import run_training
from bob.host.training import TrainRequest
from bob.plan import SM86
from bob.program.bob import shard_boundaries
from bob.records.shards import open_checkpoint
from conftest import contents, train_cpu

distributed = pytest.importorskip("distributed")


def _tables(checkpoint: Path):
    return open_checkpoint(checkpoint).load()


def _index(checkpoint: Path) -> dict:
    return json.loads(Path(f"{checkpoint}.index.json").read_text())


def test_train_shards_flag_gives_the_one_piece_bytes_and_says_so(tmp_path, text, capsys):
    assert train_cpu("--text", str(text), "--steps", "10", "-c", str(tmp_path / "one.st")) == 0
    capsys.readouterr()
    assert train_cpu("--text", str(text), "--steps", "10", "-c", str(tmp_path / "sh.st"),
                     "--shards", "4", "--json") == 0
    out = capsys.readouterr()
    summary = json.loads(out.out)
    assert summary["shards"] == [list(rows) for rows in shard_boundaries(256, 4)]
    assert summary["shards_ran"] == "in turn, in this process"
    assert summary["checkpoint"] == str(tmp_path / "sh.st.index.json")
    assert "4, in turn, in this process" in out.err  # the table's row shards line
    assert _tables(tmp_path / "sh.st") == _tables(tmp_path / "one.st")


def test_device_memory_picks_the_fewest_shards_that_fit(tmp_path, text):
    one_shard = sharded.shard_arena_bytes(256, "corpus", 5, (0, 256), SM86)
    two_shards = sharded.largest_shard_bytes(256, "corpus", 5, 2, SM86)
    assert two_shards < one_shard
    assert train_cpu("--text", str(text), "--steps", "5", "-c", str(tmp_path / "sh.st"),
                     "--device-memory", str(one_shard - 1)) == 0
    assert [entry["rows"] for entry in _index(tmp_path / "sh.st")["metadata"]["shards"]] \
        == [[0, 128], [128, 256]]


@pytest.mark.parametrize("argv, message", [
    (["--device-memory", "8X"], "Invalid value for '--device-memory': '8X' is not a size"),
    (["--device-memory", "10"], "a shard of one row needs"),
    (["--gpus", "a,b"], "'a,b' is not GPU numbers separated by commas"),
    (["--gpus", "0,0"], "--gpus must list distinct GPU numbers"),
    (["--gpus", "0"], "--gpus runs shards on GPUs; --backend cpu runs none"),
    (["--shards", "0"], "--shards must be an integer of at least 1"),
    (["--shards", "257"], r"--shards must be an integer in [1, V=256]"),
    (["--workers", "2", "--gpus", "0,1"], "--gpus runs a worker per GPU listed"),
    (["--shards", "2", "--schedule", "fused"], "do not take --schedule fused"),
    (["--shards", "2", "--keep-best", "--val", "VAL"], "do not take validation data"),
])
def test_bad_shard_flags_are_one_line_exit_2_and_write_nothing(tmp_path, text, capsys, argv,
                                                               message):
    argv = [str(text) if word == "VAL" else word for word in argv]
    before = contents(tmp_path)
    status = train_cpu("--text", str(text), "--steps", "5", "-c", str(tmp_path / "sh.st"),
                       *argv)
    err = capsys.readouterr().err
    assert status == 2
    assert message in err and err.count("\n") == 1, err
    assert contents(tmp_path) == before


def test_four_shards_on_dask_workers_give_the_one_piece_bytes(tmp_path, text, capsys):
    assert train_cpu("--text", str(text), "--steps", "10", "-c", str(tmp_path / "one.st")) == 0
    assert train_cpu("--text", str(text), "--steps", "10", "-c", str(tmp_path / "sh.st"),
                     "--workers", "4") == 0
    out = capsys.readouterr()
    assert "4, side by side on 4 Dask worker processes" in out.out  # the table's line
    assert "distributed." not in out.err  # Dask's own log lines are kept off Bob's stderr
    assert _tables(tmp_path / "sh.st") == _tables(tmp_path / "one.st")
    assert len(_index(tmp_path / "sh.st")["metadata"]["shards"]) == 4


class _KillShard(distributed.WorkerPlugin):
    """Ends the worker process (as a kill would) when it starts running this task."""

    def __init__(self, key: str):
        self.key = key

    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and key == self.key:
            os._exit(9)


def test_a_worker_lost_mid_invocation_is_one_line_and_the_last_checkpoint_stays(
        tmp_path, text, monkeypatch):
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers unpickle it
    checkpoint = tmp_path / "sh.st"
    request = TrainRequest(texts=(str(text),), updates_per_invocation=5, backend="cpu",
                           checkpoint=str(checkpoint), steps=5, workers=2, shards=4)
    run_training(request)
    kept = _index(checkpoint)
    kept_files = sorted(p.name for p in tmp_path.iterdir())
    tables = _tables(checkpoint)

    run = sharded.DaskShards.__call__

    def with_a_kill(self, tasks):  # shard 3 of the next invocation (after step 5) dies
        self.client.register_plugin(_KillShard("bob-shard-5-2"))
        return run(self, tasks)

    monkeypatch.setattr(sharded.DaskShards, "__call__", with_a_kill)
    with pytest.raises(RunFailure) as lost:
        run_training(TrainRequest(texts=(str(text),), updates_per_invocation=5,
                                  backend="cpu", checkpoint=str(checkpoint), steps=5,
                                  resume=True, workers=2, shards=4))
    message = str(lost.value)
    assert "\n" not in message
    assert re.fullmatch(r"Dask worker tcp://\S+ was lost with shard [1-4] of 4 \(rows "
                        r"\[\d+, \d+\)\) of the updates after step 5 on it; the checkpoint "
                        r"at step 5 is kept", message), message
    assert _index(checkpoint) == kept  # the index still names step 5's shards
    assert sorted(p.name for p in tmp_path.iterdir()) == kept_files  # no step-10 shard left
    assert _tables(checkpoint) == tables


def test_dask_address_that_answers_nothing_is_one_line(tmp_path, text, capsys):
    before = contents(tmp_path)
    status = train_cpu("--text", str(text), "--steps", "5", "-c", str(tmp_path / "sh.st"),
                       "--shards", "2", "--dask", "tcp://127.0.0.1:9")
    # The connection times out after 10 s: a heartbeat line may come first.
    err = "".join(line for line in capsys.readouterr().err.splitlines(keepends=True)
                  if not line.startswith("... "))
    assert status == 2 and err.count("\n") == 1, err
    assert "--dask tcp://127.0.0.1:9: cannot reach the scheduler" in err
    assert contents(tmp_path) == before


# -- bob plan --------------------------------------------------------------------------
def test_plan_shows_the_shards_and_the_widest_plan(capsys):
    assert main(["plan", "-V", "1000", "-N", "5", "--shards", "3"]) == 0
    out = capsys.readouterr().out
    assert "Row shards: 3 of V=1000 (hard, N=5)" in out
    for rows in ("[0, 333)", "[333, 666)", "[666, 1000)"):
        assert rows in out
    assert "The plan of shard 3, rows [666, 1000)" in out
    assert "Virtual address map" in out and "Launches" in out


def test_plan_device_memory_as_json_names_each_shard(capsys):
    one_shard = sharded.shard_arena_bytes(1000, "corpus", 5, (0, 1000), SM86)
    assert main(["plan", "-V", "1000", "-N", "5", "--mode", "corpus", "--device-memory",
                 str(one_shard - 1), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [shard["rows"] for shard in listed["shards"]] == [[0, 500], [500, 1000]]
    assert all(shard["certified"] and shard["arena_bytes"] < one_shard
               for shard in listed["shards"])


@pytest.mark.parametrize("argv, message", [
    (["--shards", "2", "--disasm"], "--disasm and --emit show one plan's command stream"),
    (["--shards", "2", "--schedule", "fused"], "row shards run the seed schedule"),
    (["--shards", "0"], "--shards must be an integer of at least 1"),
    (["--device-memory", "100"], "a shard of one row needs"),
])
def test_plan_shard_refusals_are_one_line(tmp_path, capsys, argv, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


# -- bob doctor ------------------------------------------------------------------------
def test_doctor_lists_the_gpus_the_driver_sees(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "list_gpus", lambda: ([
        {"gpu": 0, "name": "NVIDIA H200", "arch": "sm_90", "memory_bytes": 150_000_000_000,
         "multiprocessors": 132},
        {"gpu": 1, "name": "NVIDIA H200", "arch": "sm_90", "memory_bytes": 150_000_000_000,
         "multiprocessors": 132}], "2 GPUs seen by the CUDA driver"))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "2 GPUs seen by the CUDA driver (bob train --gpus numbers them so):" in out
    assert out.count("NVIDIA H200") == 2 and "139.7 GiB" in out
    assert main(["doctor", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [gpu["gpu"] for gpu in listed["gpus"]] == [0, 1]


def test_doctor_says_why_no_gpu_is_listed(monkeypatch, capsys):
    from bob.backends.cuda import driver

    def no_driver():
        raise RuntimeError("no NVIDIA driver library (libcuda.so)")

    monkeypatch.setattr(driver, "initialize", no_driver)
    gpus, note = doctor.list_gpus()
    assert gpus == [] and note == "no GPU listed: no NVIDIA driver library (libcuda.so)"
    monkeypatch.undo()  # the backends' rows need the real driver module
    monkeypatch.setattr(doctor, "list_gpus", lambda: (gpus, note))
    assert main(["doctor"]) == 0
    assert "no GPU listed: no NVIDIA driver library (libcuda.so)" in capsys.readouterr().out


# -- stops -----------------------------------------------------------------------------
def test_a_first_stop_commits_the_invocation_in_flight_then_ends_in_one_line(tmp_path, text,
                                                                            monkeypatch):
    import signal

    from bob.errors import Interrupted
    from bob.host import stops

    asked: list[int] = []
    real_run_shard = sharded.run_shard

    def signalled(task):  # SIGTERM arrives while the first invocation's third shard runs
        if task.first_step == 0 and task.index == 2:
            asked.append(signal.SIGTERM)
        return real_run_shard(task)

    monkeypatch.setattr(sharded, "run_shard", signalled)
    monkeypatch.setattr(stops, "stop_requested", lambda: asked[0] if asked else None)
    checkpoint = tmp_path / "sh.st"
    with pytest.raises(Interrupted) as stopped:
        run_training(TrainRequest(texts=(str(text),), updates_per_invocation=5,
                                  backend="cpu", checkpoint=str(checkpoint), steps=15,
                                  shards=4))
    assert stopped.value.exit_status == 143
    assert str(stopped.value) == "interrupted at update 5; checkpoint at update 5 kept"
    assert _index(checkpoint)["metadata"]["step"] == "5"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("sh.st.step")) \
        == [f"sh.st.step5-0000{i}-of-00004.safetensors" for i in range(1, 5)]


@pytest.mark.parametrize("resumed", [False, True])
def test_a_stop_at_once_removes_the_invocations_files_and_names_what_is_kept(
        tmp_path, text, monkeypatch, resumed):
    import signal

    from bob.errors import Interrupted

    checkpoint = tmp_path / "sh.st"
    fields = dict(texts=(str(text),), updates_per_invocation=5, backend="cpu",
                  checkpoint=str(checkpoint), shards=4)
    if resumed:
        run_training(TrainRequest(steps=5, **fields))
    before = contents(tmp_path)
    real_run_shard = sharded.run_shard

    def stopped_at_once(task):  # a second signal: raised in the middle of shard 3
        if task.index == 2:
            raise Interrupted(signal.SIGINT)
        return real_run_shard(task)

    monkeypatch.setattr(sharded, "run_shard", stopped_at_once)
    with pytest.raises(Interrupted) as stopped:
        run_training(TrainRequest(steps=10, resume=resumed, **fields))
    assert stopped.value.exit_status == 130
    if resumed:
        assert str(stopped.value) == "interrupted at update 10; checkpoint at update 5 kept"
    else:
        assert str(stopped.value) == ("interrupted at update 5; no checkpoint written by "
                                      "this run")
    assert contents(tmp_path) == before  # the shards of the invocation stopped are gone
