"""The sparse corpus input's kernels in Bob's own machine code (docs/ARITHMETIC.md, "Sparse
corpus input"; ``cuda/bob_sparse.cuh``): the scatter of (key, value) pairs into a cleared
V x V table, and the corpus loss of each row with no gradient stored."""

from __future__ import annotations

from bob.isa.builder import Image
from bob.isa.model import RZ, CBuf, GMem
from bob.kernels import signatures as sig
from bob.kernels.own.asm import (
    DESC,
    LANES,
    TREE_SCRATCH,
    TRIP_GUARDS,
    UNROLL,
    Asm,
    Loop,
    Scratch,
    Trip,
    log2,
    p,
    r,
    tree,
)
from bob.kernels.own.seed import (
    CTAID,
    SECOND_TREE,
    TID,
    TWO_TREES,
    VOCAB,
    WORD,
    _exp_sums,
    _exponent,
    _loss_start,
    _row_max,
)

GRID_X = 0xC  # gridDim.x in constant bank 0
NO_KEY = 0xFFFFFFFF  # both words of the key a lane without a pair holds: never < V x V


def scatter(arch: str) -> Image:
    """table[keys[i]] = values[i] as bits for every i < count whose key < V x V, grid-stride
    over a 64-bit index: V x V reaches 2^32 at V = 65536, so the key is compared in 64 bits.
    Keys are distinct, so no two lanes write one cell. As every own kernel, it traps
    unless blockDim.x is 256 (the plan's block); the stride is gridDim.x * 256."""
    s = Asm(arch, sig.SIGNATURES[sig.SCATTER])
    s.prologue(TID, CTAID, scratch=2)
    x = 2
    count, cells, stride, base, index, key = 4, 6, 8, 10, 12, 14  # 64-bit pairs
    value, address = 16, 18
    table, keys, values = 20, 22, 24  # the pointers
    s.op("LDC", r(x), CBuf(0, s.slots["count"], index=RZ))
    s.wide(count, r(x), 1, RZ)  # zero-extended
    s.op("LDC", r(x), CBuf(0, s.slots["vocab"], index=RZ))
    s.wide(cells, r(x), r(x), RZ)
    s.op("LDC", r(x), CBuf(0, GRID_X, index=RZ))
    s.wide(stride, r(x), LANES, RZ)
    s.wide(base, r(CTAID), LANES, RZ)
    s.pointer(table, "table")
    s.pointer(keys, "keys")
    s.pointer(values, "values")
    top, end = s.fresh("loop"), s.fresh("done")
    s.b.label(top)
    s.isetp(6, "GE", r(base), r(count))
    s.isetp_ex(6, "GE", r(base + 1), r(count + 1), p(6))
    s.b.bra(end, guard=p(6))
    s.wide(index, r(TID), 1, base)
    s.isetp(5, "LT", r(index), r(count))
    s.isetp_ex(5, "LT", r(index + 1), r(count + 1), p(5))
    s.mov(key, NO_KEY)
    s.mov(key + 1, NO_KEY)
    s.wide(address, r(index), 8, keys)
    s.mad(address + 1, r(index + 1), 8, r(address + 1))
    s.op("LDG.E", r(key), GMem(address, 0, DESC), mods="64", guard=p(5))
    s.isetp(4, "LT", r(key), r(cells))
    s.isetp_ex(4, "LT", r(key + 1), r(cells + 1), p(4))  # a pair, its cell in the table
    s.wide(address, r(index), 4, values)
    s.mad(address + 1, r(index + 1), 4, r(address + 1))
    s.ldg(value, address, guard=p(4))
    s.wide(address, r(key), 4, table)
    s.mad(address + 1, r(key + 1), 4, r(address + 1))
    s.stg(address, value, guard=p(4))
    s.wide(base, r(stride), 1, base)
    s.add(base + 1, r(base + 1), r(stride + 1))
    s.b.bra(top)
    s.b.label(end)
    s.exit()
    return s.image("bob_scatter")


def loss_corpus(arch: str) -> Image:
    """One block per row r, weights T: loss[r] = ln2 sum_j T_j (L - z_j), L = log2(s), by
    ``seed.loss_gradient_corpus``'s operations in its order (so its bits), without the
    weights' row sum and the gradient that only it needs."""
    s = Asm(arch, sig.SIGNATURES[sig.LOSS_ONLY_CORPUS])
    w_row, t_row, address = 4, 6, 8
    base, j, x, z, e, m, total, partial, weight, big_l = range(10, 20)
    # The loops' registers past 29 are log2's scratch, which no loop overlaps.
    values, weights, left, rest = (x, 20, 21, 22), (weight, 23, 29, 30), 31, 32
    trip = Trip(s, TID, j, left, rest)
    _loss_start(s, ((w_row, "parameters"), (t_row, "weights")), scratch=address)
    _row_max(s, m, base, trip, values, w_row, address, Scratch(24, 4))
    s.mov(partial, 0)
    _exp_sums(s, base, trip, values, m, z, e, partial, w_row, address)
    tree(s, total, partial, WORD, "sum", Scratch(24, TREE_SCRATCH), SECOND_TREE,
         closing_barrier=False)
    log2(s, big_l, total, Scratch(30, 32))
    s.mov(partial, 0)
    with Loop(s, base, r(VOCAB), step=UNROLL * LANES):
        trip.start(base, VOCAB)
        s.wide(address, r(j), 4, w_row)
        trip.load(values, address, 0)
        s.wide(address, r(j), 4, t_row)
        trip.load(weights, address, 0)
        for k in trip.each():
            _exponent(s, z, values[k], m)
            s.fadd(z, r(big_l), r(z, neg=True))
            s.fmul(z, r(z), r(weights[k]))
            s.fadd(partial, r(partial), r(z), guard=p(TRIP_GUARDS[k]))
    tree(s, total, partial, WORD, "sum", Scratch(24, TREE_SCRATCH), closing_barrier=False)
    s.fmul(total, r(total), s.param("ln2"))
    s.canonical(total, 0)
    s.isetp(4, "EQ", r(TID), 0)
    s.pointer(address, "loss")
    s.wide(address, r(CTAID), 4, address)
    s.stg(address, total, guard=p(4))
    s.exit()
    return s.image("bob_loss_corpus", shared_bytes=TWO_TREES)


BUILDERS = {
    sig.SCATTER: scatter,
    sig.LOSS_ONLY_CORPUS: loss_corpus,
}
