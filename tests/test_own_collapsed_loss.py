"""Bob's own collapsed loss kernels (bob.kernels.own.collapsed_loss): add_run alone against
bob.kernels.collapsed.runs.add_run, and each kernel on the emulator against the collapsed
reference byte for byte, on rows with no exception, one, many, all, a rest of one column,
zeros of both signs, subnormals, a NaN and a weightless corpus row; their schedules pass
bob.isa.check, their instructions print as nvdisasm prints them, and own_region takes
them."""

from __future__ import annotations

import numpy as np
import pytest

from bob.isa.builder import ARCH_FACTS
from bob.kernels.collapsed import runs
from bob.kernels.own import collapsed_loss as cl
from bob.kernels.own.asm import LANES, Asm, Scratch, p, r
from bob.plan.model import Footprint, PointerParam, ScalarParam
from isa_emulator import Arena, Launch, constants
from own_support import code_order  # noqa: F401 - the fixture

ARCHS = ("sm_90", "sm_86")
pytestmark = pytest.mark.usefixtures("code_order")

RUN_PARAMS = (
    PointerParam("out", Footprint(4, ("count",)), "write"),
    PointerParam("acc", Footprint(4, ("count",)), "read"),
    PointerParam("x", Footprint(4, ("count",)), "read"),
    PointerParam("n", Footprint(4, ("count",)), "read"),
    ScalarParam("count", "u32"),
)


def add_run_image(arch: str):
    """out[i] = add_run(acc[i], x[i], n[i]), a lane each: lanes of one block loop
    different numbers of times."""
    s = Asm(arch, RUN_PARAMS)
    tid, ctaid, i, address, acc, x, n, pointer = 0, 1, 2, 4, 6, 7, 8, 10
    s.prologue(tid, ctaid, scratch=3)
    vote = cl.Vote(s, tid, 12, 13, 14)
    vote.start()
    s.lea(i, r(ctaid), r(tid), 8)
    s.isetp(6, "LT", r(i), s.param("count"))
    for register, name in ((acc, "acc"), (x, "x"), (n, "n")):
        s.mov(register, 0)
        s.pointer(pointer, name)
        s.wide(address, r(i), 4, pointer)
        s.ldg(register, address, guard=p(6))
    cl.add_run(s, vote, acc, x, n, Scratch(20, cl.ADD_RUN_SCRATCH))
    s.isetp(6, "LT", r(i), s.param("count"))
    s.pointer(pointer, "out")
    s.wide(address, r(i), 4, pointer)
    s.stg(address, acc, guard=p(6))
    s.exit()
    return s.image("test_add_run", shared_bytes=cl.SHARED_BYTES)


def run_add_run(arch: str, acc: np.ndarray, x: np.ndarray, n: np.ndarray) -> np.ndarray:
    image = add_run_image(arch)
    count = len(acc)
    arena = Arena()
    out = arena.put(np.zeros(count, np.uint32))
    pointers = [arena.put(np.ascontiguousarray(a).view(np.uint32))
                for a in (acc.astype(np.float32), x.astype(np.float32), n.astype(np.uint32))]
    facts = ARCH_FACTS[arch]
    grid = -(-count // LANES)
    bank = constants(facts.parameter_base, facts.descriptor_offset, LANES, grid,
                     [("u64", out), *(("u64", a) for a in pointers), ("u32", count)])
    memory = arena.memory()
    Launch(image.code, arch, bank, memory, arena.base, grid=grid,
           shared_bytes=image.shared_bytes).run()
    return Arena.read(memory, arena.base, out, np.uint32, count)


def _bits(values) -> np.ndarray:
    return np.array(values, np.uint32).view(np.float32)


def run_cases(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(acc, x, n) with the edges: binade crossings, ties from odd and even multiples,
    subnormal terms and sums, zeros of both signs, x below half a spacing, infinities,
    NaN, negative terms, n of 0, 1 and up to 2^24 and past it."""
    f = np.float32
    cases = [
        (0.0, 1.0, 0), (0.0, 1.0, 1), (0.0, 1.0, 1000), (0.0, 0.1, 300), (0.0, 0.1, 70000),
        (1.0, 1.0, 2**24 + 5), (0.0, 1.0, 2**25), (3.0, 1.5, 12345),
        (1.0, 2.0**-24, 5), (1.0 + 2.0**-23, 2.0**-24, 7),  # ties: even and odd multiples
        (1.0, 3 * 2.0**-25, 9), (2.0, 2.0**-23 * 3, 11), (1.0, 2.0**-26, 1000),
        (-0.0, 0.0, 3), (0.0, -0.0, 3), (-0.0, -0.0, 4), (5.0, 0.0, 9), (5.0, -0.0, 9),
        (np.inf, 1.0, 3), (1.0, np.inf, 3), (1.0, -np.inf, 2), (np.nan, 1.0, 2),
        (1.0, np.nan, 2), (np.inf, -np.inf, 2), (10.0, -1.0, 25), (-3.0, 0.5, 17),
        (0.0, 3.0e38, 5), (1.0e38, 1.0e38, 4), (7.0, 7.0, 100), (0.5, 1.0, 64),
        (2.0**-140, 2.0**-149, 1000), (0.0, 2.0**-149, 2**24 + 3), (0.0, 2.0**-130, 50000),
        (1.0e-38, 3.0e-39, 40000), (0.0, 1.0e-45, 9), (1.0, 1.0e-45, 2**31),
    ]
    acc = [f(a) for a, _, _ in cases]
    x = [f(b) for _, b, _ in cases]
    n = [c for _, _, c in cases]
    size = 300  # random lanes too, more than one block
    start = rng.choice([0.0, 1.0, 0.3, 1e-40], size).astype(f)
    term = (rng.random(size) * 2.0 ** rng.integers(-30, 4, size)).astype(f)
    term[rng.random(size) < 0.1] = _bits(rng.integers(1, 1 << 23, size))[:1]
    count = rng.integers(0, 5000, size)
    count[rng.random(size) < 0.05] = rng.integers(2**20, 2**25)
    return (np.concatenate([np.array(acc, f), start]), np.concatenate([np.array(x, f), term]),
            np.concatenate([np.array(n, np.int64), count]))


@pytest.mark.parametrize("arch", ARCHS)
def test_add_run_alone_matches_runs_add_run(arch):
    acc, x, n = run_cases(np.random.default_rng(7))
    got = run_add_run(arch, acc, x, n)
    want = np.array([runs.add_run(a, b, int(k)) for a, b, k in zip(acc, x, n, strict=True)],
                    np.float32).view(np.uint32)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(acc[i], x[i], int(n[i]), hex(got[i]), hex(want[i]))
                           for i in bad[:5]]
