"""How many cycles a fixed-latency result needs before each kind of reader may read it.

Volta and later GPUs do not interlock fixed-latency results, and the wait depends on
both ends: which pipe wrote the value and which reads it. A predicate that guards an
instruction, or that a variable-latency instruction reads, is read at dispatch: 13
cycles after an ISETP, where the next ISETP may combine it after 4 (ptxas's code stalls
13 between an ISETP and the branch or EXIT it guards, and between a compare and the VOTE
that reads its predicate: a VOTE 5 cycles after the ISETP it read took the predicate
before it, on an H100). An address that a load or store
reads from an IMAD.WIDE's upper half needs 5.

The figures are Mesa NAK's register-scheduling tables for Ampere
(``sm80_instr_latencies.rs``, which its authors give as NVIDIA's own), used here for
sm_86 and sm_90: facts about the hardware, not code. On the H200 Bob's own kernels
scheduled with one latency of 4 for every pair (and 2 for IMAD.WIDE's addend) read
stale predicates and addresses (docs/ISA.md).

Classes are named by what an instruction is, per operand where one instruction is two
(IMAD.WIDE's halves); the tables are read writer -> reader.
"""

from __future__ import annotations

from functools import cache
from types import MappingProxyType

# -- who writes ----------------------------------------------------------------------------
ALU = "alu"  # the integer and logic pipe, compares and selects
FMA = "fma"  # the multiply-add pipe: FADD, FMUL, FFMA, IMAD, VIADD
WIDE_LOW, WIDE_HIGH = "wide-low", "wide-high"  # IMAD.WIDE's two result registers
MMA = "mma"  # HFMA2.MMA, on the tensor pipe's datapath
EITHER = "alu-or-fma"  # a pipe the tables do not name for sm_90: the worse of both
UNIFORM_LOAD = "uniform-load"  # ULDC, UMOV
UNIFORM = "uniform"  # the uniform datapath's arithmetic: UIADD3, UIMAD.WIDE, ULEA

# -- who reads (ALU, FMA and MMA read as they write) ---------------------------------------
WIDE_AB = "wide-ab"  # IMAD.WIDE's factors
WIDE_C_HIGH = "wide-c-high"  # the upper register of IMAD.WIDE's addend (the lower: FMA)
DECOUPLED = "decoupled"  # a variable-latency instruction that is not a memory access
MEMORY = "memory"  # loads, stores, shuffles, barriers: the address unit
GUARD = "guard"  # an instruction's guard predicate

WRITERS_BY_MNEMONIC = MappingProxyType({
    **dict.fromkeys(("FMNMX", "FSEL", "FSETP", "IADD3", "IADD3.X", "ISETP", "LEA",
                     "LEA.HI.SX32", "LEA.HI.X", "LOP3.LUT", "MOV", "PLOP3.LUT", "SEL",
                     "SHF"), ALU),
    **dict.fromkeys(("FADD", "FFMA", "FMUL", "IMAD", "VIADD"), FMA),  # VIADD: as ptxas reads it
    "HFMA2.MMA": MMA,
    **dict.fromkeys(("ULDC", "UMOV"), UNIFORM_LOAD),
    **dict.fromkeys(("UIADD3", "UIMAD.WIDE", "ULEA"), UNIFORM),
})
MEMORY_MNEMONICS = frozenset(("LDG.E", "STG.E", "LDS", "STS", "SHFL",
                              "BAR.SYNC.DEFER_BLOCKING", "RED.E.ADD.64.STRONG.GPU",
                              "REDG.E.ADD.64.STRONG.GPU"))
BARRIERS = frozenset(("BAR.SYNC.DEFER_BLOCKING",))

# Registers: writer -> {reader: cycles}.
_REGISTER = {
    ALU: {ALU: 4, FMA: 5, WIDE_AB: 5, WIDE_C_HIGH: 3, MMA: 6, DECOUPLED: 4, MEMORY: 5},
    FMA: {ALU: 5, FMA: 4, WIDE_AB: 4, WIDE_C_HIGH: 2, MMA: 6, DECOUPLED: 4, MEMORY: 5},
    # IMAD.WIDE's halves read by the FMA pipe: ptxas's sm_90 code never reads them sooner
    # than 4 and 6 cycles (NAK's Ampere tables: 2 and 4), so Bob waits as long.
    WIDE_LOW: {ALU: 3, FMA: 4, WIDE_AB: 4, WIDE_C_HIGH: 2, MMA: 6, DECOUPLED: 4, MEMORY: 5},
    WIDE_HIGH: {ALU: 5, FMA: 6, WIDE_AB: 6, WIDE_C_HIGH: 2, MMA: 6, DECOUPLED: 4, MEMORY: 5},
    MMA: {ALU: 10, FMA: 10, WIDE_AB: 10, WIDE_C_HIGH: 8, MMA: 6, DECOUPLED: 6, MEMORY: 7},
}
_REGISTER[EITHER] = {reader: max(_REGISTER[ALU][reader], _REGISTER[FMA][reader])
                     for reader in _REGISTER[ALU]}
# Predicates: an ALU-pipe compare or an FMA-pipe carry (IMAD), read as an operand by
# either pipe (any other writer: 5) ...
_PREDICATE = {ALU: {ALU: 4, FMA: 5}, FMA: {ALU: 5, FMA: 4}}
_PREDICATE_DISPATCH = 13  # ... and by a guard, a branch or a variable-latency instruction
# Uniform registers: a uniform load, or the uniform datapath, read by ...
_UNIFORM = {
    UNIFORM_LOAD: {"vector": 2, DECOUPLED: 2, UNIFORM: 2},
    UNIFORM: {"vector": 6, DECOUPLED: 9, UNIFORM: 4},
}
UNIFORM_PREDICATE = 2  # the uniform predicates ptxas's code uses (Bob's own use none)

# From a BAR.SYNC to the next memory access: NAK's execution latency of barriers from
# sm_80 on; ptxas's sm_90 code never issues one sooner (276 barriers in Bob's kernels). An
# LDS one cycle after the barrier read a reduction's slot before the other warps' last
# store: whole rows of the own loss kernels wrong on the H200.
BARRIER_LATENCY = 6
BARRIER = ("barrier", ("", 0))  # the key of the barrier's countdown

# A variable-latency write after a fixed-latency read of the same register (WAR), and
# after a fixed-latency write of it when the variable-latency one is guarded (WAW).
VARIABLE_WRITE_AFTER_READ = 2
GUARDED_VARIABLE_WRITE_AFTER_WRITE = 5

# Every reader a result is counted down for (``readiness``), in this order.
READERS = (ALU, FMA, EITHER, WIDE_AB, WIDE_C_HIGH, MMA, DECOUPLED, MEMORY, GUARD, UNIFORM)
READER_INDEX = MappingProxyType({reader: i for i, reader in enumerate(READERS)})
_DISPATCHED = (DECOUPLED, MEMORY, GUARD)


def _register(writer: str, reader: str) -> int:
    if reader == EITHER:
        return max(_register(writer, ALU), _register(writer, FMA))
    return _REGISTER[writer][DECOUPLED if reader in (GUARD, UNIFORM) else reader]


def _predicate(writer: str, reader: str) -> int:
    if reader in _DISPATCHED or reader in (MMA, UNIFORM):
        return _PREDICATE_DISPATCH
    if reader == EITHER:
        return max(_predicate(writer, ALU), _predicate(writer, FMA))
    pipe = ALU if reader == ALU else FMA
    return _PREDICATE[writer][pipe] if writer in _PREDICATE else 5


def _uniform(writer: str, reader: str) -> int:
    table = _UNIFORM[writer if writer in _UNIFORM else UNIFORM]
    if reader in _DISPATCHED:
        return table[DECOUPLED]
    return table[UNIFORM] if reader == UNIFORM else table["vector"]


def latency(kind: str, writer: str, reader: str) -> int:
    """Cycles from a fixed-latency write of a `kind` register ("R", "P", "UR", "UP") by
    `writer` to its read by `reader`."""
    if kind == "P":
        return _predicate(writer, reader)
    if kind == "UR":
        return _uniform(writer, reader)
    if kind == "UP":
        return UNIFORM_PREDICATE
    return _register(writer, reader)


@cache
def readiness(kind: str, writer: str) -> tuple[int, ...]:
    """The cycles each reader of READERS waits for the result, in that order."""
    return tuple(latency(kind, writer, reader) for reader in READERS)


def writer_class(mnemonic: str, uniform: bool) -> str:
    if mnemonic in WRITERS_BY_MNEMONIC:
        return WRITERS_BY_MNEMONIC[mnemonic]
    return UNIFORM if uniform else EITHER


def reader_class(mnemonic: str, variable: bool, uniform: bool) -> str:
    """The class of an instruction's register sources (IMAD.WIDE's are per operand)."""
    if uniform:
        return UNIFORM
    if variable or mnemonic in ("BRA", "EXIT", "RET.REL.NODEC", "CALL.REL.NOINC",
                                "BPT.TRAP", "BSSY", "BSYNC", "VOTE"):
        return MEMORY if mnemonic in MEMORY_MNEMONICS else DECOUPLED
    found = WRITERS_BY_MNEMONIC.get(mnemonic, EITHER)
    return EITHER if found in (EITHER, UNIFORM, UNIFORM_LOAD) else found
