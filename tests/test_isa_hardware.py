"""What the H200 taught the encoder, the checker and the scheduler (docs/ISA.md, "What
the H200 refused"): a guarded BPT.TRAP is an illegal instruction encoding even where its
guard is false; with the yield bit only stalls of 1 to 11 are encodings; and a fixed-latency
result's wait depends on who reads it (a predicate that guards an instruction: 13 cycles
after an ISETP; an address a load reads from IMAD.WIDE's upper half: 5)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bob.isa import check, codec, table
from bob.isa.builder import Builder
from bob.isa.control import Control
from bob.isa.fields import GUARD
from bob.isa.model import PT, RZ, CBuf, GMem, Imm, Instruction, Pred, Reg, SMem, SReg, UReg
from bob.kernels import own
from bob.kernels.own_regions import OWN_REGIONS

SM90 = table("sm_90")


def _encoded(instructions: list[Instruction]) -> bytes:
    return b"".join(codec.encode(each, SM90) for each in instructions)


def _rules(code: bytes) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for hazard in check.check(code, SM90):
        found.setdefault(hazard.pc, set()).add(hazard.rule)
    return found


def test_a_guarded_trap_is_refused_by_the_encoder_and_reported_by_the_checker():
    trap = Instruction("BPT.TRAP", (Imm(1),), guard=Pred(0), control=Control(stall=1))
    with pytest.raises(codec.EncodeError, match="BPT.TRAP takes no guard: a guarded one is "
                                                r"an illegal instruction \(branch around it\)"):
        codec.encode(trap, SM90)
    unguarded = codec.encode(replace(trap, guard=Pred(PT)), SM90)
    word = GUARD.write(int.from_bytes(unguarded, "little"), 0)  # @P0, as the bytes would be
    exit_ = codec.encode(Instruction("EXIT", control=Control(stall=5)), SM90)
    hazards = check.check(word.to_bytes(16, "little") + exit_, SM90)
    assert [(h.pc, h.rule) for h in hazards] == [(0, "illegal-encoding")]
    assert "a guarded BPT.TRAP" in hazards[0].message
    assert not check.check(unguarded + exit_, SM90)


@pytest.mark.parametrize("stall", range(16))
@pytest.mark.parametrize("yield_bit", [True, False])
def test_a_stall_outside_1_to_11_with_the_yield_bit_is_no_encoding(stall, yield_bit):
    move = Instruction("MOV.I", (Reg(0), Imm(1)), control=Control(stall=stall,
                                                                   yield_bit=yield_bit))
    if yield_bit and not 1 <= stall <= 11:
        with pytest.raises(codec.EncodeError, match=f"a stall of {stall} with the yield bit "
                                                    "set is no encoding"):
            codec.encode(move, SM90)
    else:
        assert len(codec.encode(move, SM90)) == 16


def test_nvdisasm_refuses_the_stalls_the_encoder_refuses():
    from bob.isa import oracle
    from bob.isa.control import read_control, write_control

    try:
        oracle.tool_path("nvdisasm")
    except oracle.OracleMissing as why:
        pytest.skip(str(why))
    base = codec.encode(Instruction("MOV.I", (Reg(0), Imm(1)), control=Control(stall=1)),
                        SM90)
    word = int.from_bytes(base, "little")
    for stall in range(16):
        for yield_bit in (True, False):
            control = replace(read_control(word), stall=stall, yield_bit=yield_bit)
            raw = write_control(word, control).to_bytes(16, "little")
            try:
                oracle.nvdisasm_raw(raw, "sm_90")
                accepted = True
            except RuntimeError:
                accepted = False
            assert accepted == control.defined, (stall, yield_bit)


def _compare_then(reader: Instruction, stall: int) -> bytes:
    compare = Instruction("ISETP.PPRIP", (Pred(0), Pred(PT), Reg(3), Imm(256), Pred(PT)),
                          ("EQ", "U32", "AND"), control=Control(stall=stall, yield_bit=stall <= 11))
    return _encoded([compare, reader, Instruction("EXIT", control=Control(stall=5))])


def test_a_guard_waits_13_cycles_for_an_isetp_a_combining_isetp_4():
    guarded = Instruction("MOV.I", (Reg(5), Imm(7)), guard=Pred(0),
                          control=Control(stall=1, yield_bit=True))
    assert _rules(_compare_then(guarded, 4)) == {0x10: {"fixed-latency"}}
    assert _rules(_compare_then(guarded, 12)) == {0x10: {"fixed-latency"}}
    assert _rules(_compare_then(guarded, 13)) == {}
    combining = Instruction("ISETP.PPRIP", (Pred(1), Pred(PT), Reg(4), Imm(9), Pred(0)),
                            ("LT", "U32", "AND"), control=Control(stall=1, yield_bit=True))
    assert _rules(_compare_then(combining, 3)) == {0x10: {"fixed-latency"}}
    assert _rules(_compare_then(combining, 4)) == {}


def test_a_load_waits_5_cycles_for_its_address_from_imad_wide():
    def program(stall: int) -> bytes:
        wide = Instruction("IMAD.WIDE.RRIR", (Reg(12), Reg(6), Imm(4), Reg(8)), ("U32",),
                           control=Control(stall=stall, yield_bit=True))
        load = Instruction("LDG.E", (Reg(7), GMem(12, 0, 4)),
                           control=Control(stall=2, yield_bit=True, write=0))
        use = Instruction("MOV.R", (Reg(9), Reg(7)), control=Control(stall=1, wait=1))
        return _encoded([wide, load, use, Instruction("EXIT", control=Control(stall=5))])

    assert _rules(program(3)) == {0x10: {"fixed-latency"}}  # the old model's 3 is too few
    assert _rules(program(4)) == {0x10: {"fixed-latency"}}
    assert _rules(program(5)) == {}


def test_the_scheduler_waits_for_a_guard_and_an_address_as_the_checker_wants():
    b = Builder("sm_90")
    b.op("ULDC", UReg(4), CBuf(0, 0x208), mods="64")
    b.op("S2R", Reg(0), SReg(own.TID_X))
    b.op("ISETP.PPRIP", Pred(0), Pred(PT), Reg(0), Imm(256), Pred(PT), mods=("LT", "U32", "AND"))
    b.op("IMAD.WIDE.RRIR", Reg(12), Reg(0), Imm(4), Reg(RZ), mods="U32")
    b.op("LDG.E", Reg(7), GMem(12, 0, 4), guard=Pred(0))
    b.op("STG.E", GMem(12, 0, 4), Reg(7), guard=Pred(0))
    b.op("EXIT")
    image = b.image("probe")
    assert not check.check(image.code, SM90)
    compare, wide, load = image.instructions[2], image.instructions[3], image.instructions[4]
    assert max(compare.control.stall, 1) + max(wide.control.stall, 1) >= 13
    assert wide.control.stall >= 5
    assert load.form == "LDG.E"


@pytest.mark.parametrize("name", OWN_REGIONS)
def test_own_images_trap_unguarded_and_pass_the_checker(name):
    image = own.image(name, "sm_90")
    traps = [each for each in image.instructions if each.form == "BPT.TRAP"]
    assert traps and all(each.guard == Pred(PT) for each in traps)
    assert all(each.control.defined for each in image.instructions)
    assert not check.check(image.code, SM90)


def _barrier_then_load(stall: int) -> bytes:
    barrier = Instruction("BAR.SYNC.I", (Imm(0),), control=Control(stall=stall,
                                                                 yield_bit=True))
    load = Instruction("LDS", (Reg(5), SMem(RZ, 0x400)),
                       control=Control(stall=2, yield_bit=True, write=0))
    use = Instruction("MOV.R", (Reg(6), Reg(5)), control=Control(stall=1, wait=1))
    return _encoded([barrier, load, use, Instruction("EXIT", control=Control(stall=5))])


def test_a_shared_load_waits_6_cycles_after_a_barrier():
    """An LDS one cycle after BAR.SYNC read a reduction's slot before the other warps'
    last store had landed (the own loss kernels' wrong rows on the H200)."""
    assert _rules(_barrier_then_load(1)) == {0x10: {"barrier-latency"}}
    assert _rules(_barrier_then_load(5)) == {0x10: {"barrier-latency"}}
    assert _rules(_barrier_then_load(6)) == {}


def test_the_scheduler_keeps_memory_6_cycles_after_a_barrier():
    b = Builder("sm_90")
    b.op("S2R", Reg(0), SReg(own.TID_X))
    b.op("STS", SMem(0, 0x400), Reg(0))
    b.op("BAR.SYNC.I", Imm(0))
    b.op("LDS", Reg(5), SMem(RZ, 0x400))
    b.op("EXIT")
    image = b.image("probe", shared_bytes=1024)
    assert not check.check(image.code, SM90)
    barrier = next(each for each in image.instructions if each.form == "BAR.SYNC.I")
    assert barrier.control.stall >= 6
