"""The Numba kernels (bob.kernels.fast) against the NumPy reference, bit for bit.

Every kernel on random inputs salted with edge values (NaN, infinities, signed
zeros, subnormals, huge and tiny numbers), exp2 and log2 on every 61st binary32,
and whole invocations of both schedules through the CPU backend.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("numba")

from numba import njit  # noqa: E402

from bob.backends import choose_backend  # noqa: E402
from bob.backends.cpu import CpuBackend, default_kernels  # noqa: E402
from bob.host.check import compare_backends, random_record  # noqa: E402
from bob.host.data import replace_prompts  # noqa: E402
from bob.host.session import Session, split_updates  # noqa: E402
from bob.kernels import arith, fast, sets  # noqa: E402
from bob.kernels import reference as ref  # noqa: E402
from bob.kernels import signatures as sig  # noqa: E402
from bob.kernels.sets import fast_kernels, reference_kernels
from bob.program.bob import (  # noqa: E402
    ADAM_SCALAR_NAMES,
    Hyper,
    adam_scalar_table,
)
from bob.records.checkpoint import Checkpoint  # noqa: E402
from conftest import assert_same_bits as shared_assert_same_bits  # noqa: E402
from conftest import bob_config  # noqa: E402

F32 = np.float32
EDGES = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-40, 1.17549435e-38,
                  3.4e38, -3.4e38, 1e-30, 88.0, -104.0, 150.0, -150.0, 1.0, -1.0], F32)


def assert_same_bits(name: str, got: np.ndarray, want: np.ndarray) -> None:
    shared_assert_same_bits(name, got, want, ("fast", "reference"))


def salted(rng: np.random.Generator, shape: tuple[int, ...], scale: float,
           fraction: float = 0.02) -> np.ndarray:
    """Normal values with a fraction of them replaced by edge values."""
    x = (rng.standard_normal(shape) * scale).astype(F32)
    where = rng.random(shape) < fraction
    x[where] = rng.choice(EDGES, int(where.sum()))
    return x


@njit(error_model="numpy")
def _exp2_all(x, out):  # type: ignore[no-untyped-def]
    for i in range(x.size):
        out[i] = fast._exp2(x[i])


@njit(error_model="numpy")
def _log2_all(x, out):  # type: ignore[no-untyped-def]
    for i in range(x.size):
        out[i] = fast._log2(x[i])


def every_61st_f32(start: int) -> np.ndarray:
    return (np.arange(start, 1 << 32, 61, dtype=np.uint64).astype(np.uint32)).view(F32)


def test_the_backend_picks_the_fast_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_kernels()[0] == "fast"
    monkeypatch.setenv("BOB_CPU_KERNELS", "reference")
    assert default_kernels() == ("reference", reference_kernels())
    monkeypatch.setenv("BOB_CPU_KERNELS", "quick")
    with pytest.raises(ValueError, match="BOB_CPU_KERNELS"):
        default_kernels()
    # Every region has both kernels: the dense program's here, the collapsed tables' in
    # bob.kernels.collapsed.
    assert set(fast.KERNELS) == set(ref.KERNELS)
    assert set(fast_kernels()) == set(reference_kernels()) == set(sig.SIGNATURES)


@pytest.mark.parametrize("start", [0, 17, 40])
def test_exp2_and_log2_on_every_61st_binary32(start: int) -> None:
    x = np.concatenate([every_61st_f32(start), EDGES])
    got = np.empty_like(x)
    _exp2_all(x, got)
    assert_same_bits("exp2", arith.canonicalize_nan(got), arith.canonicalize_nan(arith.exp2(x)))
    _log2_all(x, got)
    assert_same_bits("log2", arith.canonicalize_nan(got), arith.canonicalize_nan(arith.log2(x)))


@pytest.mark.parametrize("vocab", [1, 7, 256, 300, 700])
@pytest.mark.parametrize("scale", [0.5, 30.0])
def test_loss_gradients_equal_the_reference(vocab: int, scale: float) -> None:
    rng = np.random.default_rng(vocab)
    rows = 37
    table = salted(rng, (rows, vocab), scale)
    table[0] = 0.0  # all ties, +0
    table[1] = -0.0
    table[2, :] = -np.inf
    targets = rng.integers(0, vocab + 2, rows).astype(np.uint32)  # some never admitted
    weights = np.abs(salted(rng, (rows, vocab), 1.0 / vocab, 0.01))
    weights[3] = 0.0
    scalars = ref.LossScalars.for_vocab(vocab)
    grad, loss = np.empty_like(table), np.empty(rows, F32)

    want_loss, want_grad = ref.loss_gradient_hard_rows(table, targets, scalars)
    fast.loss_gradient_hard_rows(table, targets, scalars.log2e, scalars.ln2,
                                 scalars.inverse_rows, grad, loss)
    assert_same_bits("hard gradients", grad, want_grad)
    assert_same_bits("hard loss", loss, want_loss)

    want_loss, want_grad = ref.loss_gradient_corpus_rows(table, weights, scalars)
    fast.loss_gradient_corpus_rows(table, weights, scalars.log2e, scalars.ln2, grad, loss)
    assert_same_bits("corpus gradients", grad, want_grad)
    assert_same_bits("corpus loss", loss, want_loss)


@pytest.mark.parametrize("count", [3, 1000, 65536 + 17])
def test_adamw_equals_the_reference(count: int) -> None:
    rng = np.random.default_rng(count)
    w, g, m = (salted(rng, (count,), 1.0) for _ in range(3))
    v = np.abs(salted(rng, (count,), 1e-3))
    edges = np.array([0.0, -0.0, 1e-45, np.inf, np.nan], F32)
    v[:5] = edges[:min(5, count)]
    for step, zero_eps in ((1, False), (1000, False), (3, True)):
        row = adam_scalar_table(Hyper(), step, 1)[0]
        if zero_eps:  # 0 / 0 where v is 0 (Hyper refuses eps 0; the kernels must still agree)
            row[ADAM_SCALAR_NAMES.index("eps_hat")] = 0.0
        want = [a.copy() for a in (w, m, v)]
        ref.adamw_update(want[0], g, want[1], want[2], ref.AdamScalars(*row[:7]))
        got = [a.copy() for a in (w, m, v)]
        fast.adamw_update(got[0], g, got[1], got[2], row[:7].copy())
        for name, a, b in zip(("w", "m", "v"), got, want, strict=True):
            assert_same_bits(f"AdamW {name} (step {step})", a, b)


def edge_rows(rng: np.random.Generator, vocab: int) -> list[np.ndarray]:
    """Rows that test the reductions' order and the selects: NaN, infinities, signed-zero
    ties, subnormals, one huge element."""
    def row(values: list[float]) -> np.ndarray:
        return np.resize(np.array(values, F32), vocab)

    lone_nan = np.zeros(vocab, F32)
    lone_nan[vocab // 2] = np.nan
    one_big = (rng.standard_normal(vocab) * 0.1).astype(F32)
    one_big[-1] = 100.0  # every other exponential underflows, some to subnormals
    return [row([0.0]), row([-0.0]), row([-0.0, 0.0]), row([0.0, -0.0, -1.0]), row([np.nan]),
            row([-np.inf]), row([np.inf, 1.0]), row([1e-45, -1e-45, 1e-40]), lone_nan,
            one_big, row([1.0, np.nan, -np.inf])]


@njit(error_model="numpy")
def _row_max_all(x, out):  # type: ignore[no-untyped-def]
    lanes = np.empty(arith.LANES, F32)
    for r in range(x.shape[0]):
        out[r] = fast._row_max(x[r], lanes)


@njit(error_model="numpy")
def _row_sum_all(x, out):  # type: ignore[no-untyped-def]
    lanes = np.empty(arith.LANES, F32)
    for r in range(x.shape[0]):
        out[r] = fast._row_sum(x[r], lanes)


@pytest.mark.parametrize("vocab", [1, 3, 255, 256, 257, 512, 700])
def test_the_reductions_keep_the_specified_order(vocab: int) -> None:
    """row_max in the literal lane-and-tree order (the sign of a zero maximum depends on
    it) and row_sum, whose rounding depends on it, on rows wider and narrower than 256."""
    rng = np.random.default_rng(vocab)
    rows = np.stack([*edge_rows(rng, vocab), *salted(rng, (20, vocab), 1e3, 0.1)])
    rows[-1] = rng.choice(np.array([0.0, -0.0], F32), vocab)
    got = np.empty(rows.shape[0], F32)
    _row_max_all(rows, got)
    assert_same_bits("row_max", got, arith.row_max_in_order(rows))
    _row_sum_all(rows, got)
    assert_same_bits("row_sum", arith.canonicalize_nan(got),
                     arith.canonicalize_nan(arith.row_sum(rows)))


@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab,updates", [(1, 2), (5, 3), (17, 1), (255, 3), (256, 1), (256, 4),
                                           (300, 2), (512, 2), (513, 1)])
@pytest.mark.parametrize("finish", [True, False])
def test_the_fused_kernel_equals_the_reference(mode: str, vocab: int, updates: int,
                                               finish: bool) -> None:
    rng = np.random.default_rng(vocab + updates)
    table = salted(rng, (vocab, vocab), 2.0, 0.005)
    for r, row in enumerate(edge_rows(rng, vocab)[:vocab]):
        table[r] = row
    first = salted(rng, (vocab, vocab), 0.01, 0.005)
    second = np.abs(salted(rng, (vocab, vocab), 1e-4, 0.005))
    steps = adam_scalar_table(Hyper(), 7, updates)
    scalars = ref.LossScalars.for_vocab(vocab)
    targets = rng.integers(0, vocab + 1, vocab).astype(np.uint32)
    weights = np.abs(salted(rng, (vocab, vocab), 1.0 / vocab**2, 0.002))
    sentinel = np.full((vocab, vocab), 7.0, F32)

    want = [a.copy() for a in (table, first, second)]
    want_grad = sentinel.copy()
    if mode == "hard":
        def loss_gradient(w: np.ndarray, out: np.ndarray) -> tuple:
            return ref.loss_gradient_hard_rows(w, targets, scalars, out=out)
    else:
        def loss_gradient(w: np.ndarray, out: np.ndarray) -> tuple:
            return ref.loss_gradient_corpus_rows(w, weights, scalars, out=out)
    want_loss = ref.fused_train_rows(*want, loss_gradient, steps,
                                     want_grad if finish else None)

    got = [a.copy() for a in (table, first, second)]
    rows = vocab if finish else 0
    got_grad = sentinel.copy()
    grad, loss = got_grad[:rows], np.full(rows, 7.0, F32)
    if mode == "hard":
        fast.fused_hard_rows(*got, targets, steps, scalars.log2e, scalars.ln2,
                             scalars.inverse_rows, finish, grad, loss)
    else:
        fast.fused_corpus_rows(*got, weights, steps, scalars.log2e, scalars.ln2, finish, grad,
                               loss)
    for name, a, b in zip(("parameters", "first moment", "second moment"), got, want,
                          strict=True):
        assert_same_bits(name, a, b)
    assert_same_bits("gradients", got_grad, want_grad)  # untouched without finish
    if finish:
        assert want_loss is not None
        assert_same_bits("loss", loss, want_loss)


@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_invocations_with_fast_and_reference_kernels_agree(schedule: str, mode: str) -> None:
    config = bob_config(vocab=256, prompts=3, updates=4, mode=mode, schedule=schedule)
    record = random_record(config, 11)
    choices = (choose_backend("cpu"),
               replace(choose_backend("cpu"),
                       opener=lambda plan: CpuBackend(plan, ref.KERNELS)))
    with Session(choices[0]) as fast_session, Session(choices[1]) as reference_session:
        states = [Checkpoint.zeros(256, Hyper(), mode)] * 2
        for number, updates in enumerate(split_updates(10, config.updates)):
            for i, session in enumerate((fast_session, reference_session)):
                states[i] = session.invoke(replace(config, updates=updates), states[i], record,
                                           "train").checkpoint
            assert fast_session.last_backend.kernel_set == "fast"
            assert reference_session.last_backend.kernel_set == "given"
            difference = compare_backends(fast_session.last_backend,
                                          reference_session.last_backend, number)
            assert difference is None, str(difference)


@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_the_tiny_calls_compile_the_code_every_invocation_runs(schedule: str, mode: str) -> None:
    """compile_kernels compiles each function on tiny arrays: of the very types the kernels
    pass, or the first real invocation would compile again (silently: the cache index is
    not empty). Training, validation and a forward invocation add no signature."""
    calls = fast.tiny_calls()
    assert set(calls) == {f for functions in fast.COMPILED.values() for f in functions}
    for function, arguments in calls.items():
        function(*arguments)
    before = {function: len(function.signatures) for function in calls}
    config = bob_config(vocab=64, prompts=2, updates=3, mode=mode, schedule=schedule)
    record = random_record(config, 5)
    validation = None
    if mode == "corpus":
        validation = replace_prompts(random_record(config, 6), ())
        config = replace(config, validation_pairs=validation.pairs)
    with Session(choose_backend("cpu")) as session:
        state = Checkpoint.zeros(64, Hyper(), mode)
        state = session.invoke(config, state, record, "train", validation=validation).checkpoint
        session.invoke(replace(config, updates=0), state, record, "predict",
                       validation=validation)
        assert session.last_backend.kernel_set == "fast"
    assert {function: len(function.signatures) for function in calls} == before


def test_compiling_ahead_stops_when_the_run_is_asked_to(monkeypatch) -> None:
    """A session's backend compiles its plan's kernels, then (compile_ahead) those every
    session reaches, one at a time while keep_going says so: a run asked to stop leaves
    the rest for a later run."""
    assert set(sets.SESSION_REGIONS) == {sig.LOSS_HARD, sig.LOSS_CORPUS, sig.LOSS_ONLY_CORPUS}
    compiled: list[str] = []
    functions = [lambda name=name: compiled.append(name) for name in ("a", "b", "c")]
    monkeypatch.setattr(sets, "_uncompiled", lambda regions: functions)
    monkeypatch.setattr(sets, "tiny_calls", lambda: {f: () for f in functions})
    answers = iter([True, True, False])
    sets.compile_kernels(sets.SESSION_REGIONS, lambda: next(answers))
    assert compiled == ["a", "b"]
    sets.compile_kernels(sets.SESSION_REGIONS)
    assert compiled == ["a", "b", "a", "b", "c"]


def test_a_cpu_session_compiles_ahead_what_every_session_reaches(monkeypatch) -> None:
    asked: list[tuple[str, ...]] = []
    monkeypatch.setattr(sets, "compile_kernels",
                        lambda regions, keep_going=None: asked.append(tuple(regions)))
    config = bob_config(vocab=16, prompts=1, updates=1, mode="hard")
    with Session(choose_backend("cpu")) as session:
        session.plan_for(config)
    assert sets.SESSION_REGIONS in asked
