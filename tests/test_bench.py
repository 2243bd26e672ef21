"""`bob bench` on the CPU at tiny sizes: well-formed rows, and contenders that train the same thing.

    .venv/bin/python -m pytest -q tests/test_bench.py

No test asserts a time: timings are for reading, never for gates.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bob.backends import choose_backend
from bob.cli import bench_cmd
from bob.cli.main import cli, main
from bob.config import Hyper
from bob.host.check import random_record
from bob.host.session import Session
from bob.program.bob import BobConfig, typical_pairs
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint
from dev.bench import bench_tokens
from dev.bench.measurement import bob_configs, measure_peer
from dev.bench.peers import (
    NumpyPeer,
    Peer,
    Unavailable,
    bench_targets,
    numpy_corpus_objective,
    numpy_corpus_train,
    numpy_objective,
    numpy_train,
    out_of_memory,
    require_room,
)
from dev.bench.processes import run_process
from dev.bench.suite import run_bench
from dev.bench.tables import BYTES_PER_PARAMETER, DEVICES, TARGET_SEED, BenchTable, Row
from dev.bench.workload import bench_workload, token_corpus, zipf_tokens

BOB_ROWS = ("bob cpu invocation", "bob cpu run", "bob cpu train steady invocation",
            "bob cpu train command")
HOST_ROWS = ("adam_scalars", "set_scalars", "load", "collect")


def _row(table: BenchTable, name: str) -> Row:
    matches = [row for row in table.rows if row.contender == name]
    assert len(matches) == 1, f"expected one row {name!r} in {[r.contender for r in table.rows]}"
    return matches[0]


def test_cpu_bench_produces_well_formed_rows() -> None:
    report = run_bench(("cpu",), (8,), updates=3, repeats=2)
    (table,) = report.tables
    assert (table.device, table.vocab, table.updates, table.repeats) == ("cpu", 8, 3, 2)
    names = [row.contender for row in table.rows]
    for name in (*BOB_ROWS, "numpy loop"):
        assert name in names
    for piece in HOST_ROWS:
        assert any(piece in name and name.startswith("bob cpu host") for name in names), piece
    for row in table.rows:
        if row.error is not None:  # only a missing package may skip a peer; nothing fails
            assert row.kind == "peer" and row.error.startswith("skipped: "), row
            continue
        assert row.updates == 3
        assert len(row.samples) == 2 and all(s > 0 for s in row.samples), row
        assert row.seconds is not None and min(row.samples) <= row.seconds <= max(row.samples)
        assert row.us_per_update is not None and math.isfinite(row.us_per_update)
        if row.kind in ("bob", "peer"):
            assert row.loss is not None and math.isfinite(row.loss)
            ratio = table.ratio(row, "run")
            assert ratio is not None and ratio > 0
        else:
            assert table.ratio(row, "run") is None
    assert table.ratio(_row(table, "bob cpu run"), "run") == 1.0
    # Every way of training the same N updates from zero reaches the same loss.
    losses = {_row(table, name).loss for name in BOB_ROWS}
    assert len(losses) == 1, losses
    assert not table.shows_bandwidth  # V = 8 lives in the caches
    assert not report.bob_failed


def test_report_json_is_complete() -> None:
    report = run_bench(("cpu",), (4,), updates=2, repeats=1)
    document = json.loads(json.dumps(report.to_json()))
    assert document["format"] == "bob-bench"
    assert document["bytes_per_parameter"] == BYTES_PER_PARAMETER == 24
    assert document["hyper"] == {"lr": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                                 "weight_decay": 0.01}
    (table,) = document["tables"]
    keys = {"contender", "kind", "updates", "seconds", "samples", "us_per_update", "spread",
            "gb_per_s", "ratio_to_bob_run", "ratio_to_bob_invocation", "ratio_to_bob_command",
            "loss", "note", "error", "whole_process", "peak_rss_bytes"}
    for row in table["rows"]:
        assert set(row) == keys


def test_contenders_end_at_the_same_loss() -> None:
    report = run_bench(("cpu",), (16,), updates=10, repeats=1)
    (table,) = report.tables
    bob = _row(table, "bob cpu invocation").loss
    assert bob is not None
    for row in table.rows:
        if row.loss is not None:
            assert row.loss == pytest.approx(bob, rel=1e-4), row.contender


def test_numpy_loop_follows_bobs_trajectory() -> None:
    """The NumPy contender computes the objective Bob computes, update after update."""
    vocab, steps, hyper = 16, 40, Hyper()
    targets = bench_targets(vocab)
    record = InputRecord.hard(targets)
    checkpoint = Checkpoint.zeros(vocab, hyper)
    config = BobConfig(vocab=vocab, prompts=0, updates=1)
    bob = []
    with Session(choose_backend("cpu"), hyper) as session:
        for _ in range(steps):
            invocation = session.invoke(config, checkpoint, record, "train")
            bob.append(invocation.initial_loss)
            checkpoint = invocation.checkpoint
        bob.append(invocation.loss)

    w, m, v = (np.zeros((vocab, vocab), np.float32) for _ in range(3))
    plain = numpy_train(w, m, v, targets, steps, hyper)
    plain.append(numpy_objective(w, targets))

    assert bob[0] == pytest.approx(math.log(vocab), rel=1e-6)
    assert bob[-1] < 0.5 * bob[0]  # it learned
    np.testing.assert_allclose(plain, bob, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(w, checkpoint.parameters, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m, checkpoint.first_moment, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(v, checkpoint.second_moment, rtol=1e-4, atol=1e-10)


def test_numpy_loop_continues_from_a_step() -> None:
    """first_step carries the bias correction: 2 + 3 updates equal 5."""
    vocab, targets = 8, bench_targets(8)
    whole = [np.zeros((vocab, vocab), np.float32) for _ in range(3)]
    split = [np.zeros((vocab, vocab), np.float32) for _ in range(3)]
    numpy_train(*whole, targets, 5)
    numpy_train(*split, targets, 2)
    numpy_train(*split, targets, 3, first_step=3)
    for a, b in zip(whole, split, strict=True):
        np.testing.assert_array_equal(a, b)


def test_numpy_corpus_loop_follows_bobs_trajectory() -> None:
    """The corpus contender computes Bob's corpus objective, update after update, on the
    sparse record's weights made dense."""
    vocab, steps, hyper = 16, 30, Hyper()
    config = BobConfig(vocab=vocab, prompts=0, updates=1, mode="corpus",
                       pairs=typical_pairs(vocab) // 4)
    record = random_record(config, TARGET_SEED)
    checkpoint = Checkpoint.zeros(vocab, hyper, "corpus")
    bob = []
    with Session(choose_backend("cpu"), hyper) as session:
        for _ in range(steps):
            invocation = session.invoke(config, checkpoint, record, "train")
            bob.append(invocation.initial_loss)
            checkpoint = invocation.checkpoint
        bob.append(invocation.loss)

    weights = record.dense_weights()
    w, m, v = (np.zeros((vocab, vocab), np.float32) for _ in range(3))
    plain = numpy_corpus_train(w, m, v, weights, steps, hyper)
    plain.append(numpy_corpus_objective(w, weights))

    assert bob[0] == pytest.approx(math.log(vocab), rel=1e-6)
    assert bob[-1] < 0.8 * bob[0]  # it learned
    np.testing.assert_allclose(plain, bob, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(w, checkpoint.parameters, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m, checkpoint.first_moment, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(v, checkpoint.second_moment, rtol=1e-4, atol=1e-10)


def test_torch_cpu_peer_trains_the_same_objective() -> None:
    pytest.importorskip("torch")
    from dev.bench.peers import TorchEager

    vocab, updates, hyper = 16, 20, Hyper()
    record = bench_workload("hard", vocab).record
    np.testing.assert_array_equal(record.targets, bench_targets(vocab))
    torch_peer = TorchEager(record, updates, hyper, "cpu")
    numpy_peer = NumpyPeer(record, updates, hyper)
    for peer in (torch_peer, numpy_peer):
        peer.reset()
        peer.run()
    assert torch_peer.loss() == pytest.approx(numpy_peer.loss(), rel=1e-5)
    torch_peer.reset()
    assert torch_peer.loss() == pytest.approx(math.log(vocab), rel=1e-6)


def test_torch_cpu_peer_trains_the_same_corpus_objective() -> None:
    pytest.importorskip("torch")
    from dev.bench.peers import TorchEager

    vocab, updates, hyper = 16, 20, Hyper()
    record = bench_workload("corpus", vocab).record
    torch_peer = TorchEager(record, updates, hyper, "cpu")
    numpy_peer = NumpyPeer(record, updates, hyper)
    start = torch_peer.loss()
    # From the zero table every row's softmax is uniform: the loss is log V.
    assert start == pytest.approx(math.log(vocab), rel=1e-6)
    for peer in (torch_peer, numpy_peer):
        peer.run()
    assert torch_peer.loss() == pytest.approx(numpy_peer.loss(), rel=1e-5)
    weights = record.dense_weights().astype(np.float64)
    optimum = -np.sum(weights * np.log(weights / weights.sum(axis=1, keepdims=True)))
    assert optimum < torch_peer.loss() < start - 0.1  # on its way down to the optimum


class _Broken(Peer):
    name = "broken"

    def reset(self) -> None:
        pass

    def run(self) -> None:
        raise RuntimeError("the device fell over\nsecond line")

    def loss(self) -> float:
        return 0.0


def test_a_missing_or_failing_peer_is_reported_not_raised() -> None:
    def missing() -> Peer:
        raise Unavailable("JAX is not installed")

    skipped = measure_peer(missing, "jax jit(fori_loop)", 5, 2)
    assert skipped.contender == "jax jit(fori_loop)"
    assert skipped.error == "skipped: JAX is not installed"
    assert skipped.seconds is None and skipped.us_per_update is None
    failed = measure_peer(_Broken, "broken", 5, 2)
    assert failed.error == "failed: RuntimeError: the device fell over"


def test_every_schedule_is_benched_the_seed_first() -> None:
    seed = BobConfig(vocab=8, prompts=0, updates=3, mode="hard")
    assert list(bob_configs(8, 3)) == [("", seed), (" fused", replace(seed, schedule="fused"))]


ROOT = Path(__file__).resolve().parent.parent


def test_bench_command_finds_the_suite_beside_src_in_this_checkout() -> None:
    assert bench_cmd.checkout_root() == ROOT
    assert bench_cmd.BENCH_BACKENDS == ("auto", *DEVICES)  # the suite's devices


def test_bench_command_without_a_checkout_refuses_in_one_line(tmp_path: Path) -> None:
    """Bob installed without its repository (here: the package copied alone onto a path,
    as a wheel installs it) has no dev/ beside it: one line saying what to do, status 2."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "src" / "bob", site / "bob",
                    ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "bob", "bench", "--backend", "cpu", "-V", "4"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr == f"bob: {bench_cmd.NO_CHECKOUT}\n"
    assert "clone the repository and run `make bench`" in bench_cmd.NO_CHECKOUT


def test_nothing_in_the_product_imports_the_dev_tooling_but_the_bench_face() -> None:
    importers = {path.relative_to(ROOT / "src").as_posix()
                 for path in (ROOT / "src").rglob("*.py")
                 if re.search(r"^\s*(from|import) dev\b", path.read_text(), re.M)}
    assert importers == {"bob/cli/bench_cmd.py"}
    assert not (ROOT / "src" / "bob" / "bench").exists()
    assert not (ROOT / "src" / "bob" / "bringup").exists()


def test_the_profiled_targets_are_the_bench_targets() -> None:
    from bob.cli import profile_cmd

    assert profile_cmd.TARGET_SEED == TARGET_SEED


def test_bench_command_prints_json() -> None:
    result = CliRunner().invoke(
        cli, ["bench", "--backend", "cpu", "-V", "4", "-V", "8", "-N", "2", "-r", "1", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [t["vocab"] for t in document["tables"]] == [4, 8]
    assert all(t["device"] == "cpu" for t in document["tables"])


def test_bench_command_prints_tables_and_saves(tmp_path) -> None:
    saved = tmp_path / "bench.json"
    result = CliRunner().invoke(
        cli, ["bench", "--backend", "cpu", "-V", "8", "-N", "2", "-r", "1", "--save", str(saved)])
    assert result.exit_code == 0, result.output
    assert "bob cpu run" in result.stdout and "numpy loop" in result.stdout
    assert json.loads(saved.read_text())["tables"][0]["vocab"] == 8


def test_bench_on_cuda_without_a_gpu_fails_with_a_reason(capsys) -> None:
    try:
        choose_backend("cuda")
    except Exception:  # noqa: BLE001 - whatever keeps cuda from running here
        pass
    else:
        pytest.skip("a GPU is usable here")
    assert main(["bench", "--backend", "cuda", "-V", "4", "-N", "1", "-r", "1"]) == 1
    assert "cuda" in capsys.readouterr().err


def test_the_command_row_finds_bob_from_another_directory(monkeypatch, tmp_path):
    """An uninstalled checkout runs with a relative PYTHONPATH; the `bob train` subprocess
    runs in a temporary directory and must still import this Bob."""
    from dev.bench.measurement import command_env

    monkeypatch.setenv("PYTHONPATH", "src")
    env = command_env()
    entries = env["PYTHONPATH"].split(os.pathsep)
    assert all(os.path.isabs(entry) for entry in entries)
    done = subprocess.run([sys.executable, "-c", "import bob, sys; print(bob.__file__)"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    import bob
    assert done.stdout.strip() == bob.__file__


def test_bench_host_times_the_session_with_the_device_program_made_instant() -> None:
    """dev/bench/bench_host.py in a process of its own (it makes the cpu backend's run a
    no-op): the steady line, then each of the session's steps with its calls counted."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "V": "16", "N": "10"}
    done = subprocess.run([sys.executable, "-m", "dev.bench.bench_host"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("V=16 N=10 fused: host part ")
    assert "us per steady invocation (median of 5: " in lines[0]
    steps = {line.split(":")[0].strip().rsplit(".", 1)[-1]: line for line in lines[1:]}
    assert set(steps) == {"begin_after", "_start", "update_scalar_writes", "read_after",
                          "settle", "finish"}
    assert steps["settle"].endswith("median of 50 calls")  # every invocation settled
    assert steps["begin_after"].endswith("median of 49 calls")  # all but the first


def test_bench_command_times_each_command_in_rounds_and_reads_both_statistics() -> None:
    """dev/bench/bench_command.py on the cpu backend (the script without a GPU): every
    command's median and least, and the target read by each."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "B": "cpu", "V": "16", "N": "10",
           "STEPS": "30", "REPEATS": "2"}
    done = subprocess.run([sys.executable, "-m", "dev.bench.bench_command"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600, check=True)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cpu V=16, N=10: device program ")
    assert lines[0].endswith("ms for 30 updates")
    for count in (0, 10, 30):
        assert any(line.startswith(f"bob train --steps {count:<6}: median ") and
                   ", least " in line for line in lines), count
    for statistic in ("median", "least"):
        readings = [line for line in lines if line.startswith(f"{statistic}: start-up (")]
        assert len(readings) == 2 and all("x of it" in line for line in readings)
        assert any(line.startswith(f"{statistic}: the 20 updates after the first")
                   for line in lines)


# -- corpus mode -------------------------------------------------------------------------
CORPUS_BOB_ROWS = ("bob cpu invocation", "bob cpu run", "bob cpu train steady invocation",
                   "bob cpu fused invocation", "bob cpu fused run",
                   "bob cpu fused train steady invocation")


def test_cpu_corpus_bench_gives_every_row_with_sane_values_and_ratios() -> None:
    report = run_bench(("cpu",), (16,), updates=3, repeats=1, mode="corpus")
    (table,) = report.tables
    assert (table.mode, table.pairs) == ("corpus", typical_pairs(16))
    assert table.data == f"random corpus, {typical_pairs(16)} pairs (seed {TARGET_SEED})"
    names = [row.contender for row in table.rows]
    for name in (*CORPUS_BOB_ROWS, "bob cpu train command", "numpy loop"):
        assert name in names
    assert not any(" host: " in name for name in names)  # the host pieces are hard mode's
    for row in table.rows:
        if row.error is not None:  # only a missing package may skip a peer; nothing fails
            assert row.kind == "peer" and row.error.startswith("skipped: "), row
            continue
        assert row.seconds is not None and row.seconds > 0 and len(row.samples) == 1
        assert row.loss is not None and math.isfinite(row.loss), row
        assert table.ratio(row, "run") is not None and table.ratio(row, "run") > 0
        if row.whole_process:
            assert row.peak_rss_bytes is not None and 10e6 < row.peak_rss_bytes < 4e9, row
            assert table.ratio(row, "command") > 0
        else:
            assert table.ratio(row, "command") is None
    # Bob's rows train the same K pairs from zero: one loss; the peers reach it.
    bob = {_row(table, name).loss for name in CORPUS_BOB_ROWS}
    assert len(bob) == 1, bob
    (loss,) = bob
    assert loss < math.log(16)
    assert _row(table, "numpy loop").loss == pytest.approx(loss, rel=1e-4)
    # The whole commands train on token files (not the random corpus): the same loss as
    # each other, and the command row is the ratio's reference.
    command = _row(table, "bob cpu train command")
    assert table.ratio(command, "command") == 1.0
    assert "counting" in command.note and "validation" in command.note
    if "pytorch cpu eager end to end" in names:
        end_to_end = _row(table, "pytorch cpu eager end to end")
        if end_to_end.error is None:
            assert end_to_end.whole_process and end_to_end.loss == pytest.approx(command.loss,
                                                                                 rel=1e-5)
            assert "ms/update inside" in end_to_end.note
    assert not report.bob_failed
    document = report.to_json()
    assert document["format_version"] == 2
    assert document["tables"][0]["mode"] == "corpus"


def test_bench_command_trains_the_pairs_of_a_token_file(tmp_path: Path, monkeypatch) -> None:
    """Named relative to where bob bench runs (the commands run elsewhere)."""
    vocab = 16
    monkeypatch.chdir(tmp_path)
    tokens, val = "t.bin", "v.bin"
    ids = zipf_tokens(5000, vocab)
    ids[:4000].tofile(tokens)
    ids[4000:].tofile(val)
    distinct = len(np.unique(ids[:3999].astype(np.int64) * vocab + ids[1:4000]))
    result = CliRunner().invoke(cli, ["bench", "--backend", "cpu", "-V", str(vocab), "-N", "2",
                                      "-r", "1", "--mode", "corpus", "--tokens", tokens,
                                      "--val-tokens", val, "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["command"].endswith(f"--mode corpus --tokens {tokens} --val-tokens {val}")
    (table,) = document["tables"]
    assert (table["mode"], table["pairs"]) == ("corpus", distinct)
    assert table["data"] == f"tokens {tokens}, {distinct} pairs"
    rows = {row["contender"]: row for row in table["rows"]}
    command = rows["bob cpu train command"]
    assert command["error"] is None and command["whole_process"]
    assert command["ratio_to_bob_command"] == 1.0 and command["peak_rss_bytes"] > 0
    assert "tokens: given" in command["note"]


@pytest.mark.parametrize(("words", "message"), [
    (["--tokens", "{t}"], "token files are corpus data: give --mode corpus with --tokens"),
    (["--mode", "corpus", "--val-tokens", "{t}"],
     "--val-tokens validates the --tokens corpus: give --tokens too"),
])
def test_bench_command_refuses_token_files_where_they_cannot_go(tmp_path, capsys, words,
                                                                message) -> None:
    path = tmp_path / "t.bin"
    zipf_tokens(100, 16).tofile(path)
    argv = ["bench", "--backend", "cpu", "-V", "16", *(w.format(t=path) for w in words)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"bob: {message}\n"


def test_a_workload_is_the_bench_targets_a_random_corpus_or_a_token_files_pairs(tmp_path):
    hard = bench_workload("hard", 8)
    np.testing.assert_array_equal(hard.record.targets, bench_targets(8))
    corpus = bench_workload("corpus", 8)
    assert corpus.record.pairs == typical_pairs(8) == 64 and corpus.tokens is None
    assert corpus.record.values.sum() == pytest.approx(1.0, rel=1e-6)
    path = tmp_path / "t.bin"
    np.array([0, 1, 0, 1, 2], "<u2").tofile(path)
    counted = bench_workload("corpus", 8, str(path))
    assert counted.record.keys.tolist() == [1, 8, 10]  # 0->1, 1->0, 1->2
    assert counted.record.values.tolist() == pytest.approx([0.5, 0.25, 0.25])
    assert counted.tokens.train == counted.tokens.val == path.resolve()


def test_a_token_corpus_is_made_where_none_is_given_and_kept_where_it_is(tmp_path):
    small = token_corpus(tmp_path / "small", 16)  # below the byte alphabet: the Zipf stream
    assert "Zipf-like" in small.how and set(small.made) == {small.train, small.val}
    ids = np.fromfile(small.train, "<u2")
    assert ids.max() < 16 and len(ids) + len(np.fromfile(small.val, "<u2")) == 300_000
    again = token_corpus(tmp_path / "small", 16)
    assert again.made == () and again.how.startswith("given")
    small.val.unlink()
    with pytest.raises(ValueError, match="give both or neither"):
        token_corpus(tmp_path / "small", 16)
    pytest.importorskip("tokenizers")
    bpe = token_corpus(tmp_path / "bpe", 300)
    assert bpe.how.startswith("BPE") and np.fromfile(bpe.train, "<u2").max() < 300
    assert {path.name for path in bpe.made} == {"train.bin", "val.bin", "tokenizer.json"}


def test_a_peer_too_large_for_its_device_is_skipped_with_its_needs() -> None:
    with pytest.raises(Unavailable) as raised:
        require_room("pytorch cuda graph", "torch graph", "corpus", 50257, 64 << 30)
    assert str(raised.value) == (
        "pytorch cuda graph needs about 75.3 GiB of device memory at V=50257 (8 tables of "
        "V x V f32: W, gradient, m, v, T and the loss's temporaries); 64.0 GiB is free")
    require_room("jax jit(fori_loop)", "jax", "hard", 50257, None)  # no figure: no check

    class OutOfMemoryError(RuntimeError):
        pass

    class Hungry(_Broken):
        def run(self) -> None:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 9.41 GiB")

    assert out_of_memory(OutOfMemoryError("x")) and out_of_memory(RuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 10106 MiB"))
    assert not out_of_memory(RuntimeError("the device fell over"))
    row = measure_peer(Hungry, "hungry", 5, 1)
    assert row.error == ("skipped: out of device memory (OutOfMemoryError: CUDA out of memory. "
                         "Tried to allocate 9.41 GiB)")


@pytest.mark.parametrize("gnu_time", [True, False])
def test_a_process_is_timed_with_its_own_peak_memory(monkeypatch, gnu_time) -> None:
    from dev.bench import processes

    if not gnu_time:
        monkeypatch.setattr(processes, "gnu_time", lambda: None)
    elif processes.gnu_time() is None:
        pytest.skip("no GNU time here")
    ours = np.ones(1 << 26)  # 512 MiB here: a child forked from this process would count it
    ours[0] = 2
    big = run_process([sys.executable, "-c", "import numpy; print(numpy.ones(1 << 25).sum())"])
    assert big.returncode == 0 and big.stdout.strip() == str(float(1 << 25))
    assert 8 << 25 < big.peak_rss_bytes < 8 << 26  # its 256 MiB array, not our 512
    assert big.rss_source == ("/usr/bin/time -v" if gnu_time else "wait4 of its own reaper")
    small = run_process([sys.executable, "-c", "import sys; sys.exit('no room')"])
    assert small.peak_rss_bytes < 100e6  # an interpreter alone, not the largest child's
    assert small.returncode == 1 and small.failure == "no room"
    with pytest.raises(RuntimeError, match="no room"):
        small.checked()
    slow = run_process(["sleep", "30"], timeout=0.3)
    assert slow.timed_out and slow.seconds < 10 and slow.failure.startswith("killed after")


def test_bench_tokens_reads_the_device_time_and_folds_gpt2_ids() -> None:
    stderr = ("step 100: train 9.1000, val 9.2000  (20 ms/update, ETA 0:18)\n"
              "  step 200: train 8.1000  (15.5 ms/update, ETA 0:00)\nbob train (cuda)\n")
    assert bench_tokens.device_seconds(stderr) == pytest.approx(100 * 0.020 + 100 * 0.0155)
    assert bench_tokens.device_seconds("no lines") is None
    assert bench_tokens.prompt_ids("464 3290", 50257) == "464 3290"
    assert bench_tokens.prompt_ids("464 3290", 512) == "464 218"


def test_bench_tokens_runs_end_to_end_at_v512_on_cpu(tmp_path: Path) -> None:
    """dev/bench/bench_tokens.py as the lead runs it, at V = 512 on the cpu backend without
    PyTorch: every command runs, the JSON report is complete, and only the token files it
    was given are left."""
    data = tmp_path / "data"
    data.mkdir()
    ids = zipf_tokens(60_000, 512)
    ids[:54_000].tofile(data / "train.bin")
    ids[54_000:].tofile(data / "val.bin")
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "dev.bench.bench_tokens", str(data),
                           "--vocab", "512", "--steps", "6", "-N", "3", "--backend", "cpu",
                           "--skip-torch", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(path.name for path in data.iterdir()) == ["train.bin", "val.bin"]
    report = json.loads(out.read_text())
    assert report["format"] == "bob-bench-tokens" and report["failed"] == []
    commands = {step["name"]: step for step in report["commands"]}
    assert list(commands) == ["start-up", "count", "train", "eval", "generate"]
    for step in commands.values():
        assert step["error"] is None and step["seconds"] > 0 and step["peak_rss_bytes"] > 0
    assert commands["train"]["argv"][3:] == [
        "train", "--counts", commands["count"]["argv"][-2], "--vocab", "512", "--steps", "6",
        "-N", "3", "--val-tokens", str(data / "val.bin"), "--schedule", "fused", "--backend",
        "cpu", "-c", commands["eval"]["argv"][5], "--json"]
    assert report["count"]["transitions"] == 53_999
    assert report["train"]["global_step"] == 6 and report["train"]["val_loss"] > 0
    assert report["eval"]["loss"] == pytest.approx(report["train"]["val_loss"], rel=1e-6)
    assert report["device_seconds"] > 0 and report["checkpoint_write_seconds"] > 0
    assert report["pytorch"] is None
    targets = {target["name"].split(" vs ")[0]: target for target in report["targets"]}
    for name in ("bob count: peak RSS", "bob train: peak RSS", "bob eval: peak RSS",
                 "bob generate: peak RSS"):
        assert targets[name]["met"] is True and targets[name]["limit"] == 4.0
    assert targets["bob train wall"]["limit"] > 0 and targets["bob train wall"]["value"] > 0
    assert targets["bob generate past start-up"]["limit"] == 2.0
    assert not any(name.startswith("pytorch") for name in targets)  # --skip-torch
    assert "bob train wall vs 1.3 x device" in done.stdout


@pytest.mark.gpu
def test_cuda_corpus_bench_rows_agree_with_their_peers(cuda_choice) -> None:
    """`bob bench --backend cuda --mode corpus` at a small V: Bob's rows, the whole
    commands and every peer that runs train the same corpus to the same loss."""
    report = run_bench(("cuda",), (1024,), updates=5, repeats=1, mode="corpus")
    (table,) = report.tables
    assert not report.bob_failed, [row for row in table.rows if row.error]
    names = [row.contender for row in table.rows]
    for name in ("bob cuda invocation", "bob cuda run", "bob cuda train steady invocation",
                 "bob cuda fused run", "bob cuda train command", "pytorch eager",
                 "pytorch cuda graph", "jax jit(fori_loop)", "pytorch eager end to end"):
        assert name in names, name
    bob = _row(table, "bob cuda run").loss
    for row in table.rows:
        if row.error is not None:
            assert row.error.startswith("skipped: "), row
        elif row.kind in ("bob", "peer") and not row.whole_process:
            assert row.loss == pytest.approx(bob, rel=1e-4), row.contender
    command = _row(table, "bob cuda train command")
    end_to_end = _row(table, "pytorch eager end to end")
    if end_to_end.error is None:
        assert end_to_end.loss == pytest.approx(command.loss, rel=1e-4)
        assert table.ratio(end_to_end, "command") > 0 and end_to_end.peak_rss_bytes > 0


def test_compute_floor_reads_ncu_csv_sums_over_launches():
    from dev.bench.compute_floor import parse_ncu_csv

    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
              '"Block Size","Grid Size","Device","CC","Section Name","Metric Name",'
              '"Metric Unit","Metric Value"\n')

    def row(launch: int, metric: str, value: str) -> str:
        return (f'"{launch}","1","python","h","bob_fused_train_held","1","7","(512,1,1)",'
                f'"(132,1,1)","0","9.0","Command line profiler metrics","{metric}","inst",'
                f'"{value}"\n')

    text = ("==PROF== Connected to process 1\n" + header
            + row(0, "smsp__inst_executed.sum", "1,000")
            + row(0, "smsp__thread_inst_executed.sum", "32,000")
            + row(1, "smsp__inst_executed.sum", "500")
            + row(1, "smsp__thread_inst_executed.sum", "15,000"))
    count = parse_ncu_csv(text)
    assert (count.launches, count.warp, count.thread) == (2, 1500.0, 47000.0)


def test_compute_floor_refuses_a_malformed_case():
    from dev.bench.compute_floor import parse_case

    assert parse_case("50257:corpus") == (50257, "corpus")
    with pytest.raises(SystemExit, match="V:hard or V:corpus, not '8192'"):
        parse_case("8192")
