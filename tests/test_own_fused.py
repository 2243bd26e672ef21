"""Bob's own fused resident kernels (bob.kernels.own.fused: bob-fused-train and -corpus,
V <= 1024) on the emulator against the NumPy reference, byte for byte: several updates
with their own AdamW scalars, finish on and off, edge values planted in the parameters,
moments and weights; a vocabulary past the kernels' limit traps."""

from __future__ import annotations

import numpy as np
import pytest

from bob.kernels import own
from bob.kernels import reference as ref
from bob.kernels import signatures as sig
from bob.kernels.own import fused
from bob.kernels.own_regions import own_region
from bob.plan.placement import SM86, SM90
from isa_emulator import EmulatorError
from own_support import run_region

ARCHS = ("sm_90", "sm_86")
SENTINEL = 0x5EED5EED  # gradients and loss hold it where the kernel must not store
REGIONS = (sig.FUSED_HARD, sig.FUSED_CORPUS)


def _bits(x: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(x).view(np.uint32).reshape(-1).copy()
    b[np.isnan(np.ascontiguousarray(x).reshape(-1))] = 0x7FFFFFFF
    return b


def _same(name: str, got: np.ndarray, want: np.ndarray) -> None:
    """got's bits are want's (NaN canonical); else the first difference, by index."""
    want = _bits(want)
    differ = np.nonzero(got != want)[0]
    assert not len(differ), (f"{name}: {len(differ)} of {len(want)} differ, the first at "
                             f"{differ[0]}: {got[differ[0]]:#010x}, want {want[differ[0]]:#010x}")


def _tables(rng, vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parameters and both moments with edge values planted in rows 0 .. 7. A NaN or +inf
    anywhere in a row makes the whole row NaN within an update or two (rows 0, 1, 2, 7);
    rows 3 .. 6 keep theirs: zeros of both signs (row 3's max a zero whose sign the
    tree's order decides), subnormals, -inf parameters from an infinite first moment."""
    w = (rng.standard_normal((vocab, vocab)) * 3).astype(np.float32)
    m = (rng.standard_normal((vocab, vocab)) * 1e-2).astype(np.float32)
    v = (np.abs(rng.standard_normal((vocab, vocab))) * 1e-4).astype(np.float32)
    last = vocab - 1
    w[0, 3] = np.nan
    w[0, last] = np.float32(np.nan).view(np.uint32) | 0x80000123  # a NaN with sign, payload
    w[1, :] = -np.inf
    w[2, 5] = np.inf
    w[3, :] = 0.0
    w[3, 7::2] = -0.0
    w[3, 0] = -0.0  # the tree's max is -0 (lane 0 keeps its own on ties), the largest +0
    m[3, ::3] = -0.0
    v[3, ::5] = 0.0
    w[4, 2] = 1e-42
    w[4, last] = -1e-44
    w[5, :] = 1e-40  # a subnormal row
    m[5, 1::2] = -1e-45
    m[6, :4] = [np.inf, -0.0, 1e-41, -1e-44]
    v[6, :4] = [0.0, 1e-44, -0.0, 3e-39]
    m[6, last] = 1e-41
    v[6, last] = 1e-45
    m[7, :2] = [np.nan, -np.inf]
    v[7, 1:4] = [-1e-3, np.inf, np.nan]  # a negative one: its root is NaN
    return w, m, v


def _steps(updates: int) -> np.ndarray:
    """f32[updates][8] of AdamW scalars, each update its own (padding NaN: never read)."""
    steps = np.full((updates, 8), np.nan, np.float32)
    for k in range(updates):
        lr = 0.05 * (k + 1)
        t = k + 1
        steps[k, :7] = [1 - lr * 0.1, 0.9, 0.1, 0.999, 0.001,
                        lr * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t),
                        1e-8 * np.sqrt(1 - 0.999 ** t)]
    return steps


def _rows(vocab: int) -> tuple[int, ...]:
    """The rows with planted values, one in the middle and the last."""
    return (*range(8), vocab // 2 + 1, vocab - 1)


def _run(arch: str, corpus: bool, vocab: int, updates: int, finish: int, rows: tuple[int, ...],
         seed: int = 7, perturb: int = 0) -> None:
    rng = np.random.default_rng(seed + vocab)
    w, m, v = _tables(rng, vocab)
    steps = _steps(updates)
    scalars = ref.LossScalars.for_vocab(vocab)
    gradients = np.full((vocab, vocab), SENTINEL, np.uint32).view(np.float32)
    loss = np.full(vocab, SENTINEL, np.uint32).view(np.float32)
    arguments = dict(parameters=w, first_moment=m, second_moment=v, gradients=gradients,
                     loss=loss, adam_scalars=steps if updates else np.zeros(8, np.float32),
                     log2e=scalars.log2e, ln2=scalars.ln2, vocab=vocab, updates=updates,
                     finish=finish)
    if corpus:
        weights = np.abs(rng.standard_normal((vocab, vocab))).astype(np.float32)
        weights[weights < 0.7] = 0
        weights[2, 1] = np.inf
        weights[4, 3] = 1e-40
        weights[5, :] = 0.0  # no weight at all
        weights[6, 4] = -0.0
        weights[7, 4] = np.nan
        arguments["weights"] = weights
    else:
        targets = rng.integers(0, vocab, vocab).astype(np.uint32)
        # Targets >= V (never admitted): a NaN loss, no -1 term, whichever lane holds
        # column V + 3 in a slot partly in the row storing nothing.
        targets[vocab // 2 + 1] = vocab + 3
        targets[3] = 0xFFFFFFFF
        targets[6] = vocab - 1
        targets[5] = 0
        arguments["targets"] = targets
        arguments["inverse_rows"] = scalars.inverse_rows
    region = sig.FUSED_CORPUS if corpus else sig.FUSED_HARD
    out = run_region(own.image(region, arch), region, vocab, arguments, perturb=perturb,
                     blocks=rows)

    picked = list(rows)
    table, first, second = w[picked].copy(), m[picked].copy(), v[picked].copy()
    if corpus:
        mine = weights[picked]

        def loss_gradient(x, into):
            return ref.loss_gradient_corpus_rows(x, mine, scalars, out=into)
    else:
        mine = targets[picked]

        def loss_gradient(x, into):
            return ref.loss_gradient_hard_rows(x, mine, scalars, out=into)

    want_gradients = np.empty_like(table) if finish else None
    want_loss = ref.fused_train_rows(table, first, second, loss_gradient, steps,
                                     want_gradients)
    got = {name: out[name].view(np.uint32).reshape(-1, vocab)[picked].reshape(-1)
           for name in ("parameters", "first_moment", "second_moment", "gradients")}
    for name, want in (("parameters", table), ("first_moment", first),
                       ("second_moment", second)):
        _same(name, got[name], want)
    if finish:
        _same("gradients", got["gradients"], want_gradients)
        _same("loss", out["loss"].view(np.uint32)[picked], want_loss)
    else:  # neither tensor is touched (their footprints are 0)
        assert (out["gradients"].view(np.uint32) == SENTINEL).all()
        assert (out["loss"].view(np.uint32) == SENTINEL).all()
    # Rows no block ran keep their bytes.
    others = [row for row in range(vocab) if row not in rows]
    assert (out["parameters"].view(np.uint32).reshape(vocab, vocab)[others]
            == w.view(np.uint32)[others]).all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("corpus", (False, True), ids=("hard", "corpus"))
@pytest.mark.parametrize("vocab", (37, 256, 300))
@pytest.mark.parametrize("finish", (1, 0))
def test_fused_train_matches_the_reference(arch, corpus, vocab, finish):
    _run(arch, corpus, vocab, updates=3, finish=finish, rows=_rows(vocab))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("corpus", (False, True), ids=("hard", "corpus"))
@pytest.mark.parametrize("finish", (1, 0))
def test_fused_train_at_the_resident_limit(arch, corpus, finish):
    vocab = fused.RESIDENT_VOCAB
    rows = (3, 4, 6, vocab // 2 + 1, vocab - 1) if finish else (5, vocab - 1)
    _run(arch, corpus, vocab, updates=3, finish=finish, rows=rows)


@pytest.mark.parametrize("corpus", (False, True), ids=("hard", "corpus"))
def test_fused_train_one_update_and_none(corpus):
    _run("sm_90", corpus, 300, updates=1, finish=1, rows=(0, 4, 6, 7, 299), seed=11)
    _run("sm_90", corpus, 300, updates=0, finish=1, rows=(0, 2, 6, 7), seed=12)


@pytest.mark.parametrize("corpus", (False, True), ids=("hard", "corpus"))
@pytest.mark.parametrize("vocab", (37, 300))  # a lane's one element, and two
def test_fused_train_reads_every_update_s_scalars_across_staged_chunks(corpus, vocab):
    # Past two chunks of staged adam_scalars rows: the chunk in shared memory is filled
    # three times, the last partly (its lanes past the launch's rows load nothing).
    updates = 2 * fused.CHUNK_UPDATES + 5
    _run("sm_90", corpus, vocab, updates=updates, finish=1, rows=(0, 3, vocab - 1), seed=13)


@pytest.mark.parametrize("corpus", (False, True), ids=("hard", "corpus"))
def test_fused_train_does_not_depend_on_mufu_s_last_bits(corpus):
    _run("sm_90", corpus, 256, updates=2, finish=1, rows=(0, 5, 6, 7, 200), perturb=2)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("region", REGIONS)
@pytest.mark.parametrize("vocab", (fused.RESIDENT_VOCAB + 1, 4096))
def test_a_longer_row_traps(arch, region, vocab):
    tiny = np.zeros(4, np.float32)
    arguments = dict(parameters=tiny, first_moment=tiny, second_moment=tiny, gradients=tiny,
                     loss=tiny, adam_scalars=np.zeros(8, np.float32), targets=tiny.view(np.uint32),
                     weights=tiny, log2e=1.0, ln2=1.0, inverse_rows=1.0, vocab=vocab,
                     updates=1, finish=1)
    with pytest.raises(EmulatorError, match="^trap at"):
        run_region(own.image(region, arch), region, vocab, arguments, blocks=(0,))


@pytest.mark.parametrize("region", REGIONS)
def test_a_block_past_the_last_row_stores_nothing(region):
    vocab = 37
    table = np.arange(vocab * vocab, dtype=np.float32).reshape(vocab, vocab)
    arguments = dict(parameters=table, first_moment=table, second_moment=table,
                     gradients=table, loss=table[0], adam_scalars=_steps(1), weights=table,
                     targets=np.zeros(vocab, np.uint32), log2e=1.0, ln2=1.0, inverse_rows=1.0,
                     vocab=vocab, updates=1, finish=1)
    out = run_region(own.image(region, "sm_90"), region, vocab + 2, arguments,
                     blocks=(vocab, vocab + 1))
    for name in ("parameters", "first_moment", "second_moment", "gradients"):
        assert (out[name].reshape(vocab, vocab) == table).all(), name
    assert (out["loss"] == table[0]).all()


def test_the_limit_is_the_registry_s():
    for region in REGIONS:
        assert own.VOCAB_LIMITS[region] == fused.RESIDENT_VOCAB == 1024
        assert own.covers(region, 1024) and not own.covers(region, 1025)


@pytest.mark.parametrize("target", [SM90, SM86], ids=lambda t: t.name)
@pytest.mark.parametrize("region", REGIONS)
def test_own_region_accepts_the_images(target, region):
    declared = sig.declared_region(region)
    built = own_region(region, target)
    image = own.image(region, target.name)
    assert built.code == image.code and built.entry == declared.entry == image.name
    assert built.params == declared.params and built.registers == image.registers
    assert image.registers <= 64  # four blocks of 256 an SM, as NVRTC's launch bounds ask
