"""Exact binary32 rounding of rational numbers, for proving constants."""

from __future__ import annotations

import struct
from fractions import Fraction

_MANTISSA_BITS = 23
_MIN_EXPONENT = -126  # of the smallest normal number


def f32_bits_from_fraction(value: Fraction) -> int:
    """The binary32 bit pattern nearest `value` (ties to even), computed exactly."""
    if value == 0:
        return 0
    sign = 0
    if value < 0:
        sign, value = 1 << 31, -value
    exponent = value.numerator.bit_length() - value.denominator.bit_length()
    if Fraction(2) ** exponent > value:
        exponent -= 1
    exponent = max(exponent, _MIN_EXPONENT)  # subnormals share the smallest exponent
    scaled = value / Fraction(2) ** (exponent - _MANTISSA_BITS)
    integer = scaled.numerator // scaled.denominator
    remainder = scaled - integer
    if remainder > Fraction(1, 2) or (remainder == Fraction(1, 2) and integer % 2):
        integer += 1
    if integer == 1 << (_MANTISSA_BITS + 1):  # rounding carried into the next binade
        integer >>= 1
        exponent += 1
    if exponent > 127:
        return sign | 0x7F800000
    if integer < 1 << _MANTISSA_BITS:  # subnormal
        return sign | integer
    biased = exponent + 127
    return sign | (biased << _MANTISSA_BITS) | (integer - (1 << _MANTISSA_BITS))


def f32_from_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def fraction_of_f32_bits(bits: int) -> Fraction:
    return Fraction(f32_from_bits(bits))
