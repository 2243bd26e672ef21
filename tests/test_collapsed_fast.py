"""The collapsed tables' Numba kernels (bob.kernels.collapsed.fast) against their NumPy
reference, byte for byte.

Random indexes at V = 2 ... 4099 with rows of every shape (no exceptions, every column an
exception, a rest of one column, a few, a third of the row) and tables salted with edge
values (zeros of both signs, a zero max of mixed signs, subnormals, huge values whose
differences overflow, NaN, infinities); every region over the arena's dtypes; the exact
runs and the row reductions against the dense order on expanded rows; whole invocations
of both schedules through the CPU backend with the fast and the reference kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pytest

pytest.importorskip("numba")

from numba import njit  # noqa: E402

from bob.backends import choose_backend  # noqa: E402
from bob.backends.cpu import CpuBackend  # noqa: E402
from bob.config import Hyper  # noqa: E402
from bob.host.session import Session  # noqa: E402
from bob.kernels import arith  # noqa: E402
from bob.kernels import reference as dense_ref  # noqa: E402
from bob.kernels import signatures as sig  # noqa: E402
from bob.kernels.collapsed import fast  # noqa: E402
from bob.kernels.collapsed import reference as ref  # noqa: E402
from bob.kernels.collapsed.runs import add_run  # noqa: E402
from bob.kernels.memory import Memory  # noqa: E402
from bob.kernels.sets import reference_kernels  # noqa: E402
from bob.program.bob import adam_scalar_table  # noqa: E402
from bob.records.binary import InputRecord  # noqa: E402
from bob.records.checkpoint import TrainingState  # noqa: E402
from bob.records.collapsed import ClassIndex, CollapsedCheckpoint  # noqa: E402
from conftest import assert_same_bits as shared_assert_same_bits  # noqa: E402
from conftest import bob_config, first_difference  # noqa: E402

F32 = np.float32
VOCABS = (2, 3, 256, 257, 1000, 4099)
BLOCKS = 5  # blocks of rows per launch in the array-level calls: more than the cores


def seeds(vocab: int) -> range:
    """Tables to draw: a row shape or pattern needs many draws to turn up at V = 2, 3."""
    return range(12 if vocab <= 3 else 1)


def assert_same_bits(name: str, got: np.ndarray, want: np.ndarray) -> None:
    shared_assert_same_bits(name, got, want, ("fast", "reference"))


# -- random collapsed tables -------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """An index, a table of classes, corpus weights and hard targets."""

    index: ClassIndex
    w: np.ndarray  # f32[V + K]
    weights: np.ndarray  # f32[K]
    targets: np.ndarray  # u32[V]

    @property
    def vocab(self) -> int:
        return self.index.vocab

    @property
    def reference_index(self) -> ref.RowClasses:
        return ref.RowClasses.of(self.vocab, self.index.offsets, self.index.columns)

    def device_index(self) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        """vocab and the index as the arena holds it (u32, writable: Numba compiles
        another specialization for read-only arrays)."""
        return device_index(self.index)


def device_index(index: ClassIndex) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    return index.vocab, index.device_offsets(), index.columns.copy(), index.lane_order()


def _row_columns(rng: np.random.Generator, vocab: int, kind: int) -> set[int]:
    """A row's exception columns by kind: none, all, all but one, about a third, or a
    few (most rows)."""
    if kind == 0:
        return set()
    if kind == 1:
        return set(range(vocab))
    if kind == 2:
        return set(range(vocab)) - {int(rng.integers(vocab))}
    if kind == 3:
        return set(rng.choice(vocab, max(1, vocab // 3), replace=False).tolist())
    return set(rng.choice(vocab, int(rng.integers(1, min(vocab, 9) + 1)), replace=False)
               .tolist())


# Row patterns that decide the max's sign, the sums' rounding or a NaN: each draws the
# values of a row's classes (the rest first).
PATTERNS: tuple[Callable[[np.random.Generator, int], np.ndarray], ...] = (
    lambda rng, n: rng.choice(np.array([0.0, -0.0], F32), n),  # a zero max, mixed signs
    lambda rng, n: rng.choice(np.array([0.0, -0.0, -1.0, -7.5], F32), n),
    lambda rng, n: np.resize(np.array([-0.0, 0.0], F32), n),  # a -0 rest, +0 exceptions
    lambda rng, n: rng.choice(np.array([1e-45, -1e-45, 3e-39, -1e-40, 0.0], F32), n),
    lambda rng, n: rng.choice(np.array([3e38, -3e38, 1e38, -2e38], F32), n),  # overflow
    lambda rng, n: np.where(np.arange(n) == n - 1, F32(np.nan),
                            rng.standard_normal(n).astype(F32)),
    lambda rng, n: np.where(np.arange(n) == n // 2, F32(np.inf),
                            rng.standard_normal(n).astype(F32)),
    lambda rng, n: np.full(n, -np.inf, F32),  # no candidate
    lambda rng, n: rng.choice(np.array([-np.inf, np.nan], F32), n),
    lambda rng, n: np.where(np.arange(n) == 0, F32(np.nan),
                            rng.standard_normal(n).astype(F32)),  # a NaN rest
    lambda rng, n: np.full(n, 2.5, F32),  # equal terms: ties in the runs
    lambda rng, n: np.where(np.arange(n) == 0, F32(200.0),
                            rng.standard_normal(n).astype(F32)),  # a rest far above
)


def make_case(vocab: int, seed: int, hard: bool) -> Case:
    """Rows of every kind; about half the rows salted with a pattern."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, vocab, vocab).astype(np.uint32)
    kinds = rng.choice(5, vocab, p=[0.25, 0.02, 0.02, 0.03, 0.68])
    if vocab > 3:
        kinds[:4] = [0, 1, 2, 3]
    if vocab > 1000:  # past the first rows, no whole rows: they are slow in the reference
        wide = np.flatnonzero((kinds >= 1) & (kinds <= 3))
        kinds[wide[wide >= 4]] = 4
    offsets, columns = [0], []
    for r in range(vocab):
        chosen = _row_columns(rng, vocab, int(kinds[r]))
        if hard and r % 11 != 5:  # some targets are no exception: a NaN loss
            chosen.add(int(targets[r]))
        columns += sorted(chosen)
        offsets.append(len(columns))
    if hard:
        targets[vocab // 2] = vocab + 3  # never admitted by the host
    index = ClassIndex(vocab, np.array(offsets), np.array(columns, np.uint32))
    scales = rng.choice(np.array([1e-3, 1.0, 30.0], F32), vocab)
    w = (rng.standard_normal(index.classes) * scales[index_rows_of_classes(index)]).astype(F32)
    for r in range(vocab):
        if rng.random() < 0.5:
            where = class_positions(index, r)
            pattern = PATTERNS[int(rng.integers(len(PATTERNS)))]
            w[where] = pattern(rng, where.size)
    weights = (rng.random(index.exceptions) / max(1, index.exceptions)).astype(F32)
    weights[rng.random(index.exceptions) < 0.2] = 0.0
    for r in range(vocab):  # rows weighing nothing: +0, -0, both
        first, last = int(index.offsets[r]), int(index.offsets[r + 1])
        choice = rng.random()
        if choice < 0.2:
            weights[first:last] = 0.0
        elif choice < 0.3:
            weights[first:last] = -0.0
        elif choice < 0.4:
            weights[first:last] = rng.choice(np.array([0.0, -0.0], F32), last - first)
    return Case(index, w, weights, targets)


def index_rows_of_classes(index: ClassIndex) -> np.ndarray:
    return np.concatenate([np.arange(index.vocab), index.rows()])


def class_positions(index: ClassIndex, r: int) -> np.ndarray:
    """Row r's classes in a table of classes: the rest, then its exceptions."""
    first, last = int(index.offsets[r]), int(index.offsets[r + 1])
    return np.concatenate([[r], index.vocab + np.arange(first, last)])


# -- the exact runs and the reductions -----------------------------------------------------


@njit(error_model="numpy")
def _add_runs(acc, x, n, out):  # type: ignore[no-untyped-def]
    for i in range(acc.size):
        out[i] = fast.add_run(acc[i], x[i], n[i])


@njit(error_model="numpy")
def _literal_runs(acc, x, n, out):  # type: ignore[no-untyped-def]
    for i in range(acc.size):
        total = acc[i]
        for _ in range(n[i]):
            total = total + x[i]
        out[i] = total


def test_add_run_equals_the_additions_one_by_one() -> None:
    """Every branch of add_run: ties from odd and even accumulators, binade ends, terms
    below half a spacing, subnormals, overflow to inf, zeros, negative and non-finite
    terms, against n literal binary32 additions and runs.add_run."""
    rng = np.random.default_rng(7)
    count = 20000
    x = (2.0 ** rng.uniform(-149, 127, count)).astype(F32)
    with np.errstate(over="ignore"):  # some accumulators overflow to inf: wanted
        acc = (x * (2.0 ** rng.integers(-3, 30, count))).astype(F32)
    # ties: acc = a u (a odd or even) and x = (f + 1/2) u, u acc's spacing
    tie = np.flatnonzero(rng.random(count) < 0.3)
    spacing = 2.0 ** rng.integers(-149, 80, tie.size)
    acc[tie] = (rng.integers(1 << 23, 1 << 24, tie.size) * spacing).astype(F32)
    x[tie] = ((rng.integers(0, 1 << 12, tie.size) + 0.5) * spacing).astype(F32)
    x[:40] = [0.0, -0.0, np.nan, np.inf, -np.inf, -1.0, 1e-45, 3e38, 2.0, 0.5] * 4
    acc[:40:3] = 0.0
    acc[40:50] = [np.inf, np.nan, -0.0, 3.4e38, 1e-45, -5.0, 16777216.0, 1.0, 0.0, 8388607.0]
    n = rng.integers(0, 3000, count).astype(np.int64)
    got, want = np.empty(count, F32), np.empty(count, F32)
    _add_runs(acc, x, n, got)
    _literal_runs(acc, x, n, want)
    assert_same_bits("add_run", arith.canonicalize_nan(got), arith.canonicalize_nan(want))
    spec = np.array([add_run(a, b, k) for a, b, k in zip(acc[:2000], x[:2000], n[:2000],
                                                           strict=True)], F32)
    assert_same_bits("runs.add_run", arith.canonicalize_nan(got[:2000]),
                     arith.canonicalize_nan(spec))


@njit(error_model="numpy")
def _class_sums(vocab, offsets, columns, order, values, out):  # type: ignore[no-untyped-def]
    lanes = fast.lanes_scratch()
    for r in range(vocab):
        first = np.int64(offsets[r])
        count = np.int64(offsets[r + 1]) - first
        out[r] = fast._class_sum(vocab, values[r], values, vocab, columns, order, first,
                                 count, lanes)


@njit(error_model="numpy")
def _class_maxima(vocab, offsets, columns, order, w, out):  # type: ignore[no-untyped-def]
    lanes = fast.lanes_scratch()
    for r in range(vocab):
        first = np.int64(offsets[r])
        count = np.int64(offsets[r + 1]) - first
        out[r] = fast._class_max(vocab, w, r, columns, order, first, count, lanes)


@pytest.mark.parametrize("vocab", VOCABS)
def test_the_row_reductions_follow_the_dense_order(vocab: int) -> None:
    """The row max and the row sum of every expanded row, in the literal order of
    ARITHMETIC.md section 6 (the sign of a zero max and every rounding depend on it)."""
    case = make_case(vocab, vocab + 1, hard=False)
    index = case.index
    rows = np.arange(vocab)
    got = np.empty(vocab, F32)
    _class_maxima(*case.device_index(), case.w, got)
    assert_same_bits("row max", got, arith.row_max_in_order(index.expand(case.w, rows)))
    rng = np.random.default_rng(vocab)
    positive = np.abs(case.w)  # sums of exponential-like terms, edge values included
    positive[rng.random(positive.size) < 0.3] = F32(0.3)  # runs of ties
    for values in (positive, case.w):
        _class_sums(*case.device_index(), values, got)
        want = arith.row_sum(index.expand(values, rows))
        assert_same_bits("row sum", arith.canonicalize_nan(got), arith.canonicalize_nan(want))


@pytest.mark.parametrize("vocab", [2, 3, 256, 257, 700])
def test_a_zero_max_of_both_signs_takes_the_lanes_order(vocab: int) -> None:
    """Rows of zeros of both signs and negatives, the rest present or not: each lane's
    first zero, then the tree, exactly as the dense max."""
    rng = np.random.default_rng(vocab + 3)
    offsets, columns = [0], []
    for r in range(vocab):
        size = vocab if r % 5 == 0 else int(rng.integers(0, vocab + 1))
        columns += sorted(rng.choice(vocab, size, replace=False).tolist())
        offsets.append(len(columns))
    index = ClassIndex(vocab, np.array(offsets), np.array(columns, np.uint32))
    values = np.array([0.0, -0.0, -0.0, -3.0, -np.inf, np.nan], F32)
    w = rng.choice(values, index.classes)
    w[::7] = 1e38  # some rests absent: never a candidate
    got = np.empty(vocab, F32)
    _class_maxima(*device_index(index), w, got)
    assert_same_bits("row max", got, arith.row_max_in_order(index.expand(w, np.arange(vocab))))
    assert_same_bits("row max", got, ref.class_row_max(
        ref.RowClasses.of(vocab, index.offsets, index.columns), w))


# -- the loss kernels --------------------------------------------------------------------------


def _loss_scalars(vocab: int) -> dense_ref.LossScalars:
    return dense_ref.LossScalars.for_vocab(vocab)


@pytest.mark.parametrize("vocab", VOCABS)
def test_the_hard_loss_gradient_equals_the_reference(vocab: int) -> None:
    scalars = _loss_scalars(vocab)
    for seed in seeds(vocab):
        case = make_case(vocab, vocab + 100 * seed, hard=True)
        want_loss, want_grad = ref.loss_gradient_hard_classes(case.reference_index, case.w,
                                                              case.targets, scalars)
        grad = np.full(case.index.classes, 7.0, F32)
        loss = np.full(vocab, 7.0, F32)
        fast.loss_gradient_hard_classes(*case.device_index(), case.w, case.targets,
                                        scalars.log2e, scalars.ln2, scalars.inverse_rows, grad,
                                        loss, BLOCKS)
        assert_same_bits(f"gradients (seed {seed})", grad, want_grad)
        assert_same_bits(f"loss (seed {seed})", loss, want_loss)


@pytest.mark.parametrize("vocab", VOCABS)
def test_the_corpus_losses_equal_the_reference(vocab: int) -> None:
    """The loss-gradient and the loss alone; rows weighing nothing (+0, -0, both) take the
    shortcut where their exponents are tame and the full path otherwise."""
    scalars = _loss_scalars(vocab)
    for seed in seeds(vocab):
        case = make_case(vocab, vocab + 2 + 100 * seed, hard=False)
        want_loss, want_grad = ref.loss_gradient_corpus_classes(case.reference_index, case.w,
                                                                case.weights, scalars)
        grad = np.full(case.index.classes, 7.0, F32)
        loss = np.full(vocab, 7.0, F32)
        fast.loss_gradient_corpus_classes(*case.device_index(), case.w, case.weights,
                                          scalars.log2e, scalars.ln2, grad, loss, BLOCKS)
        assert_same_bits(f"gradients (seed {seed})", grad, want_grad)
        assert_same_bits(f"loss (seed {seed})", loss, want_loss)
        loss[:] = 7.0
        fast.loss_corpus_classes(*case.device_index(), case.w, case.weights, scalars.log2e,
                                 scalars.ln2, loss, 1)
        assert_same_bits(f"loss alone (seed {seed})", loss, ref.loss_corpus_classes(
            case.reference_index, case.w, case.weights, scalars))


def test_weightless_rows_are_zero_only_where_their_exponents_are_tame() -> None:
    """Rows whose weights are all zero: +0 gradients and loss for a finite row, but a
    row with a NaN or an infinity, or whose huge values' difference overflows to -inf
    ((L - z) * 0 is NaN there), and a row with an absent rest far above its max (its
    exp2 is inf, its gradient NaN), take the full path, as the reference does."""
    vocab = 5
    index = ClassIndex(vocab, np.array([0, 2, 4, 6, 11, 13]),
                       np.array([0, 3, 1, 2, 0, 4, 0, 1, 2, 3, 4, 1, 2], np.uint32))
    w = np.zeros(index.classes, F32)
    w[:vocab] = [0.5, -3e38, np.nan, 1e30, -1.0]
    w[vocab:] = [1.0, -0.0, 3e38, 2.0, np.inf, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 1.0, -2.0]
    weights = np.resize(np.array([0.0, -0.0], F32), index.exceptions)
    case = Case(index, w, weights, np.zeros(vocab, np.uint32))
    scalars = _loss_scalars(vocab)
    want_loss, want_grad = ref.loss_gradient_corpus_classes(case.reference_index, w, weights,
                                                            scalars)
    assert np.isnan(want_loss[1:3]).all() and np.isnan(want_grad[3])  # row 3's absent rest
    assert not want_loss[[0, 3, 4]].view(np.uint32).any()  # +0
    grad, loss = np.empty(index.classes, F32), np.empty(vocab, F32)
    fast.loss_gradient_corpus_classes(*case.device_index(), w, weights, scalars.log2e,
                                      scalars.ln2, grad, loss, BLOCKS)
    assert_same_bits("gradients", grad, want_grad)
    assert_same_bits("loss", loss, want_loss)


# -- the fused kernel --------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("finish", [False, True])
def test_the_fused_kernel_equals_the_reference(vocab: int, mode: str, finish: bool) -> None:
    """Several updates of every row (AdamW's scalars of steps 7 ...), then with finish the
    loss and gradients; without, the last update's gradients and the loss untouched."""
    for seed in seeds(vocab):
        hard = mode == "hard"
        fused_case(make_case(vocab, 3 * vocab + 100 * seed, hard), hard, finish)


def fused_case(case: Case, hard: bool, finish: bool, updates: int = 3) -> None:
    """`updates` fused updates of the case's tables (moments drawn), fast and reference."""
    vocab = case.vocab
    rng = np.random.default_rng(vocab)
    classes = case.index.classes
    tables = (case.w, (rng.standard_normal(classes) * 0.01).astype(F32),
              np.abs(rng.standard_normal(classes) * 1e-4).astype(F32))
    steps = adam_scalar_table(Hyper(), 7, updates)
    scalars = _loss_scalars(vocab)
    index = case.reference_index
    if hard:
        def loss_gradient(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return ref.loss_gradient_hard_classes(index, w, case.targets, scalars)
    else:
        def loss_gradient(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return ref.loss_gradient_corpus_classes(index, w, case.weights, scalars)
    want = [a.copy() for a in tables]
    want_grad = np.full(classes, 7.0, F32)
    want_loss = ref.fused_train_classes(*want, want_grad, loss_gradient, steps, finish)

    got = [a.copy() for a in tables]
    grad = np.full(classes, 7.0, F32)
    loss = np.full(vocab if finish else 0, 7.0, F32)
    if hard:
        fast.fused_hard_classes(*case.device_index(), *got, case.targets, steps, scalars.log2e,
                                scalars.ln2, scalars.inverse_rows, finish, grad, loss, BLOCKS)
    else:
        fast.fused_corpus_classes(*case.device_index(), *got, case.weights, steps,
                                  scalars.log2e, scalars.ln2, finish, grad, loss, BLOCKS)
    for name, a, b in zip(("parameters", "first moment", "second moment"), got, want,
                          strict=True):
        assert_same_bits(name, a, b)
    assert_same_bits("gradients", grad, want_grad)  # the last update's without finish
    if want_loss is not None:
        assert_same_bits("loss", loss, want_loss)


# -- every region over the arena ---------------------------------------------------------------


class Arena:
    """Tensors placed one after another in a byte buffer, as the kernels' arguments see
    them; `copy` gives a second arena with the same bytes at the same addresses."""

    BASE = 0x10000

    def __init__(self) -> None:
        self.buffer = np.zeros(0, np.uint8)
        self.args: dict = {}
        self.tensors: dict[str, tuple[int, np.dtype, int]] = {}

    def put(self, name: str, array: np.ndarray) -> None:
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        start = -(-self.buffer.size // 256) * 256
        grown = np.zeros(start + max(raw.size, 4), np.uint8)
        grown[:self.buffer.size] = self.buffer
        grown[start:start + raw.size] = raw
        self.buffer = grown
        self.args[name] = self.BASE + start
        self.tensors[name] = (start, array.dtype, array.size)

    def tensor(self, name: str) -> np.ndarray:
        start, dtype, size = self.tensors[name]
        return self.buffer[start:start + size * dtype.itemsize].view(dtype)

    def memory(self) -> Memory:
        return Memory(self.buffer, self.BASE)

    def copy(self) -> Arena:
        other = Arena()
        other.buffer, other.args = self.buffer.copy(), dict(self.args)
        other.tensors = dict(self.tensors)
        return other


def case_arena(case: Case, updates: int, finish: int) -> Arena:
    """Every argument any collapsed region takes, over one arena."""
    vocab, offsets, columns, order = case.device_index()
    rng = np.random.default_rng(vocab)
    classes = case.index.classes
    arena = Arena()
    tables = {"parameters": case.w,
              "first_moment": (rng.standard_normal(classes) * 0.01).astype(F32),
              "second_moment": np.abs(rng.standard_normal(classes) * 1e-4).astype(F32),
              "gradients": np.full(classes, 7.0, F32)}
    for name, table in tables.items():
        arena.put(name, table)
    arena.put("row_offsets", offsets)
    arena.put("columns", columns)
    arena.put("lane_order", order)
    arena.put("weights", case.weights)
    arena.put("targets", case.targets)
    arena.put("loss", np.full(vocab, 7.0, F32))
    arena.put("logits", np.full(vocab, 7.0, F32))
    arena.put("adam_scalars", adam_scalar_table(Hyper(), 1, updates))
    arena.put("health", np.array([5, (1 << 64) - 2, 0], np.uint64))
    scalars = _loss_scalars(vocab)
    arena.args.update(vocab=vocab, exceptions=case.index.exceptions, classes=classes,
                      offsets=vocab + 1, log2e=scalars.log2e, ln2=scalars.ln2,
                      inverse_rows=scalars.inverse_rows, updates=updates, finish=finish)
    return arena


def assert_same_arenas(region: str, got: Arena, want: Arena) -> None:
    for name in want.tensors:
        assert_same_bits(f"{region}: {name}", got.tensor(name), want.tensor(name))
    assert_same_bits(f"{region}: the arena", got.buffer, want.buffer)


def run_both(region: str, arena: Arena) -> None:
    got, want = arena.copy(), arena.copy()
    fast.KERNELS[region](got.memory(), got.args)
    ref.KERNELS[region](want.memory(), want.args)
    assert_same_arenas(region, got, want)


@pytest.mark.parametrize("vocab", VOCABS)
def test_every_region_over_the_arena_equals_the_reference(vocab: int) -> None:
    assert set(fast.KERNELS) == set(ref.KERNELS) == set(sig.COLLAPSED_REGIONS)
    for hard in (True, False):
        case = make_case(vocab, 5 * vocab + hard, hard)
        for finish in (0, 1):
            arena = case_arena(case, 2, finish)
            region = sig.COLLAPSED_FUSED_HARD if hard else sig.COLLAPSED_FUSED_CORPUS
            run_both(region, arena)
        arena = case_arena(case, 2, 1)
        for region in (sig.COLLAPSED_LOSS_HARD, sig.COLLAPSED_LOSS_CORPUS,
                       sig.COLLAPSED_LOSS_ONLY, sig.COLLAPSED_HEALTH):
            run_both(region, arena)


@pytest.mark.parametrize("vocab", [2, 257, 4099])
def test_gather_copies_bits_and_refuses_a_prompt_outside(vocab: int) -> None:
    case = make_case(vocab, vocab + 9, hard=False)
    w = case.w.copy()
    w.view(np.uint32)[::5] = 0x7FC01234  # NaN payloads are copied, not canonicalized
    case = replace(case, w=w)
    for prompt in (0, vocab - 1, vocab // 2, vocab, 0xFFFFFFFF):
        arena = case_arena(case, 1, 1)
        arena.put("prompt", np.array([prompt], np.uint32))
        run_both(sig.COLLAPSED_GATHER, arena)


@pytest.mark.parametrize("vocab", [3, 1000])
def test_scatter_writes_only_exceptions(vocab: int) -> None:
    """Keys of exceptions, keys of no exception, keys past V x V and near 2^64."""
    case = make_case(vocab, vocab + 4, hard=False)
    rng = np.random.default_rng(vocab)
    mine = case.index.keys()
    others = rng.integers(0, vocab * vocab, 50)
    keys = np.unique(np.concatenate([rng.permutation(mine)[:mine.size // 2], others]))
    keys = np.concatenate([rng.permutation(keys).astype(np.uint64),
                           np.array([vocab * vocab, (1 << 63) + 5, (1 << 64) - 1], np.uint64)])
    values = rng.random(keys.size).astype(F32)
    values.view(np.uint32)[::4] = 0x7FC00001  # bits, not floats
    arena = case_arena(case, 1, 1)
    arena.put("keys", keys)
    arena.put("values", values)
    arena.args["count"] = keys.size
    run_both(sig.COLLAPSED_SCATTER, arena)


def test_health_counts_and_wraps() -> None:
    """Non-finite classes per table added to health, modulo 2^64."""
    case = make_case(257, 1, hard=False)
    arena = case_arena(case, 1, 1)
    got = arena.copy()
    fast.KERNELS[sig.COLLAPSED_HEALTH](got.memory(), got.args)
    start = got.args["health"] - Arena.BASE
    health = got.buffer[start:start + 24].view(np.uint64)
    expected = np.array([5, (1 << 64) - 2, 0], np.uint64) + np.array(
        [np.count_nonzero(~np.isfinite(case.w)), 0, 0], np.uint64)
    assert np.array_equal(health, expected)
    run_both(sig.COLLAPSED_HEALTH, arena)


# -- whole invocations through the session -----------------------------------------------------


@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_invocations_with_fast_and_reference_kernels_agree(schedule: str, mode: str) -> None:
    """Two invocations of collapsed tables on the cpu backend, one session with the fast
    kernels and one with the reference: every tensor equal after each."""
    vocab, updates = 300, 4
    rng = np.random.default_rng(5)
    if mode == "hard":
        targets = rng.integers(0, vocab, vocab).astype(np.uint32)
        record = InputRecord.hard(targets, prompts=[1, 5])
        keys = np.arange(vocab) * vocab + targets
    else:
        keys = np.unique(rng.integers(0, vocab * vocab, 3000))
        values = rng.random(keys.size)
        record = InputRecord.sparse(vocab, keys, (values / values.sum()).astype(F32),
                                    prompts=[1, 5])
    index = ClassIndex.from_keys(vocab, np.unique(keys))
    state = CollapsedCheckpoint.zeros(TrainingState(vocab, 0, Hyper(), mode, ""), index)
    config = bob_config(vocab=vocab, prompts=2, updates=updates, mode=mode, schedule=schedule,
                        pairs=record.pairs, tables="collapsed", exceptions=index.exceptions)
    reference = replace(choose_backend("cpu"),
                        opener=lambda plan: CpuBackend(plan, reference_kernels()))
    states = [state, state]
    with Session(choose_backend("cpu")) as fast_session, Session(reference) as ref_session:
        for _ in range(2):
            for i, session in enumerate((fast_session, ref_session)):
                states[i] = session.invoke(config, states[i], record, "train").checkpoint
            assert fast_session.last_backend.kernel_set == "fast"
            plan = fast_session.last_backend.plan
            difference = first_difference(plan, ref_session.last_backend,
                                          fast_session.last_backend)
            assert difference is None, difference


def test_rows_of_a_token_vocabulary_equal_the_reference() -> None:
    """V = 50257: chains of 196 and 197 columns, doubling runs to 128, rows of a few
    exceptions and rows of thousands, hard and corpus losses."""
    vocab = 50257
    rng = np.random.default_rng(vocab)
    counts = np.where(rng.random(vocab) < 0.1, rng.integers(1, 6, vocab), 0)
    counts[rng.choice(vocab, 3, replace=False)] = [3000, 20000, vocab]
    keys = np.concatenate([r * vocab + np.sort(rng.choice(vocab, c, replace=False))
                           for r, c in enumerate(counts.tolist()) if c])
    index = ClassIndex.from_keys(vocab, keys)
    scales = rng.choice(np.array([1e-3, 1.0, 30.0], F32), vocab)
    w = (rng.standard_normal(index.classes) * scales[index_rows_of_classes(index)]).astype(F32)
    weights = (rng.random(index.exceptions) * 1e-5).astype(F32)
    targets = np.array([index.columns[index.offsets[r]] if counts[r] else r
                        for r in range(vocab)], np.uint32)
    case = Case(index, w, weights, targets)
    scalars = _loss_scalars(vocab)
    grad, loss = np.empty(index.classes, F32), np.empty(vocab, F32)
    fast.loss_gradient_hard_classes(*case.device_index(), w, targets, scalars.log2e,
                                    scalars.ln2, scalars.inverse_rows, grad, loss, BLOCKS)
    want_loss, want_grad = ref.loss_gradient_hard_classes(case.reference_index, w, targets,
                                                          scalars)
    assert_same_bits("hard gradients", grad, want_grad)
    assert_same_bits("hard loss", loss, want_loss)
    fast.loss_gradient_corpus_classes(*case.device_index(), w, weights, scalars.log2e,
                                      scalars.ln2, grad, loss, BLOCKS)
    want_loss, want_grad = ref.loss_gradient_corpus_classes(case.reference_index, w, weights,
                                                            scalars)
    assert_same_bits("corpus gradients", grad, want_grad)
    assert_same_bits("corpus loss", loss, want_loss)


@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_the_tiny_calls_compile_the_code_every_collapsed_invocation_runs(schedule: str,
                                                                         mode: str) -> None:
    """The collapsed kernels' tiny calls are of the very types their launches pass: training,
    validation and a forward invocation of collapsed tables add no signature (the CPU
    backend's compile notice and its compiling ahead cover them)."""
    from dataclasses import replace

    from bob.backends import choose_backend
    from bob.host.session import Session
    from bob.host.tables import named_keys, starting_tables
    from bob.kernels.sets import compiled_functions
    from bob.program.bob import BobConfig
    from bob.records.binary import InputRecord
    from bob.records.checkpoint import TrainingState

    calls = fast.tiny_calls()
    assert set(calls) == {f for functions in fast.COMPILED.values() for f in functions}
    assert set(fast.COMPILED) == set(sig.COLLAPSED_REGIONS) <= set(compiled_functions())
    for function, arguments in calls.items():
        function(*arguments)
    before = {function: len(function.signatures) for function in calls}
    rng = np.random.default_rng(5)
    vocab = 64
    if mode == "hard":
        record = InputRecord.hard(rng.integers(0, vocab, vocab).astype(np.uint32), (1, 2))
        validation = None
    else:
        keys = np.unique(rng.integers(0, vocab * vocab, 300))
        record = InputRecord.sparse(vocab, keys, np.full(keys.size, 1 / keys.size, F32),
                                    (1, 2))
        held = np.unique(rng.integers(0, vocab * vocab, 50))
        validation = InputRecord.sparse(vocab, held, np.full(held.size, 1 / held.size, F32))
    state = TrainingState(vocab, 0, Hyper(), mode, "", tables="collapsed")
    start = starting_tables("collapsed", state, named_keys(record, validation))
    config = BobConfig(vocab=vocab, prompts=2, updates=3, mode=mode, schedule=schedule,
                       pairs=record.pairs,
                       validation_pairs=0 if validation is None else validation.pairs,
                       tables="collapsed", exceptions=start.index.exceptions)
    with Session(choose_backend("cpu")) as session:
        trained = session.invoke(config, start, record, "train",
                                 validation=validation).checkpoint
        session.invoke(replace(config, updates=0), trained, record, "predict",
                       validation=validation)
        assert session.last_backend.kernel_set == "fast"
    assert {function: len(function.signatures) for function in calls} == before
