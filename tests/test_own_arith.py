"""Bob's own division and square root (bob.kernels.own), run on the emulator over edge
classes of operands, with MUFU's results exact and perturbed by 1 and 2 ulps: every
result must be the IEEE correctly rounded one (NumPy's), NaN as the canonical pattern.
Both ways through each routine are tried: warps whose every lane is in the fast range
(its edges included), which skip the exact sequence, and warps with one lane outside."""

from __future__ import annotations

import numpy as np
import pytest

from bob.isa import table
from bob.isa.check import check
from bob.kernels.own.asm import (
    DIVIDE_FAST_A,
    DIVIDE_FAST_B,
    DIVIDE_FAST_SPREAD,
    SQRT_FAST_LOW,
)
from own_support import elementwise, run_elementwise, run_elementwise_counted

ARCHS = ("sm_90", "sm_86")
PERTURBATIONS = (0, 1, -1, 2, -2)


def _bits(values: np.ndarray) -> np.ndarray:
    bits = values.view(np.uint32).copy()
    bits[np.isnan(values)] = 0x7FFFFFFF
    return bits


def _edge_operands(rng: np.random.Generator, n: int) -> np.ndarray:
    """Every exponent (subnormals, zeros, infinities and NaNs among them), both signs,
    significands random, zero and all ones."""
    mantissa = rng.integers(0, 1 << 23, n).astype(np.uint32)
    mantissa[rng.random(n) < 0.2] = 0
    mantissa[rng.random(n) < 0.1] = (1 << 23) - 1
    exponent = rng.integers(0, 256, n).astype(np.uint32)
    sign = (rng.random(n) < 0.5).astype(np.uint32) << 31
    return (sign | exponent << 23 | mantissa).view(np.float32)


def _near_subnormal_midpoints(rng: np.random.Generator, n: int):
    """Pairs whose quotient lies within a few 2^-24 of a midpoint of the subnormal grid,
    off it: the 24-bit quotient lands on the midpoint, so rounding it again goes wrong
    half the time (the double rounding the final correction exists for)."""
    dropped = rng.integers(1, 25, n)
    significand = rng.integers(1 << 23, 1 << 24, n)
    significand = (significand >> dropped << dropped) | (1 << (dropped - 1))
    s = (significand / (1 << 23)).astype(np.float32)
    b = (rng.integers(1 << 23, 1 << 24, n) / (1 << 23)).astype(np.float32)
    a = (s.astype(np.float64) * b).astype(np.float32)  # a / b is near s, rarely s itself
    shift = rng.integers(-20, 20, n)
    result_exponent = -126 - dropped
    with np.errstate(all="ignore"):
        a = (a * np.exp2(shift)).astype(np.float32)
        b = (b * np.exp2(shift - result_exponent)).astype(np.float32)
    keep = np.isfinite(b) & (b != 0) & np.isfinite(a) & (a != 0)
    return a[keep], b[keep], (shift - (shift - result_exponent))[keep]


DIVISIONS = ("divide", "divide_by")  # b's reciprocal made by each lane, then the division


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("operation", DIVISIONS)
def test_division_is_correctly_rounded_for_every_operand_class(arch, operation):
    image = elementwise(arch, operation)
    assert check(image.code, table(arch)) == []
    rng = np.random.default_rng(11)
    n = 1 << 13
    a, b = _edge_operands(rng, n), _edge_operands(rng, n)
    # And quotients near and in the subnormal and overflow ranges.
    exponents = (a.view(np.uint32) >> 23 & 0xFF).astype(np.int64)
    shifted = np.clip(exponents + rng.integers(-160, 160, n), 1, 254).astype(np.uint32)
    near = (a.view(np.uint32) & 0x807FFFFF | shifted << 23).view(np.float32)
    b = np.where(rng.random(n) < 0.5, b, near).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-45, 3.4e38],
                       np.float32)
    a = np.concatenate([a, np.repeat(special, len(special))])
    b = np.concatenate([b, np.tile(special, len(special))])
    # As drawn, nearly every warp holds a lane outside the fast range; ordered by the
    # exponents, most warps are one class, so the fast range's edges meet whole warps.
    order = np.lexsort((b.view(np.uint32) >> 23 & 0xFF, a.view(np.uint32) >> 23 & 0xFF))
    a, b = np.concatenate([a, a[order]]), np.concatenate([b, b[order]])
    with np.errstate(all="ignore"):
        want = _bits(a / b)
    for perturb in PERTURBATIONS:
        got = run_elementwise(image, a, b, perturb)
        wrong = np.nonzero(got != want)[0]
        assert not len(wrong), (perturb, [(hex(a.view(np.uint32)[k]), hex(b.view(np.uint32)[k]),
                                           hex(got[k]), hex(want[k])) for k in wrong[:5]])


@pytest.mark.parametrize("operation", DIVISIONS)
def test_division_rounds_subnormal_quotients_once(operation):
    a, b, exponent = _near_subnormal_midpoints(np.random.default_rng(12), 1 << 13)
    with np.errstate(all="ignore"):
        want = _bits(a / b)
        # The class is real: the 24-bit quotient scaled with one more rounding differs.
        q = (a.astype(np.float64) * np.exp2(-exponent.astype(np.float64)) / b).astype(
            np.float32)  # the quotient's 24 bits, scaled into the normal range exactly
        double_rounded = _bits((q.astype(np.float64) * np.exp2(exponent)).astype(np.float32))
    assert (double_rounded != want).sum() > 100
    image = elementwise("sm_90", operation)
    for perturb in PERTURBATIONS:
        got = run_elementwise(image, a, b, perturb)
        assert (got == want).all(), perturb


@pytest.mark.parametrize("arch", ARCHS)
def test_square_root_is_correctly_rounded_for_every_operand_class(arch):
    image = elementwise(arch, "sqrt")
    assert check(image.code, table(arch)) == []
    rng = np.random.default_rng(13)
    x = _edge_operands(rng, 1 << 13)
    # Squares and their neighbours: roots on and beside representable values.
    roots = (rng.integers(1 << 23, 1 << 24, 2048) / (1 << 23)).astype(np.float32)
    squares = (roots.astype(np.float64) ** 2).astype(np.float32)
    neighbours = np.concatenate([(squares.view(np.uint32).astype(np.int64) + d).astype(np.uint32)
                                 for d in (-1, 0, 1)])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 1e-45, 4.0 - 2**-22,
                        3.4028235e38], np.float32)
    x = np.concatenate([x, neighbours.view(np.float32), special])
    x = np.concatenate([x, np.sort(x.view(np.uint32)).view(np.float32)])  # one class a warp
    with np.errstate(all="ignore"):
        want = _bits(np.sqrt(x))
    for perturb in PERTURBATIONS:
        got = run_elementwise(image, x, None, perturb)
        wrong = np.nonzero(got != want)[0]
        assert not len(wrong), (perturb, [(hex(x.view(np.uint32)[k]), hex(got[k]),
                                           hex(want[k])) for k in wrong[:5]])


def _with_exponent(significand_bits: np.ndarray, exponent: np.ndarray, sign) -> np.ndarray:
    return (np.asarray(sign, np.uint32) << 31 | exponent.astype(np.uint32) << 23
            | significand_bits.astype(np.uint32)).view(np.float32)


def _fast_divisions(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Operand pairs inside the fast range, its edges often: random significands, and
    dividends placed near the rounding midpoints of their quotients."""
    def significands():
        bits = rng.integers(0, 1 << 23, n)
        bits[rng.random(n) < 0.1] = 0
        bits[rng.random(n) < 0.05] = (1 << 23) - 1
        return bits

    def pick(low, high):
        value = rng.integers(low, high + 1, n)
        edge = rng.random(n)
        value[edge < 0.15] = low
        value[(edge >= 0.15) & (edge < 0.3)] = high
        return value

    spread = pick(*DIVIDE_FAST_SPREAD)
    eb = np.clip(pick(*DIVIDE_FAST_B), DIVIDE_FAST_A[0] - spread, DIVIDE_FAST_A[1] - spread)
    ea = eb + spread
    b = _with_exponent(significands(), eb, rng.random(n) < 0.5)
    a = _with_exponent(significands(), ea, rng.random(n) < 0.5)
    # Near midpoints: a = b * (a 25-bit odd significand), rounded, so a / b lies within a
    # few 2^-24 of a midpoint of the quotient's grid.
    near = rng.random(n) < 0.4
    midpoint = (rng.integers(1 << 24, 1 << 25, n) | 1) / float(1 << 24)
    with np.errstate(all="ignore"):  # past binary32's range: dropped just below
        tilted = (b.astype(np.float64) * midpoint * np.exp2(spread.astype(np.float64)))
        tilted = tilted.astype(np.float32)
    usable = near & np.isfinite(tilted) & (tilted != 0)
    a = np.where(usable, tilted, a).astype(np.float32)
    a[rng.random(n) < 0.05] = 0.0
    inside = _divide_in_fast_range(a, b)
    return a[inside], b[inside]


def _divide_in_fast_range(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ea = (a.view(np.uint32) >> 23 & 0xFF).astype(np.int64)
    eb = (b.view(np.uint32) >> 23 & 0xFF).astype(np.int64)
    zero = (a.view(np.uint32) & 0x7FFFFFFF) == 0
    in_a = (DIVIDE_FAST_A[0] <= ea) & (ea <= DIVIDE_FAST_A[1])
    spread = ((a.view(np.uint32) & 0x7FFFFFFF).astype(np.int64)
              - (b.view(np.uint32) & 0x7FFFFFFF).astype(np.int64))
    in_spread = ((DIVIDE_FAST_SPREAD[0] << 23 <= spread)
                 & (spread <= DIVIDE_FAST_SPREAD[1] << 23))
    return (zero | (in_a & in_spread)) & (DIVIDE_FAST_B[0] <= eb) & (eb <= DIVIDE_FAST_B[1])


def _whole_warps(*arrays: np.ndarray) -> list[np.ndarray]:
    keep = len(arrays[0]) // 32 * 32
    return [x[:keep] for x in arrays]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("operation", DIVISIONS)
def test_division_in_the_fast_range_is_correctly_rounded_without_the_exact_sequence(
        arch, operation):
    image = elementwise(arch, operation)
    a, b = _whole_warps(*_fast_divisions(np.random.default_rng(21), 1 << 13))
    assert len(a) > 4000
    with np.errstate(all="ignore"):
        want = _bits(a / b)
    # One lane outside the range (a subnormal divisor) in every warp: the exact way.
    b_out = b.copy()
    b_out[::32] = np.float32(1e-40)
    with np.errstate(all="ignore"):
        want_out = _bits(a / b_out)
    for perturb in PERTURBATIONS:
        got, fast_steps = run_elementwise_counted(image, a, b, perturb)
        wrong = np.nonzero(got != want)[0]
        assert not len(wrong), (perturb, [(hex(a.view(np.uint32)[k]), hex(b.view(np.uint32)[k]),
                                           hex(got[k]), hex(want[k])) for k in wrong[:5]])
        got, exact_steps = run_elementwise_counted(image, a, b_out, perturb)
        assert (got == want_out).all(), perturb
        # Every warp skipped the exact sequence (over 60 instructions) in the first run.
        assert exact_steps - fast_steps > 60 * len(a) // 32


@pytest.mark.parametrize("arch", ARCHS)
def test_square_root_in_the_fast_range_is_correctly_rounded_without_the_exact_sequence(arch):
    image = elementwise(arch, "sqrt")
    rng = np.random.default_rng(22)
    n = 1 << 13
    low = SQRT_FAST_LOW >> 23
    exponent = rng.integers(low, 255, n)
    exponent[rng.random(n) < 0.2] = low
    exponent[rng.random(n) < 0.1] = 254
    x = _with_exponent(rng.integers(0, 1 << 23, n), exponent, 0)
    # Squares and their neighbours: roots on and beside representable values.
    roots = (rng.integers(1 << 23, 1 << 24, n // 4) / (1 << 23)).astype(np.float32)
    squares = (roots.astype(np.float64) ** 2 * np.exp2(rng.integers(-50, 60, n // 4) * 2))
    squares = squares.astype(np.float32).view(np.uint32).astype(np.int64)
    neighbours = (squares + rng.integers(-1, 2, n // 4)).astype(np.uint32).view(np.float32)
    x = np.concatenate([x, neighbours, np.zeros(64, np.float32),
                        np.full(32, np.float32(2.0 ** -100))])
    x = x[(x.view(np.uint32) >= SQRT_FAST_LOW) & (x.view(np.uint32) <= 0x7F7FFFFF) | (x == 0)]
    (x,) = _whole_warps(rng.permutation(x))
    with np.errstate(all="ignore"):
        want = _bits(np.sqrt(x))
    x_out = x.copy()
    x_out[::32] = np.float32(-1.0)
    with np.errstate(all="ignore"):
        want_out = _bits(np.sqrt(x_out))
    for perturb in PERTURBATIONS:
        got, fast_steps = run_elementwise_counted(image, x, None, perturb)
        wrong = np.nonzero(got != want)[0]
        assert not len(wrong), (perturb, [(hex(x.view(np.uint32)[k]), hex(got[k]),
                                           hex(want[k])) for k in wrong[:5]])
        got, exact_steps = run_elementwise_counted(image, x_out, None, perturb)
        assert (got == want_out).all(), perturb
        assert exact_steps - fast_steps > 30 * len(x) // 32


def _exact_quotients(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """In-range pairs whose quotient is representable (a = q b exactly), so the fast
    sequence's candidate is the quotient itself: 12-bit q and b, powers of two among
    them, and q = 2^E - ulp/2 (a significand of ones) over powers of two."""
    q = rng.integers(1 << 11, 1 << 12, n).astype(np.float64) / (1 << 11)
    q[rng.random(n) < 0.3] = 1.0
    b = rng.integers(1 << 11, 1 << 12, n).astype(np.float64) / (1 << 11)
    ones = rng.random(n) < 0.3
    q[ones] = 2.0 - 2.0 ** -23
    b[ones] = 1.0
    scale_q = np.exp2(rng.integers(-70, 90, n).astype(np.float64))
    scale_b = np.exp2(rng.integers(-30, 30, n).astype(np.float64))
    a = (q * scale_q * b * scale_b).astype(np.float32)
    b = (b * scale_b).astype(np.float32)
    signs = np.where(rng.random((2, n)) < 0.5, -1, 1).astype(np.float32)
    return a * signs[0], b * signs[1]


@pytest.mark.parametrize("nudge", (-1, 1))
def test_the_fast_division_s_midpoint_test_corrects_a_candidate_one_ulp_off(nudge):
    image = elementwise("sm_90", "divide", nudge=nudge)
    a, b = _exact_quotients(np.random.default_rng(23), 1 << 12)
    assert _divide_in_fast_range(a, b).all()
    # And quotients within a few 2^-24 of a midpoint, the fast range's edges among them,
    # where the neighbours' remainders decide (a zero dividend's candidate, 0, has no
    # neighbour within an ulp: left out).
    near_a, near_b = _fast_divisions(np.random.default_rng(25), 1 << 13)
    keep = near_a != 0
    a, b = np.concatenate([a, near_a[keep]]), np.concatenate([b, near_b[keep]])
    want = _bits(a / b)
    assert (run_elementwise(image, a, b) == want).all()


@pytest.mark.parametrize("nudge", (-1, 1))
def test_the_fast_square_root_s_midpoint_test_corrects_a_candidate_one_ulp_off(nudge):
    image = elementwise("sm_90", "sqrt", nudge=nudge)
    rng = np.random.default_rng(24)
    roots = rng.integers(1 << 11, 1 << 12, 4096).astype(np.float64) / (1 << 11)
    roots[rng.random(4096) < 0.3] = 1.0
    roots *= np.exp2(rng.integers(-45, 60, 4096).astype(np.float64))
    x = (roots * roots).astype(np.float32)
    # Just below a power of four: the root rounds down to 2^E - ulp/2, a quarter of the
    # ulp above lies the midpoint (the threshold below a power of two).
    below = (np.exp2(2.0 * rng.integers(-45, 60, 256)) * (1 - 2.0 ** -24)).astype(np.float32)
    # Squares of 25-bit midpoints, rounded, and their neighbours: roots within a few
    # 2^-25 of a midpoint, where the neighbours' residuals decide.
    middle = (rng.integers(1 << 24, 1 << 25, 2048) | 1).astype(np.float64) / (1 << 24)
    near = (middle ** 2 * np.exp2(2.0 * rng.integers(-49, 63, 2048))).astype(np.float32)
    near = (near.view(np.uint32).astype(np.int64)[:, None] + np.arange(-1, 2)).ravel()
    x = np.concatenate([x, below, near.astype(np.uint32).view(np.float32)])
    want = _bits(np.sqrt(x))
    assert (run_elementwise(image, x, None) == want).all()
