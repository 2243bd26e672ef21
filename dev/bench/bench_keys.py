"""Sparse pair keys as u32 against u64, and the token files of the large-vocabulary counts.

    PYTHONPATH=src python3 -m dev.bench.bench_keys --tokens 50000000 --vocab 50257
    PYTHONPATH=src python3 -m dev.bench.bench_keys --tokens 100000000 --vocab 262144 \\
        --zipf 1.1 --write z100m_v262144.u32

Timing (the default): writes --tokens uint32 ids below --vocab (Zipf ids clipped to
V - 1, through a random permutation of the vocabulary so that the frequent ids spread over
the rows; a fixed seed) into --dir, then counts them with `counting.count_sources` on
--workers threads with Numba, the key type forced to u32 and to u64 in turn, --rounds
rounds. Prints each run's seconds, the best of each and their ratio; the counts must be
the same both ways. This is how `counting.key_dtype` chose u32 where it fits (V <= 65536).

--write FILE: only writes the token file (for `/usr/bin/time -v python -m bob count
--tokens FILE --vocab V --token-dtype uint32`, docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bob.records import counting
from bob.records.sources import resolve

SEED = 2026
CHUNK = 10_000_000  # ids drawn at a time: the generator's memory stays bounded


def write_tokens(path: Path, tokens: int, vocab: int, zipf: float) -> Path:
    rng = np.random.default_rng(SEED)
    spread = rng.permutation(vocab).astype("<u4")
    with path.open("wb") as file:
        for first in range(0, tokens, CHUNK):
            ranks = np.minimum(rng.zipf(zipf, min(CHUNK, tokens - first)) - 1, vocab - 1)
            spread[ranks].tofile(file)
    return path


def time_keys(path: Path, vocab: int, workers: int, rounds: int) -> None:
    found = resolve([str(path)], "uint32")
    chosen = counting.key_dtype
    seconds: dict[str, list[float]] = {"u32": [], "u64": []}
    results = {}
    try:
        for _ in range(rounds):
            for name, dtype in (("u32", np.uint32), ("u64", np.uint64)):
                counting.key_dtype = lambda _vocab, dtype=dtype: dtype
                counting.count_sources(found[:1], vocab, workers=1, engine="numba",
                                       block_bytes=1 << 16)  # compiled before the clock
                begun = time.perf_counter()
                counts = counting.count_sources(found, vocab, workers=workers, engine="numba")
                seconds[name].append(time.perf_counter() - begun)
                results[name] = counts
                print(f"{name}: {seconds[name][-1]:.2f} s ({counts.keys.size:,} distinct "
                      "pairs)", flush=True)
    finally:
        counting.key_dtype = chosen
    if not results["u32"].same_as(results["u64"]):
        raise SystemExit("the counts differ between the key types")
    best = {name: min(runs) for name, runs in seconds.items()}
    print(f"best: u32 {best['u32']:.2f} s, u64 {best['u64']:.2f} s "
          f"({best['u64'] / best['u32']:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=50_000_000)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--zipf", type=float, default=1.2, help="the ids' Zipf exponent")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where the token file goes")
    parser.add_argument("--write", type=Path, default=None, metavar="FILE",
                        help="only write the token file")
    args = parser.parse_args()
    if args.write is not None:
        write_tokens(args.write, args.tokens, args.vocab, args.zipf)
        return
    if args.vocab > counting.NARROW_KEY_MAX_VOCAB:
        raise SystemExit(f"--vocab {args.vocab}: u32 keys hold V up to "
                         f"{counting.NARROW_KEY_MAX_VOCAB} only")
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        path = write_tokens(Path(directory) / "tokens.u32", args.tokens, args.vocab, args.zipf)
        time_keys(path, args.vocab, args.workers, args.rounds)


if __name__ == "__main__":
    main()
