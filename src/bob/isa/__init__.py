"""Bob's own instruction encoder for NVIDIA GPUs (sm_90, and sm_86 encoded and decoded).

- ``fields``: bit fields, operand slots, modifiers and forms: the typed field tables.
- ``forms``, ``opcodes``: the layout the architectures share and the opcode families.
- ``sm90``, ``sm86``: each architecture's table of forms.
- ``model``: operands and an instruction; ``control``: the scheduling controls.
- ``codec``: an instruction to 16 bytes and back; ``text``: nvdisasm's text for it.
- ``check``: the latency and scoreboard checker for a program's controls.
- ``oracle``: NVIDIA's nvdisasm and ptxas from their wheels, for the tests.

docs/ISA.md says what is covered and how it is checked.
"""

from bob.isa import sm86, sm90
from bob.isa.fields import Table

TABLES: dict[str, Table] = {"sm_90": sm90.TABLE, "sm_86": sm86.TABLE}


def table(arch: str) -> Table:
    try:
        return TABLES[arch]
    except KeyError:
        raise ValueError(f"Bob encodes {', '.join(TABLES)}, not {arch!r}") from None
