"""bob.isa.order, the list scheduler of straight runs: what it moves, what it never moves.

Whole kernels reordered are checked where they run: tests/test_own_kernels.py runs every
own kernel in both orderings on the emulator against the reference."""

from __future__ import annotations

from collections import Counter

import pytest

from bob.isa import table
from bob.isa.builder import ORDERINGS, Builder, ordering
from bob.isa.check import check
from bob.isa.model import Instruction
from bob.isa.order import reorder
from bob.kernels import own
from bob.kernels.own.asm import Asm, p, r
from own_support import ELEMENTWISE

ARCH = "sm_90"


def _written(build) -> list[Instruction]:
    s = Asm(ARCH, ELEMENTWISE)
    build(s)
    return list(s.b._items)


def _forms(instructions: list[Instruction]) -> list[tuple[str, tuple]]:
    return [(each.form, each.operands) for each in instructions]


def test_an_independent_instruction_moves_into_a_load_s_latency():
    def build(s):
        s.ldg(1, 4)  # R1 := [R4]
        s.fadd(2, r(1), r(1))  # reads the load
        s.add(5, r(6), 1)  # independent: issued while the load is in flight

    written = _written(build)
    ordered = reorder(written, table(ARCH))
    assert _forms(ordered) == _forms([written[0], written[2], written[1]])


def test_a_load_never_passes_a_store_and_a_store_never_passes_a_load():
    def build(s):
        s.stg(4, 1)  # [R4] := R1
        s.ldg(7, 8)  # may read what the store wrote
        s.stg(10, 7)
        s.add(12, r(13), 1)

    written = _written(build)
    ordered = reorder(written, table(ARCH))
    memory = [each for each in ordered if each.form in ("STG.E", "LDG.E")]
    assert _forms(memory) == _forms([written[0], written[1], written[2]])


def test_loads_may_pass_loads():
    def build(s):
        s.ldg(1, 4)
        s.fadd(2, r(1), r(1))
        s.fadd(3, r(2), r(2))
        s.ldg(5, 8)  # independent of the first chain: issued before it waits

    written = _written(build)
    ordered = reorder(written, table(ARCH))
    assert [each.form for each in ordered].index("LDG.E") == 0
    assert ordered[1].form == "LDG.E"


def test_register_and_predicate_order_is_kept():
    def build(s):
        s.add(1, r(2), 1)
        s.add(2, r(3), 1)  # overwrites what the first reads: stays after it
        s.add(1, r(4), 1)  # overwrites the first's result: stays after it
        s.isetp(0, "LT", r(5), r(6))
        s.add(7, r(8), 1, guard=p(0))  # guarded by the compare: after it
        s.add(7, r(9), 1, guard=p(0, True))  # a guarded write keeps the old R7: after

    written = _written(build)
    ordered = reorder(written, table(ARCH))
    position = {id(each): index for index, each in enumerate(ordered)}
    for before, after in ((0, 1), (0, 2), (3, 4), (4, 5)):
        assert position[id(written[before])] < position[id(written[after])]


def test_fences_and_labels_keep_their_places():
    def build(s):
        s.ldg(1, 4)
        s.fadd(2, r(1), r(1))
        s.barrier()
        s.add(5, r(6), 1)  # may not cross the barrier
        s.fadd(3, r(2), r(2))

    written = _written(build)
    ordered = reorder(written, table(ARCH))
    assert ordered[2] is written[2]
    assert {id(each) for each in ordered[:2]} == {id(each) for each in written[:2]}
    # a block start splits a run as a barrier does
    split = reorder(written[3:], table(ARCH), block_starts={1})
    assert split == written[3:]


@pytest.mark.parametrize("arch", ("sm_90", "sm_86"))
@pytest.mark.parametrize("region", sorted(own.BUILDERS))
def test_every_own_image_reordered_passes_the_checker_with_fewer_stalls(arch, region):
    """The list scheduler moves code, the controls stay provable, and a kernel's fixed
    stalls never grow (a run keeps a new order only where the program's stalls fall)."""
    from bob.isa.control import read_control

    def stalls(code: bytes) -> int:
        return sum(read_control(int.from_bytes(code[i:i + 16], "little")).stall
                   for i in range(0, len(code), 16))

    images = {}
    for name in ORDERINGS:
        with ordering(name):
            images[name] = own.image(region, arch)
    written, latency = images["written"], images["latency"]
    assert check(latency.code, table(arch)) == []
    assert len(latency.code) == len(written.code)
    def what(each: Instruction) -> str:  # the instruction less its controls
        return repr((each.form, each.operands, each.modifiers, each.guard))

    assert Counter(map(what, latency.instructions)) == Counter(map(what, written.instructions))
    assert stalls(latency.code) <= stalls(written.code)


def test_a_run_the_list_scheduler_would_slow_keeps_its_written_order():
    """With a cost, reorder takes a run's new order only where the cost falls."""
    def build(s):
        s.ldg(1, 4)
        s.fadd(2, r(1), r(1))
        s.add(5, r(6), 1)

    written = _written(build)
    assert reorder(written, table(ARCH), cost=lambda order: 0.0) == written
    assert reorder(written, table(ARCH), cost=lambda order: float(order.index(written[2]))) \
        != written


def test_an_unknown_ordering_is_refused():
    with pytest.raises(ValueError, match="unknown ordering 'fast'; choose one of written, "
                       "latency"), ordering("fast"):
        pass
    assert Builder(ARCH).ordering == "written"
