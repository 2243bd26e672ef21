"""The schedule checker accepts ptxas's schedules of the seed kernels and rejects
planted hazards: a fixed-latency producer's stall shortened, the wait dropped from an
LDG result's first reader, and a scoreboard waited on before it can be set."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bob.isa import check, codec, table
from bob.isa.control import read_control, write_control
from bob.kernels.cuda.cubin import Cubin
from isa_support import ARCHS, SEED_KERNELS, kernel_image


def _code(arch: str, entry: str) -> bytes:
    return Cubin(kernel_image(arch)).kernel(entry).code


def _with_control(code: bytes, index: int, **changes) -> bytes:
    raw = code[index * 16:index * 16 + 16]
    word = int.from_bytes(raw, "little")
    word = write_control(word, replace(read_control(word), **changes))
    return code[:index * 16] + word.to_bytes(16, "little") + code[index * 16 + 16:]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("entry", SEED_KERNELS)
def test_accepts_ptxas_schedules(arch, entry):
    hazards = check.check(_code(arch, entry), table(arch))
    assert not hazards, "\n".join(map(str, hazards))


@pytest.mark.parametrize("arch", ARCHS)
def test_reports_every_kernel(arch):
    """Every kernel of the image, counted (the non-seed ones are not all modelled yet)."""
    cubin = Cubin(kernel_image(arch))
    counts = {entry: len(check.check(cubin.kernel(entry).code, table(arch)))
              for entry in cubin.entries()}
    print(f"{arch}: hazards the model reports per kernel: {counts}")
    assert all(counts[entry] == 0 for entry in SEED_KERNELS)


def _steps(arch: str, entry: str):
    code = _code(arch, entry)
    return code, check._steps(code, table(arch))


@pytest.mark.parametrize("arch", ARCHS)
def test_rejects_a_shortened_fixed_latency_stall(arch):
    code, steps = _steps(arch, "bob_adamw")
    planted = 0
    for index, step in enumerate(steps[:-1]):
        following = steps[index + 1]
        if step.effects.known and not step.effects.variable and step.effects.writes & \
                following.effects.reads and step.control.stall >= 2:
            bad = _with_control(code, index, stall=1)
            rules = {h.rule for h in check.check(bad, table(arch)) if h.pc == following.pc}
            assert "fixed-latency" in rules, f"stall shortened at 0x{step.pc:x} not caught"
            planted += 1
    assert planted, "no fixed-latency producer directly followed by its reader"


@pytest.mark.parametrize("arch", ARCHS)
def test_rejects_a_dropped_wait_on_a_load(arch):
    code, steps = _steps(arch, "bob_row_gather")
    forms = table(arch)
    planted = 0
    for index, step in enumerate(steps):
        if step.instruction is None or forms.form(step.instruction.form).mnemonic != "LDG.E":
            continue
        board = step.control.write
        for later in range(index + 1, len(steps)):
            reader = steps[later]
            if reader.control.waits_on(board):
                bad = _with_control(code, later, wait=reader.control.wait & ~(1 << board))
                rules = {h.rule for h in check.check(bad, forms)}
                assert "unwaited-read" in rules, f"dropped wait at 0x{reader.pc:x} not caught"
                planted += 1
                break
    assert planted, "no LDG with a waiting reader"


@pytest.mark.parametrize("arch", ARCHS)
def test_rejects_a_scoreboard_reused_too_early(arch):
    """A wait on a scoreboard by the very next instruction, with stall 1, sees it unset."""
    code, steps = _steps(arch, "bob_row_gather")
    index = next(i for i, s in enumerate(steps[:-1]) if s.control.write is not None)
    board = steps[index].control.write
    bad = _with_control(code, index, stall=1)
    bad = _with_control(bad, index + 1, wait=steps[index + 1].control.wait | 1 << board)
    rules = {h.rule for h in check.check(bad, table(arch))}
    assert "early-wait" in rules


def test_checked_code_still_decodes():
    """The planted programs stay well-formed: only control bits change."""
    code = _code("sm_90", "bob_adamw")
    bad = _with_control(code, 3, stall=1)
    assert codec.decode(bad[48:64], table("sm_90")).control.stall == 1


def test_rejects_a_vote_read_sooner_than_a_guard_s():
    """A VOTE reads its predicate at dispatch, as a guard does: ptxas stalls 13 cycles
    between a compare and the VOTE that reads what it wrote, and an own VOTE 5 cycles after
    its ISETP took the predicate before it on an H100. Shortened to 5, the checker says so
    (ptxas's sm_90 code has such pairs; its sm_86 code puts other work between them)."""
    arch = "sm_90"
    forms = table(arch)
    cubin = Cubin(kernel_image(arch))
    planted = 0
    for entry in cubin.entries():
        code = cubin.kernel(entry).code
        steps = check._steps(code, forms)
        for index, step in enumerate(steps[:-1]):
            following = steps[index + 1]
            if (following.instruction is None or step.instruction is None
                    or forms.form(following.instruction.form).mnemonic != "VOTE"
                    or forms.form(step.instruction.form).mnemonic != "ISETP"
                    or not step.effects.writes & following.effects.reads):
                continue
            assert step.control.stall >= 13, (entry, hex(step.pc))
            bad = _with_control(code, index, stall=5)
            rules = {h.rule for h in check.check(bad, forms) if h.pc == following.pc}
            assert "fixed-latency" in rules, f"{entry}: VOTE at 0x{following.pc:x} not caught"
            planted += 1
    assert planted, "no ISETP directly followed by the VOTE that reads its predicate"
