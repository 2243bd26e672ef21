"""What Bob's own kernels are written with: ``bob.isa.builder`` spelled as the kernels use
it (``Asm``), and the arithmetic routines they share.

Each kernel performs the operation sequence of docs/ARITHMETIC.md (the same as
``cuda/bob_kernels.cu`` and ``reference.py``), so the bytes it stores equal
theirs. Shapes chosen for simple, provable code rather than speed:

- Every branch is uniform over the block: loops run over a block-wide base
  index and each lane's element is guarded by a predicate, so no warp ever
  diverges and no reconvergence barrier is needed.
- Reductions are the 256-lane tree of ARITHMETIC.md (lane l < s combines lane
  l + s), so the order is the specified one by construction; a row max that
  feeds only w - max is the largest order key instead (``keyed_max``), which
  differs from the tree's only in the sign of a zero that no such use sees.
- Division and square root are correctly rounded for every binary32 input by
  their own construction (``divide``, ``square_root``): a Newton sequence from
  MUFU gives a candidate within one ulp, and an exact test against the rounding
  midpoints fixes the last bit, so the result does not depend on MUFU's last
  bits. Where every lane of a warp has operands in a range where each step is
  exact without scaling (ordinary values), that is all; where one lane does
  not, the warp goes the whole way: operands scaled exactly into [1, 2) (or
  [1, 4)), subnormal results rounded once, special values. The choice is one
  VOTE.ANY a warp, so the branch never diverges.
- ``exp2``'s round-to-integer is the 1.5 * 2^23 addition (exact for the
  clamped range, ties to even), which also gives k from the sum's bits.

Register and predicate use is explicit; the routines document what they clobber.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from bob.isa.builder import Builder, Image
from bob.isa.model import PT, RZ, CBuf, GMem, Imm, Pred, Reg, SMem, SReg, UReg
from bob.kernels.arith import EXP2_COEFFICIENTS, LOG2_COEFFICIENTS, SQRT2_BELOW_BITS
from bob.plan.model import Param
from bob.plan.placement import TARGETS, argument_slots

LANES = 256
TID_X = 0x21
CTAID_X = 0x25
DESC = 4  # UR4:UR5 hold the global memory descriptor
NAN_BITS = 0x7FFFFFFF  # the canonical NaN every kernel stores
POS_INF = 0x7F800000
NEG_INF = 0xFF800000
SIGN = 0x80000000
MANTISSA = 0x007FFFFF
ONE = 0x3F800000
TWO_POW_24 = 0x4B800000
ROUND_MAGIC = 0x4B400000  # 1.5 * 2^23
EXP2_LOW = 0xC3170000  # -151
EXP2_HIGH = 0x43010000  # 129
MIN_NORMAL = 0x00800000
HALF = 0x3F000000

# LOP3 truth tables over (a, b, c) = (0xF0, 0xCC, 0xAA).
AND_AB = 0xC0
OR_AB = 0xFC
XOR_AC_AND_B = 0x48  # (a ^ c) & b
AND_AB_XOR_C = 0x6A  # (a & b) ^ c
OR_AC = 0xFA


def r(index: int, neg: bool = False, abs_: bool = False) -> Reg:
    return Reg(index, neg, abs_)


RZR = Reg(RZ)
PTP = Pred(PT)


def p(index: int, inverted: bool = False) -> Pred:
    return Pred(index, inverted)


def imm(value: int) -> Imm:
    return Imm(value & 0xFFFFFFFF)


class Asm:
    """A Builder with the spellings Bob's kernels use, and its constant-bank facts."""

    def __init__(self, arch: str, params: tuple[Param, ...]):
        self.b = Builder(arch)
        self.arch = arch
        self.facts = self.b.facts
        self.slots = {slot.param.name: slot.offset
                      for slot in argument_slots(TARGETS[arch], params)}
        self._labels = 0

    def fresh(self, stem: str) -> str:
        self._labels += 1
        return f"{stem}{self._labels}"

    def param(self, name: str) -> CBuf:
        return CBuf(0, self.slots[name])

    def op(self, *args, **kwargs) -> None:
        self.b.op(*args, **kwargs)

    # -- moves and integers -------------------------------------------------------------
    def mov(self, d: int, value: int | Reg | UReg | CBuf, guard: Pred = PTP) -> None:
        if isinstance(value, int):
            self.op("MOV.I", r(d), imm(value), guard=guard)
        elif isinstance(value, CBuf):
            self.op("MOV.C", r(d), value, guard=guard)
        elif isinstance(value, UReg):
            self.op("MOV.U", r(d), value, guard=guard)
        else:
            self.op("MOV.R", r(d), value, guard=guard)

    def pointer(self, d: int, name: str) -> None:
        """Registers d, d + 1 := the pointer argument `name`."""
        self.op("LDC", r(d), CBuf(0, self.slots[name], index=RZ), mods="64")

    def add(self, d: int, a: Reg, b: int | Reg, guard: Pred = PTP) -> None:
        if isinstance(b, int):
            self.op("IADD3.RRIR", r(d), a, imm(b), RZR, guard=guard)
        else:
            self.op("IADD3.RRRR", r(d), a, b, RZR, guard=guard)

    def logic(self, d: int, a: Reg, b: int | Reg, c: Reg, lut: int) -> None:
        if isinstance(b, int):
            self.op("LOP3.LUT.RRIR", r(d), a, imm(b), c, Imm(lut), PTP)
        else:
            self.op("LOP3.LUT.RRRR", r(d), a, b, c, Imm(lut), PTP)

    def shr(self, d: int, a: Reg, shift: int | Reg, signed: bool = False) -> None:
        kind = "S32" if signed else "U32"
        if isinstance(shift, int):
            self.op("SHF.RRIR", r(d), RZR, imm(shift), a, mods=("R", kind, "HI"))
        else:
            self.op("SHF.RRRR", r(d), RZR, shift, a, mods=("R", kind, "HI"))

    def shl(self, d: int, a: Reg, shift: int | Reg) -> None:
        if isinstance(shift, int):
            self.op("SHF.RRIR", r(d), a, imm(shift), RZR, mods=("L", "U32"))
        else:
            self.op("SHF.RRRR", r(d), a, shift, RZR, mods=("L", "U32"))

    def lea(self, d: int, a: Reg, b: int | Reg, shift: int) -> None:
        """d = (a << shift) + b."""
        if isinstance(b, int):
            self.op("LEA.RRI", r(d), a, imm(b), Imm(shift))
        else:
            self.op("LEA.RRR", r(d), a, b, Imm(shift))

    def wide(self, d: int, a: Reg, b: int | Reg, c: int) -> None:
        """d:d+1 = a * b + c:c+1 (unsigned)."""
        if isinstance(b, int):
            self.op("IMAD.WIDE.RRIR", r(d), a, imm(b), r(c), mods="U32")
        else:
            self.op("IMAD.WIDE.RRRR", r(d), a, b, r(c), mods="U32")

    def mad(self, d: int, a: Reg, b: int | Reg, c: Reg) -> None:
        if isinstance(b, int):
            self.op("IMAD.RRIR", r(d), a, imm(b), c, mods="U32")
        else:
            self.op("IMAD.RRRR", r(d), a, b, c, mods="U32")

    def isetp(self, dst: int, compare: str, a: Reg, b: int | Reg | CBuf, *, signed: bool = False,
              combine: str = "AND", other: Pred = PTP, guard: Pred = PTP) -> None:
        mods = (compare, *(() if signed else ("U32",)), combine)
        if isinstance(b, int):
            self.op("ISETP.PPRIP", p(dst), PTP, a, imm(b), other, mods=mods, guard=guard)
        elif isinstance(b, CBuf):
            self.op("ISETP.PPRCP", p(dst), PTP, a, b, other, mods=mods, guard=guard)
        else:
            self.op("ISETP.PPRRP", p(dst), PTP, a, b, other, mods=mods, guard=guard)

    def isetp_ex(self, dst: int, compare: str, a: Reg, b: Reg | CBuf, low: Pred) -> None:
        """The 64-bit comparison's high words; `low` holds the low words' result."""
        mods = (compare, "U32", "AND", "EX")
        form = "ISETP.EX.PPRCPP" if isinstance(b, CBuf) else "ISETP.EX.PPRRPP"
        self.op(form, p(dst), PTP, a, b, PTP, low, mods=mods)

    def sel(self, d: int, a: Reg, b: int | Reg, choose_a: Pred) -> None:
        if isinstance(b, int):
            self.op("SEL.RIP", r(d), a, imm(b), choose_a)
        else:
            self.op("SEL.RRP", r(d), a, b, choose_a)

    # -- binary32 -----------------------------------------------------------------------
    def fadd(self, d: int, a: Reg, b: int | Reg | CBuf, guard: Pred = PTP) -> None:
        self.op(_form("FADD", b), r(d), a, _src(b), guard=guard)

    def fmul(self, d: int, a: Reg, b: int | Reg | CBuf, ftz: bool = False) -> None:
        self.op(_form("FMUL", b), r(d), a, _src(b), mods=("FTZ",) if ftz else ())

    def ffma(self, d: int, a: Reg, b: Reg, c: int | Reg) -> None:
        if isinstance(c, int):
            self.op("FFMA.RRI", r(d), a, b, imm(c))
        else:
            self.op("FFMA.RRR", r(d), a, b, c)

    def fsetp(self, dst: int, compare: str, a: Reg, b: int | Reg | CBuf, *,
              combine: str = "AND", other: Pred = PTP) -> None:
        form = {"I": "FSETP.PPRIP", "C": "FSETP.PPRCP", "R": "FSETP.PPRRP"}[_kind(b)]
        self.op(form, p(dst), PTP, a, _src(b), other, mods=(compare, combine))

    def fsel(self, d: int, a: Reg, b: int | Reg, choose_a: Pred) -> None:
        self.op("FSEL.RIP" if isinstance(b, int) else "FSEL.RRP", r(d), a, _src(b), choose_a)

    def canonical(self, x: int, scratch_pred: int) -> None:
        """x := the canonical NaN where x is a NaN."""
        self.fsetp(scratch_pred, "NAN", r(x), r(x))
        self.mov(x, NAN_BITS, guard=p(scratch_pred))

    # -- memory -------------------------------------------------------------------------
    def ldg(self, d: int, address: int, guard: Pred = PTP, offset: int = 0) -> None:
        self.op("LDG.E", r(d), GMem(address, offset, DESC), guard=guard)

    def stg(self, address: int, value: int, guard: Pred = PTP, offset: int = 0) -> None:
        self.op("STG.E", GMem(address, offset, DESC), r(value), guard=guard)

    def lds(self, d: int, base: int, offset: int, guard: Pred = PTP) -> None:
        self.op("LDS", r(d), SMem(base, self.facts.shared_base + offset), guard=guard)

    def sts(self, base: int, offset: int, value: int, guard: Pred = PTP) -> None:
        self.op("STS", SMem(base, self.facts.shared_base + offset), r(value), guard=guard)

    def barrier(self) -> None:
        self.op("BAR.SYNC.I", Imm(0))

    def prologue(self, tid: int, ctaid: int | None, scratch: int) -> None:
        """The descriptor in UR4:UR5, tid (and ctaid); trap unless blockDim.x is 256
        (the reductions' order, and the loops' stride, assume it)."""
        self.op("ULDC", UReg(DESC), CBuf(0, self.facts.descriptor_offset), mods="64")
        self.op("S2R", r(tid), SReg(TID_X))
        if ctaid is not None:
            self.op("S2R", r(ctaid), SReg(CTAID_X))
        self.op("LDC", r(scratch), CBuf(0, 0, index=RZ))  # blockDim.x
        self.isetp(0, "EQ", r(scratch), LANES)
        checked = self.fresh("block_checked")
        self.b.bra(checked, guard=p(0))  # a guarded trap is an illegal instruction
        self.op("BPT.TRAP", Imm(1))
        self.b.label(checked)

    def exit(self, guard: Pred = PTP) -> None:
        self.op("EXIT", guard=guard)

    def image(self, name: str, shared_bytes: int = 0) -> Image:
        return self.b.image(name, shared_bytes=shared_bytes)


def _kind(b) -> str:
    return "I" if isinstance(b, int) else "C" if isinstance(b, CBuf) else "R"


def _form(mnemonic: str, b) -> str:
    return f"{mnemonic}.R{_kind(b)}"


def _src(b):
    return imm(b) if isinstance(b, int) else b


# -- division and square root -----------------------------------------------------------


@dataclass(frozen=True)
class Scratch:
    """Registers a routine may clobber: `first` .. `first + count - 1` (pairs aligned)."""

    first: int
    count: int

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.count:
            raise ValueError(f"scratch register {i} of {self.count}")
        return self.first + i


DIVIDE_REGISTERS = 19  # what divide clobbers: t(0..18)
DIVIDE_SCRATCH = 22
SQRT_SCRATCH = 15
# The fast range's edges, as biased exponents (docs/ISA.md, "Bob's own seed kernels"):
# inside them every step of the unscaled sequences is exact or correctly rounded.
DIVIDE_FAST_A = (27, 254)  # |a|, or a zero
DIVIDE_FAST_B = (2, 252)  # |b|
# |a|'s bits less |b|'s, in units of 2^23: within it the exponents' difference is too.
DIVIDE_FAST_SPREAD = (-101, 126)
SQRT_FAST_LOW = 27 << 23  # x in [2^-100, max float], or +0


def _normalize(s: Asm, x: int, magnitude: int, mantissa: int, exponent: int, pred: int) -> None:
    """From |x| in `magnitude` (finite, nonzero: other values give garbage, overridden
    later): mantissa := its significand in [1, 2) as binary32 bits, exponent := its
    unbiased exponent. Subnormals are scaled by 2^24 first, exactly."""
    s.logic(magnitude, r(x), 0x7FFFFFFF, RZR, AND_AB)
    s.isetp(pred, "LT", r(magnitude), MIN_NORMAL)
    s.mov(exponent, 0)
    s.fmul_guarded(magnitude, r(magnitude), TWO_POW_24, p(pred))
    s.mov(exponent, 24, guard=p(pred))
    s.shr(mantissa, r(magnitude), 23)
    s.op("IADD3.RRRR", r(exponent), r(mantissa), r(exponent, neg=True), RZR)
    s.add(exponent, r(exponent), -127)
    s.logic(mantissa, r(magnitude), 0x007FFFFF, RZR, AND_AB)
    s.logic(mantissa, r(mantissa), ONE, RZR, OR_AB)


def _fmul_guarded(self: Asm, d: int, a: Reg, b: int, guard: Pred) -> None:
    self.op("FMUL.RI", r(d), a, imm(b), guard=guard)


Asm.fmul_guarded = _fmul_guarded  # type: ignore[attr-defined]


def _midpoint_distances(s: Asm, up: int, down: int, q: int, scale: int, shift: int,
                        w: int) -> None:
    """up := 2^(E - shift) * scale, E the exponent of q (exact in the callers' ranges);
    down := up, halved where q is a power of two (the ulp below it is half). Clobbers w,
    P1."""
    s.logic(up, r(q), POS_INF, RZR, AND_AB)
    s.add(up, r(up), -(shift << 23))
    s.fmul(up, r(scale), r(up))
    s.logic(w, r(q), 0x007FFFFF, RZR, AND_AB)
    s.isetp(1, "EQ", r(w), 0)
    s.fmul(down, r(up), HALF)
    s.fsel(down, r(down), r(up), p(1))


def divide(s: Asm, d: int, a: int, b: int, t: Scratch) -> None:
    """d := a / b correctly rounded (IEEE round to nearest even, subnormals kept), for
    every binary32 a and b. Clobbers t(0..18) and P0..P5; d may be a or b.

    The fast sequence (``_divide_fast``) where every lane of the warp has operands in its
    range, else the exact one (``_divide_exact``) for the whole warp."""
    quotient, routine = t(18), Scratch(t.first, 18)
    _divide_fast(s, quotient, a, b, routine)
    _unless_every_lane_fast(s, lambda: _divide_exact(s, quotient, a, b, routine))
    s.mov(d, r(quotient))


def _unless_every_lane_fast(s: Asm, exact) -> None:
    """exact() for the whole warp where some lane has P0 (its operands outside the fast
    range): one VOTE.ANY, so the branch is the same in every lane of the warp."""
    done = s.fresh("fast")
    s.op("VOTE", RZR, p(1), p(0), mods="ANY")
    s.b.bra(done, guard=p(1, True))
    exact()
    s.b.label(done)


def _dividend_outside(s: Asm, x: int, y: int, e: int) -> None:
    """P0 := the dividend |a| (its bits in x) outside DIVIDE_FAST_A, or its bits less
    those of |b| (in y) outside DIVIDE_FAST_SPREAD; a zero dividend inside. Each range
    is one unsigned compare of the bits less the low edge against the width. Clobbers
    e."""
    low, high = DIVIDE_FAST_A
    s.add(e, r(x), -(low << 23))
    s.isetp(0, "GT", r(e), (high - low) << 23 | MANTISSA)
    low, high = DIVIDE_FAST_SPREAD
    s.op("IADD3.RRIR", r(e), r(x), imm(-(low << 23)), r(y, neg=True))
    s.isetp(0, "GT", r(e), (high - low) << 23, combine="OR", other=p(0))
    s.isetp(0, "NE", r(x), 0, other=p(0))  # a zero dividend is in range


def _divisor_outside(s: Asm, y: int, e: int) -> None:
    """P0 |= |b| (its bits in y) outside DIVIDE_FAST_B. Clobbers e."""
    low, high = DIVIDE_FAST_B
    s.add(e, r(y), -(low << 23))
    s.isetp(0, "GT", r(e), (high - low) << 23 | MANTISSA, combine="OR", other=p(0))


def _nearest_of_three(s: Asm, q: int, x: int, factor: Callable[[int], int],
                      registers: tuple[int, int, int, int, int]) -> None:
    """q := whichever of q and its neighbours q -+ 1 (in the bits) is nearest the exact
    value, by the residuals x - c * factor(c) of the three candidates c (x - c |b| for a
    quotient, x - c^2 for a root): up where r + ru > 0, down where r + rd < 0 (why,
    in ``_divide_fast`` and ``_square_root_fast``). `registers`: r, qu, qd, ru, rd, all
    clobbered, with P2 and P3."""
    rem, up, down, rem_up, rem_down = registers
    s.add(up, r(q), 1)
    s.add(down, r(q), -1)
    for residual, candidate in ((rem, q), (rem_up, up), (rem_down, down)):
        s.ffma(residual, r(candidate, neg=True), r(factor(candidate)), r(x))
    s.fsetp(2, "GT", r(rem), r(rem_up, neg=True))
    s.fsetp(3, "LT", r(rem), r(rem_down, neg=True))
    s.sel(q, r(up), r(q), p(2))
    s.sel(q, r(down), r(q), p(3))


def _divide_fast(s: Asm, d: int, a: int, b: int, t: Scratch, nudge: int = 0) -> None:
    """d := a / b where P0 is clear: |a| = 0 or in DIVIDE_FAST_A, |b| in DIVIDE_FAST_B,
    their bits' difference in DIVIDE_FAST_SPREAD. Clobbers t(0..8) and P0, P2, P3; d may
    be a or b.

    The candidate q (a Newton step on MUFU.RCP, the quotient and one correction) is within
    an ulp of Q = |a| / |b|. With x = |a|, y = |b| and g the product of the ulps of q and
    y, x, q y and qu y (qu = q + ulp, its upper neighbour) are whole multiples of g, and
    qd y (qd its lower neighbour) of g / 2; the range keeps g / 2 above 2^-149 and every
    neighbour normal. Q lies past the midpoint of q and qu exactly where
    r + ru > 0 (r = x - q y, ru = x - qu y = r - (qu - q) y), and past that of q and qd
    where r + rd < 0; a normal quotient of 24-bit significands is never on a midpoint, so
    neither sum is zero and no tie rule is needed. r is exact (below 2^24 g, |r| < ulp(q)
    y). ru or rd rounds only where it reaches 2^24 g (rd 2^23 g below a power of two), by
    at most g (g / 2); there its sum with r is at least 2g (2^23 g) from zero, so each
    compare's outcome is the exact one. A zero dividend gives q = 0, which neither
    compare moves (ru is -0 or negative, rd a NaN). `nudge` moves the candidate by so many
    ulps before the test (the tests' way to show the test corrects it wherever it starts
    within one ulp).
    """
    x, y, rcp, e, q, rem, up, down, rem_up = (t(i) for i in range(9))
    rem_down = rcp
    s.logic(x, r(a), 0x7FFFFFFF, RZR, AND_AB)
    s.logic(y, r(b), 0x7FFFFFFF, RZR, AND_AB)
    _dividend_outside(s, x, y, e)
    _divisor_outside(s, y, e)
    # The candidate: a Newton step on MUFU.RCP, the quotient and one correction.
    s.op("MUFU.R", r(rcp), r(y), mods="RCP")
    s.ffma(e, r(y, neg=True), r(rcp), ONE)
    s.ffma(rcp, r(rcp), r(e), r(rcp))
    s.fmul(q, r(x), r(rcp))
    s.ffma(e, r(y, neg=True), r(q), r(x))
    s.ffma(q, r(rcp), r(e), r(q))
    if nudge:
        s.add(q, r(q), nudge)
    _nearest_of_three(s, q, x, lambda _: y, (rem, up, down, rem_up, rem_down))
    s.logic(e, r(a), SIGN, r(b), XOR_AC_AND_B)
    s.logic(d, r(q), r(e), RZR, OR_AB)


@dataclass(frozen=True)
class Reciprocal:
    """A divisor many divisions share (a row's sum), prepared once by ``reciprocal``:
    registers holding y = 1/b correctly rounded, and |b|'s bits where |b| is in
    DIVIDE_FAST_B (else OUTSIDE_DIVIDE_FAST_B, past its every bound)."""

    divisor: int
    y: int
    magnitude: int


OUTSIDE_DIVIDE_FAST_B = 0xFFFFFFFF  # a divisor's bits past every range check


def reciprocal(s: Asm, prepared: Reciprocal, t: Scratch) -> None:
    """prepared.y := 1 / b by ``divide`` (correctly rounded, every b) and
    prepared.magnitude as its docstring says. Clobbers t (DIVIDE_REGISTERS) and P0..P5."""
    b, y, e = prepared.divisor, prepared.y, prepared.magnitude
    s.mov(y, ONE)
    divide(s, y, y, b, t)
    s.logic(e, r(b), 0x7FFFFFFF, RZR, AND_AB)
    low, high = DIVIDE_FAST_B
    s.add(t(0), r(e), -(low << 23))
    s.isetp(0, "GT", r(t(0)), (high - low) << 23 | MANTISSA)
    s.mov(e, OUTSIDE_DIVIDE_FAST_B, guard=p(0))


def divide_by(s: Asm, d: int, a: int, prepared: Reciprocal, t: Scratch) -> None:
    """d := a / b correctly rounded for every binary32 a, b the prepared divisor (its
    reciprocal() made before). Clobbers t(0..18) and P0..P5; d may be a.

    Where every lane of the warp has operands in ``_divide_fast``'s range: q = a y, one
    correction by the exact remainder, and nothing else (``_divide_by_fast``); else the
    exact sequence for the whole warp, as ``divide``."""
    quotient, routine = t(18), Scratch(t.first, 18)
    _divide_by_fast(s, quotient, a, prepared, routine)
    _unless_every_lane_fast(s, lambda: _divide_exact(s, quotient, a, prepared.divisor,
                                                     routine))
    s.mov(d, r(quotient))


def _divide_by_fast(s: Asm, d: int, a: int, prepared: Reciprocal, t: Scratch) -> None:
    """d := a / b where P0 is clear (the operands in ``_divide_fast``'s range), from y =
    RN(1/b): q0 = RN(|a| y), r = |a| - q0 b (exact: q0 is within an ulp and nothing
    underflows there), d = RN(q0 + r y) with a's sign given to it. Markstein's theorem:
    with y within half an ulp of 1/b and q0 within an ulp of |a|/b, RN(q0 + r y) is
    the correctly rounded quotient (neither under- nor overflowing, as the range
    ensures). Its sign is b's (y's) already; a zero dividend gives a zero of the right
    sign. Clobbers t(0..2) and P0; d must not be a."""
    b, y, magnitude = prepared.divisor, prepared.y, prepared.magnitude
    x, e, q = (t(i) for i in range(3))
    s.logic(x, r(a), 0x7FFFFFFF, RZR, AND_AB)
    _dividend_outside(s, x, magnitude, e)
    s.isetp(0, "GT", r(magnitude), DIVIDE_FAST_B[1] << 23 | MANTISSA, combine="OR",
            other=p(0))  # b too
    s.fmul(q, r(x), r(y))
    s.ffma(e, r(q, neg=True), r(b), r(x))
    s.ffma(q, r(e), r(y), r(q))
    s.logic(d, r(a), SIGN, r(q), AND_AB_XOR_C)


def _divide_exact(s: Asm, d: int, a: int, b: int, t: Scratch) -> None:
    """d := a / b correctly rounded for every binary32 a and b. Clobbers t(0..17) and
    P0..P5; d may be a or b.

    |a| = A 2^ea, |b| = B 2^eb with A, B in [1, 2) (exact scaling). q = A / B rounded to
    24 bits: a Newton sequence from MUFU.RCP gives a candidate within one ulp; the exact
    remainder A - qB compared with B times half an ulp (both exact) moves it to the
    correctly rounded one. The result q 2^(ea - eb) is made by two power-of-two
    products of which only the last rounds (subnormal results). Where that rounding
    meets an exact midpoint that the quotient only reached by its own rounding, q is
    first moved one ulp towards the true quotient (the remainder's sign), so the last
    rounding goes the way the exact quotient does.
    """
    sign, abs_a, abs_b = t(0), t(1), t(2)
    big_a, big_b, ea, eb = t(3), t(4), t(5), t(6)
    r0, e1, q, rem = t(7), t(8), t(9), t(10)
    hu, hd, e, y = t(11), t(12), t(13), t(14)
    w1, w2, w3 = t(15), t(16), t(17)
    s.logic(sign, r(a), SIGN, r(b), XOR_AC_AND_B)
    _normalize(s, a, abs_a, big_a, ea, 0)
    _normalize(s, b, abs_b, big_b, eb, 0)
    s.op("IADD3.RRRR", r(e), r(ea), r(eb, neg=True), RZR)
    # q: MUFU.RCP, a Newton step on the reciprocal, the quotient and its correction.
    s.op("MUFU.R", r(r0), r(big_b), mods="RCP")
    s.ffma(e1, r(big_b, neg=True), r(r0), ONE)
    s.ffma(r0, r(r0), r(e1), r(r0))
    s.fmul(q, r(big_a), r(r0))
    s.ffma(rem, r(big_b, neg=True), r(q), r(big_a))
    s.ffma(q, r(r0), r(rem), r(q))
    # The exact remainder and the midpoints: q +- ulp/2 scaled by B.
    s.ffma(rem, r(q, neg=True), r(big_b), r(big_a))
    _midpoint_distances(s, hu, hd, q, big_b, 24, w1)  # half an ulp of q, times B
    s.logic(w1, r(q), 1, RZR, AND_AB)
    s.isetp(3, "NE", r(w1), 0)  # q odd
    s.fsetp(2, "EQ", r(rem), r(hu), other=p(3))
    s.fsetp(1, "GT", r(rem), r(hu), combine="OR", other=p(2))
    s.fsetp(2, "EQ", r(rem), r(hd, neg=True), other=p(3))
    s.fsetp(4, "LT", r(rem), r(hd, neg=True), combine="OR", other=p(2))
    s.add(q, r(q), 1, guard=p(1))
    s.add(q, r(q), -1, guard=p(4))
    s.ffma(rem, r(q, neg=True), r(big_b), r(big_a))  # exact, for the last rounding
    # e clamped to [-152, 129]: beyond, the result is 0 or inf either way.
    s.isetp(1, "LT", r(e), -152, signed=True)
    s.sel(e, r(e), -152, p(1, True))
    s.isetp(1, "GT", r(e), 129, signed=True)
    s.sel(e, r(e), 129, p(1, True))
    # Dropped bits of a subnormal result: drop = -126 - (E_q + e), clamped to 25.
    s.shr(w1, r(q), 23)
    s.op("IADD3.RRRR", r(w1), r(w1), r(e), RZR)  # biased E_q + e
    s.op("IADD3.RRIR", r(w1), r(w1, neg=True), imm(127 - 126), RZR)  # 1 - (E_q + e + 127)
    s.isetp(1, "GT", r(w1), 25, signed=True)
    s.sel(w1, r(w1), 25, p(1, True))
    s.isetp(5, "GT", r(w1), 0, signed=True)  # a subnormal (or zero) result
    s.mov(w2, 1)
    s.shl(w2, r(w2), r(w1))  # 2^drop
    s.add(w3, r(w2), -1)
    s.logic(y, r(q), 0x007FFFFF, RZR, AND_AB)
    s.logic(y, r(y), 0x00800000, RZR, OR_AB)  # the significand
    s.logic(y, r(y), r(w3), RZR, AND_AB)  # its dropped bits
    s.shr(w2, r(w2), 1)  # half of 2^drop
    s.isetp(1, "EQ", r(y), r(w2), other=p(5))
    s.fsetp(2, "NE", r(rem), RZR, other=p(1))  # a midpoint the exact quotient is not on
    s.fsetp(3, "GT", r(rem), RZR, other=p(2))
    s.fsetp(4, "LT", r(rem), RZR, other=p(2))
    s.add(q, r(q), 1, guard=p(3))
    s.add(q, r(q), -1, guard=p(4))
    # q 2^e as q 2^k1 2^k2, k1 = floor(e / 2): the first product is exact.
    s.shr(w1, r(e), 1, signed=True)
    s.op("IADD3.RRRR", r(w2), r(e), r(w1, neg=True), RZR)
    s.lea(w1, r(w1), ONE, 23)
    s.lea(w2, r(w2), ONE, 23)
    s.fmul(y, r(q), r(w1))
    s.fmul(y, r(y), r(w2))
    s.logic(y, r(y), r(sign), RZR, OR_AB)
    # Special operands, by their magnitudes' bits (|x| of a subnormal x was scaled, of
    # 0 and inf not).
    s.isetp(1, "EQ", r(abs_a), 0)
    s.isetp(1, "EQ", r(abs_b), POS_INF, combine="OR", other=p(1))  # a zero result
    s.isetp(2, "EQ", r(abs_a), POS_INF)
    s.isetp(2, "EQ", r(abs_b), 0, combine="OR", other=p(2))  # an infinite result
    s.logic(w1, r(a), 0x7FFFFFFF, RZR, AND_AB)
    s.logic(w2, r(b), 0x7FFFFFFF, RZR, AND_AB)
    s.isetp(4, "EQ", r(w1), r(w2), other=p(1))  # 0 / 0 or inf / inf
    s.isetp(4, "GT", r(w1), POS_INF, combine="OR", other=p(4))
    s.isetp(4, "GT", r(w2), POS_INF, combine="OR", other=p(4))  # or a NaN operand
    s.mov(y, r(sign), guard=p(1))
    s.op("LOP3.LUT.RRIR", r(y), r(sign), imm(POS_INF), RZR, Imm(OR_AB), PTP, guard=p(2))
    s.mov(y, NAN_BITS, guard=p(4))
    s.mov(d, r(y))


def square_root(s: Asm, d: int, x: int, t: Scratch) -> None:
    """d := sqrt(x) correctly rounded for every binary32 x. Clobbers t(0..14) and P0..P4;
    d may be x.

    The fast sequence (``_square_root_fast``) where every lane of the warp has x in its
    range, else the exact one (``_square_root_exact``) for the whole warp."""
    root, routine = t(14), Scratch(t.first, 14)
    _square_root_fast(s, root, x, routine)
    _unless_every_lane_fast(s, lambda: _square_root_exact(s, root, x, routine))
    s.mov(d, r(root))


def _square_root_fast(s: Asm, d: int, x: int, t: Scratch, nudge: int = 0) -> None:
    """d := sqrt(x) where P0 is clear: x = +0 or in [2^-100, max float]. Clobbers
    t(0..6) and P0, P2..P4; d must not be x.

    The candidate y (MUFU.RSQ and one correction) is within an ulp u of sqrt(x). There x
    and y^2 are whole multiples of u^2, the squares of y's neighbours yu = y + u and
    yd = y - u (u / 2 where y is a power of two) of u^2 / 4, all above 2^-149. With r, ru,
    rd the residuals x - y^2, x - yu^2, x - yd^2: x - ((y + yu) / 2)^2 = (r + ru) / 2 +
    u^2 / 4 and r + ru = 2r - (2Y + 1) u^2 (Y = y / u) is an odd multiple of u^2, so the
    root lies past the upper midpoint exactly where r + ru > 0; likewise past the lower one
    exactly where r + rd < 0 (never zero either). Near a midpoint the residuals are below
    2^24 u^2 and exact; where one rounds, the two compared values are more than an ulp
    apart, so rounding, monotone and odd, keeps each compare's outcome. `nudge`: as
    ``_divide_fast``'s.
    """
    half, y, rem, up, down, rem_up, w = (t(i) for i in range(7))
    rem_down = half
    s.add(w, r(x), -SQRT_FAST_LOW)
    s.isetp(0, "GT", r(w), 0x7F7FFFFF - SQRT_FAST_LOW)  # negative numbers too
    s.isetp(0, "NE", r(x), 0, other=p(0))
    s.op("MUFU.R", r(half), r(x), mods="RSQ")
    s.fmul(y, r(x), r(half))
    s.fmul(half, r(half), HALF)
    s.ffma(rem, r(y, neg=True), r(y), r(x))
    s.ffma(y, r(rem), r(half), r(y))
    if nudge:
        s.add(y, r(y), nudge)
    _nearest_of_three(s, y, x, lambda candidate: candidate, (rem, up, down, rem_up, rem_down))
    s.isetp(4, "EQ", r(x), 0)
    s.sel(d, RZR, r(y), p(4))


def _square_root_exact(s: Asm, d: int, x: int, t: Scratch) -> None:
    """d := sqrt(x) correctly rounded for every binary32 x. Clobbers t(0..13) and
    P0..P2; d may be x.

    x = M 4^k with M in [1, 4) (subnormals scaled by 2^24 first, exactly); MUFU.RSQ and
    one correction by the residual give a candidate y within one ulp of sqrt(M), kept in
    [1, 2). With Y = y 2^23 and M 2^23 integers, the midpoints (2Y +- 1) 2^-24 are
    compared with sqrt(M) exactly as 64-bit integers: (2Y +- 1)^2 against M 2^48
    (odd against even: a square root never lies on a midpoint). The result is the
    corrected y with k added to its exponent.
    """
    xs, u, k, parity, big_m = t(0), t(1), t(2), t(3), t(4)
    rs, y, h, w, sq = t(5), t(6), t(7), t(8), t(10)  # sq: t(10), t(11) a pair
    m_lo, m_hi = t(12), t(13)
    s.mov(xs, r(x))
    s.isetp(0, "LT", r(x), MIN_NORMAL)
    s.mov(u, -127)
    s.fmul_guarded(xs, r(xs), TWO_POW_24, p(0))
    s.mov(u, -127 - 24, guard=p(0))
    s.shr(w, r(xs), 23)
    s.op("IADD3.RRRR", r(u), r(u), r(w), RZR)  # the unbiased exponent
    s.logic(parity, r(u), 1, RZR, AND_AB)
    s.op("IADD3.RRRR", r(k), r(u), r(parity, neg=True), RZR)
    s.shr(k, r(k), 1, signed=True)
    s.logic(big_m, r(xs), 0x007FFFFF, RZR, AND_AB)
    s.logic(big_m, r(big_m), ONE, RZR, OR_AB)
    s.lea(big_m, r(parity), r(big_m), 23)  # M in [2, 4) for an odd exponent
    s.op("MUFU.R", r(rs), r(big_m), mods="RSQ")
    s.fmul(y, r(big_m), r(rs))
    s.fmul(h, r(rs), HALF)
    s.ffma(w, r(y, neg=True), r(y), r(big_m))
    s.ffma(y, r(w), r(h), r(y))
    s.isetp(0, "LT", r(y), ONE)
    s.sel(y, r(y), ONE, p(0, True))
    s.isetp(0, "GT", r(y), 0x3FFFFFFF)
    s.sel(y, r(y), 0x3FFFFFFF, p(0, True))
    # M 2^48 as a 64-bit integer: (M 2^23) << 25, M 2^23 = significand << parity.
    s.logic(w, r(xs), 0x007FFFFF, RZR, AND_AB)
    s.logic(w, r(w), 0x00800000, RZR, OR_AB)
    s.shl(w, r(w), r(parity))
    s.shl(m_lo, r(w), 25)
    s.shr(m_hi, r(w), 7)
    s.logic(w, r(y), 0x007FFFFF, RZR, AND_AB)
    s.logic(w, r(w), 0x00800000, RZR, OR_AB)  # Y
    s.lea(h, r(w), 1, 1)  # 2Y + 1
    s.wide(sq, r(h), r(h), RZ)
    s.isetp(1, "LT", r(sq), r(m_lo))
    s.isetp_ex(1, "LT", r(sq + 1), r(m_hi), p(1))  # the upper midpoint is below sqrt(M)
    s.lea(h, r(w), -1, 1)  # 2Y - 1
    s.wide(sq, r(h), r(h), RZ)
    s.isetp(2, "GT", r(sq), r(m_lo))
    s.isetp_ex(2, "GT", r(sq + 1), r(m_hi), p(2))  # the lower one is above it
    s.add(y, r(y), 1, guard=p(1))
    s.add(y, r(y), -1, guard=p(2))
    s.lea(y, r(k), r(y), 23)
    # +0, -0 and +inf are their own roots; NaN and negative numbers give NaN.
    s.isetp(0, "GT", r(x), POS_INF)
    s.mov(y, NAN_BITS, guard=p(0))
    s.isetp(0, "EQ", r(x), POS_INF)
    s.logic(w, r(x), 0x7FFFFFFF, RZR, AND_AB)
    s.isetp(0, "EQ", r(w), 0, combine="OR", other=p(0))
    s.mov(y, r(x), guard=p(0))
    s.mov(d, r(y))


# AdamW's scalars, by their parameter names, in adamw_step's order.
ADAM_SCALARS = ("decay", "beta1", "one_minus_beta1", "beta2", "one_minus_beta2", "step_size",
                "eps_hat")


def adamw_step(s: Asm, w: int, m: int, v: int, g: int, x: int, y: int,
               scalars: tuple[CBuf | Reg, ...], t: Scratch) -> None:
    """AdamW on one element in ARITHMETIC.md's order: w *= decay; m = b1 m + (1-b1) g;
    v = b2 v + (1-b2) g^2; w -= step (m / (sqrt v + eps)). `scalars`: decay, beta1,
    one_minus_beta1, beta2, one_minus_beta2, step_size, eps_hat (parameters or
    registers). Clobbers x, y, t (the division's scratch, DIVIDE_REGISTERS at least) and
    P0..P5."""
    decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, eps_hat = scalars
    s.fmul(w, r(w), decay)
    s.fmul(m, r(m), beta1)
    s.fmul(x, r(g), one_minus_beta1)
    s.fadd(m, r(m), r(x))
    s.fmul(v, r(v), beta2)
    s.fmul(x, r(g), r(g))
    s.fmul(x, r(x), one_minus_beta2)
    s.fadd(v, r(v), r(x))
    square_root(s, x, v, Scratch(t.first, SQRT_SCRATCH))
    s.fadd(x, r(x), eps_hat)
    s.fmul(y, r(m), step_size)
    divide(s, y, y, x, t)
    s.fadd(w, r(w), r(y, neg=True))


# -- exp2, log2, reductions ----------------------------------------------------------------


def exp2(s: Asm, d: int, x: int, t: Scratch) -> None:
    """d := 2^x by ARITHMETIC.md's sequence (reference.exp2's bits). Clobbers t(0..4), P0."""
    xc, n, f, k, k1 = t(0), t(1), t(2), t(3), t(4)
    s.fsetp(0, "LT", r(x), EXP2_LOW)  # NaN passes both selects
    s.fsel(xc, r(x), EXP2_LOW, p(0, True))
    s.fsetp(0, "GT", r(xc), EXP2_HIGH)
    s.fsel(xc, r(xc), EXP2_HIGH, p(0, True))
    s.fadd(k, r(xc), ROUND_MAGIC)  # rint(xc) + 1.5 * 2^23: exact, ties to even
    s.fadd(n, r(k), ROUND_MAGIC | SIGN)
    s.fadd(f, r(xc), r(n, neg=True))  # exact, in [-0.5, 0.5]
    coefficients = [c.bits for c in EXP2_COEFFICIENTS]
    s.fmul(d, r(f), coefficients[7])
    for c in reversed(coefficients[1:7]):
        s.fadd(d, r(d), c)
        s.fmul(d, r(d), r(f))
    s.fadd(d, r(d), coefficients[0])
    s.add(k, r(k), -ROUND_MAGIC)  # the integer n from the sum's bits
    s.shr(k1, r(k), 1, signed=True)  # floor(n / 2)
    s.op("IADD3.RRRR", r(k), r(k), r(k1, neg=True), RZR)
    s.lea(k1, r(k1), ONE, 23)
    s.lea(k, r(k), ONE, 23)
    s.fmul(d, r(d), r(k1))  # exact
    s.fmul(d, r(d), r(k))  # the one rounding


def log2(s: Asm, d: int, x: int, t: Scratch) -> None:
    """d := log2(x) by ARITHMETIC.md's sequence (reference.log2's bits). Clobbers the
    scratch registers (at least 24) and P0..P5; d must not be x."""
    xs, e, m, num, den, q, u, w = (t(i) for i in range(8))
    s.mov(xs, r(x))
    s.mov(e, -127)
    s.fsetp(0, "LT", r(x), MIN_NORMAL)
    s.fmul_guarded(xs, r(xs), TWO_POW_24, p(0))  # exact: now normal
    s.mov(e, -127 - 24, guard=p(0))
    s.shr(w, r(xs), 23)
    s.op("IADD3.RRRR", r(e), r(e), r(w), RZR)
    s.logic(m, r(xs), 0x007FFFFF, RZR, AND_AB)
    s.logic(m, r(m), ONE, RZR, OR_AB)  # [1, 2)
    s.fsetp(0, "GT", r(m), SQRT2_BELOW_BITS)
    s.fmul_guarded(m, r(m), HALF, p(0))  # exact
    s.add(e, r(e), 1, guard=p(0))
    s.fadd(num, r(m), ONE | SIGN)  # exact
    s.fadd(den, r(m), ONE)
    divide(s, q, num, den, Scratch(t.first + 8, t.count - 8))  # q holds t
    s.fmul(u, r(q), r(q))
    a = [c.bits for c in LOG2_COEFFICIENTS]
    s.fmul(w, r(u), a[4])
    for c in (a[3], a[2], a[1]):
        s.fadd(w, r(w), c)
        s.fmul(w, r(w), r(u))
    s.fadd(w, r(w), a[0])
    s.fmul(w, r(q), r(w))
    s.add(e, r(e), ROUND_MAGIC)
    s.fadd(e, r(e), ROUND_MAGIC | SIGN)  # (float)e, exact
    s.fadd(d, r(e), r(w))
    # 0 gives -inf, +inf itself, negative numbers and NaN a NaN.
    s.fsetp(0, "EQ", r(x), POS_INF)
    s.mov(d, POS_INF, guard=p(0))
    s.fsetp(0, "LT", r(x), 0)
    s.fsetp(0, "NAN", r(x), r(x), combine="OR", other=p(0))
    s.mov(d, NAN_BITS, guard=p(0))
    s.fsetp(0, "EQ", r(x), 0)
    s.mov(d, NEG_INF, guard=p(0))


def select_max(s: Asm, held: int, newcomer: int, pred: int) -> None:
    """held := newcomer > held ? newcomer : held (a NaN newcomer skipped, ties kept)."""
    s.fsetp(pred, "GT", r(newcomer), r(held))
    s.fsel(held, r(newcomer), r(held), p(pred))


TREE_SCRATCH = 4
WARP = 32
FULL_CLAMP = 0x1F  # SHFL's segment mask and clamp for a whole warp


TREE_BYTES = 4 * LANES  # a tree's buffer in shared memory


def tree(s: Asm, d: int, value: int, word: int, kind: str, t: Scratch, offset: int = 0,
         closing_barrier: bool = True) -> None:
    """d := the 256-lane tree of ARITHMETIC.md over each lane's `value` ("sum" or "max"):
    for s = 128, 64, ..., 1, lane l < s combines lane l + s into itself. After one
    barrier every warp runs the whole tree itself from shared memory at `offset`
    (TREE_BYTES): lane t reads partials t + 32 i (i < 8), so levels 128, 64 and 32
    combine values it holds, and levels 16 .. 1 are SHFL.DOWN (lane t < s takes lane
    t + s); lane 0's result goes to every lane. `word` holds tid * 4. With
    `closing_barrier` a second barrier lets the buffer be written again at once; without
    it the caller writes the buffer again only past another barrier (consecutive trees
    on two buffers in turn: a lane writes one only after the other tree's barrier, which
    every lane reaches after its reads of the first). Clobbers t(0..3), P0."""
    a, b, lane_word, x = t(0), t(1), t(2), t(3)

    def combine(held: int, incoming: int) -> None:
        if kind == "sum":
            s.fadd(held, r(held), r(incoming))
        else:
            select_max(s, held, incoming, 0)

    def level(d: int, i: int, j: int) -> None:
        """d := partial i (t + 32 i) combined with partial j; clobbers b."""
        s.lds(d, lane_word, offset + 4 * WARP * i)
        s.lds(b, lane_word, offset + 4 * WARP * j)
        combine(d, b)

    s.sts(word, offset, value)
    s.barrier()
    s.logic(lane_word, r(word), 4 * (WARP - 1), RZR, AND_AB)
    level(x, 0, 4)  # s = 128: a_i = op(a_i, a_{i + 4}) ...
    level(a, 2, 6)
    combine(x, a)  # ... s = 64: a_0 = op(a_0, a_2)
    level(a, 1, 5)
    s.mov(d, r(a))  # a_1, while a takes a_3
    level(a, 3, 7)
    combine(d, a)  # a_1 = op(a_1, a_3)
    combine(x, d)  # s = 32
    step = WARP // 2
    while step:
        s.op("SHFL.PRRII", PTP, r(a), r(x), Imm(step), Imm(FULL_CLAMP), mods="DOWN")
        combine(x, a)
        step //= 2
    s.op("SHFL.PRRII", PTP, r(d), r(x), Imm(0), Imm(FULL_CLAMP), mods="IDX")
    if closing_barrier:
        s.barrier()


XOR_AB = 0x3C
WARP_KEY = 8  # the uniform register of a warp's largest order key


def order_key(s: Asm, d: int, x: int, pred: int) -> None:
    """d := x's order key: its bits as a signed integer, a negative's other bits flipped,
    so that keys order as the floats they are (-0 below +0; x not a NaN). The map is its
    own inverse. Clobbers P`pred`; d must not be x."""
    s.isetp(pred, "GT", r(x), -1, signed=True)
    s.logic(d, r(x), 0x7FFFFFFF, RZR, XOR_AB)
    s.sel(d, r(x), r(d), p(pred))


def keyed_max(s: Asm, d: int, value: int, word: int, t: Scratch, offset: int = 0) -> None:
    """d := the largest of the lanes' `value`s (none a NaN: a lane's max skips them).
    That is the 256-lane max tree's result but for the sign of a zero, which the tree's
    order decides and this does not (+0 where both zeros are among the values): the
    kernels take it only for w - max, where -0 and +0 give the same bits but in a zero
    difference, which exp2 and the loss's L - z map alike. Each warp's largest order key
    (REDUX.MAX) goes to shared memory at `offset` (a word a warp), one barrier, and every
    lane takes the largest of the eight: no shuffle chain. `word` holds tid * 4; the
    buffer is written again only past another barrier, as ``tree`` without its closing
    barrier. Clobbers t(0..3), P0."""
    a, b, x, y = t(0), t(1), t(2), t(3)
    order_key(s, a, value, 0)
    s.op("REDUX", UReg(WARP_KEY), r(a), mods=("MAX", "S32"))
    s.shr(x, r(word), 5)  # tid / 8: the warp's index times 4, once masked
    s.logic(x, r(x), 4 * (LANES // WARP - 1), RZR, AND_AB)
    s.logic(y, r(word), 4 * (WARP - 1), RZR, AND_AB)
    s.isetp(0, "EQ", r(y), 0)  # the warp's lane 0
    s.mov(a, UReg(WARP_KEY))
    s.sts(x, offset, a, guard=p(0))
    s.barrier()
    s.lds(a, RZ, offset)
    for warp in range(1, LANES // WARP):
        s.lds(b, RZ, offset + 4 * warp)
        s.isetp(0, "GT", r(b), r(a), signed=True)
        s.sel(a, r(b), r(a), p(0))
    order_key(s, d, a, 0)


class Loop:
    """A loop over the block's elements base, base + step, ... < bound (step 256: one
    element a lane a trip; UNROLL * 256 for ``Trip``'s): uniform branches."""

    def __init__(self, s: Asm, base: int, bound: int | CBuf, step: int = LANES):
        self.s, self.base, self.bound, self.step = s, base, bound, step
        self.top, self.end = s.fresh("loop"), s.fresh("done")

    def __enter__(self) -> Loop:
        s = self.s
        s.mov(self.base, 0)
        s.b.label(self.top)
        s.isetp(6, "GE", r(self.base), self.bound)
        s.b.bra(self.end, guard=p(6))
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            s = self.s
            s.add(self.base, r(self.base), self.step)
            s.b.bra(self.top)
            s.b.label(self.end)


UNROLL = 4  # a row loop's elements a lane a trip: their loads in flight together
TRIP_GUARDS = (2, 3, 4, 5)  # the predicates of a trip's elements (exp2 takes P0, Loop P6)


@dataclass(frozen=True)
class Trip:
    """A row loop's trip of UNROLL elements a lane: element k is column j + 256 k, with j
    = base + tid; `left` holds V - j, so element k is in the row where left > 256 k.
    Loads come first, all in flight at once; the elements are then taken in k order,
    so a lane's running sum or max meets them in the order of the one-element loop."""

    s: Asm
    tid: int
    j: int
    left: int
    rest: int  # V - base: the same in every lane

    def start(self, base: int, vocab: int) -> None:
        """j, left, rest and every element's guard (TRIP_GUARDS)."""
        s = self.s
        s.add(self.j, r(base), r(self.tid))
        s.op("IADD3.RRRR", r(self.left), r(vocab), r(self.j, neg=True), RZR)
        s.op("IADD3.RRRR", r(self.rest), r(vocab), r(base, neg=True), RZR)
        for k, guard in enumerate(TRIP_GUARDS):
            self.inside(k, guard)

    def each(self) -> Iterator[int]:
        """k for each element of the trip in order, the ones past the row for every lane
        (the row's last trip) skipped by a uniform branch."""
        s, end = self.s, self.s.fresh("trip_done")
        for k in range(UNROLL):
            if k:
                s.isetp(6, "LE", r(self.rest), LANES * k, signed=True)
                s.b.bra(end, guard=p(6))
            yield k
        s.b.label(end)

    def inside(self, k: int, pred: int) -> None:
        """P`pred` := element k is in the row (again, after a routine took the guards)."""
        self.s.isetp(pred, "GT", r(self.left), LANES * k, signed=True)

    def load(self, values: tuple[int, ...], address: int, default: int) -> None:
        """values[k] := the trip's element k from the row at `address` (that of element
        0), `default` where it is past the row."""
        for k, value in enumerate(values):
            self.s.mov(value, default)
            self.s.ldg(value, address, guard=p(TRIP_GUARDS[k]), offset=4 * LANES * k)


def row_address(s: Asm, d: int, pointer: str, row: int, columns: int, scratch: int) -> None:
    """d:d+1 := pointer + 4 * row * columns (a 64-bit offset). Clobbers scratch..+1."""
    s.pointer(d, pointer)
    s.wide(scratch, r(row), r(columns), RZ)  # row * columns, 64 bits
    s.wide(d, r(scratch), 4, d)
    s.mad(d + 1, r(scratch + 1), 4, r(d + 1))
