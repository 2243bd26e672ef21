"""Bob's arithmetic: constants proved, exp2/log2 within their bounds, reductions in order.

Set BOB_EXHAUSTIVE=1 to check exp2 and log2 at every float32 argument (about 2 min).
"""

from __future__ import annotations

import os
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from bob.kernels import arith
from bob.kernels.exact import f32_bits_from_fraction, fraction_of_f32_bits
from bob.program import bob

F32 = np.float32


def f32(bits: int) -> np.float32:
    return np.uint32(bits).view(np.float32)


def bits_of(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: equal bits, or both NaN (payloads are canonicalized only on store)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (bits_of(a) == bits_of(b)) | (np.isnan(a) & np.isnan(b))


def ulp_errors(y32: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|y32 - exact| in units of the last place of binary32 at `exact` (2^-149 below 2^-126)."""
    exact = np.asarray(exact, np.float64)
    _, exponent = np.frexp(np.abs(exact))
    ulp = np.ldexp(1.0, np.maximum(exponent - 24, -149))
    return np.abs(y32.astype(np.float64) - exact) / ulp


# -- constants ----------------------------------------------------------------------


def test_ln2_decimal_is_a_truncation_of_ln2():
    with localcontext() as context:
        context.prec = 110
        ln2 = Fraction(Decimal(2).ln())  # correctly rounded: within 1e-109 of ln 2
    low, high = arith.ln2_interval()
    assert low + Fraction(1, 10**105) < ln2 < high - Fraction(1, 10**105)
    assert len(arith.LN2_DECIMAL.split(".")[1]) >= 60


@pytest.mark.parametrize("constant", arith.CONSTANTS, ids=lambda c: c.name)
def test_constant_is_correctly_rounded(constant):
    # Each constant is a product of powers of ln 2 (positive or negative), so it is
    # monotone in ln 2: both ends of the interval rounding to the same bits prove
    # that the real value does too.
    low, high = arith.ln2_interval()
    assert f32_bits_from_fraction(constant.of_ln2(low)) == constant.bits, constant.real
    assert f32_bits_from_fraction(constant.of_ln2(high)) == constant.bits, constant.real


def test_program_passes_the_proved_constants():
    assert bob.LOG2E_BITS == arith.LOG2E.bits
    assert bob.LN2_BITS == arith.LN2.bits
    assert arith.EXP2_C1.bits == arith.LN2.bits
    assert bob.inverse_rows_bits(256) == 0x3B800000


def test_sqrt2_threshold_is_the_largest_float_below_sqrt2():
    below = fraction_of_f32_bits(arith.SQRT2_BELOW_BITS)
    above = fraction_of_f32_bits(arith.SQRT2_BELOW_BITS + 1)
    assert below * below < 2 < above * above
    assert f32_bits_from_fraction(Fraction(1)) == 0x3F800000


def test_exp2_clamp_bounds():
    assert arith.EXP2_LOW == F32(-151) and arith.EXP2_HIGH == F32(129)
    # below -151 the result rounds to 0: 2^-151 * 2^0.5 < 2^-150, half the least subnormal
    assert Fraction(2) ** -151 * Fraction(3, 2) < Fraction(2) ** -150


# -- a scalar model of the CUDA code, operation by operation -----------------------


def model_exp2(x: np.float32) -> np.float32:
    low, high = arith.EXP2_LOW, arith.EXP2_HIGH
    c = [k.value for k in arith.EXP2_COEFFICIENTS]
    xc = low if x < low else x
    xc = high if xc > high else xc
    n = np.rint(xc)
    f = xc - n
    p = f * c[7]
    for k in range(6, 0, -1):
        p = (p + c[k]) * f
    p = p + c[0]
    k = 0 if np.isnan(n) else int(n)  # __float2int_rn
    k1 = k >> 1
    p = p * f32((k1 + 127) << 23)
    return p * f32((k - k1 + 127) << 23)


def model_log2(x: np.float32) -> np.float32:
    a = [k.value for k in arith.LOG2_COEFFICIENTS]
    if not x > 0:
        return F32(-np.inf) if x == 0 else F32(np.nan)
    if x == np.inf:
        return x
    adjust = 0
    if x < f32(0x00800000):
        x, adjust = x * F32(2.0**24), 24
    bits = int(bits_of(x))
    e = (bits >> 23) - 127 - adjust
    m = f32((bits & 0x007FFFFF) | 0x3F800000)
    if m > f32(arith.SQRT2_BELOW_BITS):
        m, e = m * F32(0.5), e + 1
    t = (m - F32(1)) / (m + F32(1))
    u = t * t
    q = u * a[4]
    for k in (3, 2, 1):
        q = (q + a[k]) * u
    q = q + a[0]
    return F32(e) + t * q


def edge_values() -> np.ndarray:
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5,
                127.5, 127.99, 128.0, 128.5, 129.0, 200.0, -126.0, -126.5, -149.0, -149.5,
                -150.0, -150.25, -150.5, -150.75, -151.0, -151.5, -152.0, -1e30]
    extremes = [f32(b) for b in (0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF,
                                 0x80000001, 0xFF7FFFFF, 0x3FB504F3, 0x3FB504F4, 0x3F3504F3)]
    around = [np.nextafter(F32(v), F32(d)) for v in (-150, -149, -0.5, 0.5, 128, -151)
              for d in (-np.inf, np.inf)]
    return np.array(specials + extremes + around, np.float32)


def test_vectorised_exp2_and_log2_are_the_scalar_model_bit_for_bit():
    rng = np.random.default_rng(1)
    x = np.concatenate([
        edge_values(),
        rng.uniform(-160, 140, 3000).astype(np.float32),
        rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32).view(np.float32),
    ])
    with np.errstate(all="ignore"):
        expected_exp2 = np.array([model_exp2(v) for v in x], np.float32)
        expected_log2 = np.array([model_log2(v) for v in x], np.float32)
    assert same_bits(arith.exp2(x), expected_exp2).all()
    assert same_bits(arith.log2(x), expected_log2).all()
    assert arith.exp2(x).dtype == np.float32 and arith.log2(x).dtype == np.float32


def test_functions_refuse_other_dtypes():
    with pytest.raises(TypeError):
        arith.exp2(np.zeros(3))
    with pytest.raises(TypeError):
        arith.log2(np.ones(3, np.float16))
    with pytest.raises(TypeError):
        arith.row_sum(np.ones((2, 3)))


def test_exp2_keeps_shape_and_writes_out():
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    out = np.empty_like(x)
    assert arith.exp2(x, out=out) is out
    assert same_bits(out, arith.exp2(x.reshape(-1)).reshape(3, 4)).all()
    assert arith.exp2(F32(3.0)).shape == () and arith.exp2(F32(3.0)) == 8


# -- exp2 ---------------------------------------------------------------------------


def test_exp2_special_values():
    x = np.array([-np.inf, np.inf, np.nan, 128.0, 1000.0, -150.0, -151.0, -1e38, 0.0, -0.0],
                 np.float32)
    y = arith.exp2(x)
    assert y[0] == 0 and y[1] == np.inf and np.isnan(y[2])
    assert y[3] == np.inf and y[4] == np.inf
    assert bits_of(y[5]) == 0  # 2^-150 is the tie between 0 and 2^-149: even, 0
    assert bits_of(y[6]) == 0 and bits_of(y[7]) == 0
    assert y[8] == 1 and y[9] == 1


def test_exp2_of_integers_is_exact():
    k = np.arange(-149, 128)
    y = arith.exp2(k.astype(np.float32))
    assert (y.astype(np.float64) == np.ldexp(1.0, k)).all()


def test_exp2_subnormal_results_are_kept():
    x = np.array([-149.0, -140.5, -127.3, -126.0], np.float32)
    y = arith.exp2(x)
    assert (y > 0).all() and (y[:3] < np.finfo(np.float32).tiny).all()


def exp2_dense_sample() -> np.ndarray:
    # Every 61st float32 in [-151, 0] and in [0, 128), plus the edge values.
    negative = (np.arange(0, 0x43170001, 61, dtype=np.uint32) | np.uint32(0x80000000))
    positive = np.arange(0, 0x43000000, 61, dtype=np.uint32)
    return np.concatenate([negative.view(np.float32), positive.view(np.float32)])


def test_exp2_error_bound_dense():
    x = exp2_dense_sample()
    errors = ulp_errors(arith.exp2(x), np.exp2(x.astype(np.float64)))
    assert errors.max() <= arith.EXP2_MAX_ULPS, f"{errors.max():.4f} ulp at x={x[errors.argmax()]}"


def test_exp2_error_bound_edges():
    x = edge_values()
    x = x[np.isfinite(x) & (x < 128)]
    errors = ulp_errors(arith.exp2(x), np.exp2(x.astype(np.float64)))
    assert errors.max() <= arith.EXP2_MAX_ULPS


# -- log2 ---------------------------------------------------------------------------


def test_log2_special_values():
    x = np.array([0.0, -0.0, -1.0, -np.inf, np.inf, np.nan, 1.0], np.float32)
    y = arith.log2(x)
    assert y[0] == -np.inf and y[1] == -np.inf
    assert np.isnan(y[2]) and np.isnan(y[3]) and np.isnan(y[5])
    assert y[4] == np.inf
    assert bits_of(y[6]) == 0  # log2(1) is +0


def test_log2_of_powers_of_two_is_exact_including_subnormals():
    k = np.arange(-149, 128)
    x = np.ldexp(1.0, k).astype(np.float32)
    assert (arith.log2(x) == k.astype(np.float32)).all()


def test_log2_error_bound_dense():
    # Every 127th positive finite float32 (subnormals included), plus the edge values.
    x = np.arange(1, 0x7F800000, 127, dtype=np.uint32).view(np.float32)
    edges = edge_values()
    x = np.concatenate([x, edges[np.isfinite(edges) & (edges > 0)]])
    errors = ulp_errors(arith.log2(x), np.log2(x.astype(np.float64)))
    assert errors.max() <= arith.LOG2_MAX_ULPS, f"{errors.max():.4f} ulp at x={x[errors.argmax()]}"


@pytest.mark.skipif(os.environ.get("BOB_EXHAUSTIVE") != "1", reason="set BOB_EXHAUSTIVE=1")
@pytest.mark.parametrize("which", ["exp2-negative", "exp2-positive", "log2"])
def test_error_bounds_exhaustive(which):
    sign, end, func, exact, bound = {
        "exp2-negative": (0x80000000, 0x43170001, arith.exp2, np.exp2, arith.EXP2_MAX_ULPS),
        "exp2-positive": (0, 0x43000000, arith.exp2, np.exp2, arith.EXP2_MAX_ULPS),
        "log2": (0, 0x7F800000, arith.log2, np.log2, arith.LOG2_MAX_ULPS),
    }[which]
    worst = 0.0
    for start in range(0, end, 1 << 24):
        x = (np.arange(start, min(start + (1 << 24), end), dtype=np.uint32) | np.uint32(sign))
        x = x.view(np.float32)
        if func is arith.log2:
            x = x[x > 0]
        with np.errstate(all="ignore"):
            worst = max(worst, float(ulp_errors(func(x), exact(x.astype(np.float64))).max()))
    assert worst <= bound, f"{which}: {worst:.4f} ulp"


# -- reductions ---------------------------------------------------------------------


def loop_sum(row: np.ndarray) -> np.float32:
    lanes = [F32(0.0)] * 256
    for j, value in enumerate(row):
        lanes[j % 256] = lanes[j % 256] + value  # lane j % 256 takes j in increasing order
    s = 128
    while s >= 1:
        for lane in range(s):
            lanes[lane] = lanes[lane] + lanes[lane + s]
        s //= 2
    return lanes[0]


def loop_max(row: np.ndarray) -> np.float32:
    lanes = [F32(-np.inf)] * 256
    for j, value in enumerate(row):
        held = lanes[j % 256]
        lanes[j % 256] = value if value > held else held
    s = 128
    while s >= 1:
        for lane in range(s):
            held, newcomer = lanes[lane], lanes[lane + s]
            lanes[lane] = newcomer if newcomer > held else held
        s //= 2
    return lanes[0]


def awkward_rows(rows: int, v: int, rng: np.random.Generator) -> np.ndarray:
    """Rows whose sums depend on the order: wide magnitudes, signed zeros, infinities, NaN."""
    x = (rng.standard_normal((rows, v)) * 10.0 ** rng.integers(-8, 9, (rows, v))).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38], np.float32)
    mask = rng.random((rows, v)) < 0.03
    x[mask] = rng.choice(specials, mask.sum())
    x[0] = rng.choice(np.array([0.0, -0.0], np.float32), v)  # a row of zeros only
    if rows > 1:
        x[1] = -x[0]
    return x


@pytest.mark.parametrize("v", [1, 2, 3, 100, 255, 256, 257, 513, 700])
def test_reductions_follow_the_documented_order(v):
    rng = np.random.default_rng(v)
    x = awkward_rows(6, v, rng)
    with np.errstate(all="ignore"):
        sums = [loop_sum(row) for row in x]
        maxima = [loop_max(row) for row in x]
    assert same_bits(arith.row_sum(x), sums).all()
    assert same_bits(arith.row_max(x), maxima).all()
    assert same_bits(arith.row_max_in_order(x), maxima).all()
    assert arith.row_sum(x).dtype == np.float32 and arith.row_max(x).dtype == np.float32


def test_row_max_of_zeros_and_nan():
    rows = np.array([[-0.0, 0.0], [0.0, -0.0], [np.nan, np.nan], [np.nan, -np.inf],
                     [np.nan, 1.0], [-np.inf, -np.inf]], np.float32)
    result = arith.row_max(rows)
    assert list(bits_of(result[:2])) == [0x80000000, 0x00000000]  # the first zero held stays
    assert list(result[2:]) == [-np.inf, -np.inf, 1.0, -np.inf]  # NaN is never taken


def test_row_sum_adds_in_lane_order():
    # Lane 0 adds 2^24 + 1 three times, each rounding back to 2^24 (a pairwise sum would
    # add the ones first and get 2^24 + 4).
    x = np.zeros((1, 256 * 4), np.float32)
    x[0, 0] = 2.0**24
    x[0, 256::256] = 1.0
    assert arith.row_sum(x)[0] == 2.0**24
    assert loop_sum(x[0]) == 2.0**24


def test_canonicalize_nan():
    x = np.array([1.0, np.nan, -np.nan, 2.0], np.float32)
    x.view(np.uint32)[2] = 0xFFC00001
    arith.canonicalize_nan(x)
    assert list(bits_of(x)) == [0x3F800000, 0x7FFFFFFF, 0x7FFFFFFF, 0x40000000]
