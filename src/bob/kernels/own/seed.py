"""The seed schedule's kernels in Bob's own machine code: row gather, the loss-gradient in
both modes, AdamW and greedy argmax (the shapes and routines of ``bob.kernels.own.asm``)."""

from __future__ import annotations

from bob.isa.builder import Image
from bob.isa.model import RZ, CBuf
from bob.kernels import signatures as sig
from bob.kernels.own.asm import (
    ADAM_SCALARS,
    DIVIDE_REGISTERS,
    DIVIDE_SCRATCH,
    LANES,
    NAN_BITS,
    NEG_INF,
    ONE,
    RZR,
    SIGN,
    TREE_BYTES,
    TREE_SCRATCH,
    TRIP_GUARDS,
    UNROLL,
    Asm,
    Loop,
    Reciprocal,
    Scratch,
    Trip,
    adamw_step,
    divide_by,
    exp2,
    keyed_max,
    log2,
    p,
    r,
    reciprocal,
    row_address,
    select_max,
    tree,
)

# Registers: R0 tid, R1 ctaid, R2 tid * 4, R3 the vocabulary; the rest per kernel.
TID, CTAID, WORD, VOCAB = 0, 1, 2, 3
# The loss kernels' trees take two buffers in turn, so that none needs a closing barrier.
SECOND_TREE = TREE_BYTES  # the second buffer's offset
TWO_TREES = 2 * TREE_BYTES


def _start(s: Asm) -> None:
    s.prologue(TID, CTAID, scratch=VOCAB)
    s.shl(WORD, r(TID), 2)
    s.op("LDC", r(VOCAB), CBuf(0, s.slots["vocab"], index=RZ))


def row_gather(arch: str) -> Image:
    """logits[j] = table[prompt[0] * V + j] as bits; a prompt >= V gives canonical NaNs."""
    s = Asm(arch, sig.SIGNATURES[sig.GATHER])
    _start(s)
    row, base, j, value, source, out, address, scratch = 4, 5, 6, 7, 8, 10, 12, 14
    s.pointer(address, "prompt")
    s.ldg(row, address)
    row_address(s, source, "table", row, VOCAB, scratch)
    s.pointer(out, "logits")
    with Loop(s, base, r(VOCAB)):
        s.add(j, r(base), r(TID))
        s.isetp(1, "LT", r(j), r(VOCAB))
        s.isetp(2, "LT", r(row), r(VOCAB), other=p(1))
        s.mov(value, NAN_BITS)
        s.wide(address, r(j), 4, source)
        s.ldg(value, address, guard=p(2))
        s.wide(address, r(j), 4, out)
        s.stg(address, value, guard=p(1))
    s.exit()
    return s.image("bob_row_gather")


def greedy_argmax(arch: str) -> Image:
    """prediction[0] = the lowest j with row[j] maximal, NaN above every number: each
    lane keeps its best (value, index) by `beats`, then the tree in shared memory."""
    s = Asm(arch, sig.SIGNATURES[sig.ARGMAX])
    _start(s)
    base, j, value, best, best_index, source, address = 4, 5, 6, 7, 8, 10, 12
    other, other_index = 14, 15
    indices = 4 * LANES  # the indices' buffer, after the values'
    s.pointer(source, "row")
    s.mov(best, NEG_INF)
    s.mov(best_index, 0xFFFFFFFF)  # loses to every element, even -inf
    with Loop(s, base, r(VOCAB)):
        s.add(j, r(base), r(TID))
        s.isetp(1, "LT", r(j), r(VOCAB))
        s.mov(value, NEG_INF)
        s.wide(address, r(j), 4, source)
        s.ldg(value, address, guard=p(1))
        s.sel(j, r(j), 0xFFFFFFFF, p(1))  # no element: never beats
        _beats(s, value, j, best, best_index)
    s.sts(WORD, 0, best)
    s.sts(WORD, indices, best_index)
    s.barrier()
    step = LANES // 2
    while step:
        s.isetp(0, "LT", r(WORD), 4 * step)
        s.mov(other, NEG_INF)
        s.mov(other_index, 0xFFFFFFFF)
        s.lds(other, WORD, 4 * step, guard=p(0))
        s.lds(other_index, WORD, indices + 4 * step, guard=p(0))
        s.lds(best, WORD, 0, guard=p(0))
        s.lds(best_index, WORD, indices, guard=p(0))
        _beats(s, other, other_index, best, best_index)
        s.sts(WORD, 0, best, guard=p(0))
        s.sts(WORD, indices, best_index, guard=p(0))
        s.barrier()
        step //= 2
    s.isetp(0, "EQ", r(TID), 0)
    s.isetp(0, "EQ", r(CTAID), 0, other=p(0))
    s.pointer(address, "prediction")
    s.stg(address, best_index, guard=p(0))
    s.exit()
    return s.image("bob_greedy_argmax", shared_bytes=8 * LANES)


def _beats(s: Asm, value: int, index: int, best: int, best_index: int) -> None:
    """(best, best_index) := (value, index) where it ranks above: NaN above every number,
    equal values to the lower index. Clobbers P2..P5.

    Two exclusive cases: with no NaN, value > best or (value == best and index lower)
    (ordered comparisons are false with a NaN); with value a NaN, best a number or the
    index lower."""
    s.isetp(2, "LT", r(index), r(best_index))
    s.fsetp(3, "NUM", r(best), r(best), combine="OR", other=p(2))
    s.fsetp(3, "NAN", r(value), r(value), other=p(3))
    s.fsetp(4, "EQ", r(value), r(best), other=p(2))
    s.fsetp(4, "GT", r(value), r(best), combine="OR", other=p(4))
    for case in (3, 4):
        s.mov(best, r(value), guard=p(case))
        s.mov(best_index, r(index), guard=p(case))


ADAMW_ELEMENTS = 2  # elements a lane a trip: base + tid and 256 past it, loads together


def adamw(arch: str) -> Image:
    """AdamW over rows x columns elements, grid-stride over a 64-bit index, in the specified
    order: w *= decay; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    w -= step (m / (sqrt v + eps)); each stored canonical. A block takes 512 consecutive
    elements a trip, lane l elements l and l + 256: all eight loads in flight at once."""
    s = Asm(arch, sig.SIGNATURES[sig.ADAMW])
    s.prologue(TID, CTAID, scratch=VOCAB)
    count, stride, base, index, second = 4, 6, 8, 10, 26  # 64-bit pairs
    x, y, apart = 16, 17, VOCAB
    addresses = (18, 20, 22, 24)  # parameters, gradients, first and second moment
    names = ("parameters", "gradients", "first_moment", "second_moment")
    elements = ((12, 13, 14, 15), (28, 29, 52, 53))  # (g, w, m, v) of each element
    inside = (5, 4)  # the predicates of "the element is < count"
    span = ADAMW_ELEMENTS * LANES
    scalars = tuple(s.param(name) for name in ADAM_SCALARS)
    s.op("LDC", r(x), CBuf(0, s.slots["rows"], index=RZ))
    s.op("LDC", r(y), CBuf(0, s.slots["columns"], index=RZ))
    s.wide(count, r(x), r(y), RZ)
    s.op("LDC", r(x), CBuf(0, 0xC, index=RZ))  # gridDim.x
    s.wide(stride, r(x), span, RZ)
    s.wide(base, r(CTAID), span, RZ)
    s.mov(apart, LANES)
    top, end = s.fresh("loop"), s.fresh("done")
    s.b.label(top)
    s.isetp(6, "GE", r(base), r(count))
    s.isetp_ex(6, "GE", r(base + 1), r(count + 1), p(6))
    s.b.bra(end, guard=p(6))
    s.wide(index, r(TID), 1, base)
    s.wide(second, r(apart), 1, index)

    def guard_elements() -> None:
        for pair, pred in zip((index, second), inside, strict=True):
            s.isetp(pred, "LT", r(pair), r(count))
            s.isetp_ex(pred, "LT", r(pair + 1), r(count + 1), p(pred))

    guard_elements()
    for address, name in zip(addresses, names, strict=True):
        s.pointer(address, name)
        s.wide(address, r(index), 4, address)
        s.mad(address + 1, r(index + 1), 4, r(address + 1))
    for k, (g, w, m, v) in enumerate(elements):
        for value, address in zip((w, g, m, v), addresses, strict=True):
            s.mov(value, 0)
            s.ldg(value, address, guard=p(inside[k]), offset=4 * LANES * k)
    for k, (g, w, m, v) in enumerate(elements):
        adamw_step(s, w, m, v, g, x, y, scalars, Scratch(30, DIVIDE_SCRATCH))
        for value in (w, m, v):
            s.canonical(value, 0)
        guard_elements()  # again: the division took the predicates
        for value, address in zip((w, m, v), (addresses[0], addresses[2], addresses[3]),
                                  strict=True):
            s.stg(address, value, guard=p(inside[k]), offset=4 * LANES * k)
    s.wide(base, r(stride), 1, base)
    s.add(base + 1, r(base + 1), r(stride + 1))
    s.b.bra(top)
    s.b.label(end)
    s.exit()
    return s.image("bob_adamw")


def _exponent(s: Asm, d: int, w: int, m: int) -> None:
    """d := (w - m) * log2e: the softmax exponent in the log2 domain."""
    s.fadd(d, r(w), r(m, neg=True))
    s.fmul(d, r(d), s.param("log2e"))


def _row_max(s: Asm, m: int, base: int, trip: Trip, values: tuple[int, ...], row: int,
             address: int, scratch: Scratch) -> None:
    """m := the row's max: lane l takes elements l, l + 256, ... from -inf, UNROLL a trip,
    then the block's largest by order keys (``keyed_max``) in the first tree buffer, with
    no closing barrier: the next tree takes the second (SECOND_TREE)."""
    held = scratch(0)
    s.mov(held, NEG_INF)
    with Loop(s, base, r(VOCAB), step=UNROLL * LANES):
        trip.start(base, VOCAB)
        s.wide(address, r(trip.j), 4, row)
        trip.load(values, address, NEG_INF)
        for value in values:
            select_max(s, held, value, 0)
    keyed_max(s, m, held, WORD, Scratch(scratch.first + 1, TREE_SCRATCH))


def _loss_start(s: Asm, rows: tuple[tuple[int, str], ...], scratch: int) -> None:
    """Prologue, a block past the last row exits whole; each row address register pair."""
    _start(s)
    s.isetp(0, "GE", r(CTAID), r(VOCAB))
    s.exit(guard=p(0))
    for register, name in rows:
        row_address(s, register, name, CTAID, VOCAB, scratch)


def _exp_sums(s: Asm, base: int, trip: Trip, values: tuple[int, ...], m: int, z: int, e: int,
              partial: int, w_row: int, address: int,
              weights: tuple[int, ...] = (), partial_t: int = 0, t_row: int = 0) -> None:
    """partial := the lane's sum of exp2((w - m) log2e) over its elements, in their order;
    with `weights`, partial_t := the lane's sum of the weights row's."""
    with Loop(s, base, r(VOCAB), step=UNROLL * LANES):
        trip.start(base, VOCAB)
        s.wide(address, r(trip.j), 4, w_row)
        trip.load(values, address, 0)
        if weights:
            s.wide(address, r(trip.j), 4, t_row)
            trip.load(weights, address, 0)
        for k in trip.each():
            _exponent(s, z, values[k], m)
            exp2(s, e, z, Scratch(24, 5))
            s.fadd(partial, r(partial), r(e), guard=p(TRIP_GUARDS[k]))
            if weights:
                s.fadd(partial_t, r(partial_t), r(weights[k]), guard=p(TRIP_GUARDS[k]))


def loss_gradient_hard(arch: str) -> Image:
    """One block per row r: loss[r] = ln2 (log2(s) - z_t), gradients[r][j] = p_j / V and
    (p_t - 1) / V at the target, p_j = e_j / s (reference.loss_gradient_hard_rows)."""
    s = Asm(arch, sig.SIGNATURES[sig.LOSS_HARD])
    w_row, g_row, address = 4, 6, 8
    base, j, x, z, e, m, total, partial, target, value = 10, 11, 12, 13, 14, 15, 16, 17, 18, 19
    values, left, to_target, store, rest = (x, 20, 21, 22), 23, 29, 52, 54
    trip = Trip(s, TID, j, left, rest)
    _loss_start(s, ((w_row, "parameters"), (g_row, "gradients")), scratch=address)
    s.pointer(address, "targets")
    s.wide(address, r(CTAID), 4, address)
    s.ldg(target, address)
    _row_max(s, m, base, trip, values, w_row, address, Scratch(24, 4))
    # The loss, by lane 0 (NaN for a target >= V, never admitted by the host): its w[t]
    # read now, in flight through the sums and the tree, the target long arrived.
    s.isetp(5, "LT", r(target), r(VOCAB))
    s.isetp(4, "EQ", r(TID), 0, other=p(5))
    s.mov(value, 0)
    s.wide(address, r(target), 4, w_row)
    s.ldg(value, address, guard=p(4))
    s.mov(partial, 0)
    _exp_sums(s, base, trip, values, m, z, e, partial, w_row, address)
    tree(s, total, partial, WORD, "sum", Scratch(24, TREE_SCRATCH), SECOND_TREE,
         closing_barrier=False)
    log2(s, e, total, Scratch(30, 32))
    _exponent(s, z, value, m)
    s.fadd(e, r(e), r(z, neg=True))
    s.fmul(e, r(e), s.param("ln2"))
    s.isetp(5, "LT", r(target), r(VOCAB))
    s.mov(e, NAN_BITS, guard=p(5, True))
    s.canonical(e, 0)
    s.isetp(4, "EQ", r(TID), 0)
    s.pointer(address, "loss")
    s.wide(address, r(CTAID), 4, address)
    s.stg(address, e, guard=p(4))
    sum_reciprocal = Reciprocal(total, 55, 56)  # past the loop's registers
    reciprocal(s, sum_reciprocal, Scratch(30, DIVIDE_REGISTERS))
    with Loop(s, base, r(VOCAB), step=UNROLL * LANES):
        trip.start(base, VOCAB)
        s.wide(address, r(j), 4, w_row)
        trip.load(values, address, 0)
        s.wide(store, r(j), 4, g_row)
        s.op("IADD3.RRRR", r(to_target), r(target), r(j, neg=True), RZR)
        for k in trip.each():
            _exponent(s, z, values[k], m)
            exp2(s, e, z, Scratch(24, 5))
            divide_by(s, e, e, sum_reciprocal, Scratch(30, DIVIDE_SCRATCH))
            s.isetp(4, "EQ", r(to_target), LANES * k)  # column j + 256 k is the target
            s.fadd(e, r(e), ONE | SIGN, guard=p(4))
            s.fmul(e, r(e), s.param("inverse_rows"))
            s.canonical(e, 0)
            trip.inside(k, 5)
            s.stg(store, e, guard=p(5), offset=4 * LANES * k)
    s.exit()
    return s.image("bob_loss_gradient_hard", shared_bytes=TWO_TREES)


def loss_gradient_corpus(arch: str) -> Image:
    """One block per row r, weights T: loss[r] = ln2 sum_j T_j (L - z_j), L = log2(s), and
    gradients[r][j] = rowsum(T) p_j - T_j (reference.loss_gradient_corpus_rows)."""
    s = Asm(arch, sig.SIGNATURES[sig.LOSS_CORPUS])
    w_row, g_row, t_row, address = 4, 6, 8, 10
    base, j, x, z, e, m, total, partial, weight, weight_sum, big_l, partial_t = range(12, 24)
    values, weights = (x, 29, 52, 53), (weight, 54, 55, 56)
    left, store, rest = 57, 58, 60
    trip = Trip(s, TID, j, left, rest)
    _loss_start(s, ((w_row, "parameters"), (g_row, "gradients"), (t_row, "weights")),
                scratch=address)
    _row_max(s, m, base, trip, values, w_row, address, Scratch(24, 4))
    s.mov(partial, 0)
    s.mov(partial_t, 0)
    _exp_sums(s, base, trip, values, m, z, e, partial, w_row, address, weights, partial_t,
              t_row)
    tree(s, total, partial, WORD, "sum", Scratch(24, TREE_SCRATCH), SECOND_TREE,
         closing_barrier=False)
    tree(s, weight_sum, partial_t, WORD, "sum", Scratch(24, TREE_SCRATCH),
         closing_barrier=False)
    log2(s, big_l, total, Scratch(30, 32))
    sum_reciprocal = Reciprocal(total, 49, 50)  # past the division's, below the loop's
    reciprocal(s, sum_reciprocal, Scratch(30, DIVIDE_REGISTERS))
    s.mov(partial, 0)
    with Loop(s, base, r(VOCAB), step=UNROLL * LANES):
        trip.start(base, VOCAB)
        s.wide(address, r(j), 4, w_row)
        trip.load(values, address, 0)
        s.wide(address, r(j), 4, t_row)
        trip.load(weights, address, 0)
        s.wide(store, r(j), 4, g_row)
        for k in trip.each():
            weight_k = weights[k]
            _exponent(s, z, values[k], m)
            exp2(s, e, z, Scratch(24, 5))
            divide_by(s, e, e, sum_reciprocal, Scratch(30, DIVIDE_REGISTERS))
            s.fadd(z, r(big_l), r(z, neg=True))
            s.fmul(z, r(z), r(weight_k))
            trip.inside(k, 5)
            s.fadd(partial, r(partial), r(z), guard=p(5))
            s.fmul(e, r(weight_sum), r(e))
            s.fadd(e, r(e), r(weight_k, neg=True))
            s.canonical(e, 0)
            s.stg(store, e, guard=p(5), offset=4 * LANES * k)
    tree(s, total, partial, WORD, "sum", Scratch(24, TREE_SCRATCH), SECOND_TREE,
         closing_barrier=False)
    s.fmul(total, r(total), s.param("ln2"))
    s.canonical(total, 0)
    s.isetp(4, "EQ", r(TID), 0)
    s.pointer(address, "loss")
    s.wide(address, r(CTAID), 4, address)
    s.stg(address, total, guard=p(4))
    s.exit()
    return s.image("bob_loss_gradient_corpus", shared_bytes=TWO_TREES)


BUILDERS = {
    sig.GATHER: row_gather,
    sig.LOSS_HARD: loss_gradient_hard,
    sig.LOSS_CORPUS: loss_gradient_corpus,
    sig.ADAMW: adamw,
    sig.ARGMAX: greedy_argmax,
}
