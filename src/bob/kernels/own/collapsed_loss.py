"""The collapsed tables' loss kernels in Bob's own machine code (docs/ARITHMETIC.md,
"Collapsed tables"; ``cuda/bob_collapsed.cuh``; ``bob.kernels.collapsed.reference``).

A block runs one row at a time (the rows of its COLLAPSED_ROWS_PER_BLOCK in turn); thread
t is tree lane t. Every row sum replays lane t's chain l, l + 256, ... < V: runs of the
rest's term between the lane's exceptions (``lane_order`` lists them contiguously, in
the order the chain meets them), each run summed exactly by ``add_run``, then the tree.
The row max is exact over the classes, with the literal order's zero where zeros of
both signs are the maximum.

Lanes loop different numbers of times here (their runs and exceptions differ), while
every branch stays uniform over the block: a loop goes round while any lane still has
work (``Vote``: a flag in shared memory, one barrier a round) and each lane's work is
predicated on its own condition.
"""

from __future__ import annotations

from collections.abc import Callable

from bob.isa.model import RZ, Imm
from bob.kernels.own.asm import (
    LANES,
    ONE,
    POS_INF,
    PTP,
    RZR,
    SIGN,
    Asm,
    Scratch,
    p,
    r,
)

FLAGS = 4 * LANES  # the votes' three words, after the trees' buffer
SHARED_BYTES = FLAGS + 16
MANTISSA = 0x007FFFFF
IMPLICIT = 0x00800000
TWO_POW_24_INT = 0x01000000
MAGIC = 0x4B000000  # 2^23: its bits or an integer below 2^23 are that integer plus 2^23
LARGEST_COUNT = 0x4B7FFFFF  # 2^24 - 1 as binary32
MODERATE_BITS = 0x7E000000  # 2^125
ADD_RUN_SCRATCH = 20


class Vote:
    """Block-wide votes through three words of shared memory, used in turn: vote k sets
    word k % 3 where a lane's predicate holds, every lane reads it after a barrier, and
    lane 0 clears word (k + 2) % 3, which every lane read before that barrier and none
    sets again before the next one. The word in turn is a register (`phase`, its byte
    offset), so votes may sit in loops."""

    def __init__(self, s: Asm, tid: int, phase: int, value: int, place: int):
        self.s, self.tid, self.phase, self.value, self.place = s, tid, phase, value, place

    def start(self) -> None:
        """Clear the words (shared memory starts undefined) and start the turn at word 0.
        Clobbers P0."""
        s = self.s
        s.mov(self.phase, 0)
        s.isetp(0, "EQ", r(self.tid), 0)
        for word in range(3):
            s.sts(RZ, FLAGS + 4 * word, RZ, guard=p(0))
        s.barrier()

    def any(self, dst: int, pred: int, inverted: bool = False) -> None:
        """P`dst` := whether P`pred` (or its negation) holds in some lane of the block.
        Clobbers P`dst` only (dst may be pred)."""
        s = self.s
        s.mov(self.value, 1)
        s.sts(self.phase, FLAGS, self.value, guard=p(pred, inverted))
        s.barrier()
        s.lds(self.value, self.phase, FLAGS)
        s.add(self.place, r(self.phase), 8)  # the word of two votes before: (k + 2) % 3
        s.isetp(dst, "GE", r(self.place), 12)
        s.add(self.place, r(self.place), -12, guard=p(dst))
        s.isetp(dst, "EQ", r(self.tid), 0)
        s.sts(self.place, FLAGS, RZ, guard=p(dst))
        s.add(self.phase, r(self.phase), 4)
        s.isetp(dst, "EQ", r(self.phase), 12)
        s.mov(self.phase, 0, guard=p(dst))
        s.isetp(dst, "NE", r(self.value), 0)


def while_any(s: Asm, vote: Vote, condition: Callable[[int], None],
              body: Callable[[], None]) -> None:
    """Go round while `condition(pred)` (which sets P`pred` per lane) holds in some lane:
    a uniform loop. The body predicates each lane's work on its own condition."""
    top, end = s.fresh("while"), s.fresh("wend")
    s.b.label(top)
    condition(6)
    vote.any(6, 6)
    s.b.bra(end, guard=p(6, True))
    body()
    s.b.bra(top)
    s.b.label(end)


def _to_float(s: Asm, d: int, v: int, t: int) -> None:
    """d := v as binary32, exact for v < 2^24 (two halves below 2^23 by the 2^23 magic).
    Clobbers t."""
    s.shr(t, r(v), 1)
    s.logic(t, r(t), MAGIC, RZR, 0xFC)
    s.fadd(d, r(t), MAGIC | SIGN)  # v >> 1
    s.fadd(d, r(d), r(d))
    s.logic(t, r(v), 1, RZR, 0xC0)
    s.logic(t, r(t), MAGIC, RZR, 0xFC)
    s.fadd(t, r(t), MAGIC | SIGN)  # v & 1
    s.fadd(d, r(d), r(t))


def add_run(s: Asm, vote: Vote, acc: int, x: int, n: int, t: Scratch) -> None:
    """acc := acc plus n additions of x, each rounded to binary32, in every lane (n its
    own per lane; n is consumed): ``bob.kernels.collapsed.runs.add_run``'s steps. Inside a
    binade m equal additions are one multiplication; the addition that leaves it, a tie
    from an odd multiple, and every addition of a zero, an infinity, a NaN or a negative
    value are done one at a time. Clobbers the scratch registers and P0..P6.

    A step of m additions may be cut shorter than the binade allows (m is estimated from
    a reciprocal and corrected down to a count the binade holds, at least 1): the result
    does not change, as the next step goes on from the exact sum."""
    e, xe, whole, x_whole, scale, shift = (t(i) for i in range(6))
    floor, mask, half, step, flag, num = (t(i) for i in range(6, 12))
    fa, fb, q, one, prod = t(12), t(13), t(14), t(15), t(16)  # prod: t(16), t(17)
    work = t(18)
    if prod % 2:
        raise ValueError("add_run's scratch must start at an even register")

    def body() -> None:
        s.isetp(0, "NE", r(n), 0)
        # P1: the shortcut applies (0 < x < acc < inf); P2: one addition, as binary32.
        s.fsetp(1, "GT", r(x), 0, other=p(0))
        s.fsetp(1, "LT", r(x), r(acc), other=p(1))
        s.fsetp(1, "LT", r(acc), POS_INF, other=p(1))
        s.isetp(2, "NE", r(n), 0, other=p(1, True))
        s.fadd(acc, r(acc), r(x), guard=p(2))
        s.add(n, r(n), -1, guard=p(2))
        # A zero x, or an infinite or NaN acc or x: fixed from here on (no shortcut lane
        # is: it never changed acc above, and its acc and x are finite, x > 0).
        s.logic(work, r(x), 0x7FFFFFFF, RZR, 0xC0)
        s.isetp(3, "GE", r(work), POS_INF)
        s.logic(work, r(acc), 0x7FFFFFFF, RZR, 0xC0)
        s.isetp(3, "GE", r(work), POS_INF, combine="OR", other=p(3))
        s.fsetp(3, "EQ", r(x), 0, combine="OR", other=p(3))
        s.mov(n, 0, guard=p(3))
        # The binade's constants (acc and x positive: no sign bits).
        s.shr(e, r(acc), 23)
        s.shr(xe, r(x), 23)
        s.logic(whole, r(acc), MANTISSA, RZR, 0xC0)
        s.logic(x_whole, r(x), MANTISSA, RZR, 0xC0)
        s.isetp(4, "NE", r(e), 0)
        s.op("LOP3.LUT.RRIR", r(whole), r(whole), _imm(IMPLICIT), RZR, _imm(0xFC), PTP,
             guard=p(4))
        s.sel(scale, r(e), 1, p(4))
        s.isetp(5, "NE", r(xe), 0)
        s.op("LOP3.LUT.RRIR", r(x_whole), r(x_whole), _imm(IMPLICIT), RZR, _imm(0xFC), PTP,
             guard=p(5))
        s.sel(xe, r(xe), 1, p(5))
        s.op("IADD3.RRRR", r(shift), r(scale), r(xe, neg=True), RZR)
        # x below half a spacing: acc never moves again.
        s.isetp(4, "GT", r(shift), 25, other=p(1))
        s.mov(n, 0, guard=p(4))
        s.isetp(1, "LE", r(shift), 25, other=p(1))
        s.isetp(4, "GT", r(shift), 25)
        s.sel(shift, r(shift), 26, p(4, True))  # any other lane's shift, kept in range
        s.shr(floor, r(x_whole), r(shift))
        s.mov(one, 1)
        s.shl(mask, r(one), r(shift))
        s.shr(half, r(mask), 1)  # 2^(shift - 1), 0 for shift 0
        s.add(mask, r(mask), -1)
        s.logic(mask, r(x_whole), r(mask), RZR, 0xC0)  # the remainder
        s.isetp(5, "NE", r(shift), 0)
        s.isetp(5, "EQ", r(mask), r(half), other=p(5))  # a tie
        s.isetp(4, "GT", r(mask), r(half))
        s.sel(step, r(one), 0, p(4))
        s.op("LOP3.LUT.RRIR", r(step), r(floor), _imm(1), RZR, _imm(0xC0), PTP, guard=p(5))
        s.add(step, r(step), r(floor))
        # One addition as binary32: a tie from an odd multiple, or the binade's last.
        s.logic(work, r(whole), 1, RZR, 0xC0)
        s.isetp(3, "NE", r(work), 0, other=p(5))
        s.add(work, r(whole), r(floor))
        s.isetp(3, "GE", r(work), TWO_POW_24_INT, combine="OR", other=p(3))
        s.sel(flag, r(one), 0, p(3))
        s.isetp(3, "NE", r(flag), 0, other=p(1))
        s.fadd(acc, r(acc), r(x), guard=p(3))
        s.add(n, r(n), -1, guard=p(3))
        # A zero step: acc never moves again.
        s.isetp(5, "EQ", r(step), 0, other=p(1))
        s.isetp(5, "EQ", r(flag), 0, other=p(5))
        s.mov(n, 0, guard=p(5))
        # P4: m = min(n, q + 1) additions at once, q <= (2^24 - 1 - floor - whole) / step.
        s.isetp(4, "NE", r(step), 0, other=p(1))
        s.isetp(4, "EQ", r(flag), 0, other=p(4))
        s.add(num, r(floor), r(whole))
        s.op("IADD3.RRIR", r(num), r(num, neg=True), _imm(TWO_POW_24_INT - 1), RZR)
        _to_float(s, fa, num, work)
        _to_float(s, fb, step, work)
        s.op("MUFU.R", r(fb), r(fb), mods="RCP")
        s.fmul(fa, r(fa), r(fb))
        s.fsetp(5, "GT", r(fa), LARGEST_COUNT)
        s.fsel(fa, r(fa), LARGEST_COUNT, p(5, True))
        # q = floor(fa): the significand shifted by 150 - its biased exponent; 0 below 1.
        s.shr(work, r(fa), 23)
        s.op("IADD3.RRIR", r(work), r(work, neg=True), _imm(150), RZR)
        s.isetp(5, "LT", r(fa), ONE)
        s.mov(work, 0, guard=p(5))
        s.logic(q, r(fa), MANTISSA, RZR, 0xC0)
        s.logic(q, r(q), IMPLICIT, RZR, 0xFC)
        s.shr(q, r(q), r(work))
        s.mov(q, 0, guard=p(5))
        for _ in range(2):  # down to q * step <= num: the estimate may be a little high
            _too_many(s, q, step, num, prod, 5)
            s.add(q, r(q), -1, guard=p(5))
        _too_many(s, q, step, num, prod, 5)
        s.mov(q, 0, guard=p(5))  # never reached with a sound reciprocal; 1 is always sound
        s.add(q, r(q), 1)
        s.isetp(5, "GT", r(q), r(n))
        s.sel(q, r(n), r(q), p(5))
        s.op("IADD3.RRRR", r(n), r(n), r(q, neg=True), RZR, guard=p(4))
        s.mad(work, r(q), r(step), r(whole))
        s.add(work, r(work), -IMPLICIT)
        s.lea(work, r(scale), r(work), 23)
        s.mov(acc, r(work), guard=p(4))

    while_any(s, vote, lambda pred: s.isetp(pred, "NE", r(n), 0), body)


def _too_many(s: Asm, q: int, step: int, num: int, prod: int, pred: int) -> None:
    """P`pred` := q * step > num (the product in 64 bits)."""
    s.wide(prod, r(q), r(step), RZ)
    s.isetp(pred, "GT", r(prod), r(num))
    s.isetp(pred, "NE", r(prod + 1), 0, combine="OR", other=p(pred))


def _imm(value: int) -> Imm:
    return Imm(value & 0xFFFFFFFF)
