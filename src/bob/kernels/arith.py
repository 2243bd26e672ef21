"""Bob's binary32 arithmetic, specified in NumPy: exp2, log2 and the row reductions.

``docs/ARITHMETIC.md`` is the specification and this module its executable form.
Every function performs exactly the operations the CUDA kernels perform, in the
same order, each rounded once to binary32: IEEE + - * /, comparisons and
selects, round-to-integral, and multiplication by powers of two built from
their bits. No float64, no pairwise summation, no fused multiply-add.

Inputs must already be float32 arrays: converting here would hide a rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from bob.kernels.exact import f32_from_bits

# ln 2 to 70 decimals, truncated (not rounded): ln 2 lies in [LN2_DECIMAL, LN2_DECIMAL + 1e-70).
# Every constant below is a monotone function of ln 2, so rounding both ends of
# that interval to the same binary32 proves the constant correctly rounded.
LN2_DECIMAL = "0.6931471805599453094172321214581765680755001343602552541206800094933936"
LN2_TRUNCATION = Fraction(1, 10**70)


def ln2_interval() -> tuple[Fraction, Fraction]:
    """Exact rationals bracketing ln 2: [low, high)."""
    low = Fraction(LN2_DECIMAL)
    return low, low + LN2_TRUNCATION


@dataclass(frozen=True)
class Constant:
    """A binary32 constant: its bits and the real number it is the rounding of."""

    name: str
    bits: int
    real: str  # the real number, for people
    of_ln2: Callable[[Fraction], Fraction]  # the same real number, monotone in ln 2

    @property
    def value(self) -> np.float32:
        return np.float32(f32_from_bits(self.bits))


# -- the kernels' scalar arguments (bob.program.bob writes the same bits) -----------
LOG2E = Constant("log2e", 0x3FB8AA3B, "1/ln 2", lambda ln2: 1 / ln2)
LN2 = Constant("ln2", 0x3F317218, "ln 2", lambda ln2: ln2)

# -- exp2: Taylor coefficients of 2^f = sum_k (ln 2)^k f^k / k! ---------------------
EXP2_C0 = Constant("exp2_c0", 0x3F800000, "1", lambda ln2: Fraction(1))
EXP2_C1 = Constant("exp2_c1", 0x3F317218, "ln2", lambda ln2: ln2)
EXP2_C2 = Constant("exp2_c2", 0x3E75FDF0, "ln2^2/2!", lambda ln2: ln2**2 / 2)
EXP2_C3 = Constant("exp2_c3", 0x3D635847, "ln2^3/3!", lambda ln2: ln2**3 / 6)
EXP2_C4 = Constant("exp2_c4", 0x3C1D955B, "ln2^4/4!", lambda ln2: ln2**4 / 24)
EXP2_C5 = Constant("exp2_c5", 0x3AAEC3FF, "ln2^5/5!", lambda ln2: ln2**5 / 120)
EXP2_C6 = Constant("exp2_c6", 0x39218489, "ln2^6/6!", lambda ln2: ln2**6 / 720)
EXP2_C7 = Constant("exp2_c7", 0x377FE5FE, "ln2^7/7!", lambda ln2: ln2**7 / 5040)
EXP2_COEFFICIENTS = (EXP2_C0, EXP2_C1, EXP2_C2, EXP2_C3, EXP2_C4, EXP2_C5, EXP2_C6, EXP2_C7)

# -- log2: log2(m) = 2 log2(e) atanh(t) = sum_k 2/(k ln 2) t^k over odd k -----------
LOG2_A1 = Constant("log2_a1", 0x4038AA3B, "2/(1 ln2)", lambda ln2: 2 / ln2)
LOG2_A3 = Constant("log2_a3", 0x3F76384F, "2/(3 ln2)", lambda ln2: 2 / (3 * ln2))
LOG2_A5 = Constant("log2_a5", 0x3F13BB63, "2/(5 ln2)", lambda ln2: 2 / (5 * ln2))
LOG2_A7 = Constant("log2_a7", 0x3ED30BB1, "2/(7 ln2)", lambda ln2: 2 / (7 * ln2))
LOG2_A9 = Constant("log2_a9", 0x3EA4258A, "2/(9 ln2)", lambda ln2: 2 / (9 * ln2))
LOG2_COEFFICIENTS = (LOG2_A1, LOG2_A3, LOG2_A5, LOG2_A7, LOG2_A9)

CONSTANTS = (LOG2E, LN2, *EXP2_COEFFICIENTS, *LOG2_COEFFICIENTS)

# The largest binary32 below sqrt(2) (also its rounding): mantissas above it are halved,
# so the reduced mantissa lies in [sqrt(1/2), sqrt(2)).
SQRT2_BELOW_BITS = 0x3FB504F3

# exp2 clamps its argument to [EXP2_LOW, EXP2_HIGH]: below, the result rounds to 0
# (2^-151 * sqrt 2 < 2^-150, half the smallest subnormal); above, it overflows to inf.
EXP2_LOW = np.float32(-151.0)
EXP2_HIGH = np.float32(129.0)

# Error bounds in units in the last place of the exact result (2^-149 for subnormal
# results), measured over every float32 argument (tests/test_arith.py, BOB_EXHAUSTIVE=1):
# exp2 at most 1.151 ulp for all x < 128, log2 at most 3.004 ulp for all x > 0.
EXP2_MAX_ULPS = 1.16
LOG2_MAX_ULPS = 3.01

CANONICAL_NAN_BITS = 0x7FFFFFFF  # every NaN a kernel stores is written as this pattern

LANES = 256  # the CUDA block: reductions run over this many lanes

_F32 = np.float32
_ROUND_TO_INT = _F32(12582912.0)  # 1.5 * 2^23
_ONE = _F32(1.0)
_HALF = _F32(0.5)
_TWO_POW_24 = _F32(16777216.0)
_MIN_NORMAL = _F32(f32_from_bits(0x00800000))  # 2^-126
_SQRT2_BELOW = _F32(f32_from_bits(SQRT2_BELOW_BITS))
_EXP2_C = tuple(c.value for c in EXP2_COEFFICIENTS)
_LOG2_A = tuple(a.value for a in LOG2_COEFFICIENTS)


def _require_f32(x: np.ndarray | np.floating) -> np.ndarray:
    array = np.asarray(x)
    if array.dtype != np.float32:
        raise TypeError(f"Bob's arithmetic takes float32, not {array.dtype}")
    return array


def exp2(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """2^x for float32 x, by the specified sequence (error bound in ARITHMETIC.md).

    NaN gives NaN, -inf and x < -150 give 0, x >= 128 gives inf; subnormal
    results are rounded once, never flushed. `out` (float32, x's shape) may
    receive the result; large temporaries are few because each costs page
    faults on small machines.
    """
    x = _require_f32(x)
    result = np.empty_like(x) if out is None else out
    if result.dtype != np.float32 or result.shape != x.shape or not result.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous float32 array of shape {x.shape}")
    p = result.reshape(-1)
    with np.errstate(all="ignore"):  # NaN casts, underflow and overflow are all intended
        f = np.clip(x.reshape(-1), EXP2_LOW, EXP2_HIGH)  # the two selects; NaN passes through
        n = np.rint(f)  # round half to even
        f -= n  # f = x - n: exact, in [-0.5, 0.5]
        np.multiply(f, _EXP2_C[7], out=p)
        for c in _EXP2_C[6:0:-1]:  # Horner: p = p * f + c, two roundings per step
            p += c
            p *= f
        p += _EXP2_C[0]
        # n is an integer with |n| <= 151, so 1.5 * 2^23 + n is exact and its bits are
        # 0x4B400000 + n: the conversion to int32, in place (CUDA: __float2int_rn).
        n += _ROUND_TO_INT
        k = n.view(np.int32)
        k -= 0x4B400000
        k1 = np.right_shift(k, 1, out=f.view(np.int32))  # floor(n / 2); f is spent
        k -= k1  # k2 = n - k1; both halves are normal exponents
        for half in (k1, k):  # p * 2^k1 is exact; p * 2^k2 is the one rounding
            half += 127
            half <<= 23  # the bits of 2^half
            p *= half.view(np.float32)
    return result


def log2(x: np.ndarray) -> np.ndarray:
    """log2(x) for float32 x, by the specified sequence (error bound in ARITHMETIC.md).

    Subnormals are handled exactly by pre-scaling; 0 gives -inf, inf gives
    inf, negative and NaN give NaN.
    """
    shape, x = np.shape(x), _require_f32(x).reshape(-1)
    with np.errstate(all="ignore"):
        ok = (x > 0) & (x < np.inf)
        xs = np.where(ok, x, _ONE)
        tiny = xs < _MIN_NORMAL
        xs = np.where(tiny, xs * _TWO_POW_24, xs)  # exact: now a normal number
        bits = xs.view(np.uint32)
        e = (bits >> 23).astype(np.int32) - 127 - np.where(tiny, 24, 0)
        m = ((bits & 0x007FFFFF) | 0x3F800000).astype(np.uint32).view(np.float32)  # [1, 2)
        big = m > _SQRT2_BELOW
        m = np.where(big, m * _HALF, m)  # exact: m in [sqrt(1/2), sqrt(2))
        e += big
        t = (m - _ONE) / (m + _ONE)  # m - 1 is exact (Sterbenz)
        u = t * t
        q = u * _LOG2_A[4]
        for a in _LOG2_A[3:0:-1]:  # Horner in t^2: q = q * u + a
            q += a
            q *= u
        q += _LOG2_A[0]
        result = e.astype(np.float32) + t * q
        result = np.where(x == 0, _F32(-np.inf), result)
        result = np.where(x == np.inf, _F32(np.inf), result)
        result = np.where((x < 0) | np.isnan(x), _F32(np.nan), result)
    return result.astype(np.float32, copy=False).reshape(shape)


def _require_rows(x: np.ndarray) -> np.ndarray:
    x = _require_f32(x)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"reductions take a 2-D array (rows x V, V >= 1), not shape {x.shape}")
    return x


def row_sum(x: np.ndarray) -> np.ndarray:
    """Sum of each row in Bob's fixed order (see ARITHMETIC.md, "Reductions").

    Lane l adds elements l, l+256, l+512, ... to 0.0 in turn; then for
    s = 128, 64, ..., 1, lane l < s adds lane l+s. The sum is lane 0.
    """
    x = _require_rows(x)
    rows, v = x.shape
    acc = np.zeros((rows, LANES), np.float32)
    with np.errstate(all="ignore"):
        for start in range(0, v, LANES):
            width = min(LANES, v - start)
            acc[:, :width] += x[:, start:start + width]
        s = LANES // 2
        while s >= 1:
            acc[:, :s] += acc[:, s:2 * s]
            s //= 2
    return acc[:, 0].copy()


def row_max(x: np.ndarray) -> np.ndarray:
    """Maximum of each row in Bob's fixed order, with the select `b > a ? b : a`.

    Lanes start from -inf; `a` is what the lane holds, `b` the newcomer, so a
    NaN newcomer is skipped and of two equal zeros the one held first stays.
    See `row_max_in_order` for the order itself; this computes the same bits
    faster: a lane never holds NaN, so the result is the largest non-NaN
    element (-inf if none), and elements that compare equal have equal bits
    except +0 and -0. Only rows whose maximum is zero need the order.
    """
    x = _require_rows(x)
    with np.errstate(invalid="ignore"):
        result = np.fmax.reduce(x, axis=1)  # fmax skips NaN like the select does
    result[np.isnan(result)] = -np.inf  # rows of NaN only: no lane took anything
    zero = result == 0
    if zero.any():
        result[zero] = row_max_in_order(x[zero])
    return result


def row_max_in_order(x: np.ndarray) -> np.ndarray:
    """`row_max` step by step: lanes, strided elements, then the tree."""
    x = _require_rows(x)
    rows, v = x.shape
    acc = np.full((rows, LANES), -np.inf, np.float32)
    for start in range(0, v, LANES):
        width = min(LANES, v - start)
        held, newcomer = acc[:, :width], x[:, start:start + width]
        np.copyto(held, newcomer, where=newcomer > held)
    s = LANES // 2
    while s >= 1:
        held, newcomer = acc[:, :s], acc[:, s:2 * s]
        np.copyto(held, newcomer, where=newcomer > held)
        s //= 2
    return acc[:, 0].copy()


def canonicalize_nan(x: np.ndarray) -> np.ndarray:
    """Write every NaN in `x` as 0x7FFFFFFF, in place: NaN payloads differ between CPUs and GPUs."""
    nan = np.isnan(x)
    if nan.any():
        x.view(np.uint32)[nan] = CANONICAL_NAN_BITS
    return x
