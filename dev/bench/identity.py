"""The same token run on several backends, compared by the digests of every table.

    PYTHONPATH=src python3 -m dev.bench.identity --backends cpu,cuda,nv \\
        --tokens train.bin --val-tokens val.bin --vocab 21553 --steps 20 -N 10

Each backend counts nothing of its own: the corpus and validation records are made once
(Bob's counter, sparse), then every backend trains the same updates from zero tables in
one session (`session.train`, the validation loss on the device), and its arena's tables
are streamed to sha256 a chunk at a time (`Session.stream_tables`: no table on the host).
It prints each backend's digests, loss and validation loss, and exits 1 when any differ:
at GPT-2's V the tables are 10 GB each, so this is how two backends are held to each other
byte for byte where the CPU is too slow to join them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bob.backends import choose_backend, resolve_submission
from bob.config import Hyper
from bob.host.data import CorpusSpec, corpus_record, count_corpus
from bob.host.session import Session, train
from bob.program.bob import BobConfig
from bob.records.checkpoint import StartingPoint, TrainingState

PIECE = 4 << 20  # a streamed chunk is hashed in pieces this large, side by side


class TableDigests:
    """sha256 of each table's pieces, hashed on threads while the chunk is still valid (the
    ring buffer is reused once the sink returns), then the sha256 of those in order: the
    same digest for the same bytes, whatever the chunking, at many GB/s."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(os.cpu_count() or 1)
        self.pieces: dict[str, list[tuple[int, bytes]]] = {}

    def add(self, name: str, offset: int, data: memoryview) -> None:
        jobs = [(offset + at, self.pool.submit(lambda at=at: hashlib.sha256(
                 data[at:at + PIECE]).digest())) for at in range(0, len(data), PIECE)]
        self.pieces.setdefault(name, []).extend((at, job.result()) for at, job in jobs)

    def hexdigests(self) -> dict[str, str]:
        self.pool.shutdown()
        return {name: hashlib.sha256(b"".join(d for _, d in sorted(pieces))).hexdigest()
                for name, pieces in self.pieces.items()}


def run(backend: str, config: BobConfig, record, validation, steps: int) -> dict:
    """One backend's run: its tables' digests, its last loss and validation loss."""
    choice = choose_backend(backend)
    config = BobConfig(**{**config.__dict__,
                          "submission": resolve_submission("auto", choice.name)})
    start = StartingPoint(TrainingState(config.vocab, 0, Hyper(), "corpus", record.data_digest))
    begun = time.perf_counter()
    with Session(choice) as session:
        (last,) = train(session, config, start, record, steps, keep_all=False,
                        validation=validation, tables=lambda index, done: False)
        trained = time.perf_counter() - begun
        digests = TableDigests()
        session.stream_tables(last.state.step, digests.add)
    return {"backend": backend, "submission": config.submission,
            "digests": digests.hexdigests(),
            "loss": last.loss, "validation": None if last.validation is None
            else last.validation[1], "train_seconds": trained}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="cpu,cuda,nv")
    parser.add_argument("--tokens", required=True, nargs="+")
    parser.add_argument("--val-tokens", nargs="+", default=())
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("-N", "--updates-per-invocation", type=int, default=10)
    parser.add_argument("--schedule", default="fused", choices=("seed", "fused"))
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    if args.steps % args.updates_per_invocation:
        parser.error("--steps must be a multiple of -N: every invocation runs one plan, and "
                     "the tables never leave the device")
    counted = count_corpus(CorpusSpec(tokens=tuple(args.tokens), vocab=args.vocab))
    record = corpus_record(counted, counted.name)
    validation = None
    if args.val_tokens:
        val = count_corpus(CorpusSpec(tokens=tuple(args.val_tokens), vocab=args.vocab))
        validation = corpus_record(val, val.name)
    config = BobConfig(vocab=args.vocab, prompts=0, updates=args.updates_per_invocation,
                       mode="corpus", schedule=args.schedule, pairs=record.pairs,
                       validation_pairs=0 if validation is None else validation.pairs)
    results = []
    for backend in args.backends.split(","):
        result = run(backend, config, record, validation, args.steps)
        results.append(result)
        digests = " ".join(f"{name} {digest[:16]}" for name, digest in result["digests"].items())
        print(f"{backend:7} ({result['submission']}): loss {result['loss']!r} val "
              f"{result['validation']!r} {digests} ({result['train_seconds']:.1f} s)",
              flush=True)
    same = all(r["digests"] == results[0]["digests"] and r["loss"] == results[0]["loss"]
               and r["validation"] == results[0]["validation"] for r in results)
    print(f"V={args.vocab} K={record.pairs} {args.steps} updates: "
          + ("every table identical on " + ", ".join(r["backend"] for r in results) if same
             else "DIFFERENT"))
    if args.json_path:
        with open(args.json_path, "w") as file:
            json.dump({"vocab": args.vocab, "pairs": record.pairs, "steps": args.steps,
                       "identical": same, "runs": results}, file, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
