"""Row reductions over a collapsed row: the dense order's bits at the cost of its classes.

A collapsed row holds one *rest* value for every column the data never names and a few
*exception* columns with their own values. Bob's row reductions (ARITHMETIC.md section
6) run lane l over columns l, l + 256, ... in order and then a tree over the 256 lanes.
Here each lane's chain is replayed as runs of the rest value between its exceptions,
and a run of n equal additions is summed exactly in a few steps per binade
(``add_runs``), so a row costs its exceptions and a few steps per lane, not V additions.

Why a run is cheap, exactly. Let acc > 0 lie in a binade whose spacing is u, so acc is a
whole multiple a of u with a < 2^24, and let 0 < x < acc, so q = x / u < 2^24. While
a + q < 2^24 the binary32 sum acc + x is the multiple of u nearest a + q (ties to even):
a grows by d = round(q) every addition, the same every time, except at a tie (q a whole
number and a half), where the first addition leaves a even and every later one adds the
even neighbour of q. So m additions inside the binade are one multiplication, and the
addition that leaves the binade is done as binary32. Zeros, infinities, NaN and
negative values take the additions one at a time: they are rare and the runs are short.
"""

from __future__ import annotations

import numpy as np

from bob.kernels.arith import LANES

_F32 = np.float32
_TWO_POW_24 = 1 << 24
_MANTISSA = 0x7FFFFF
_IMPLICIT = 1 << 23


LANE_ROWS = 8192  # rows whose 256 lanes the reference holds at once (8 MiB)


def chain_lengths(vocab: int) -> np.ndarray:
    """Columns in each lane's chain: lane l takes l, l + 256, ... below V (int64[256])."""
    lanes = np.arange(LANES, dtype=np.int64)
    return np.maximum(0, (vocab - lanes + LANES - 1) // LANES)


def add_run(acc: float, x: float, n: int) -> np.float32:
    """`acc` plus `n` additions of `x`, each rounded to binary32: one value at a time (the
    specification ``add_runs`` vectorizes; the Numba and CUDA kernels follow it)."""
    total, term = _F32(acc), _F32(x)
    with np.errstate(all="ignore"):
        while n > 0:
            if not (np.isfinite(total) and np.isfinite(term) and 0 < term < total):
                total = _F32(total + term)
                n -= 1
                if term == 0 or not (np.isfinite(total) and np.isfinite(term)):
                    return total  # fixed from here on: x is a zero, or acc is inf or NaN
                continue
            scale, whole, step, tie_odd, floor = _binade_step(int(total.view(np.uint32)),
                                                             int(term.view(np.uint32)))
            if tie_odd or whole + floor >= _TWO_POW_24:
                total = _F32(total + term)  # a tie from an odd a, or the binade's last one
                n -= 1
                continue
            if step == 0:
                return total  # x is below half a spacing: acc never moves again
            count = min(n, (_TWO_POW_24 - 1 - floor - whole) // step + 1)
            n -= count
            total = np.uint32(((scale - 1) << 23) + whole + count * step).view(_F32)
    return total


def _binade_step(acc_bits: int, x_bits: int) -> tuple[int, int, int, bool, int]:
    """For 0 < x < acc (both finite): acc's biased exponent (at least 1), its multiple a of
    the spacing, the step d every addition adds inside the binade, whether this addition
    is a tie from an odd a (it must be done as binary32), and floor(q)."""
    exponent, x_exponent = acc_bits >> 23, x_bits >> 23
    whole = (acc_bits & _MANTISSA) | (_IMPLICIT if exponent else 0)
    x_whole = (x_bits & _MANTISSA) | (_IMPLICIT if x_exponent else 0)
    scale = max(exponent, 1)
    shift = scale - max(x_exponent, 1)  # >= 0 since x < acc
    if shift > 25:
        return scale, whole, 0, False, 0  # q < 1/2: no addition moves acc
    floor = x_whole >> shift
    remainder = x_whole & ((1 << shift) - 1)
    half = (1 << (shift - 1)) if shift else 0
    if shift and remainder == half:  # a tie: the even neighbour once a is even
        return scale, whole, floor + (floor & 1), bool(whole & 1), floor
    return scale, whole, floor + int(shift > 0 and remainder > half), False, floor


def add_runs(acc: np.ndarray, x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """`add_run` element by element over arrays (broadcast): acc[i] plus n[i] additions of
    x[i], each rounded to binary32. A new float32 array."""
    acc, x, n = np.broadcast_arrays(np.asarray(acc, _F32), np.asarray(x, _F32),
                                    np.asarray(n, np.int64))
    total = acc.astype(_F32, copy=True).reshape(-1)
    term = np.ascontiguousarray(x).reshape(-1)
    left = n.astype(np.int64, copy=True).reshape(-1)
    todo = np.flatnonzero(left > 0)
    with np.errstate(all="ignore"):
        while todo.size:
            a, b, k = total[todo], term[todo], left[todo]
            finite = np.isfinite(a) & np.isfinite(b)
            fast = finite & (b > 0) & (a > b)
            step_one = ~fast
            shortcut = np.flatnonzero(fast)
            if shortcut.size:
                whole, scale, step, one, floor = _binade_steps(a[shortcut], b[shortcut])
                step_one[shortcut[one]] = True
                moving = ~one & (step > 0)
                k[shortcut[~one & (step == 0)]] = 0  # below half a spacing: fixed
                go = shortcut[moving]
                whole, scale, step, floor = whole[moving], scale[moving], step[moving], \
                    floor[moving]
                count = np.minimum(k[go], (_TWO_POW_24 - 1 - floor - whole) // step + 1)
                k[go] -= count
                bits = ((scale - 1) << 23) + whole + count * step
                a[go] = bits.astype(np.uint32).view(_F32)
            single = np.flatnonzero(step_one)
            if single.size:
                a[single] = a[single] + b[single]
                k[single] -= 1
                fixed = (b[single] == 0) | ~np.isfinite(a[single]) | ~np.isfinite(b[single])
                k[single[fixed]] = 0
            total[todo], left[todo] = a, k
            todo = todo[k > 0]
    return total.reshape(acc.shape)


def _binade_steps(acc: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, ...]:
    """`_binade_step` over arrays with 0 < x < acc: a, the biased exponent, d, whether the
    next addition must be done as binary32 (an odd a at a tie, or the binade's last), and
    floor(q)."""
    acc_bits = acc.view(np.uint32).astype(np.int64)
    x_bits = x.view(np.uint32).astype(np.int64)
    exponent, x_exponent = acc_bits >> 23, x_bits >> 23
    whole = (acc_bits & _MANTISSA) | np.where(exponent > 0, _IMPLICIT, 0)
    x_whole = (x_bits & _MANTISSA) | np.where(x_exponent > 0, _IMPLICIT, 0)
    scale = np.maximum(exponent, 1)
    shift = np.minimum(scale - np.maximum(x_exponent, 1), 26)  # >= 0; 26: q < 1/2
    floor = x_whole >> shift
    remainder = x_whole & ((np.int64(1) << shift) - 1)
    half = np.where(shift > 0, np.int64(1) << np.maximum(shift - 1, 0), 0)
    tie = (shift > 0) & (remainder == half)
    step = np.where(tie, floor + (floor & 1), floor + ((shift > 0) & (remainder > half)))
    one = (tie & ((whole & 1) == 1)) | (whole + floor >= _TWO_POW_24)
    return whole, scale, step, one, floor


def sum_tree(lanes: np.ndarray) -> np.ndarray:
    """The tree of ARITHMETIC.md section 6 over lanes[rows][256]: lane l < s adds lane
    l + s for s = 128, ..., 1. Lane 0 of each row (a new array)."""
    acc = np.array(lanes, _F32, copy=True)
    with np.errstate(all="ignore"):
        s = LANES // 2
        while s >= 1:
            acc[:, :s] += acc[:, s:2 * s]
            s //= 2
    return acc[:, 0].copy()


def max_tree(lanes: np.ndarray) -> np.ndarray:
    """The max tree over lanes[rows][256]: lane l < s takes lane l + s where it is
    greater (`select(b > a, b, a)`), s = 128, ..., 1. Lane 0 of each row."""
    acc = np.array(lanes, _F32, copy=True)
    s = LANES // 2
    while s >= 1:
        held, newcomer = acc[:, :s], acc[:, s:2 * s]
        np.copyto(held, newcomer, where=newcomer > held)
        s //= 2
    return acc[:, 0].copy()


def lane_sums(vocab: int, rest: np.ndarray, exception_rows: np.ndarray,
              exception_columns: np.ndarray, exception_values: np.ndarray) -> np.ndarray:
    """Each row's sum in Bob's order, the row holding `rest[r]` at every column but its
    exceptions: exception i is at column exception_columns[i] of row exception_rows[i]
    with value exception_values[i], sorted by (row, column), unique.

    Lanes without exceptions hold the sum of their chain's rest values (one of at most two
    run lengths a row); the others replay their chain as runs of the rest value between
    exceptions. Then the tree. float32[rows].
    """
    rest = np.asarray(rest, _F32)
    rows = rest.size
    lengths = chain_lengths(vocab)
    distinct, lane_kind = np.unique(lengths, return_inverse=True)
    plain = add_runs(np.zeros((rows, distinct.size), _F32), rest[:, None], distinct[None, :])
    sums = np.empty(rows, _F32)
    bounds = np.searchsorted(exception_rows, np.arange(0, rows + LANE_ROWS, LANE_ROWS))
    for block, first in enumerate(range(0, rows, LANE_ROWS)):  # lanes: a few MiB at a time
        last = min(rows, first + LANE_ROWS)
        lanes = plain[first:last, lane_kind]  # rows x 256
        low, high = bounds[block], bounds[block + 1]
        if high > low:
            replay_lanes(vocab, lanes, rest[first:last], exception_rows[low:high] - first,
                         exception_columns[low:high], exception_values[low:high])
        sums[first:last] = sum_tree(lanes)
    return sums


def replay_lanes(vocab: int, lanes: np.ndarray, rest: np.ndarray, exception_rows: np.ndarray,
                 exception_columns: np.ndarray, exception_values: np.ndarray) -> None:
    """Overwrite lanes[row][lane] of every lane that holds an exception with its chain:
    runs of rest[row] between the exceptions' values, in column order."""
    lengths = chain_lengths(vocab)
    columns = exception_columns.astype(np.int64)
    lane, position = columns % LANES, columns // LANES
    key = exception_rows.astype(np.int64) * LANES + lane
    order = np.argsort(key, kind="stable")  # within a lane, positions stay ascending
    key, position, values = key[order], position[order], exception_values[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    sizes = np.diff(np.r_[starts, key.size])
    group_row, group_lane = key[starts] // LANES, key[starts] % LANES
    group_rest = rest[group_row]
    acc = np.zeros(starts.size, _F32)
    previous = np.full(starts.size, -1, np.int64)
    for k in range(int(sizes.max())):
        live = np.flatnonzero(sizes > k)
        at = starts[live] + k
        acc[live] = add_runs(acc[live], group_rest[live], position[at] - previous[live] - 1)
        with np.errstate(all="ignore"):
            acc[live] += values[at]
        previous[live] = position[at]
    acc = add_runs(acc, group_rest, lengths[group_lane] - previous - 1)
    lanes[group_row, group_lane] = acc
