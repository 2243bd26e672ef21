"""Running Bob's own kernels on the emulator (tests/isa_emulator.py): test harnesses."""

from __future__ import annotations

import numpy as np
import pytest

from bob.isa.builder import ORDERINGS, ordering
from bob.kernels.own import LANES, Asm, Scratch, divide, p, r, square_root
from bob.kernels.own.asm import (
    DIVIDE_REGISTERS,
    SQRT_SCRATCH,
    Reciprocal,
    _divide_fast,
    _square_root_fast,
    divide_by,
    reciprocal,
)
from bob.plan.model import Footprint, PointerParam, ScalarParam
from isa_emulator import Arena, Launch, constants


@pytest.fixture(params=ORDERINGS)
def code_order(request):
    """Every image built in a test is built in this ordering of its straight runs (a test
    module takes it for all its tests: `pytestmark = pytest.mark.usefixtures(...)`)."""
    with ordering(request.param):
        yield request.param


def assert_checked_and_placed(region: str, arch: str) -> None:
    """The own image of `region` passes the schedule checker, and own_region takes it (its
    parameter reads, schedule and resources) as the region Bob runs."""
    from bob.isa import table
    from bob.isa.check import check
    from bob.kernels import own
    from bob.kernels import signatures as sig
    from bob.kernels.own_regions import OWN_REGIONS, own_region
    from bob.plan.placement import TARGETS

    image = own.image(region, arch)
    assert check(image.code, table(arch)) == []
    placed = own_region(region, TARGETS[arch])
    assert placed.code == image.code and placed.entry == sig.declared_region(region).entry
    assert region in OWN_REGIONS


ELEMENTWISE = (
    PointerParam("out", Footprint(4, ("count",)), "write"),
    PointerParam("a", Footprint(4, ("count",)), "read"),
    PointerParam("b", Footprint(4, ("count",)), "read"),
    ScalarParam("count", "u32"),
)


def elementwise(arch: str, operation: str, nudge: int | None = None):
    """out[i] = a[i] / b[i] ("divide"; "divide_by": by b[i]'s reciprocal() first) or
    sqrt(a[i]) ("sqrt"), one element per thread; with a `nudge`, by the fast sequence
    alone, its candidate moved so many ulps."""
    s = Asm(arch, ELEMENTWISE)
    tid, ctaid, i, addr, x, y = 0, 1, 2, 4, 6, 7
    s.prologue(tid, ctaid, scratch=3)
    s.lea(i, r(ctaid), r(tid), 8)
    s.isetp(6, "LT", r(i), s.param("count"))
    s.pointer(8, "a")
    s.wide(addr, r(i), 4, 8)
    s.ldg(x, addr, guard=p(6))
    if operation == "divide":
        s.pointer(8, "b")
        s.wide(addr, r(i), 4, 8)
        s.ldg(y, addr, guard=p(6))
        if nudge is None:
            divide(s, x, x, y, Scratch(10, DIVIDE_REGISTERS))
        else:
            _divide_fast(s, 30, x, y, Scratch(10, DIVIDE_REGISTERS), nudge)
            s.mov(x, r(30))
    elif operation == "divide_by":  # by each lane's divisor, prepared first
        s.pointer(8, "b")
        s.wide(addr, r(i), 4, 8)
        s.ldg(y, addr, guard=p(6))
        prepared = Reciprocal(y, 40, 41)
        reciprocal(s, prepared, Scratch(10, DIVIDE_REGISTERS))
        divide_by(s, x, x, prepared, Scratch(10, DIVIDE_REGISTERS))
    elif nudge is None:
        square_root(s, x, x, Scratch(10, SQRT_SCRATCH))
    else:
        _square_root_fast(s, 30, x, Scratch(10, SQRT_SCRATCH), nudge)
        s.mov(x, r(30))
    s.pointer(8, "out")
    s.wide(addr, r(i), 4, 8)
    s.stg(addr, x, guard=p(6))
    s.exit()
    return s.image(f"test_{operation}" if nudge is None else f"test_{operation}_{nudge}")


def run_elementwise(image, a: np.ndarray, b: np.ndarray | None = None, perturb: int = 0):
    return run_elementwise_counted(image, a, b, perturb)[0]


def run_elementwise_counted(image, a: np.ndarray, b: np.ndarray | None = None,
                            perturb: int = 0) -> tuple[np.ndarray, int]:
    """run_elementwise's results and the warp instructions the emulator executed."""
    count = len(a)
    arena = Arena()
    out = arena.put(np.zeros(count, np.uint32))
    pa = arena.put(a.view(np.uint32))
    pb = arena.put((b if b is not None else a).view(np.uint32))
    from bob.isa.builder import ARCH_FACTS

    facts = ARCH_FACTS[image.arch]
    grid = -(-count // LANES)
    bank = constants(facts.parameter_base, facts.descriptor_offset, LANES, grid,
                     [("u64", out), ("u64", pa), ("u64", pb), ("u32", count)])
    memory = arena.memory()
    launch = Launch(image.code, image.arch, bank, memory, arena.base, grid=grid,
                    perturb=perturb)
    launch.run()
    return Arena.read(memory, arena.base, out, np.uint32, count), launch.steps


def run_region(image, region: str, grid: int, arguments: dict, perturb: int = 0,
               blocks: tuple[int, ...] | None = None) -> dict:
    """Run `image` as `region` on the emulator: `arguments` by parameter name (arrays for
    pointers, numbers for scalars: np.float32 for f32). Returns every pointer's array
    after the launch, by name."""
    from bob.isa.builder import ARCH_FACTS
    from bob.kernels import signatures as sig

    arena = Arena()
    placed = {}
    words = []
    params = sig.SIGNATURES[region]
    for param in params:
        if isinstance(param, PointerParam):
            array = np.ascontiguousarray(arguments[param.name])
            placed[param.name] = (arena.put(array), array.dtype, array.size)
            words.append(("u64", placed[param.name][0]))
    for param in params:
        if isinstance(param, ScalarParam):
            value = arguments[param.name]
            bits = int(np.float32(value).view(np.uint32)) if param.dtype == "f32" else int(value)
            words.append(("u32", bits))
    facts = ARCH_FACTS[image.arch]
    bank = constants(facts.parameter_base, facts.descriptor_offset, LANES, grid, words)
    memory = arena.memory()
    Launch(image.code, image.arch, bank, memory, arena.base, grid=grid,
           shared_bytes=image.shared_bytes, perturb=perturb, blocks=blocks).run()
    return {name: Arena.read(memory, arena.base, address, dtype, size)
            for name, (address, dtype, size) in placed.items()}


def reference(region: str, arguments: dict, grid: int) -> dict[str, np.ndarray]:
    """Run the NumPy reference kernel of `region` over copies of `arguments`' arrays, in one
    arena as a plan places them; every pointer's array afterwards, by name."""
    from bob.kernels import reference as ref
    from bob.kernels import signatures as sig
    from bob.kernels.collapsed import reference as collapsed
    from bob.kernels.memory import Memory

    pointers = [param.name for param in sig.SIGNATURES[region]
                if isinstance(param, PointerParam)]
    arrays = {name: np.ascontiguousarray(arguments[name]) for name in pointers}
    base, offsets, end = 0x10_0000_0000, {}, 0
    for name in pointers:
        offsets[name] = end
        end += -(-arrays[name].nbytes // 256) * 256
    buffer = np.zeros(max(end, 1), np.uint8)
    views = {name: buffer[offsets[name]:offsets[name] + arrays[name].nbytes]
             .view(arrays[name].dtype).reshape(arrays[name].shape) for name in pointers}
    for name in pointers:
        views[name][...] = arrays[name]
    args = {**{name: value for name, value in arguments.items() if name not in pointers},
            **{name: base + offsets[name] for name in pointers}, "grid.x": grid}
    {**ref.KERNELS, **collapsed.KERNELS}[region](Memory(buffer, base), args)
    return {name: view.copy() for name, view in views.items()}
