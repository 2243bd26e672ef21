"""Encode an `Instruction` into 16 bytes and decode 16 bytes back, by a form table.

Decoding is strict: it returns an instruction only where some form of the
table accounts for every set bit (its opcode, its fields, its fixed values and
the control bits), so decoding then encoding gives the same bytes. Anything
else raises `NotInSubset` with the reason, and the caller lists it.
"""

from __future__ import annotations

from bob.isa.control import LONGEST_YIELDING_STALL, read_control, write_control
from bob.isa.fields import (
    CONTROL_LOW,
    GUARD,
    GUARD_NOT,
    INSTRUCTION_BYTES,
    OPCODE,
    FieldError,
    Form,
    Kind,
    Slot,
    Table,
)
from bob.isa.model import (
    PT,
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

BODY_MASK = (1 << CONTROL_LOW) - 1


class NotInSubset(ValueError):
    """The bytes are no form of the table (an opcode or form Bob does not encode)."""


class EncodeError(ValueError):
    """The instruction does not fit its form: the message names the form and operand."""


# -- decoding -------------------------------------------------------------------------


def decode(data: bytes, table: Table) -> Instruction:
    if len(data) != INSTRUCTION_BYTES:
        raise NotInSubset(f"an instruction is {INSTRUCTION_BYTES} bytes, not {len(data)}")
    word = int.from_bytes(data, "little")
    try:
        control = read_control(word)
    except FieldError as error:
        raise NotInSubset(str(error)) from None
    body = word & BODY_MASK
    opcode = OPCODE.read(body)
    candidates = table.candidates(opcode)
    if not candidates:
        raise NotInSubset(f"opcode 0x{opcode:03x} is not in the {table.arch} table")
    reasons = []
    for form in candidates:
        instruction, reason = _try_form(form, body, table)
        if instruction is not None:
            return Instruction(instruction.form, instruction.operands, instruction.modifiers,
                               instruction.guard, control)
        reasons.append(f"{form.name}: {reason}")
    raise NotInSubset("; ".join(reasons))


def _try_form(form: Form, body: int, table: Table) -> tuple[Instruction | None, str]:
    stray = body & ~form.mask
    if stray:
        low = (stray & -stray).bit_length() - 1
        return None, f"bit {low} is set and no field of the form covers it"
    for field, value in form.fixed:
        if field.read(body) != value:
            return None, f"{field.name} is {field.read(body)}, the form needs {value}"
    modifiers = []
    for modifier in form.modifiers:
        text = modifier.text(modifier.field.read(body))
        if text is None:
            return None, f"{modifier.field.name} = {modifier.field.read(body)} has no name"
        if text:
            modifiers.append(text)
    operands = tuple(_read_operand(slot, body, table) for slot in form.operands)
    guard = Pred(GUARD.read(body), bool(GUARD_NOT.read(body)))
    return Instruction(form.name, operands, tuple(modifiers), guard), ""


def _flag(slot: Slot, role: str, body: int) -> bool:
    field = slot.get(role)
    return bool(field.read(body)) if field is not None else False


def _read_operand(slot: Slot, body: int, table: Table) -> Operand:
    value = slot.get("value").read(body)
    kind = slot.kind
    if kind is Kind.REG:
        return Reg(value, _flag(slot, "neg", body), _flag(slot, "abs", body))
    if kind is Kind.UREG:
        return UReg(value, _flag(slot, "neg", body), _flag(slot, "abs", body))
    if kind is Kind.PRED:
        return Pred(value, _flag(slot, "not", body))
    if kind is Kind.UPRED:
        return UPred(value, _flag(slot, "not", body))
    if kind in (Kind.IMM, Kind.FIMM):
        return Imm(value)
    if kind is Kind.CBUF:
        index = slot.get("index")
        return CBuf(slot.get("bank").read(body), value, _flag(slot, "neg", body),
                    _flag(slot, "abs", body), index.read(body) if index is not None else None)
    if kind is Kind.SREG:
        return SReg(value)
    if kind is Kind.TARGET:
        return Target(value * table.target_unit)
    if kind is Kind.GMEM:
        return GMem(value, slot.get("offset").read(body), slot.get("desc").read(body))
    if kind is Kind.SMEM:
        ubase = slot.get("ubase")
        return SMem(value, slot.get("offset").read(body),
                    ubase.read(body) if ubase is not None else None,
                    _flag(slot, "x4", body))
    if kind is Kind.BARRIER:
        return Barrier(value)
    raise AssertionError(f"slot kind {kind}")


# -- encoding -------------------------------------------------------------------------


def encode(instruction: Instruction, table: Table) -> bytes:
    form = table.form(instruction.form)
    if len(instruction.operands) != len(form.operands):
        raise EncodeError(f"{form.name} takes {len(form.operands)} operands, "
                          f"not {len(instruction.operands)}")
    if form.unguarded and instruction.guard != Pred(PT):
        raise EncodeError(f"{form.name} takes no guard: a guarded one is an illegal "
                          "instruction (branch around it)")
    if not instruction.control.defined:
        raise EncodeError(f"{form.name}: a stall of {instruction.control.stall} with the yield "
                          f"bit set is no encoding (1 to {LONGEST_YIELDING_STALL} with it)")
    word = OPCODE.write(0, form.opcode)
    try:
        word = GUARD.write(word, instruction.guard.index)
        word = GUARD_NOT.write(word, int(instruction.guard.inverted))
        for field, value in form.fixed:
            word = field.write(word, value)
        word = _write_modifiers(form, instruction.modifiers, word)
        for position, (slot, operand) in enumerate(zip(form.operands, instruction.operands,
                                                       strict=True)):
            word = _write_operand(form, position, slot, operand, word, table)
        ports = {slot.reuse for slot in form.operands if slot.reuse is not None}
        stray = [port for port in range(4)
                 if instruction.control.reuse >> port & 1 and port not in ports]
        if stray:  # nvdisasm refuses these: the port reads no register here
            raise EncodeError(f"{form.name}: reuse flag {stray[0]} names a port the form "
                              "reads no register through")
        control = instruction.control
        if not form.variable_latency and (control.write is not None or control.read is not None):
            # nvdisasm refuses it, and ptxas never sets one: nothing would release it.
            raise EncodeError(f"{form.name}: a fixed-latency instruction takes no scoreboard")
        if control.write is not None and not any(slot.written for slot in form.operands):
            raise EncodeError(f"{form.name} writes no register: it takes no write scoreboard")
        word = write_control(word, control)
    except FieldError as error:
        raise EncodeError(f"{form.name}: {error}") from None
    return word.to_bytes(INSTRUCTION_BYTES, "little")


def _write_modifiers(form: Form, modifiers: tuple[str, ...], word: int) -> int:
    """Each modifier field from the next printed modifier it names, else its default."""
    position = 0
    for modifier in form.modifiers:
        text = modifiers[position] if position < len(modifiers) else None
        raw = modifier.raw(text) if text else None
        if raw is not None:
            position += 1
        else:
            raw = modifier.raw("")
            if raw is None:
                names = ", ".join(name for _, name in modifier.names)
                raise EncodeError(f"{form.name}: modifier {modifier.field.name} needs one of "
                                  f"{names}, got {text!r}")
        word = modifier.field.write(word, raw)
    if position != len(modifiers):
        raise EncodeError(f"{form.name}: modifiers {modifiers[position:]} are not the form's "
                          f"(it takes {[m.field.name for m in form.modifiers]}, in order)")
    return word


_OPERAND_TYPES = {
    Kind.REG: Reg, Kind.UREG: UReg, Kind.PRED: Pred, Kind.UPRED: UPred, Kind.IMM: Imm,
    Kind.FIMM: Imm, Kind.CBUF: CBuf, Kind.SREG: SReg, Kind.TARGET: Target, Kind.GMEM: GMem,
    Kind.SMEM: SMem, Kind.BARRIER: Barrier,
}


def _set_flag(form: Form, position: int, slot: Slot, role: str, value: bool,
              word: int) -> int:
    field = slot.get(role)
    if field is None:
        if value:
            raise EncodeError(f"{form.name} operand {position}: the form has no {role} here")
        return word
    return field.write(word, int(value))


def _write_operand(form: Form, position: int, slot: Slot, operand: Operand, word: int,
                   table: Table) -> int:
    expected = _OPERAND_TYPES[slot.kind]
    if not isinstance(operand, expected):
        raise EncodeError(f"{form.name} operand {position} is a {slot.kind.name}, "
                          f"not {operand!r}")
    value_field = slot.get("value")
    if isinstance(operand, (Reg, UReg, CBuf)):
        word = _set_flag(form, position, slot, "neg", operand.neg, word)
        word = _set_flag(form, position, slot, "abs", operand.abs, word)
    if isinstance(operand, (Reg, UReg, SReg, Barrier)):
        return value_field.write(word, operand.index)
    if isinstance(operand, (Pred, UPred)):
        word = _set_flag(form, position, slot, "not", operand.inverted, word)
        return value_field.write(word, operand.index)
    if isinstance(operand, Imm):
        if slot.style == "n" and operand.value == 0:
            raise EncodeError(f"{form.name} operand {position} is never zero")
        return value_field.write(word, operand.value)
    if isinstance(operand, CBuf):
        index = slot.get("index")
        if (index is None) != (operand.index is None):
            raise EncodeError(f"{form.name}: the constant {'needs' if index else 'takes no'} "
                              "index register")
        if index is not None:
            word = index.write(word, operand.index)
        word = slot.get("bank").write(word, operand.bank)
        return value_field.write(word, operand.offset)
    if isinstance(operand, Target):
        if operand.offset % table.target_unit:
            raise EncodeError(f"{form.name}: branch offset {operand.offset} is not a multiple "
                              f"of {table.target_unit}")
        return value_field.write(word, operand.offset // table.target_unit)
    if isinstance(operand, GMem):
        word = slot.get("offset").write(word, operand.offset)
        word = slot.get("desc").write(word, operand.desc)
        return value_field.write(word, operand.base)
    if isinstance(operand, SMem):
        word = slot.get("offset").write(word, operand.offset)
        word = _set_flag(form, position, slot, "x4", operand.x4, word)
        ubase = slot.get("ubase")
        if (ubase is None) != (operand.ubase is None):
            raise EncodeError(f"{form.name}: the address {'needs' if ubase else 'takes no'} "
                              "uniform register")
        if ubase is not None:
            word = ubase.write(word, operand.ubase)
        return value_field.write(word, operand.base)
    raise AssertionError(f"operand {operand!r}")


def decode_program(code: bytes, table: Table) -> list[Instruction | NotInSubset]:
    """Each 16-byte instruction of `code`, decoded, or the reason it is not in the subset."""
    if len(code) % INSTRUCTION_BYTES:
        raise NotInSubset(f"code of {len(code)} bytes is not whole instructions")
    out: list[Instruction | NotInSubset] = []
    for offset in range(0, len(code), INSTRUCTION_BYTES):
        try:
            out.append(decode(code[offset:offset + INSTRUCTION_BYTES], table))
        except NotInSubset as error:
            out.append(error)
    return out
