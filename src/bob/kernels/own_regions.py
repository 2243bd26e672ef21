"""Regions from Bob's own images: the seed kernels' machine code with no compiler and no cubin.

    own_regions(SM90)                       # the regions with code from bob.kernels.own
    with_own_kernels(compiled, SM90)        # NVRTC's regions with those replaced

``bob.kernels.own`` writes the seed kernels (row gather, the loss-gradient in both
modes, AdamW, greedy argmax) and the fused schedule's register-resident kernel in both
modes (V <= 1024) with Bob's instruction builder. This module turns each
image into the region the plan declares, after checking what NVRTC's regions are
checked for (``bob.kernels.cuda.regions``): the image reads its arguments exactly
where the plan's parameter block holds them (every parameter, at its offset, with
its size), its schedule passes ``bob.isa.check``, and its registers and shared memory
fit the target. The plan and the certificate take the regions unchanged; the nv
backend places the code in the program component and the register count and shared
window in the QMD, as it does NVRTC's. Regions Bob has no own code for (the health
check, the scatter, the loss alone, the other fused kernels: wide, tall, stream, held,
cluster) stay NVRTC's; the resident kernel's own code serves no plan past V = 1024
(``own.covers``), its image trapping there.
"""

from __future__ import annotations

from collections.abc import Mapping

from bob.errors import RunFailure
from bob.isa import table
from bob.isa.check import check
from bob.isa.codec import decode_program
from bob.isa.model import CBuf, Instruction
from bob.isa.text import listing
from bob.kernels import own
from bob.kernels import signatures as sig
from bob.plan.model import Region, Target
from bob.plan.placement import argument_slots

OWN_REGIONS = tuple(own.BUILDERS)  # the regions Bob has its own machine code for
MAX_REGISTERS = 255  # per thread, what a QMD's register count allows
WIDE_LOAD = "64"  # LDC.64 / ULDC.64: a constant-bank read of 8 bytes


def parameter_reads(instructions: list[Instruction], target: Target) -> dict[int, int]:
    """Constant bank 0 reads at or past the parameter base: offset -> bytes read."""
    reads: dict[int, int] = {}
    for instruction in instructions:
        width = 8 if WIDE_LOAD in instruction.modifiers else 4
        for operand in instruction.operands:
            if isinstance(operand, CBuf) and operand.bank == 0 \
                    and operand.offset >= target.parameter_base:
                reads[operand.offset] = max(reads.get(operand.offset, 0), width)
    return reads


def check_parameter_reads(name: str, instructions: list[Instruction], declared: Region,
                          target: Target) -> None:
    """Raise unless the image reads every declared parameter at the plan's offset with its
    size (8 bytes for a pointer, 4 for a scalar), and nothing else past the base."""
    slots = {slot.offset: slot for slot in argument_slots(target, declared.params)}
    reads = parameter_reads(instructions, target)
    for offset, width in sorted(reads.items()):
        slot = slots.get(offset)
        if slot is None or slot.size != width:
            wanted = ", ".join(f"{s.param.name}@0x{s.offset:x}:{s.size}"
                               for s in slots.values())
            raise RunFailure(f"own image {name!r} reads {width} bytes at c[0x0][0x{offset:x}], "
                             f"which is no parameter of the plan's [{wanted}]")
    unread = [slot.param.name for offset, slot in slots.items() if offset not in reads]
    if unread:
        raise RunFailure(f"own image {name!r} never reads its parameter(s) "
                         f"{', '.join(unread)}: its signature is not the plan's")


def check_schedule(name: str, image: own.Image) -> None:
    """Raise if the image's control bits break the latency model (bob.isa.check)."""
    hazards = check(image.code, table(image.arch))
    if hazards:
        raise RunFailure(f"own image {name!r}: {len(hazards)} scheduling hazard(s), the first: "
                         f"{hazards[0]}")


def check_resources(name: str, image: own.Image, target: Target) -> None:
    if image.registers > MAX_REGISTERS:
        raise RunFailure(f"own image {name!r} needs {image.registers} registers a thread; a "
                         f"QMD allows {MAX_REGISTERS}")
    if image.shared_bytes > target.max_shared_bytes_per_block:
        raise RunFailure(f"own image {name!r} needs {image.shared_bytes} bytes of shared "
                         f"memory; {target.name} allows a block "
                         f"{target.max_shared_bytes_per_block}")


def decoded(image: own.Image) -> list[Instruction]:
    """The image's instructions read back from its bytes: what the GPU will run."""
    instructions = decode_program(image.code, table(image.arch))
    for index, instruction in enumerate(instructions):
        if not isinstance(instruction, Instruction):
            raise RunFailure(f"own image {image.name!r}: instruction {index} does not decode "
                             f"({instruction})")
    return instructions  # type: ignore[return-value]


def own_region(name: str, target: Target) -> Region:
    """The declared region `name` with Bob's own image for `target`, after the checks."""
    image = own.image(name, target.name)
    declared = sig.declared_region(name)
    if image.name != declared.entry:
        raise RunFailure(f"own image {image.name!r} is not region {name!r}'s entry "
                         f"{declared.entry!r}")
    check_parameter_reads(name, decoded(image), declared, target)
    check_schedule(name, image)
    check_resources(name, image, target)
    return sig.declared_region(name, image.code, image.registers, image.shared_bytes)


def own_regions(target: Target) -> dict[str, Region]:
    """The seed regions Bob has its own machine code for, for `target`."""
    return {name: own_region(name, target) for name in OWN_REGIONS}


def with_own_kernels(regions: Mapping[str, Region] | None, target: Target) -> dict[str, Region]:
    """`regions` (NVRTC's, or none) with the seed's regions replaced by Bob's own."""
    return {**(regions or {}), **own_regions(target)}


def own_listing(target: Target, names: tuple[str, ...] = OWN_REGIONS) -> str:
    """Each own region's instructions as nvdisasm prints them, decoded from the image's bytes,
    with addresses and control bits (``bob plan --kernels own --disasm``)."""
    parts = []
    for name in names:
        image = own.image(name, target.name)
        parts.append(f"# {name}: {image.name} for {target.name}, {len(image.code) // 16} "
                     f"instructions, {image.registers} registers, {image.shared_bytes} bytes "
                     "of shared memory")
        parts.append(listing(decoded(image), table(image.arch)))
    return "\n".join(parts)
