"""Regions from Bob's own images: machine code with no compiler and no cubin.

    own_regions(SM90)                       # every region Bob has own code for
    with_own_kernels(compiled, SM90)        # NVRTC's regions with those replaced
    coverage_refusal(names, 4096)           # None, or why a plan of these regions cannot run

``bob.kernels.own`` writes kernels (its ``BUILDERS``: the seed schedule's row gather,
loss-gradient in both modes, AdamW and greedy argmax, the fused schedule's
register-resident kernel in both modes (V <= 1024: ``own.VOCAB_LIMITS``, its image
trapping past it), the scatter and the loss alone, the health check, and every family
added beside them) with Bob's instruction builder.
This module turns each image into the region the plan declares, after checking what
NVRTC's regions are checked for (``bob.kernels.cuda.regions``): the image reads its
arguments exactly where the plan's parameter block holds them (every parameter, at its
offset, with its size), its schedule passes ``bob.isa.check``, and its registers and
shared memory fit the target. The plan and the certificate take the regions unchanged;
the nv backend places the code in the program component and the register count and
shared window in the QMD, as it does NVRTC's. The nv backend's snapshot copy kernels are
no regions: ``bob.kernels.cuda.snapshot`` takes Bob's own (``own.copy``) where NVRTC is
not installed, decoded and checked with this module's functions.

Which plans own code runs (``coverage_refusal``): the schedule's own kernels (the gather,
the loss-gradient, AdamW or the fused kernel, the argmax) must all be Bob's; the regions
every plan holds beside them (the health check, the scatter, the loss alone) are Bob's
where it has them and NVRTC's where not, while NVRTC is installed. Without NVRTC every
region must be Bob's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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
# The regions a plan holds beside its schedule's kernels, in either table layout: where Bob
# has no own code for one, NVRTC's runs it (when NVRTC is installed). One Bob has code for
# is Bob's at every V (the regions go by name), so it must serve the plan's V.
SHARED_REGIONS = frozenset({sig.HEALTH, sig.SCATTER, sig.LOSS_ONLY_CORPUS, sig.COLLAPSED_HEALTH,
                            sig.COLLAPSED_SCATTER, sig.COLLAPSED_LOSS_ONLY})
# The fused schedule's training regions (--schedule seed has none of them), and the
# collapsed tables' (--tables dense has none): a refusal of those alone says so.
FUSED_REGIONS = frozenset(name for name in sig.SIGNATURES if name.startswith("bob-fused-")) \
    | {sig.COLLAPSED_FUSED_HARD, sig.COLLAPSED_FUSED_CORPUS}
CUDA_EXTRA = "pip install 'bob-bigram[cuda]'"
# Every region of the seed schedule's one-piece dense plans, in either mode, validation
# included: where own code runs all of them at every V, nv without NVRTC runs any such run.
SEED_SCHEDULE_REGIONS = (sig.GATHER, sig.LOSS_HARD, sig.LOSS_CORPUS, sig.ADAMW, sig.ARGMAX,
                         sig.HEALTH, sig.SCATTER, sig.LOSS_ONLY_CORPUS)


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
    """The regions Bob has its own machine code for, for `target`."""
    return {name: own_region(name, target) for name in OWN_REGIONS}


def with_own_kernels(regions: Mapping[str, Region] | None, target: Target) -> dict[str, Region]:
    """`regions` (NVRTC's, or none) with those Bob has own code for replaced by it."""
    return {**(regions or {}), **own_regions(target)}


def uncovered(names: Iterable[str], vocab: int) -> tuple[str, ...]:
    """The regions among `names` (once each, in their order) that Bob's own code does not run
    at vocabulary `vocab` (bob.kernels.own.covers)."""
    return tuple(name for name in dict.fromkeys(names) if not own.covers(name, vocab))


def needs_own_code(name: str, nvrtc: bool) -> bool:
    """Whether a plan's region `name` must be Bob's own code: every region without NVRTC;
    with it, all but a shared region Bob has no code for (NVRTC's runs that one)."""
    return not nvrtc or name not in SHARED_REGIONS or name in own.BUILDERS


def coverage_refusal(names: Iterable[str], vocab: int, nvrtc: bool = True) -> str | None:
    """None where Bob's own code runs a plan of the regions `names` at vocabulary `vocab`,
    else the one line that refuses it, naming the regions: with NVRTC installed for the
    shared regions (`--kernels own`), or without it (nv where NVRTC is not installed)."""
    missing = uncovered((name for name in names if needs_own_code(name, nvrtc)), vocab)
    if not missing:
        return None
    ways = []
    if all(name in FUSED_REGIONS for name in missing):
        ways.append("--schedule seed")
    if all(name in sig.COLLAPSED_REGIONS for name in missing):
        ways.append("--tables dense")
    where = f"{', '.join(missing)} (V = {vocab})"
    if nvrtc:
        return (f"--kernels own: Bob has no own machine code for {where}; use "
                f"{' or '.join(['--kernels nvrtc', *ways])}")
    return (f"nv runs Bob's own machine code here (NVRTC is not installed), and Bob has none "
            f"for {where}: {' or '.join([CUDA_EXTRA, *ways])}")


def seed_schedule_gaps() -> tuple[str, ...]:
    """The seed schedule's regions Bob's own code does not run at every V (none once it has
    them all): what keeps `auto` from nv where NVRTC is not installed."""
    return tuple(name for name in SEED_SCHEDULE_REGIONS
                 if name not in own.BUILDERS or name in own.VOCAB_LIMITS)


# The collapsed tables' fused kernels: a collapsed plan on the seed schedule needs none.
COLLAPSED_FUSED = (sig.COLLAPSED_FUSED_HARD, sig.COLLAPSED_FUSED_CORPUS)


def collapsed_refusal() -> str | None:
    """None where Bob's own code has the collapsed tables' seed schedule (every collapsed
    plan is then held to coverage_refusal like any: a fused one Bob has no kernel for is
    refused naming it, and `--schedule auto` takes the seed schedule), else the line that
    refuses --tables collapsed with it."""
    missing = [name for name in sig.COLLAPSED_REGIONS
               if name not in COLLAPSED_FUSED and needs_own_code(name, nvrtc=True)
               and name not in own.BUILDERS]
    if not missing:
        return None
    return (f"--kernels own: Bob has no own machine code for the collapsed tables' regions "
            f"({', '.join(missing)}); use --kernels nvrtc or --tables dense")


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
