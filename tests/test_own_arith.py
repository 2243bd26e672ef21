"""Bob's own division and square root (bob.kernels.own), run on the emulator over edge
classes of operands, with MUFU's results exact and perturbed by 1 and 2 ulps: every
result must be the IEEE correctly rounded one (NumPy's), NaN as the canonical pattern."""

from __future__ import annotations

import numpy as np
import pytest

from bob.isa import table
from bob.isa.check import check
from own_support import elementwise, run_elementwise

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


@pytest.mark.parametrize("arch", ARCHS)
def test_division_is_correctly_rounded_for_every_operand_class(arch):
    image = elementwise(arch, "divide")
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
    with np.errstate(all="ignore"):
        want = _bits(a / b)
    for perturb in PERTURBATIONS:
        got = run_elementwise(image, a, b, perturb)
        wrong = np.nonzero(got != want)[0]
        assert not len(wrong), (perturb, [(hex(a.view(np.uint32)[k]), hex(b.view(np.uint32)[k]),
                                           hex(got[k]), hex(want[k])) for k in wrong[:5]])


def test_division_rounds_subnormal_quotients_once():
    a, b, exponent = _near_subnormal_midpoints(np.random.default_rng(12), 1 << 13)
    with np.errstate(all="ignore"):
        want = _bits(a / b)
        # The class is real: the 24-bit quotient scaled with one more rounding differs.
        q = (a.astype(np.float64) * np.exp2(-exponent.astype(np.float64)) / b).astype(
            np.float32)  # the quotient's 24 bits, scaled into the normal range exactly
        double_rounded = _bits((q.astype(np.float64) * np.exp2(exponent)).astype(np.float32))
    assert (double_rounded != want).sum() > 100
    image = elementwise("sm_90", "divide")
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
    with np.errstate(all="ignore"):
        want = _bits(np.sqrt(x))
    for perturb in PERTURBATIONS:
        got = run_elementwise(image, x, None, perturb)
        wrong = np.nonzero(got != want)[0]
        assert not len(wrong), (perturb, [(hex(x.view(np.uint32)[k]), hex(got[k]),
                                           hex(want[k])) for k in wrong[:5]])
