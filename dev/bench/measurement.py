"""Timing: a contender's N updates, repeated after a warm-up, the median kept; Bob's rows.

A contender that cannot run is a row with its reason, one that fails a row with its error.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from bob.backends import BackendChoice
from bob.config import DEFAULT_SUBMISSION_POLICY, SCHEDULES, Hyper
from bob.program.bob import BobConfig, adam_scalar_table
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint
from dev.bench.peers import Peer, Unavailable, bench_targets
from dev.bench.tables import BYTES_PER_PARAMETER, Row, RowKind

STEADY_INVOCATIONS = 5  # session.train's invocations per steady timing
COMMAND_TIMEOUT = 600.0  # seconds one `bob train` process may take in the bench

# The H200 copy bandwidth Bob's V = 8192 goal is set against (docs/BENCHMARKS.md, "Against
# the goals"): the second memory-floor row, beside the copy measured at the start of the run.
GOAL_COPY_BANDWIDTH = 4.27e12  # bytes/s


def time_runs(run: Callable[[], None], reset: Callable[[], None], repeats: int,
              ) -> tuple[float, ...]:
    """One untimed warm-up, then `repeats` timings of run(), each after an untimed reset()."""
    reset()
    run()
    samples = []
    for _ in range(repeats):
        reset()
        start = time.perf_counter()
        run()  # returns only when the device is done
        samples.append(time.perf_counter() - start)
    return tuple(samples)


def error_text(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def failed(name: str, kind: RowKind, updates: int, error: BaseException) -> Row:
    if isinstance(error, Unavailable):
        return Row(name, kind, updates, error=f"skipped: {error}")
    if os.environ.get("BOB_BENCH_TRACEBACK"):
        traceback.print_exception(error, file=sys.stderr)
    return Row(name, kind, updates, error=f"failed: {error_text(error)}")


def measure_peer(make: Callable[[], Peer], name: str, updates: int, repeats: int) -> Row:
    try:
        peer = make()
    except Exception as error:  # noqa: BLE001 - a peer that cannot start is reported
        return failed(name, "peer", updates, error)
    try:
        samples = time_runs(peer.run, peer.reset, repeats)
        return Row(peer.name, "peer", updates, statistics.median(samples), samples,
                   peer.loss(), peer.note)
    except Exception as error:  # noqa: BLE001 - one failing peer must not end the bench
        return failed(peer.name, "peer", updates, error)
    finally:
        with contextlib.suppress(Exception):
            peer.close()


def bob_configs(vocab: int, updates: int, submission: str = DEFAULT_SUBMISSION_POLICY,
                ) -> Iterator[tuple[str, BobConfig]]:
    """Bob's configuration for each schedule and its row label, the seed's ("") first."""
    for schedule in SCHEDULES:
        label = "" if schedule == "seed" else f" {schedule}"
        yield label, BobConfig(vocab=vocab, prompts=0, updates=updates, mode="hard",
                               schedule=schedule,
                               submission=submission)  # type: ignore[arg-type]


def measure_bob(choice: BackendChoice, config: BobConfig, hyper: Hyper, repeats: int,
                label: str = "") -> list[Row]:
    """Bob's invocation, its run alone, and the host's pieces of an invocation.

    Only the seed schedule's rows ("bob cuda run", label "") are the ratios'
    reference; another schedule's rows carry its label ("bob cuda fused run").
    """
    from bob.host.session import Invocation, Session

    n = config.updates
    name = f"bob {choice.name}{label}"
    record = InputRecord.hard(bench_targets(config.vocab), (), source="bench targets")
    zero = Checkpoint.zeros(config.vocab, hyper, "hard")
    session = Session(choice, hyper)
    try:
        last: list[Invocation] = []

        def invoke() -> None:
            last[:] = [session.invoke(config, zero, record, "train")]

        try:
            samples = time_runs(invoke, lambda: None, repeats)
        except Exception as error:  # noqa: BLE001 - reported as Bob's failure
            return [failed(f"{name} invocation", "bob", n, error)]
        loss = last[0].loss
        rows = [Row(f"{name} invocation", "bob", n, statistics.median(samples), samples, loss,
                    "Session.invoke: load, scalars, run, read back and check")]
        backend = session.last_backend
        assert backend is not None
        plan = session.plan_for(config)

        def load() -> None:
            Session.load(backend, zero, record)

        def run() -> None:
            backend.run(range(plan.submission_count))

        def compute_scalars() -> None:
            adam_scalar_table(hyper, 1, n)

        def set_scalars() -> None:
            # As an invocation does: the fused schedule writes the tensor, the seed patches
            # every AdamW launch in one set_scalars_many (the table's computation included).
            session.write_update_scalars(config, backend, 1)

        def collect() -> None:
            session.collect(config, backend, zero, "train")

        what = ("one graph launch + stream synchronize" if choice.name == "cuda"
                else "backend.run over every submission")
        timed = (
            (f"{name} run", "bob", run, load, f"{what}; {plan.launch_count} launches in "
             f"{plan.submission_count} {plan.submission_policy} submissions"),
            (f"{name} host: adam_scalars x{n}", "host", compute_scalars, None,
             "N updates' AdamW scalars as one table (float64, rounded to binary32)"),
            (f"{name} host: set_scalars x{n}", "host", set_scalars, None,
             "the scalars where the plan reads them: N AdamW blocks patched in one call "
             "(seed), the adam_scalars tensor (fused)"),
            (f"{name} host: load", "host", load, None, "checkpoint + input into the arena"),
            (f"{name} host: collect", "host", collect, None,
             "results + checkpoint out, finiteness checks"),
        )
        for row_name, kind, work, reset, note in timed:
            try:
                samples = time_runs(work, reset or (lambda: None), repeats)
            except Exception as error:  # noqa: BLE001 - one failing piece is reported
                rows.append(failed(row_name, kind, n, error))
                continue
            rows.append(Row(row_name, kind, n, statistics.median(samples), samples,
                            loss if kind == "bob" else None, note))
        # Measured last (training on moves the AdamW scalars the run row uses), shown after
        # the invocation row.
        run_row = next((row for row in rows if row.contender == f"{name} run"), None)
        rows[1:1] = [steady_row(session, config, zero, record, repeats, name, run_row),
                     command_row(choice, config, hyper, record, repeats, name)]
        return rows
    finally:
        session.close()


def steady_row(session, config: BobConfig, start: Checkpoint, record: InputRecord,
               repeats: int, name: str, run: Row | None = None,
               invocations: int = STEADY_INVOCATIONS) -> Row:
    """One invocation's share of `session.train` once the pipeline is full.

    Each timing trains `invocations` invocations from `start` and keeps the time
    between the first invocation's completion and the last's, per invocation: the
    tables stay resident in the arena, each invocation is queued before the last is
    read back. `run` (the device program alone) is what the note compares it with.
    """
    from bob.host.session import Invocation, train

    row_name = f"{name} train steady invocation"
    losses: list[float] = []  # after the first invocation: the loss after N, as every row

    def one() -> float:
        stamps: list[float] = []

        def after(invocation: Invocation, done: int) -> None:
            stamps.append(time.perf_counter())
            if done == config.updates:
                losses.append(invocation.loss)

        # As bob train runs it: no earlier invocation's tables held.
        train(session, config, start, record, invocations * config.updates, after,
              keep_all=False)
        return (stamps[-1] - stamps[0]) / (len(stamps) - 1)

    try:
        one()  # warm-up
        samples = tuple(one() for _ in range(repeats))
    except Exception as error:  # noqa: BLE001 - reported as Bob's failure
        return failed(row_name, "bob", config.updates, error)
    steady = statistics.median(samples)
    note = (f"session.train over {invocations} invocations: resident tables, each queued "
            "before the last is read back; per invocation, the first one excluded")
    if run is not None and run.seconds:
        note += f" (this row / the run row: {steady / run.seconds:.3f}x)"
    return Row(row_name, "bob", config.updates, steady, samples, losses[-1], note)


def command_env() -> dict[str, str]:
    """The environment for a `bob` subprocess run in another directory: this Bob's package
    first on its path, and relative PYTHONPATH entries made absolute (an uninstalled
    checkout runs with PYTHONPATH=src)."""
    import bob

    here = str(Path(bob.__file__).resolve().parent.parent)
    inherited = [str(Path(entry).resolve()) for entry in
                 os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([here, *inherited])}


def command_row(choice: BackendChoice, config: BobConfig, hyper: Hyper, record: InputRecord,
                repeats: int, name: str) -> Row:
    """`bob train --steps N` as a user runs it: process start to exit, the checkpoint saved."""
    row_name = f"{name} train command"
    with tempfile.TemporaryDirectory(prefix="bob-bench-") as directory:
        source = Path(directory) / "input.bin"
        record.write(source)
        argv = [sys.executable, "-m", "bob", "train", "--input", str(source),
                "--backend", choice.name, "--steps", str(config.updates),
                "-N", str(config.updates), "--schedule", config.schedule,
                "--submission", config.submission, "--overwrite", "--json",
                "--lr", repr(hyper.lr), "--beta1", repr(hyper.beta1), "--beta2",
                repr(hyper.beta2), "--eps", repr(hyper.eps), "--weight-decay",
                repr(hyper.weight_decay),
                "-c", str(Path(directory) / "bob.safetensors")]
        losses: list[float] = []

        def run() -> None:
            done = subprocess.run(argv, capture_output=True, text=True, check=False,
                                  timeout=COMMAND_TIMEOUT, cwd=directory, env=command_env())
            if done.returncode != 0:
                lines = done.stderr.strip().splitlines()
                raise RuntimeError(lines[-1] if lines else f"exit {done.returncode}")
            losses.append(json.loads(done.stdout)["loss"])

        try:
            samples = time_runs(run, lambda: None, repeats)
        except Exception as error:  # noqa: BLE001 - reported as Bob's failure
            return failed(row_name, "bob", config.updates, error)
    return Row(row_name, "bob", config.updates, statistics.median(samples), samples, losses[-1],
               "the whole `bob train --steps N` process: start-up, imports, plan, backend, "
               "one invocation, checkpoint saved, exit")


def floor_rows(vocab: int, updates: int, measured: float | None) -> list[Row]:
    rows = []
    for bandwidth, source in ((measured, "measured copy"), (GOAL_COPY_BANDWIDTH, "goal")):
        if bandwidth is None:
            continue
        seconds = BYTES_PER_PARAMETER * vocab * vocab / bandwidth * updates
        rows.append(Row(f"memory floor ({source} {bandwidth / 1e12:.2f} TB/s)", "floor",
                        updates, seconds, (), None, "24 B/param / bandwidth (computed)"))
    return rows
