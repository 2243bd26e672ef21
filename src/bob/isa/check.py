"""Check a program's scheduling controls against a latency and scoreboard model.

Volta and later GPUs do not interlock fixed-latency results: an instruction
that reads a register before its producer's latency has passed reads the old
value, silently. Variable-latency results (loads, the multi-function unit,
conversions, shuffles) arrive through a scoreboard that the reader must wait
on. The checker walks every path of the program (branches, calls and returns
followed, states merged where paths meet) and reports:

- ``fixed-latency``: a register (or predicate) read fewer cycles after its
  fixed-latency producer issued than the producer's latency;
- ``unwaited-read``: a read of a register whose variable-latency write is
  pending on a scoreboard not waited for since. A result written with no
  scoreboard is covered by the next one a later instruction of the same opcode
  sets (ptxas relies on loads of one kind completing in order: eight LDS, every
  second with a scoreboard); until then no wait covers it;
- ``unwaited-overwrite``: a write to a register a pending variable-latency
  instruction will still write (its late result would land on top) or still
  read (its read scoreboard not waited for);
- ``early-wait``: a wait on a scoreboard by the instruction right after the one
  that sets it, whose stall is too short for the scoreboard to be set yet.

- ``early-overwrite``: a variable-latency write of a register fewer cycles
  after a fixed-latency instruction read it, or (the write guarded) wrote it,
  than the hardware needs;
- ``barrier-latency``: a memory access fewer cycles after a BAR.SYNC than the
  barrier takes to take effect;
- ``illegal-encoding``: bits nvdisasm may print but the hardware refuses (a
  guarded BPT.TRAP; a stall outside 1..11 with the yield bit set).

The latencies depend on the writer's pipe and the reader's (``bob.isa.latency``);
every schedule ptxas made for Bob's kernels passes (tests/test_isa_check.py),
so a schedule it accepts is safe by it; instructions outside Bob's subset are
opaque: their waits and scoreboards count, their registers are not known.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from bob.isa import latency
from bob.isa.codec import NotInSubset, decode
from bob.isa.control import SCOREBOARDS, Control, read_control
from bob.isa.fields import INSTRUCTION_BYTES, Kind, Table
from bob.isa.model import PT, RZ, URZ, CBuf, GMem, Instruction, Pred, SMem, Target

# A scoreboard is set a cycle after its instruction issues: an instruction that
# waits on it must issue at least this many cycles later.
SCOREBOARD_SETUP = 2
WIDE_SIZES = {"64": 2, "128": 4}

Register = tuple[str, int]  # ("R", 5), ("P", 0), ("UR", 4), ("UP", 1)


@dataclass(frozen=True)
class Hazard:
    pc: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"0x{self.pc:04x}: {self.rule}: {self.message}"


@dataclass(frozen=True)
class Effects:
    """What one instruction reads and writes, and how its results arrive."""

    reads: frozenset[Register]
    writes: frozenset[Register]
    sources: tuple[tuple[Register, str], ...]  # each read and its reader class
    results: tuple[tuple[Register, str], ...]  # each write and its writer class
    variable: bool
    known: bool  # False for an instruction outside the subset (opaque)
    queue: str = ""  # the in-order queue of a variable-latency instruction (its opcode)
    guarded: bool = False

    def readiness(self, register: Register) -> tuple[int, ...]:
        """Cycles until each reader class (latency.READERS) may read `register`, written
        here by a fixed-latency pipe."""
        writer = dict(self.results)[register]
        return latency.readiness(register[0], writer)


@dataclass
class State:
    """The machine between two instructions on one path."""

    # Fixed-latency results: cycles until readable, per reader class (latency.READERS).
    ready: dict[Register, tuple[int, ...]] = field(default_factory=dict)
    # Cycles until a variable-latency write may follow a fixed-latency read ("read", r)
    # or, guarded, a fixed-latency write ("write", r) of the register.
    recent: dict[tuple[str, Register], int] = field(default_factory=dict)
    pending_write: dict[Register, frozenset[int]] = field(default_factory=dict)
    pending_read: dict[Register, frozenset[int]] = field(default_factory=dict)
    # Results written with no scoreboard, by queue, until a later instruction of
    # the queue sets one: its completion implies theirs (the queue is in order).
    orphans: dict[str, frozenset[Register]] = field(default_factory=dict)

    def copy(self) -> State:
        return State(dict(self.ready), dict(self.recent), dict(self.pending_write),
                     dict(self.pending_read), dict(self.orphans))

    def merge(self, other: State) -> bool:
        """Take the worse of both; True if anything changed."""
        changed = False
        for name in ("pending_write", "pending_read"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for register, boards in theirs.items():
                union = mine.get(register, frozenset()) | boards
                if union != mine.get(register):
                    mine[register] = union
                    changed = True
        for queue, registers in other.orphans.items():
            union = self.orphans.get(queue, frozenset()) | registers
            if union != self.orphans.get(queue):
                self.orphans[queue] = union
                changed = True
        for register, cycles in other.ready.items():
            mine = self.ready.get(register, (0,) * len(cycles))
            worse = tuple(max(a, b) for a, b in zip(mine, cycles, strict=True))
            if worse != mine:
                self.ready[register] = worse
                changed = True
        for key, cycles in other.recent.items():
            if cycles > self.recent.get(key, 0):
                self.recent[key] = cycles
                changed = True
        return changed

    def advance(self, cycles: int) -> None:
        self.ready = {r: tuple(max(c - cycles, 0) for c in left)
                      for r, left in self.ready.items() if max(left) > cycles}
        self.recent = {k: c - cycles for k, c in self.recent.items() if c > cycles}

    def wait(self, mask: int) -> None:
        for name in ("pending_write", "pending_read"):
            table = getattr(self, name)
            for register in list(table):
                left = frozenset(b for b in table[register] if not mask >> b & 1)
                if left:
                    table[register] = left
                else:
                    del table[register]


def _names(kind: Kind, index: int, count: int) -> list[Register]:
    if kind in (Kind.REG, Kind.GMEM, Kind.SMEM):  # a pair or quad at RZ is all RZ
        return [] if index == RZ else [("R", index + i) for i in range(count)]
    if kind is Kind.UREG:
        return [] if index == URZ else [("UR", index + i) for i in range(count)]
    if kind is Kind.PRED:
        return [] if index == PT else [("P", index)]
    if kind is Kind.UPRED:
        return [] if index == PT else [("UP", index)]
    return []


def effects(instruction: Instruction, table: Table) -> Effects:
    form = table.form(instruction.form)
    size = next((WIDE_SIZES[m] for m in instruction.modifiers if m in WIDE_SIZES), 1)
    uniform = form.mnemonic.startswith("U")
    reader = latency.reader_class(form.mnemonic, form.variable_latency, uniform)
    writer = latency.writer_class(form.mnemonic, uniform)
    wide = form.mnemonic == "IMAD.WIDE"
    sources: list[tuple[Register, str]] = []
    results: list[tuple[Register, str]] = []
    guarded = instruction.guard.index != PT
    if guarded:
        sources.append((("UP" if form.uniform_guard else "P", instruction.guard.index),
                        latency.GUARD))
    for slot, operand in zip(form.operands, instruction.operands, strict=True):
        index = getattr(operand, "index", getattr(operand, "base", None))
        if isinstance(operand, CBuf):
            if operand.index is not None:
                sources.extend((name, reader) for name in _names(Kind.REG, operand.index, 1))
            continue
        if index is None:
            continue
        data = slot.kind in (Kind.REG, Kind.UREG) and form.mnemonic in _SIZED
        count = slot.count * (size if data else 1)
        names = _names(slot.kind, index, count)
        if slot.written:
            halves = (latency.WIDE_LOW, latency.WIDE_HIGH) if wide and slot.kind is Kind.REG \
                else (writer,) * len(names)
            results.extend(zip(names, halves, strict=False))
        elif wide and slot.reuse == 2:  # the addend: its halves are read at different times
            sources.extend(zip(names, (latency.FMA, latency.WIDE_C_HIGH), strict=False))
        else:
            sources.extend((name, latency.WIDE_AB if wide else reader) for name in names)
        if isinstance(operand, SMem) and operand.ubase is not None:
            sources.extend((name, reader) for name in _names(Kind.UREG, operand.ubase, 1))
        if isinstance(operand, GMem):
            sources.extend((name, reader) for name in _names(Kind.UREG, operand.desc, 2))
    opcode = form.mnemonic.split(".")[0]
    return Effects(frozenset(r for r, _ in sources), frozenset(r for r, _ in results),
                   tuple(sources), tuple(results), form.variable_latency, True,
                   QUEUES.get(opcode, opcode), guarded)


# Variable-latency opcodes that complete in one order: the conversions and the
# multi-function unit share one (ptxas covers an F2I result by a later FRND's
# scoreboard); every other opcode is its own queue.
QUEUES = {"F2I": "conversion", "FRND": "conversion", "MUFU": "conversion",
          "I2FP": "conversion"}

# Forms whose register data operand widens with a .64 / .128 size modifier.
_SIZED = {"LDG.E", "STG.E", "LDS", "STS", "LDC", "ULDC"}
OPAQUE = Effects(frozenset(), frozenset(), (), (), False, False)
# A variable-latency result written with no scoreboard: no wait can make it safe.
NEVER = SCOREBOARDS


@dataclass(frozen=True)
class Step:
    pc: int
    control: Control
    instruction: Instruction | None
    effects: Effects
    successors: tuple[int, ...]  # indices of the instructions that may follow
    mnemonic: str = ""  # "" outside the subset


def _steps(code: bytes, table: Table) -> list[Step]:
    count = len(code) // INSTRUCTION_BYTES
    decoded: list[tuple[Control, Instruction | None]] = []
    for index in range(count):
        raw = code[index * INSTRUCTION_BYTES:(index + 1) * INSTRUCTION_BYTES]
        control = read_control(int.from_bytes(raw, "little"))
        try:
            decoded.append((control, decode(raw, table)))
        except NotInSubset:
            decoded.append((control, None))
    returns = [i + 1 for i, (_, ins) in enumerate(decoded)
               if ins is not None and table.form(ins.form).mnemonic == "CALL.REL.NOINC"
               and i + 1 < count]
    steps = []
    for index, (control, instruction) in enumerate(decoded):
        pc = index * INSTRUCTION_BYTES
        if instruction is None:
            successors = (index + 1,) if index + 1 < count else ()
            steps.append(Step(pc, control, None, OPAQUE, successors))
            continue
        steps.append(Step(pc, control, instruction, effects(instruction, table),
                          _successors(index, instruction, table, count, returns),
                          table.form(instruction.form).mnemonic))
    return steps


def _successors(index: int, instruction: Instruction, table: Table, count: int,
                returns: list[int]) -> tuple[int, ...]:
    mnemonic = table.form(instruction.form).mnemonic
    conditional = instruction.guard.index != PT or instruction.guard.inverted
    following = [index + 1] if index + 1 < count else []
    targets = [index + 1 + t.offset // INSTRUCTION_BYTES for t in instruction.operands
               if isinstance(t, Target)]
    targets = [t for t in targets if 0 <= t < count]
    if mnemonic == "BRA":
        conditional = conditional or len(instruction.operands) == 2
        return tuple(targets + (following if conditional else []))
    if mnemonic == "CALL.REL.NOINC":
        return tuple(targets)
    if mnemonic == "RET.REL.NODEC":
        return tuple(returns + (following if conditional else []))
    if mnemonic in ("EXIT", "BPT.TRAP"):
        return tuple(following if conditional else [])
    return tuple(following)


def check(code: bytes, table: Table) -> list[Hazard]:
    """Every hazard the model finds in `code` (one kernel's machine code), by address."""
    steps = _steps(code, table)
    if not steps:
        return []
    states: dict[int, State] = {0: State()}
    work = [0]
    hazards: dict[tuple[int, str, str], Hazard] = {}
    for step in steps:
        for message in _illegal(step, table):
            hazards[(step.pc, "illegal-encoding", message)] = Hazard(
                step.pc, "illegal-encoding", message)
    while work:
        index = work.pop()
        step = steps[index]
        after = _step(step, states[index].copy(), steps, index, hazards)
        for successor in step.successors:
            if successor not in states:
                states[successor] = after.copy()
                work.append(successor)
            elif states[successor].merge(after):
                work.append(successor)
    return sorted(hazards.values(), key=lambda h: (h.pc, h.rule))


def _illegal(step: Step, table: Table) -> list[str]:
    """What makes `step` no instruction the hardware runs, though nvdisasm may print it."""
    found = []
    if step.instruction is not None:
        form = table.form(step.instruction.form)
        if form.unguarded and step.instruction.guard != Pred(PT):
            found.append(f"a guarded {form.mnemonic}: the hardware takes it as an illegal "
                         "instruction (branch around it)")
    if not step.control.defined:
        found.append(f"stall {step.control.stall} with the yield bit set is no encoding")
    return found


def _step(step: Step, state: State, steps: list[Step], index: int,
          hazards: dict[tuple[int, str, str], Hazard]) -> State:
    def report(rule: str, message: str) -> None:
        hazards.setdefault((step.pc, rule, message), Hazard(step.pc, rule, message))

    control = step.control
    if index > 0 and control.wait:
        previous = steps[index - 1]
        setters = {b for b in (previous.control.write, previous.control.read) if b is not None}
        early = {b for b in setters if control.waits_on(b)}
        if early and max(previous.control.stall, 1) < SCOREBOARD_SETUP:
            report("early-wait", f"waits on scoreboard {min(early)} set by the instruction "
                                 f"before, whose stall {previous.control.stall} is under "
                                 f"{SCOREBOARD_SETUP}")
    state.wait(control.wait)
    fx = step.effects
    mnemonic = step.mnemonic
    if mnemonic in latency.MEMORY_MNEMONICS and state.recent.get(latency.BARRIER, 0) > 0:
        report("barrier-latency", f"a memory access {state.recent[latency.BARRIER]} cycle(s) "
                                  "too soon after BAR.SYNC (the barrier has not taken effect)")
    late: dict[Register, int] = {}
    for register, reader in fx.sources:
        left = state.ready.get(register)
        if left is not None:
            late[register] = max(late.get(register, 0), left[latency.READER_INDEX[reader]])
    for register in sorted(fx.reads):
        cycles = late.get(register, 0)
        if cycles > 0:
            report("fixed-latency", f"reads {_name(register)} {cycles} cycle(s) too early")
        boards = state.pending_write.get(register)
        if boards and NEVER in boards:
            report("unwaited-read", f"reads {_name(register)}, a variable-latency result "
                                    "written with no scoreboard")
        elif boards:
            report("unwaited-read", f"reads {_name(register)} before its variable-latency "
                                    f"write (scoreboard {_boards(boards)}) is waited for")
    if fx.variable:
        for register in sorted(fx.writes):
            after_read = state.recent.get(("read", register), 0)
            after_write = state.recent.get(("write", register), 0) if fx.guarded else 0
            if max(after_read, after_write) > 0:
                what = "read" if after_read >= after_write else "wrote"
                report("early-overwrite", f"writes {_name(register)} "
                                          f"{max(after_read, after_write)} cycle(s) after a "
                                          f"fixed-latency instruction {what} it, too soon")
    for register in sorted(fx.writes):
        boards = state.pending_write.get(register, frozenset()) | \
            state.pending_read.get(register, frozenset())
        if boards:
            report("unwaited-overwrite", f"writes {_name(register)} while scoreboard "
                                         f"{_boards(boards)} still covers it")
    if fx.variable and control.write is not None:
        for register in state.orphans.pop(fx.queue, frozenset()):
            if NEVER in state.pending_write.get(register, frozenset()):
                state.pending_write[register] = frozenset({control.write})
    if fx.variable and control.write is None and fx.writes:
        state.orphans[fx.queue] = state.orphans.get(fx.queue, frozenset()) | fx.writes
    for register in fx.writes:
        state.pending_write.pop(register, None)
        state.pending_read.pop(register, None)
        state.ready.pop(register, None)
        if fx.variable:
            board = NEVER if control.write is None else control.write
            state.pending_write[register] = frozenset({board})
        else:
            state.ready[register] = fx.readiness(register)
            state.recent[("write", register)] = latency.GUARDED_VARIABLE_WRITE_AFTER_WRITE
    if mnemonic in latency.BARRIERS:
        state.recent[latency.BARRIER] = latency.BARRIER_LATENCY
    if fx.known and not fx.variable:
        for register in fx.reads:
            state.recent[("read", register)] = max(state.recent.get(("read", register), 0),
                                                   latency.VARIABLE_WRITE_AFTER_READ)
    if control.read is not None:
        # Predicates (the guard among them) are read at issue; registers may be read late.
        for register in fx.reads - {r for r in fx.reads if r[0] in ("P", "UP")}:
            state.pending_read[register] = state.pending_read.get(register, frozenset()) | {
                control.read}
    state.advance(max(control.stall, 1))
    return state


def _name(register: Register) -> str:
    return f"{register[0]}{register[1]}"


def _boards(boards: Iterable[int]) -> str:
    return ",".join(str(b) for b in sorted(boards) if b < SCOREBOARDS)
