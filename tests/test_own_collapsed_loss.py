"""Bob's own collapsed loss kernels (bob.kernels.own.collapsed_loss): add_run alone against
bob.kernels.collapsed.runs.add_run, and each kernel on the emulator against the collapsed
reference byte for byte, on rows with no exception, one, many, all, a rest of one column,
zeros of both signs, subnormals, a NaN and a weightless corpus row; their schedules pass
bob.isa.check, their instructions print as nvdisasm prints them, and own_region takes
them."""

from __future__ import annotations

import numpy as np
import pytest

from bob.isa.builder import ARCH_FACTS
from bob.kernels import own
from bob.kernels import signatures as sig
from bob.kernels.collapsed import runs
from bob.kernels.own import collapsed_loss as cl
from bob.kernels.own.asm import LANES, Asm, Scratch, p, r
from bob.plan.model import Footprint, PointerParam, ScalarParam
from isa_emulator import Arena, Launch, constants
from isa_support import assert_printed_as_nvdisasm_prints
from own_support import (  # noqa: F401 - the fixture
    assert_checked_and_placed,
    code_order,
    reference,
    run_region,
)

ARCHS = ("sm_90", "sm_86")
pytestmark = pytest.mark.usefixtures("code_order")

RUN_PARAMS = (
    PointerParam("out", Footprint(4, ("count",)), "write"),
    PointerParam("acc", Footprint(4, ("count",)), "read"),
    PointerParam("x", Footprint(4, ("count",)), "read"),
    PointerParam("n", Footprint(4, ("count",)), "read"),
    ScalarParam("count", "u32"),
)


def add_run_image(arch: str):
    """out[i] = add_run(acc[i], x[i], n[i]), a lane each: lanes of one block loop
    different numbers of times."""
    s = Asm(arch, RUN_PARAMS)
    tid, ctaid, i, address, acc, x, n, pointer = 0, 1, 2, 4, 6, 7, 8, 10
    s.prologue(tid, ctaid, scratch=3)
    vote = cl.Vote(s, tid, 12, 13, 14)
    vote.start()
    s.lea(i, r(ctaid), r(tid), 8)
    s.isetp(6, "LT", r(i), s.param("count"))
    for register, name in ((acc, "acc"), (x, "x"), (n, "n")):
        s.mov(register, 0)
        s.pointer(pointer, name)
        s.wide(address, r(i), 4, pointer)
        s.ldg(register, address, guard=p(6))
    cl.add_run(s, vote, acc, x, n, Scratch(20, cl.ADD_RUN_SCRATCH))
    s.isetp(6, "LT", r(i), s.param("count"))
    s.pointer(pointer, "out")
    s.wide(address, r(i), 4, pointer)
    s.stg(address, acc, guard=p(6))
    s.exit()
    return s.image("test_add_run", shared_bytes=cl.SHARED_BYTES)


def run_add_run(arch: str, acc: np.ndarray, x: np.ndarray, n: np.ndarray) -> np.ndarray:
    image = add_run_image(arch)
    count = len(acc)
    arena = Arena()
    out = arena.put(np.zeros(count, np.uint32))
    pointers = [arena.put(np.ascontiguousarray(a).view(np.uint32))
                for a in (acc.astype(np.float32), x.astype(np.float32), n.astype(np.uint32))]
    facts = ARCH_FACTS[arch]
    grid = -(-count // LANES)
    bank = constants(facts.parameter_base, facts.descriptor_offset, LANES, grid,
                     [("u64", out), *(("u64", a) for a in pointers), ("u32", count)])
    memory = arena.memory()
    Launch(image.code, arch, bank, memory, arena.base, grid=grid,
           shared_bytes=image.shared_bytes).run()
    return Arena.read(memory, arena.base, out, np.uint32, count)


def _bits(values) -> np.ndarray:
    return np.array(values, np.uint32).view(np.float32)


def run_cases(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(acc, x, n) with the edges: binade crossings, ties from odd and even multiples,
    subnormal terms and sums, zeros of both signs, x below half a spacing, infinities,
    NaN, negative terms, n of 0, 1 and up to 2^24 and past it."""
    f = np.float32
    cases = [
        (0.0, 1.0, 0), (0.0, 1.0, 1), (0.0, 1.0, 1000), (0.0, 0.1, 300), (0.0, 0.1, 70000),
        (1.0, 1.0, 2**24 + 5), (0.0, 1.0, 2**25), (3.0, 1.5, 12345),
        (1.0, 2.0**-24, 5), (1.0 + 2.0**-23, 2.0**-24, 7),  # ties: even and odd multiples
        (1.0, 3 * 2.0**-25, 9), (2.0, 2.0**-23 * 3, 11), (1.0, 2.0**-26, 1000),
        (-0.0, 0.0, 3), (0.0, -0.0, 3), (-0.0, -0.0, 4), (5.0, 0.0, 9), (5.0, -0.0, 9),
        (np.inf, 1.0, 3), (1.0, np.inf, 3), (1.0, -np.inf, 2), (np.nan, 1.0, 2),
        (1.0, np.nan, 2), (np.inf, -np.inf, 2), (10.0, -1.0, 25), (-3.0, 0.5, 17),
        (0.0, 3.0e38, 5), (1.0e38, 1.0e38, 4), (7.0, 7.0, 100), (0.5, 1.0, 64),
        (2.0**-140, 2.0**-149, 1000), (0.0, 2.0**-149, 2**24 + 3), (0.0, 2.0**-130, 50000),
        (1.0e-38, 3.0e-39, 40000), (0.0, 1.0e-45, 9), (1.0, 1.0e-45, 2**31),
    ]
    acc = [f(a) for a, _, _ in cases]
    x = [f(b) for _, b, _ in cases]
    n = [c for _, _, c in cases]
    size = 300  # random lanes too, more than one block
    start = rng.choice([0.0, 1.0, 0.3, 1e-40], size).astype(f)
    term = (rng.random(size) * 2.0 ** rng.integers(-30, 4, size)).astype(f)
    term[rng.random(size) < 0.1] = _bits(rng.integers(1, 1 << 23, size))[:1]
    count = rng.integers(0, 5000, size)
    count[rng.random(size) < 0.05] = rng.integers(2**20, 2**25)
    return (np.concatenate([np.array(acc, f), start]), np.concatenate([np.array(x, f), term]),
            np.concatenate([np.array(n, np.int64), count]))


@pytest.mark.parametrize("arch", ARCHS)
def test_add_run_alone_matches_runs_add_run(arch):
    acc, x, n = run_cases(np.random.default_rng(7))
    got = run_add_run(arch, acc, x, n)
    want = np.array([runs.add_run(a, b, int(k)) for a, b, k in zip(acc, x, n, strict=True)],
                    np.float32).view(np.uint32)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(acc[i], x[i], int(n[i]), hex(got[i]), hex(want[i]))
                           for i in bad[:5]]


# -- the kernels -------------------------------------------------------------------------------


def row_columns(rng: np.random.Generator, vocab: int, kind: int) -> np.ndarray:
    """Row exception columns by kind: none, one, many (past 256 where V allows), all, all
    but one (a rest of one column), a few, the first few."""
    if kind == 0:
        return np.zeros(0, np.int64)
    if kind == 1:
        return rng.choice(vocab, 1, replace=False)
    if kind == 2:
        return rng.choice(vocab, min(vocab - 3, 280), replace=False)
    if kind == 3:
        return np.arange(vocab)
    if kind == 4:
        return np.delete(np.arange(vocab), rng.integers(vocab))
    if kind == 5:
        return np.arange(min(vocab, 4))
    return rng.choice(vocab, int(rng.integers(2, 9)), replace=False)


KINDS = 10


def collapsed_table(vocab: int, seed: int = 0):
    """A sound class index and its parameters and weights, row r of kind r % KINDS with
    edges planted: a zero maximum of both signs (the rest -0 or +0, a zero of the other
    sign among the exceptions, everything else negative), subnormals, a NaN, infinities,
    weightless rows (the shortcut's, one with a class past 2^125, one whose rest stands
    for no column), a rest that ties with an exception."""
    from bob.records.collapsed import ClassIndex

    rng = np.random.default_rng(seed)
    keys = []
    for row in range(vocab):
        columns = np.sort(row_columns(rng, vocab, row % KINDS))
        keys.append(row * vocab + columns)
    index = ClassIndex.from_keys(vocab, np.concatenate(keys))
    counts = np.diff(index.offsets)
    w = (rng.standard_normal(index.classes) * 3).astype(np.float32)
    weights = (np.abs(rng.standard_normal(index.exceptions)) / 4).astype(np.float32)
    for row in range(vocab):
        first, last = int(index.offsets[row]), int(index.offsets[row + 1])
        exceptions = slice(vocab + first, vocab + last)
        kind = row % KINDS
        if kind == 5 and last > first:  # a zero maximum: the literal order's zero
            w[exceptions] = -np.abs(w[exceptions]) - 1
            w[row] = np.float32(-0.0) if row % 20 == 5 else np.float32(0.0)
            w[vocab + first + (last - first) // 2] = (np.float32(0.0) if row % 20 == 5
                                                      else np.float32(-0.0))
        if kind == 6 and last > first:  # subnormals and a NaN
            w[vocab + first] = np.uint32(0x00000003).view(np.float32)
            w[vocab + last - 1] = np.float32(np.nan)
            w[row] = np.uint32(0x80400000).view(np.float32)
        if kind == 7:  # weightless, moderate or (every other one) one class past 2^125
            weights[first:last] = np.where(np.arange(last - first) % 2, -0.0, 0.0)
            if row % 20 == 17 and last > first:
                w[vocab + first] = np.float32(1e38)
        if kind == 3 and row % 20 == 13:  # weightless, its rest standing for no column
            weights[first:last] = 0.0
            w[row] = np.float32(3e38)
        if kind == 8 and last > first:  # the rest ties with an exception, +-inf
            w[row] = w[vocab + first]
            weights[first] = np.float32(np.inf) if row % 20 == 8 else weights[first]
        if kind == 9 and counts[row] > 1:
            w[vocab + first] = np.float32(-np.inf)
    return index, w, weights


def device_index(index) -> dict[str, np.ndarray]:
    return {"row_offsets": index.offsets.astype(np.uint32), "columns": index.columns,
            "lane_order": index.lane_order()}


def sizes(index) -> dict[str, int]:
    return {"vocab": index.vocab, "exceptions": index.exceptions, "classes": index.classes,
            "offsets": index.vocab + 1}


LOG2E = np.uint32(0x3FB8AA3B).view(np.float32)
LN2 = np.uint32(0x3F317218).view(np.float32)


def blocks_of(vocab: int) -> tuple[int, ...]:
    """Blocks to run: every one at V = 37; at 300, the first two and the last (the one a
    row of each kind, rows past V)."""
    grid = -(-vocab // 8)
    return tuple(range(grid)) if vocab <= 40 else (0, 1, grid - 1)


def rows_of(vocab: int) -> np.ndarray:
    return np.array([row for b in blocks_of(vocab) for row in range(8 * b, 8 * b + 8)
                     if row < vocab])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vocab", [37, 300])
def test_loss_corpus_matches_reference(arch, vocab):
    from bob.kernels.collapsed.reference import RowClasses, loss_corpus_classes
    from bob.kernels.reference import LossScalars
    index, w, weights = collapsed_table(vocab, seed=vocab)
    classes = RowClasses.of(vocab, index.offsets, index.columns)
    want = loss_corpus_classes(classes, w, weights, LossScalars(LOG2E, LN2)).view(np.uint32)
    sentinel = 0x7FBADBAD
    arguments = {"parameters": w, "weights": weights,
                 "loss": np.full(vocab, sentinel, np.uint32), **device_index(index),
                 "log2e": LOG2E, "ln2": LN2, **sizes(index)}
    got = run_region(cl.loss_corpus(arch), sig.COLLAPSED_LOSS_ONLY, -(-vocab // 8),
                     arguments, blocks=blocks_of(vocab))["loss"]
    rows = rows_of(vocab)
    bad = [(int(row), hex(got[row]), hex(want[row])) for row in rows if got[row] != want[row]]
    assert not bad, bad
    others = np.setdiff1d(np.arange(vocab), rows)
    assert (got[others] == sentinel).all()


def class_max_image(arch: str):
    """loss[r] := the class max of row r (Row.class_max), in the loss kernel's layout."""
    s = Asm(arch, sig.SIGNATURES[sig.COLLAPSED_LOSS_ONLY])
    vote = cl._kernel_start(s, ((cl.LOSS_PTR, "loss"),))
    row = cl.Row(s, vote)

    def run_row(next_row: str) -> None:
        row.start()
        row.chains()
        row.class_max()
        cl._store_lane0(s, cl.LOSS_PTR, cl.ROW, cl.M)

    cl._each_row(s, run_row)
    return s.image("test_class_max", shared_bytes=cl.SHARED_BYTES)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vocab", [37, 300])
def test_class_max_alone_matches_reference(arch, vocab):
    """The exact max, a zero's sign included (the loss hardly shows it): the literal
    order's zero where zeros of both signs are the maximum."""
    from bob.kernels.collapsed.reference import RowClasses, class_row_max

    index, w, weights = collapsed_table(vocab, seed=vocab + 1)
    for row in range(0, vocab, KINDS):  # more zero rows: +0 rest, -0 at a later column
        first, last = int(index.offsets[row]), int(index.offsets[row + 1])
        w[row] = np.float32(0.0)
        w[vocab + first:vocab + last] = np.float32(-0.0)
    want = class_row_max(RowClasses.of(vocab, index.offsets, index.columns), w)
    want = want.view(np.uint32)
    arguments = {"parameters": w, "weights": weights, "loss": np.zeros(vocab, np.float32),
                 **device_index(index), "log2e": LOG2E, "ln2": LN2, **sizes(index)}
    got = run_region(class_max_image(arch), sig.COLLAPSED_LOSS_ONLY, -(-vocab // 8),
                     arguments, blocks=blocks_of(vocab))["loss"].view(np.uint32)
    rows = rows_of(vocab)
    assert (want[rows] & 0x7FFFFFFF == 0).sum() >= 3  # zero maxima of both signs
    assert {0, 0x80000000} <= set(want[rows].tolist())
    bad = [(int(row), hex(got[row]), hex(want[row])) for row in rows if got[row] != want[row]]
    assert not bad, bad


@pytest.mark.parametrize("arch", ARCHS)
def test_loss_corpus_does_not_depend_on_mufu_s_last_bits(arch):
    """The reciprocal that sizes add_run's steps only cuts them shorter when it is off."""
    from bob.kernels.collapsed.reference import RowClasses, loss_corpus_classes
    from bob.kernels.reference import LossScalars

    vocab = 300
    index, w, weights = collapsed_table(vocab, seed=3)
    want = loss_corpus_classes(RowClasses.of(vocab, index.offsets, index.columns), w,
                               weights, LossScalars(LOG2E, LN2)).view(np.uint32)
    arguments = {"parameters": w, "weights": weights, "loss": np.zeros(vocab, np.float32),
                 **device_index(index), "log2e": LOG2E, "ln2": LN2, **sizes(index)}
    got = run_region(own.image(sig.COLLAPSED_LOSS_ONLY, arch), sig.COLLAPSED_LOSS_ONLY,
                     -(-vocab // 8), arguments, blocks=(0,), perturb=3)["loss"]
    assert (got.view(np.uint32)[:8] == want[:8]).all()


# -- the images --------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("region", sorted(cl.BUILDERS))
def test_schedule_passes_the_checker_and_own_region_takes_it(arch, region):
    assert_checked_and_placed(region, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_collapsed_loss_instructions_print_as_nvdisasm_prints_them(arch):
    assert_printed_as_nvdisasm_prints(
        [own.image(region, arch) for region in sorted(cl.BUILDERS)] + [add_run_image(arch)],
        arch)


def targets_of(index, seed: int) -> np.ndarray:
    """Each row's target: mostly one of its exceptions, else a column that is none (the
    rest's: a NaN loss) or one past V."""
    rng = np.random.default_rng(seed)
    vocab = index.vocab
    targets = rng.integers(0, vocab, vocab).astype(np.uint32)
    for row in range(vocab):
        first, last = int(index.offsets[row]), int(index.offsets[row + 1])
        if last > first and row % 3:
            targets[row] = index.columns[rng.integers(first, last)]
    targets[vocab // 2] = vocab + 7
    return targets


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vocab", [37, 300])
def test_loss_gradient_hard_matches_reference(arch, vocab):
    from bob.kernels.collapsed.reference import RowClasses, loss_gradient_hard_classes
    from bob.kernels.reference import LossScalars

    index, w, _ = collapsed_table(vocab, seed=vocab + 2)
    targets = targets_of(index, vocab)
    inverse_rows = np.float32(1.0) / np.float32(vocab)
    loss, grad = loss_gradient_hard_classes(RowClasses.of(vocab, index.offsets, index.columns),
                                            w, targets, LossScalars(LOG2E, LN2, inverse_rows))
    sentinel = 0x7FBADBAD
    arguments = {"parameters": w, "gradients": np.full(index.classes, sentinel, np.uint32),
                 "targets": targets, "loss": np.full(vocab, sentinel, np.uint32),
                 **device_index(index), "log2e": LOG2E, "ln2": LN2,
                 "inverse_rows": inverse_rows, **sizes(index)}
    got = run_region(own.image(sig.COLLAPSED_LOSS_HARD, arch), sig.COLLAPSED_LOSS_HARD,
                     -(-vocab // 8), arguments, blocks=blocks_of(vocab))
    compare_rows(index, got, loss, grad, sentinel)


def compare_rows(index, got: dict, loss: np.ndarray, grad: np.ndarray, sentinel: int,
                 rows: np.ndarray | None = None) -> None:
    """The rows run (rows_of's unless given) give the reference's loss and every class's
    gradient, bit for bit; the others are untouched."""
    vocab = index.vocab
    rows = rows_of(vocab) if rows is None else rows
    ran = np.zeros(vocab, bool)
    ran[rows] = True
    bad = [(int(row), hex(got["loss"][row]), hex(loss.view(np.uint32)[row])) for row in rows
           if got["loss"][row] != loss.view(np.uint32)[row]]
    assert not bad, bad
    class_ran = np.concatenate([ran, np.repeat(ran, np.diff(index.offsets))])
    g, want = got["gradients"].view(np.uint32), grad.view(np.uint32)
    wrong = np.flatnonzero(class_ran & (g != want))
    assert wrong.size == 0, [(int(c), hex(g[c]), hex(want[c])) for c in wrong[:6]]
    assert (g[~class_ran] == sentinel).all()
    assert (got["loss"].view(np.uint32)[~ran] == sentinel).all()


def check_loss_gradient_corpus(arch, index, w, weights, blocks, **rows) -> None:
    """The own corpus loss-gradient on `blocks` against the reference's classes."""
    from bob.kernels.collapsed.reference import RowClasses, loss_gradient_corpus_classes
    from bob.kernels.reference import LossScalars

    vocab = index.vocab
    loss, grad = loss_gradient_corpus_classes(
        RowClasses.of(vocab, index.offsets, index.columns), w, weights,
        LossScalars(LOG2E, LN2))
    sentinel = 0x7FBADBAD
    arguments = {"parameters": w, "gradients": np.full(index.classes, sentinel, np.uint32),
                 "weights": weights, "loss": np.full(vocab, sentinel, np.uint32),
                 **device_index(index), "log2e": LOG2E, "ln2": LN2, **sizes(index)}
    got = run_region(own.image(sig.COLLAPSED_LOSS_CORPUS, arch), sig.COLLAPSED_LOSS_CORPUS,
                     -(-vocab // 8), arguments, blocks=blocks)
    compare_rows(index, got, loss, grad, sentinel, **rows)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vocab", [37, 300])
def test_loss_gradient_corpus_matches_reference(arch, vocab):
    index, w, weights = collapsed_table(vocab, seed=vocab + 3)
    check_loss_gradient_corpus(arch, index, w, weights, blocks_of(vocab))


@pytest.mark.parametrize("arch", ARCHS)
def test_several_exceptions_a_lane(arch):
    """V = 700: chains of three columns, rows with two and three exceptions a lane (the
    runs between and after them), a block's rows."""
    index, w, weights = collapsed_table(700, seed=11)
    assert (np.bincount(index.columns[index.offsets[3]:index.offsets[4]] % LANES) == 3).any()
    check_loss_gradient_corpus(arch, index, w, weights, (0,), rows=np.arange(8))


# -- the fused kernels -------------------------------------------------------------------------

FUSED = {False: sig.COLLAPSED_FUSED_HARD, True: sig.COLLAPSED_FUSED_CORPUS}


def adam_steps(updates: int) -> np.ndarray:
    """adam_scalars: each update's decay, beta1, 1 - beta1, beta2, 1 - beta2, step size and
    eps_hat (a bias-corrected schedule, as the host writes it), and the padding."""
    steps = np.zeros((updates, 8), np.float32)
    for k in range(updates):
        t = k + 1
        steps[k, :7] = [1 - 1e-3 * 0.1, 0.9, 0.1, 0.999, 0.001,
                        0.1 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t),
                        1e-8 * np.sqrt(1 - 0.999 ** t)]
    return steps


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("corpus", [False, True])
@pytest.mark.parametrize("finish", [0, 1])
def test_fused_matches_the_reference_update_by_update(arch, corpus, finish):
    """Two updates of every row at V = 37 (each kind of row, edges planted, moments with
    zeros and a subnormal, a NaN and a negative second moment), then with `finish` the
    loss and gradients of the result: every class's w, m, v and gradient and every loss
    word, bit for bit; without it the loss words stay as they were."""
    vocab, updates = 37, 2
    index, w, weights = collapsed_table(vocab, seed=41 + corpus)
    rng = np.random.default_rng(42)
    m = (rng.standard_normal(index.classes) * 1e-3).astype(np.float32)
    v = (np.abs(rng.standard_normal(index.classes)) * 1e-6).astype(np.float32)
    m[:4], v[:4] = [0.0, -0.0, 1e-40, np.nan], [0.0, 1e-44, -1.0, 0.0]
    sentinel = 0x7FBADBAD
    region = FUSED[corpus]
    arguments = {"parameters": w, "first_moment": m, "second_moment": v,
                 "gradients": np.full(index.classes, sentinel, np.uint32),
                 "loss": np.full(vocab, sentinel, np.uint32),
                 "adam_scalars": adam_steps(updates), **device_index(index),
                 "log2e": LOG2E, "ln2": LN2, **sizes(index), "updates": updates,
                 "finish": finish}
    if corpus:
        arguments["weights"] = weights
    else:
        arguments["targets"] = targets_of(index, vocab)
        arguments["inverse_rows"] = np.float32(1.0) / np.float32(vocab)
    grid = -(-vocab // 8)
    got = run_region(own.image(region, arch), region, grid, arguments)
    want = reference(region, arguments, grid)
    for name in ("parameters", "first_moment", "second_moment", "gradients", "loss"):
        mine, theirs = got[name].view(np.uint32), want[name].view(np.uint32)
        wrong = np.flatnonzero(mine != theirs)
        assert wrong.size == 0, (name, [(int(c), hex(mine[c]), hex(theirs[c]))
                                        for c in wrong[:6]])
    assert (got["loss"].view(np.uint32) == sentinel).all() != bool(finish)
