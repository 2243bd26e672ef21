"""The NumPy reference kernels: against float64 mathematics, against a scalar model of
the CUDA code, inside their declared footprints; and the CUDA source against the
signatures it must match."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from bob.kernels import arith
from bob.kernels import reference as ref
from bob.kernels import signatures as sig
from bob.kernels.memory import Memory
from bob.plan.model import PointerParam, ScalarParam
from bob.program.bob import Hyper, adam_scalar_table, adam_scalars
from conftest import shipped_ptx

F32 = np.float32
CUDA_SOURCE = Path(ref.__file__).parent / "cuda" / "bob_kernels.cu"


def bits_of(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def report(name: str, got: np.ndarray, want: np.ndarray) -> str:
    diff = np.abs(got.astype(np.float64) - want)
    i = np.unravel_index(np.argmax(diff), diff.shape)
    return f"{name}: largest difference {diff[i]:.3g} at {i}: {got[i]!r} vs {want[i]!r}"


# -- float64 mathematics --------------------------------------------------------------


def softmax64(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = table.astype(np.float64)
    m = w.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(w - m).sum(axis=1, keepdims=True))
    return np.exp(w - lse), lse[:, 0]


def hard64(table: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = table.shape[0]
    p, lse = softmax64(table)
    rows = np.arange(v)
    loss = lse - table.astype(np.float64)[rows, targets]
    p[rows, targets] -= 1.0
    return loss, p / v


def corpus64(table: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p, lse = softmax64(table)
    t = weights.astype(np.float64)
    loss = (t * (lse[:, None] - table.astype(np.float64))).sum(axis=1)
    return loss, t.sum(axis=1, keepdims=True) * p - t


def random_problem(v: int, seed: int, scale: float = 3.0):
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal((v, v)) * scale).astype(np.float32)
    targets = rng.integers(0, v, v).astype(np.uint32)
    counts = rng.integers(0, 50, (v, v)) * (rng.random((v, v)) < 0.2)
    weights = (counts / max(counts.sum(), 1)).astype(np.float32)
    return table, targets, weights


@pytest.mark.parametrize("v", [2, 37, 256, 300])
def test_hard_loss_and_gradient_match_float64(v):
    table, targets, _ = random_problem(v, seed=v)
    loss, grad = ref.loss_gradient_hard_rows(table, targets, ref.LossScalars.for_vocab(v))
    want_loss, want_grad = hard64(table, targets)
    assert loss.dtype == np.float32 and grad.dtype == np.float32
    assert np.allclose(loss, want_loss, rtol=2e-6, atol=2e-6), report("loss", loss, want_loss)
    assert np.allclose(grad, want_grad, rtol=1e-5, atol=1e-9), report("grad", grad, want_grad)


@pytest.mark.parametrize("v", [2, 37, 256, 300])
def test_corpus_loss_and_gradient_match_float64(v):
    table, _, weights = random_problem(v, seed=100 + v)
    loss, grad = ref.loss_gradient_corpus_rows(table, weights, ref.LossScalars.for_vocab(v))
    want_loss, want_grad = corpus64(table, weights)
    assert np.allclose(loss, want_loss, rtol=1e-5, atol=1e-7), report("loss", loss, want_loss)
    assert np.allclose(grad, want_grad, rtol=1e-5, atol=1e-8), report("grad", grad, want_grad)


def numerical_gradient(objective, table: np.ndarray, h: float = 1e-6) -> np.ndarray:
    w = table.astype(np.float64)
    grad = np.zeros_like(w)
    for index in np.ndindex(w.shape):
        up, down = w.copy(), w.copy()
        up[index] += h
        down[index] -= h
        grad[index] = (objective(up) - objective(down)) / (2 * h)
    return grad


def test_gradients_are_the_derivative_of_the_objectives():
    v = 8
    table, targets, weights = random_problem(v, seed=7, scale=1.0)
    scalars = ref.LossScalars.for_vocab(v)
    # hard: the objective is the mean of the row losses
    _, grad = ref.loss_gradient_hard_rows(table, targets, scalars)
    want = numerical_gradient(lambda w: hard64(w, targets)[0].mean(), table)
    assert np.allclose(grad, want, atol=1e-7), report("hard grad", grad, want)
    # corpus: the objective is the sum of the row losses
    _, grad = ref.loss_gradient_corpus_rows(table, weights, scalars)
    want = numerical_gradient(lambda w: corpus64(w, weights)[0].sum(), table)
    assert np.allclose(grad, want, atol=1e-7), report("corpus grad", grad, want)


def test_loss_of_a_uniform_row_is_ln_v():
    v = 256
    table = np.zeros((v, v), np.float32)
    loss, grad = ref.loss_gradient_hard_rows(table, np.arange(v, dtype=np.uint32),
                                             ref.LossScalars.for_vocab(v))
    assert np.allclose(loss, np.log(v), rtol=1e-7)
    assert (grad[0, 1:] == F32(1 / v) * F32(1 / v)).all()


def test_nan_and_bad_targets_store_the_canonical_nan():
    v = 4
    table, targets, weights = random_problem(v, seed=3)
    table[1, 2] = np.nan
    targets[3] = v  # never admitted by the host; the kernel must still stay defined
    loss, grad = ref.loss_gradient_hard_rows(table, targets, ref.LossScalars.for_vocab(v))
    assert bits_of(loss[1]) == arith.CANONICAL_NAN_BITS
    assert (bits_of(grad[1]) == arith.CANONICAL_NAN_BITS).all()
    assert bits_of(loss[3]) == arith.CANONICAL_NAN_BITS and np.isfinite(grad[3]).all()
    assert np.isfinite(loss[[0, 2]]).all()
    loss, grad = ref.loss_gradient_corpus_rows(table, weights, ref.LossScalars.for_vocab(v))
    assert bits_of(loss[1]) == arith.CANONICAL_NAN_BITS
    assert (bits_of(grad[1]) == arith.CANONICAL_NAN_BITS).all()


# -- AdamW ----------------------------------------------------------------------------


def adam_scalars_for(step: int) -> ref.AdamScalars:
    values = {name: scalar.value for name, scalar in adam_scalars(Hyper(), step).items()}
    return ref.AdamScalars(**values)


def test_adamw_matches_float64_over_steps():
    rng = np.random.default_rng(11)
    n = 1000
    w = rng.standard_normal(n).astype(np.float32)
    m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    w64, m64, v64 = w.astype(np.float64), m.astype(np.float64), v.astype(np.float64)
    for step in range(1, 6):
        g = (rng.standard_normal(n) * 0.01).astype(np.float32)
        s = adam_scalars_for(step)
        ref.adamw_update(w, g, m, v, s)
        d = {name: float(getattr(s, name)) for name in ("decay", "beta1", "one_minus_beta1",
                                                         "beta2", "one_minus_beta2",
                                                         "step_size", "eps_hat")}
        g64 = g.astype(np.float64)
        w64 = w64 * d["decay"]
        m64 = d["beta1"] * m64 + d["one_minus_beta1"] * g64
        v64 = d["beta2"] * v64 + d["one_minus_beta2"] * g64 * g64
        w64 = w64 - d["step_size"] * m64 / (np.sqrt(v64) + d["eps_hat"])
    assert np.allclose(w, w64, rtol=1e-5, atol=1e-6), report("w", w, w64)
    assert np.allclose(m, m64, rtol=1e-5, atol=1e-9), report("m", m, m64)
    assert np.allclose(v, v64, rtol=1e-5, atol=1e-12), report("v", v, v64)


def test_adamw_first_step_moves_each_weight_by_about_lr():
    # With zero moments, the first update is lr * sign(g) (up to eps), after decay.
    g = np.array([1.0, -2.0, 0.5], np.float32)
    w, m, v = np.ones(3, np.float32), np.zeros(3, np.float32), np.zeros(3, np.float32)
    ref.adamw_update(w, g, m, v, adam_scalars_for(1))
    assert np.allclose(w, 1.0 * (1 - 0.1 * 0.01) - 0.1 * np.sign(g), atol=1e-6)


def test_adamw_is_the_documented_sequence_bit_for_bit():
    rng = np.random.default_rng(12)
    w, g, m = (rng.standard_normal(50).astype(np.float32) for _ in range(3))
    v = rng.random(50).astype(np.float32)
    s = adam_scalars_for(3)
    want_w, want_m, want_v = [], [], []
    for wi, gi, mi, vi in zip(w, g, m, v, strict=True):
        wi = wi * s.decay
        mi = mi * s.beta1 + s.one_minus_beta1 * gi
        vi = vi * s.beta2 + (gi * gi) * s.one_minus_beta2
        wi = wi - (s.step_size * mi) / (np.sqrt(vi) + s.eps_hat)
        want_w.append(wi), want_m.append(mi), want_v.append(vi)
    ref.adamw_update(w, g, m, v, s)
    assert (bits_of(w) == bits_of(np.array(want_w, np.float32))).all()
    assert (bits_of(m) == bits_of(np.array(want_m, np.float32))).all()
    assert (bits_of(v) == bits_of(np.array(want_v, np.float32))).all()


# -- a scalar model of the CUDA loss kernels -------------------------------------------


def lanes_then_tree(values, identity, combine):
    lanes = [identity] * 256
    for j, value in enumerate(values):
        lanes[j % 256] = combine(lanes[j % 256], value)
    s = 128
    while s >= 1:
        for lane in range(s):
            lanes[lane] = combine(lanes[lane], lanes[lane + s])
        s //= 2
    return lanes[0]


def add(a, b):
    return a + b


def select_max(held, newcomer):
    return newcomer if newcomer > held else held


def model_row(w: np.ndarray, log2e: np.float32):
    m = lanes_then_tree(w, F32(-np.inf), select_max)
    z = [(wj - m) * log2e for wj in w]
    e = [arith.exp2(zj)[()] for zj in z]
    s = lanes_then_tree(e, F32(0.0), add)
    return z, e, s, arith.log2(s)[()]


@pytest.mark.parametrize("v", [5, 300])
def test_loss_kernels_are_the_cuda_sequence_bit_for_bit(v):
    table, targets, weights = random_problem(v, seed=v + 1)
    table[0, : v // 2] = 0.0
    table[0, 1] = -0.0  # signed zeros in the row max
    scalars = ref.LossScalars.for_vocab(v)
    hard_loss, hard_grad = ref.loss_gradient_hard_rows(table, targets, scalars)
    corpus_loss, corpus_grad = ref.loss_gradient_corpus_rows(table, weights, scalars)
    for r in (0, 1, v - 1):
        z, e, s, big_l = model_row(table[r], scalars.log2e)
        t = int(targets[r])
        p = [ej / s for ej in e]
        grad = [(pj - F32(1)) * scalars.inverse_rows if j == t else pj * scalars.inverse_rows
                for j, pj in enumerate(p)]
        assert bits_of(hard_loss[r]) == bits_of(scalars.ln2 * (big_l - z[t]))
        assert (bits_of(hard_grad[r]) == bits_of(np.array(grad, np.float32))).all()
        tw = weights[r]
        weight_sum = lanes_then_tree(tw, F32(0.0), add)
        total = lanes_then_tree([(big_l - zj) * tj for zj, tj in zip(z, tw, strict=True)],
                                F32(0.0), add)
        grad = [weight_sum * pj - tj for pj, tj in zip(p, tw, strict=True)]
        assert bits_of(corpus_loss[r]) == bits_of(scalars.ln2 * total)
        assert (bits_of(corpus_grad[r]) == bits_of(np.array(grad, np.float32))).all()


# -- argmax ---------------------------------------------------------------------------


def cuda_argmax(row: np.ndarray) -> int:
    """The CUDA kernel's lanes and tree, with its `beats` comparison."""
    def beats(value, index, best, best_index):
        if np.isnan(value) or np.isnan(best):
            return bool(np.isnan(value) and (not np.isnan(best) or index < best_index))
        return bool(value > best or (value == best and index < best_index))

    lanes = [(F32(-np.inf), 0xFFFFFFFF)] * 256
    for j, value in enumerate(row):
        if beats(value, j, *lanes[j % 256]):
            lanes[j % 256] = (value, j)
    s = 128
    while s >= 1:
        for lane in range(s):
            if beats(*lanes[lane + s], *lanes[lane]):
                lanes[lane] = lanes[lane + s]
        s //= 2
    return lanes[0][1]


def test_argmax_ties_pick_the_lowest_index():
    rows = np.array([[1.0, 3.0, 3.0, 2.0], [-0.0, 0.0, -1.0, 0.0], [-np.inf] * 4,
                     [5.0, 5.0, 5.0, 5.0], [0.0, np.nan, 9.0, np.nan]], np.float32)
    assert list(ref.greedy_argmax_rows(rows)) == [1, 0, 0, 0, 1]
    assert [cuda_argmax(row) for row in rows] == [1, 0, 0, 0, 1]


@pytest.mark.parametrize("v", [1, 2, 256, 257, 700])
def test_argmax_equals_the_cuda_lanes_and_tree(v):
    rng = np.random.default_rng(v)
    values = np.array([-1.0, 0.0, -0.0, 2.0, -np.inf, np.inf, np.nan], np.float32)
    rows = rng.choice(values, (8, v)).astype(np.float32)
    rows[0] = rng.standard_normal(v)
    got = ref.greedy_argmax_rows(rows)
    assert got.dtype == np.uint32
    assert list(got) == [cuda_argmax(row) for row in rows]


# -- kernels over an arena: footprints --------------------------------------------------

U32_POINTERS = {"prompt", "targets", "prediction", "row_offsets", "columns", "lane_order"}
U64_POINTERS = {"health", "keys"}


FUSED_UPDATES = 3


def arena_for(region: str, vocab: int, count: int, rng: np.random.Generator, finish: int = 1):
    """Every pointer of `region` in its own tensor, separated by poisoned gaps."""
    params = sig.SIGNATURES[region]
    values = {"vocab": vocab, "grid.x": vocab, "rows": 1, "columns": count,
              "updates": FUSED_UPDATES, "finish": finish, "count": count}
    base, gap = 0x40000, 512
    spans, address = {}, base + gap
    for p in params:
        if isinstance(p, PointerParam):
            size = p.footprint.evaluate(values)
            spans[p.name] = (address, size, p.access)
            address += -(-(size + gap) // 256) * 256
    buffer = rng.integers(0, 256, address + gap - base, dtype=np.uint8)  # poison everywhere
    memory = Memory(buffer, base)
    args: dict[str, int | np.float32] = {}
    for p in params:
        if isinstance(p, PointerParam):
            start, size, access = spans[p.name]
            args[p.name] = start
            if access == "read" and p.name in U32_POINTERS:
                memory.array(start, "u32", size // 4)[:] = rng.integers(0, vocab, size // 4)
            elif access == "read" or access == "readwrite":
                memory.array(start, "f32", size // 4)[:] = rng.standard_normal(size // 4)
        else:
            assert isinstance(p, ScalarParam)
            args[p.name] = values[p.name] if p.dtype == "u32" else F32(0.0)
    return memory, args, spans


FUSED_REGIONS = (sig.FUSED_HARD, sig.FUSED_CORPUS, sig.FUSED_WIDE_HARD, sig.FUSED_WIDE_CORPUS,
                 sig.FUSED_TALL_HARD, sig.FUSED_TALL_CORPUS, sig.FUSED_STREAM_HARD,
                 sig.FUSED_STREAM_CORPUS, sig.FUSED_HELD_HARD, sig.FUSED_HELD_CORPUS,
                 sig.FUSED_CLUSTER_HARD, sig.FUSED_CLUSTER_CORPUS)
# The dense regions (the collapsed tables' need a sound index: tests/test_collapsed.py).
FOOTPRINT_CASES = [(region, 1) for region in sig.SIGNATURES
                   if region not in sig.COLLAPSED_REGIONS] + [
    (region, 0) for region in FUSED_REGIONS]  # finish 0: no gradients, no loss


@pytest.mark.parametrize("region,finish", FOOTPRINT_CASES)
@pytest.mark.parametrize("vocab", [256, 300])
def test_kernels_write_only_their_declared_footprints(region, finish, vocab):
    rng = np.random.default_rng(vocab)
    count = vocab * vocab - 5
    memory, args, spans = arena_for(region, vocab, count, rng, finish)
    fused = region in FUSED_REGIONS
    if region in (sig.LOSS_HARD, sig.LOSS_CORPUS, sig.LOSS_ONLY_CORPUS) or fused:
        scalars = ref.LossScalars.for_vocab(vocab)
        args.update(log2e=scalars.log2e, ln2=scalars.ln2)
        if "inverse_rows" in args:
            args["inverse_rows"] = scalars.inverse_rows
        if "weights" in args:
            weights = memory.array(int(args["weights"]), "f32", vocab * vocab)
            weights[:] = np.abs(weights) / np.abs(weights).sum()
    if region == sig.ADAMW or fused:
        n = count if region == sig.ADAMW else vocab * vocab
        second = memory.array(int(args["second_moment"]), "f32", n)
        second[:] = np.abs(second)
    if region == sig.ADAMW:
        scalars = adam_scalars_for(4)
        args.update({name: getattr(scalars, name) for name in scalars.__dataclass_fields__})
    if fused:
        rows = memory.array(int(args["adam_scalars"]), "f32", 8 * FUSED_UPDATES)
        rows[:] = adam_scalar_table(Hyper(), 4, FUSED_UPDATES).reshape(-1)
    if region == sig.SCATTER:
        # distinct keys: all but five cells, in random order, and a few past the table
        # (never written); the table cleared first, as the host does
        keys = memory.array(int(args["keys"]), "u64", count)
        keys[:] = rng.permutation(vocab * vocab)[:count]
        keys[rng.choice(count, 3, replace=False)] += np.uint64(vocab * vocab)
        memory.array(int(args["table"]), "f32", vocab * vocab)[:] = 0.0
    before = memory.buffer.copy()
    ref.KERNELS[region](memory, args)
    writable = np.zeros(memory.buffer.size, bool)
    for start, size, access in spans.values():
        if access != "read":
            writable[start - memory.base:start - memory.base + size] = True
    changed = memory.buffer != before
    assert not (changed & ~writable).any(), (
        f"{region} wrote outside its footprints at offset "
        f"{np.nonzero(changed & ~writable)[0][0]:#x}")
    for name, (start, size, access) in spans.items():
        if access != "read" and name not in U32_POINTERS:
            out = memory.array(start, "f32", size // 4)
            assert np.isfinite(out).all(), f"{region}: {name} holds non-finite values"


@pytest.mark.parametrize("region", [sig.LOSS_HARD, sig.LOSS_CORPUS])
def test_kernels_over_memory_equal_the_array_helpers(region):
    vocab = 300
    rng = np.random.default_rng(5)
    memory, args, _ = arena_for(region, vocab, 0, rng)
    scalars = ref.LossScalars.for_vocab(vocab)
    args.update(log2e=scalars.log2e, ln2=scalars.ln2)
    table = memory.array(int(args["parameters"]), "f32", vocab * vocab).reshape(vocab, vocab)
    if region == sig.LOSS_HARD:
        args["inverse_rows"] = scalars.inverse_rows
        targets = memory.array(int(args["targets"]), "u32", vocab)
        want_loss, want_grad = ref.loss_gradient_hard_rows(table.copy(), targets.copy(), scalars)
    else:
        weights = memory.array(int(args["weights"]), "f32", vocab * vocab).reshape(vocab, vocab)
        want_loss, want_grad = ref.loss_gradient_corpus_rows(table.copy(), weights.copy(),
                                                             scalars)
    ref.KERNELS[region](memory, args)
    assert (bits_of(memory.array(int(args["loss"]), "f32", vocab)) == bits_of(want_loss)).all()
    grad = memory.array(int(args["gradients"]), "f32", vocab * vocab)
    assert (bits_of(grad) == bits_of(want_grad.reshape(-1))).all()


def test_gradient_buffer_must_not_overlap_the_inputs():
    table, targets, weights = random_problem(4, seed=1)
    scalars = ref.LossScalars.for_vocab(4)
    with pytest.raises(ValueError):
        ref.loss_gradient_hard_rows(table, targets, scalars, out=table)
    with pytest.raises(ValueError):
        ref.loss_gradient_corpus_rows(table, weights, scalars, out=weights)
    out = np.full((4, 4), np.nan, np.float32)
    _, grad = ref.loss_gradient_hard_rows(table, targets, scalars, out=out)
    assert grad is out
    assert (bits_of(out) == bits_of(ref.loss_gradient_hard_rows(table, targets, scalars)[1])).all()


def test_gather_copies_bits_and_argmax_reads_the_row():
    vocab = 300
    rng = np.random.default_rng(6)
    memory, args, _ = arena_for(sig.GATHER, vocab, 0, rng)
    table = memory.array(int(args["table"]), "f32", vocab * vocab).reshape(vocab, vocab)
    table.view(np.uint32)[17, :3] = [0xFFC00001, 0x80000000, 0x00000001]  # NaN payload, -0
    memory.array(int(args["prompt"]), "u32", 1)[0] = 17
    ref.KERNELS[sig.GATHER](memory, args)
    logits = memory.array(int(args["logits"]), "f32", vocab)
    assert (bits_of(logits) == bits_of(table[17])).all()

    memory.array(int(args["prompt"]), "u32", 1)[0] = vocab  # out of range: NaN, no read
    ref.KERNELS[sig.GATHER](memory, args)
    assert (bits_of(logits) == arith.CANONICAL_NAN_BITS).all()

    row = np.zeros(vocab, np.float32)
    row[[40, 41, 299]] = 7.0
    memory2, args2, _ = arena_for(sig.ARGMAX, vocab, 0, rng)
    memory2.array(int(args2["row"]), "f32", vocab)[:] = row
    ref.KERNELS[sig.ARGMAX](memory2, args2)
    assert memory2.array(int(args2["prediction"]), "u32", 1)[0] == 40


def test_every_region_has_a_kernel():
    from bob.kernels.collapsed.reference import KERNELS as collapsed

    assert set(ref.KERNELS) | set(collapsed) == set(sig.SIGNATURES) == set(sig.ENTRIES)
    assert set(collapsed) == set(sig.COLLAPSED_REGIONS)


# -- the CUDA source -------------------------------------------------------------------


def cuda_code() -> str:
    """bob_kernels.cu and the headers beside it (bob_tall.cuh), comments removed."""
    text = "\n".join(path.read_text() for path in
                     [CUDA_SOURCE, *sorted(CUDA_SOURCE.parent.glob("*.cuh"))])
    return re.sub(r"//[^\n]*", "", text)


def test_cuda_entries_take_the_signature_parameters_in_order():
    code = cuda_code()
    for region, params in sig.SIGNATURES.items():
        entry = sig.ENTRIES[region]
        found = re.search(r'extern "C" __global__ (?:\w+ )?void ' + entry + r"\(([^)]*)\)", code)
        assert found, f"no entry {entry} in {CUDA_SOURCE.name}"
        declared = [" ".join(part.split()) for part in found.group(1).split(",")]
        expected = []
        for p in params:
            if isinstance(p, PointerParam):
                element = ("u32" if p.name in U32_POINTERS
                           else "u64" if p.name in U64_POINTERS else "float")
                const = "const " if p.access == "read" else ""
                expected.append(f"{const}{element}* {p.name}")
            else:
                expected.append(f"{'float' if p.dtype == 'f32' else 'u32'} {p.name}")
        assert declared == expected, entry


def test_cuda_constants_are_the_proved_ones():
    defines = dict(re.findall(r"#define (\w+) 0x([0-9A-Fa-f]+)u", CUDA_SOURCE.read_text()))
    want = {c.name.upper(): c.bits for c in (*arith.EXP2_COEFFICIENTS, *arith.LOG2_COEFFICIENTS)}
    want.update(SQRT2_BELOW=arith.SQRT2_BELOW_BITS, CANONICAL_NAN=arith.CANONICAL_NAN_BITS,
                EXP2_LOW=int(bits_of(arith.EXP2_LOW)), EXP2_HIGH=int(bits_of(arith.EXP2_HIGH)))
    for name, bits in want.items():
        assert int(defines[name], 16) == bits, name


def test_cuda_uses_no_library_math_or_contraction():
    # Two helpers are exempt, by name: quotient_fast and root_fast (SMALL_FAST_DIVIDE, on by
    # default) give the correctly rounded a / b and sqrt(a) with the instructions ptxas
    # emits for __fdiv_rn and __fsqrt_rn, FMA among them; no operation of Bob's is
    # contracted there. Only the kernels the test below names hold them.
    code, exempt = re.subn(r"static __device__ __forceinline__ float (?:quotient_fast|root_fast)"
                           r"\([^)]*\) \{.*?\n\}", "", cuda_code(), flags=re.S)
    assert exempt == 2
    forbidden = r"\b(exp2f|log2f|expf|logf|powf|__expf|__logf|__powf|exp10f|fmaf|__fmaf_rn|" \
                r"fmaxf|fminf|__saturatef|#include)\b"
    assert not re.search(forbidden, code), re.search(forbidden, code)


# No contraction, no approximate division or square root, no max/min instructions (any
# modifiers: fma.rn.f32 as well as fma.f32), except a max against -inf: max.f32(x, -inf) is
# the select from -inf for every x (NaN gives -inf, zeros keep their sign), which the
# compiler may emit for it.
UNEXACT = re.compile(r"\b(fma|mad|div\.approx|div\.full|sqrt\.approx|rcp\.approx|"
                     r"rsqrt\.approx|ex2|lg2|max|min)(?:\.\w+)*\.f32[^;]*;")
SELECT_FROM_NEG_INF = re.compile(r"max\.f32\s+%f\d+, %f\d+, 0fFF800000;")
# What quotient_fast and root_fast compile to: the fast paths of the correctly rounded
# division and square root, in the small-row fused kernels (and the wide ones, which
# contain the small path), the held ones and the seed schedule's hard loss-gradient and
# AdamW only.
FAST_DIVIDE = re.compile(r"(fma\.rn|rcp\.approx\.ftz|rsqrt\.approx\.ftz)\.f32[^;]*;")
FAST_DIVIDE_ENTRIES = {"bob_loss_gradient_hard", "bob_adamw",
                       "bob_fused_train_hard", "bob_fused_train_corpus",
                       "bob_fused_train_wide_hard", "bob_fused_train_wide_corpus",
                       "bob_fused_train_held_hard", "bob_fused_train_held_corpus"}
# The cluster kernels are compiled for sm_90 only (elsewhere their entries trap).
CLUSTER_ENTRIES = {"bob_fused_train_cluster_hard", "bob_fused_train_cluster_corpus"}


def _unexact_by_entry(text: str) -> dict[str, list[str]]:
    found = {}
    for part in text.split(".entry ")[1:]:
        entry = part.split("(", 1)[0]
        found[entry] = [m.group(0) for m in UNEXACT.finditer(part)
                        if not SELECT_FROM_NEG_INF.fullmatch(m.group(0))]
    return found


@pytest.mark.parametrize("arch", ["sm_86", "sm_90"])
def test_cuda_source_compiles_with_nvrtc(arch):
    pytest.importorskip("cuda.bindings.nvrtc")
    text = shipped_ptx(arch)
    for entry in sig.ENTRIES.values():
        assert f".entry {entry}(" in text
    found = _unexact_by_entry(text)
    expected = FAST_DIVIDE_ENTRIES | (CLUSTER_ENTRIES if arch == "sm_90" else set())
    assert {entry for entry, hits in found.items() if hits} == expected
    for entry in expected:  # the fast divide's own instructions, nothing else
        assert all(FAST_DIVIDE.fullmatch(hit) for hit in found[entry]), entry
    # Without the fast divide (the knob source's variant) not one such instruction is left.
    from dev.cuda.variants import knob_source

    strict = _unexact_by_entry(shipped_ptx(arch, knob_source("#define SMALL_FAST_DIVIDE 0\n"
                                                             "#define HELD_FAST_DIVIDE 0\n"
                                                             "#define SEED_FAST_DIVIDE 0\n")))
    # (the cluster kernels have no such variant: their divisions are always issued together)
    assert {entry: hits for entry, hits in strict.items()
            if hits and entry not in CLUSTER_ENTRIES} == {}
