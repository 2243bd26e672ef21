"""The opcode families Bob encodes, as form builders an architecture table calls.

Each function returns the forms of one opcode for the operand shapes asked for
(a shape is the printed kinds of the varying sources: "R" register, "I"
immediate, "C" constant, "U" uniform register). Opcode numbers and field
meanings are from Mesa NAK (sm70_encode.rs) where NAK has them, and otherwise
from what nvdisasm prints for ptxas's code; tests/test_isa_oracle.py checks every
form against nvdisasm.
"""

from __future__ import annotations

from collections.abc import Iterable

from bob.isa.fields import Bits, Field, Form, Kind, Modifier, Slot, bits
from bob.isa.forms import (
    A_NEG,
    BOOL_MOD,
    CB_BANK,
    CB_OFFSET,
    FALSE_PSRC,
    FALSE_PSRC2,
    FTZ_MOD,
    IMM32,
    NO_PDST,
    NO_PDST2,
    PDST,
    PDST2,
    PSRC,
    PSRC2,
    PSRC2_NOT,
    PSRC3,
    PSRC3_NOT,
    PSRC_NOT,
    ROUND,
    ROUND_MOD,
    SAT_MOD,
    TWO_SOURCE_KINDS,
    UNIFORM,
    A,
    B,
    C,
    Source,
    a_src,
    alu_opcode,
    cbuf,
    dst,
    flag,
    form,
    imm,
    modifier,
    pdst,
    port1,
    pred,
    reg,
    three_source,
    ureg,
)

FLOAT = Source(neg=True, abs_=True)
INTEGER_NEG = Source(neg=True)
PLAIN = Source()

# -- floating point ---------------------------------------------------------------------


def fadd(shapes: Iterable[str]) -> list[Form]:
    # FADD reads its second source through port 1 for a register and as the
    # third source otherwise (NAK: src2), so the kind bits differ from FMUL's.
    # A register second source sits at 32..39 but is reused through port 2.
    kinds = {"R": 1, "I": 2, "C": 3, "U": 7}
    forms = []
    for k in shapes:
        b, fixed = port1(k, FLOAT, style="f")
        if k == "R":
            b = Slot(b.kind, b.fields, reuse=2)
        forms.append(form(f"FADD.R{k}", "FADD", alu_opcode(0x021, kinds[k]),
                          [dst(), a_src(FLOAT), b], (FTZ_MOD, ROUND_MOD, SAT_MOD), fixed))
    return forms


# FMUL bits 84..86: 4 is a plain product (other values scale it: NAK "PDIV").
FMUL_SCALE = Field("scale", bits(84, 3), "scale the product (4: none)")


def fmul(shapes: Iterable[str]) -> list[Form]:
    return [form(f"FMUL.R{k}", "FMUL", alu_opcode(0x020, TWO_SOURCE_KINDS[k]),
                 [dst(), a_src(FLOAT), port1(k, FLOAT, style="f")[0]],
                 (FTZ_MOD, ROUND_MOD, SAT_MOD), (*port1(k, FLOAT)[1], (FMUL_SCALE, 4)))
            for k in shapes]


def ffma(shapes: Iterable[str]) -> list[Form]:
    forms = []
    for shape in shapes:
        kinds, (b, c), fixed = three_source(shape, FLOAT, style="f")
        forms.append(form(f"FFMA.R{shape}", "FFMA", alu_opcode(0x023, kinds),
                          [dst(), a_src(FLOAT), b, c], (FTZ_MOD, ROUND_MOD, SAT_MOD), fixed))
    return forms


NAN_BIT = Field("nan", bits(81, 1), "a NaN operand gives NaN")


def fmnmx(shapes: Iterable[str]) -> list[Form]:
    # The predicate picks the minimum (true) or the maximum (false).
    return [form(f"FMNMX.R{k}P", "FMNMX", alu_opcode(0x009, TWO_SOURCE_KINDS[k]),
                 [dst(), a_src(FLOAT), port1(k, FLOAT, style="f")[0], pred(PSRC, PSRC_NOT)],
                 (FTZ_MOD, flag(NAN_BIT, "NAN")), port1(k, FLOAT)[1])
            for k in shapes]


def fsel(shapes: Iterable[str]) -> list[Form]:
    return [form(f"FSEL.R{k}P", "FSEL", alu_opcode(0x008, TWO_SOURCE_KINDS[k]),
                 [dst(), a_src(FLOAT), port1(k, FLOAT, style="f")[0], pred(PSRC, PSRC_NOT)],
                 (FTZ_MOD,), port1(k, FLOAT)[1])
            for k in shapes]


FLOAT_COMPARE = Field("compare", bits(76, 4), "the comparison")
FLOAT_COMPARE_MOD = modifier(FLOAT_COMPARE, F=0, LT=1, EQ=2, LE=3, GT=4, NE=5, GE=6, NUM=7,
                             NAN=8, LTU=9, EQU=10, LEU=11, GTU=12, NEU=13, GEU=14, T=15)


def fsetp(shapes: Iterable[str]) -> list[Form]:
    return [form(f"FSETP.PPR{k}P", "FSETP", alu_opcode(0x00B, TWO_SOURCE_KINDS[k]),
                 [pdst(PDST), pdst(PDST2), a_src(FLOAT), port1(k, FLOAT, style="f")[0],
                  pred(PSRC, PSRC_NOT)],
                 (FLOAT_COMPARE_MOD, FTZ_MOD, BOOL_MOD), port1(k, FLOAT)[1])
            for k in shapes]


# Conversions and the multi-function unit read one source, through port 1.
DST_SIZE = Field("dst_size", bits(75, 2), "log2 of the result's bytes")
SRC_SIZE = Field("src_size", bits(84, 2), "log2 of the source's bytes")
F2I_SIGNED = Field("signed", bits(72, 1), "the integer result is signed")
F2I_NTZ = Field("ntz", bits(77, 1), "NTZ (ptxas sets it on every F2I it writes)")
WORD_SIZES = ((DST_SIZE, 2), (SRC_SIZE, 2))


def _no_reuse(slot: Slot) -> Slot:
    """The slot without a reuse port: the unit behind the opcode keeps no operand cache."""
    return Slot(slot.kind, slot.fields, slot.written, None, slot.count, slot.style)


def frnd(shapes: Iterable[str]) -> list[Form]:
    rounding = modifier(ROUND, _=0, FLOOR=1, CEIL=2, TRUNC=3)
    return [form(f"FRND.{k}", "FRND", alu_opcode(0x107, TWO_SOURCE_KINDS[k]),
                 [dst(), _no_reuse(port1(k, FLOAT, style="f")[0])], (FTZ_MOD, rounding),
                 (*port1(k, FLOAT)[1], *WORD_SIZES), variable=True)
            for k in shapes]


def f2i(shapes: Iterable[str]) -> list[Form]:
    signed = modifier(F2I_SIGNED, _=1, U32=0)
    rounding = modifier(ROUND, _=0, FLOOR=1, CEIL=2, TRUNC=3)
    return [form(f"F2I.{k}", "F2I", alu_opcode(0x105, TWO_SOURCE_KINDS[k]),
                 [dst(), _no_reuse(port1(k, FLOAT, style="f")[0])],
                 (FTZ_MOD, signed, rounding, flag(F2I_NTZ, "NTZ")),
                 (*port1(k, FLOAT)[1], *WORD_SIZES), variable=True)
            for k in shapes]


MUFU_FUNCTION = Field("function", bits(74, 6), "the function")
MUFU_MOD = modifier(MUFU_FUNCTION, COS=0, SIN=1, EX2=2, LG2=3, RCP=4, RSQ=5, SQRT=8, TANH=9)


def mufu(shapes: Iterable[str]) -> list[Form]:
    return [form(f"MUFU.{k}", "MUFU", alu_opcode(0x108, TWO_SOURCE_KINDS[k]),
                 [dst(), _no_reuse(port1(k, FLOAT, style="f")[0])], (MUFU_MOD,),
                 port1(k, FLOAT)[1],
                 variable=True)
            for k in shapes]


def fchk(shapes: Iterable[str]) -> list[Form]:
    # P = the division a / b needs the slow path (denormal, overflow, special values).
    return [form(f"FCHK.PR{k}", "FCHK", alu_opcode(0x102, TWO_SOURCE_KINDS[k]),
                 [pdst(), reg(A), _no_reuse(port1(k, PLAIN)[0])], (), port1(k, PLAIN)[1],
                 variable=True)
            for k in shapes]


# -- integer ----------------------------------------------------------------------------
IADD3_X = Field("x", bits(74, 1), "add the carries in (the high word of a wide add)")


def iadd3(shapes: Iterable[str], *, carry_out: int = 0) -> list[Form]:
    """IADD3 without carries, with `carry_out` carry predicates printed."""
    forms = []
    for shape in shapes:
        kinds, (b, c), fixed = three_source(shape, INTEGER_NEG, style="s")
        outs = [pdst(PDST), pdst(PDST2)][:carry_out]
        unused = (NO_PDST + NO_PDST2)[carry_out:]
        name = f"IADD3.R{'P' * carry_out}R{shape}R" if shape[1] != "R" else \
            f"IADD3.R{'P' * carry_out}R{shape}"
        forms.append(form(name, "IADD3", alu_opcode(0x010, kinds),
                          [dst(), *outs, a_src(INTEGER_NEG), b, c], (),
                          (*fixed, *unused, *FALSE_PSRC, *FALSE_PSRC2)))
    return forms


def iadd3_x(shapes: Iterable[str]) -> list[Form]:
    forms = []
    for shape in shapes:
        kinds, (b, c), fixed = three_source(shape, PLAIN, style="s")
        forms.append(form(f"IADD3.X.RR{shape}PP", "IADD3.X", alu_opcode(0x010, kinds),
                          [dst(), a_src(), b, c, pred(PSRC, PSRC_NOT), pred(PSRC2, PSRC2_NOT)],
                          (), (*fixed, *NO_PDST, *NO_PDST2, (IADD3_X, 1))))
    return forms


def _unsigned(slot: Slot) -> Slot:
    """The slot without its negation and absolute-value fields."""
    roles = tuple(r for r in slot.fields if r[0] not in ("neg", "abs"))
    return Slot(slot.kind, roles, slot.written, slot.reuse, slot.count, slot.style)


IMAD_SIGNED = Field("signed", bits(73, 1), "the operands are signed")
IMAD_SIGNED_MOD = modifier(IMAD_SIGNED, _=1, U32=0)


def imad(shapes: Iterable[str], *, wide: bool = False) -> list[Form]:
    """IMAD (d = a * b + c) and IMAD.WIDE (a 64-bit d and c)."""
    forms = []
    opcode = 0x025 if wide else 0x024
    mnemonic = "IMAD.WIDE" if wide else "IMAD"
    count = 2 if wide else 1
    for shape in shapes:
        kinds, (b, c), fixed = three_source(shape, INTEGER_NEG, style="s",
                                            count_c=count)
        # Only the addend negates (NAK: bit 75), wherever it sits.
        if shape[1] == "R":
            b = _unsigned(b)
        else:
            b, c = reg(C, reuse=1), _unsigned(c)
        forms.append(form(f"{mnemonic}.RR{shape}", mnemonic, alu_opcode(opcode, kinds),
                          [dst(count), a_src(), b, c], (IMAD_SIGNED_MOD,),
                          (*fixed, *NO_PDST, *FALSE_PSRC)))
    return forms


LEA_SHIFT = Field("shift", bits(75, 5), "the left shift of a")
LEA_HI = Field("hi", bits(80, 1), "shift the 64-bit value c:a, keep the high word")
LEA_X = Field("x", bits(74, 1), "add the carry in")
LEA_SX32 = Field("sx32", bits(73, 1), "sign-extend a to 64 bits first")


def lea(shapes: Iterable[str], *, carry_out: bool) -> list[Form]:
    """LEA d, [P,] a, b, shift: d = (a << shift) + b."""
    forms = []
    for k in shapes:
        b, fixed = port1(k, PLAIN)
        outs = [pdst(PDST)] if carry_out else []
        unused = () if carry_out else NO_PDST
        forms.append(form(f"LEA.R{'P' if carry_out else ''}R{k}", "LEA",
                          alu_opcode(0x011, TWO_SOURCE_KINDS[k]),
                          [dst(), *outs, a_src(), b, imm(LEA_SHIFT)], (),
                          (*fixed, *unused, *FALSE_PSRC, (C, 0xFF))))
    return forms


def lea_hi_x(shapes: Iterable[str]) -> list[Form]:
    """LEA.HI.X d, a, b, c, shift, P: the high word of (c:a << shift) + b + carry."""
    forms = []
    for k in shapes:
        b, fixed = port1(k, PLAIN)
        forms.append(form(f"LEA.HI.X.RR{k}RP", "LEA.HI.X",
                          alu_opcode(0x011, TWO_SOURCE_KINDS[k]),
                          [dst(), a_src(), b, reg(C), imm(LEA_SHIFT), pred(PSRC, PSRC_NOT)],
                          (), (*fixed, *NO_PDST, (LEA_HI, 1), (LEA_X, 1))))
    return forms


def lea_hi_sx32(shapes: Iterable[str]) -> list[Form]:
    """LEA.HI.SX32 d, a, b, shift: b + (sign-extended a >> (32 - shift))."""
    forms = []
    for k in shapes:
        b, fixed = port1(k, PLAIN)
        forms.append(form(f"LEA.HI.SX32.RR{k}", "LEA.HI.SX32",
                          alu_opcode(0x011, TWO_SOURCE_KINDS[k]),
                          [dst(), a_src(), b, imm(LEA_SHIFT)], (),
                          (*fixed, *NO_PDST, *FALSE_PSRC, (C, 0xFF), (LEA_HI, 1),
                           (LEA_SX32, 1))))
    return forms


SHF_RIGHT = Field("right", bits(76, 1), "shift right (else left)")
SHF_TYPE = Field("type", bits(73, 2), "the data type")
SHF_WRAP = Field("wrap", bits(75, 1), "the shift count wraps modulo the width")
SHF_HI = Field("hi", bits(80, 1), "keep the high word of the 64-bit result")


def shf(shapes: Iterable[str]) -> list[Form]:
    """SHF d, a, shift, c: a funnel shift of the 64-bit value c:a."""
    modifiers = (modifier(SHF_RIGHT, L=0, R=1), flag(SHF_WRAP, "W"),
                 modifier(SHF_TYPE, S64=0, U64=1, S32=2, U32=3), flag(SHF_HI, "HI"))
    forms = []
    for shape in shapes:
        kinds, (b, c), fixed = three_source(shape, PLAIN)
        forms.append(form(f"SHF.RR{shape}", "SHF", alu_opcode(0x019, kinds),
                          [dst(), a_src(), b, c], modifiers, fixed))
    return forms


LOP3_LUT = Field("lut", bits(72, 8), "the truth table of the three inputs")
LOP3_PAND = Field("pand", bits(80, 1), "the predicate is the AND of the result's bits")


def lop3(shapes: Iterable[str], *, predicate: bool) -> list[Form]:
    forms = []
    for shape in shapes:
        kinds, (b, c), fixed = three_source(shape, PLAIN)
        outs = [pdst(PDST)] if predicate else []
        unused = () if predicate else NO_PDST
        forms.append(form(f"LOP3.LUT.{'P' if predicate else ''}RR{shape}", "LOP3.LUT",
                          alu_opcode(0x012, kinds),
                          [*outs, dst(), a_src(), b, c, imm(LOP3_LUT), pred(PSRC, PSRC_NOT)],
                          (flag(LOP3_PAND, "PAND"),), (*fixed, *unused)))
    return forms


INT_COMPARE = Field("compare", bits(76, 3), "the comparison")
INT_COMPARE_MOD = modifier(INT_COMPARE, F=0, LT=1, EQ=2, LE=3, GT=4, NE=5, GE=6, T=7)
ISETP_SIGNED = Field("signed", bits(73, 1), "the operands are signed")
ISETP_EX = Field("ex", bits(72, 1), "extend an earlier comparison of the low words")


def isetp(shapes: Iterable[str], *, extended: bool = False) -> list[Form]:
    forms = []
    for k in shapes:
        b, fixed = port1(k, PLAIN, style="s")
        ops = [pdst(PDST), pdst(PDST2), a_src(), b, pred(PSRC, PSRC_NOT)]
        mods = [INT_COMPARE_MOD, modifier(ISETP_SIGNED, _=1, U32=0), BOOL_MOD]
        if extended:
            ops.append(pred(PSRC3, PSRC3_NOT))
            mods.append(Modifier(ISETP_EX, ((1, "EX"),)))
        else:
            fixed = (*fixed, (PSRC3, 7))
        forms.append(form(f"ISETP{'.EX' if extended else ''}.PPR{k}P{'P' if extended else ''}",
                          "ISETP", alu_opcode(0x00C, TWO_SOURCE_KINDS[k]), ops, tuple(mods),
                          fixed))
    return forms


def sel(shapes: Iterable[str]) -> list[Form]:
    return [form(f"SEL.R{k}P", "SEL", alu_opcode(0x007, TWO_SOURCE_KINDS[k]),
                 [dst(), a_src(), port1(k, PLAIN)[0], pred(PSRC, PSRC_NOT)], (),
                 port1(k, PLAIN)[1])
            for k in shapes]


MOV_LANES = Field("lanes", bits(72, 4), "the quad lanes written (15: all)")


def mov(shapes: Iterable[str]) -> list[Form]:
    return [form(f"MOV.{k}", "MOV", alu_opcode(0x002, TWO_SOURCE_KINDS[k]),
                 [dst(), port1(k, PLAIN)[0]], (),
                 (*port1(k, PLAIN)[1], (MOV_LANES, 0xF)))
            for k in shapes]


def viadd(shapes: Iterable[str]) -> list[Form]:
    """VIADD d, a, b: a 32-bit add (sm_90)."""
    return [form(f"VIADD.R{k}", "VIADD", alu_opcode(0x036, TWO_SOURCE_KINDS[k]),
                 [dst(), a_src(), port1(k, PLAIN)[0]], (), port1(k, PLAIN)[1])
            for k in shapes]


I2F_SIGNED = Field("signed", bits(74, 1), "the integer source is signed")


def i2fp(shapes: Iterable[str]) -> list[Form]:
    """I2FP.F32.S32 / .U32: an integer to binary32."""
    return [form(f"I2FP.F32.{k}", "I2FP.F32", alu_opcode(0x045, TWO_SOURCE_KINDS[k]),
                 [dst(), port1(k, PLAIN)[0]],
                 (modifier(I2F_SIGNED, U32=0, S32=1), modifier(ROUND, _=0, RZ=3)),
                 (*port1(k, PLAIN)[1], *WORD_SIZES))
            for k in shapes]


PLOP3_LUT = Field("plut", (Bits(64, 3), Bits(72, 5)), "the truth table of the first result")
PLOP3_LUT2 = Field("plut2", bits(16, 8), "the truth table of the second result")


VOTE_MODE = Field("vote", bits(72, 2), "what the predicate result says of the lanes")


def vote() -> list[Form]:
    """VOTE.mode R, P, Q: R := the ballot of Q over the warp's active lanes (RZ: none, not
    printed), P := whether all (ALL), any (ANY) or all or none (EQ) of them hold Q. The
    same in every lane: a branch guarded by P is uniform over the warp."""
    return [form("VOTE", "VOTE", 0x806, [dst(), pdst(PDST), pred(PSRC, PSRC_NOT)],
                 (modifier(VOTE_MODE, ALL=0, ANY=1, EQ=2),))]


def plop3() -> list[Form]:
    """PLOP3.LUT P, Q, a, b, c, lut, lut2: two logic functions of three predicates."""
    return [form("PLOP3.LUT", "PLOP3.LUT", 0x81C,
                 [pdst(PDST), pdst(PDST2), pred(PSRC, PSRC_NOT), pred(PSRC2, PSRC2_NOT),
                  pred(PSRC3, PSRC3_NOT), imm(PLOP3_LUT), imm(PLOP3_LUT2)])]


def hfma2_mma() -> list[Form]:
    """HFMA2.MMA d, a, b, (h1, h0): two binary16 FMAs; ptxas uses -RZ * RZ + c as a move."""
    return [form("HFMA2.MMA.RRRI", "HFMA2.MMA", alu_opcode(0x035, 2),
                 [dst(), reg(A, neg=A_NEG, reuse=0), reg(C, reuse=1), imm(IMM32, "h")])]


# -- uniform datapath -------------------------------------------------------------------
UDST = Field("udst", bits(16, 8), "the destination uniform register")
UA = Field("ua", bits(24, 8), "the first source uniform register")
UB = Field("ub", bits(32, 8), "the second source uniform register")
UC = Field("uc", bits(64, 8), "the third source uniform register")
UPDST = Field("updst", bits(81, 3), "the uniform predicate written (7: UPT)")
UPDST2 = Field("updst2", bits(84, 3), "the second uniform predicate written (7: UPT)")
UPSRC = Field("upsrc", bits(87, 3), "the uniform predicate read")
UPSRC_NOT = Field("upsrc_not", bits(90, 1), "invert the uniform predicate read")
UPSRC2 = Field("upsrc2", bits(77, 3), "the second uniform predicate read")
UPSRC2_NOT = Field("upsrc2_not", bits(80, 1), "invert the second uniform predicate read")


def udst(count: int = 1) -> Slot:
    return ureg(UDST, written=True, count=count)


def umov(shapes: Iterable[str]) -> list[Form]:
    # UMOV is encoded like a warp-wide ALU op with a uniform source (NAK).
    forms = []
    for k in shapes:
        source = ureg(UB) if k == "U" else imm(IMM32)
        fixed = ((UNIFORM, 1),) if k == "U" else ()
        forms.append(form(f"UMOV.{k}", "UMOV", alu_opcode(0x082, TWO_SOURCE_KINDS[k]),
                          [udst(), source], (), fixed, uniform=True))
    return forms


def uiadd3(shapes: Iterable[str]) -> list[Form]:
    forms = []
    for shape in shapes:
        first, second = shape
        if second == "R":
            kinds = TWO_SOURCE_KINDS["R" if first == "U" else first]
            b = ureg(UB) if first == "U" else imm(IMM32, "s")
            c = ureg(UC)
        else:
            kinds = 2
            b, c = ureg(UC), imm(IMM32, "s")
        forms.append(form(f"UIADD3.UU{shape}", "UIADD3", alu_opcode(0x090, kinds),
                          [udst(), ureg(UA), b, c], (),
                          ((UNIFORM, 1), (UPDST, 7), (UPDST2, 7), (UPSRC, 7), (UPSRC_NOT, 1),
                           (UPSRC2, 7), (UPSRC2_NOT, 1)), uniform=True))
    return forms


def uimad_wide(signed: bool = False) -> list[Form]:
    return [form("UIMAD.WIDE.UUUU", "UIMAD.WIDE", alu_opcode(0x0A5, 1),
                 [udst(2), ureg(UA), ureg(UB), ureg(UC, count=2)], (IMAD_SIGNED_MOD,),
                 ((UNIFORM, 1), (UPDST, 7), (UPSRC, 7), (UPSRC_NOT, 1)), uniform=True)]


REDUX_OP = Field("op", bits(78, 3), "the reduction")
REDUX_SIGNED = Field("signed", bits(73, 1), "the operands are signed (MIN, MAX)")


def redux() -> list[Form]:
    """REDUX.op UR, R: a warp-wide reduction into a uniform register."""
    return [form("REDUX", "REDUX", 0x3C4, [udst(), reg(A)],
                 (modifier(REDUX_OP, _=0, OR=1, XOR=2, SUM=3, MIN=4, MAX=5),
                  modifier(REDUX_SIGNED, _=0, S32=1)), variable=True)]


def ulea() -> list[Form]:
    return [form("ULEA.UUU", "ULEA", alu_opcode(0x091, 1),
                 [udst(), ureg(UA), ureg(UB), imm(LEA_SHIFT)], (),
                 ((UNIFORM, 1), (UPDST, 7), (UPSRC, 7), (UPSRC_NOT, 1), (UC, 63)),
                 uniform=True)]


# -- constants, special registers -------------------------------------------------------
LOAD_SIZE = Field("size", bits(73, 3), "the access size")
LOAD_SIZE_MOD = modifier(LOAD_SIZE, U8=0, S8=1, U16=2, S16=3, _=4, **{"64": 5, "128": 6})
CONSTANT_SIZE_MOD = modifier(LOAD_SIZE, U8=0, S8=1, U16=2, S16=3, _=4, **{"64": 5})


LDC_MODE = Field("mode", bits(78, 2), "the indexing mode (0: plain)")


def ldc() -> list[Form]:
    """LDC d, c[bank][R + offset]: a constant word at a register index (RZ for none)."""
    word = Slot(Kind.CBUF, (("value", CB_OFFSET), ("bank", CB_BANK), ("index", A)), reuse=0)
    return [form("LDC", "LDC", 0xB82, [dst(), word], (CONSTANT_SIZE_MOD,), ((LDC_MODE, 0),),
                 variable=True)]


def uldc() -> list[Form]:
    return [form("ULDC", "ULDC", 0xAB9, [udst(), cbuf()], (CONSTANT_SIZE_MOD,), uniform=True)]


SPECIAL = Field("special", bits(72, 8), "the special register")


def s2r() -> list[Form]:
    return [form("S2R", "S2R", 0x919, [dst(), Slot(Kind.SREG, (("value", SPECIAL),))],
                 variable=True)]


def s2ur() -> list[Form]:
    return [form("S2UR", "S2UR", 0x9C3, [udst(), Slot(Kind.SREG, (("value", SPECIAL),))],
                 variable=True, uniform=True)]


# -- memory -----------------------------------------------------------------------------
MEM_OFFSET = Field("offset", bits(40, 24), "the address offset in bytes", signed=True)
MEM_WIDE = Field("wide", bits(72, 1), "a 64-bit address")
EVICTION = Field("eviction", bits(84, 3), "the L2 eviction priority")
EVICTION_MOD = modifier(EVICTION, EF=0, _=1, EL=2, LU=3, EU=4, NA=5)
GLOBAL_E = Field("extended", bits(76, 1), "the .E address form ptxas writes (set)")
DESC_LOAD = Field("desc", bits(32, 8), "the uniform register holding the memory descriptor")
DESC_STORE = Field("desc_store", bits(64, 8),
                   "the uniform register holding the memory descriptor")
# Bits 90 and 91 of a global access with a descriptor: both set on every one ptxas
# writes.
DESC_BITS = Field("desc_bits", bits(90, 2), "the descriptor form (3 in ptxas's code)")


def gmem(desc: Field) -> Slot:
    return Slot(Kind.GMEM, (("value", A), ("offset", MEM_OFFSET), ("desc", desc)), count=2)


def ldg() -> list[Form]:
    return [form("LDG.E", "LDG.E", 0x981, [dst(), gmem(DESC_LOAD)],
                 (EVICTION_MOD, LOAD_SIZE_MOD),
                 ((MEM_WIDE, 1), (GLOBAL_E, 1), (PDST, 7), (DESC_BITS, 3)), variable=True)]


def stg() -> list[Form]:
    return [form("STG.E", "STG.E", 0x986, [gmem(DESC_STORE), reg(B)],
                 (EVICTION_MOD, LOAD_SIZE_MOD), ((MEM_WIDE, 1), (GLOBAL_E, 1), (DESC_BITS, 3)),
                 variable=True)]


# RED (REDG on sm_90): a reduction into global memory with no result. Its descriptor is 6
# bits at 64..69 with bit 71 saying it is one (clear: [R.64+UR], an address offset).
RED_DESC = Field("red_desc", bits(64, 6), "the uniform register holding the memory descriptor")
RED_DESC_FORM = Field("red_desc_form", bits(71, 1), "the uniform register is a descriptor")
ATOM_TYPE = Field("atom_type", bits(73, 4), "the operand type (2: unsigned 64-bit)")
MEMORY_ORDER = Field("order", bits(77, 4), "ordering and scope (7: STRONG.GPU)")
ATOM_OP = Field("atom_op", bits(87, 3), "the operation (0: ADD)")


def red_add_u64(mnemonic: str) -> list[Form]:
    """RED.E.ADD.64.STRONG.GPU [R.64], R: an atomic unsigned 64-bit add to global memory,
    as ptxas writes atomicAdd on an unsigned long long whose result is unused (nvdisasm
    names it REDG on sm_90, RED on sm_86)."""
    address = Slot(Kind.GMEM, (("value", A), ("offset", MEM_OFFSET), ("desc", RED_DESC)),
                   count=2)
    return [form("RED.E.ADD.64", f"{mnemonic}.E.ADD.64.STRONG.GPU", 0x98E,
                 [address, reg(B, count=2)], (),
                 ((RED_DESC_FORM, 1), (MEM_WIDE, 1), (ATOM_TYPE, 2), (MEMORY_ORDER, 7),
                  (EVICTION, 1), (ATOM_OP, 0), (DESC_BITS, 3)), variable=True)]


SMEM_X4 = Field("x4", bits(78, 1), "the address register counts 4-byte words")


def smem(ubase: Field | None = None) -> Slot:
    roles = [("value", A), ("offset", MEM_OFFSET), ("x4", SMEM_X4)]
    if ubase is not None:
        roles.append(("ubase", ubase))
    return Slot(Kind.SMEM, tuple(roles))


# A shared address may add a uniform register (bit 91 says so): at 32..39 for a
# load, at 64..71 for a store, whose data is at 32..39.
SMEM_ULOAD = Field("ubase", bits(32, 8), "the uniform register added to the address")
SMEM_USTORE = Field("ubase_store", bits(64, 8), "the uniform register added to the address")


def lds() -> list[Form]:
    return [form("LDS", "LDS", 0x984, [dst(), smem()], (LOAD_SIZE_MOD,), variable=True),
            form("LDS.U", "LDS", 0x984, [dst(), smem(SMEM_ULOAD)], (LOAD_SIZE_MOD,),
                 ((UNIFORM, 1),), variable=True)]


def sts() -> list[Form]:
    return [form("STS", "STS", 0x388, [smem(), reg(B)], (LOAD_SIZE_MOD,),
                 variable=True),
            form("STS.U", "STS", 0x988, [smem(SMEM_USTORE), reg(B)], (LOAD_SIZE_MOD,),
                 ((UNIFORM, 1),), variable=True)]


SHFL_MODE = Field("mode", bits(58, 2), "the shuffle")
SHFL_MOD = modifier(SHFL_MODE, IDX=0, UP=1, DOWN=2, BFLY=3)
SHFL_LANE = Field("lane", bits(53, 5), "the lane (or lane offset) immediate")
SHFL_CLAMP = Field("clamp", bits(40, 13), "the segment mask and clamp immediate")


def shfl() -> list[Form]:
    """SHFL P, d, a, lane, clamp: lane and clamp each a register or an immediate."""
    shapes = {"RR": 0x389, "RI": 0x589, "IR": 0x989, "II": 0xF89}
    forms = []
    for shape, opcode in shapes.items():
        # No reuse flags: nvdisasm refuses them on SHFL.
        lane = reg(B) if shape[0] == "R" else imm(SHFL_LANE)
        clamp = reg(C) if shape[1] == "R" else imm(SHFL_CLAMP)
        forms.append(form(f"SHFL.PRR{shape}", "SHFL", opcode,
                          [pdst(), dst(), reg(A), lane, clamp], (SHFL_MOD,), variable=True))
    return forms


# -- control ----------------------------------------------------------------------------
BAR_ID = Field("barrier", bits(54, 4), "the barrier")
BAR_DEFER = Field("defer", bits(80, 1), "DEFER_BLOCKING (set by ptxas on every bar.sync)")
BAR_THREADS = Field("threads", bits(42, 12), "the threads the barrier waits for (0: the block)")


def bar() -> list[Form]:
    """BAR.SYNC id, and BAR.SYNC id, threads: a barrier of part of the block (bar.sync
    id, n), the threads a nonzero count (zero is the first form)."""
    return [form("BAR.SYNC.I", "BAR.SYNC.DEFER_BLOCKING", 0xB1D, [imm(BAR_ID)], (),
                 ((BAR_DEFER, 1),), variable=True),
            form("BAR.SYNC.II", "BAR.SYNC.DEFER_BLOCKING", 0xB1D,
                 [imm(BAR_ID), imm(BAR_THREADS, style="n")], (), ((BAR_DEFER, 1),),
                 variable=True)]


BRANCH_PSRC = ((PSRC, 7),)


def exit_() -> list[Form]:
    return [form("EXIT", "EXIT", 0x94D, [], (), BRANCH_PSRC)]


def nop() -> list[Form]:
    return [form("NOP", "NOP", 0x918, [])]


def target(offset: Field) -> Slot:
    return Slot(Kind.TARGET, (("value", offset),))


CONVERGENCE_BARRIER = Field("convergence_barrier", bits(16, 4), "the convergence barrier")
BSSY_OFFSET = Field("bssy_offset", bits(34, 30),
                    "where the threads reconverge: 4-byte units from the next instruction",
                    signed=True)


def bssy() -> list[Form]:
    """BSSY B, target: the threads that reach BSYNC B wait for the rest there."""
    barrier = Slot(Kind.BARRIER, (("value", CONVERGENCE_BARRIER),), written=True)
    return [form("BSSY", "BSSY", 0x945, [barrier, target(BSSY_OFFSET)], (), BRANCH_PSRC)]


def bsync() -> list[Form]:
    barrier = Slot(Kind.BARRIER, (("value", CONVERGENCE_BARRIER),))
    return [form("BSYNC", "BSYNC", 0x941, [barrier], (), BRANCH_PSRC)]


CALL_RELATIVE = Field("relative", bits(86, 1), "the .REL form ptxas writes (set)")


def call(offset: Field) -> list[Form]:
    return [form("CALL.REL.NOINC", "CALL.REL.NOINC", 0x944, [target(offset)], (),
                 (*BRANCH_PSRC, (CALL_RELATIVE, 1)))]


def ret(offset: Field) -> list[Form]:
    """RET.REL.NODEC R, target: return to the address in R (the target names the function)."""
    return [form("RET.REL.NODEC", "RET.REL.NODEC", 0x950, [reg(A), target(offset)], (),
                 (*BRANCH_PSRC, (CALL_RELATIVE, 1)))]


TRAP_CODE = Field("code", bits(34, 3), "the breakpoint's code")
TRAP_MODE = Field("trap", bits(84, 2), "TRAP (3): stop the grid with an error")


def bpt() -> list[Form]:
    return [form("BPT.TRAP", "BPT.TRAP", 0x95C, [imm(TRAP_CODE)], (), ((TRAP_MODE, 3),),
                 unguarded=True)]


def bra(offset: Field) -> list[Form]:
    """BRA target and BRA P, target (taken where the guard and P both hold)."""
    return [form("BRA.L", "BRA", 0x947, [target(offset)], (), BRANCH_PSRC),
            form("BRA.PL", "BRA", 0x947, [pred(PSRC, PSRC_NOT), target(offset)])]
