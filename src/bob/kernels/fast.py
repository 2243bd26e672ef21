"""Bob's kernels compiled with Numba: the CPU backend's fast path, bit for bit the reference.

The operation sequences of docs/ARITHMETIC.md written element by element, as the
CUDA kernels are, and compiled by Numba: rows run in parallel on the cores
(``prange``), and the loops over a row's elements or over the 256 lanes are
vectorized by LLVM. Every float is binary32 (constants are ``np.float32``, so
nothing is promoted to float64); Numba never contracts ``a * b + c`` into a
fused multiply-add and never reassociates without ``fastmath``, which is not
used. ``error_model="numpy"``: a division by zero is IEEE's (inf or NaN), not
Python's ZeroDivisionError, and needs no check that would stop vectorization.
``tests/test_cpu_fast.py`` compares every kernel with the reference bit for
bit, edge values included, and whole invocations of both schedules.

Why: the reference spends most of its time making and walking full-size
NumPy temporaries (about 30 passes over the table per update); here each
element is loaded once per pass and stays in registers. The fused kernel keeps
a row in the core's cache for all the updates of an invocation.

Needs ``numba`` (``pip install 'bob-bigram[fast]'``); without it the CPU backend uses
the reference. The first call compiles (a few seconds, cached on disk after).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from bob.kernels import arith
from bob.kernels import reference as ref
from bob.kernels import signatures as sig
from bob.kernels.memory import Memory

Args = ref.Args

_F32 = np.float32
_LANES = arith.LANES
_ZERO = _F32(0.0)
_ONE = _F32(1.0)
_HALF = _F32(0.5)
_NEG_INF = _F32(-np.inf)
_POS_INF = _F32(np.inf)
_EXP2_LOW = arith.EXP2_LOW
_EXP2_HIGH = arith.EXP2_HIGH
_ROUND_TO_INT = _F32(12582912.0)  # 1.5 * 2^23: n + this has n in its low mantissa bits
_ROUND_TO_INT_BITS = 0x4B400000
_MIN_NORMAL = _F32(2.0**-126)
_TWO_POW_24 = _F32(16777216.0)
_SQRT2_BELOW = np.uint32(arith.SQRT2_BELOW_BITS).view(_F32)
_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7 = (c.value for c in arith.EXP2_COEFFICIENTS)
_A1, _A3, _A5, _A7, _A9 = (a.value for a in arith.LOG2_COEFFICIENTS)
_CANONICAL_NAN_BITS = arith.CANONICAL_NAN_BITS
_ADAM_STRIDE = 8  # floats per row of adam_scalars

# -- bits <-> binary32, as CUDA's __int_as_float / __float_as_int -------------------------


@intrinsic
def _f32_from_bits(typingctx, bits):  # type: ignore[no-untyped-def]
    """The binary32 whose bits are the low 32 bits of an integer (LLVM bitcast)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        value = args[0]
        if bits.bitwidth > 32:
            value = builder.trunc(value, ir.IntType(32))
        elif bits.bitwidth < 32:
            value = builder.zext(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _bits_from_f32(typingctx, value):  # type: ignore[no-untyped-def]
    """The bits of a binary32, as an int32."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(value), codegen


@intrinsic
def _wide_vectors(typingctx):  # type: ignore[no-untyped-def]
    """Let LLVM vectorize the calling function with 512-bit registers where the CPU has them.

    LLVM prefers 256-bit vectors on AVX-512 CPUs (a guard against clock drops in
    mixed code); these kernels are nothing but vector arithmetic, and run faster with
    512 bits (docs/BENCHMARKS.md).
    Only the vector width changes, never an operation: the bits are the same. Called
    first in each ``prange`` body, so it marks the function Numba outlines for it.
    llvmlite only accepts the attributes it knows, so the string attribute goes into
    the set directly. Without AVX-512 LLVM uses the widest vectors it has.
    """

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        return context.get_dummy_value()

    return types.none(), codegen


# -- the arithmetic of ARITHMETIC.md, one element at a time ---------------------------------


@njit(inline="always", cache=True, error_model="numpy")
def _canonical(x):  # type: ignore[no-untyped-def]
    """What a kernel stores: every NaN as 0x7FFFFFFF."""
    return _f32_from_bits(_CANONICAL_NAN_BITS) if x != x else x


@njit(inline="always", cache=True, error_model="numpy")
def _exp2(x):  # type: ignore[no-untyped-def]
    """2^x, section 3: clamp, n = rint, Horner in f = x - n, two power-of-two scalings."""
    xc = _EXP2_LOW if x < _EXP2_LOW else x  # NaN passes both selects
    xc = _EXP2_HIGH if xc > _EXP2_HIGH else xc
    n = np.rint(xc)
    f = xc - n
    p = f * _C7
    p = (p + _C6) * f
    p = (p + _C5) * f
    p = (p + _C4) * f
    p = (p + _C3) * f
    p = (p + _C2) * f
    p = (p + _C1) * f
    p = p + _C0
    k = _bits_from_f32(n + _ROUND_TO_INT) - _ROUND_TO_INT_BITS  # n as an integer
    k1 = k >> 1  # floor(k / 2)
    k2 = k - k1
    p = p * _f32_from_bits((k1 + 127) << 23)  # exact
    return p * _f32_from_bits((k2 + 127) << 23)  # the one rounding


@njit(inline="always", cache=True, error_model="numpy")
def _log2(x):  # type: ignore[no-untyped-def]
    """log2(x), section 4."""
    if not x > _ZERO:
        return _NEG_INF if x == _ZERO else _f32_from_bits(_CANONICAL_NAN_BITS)
    if x == _POS_INF:
        return x
    adjust = 0
    if x < _MIN_NORMAL:  # subnormal: scale into the normal range, exactly
        x = x * _TWO_POW_24
        adjust = 24
    bits = _bits_from_f32(x)
    e = (bits >> 23) - 127 - adjust
    m = _f32_from_bits((bits & 0x007FFFFF) | 0x3F800000)  # [1, 2)
    if m > _SQRT2_BELOW:
        m = m * _HALF
        e += 1
    t = (m - _ONE) / (m + _ONE)
    u = t * t
    q = u * _A9
    q = (q + _A7) * u
    q = (q + _A5) * u
    q = (q + _A3) * u
    q = q + _A1
    return _F32(e) + t * q


@njit(inline="always", cache=True, error_model="numpy")
def _take_larger(lanes, lane, newcomer):  # type: ignore[no-untyped-def]
    """row_max's op: the held value stays unless the newcomer is larger (never a NaN)."""
    held = lanes[lane]
    lanes[lane] = newcomer if newcomer > held else held


# The trees are written one level per loop with a constant trip count: LLVM then
# vectorizes each level without remainder loops or overlap checks (which a `while` over
# the width costs). Levels 4, 2 and 1 stay scalar.


@njit(inline="always", cache=True, error_model="numpy")
def _max_tree(lanes):  # type: ignore[no-untyped-def]
    """Section 6, step 2 for row_max: for s = 128 ... 1, lane l < s takes lane l + s."""
    for lane in range(128):
        _take_larger(lanes, lane, lanes[lane + 128])
    for lane in range(64):
        _take_larger(lanes, lane, lanes[lane + 64])
    for lane in range(32):
        _take_larger(lanes, lane, lanes[lane + 32])
    for lane in range(16):
        _take_larger(lanes, lane, lanes[lane + 16])
    for lane in range(8):
        _take_larger(lanes, lane, lanes[lane + 8])
    for lane in range(4):
        _take_larger(lanes, lane, lanes[lane + 4])
    for lane in range(2):
        _take_larger(lanes, lane, lanes[lane + 2])
    _take_larger(lanes, 0, lanes[1])
    return lanes[0]


@njit(inline="always", cache=True, error_model="numpy")
def _sum_tree(lanes):  # type: ignore[no-untyped-def]
    """Section 6, step 2 for row_sum: for s = 128 ... 1, lane l < s adds lane l + s."""
    for lane in range(128):
        lanes[lane] = lanes[lane] + lanes[lane + 128]
    for lane in range(64):
        lanes[lane] = lanes[lane] + lanes[lane + 64]
    for lane in range(32):
        lanes[lane] = lanes[lane] + lanes[lane + 32]
    for lane in range(16):
        lanes[lane] = lanes[lane] + lanes[lane + 16]
    for lane in range(8):
        lanes[lane] = lanes[lane] + lanes[lane + 8]
    for lane in range(4):
        lanes[lane] = lanes[lane] + lanes[lane + 4]
    for lane in range(2):
        lanes[lane] = lanes[lane] + lanes[lane + 2]
    lanes[0] = lanes[0] + lanes[1]
    return lanes[0]


@njit(inline="always", cache=True, error_model="numpy")
def _row_max(x, lanes):  # type: ignore[no-untyped-def]
    """Section 6: lane l takes x[l], x[l + 256], ... by `b > a ? b : a` from -inf, then the tree."""
    vocab = x.size
    full = vocab - vocab % _LANES  # elements in whole 256-wide chunks
    for lane in range(_LANES):
        lanes[lane] = _NEG_INF
    for start in range(0, full, _LANES):
        for lane in range(_LANES):  # constant trip count: one vectorized pass
            _take_larger(lanes, lane, x[start + lane])
    for lane in range(vocab - full):
        _take_larger(lanes, lane, x[full + lane])
    return _max_tree(lanes)


@njit(inline="always", cache=True, error_model="numpy")
def _row_sum(x, lanes):  # type: ignore[no-untyped-def]
    """Section 6: lane l adds x[l], x[l + 256], ... to +0, then the tree."""
    vocab = x.size
    full = vocab - vocab % _LANES
    for lane in range(_LANES):
        lanes[lane] = _ZERO
    for start in range(0, full, _LANES):
        for lane in range(_LANES):
            lanes[lane] = lanes[lane] + x[start + lane]
    for lane in range(vocab - full):
        lanes[lane] = lanes[lane] + x[full + lane]
    return _sum_tree(lanes)


@njit(inline="always", cache=True, error_model="numpy")
def _exponentials(w, log2e, e, lanes):  # type: ignore[no-untyped-def]
    """Row max m, e_j = exp2((w_j - m) log2e) into e; returns (m, s = row_sum(e)).

    Each e_j joins its lane's sum as it is computed (lane j mod 256, in increasing
    j, as row_sum takes them): one pass over the row instead of two.
    """
    m = _row_max(w, lanes)
    vocab = w.size
    full = vocab - vocab % _LANES
    for lane in range(_LANES):
        lanes[lane] = _ZERO
    for start in range(0, full, _LANES):
        for lane in range(_LANES):
            x = _exp2((w[start + lane] - m) * log2e)
            e[start + lane] = x
            lanes[lane] = lanes[lane] + x
    for lane in range(vocab - full):
        x = _exp2((w[full + lane] - m) * log2e)
        e[full + lane] = x
        lanes[lane] = lanes[lane] + x
    return m, _sum_tree(lanes)


# -- one row of each loss-gradient ----------------------------------------------------------


@njit(inline="always", cache=True, error_model="numpy")
def _hard_row(w, target, log2e, ln2, inverse_rows, grad, lanes):  # type: ignore[no-untyped-def]
    """Section 7, bob-loss-gradient: grad[j] = p_j / V (p_t - 1 at the target); the loss."""
    m, s = _exponentials(w, log2e, grad, lanes)
    vocab = w.size
    valid = target < vocab
    hit = _ZERO
    if valid:
        hit = grad[target] / s - _ONE
    for j in range(vocab):
        grad[j] = _canonical((grad[j] / s) * inverse_rows)
    if not valid:  # never admitted by the host: a NaN loss and no -1 term
        return _f32_from_bits(_CANONICAL_NAN_BITS)
    grad[target] = _canonical(hit * inverse_rows)
    return _canonical(ln2 * (_log2(s) - (w[target] - m) * log2e))


@njit(inline="always", cache=True, error_model="numpy")
def _corpus_loss(w, weights, log2e, ln2, e, terms, lanes):  # type: ignore[no-untyped-def]
    """Section 7, bob-loss-gradient-corpus's loss; the exponentials left in e. Returns
    (loss, s)."""
    m, s = _exponentials(w, log2e, e, lanes)
    big_l = _log2(s)
    for j in range(w.size):
        terms[j] = (big_l - (w[j] - m) * log2e) * weights[j]
    return _canonical(ln2 * _row_sum(terms, lanes)), s


@njit(inline="always", cache=True, error_model="numpy")
def _corpus_row(w, weights, log2e, ln2, grad, terms, lanes):  # type: ignore[no-untyped-def]
    """Section 7, bob-loss-gradient-corpus: grad[j] = rowsum(T) p_j - T_j; the loss."""
    loss, s = _corpus_loss(w, weights, log2e, ln2, grad, terms, lanes)
    weight_sum = _row_sum(weights, lanes)
    for j in range(w.size):
        grad[j] = _canonical((grad[j] / s) * weight_sum - weights[j])
    return loss


@njit(parallel=True, cache=True, error_model="numpy")
def loss_gradient_hard_rows(table, targets, log2e, ln2, inverse_rows, grad,
                            loss):  # type: ignore[no-untyped-def]
    """reference.loss_gradient_hard_rows into `grad` and `loss`."""
    for r in prange(table.shape[0]):
        _wide_vectors()
        lanes = np.empty(_LANES, _F32)
        loss[r] = _hard_row(table[r], targets[r], log2e, ln2, inverse_rows, grad[r], lanes)


@njit(parallel=True, cache=True, error_model="numpy")
def loss_gradient_corpus_rows(table, weights, log2e, ln2, grad,
                              loss):  # type: ignore[no-untyped-def]
    """reference.loss_gradient_corpus_rows into `grad` and `loss`."""
    for r in prange(table.shape[0]):
        _wide_vectors()
        lanes = np.empty(_LANES, _F32)
        terms = np.empty(table.shape[1], _F32)
        loss[r] = _corpus_row(table[r], weights[r], log2e, ln2, grad[r], terms, lanes)


@njit(parallel=True, cache=True, error_model="numpy")
def loss_corpus_rows(table, weights, log2e, ln2, loss):  # type: ignore[no-untyped-def]
    """reference.loss_corpus's row losses into `loss`; no gradient stored."""
    for r in prange(table.shape[0]):
        _wide_vectors()
        lanes = np.empty(_LANES, _F32)
        e = np.empty(table.shape[1], _F32)
        terms = np.empty(table.shape[1], _F32)
        loss[r] = _corpus_loss(table[r], weights[r], log2e, ln2, e, terms, lanes)[0]


# -- AdamW --------------------------------------------------------------------------------


@njit(inline="always", cache=True, error_model="numpy")
def _scalars(step):  # type: ignore[no-untyped-def]
    """An adam_scalars row as 7 values, read once: a loop that stores through the tables
    cannot keep reading them from memory and still be vectorized."""
    return step[0], step[1], step[2], step[3], step[4], step[5], step[6]


@njit(inline="always", cache=True, error_model="numpy")
def _adamw_element(w, g, m, v, scalars, j):  # type: ignore[no-untyped-def]
    """Section 7, bob-adamw, on element j; `scalars` in the order of ADAM_SCALAR_NAMES."""
    decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, eps_hat = scalars
    decayed = w[j] * decay
    first = m[j] * beta1 + one_minus_beta1 * g
    second = v[j] * beta2 + (g * g) * one_minus_beta2
    w[j] = _canonical(decayed - (step_size * first) / (np.sqrt(second) + eps_hat))
    m[j] = _canonical(first)
    v[j] = _canonical(second)


@njit(inline="always", cache=True, error_model="numpy")
def _adamw_span(w, g, m, v, scalars):  # type: ignore[no-untyped-def]
    for j in range(w.size):
        _adamw_element(w, g[j], m, v, scalars, j)


_ADAMW_CHUNK = 8192  # elements per parallel task


@njit(parallel=True, cache=True, error_model="numpy")
def adamw_update(w, g, m, v, step):  # type: ignore[no-untyped-def]
    """reference.adamw_update over flat arrays; `step` holds the 7 scalars in order."""
    scalars = _scalars(step)
    for chunk in prange((w.size + _ADAMW_CHUNK - 1) // _ADAMW_CHUNK):
        _wide_vectors()
        # slices, not indices into the whole arrays: LLVM vectorizes the loop over a slice
        start, stop = chunk * _ADAMW_CHUNK, min(w.size, (chunk + 1) * _ADAMW_CHUNK)
        _adamw_span(w[start:stop], g[start:stop], m[start:stop], v[start:stop], scalars)


# -- the fused kernel: every update of a row, rows in parallel --------------------------------


@njit(parallel=True, cache=True, error_model="numpy")
def fused_hard_rows(table, first, second, targets, steps, log2e, ln2, inverse_rows, finish,
                    grad, loss):  # type: ignore[no-untyped-def]
    """reference.fused_train_rows, hard targets; `grad`, `loss` written only with finish."""
    vocab = table.shape[1]
    for r in prange(table.shape[0]):
        _wide_vectors()
        lanes = np.empty(_LANES, _F32)
        e = np.empty(vocab, _F32)
        w, m, v, target = table[r], first[r], second[r], targets[r]
        for k in range(steps.shape[0]):
            scalars = _scalars(steps[k])
            _, s = _exponentials(w, log2e, e, lanes)
            for j in range(vocab):
                p = e[j] / s
                g = (p - _ONE) * inverse_rows if j == target else p * inverse_rows
                _adamw_element(w, g, m, v, scalars, j)
        if finish:
            loss[r] = _hard_row(w, target, log2e, ln2, inverse_rows, grad[r], lanes)


@njit(parallel=True, cache=True, error_model="numpy")
def fused_corpus_rows(table, first, second, weights, steps, log2e, ln2, finish, grad,
                      loss):  # type: ignore[no-untyped-def]
    """reference.fused_train_rows, corpus weights; `grad`, `loss` written only with finish."""
    vocab = table.shape[1]
    for r in prange(table.shape[0]):
        _wide_vectors()
        lanes = np.empty(_LANES, _F32)
        e = np.empty(vocab, _F32)
        w, m, v, t = table[r], first[r], second[r], weights[r]
        weight_sum = _row_sum(t, lanes)
        for k in range(steps.shape[0]):
            scalars = _scalars(steps[k])
            _, s = _exponentials(w, log2e, e, lanes)
            for j in range(vocab):
                g = (e[j] / s) * weight_sum - t[j]
                _adamw_element(w, g, m, v, scalars, j)
        if finish:
            loss[r] = _corpus_row(w, t, log2e, ln2, grad[r], e, lanes)


# -- kernels over the arena (the reference's signatures) ---------------------------------------


def _table(memory: Memory, args: Args, name: str) -> np.ndarray:
    vocab = int(args["vocab"])
    return memory.array(int(args[name]), "f32", vocab * vocab).reshape(vocab, vocab)


def _grid_table(memory: Memory, args: Args, name: str) -> np.ndarray:
    """The rows of a block-per-row kernel's grid (ref.grid_rows) of a table: f32[R][V]."""
    rows, vocab = ref.grid_rows(args), int(args["vocab"])
    return memory.array(int(args[name]), "f32", rows * vocab).reshape(rows, vocab)


def loss_gradient_hard(memory: Memory, args: Args) -> None:
    rows = ref.grid_rows(args)
    loss_gradient_hard_rows(
        _grid_table(memory, args, "parameters"),
        memory.array(int(args["targets"]), "u32", rows),
        _F32(args["log2e"]), _F32(args["ln2"]), _F32(args["inverse_rows"]),
        _grid_table(memory, args, "gradients"), memory.array(int(args["loss"]), "f32", rows))


def loss_gradient_corpus(memory: Memory, args: Args) -> None:
    loss_gradient_corpus_rows(
        _grid_table(memory, args, "parameters"), _grid_table(memory, args, "weights"),
        _F32(args["log2e"]), _F32(args["ln2"]), _grid_table(memory, args, "gradients"),
        memory.array(int(args["loss"]), "f32", ref.grid_rows(args)))


def loss_corpus(memory: Memory, args: Args) -> None:
    loss_corpus_rows(_grid_table(memory, args, "parameters"),
                     _grid_table(memory, args, "weights"),
                     _F32(args["log2e"]), _F32(args["ln2"]),
                     memory.array(int(args["loss"]), "f32", ref.grid_rows(args)))


def adamw(memory: Memory, args: Args) -> None:
    count = int(args["rows"]) * int(args["columns"])
    w, g, m, v = (memory.array(int(args[name]), "f32", count)
                  for name in ("parameters", "gradients", "first_moment", "second_moment"))
    scalars = ref.AdamScalars.from_args(args)
    step = np.array([getattr(scalars, name) for name in scalars.__dataclass_fields__], _F32)
    adamw_update(w, g, m, v, step)


def _fused_arguments(memory: Memory, args: Args) -> tuple:
    """Tables, adam_scalars rows, finish, and the gradients and loss (empty when not finishing)."""
    vocab, updates, finish = (int(args[name]) for name in ("vocab", "updates", "finish"))
    tables = tuple(_table(memory, args, name)
                   for name in ("parameters", "first_moment", "second_moment"))
    steps = memory.array(int(args["adam_scalars"]), "f32", _ADAM_STRIDE * updates)
    # With finish 0 the footprints of gradients and loss are empty: pass empty arrays.
    rows = vocab if finish else 0
    grad = memory.array(int(args["gradients"]), "f32", rows * vocab).reshape(rows, vocab)
    loss = memory.array(int(args["loss"]), "f32", rows)
    return (*tables, steps.reshape(updates, _ADAM_STRIDE), bool(finish), grad, loss)


def fused_train_hard(memory: Memory, args: Args) -> None:
    table, first, second, steps, finish, grad, loss = _fused_arguments(memory, args)
    targets = memory.array(int(args["targets"]), "u32", table.shape[0])
    fused_hard_rows(table, first, second, targets, steps, _F32(args["log2e"]),
                    _F32(args["ln2"]), _F32(args["inverse_rows"]), finish, grad, loss)


def fused_train_corpus(memory: Memory, args: Args) -> None:
    table, first, second, steps, finish, grad, loss = _fused_arguments(memory, args)
    weights = _table(memory, args, "weights")
    fused_corpus_rows(table, first, second, weights, steps, _F32(args["log2e"]),
                      _F32(args["ln2"]), finish, grad, loss)


# The compiled functions each kernel calls: what its first launch in a process compiles,
# or loads from Numba's cache on disk (`cache=True`) where an earlier run left it.
COMPILED: dict[str, tuple[Any, ...]] = {
    sig.LOSS_HARD: (loss_gradient_hard_rows,),
    sig.LOSS_CORPUS: (loss_gradient_corpus_rows,),
    sig.LOSS_ONLY_CORPUS: (loss_corpus_rows,),
    sig.ADAMW: (adamw_update,),
    **{name: (fused_hard_rows,) for name in (
        sig.FUSED_HARD, sig.FUSED_WIDE_HARD, sig.FUSED_TALL_HARD, sig.FUSED_STREAM_HARD,
        sig.FUSED_HELD_HARD, sig.FUSED_CLUSTER_HARD)},
    **{name: (fused_corpus_rows,) for name in (
        sig.FUSED_CORPUS, sig.FUSED_WIDE_CORPUS, sig.FUSED_TALL_CORPUS,
        sig.FUSED_STREAM_CORPUS, sig.FUSED_HELD_CORPUS, sig.FUSED_CLUSTER_CORPUS)},
}


def tiny_calls() -> dict[Any, tuple]:
    """Arguments for each compiled function, of the very types the kernels pass them
    (memory.array's C-contiguous, aligned, writable views; float32 scalars; a bool), on a
    2 x 2 table: Numba compiles by type, so the code is the one every V runs."""
    vocab = 2
    row = np.zeros(vocab, _F32)
    targets = np.zeros(vocab, np.uint32)
    steps = np.zeros((1, _ADAM_STRIDE), _F32)
    one = _F32(1.0)

    def table() -> np.ndarray:
        return np.zeros((vocab, vocab), _F32)

    return {
        loss_gradient_hard_rows: (table(), targets, one, one, one, table(), row),
        loss_gradient_corpus_rows: (table(), table(), one, one, table(), row),
        loss_corpus_rows: (table(), table(), one, one, row),
        adamw_update: (row, row.copy(), row.copy(), row.copy(), steps[0].copy()),
        fused_hard_rows: (table(), table(), table(), targets, steps, one, one, one, True,
                          table(), row),
        fused_corpus_rows: (table(), table(), table(), table(), steps, one, one, True, table(),
                            row),
    }


KERNELS: dict[str, ref.Kernel] = {
    sig.GATHER: ref.row_gather,  # a copy and a scan of one row: nothing to gain
    sig.LOSS_HARD: loss_gradient_hard,
    sig.LOSS_CORPUS: loss_gradient_corpus,
    sig.ADAMW: adamw,
    sig.ARGMAX: ref.greedy_argmax,
    sig.FUSED_HARD: fused_train_hard,
    sig.FUSED_CORPUS: fused_train_corpus,
    sig.FUSED_WIDE_HARD: fused_train_hard,
    sig.FUSED_WIDE_CORPUS: fused_train_corpus,
    sig.FUSED_TALL_HARD: fused_train_hard,
    sig.FUSED_TALL_CORPUS: fused_train_corpus,
    sig.FUSED_STREAM_HARD: fused_train_hard,
    sig.FUSED_STREAM_CORPUS: fused_train_corpus,
    sig.FUSED_HELD_HARD: fused_train_hard,
    sig.FUSED_HELD_CORPUS: fused_train_corpus,
    sig.FUSED_CLUSTER_HARD: fused_train_hard,
    sig.FUSED_CLUSTER_CORPUS: fused_train_corpus,
    # NumPy's isfinite runs at memory speed already; a Numba loop is slower (and a
    # parallel one pays its threads' start-up at every size)
    sig.HEALTH: ref.health,
    sig.SCATTER: ref.scatter,  # one indexed store in NumPy: nothing to gain
    sig.LOSS_ONLY_CORPUS: loss_corpus,
}
