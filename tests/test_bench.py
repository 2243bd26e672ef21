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
from bob.host.session import Session
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint
from dev.bench.measurement import bob_configs, measure_peer
from dev.bench.peers import (
    NumpyPeer,
    Peer,
    Unavailable,
    bench_targets,
    numpy_objective,
    numpy_train,
)
from dev.bench.suite import run_bench
from dev.bench.tables import BYTES_PER_PARAMETER, DEVICES, TARGET_SEED, BenchTable, Row

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
            "gb_per_s", "ratio_to_bob_run", "ratio_to_bob_invocation", "loss", "note", "error"}
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


def test_torch_cpu_peer_trains_the_same_objective() -> None:
    pytest.importorskip("torch")
    from dev.bench.peers import TorchEager

    vocab, updates, hyper = 16, 20, Hyper()
    targets = bench_targets(vocab)
    torch_peer = TorchEager(vocab, updates, targets, hyper, "cpu")
    numpy_peer = NumpyPeer(vocab, updates, targets, hyper)
    for peer in (torch_peer, numpy_peer):
        peer.reset()
        peer.run()
    assert torch_peer.loss() == pytest.approx(numpy_peer.loss(), rel=1e-5)
    torch_peer.reset()
    assert torch_peer.loss() == pytest.approx(math.log(vocab), rel=1e-6)


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
