"""The health check in Bob's own machine code: health[t] += the count of non-finite elements
of table t (parameters, first_moment, second_moment), as ``bob_health`` in
``cuda/bob_kernels.cu`` and ``reference.health``.

A count is an integer, so any order of counting gives the same bytes. The shape is
``seed.adamw``'s: a grid-stride loop over a block-wide 64-bit base (V x V reaches 2^32),
here over 16-byte quads of the tables (LDG.E.128; the signature makes them 16-byte
aligned), each lane's quad under a predicate; the last V x V mod 4 elements go one each
to the first lanes of block 0. An element is non-finite where its exponent bits are all
ones, tested on the bits: (x & 0x7F800000) + 0x00800000 has bit 31 set exactly then.
Each lane counts in 64 bits; each warp adds its lanes' counts by shuffles (SHFL.DOWN of
both words, lane 0 ending with the warp's total), lane 0 of each warp puts it in shared
memory, and after one barrier lanes 0..2 add the eight warps' totals of their table and
add it to health with one 64-bit atomic each (RED.E.ADD.64), only where it is not zero
(a healthy table costs no atomics).
``count_non_finite`` writes it over any element count: the collapsed tables' check
(``collapsed_io``) counts over their V + K classes with the same code.
"""

from __future__ import annotations

from collections.abc import Callable

from bob.isa.builder import Image
from bob.isa.model import RZ, CBuf, GMem, Imm, SMem
from bob.kernels import signatures as sig
from bob.kernels.own.asm import DESC, FULL_CLAMP, LANES, POS_INF, PTP, WARP, Asm, p, r

EXPONENT = POS_INF  # the exponent bits of a binary32
CARRY_TO_SIGN = 0x00800000  # added to the exponent bits: bit 31 set where they are all ones
WARPS = LANES // WARP
TABLE_BYTES = 8 * WARPS  # one table's 64-bit warp totals in shared memory

# Registers: 64-bit values in aligned pairs, the loaded quads in aligned fours.
TID, CTAID, X = 0, 1, 2
COUNT, QUADS, STRIDE, BASE, INDEX = 4, 6, 8, 10, 12
BAD = (14, 16, 18)  # each table's 64-bit count, per lane
ADDRESSES = (20, 22, 24)
WORD = 26  # the warp's place in a table's shared totals: (tid / 32) * 8
QUAD_REGISTERS = (28, 32, 36)
FLAGS = 40  # 40..43: a quad's four flags
SUM = 44
MINE, THEIRS = (46, 50, 54), (48, 52, 56)  # the tree's pairs, per table


def _flag(s: Asm, d: int, x: int) -> None:
    """d := 1 where the binary32 bits in x are NaN or +-inf, else 0."""
    s.logic(d, r(x), EXPONENT, r(RZ), 0xC0)  # a & b
    s.add(d, r(d), CARRY_TO_SIGN)
    s.shr(d, r(d), 31)


def _add_wide(s: Asm, count: int, value: int) -> None:
    """count:count+1 += the 32-bit value."""
    s.wide(count, r(value), 1, count)


def _count_quad(s: Asm, count: int, quad: int) -> None:
    """count += the non-finite elements of the four words quad..quad+3."""
    for k in range(4):
        _flag(s, FLAGS + k, quad + k)
    s.op("IADD3.RRRR", r(SUM), r(FLAGS), r(FLAGS + 1), r(FLAGS + 2))
    s.add(SUM, r(SUM), r(FLAGS + 3))
    _add_wide(s, count, SUM)


def health(arch: str) -> Image:
    return count_non_finite(arch, sig.HEALTH, "bob_health", _table_cells)


def _table_cells(s: Asm) -> None:
    """COUNT:COUNT+1 := V x V, the dense tables' elements (64 bits)."""
    s.op("LDC", r(X), CBuf(0, s.slots["vocab"], index=RZ))
    s.wide(COUNT, r(X), r(X), RZ)


def count_non_finite(arch: str, region: str, entry: str, elements: Callable[[Asm], None],
                     ) -> Image:
    """The health check of `region` (its tables and health named as bob-health's), over
    as many elements of each table as `elements` leaves in COUNT:COUNT+1 (it may clobber
    X)."""
    s = Asm(arch, sig.SIGNATURES[region])
    s.prologue(TID, CTAID, scratch=X)
    names = sig.HEALTH_COUNTS
    elements(s)
    # quads = count / 4, a 64-bit shift right by 2 from the two words.
    s.shr(QUADS, r(COUNT), 2)
    s.shl(X, r(COUNT + 1), 30)
    s.logic(QUADS, r(QUADS), r(X), r(RZ), 0xFC)  # a | b
    s.shr(QUADS + 1, r(COUNT + 1), 2)
    s.op("LDC", r(X), CBuf(0, 0xC, index=RZ))  # gridDim.x
    s.wide(STRIDE, r(X), LANES, RZ)
    s.wide(BASE, r(CTAID), LANES, RZ)
    for bad in BAD:
        s.mov(bad, 0)
        s.mov(bad + 1, 0)
    top, end = s.fresh("quads"), s.fresh("quads_done")
    s.b.label(top)
    s.isetp(6, "GE", r(BASE), r(QUADS))
    s.isetp_ex(6, "GE", r(BASE + 1), r(QUADS + 1), p(6))
    s.b.bra(end, guard=p(6))
    s.wide(INDEX, r(TID), 1, BASE)
    s.isetp(5, "LT", r(INDEX), r(QUADS))
    s.isetp_ex(5, "LT", r(INDEX + 1), r(QUADS + 1), p(5))
    for address, name in zip(ADDRESSES, names, strict=True):
        s.pointer(address, name)
        s.wide(address, r(INDEX), 16, address)
        s.mad(address + 1, r(INDEX + 1), 16, r(address + 1))
    for quad, address in zip(QUAD_REGISTERS, ADDRESSES, strict=True):
        for k in range(4):
            s.mov(quad + k, 0)  # a lane past the end counts four finite zeros
        s.op("LDG.E", r(quad), GMem(address, 0, DESC), mods="128", guard=p(5))
    for bad, quad in zip(BAD, QUAD_REGISTERS, strict=True):
        _count_quad(s, bad, quad)
    s.wide(BASE, r(STRIDE), 1, BASE)
    s.add(BASE + 1, r(BASE + 1), r(STRIDE + 1))
    s.b.bra(top)
    s.b.label(end)
    # The last count mod 4 elements: element 4 * quads + ctaid * 256 + tid, for the few
    # lanes of block 0 below count (the grid's stride is at least 256 > 3).
    s.wide(INDEX, r(CTAID), LANES, RZ)
    s.wide(INDEX, r(TID), 1, INDEX)
    s.wide(INDEX, r(QUADS), 4, INDEX)
    s.mad(INDEX + 1, r(QUADS + 1), 4, r(INDEX + 1))
    s.isetp(5, "LT", r(INDEX), r(COUNT))
    s.isetp_ex(5, "LT", r(INDEX + 1), r(COUNT + 1), p(5))
    for bad, quad, address, name in zip(BAD, QUAD_REGISTERS, ADDRESSES, names, strict=True):
        s.pointer(address, name)
        s.wide(address, r(INDEX), 4, address)
        s.mad(address + 1, r(INDEX + 1), 4, r(address + 1))
        s.mov(quad, 0)
        s.ldg(quad, address, guard=p(5))
        _flag(s, FLAGS, quad)
        _add_wide(s, bad, FLAGS)
    _warp_totals(s)
    # Lanes 0..2: health[tid] += the block's total of table tid (its warps' totals), where
    # it is not zero.
    total = MINE[0]
    s.shl(X, r(TID), 6)  # tid * TABLE_BYTES
    s.isetp(4, "LT", r(TID), len(names))
    s.mov(total, 0)
    s.mov(total + 1, 0)
    for warp in range(WARPS):
        s.op("LDS", r(THEIRS[0]), _smem(s, X, 8 * warp), mods="64", guard=p(4))
        _add_pair(s, total, THEIRS[0])  # past lane 2 a stale sum, which P2 never stores
    s.isetp(1, "NE", r(total), 0)
    s.isetp_ex(1, "NE", r(total + 1), r(RZ), p(1))
    s.isetp(2, "LT", r(TID), len(names), other=p(1))
    s.pointer(ADDRESSES[0], "health")
    s.wide(ADDRESSES[0], r(TID), 8, ADDRESSES[0])
    s.op("RED.E.ADD.64", GMem(ADDRESSES[0], 0, DESC), r(total), guard=p(2))
    s.exit()
    return s.image(entry, shared_bytes=len(names) * TABLE_BYTES)


def _smem(s: Asm, base: int, offset: int) -> SMem:
    return SMem(base, s.facts.shared_base + offset)


def _add_pair(s: Asm, total: int, value: int) -> None:
    """total:total+1 += value:value+1 (64 bits)."""
    _add_wide(s, total, value)
    s.add(total + 1, r(total + 1), r(value + 1))


def _warp_totals(s: Asm) -> None:
    """Each table's lane counts summed over the warp into lane 0 (SHFL.DOWN of both words,
    16 .. 1: lane l adds lane l + step's, the lanes past the warp adding their own, which
    lane 0's total never takes), which stores it in the table's slot of the warp; one
    barrier."""
    step = WARP // 2
    while step:
        for t, bad in enumerate(BAD):
            for word in range(2):
                s.op("SHFL.PRRII", PTP, r(THEIRS[t] + word), r(bad + word), Imm(step),
                     Imm(FULL_CLAMP), mods="DOWN")
        for t, bad in enumerate(BAD):
            _add_pair(s, bad, THEIRS[t])
        step //= 2
    s.shr(WORD, r(TID), 5)
    s.shl(WORD, r(WORD), 3)
    s.logic(X, r(TID), WARP - 1, r(RZ), 0xC0)  # a & b: the lane
    s.isetp(0, "EQ", r(X), 0)
    for t, bad in enumerate(BAD):
        s.op("STS", _smem(s, WORD, t * TABLE_BYTES), r(bad), mods="64", guard=p(0))
    s.barrier()


BUILDERS = {sig.HEALTH: health}
