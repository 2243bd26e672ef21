"""Bob's kernels in NumPy: every backend's oracle.

Each kernel performs the float32 operation sequence of docs/ARITHMETIC.md over
whole rows at once; the CUDA kernels perform the same sequence one element per
thread, so the bytes agree. The pure-array helpers (``*_rows``, ``adamw_update``)
are the kernels without a Memory, for tests and fast paths.

The reference assumes the plan's geometry (one block per row for the loss
kernels, one block for gather and argmax); the certificate checks footprints,
Bob's program fixes the geometry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from fractions import Fraction

import numpy as np

from bob.kernels import signatures as sig
from bob.kernels.arith import (
    CANONICAL_NAN_BITS,
    LN2,
    LOG2E,
    canonicalize_nan,
    exp2,
    log2,
    row_max,
    row_sum,
)
from bob.kernels.exact import f32_bits_from_fraction, f32_from_bits
from bob.kernels.memory import Memory

Args = dict[str, int | np.float32]
Kernel = Callable[[Memory, Args], None]

_ONE = np.float32(1.0)


def _f32_fields(instance: object) -> None:
    # Scalars are binary32 whatever the caller passed: a Python float is rounded once here.
    for f in fields(instance):  # type: ignore[arg-type]
        object.__setattr__(instance, f.name, np.float32(getattr(instance, f.name)))


@dataclass(frozen=True)
class LossScalars:
    """The loss kernels' f32 arguments."""

    log2e: np.float32
    ln2: np.float32
    # 1/V scales the hard-target gradient; the corpus kernel has none (NaN shows a misuse)
    inverse_rows: np.float32 = np.float32(np.nan)

    def __post_init__(self) -> None:
        _f32_fields(self)

    @staticmethod
    def for_vocab(vocab: int) -> LossScalars:
        """The values Bob's program passes for a table of `vocab` rows."""
        inverse = f32_from_bits(f32_bits_from_fraction(Fraction(1, vocab)))
        return LossScalars(LOG2E.value, LN2.value, np.float32(inverse))


@dataclass(frozen=True)
class AdamScalars:
    """AdamW's f32 arguments, as the host computes them for one update."""

    decay: np.float32
    beta1: np.float32
    one_minus_beta1: np.float32
    beta2: np.float32
    one_minus_beta2: np.float32
    step_size: np.float32
    eps_hat: np.float32

    def __post_init__(self) -> None:
        _f32_fields(self)

    @staticmethod
    def from_args(args: Args) -> AdamScalars:
        return AdamScalars(*(args[f.name] for f in fields(AdamScalars)))


# -- pure-array helpers -------------------------------------------------------------


def _require(array: np.ndarray, dtype: type, ndim: int, what: str) -> None:
    if array.dtype != dtype or array.ndim != ndim:
        raise TypeError(f"{what} must be a {ndim}-D {np.dtype(dtype)} array, "
                        f"not {array.ndim}-D {array.dtype}")


def _exponents(table: np.ndarray, m: np.ndarray, log2e: np.float32,
               out: np.ndarray) -> np.ndarray:
    """z = (W - m) * log2e per row, into `out`."""
    np.subtract(table, m[:, None], out=out)
    out *= log2e
    return out


def _gradient_buffer(table: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    _require(table, np.float32, 2, "the table")
    if out is None:
        return np.empty_like(table)
    _require(out, np.float32, 2, "the gradient buffer")
    if out.shape != table.shape or np.may_share_memory(out, table):
        raise ValueError("the gradient buffer must match the table's shape and not overlap it")
    return out


def loss_gradient_hard_rows(table: np.ndarray, targets: np.ndarray, scalars: LossScalars,
                            out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Row losses (nats) and gradients for one target per row.

    loss[r] = ln2 * (L - z[t]); grad[r][j] = (e[j] / s) * (1/V), and for
    j = t, (e[t] / s - 1) * (1/V). A target >= V (which the host never
    admits) gives a NaN loss and no -1 term. The gradients go to `out` when
    given (it then holds z and e on the way: one full-size array fewer).
    """
    _require(targets, np.uint32, 1, "the targets")
    rows, vocab = table.shape
    grad = _gradient_buffer(table, out)
    with np.errstate(all="ignore"):
        valid = targets < vocab
        r = np.nonzero(valid)[0]
        t = targets[valid].astype(np.intp)
        z = _exponents(table, row_max(table), scalars.log2e, out=grad)
        z_target = z[r, t]  # a copy, before z becomes e
        e = exp2(z, out=grad)
        s = row_sum(e)
        loss = np.full(rows, np.nan, np.float32)
        loss[r] = scalars.ln2 * (log2(s)[r] - z_target)
        p = e
        p /= s[:, None]
        hit = p[r, t] - _ONE
        p *= scalars.inverse_rows
        grad[r, t] = hit * scalars.inverse_rows
    return canonicalize_nan(loss), canonicalize_nan(grad)


def loss_gradient_corpus_rows(table: np.ndarray, weights: np.ndarray, scalars: LossScalars,
                              out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Row losses (nats) and gradients against weighted targets T.

    loss[r] = ln2 * row_sum((L - z[j]) * T[j]); grad[r][j] = rs * (e[j] / s) - T[j]
    with rs = row_sum(T). The gradients go to `out` when given.
    """
    _require(weights, np.float32, 2, "the weights")
    if weights.shape != table.shape:
        raise ValueError(f"weights {weights.shape} and table {table.shape} differ in shape")
    grad = _gradient_buffer(table, out)
    if np.may_share_memory(grad, weights):
        raise ValueError("the gradient buffer must not overlap the weights")
    with np.errstate(all="ignore"):
        m = row_max(table)
        e = exp2(_exponents(table, m, scalars.log2e, out=grad), out=grad)
        s = row_sum(e)
        big_l = log2(s)
        # z again rather than kept: the same operations give the same bits.
        terms = _exponents(table, m, scalars.log2e, out=np.empty_like(table))
        np.subtract(big_l[:, None], terms, out=terms)
        terms *= weights
        loss = scalars.ln2 * row_sum(terms)
        weight_sums = row_sum(weights)
        p = e
        p /= s[:, None]
        p *= weight_sums[:, None]
        p -= weights
    return canonicalize_nan(loss), canonicalize_nan(grad)


def adamw_update(w: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray,
                 scalars: AdamScalars) -> None:
    """One AdamW step over flat float32 arrays, in place on w, m and v."""
    for name, array in (("w", w), ("g", g), ("m", m), ("v", v)):
        _require(array, np.float32, 1, f"AdamW's {name}")
    with np.errstate(all="ignore"):
        w *= scalars.decay
        m *= scalars.beta1
        m += scalars.one_minus_beta1 * g
        g2 = g * g
        g2 *= scalars.one_minus_beta2
        v *= scalars.beta2
        v += g2
        denominator = np.sqrt(v)  # IEEE correctly rounded in float32
        denominator += scalars.eps_hat
        step = scalars.step_size * m
        step /= denominator
        w -= step
    for array in (w, m, v):
        canonicalize_nan(array)


def fused_train_rows(table: np.ndarray, first: np.ndarray, second: np.ndarray,
                     loss_gradient: Callable[[np.ndarray, np.ndarray], tuple],
                     steps: np.ndarray, gradients: np.ndarray | None) -> np.ndarray | None:
    """The fused kernel over whole tables: per update, the gradient of the table, then AdamW.

    `loss_gradient(table, out)` is the mode's loss-gradient helper with its data bound
    (it writes the gradients into `out`); `steps` is f32[updates][8], one row of AdamW
    scalars per update. This is exactly the seed schedule's AdamW, loss-gradient, AdamW,
    ..., with the gradient of the table before the first update recomputed rather than
    read (the same operations give the same bits) and the losses in between never
    stored. Given `gradients` (the launch that finishes an invocation), the loss and
    gradients of the final table are computed, the gradients into `gradients`, and the
    row losses returned; otherwise None.
    """
    scratch = np.empty_like(table)
    flat = (table.reshape(-1), first.reshape(-1), second.reshape(-1))
    for row in steps:
        _, grad = loss_gradient(table, scratch)
        adamw_update(flat[0], grad.reshape(-1), flat[1], flat[2],
                     AdamScalars(*row[:len(fields(AdamScalars))]))
    if gradients is None:
        return None
    loss, _ = loss_gradient(table, gradients)
    return loss


def greedy_argmax_rows(rows: np.ndarray) -> np.ndarray:
    """Per row, the lowest index of the maximum; NaN counts above every number.

    The CUDA kernel's lanes and tree (ARITHMETIC.md) give exactly this: its
    comparison is a total order on (value, index), so order does not matter.
    """
    _require(rows, np.float32, 2, "the rows")
    return np.argmax(rows, axis=1).astype(np.uint32)


# -- kernels over the arena ------------------------------------------------------------


def _u32(args: Args, name: str) -> int:
    return int(args[name])


def row_gather(memory: Memory, args: Args) -> None:
    """logits[j] = table[prompt[0] * V + j]; a prompt >= V gives a row of NaN."""
    vocab = _u32(args, "vocab")
    prompt = int(memory.array(int(args["prompt"]), "u32", 1)[0])
    logits = memory.array(int(args["logits"]), "f32", vocab)
    if prompt < vocab:
        logits[:] = memory.array(int(args["table"]) + 4 * prompt * vocab, "f32", vocab)
    else:
        logits.view(np.uint32)[:] = CANONICAL_NAN_BITS


def grid_rows(args: Args) -> int:
    """The rows a block-per-row kernel handles: its grid's, at most V (a block past the
    table's last row returns at once); V where the caller gives no grid."""
    vocab = _u32(args, "vocab")
    return min(vocab, int(args.get("grid.x", vocab)))


def _rows_table(memory: Memory, args: Args, name: str) -> np.ndarray:
    """The grid's rows of a table through pointer `name`: f32[R][V]."""
    rows, vocab = grid_rows(args), _u32(args, "vocab")
    return memory.array(int(args[name]), "f32", rows * vocab).reshape(rows, vocab)


def loss_gradient_hard(memory: Memory, args: Args) -> None:
    rows = grid_rows(args)
    table = _rows_table(memory, args, "parameters")
    targets = memory.array(int(args["targets"]), "u32", rows)
    scalars = LossScalars(args["log2e"], args["ln2"], args["inverse_rows"])
    grad = _rows_table(memory, args, "gradients")
    loss, _ = loss_gradient_hard_rows(table, targets, scalars, out=grad)
    memory.array(int(args["loss"]), "f32", rows)[:] = loss


def loss_gradient_corpus(memory: Memory, args: Args) -> None:
    table = _rows_table(memory, args, "parameters")
    weights = _rows_table(memory, args, "weights")
    scalars = LossScalars(args["log2e"], args["ln2"])
    grad = _rows_table(memory, args, "gradients")
    loss, _ = loss_gradient_corpus_rows(table, weights, scalars, out=grad)
    memory.array(int(args["loss"]), "f32", grid_rows(args))[:] = loss


# Rows of a V x V table the loss alone handles at a time: its scratch stays a few MiB.
_LOSS_BLOCK_ELEMENTS = 1 << 20


def loss_corpus(memory: Memory, args: Args) -> None:
    """bob-loss-corpus: bob-loss-gradient-corpus's row losses, no gradient stored."""
    vocab, count = _u32(args, "vocab"), grid_rows(args)
    table = _rows_table(memory, args, "parameters")
    weights = _rows_table(memory, args, "weights")
    loss = memory.array(int(args["loss"]), "f32", count)
    scalars = LossScalars(args["log2e"], args["ln2"])
    rows = max(1, _LOSS_BLOCK_ELEMENTS // vocab)
    scratch = np.empty((min(rows, count), vocab), np.float32)
    for first in range(0, count, rows):
        last = min(count, first + rows)
        loss[first:last], _ = loss_gradient_corpus_rows(
            table[first:last], weights[first:last], scalars, out=scratch[:last - first])


def scatter(memory: Memory, args: Args) -> None:
    """bob-scatter: table[keys[i]] = values[i] (as bits) for i < count; a key outside the
    V x V table is not written."""
    vocab, count = _u32(args, "vocab"), _u32(args, "count")
    cells = vocab * vocab
    table = memory.array(int(args["table"]), "u32", cells)
    keys = memory.array(int(args["keys"]), "u64", count)
    values = memory.array(int(args["values"]), "u32", count)
    inside = keys < cells
    table[keys[inside]] = values[inside]


def adamw(memory: Memory, args: Args) -> None:
    count = _u32(args, "rows") * _u32(args, "columns")  # a Python int: 2**32 at V = 65536
    w = memory.array(int(args["parameters"]), "f32", count)
    g = memory.array(int(args["gradients"]), "f32", count)
    m = memory.array(int(args["first_moment"]), "f32", count)
    v = memory.array(int(args["second_moment"]), "f32", count)
    adamw_update(w, g, m, v, AdamScalars.from_args(args))


def greedy_argmax(memory: Memory, args: Args) -> None:
    row = memory.array(int(args["row"]), "f32", _u32(args, "vocab"))
    memory.array(int(args["prediction"]), "u32", 1)[0] = greedy_argmax_rows(row[None, :])[0]


def _fused_tables(memory: Memory, args: Args) -> tuple[np.ndarray, ...]:
    """Parameters, both moments and the gradients as V x V views; the scalar rows."""
    vocab = _u32(args, "vocab")
    tables = tuple(
        memory.array(int(args[name]), "f32", vocab * vocab).reshape(vocab, vocab)
        for name in ("parameters", "first_moment", "second_moment")
    )
    updates = _u32(args, "updates")
    steps = memory.array(int(args["adam_scalars"]), "f32", 8 * updates).reshape(updates, 8)
    return (*tables, steps)


def _fused_outputs(memory: Memory, args: Args) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The gradients and loss views, only when this launch finishes (footprints are 0 else)."""
    if not _u32(args, "finish"):
        return None, None
    vocab = _u32(args, "vocab")
    gradients = memory.array(int(args["gradients"]), "f32", vocab * vocab)
    return gradients.reshape(vocab, vocab), memory.array(int(args["loss"]), "f32", vocab)


def fused_train_hard(memory: Memory, args: Args) -> None:
    table, first, second, steps = _fused_tables(memory, args)
    targets = memory.array(int(args["targets"]), "u32", table.shape[0])
    scalars = LossScalars(args["log2e"], args["ln2"], args["inverse_rows"])
    gradients, loss = _fused_outputs(memory, args)

    def loss_gradient(w: np.ndarray, out: np.ndarray) -> tuple:
        return loss_gradient_hard_rows(w, targets, scalars, out=out)

    row_losses = fused_train_rows(table, first, second, loss_gradient, steps, gradients)
    if loss is not None:
        loss[:] = row_losses


def fused_train_corpus(memory: Memory, args: Args) -> None:
    table, first, second, steps = _fused_tables(memory, args)
    vocab = table.shape[0]
    weights = memory.array(int(args["weights"]), "f32", vocab * vocab).reshape(vocab, vocab)
    scalars = LossScalars(args["log2e"], args["ln2"])
    gradients, loss = _fused_outputs(memory, args)

    def loss_gradient(w: np.ndarray, out: np.ndarray) -> tuple:
        return loss_gradient_corpus_rows(w, weights, scalars, out=out)

    row_losses = fused_train_rows(table, first, second, loss_gradient, steps, gradients)
    if loss is not None:
        loss[:] = row_losses


_HEALTH_CHUNK = 1 << 18  # elements: the temporaries stay in the cache


def non_finite_count(table: np.ndarray) -> int:
    """Elements of a binary32 array that are NaN or +-inf (its exponent bits all ones, which
    is what np.isfinite tests). Chunk by chunk, counting only where one is not all finite:
    faster than one np.count_nonzero over the table, whose temporaries leave the cache."""
    found = 0
    for start in range(0, table.size, _HEALTH_CHUNK):
        chunk = table[start:start + _HEALTH_CHUNK]
        if not np.isfinite(chunk).all():
            found += int(np.count_nonzero(~np.isfinite(chunk)))
    return found


def add_health(memory: Memory, args: Args, counts: tuple[int, ...]) -> None:
    """health[t] += counts[t], as the device's 64-bit atomics add (modulo 2^64)."""
    health = memory.array(int(args["health"]), "u32", 2 * len(counts)).view(np.uint64)
    health += np.array(counts, np.uint64)


def health(memory: Memory, args: Args) -> None:
    """bob-health: add each table's count of non-finite elements to health."""
    count = _u32(args, "vocab") ** 2
    add_health(memory, args, tuple(
        non_finite_count(memory.array(int(args[name]), "f32", count))
        for name in sig.HEALTH_COUNTS))


KERNELS: dict[str, Kernel] = {
    sig.GATHER: row_gather,
    sig.LOSS_HARD: loss_gradient_hard,
    sig.LOSS_CORPUS: loss_gradient_corpus,
    sig.ADAMW: adamw,
    sig.ARGMAX: greedy_argmax,
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
    sig.HEALTH: health,
    sig.SCATTER: scatter,
    sig.LOSS_ONLY_CORPUS: loss_corpus,
}
