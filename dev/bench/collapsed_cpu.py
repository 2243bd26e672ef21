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
  launches them), the kernel alone, then whole invocations of --launch updates through
  `bob.host.session.Session` on the cpu backend (scatter, losses, gathers, health and the
  host's part included; `--no-session` skips them).

Times are wall seconds; beside them the process's CPU seconds (all threads), which other
processes on a shared machine disturb less: on an idle machine wall is about CPU / cores.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from bob.backends import choose_backend
from bob.config import Hyper
from bob.host.session import Session
from bob.kernels import reference as dense_ref
from bob.kernels.collapsed import fast
from bob.kernels.collapsed import reference as ref
from bob.program.bob import BobConfig, adam_scalar_table
from bob.records.binary import InputRecord
from bob.records.checkpoint import TrainingState
from bob.records.collapsed import ClassIndex, CollapsedCheckpoint

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


@dataclass(frozen=True)
class Timing:
    wall: float
    cpu: float

    def per(self, count: int) -> str:
        """ms per `count`: wall (CPU)."""
        return f"{1e3 * self.wall / count:.2f} ms (CPU {1e3 * self.cpu / count:.2f})"


def timed(call: Callable[[], object]) -> Timing:
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


@dataclass(frozen=True)
class Workload:
    """The index, the weights and the arrays the kernels take."""

    index: ClassIndex
    counts: np.ndarray

    @property
    def weights(self) -> np.ndarray:
        return (self.counts / self.counts.sum()).astype(F32)

    def device(self) -> tuple:
        """The index as the arena holds it: u32 arrays, writable (as the session's are,
        so that both use one compiled specialization)."""
        index = self.index
        return index.vocab, index.device_offsets(), index.columns.copy(), index.lane_order()

    def zeros(self) -> list[np.ndarray]:
        return [np.zeros(self.index.classes, F32) for _ in range(3)]

    def fast_fused(self, tables: list[np.ndarray], steps: np.ndarray, finish: bool) -> None:
        vocab, classes = self.index.vocab, self.index.classes
        scalars = dense_ref.LossScalars.for_vocab(vocab)
        grad = np.empty(classes if finish else 0, F32)
        loss = np.empty(vocab if finish else 0, F32)
        fast.fused_corpus_classes(*self.device(), *tables, self.weights, steps, scalars.log2e,
                                  scalars.ln2, finish, grad, loss, fast.blocks())


def describe(work: Workload) -> str:
    per_row = work.index.counts()
    return (f"V = {work.index.vocab}, K = {work.index.exceptions} pairs, rows with data "
            f"{np.count_nonzero(per_row)} (1-5 exceptions: "
            f"{np.count_nonzero((per_row >= 1) & (per_row <= 5))}, the largest {per_row.max()})")


def fused_side_by_side(work: Workload, updates: int) -> Timing:
    """`updates` fused updates from zero by the reference and by Numba; equal tables. The
    reference's time per update."""
    steps = adam_scalar_table(Hyper(), 1, updates)
    first = timed(lambda: work.fast_fused(work.zeros(), steps[:1], True))
    print(f"first fast launch (compiles or loads the kernel): {first.wall:.1f} s")
    rows = ref.RowClasses.of(work.index.vocab, work.index.offsets, work.index.columns)
    scalars = dense_ref.LossScalars.for_vocab(work.index.vocab)
    weights = work.weights
    mine, theirs = work.zeros(), work.zeros()
    fast_time = timed(lambda: work.fast_fused(mine, steps, False))
    reference_time = timed(lambda: ref.fused_train_classes(
        *theirs, lambda w: ref.loss_gradient_corpus_classes(rows, w, weights, scalars), steps,
        False))
    same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32))
               for a, b in zip(mine, theirs, strict=True))
    print(f"fused, {updates} updates from zero, per update: reference "
          f"{reference_time.per(updates)}, fast {fast_time.per(updates)}: "
          f"{reference_time.wall / fast_time.wall:.0f}x; tables "
          f"{'equal' if same else 'DIFFER'}")
    losses_side_by_side(work, mine[0])
    return Timing(reference_time.wall / updates, reference_time.cpu / updates)


def losses_side_by_side(work: Workload, w: np.ndarray) -> None:
    """The seed schedule's loss-gradient and validation's loss alone, one call each."""
    index, weights = work.index, work.weights
    rows = ref.RowClasses.of(index.vocab, index.offsets, index.columns)
    scalars = dense_ref.LossScalars.for_vocab(index.vocab)
    grad, loss = np.empty(index.classes, F32), np.empty(index.vocab, F32)
    for name, fast_call, reference_call in (
        ("loss-gradient", lambda: fast.loss_gradient_corpus_classes(
            *work.device(), w, weights, scalars.log2e, scalars.ln2, grad, loss, fast.blocks()),
         lambda: ref.loss_gradient_corpus_classes(rows, w, weights, scalars)),
        ("loss alone", lambda: fast.loss_corpus_classes(
            *work.device(), w, weights, scalars.log2e, scalars.ln2, loss, fast.blocks()),
         lambda: ref.loss_corpus_classes(rows, w, weights, scalars)),
    ):
        fast_call()  # compiles or loads
        fast_time = min((timed(fast_call) for _ in range(3)), key=lambda t: t.wall)
        reference_time = timed(reference_call)
        print(f"{name}, one call: reference {reference_time.per(1)}, fast "
              f"{fast_time.per(1)}: {reference_time.wall / fast_time.wall:.0f}x")


def kernel_run(work: Workload, updates: int, launch: int, reference: Timing) -> None:
    """`updates` fused updates from zero in launches of `launch` updates, finish 1 each,
    and the reference's time per update over theirs."""
    tables = work.zeros()
    wall = cpu = 0.0
    for start in range(0, updates, launch):
        steps = adam_scalar_table(Hyper(), start + 1, min(launch, updates - start))
        spent = timed(lambda: work.fast_fused(tables, steps, True))  # noqa: B023 - called now
        wall, cpu = wall + spent.wall, cpu + spent.cpu
    total = Timing(wall, cpu)
    print(f"run, the fused kernel alone: {updates} updates in launches of {launch}: "
          f"{total.wall:.1f} s (CPU {total.cpu:.1f}), {total.per(updates)} per update; the "
          f"reference's update {updates * reference.wall / total.wall:.0f}x that (CPU "
          f"{updates * reference.cpu / total.cpu:.0f}x)")


def session_run(work: Workload, updates: int, launch: int) -> None:
    """The same updates as whole invocations through the session on the cpu backend."""
    index, vocab = work.index, work.index.vocab
    record = InputRecord.sparse(vocab, index.keys().astype(np.uint64), work.weights,
                                prompts=[1, 5])
    state = CollapsedCheckpoint.zeros(TrainingState(vocab, 0, Hyper(), "corpus", ""), index)
    config = BobConfig(vocab=vocab, prompts=2, updates=launch, mode="corpus", schedule="fused",
                       pairs=record.pairs, tables="collapsed", exceptions=index.exceptions)
    wall = cpu = 0.0
    loss = float("nan")
    with Session(choose_backend("cpu")) as session:
        for start in range(0, updates, launch):
            count = min(launch, updates - start)
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            result = session.invoke(replace(config, updates=count), state, record, "train")
            wall += time.perf_counter() - wall_start
            cpu += time.process_time() - cpu_start
            state, loss = result.checkpoint, result.loss
    total = Timing(wall, cpu)
    print(f"run, whole invocations of {launch} through the session: {updates} updates "
          f"{total.wall:.1f} s (CPU {total.cpu:.1f}), {total.per(updates)} per update; "
          f"loss {loss:.6f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", "-V", type=int, default=TOKEN_VOCAB)
    parser.add_argument("--rows", type=int, default=DATA_ROWS, help="rows with data")
    parser.add_argument("--pairs", type=int, default=PAIRS, help="distinct pairs (about)")
    parser.add_argument("--updates", "-N", type=int, default=1000, help="the run's updates")
    parser.add_argument("--launch", type=int, default=100, help="updates per fused launch")
    parser.add_argument("--reference-updates", type=int, default=2)
    parser.add_argument("--no-session", action="store_true", help="skip the session's run")
    args = parser.parse_args()

    work = Workload(*synthetic_index(args.vocab, args.rows, args.pairs))
    print(describe(work))
    reference = fused_side_by_side(work, args.reference_updates)
    kernel_run(work, args.updates, args.launch, reference)
    if not args.no_session:
        session_run(work, args.updates, args.launch)


if __name__ == "__main__":
    main()
