"""Print an instruction as nvdisasm prints it (its raw-binary mode, ``-b SM90``).

The printer follows nvdisasm's conventions, learned from its output: registers
R0..R254 and RZ, uniform registers UR0..UR62 and URZ, predicates P0..P6 and PT
with ``!`` for inversion; an integer immediate in hex (signed where the opcode
is arithmetic); a binary32 immediate with ``%.20g`` below 1e9 and ``%.20e`` from
there, ``+INF``, ``+QNAN``/``+SNAN``, ``-0.0``; branch targets as absolute
addresses; ``.reuse`` on an operand whose port has its reuse flag; and a few
aliases nvdisasm uses for IMAD (``IMAD.MOV``, ``IMAD.SHL``, ``IMAD.IADD``).
"""

from __future__ import annotations

import struct

from bob.isa.fields import INSTRUCTION_BYTES, Form, Kind, Slot, Table
from bob.isa.model import (
    PT,
    RZ,
    URZ,
    Barrier,
    CBuf,
    GMem,
    Imm,
    Instruction,
    Operand,
    Pred,
    Reg,
    SMem,
    SReg,
    Target,
    UPred,
    UReg,
)

SPECIAL_REGISTERS = {
    0x00: "SR_LANEID",
    0x21: "SR_TID.X", 0x22: "SR_TID.Y", 0x23: "SR_TID.Z",
    0x25: "SR_CTAID.X", 0x26: "SR_CTAID.Y", 0x27: "SR_CTAID.Z",
    0x2f: "SR_SWINHI",  # the shared window's high address bits (cluster shared memory)
    0x88: "SR_CgaCtaId",
}

# Opcodes whose carry or result predicate nvdisasm leaves out when it is PT.
HIDES_PT_RESULT = {"IADD3", "LEA", "LOP3.LUT"}

# nvdisasm switches a binary32 immediate to exponent form from this magnitude.
EXPONENT_FROM = 1e9


def binary32(bits_: int) -> str:
    sign = "-" if bits_ >> 31 else "+"
    exponent = bits_ >> 23 & 0xFF
    mantissa = bits_ & 0x7FFFFF
    if exponent == 0xFF:
        if mantissa == 0:
            return f"{sign}INF"
        return f"{sign}{'QNAN' if mantissa >> 22 else 'SNAN'}"
    if bits_ == 0x80000000:
        return "-0.0"
    value = struct.unpack("<f", struct.pack("<I", bits_))[0]
    if abs(value) >= EXPONENT_FROM:
        return f"{value:.20e}"
    return f"{value:.20g}"


def binary16(bits_: int) -> str:
    sign = "-" if bits_ >> 15 else "+"
    if bits_ >> 10 & 0x1F == 0x1F:
        if bits_ & 0x3FF == 0:
            return f"{sign}INF"
        return f"{sign}{'QNAN' if bits_ >> 9 & 1 else 'SNAN'}"
    if bits_ == 0x8000:
        return "-0.0"
    return f"{struct.unpack('<e', struct.pack('<H', bits_))[0]:.20g}"


def hex_signed(value: int, width: int) -> str:
    if value >> (width - 1):
        return f"-0x{(1 << width) - value:x}"
    return f"0x{value:x}"


def _register(name: str, reuse: bool, neg: bool = False, abs_: bool = False) -> str:
    text = f"|{name}|" if abs_ else name
    text += ".reuse" if reuse else ""
    return f"-{text}" if neg else text


def _cbuf_offset(operand: CBuf) -> str:
    # LDC's index register: nvdisasm prints RZ alone for a zero offset, else omits it.
    if operand.index is None or operand.index == RZ:
        if operand.index == RZ and operand.offset == 0:
            return "RZ"
        return f"0x{operand.offset:x}"
    return _address(f"R{operand.index}", operand.offset)


def _address(base: str, offset: int) -> str:
    if offset == 0:
        return base
    sign = "-" if offset < 0 else "+"
    return f"{base}{sign}0x{abs(offset):x}"


def operand_text(slot: Slot, operand: Operand, reuse: int, pc: int,
                 table: Table | None = None) -> str:
    reused = slot.reuse is not None and bool(reuse >> slot.reuse & 1)
    if isinstance(operand, Reg):
        name = "RZ" if operand.index == RZ else f"R{operand.index}"
        return _register(name, reused, operand.neg, operand.abs)
    if isinstance(operand, UReg):
        name = "URZ" if operand.index == URZ else f"UR{operand.index}"
        return _register(name, False, operand.neg, operand.abs)
    if isinstance(operand, Pred):
        return ("!" if operand.inverted else "") + ("PT" if operand.index == PT
                                                     else f"P{operand.index}")
    if isinstance(operand, UPred):
        return ("!" if operand.inverted else "") + ("UPT" if operand.index == PT
                                                     else f"UP{operand.index}")
    if isinstance(operand, Imm):
        if slot.kind is Kind.FIMM:
            return binary32(operand.value)
        if slot.style == "h":  # two binary16 values, the high half first
            return f"{binary16(operand.value >> 16)}, {binary16(operand.value & 0xFFFF)}"
        if slot.style == "s":
            return hex_signed(operand.value, slot.get("value").width)
        return f"0x{operand.value:x}"
    if isinstance(operand, CBuf):
        text = f"c[0x{operand.bank:x}][{_cbuf_offset(operand)}]"
        if operand.abs:
            text = f"|{text}|"
        return f"-{text}" if operand.neg else text
    if isinstance(operand, SReg):
        return SPECIAL_REGISTERS.get(operand.index, f"SR{operand.index}")
    if isinstance(operand, Target):
        return f"0x{pc + INSTRUCTION_BYTES + operand.offset:x}"
    if isinstance(operand, GMem):
        base = ("RZ" if operand.base == RZ else f"R{operand.base}") + ".64"
        # A negative global offset prints as "+-0x8" (nvdisasm's way).
        offset = f"+-0x{-operand.offset:x}" if operand.offset < 0 else (
            f"+0x{operand.offset:x}" if operand.offset else "")
        inner = f"[{base}{'.reuse' if reused else ''}{offset}]"
        if table is not None and not table.prints_descriptor:
            return inner
        return f"desc[UR{operand.desc}]{inner}"
    if isinstance(operand, SMem):
        scale = ".X4" if operand.x4 else ""
        parts = [] if operand.base == RZ else [
            f"R{operand.base}{scale}" + (".reuse" if reused else "")]
        if operand.ubase is not None:
            parts.append("URZ" if operand.ubase == URZ else f"UR{operand.ubase}")
        if not parts:
            return f"[0x{operand.offset:x}]" if operand.offset else "[RZ]"
        return f"[{_address('+'.join(parts), operand.offset)}]"
    if isinstance(operand, Barrier):
        return f"B{operand.index}"
    raise AssertionError(f"operand {operand!r}")


def mnemonic(form: Form, instruction: Instruction) -> str:
    """The mnemonic with its modifiers, and nvdisasm's IMAD aliases."""
    modifiers = list(instruction.modifiers)
    name = form.mnemonic
    if name == "IMAD":
        alias = _imad_alias(instruction)
        if alias:
            name = f"IMAD.{alias}"
    return ".".join([name, *modifiers])


def _imad_alias(instruction: Instruction) -> str | None:
    _, a, b, c = instruction.operands
    if isinstance(b, UReg) or isinstance(c, UReg):
        return None  # nvdisasm names no alias with a uniform source
    # A zero product, or a * 1 + 0: nvdisasm calls it a move.
    zero = (isinstance(a, Reg) and a.index == RZ) or (isinstance(b, Reg) and b.index == RZ)
    if zero or (isinstance(b, Imm) and b.value == 1 and isinstance(c, Reg) and c.index == RZ
                and not c.neg):
        return "MOV"
    if isinstance(b, Imm) and b.value == 1:
        return "IADD"
    if isinstance(b, Imm) and isinstance(c, Reg) and c.index == RZ and not c.neg \
            and b.value and b.value & (b.value - 1) == 0:
        return "SHL"
    return None


def render(instruction: Instruction, table: Table, pc: int = 0) -> str:
    """The instruction as nvdisasm prints it, without the address and the ';'."""
    form = table.form(instruction.form)
    guard = instruction.guard
    prefix = ""
    if guard.index != PT or guard.inverted:
        shown = UPred(guard.index, guard.inverted) if form.uniform_guard else guard
        prefix = "@" + operand_text(Slot(Kind.PRED, ()), shown, 0, pc) + " "
    shown = [(slot, operand) for slot, operand in zip(form.operands, instruction.operands,
                                                      strict=True)
             if not (form.mnemonic in HIDES_PT_RESULT and slot.written
                     and isinstance(operand, Pred) and operand.index == PT)
             and not (form.mnemonic == "BRA" and operand == Pred(PT))
             and not (form.mnemonic == "VOTE" and slot.written and operand == Reg(RZ))
             and not (form.mnemonic == "BPT.TRAP" and operand == Imm(0))]
    operands = ", ".join(operand_text(slot, operand, instruction.control.reuse, pc, table)
                         for slot, operand in shown)
    if form.mnemonic == "RET.REL.NODEC":  # nvdisasm prints no comma before the target
        operands = operands.replace(", ", " ")
    text = prefix + mnemonic(form, instruction)
    return f"{text} {operands}" if operands else text


def listing(instructions: list[Instruction], table: Table, base: int = 0) -> str:
    """A listing of consecutive instructions, one a line, with addresses and controls."""
    from bob.isa.control import describe

    lines = []
    for index, instruction in enumerate(instructions):
        pc = base + index * INSTRUCTION_BYTES
        lines.append(f"/*{pc:04x}*/  {describe(instruction.control):<22} "
                     f"{render(instruction, table, pc)} ;")
    return "\n".join(lines)
