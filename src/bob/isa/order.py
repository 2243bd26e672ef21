"""Instruction order within straight runs of code: a list scheduler.

The builder's ``schedule`` sets controls for the order the kernel was written in, so a
chain of dependent instructions stalls for every latency in it. ``reorder`` first moves
independent instructions into those stalls, as a compiler's list scheduler does: within
each straight run (between labels, branches and barriers) it issues, cycle by cycle, the
instruction whose operands are ready soonest, preferring the longest chain behind it.

Order is kept wherever it could matter:

- every register, predicate and uniform register: a read after a write, a write after a
  read, a write after a write (a guarded write keeps the old value: it is a read too);
- every memory access (global, shared, constant bank index loads aside) after each
  earlier one that is a store, and each store after every earlier access: loads may pass
  loads;
- branches, EXIT, traps, barriers and instructions the checker does not know stay where
  they are, and nothing crosses them or a label.

What the reordered code computes is what the written order computes, instruction for
instruction; ``schedule`` then sets its controls and ``bob.isa.check`` proves them. The
builder keeps a run's new order only where the program's fixed stalls, as ``schedule``
sets them, come out fewer (``reorder``'s `cost`).
"""

from __future__ import annotations

from collections.abc import Callable

from bob.isa import latency
from bob.isa.check import Effects, effects
from bob.isa.fields import Table
from bob.isa.model import Instruction

# The cycles the order assumes a variable-latency result takes (the controls wait for
# the real one on a scoreboard): long enough that the order issues a load's readers last.
ASSUMED_LATENCY = {"LDG": 300, "LDS": 30, "LDC": 20, "S2R": 20, "MUFU": 18}
DEFAULT_VARIABLE_LATENCY = 20
STORES = ("STG", "STS", "RED", "ATOM", "ATOMG", "ATOMS")
LOADS = ("LDG", "LDS")
FENCES = ("BRA", "EXIT", "BPT", "BAR", "CALL", "RET", "MEMBAR", "SHFL", "WARPSYNC",
          "DEPBAR", "NOP")


def _opcode(instruction: Instruction, table: Table) -> str:
    return table.form(instruction.form).mnemonic.split(".")[0]


def _is_fence(instruction: Instruction, table: Table, fx: Effects) -> bool:
    return not fx.known or _opcode(instruction, table) in FENCES


def _result_latency(instruction: Instruction, table: Table, fx: Effects,
                    register: tuple[str, int], reader: str) -> int:
    if fx.variable:
        return ASSUMED_LATENCY.get(_opcode(instruction, table), DEFAULT_VARIABLE_LATENCY)
    return fx.readiness(register)[latency.READER_INDEX[reader]]


def _run(instructions: list[Instruction], table: Table) -> list[Instruction]:
    """One straight run, reordered."""
    count = len(instructions)
    if count < 3:
        return instructions
    fx = [effects(each, table) for each in instructions]
    opcodes = [_opcode(each, table) for each in instructions]
    # predecessors[j]: (i, cycles after i's issue that j may issue)
    predecessors: list[list[tuple[int, int]]] = [[] for _ in range(count)]
    for j in range(count):
        reads_j = fx[j].reads | (fx[j].writes if fx[j].guarded else frozenset())
        for i in range(j):
            cycles = -1
            for register, reader in fx[j].sources:
                if register in fx[i].writes:
                    cycles = max(cycles, _result_latency(instructions[i], table, fx[i],
                                                         register, reader))
            if fx[j].guarded and fx[i].writes & fx[j].writes:
                cycles = max(cycles, 1)
            if fx[i].reads & fx[j].writes or fx[i].writes & fx[j].writes \
                    or fx[i].writes & reads_j:
                cycles = max(cycles, 1)
            memory_i = opcodes[i] in LOADS or opcodes[i] in STORES
            memory_j = opcodes[j] in LOADS or opcodes[j] in STORES
            if memory_i and memory_j and (opcodes[i] in STORES or opcodes[j] in STORES):
                cycles = max(cycles, 1)
            if cycles >= 0:
                predecessors[j].append((i, max(cycles, 1)))
    successors: list[list[tuple[int, int]]] = [[] for _ in range(count)]
    for j, edges in enumerate(predecessors):
        for i, cycles in edges:
            successors[i].append((j, cycles))
    height = [0] * count  # the longest chain of cycles from an instruction to the run's end
    for i in reversed(range(count)):
        height[i] = max((cycles + height[j] for j, cycles in successors[i]), default=1)

    waiting = [len(edges) for edges in predecessors]
    issued_at: dict[int, int] = {}
    order: list[int] = []
    cycle = 0
    candidates = {i for i in range(count) if not waiting[i]}
    while candidates:
        def earliest(i: int) -> int:
            return max((issued_at[p] + cycles for p, cycles in predecessors[i]), default=0)

        chosen = min(candidates, key=lambda i: (max(earliest(i), cycle), -height[i], i))
        candidates.remove(chosen)
        cycle = max(earliest(chosen), cycle) + 1
        issued_at[chosen] = cycle - 1
        order.append(chosen)
        for j, _ in successors[chosen]:
            waiting[j] -= 1
            if not waiting[j]:
                candidates.add(j)
    return [instructions[i] for i in order]


def runs(instructions: list[Instruction], table: Table,
         block_starts: set[int] | frozenset[int] = frozenset()) -> list[tuple[int, int]]:
    """The straight runs as (first, end) index pairs: split at every block start and
    around every fence (branch, EXIT, barrier, unknown instruction)."""
    spans: list[tuple[int, int]] = []
    first = 0
    for index, instruction in enumerate(instructions):
        if index in block_starts and index > first:
            spans.append((first, index))
            first = index
        if _is_fence(instruction, table, effects(instruction, table)):
            if index > first:
                spans.append((first, index))
            first = index + 1
    if len(instructions) > first:
        spans.append((first, len(instructions)))
    return spans


def reorder(instructions: list[Instruction], table: Table,
            block_starts: set[int] | frozenset[int] = frozenset(),
            cost: Callable[[list[Instruction]], float] | None = None) -> list[Instruction]:
    """`instructions` with each straight run list-scheduled; every fence and every block
    start keeps its index, so resolved branch offsets and labels stay true.

    With `cost` (of a whole program: lower is better), a run takes its new order only
    where the program costs less with it than without: the list scheduler's estimate of
    the machine is coarser than the controls' own, and a run it would slow stays as it
    was. The result never costs more than the written order."""
    result = list(instructions)
    best = cost(result) if cost else 0.0
    for first, end in runs(instructions, table, block_starts):
        ordered = _run(result[first:end], table)
        if ordered == result[first:end]:
            continue
        candidate = result[:first] + ordered + result[end:]
        if cost is None:
            result = candidate
            continue
        price = cost(candidate)
        if price < best:
            result, best = candidate, price
    return result
