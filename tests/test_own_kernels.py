"""Bob's own seed kernels (bob.kernels.own) on the emulator against the NumPy reference,
byte for byte, with edge inputs; their schedules pass bob.isa.check; their instructions
print as nvdisasm prints them. Every test runs on the code in each ordering of its
straight runs (bob.isa.builder.ORDERINGS): as written, and list-scheduled."""

from __future__ import annotations

import numpy as np
import pytest

from bob.isa import table
from bob.isa.check import check
from bob.kernels import own
from bob.kernels import reference as ref
from bob.kernels import signatures as sig
from isa_support import assert_printed_as_nvdisasm_prints
from own_support import code_order, run_region  # noqa: F401 - the fixture

ARCHS = ("sm_90", "sm_86")

pytestmark = pytest.mark.usefixtures("code_order")


def _bits(x: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(x).view(np.uint32).reshape(-1).copy()
    b[np.isnan(np.ascontiguousarray(x).reshape(-1))] = 0x7FFFFFFF
    return b


def _table(rng, vocab: int) -> np.ndarray:
    t = (rng.standard_normal((vocab, vocab)) * 3).astype(np.float32)
    t[0, 3] = np.nan
    t[1, :] = -np.inf
    t[2, 5] = np.inf
    t[3, :] = 0.0
    t[3, 7] = -0.0
    t[3, 0] = -0.0  # the tree's max is -0 (lane 0 keeps its own on ties), the largest +0
    t[4, 2] = 1e-42
    t[5, :] = 1e-40  # subnormal row
    return t


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("region", sorted(own.BUILDERS))
def test_schedule_passes_the_checker(arch, region):
    image = own.image(region, arch)
    assert check(image.code, table(arch)) == []
    assert image.registers % 8 == 0 and image.registers <= 255


@pytest.mark.parametrize("arch", ARCHS)
def test_own_instructions_print_as_nvdisasm_prints_them(arch):
    assert_printed_as_nvdisasm_prints(
        [own.image(region, arch) for region in sorted(own.BUILDERS)], arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_row_gather(arch):
    image = own.row_gather(arch)
    table_ = _table(np.random.default_rng(1), 37)
    for prompt in (5, 36, 37):
        out = run_region(image, sig.GATHER, 1, {"logits": np.zeros(37, np.float32),
                                                "prompt": np.array([prompt], np.uint32),
                                                "table": table_, "vocab": 37})
        want = table_[prompt].view(np.uint32) if prompt < 37 else np.full(37, 0x7FFFFFFF)
        assert (out["logits"].view(np.uint32) == want).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_argmax_ties_and_nan(arch):
    image = own.greedy_argmax(arch)
    rows = [np.array([1, 3, 3, 2], np.float32), np.array([1, np.nan, 3, np.nan], np.float32),
            np.full(300, -np.inf, np.float32), np.array([-0.0, 0.0, 0.0], np.float32),
            np.random.default_rng(2).standard_normal(1000).astype(np.float32)]
    for row in rows:
        out = run_region(image, sig.ARGMAX, 1, {"prediction": np.zeros(1, np.uint32),
                                                "row": row, "vocab": len(row)})
        assert out["prediction"][0] == ref.greedy_argmax_rows(row[None])[0]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("perturb", (0, 2))
def test_adamw(arch, perturb):
    rng = np.random.default_rng(3)
    n = 50 * 60
    w = rng.standard_normal(n).astype(np.float32)
    g = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    m = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    v = (np.abs(rng.standard_normal(n)) * 1e-6).astype(np.float32)
    g[:6] = [np.nan, np.inf, -np.inf, 1e-40, 0.0, -0.0]
    v[6:8] = [0.0, 1e-44]
    scalars = ref.AdamScalars(0.99, 0.9, 0.1, 0.999, 0.001, 1e-3, 1e-8)
    args = dict(parameters=w.copy(), gradients=g.copy(), first_moment=m.copy(),
                second_moment=v.copy(), rows=50, columns=60,
                **{name: getattr(scalars, name) for name in scalars.__dataclass_fields__})
    out = run_region(own.adamw(arch), sig.ADAMW, 3, args, perturb=perturb)
    ref.adamw_update(w, g, m, v, scalars)
    for got, want in ((out["parameters"], w), (out["first_moment"], m),
                      (out["second_moment"], v)):
        assert (got.view(np.uint32) == _bits(want)).all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vocab", (37, 256, 1300))  # 1300: a second trip, partly past V
def test_loss_gradient_hard(arch, vocab):
    rng = np.random.default_rng(4)
    table_ = _table(rng, vocab)
    targets = rng.integers(0, vocab, vocab).astype(np.uint32)
    targets[6] = vocab + 3  # never admitted: a NaN loss, no -1 term
    scalars = ref.LossScalars.for_vocab(vocab)
    rows = tuple(range(8)) + (vocab - 1,)
    out = run_region(own.loss_gradient_hard(arch), sig.LOSS_HARD, vocab,
                     dict(parameters=table_, gradients=np.zeros_like(table_), targets=targets,
                          loss=np.zeros(vocab, np.float32), log2e=scalars.log2e,
                          ln2=scalars.ln2, inverse_rows=scalars.inverse_rows, vocab=vocab),
                     blocks=rows)
    loss, grad = ref.loss_gradient_hard_rows(table_, targets, scalars)
    rows_ = list(rows)
    assert (out["loss"].view(np.uint32)[rows_] == _bits(loss)[rows_]).all()
    got = out["gradients"].view(np.uint32).reshape(vocab, vocab)[rows_]
    assert (got == _bits(grad).reshape(vocab, vocab)[rows_]).all()


def test_a_tree_s_buffer_written_again_before_a_barrier_is_a_race(monkeypatch):
    # The loss kernels' trees need no closing barrier only because they take two buffers
    # in turn: on one buffer, a warp's next partial overwrites the max tree's partials
    # before the other warps read them, which the emulator refuses.
    from bob.kernels.own import seed
    from isa_emulator import EmulatorError

    vocab = 37
    table_ = _table(np.random.default_rng(4), vocab)
    scalars = ref.LossScalars.for_vocab(vocab)
    arguments = dict(parameters=table_, gradients=np.zeros_like(table_),
                     targets=np.zeros(vocab, np.uint32), loss=np.zeros(vocab, np.float32),
                     log2e=scalars.log2e, ln2=scalars.ln2,
                     inverse_rows=scalars.inverse_rows, vocab=vocab)
    run_region(seed.loss_gradient_hard("sm_90"), sig.LOSS_HARD, vocab, arguments, blocks=(0,))
    monkeypatch.setattr(seed, "SECOND_TREE", 0)
    with pytest.raises(EmulatorError, match="^shared race: warp 1 reads a word another warp wrote"):
        run_region(seed.loss_gradient_hard("sm_90"), sig.LOSS_HARD, vocab, arguments,
                   blocks=(0,))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vocab", (37, 256, 1300))
def test_loss_gradient_corpus(arch, vocab):
    rng = np.random.default_rng(5)
    table_ = _table(rng, vocab)
    weights = np.abs(rng.standard_normal((vocab, vocab))).astype(np.float32)
    weights[weights < 0.5] = 0
    scalars = ref.LossScalars.for_vocab(vocab)
    rows = tuple(range(8)) + (vocab - 1,)
    out = run_region(own.loss_gradient_corpus(arch), sig.LOSS_CORPUS, vocab,
                     dict(parameters=table_, gradients=np.zeros_like(table_), weights=weights,
                          loss=np.zeros(vocab, np.float32), log2e=scalars.log2e,
                          ln2=scalars.ln2, vocab=vocab), blocks=rows)
    loss, grad = ref.loss_gradient_corpus_rows(table_, weights, scalars)
    rows_ = list(rows)
    assert (out["loss"].view(np.uint32)[rows_] == _bits(loss)[rows_]).all()
    got = out["gradients"].view(np.uint32).reshape(vocab, vocab)[rows_]
    assert (got == _bits(grad).reshape(vocab, vocab)[rows_]).all()
