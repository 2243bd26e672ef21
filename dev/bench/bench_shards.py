"""Row shards in turn on one GPU against the one-piece run, side by side in one process.

    PYTHONPATH=src:. python3 -m dev.bench.bench_shards -V 32768 --shards 4 --steps 60 -N 30

Both train the same input record (random hard targets, or random sparse corpus weights)
on one backend from zeros, each writing its checkpoint under --dir; then the two
checkpoints are compared table by table, a block of rows at a time (the host never holds
a whole table), and the run's losses too. Printed per contender: wall time, ms per update
of the updates alone, and for the shards the streaming (plan, rows and data in; tables
out to the shard files) beside it; then the ratio of the shards' update time to the one
piece's, and whether the bytes are identical. Delete --dir afterwards: at V = 32768 the
two checkpoints are 24 GiB.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from bob.config import CHECKPOINT_TENSORS
from bob.host.api import run_training
from bob.host.training import TrainRequest
from bob.program.bob import typical_pairs
from bob.records.binary import F32, U64, InputRecord
from bob.records.shards import open_checkpoint

BLOCK_ROWS = 1024


def input_record(vocab: int, mode: str, seed: int = 0) -> InputRecord:
    rng = np.random.default_rng(seed)
    if mode == "hard":
        return InputRecord.hard(rng.integers(0, vocab, vocab, dtype=np.uint32))
    pairs = min(typical_pairs(vocab), vocab * vocab)
    keys = np.unique(rng.integers(0, vocab * vocab, pairs, dtype=np.uint64)).astype(U64)
    counts = rng.integers(1, 100, len(keys)).astype(np.float64)
    return InputRecord.sparse(vocab, keys, (counts / counts.sum()).astype(F32))


def first_difference(one: str, sharded: str, vocab: int) -> str | None:
    """None when both checkpoints hold the same bits in every table, else where not."""
    a, b = open_checkpoint(one), open_checkpoint(sharded)
    for name in CHECKPOINT_TENSORS:
        for first in range(0, vocab, BLOCK_ROWS):
            last = min(vocab, first + BLOCK_ROWS)
            x = a.row_block(name, first, last).view(np.uint32)
            y = b.row_block(name, first, last).view(np.uint32)
            if not np.array_equal(x, y):
                row, column = np.argwhere(x != y)[0]
                return f"{name}[{first + row}][{column}]"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-V", "--vocab", type=int, default=32768)
    parser.add_argument("--mode", choices=("hard", "corpus"), default="hard")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("-N", "--updates-per-invocation", type=int, default=30)
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--dir", default="/tmp/bob-bench-shards")
    parser.add_argument("--json", action="store_true", help="Also print the figures as JSON.")
    args = parser.parse_args(argv)

    where = Path(args.dir)
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    record_path = where / "input.bin"
    input_record(args.vocab, args.mode).write(record_path)

    def request(checkpoint: str, **fields) -> TrainRequest:
        return TrainRequest(input_record=str(record_path), steps=args.steps,
                            updates_per_invocation=args.updates_per_invocation,
                            backend=args.backend, checkpoint=str(where / checkpoint),
                            **fields)

    # Warm-up (kernels compiled, the driver and the worker paths loaded): both ways once at
    # V = 256, untimed.
    warm = where / "warm.bin"
    input_record(256, args.mode).write(warm)
    for fields in ({}, {"shards": 2}):
        run_training(TrainRequest(input_record=str(warm), steps=2, updates_per_invocation=1,
                                  backend=args.backend, checkpoint=str(where / "warm.st"),
                                  overwrite=True, **fields))

    one_times: list[float] = []

    def one_progress(invocation, done) -> None:
        one_times.append(invocation.finished - invocation.began)

    begun = time.perf_counter()
    one = run_training(request("one.safetensors"), one_progress)
    one_wall = time.perf_counter() - begun
    outcomes = []

    def shard_progress(invocation, done) -> None:
        outcomes.extend(invocation.shards)

    begun = time.perf_counter()
    sharded = run_training(request("sharded.safetensors", shards=args.shards), shard_progress)
    sharded_wall = time.perf_counter() - begun
    difference = first_difference(one.checkpoint, sharded.checkpoint, args.vocab)
    same_losses = one.history == sharded.history

    steps = args.steps
    one_update_ms = 1000 * sum(one_times) / steps
    run_ms = 1000 * sum(o.run_seconds for o in outcomes) / steps
    load_s = sum(o.load_seconds for o in outcomes)
    save_s = sum(o.save_seconds for o in outcomes)
    figures = {
        "vocab": args.vocab, "mode": args.mode, "shards": args.shards, "steps": steps,
        "updates_per_invocation": args.updates_per_invocation, "backend": args.backend,
        "one_piece_wall_s": one_wall, "one_piece_ms_per_update": one_update_ms,
        "sharded_wall_s": sharded_wall, "sharded_update_ms_per_update": run_ms,
        "sharded_stream_in_s": load_s, "sharded_stream_out_s": save_s,
        "update_ratio": run_ms / one_update_ms,
        "identical": difference is None and same_losses,
    }
    print(f"V={args.vocab} {args.mode}, {steps} updates in invocations of "
          f"{args.updates_per_invocation}, {args.backend}:")
    print(f"  one piece:        {one_wall:8.2f} s wall, {one_update_ms:8.3f} ms/update "
          "(its invocations, saves aside)")
    print(f"  {args.shards} shards in turn: {sharded_wall:8.2f} s wall, {run_ms:8.3f} ms/update "
          f"(the shards' updates), streaming in {load_s:.2f} s, out {save_s:.2f} s")
    print(f"  ratio of update time, shards / one piece: {run_ms / one_update_ms:.3f}x; "
          f"(shards' updates + streaming) / one piece's invocations: "
          f"{(1000 * sum(o.seconds for o in outcomes) / steps) / one_update_ms:.2f}x")
    print(f"  bytes: {'identical' if difference is None else 'DIFFER at ' + difference}; "
          f"losses: {'identical' if same_losses else 'DIFFER'}")
    if args.json:
        print(json.dumps(figures))
    shutil.rmtree(where, ignore_errors=True)
    return 0 if figures["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
