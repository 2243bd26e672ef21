"""Write a kernel as typed instructions, schedule it conservatively, and make its image.

    b = Builder("sm_90")
    b.op("S2R", R(0), SReg(TID_X))
    b.label("loop")
    b.bra("loop", Pred(0))
    image = b.image("bob_row_gather", shared_bytes=1024)

Registers are explicit (``R(5)``); labels name positions, and ``bra`` resolves
them to each architecture's branch offset when the image is made. Every
instruction is written with default controls: ``schedule`` sets them all.

The scheduler is correct first, not fast. Within a straight run of code it
tracks, per register and predicate, when a fixed-latency result becomes
readable for each kind of reader (``bob.isa.latency``: a guard waits 13 cycles
for an ISETP), keeps memory accesses 6 cycles after a barrier, and which scoreboard a
variable-latency result or a pending source read sits on; each instruction
waits for exactly the scoreboards of what it reads or overwrites, and the
instruction before it stalls until its fixed-latency sources are ready. At
every label and branch the machine is drained: the instruction before a label
and every branch stall until all fixed-latency results are written, and the
first instruction after a label waits on every scoreboard. Variable-latency
instructions take a write scoreboard where they write a register and a read
scoreboard where they read one, round robin over the six.

Before that, with ``ordering("latency")``, ``bob.isa.order`` list-schedules each
straight run so that independent instructions fill the latencies; the default,
"written", keeps the order the kernel was written in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace

from bob.isa import latency
from bob.isa import table as arch_table
from bob.isa.check import SCOREBOARD_SETUP, effects
from bob.isa.codec import encode
from bob.isa.control import MAX_STALL, SCOREBOARDS, Control
from bob.isa.fields import INSTRUCTION_BYTES, Table
from bob.isa.model import PT, RZ, Instruction, Operand, Pred, Reg, Target
from bob.isa.order import reorder

ALL_BOARDS = (1 << SCOREBOARDS) - 1
ALWAYS = Pred(PT)
# Registers the hardware allocates beyond the highest one the code names (what ptxas's
# own counts show: the highest register used + 3), in the allocation unit of 8.
EXTRA_REGISTERS = 3
REGISTER_GRANULE = 8
MIN_REGISTERS = 16
# ptxas's practice in every kernel it compiled for Bob (the corpus of tests/test_isa_corpus):
# each BRA and EXIT that runs stalls at least 5 cycles, and an image ends with a branch to
# itself and NOPs up to a whole fetch block, so that nothing issued past the last EXIT
# before it takes effect is the bytes after the image. Bob's own images did neither, and
# every one of them faulted on the H200 (channel error 13: docs/ISA.md).
BRANCH_STALL = 5
FETCH_BLOCK = 128  # bytes: ptxas pads every image to a multiple of this
TAIL_CONTROL = Control(stall=0, yield_bit=False)  # the padding's controls, as ptxas's
# How a builder orders each straight run before its controls are set: "written" (as the
# kernel was written) or "latency" (bob.isa.order's list scheduler).
ORDERINGS = ("written", "latency")
_ordering = ["written"]


@contextlib.contextmanager
def ordering(name: str) -> Iterator[None]:
    """Builders made inside order their code so (ORDERINGS); the one before after."""
    if name not in ORDERINGS:
        raise ValueError(f"unknown ordering {name!r}; choose one of {', '.join(ORDERINGS)}")
    _ordering.append(name)
    try:
        yield
    finally:
        _ordering.pop()


@dataclass(frozen=True)
class ArchFacts:
    """What a kernel's code must know of its architecture beyond the forms."""

    parameter_base: int  # kernel parameters start here in constant bank 0
    descriptor_offset: int  # the global memory descriptor (64 bits) in constant bank 0
    shared_base: int  # the block's own shared data starts here in its shared window
    reserved_shared: int  # system shared bytes an image counts in its shared size


ARCH_FACTS = {
    # sm_90: parameters at c[0x0][0x210]; ptxas reads the descriptor from c[0x0][0x208];
    # the first KiB of a block's shared window is the system's.
    "sm_90": ArchFacts(0x210, 0x208, 0x400, 0x400),
    "sm_86": ArchFacts(0x160, 0x118, 0x0, 0x0),
}


@dataclass(frozen=True)
class Image:
    """A kernel's machine code and the facts a launch needs."""

    name: str
    arch: str
    code: bytes
    registers: int  # per thread, as the QMD takes it
    shared_bytes: int  # the block's shared window, the system's part included (sm_90)
    barriers: int  # named barriers used (BAR.SYNC 0 only: 1)
    instructions: tuple[Instruction, ...]


@dataclass(frozen=True)
class _Branch:
    label: str
    predicate: Pred | None
    guard: Pred


def R(index: int) -> Reg:  # noqa: N802 - reads like the register it names
    return Reg(index)


class Builder:
    """A kernel under construction: instructions and labels, in order."""

    def __init__(self, arch: str):
        self.arch = arch
        self.table: Table = arch_table(arch)
        self.facts = ARCH_FACTS[arch]
        self.ordering = _ordering[-1]
        self._items: list[Instruction | _Branch | str] = []

    def op(self, form: str, *operands: Operand, mods: tuple[str, ...] | str = (),
           guard: Pred = ALWAYS) -> None:
        if isinstance(mods, str):
            mods = tuple(m for m in mods.split(".") if m)
        self.table.form(form)  # refuses an unknown form now, not at the end
        self._items.append(Instruction(form, tuple(operands), tuple(mods), guard))

    def label(self, name: str) -> None:
        if name in self._items:
            raise ValueError(f"label {name!r} is defined twice")
        self._items.append(name)

    def bra(self, label: str, predicate: Pred | None = None, guard: Pred = ALWAYS) -> None:
        self._items.append(_Branch(label, predicate, guard))

    def instructions(self) -> list[Instruction]:
        """The instructions with branch offsets resolved and controls scheduled."""
        labels: dict[str, int] = {}
        count = 0
        for item in self._items:
            if isinstance(item, str):
                labels[item] = count
            else:
                count += 1
        starts: set[int] = set(labels.values())
        resolved: list[Instruction] = []
        for item in self._items:
            if isinstance(item, str):
                continue
            if isinstance(item, _Branch):
                if item.label not in labels:
                    raise ValueError(f"branch to undefined label {item.label!r}")
                offset = (labels[item.label] - len(resolved) - 1) * INSTRUCTION_BYTES
                if item.predicate is None:
                    item = Instruction("BRA.L", (Target(offset),), (), item.guard)
                else:
                    item = Instruction("BRA.PL", (item.predicate, Target(offset)), (),
                                       item.guard)
            resolved.append(item)
        if self.ordering == "latency":
            resolved = reorder(resolved, self.table, starts,
                               cost=lambda order: stall_cycles(order, self.table, starts))
        return schedule(resolved, self.table, starts) + tail(len(resolved))

    def image(self, name: str, *, shared_bytes: int = 0) -> Image:
        instructions = self.instructions()
        code = b"".join(encode(i, self.table) for i in instructions)
        highest = max((r for i in instructions for r in _registers(i, self.table)), default=0)
        registers = max(MIN_REGISTERS, -(-(highest + EXTRA_REGISTERS) // REGISTER_GRANULE)
                        * REGISTER_GRANULE)
        uses_barrier = any(self.table.form(i.form).mnemonic.startswith("BAR")
                           for i in instructions)
        shared = shared_bytes + (self.facts.reserved_shared if shared_bytes else 0)
        return Image(name, self.arch, code, registers, shared, int(uses_barrier),
                     tuple(instructions))


def stall_cycles(instructions: list[Instruction], table: Table,
                 block_starts: set[int] | frozenset[int] = frozenset()) -> float:
    """The fixed stalls `schedule` gives this order, summed (inf where it cannot)."""
    try:
        scheduled = schedule(instructions, table, block_starts)
    except ValueError:
        return float("inf")
    return float(sum(instruction.control.stall for instruction in scheduled))


def tail(count: int) -> list[Instruction]:
    """What follows `count` instructions: a branch to itself, then NOPs to a whole fetch
    block (never reached: the code before it ends in an unconditional EXIT)."""
    per_block = FETCH_BLOCK // INSTRUCTION_BYTES
    nops = -(count + 1) % per_block
    return [Instruction("BRA.L", (Target(-INSTRUCTION_BYTES),), (), ALWAYS, TAIL_CONTROL),
            *(Instruction("NOP", (), (), ALWAYS, TAIL_CONTROL) for _ in range(nops))]


def _registers(instruction: Instruction, table: Table) -> list[int]:
    fx = effects(instruction, table)
    return [index for kind, index in fx.reads | fx.writes if kind == "R" and index < RZ]


def _is_branch(instruction: Instruction, table: Table) -> bool:
    return table.form(instruction.form).mnemonic in ("BRA", "EXIT", "BPT.TRAP")


def schedule(instructions: list[Instruction], table: Table,
             block_starts: set[int] = frozenset()) -> list[Instruction]:
    """`instructions` with every control set so that ``bob.isa.check`` accepts them.

    `block_starts` are the indices branches may reach (labels): the machine is
    drained before each.
    """
    controls = [Control(stall=1, yield_bit=True) for _ in instructions]
    now = 0  # issue cycle of the current instruction
    # fixed-latency result -> the cycle each reader class may read it (latency.READERS)
    ready: dict[tuple[str, int], tuple[int, ...]] = {}
    # ("read" | "write", register) -> the first cycle a variable-latency write may follow
    recent: dict[tuple[str, tuple[str, int]], int] = {}
    writing: dict[tuple[str, int], set[int]] = {}  # pending variable write -> boards
    reading: dict[tuple[str, int], set[int]] = {}  # pending variable read -> boards
    issued: list[int] = []
    next_board = 0

    def take_board() -> int:
        nonlocal next_board
        board = next_board
        next_board = (next_board + 1) % SCOREBOARDS
        return board

    for index, instruction in enumerate(instructions):
        fx = effects(instruction, table)
        form = table.form(instruction.form)
        wait = 0
        if index in block_starts and index > 0:
            wait = ALL_BOARDS
            writing.clear()
            reading.clear()
            ready.clear()
            recent.clear()
        for register in fx.reads | fx.writes:
            for board in writing.get(register, ()):
                wait |= 1 << board
        for register in fx.writes:
            for board in reading.get(register, ()):
                wait |= 1 << board
        if form.mnemonic.startswith("BAR"):
            # The barrier publishes this thread's earlier memory accesses: let them finish.
            for boards in (*writing.values(), *reading.values()):
                for board in boards:
                    wait |= 1 << board
        earliest = max((ready[r][latency.READER_INDEX[reader]] for r, reader in fx.sources
                        if r in ready), default=0)
        if form.mnemonic in latency.MEMORY_MNEMONICS:
            earliest = max(earliest, recent.get(latency.BARRIER, 0))
        if fx.variable:
            for register in fx.writes:
                earliest = max(earliest, recent.get(("read", register), 0),
                               recent.get(("write", register), 0) if fx.guarded else 0)
        if index > 0:
            previous = controls[index - 1]
            gap = max(earliest - issued[-1], 1)
            if wait and (previous.write is not None or previous.read is not None):
                gap = max(gap, SCOREBOARD_SETUP)
            if gap > previous.stall:
                if gap > MAX_STALL:
                    raise ValueError(f"instruction {index}: a gap of {gap} cycles")
                controls[index - 1] = replace(previous, stall=gap)
            now = issued[-1] + max(controls[index - 1].stall, 1)
        issued.append(now)
        if wait:
            for table_ in (writing, reading):
                for register in list(table_):
                    table_[register] -= {b for b in range(SCOREBOARDS) if wait >> b & 1}
                    if not table_[register]:
                        del table_[register]
        write = read = None
        if fx.variable:
            registers_read = {r for r in fx.reads if r[0] in ("R", "UR")}
            if fx.writes:
                write = take_board()
            if registers_read:
                read = take_board()
                for register in registers_read:
                    reading.setdefault(register, set()).add(read)
        for register in fx.writes:
            ready.pop(register, None)
            writing.pop(register, None)
            reading.pop(register, None)
            if fx.variable:
                writing[register] = {write}
            else:
                ready[register] = tuple(now + c for c in fx.readiness(register))
                recent[("write", register)] = now + latency.GUARDED_VARIABLE_WRITE_AFTER_WRITE
        if form.mnemonic in latency.BARRIERS:
            recent[latency.BARRIER] = now + latency.BARRIER_LATENCY
        if not fx.variable:
            for register in fx.reads:
                recent[("read", register)] = max(recent.get(("read", register), 0),
                                                 now + latency.VARIABLE_WRITE_AFTER_READ)
        controls[index] = replace(controls[index], write=write, read=read, wait=wait)
        drain = _is_branch(instruction, table) or index + 1 in block_starts
        if drain:
            left = max([max(cycles) - now for cycles in ready.values()]
                       + [cycle - now for cycle in recent.values()], default=0)
            stall = max(controls[index].stall, left, 1)
            if table.form(instruction.form).mnemonic in ("BRA", "EXIT"):
                stall = max(stall, BRANCH_STALL)
            if write is not None or read is not None:
                stall = max(stall, SCOREBOARD_SETUP)
            controls[index] = replace(controls[index], stall=min(stall, MAX_STALL))
    return [replace(instruction, control=control if control.defined
                    else replace(control, yield_bit=False))  # as ptxas's long stalls
            for instruction, control in zip(instructions, controls, strict=True)]
