"""The instruction model: operands, an instruction, and its encoding as 16 bytes.

An `Instruction` names its form (an entry of an architecture's table in
``bob.isa.sm90`` / ``bob.isa.sm86``), its operands in the order the
disassembler prints them, its modifiers as printed (``("GE", "U32", "AND")``),
its guard predicate and its scheduling controls. ``bob.isa.codec`` turns it into
bytes and back; ``bob.isa.text`` prints it as nvdisasm does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bob.isa.control import Control

RZ = 255  # the zero register: reads 0, writes are dropped
URZ = 63
PT = 7  # the true predicate


@dataclass(frozen=True)
class Reg:
    index: int  # 0..254, RZ = 255
    neg: bool = False
    abs: bool = False


@dataclass(frozen=True)
class UReg:
    index: int  # 0..62, URZ = 63
    neg: bool = False
    abs: bool = False


@dataclass(frozen=True)
class Pred:
    index: int  # 0..6, PT = 7
    inverted: bool = False


@dataclass(frozen=True)
class UPred:
    index: int  # 0..6, UPT = 7
    inverted: bool = False


@dataclass(frozen=True)
class Imm:
    """An immediate as its raw field value (a binary32's bits for a float operand)."""

    value: int


@dataclass(frozen=True)
class CBuf:
    bank: int
    offset: int  # bytes
    neg: bool = False
    abs: bool = False
    index: int | None = None  # LDC's index register (RZ for none); None where there is none


@dataclass(frozen=True)
class SReg:
    index: int  # the special register's number (SR_TID.X is 0x21)


@dataclass(frozen=True)
class Target:
    """A branch target: bytes from the next instruction's address."""

    offset: int


@dataclass(frozen=True)
class GMem:
    """A global address: the 64-bit register pair at `base`, plus `offset`."""

    base: int
    offset: int = 0
    desc: int = 0  # the uniform register holding the memory descriptor


@dataclass(frozen=True)
class SMem:
    """A shared-memory address: register `base` (RZ for none) plus `offset`."""

    base: int
    offset: int = 0
    ubase: int | None = None  # a uniform register added to the address
    x4: bool = False  # the register counts 4-byte words (printed R3.X4)


@dataclass(frozen=True)
class Barrier:
    index: int  # a convergence barrier, B0..B15


Operand = Reg | UReg | Pred | UPred | Imm | CBuf | SReg | Target | GMem | SMem | Barrier


@dataclass(frozen=True)
class Instruction:
    form: str  # the form's name in its architecture's table
    operands: tuple[Operand, ...] = ()
    modifiers: tuple[str, ...] = ()  # as printed after the mnemonic, in order
    guard: Pred = Pred(PT)
    control: Control = field(default_factory=Control)
