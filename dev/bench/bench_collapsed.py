"""Collapsed tables at GPT-2's vocabulary: the device program per update beside the dense
kernels and the floor, and the whole job beside PyTorch's eager loop, in one process.

    PYTHONPATH=src:. python3 -m dev.bench.bench_collapsed DIR --json out.json
    PYTHONPATH=src:. python3 -m dev.bench.bench_collapsed DIR --vocab 512 --backends cpu \\
        --skip-dense --skip-torch --steps 20     # the same run in seconds, without a GPU

DIR holds nanoGPT's train.bin and val.bin (uint16); where both are missing they are made
first (`dev/bench/token_corpus.py`: a BPE tokenizer trained on text that ships with
Python). Then:

1. per update, device time through the plan: each backend x mode (corpus: the counted
   pairs; hard: each row's most frequent successor, token 0 for rows the data never
   names) x schedule, as the difference of two invocations of N0 and N0 + STEPS updates
   (what a run's later invocations cost, the host's fixed work cancelled), beside the
   dense fused kernels' corpus update at the same V (a few updates) and the floor: the
   additions the dense order costs for the rows whose sums matter, at the device's FP32
   issue rate (SMs x 128 lanes x clock);
2. the whole job as a user runs it, each a process: `bob train --tokens train.bin
   --val-tokens val.bin --steps S -N S` (count, S updates, validation, checkpoint) less
   `bob --help`'s start-up, beside `dev.bench.torch_corpus --tokens train.bin --steps S`
   (PyTorch eager: count and S updates on the device, no validation, no checkpoint: a
   lower bound of its whole job), and the checkpoint's size.

Prints each figure with its target's ratio (SPEC.md section 10); `--json` writes them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from bob.backends import choose_backend
from bob.config import Hyper
from bob.host.session import Session
from bob.host.tables import starting_tables
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord
from bob.records.checkpoint import StartingPoint, TrainingState
from bob.records.countsfile import CountsFile
from bob.records.digest import weights_of
from dev.bench.processes import bob_env, run_process

FIRST = 100  # updates of the first invocation of each pair: its fixed costs cancel


def corpus_records(counted: CountsFile) -> dict[str, InputRecord]:
    """The corpus record of the counts, and hard targets: each row's most frequent
    successor (token 0 where no data names the row)."""
    keys, counts = counted.counts.pairs()
    vocab = counted.vocab
    corpus = InputRecord.sparse(vocab, keys, weights_of(counts, counted.transitions))
    rows = (keys // vocab).astype(np.int64)
    order = np.lexsort((-counts.astype(np.int64), rows))  # by row, most frequent first
    first = order[np.r_[True, rows[order][1:] != rows[order][:-1]]]
    targets = np.zeros(vocab, np.uint32)
    targets[rows[first]] = (keys[first] % vocab).astype(np.uint32)
    return {"corpus": corpus, "hard": InputRecord.hard(targets)}


def token_records(directory: Path, vocab: int) -> tuple[CountsFile, dict[str, InputRecord]]:
    """The corpus in `directory` counted by `bob count` (made first where it is missing),
    and its two records."""
    if not (directory / "train.bin").exists():
        from dev.bench.token_corpus import write_token_corpus

        print(write_token_corpus(directory, vocab), flush=True)
    counts = directory / "train.counts"
    run_process([sys.executable, "-m", "bob", "count", "--tokens", directory / "train.bin",
                 "--vocab", str(vocab), "-o", counts, "--overwrite"], env=bob_env()).checked()
    counted = CountsFile.load(counts)
    return counted, corpus_records(counted)


def per_update(backend: str, record: InputRecord, schedule: str, steps: int) -> dict:
    """Device time per update of collapsed tables through the plan (a difference of two
    invocations), and the tables' classes."""
    vocab = record.vocab
    state = TrainingState(vocab, 0, Hyper(), record.mode, "", tables="collapsed")
    start = starting_tables("collapsed", state, record.named_keys())
    seconds = []
    with Session(choose_backend(backend)) as session:
        for updates in (FIRST, FIRST + steps):
            config = BobConfig(vocab=vocab, prompts=0, updates=updates, mode=record.mode,
                               schedule=schedule, pairs=record.pairs, tables="collapsed",
                               exceptions=start.index.exceptions)
            session.invoke(config, start, record, "train")  # warm: compile, allocate
            begun = time.perf_counter()
            session.invoke(config, start, record, "train")
            seconds.append(time.perf_counter() - begun)
    return {"backend": backend, "mode": record.mode, "schedule": schedule,
            "us_per_update": 1e6 * (seconds[1] - seconds[0]) / steps,
            "classes": vocab + start.index.exceptions}


def dense_corpus_update(backend: str, record: InputRecord, steps: int) -> float:
    """The dense fused kernels' corpus update at the same V, microseconds (a difference of
    two invocations of 1 and 1 + steps updates)."""
    vocab = record.vocab
    seconds = []
    with Session(choose_backend(backend)) as session:
        start = StartingPoint.fresh(vocab, Hyper(), "corpus")  # cleared on the device
        for updates in (1, 1 + steps):
            session.release()  # one dense arena at a time: two need more than a GPU holds
            config = BobConfig(vocab=vocab, prompts=0, updates=updates, mode="corpus",
                               schedule="fused", pairs=record.pairs)
            running = session.begin(config, start, record, "train", tables=False)
            session.settle(running)
            begun = time.perf_counter()
            running = session.begin(config, start, record, "train", tables=False)
            session.settle(running)
            seconds.append(time.perf_counter() - begun)
    return 1e6 * (seconds[1] - seconds[0]) / steps


def floor_us(record: InputRecord, backend: str) -> tuple[float, float]:
    """The dense order's additions for the rows whose sums matter (every row in hard mode,
    rows with data in corpus mode; V each), and their time at the FP32 issue rate."""
    vocab = record.vocab
    rows = vocab if record.mode == "hard" else int(np.unique(record.named_keys() // vocab).size)
    additions = float(rows) * vocab
    if backend == "cpu":
        return additions, float("nan")
    from dev.bench.compute_floor import Issue

    lanes_per_second = 32 * Issue.of_device(0).warp_instructions_per_second
    return additions, 1e6 * additions / lanes_per_second


def whole_job(directory: Path, vocab: int, steps: int, backend: str,
              torch_steps: int) -> dict:
    """`bob train` from tokens to checkpoint as a process, less start-up; PyTorch eager."""
    env = bob_env()
    python = sys.executable
    startup = run_process([python, "-m", "bob", "--help"], env=env).checked().seconds
    checkpoint = directory / "collapsed.safetensors"
    train = run_process([python, "-m", "bob", "train", "--tokens", directory / "train.bin",
                         "--vocab", str(vocab), "--val-tokens", directory / "val.bin",
                         "--steps", str(steps), "-N", str(steps), "--schedule", "fused",
                         "--backend", backend, "-c", checkpoint, "--overwrite", "--json"],
                        env=env).checked()
    report = json.loads(train.stdout)
    found = {"startup_seconds": startup, "train_seconds": train.seconds,
             "after_startup_seconds": train.seconds - startup,
             "peak_rss_bytes": train.peak_rss_bytes, "tables": report.get("tables"),
             "loss": report["loss"], "val_loss": report.get("val_loss"),
             "checkpoint_bytes": checkpoint.stat().st_size}
    checkpoint.unlink()
    if torch_steps:
        peer = run_process([python, "-m", "dev.bench.torch_corpus", "--tokens",
                            directory / "train.bin", "--vocab", str(vocab), "--steps",
                            str(torch_steps)], env=env)
        line = json.loads(peer.stdout.strip().splitlines()[-1]) if peer.returncode == 0 \
            else {"skipped": peer.failure}
        found["torch"] = {**line, "process_seconds": peer.seconds}
        if "skipped" not in line:  # its whole job at `steps` updates: the rest scales
            found["torch"]["job_seconds"] = (peer.seconds - line["train_seconds"]
                                             + line["seconds_per_update"] * steps)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--backends", nargs="+", default=["cuda", "nv"])
    parser.add_argument("--schedules", nargs="+", default=["fused", "seed"])
    parser.add_argument("--skip-job", action="store_true", help="no whole-job processes")
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--torch-steps", type=int, default=None,
                        help="PyTorch's updates (default --steps); its job at --steps updates "
                             "is its process time less its training, plus --steps of its "
                             "measured updates")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    directory = args.directory
    counted, records = token_records(directory, args.vocab)
    print(f"V={args.vocab}: {counted.transitions:,} transitions, K={records['corpus'].pairs:,} "
          f"pairs over {np.unique(records['corpus'].named_keys() // args.vocab).size:,} rows",
          flush=True)
    results: dict = {"vocab": args.vocab, "pairs": records["corpus"].pairs, "updates": []}
    for backend in args.backends:
        for mode, record in records.items():
            additions, floor = floor_us(record, backend)
            for schedule in args.schedules:
                row = per_update(backend, record, schedule, args.steps if schedule == "fused"
                                 else max(1, args.steps // 10))
                row.update(floor_us=floor, additions=additions)
                results["updates"].append(row)
                print(f"{backend:5} {mode:6} {schedule:5}: {row['us_per_update']:9.2f} us/update "
                      f"({row['classes']:,} classes); floor {floor:.2f} us "
                      f"({additions:.3g} additions): {row['us_per_update'] / floor:.2f}x the "
                      "floor", flush=True)
        if not args.skip_dense and backend != "cpu":
            dense = dense_corpus_update(backend, records["corpus"], 10)
            results.setdefault("dense_corpus_us", {})[backend] = dense
            fused = next(r for r in results["updates"] if r["backend"] == backend
                         and r["mode"] == "corpus" and r["schedule"] == args.schedules[0])
            print(f"{backend:5} dense fused corpus: {dense:,.1f} us/update; collapsed "
                  f"{dense / fused['us_per_update']:,.0f}x faster (target >= 250x)", flush=True)
    if args.skip_job:
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        return 0
    torch_steps = 0 if args.skip_torch else (args.torch_steps or args.steps)
    job = whole_job(directory, args.vocab, args.steps, args.backends[0], torch_steps)
    results["job"] = job
    print(f"bob train ({job['tables']} tables): {job['train_seconds']:.2f} s, "
          f"{job['after_startup_seconds']:.2f} s after start-up (target <= 5 s); checkpoint "
          f"{job['checkpoint_bytes'] / 1e6:.2f} MB (target <= 10 MB); peak RSS "
          f"{(job['peak_rss_bytes'] or 0) / 1e9:.2f} GB", flush=True)
    torch = job.get("torch")
    if torch and "skipped" not in torch:
        ratio = torch["job_seconds"] / job["train_seconds"]
        print(f"PyTorch eager (count + {args.steps} updates, no validation or checkpoint): "
              f"{torch['job_seconds']:.2f} s ({torch['steps']} updates run, "
              f"{1e3 * torch['seconds_per_update']:.2f} ms each, process "
              f"{torch['process_seconds']:.2f} s): Bob {ratio:.1f}x faster end to end "
              "(target >= 30x)", flush=True)
    elif torch:
        print(f"PyTorch eager: skipped ({torch['skipped']})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
