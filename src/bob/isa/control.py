"""The scheduling controls in bits 105..125 of every instruction.

Volta and later GPUs have no interlock for fixed-latency results: the
compiler says how long to wait. Each instruction carries:

- a stall count: cycles before the next instruction issues (0..15);
- the yield bit (its raw value: ptxas sets it on almost every instruction);
- a write scoreboard: set when the instruction's results arrive late (a load, a
  multi-function op), released when they are written; 7 means none;
- a read scoreboard: released when the instruction has read its registers
  (a store may read its data long after issue); 7 means none;
- a wait mask: the scoreboards (bit i for scoreboard i) that must be released
  before this instruction issues;
- reuse flags: operand ports whose register this instruction leaves in the
  operand cache for the next one (bit 0 the first source port).

Positions from Mesa NAK's ``set_instr_deps`` (sm70_encode.rs), checked against
nvdisasm's output for ptxas's code.
"""

from __future__ import annotations

from dataclasses import dataclass

from bob.isa.fields import Field, FieldError, bits

NO_SCOREBOARD = 7
SCOREBOARDS = 6
MAX_STALL = 15
# Stall and yield together are one 5-bit field to nvdisasm, and with the yield bit set
# only stalls of 1 to 11 are values of it ("undefined value" for every opcode otherwise);
# ptxas leaves the yield bit off on its long stalls and its tail's NOPs.
LONGEST_YIELDING_STALL = 11

STALL = Field("stall", bits(105, 4), "cycles before the next instruction issues")
YIELD = Field("yield", bits(109, 1), "the yield bit, raw")
WRITE_SCOREBOARD = Field("write_scoreboard", bits(110, 3),
                         "scoreboard released when the results are written (7: none)")
READ_SCOREBOARD = Field("read_scoreboard", bits(113, 3),
                        "scoreboard released when the sources have been read (7: none)")
WAIT = Field("wait", bits(116, 6), "scoreboards waited for before issue, one bit each")
REUSE = Field("reuse", bits(122, 4), "operand ports kept in the reuse cache, one bit each")
CONTROL_FIELDS = (STALL, YIELD, WRITE_SCOREBOARD, READ_SCOREBOARD, WAIT, REUSE)
UNUSED = Field("unused", bits(126, 2), "always zero")


@dataclass(frozen=True)
class Control:
    stall: int = MAX_STALL
    yield_bit: bool = False
    write: int | None = None  # the write scoreboard, None for none
    read: int | None = None  # the read scoreboard, None for none
    wait: int = 0  # mask over the six scoreboards
    reuse: int = 0  # mask over the four operand ports

    def __post_init__(self) -> None:
        for name in ("write", "read"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < SCOREBOARDS:
                raise FieldError(f"{name} scoreboard {value!r} is not in 0..{SCOREBOARDS - 1}")

    @property
    def defined(self) -> bool:
        """Whether the stall and yield bit form a value the hardware defines."""
        return not self.yield_bit or 1 <= self.stall <= LONGEST_YIELDING_STALL

    def waits_on(self, scoreboard: int) -> bool:
        return bool(self.wait >> scoreboard & 1)


def read_control(word: int) -> Control:
    """The controls of a 128-bit instruction word; FieldError where bits 126..127 are set."""
    if UNUSED.read(word):
        raise FieldError("bits 126..127 of the instruction are set")
    write = WRITE_SCOREBOARD.read(word)
    read = READ_SCOREBOARD.read(word)
    return Control(
        stall=STALL.read(word),
        yield_bit=bool(YIELD.read(word)),
        write=None if write == NO_SCOREBOARD else write,
        read=None if read == NO_SCOREBOARD else read,
        wait=WAIT.read(word),
        reuse=REUSE.read(word),
    )


def write_control(word: int, control: Control) -> int:
    """`word` with its control bits set from `control`."""
    word = STALL.write(word, control.stall)
    word = YIELD.write(word, int(control.yield_bit))
    word = WRITE_SCOREBOARD.write(
        word, NO_SCOREBOARD if control.write is None else control.write)
    word = READ_SCOREBOARD.write(word, NO_SCOREBOARD if control.read is None else control.read)
    word = WAIT.write(word, control.wait)
    return REUSE.write(word, control.reuse)


def describe(control: Control) -> str:
    """A short listing of the controls: stall, yield, scoreboards, waits, reuse."""
    parts = [f"S{control.stall:02d}", "Y" if control.yield_bit else "-"]
    parts.append(f"W{control.write}" if control.write is not None else "--")
    parts.append(f"R{control.read}" if control.read is not None else "--")
    waits = "".join(str(i) for i in range(SCOREBOARDS) if control.waits_on(i))
    parts.append(f"B{waits}" if waits else "--")
    if control.reuse:
        parts.append(f"U{control.reuse:x}")
    return ":".join(parts)
