"""The sm_86 (Ampere) forms Bob encodes.

Differences from sm_90 (``bob.isa.sm90``): a branch offset is one field at
34..81; there is no ACQBULK nor VIADD. Global accesses carry a memory
descriptor in a uniform register exactly as on sm_90, but nvdisasm does not
print it for sm_86 (``[R2.64]``). ptxas reads kernel parameters straight from constant bank 0 more
often here, so the constant forms of the ALU ops are common.
"""

from __future__ import annotations

from bob.isa import opcodes as op
from bob.isa.fields import Bits, Field, Table

BRANCH_OFFSET = Field("offset", (Bits(34, 48),),
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
    *op.frnd("RUC"), *op.f2i("RUC"), *op.mufu("RIUC"), *op.fchk("RUC"),
    *op.ldg(), *op.stg(), *op.lds(), *op.sts(), *op.shfl(), *op.red_add_u64("RED"),
    *op.bar(), *op.bra(BRANCH_OFFSET), *op.exit_(), *op.nop(), *op.bssy(), *op.bsync(),
    *op.call(BRANCH_OFFSET), *op.ret(BRANCH_OFFSET), *op.bpt(), *op.plop3(), *op.redux(),
    *op.vote(),
    *op.i2fp("RU"), *op.hfma2_mma(),
)

TABLE = Table("sm_86", FORMS, prints_descriptor=False)
