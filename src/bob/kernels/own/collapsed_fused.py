"""The collapsed tables' fused kernels in Bob's own machine code: every update of an
invocation in one launch, a row's updates all before the next row's
(``bob_collapsed_fused_train`` and ``_corpus`` in ``cuda/bob_collapsed.cuh``;
``bob.kernels.collapsed.reference.fused_train_classes``).

A row's update is the collapsed loss kernel's pass over the row (``collapsed_loss``'s
``hard_row`` / ``corpus_row``: every class's gradient into the gradients tensor, no loss),
then AdamW on each of the row's classes with that update's row of ``adam_scalars``, then a
barrier: the next pass reads every class the block's lanes wrote. A class's gradient and
its AdamW are one lane's (the rest lane 0's, exception FIRST + k lane k % 256's), so its
AdamW reads what that lane stored. With ``finish``, a last pass stores the row's loss and
gradients of the result.
"""

from __future__ import annotations

from bob.isa.builder import Image
from bob.isa.model import RZ, CBuf
from bob.kernels import signatures as sig
from bob.kernels.own.asm import (
    DIVIDE_SCRATCH,
    Asm,
    Scratch,
    adamw_step,
    p,
    r,
)
from bob.kernels.own.collapsed_loss import (
    ADDRESS,
    COUNT,
    DATA_PTR,
    G_PTR,
    LOSS_PTR,
    ROUTINE,
    ROW,
    SHARED_BYTES,
    TID,
    VOCAB,
    W_PTR,
    Row,
    _each_row,
    _kernel_start,
    corpus_row,
    hard_row,
)
from bob.kernels.own.collapsed_loss import I as EXCEPTION  # noqa: N811 - the exception
from bob.kernels.own.collapsed_loss import K as EACH_K
from bob.kernels.own.fused import ADAM_STRIDE

# Registers past the loss kernels' (which end at ROUTINE + 32): the update counter. The
# AdamW phase takes the add_run scratch (60 .. 79), idle then.
UPDATE = ROUTINE + 32
SCALARS = 60  # adamw_step's seven scalars, in its order
G, W, M, V, X, Y = range(67, 73)
CLASS = 73
M_PTR, V_PTR, ADAM_PTR = 74, 76, 78  # pairs


def _adamw_class(s: Asm, guard: int, again) -> None:
    """AdamW on class CLASS under P`guard`, in seed.adamw's order, with the update's
    SCALARS; `again()` sets P`guard` again after the division took it."""
    arrays = ((W, W_PTR), (G, G_PTR), (M, M_PTR), (V, V_PTR))
    for value, pointer in arrays:
        s.mov(value, 0)
        s.wide(ADDRESS, r(CLASS), 4, pointer)
        s.ldg(value, ADDRESS, guard=p(guard))
    adamw_step(s, W, M, V, G, X, Y, tuple(r(SCALARS + i) for i in range(7)),
               Scratch(ROUTINE, DIVIDE_SCRATCH))
    for value in (W, M, V):
        s.canonical(value, 0)
    again()
    for value, pointer in ((W, W_PTR), (M, M_PTR), (V, V_PTR)):
        s.wide(ADDRESS, r(CLASS), 4, pointer)
        s.stg(ADDRESS, value, guard=p(guard))


def _adamw_row(s: Asm, row: Row) -> None:
    """AdamW with update UPDATE's scalars on every class of row ROW: the rest by lane 0,
    exception i by the lane that stored its gradient."""
    s.pointer(M_PTR, "first_moment")
    s.pointer(V_PTR, "second_moment")
    s.pointer(ADAM_PTR, "adam_scalars")
    s.mov(X, 4 * ADAM_STRIDE)
    s.wide(ADAM_PTR, r(UPDATE), r(X), ADAM_PTR)
    for i in range(7):
        s.ldg(SCALARS + i, ADAM_PTR, offset=4 * i)

    def lane0() -> None:
        s.isetp(0, "EQ", r(TID), 0)

    lane0()
    s.mov(CLASS, r(ROW))
    _adamw_class(s, 0, lane0)

    def exception(pred: int) -> None:
        def inside() -> None:
            s.add(X, r(EACH_K), r(TID))
            s.isetp(pred, "LT", r(X), r(COUNT))

        s.add(CLASS, r(VOCAB), r(EXCEPTION))
        _adamw_class(s, pred, inside)

    row.each_exception(exception)


def _fused(arch: str, corpus: bool) -> Image:
    region = sig.COLLAPSED_FUSED_CORPUS if corpus else sig.COLLAPSED_FUSED_HARD
    s = Asm(arch, sig.SIGNATURES[region])
    vote = _kernel_start(s, ((DATA_PTR, "weights" if corpus else "targets"),
                             (LOSS_PTR, "loss"), (G_PTR, "gradients")))
    row = Row(s, vote)

    def one_pass(skip: str, loss: bool) -> None:
        if corpus:
            corpus_row(s, row, skip, loss=loss)
        else:
            hard_row(s, row, loss=loss)

    def run_row(next_row: str) -> None:
        top, trained, step = s.fresh("update"), s.fresh("trained"), s.fresh("adamw")
        s.mov(UPDATE, 0)
        s.b.label(top)
        s.op("LDC", r(X), CBuf(0, s.slots["updates"], index=RZ))
        s.isetp(6, "GE", r(UPDATE), r(X))
        s.b.bra(trained, guard=p(6))
        one_pass(step, loss=False)
        s.b.label(step)
        _adamw_row(s, row)
        s.barrier()  # the next pass reads every class
        s.add(UPDATE, r(UPDATE), 1)
        s.b.bra(top)
        s.b.label(trained)
        s.op("LDC", r(X), CBuf(0, s.slots["finish"], index=RZ))
        s.isetp(6, "EQ", r(X), 0)
        s.b.bra(next_row, guard=p(6))
        one_pass(next_row, loss=True)

    _each_row(s, run_row)
    name = "bob_collapsed_fused_train_corpus" if corpus else "bob_collapsed_fused_train"
    return s.image(name, shared_bytes=SHARED_BYTES)


def fused_train_hard(arch: str) -> Image:
    return _fused(arch, corpus=False)


def fused_train_corpus(arch: str) -> Image:
    return _fused(arch, corpus=True)


BUILDERS = {
    sig.COLLAPSED_FUSED_HARD: fused_train_hard,
    sig.COLLAPSED_FUSED_CORPUS: fused_train_corpus,
}
