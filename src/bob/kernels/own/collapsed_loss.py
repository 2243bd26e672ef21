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

from bob.isa.builder import Image
from bob.isa.model import RZ, CBuf, Imm
from bob.kernels import signatures as sig
from bob.kernels.own.asm import (
    DIVIDE_SCRATCH,
    LANES,
    NAN_BITS,
    NEG_INF,
    ONE,
    POS_INF,
    PTP,
    RZR,
    SIGN,
    TREE_SCRATCH,
    Asm,
    Scratch,
    divide,
    exp2,
    log2,
    p,
    r,
    select_max,
    tree,
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


# -- the kernels ---------------------------------------------------------------------------

# Registers: R0 tid, R1 ctaid, R2 tid * 4, R3 the vocabulary (seed's); the votes'; the
# row's index; each lane's chain; the row's values; pointers (pairs); routines' scratch.
TID, CTAID, WORD, VOCAB = 0, 1, 2, 3
PHASE, VOTED, PLACE = 4, 5, 6
ROW, FIRST, LAST, COUNT, ROW_K = 7, 8, 9, 10, 11
BEGIN, END, LENGTH, LANE = 12, 13, 14, 15
M, REST_W, REST_TERM, SUM, BIG_L, TOTAL = 16, 17, 18, 19, 20, 21
ACC, X, N, K, NEXT, I, POS, V, TMP, TMP2 = 22, 23, 24, 25, 26, 27, 28, 29, 30, 31  # noqa: E741 - I the exception
W_PTR, ORDER_PTR, COLUMNS_PTR, OFFSETS_PTR, DATA_PTR, G_PTR, LOSS_PTR = 32, 34, 36, 38, 40, 42, 44
ADDRESS = 46
HELD, LOW, HIGH, MIDDLE, NEGATIVE, POSITIVE, COLUMN, Z_REST, TARGET, FLAG = range(48, 58)
REST_E, WEIGHT_SUM = 58, 59
RUN_SCRATCH = Scratch(60, ADD_RUN_SCRATCH)
ROUTINE = 80  # exp2, log2, divide, tree: from here
NO_COLUMN = 0xFFFFFFFF


class Row:
    """The code that runs a row of a collapsed table: its index, each lane's chain, the
    class max and the chain sums (cuda/bob_collapsed.cuh's Row, ChainRanges, class_max,
    class_sum)."""

    def __init__(self, s: Asm, vote: Vote):
        self.s, self.vote = s, vote

    def load(self, register: int, pointer: int, index: int, guard: int | None = None,
             offset: int = 0) -> None:
        """register := pointer[index + offset] (32-bit elements)."""
        s = self.s
        s.wide(ADDRESS, r(index), 4, pointer)
        s.ldg(register, ADDRESS, guard=p(guard) if guard is not None else PTP, offset=offset)

    def class_address(self, index: int) -> None:
        """ADDRESS := the parameters' exception `index` (class V + index)."""
        s = self.s
        s.add(TMP2, r(VOCAB), r(index))
        s.wide(ADDRESS, r(TMP2), 4, W_PTR)

    def start(self) -> None:
        """The row's exceptions [FIRST, LAST), COUNT, its rest REST_W (every lane)."""
        s = self.s
        self.load(FIRST, OFFSETS_PTR, ROW)
        self.load(LAST, OFFSETS_PTR, ROW, offset=4)
        s.op("IADD3.RRRR", r(COUNT), r(LAST), r(FIRST, neg=True), RZR)
        self.load(REST_W, W_PTR, ROW)

    def each_exception(self, body: Callable[[int], None]) -> None:
        """body(pred) for exception I = FIRST + tid, FIRST + tid + 256, ... < LAST, P`pred`
        where the lane has one (a uniform loop over the block). body may clobber P0..P5."""
        s = self.s
        top, end = s.fresh("each"), s.fresh("each_done")
        s.mov(K, 0)
        s.b.label(top)
        s.isetp(6, "GE", r(K), r(COUNT))
        s.b.bra(end, guard=p(6))
        s.add(I, r(K), r(TID))
        s.isetp(5, "LT", r(I), r(COUNT))
        s.add(I, r(I), r(FIRST))
        body(5)
        s.add(K, r(K), LANES)
        s.b.bra(top)
        s.b.label(end)

    def lane_begin(self, dest: int, lane: int) -> None:
        """dest := the first k in [FIRST, LAST) whose exception's lane (column % 256) is at
        least `lane`'s value: a binary search over lane_order."""
        s = self.s
        s.mov(LOW, r(FIRST))
        s.mov(HIGH, r(LAST))

        def body() -> None:
            s.isetp(0, "LT", r(LOW), r(HIGH))
            s.op("IADD3.RRRR", r(MIDDLE), r(HIGH), r(LOW, neg=True), RZR)
            s.shr(MIDDLE, r(MIDDLE), 1)
            s.add(MIDDLE, r(MIDDLE), r(LOW))
            self.load(TMP, ORDER_PTR, MIDDLE, guard=0)
            self.load(TMP, COLUMNS_PTR, TMP, guard=0)
            s.logic(TMP, r(TMP), LANES - 1, RZR, 0xC0)
            s.isetp(1, "LT", r(TMP), r(lane), other=p(0))
            s.isetp(2, "GE", r(TMP), r(lane), other=p(0))
            s.add(LOW, r(MIDDLE), 1, guard=p(1))
            s.mov(HIGH, r(MIDDLE), guard=p(2))

        while_any(s, self.vote, lambda pred: s.isetp(pred, "LT", r(LOW), r(HIGH)), body)
        s.mov(dest, r(LOW))

    def chains(self) -> None:
        """Each lane's exceptions [BEGIN, END) in lane_order and its chain's LENGTH."""
        s = self.s
        self.lane_begin(BEGIN, TID)
        s.add(LANE, r(TID), 1)
        self.lane_begin(END, LANE)
        s.op("IADD3.RRRR", r(LENGTH), r(VOCAB), r(TID, neg=True), RZR)
        s.add(LENGTH, r(LENGTH), LANES - 1)
        s.shr(LENGTH, r(LENGTH), 8)
        s.isetp(0, "LT", r(TID), r(VOCAB))
        s.sel(LENGTH, r(LENGTH), 0, p(0))

    def rest_present(self, pred: int) -> None:
        """P`pred` := the rest class stands for some column (fewer exceptions than V)."""
        self.s.isetp(pred, "LT", r(COUNT), r(VOCAB))

    def class_max(self) -> None:
        """M := the expanded row's max in the order of section 6, exact over the classes:
        NaN never taken, -inf for no candidate; a zero maximum with zeros of both signs
        takes the literal order's (each lane's first zero, then the select tree)."""
        s = self.s
        s.mov(HELD, NEG_INF)
        self.rest_present(0)
        s.isetp(0, "EQ", r(TID), 0, other=p(0))
        s.mov(X, NEG_INF)
        s.mov(X, r(REST_W), guard=p(0))
        select_max(s, HELD, X, 1)

        def largest(pred: int) -> None:
            s.mov(X, NEG_INF)
            self.class_address(I)
            s.ldg(X, ADDRESS, guard=p(pred))
            select_max(s, HELD, X, 1)

        self.each_exception(largest)
        tree(s, M, HELD, WORD, "max", Scratch(ROUTINE, TREE_SCRATCH))
        done = s.fresh("max_done")
        s.fsetp(0, "NE", r(M), RZR)
        s.b.bra(done, guard=p(0))
        # A zero maximum: the signs of the row's zeros.
        s.mov(NEGATIVE, 0)
        s.mov(POSITIVE, 0)

        def signs(pred: int) -> None:
            s.fsetp(1, "EQ", r(X), RZR, other=p(pred))
            s.isetp(2, "LT", r(X), 0, signed=True, other=p(1))  # the sign bit
            s.isetp(3, "GE", r(X), 0, signed=True, other=p(1))
            s.mov(NEGATIVE, 1, guard=p(2))
            s.mov(POSITIVE, 1, guard=p(3))

        self.rest_present(0)
        s.isetp(0, "EQ", r(TID), 0, other=p(0))
        s.mov(X, r(REST_W))
        signs(0)

        def exception_signs(pred: int) -> None:
            s.mov(X, 0x3F800000)  # no zero
            self.class_address(I)
            s.ldg(X, ADDRESS, guard=p(pred))
            signs(pred)

        self.each_exception(exception_signs)
        s.isetp(0, "NE", r(NEGATIVE), 0)
        self.vote.any(0, 0)
        s.sel(NEGATIVE, RZR, 1, p(0, True))  # 1 where some lane has one
        s.isetp(0, "NE", r(POSITIVE), 0)
        self.vote.any(0, 0)
        s.sel(POSITIVE, RZR, 1, p(0, True))
        mixed = s.fresh("mixed_zeros")
        s.isetp(0, "NE", r(NEGATIVE), 0)
        s.isetp(0, "NE", r(POSITIVE), 0, other=p(0))
        s.b.bra(mixed, guard=p(0))
        s.isetp(0, "NE", r(NEGATIVE), 0)
        s.mov(M, 0)
        s.mov(M, SIGN, guard=p(0))
        s.b.bra(done)
        s.b.label(mixed)
        self.literal_zero()
        s.b.label(done)

    def literal_zero(self) -> None:
        """M := the literal order's zero: each lane's first zero on its chain (its first
        exception zero, or the rest's where it is a zero at an earlier column), then the
        select tree over the lanes."""
        s = self.s
        s.mov(COLUMN, NO_COLUMN)
        s.mov(HELD, NEG_INF)
        s.mov(K, r(BEGIN))

        def searching(pred: int) -> None:
            s.isetp(pred, "LT", r(K), r(END))
            s.isetp(pred, "EQ", r(COLUMN), NO_COLUMN, other=p(pred))

        def first_zero() -> None:
            searching(0)
            self.load(I, ORDER_PTR, K, guard=0)
            s.mov(X, 0x3F800000)
            self.class_address(I)
            s.ldg(X, ADDRESS, guard=p(0))
            s.fsetp(1, "EQ", r(X), RZR, other=p(0))
            self.load(COLUMN, COLUMNS_PTR, I, guard=1)
            s.mov(HELD, r(X), guard=p(1))
            s.add(K, r(K), 1, guard=p(0))

        while_any(s, self.vote, searching, first_zero)
        # The rest's first column on the chain: the position past the chain's leading run
        # of exceptions (the rest a zero standing for some column, else none is taken).
        s.mov(K, r(BEGIN))
        s.mov(POS, 0)

        def leading(pred: int) -> None:
            s.isetp(pred, "LT", r(K), r(END))
            self.load(TMP, ORDER_PTR, K, guard=pred)
            self.load(TMP, COLUMNS_PTR, TMP, guard=pred)
            s.shr(TMP, r(TMP), 8)
            s.isetp(pred, "EQ", r(TMP), r(POS), other=p(pred))

        def step() -> None:
            leading(0)
            s.add(POS, r(POS), 1, guard=p(0))
            s.add(K, r(K), 1, guard=p(0))

        while_any(s, self.vote, leading, step)
        s.lea(TMP, r(POS), r(TID), 8)  # the rest's column
        s.isetp(0, "LT", r(TMP), r(COLUMN))
        s.isetp(0, "LT", r(POS), r(LENGTH), other=p(0))
        self.rest_present(1)
        s.fsetp(1, "EQ", r(REST_W), RZR, other=p(1))
        s.mov(HELD, r(REST_W), guard=_and(s, 0, 1))
        tree(s, M, HELD, WORD, "max", Scratch(ROUTINE, TREE_SCRATCH))

    def class_sum(self, dest: int, rest: int, value: Callable[[int, int], None]) -> None:
        """dest := the expanded row's sum in the order of section 6, `rest` at every
        column that is no exception and value(V, pred) (from exception I, loads under
        P`pred`; it may clobber P0..P5 and the routine scratch) at exception I's: each
        lane's chain as runs of `rest` between its exceptions, then the tree."""
        s = self.s
        s.mov(ACC, 0)
        s.mov(NEXT, 0)
        s.mov(K, r(BEGIN))

        def body() -> None:
            s.isetp(0, "LT", r(K), r(END))
            self.load(I, ORDER_PTR, K, guard=0)
            self.load(POS, COLUMNS_PTR, I, guard=0)
            s.shr(POS, r(POS), 8)
            s.op("IADD3.RRRR", r(N), r(POS), r(NEXT, neg=True), RZR)
            s.mov(N, 0, guard=p(0, True))
            add_run(s, self.vote, ACC, rest, N, RUN_SCRATCH)
            s.isetp(0, "LT", r(K), r(END))
            value(V, 0)
            s.isetp(0, "LT", r(K), r(END))
            s.fadd(ACC, r(ACC), r(V), guard=p(0))
            s.add(NEXT, r(POS), 1, guard=p(0))
            s.add(K, r(K), 1, guard=p(0))

        while_any(s, self.vote, lambda pred: s.isetp(pred, "LT", r(K), r(END)), body)
        s.op("IADD3.RRRR", r(N), r(LENGTH), r(NEXT, neg=True), RZR)
        add_run(s, self.vote, ACC, rest, N, RUN_SCRATCH)
        tree(s, dest, ACC, WORD, "sum", Scratch(ROUTINE, TREE_SCRATCH))


def _and(s: Asm, a: int, b: int) -> object:
    """P`a` := P`a` and P`b` (through a register); returns P`a`."""
    s.sel(TMP, RZR, 1, p(b, True))  # 1 where P`b`
    s.isetp(a, "NE", r(TMP), 0, other=p(a))
    return p(a)


def _kernel_start(s: Asm, pointers: tuple[tuple[int, str], ...]) -> Vote:
    """Prologue, the votes' words cleared, the pointers; ROW_K := 0."""
    s.prologue(TID, CTAID, scratch=VOCAB)
    s.shl(WORD, r(TID), 2)
    s.op("LDC", r(VOCAB), CBuf(0, s.slots["vocab"], index=RZ))
    for name in ("exceptions", "classes", "offsets"):  # sizes the bounds never need: read
        s.op("LDC", r(TMP), CBuf(0, s.slots[name], index=RZ))  # as the signature declares
    vote = Vote(s, TID, PHASE, VOTED, PLACE)
    vote.start()
    for register, name in ((W_PTR, "parameters"), (ORDER_PTR, "lane_order"),
                           (COLUMNS_PTR, "columns"), (OFFSETS_PTR, "row_offsets"), *pointers):
        s.pointer(register, name)
    s.mov(ROW_K, 0)
    return vote


def _each_row(s: Asm, run_row: Callable[[str], None]) -> None:
    """run_row(next_label) for rows ctaid * 8 + k, k < 8, below V, one after another (the
    block's rows of the plan's grid: COLLAPSED_ROWS_PER_BLOCK)."""
    top, next_row = s.fresh("row"), s.fresh("next_row")
    s.b.label(top)
    s.lea(ROW, r(CTAID), r(ROW_K), 3)
    s.isetp(0, "GE", r(ROW), r(VOCAB))
    s.isetp(0, "GE", r(ROW_K), sig.COLLAPSED_ROWS_PER_BLOCK, combine="OR", other=p(0))
    s.exit(guard=p(0))
    run_row(next_row)
    s.b.label(next_row)
    s.add(ROW_K, r(ROW_K), 1)
    s.b.bra(top)


def _exponent(s: Asm, d: int, w: int) -> None:
    """d := (w - M) * log2e."""
    s.fadd(d, r(w), r(M, neg=True))
    s.fmul(d, r(d), s.param("log2e"))


def _row_sums(s: Asm, row: Row) -> None:
    """After row.chains(): M, SUM := the row's sum of exponentials, Z_REST := the rest's
    exponent, REST_E its exponential."""
    row.class_max()
    _exponent(s, Z_REST, REST_W)
    exp2(s, REST_E, Z_REST, Scratch(ROUTINE, 5))

    def exponential(d: int, pred: int) -> None:
        s.mov(X, 0)
        row.class_address(I)
        s.ldg(X, ADDRESS, guard=p(pred))
        _exponent(s, TMP, X)
        exp2(s, d, TMP, Scratch(ROUTINE, 5))

    row.class_sum(SUM, REST_E, exponential)


def _store_lane0(s: Asm, pointer: int, index: int, value: int) -> None:
    s.isetp(0, "EQ", r(TID), 0)
    s.wide(ADDRESS, r(index), 4, pointer)
    s.stg(ADDRESS, value, guard=p(0))


def _corpus_loss(s: Asm, row: Row) -> None:
    """Lane 0 stores loss[ROW] = ln2 * the sum of (L - z) T over the expanded row (the
    rest's weight 0), L = log2(SUM)."""
    log2(s, BIG_L, SUM, Scratch(ROUTINE, 32))
    s.fadd(REST_TERM, r(BIG_L), r(Z_REST, neg=True))
    s.fmul(REST_TERM, r(REST_TERM), 0)

    def term(d: int, pred: int) -> None:
        s.mov(X, 0)
        s.mov(TMP, 0)
        row.class_address(I)
        s.ldg(X, ADDRESS, guard=p(pred))
        row.load(TMP, DATA_PTR, I, guard=pred)
        _exponent(s, d, X)
        s.fadd(d, r(BIG_L), r(d, neg=True))
        s.fmul(d, r(d), r(TMP))

    row.class_sum(TOTAL, REST_TERM, term)
    s.fmul(TOTAL, r(TOTAL), s.param("ln2"))
    s.canonical(TOTAL, 0)
    _store_lane0(s, LOSS_PTR, ROW, TOTAL)


def _weightless(s: Asm, row: Row, skip: str, gradients: bool, loss: bool = True) -> None:
    """The weightless-row shortcut (bob_collapsed.cuh's corpus_row): where every exception's
    weight is a zero, the rest stands for some column and every class's |w| <= 2^125, the
    loss (where `loss`) and every gradient (where `gradients`) is +0: stored, then on to
    `skip`."""
    s.mov(FLAG, 0)
    s.mov(TMP, r(REST_W))
    s.logic(TMP, r(TMP), 0x7FFFFFFF, RZR, 0xC0)
    s.isetp(0, "GT", r(TMP), MODERATE_BITS)
    s.isetp(0, "EQ", r(TID), 0, other=p(0))
    s.mov(FLAG, 1, guard=p(0))

    def check(pred: int) -> None:
        s.mov(X, 0)
        s.mov(TMP, 0)
        row.class_address(I)
        s.ldg(X, ADDRESS, guard=p(pred))
        row.load(TMP, DATA_PTR, I, guard=pred)
        s.fsetp(0, "NE", r(TMP), RZR)  # a weight (NaN included)
        s.logic(X, r(X), 0x7FFFFFFF, RZR, 0xC0)
        s.isetp(0, "GT", r(X), MODERATE_BITS, combine="OR", other=p(0))
        s.mov(FLAG, 1, guard=p(0))

    row.each_exception(check)
    s.isetp(0, "NE", r(FLAG), 0)
    row.vote.any(0, 0)
    row.rest_present(1)
    keep = s.fresh("weighted")
    s.b.bra(keep, guard=p(0))
    s.b.bra(keep, guard=p(1, True))
    s.mov(TOTAL, 0)
    if loss:
        _store_lane0(s, LOSS_PTR, ROW, TOTAL)
    if gradients:
        _store_lane0(s, G_PTR, ROW, TOTAL)

        def clear(pred: int) -> None:
            s.add(TMP2, r(VOCAB), r(I))
            s.wide(ADDRESS, r(TMP2), 4, G_PTR)
            s.stg(ADDRESS, TOTAL, guard=p(pred))

        row.each_exception(clear)
    s.b.bra(skip)
    s.b.label(keep)


def loss_corpus(arch: str) -> Image:
    """The corpus loss alone of every row of a collapsed table (bob_collapsed_loss_corpus):
    loss[r] = ln2 sum (L - z) T over the expanded row, the weights T the exceptions'."""
    s = Asm(arch, sig.SIGNATURES[sig.COLLAPSED_LOSS_ONLY])
    vote = _kernel_start(s, ((DATA_PTR, "weights"), (LOSS_PTR, "loss")))
    row = Row(s, vote)

    def run_row(next_row: str) -> None:
        row.start()
        _weightless(s, row, next_row, gradients=False)
        row.chains()
        _row_sums(s, row)
        _corpus_loss(s, row)

    _each_row(s, run_row)
    return s.image("bob_collapsed_loss_corpus", shared_bytes=SHARED_BYTES)


def _divide(s: Asm, d: int, a: int, b: int) -> None:
    divide(s, d, a, b, Scratch(ROUTINE, DIVIDE_SCRATCH))


def _exception_exponential(s: Asm, row: Row, d: int, pred: int) -> None:
    """d := exp2((w[V + I] - M) log2e), w loaded under P`pred`."""
    s.mov(X, 0)
    row.class_address(I)
    s.ldg(X, ADDRESS, guard=p(pred))
    _exponent(s, TMP, X)
    exp2(s, d, TMP, Scratch(ROUTINE, 5))


def _find_exception(s: Asm, row: Row) -> None:
    """TARGET := the exception of (ROW, targets[ROW]), NO_COLUMN where the target is none
    (or >= V): a binary search over the row's sorted columns."""
    row.load(COLUMN, DATA_PTR, ROW)
    s.mov(TARGET, NO_COLUMN)
    s.mov(LOW, r(FIRST))
    s.mov(HIGH, r(LAST))
    s.isetp(0, "GE", r(COLUMN), r(VOCAB))
    s.mov(HIGH, r(LOW), guard=p(0))

    def body() -> None:
        s.isetp(0, "LT", r(LOW), r(HIGH))
        s.op("IADD3.RRRR", r(MIDDLE), r(HIGH), r(LOW, neg=True), RZR)
        s.shr(MIDDLE, r(MIDDLE), 1)
        s.add(MIDDLE, r(MIDDLE), r(LOW))
        row.load(TMP, COLUMNS_PTR, MIDDLE, guard=0)
        s.isetp(1, "EQ", r(TMP), r(COLUMN), other=p(0))
        s.mov(TARGET, r(MIDDLE), guard=p(1))
        s.mov(HIGH, r(LOW), guard=p(1))  # found: done
        s.isetp(2, "LT", r(TMP), r(COLUMN), other=p(0))
        s.add(LOW, r(MIDDLE), 1, guard=p(2))
        s.isetp(3, "GT", r(TMP), r(COLUMN), other=p(0))
        s.mov(HIGH, r(MIDDLE), guard=p(3))

    while_any(s, row.vote, lambda pred: s.isetp(pred, "LT", r(LOW), r(HIGH)), body)


def hard_row(s: Asm, row: Row, loss: bool) -> None:
    """Row ROW's gradient of every class, and (where `loss`) its loss, hard targets
    (bob_collapsed.cuh's hard_row)."""
    row.start()
    _find_exception(s, row)
    row.chains()
    _row_sums(s, row)
    _divide(s, TOTAL, REST_E, SUM)
    s.fmul(TOTAL, r(TOTAL), s.param("inverse_rows"))
    s.canonical(TOTAL, 0)
    _store_lane0(s, G_PTR, ROW, TOTAL)
    if loss:
        log2(s, BIG_L, SUM, Scratch(ROUTINE, 32))
        s.isetp(1, "NE", r(TARGET), NO_COLUMN)
        s.mov(X, 0)
        row.class_address(TARGET)
        s.ldg(X, ADDRESS, guard=p(1))
        _exponent(s, TMP, X)
        s.fadd(TOTAL, r(BIG_L), r(TMP, neg=True))
        s.fmul(TOTAL, r(TOTAL), s.param("ln2"))
        s.mov(TOTAL, NAN_BITS, guard=p(1, True))
        s.canonical(TOTAL, 0)
        _store_lane0(s, LOSS_PTR, ROW, TOTAL)

    def gradient(pred: int) -> None:
        _exception_exponential(s, row, V, pred)
        _divide(s, V, V, SUM)
        s.isetp(0, "EQ", r(I), r(TARGET))
        s.fadd(V, r(V), ONE | SIGN, guard=p(0))
        s.fmul(V, r(V), s.param("inverse_rows"))
        s.canonical(V, 0)
        s.add(TMP2, r(VOCAB), r(I))
        s.wide(ADDRESS, r(TMP2), 4, G_PTR)
        s.add(TMP, r(K), r(TID))
        s.isetp(5, "LT", r(TMP), r(COUNT))  # P5 again: the division took it
        s.stg(ADDRESS, V, guard=p(5))

    row.each_exception(gradient)


def corpus_row(s: Asm, row: Row, skip: str, loss: bool) -> None:
    """Row ROW's gradient of every class against the exceptions' corpus weights, and
    (where `loss`) its loss (bob_collapsed.cuh's corpus_row): the gradient (e / s) W - T,
    W the row's weight sum in the order of section 6, the rest's weight 0. A weightless
    row stores its zeros and goes on to `skip`."""
    row.start()
    _weightless(s, row, skip, gradients=True, loss=loss)
    row.chains()

    def weight(d: int, pred: int) -> None:
        s.mov(d, 0)
        row.load(d, DATA_PTR, I, guard=pred)

    s.mov(TMP, 0)
    s.mov(WEIGHT_SUM, 0)
    row.class_sum(WEIGHT_SUM, TMP, weight)
    _row_sums(s, row)
    if loss:
        _corpus_loss(s, row)
    _divide(s, TOTAL, REST_E, SUM)
    s.fmul(TOTAL, r(TOTAL), r(WEIGHT_SUM))
    s.fadd(TOTAL, r(TOTAL), SIGN)  # - 0, the rest's weight
    s.canonical(TOTAL, 0)
    _store_lane0(s, G_PTR, ROW, TOTAL)

    def gradient(pred: int) -> None:
        _exception_exponential(s, row, V, pred)
        _divide(s, V, V, SUM)
        s.add(TMP, r(K), r(TID))
        s.isetp(5, "LT", r(TMP), r(COUNT))  # P5 again: the division took it
        s.mov(X, 0)
        row.load(X, DATA_PTR, I, guard=5)
        s.fmul(V, r(V), r(WEIGHT_SUM))
        s.fadd(V, r(V), r(X, neg=True))
        s.canonical(V, 0)
        s.add(TMP2, r(VOCAB), r(I))
        s.wide(ADDRESS, r(TMP2), 4, G_PTR)
        s.stg(ADDRESS, V, guard=p(5))

    row.each_exception(gradient)


def loss_gradient_hard(arch: str) -> Image:
    """Row losses and every class's gradient, hard targets, of a collapsed table
    (bob_collapsed_loss_gradient's hard_row): loss[r] = ln2 (log2(s) - z_t), NaN where the
    target is no exception of the row; gradient p / V, (p_t - 1) / V at the target."""
    s = Asm(arch, sig.SIGNATURES[sig.COLLAPSED_LOSS_HARD])
    vote = _kernel_start(s, ((DATA_PTR, "targets"), (LOSS_PTR, "loss"),
                             (G_PTR, "gradients")))
    row = Row(s, vote)
    _each_row(s, lambda next_row: hard_row(s, row, loss=True))
    return s.image("bob_collapsed_loss_gradient", shared_bytes=SHARED_BYTES)


def loss_gradient_corpus(arch: str) -> Image:
    """Row losses and every class's gradient against the exceptions' corpus weights
    (bob_collapsed_loss_gradient_corpus's corpus_row): the gradient (e / s) W - T, W the
    row's weight sum in the order of section 6, the rest's weight 0."""
    s = Asm(arch, sig.SIGNATURES[sig.COLLAPSED_LOSS_CORPUS])
    vote = _kernel_start(s, ((DATA_PTR, "weights"), (LOSS_PTR, "loss"),
                             (G_PTR, "gradients")))
    row = Row(s, vote)
    _each_row(s, lambda next_row: corpus_row(s, row, next_row, loss=True))
    return s.image("bob_collapsed_loss_gradient_corpus", shared_bytes=SHARED_BYTES)


BUILDERS = {
    sig.COLLAPSED_LOSS_ONLY: loss_corpus,
    sig.COLLAPSED_LOSS_HARD: loss_gradient_hard,
    sig.COLLAPSED_LOSS_CORPUS: loss_gradient_corpus,
}
