"""Bob's own health check and snapshot copy kernels (bob.kernels.own.health, .copy): on the
emulator against the reference, their schedules checked, their instructions printed as
nvdisasm prints them; the health region through own_regions' checks; and the nv backend's
copy kernels taken from Bob's own images where NVRTC cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bob.errors import RunFailure
from bob.isa import codec, oracle, table, text
from bob.isa.builder import ARCH_FACTS
from bob.isa.check import check
from bob.isa.control import read_control
from bob.isa.model import GMem, Instruction, Reg
from bob.kernels import own
from bob.kernels import reference as ref
from bob.kernels import signatures as sig
from bob.kernels.cuda import snapshot
from bob.kernels.own.copy import UNITS, UNROLL, copy_image
from bob.kernels.own_regions import OWN_REGIONS, own_region
from bob.plan.placement import SM86, SM90
from conftest import needs_nvrtc
from isa_emulator import Arena, Launch, constants
from isa_support import assert_printed_as_nvdisasm_prints
from own_support import code_order, run_region  # noqa: F401 - the fixture

ARCHS = ("sm_90", "sm_86")
# Every test on the code in each ordering of its straight runs (bob.isa.builder).
pytestmark = pytest.mark.usefixtures("code_order")
LANES = 256
# What ptxas writes for atomicAdd(&health[i], unsigned long long) with its result unused
# (NVRTC, sm_90 and sm_86 alike): RED(G).E.ADD.64.STRONG.GPU desc[UR4][R2.64], R4.
PTXAS_RED = 0x000FE2000C10E584_000000040200798E
PRINTED_RED = {"sm_90": "REDG.E.ADD.64.STRONG.GPU desc[UR4][R2.64], R4",
               "sm_86": "RED.E.ADD.64.STRONG.GPU [R2.64], R4"}


def _images(arch: str):
    return [own.image(sig.HEALTH, arch)] + [copy_image(entry, arch) for entry in UNITS]


# -- the atomic add -----------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_the_64_bit_atomic_add_is_ptxas_s_bytes_and_text(arch):
    raw = PTXAS_RED.to_bytes(16, "little")
    forms = table(arch)
    decoded = codec.decode(raw, forms)
    assert decoded.form == "RED.E.ADD.64"
    assert decoded.operands == (GMem(2, 0, 4), Reg(4))
    ours = Instruction("RED.E.ADD.64", (GMem(2, 0, 4), Reg(4)), (),
                       control=read_control(PTXAS_RED))
    assert codec.encode(ours, forms) == raw
    assert text.render(ours, forms) == PRINTED_RED[arch]


# -- health --------------------------------------------------------------------------------


def _tables(rng, vocab: int) -> list[np.ndarray]:
    """Three tables with NaN and +-inf planted at quads' lanes, in the last (tail) element,
    and a whole row of them in the second moment."""
    tables = [(rng.standard_normal((vocab, vocab)) * 3).astype(np.float32) for _ in range(3)]
    flat = [t.reshape(-1) for t in tables]
    count = vocab * vocab
    flat[0][[0, 5, count - 1]] = [np.nan, np.inf, -np.inf]
    flat[0][count // 2] = np.float32(np.nan) * -1
    flat[1][3] = -np.inf
    flat[1][min(4 * 300 + 2, count - 2)] = np.inf  # a quad of a later round where there is one
    flat[1][1] = 3.4e38  # finite: the largest exponent but one
    flat[1][2] = 1e-42  # subnormal, finite
    tables[2][vocab - 1, :] = np.inf
    flat[2][7] = np.array(0x7F800001, np.uint32).view(np.float32)  # a signalling NaN
    return tables


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("vocab,grid", [(3, 1), (37, 3), (50, 1), (70, 2)])
def test_health_counts_non_finite_elements_into_what_is_there(arch, vocab, grid):
    """V x V not a multiple of 4 (a tail) or of the block, one or several blocks and
    grid-stride rounds (70 x 70 / 4 quads over 2 x 256 lanes: 3 rounds); the counts add
    to health's values, one with a low word about to carry."""
    tables = _tables(np.random.default_rng(vocab), vocab)
    start = np.array([0xFFFF_FFFF, 5, 1 << 40], np.uint64)
    out = run_region(own.image(sig.HEALTH, arch), sig.HEALTH, grid,
                     dict(parameters=tables[0], first_moment=tables[1],
                          second_moment=tables[2], health=start.copy(), vocab=vocab))
    counts = [ref.non_finite_count(t) for t in tables]
    assert all(counts)  # something planted in each table
    assert out["health"].tolist() == (start + np.array(counts, np.uint64)).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_health_of_healthy_tables_leaves_health_alone(arch):
    rng = np.random.default_rng(9)
    tables = [rng.standard_normal((20, 20)).astype(np.float32) for _ in range(3)]
    tables[1][0, 0] = np.nan
    start = np.array([7, 8, 9], np.uint64)
    out = run_region(own.image(sig.HEALTH, arch), sig.HEALTH, 2,
                     dict(parameters=tables[0], first_moment=tables[1],
                          second_moment=tables[2], health=start.copy(), vocab=20))
    assert out["health"].tolist() == [7, 9, 9]


@pytest.mark.parametrize("target", [SM90, SM86], ids=lambda t: t.name)
def test_the_health_region_passes_own_regions_checks(target):
    assert sig.HEALTH in OWN_REGIONS
    region = own_region(sig.HEALTH, target)
    image = own.image(sig.HEALTH, target.name)
    assert region.code == image.code and region.entry == "bob_health"
    assert region.shared_bytes == image.shared_bytes == \
        3 * 8 * (LANES // 32) + ARCH_FACTS[target.name].reserved_shared  # warps' totals
    assert region.params == sig.SIGNATURES[sig.HEALTH]
    assert own.covers(sig.HEALTH, 65536)


# -- the copy kernels ----------------------------------------------------------------------


def _copy(image, units: int, grid: int, offset: int = 0):
    """Run the copy `image` over `units` units from a source to a destination `offset`
    bytes into a buffer of sentinels; (source bytes, the buffer after, where the copy
    starts in it)."""
    unit = UNITS[image.name]
    rng = np.random.default_rng(units)
    source = rng.integers(0, 1 << 32, units * unit // 4 + offset // 4, dtype=np.uint32)
    guard = 64  # words of sentinels on each side of the destination
    buffer = np.full(2 * guard + units * unit // 4 + offset // 4, 0xA5A5A5A5, np.uint32)
    arena = Arena()
    source_address = arena.put(source) + offset
    buffer_address = arena.put(buffer)
    destination = buffer_address + 4 * guard + offset
    facts = ARCH_FACTS[image.arch]
    bank = constants(facts.parameter_base, facts.descriptor_offset, LANES, grid,
                     [("u64", source_address), ("u64", destination), ("u64", units)])
    memory = arena.memory()
    Launch(image.code, image.arch, bank, memory, arena.base, grid=grid).run()
    after = Arena.read(memory, arena.base, buffer_address, np.uint32, len(buffer))
    start = guard + offset // 4
    return source[offset // 4:], after, start


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("entry", sorted(UNITS))
@pytest.mark.parametrize("units,grid", [(1, 1), (37, 1), (1001, 1), (3333, 2)])
def test_a_copy_moves_exactly_its_units(arch, entry, units, grid):
    """Odd counts, counts past a round of grid x 256 x UNROLL units (3333 over 2 blocks:
    two rounds), and nothing written outside the destination."""
    assert (3333 > 2 * LANES * UNROLL) and (1001 < LANES * UNROLL)
    offset = 4 if entry == "bob_copy_4" else 0  # addresses only 4-byte aligned
    source, after, start = _copy(copy_image(entry, arch), units, grid, offset)
    words = units * UNITS[entry] // 4
    assert (after[start:start + words] == source[:words]).all()
    outside = np.concatenate([after[:start], after[start + words:]])
    assert (outside == 0xA5A5A5A5).all()


# -- every image: checker, printing --------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_the_schedules_pass_the_checker(arch):
    for image in _images(arch):
        assert check(image.code, table(arch)) == [], image.name
        assert image.registers % 8 == 0 and image.registers <= 255


@pytest.mark.parametrize("arch", ARCHS)
def test_every_instruction_prints_as_nvdisasm_prints_it(arch):
    assert_printed_as_nvdisasm_prints(_images(arch), arch)
    assert any(line.startswith("@P2 " + PRINTED_RED[arch].split()[0])
               for line in oracle.nvdisasm_raw(own.image(sig.HEALTH, arch).code, arch))


# -- the nv backend's choice ---------------------------------------------------------------


@pytest.fixture
def without_nvrtc(monkeypatch):
    """NVRTC's bindings made unimportable, and the copy kernels' cache cleared around."""
    for name in ("cuda", "cuda.bindings", "cuda.bindings.nvrtc"):
        monkeypatch.setitem(sys.modules, name, None)
    snapshot.copy_kernels.cache_clear()
    yield
    snapshot.copy_kernels.cache_clear()


@pytest.mark.parametrize("arch", ARCHS)
def test_without_nvrtc_the_copy_kernels_are_bob_s_own(without_nvrtc, arch):
    assert "import cuda.bindings.nvrtc" in snapshot.nvrtc_problem()
    kernels = snapshot.copy_kernels(arch)
    assert set(kernels) == set(snapshot.UNITS)
    for entry, copy in kernels.items():
        kernel = copy.kernel
        assert copy.origin == snapshot.OWN and copy.unit == snapshot.UNITS[entry]
        assert kernel.code == copy_image(entry, arch).code
        assert [(p.offset, p.size) for p in kernel.params] == [(0, 8), (8, 8), (16, 8)]
        assert kernel.parameter_base == ARCH_FACTS[arch].parameter_base
        assert kernel.frame_bytes == 0 and kernel.shared_bytes == 0
        assert kernel.max_threads == (snapshot.THREADS, 1, 1)


def test_an_own_copy_kernel_reading_other_parameters_is_refused(monkeypatch):
    # The health image reads five parameters, four pointers and a word: not the copy's.
    monkeypatch.setattr(snapshot, "copy_image",
                        lambda entry, arch: own.image(sig.HEALTH, arch))
    with pytest.raises(RunFailure, match=r"copy kernel 'bob_copy_16' takes \[\(0, 8\), "
                                         r"\(8, 8\), \(16, 8\), \(24, 8\), \(32, 4\)\]"):
        snapshot.own_copy_kernels("sm_90")


class _Block:
    """Video memory as the copy kernels' block sees it, with no device."""

    def __init__(self, size: int):
        self.data = bytearray(size)

    def write(self, offset: int, data: bytes) -> None:
        self.data[offset:offset + len(data)] = data

    def read(self, offset: int, size: int) -> bytes:
        return bytes(self.data[offset:offset + size])


def test_the_snapshot_qmds_launch_bob_s_own_copy_kernels(without_nvrtc, monkeypatch):
    from bob.backends.nv import decoder
    from bob.backends.nv.encoder import DRIVER_AREA
    from bob.backends.nv.rm import snapshot as rm_snapshot

    monkeypatch.setattr(rm_snapshot, "allocate", lambda device, size, **_: _Block(size))
    snapshots = rm_snapshot.SnapshotKernels(device=None)
    copies = ((0x20_0100_0000, 0x10_4000_0000, 1 << 20),  # 16-byte units
              (0x20_0200_0004, 0x10_5000_0004, 4096 + 4))  # 4-byte units
    addresses = snapshots.write(copies)
    for address, (source, destination, size), entry in zip(
            addresses, copies, ("bob_copy_16", "bob_copy_4"), strict=True):
        copy = snapshots.kernels[entry]
        assert copy.origin == snapshot.OWN
        code_at = snapshots.code_address[entry] - rm_snapshot.KERNELS_VA
        assert snapshots.block.read(code_at, len(copy.kernel.code)) == copy.kernel.code
        record = snapshots.block.read(address - rm_snapshot.KERNELS_VA, 384)
        dispatch = decoder.decode_qmd(record, 0xCBC0).dispatch()
        assert dispatch.program_address == snapshots.code_address[entry]
        assert dispatch.registers == copy.kernel.registers == copy_image(entry, "sm_90").registers
        assert dispatch.block == (256, 1, 1)
        bank, bank_size = dispatch.constant_buffers[0]
        data = snapshots.block.read(bank - rm_snapshot.KERNELS_VA, bank_size)
        blocks = min(rm_snapshot.MAX_BLOCKS, -(-(size // copy.unit) // 256))
        assert DRIVER_AREA.unpack_from(data)[:6] == (256, 1, 1, blocks, 1, 1)
        assert rm_snapshot.COPY_ARGUMENTS.unpack_from(data, copy.kernel.parameter_base) == (
            source, destination, size // copy.unit)


def test_the_nv_snapshot_module_imports_and_chooses_with_no_cuda_bindings():
    """In a fresh interpreter where no `cuda` package can be imported at all."""
    program = textwrap.dedent("""
        import importlib.abc, sys

        class NoCuda(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "cuda" or name.startswith("cuda."):
                    raise ImportError(f"{name} is blocked")
                return None

        sys.meta_path.insert(0, NoCuda())
        from bob.backends.nv.rm import snapshot
        from bob.kernels.cuda.snapshot import copy_kernels
        kernels = copy_kernels(snapshot.SUBMITTED_TARGET)
        print(sorted((entry, copy.origin) for entry, copy in kernels.items()))
        print(any(name == "cuda" or name.startswith("cuda.") for name in sys.modules))
    """)
    src = Path(__file__).resolve().parent.parent / "src"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == [
        "[('bob_copy_16', 'own'), ('bob_copy_4', 'own')]", "False"]


@needs_nvrtc
def test_with_nvrtc_the_copy_kernels_stay_nvrtc_s():
    snapshot.copy_kernels.cache_clear()
    try:
        kernels = snapshot.copy_kernels("sm_90")
    finally:
        snapshot.copy_kernels.cache_clear()
    assert {copy.origin for copy in kernels.values()} == {snapshot.NVRTC}
    compiled = snapshot.compiled_copy_kernels("sm_90")
    assert all(kernels[e].kernel.code == compiled[e].kernel.code for e in kernels)
