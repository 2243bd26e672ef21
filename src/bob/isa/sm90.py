"""The sm_90 (Hopper) forms Bob encodes.

What differs from sm_86: nvdisasm prints the memory descriptor of a global
access (``desc[UR4][R2.64]``; sm_86 has it too, unprinted); a branch offset is split, its low
eight bits at 16..23 and the rest at 34..81 (an sm_86-form branch is an
illegal instruction on an H200); kernels start with ACQBULK where they wait
for the grid before them; and ptxas prefers uniform-register sources to
constant-bank ones, so the constant forms of the ALU ops are rarely seen.
"""

from __future__ import annotations

from bob.isa import opcodes as op
from bob.isa.fields import Bits, Field, Table
from bob.isa.forms import form

BRANCH_OFFSET = Field("offset", (Bits(16, 8), Bits(34, 48)),
                      "the target: 4-byte units from the next instruction", signed=True)

FORMS = (
    *op.s2r(), *op.s2ur(), *op.ldc(), *op.uldc(),
    *op.mov("RIUC"), *op.umov("UI"),
    *op.iadd3(("RR", "IR", "UR", "CR")),
    *op.iadd3(("RR", "IR", "UR", "CR"), carry_out=1),
    *op.iadd3_x(("RR", "IR", "UR", "CR")),
    *op.uiadd3(("UR", "IR")),
    *op.imad(("RR", "IR", "UR", "CR", "RI", "RC", "RU")),
    *op.imad(("RR", "IR", "UR", "CR", "RC"), wide=True),
    *op.uimad_wide(),
    *op.lea("RIUC", carry_out=False), *op.lea("RIUC", carry_out=True),
    *op.lea_hi_x("RUC"), *op.lea_hi_sx32("R"), *op.ulea(),
    *op.shf(("RR", "IR", "UR", "RI", "RU")),
    *op.lop3(("RR", "IR", "UR", "CR"), predicate=False),
    *op.lop3(("RR", "IR", "UR", "CR"), predicate=True),
    *op.isetp("RIUC"), *op.isetp("RIUC", extended=True),
    *op.fsetp("RIUC"),
    *op.sel("RIUC"), *op.fsel("RIUC"),
    *op.fadd("RIUC"), *op.fmul("RIUC"),
    *op.ffma(("RR", "IR", "UR", "CR", "RI", "RC", "RU")),
    *op.fmnmx("RIUC"),
    *op.frnd("RU"), *op.f2i("RU"), *op.mufu("RIU"), *op.fchk("RU"),
    *op.ldg(), *op.stg(), *op.lds(), *op.sts(), *op.shfl(), *op.red_add_u64("REDG"),
    *op.bar(), *op.bra(BRANCH_OFFSET), *op.exit_(), *op.nop(), *op.bssy(), *op.bsync(),
    *op.call(BRANCH_OFFSET), *op.ret(BRANCH_OFFSET), *op.bpt(), *op.plop3(), *op.redux(),
    *op.vote(),
    *op.i2fp("RU"), *op.hfma2_mma(),
    # griddepcontrol.wait: wait until the grid this launch depends on has finished.
    *op.viadd("RIU"),
    form("ACQBULK", "ACQBULK", 0x82E, []),
)

TABLE = Table("sm_90", FORMS)
