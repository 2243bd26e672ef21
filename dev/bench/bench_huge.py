"""Vocabularies no dense table holds, on one GPU: every command a process, its wall time
and peak RSS (`dev.bench.processes`).

    PYTHONPATH=src:. python3 -m dev.bench.bench_huge DIR --json out.json
    PYTHONPATH=src:. python3 -m dev.bench.bench_huge DIR --tokens 2000000 --steps 20 \\
        --backend cpu          # the same commands in seconds, without a GPU

Corpus mode at V = 262144: `--tokens` ids (Zipf-like over V, as a token corpus's
frequencies are; uint32 raw files, the last tenth as validation) counted with `bob
count`, then `bob train --counts ... --val-tokens ... --steps S -N S` (collapsed tables:
no dense table of that V exists), `bob generate` from the checkpoint. Hard mode at V =
200019 (GPT-4o's vocabulary): an input record of one target a row, `bob train --input`.
Printed per command: wall seconds, peak RSS against the 4 GB + O(K) target, and the
train commands' report (tables, loss, validation loss, ms per update). Everything written
is deleted at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from bob.records.binary import InputRecord
from dev.bench.processes import bob_env, run_process

CORPUS_VOCAB = 262144
HARD_VOCAB = 200019
HOST_TARGET_BYTES = 4e9


def zipf_ids(count: int, vocab: int, seed: int) -> np.ndarray:
    """Ids with a token corpus's shape: a Zipf law over a random order of the vocabulary."""
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.15, count), vocab) - 1
    return rng.permutation(vocab).astype(np.uint32)[ranks]


def bob(directory: Path, *words: object) -> dict:
    run = run_process([sys.executable, "-m", "bob", *map(str, words)], env=bob_env())
    found = {"command": " ".join(map(str, words[:2])), "seconds": run.seconds,
             "peak_rss_bytes": run.peak_rss_bytes, "status": run.returncode}
    if run.returncode != 0:
        found["failure"] = run.failure
    elif "--json" in words:
        found["report"] = json.loads(run.stdout.strip().splitlines()[-1])
    else:
        found["stdout"] = run.stdout.strip()[-300:]
    peak = (run.peak_rss_bytes or 0) / 1e9
    print(f"bob {found['command']}: {run.seconds:.2f} s, peak RSS {peak:.2f} GB"
          + (f"  FAILED: {found['failure']}" if run.returncode else ""), flush=True)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--tokens", type=int, default=100_000_000)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    work = args.directory
    work.mkdir(parents=True, exist_ok=True)
    ids = zipf_ids(args.tokens, CORPUS_VOCAB, 1)
    cut = len(ids) * 9 // 10
    ids[:cut].tofile(work / "train.bin")
    ids[cut:].tofile(work / "val.bin")
    del ids
    steps = str(args.steps)
    results = {"tokens": args.tokens, "steps": args.steps, "backend": args.backend}
    results["count"] = bob(work, "count", "--tokens", work / "train.bin", "--vocab",
                           CORPUS_VOCAB, "-o", work / "train.counts", "--overwrite", "--json")
    results["train_corpus"] = bob(work, "train", "--counts", work / "train.counts",
                                  "--val-tokens", work / "val.bin", "--vocab", CORPUS_VOCAB,
                                  "--steps", steps, "-N", steps, "--backend", args.backend,
                                  "-c", work / "corpus.safetensors", "--overwrite", "--json")
    results["generate"] = bob(work, "generate", "-c", work / "corpus.safetensors", "--ids",
                              "5", "-n", "20", "--seed", "1")
    targets = zipf_ids(HARD_VOCAB, HARD_VOCAB, 2) % HARD_VOCAB
    InputRecord.hard(targets.astype(np.uint32)).write(work / "hard.rec")
    results["train_hard"] = bob(work, "train", "--input", work / "hard.rec", "--steps", steps,
                                "-N", steps, "--backend", args.backend, "-c",
                                work / "hard.safetensors", "--overwrite", "--json")
    for name in ("train_corpus", "train_hard"):
        report = results[name].get("report")
        if report:
            per_update = 1e3 * report["wall_seconds"] / max(1, report["steps"])
            print(f"{name}: {report['tables']} tables ({report['tables_reason']}), loss "
                  f"{report['initial_loss']:.4f} -> {report['loss']:.4f}, validation "
                  f"{report.get('val_loss')}, {per_update:.3f} ms per update of the whole run",
                  flush=True)
    from bob.records.countsfile import CountsFile

    pairs = CountsFile.load(work / "train.counts").counts.keys.size \
        if (work / "train.counts").exists() else 0
    target = HOST_TARGET_BYTES + 64 * pairs
    worst = max((r.get("peak_rss_bytes") or 0) for r in results.values() if isinstance(r, dict))
    print(f"peak RSS {worst / 1e9:.2f} GB; target 4 GB + O(K) = {target / 1e9:.2f} GB at "
          f"K={pairs:,}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
