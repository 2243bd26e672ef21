"""The collapsed tables' kernels compiled with Numba: bit for bit the reference, per row.

A collapsed table holds per row a *rest class* (one value for every column the row does
not list) and the row's exception columns (``bob.kernels.collapsed.reference``). These
kernels give the reference's bytes (and so the dense kernels' on every expanded row) with
the arithmetic of ``bob.kernels.fast``: every class's exp2, gradient and AdamW once, one
row at a time, rows in parallel (``prange``). The reductions follow
``bob.kernels.collapsed.runs``:

- the row max is exact over the classes (the rest only where it stands for a column);
  only a maximum that is a zero of both signs needs the lanes' order, which decides its
  sign: each lane's first zero along its chain, then the max tree;
- a row sum replays the 256 lanes' chains: lanes without exceptions hold one of the two
  sums of a chain of rest values (chains of V // 256 or V // 256 + 1 columns), the others
  walk their exceptions in ``lane_order`` (a lane's exceptions are contiguous there, in
  chain order) with the runs of rest values between them summed exactly by ``add_run``
  (runs.add_run, a few steps per binade), then the sum tree.

So a row costs its classes plus a few hundred operations for its lanes, whatever V is.
Corpus rows whose weights are all zero (most rows of a token corpus: rows the data never
names) need no sum at all where their exponents are tame (``_corpus_shortcut``).

The fused kernel runs all of a row's updates before the next row: its classes (the rest
class r and the contiguous exceptions) stay in the core's cache for the whole launch.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from bob.kernels import reference as dense_ref
from bob.kernels import signatures as sig
from bob.kernels.arith import LANES
from bob.kernels.fast import (
    _ADAM_STRIDE,
    _CANONICAL_NAN_BITS,
    _NEG_INF,
    _ONE,
    _POS_INF,
    _ZERO,
    _adamw_element,
    _bits_from_f32,
    _canonical,
    _exp2,
    _f32_from_bits,
    _log2,
    _max_tree,
    _scalars,
    _sum_tree,
)
from bob.kernels.memory import Memory

Args = dense_ref.Args

_F32 = np.float32
_NEG_ZERO = _F32(-0.0)
_LANE_BITS = 8  # column = position * 256 + lane
_LANE_MASK = LANES - 1
_MANTISSA = 0x7FFFFF
_IMPLICIT = 1 << 23
_TWO_POW_24 = 1 << 24
_NON_FINITE = 0x7F800000  # exponent bits all ones: NaN or an infinity

# Work per row for balancing rows over the threads, in units of one class (its exp2,
# gradient, AdamW and its share of the lanes' replay): a row that sums costs about four
# more for its lanes' plain runs and tree (V = 50257 corpus, the 2-core machine).
_SUMMING_ROW_COST = 4
_CLASS_COST = 1
_BLOCKS_PER_THREAD = 4
# Scratch of a row's sums: the 256 lanes, then the doubling runs of the rest (2^k
# additions for k up to 62: a chain is never longer).
_DOUBLINGS = 64


# -- exact runs: runs.add_run element by element ---------------------------------------------


@njit(cache=True, error_model="numpy")
def add_run(total, term, n):  # type: ignore[no-untyped-def]
    """`total` plus `n` additions of `term`, each rounded to binary32 (runs.add_run).

    Inside a binade of spacing u, with acc = a u and 0 < term = q u < acc, every addition
    adds the same whole d = round(q) to a (ties: the even neighbour once a is even), so
    the additions up to the binade's end are one multiplication; the addition that leaves
    the binade, a tie from an odd a, and any term that is not in (0, acc) or not finite
    are done as binary32 one at a time."""
    while n > 0:
        if not (np.isfinite(total) and np.isfinite(term) and _ZERO < term and term < total):
            total = total + term
            n -= 1
            if term == _ZERO or not (np.isfinite(total) and np.isfinite(term)):
                return total  # fixed from here on: a zero term, or an inf or NaN sum
            continue
        acc_bits = np.int64(_bits_from_f32(total))
        term_bits = np.int64(_bits_from_f32(term))
        exponent, term_exponent = acc_bits >> 23, term_bits >> 23
        whole = (acc_bits & _MANTISSA) | (_IMPLICIT if exponent > 0 else 0)
        term_whole = (term_bits & _MANTISSA) | (_IMPLICIT if term_exponent > 0 else 0)
        scale = max(exponent, 1)  # subnormals share the first binade's spacing
        shift = scale - max(term_exponent, 1)  # >= 0: term < total
        if shift > 25:
            return total  # q < 1/2: no addition moves acc
        floor = term_whole >> shift
        step = floor
        if shift > 0:
            remainder = term_whole & ((np.int64(1) << shift) - 1)
            half = np.int64(1) << (shift - 1)
            if remainder == half:  # a tie
                if whole & 1:
                    total = total + term  # from an odd a: done as binary32, a turns even
                    n -= 1
                    continue
                step = floor + (floor & 1)  # the even neighbour, every time
            elif remainder > half:
                step = floor + 1
        if whole + floor >= _TWO_POW_24:
            total = total + term  # the addition that may leave the binade
            n -= 1
            continue
        if step == 0:
            return total
        # additions while a + q stays below 2^24: the first n, or up to the binade's end
        if whole + floor + (n - 1) * step < _TWO_POW_24:
            count = n
        else:
            count = (_TWO_POW_24 - 1 - floor - whole) // step + 1
        n -= count
        total = _f32_from_bits(((scale - 1) << 23) + whole + count * step)
    return total


# -- a row's reductions over its classes -------------------------------------------------------


@njit(cache=True, error_model="numpy")
def lanes_scratch():  # type: ignore[no-untyped-def]
    """Scratch for a row's reductions: the 256 lanes, then the rest's doubling runs."""
    return np.empty(LANES + _DOUBLINGS, _F32)


@njit(cache=True, error_model="numpy")
def _doubling_runs(rest, longest, doublings):  # type: ignore[no-untyped-def]
    """doublings[k] = the sum from +0 of 2^k additions of `rest`, for 2^k <= `longest`."""
    total = _ZERO + rest
    doublings[0] = total
    k, n = 1, 1
    while 2 * n <= longest:
        total = add_run(total, rest, n)  # 2n additions now
        doublings[k] = total
        k += 1
        n *= 2


@njit(cache=True, error_model="numpy")
def _run_from_zero(rest, n, doublings):  # type: ignore[no-untyped-def]
    """The sum from +0 of n additions of `rest` (n within `_doubling_runs`'s longest): the
    largest doubling below it, then the rest of the run, which crosses a binade or two."""
    if n == 0:
        return _ZERO
    k = 0
    while (np.int64(2) << k) <= n:
        k += 1
    return add_run(doublings[k], rest, n - (np.int64(1) << k))


@njit(cache=True, error_model="numpy")
def _class_sum(vocab, rest, values, base, columns, order, first, count, lanes):  # type: ignore[no-untyped-def]
    """Row sum in Bob's order of the row holding `rest` at every column but its exceptions
    first .. first + count - 1, exception i holding values[base + i] (runs.lane_sums).

    A lane holds columns lane, lane + 256, ...: chains of V // 256 + 1 columns below
    V % 256, of V // 256 from there. `order` lists the row's exceptions by lane, then
    column, so each lane with exceptions is one stretch of it, in chain order. Every
    chain starts with a run of rest values from +0, taken from the doubling runs.
    `lanes`: `lanes_scratch()`."""
    short = vocab >> _LANE_BITS
    extra = vocab & _LANE_MASK
    doublings = lanes[LANES:]
    _doubling_runs(rest, short + 1, doublings)
    plain_short = _run_from_zero(rest, short, doublings)
    plain_long = plain_short + rest  # one more addition of the same chain
    for lane in range(LANES):
        lanes[lane] = plain_long if lane < extra else plain_short
    j = first
    last = first + count
    while j < last:
        i = np.int64(order[j])
        column = np.int64(columns[i])
        lane = column & _LANE_MASK
        previous = column >> _LANE_BITS  # the chain position of the last exception taken
        acc = _run_from_zero(rest, previous, doublings) + values[base + i]
        j += 1
        while j < last:
            i = np.int64(order[j])
            column = np.int64(columns[i])
            if column & _LANE_MASK != lane:
                break
            position = column >> _LANE_BITS
            acc = add_run(acc, rest, position - previous - 1) + values[base + i]
            previous = position
            j += 1
        length = short + 1 if lane < extra else short
        lanes[lane] = add_run(acc, rest, length - previous - 1)
    return _sum_tree(lanes)


@njit(cache=True, error_model="numpy")
def _zero_max_in_order(vocab, w, r, columns, order, first, count, lanes):  # type: ignore[no-untyped-def]
    """The row max in Bob's order where it is a zero of both signs: a lane keeps its
    first zero along its chain (nothing is greater, and `b > a` never takes an equal
    value), lanes without one hold something below zero (-inf here), and the max tree
    picks among the lanes' zeros."""
    short = vocab >> _LANE_BITS
    extra = vocab & _LANE_MASK
    rest = w[r]
    rest_zero = count < vocab and rest == _ZERO
    for lane in range(LANES):
        length = short + 1 if lane < extra else short
        lanes[lane] = rest if rest_zero and length > 0 else _NEG_INF
    j = first
    last = first + count
    while j < last:
        lane = np.int64(columns[order[j]]) & _LANE_MASK
        length = short + 1 if lane < extra else short
        found = False
        zero = _NEG_INF
        expected = 0  # the chain position after the exceptions met so far
        while j < last:
            i = np.int64(order[j])
            column = np.int64(columns[i])
            if column & _LANE_MASK != lane:
                break
            position = column >> _LANE_BITS
            if not found:
                if position > expected and rest_zero:  # a rest column comes first
                    zero, found = rest, True
                elif w[vocab + i] == _ZERO:
                    zero, found = w[vocab + i], True
                expected = position + 1
            j += 1
        if not found and expected < length and rest_zero:
            zero = rest
        lanes[lane] = zero
    return _max_tree(lanes)


@njit(inline="always", cache=True, error_model="numpy")
def _candidate(x, best, zeros):  # type: ignore[no-untyped-def]
    """row_max's op on one class (`select(x > best)`), and the signs of the zeros seen
    (bit 0: a +0, bit 1: a -0)."""
    if x == _ZERO:
        zeros |= 2 if _bits_from_f32(x) < 0 else 1
    return (x if x > best else best), zeros


@njit(cache=True, error_model="numpy")
def _class_max(vocab, w, r, columns, order, first, count, lanes):  # type: ignore[no-untyped-def]
    """The row max over the classes (reference.class_row_max): the rest only where it
    stands for a column, NaN never taken, -inf for no candidate. Equal values have equal
    bits but for the zeros: a zero max takes its sign from the zeros, or from the
    lanes' order where they have both signs."""
    best, zeros = _NEG_INF, 0
    if count < vocab:
        best, zeros = _candidate(w[r], best, zeros)
    for i in range(vocab + first, vocab + first + count):
        best, zeros = _candidate(w[i], best, zeros)
    if best == _ZERO:
        if zeros == 3:
            return _zero_max_in_order(vocab, w, r, columns, order, first, count, lanes)
        return _NEG_ZERO if zeros == 2 else _ZERO
    return best


@njit(cache=True, error_model="numpy")
def _exponentials(vocab, w, r, columns, order, first, count, log2e, e, lanes):  # type: ignore[no-untyped-def]
    """The row max m and e = exp2((w - m) log2e) of every class into e (the rest at 0,
    exception first + j at 1 + j). Returns (m, tame): tame when every class's exponent
    is finite and above -inf and its exponential finite (what `_corpus_shortcut` needs)."""
    m = _class_max(vocab, w, r, columns, order, first, count, lanes)
    z = (w[r] - m) * log2e
    x = _exp2(z)
    e[0] = x
    tame = (z > _NEG_INF) & (x < _POS_INF)
    for j in range(count):
        z = (w[vocab + first + j] - m) * log2e
        x = _exp2(z)
        e[1 + j] = x
        tame &= (z > _NEG_INF) & (x < _POS_INF)
    return m, tame


@njit(cache=True, error_model="numpy")
def _find(columns, first, count, column):  # type: ignore[no-untyped-def]
    """The j < count with columns[first + j] == column (a row's sorted columns), or -1."""
    low, high = first, first + count
    while low < high:
        middle = (low + high) >> 1
        if np.int64(columns[middle]) < column:
            low = middle + 1
        else:
            high = middle
    if low < first + count and np.int64(columns[low]) == column:
        return low - first
    return -1


@njit(cache=True, error_model="numpy")
def _target_exception(vocab, columns, first, count, target):  # type: ignore[no-untyped-def]
    """The row's exception j holding the target column, -1 where the target is no
    exception (or >= V): its loss is NaN and no class gets the -1 term."""
    if np.int64(target) >= vocab:
        return -1
    return _find(columns, first, count, np.int64(target))


# -- the gradients of one row's classes ----------------------------------------------------------


@njit(cache=True, error_model="numpy")
def _hard_gradient(vocab, w, r, hit, columns, order, first, count, log2e, inverse_rows, e,
                   lanes):  # type: ignore[no-untyped-def]
    """bob-loss-gradient's gradient of every class into e (the rest at 0, exception
    first + j at 1 + j): p / V, (p - 1) / V at the target exception `hit`. Returns (m, s)."""
    m, _ = _exponentials(vocab, w, r, columns, order, first, count, log2e, e, lanes)
    s = _class_sum(vocab, e[0], e, 1 - first, columns, order, first, count, lanes)
    slot = 1 + hit if hit >= 0 else -1  # the target's place in e (none: -1)
    for j in range(count + 1):
        p = e[j] / s
        e[j] = (p - _ONE) * inverse_rows if j == slot else p * inverse_rows
    return m, s


@njit(cache=True, error_model="numpy")
def _weightless(weights, first, count):  # type: ignore[no-untyped-def]
    """Whether the row's exceptions all have weight zero (of either sign)."""
    i, last = first, first + count
    while i < last and weights[i] == _ZERO:
        i += 1
    return i == last


@njit(cache=True, error_model="numpy")
def _corpus_shortcut(weightless, tame):  # type: ignore[no-untyped-def]
    """Where a corpus row needs no sum: every gradient is +0 and the loss +0.

    With all weights zero, rowsum(T) = +0 (a sum of zeros from +0). Tame exponents give
    s in [1, V] (the max's exp2(0) = 1 and every e in [0, 1], an absent rest's e finite),
    so every p = e / s is finite and >= 0: rs p - T = +0 - (+-0) = +0. And L - z is finite
    for every class, so every loss term (L - z) T is a zero, their sum +0 and ln2 * +0 = +0.
    A finite table is not enough: (w - m) of two huge values of opposite signs overflows
    to -inf, and (L - z) * 0 is then NaN, as the reference computes it."""
    return weightless and tame


@njit(cache=True, error_model="numpy")
def _weight_sum(vocab, weights, weightless, columns, order, first, count, lanes):  # type: ignore[no-untyped-def]
    """rowsum(T) of a row, the rest's weight +0: a sum of zeros from +0 is +0."""
    if weightless:
        return _ZERO
    return _class_sum(vocab, _ZERO, weights, 0, columns, order, first, count, lanes)


@njit(cache=True, error_model="numpy")
def _corpus_gradient(vocab, w, r, weights, weightless, weight_sum, columns, order, first,
                     count, log2e, e, lanes):  # type: ignore[no-untyped-def]
    """bob-loss-gradient-corpus's gradient of every class into e (rest at 0): rs p - T,
    the rest's weight +0, rs = `weight_sum`. Returns (m, s, shortcut); s is not computed
    (+0) where the shortcut took the row."""
    if count == 0 and np.isfinite(w[r]):
        # a row of its rest alone (most rows of a token corpus): m = w, z = 0, e = 1, tame
        e[0] = _ZERO
        return w[r], _ZERO, True
    m, tame = _exponentials(vocab, w, r, columns, order, first, count, log2e, e, lanes)
    if _corpus_shortcut(weightless, tame):
        for j in range(count + 1):
            e[j] = _ZERO
        return m, _ZERO, True
    s = _class_sum(vocab, e[0], e, 1 - first, columns, order, first, count, lanes)
    e[0] = (e[0] / s) * weight_sum - _ZERO
    for j in range(count):
        e[1 + j] = (e[1 + j] / s) * weight_sum - weights[first + j]
    return m, s, False


@njit(cache=True, error_model="numpy")
def _corpus_loss(vocab, w, r, weights, m, s, columns, order, first, count, log2e, ln2, terms,
                 lanes):  # type: ignore[no-untyped-def]
    """bob-loss-gradient-corpus's row loss: ln2 * the row sum of (L - z) T, L = log2(s)
    (the rest's term (L - z) * +0 takes part where the rest has columns)."""
    big_l = _log2(s)
    rest_term = (big_l - (w[r] - m) * log2e) * _ZERO
    for j in range(count):
        terms[1 + j] = (big_l - (w[vocab + first + j] - m) * log2e) * weights[first + j]
    return _canonical(ln2 * _class_sum(vocab, rest_term, terms, 1 - first, columns, order,
                                       first, count, lanes))


@njit(cache=True, error_model="numpy")
def _store_classes(vocab, r, first, count, values, table):  # type: ignore[no-untyped-def]
    """A row's classes from scratch (rest at 0) into a table of classes, NaN canonical."""
    table[r] = _canonical(values[0])
    for j in range(count):
        table[vocab + first + j] = _canonical(values[1 + j])


@njit(cache=True, error_model="numpy")
def _adamw_row(vocab, r, first, count, g, w, m, v, scalars):  # type: ignore[no-untyped-def]
    """bob-adamw on a row's classes with their gradients g (rest at 0)."""
    _adamw_element(w, g[0], m, v, scalars, r)
    for j in range(count):
        _adamw_element(w, g[1 + j], m, v, scalars, vocab + first + j)


@njit(cache=True, error_model="numpy")
def _hard_row(vocab, w, r, hit, columns, order, first, count, log2e, ln2, inverse_rows, g,
              lanes, grad):  # type: ignore[no-untyped-def]
    """bob-loss-gradient on row r: its classes' gradients into `grad`; returns its loss,
    NaN where the target is no exception."""
    m, s = _hard_gradient(vocab, w, r, hit, columns, order, first, count, log2e,
                          inverse_rows, g, lanes)
    _store_classes(vocab, r, first, count, g, grad)
    if hit < 0:
        return _f32_from_bits(_CANONICAL_NAN_BITS)
    return _canonical(ln2 * (_log2(s) - (w[vocab + first + hit] - m) * log2e))


@njit(cache=True, error_model="numpy")
def _corpus_row(vocab, w, r, weights, weightless, weight_sum, columns, order, first, count,
                log2e, ln2, g, terms, lanes, grad):  # type: ignore[no-untyped-def]
    """bob-loss-gradient-corpus on row r: its classes' gradients into `grad`; returns its
    loss (+0 where the shortcut took the row)."""
    m, s, shortcut = _corpus_gradient(vocab, w, r, weights, weightless, weight_sum, columns,
                                      order, first, count, log2e, g, lanes)
    _store_classes(vocab, r, first, count, g, grad)
    if shortcut:
        return _ZERO
    return _corpus_loss(vocab, w, r, weights, m, s, columns, order, first, count, log2e, ln2,
                        terms, lanes)


# -- rows in parallel ---------------------------------------------------------------------------


@njit(cache=True, error_model="numpy")
def _row_blocks(offsets, vocab, summing_empty, blocks):  # type: ignore[no-untyped-def]
    """Boundaries of `blocks` blocks of consecutive rows of about equal work (a prange
    hands each thread an equal share of the blocks): a row costs its classes, and a row
    that sums (every row with exceptions; one without where `summing_empty`) its lanes
    besides. int64[blocks + 1]."""
    blocks = max(1, min(vocab, blocks))
    total = 0
    for r in range(vocab):
        total += _row_cost(offsets, r, summing_empty)
    bounds = np.empty(blocks + 1, np.int64)
    bounds[0] = 0
    block = 1
    done = 0
    for r in range(vocab):
        done += _row_cost(offsets, r, summing_empty)
        while block < blocks and done * blocks >= total * block:
            bounds[block] = r + 1
            block += 1
    while block <= blocks:
        bounds[block] = vocab
        block += 1
    return bounds


@njit(inline="always", cache=True, error_model="numpy")
def _row_cost(offsets, r, summing_empty):  # type: ignore[no-untyped-def]
    count = np.int64(offsets[r + 1]) - np.int64(offsets[r])
    sums = count > 0 or summing_empty
    return _CLASS_COST * (count + 1) + (_SUMMING_ROW_COST if sums else 0)


@njit(cache=True, error_model="numpy")
def _widest(offsets, low, high):  # type: ignore[no-untyped-def]
    """The most exceptions of a row in [low, high)."""
    widest = 0
    for r in range(low, high):
        widest = max(widest, np.int64(offsets[r + 1]) - np.int64(offsets[r]))
    return widest


@njit(parallel=True, cache=True, error_model="numpy")
def loss_gradient_hard_classes(vocab, offsets, columns, order, w, targets, log2e, ln2,
                               inverse_rows, grad, loss, blocks):  # type: ignore[no-untyped-def]
    """reference.loss_gradient_hard_classes into `grad` (f32[V + K]) and `loss` (f32[V])."""
    bounds = _row_blocks(offsets, vocab, True, blocks)
    for block in prange(bounds.size - 1):
        low, high = bounds[block], bounds[block + 1]
        e = np.empty(_widest(offsets, low, high) + 1, _F32)
        lanes = lanes_scratch()
        for r in range(low, high):
            first = np.int64(offsets[r])
            count = np.int64(offsets[r + 1]) - first
            hit = _target_exception(vocab, columns, first, count, targets[r])
            loss[r] = _hard_row(vocab, w, r, hit, columns, order, first, count, log2e, ln2,
                                inverse_rows, e, lanes, grad)


@njit(parallel=True, cache=True, error_model="numpy")
def loss_gradient_corpus_classes(vocab, offsets, columns, order, w, weights, log2e, ln2, grad,
                                 loss, blocks):  # type: ignore[no-untyped-def]
    """reference.loss_gradient_corpus_classes into `grad` (f32[V + K]) and `loss` (f32[V])."""
    bounds = _row_blocks(offsets, vocab, False, blocks)
    for block in prange(bounds.size - 1):
        low, high = bounds[block], bounds[block + 1]
        widest = _widest(offsets, low, high) + 1
        e = np.empty(widest, _F32)
        terms = np.empty(widest, _F32)
        lanes = lanes_scratch()
        for r in range(low, high):
            first = np.int64(offsets[r])
            count = np.int64(offsets[r + 1]) - first
            weightless = _weightless(weights, first, count)
            weight_sum = _weight_sum(vocab, weights, weightless, columns, order, first, count,
                                     lanes)
            loss[r] = _corpus_row(vocab, w, r, weights, weightless, weight_sum, columns,
                                  order, first, count, log2e, ln2, e, terms, lanes, grad)


@njit(parallel=True, cache=True, error_model="numpy")
def loss_corpus_classes(vocab, offsets, columns, order, w, weights, log2e, ln2,
                        loss, blocks):  # type: ignore[no-untyped-def]
    """reference.loss_corpus_classes into `loss` (f32[V]): the corpus loss alone."""
    bounds = _row_blocks(offsets, vocab, False, blocks)
    for block in prange(bounds.size - 1):
        low, high = bounds[block], bounds[block + 1]
        widest = _widest(offsets, low, high) + 1
        e = np.empty(widest, _F32)
        terms = np.empty(widest, _F32)
        lanes = lanes_scratch()
        for r in range(low, high):
            first = np.int64(offsets[r])
            count = np.int64(offsets[r + 1]) - first
            m, tame = _exponentials(vocab, w, r, columns, order, first, count, log2e, e, lanes)
            if _corpus_shortcut(_weightless(weights, first, count), tame):
                loss[r] = _ZERO
                continue
            s = _class_sum(vocab, e[0], e, 1 - first, columns, order, first, count, lanes)
            loss[r] = _corpus_loss(vocab, w, r, weights, m, s, columns, order, first, count,
                                   log2e, ln2, terms, lanes)


@njit(parallel=True, cache=True, error_model="numpy")
def fused_hard_classes(vocab, offsets, columns, order, w, first_moment, second_moment, targets,
                       steps, log2e, ln2, inverse_rows, finish, grad,
                       loss, blocks):  # type: ignore[no-untyped-def]
    """reference.fused_train_classes, hard targets: each row's updates in turn, then with
    `finish` its loss and gradients (else `grad` holds the last update's gradient and `loss`
    is untouched)."""
    bounds = _row_blocks(offsets, vocab, True, blocks)
    for block in prange(bounds.size - 1):
        low, high = bounds[block], bounds[block + 1]
        g = np.empty(_widest(offsets, low, high) + 1, _F32)
        lanes = lanes_scratch()
        for r in range(low, high):
            first = np.int64(offsets[r])
            count = np.int64(offsets[r + 1]) - first
            hit = _target_exception(vocab, columns, first, count, targets[r])
            for k in range(steps.shape[0]):
                _hard_gradient(vocab, w, r, hit, columns, order, first, count, log2e,
                               inverse_rows, g, lanes)
                _adamw_row(vocab, r, first, count, g, w, first_moment, second_moment,
                           _scalars(steps[k]))
            if finish:
                loss[r] = _hard_row(vocab, w, r, hit, columns, order, first, count, log2e, ln2,
                                    inverse_rows, g, lanes, grad)
            elif steps.shape[0] > 0:  # the last update's gradient stays, as on the device
                _store_classes(vocab, r, first, count, g, grad)


@njit(parallel=True, cache=True, error_model="numpy")
def fused_corpus_classes(vocab, offsets, columns, order, w, first_moment, second_moment,
                         weights, steps, log2e, ln2, finish, grad,
                         loss, blocks):  # type: ignore[no-untyped-def]
    """reference.fused_train_classes, corpus weights: each row's updates in turn, then
    with `finish` its loss and gradients (else `grad` holds the last update's gradient and
    `loss` is untouched)."""
    bounds = _row_blocks(offsets, vocab, False, blocks)
    for block in prange(bounds.size - 1):
        low, high = bounds[block], bounds[block + 1]
        widest = _widest(offsets, low, high) + 1
        g = np.empty(widest, _F32)
        terms = np.empty(widest, _F32)
        lanes = lanes_scratch()
        for r in range(low, high):
            first = np.int64(offsets[r])
            count = np.int64(offsets[r + 1]) - first
            weightless = _weightless(weights, first, count)
            weight_sum = _weight_sum(vocab, weights, weightless, columns, order, first, count,
                                     lanes)
            for k in range(steps.shape[0]):
                _corpus_gradient(vocab, w, r, weights, weightless, weight_sum, columns, order,
                                 first, count, log2e, g, lanes)
                _adamw_row(vocab, r, first, count, g, w, first_moment, second_moment,
                           _scalars(steps[k]))
            if finish:
                loss[r] = _corpus_row(vocab, w, r, weights, weightless, weight_sum, columns,
                                      order, first, count, log2e, ln2, g, terms, lanes, grad)
            elif steps.shape[0] > 0:  # the last update's gradient stays, as on the device
                _store_classes(vocab, r, first, count, g, grad)


# -- gather, scatter, health -------------------------------------------------------------------


@njit(cache=True, error_model="numpy")
def gather_row(vocab, offsets, columns, bits, prompt, logits):  # type: ignore[no-untyped-def]
    """bob-collapsed-gather over bits (u32 views): logits = the expanded row `prompt`, its
    values copied as bits; a prompt >= V gives a row of 0x7FFFFFFF."""
    row = np.int64(prompt)
    if row >= vocab:
        logits[:] = _CANONICAL_NAN_BITS
        return
    logits[:] = bits[row]
    for i in range(np.int64(offsets[row]), np.int64(offsets[row + 1])):
        logits[columns[i]] = bits[vocab + i]


@njit(cache=True, error_model="numpy")
def scatter_pairs(vocab, offsets, columns, keys, values, weights):  # type: ignore[no-untyped-def]
    """weights[i] = values[j] (bits, u32 views) where key j (row * V + column, u64) is
    exception i: a binary search in its row's columns; other keys write nothing. One
    pass in key order, so a repeated key (the host refuses them) leaves its last value."""
    size = np.uint64(vocab)
    for j in range(keys.size):
        row = keys[j] // size
        if row >= size:
            continue
        r = np.int64(row)
        first = np.int64(offsets[r])
        hit = _find(columns, first, np.int64(offsets[r + 1]) - first,
                    np.int64(keys[j] - row * size))
        if hit >= 0:
            weights[first + hit] = values[j]


@njit(cache=True, error_model="numpy")
def non_finite_count(bits):  # type: ignore[no-untyped-def]
    """Elements of a table (u32 view of binary32) whose exponent bits are all ones."""
    found = 0
    for i in range(bits.size):
        found += (bits[i] & _NON_FINITE) == _NON_FINITE
    return found


# -- kernels over the arena (the reference's signatures) ----------------------------------------


def _index(memory: Memory, args: Args) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """vocab and the index a launch points at: row_offsets, columns, lane_order (u32)."""
    vocab, exceptions = int(args["vocab"]), int(args["exceptions"])
    return (vocab, memory.array(int(args["row_offsets"]), "u32", vocab + 1),
            memory.array(int(args["columns"]), "u32", exceptions),
            memory.array(int(args["lane_order"]), "u32", exceptions))


def blocks() -> int:
    """Blocks of rows a launch makes: a few per thread, so a row of thousands of
    exceptions leaves the others something to balance."""
    return _BLOCKS_PER_THREAD * numba.get_num_threads()


def _classes(memory: Memory, args: Args, name: str) -> np.ndarray:
    return memory.array(int(args[name]), "f32", int(args["classes"]))


def _weights(memory: Memory, args: Args) -> np.ndarray:
    return memory.array(int(args["weights"]), "f32", int(args["exceptions"]))


def _rows(memory: Memory, args: Args, name: str, dtype: str = "f32") -> np.ndarray:
    return memory.array(int(args[name]), dtype, int(args["vocab"]))


def gather(memory: Memory, args: Args) -> None:
    vocab, offsets, columns, _ = _index(memory, args)
    prompt = int(memory.array(int(args["prompt"]), "u32", 1)[0])
    gather_row(vocab, offsets, columns, _classes(memory, args, "parameters").view(np.uint32),
               prompt, _rows(memory, args, "logits", "u32"))


def loss_gradient_hard(memory: Memory, args: Args) -> None:
    loss_gradient_hard_classes(
        *_index(memory, args), _classes(memory, args, "parameters"),
        _rows(memory, args, "targets", "u32"), _F32(args["log2e"]), _F32(args["ln2"]),
        _F32(args["inverse_rows"]), _classes(memory, args, "gradients"),
        _rows(memory, args, "loss"), blocks())


def loss_gradient_corpus(memory: Memory, args: Args) -> None:
    loss_gradient_corpus_classes(
        *_index(memory, args), _classes(memory, args, "parameters"), _weights(memory, args),
        _F32(args["log2e"]), _F32(args["ln2"]), _classes(memory, args, "gradients"),
        _rows(memory, args, "loss"), blocks())


def loss_corpus(memory: Memory, args: Args) -> None:
    loss_corpus_classes(*_index(memory, args), _classes(memory, args, "parameters"),
                        _weights(memory, args), _F32(args["log2e"]), _F32(args["ln2"]),
                        _rows(memory, args, "loss"), blocks())


def _fused_arguments(memory: Memory, args: Args) -> tuple:
    """The three tables, adam_scalars rows, finish, then gradients (each update's gradient
    passes through them) and loss (empty when not finishing: its footprint is then empty)."""
    updates, finish = int(args["updates"]), int(args["finish"])
    tables = tuple(_classes(memory, args, name)
                   for name in ("parameters", "first_moment", "second_moment"))
    steps = memory.array(int(args["adam_scalars"]), "f32", _ADAM_STRIDE * updates)
    grad = memory.array(int(args["gradients"]), "f32", int(args["classes"]))
    loss = memory.array(int(args["loss"]), "f32", int(args["vocab"]) if finish else 0)
    return (*tables, steps.reshape(updates, _ADAM_STRIDE), bool(finish), grad, loss)


def fused_train_hard(memory: Memory, args: Args) -> None:
    w, m, v, steps, finish, grad, loss = _fused_arguments(memory, args)
    fused_hard_classes(*_index(memory, args), w, m, v, _rows(memory, args, "targets", "u32"),
                       steps, _F32(args["log2e"]), _F32(args["ln2"]),
                       _F32(args["inverse_rows"]), finish, grad, loss, blocks())


def fused_train_corpus(memory: Memory, args: Args) -> None:
    w, m, v, steps, finish, grad, loss = _fused_arguments(memory, args)
    fused_corpus_classes(*_index(memory, args), w, m, v, _weights(memory, args), steps,
                         _F32(args["log2e"]), _F32(args["ln2"]), finish, grad, loss, blocks())


def scatter(memory: Memory, args: Args) -> None:
    vocab, exceptions, count = int(args["vocab"]), int(args["exceptions"]), int(args["count"])
    scatter_pairs(vocab, memory.array(int(args["row_offsets"]), "u32", vocab + 1),
                  memory.array(int(args["columns"]), "u32", exceptions),
                  memory.array(int(args["keys"]), "u64", count),
                  memory.array(int(args["values"]), "u32", count),
                  memory.array(int(args["weights"]), "u32", exceptions))


def health(memory: Memory, args: Args) -> None:
    dense_ref.add_health(memory, args, tuple(
        int(non_finite_count(_classes(memory, args, name).view(np.uint32)))
        for name in sig.HEALTH_COUNTS))


KERNELS: dict[str, dense_ref.Kernel] = {
    sig.COLLAPSED_GATHER: gather,
    sig.COLLAPSED_LOSS_HARD: loss_gradient_hard,
    sig.COLLAPSED_LOSS_CORPUS: loss_gradient_corpus,
    sig.COLLAPSED_LOSS_ONLY: loss_corpus,
    sig.COLLAPSED_FUSED_HARD: fused_train_hard,
    sig.COLLAPSED_FUSED_CORPUS: fused_train_corpus,
    sig.COLLAPSED_SCATTER: scatter,
    sig.COLLAPSED_HEALTH: health,
}


# The compiled functions each region calls (what its first launch compiles, or loads from
# Numba's cache on disk): bob.kernels.sets joins them to the dense kernels' for the CPU
# backend's notice and its compilation ahead.
COMPILED: dict[str, tuple] = {
    sig.COLLAPSED_GATHER: (gather_row,),
    sig.COLLAPSED_LOSS_HARD: (loss_gradient_hard_classes,),
    sig.COLLAPSED_LOSS_CORPUS: (loss_gradient_corpus_classes,),
    sig.COLLAPSED_LOSS_ONLY: (loss_corpus_classes,),
    sig.COLLAPSED_FUSED_HARD: (fused_hard_classes,),
    sig.COLLAPSED_FUSED_CORPUS: (fused_corpus_classes,),
    sig.COLLAPSED_SCATTER: (scatter_pairs,),
    sig.COLLAPSED_HEALTH: (non_finite_count,),
}


def tiny_calls() -> dict:
    """Arguments for each compiled function, of the very types the kernels pass (the
    arena's writable u32 and f32 views, float32 scalars, Python ints, a bool), on a 2 x 2
    table with one exception a row: Numba compiles by type, so the code every V runs."""
    vocab = 2
    offsets = np.array([0, 1, 2], np.uint32)
    columns = np.array([0, 1], np.uint32)
    order = np.array([0, 1], np.uint32)
    index = (vocab, offsets, columns, order)
    one = _F32(1.0)
    steps = np.zeros((1, _ADAM_STRIDE), _F32)

    def classes() -> np.ndarray:
        return np.zeros(vocab + 2, _F32)

    rows, targets, weights = np.zeros(vocab, _F32), np.zeros(vocab, np.uint32), np.zeros(2, _F32)
    return {
        gather_row: (vocab, offsets, columns, classes().view(np.uint32), 0,
                     rows.view(np.uint32)),
        loss_gradient_hard_classes: (*index, classes(), targets, one, one, one, classes(),
                                     rows.copy(), 1),
        loss_gradient_corpus_classes: (*index, classes(), weights, one, one, classes(),
                                       rows.copy(), 1),
        loss_corpus_classes: (*index, classes(), weights, one, one, rows.copy(), 1),
        fused_hard_classes: (*index, classes(), classes(), classes(), targets, steps, one, one,
                             one, True, classes(), rows.copy(), 1),
        fused_corpus_classes: (*index, classes(), classes(), classes(), weights, steps, one,
                               one, True, classes(), rows.copy(), 1),
        scatter_pairs: (vocab, offsets, columns, np.zeros(1, np.uint64),
                        np.zeros(1, np.uint32), weights.view(np.uint32)),
        non_finite_count: (classes().view(np.uint32),),
    }
