"""Timing: a contender's N updates, repeated after a warm-up, the median kept; Bob's rows;
whole commands as processes.

A contender that cannot run is a row with its reason, one that fails a row with its error.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from bob.backends import BackendChoice
from bob.config import DEFAULT_SUBMISSION_POLICY, SCHEDULES, Hyper, Mode
from bob.host.training import SMALL_CHECKPOINT_BYTES
from bob.program.bob import BobConfig, adam_scalar_table
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint, StartingPoint
from dev.bench.peers import (
    Peer,
    Unavailable,
    bench_targets,
    free_cached_memory,
    out_of_memory,
    torch_modules,
)
from dev.bench.processes import ProcessRun, run_process
from dev.bench.tables import BYTES_PER_PARAMETER, COMMAND_ROW, Device, Row, RowKind
from dev.bench.workload import TokenCorpus

STEADY_INVOCATIONS = 5  # session.train's invocations per steady timing

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
    if kind == "peer" and out_of_memory(error):  # a peer's tables that did not fit
        return Row(name, kind, updates,
                   error=f"skipped: out of device memory ({error_text(error)})")
    if os.environ.get("BOB_BENCH_TRACEBACK"):
        traceback.print_exception(error, file=sys.stderr)
    return Row(name, kind, updates, error=f"failed: {error_text(error)}")


def measure_peer(make: Callable[[], Peer], name: str, updates: int, repeats: int) -> Row:
    try:
        peer = make()
    except Exception as error:  # noqa: BLE001 - a peer that cannot start is reported
        free_cached_memory()  # what it allocated before it failed
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
        free_cached_memory()


def bob_configs(vocab: int, updates: int, submission: str = DEFAULT_SUBMISSION_POLICY,
                mode: Mode = "hard", pairs: int = 0) -> Iterator[tuple[str, BobConfig]]:
    """Bob's configuration for each schedule and its row label, the seed's ("") first;
    `pairs` is the corpus record's K."""
    for schedule in SCHEDULES:
        label = "" if schedule == "seed" else f" {schedule}"
        yield label, BobConfig(vocab=vocab, prompts=0, updates=updates, mode=mode,
                               schedule=schedule, submission=submission,  # type: ignore[arg-type]
                               pairs=pairs)


def measure_bob(choice: BackendChoice, config: BobConfig, hyper: Hyper, repeats: int,
                label: str = "", record: InputRecord | None = None) -> list[Row]:
    """Bob's invocation, its run alone, its steady invocation, and in hard mode the host's
    pieces of an invocation and the `bob train` command.

    `record` is what it trains on (default: the bench targets). Hard mode starts from a zero
    checkpoint in host memory and reads the tables back after every invocation, as it
    always has; corpus mode starts as `bob train` does, from zero tables cleared on the
    device, and reads them back only where `bob train` would (checkpoints up to
    SMALL_CHECKPOINT_BYTES): at token-sized V a table crosses to the host only when a
    checkpoint is saved. Only the seed schedule's rows ("bob cuda run", label "") are the
    ratios' reference; another schedule's rows carry its label ("bob cuda fused run").
    """
    from bob.host.session import Invocation, Session

    n = config.updates
    name = f"bob {choice.name}{label}"
    corpus = config.mode == "corpus"
    if record is None:
        record = InputRecord.hard(bench_targets(config.vocab), (), source="bench targets")
    zero: Checkpoint | StartingPoint
    if corpus:
        zero = StartingPoint.fresh(config.vocab, hyper, "corpus")
        reads_tables = zero.state.file_bytes <= SMALL_CHECKPOINT_BYTES
    else:
        zero = Checkpoint.zeros(config.vocab, hyper, "hard")
        reads_tables = True
    session = Session(choice, hyper)
    try:
        last: list[Invocation] = []

        def invoke() -> None:
            running = session.begin(config, zero, record, "train", tables=reads_tables)
            last[:] = [session.finish(session.settle(running))]

        try:
            samples = time_runs(invoke, lambda: None, repeats)
        except Exception as error:  # noqa: BLE001 - reported as Bob's failure
            return [failed(f"{name} invocation", "bob", n, error)]
        loss = last[0].loss
        what = "read back and check" if reads_tables else \
            "results and health counts read back and checked, the tables left on the device"
        rows = [Row(f"{name} invocation", "bob", n, statistics.median(samples), samples, loss,
                    f"Session.invoke: load, scalars, run, {what}")]
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
        if corpus:  # the run alone; the host pieces and the command are hard mode's rows
            timed = timed[:1]
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
        steady = steady_row(session, config, zero, record, repeats, name, run_row,
                            tables=reads_tables)
        rows[1:1] = [steady] if corpus else \
            [steady, command_row(choice, config, hyper, record, repeats, name)]
        return rows
    finally:
        session.close()


def steady_row(session, config: BobConfig, start: Checkpoint | StartingPoint,
               record: InputRecord, repeats: int, name: str, run: Row | None = None,
               invocations: int = STEADY_INVOCATIONS, tables: bool = True) -> Row:
    """One invocation's share of `session.train` once the pipeline is full.

    Each timing trains `invocations` invocations from `start` and keeps the time
    between the first invocation's completion and the last's, per invocation: the
    tables stay resident in the arena, each invocation is queued before the last is
    read back (with its tables, where `tables`). `run` (the device program alone) is
    what the note compares it with.
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
              keep_all=False, tables=lambda index, done: tables)
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


def command_env(with_dev: bool = False) -> dict[str, str]:
    """The environment for a `bob` subprocess run in another directory: this Bob's package
    first on its path, and relative PYTHONPATH entries made absolute (an uninstalled
    checkout runs with PYTHONPATH=src); `with_dev`: the checkout's root too, for a script
    of `dev/` (`python -m dev.bench...` from any directory)."""
    import bob

    here = [str(Path(bob.__file__).resolve().parent.parent)]
    if with_dev:
        here.append(str(Path(__file__).resolve().parent.parent.parent))
    inherited = [str(Path(entry).resolve()) for entry in
                 os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*here, *inherited])}


def hyper_words(hyper: Hyper) -> list[str]:
    """AdamW's hyperparameters as `bob train` (and torch_corpus.py) take them."""
    return ["--lr", repr(hyper.lr), "--beta1", repr(hyper.beta1), "--beta2", repr(hyper.beta2),
            "--eps", repr(hyper.eps), "--weight-decay", repr(hyper.weight_decay)]


def command_row(choice: BackendChoice, config: BobConfig, hyper: Hyper, record: InputRecord,
                repeats: int, name: str) -> Row:
    """`bob train --steps N` as a user runs it: process start to exit, the checkpoint saved."""
    row_name = f"{name} {COMMAND_ROW}"
    with tempfile.TemporaryDirectory(prefix="bob-bench-") as directory:
        source = Path(directory) / "input.bin"
        record.write(source)
        argv = [sys.executable, "-m", "bob", "train", "--input", str(source),
                "--backend", choice.name, "--steps", str(config.updates),
                "-N", str(config.updates), "--schedule", config.schedule,
                "--submission", config.submission, "--overwrite", "--json",
                *hyper_words(hyper), "-c", str(Path(directory) / "bob.safetensors")]
        runs: list[ProcessRun] = []

        def run() -> None:
            runs.append(run_process(argv, directory, command_env()).checked())

        try:
            samples = time_runs(run, lambda: None, repeats)
        except Exception as error:  # noqa: BLE001 - reported as Bob's failure
            return failed(row_name, "bob", config.updates, error)
    return Row(row_name, "bob", config.updates, statistics.median(samples), samples,
               json.loads(runs[-1].stdout)["loss"],
               "the whole `bob train --steps N` process: start-up, imports, plan, backend, "
               "one invocation, checkpoint saved, exit", whole_process=True,
               peak_rss_bytes=max(r.peak_rss_bytes or 0 for r in runs) or None)


def corpus_command_rows(choice: BackendChoice, corpus: TokenCorpus, vocab: int, updates: int,
                        repeats: int, hyper: Hyper, submission: str, device: Device,
                        progress: Callable[[str], None] = lambda text: None) -> list[Row]:
    """The whole `bob train` on token files beside PyTorch's eager loop end to end, each a
    process from start to exit, with its peak RSS.

    Bob: `bob train --tokens TRAIN --val-tokens VAL --steps N -N N --schedule fused`
    (counting, plan, the updates, the validation loss, the checkpoint saved). PyTorch:
    `dev/bench/torch_corpus.py` (the tokens read and counted on its device, T built, the N
    updates; no validation, no checkpoint). One warm-up of each with --steps 0 (the page
    cache, the compile cache, PyTorch's libraries), then `repeats` rounds of one of each, so
    that the machine's drift falls on both alike; the median of each.
    """
    bob_name = f"bob {choice.name} {COMMAND_ROW}"
    peer_name = "pytorch eager end to end" if device == "cuda" else \
        "pytorch cpu eager end to end"

    def bob(steps: int, directory: str) -> list[str]:
        return [sys.executable, "-m", "bob", "train", "--tokens", str(corpus.train),
                "--vocab", str(vocab), "--val-tokens", str(corpus.val), "--backend",
                choice.name, "--steps", str(steps), "-N", str(max(steps, 1)), "--schedule",
                "fused", "--submission", submission, "--overwrite", "--json",
                *hyper_words(hyper), "-c", str(Path(directory) / "bob.safetensors")]

    def torch(steps: int) -> list[str]:
        return [sys.executable, "-m", "dev.bench.torch_corpus", "--tokens", str(corpus.train),
                "--vocab", str(vocab), "--steps", str(steps), "--device", device,
                *hyper_words(hyper)]

    bob_runs: list[ProcessRun] = []
    peer_runs: list[ProcessRun] = []
    bob_error: Exception | None = None
    peer_problem: str | None = None
    env = command_env()
    for round_number in range(repeats + 1):  # round 0: the warm-ups, --steps 0
        steps = updates if round_number else 0
        if bob_error is None:
            progress(f"bob train --steps {steps} ({round_number}/{repeats})")
            # A fresh directory each time: a token-sized checkpoint leaves before the next.
            with tempfile.TemporaryDirectory(prefix="bob-bench-",
                                             dir=roomiest_directory()) as directory:
                try:
                    done = run_process(bob(steps, directory), directory, env).checked()
                    if round_number:
                        bob_runs.append(done)
                except Exception as error:  # noqa: BLE001 - reported as Bob's failure
                    bob_error = error
        if peer_problem is None:
            progress(f"torch_corpus.py --steps {steps} ({round_number}/{repeats})")
            done = run_process(torch(steps), None, command_env(with_dev=True))
            report = _last_json(done)
            if done.returncode != 0 or report is None:
                peer_problem = f"failed: {done.failure}"
            elif "skipped" in report:
                peer_problem = f"skipped: {report['skipped']}"
            elif round_number:
                peer_runs.append(done)
    rows = [failed(bob_name, "bob", updates, bob_error) if bob_error is not None else
            _process_row(bob_name, "bob", updates, bob_runs,
                         f"the whole `bob train --tokens --val-tokens --steps {updates} -N "
                         f"{updates} --schedule fused` process: counting, plan, backend, the "
                         "updates, the validation loss, the checkpoint saved; "
                         f"tokens: {corpus.how}")]
    if peer_problem is not None:
        rows.append(Row(peer_name, "peer", updates, error=peer_problem, whole_process=True))
    else:
        inside = statistics.median(_last_json(r)["seconds_per_update"] for r in peer_runs)
        rows.append(_process_row(
            peer_name, "peer", updates, peer_runs,
            f"python -m dev.bench.torch_corpus: the tokens read and counted on the {device} "
            f"(torch.unique), T built, {updates} eager updates "
            f"({inside * 1e3:.2f} ms/update inside); no validation, no checkpoint"))
    return rows


def roomiest_directory() -> str:
    """The temporary directory or the working directory, whichever file system has more
    room: a checkpoint at V = 50257 is 30 GB, more than a small /tmp holds."""
    candidates = (tempfile.gettempdir(), os.getcwd())
    return max(candidates, key=lambda path: shutil.disk_usage(path).free)


def _last_json(run: ProcessRun) -> dict | None:
    """The JSON object a process printed last on its standard output, or None."""
    lines = run.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def _process_row(name: str, kind: RowKind, updates: int, runs: Sequence[ProcessRun],
                 note: str) -> Row:
    samples = tuple(run.seconds for run in runs)
    report = _last_json(runs[-1]) or {}
    peaks = [run.peak_rss_bytes for run in runs if run.peak_rss_bytes is not None]
    return Row(name, kind, updates, statistics.median(samples), samples, report.get("loss"),
               note, whole_process=True, peak_rss_bytes=max(peaks) if peaks else None)


def copy_bandwidth() -> float | None:
    """Device-to-device copy bandwidth (bytes read + written per second) through torch."""
    try:
        torch, _ = torch_modules()
        if not torch.cuda.is_available():
            return None
        source = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
        target = torch.empty_like(source)
        target.copy_(source)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            target.copy_(source)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1e-3)
        del source, target
        torch.cuda.empty_cache()
        return 2 * (1 << 30) / statistics.median(times)
    except Exception:  # noqa: BLE001 - the floor row is a courtesy
        return None


def floor_rows(vocab: int, updates: int, measured: float | None) -> list[Row]:
    rows = []
    for bandwidth, source in ((measured, "measured copy"), (GOAL_COPY_BANDWIDTH, "goal")):
        if bandwidth is None:
            continue
        seconds = BYTES_PER_PARAMETER * vocab * vocab / bandwidth * updates
        rows.append(Row(f"memory floor ({source} {bandwidth / 1e12:.2f} TB/s)", "floor",
                        updates, seconds, (), None, "24 B/param / bandwidth (computed)"))
    return rows
