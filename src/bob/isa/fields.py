"""Typed field tables for 128-bit Volta-and-later instructions.

An instruction is one little-endian 128-bit integer: bit 0 is bit 0 of its
first byte. A field is a run of bits, or several runs read low part first
(the sm_90 branch offset is split in two). A form is one encoding of one
opcode: its fixed opcode bits, the fields its operands and modifiers live in,
and the bits that must hold a fixed value. Every bit of an instruction that no
field of its form names must be zero, so a decoded form re-encodes to the
same bytes or the decoder says it does not know the instruction.

The bit positions are facts from public sources (Mesa's NAK compiler,
``sm70_encode.rs``) checked against NVIDIA's disassembler (tests/test_isa_*).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

INSTRUCTION_BITS = 128
INSTRUCTION_BYTES = 16


class FieldError(ValueError):
    """A value that does not fit its field, or a field table that contradicts itself."""


@dataclass(frozen=True)
class Bits:
    """One run of bits: `width` bits from bit `low`."""

    low: int
    width: int

    @property
    def high(self) -> int:
        return self.low + self.width - 1

    @property
    def mask(self) -> int:
        return ((1 << self.width) - 1) << self.low


@dataclass(frozen=True)
class Field:
    """A named field: its runs (the value's low bits in the first run) and what it means."""

    name: str
    runs: tuple[Bits, ...]
    meaning: str
    signed: bool = False

    @property
    def width(self) -> int:
        return sum(run.width for run in self.runs)

    @property
    def mask(self) -> int:
        mask = 0
        for run in self.runs:
            mask |= run.mask
        return mask

    def read(self, word: int) -> int:
        value = 0
        shift = 0
        for run in self.runs:
            value |= ((word >> run.low) & ((1 << run.width) - 1)) << shift
            shift += run.width
        if self.signed and value >> (self.width - 1):
            value -= 1 << self.width
        return value

    def write(self, word: int, value: int) -> int:
        """`word` with this field set to `value`; FieldError where it does not fit."""
        width = self.width
        low, high = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if self.signed else (
            0, (1 << width) - 1)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            where = ", ".join(f"{run.high}:{run.low}" for run in self.runs)
            raise FieldError(f"field {self.name} (bits {where}, {width} bits"
                             f"{', signed' if self.signed else ''}) cannot hold {value!r}")
        value &= (1 << width) - 1
        for run in self.runs:
            word = (word & ~run.mask) | ((value & ((1 << run.width) - 1)) << run.low)
            value >>= run.width
        return word


def bits(low: int, width: int) -> tuple[Bits, ...]:
    return (Bits(low, width),)


class Kind(Enum):
    """What an operand slot holds, and so how its fields read."""

    REG = "R"  # a general register, R0..R254 and RZ (255)
    UREG = "UR"  # a uniform register, UR0..UR62 and URZ (63)
    PRED = "P"  # a predicate, P0..P6 and PT (7)
    UPRED = "UP"  # a uniform predicate, UP0..UP6 and UPT (7)
    IMM = "I"  # a 32-bit immediate, shown as an integer
    FIMM = "F"  # a 32-bit immediate, shown as a binary32
    CBUF = "C"  # a constant-bank word c[bank][offset]
    SREG = "SR"  # a special register (SR_TID.X...)
    TARGET = "L"  # a branch target: an offset from the next instruction
    GMEM = "G"  # a global address: desc[UR][R.64 + offset] (sm_90) or [R.64 + offset]
    SMEM = "S"  # a shared address: [R + offset]
    BARRIER = "B"  # a convergence barrier B0..B15


@dataclass(frozen=True)
class Slot:
    """One operand of a form: its kind, whether it is written, and its fields by role.

    Roles: "value" always; where the operand has them "neg", "abs", "not" (a
    predicate's inversion), "bank" (a constant bank), "desc" (a memory
    descriptor), "offset" (an address offset). `reuse` is the operand-reuse
    bit (0..3) of the register port the operand is read through; `count` is how
    many consecutive registers it covers (2 for a 64-bit value); `style` says how
    an immediate prints: "u" unsigned hex, "s" signed hex, "f" a binary32, "n" unsigned
    hex never zero (a zero there is another form's encoding).
    """

    kind: Kind
    fields: tuple[tuple[str, Field], ...]
    written: bool = False
    reuse: int | None = None
    count: int = 1
    style: str = "u"

    def get(self, role: str) -> Field | None:
        for name, field_ in self.fields:
            if name == role:
                return field_
        return None


@dataclass(frozen=True)
class Modifier:
    """A modifier field: each raw value and the text it adds to the mnemonic ("" for none)."""

    field: Field
    names: tuple[tuple[int, str], ...]

    def text(self, raw: int) -> str | None:
        for value, name in self.names:
            if value == raw:
                return name
        return None

    def raw(self, text: str) -> int | None:
        for value, name in self.names:
            if name == text:
                return value
        return None


@dataclass(frozen=True)
class Form:
    """One encoding of one opcode on one architecture: its field table.

    `fields` is derived: the opcode and guard, then every field an operand,
    modifier or fixed value names, each once; they may not overlap.
    """

    name: str  # unique in its table: the mnemonic and operand kinds, "FADD.RRI"
    mnemonic: str
    opcode: int  # bits 0..11
    operands: tuple[Slot, ...]
    modifiers: tuple[Modifier, ...] = ()
    fixed: tuple[tuple[Field, int], ...] = ()  # fields that must hold one value
    variable_latency: bool = False  # results arrive through a scoreboard
    uniform_guard: bool = False  # the guard is a uniform predicate (@UP0)
    # The hardware takes no guard: a guarded one is an illegal instruction encoding at
    # issue, even where the guard is false (BPT.TRAP on the H200; ptxas branches around it).
    unguarded: bool = False
    fields: tuple[Field, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        named = [OPCODE, GUARD, GUARD_NOT]
        for slot in self.operands:
            named.extend(f for _, f in slot.fields)
        named.extend(m.field for m in self.modifiers)
        named.extend(f for f, _ in self.fixed)
        seen = 0
        table: list[Field] = []
        for f in named:
            if f in table:
                continue
            if any(other.name == f.name for other in table):
                raise FieldError(f"form {self.name}: two fields are named {f.name}")
            if seen & f.mask:
                raise FieldError(f"form {self.name}: field {f.name} overlaps another")
            if f.mask >> CONTROL_LOW:
                raise FieldError(f"form {self.name}: field {f.name} reaches the control bits")
            seen |= f.mask
            table.append(f)
        for f, value in self.fixed:
            f.write(0, value)  # raises where the fixed value does not fit
        object.__setattr__(self, "fields", tuple(table))

    @property
    def mask(self) -> int:
        """Every bit this form's fields cover, opcode and guard included."""
        mask = 0
        for f in self.fields:
            mask |= f.mask
        return mask


# Fields every form has, in the same place on every architecture Bob encodes.
OPCODE = Field("opcode", bits(0, 12), "the opcode and its operand form (bits 9..11)")
GUARD = Field("guard", bits(12, 3), "the predicate that guards the instruction (7: PT)")
GUARD_NOT = Field("guard_not", bits(15, 1), "the guard is inverted (@!P)")
CONTROL_LOW = 105  # bits 105..127 are the scheduling controls (bob.isa.control)


@dataclass(frozen=True)
class Table:
    """An architecture's forms: by name for the encoder, by opcode for the decoder."""

    arch: str  # "sm_90"
    forms: tuple[Form, ...]
    target_unit: int = 4  # branch offsets count 4-byte units
    prints_descriptor: bool = True  # nvdisasm shows a global access's desc[UR]

    def __post_init__(self) -> None:
        names = [f.name for f in self.forms]
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise FieldError(f"{self.arch}: forms named twice: {', '.join(doubled)}")

    def form(self, name: str) -> Form:
        for f in self.forms:
            if f.name == name:
                return f
        raise FieldError(f"{self.arch} has no form {name!r}")

    def candidates(self, opcode: int) -> tuple[Form, ...]:
        """The forms with this opcode, in table order (the decoder takes the first fit)."""
        return tuple(f for f in self.forms if f.opcode == opcode)
