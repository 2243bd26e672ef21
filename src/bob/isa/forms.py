"""The fields and form builders shared by the per-architecture tables.

Volta through Hopper share one layout for most instructions (Mesa NAK's
``encode_alu``): the destination at bits 16..23, the first source at 24..31,
and a second source whose kind bits 9..11 of the opcode select: a register at
32..39 with a third at 64..71; a 32-bit immediate at 32..63; a constant-bank
word (offset 38..53, bank 54..58); or a uniform register at 32..39 with bit 91
set. When the third source is the immediate, constant or uniform register, the
second register moves to 64..71. An architecture table (``sm90``, ``sm86``)
lists its forms with these builders; where the architectures differ, the
table says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from bob.isa.fields import Field, Form, Kind, Modifier, Slot, bits

# -- the fields ---------------------------------------------------------------------
DST = Field("dst", bits(16, 8), "the destination register")
A = Field("a", bits(24, 8), "the first source register")
A_NEG = Field("a_neg", bits(72, 1), "negate the first source")
A_ABS = Field("a_abs", bits(73, 1), "the first source's absolute value")
B = Field("b", bits(32, 8), "the register read through port 1 (bits 32..39)")
B_NEG = Field("b_neg", bits(63, 1), "negate the port-1 source")
B_ABS = Field("b_abs", bits(62, 1), "the port-1 source's absolute value")
IMM32 = Field("imm", bits(32, 32), "a 32-bit immediate")
CB_OFFSET = Field("cbuf_offset", bits(38, 16), "the constant-bank byte offset")
CB_BANK = Field("cbuf_bank", bits(54, 5), "the constant bank")
C = Field("c", bits(64, 8), "the register read through port 2 (bits 64..71)")
C_NEG = Field("c_neg", bits(75, 1), "negate the port-2 source")
C_ABS = Field("c_abs", bits(74, 1), "the port-2 source's absolute value")
UNIFORM = Field("uniform", bits(91, 1), "the source at bits 32..39 is a uniform register")

PDST = Field("pdst", bits(81, 3), "the predicate written (7: PT, none)")
PDST2 = Field("pdst2", bits(84, 3), "the second predicate written (7: PT, none)")
PSRC = Field("psrc", bits(87, 3), "the predicate read")
PSRC_NOT = Field("psrc_not", bits(90, 1), "invert the predicate read")
PSRC2 = Field("psrc2", bits(77, 3), "the second predicate read")
PSRC2_NOT = Field("psrc2_not", bits(80, 1), "invert the second predicate read")
PSRC3 = Field("psrc3", bits(68, 3), "the third predicate read")
PSRC3_NOT = Field("psrc3_not", bits(71, 1), "invert the third predicate read")

BOOL_OP = Field("bool_op", bits(74, 2), "how the comparison combines with the predicate read")
FTZ = Field("ftz", bits(80, 1), "flush subnormal inputs and results to zero")
ROUND = Field("round", bits(78, 2), "the rounding mode")
SAT = Field("sat", bits(77, 1), "clamp the result to [0, 1]")

# -- operand slots ------------------------------------------------------------------


def reg(value: Field, *, neg: Field | None = None, abs_: Field | None = None,
        reuse: int | None = None, count: int = 1, written: bool = False) -> Slot:
    roles = [("value", value)]
    if neg is not None:
        roles.append(("neg", neg))
    if abs_ is not None:
        roles.append(("abs", abs_))
    return Slot(Kind.REG, tuple(roles), written=written, reuse=reuse, count=count)


def ureg(value: Field, *, neg: Field | None = None, abs_: Field | None = None,
         count: int = 1, written: bool = False) -> Slot:
    roles = [("value", value)]
    if neg is not None:
        roles.append(("neg", neg))
    if abs_ is not None:
        roles.append(("abs", abs_))
    return Slot(Kind.UREG, tuple(roles), written=written, count=count)


def pred(value: Field, invert: Field | None = None, *, written: bool = False) -> Slot:
    roles = [("value", value)] + ([("not", invert)] if invert is not None else [])
    return Slot(Kind.PRED, tuple(roles), written=written)


def imm(value: Field = IMM32, style: str = "u") -> Slot:
    return Slot(Kind.FIMM if style == "f" else Kind.IMM, (("value", value),), style=style)


def cbuf(*, neg: Field | None = None, abs_: Field | None = None, count: int = 1) -> Slot:
    roles = [("value", CB_OFFSET), ("bank", CB_BANK)]
    if neg is not None:
        roles.append(("neg", neg))
    if abs_ is not None:
        roles.append(("abs", abs_))
    return Slot(Kind.CBUF, tuple(roles), count=count)


def dst(count: int = 1) -> Slot:
    return reg(DST, written=True, count=count)


def pdst(value: Field = PDST) -> Slot:
    return pred(value, written=True)


def modifier(f: Field, **names: int) -> Modifier:
    """A modifier from keyword names: ``modifier(FTZ, _=0, FTZ=1)``; "_" is no text."""
    return Modifier(f, tuple((value, "" if name == "_" else name)
                             for name, value in names.items()))


def flag(f: Field, text: str) -> Modifier:
    return Modifier(f, ((0, ""), (1, text)))


FTZ_MOD = flag(FTZ, "FTZ")
SAT_MOD = flag(SAT, "SAT")
ROUND_MOD = Modifier(ROUND, ((0, ""), (1, "RM"), (2, "RP"), (3, "RZ")))
BOOL_MOD = Modifier(BOOL_OP, ((0, "AND"), (1, "OR"), (2, "XOR")))
# !PT in a predicate source nobody reads: what ptxas writes there.
FALSE_PSRC = ((PSRC, 7), (PSRC_NOT, 1))
FALSE_PSRC2 = ((PSRC2, 7), (PSRC2_NOT, 1))
NO_PDST = ((PDST, 7),)
NO_PDST2 = ((PDST2, 7),)


# -- the ALU source kinds ---------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Source negation and absolute value an opcode honours, by port."""

    neg: bool = False
    abs_: bool = False


def a_src(flags: Source = Source()) -> Slot:
    return reg(A, neg=A_NEG if flags.neg else None, abs_=A_ABS if flags.abs_ else None,
               reuse=0)


def port1(kind: str, flags: Source = Source(), *, style: str = "u") -> tuple[Slot, tuple]:
    """The source at bits 32..: register, immediate, constant or uniform register."""
    neg = B_NEG if flags.neg else None
    abs_ = B_ABS if flags.abs_ else None
    if kind == "R":
        return reg(B, neg=neg, abs_=abs_, reuse=1), ()
    if kind == "I":
        return imm(IMM32, style), ()
    if kind == "C":
        return cbuf(neg=neg, abs_=abs_), ()
    if kind == "U":
        return ureg(B, neg=neg, abs_=abs_), ((UNIFORM, 1),)
    raise ValueError(f"no source kind {kind!r}")


def port2(flags: Source = Source(), count: int = 1) -> Slot:
    return reg(C, neg=C_NEG if flags.neg else None, abs_=C_ABS if flags.abs_ else None,
               reuse=2, count=count)


# Bits 9..11 of an ALU opcode: where the second and third sources are.
TWO_SOURCE_KINDS = {"R": 1, "I": 4, "C": 5, "U": 6}
THIRD_SOURCE_KINDS = {"I": 2, "C": 3, "U": 7}


def alu_opcode(base: int, kinds: int) -> int:
    return base | kinds << 9


def three_source(shape: str, flags: Source, *, style: str = "u",
                 count_b: int = 1, count_c: int = 1) -> tuple[int, list[Slot], tuple]:
    """The (kind bits, [b, c], fixed fields) of a three-source ALU form.

    `shape` is the printed kinds of b and c: "RR", "IR", "CR", "UR" put b at port 1
    and c in port 2; "RI", "RC", "RU" put c at port 1 and b in port 2.
    """
    first, second = shape
    if second == "R":
        b, fixed = port1(first, flags, style=style)
        return TWO_SOURCE_KINDS[first], [b, port2(flags, count_c)], fixed
    if first != "R":
        raise ValueError(f"three-source shape {shape!r}: one of b, c must be a register")
    c, fixed = port1(second, flags, style=style)
    # b sits at 64..71 here but is still the second source: its reuse flag is port 1's.
    b = reg(C, neg=C_NEG if flags.neg else None, abs_=C_ABS if flags.abs_ else None,
            reuse=1, count=count_b)
    return THIRD_SOURCE_KINDS[second], [b, c], fixed


def form(name: str, mnemonic: str, opcode: int, operands: list[Slot] | tuple[Slot, ...],
         modifiers: tuple[Modifier, ...] = (), fixed: tuple = (), *,
         variable: bool = False, uniform: bool = False, unguarded: bool = False) -> Form:
    return Form(name, mnemonic, opcode, tuple(operands), tuple(modifiers), tuple(fixed),
                variable_latency=variable, uniform_guard=uniform, unguarded=unguarded)
