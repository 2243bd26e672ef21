"""The collapsed tables' gather, scatter and health check in Bob's own machine code
(docs/ARITHMETIC.md, "Collapsed tables"; ``bob_collapsed_gather``, ``bob_collapsed_scatter``
and ``bob_collapsed_health`` in ``cuda/bob_collapsed.cuh``; ``collapsed.reference``).

A table of classes is f32[V + K]: class r < V is row r's rest, class V + i exception i;
row r's exceptions are i in [row_offsets[r], row_offsets[r + 1]) at columns[i], sorted.
None of these kernels does arithmetic on binary32: each moves bits or counts them, so
the bytes are the reference's by construction.

- The gather writes the rest's bits over the whole row, then, after a barrier, each
  exception's bits at its column (one block; a prompt >= V gives canonical NaNs).
- The scatter splits each 64-bit key into row and column by an exact division by V
  (``_divide``: restoring long division, V <= MAX_VOCAB), then binary-searches the
  column among the row's exceptions; each lane runs the search under predicates for a
  number of rounds that depends on V alone, so every branch stays uniform.
- The health check is ``health.count_non_finite`` over the V + K classes.

The kernels read every parameter the plan declares (``own_regions`` checks that the image
reads its signature); those a kernel has no use for are read once into a dead register.
"""

from __future__ import annotations

from bob.config import MAX_VOCAB
from bob.isa.builder import Image
from bob.isa.model import RZ, CBuf, GMem
from bob.kernels import signatures as sig
from bob.kernels.own import health
from bob.kernels.own.asm import DESC, LANES, NAN_BITS, Asm, Loop, p, r
from bob.plan.model import PointerParam

GRID_X = 0xC  # gridDim.x in constant bank 0
NO_KEY = 0xFFFFFFFF  # both words of a lane without a pair: never < V x V
NO_EXCEPTION = 0xFFFFFFFF  # the search's result where the column is no exception
# The division's quotient bits: a key below V x V <= V x 2^20 has a quotient below 2^20.
QUOTIENT_BITS = MAX_VOCAB.bit_length() - 1
assert 1 << QUOTIENT_BITS == MAX_VOCAB


def _read_unused(s: Asm, region: str, names: tuple[str, ...], dead: int) -> None:
    """Read the declared parameters `names` the kernel has no use for into the pair
    `dead` (a pointer 8 bytes, a scalar 4, as the plan's block holds them)."""
    pointers = {param.name for param in sig.SIGNATURES[region]
                if isinstance(param, PointerParam)}
    for name in names:
        if name in pointers:
            s.pointer(dead, name)
        else:
            s.op("LDC", r(dead), CBuf(0, s.slots[name], index=RZ))


# -- the gather --------------------------------------------------------------------------


def gather(arch: str) -> Image:
    """logits = the expanded row prompt[0] of the parameters, as bits."""
    s = Asm(arch, sig.SIGNATURES[sig.COLLAPSED_GATHER])
    tid, x, vocab, row, rest, base, j = 0, 1, 2, 3, 4, 5, 6
    first, last, column, value, index = 7, 8, 9, 10, 11
    out, classes, address, pointer = 12, 14, 16, 18  # 64-bit pairs
    s.prologue(tid, None, scratch=x)
    _read_unused(s, sig.COLLAPSED_GATHER, ("lane_order", "exceptions", "classes", "offsets"),
                 pointer)
    s.op("LDC", r(vocab), CBuf(0, s.slots["vocab"], index=RZ))
    s.pointer(address, "prompt")
    s.ldg(row, address)
    s.isetp(1, "LT", r(row), r(vocab))  # the same in every lane: a uniform exit below
    s.pointer(classes, "parameters")
    s.wide(address, r(row), 4, classes)
    s.mov(rest, NAN_BITS)
    s.ldg(rest, address, guard=p(1))
    s.pointer(out, "logits")
    with Loop(s, base, r(vocab)):
        s.add(j, r(base), r(tid))
        s.isetp(2, "LT", r(j), r(vocab))
        s.wide(address, r(j), 4, out)
        s.stg(address, rest, guard=p(2))
    s.exit(guard=p(1, True))
    s.barrier()  # the exceptions' bits land over the rest's
    s.pointer(pointer, "row_offsets")
    s.wide(address, r(row), 4, pointer)
    s.ldg(first, address)
    s.ldg(last, address, offset=4)
    s.pointer(pointer, "columns")
    top, end = s.fresh("exceptions"), s.fresh("exceptions_done")
    s.mov(base, r(first))
    s.b.label(top)
    s.isetp(6, "GE", r(base), r(last))
    s.b.bra(end, guard=p(6))
    s.add(index, r(base), r(tid))
    s.isetp(2, "LT", r(index), r(last))
    s.wide(address, r(index), 4, pointer)
    s.ldg(column, address, guard=p(2))
    s.add(x, r(index), r(vocab))  # class V + i (below `classes`, a u32)
    s.wide(address, r(x), 4, classes)
    s.ldg(value, address, guard=p(2))
    s.wide(address, r(column), 4, out)
    s.stg(address, value, guard=p(2))
    s.add(base, r(base), LANES)
    s.b.bra(top)
    s.b.label(end)
    s.exit()
    return s.image("bob_collapsed_gather")


# -- the scatter -------------------------------------------------------------------------


def _divide(s: Asm, quotient: int, remainder: int, key: int, vocab: int, low: int,
            bit: int) -> None:
    """quotient, remainder := key / V, key mod V, exactly, for a 64-bit key < V x V and
    V <= 2^20 (so the quotient < V fits QUOTIENT_BITS bits). Clobbers `low`, `bit`, P0.

    Restoring long division of the key's low QUOTIENT_BITS bits with the rest as the
    starting remainder: key >> 20 < V because key < V x V <= V x 2^20. Each step takes the
    next bit, 2R + bit < 2V < 2^21, and subtracts V where that reaches V, setting the
    quotient's bit: R < V stays true, and key = quotient V + R at the end."""
    s.shr(remainder, r(key), QUOTIENT_BITS)
    s.lea(remainder, r(key + 1), r(remainder), 32 - QUOTIENT_BITS)  # key >> 20
    s.shl(low, r(key), 32 - QUOTIENT_BITS)  # the low bits, the next one at bit 31
    s.mov(quotient, 0)
    for position in reversed(range(QUOTIENT_BITS)):
        s.shr(bit, r(low), 31)
        s.shl(low, r(low), 1)
        s.lea(remainder, r(remainder), r(bit), 1)
        s.isetp(0, "GE", r(remainder), r(vocab))
        s.add(remainder, r(remainder), r(vocab, neg=True), guard=p(0))
        s.add(quotient, r(quotient), 1 << position, guard=p(0))


def scatter(arch: str) -> Image:
    """weights[i] = values[j] as bits where key j (row x V + column) is exception i, for
    j < count, grid-stride over a 64-bit index (the keys are u64; V x V reaches 2^40).
    A key >= V x V (a row >= V) or one that is no exception is not written. Keys are
    distinct, so no two lanes write one slot."""
    s = Asm(arch, sig.SIGNATURES[sig.COLLAPSED_SCATTER])
    tid, ctaid, x, vocab = 0, 1, 2, 3
    count, cells, stride, base, index, key, address = 4, 6, 8, 10, 12, 14, 16  # pairs
    weights, keys, values, offsets, columns = 18, 20, 22, 24, 26  # the pointers
    row, column, low_bits, bit = 28, 29, 30, 31
    low, high, middle, found, result, value, rounds = 32, 33, 34, 35, 36, 37, 38
    s.prologue(tid, ctaid, scratch=x)
    _read_unused(s, sig.COLLAPSED_SCATTER, ("exceptions", "classes", "offsets"), x)
    s.op("LDC", r(x), CBuf(0, s.slots["count"], index=RZ))
    s.wide(count, r(x), 1, RZ)  # zero-extended
    s.op("LDC", r(vocab), CBuf(0, s.slots["vocab"], index=RZ))
    s.wide(cells, r(vocab), r(vocab), RZ)
    s.op("LDC", r(x), CBuf(0, GRID_X, index=RZ))
    s.wide(stride, r(x), LANES, RZ)
    s.wide(base, r(ctaid), LANES, RZ)
    for pointer, name in ((weights, "weights"), (keys, "keys"), (values, "values"),
                          (offsets, "row_offsets"), (columns, "columns")):
        s.pointer(pointer, name)
    top, end = s.fresh("pairs"), s.fresh("pairs_done")
    s.b.label(top)
    s.isetp(6, "GE", r(base), r(count))
    s.isetp_ex(6, "GE", r(base + 1), r(count + 1), p(6))
    s.b.bra(end, guard=p(6))
    s.wide(index, r(tid), 1, base)
    s.isetp(5, "LT", r(index), r(count))
    s.isetp_ex(5, "LT", r(index + 1), r(count + 1), p(5))
    s.mov(key, NO_KEY)
    s.mov(key + 1, NO_KEY)
    s.wide(address, r(index), 8, keys)
    s.mad(address + 1, r(index + 1), 8, r(address + 1))
    s.op("LDG.E", r(key), GMem(address, 0, DESC), mods="64", guard=p(5))
    s.isetp(4, "LT", r(key), r(cells))
    s.isetp_ex(4, "LT", r(key + 1), r(cells + 1), p(4))  # a pair whose row is below V
    _divide(s, row, column, key, vocab, low_bits, bit)
    # The row's exceptions [low, high); none for a lane with no row.
    s.mov(low, 0)
    s.mov(high, 0)
    s.wide(address, r(row), 4, offsets)
    s.ldg(low, address, guard=p(4))
    s.ldg(high, address, guard=p(4), offset=4)
    _search(s, result, column, low, high, middle, found, columns, address, rounds, vocab)
    s.isetp(2, "NE", r(result), NO_EXCEPTION)
    s.wide(address, r(index), 4, values)
    s.mad(address + 1, r(index + 1), 4, r(address + 1))
    s.ldg(value, address, guard=p(2))
    s.wide(address, r(result), 4, weights)
    s.stg(address, value, guard=p(2))
    s.wide(base, r(stride), 1, base)
    s.add(base + 1, r(base + 1), r(stride + 1))
    s.b.bra(top)
    s.b.label(end)
    s.exit()
    return s.image("bob_collapsed_scatter")


def _search(s: Asm, result: int, column: int, low: int, high: int, middle: int, found: int,
            columns: int, address: int, rounds: int, vocab: int) -> None:
    """result := the i in [low, high) with columns[i] == column, or NO_EXCEPTION
    (find_exception's binary search). Clobbers low, high, middle, found, address, rounds,
    P0..P3 and P6.

    A round halves each lane's range at least (middle = low + (high - low) / 2; the
    range left is [low, middle) or [middle + 1, high), neither longer than half) and a
    found column empties it. A row holds at most V exceptions, so bit_length(V) rounds
    empty every range: the loop runs that many, the same in every lane, and a lane whose
    range is empty does nothing in a round."""
    s.mov(result, NO_EXCEPTION)
    s.mov(rounds, r(vocab))
    top, end = s.fresh("search"), s.fresh("search_done")
    s.b.label(top)
    s.isetp(6, "EQ", r(rounds), 0)
    s.b.bra(end, guard=p(6))
    s.shr(rounds, r(rounds), 1)
    s.isetp(3, "LT", r(low), r(high))
    s.add(middle, r(high), r(low, neg=True))
    s.shr(middle, r(middle), 1)
    s.add(middle, r(middle), r(low))
    s.wide(address, r(middle), 4, columns)
    s.ldg(found, address, guard=p(3))
    s.isetp(2, "EQ", r(found), r(column), other=p(3))
    s.isetp(1, "LT", r(found), r(column), other=p(3))
    s.isetp(0, "GT", r(found), r(column), other=p(3))
    s.mov(result, r(middle), guard=p(2))
    s.mov(high, r(low), guard=p(2))
    s.add(low, r(middle), 1, guard=p(1))
    s.mov(high, r(middle), guard=p(0))
    s.b.bra(top)
    s.b.label(end)


# -- the health check --------------------------------------------------------------------


def _classes(s: Asm) -> None:
    """COUNT:COUNT+1 := the V + K classes of each table (the u32 `classes`)."""
    s.op("LDC", r(health.X), CBuf(0, s.slots["classes"], index=RZ))
    s.wide(health.COUNT, r(health.X), 1, RZ)


def collapsed_health(arch: str) -> Image:
    """health[t] += the non-finite classes of table t."""
    return health.count_non_finite(arch, sig.COLLAPSED_HEALTH, "bob_collapsed_health",
                                   _classes)


BUILDERS = {
    sig.COLLAPSED_GATHER: gather,
    sig.COLLAPSED_SCATTER: scatter,
    sig.COLLAPSED_HEALTH: collapsed_health,
}
# The scatter's division takes V <= MAX_VOCAB (Bob's largest vocabulary).
VOCAB_LIMITS = {sig.COLLAPSED_SCATTER: MAX_VOCAB}
