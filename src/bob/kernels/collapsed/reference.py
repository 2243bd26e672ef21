"""The collapsed tables' kernels in NumPy: the oracle of their Numba and CUDA twins.

A collapsed table holds, per row r, a *rest class* (one value standing for every column
the row does not list) and the row's *exception columns*, CSR-style: row r's exceptions
are ``columns[offsets[r]:offsets[r + 1]]``, sorted and unique. A table of classes is
f32[V + K]: class r < V is row r's rest, class V + i is exception i. Parameters, both
moments and the gradients are such tables; AdamW runs on them element by element
(``bob-adamw`` itself, over V + K elements).

Every kernel gives exactly the bytes the dense kernel gives on the expanded row
(ARITHMETIC.md section 7): the row max is exact over the classes (a row whose maximum is
a zero of both signs takes the literal order), exp2, the gradient and AdamW run once
per class, and every row sum replays the 256 lanes' chains with the rest value's runs
summed exactly (``bob.kernels.collapsed.runs``). A row's rest class with no column
(every column an exception) is updated like the others and joins no reduction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bob.kernels import signatures as sig
from bob.kernels.arith import canonicalize_nan, exp2, log2, row_max_in_order
from bob.kernels.collapsed.runs import lane_sums
from bob.kernels.memory import Memory
from bob.kernels.reference import AdamScalars, Args, LossScalars, adamw_update, add_health
from bob.kernels.reference import non_finite_count as _non_finite_count

_F32 = np.float32
_ONE = _F32(1.0)
_SIGN = np.uint32(0x80000000)


@dataclass(frozen=True, eq=False)
class RowClasses:
    """Where each class sits: the CSR index of a collapsed table and what follows from it.

    `offsets` int64[V + 1] and `columns` (any unsigned ints) [K]; the kernels trust them
    (the host checks an index before it reaches the arena)."""

    vocab: int
    offsets: np.ndarray
    columns: np.ndarray

    @classmethod
    def of(cls, vocab: int, offsets: np.ndarray, columns: np.ndarray) -> RowClasses:
        return cls(vocab, np.asarray(offsets, np.int64), np.asarray(columns, np.int64))

    @property
    def exceptions(self) -> int:
        return int(self.columns.size)

    @property
    def classes(self) -> int:
        return self.vocab + self.exceptions

    def counts(self) -> np.ndarray:
        """Exceptions per row (int64[V])."""
        return np.diff(self.offsets)

    def rows(self) -> np.ndarray:
        """The row of each exception (int64[K])."""
        return np.repeat(np.arange(self.vocab, dtype=np.int64), self.counts())

    def keys(self) -> np.ndarray:
        """row * V + column of each exception, increasing (int64[K])."""
        return self.rows() * self.vocab + self.columns

    def rest_present(self) -> np.ndarray:
        """Whether row r's rest class stands for at least one column (bool[V])."""
        return self.counts() < self.vocab

    def class_rows(self) -> np.ndarray:
        """The row of every class (int64[V + K])."""
        return np.concatenate([np.arange(self.vocab, dtype=np.int64), self.rows()])

    def find(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """The class of (row, column) where it is an exception, -1 where it is not (int64)."""
        keys = self.keys()
        wanted = np.asarray(rows, np.int64) * self.vocab + np.asarray(columns, np.int64)
        at = np.searchsorted(keys, wanted)
        inside = at < keys.size
        found = np.zeros(wanted.shape, bool)
        found[inside] = keys[at[inside]] == wanted[inside]
        return np.where(found, self.vocab + at, -1)

    def expand(self, classes: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The dense rows `rows` of a table of classes (f32[len(rows)][V], bits kept)."""
        rows = np.asarray(rows, np.int64)
        out = np.repeat(classes[rows][:, None], self.vocab, axis=1)
        for i, r in enumerate(rows.tolist()):
            first, last = int(self.offsets[r]), int(self.offsets[r + 1])
            out[i, self.columns[first:last]] = classes[self.vocab + first:self.vocab + last]
        return out


# -- reductions over classes -----------------------------------------------------------


def class_row_max(index: RowClasses, w: np.ndarray) -> np.ndarray:
    """Each row's max in Bob's order (`select(b > a, b, a)` over lanes, then the tree),
    exact over the classes: NaN is never taken (-inf for a row of NaN only), equal
    values have equal bits but +0 and -0, and a row whose maximum is a zero of both signs
    takes the literal order on its expanded row."""
    vocab, counts = index.vocab, index.counts()
    rest = np.where(index.rest_present(), w[:vocab], _F32(-np.inf))
    with np.errstate(invalid="ignore"):
        result = np.fmax(rest, _F32(-np.inf))  # a NaN rest is no candidate
        listed = np.flatnonzero(counts)
        if listed.size:
            exceptions = w[vocab:]
            largest = np.fmax.reduceat(exceptions, index.offsets[listed])
            result[listed] = np.fmax(result[listed], largest)
    result[np.isnan(result)] = -np.inf
    zero = np.flatnonzero(result == 0)
    if zero.size:
        mixed = zero[_zero_signs_mixed(index, w, zero)]
        if mixed.size:
            result[mixed] = row_max_in_order(index.expand(w, mixed))
        same = np.setdiff1d(zero, mixed)
        result[same] = _the_zero(index, w, same)
    return result


def _zero_signs_mixed(index: RowClasses, w: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For rows whose max is 0: whether their zeros (columns holding +0 or -0) have both
    signs (bool[len(rows)])."""
    negative, positive = _zero_signs(index, w, rows)
    return negative & positive


def _zero_signs(index: RowClasses, w: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    vocab = index.vocab
    bits = w.view(np.uint32)
    rest_zero = index.rest_present()[rows] & (w[rows] == 0)
    negative = rest_zero & ((bits[rows] & _SIGN) != 0)
    positive = rest_zero & ((bits[rows] & _SIGN) == 0)
    for i, r in enumerate(rows.tolist()):
        first, last = int(index.offsets[r]), int(index.offsets[r + 1])
        values = w[vocab + first:vocab + last]
        signs = bits[vocab + first:vocab + last][values == 0] & _SIGN
        negative[i] |= bool((signs != 0).any())
        positive[i] |= bool((signs == 0).any())
    return negative, positive


def _the_zero(index: RowClasses, w: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The one zero of rows whose zeros share a sign."""
    negative, _ = _zero_signs(index, w, rows)
    return np.where(negative, _F32(-0.0), _F32(0.0))


def class_row_sum(index: RowClasses, values: np.ndarray) -> np.ndarray:
    """Each row's sum in Bob's order of the expanded row of a table of classes."""
    vocab = index.vocab
    return lane_sums(vocab, values[:vocab], index.rows(), index.columns, values[vocab:])


def _exponents(index: RowClasses, w: np.ndarray, log2e: np.float32,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The row max, z = (w - m) * log2e per class, e = exp2(z) per class."""
    m = class_row_max(index, w)
    with np.errstate(all="ignore"):
        z = (w - m[index.class_rows()]) * log2e
    return m, z, exp2(z)


# -- the loss kernels over classes -----------------------------------------------------


def loss_gradient_hard_classes(index: RowClasses, w: np.ndarray, targets: np.ndarray,
                               scalars: LossScalars) -> tuple[np.ndarray, np.ndarray]:
    """Row losses and the gradient of every class, hard targets (bob-loss-gradient's bytes
    on every expanded row). A target that is not one of its row's exceptions (or >= V,
    which the host never admits) gives a NaN loss and no -1 term."""
    vocab = index.vocab
    inside = np.flatnonzero(targets < vocab)
    target = np.full(vocab, -1, np.int64)
    target[inside] = index.find(inside, targets[inside])
    valid = np.flatnonzero(target >= 0)
    t = target[valid]
    _, z, e = _exponents(index, w, scalars.log2e)
    s = class_row_sum(index, e)
    class_rows = index.class_rows()
    with np.errstate(all="ignore"):
        loss = np.full(vocab, np.nan, _F32)
        loss[valid] = scalars.ln2 * (log2(s)[valid] - z[t])
        p = e / s[class_rows]
        hit = p[t] - _ONE
        grad = p * scalars.inverse_rows
        grad[t] = hit * scalars.inverse_rows
    return canonicalize_nan(loss), canonicalize_nan(grad)


def _corpus_parts(index: RowClasses, w: np.ndarray, weights: np.ndarray,
                  scalars: LossScalars) -> tuple[np.ndarray, ...]:
    """e, s and each row's loss against `weights` (f32[K], the exceptions' weights; the
    rest's weight is 0)."""
    vocab = index.vocab
    _, z, e = _exponents(index, w, scalars.log2e)
    s = class_row_sum(index, e)
    big_l = log2(s)
    full = np.concatenate([np.zeros(vocab, _F32), weights])
    with np.errstate(all="ignore"):
        terms = (big_l[index.class_rows()] - z) * full
        loss = scalars.ln2 * class_row_sum(index, terms)
    return e, s, full, loss


def loss_gradient_corpus_classes(index: RowClasses, w: np.ndarray, weights: np.ndarray,
                                 scalars: LossScalars) -> tuple[np.ndarray, np.ndarray]:
    """Row losses and the gradient of every class against corpus weights
    (bob-loss-gradient-corpus's bytes on every expanded row)."""
    e, s, full, loss = _corpus_parts(index, w, weights, scalars)
    weight_sums = class_row_sum(index, full)
    class_rows = index.class_rows()
    with np.errstate(all="ignore"):
        grad = e / s[class_rows]
        grad *= weight_sums[class_rows]
        grad -= full
    return canonicalize_nan(loss), canonicalize_nan(grad)


def loss_corpus_classes(index: RowClasses, w: np.ndarray, weights: np.ndarray,
                        scalars: LossScalars) -> np.ndarray:
    """bob-loss-corpus's row losses: the corpus loss alone."""
    return canonicalize_nan(_corpus_parts(index, w, weights, scalars)[3])


def fused_train_classes(w: np.ndarray, m: np.ndarray, v: np.ndarray, gradients: np.ndarray,
                        loss_gradient, steps: np.ndarray, finish: bool) -> np.ndarray | None:
    """Per update the gradient of every class (into `gradients`), then AdamW with that
    update's row of `steps` (f32[N][8]); with `finish`, the row losses and gradients of
    the result (returned, and in `gradients`). Without it `gradients` hold the last
    update's gradient, as the CUDA kernel leaves them."""
    for row in steps:
        _, gradients[:] = loss_gradient(w)
        adamw_update(w, gradients.copy(), m, v, AdamScalars(*row[:7]))
    if not finish:
        return None
    loss, gradients[:] = loss_gradient(w)
    return loss


def scatter_classes(index: RowClasses, keys: np.ndarray, values: np.ndarray,
                    weights: np.ndarray) -> None:
    """weights[i] = values[j] (as bits) where key j (row * V + column) is exception i; a
    key that is no exception is not written."""
    keys = np.asarray(keys, np.int64)
    where = index.find(keys // index.vocab, keys % index.vocab)
    hit = where >= 0
    weights.view(np.uint32)[where[hit] - index.vocab] = values.view(np.uint32)[hit]


# -- kernels over the arena ------------------------------------------------------------


def _u32(args: Args, name: str) -> int:
    return int(args[name])


def row_classes(memory: Memory, args: Args) -> RowClasses:
    """The index a launch points at: row_offsets u32[V + 1] and columns u32[K]."""
    vocab, exceptions = _u32(args, "vocab"), _u32(args, "exceptions")
    offsets = memory.array(int(args["row_offsets"]), "u32", vocab + 1)
    columns = memory.array(int(args["columns"]), "u32", exceptions)
    return RowClasses.of(vocab, offsets, columns)


def _classes(memory: Memory, args: Args, name: str) -> np.ndarray:
    return memory.array(int(args[name]), "f32", _u32(args, "classes"))


def gather(memory: Memory, args: Args) -> None:
    """bob-collapsed-gather: logits = the expanded row prompt[0]; a prompt >= V gives a
    row of NaN (0x7FFFFFFF)."""
    index = row_classes(memory, args)
    prompt = int(memory.array(int(args["prompt"]), "u32", 1)[0])
    logits = memory.array(int(args["logits"]), "f32", index.vocab)
    if prompt < index.vocab:
        logits[:] = index.expand(_classes(memory, args, "parameters"), np.array([prompt]))[0]
    else:
        logits.view(np.uint32)[:] = 0x7FFFFFFF


def loss_gradient_hard(memory: Memory, args: Args) -> None:
    index = row_classes(memory, args)
    targets = memory.array(int(args["targets"]), "u32", index.vocab)
    scalars = LossScalars(args["log2e"], args["ln2"], args["inverse_rows"])
    loss, grad = loss_gradient_hard_classes(index, _classes(memory, args, "parameters"),
                                            targets, scalars)
    _classes(memory, args, "gradients")[:] = grad
    memory.array(int(args["loss"]), "f32", index.vocab)[:] = loss


def _weights(memory: Memory, args: Args, index: RowClasses) -> np.ndarray:
    return memory.array(int(args["weights"]), "f32", index.exceptions)


def loss_gradient_corpus(memory: Memory, args: Args) -> None:
    index = row_classes(memory, args)
    scalars = LossScalars(args["log2e"], args["ln2"])
    loss, grad = loss_gradient_corpus_classes(index, _classes(memory, args, "parameters"),
                                              _weights(memory, args, index), scalars)
    _classes(memory, args, "gradients")[:] = grad
    memory.array(int(args["loss"]), "f32", index.vocab)[:] = loss


def loss_corpus(memory: Memory, args: Args) -> None:
    index = row_classes(memory, args)
    scalars = LossScalars(args["log2e"], args["ln2"])
    memory.array(int(args["loss"]), "f32", index.vocab)[:] = loss_corpus_classes(
        index, _classes(memory, args, "parameters"), _weights(memory, args, index), scalars)


def _fused(memory: Memory, args: Args, loss_gradient) -> None:
    index = row_classes(memory, args)
    w, m, v = (_classes(memory, args, name)
               for name in ("parameters", "first_moment", "second_moment"))
    updates = _u32(args, "updates")
    steps = memory.array(int(args["adam_scalars"]), "f32", 8 * updates).reshape(updates, 8)
    loss = fused_train_classes(w, m, v, _classes(memory, args, "gradients"),
                               lambda table: loss_gradient(index, table), steps,
                               bool(_u32(args, "finish")))
    if loss is not None:
        memory.array(int(args["loss"]), "f32", index.vocab)[:] = loss


def fused_train_hard(memory: Memory, args: Args) -> None:
    targets = memory.array(int(args["targets"]), "u32", _u32(args, "vocab"))
    scalars = LossScalars(args["log2e"], args["ln2"], args["inverse_rows"])
    _fused(memory, args, lambda index, w: loss_gradient_hard_classes(index, w, targets,
                                                                     scalars))


def fused_train_corpus(memory: Memory, args: Args) -> None:
    scalars = LossScalars(args["log2e"], args["ln2"])
    weights = memory.array(int(args["weights"]), "f32", _u32(args, "exceptions"))
    _fused(memory, args, lambda index, w: loss_gradient_corpus_classes(index, w, weights,
                                                                       scalars))


def scatter(memory: Memory, args: Args) -> None:
    """bob-collapsed-scatter: each pair's weight into its exception's slot."""
    index = row_classes(memory, args)
    count = _u32(args, "count")
    keys = memory.array(int(args["keys"]), "u64", count)
    values = memory.array(int(args["values"]), "f32", count)
    scatter_classes(index, keys, values, _weights(memory, args, index))


def health(memory: Memory, args: Args) -> None:
    """bob-collapsed-health: each table's non-finite classes added to health."""
    add_health(memory, args, tuple(
        _non_finite_count(_classes(memory, args, name))
        for name in ("parameters", "first_moment", "second_moment")))


KERNELS = {
    sig.COLLAPSED_GATHER: gather,
    sig.COLLAPSED_LOSS_HARD: loss_gradient_hard,
    sig.COLLAPSED_LOSS_CORPUS: loss_gradient_corpus,
    sig.COLLAPSED_LOSS_ONLY: loss_corpus,
    sig.COLLAPSED_FUSED_HARD: fused_train_hard,
    sig.COLLAPSED_FUSED_CORPUS: fused_train_corpus,
    sig.COLLAPSED_SCATTER: scatter,
    sig.COLLAPSED_HEALTH: health,
}
