"""The fused schedule's register-resident kernel in Bob's own machine code, both modes
(bob-fused-train and -corpus, ARITHMETIC.md "bob-fused-train"), for rows of at most
RESIDENT_VOCAB columns.

One block per row runs `updates` updates of its row: the row's loss-gradient from the
current parameters (the operations and order of ``seed.loss_gradient_hard``/``_corpus``),
then AdamW with update k's scalars (row k of adam_scalars, the order of ``seed.adamw``).
Lane l holds elements l + 256 i (slot i < RESIDENT_SLOTS) of w, m, v (and the corpus
weights) in registers for all the updates: the row is read once and written once. With
`finish`, the final row's loss and gradient are stored. A vocabulary past RESIDENT_VOCAB
(the region name serves larger ones with NVRTC's code) traps, uniformly over the block.

Slots wholly past V are skipped by a uniform branch (256 i >= V); a lane's element past V
in a slot that is not is computed but never reduced or stored (its predicate is off).
Values kept between updates are not canonicalized (stores are): no result depends on a
NaN's payload. Each kernel takes 64 registers a thread, so four blocks share an SM, as
the CUDA kernel's launch bounds ask.

The block's trees take two shared buffers in turn, so none needs a closing barrier. The
rows of adam_scalars reach the block a chunk of CHUNK_UPDATES at a time, staged in shared
memory (each lane one float of the chunk, loaded into a register one chunk ahead): an
update reads its scalars from shared memory between its two trees' barriers, and the
block waits on global memory for them once a launch, not once an update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bob.isa.builder import Image
from bob.isa.model import RZ, CBuf, Imm
from bob.kernels import signatures as sig
from bob.kernels.own.asm import (
    AND_AB,
    DIVIDE_REGISTERS,
    LANES,
    NAN_BITS,
    NEG_INF,
    ONE,
    RZR,
    SIGN,
    TREE_BYTES,
    TREE_SCRATCH,
    Asm,
    Reciprocal,
    Scratch,
    adamw_step,
    divide,
    divide_by,
    exp2,
    keyed_max,
    log2,
    p,
    r,
    reciprocal,
    tree,
)
from bob.kernels.own.seed import _exponent  # z = (w - max) log2e, as the seed computes it

RESIDENT_SLOTS = 4  # row elements a lane holds in registers
RESIDENT_VOCAB = RESIDENT_SLOTS * LANES  # the longest row the kernel serves
ADAM_STRIDE = 8  # floats per row of adam_scalars: 7 scalars and padding
SLOT_BYTES = 4 * LANES  # from one slot's element of a lane to the next
# Shared memory: the two tree buffers, then a chunk of staged adam_scalars rows. An update
# reads its row between its two trees' barriers, so a lane staging the next chunk (past
# the second barrier of the chunk's last update) never overwrites a row a warp still reads.
SECOND_TREE = TREE_BYTES
SCALARS_AT = 2 * TREE_BYTES
CHUNK_UPDATES = LANES // ADAM_STRIDE  # rows of adam_scalars a chunk: a float a lane
SHARED_BYTES = SCALARS_AT + 4 * LANES
# Of its scratch, divide takes DIVIDE_REGISTERS and log2 8 more (Scratch refuses a routine
# that asks past its count): taking no more keeps both kernels at 64 registers.
LOG2_REGISTERS = 8 + DIVIDE_REGISTERS

# Registers. R0 tid, R1 ctaid, R2 tid * 4, R3 V; an address pair; the rest as named, then
# the slots' registers (slot i of w in W + i, ...) and the mode's AdamW scalars and
# scratch (_Layout). Lane addresses are made when needed from the pointers.
TID, CTAID, WORD, VOCAB = 0, 1, 2, 3
ADDRESS = 4  # a 64-bit pair
UPDATE, ROW_DATUM, ROW_MAX, ROW_SUM, PARTIAL, X, G, Y = range(6, 14)
TARGET = WEIGHT_SUM = ROW_DATUM  # the hard target, or the corpus weights' row sum
BIG_L = UPDATE  # log2 of the final row sum, at the finish
W, M, V, E, T = (14 + RESIDENT_SLOTS * n for n in range(5))  # T: the corpus weights
INSIDE = 5  # the predicate of "this lane's element of the slot is in the row"
# The row sum's reciprocal for an update's divisions, in the address pair's registers:
# nothing else of the update uses them between the sum's tree and the next staging.
SUM_RECIPROCAL = Reciprocal(ROW_SUM, ADDRESS, ADDRESS + 1)


@dataclass(frozen=True)
class _Layout:
    """The registers past the slots', which the corpus weights' slots move up."""

    corpus: bool

    @property
    def adam(self) -> int:
        """decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, eps_hat; at
        the finish log2's scratch, then (made after log2) the loss address pair."""
        return T + (RESIDENT_SLOTS if self.corpus else 0)

    @property
    def ahead(self) -> int:
        """The lane's float of the next chunk of adam_scalars, in flight (the eighth
        register of the scalars')."""
        return self.adam + 7

    @property
    def scratch(self) -> int:
        return self.adam + 8  # even: the routines' pairs are aligned

    def divide(self) -> Scratch:
        return Scratch(self.scratch, DIVIDE_REGISTERS)


def _inside(s: Asm, slot: int, pred: int = INSIDE) -> None:
    """pred := tid + 256 slot < V; X holds the column j."""
    s.add(X, r(TID), LANES * slot)
    s.isetp(pred, "LT", r(X), r(VOCAB))


def _lane_address(s: Asm, d: int, name: str) -> None:
    """d:d+1 := the address of this lane's slot-0 element of the block's row of `name`:
    the pointer + 4 (row V + tid), whose index fits 32 bits (V <= RESIDENT_VOCAB).
    Clobbers X."""
    s.mad(X, r(CTAID), r(VOCAB), r(TID))
    s.pointer(d, name)
    s.wide(d, r(X), 4, d)


def _slots(s: Asm, body: Callable[[int], None]) -> None:
    """body(i) for every slot with an element in the row: slot i > 0 is skipped, with
    the ones after it, by a uniform branch when 256 i >= V."""
    end = s.fresh("slots_done")
    for slot in range(RESIDENT_SLOTS):
        if slot:
            s.isetp(6, "LE", r(VOCAB), LANES * slot)
            s.b.bra(end, guard=p(6))
        body(slot)
    s.b.label(end)


def _exponentials(s: Asm, k: _Layout, after_max: Callable[[], None] | None = None) -> None:
    """ROW_MAX := the row max of w (by order keys: ``keyed_max``); E + i := exp2((w_i -
    max) log2e); ROW_SUM := their row sum (ARITHMETIC.md's lanes and tree: lane l takes
    its slots in order). The max takes the first buffer, the sum's tree the second;
    `after_max` runs past the first's barrier."""
    s.mov(PARTIAL, NEG_INF)
    for slot in range(RESIDENT_SLOTS):
        _inside(s, slot)
        s.fsetp(4, "GT", r(W + slot), r(PARTIAL), other=p(INSIDE))  # select_max, in the row
        s.fsel(PARTIAL, r(W + slot), r(PARTIAL), p(4))
    keyed_max(s, ROW_MAX, PARTIAL, WORD, Scratch(k.scratch, TREE_SCRATCH))
    if after_max:
        after_max()
    s.mov(PARTIAL, 0)

    def exponential(slot: int) -> None:
        _exponent(s, G, W + slot, ROW_MAX)
        exp2(s, E + slot, G, Scratch(k.scratch, 5))
        _inside(s, slot)
        s.fadd(PARTIAL, r(PARTIAL), r(E + slot), guard=p(INSIDE))

    _slots(s, exponential)
    tree(s, ROW_SUM, PARTIAL, WORD, "sum", Scratch(k.scratch, TREE_SCRATCH), SECOND_TREE,
         closing_barrier=False)


def _gradient(s: Asm, k: _Layout, slot: int, by_reciprocal: bool = False) -> None:
    """G := the element's gradient from p = e / s (by the row sum's prepared reciprocal,
    SUM_RECIPROCAL, where `by_reciprocal`): hard p (1/V), (p - 1) (1/V) at the target;
    corpus rowsum(T) p - T. Clobbers P0..P5."""
    if by_reciprocal:
        divide_by(s, G, E + slot, SUM_RECIPROCAL, k.divide())
    else:
        divide(s, G, E + slot, ROW_SUM, k.divide())
    if k.corpus:
        s.fmul(G, r(WEIGHT_SUM), r(G))
        s.fadd(G, r(G), r(T + slot, neg=True))
    else:
        s.add(X, r(TID), LANES * slot)
        s.isetp(4, "EQ", r(X), r(TARGET))
        s.fadd(G, r(G), ONE | SIGN, guard=p(4))
        s.fmul(G, r(G), s.param("inverse_rows"))


def _adamw(s: Asm, k: _Layout, slot: int) -> None:
    """AdamW on the slot's element with gradient G, in seed.adamw's order."""
    adamw_step(s, W + slot, M + slot, V + slot, G, X, Y,
               tuple(r(k.adam + i) for i in range(7)), k.divide())


def _load_row(s: Asm, k: _Layout) -> None:
    """The block's row into the slots' registers (past V: zeros), every load in flight
    together; the hard target, or the corpus weights' row sum."""
    names = ("parameters", "first_moment", "second_moment", "weights")
    arrays = (W, M, V, T)[:4 if k.corpus else 3]
    lanes = tuple(k.scratch + 2 * n for n in range(len(arrays)))  # address pairs
    for lane, name in zip(lanes, names, strict=False):
        _lane_address(s, lane, name)
    if not k.corpus:
        s.pointer(ADDRESS, "targets")
        s.wide(ADDRESS, r(CTAID), 4, ADDRESS)
        s.ldg(TARGET, ADDRESS)
    for slot in range(RESIDENT_SLOTS):
        _inside(s, slot, pred=slot)
    for slot in range(RESIDENT_SLOTS):
        for first in arrays:
            s.mov(first + slot, 0)
    for slot in range(RESIDENT_SLOTS):
        for first, lane in zip(arrays, lanes, strict=True):
            s.ldg(first + slot, lane, guard=p(slot), offset=SLOT_BYTES * slot)
    if k.corpus:
        s.mov(PARTIAL, 0)
        for slot in range(RESIDENT_SLOTS):
            s.fadd(PARTIAL, r(PARTIAL), r(T + slot), guard=p(slot))
        tree(s, WEIGHT_SUM, PARTIAL, WORD, "sum", Scratch(k.scratch, TREE_SCRATCH),
             SECOND_TREE, closing_barrier=False)  # the first update's max takes the first


def _load_chunk(s: Asm, k: _Layout, ahead: int) -> None:
    """k.ahead := this lane's float of the chunk of adam_scalars that opens at update
    UPDATE + `ahead`, where it is inside the rows of the launch's updates. Clobbers X, Y,
    ADDRESS, P6."""
    s.add(X, r(UPDATE), ahead)
    s.lea(X, r(X), r(TID), 3)  # the float's index: its row times ADAM_STRIDE plus tid
    s.mov(Y, s.param("updates"))
    s.shl(Y, r(Y), 3)
    s.isetp(6, "LT", r(X), r(Y))
    s.pointer(ADDRESS, "adam_scalars")
    s.wide(ADDRESS, r(X), 4, ADDRESS)
    s.ldg(k.ahead, ADDRESS, guard=p(6))


def _stage_chunk(s: Asm, k: _Layout) -> None:
    """At an update that opens a chunk (UPDATE % CHUNK_UPDATES == 0, uniform), the lane's
    float of it into shared memory, and the next chunk's float loaded."""
    staged = s.fresh("staged")
    s.logic(X, r(UPDATE), CHUNK_UPDATES - 1, RZR, AND_AB)
    s.isetp(6, "NE", r(X), 0)
    s.b.bra(staged, guard=p(6))
    s.sts(WORD, SCALARS_AT, k.ahead)
    _load_chunk(s, k, CHUNK_UPDATES)
    s.b.label(staged)


def _chunk_row(s: Asm, d: int) -> None:
    """d := the byte offset of update UPDATE's row within the staged chunk: UPDATE %
    CHUNK_UPDATES rows of ADAM_STRIDE floats."""
    s.logic(d, r(UPDATE), CHUNK_UPDATES - 1, RZR, AND_AB)
    s.shl(d, r(d), 5)  # 4 ADAM_STRIDE bytes a row


def _read_scalars(s: Asm, k: _Layout) -> None:
    """The update's seven AdamW scalars from its staged row (past a barrier since the
    staging)."""
    _chunk_row(s, X)
    for index in range(7):
        s.lds(k.adam + index, X, SCALARS_AT + 4 * index)


def _finish(s: Asm, k: _Layout) -> None:
    """The final row's gradient into gradients[row] and its loss into loss[row]."""
    _exponentials(s, k)
    log2(s, BIG_L, ROW_SUM, Scratch(k.adam, LOG2_REGISTERS))
    _lane_address(s, ADDRESS, "gradients")
    loss = k.adam  # past log2, before divide's scratch
    s.pointer(loss, "loss")
    s.wide(loss, r(CTAID), 4, loss)
    s.mov(PARTIAL, 0)

    def element(slot: int) -> None:
        _gradient(s, k, slot)
        s.canonical(G, 0)
        _inside(s, slot)
        s.stg(ADDRESS, G, guard=p(INSIDE), offset=SLOT_BYTES * slot)
        _exponent(s, G, W + slot, ROW_MAX)
        s.fadd(G, r(BIG_L), r(G, neg=True))  # L - z
        if k.corpus:
            s.fmul(G, r(G), r(T + slot))
            s.fadd(PARTIAL, r(PARTIAL), r(G), guard=p(INSIDE))
        else:  # the lane holding the target stores the row's loss
            s.fmul(G, r(G), s.param("ln2"))
            s.canonical(G, 0)
            s.isetp(4, "EQ", r(X), r(TARGET), other=p(INSIDE))
            s.stg(loss, G, guard=p(4))

    _slots(s, element)
    if k.corpus:  # past the sum's tree, the first buffer's turn
        tree(s, G, PARTIAL, WORD, "sum", Scratch(k.scratch, TREE_SCRATCH),
             closing_barrier=False)
        s.fmul(G, r(G), s.param("ln2"))
        s.canonical(G, 0)
        s.isetp(4, "EQ", r(TID), 0)
    else:  # a target >= V (never admitted): lane 0 stores NaN
        s.mov(G, NAN_BITS)
        s.isetp(4, "GE", r(TARGET), r(VOCAB))
        s.isetp(4, "EQ", r(TID), 0, other=p(4))
    s.stg(loss, G, guard=p(4))


def _updates(s: Asm, k: _Layout, by_reciprocal: bool) -> None:
    """The updates UPDATE .. updates - 1, each with its row of adam_scalars: the row's
    exponentials and sum, then each element's gradient and AdamW."""
    top, done = s.fresh("update"), s.fresh("updates_done")
    s.b.label(top)
    s.isetp(6, "GE", r(UPDATE), s.param("updates"))
    s.b.bra(done, guard=p(6))
    _stage_chunk(s, k)
    _exponentials(s, k, after_max=lambda: _read_scalars(s, k))
    if by_reciprocal:
        reciprocal(s, SUM_RECIPROCAL, k.divide())

    def update(slot: int) -> None:
        _gradient(s, k, slot, by_reciprocal)
        _adamw(s, k, slot)

    _slots(s, update)
    s.add(UPDATE, r(UPDATE), 1)
    s.b.bra(top)
    s.b.label(done)


def _fused(arch: str, corpus: bool) -> Image:
    region = sig.FUSED_CORPUS if corpus else sig.FUSED_HARD
    k = _Layout(corpus)
    s = Asm(arch, sig.SIGNATURES[region])
    s.prologue(TID, CTAID, scratch=VOCAB)
    s.shl(WORD, r(TID), 2)
    s.op("LDC", r(VOCAB), CBuf(0, s.slots["vocab"], index=RZ))
    # A longer row is not this kernel's: every lane traps (the branch is uniform).
    served = s.fresh("vocab_served")
    s.isetp(0, "LE", r(VOCAB), RESIDENT_VOCAB)
    s.b.bra(served, guard=p(0))
    s.op("BPT.TRAP", Imm(1))
    s.b.label(served)
    s.isetp(0, "GE", r(CTAID), r(VOCAB))
    s.exit(guard=p(0))  # a block past the last row, whole
    s.mov(UPDATE, 0)
    _load_chunk(s, k, 0)  # the first chunk, in flight with the row
    _load_row(s, k)
    # A lane holding one element (V <= 256) divides by the row sum directly; one holding
    # more prepares the sum's reciprocal once an update (the branch is uniform).
    one_slot, updated = s.fresh("one_slot"), s.fresh("updated")
    s.isetp(6, "LE", r(VOCAB), LANES)
    s.b.bra(one_slot, guard=p(6))
    _updates(s, k, by_reciprocal=True)
    s.b.bra(updated)
    s.b.label(one_slot)
    _updates(s, k, by_reciprocal=False)
    s.b.label(updated)

    finished = s.fresh("finished")
    s.mov(X, s.param("finish"))
    s.isetp(6, "EQ", r(X), 0)
    s.b.bra(finished, guard=p(6))
    _finish(s, k)
    s.b.label(finished)

    # The row back, once, canonical.
    for slot in range(RESIDENT_SLOTS):
        _inside(s, slot, pred=slot)
    for first, name in ((W, "parameters"), (M, "first_moment"), (V, "second_moment")):
        _lane_address(s, ADDRESS, name)
        for slot in range(RESIDENT_SLOTS):
            s.canonical(first + slot, 4)
            s.stg(ADDRESS, first + slot, guard=p(slot), offset=SLOT_BYTES * slot)
    s.exit()
    return s.image(sig.ENTRIES[region], shared_bytes=SHARED_BYTES)


def fused_train_hard(arch: str) -> Image:
    """bob-fused-train for V <= RESIDENT_VOCAB: the row's hard-target gradient (seed
    loss_gradient_hard's operations) then AdamW, `updates` times; the final loss and
    gradient with `finish`."""
    return _fused(arch, corpus=False)


def fused_train_corpus(arch: str) -> Image:
    """bob-fused-train-corpus for V <= RESIDENT_VOCAB: as fused_train_hard with the
    corpus gradient (seed loss_gradient_corpus's operations) and loss."""
    return _fused(arch, corpus=True)


BUILDERS = {
    sig.FUSED_HARD: fused_train_hard,
    sig.FUSED_CORPUS: fused_train_corpus,
}
