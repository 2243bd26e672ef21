"""Regions from Bob's own images (bob.kernels.own_regions): the seed's five regions with
Bob's machine code, checked against the plan's declared parameters, placed by the plan and
the nv encoder as NVRTC's are."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bob.backends.nv import decoder
from bob.backends.nv.encoder import SHARED_MEMORY_ALIGNMENT, SYSTEM_SHARED_BYTES, encode
from bob.errors import RunFailure
from bob.isa.model import CBuf, Imm, Instruction, Reg, Target
from bob.kernels import own
from bob.kernels import signatures as sig
from bob.kernels.own_regions import (
    OWN_REGIONS,
    check_parameter_reads,
    decoded,
    own_listing,
    own_region,
    own_regions,
    with_own_kernels,
)
from bob.plan import certify
from bob.plan.placement import SM86, SM90, TARGETS
from bob.program.bob import build_plan
from conftest import bob_config, needs_nvrtc

SEED_REGIONS = {sig.GATHER, sig.LOSS_HARD, sig.LOSS_CORPUS, sig.ADAMW, sig.ARGMAX}


@pytest.mark.parametrize("target", [SM90, SM86], ids=lambda t: t.name)
def test_the_seed_regions_carry_the_images_code_and_resources(target):
    regions = own_regions(target)
    assert set(regions) == set(OWN_REGIONS) and SEED_REGIONS <= set(OWN_REGIONS)
    for name, region in regions.items():
        image = own.image(name, target.name)
        assert region.code == image.code and len(region.code) % 16 == 0
        assert (region.registers, region.shared_bytes) == (image.registers, image.shared_bytes)
        declared = sig.declared_region(name)
        assert (region.params, region.entry, region.block_x) == \
            (declared.params, declared.entry, declared.block_x)
        assert region.dynamic_shared_bytes == 0 and region.cluster_slices is None


def test_sm90_shared_windows_count_the_reserved_kilobyte():
    regions = own_regions(SM90)
    assert regions[sig.ARGMAX].shared_bytes == 1024 + 8 * 256  # values and indices
    assert regions[sig.LOSS_HARD].shared_bytes == 1024 + 2 * 4 * 256  # two trees
    assert regions[sig.GATHER].shared_bytes == 0 and regions[sig.ADAMW].shared_bytes == 0


@needs_nvrtc
def test_own_regions_declare_what_nvrtc_s_regions_declare():
    from bob.kernels.cuda.regions import compiled_regions

    compiled = compiled_regions("sm_90")
    for name, region in own_regions(SM90).items():
        theirs = compiled[name]
        assert (region.params, region.entry, region.block_x, region.dynamic_shared_bytes) == \
            (theirs.params, theirs.entry, theirs.block_x, theirs.dynamic_shared_bytes)
        assert region.code != theirs.code
    mixed = with_own_kernels(compiled, SM90)
    assert set(mixed) == set(compiled)
    for name in compiled:
        assert mixed[name].code == (own.image(name, "sm_90").code if name in OWN_REGIONS
                                    else compiled[name].code)


def _instructions(name: str) -> list[Instruction]:
    return decoded(own.image(name, "sm_90"))


def test_a_read_outside_the_parameters_is_refused():
    instructions = _instructions(sig.GATHER)
    stray = Instruction("MOV.C", (Reg(3), CBuf(0, SM90.parameter_base + 0x40)))
    with pytest.raises(RunFailure, match=r"^own image 'bob-row-gather' reads 4 bytes at "
                                         r"c\[0x0\]\[0x250\], which is no parameter"):
        check_parameter_reads(sig.GATHER, [*instructions, stray],
                              sig.declared_region(sig.GATHER), SM90)


def test_a_pointer_read_as_a_word_is_refused():
    instructions = [i for i in _instructions(sig.GATHER) if "64" not in i.modifiers
                    or not any(isinstance(o, CBuf) and o.offset == SM90.parameter_base
                               for o in i.operands)]
    half = Instruction("MOV.C", (Reg(3), CBuf(0, SM90.parameter_base)))
    with pytest.raises(RunFailure, match="reads 4 bytes at c\\[0x0\\]\\[0x210\\]"):
        check_parameter_reads(sig.GATHER, [*instructions, half],
                              sig.declared_region(sig.GATHER), SM90)


def test_an_image_for_another_signature_is_refused():
    """The argmax image reads its V at 0x220, where the gather's signature has a pointer."""
    with pytest.raises(RunFailure, match=r"reads 4 bytes at c\[0x0\]\[0x220\]"):
        check_parameter_reads(sig.GATHER, _instructions(sig.ARGMAX),
                              sig.declared_region(sig.GATHER), SM90)


def test_a_hazard_in_the_schedule_is_refused(monkeypatch):
    from bob.isa import table
    from bob.isa.codec import encode as encode_one

    image = own.image(sig.GATHER, "sm_90")
    # blockDim.x's LDC result compared at once: no wait on its scoreboard.

    instructions = list(image.instructions)
    index = next(i for i, ins in enumerate(instructions) if ins.form == "ISETP.PPRIP")
    instructions[index] = replace(instructions[index],
                                  control=replace(instructions[index].control, wait=0))
    code = b"".join(encode_one(i, table("sm_90")) for i in instructions)
    broken = replace(image, code=code, instructions=tuple(instructions))
    monkeypatch.setattr(own, "image", lambda name, arch: broken)
    with pytest.raises(RunFailure, match=r"^own image 'bob-row-gather': \d+ scheduling "
                                         r"hazard\(s\), the first: 0x0040: unwaited-read"):
        own_region(sig.GATHER, SM90)


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_a_plan_with_own_regions_certifies_and_places_their_code(mode):
    config = bob_config(vocab=256, prompts=2, updates=3, mode=mode, submission="chained")
    regions = own_regions(SM90)
    plan = build_plan(config, SM90, compiled=regions)
    assert certify(plan).holds
    encoded = encode(plan)
    program = next(c for c in encoded.components if c.name == "program")
    for placed in plan.placed_regions:
        if placed.name in regions:
            start = placed.address - program.base
            assert bytes(program.data[start:start + placed.bytes]) == regions[placed.name].code
    for index, launch in enumerate(plan.launches):
        record = encoded.qmd_table.data[index * encoded.qmd_stride:][
            :plan.target.qmd_record_bytes]
        dispatch = decoder.decode_qmd(record, encoded.compute_class).dispatch()
        region = plan.region(launch.region)
        if launch.region in regions:
            assert dispatch.program_address == plan.placed_region(launch.region).address
            assert dispatch.registers == region.registers
            assert dispatch.shared_memory == -(-(SYSTEM_SHARED_BYTES + region.shared_bytes)
                                               // SHARED_MEMORY_ALIGNMENT) \
                * SHARED_MEMORY_ALIGNMENT


def test_the_listing_is_the_isa_printer_s_text():
    text = own_listing(SM90, (sig.GATHER,))
    lines = text.splitlines()
    image = own.image(sig.GATHER, "sm_90")
    assert lines[0] == (f"# bob-row-gather: bob_row_gather for sm_90, "
                        f"{len(image.code) // 16} instructions, {image.registers} registers, "
                        "0 bytes of shared memory")
    assert len(lines) == 1 + len(image.code) // 16
    assert "ULDC.64 UR4, c[0x0][0x208] ;" in lines[1]
    assert lines[-1].endswith("NOP ;") and any(line.endswith("EXIT ;") for line in lines)
    assert all(name in own_listing(TARGETS["sm_90"]) for name in OWN_REGIONS)


def test_immediates_and_the_driver_area_are_no_parameter_reads():
    """Immediates and driver-area reads (blockDim at 0, gridDim at 0xc) are no parameters."""
    instructions = [Instruction("MOV.C", (Reg(3), CBuf(0, 0xC))),
                    Instruction("MOV.I", (Reg(3), Imm(SM90.parameter_base)))]
    with pytest.raises(RunFailure, match="never reads"):
        check_parameter_reads(sig.GATHER, instructions, sig.declared_region(sig.GATHER), SM90)


def _mnemonic(instruction) -> str:
    from bob.isa import table

    if not isinstance(instruction, Instruction):
        return "?"  # outside the subset (none in the seed's regions' own code)
    return table("sm_90").form(instruction.form).mnemonic


def _branch_stalls_and_tail(code: bytes) -> tuple[set[int], list[str]]:
    """The stalls of every BRA and EXIT before the image's tail, and the tail's mnemonics
    (from the branch to itself on)."""
    from bob.isa import table
    from bob.isa.codec import decode_program

    instructions = decode_program(code, table("sm_90"))
    start = next(i for i, ins in enumerate(instructions)
                 if _mnemonic(ins) == "BRA" and ins.operands[-1:] == (Target(-16),))
    stalls = {ins.control.stall for ins in instructions[:start]
              if _mnemonic(ins) in ("BRA", "EXIT")}
    return stalls, [_mnemonic(ins) for ins in instructions[start:]]


@pytest.mark.parametrize("target", [SM90, SM86], ids=lambda t: t.name)
def test_images_branch_and_end_as_ptxas_s_do(target):
    """Every BRA and EXIT stalls 5 cycles or more, and the image ends with a branch to
    itself and NOPs to a whole 128 bytes: what ptxas writes (below), and what Bob's own
    images lacked when they faulted on the H200."""
    for name, region in own_regions(target).items():
        assert len(region.code) % 128 == 0, name
        if target is SM90:
            stalls, tail = _branch_stalls_and_tail(region.code)
            assert min(stalls) >= 5, name
            assert tail[0] == "BRA" and set(tail[1:]) <= {"NOP"}, name


@needs_nvrtc
def test_ptxas_branches_and_ends_so():
    from bob.kernels.cuda.regions import compiled_regions

    compiled = compiled_regions("sm_90")
    for name in OWN_REGIONS:
        stalls, tail = _branch_stalls_and_tail(compiled[name].code)
        assert min(stalls) >= 5 and len(compiled[name].code) % 128 == 0, name
        assert tail[0] == "BRA" and set(tail[1:]) <= {"NOP"}, name
