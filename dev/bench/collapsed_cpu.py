"""The collapsed tables' CPU kernels at GPT-2's vocabulary: the NumPy reference beside Numba.

    PYTHONPATH=src python3 -m dev.bench.collapsed_cpu [--vocab 50257] [--updates 1000]

A synthetic index shaped like a BPE token corpus's (the default: about 93,000 distinct
pairs over 14,000 rows with data, 36,000 rows with none; successor counts per row falling
as 1 / rank, so most rows have 1-5 exceptions and a few thousands; successors and pair
counts Zipf-like), Bob's zero start, corpus weights from the counts. In one process:

- the fused corpus kernel: the reference for --reference-updates updates, Numba for as
  many (after a launch that compiles or loads it), their tables compared byte for byte,
  ms/update and the ratio;
- the loss-gradient and the loss alone (the seed schedule's and validation's kernels):
  one call each, ms and the ratio;
- the run: --updates fused updates in launches of --launch (finish 1 each, as `bob train`
  launches them), seconds in all and ms/update.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from bob.config import Hyper
from bob.kernels import reference as dense_ref
from bob.kernels.collapsed import fast
from bob.kernels.collapsed import reference as ref
from bob.program.bob import adam_scalar_table
from bob.records.collapsed import ClassIndex

F32 = np.float32
TOKEN_VOCAB = 50257
DATA_ROWS = 14000
PAIRS = 93000
ID_RANGE = 15849  # the ids a small BPE corpus uses (docs/BENCHMARKS.md, V = 50257 tokens)
ZIPF_EXPONENT = 1.1
ZIPF_OFFSET = 10.0  # flattens the very top ranks
SEED = 50257


def synthetic_index(vocab: int, data_rows: int, pairs: int, seed: int = SEED,
                    ) -> tuple[ClassIndex, np.ndarray]:
    """An index like a BPE corpus's and its pairs' counts (float64[K]).

    Row of rank k (rows among the first ID_RANGE ids, in random order) gets about C / k
    distinct successors, at least 1, with C set for `pairs` in all; successors are drawn
    by a Zipf law over the same ids, counts per pair geometric (most pairs seen once)."""
    rng = np.random.default_rng(seed)
    ids = min(vocab, ID_RANGE)
    data_rows = min(data_rows, ids)
    rows = np.sort(rng.choice(ids, data_rows, replace=False))
    ranks = rng.permutation(data_rows) + 1
    scale = _scale_for(ranks, pairs, ids)
    successors = np.minimum(ids, np.maximum(1, np.round(scale / ranks))).astype(np.int64)
    popularity = 1.0 / (np.arange(1, ids + 1) + ZIPF_OFFSET) ** ZIPF_EXPONENT
    popularity /= popularity.sum()
    popular = rng.permutation(ids)  # the id of each popularity rank
    keys = []
    for row, wanted in zip(rows.tolist(), successors.tolist(), strict=True):
        drawn = np.unique(popular[rng.choice(ids, 2 * wanted + 8, p=popularity)])
        if drawn.size < wanted:
            drawn = np.union1d(drawn, rng.choice(ids, wanted, replace=False))
        keys.append(row * vocab + rng.permutation(drawn)[:wanted])
    keys = np.sort(np.concatenate(keys))
    counts = rng.geometric(0.6, keys.size).astype(np.float64)
    return ClassIndex.from_keys(vocab, keys), counts


def _scale_for(ranks: np.ndarray, pairs: int, ids: int) -> float:
    """C with sum(clip(round(C / rank), 1, ids)) about `pairs` (bisection)."""
    low, high = 0.0, float(pairs)
    for _ in range(50):
        middle = (low + high) / 2
        total = np.minimum(ids, np.maximum(1, np.round(middle / ranks))).sum()
        low, high = (middle, high) if total < pairs else (low, middle)
    return (low + high) / 2


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", "-V", type=int, default=TOKEN_VOCAB)
    parser.add_argument("--rows", type=int, default=DATA_ROWS, help="rows with data")
    parser.add_argument("--pairs", type=int, default=PAIRS, help="distinct pairs (about)")
    parser.add_argument("--updates", "-N", type=int, default=1000, help="the run's updates")
    parser.add_argument("--launch", type=int, default=100, help="updates per fused launch")
    parser.add_argument("--reference-updates", type=int, default=2)
    args = parser.parse_args()

    index, counts = synthetic_index(args.vocab, args.rows, args.pairs)
    vocab, exceptions = index.vocab, index.exceptions
    per_row = index.counts()
    print(f"V = {vocab}, K = {exceptions} pairs, rows with data {np.count_nonzero(per_row)}, "
          f"with 1-5 exceptions {np.count_nonzero((per_row >= 1) & (per_row <= 5))}, "
          f"largest {per_row.max()}")
    weights = (counts / counts.sum()).astype(F32)
    classes = index.classes
    device = (vocab, index.device_offsets(), index.columns, index.lane_order())
    rows = ref.RowClasses.of(vocab, index.offsets, index.columns)
    scalars = dense_ref.LossScalars.for_vocab(vocab)
    blocks = fast.blocks()

    def zeros() -> list[np.ndarray]:
        return [np.zeros(classes, F32) for _ in range(3)]

    def fast_fused(tables: list[np.ndarray], steps: np.ndarray, finish: bool) -> None:
        grad = np.empty(classes if finish else 0, F32)
        loss = np.empty(vocab if finish else 0, F32)
        fast.fused_corpus_classes(*device, *tables, weights, steps, scalars.log2e,
                                  scalars.ln2, finish, grad, loss, blocks)

    n = args.reference_updates
    steps = adam_scalar_table(Hyper(), 1, n)
    compile_s = timed(lambda: fast_fused(zeros(), steps[:1], True))
    mine, theirs = zeros(), zeros()
    fast_s = timed(lambda: fast_fused(mine, steps, False))
    reference_s = timed(lambda: ref.fused_train_classes(
        *theirs, lambda w: ref.loss_gradient_corpus_classes(rows, w, weights, scalars), steps,
        False))
    same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32))
               for a, b in zip(mine, theirs, strict=True))
    print(f"first fast launch (compiles or loads the kernel) {compile_s:.1f} s")
    print(f"fused, {n} updates from zero: reference {1e3 * reference_s / n:.1f} ms/update, "
          f"fast {1e3 * fast_s / n:.2f} ms/update: {reference_s / fast_s:.0f}x; tables "
          f"{'equal' if same else 'DIFFER'}")

    grad, loss = np.empty(classes, F32), np.empty(vocab, F32)
    w = mine[0]
    for name, fast_call, reference_call in (
        ("loss-gradient", lambda: fast.loss_gradient_corpus_classes(
            *device, w, weights, scalars.log2e, scalars.ln2, grad, loss, blocks),
         lambda: ref.loss_gradient_corpus_classes(rows, w, weights, scalars)),
        ("loss alone", lambda: fast.loss_corpus_classes(
            *device, w, weights, scalars.log2e, scalars.ln2, loss, blocks),
         lambda: ref.loss_corpus_classes(rows, w, weights, scalars)),
    ):
        fast_call()  # compiles or loads
        fast_s = min(timed(fast_call) for _ in range(3))
        reference_s = timed(reference_call)
        print(f"{name}: reference {1e3 * reference_s:.1f} ms, fast {1e3 * fast_s:.2f} ms: "
              f"{reference_s / fast_s:.0f}x")

    tables = zeros()
    total = 0.0
    for start in range(0, args.updates, args.launch):
        steps = adam_scalar_table(Hyper(), start + 1, min(args.launch, args.updates - start))
        begin = time.perf_counter()
        fast_fused(tables, steps, True)
        total += time.perf_counter() - begin
    print(f"run: {args.updates} fused updates in launches of {args.launch}: {total:.1f} s, "
          f"{1e3 * total / args.updates:.2f} ms/update")


if __name__ == "__main__":
    main()
