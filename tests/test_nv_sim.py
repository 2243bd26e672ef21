"""nv-sim: plans run from their encoded bytes alone, with stand-in kernels.

The reference kernels (bob.kernels.reference) are injected where they exist;
these tests use small kernels of their own so that they check the channel:
launch order, arguments read from constant buffer 0, semaphores, scalar
patches.
"""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest

from bob.backends.cpu import CpuBackend
from bob.backends.nv import encoder
from bob.backends.nv.decoder import TABLES
from bob.backends.nv.sim import NvSimBackend, NvSimError
from bob.errors import RunFailure
from bob.kernels.memory import Memory
from bob.plan.model import (
    Address,
    Dim3,
    Footprint,
    LaunchSpec,
    PointerParam,
    ProgramSpec,
    Region,
    Scalar,
    ScalarParam,
    Submission,
    TensorRef,
    TensorSpec,
)
from bob.plan.placement import SM86, SM90, place
from bob.program.bob import BobConfig, Hyper, adam_scalars, build_plan
from conftest import stand_in_regions

TARGETS = (SM86, SM90)
N = 16
BLOCK = 64

FILL = Region(
    "fill", code=b"\x11" * 40, registers=16, block_x=BLOCK,
    params=(PointerParam("out", Footprint(4, ("count",)), "write"),
            ScalarParam("value", "f32"), ScalarParam("count", "u32")),
)
AXPY = Region(
    "axpy", code=b"\x22" * 300, registers=24, block_x=BLOCK,
    params=(PointerParam("y", Footprint(4, ("count",)), "readwrite"),
            PointerParam("x", Footprint(4, ("count",)), "read"),
            ScalarParam("a", "f32"), ScalarParam("count", "u32")),
)


def fill(memory: Memory, args: dict) -> None:
    memory.array(args["out"], "f32", args["count"])[:] = args["value"]


def axpy(memory: Memory, args: dict) -> None:
    y = memory.array(args["y"], "f32", args["count"])
    x = memory.array(args["x"], "f32", args["count"])
    y[:] = y + args["a"] * x  # binary32 throughout: args["a"] is an np.float32


KERNELS = {"fill": fill, "axpy": axpy}


def tiny_plan(target):
    """fill x; fill y | y += 3x | y += 0.5x, and the last launch submitted again."""
    count = Scalar.u32(N)
    launches = (
        LaunchSpec("fill", Dim3(1), Dim3(BLOCK), (TensorRef("x"), Scalar.f32(2.0), count), "x=2"),
        LaunchSpec("fill", Dim3(1), Dim3(BLOCK), (TensorRef("y"), Scalar.f32(1.0), count), "y=1"),
        LaunchSpec("axpy", Dim3(2), Dim3(BLOCK),
                   (TensorRef("y"), TensorRef("x"), Scalar.f32(3.0), count), "y+=3x"),
        LaunchSpec("axpy", Dim3(2), Dim3(BLOCK),
                   (TensorRef("y"), TensorRef("x"), Scalar.f32(0.5), count), "y+=x/2"),
    )
    program = ProgramSpec(
        regions=(FILL, AXPY),
        tensors=(TensorSpec("x", "f32", (N,)), TensorSpec("y", "f32", (N,))),
        launches=launches,
        submissions=(Submission(0, 2, 1), Submission(2, 1, 2), Submission(3, 1, 5),
                     Submission(3, 1, 9)),
    )
    return place(program, target)


def with_scalars(plan, launch, values):
    """The launch with these scalar arguments replaced: what a patched block must encode."""
    names = [p.name for p in plan.region(launch.region).params]
    return replace(launch, args=tuple(values.get(name, arg)
                                      for name, arg in zip(names, launch.args, strict=True)))


def _f32(backend, name):
    return np.frombuffer(backend.read_tensor(name), dtype=np.float32)


@pytest.fixture(params=TARGETS, ids=lambda t: t.name)
def target(request):
    return request.param


def test_runs_launches_in_order_and_releases_semaphores(target):
    plan = tiny_plan(target)
    backend = NvSimBackend(plan, kernels=KERNELS)
    assert backend.name == "nv-sim"
    assert not backend.launched and not backend.releases  # the set-up launches nothing
    backend.run(range(plan.submission_count))
    assert [launch.region for launch in backend.launched] == ["fill", "fill", "axpy", "axpy",
                                                              "axpy"]
    assert _f32(backend, "x").tolist() == [2.0] * N
    assert _f32(backend, "y").tolist() == [1.0 + 6.0 + 1.0 + 1.0] * N
    slots = [backend.encoded.submission_semaphore(i) for i in range(plan.submission_count)]
    progress = backend.encoded.launch_progress_address
    host = [(r.address, r.value) for r in backend.releases if r.source == "host"]
    qmd = [(r.address, r.value) for r in backend.releases if r.source == "qmd"]
    assert host == [(slot, s.semaphore) for slot, s in zip(slots, plan.submissions, strict=True)]
    assert qmd == [(progress, 1), (progress, 2), (progress, 3), (progress, 4), (progress, 4)]
    assert [backend.semaphore(slot) for slot in slots] == [1, 2, 5, 9]
    assert backend.last_semaphore == 9
    assert backend.word(progress) == 4
    assert progress == slots[0] + 8  # the spare half of slot 0


def test_a_rerun_waits_for_fresh_releases(target):
    """The slots are zeroed before each run, so an old value cannot pass for a new one."""
    plan = tiny_plan(target)
    backend = NvSimBackend(plan, kernels=KERNELS)
    backend.run(range(plan.submission_count))
    backend.run(range(plan.submission_count))
    assert _f32(backend, "y").tolist() == [9.0] * N
    # Submission 0's entry cut short of its release (a header and five data words):
    entry = backend._entries[1]
    backend._entries[1] = replace(entry, words=entry.words - 6)
    with pytest.raises(NvSimError, match="holds 0, not 1"):
        backend.run(range(1))


def test_arguments_come_from_constant_buffer_zero(target):
    plan = tiny_plan(target)
    backend = NvSimBackend(plan, kernels=KERNELS)
    backend.run(range(plan.submission_count))
    third = backend.launched[2]
    assert third.arguments == {"y": plan.tensor("y").address, "x": plan.tensor("x").address,
                               "a": np.float32(3.0), "count": N,
                               "grid.x": 2}  # the QMD's grid: a block-per-row kernel's rows
    assert isinstance(third.arguments["a"], np.float32)
    assert third.grid == (2, 1, 1) and third.block == (BLOCK, 1, 1)
    assert third.qmd_address == backend.encoded.qmd_address(2)


def test_submissions_run_in_separate_calls(target):
    plan = tiny_plan(target)
    backend = NvSimBackend(plan, kernels=KERNELS)
    backend.run(range(0, 1))
    assert backend.last_semaphore == 1 and _f32(backend, "y").tolist() == [1.0] * N
    backend.run(range(1, 3))
    assert backend.last_semaphore == 5 and _f32(backend, "y").tolist() == [8.0] * N
    backend.run(range(3, 4))
    assert backend.last_semaphore == 9 and _f32(backend, "y").tolist() == [9.0] * N
    with pytest.raises(RunFailure, match="submission 4 is not in the plan's 4"):
        backend.run(range(4, 5))


def test_set_scalars_rewrites_the_parameter_block_bytes(target):
    plan = tiny_plan(target)
    backend = NvSimBackend(plan, kernels=KERNELS)
    backend.set_scalars(2, {"a": Scalar.f32(-1.0)})
    program = backend._components["program"]
    offset = plan.parameter_block_address(2) - plan.address_map.program.base
    patched = bytes(program[1][offset:offset + plan.target.parameter_block_bytes])
    area = encoder.DRIVER_AREA_BYTES
    assert patched[area:] == backend.parameter_block(2)[area:]
    assert patched[:area] == backend.encoded.program.data[offset:offset + area]  # kept
    assert patched == encoder.parameter_block(
        plan, 2, with_scalars(plan, plan.launches[2], {"a": Scalar.f32(-1.0)}))
    assert patched != backend.encoded.program.data[offset:offset + len(patched)]
    backend.run(range(plan.submission_count))
    assert _f32(backend, "y").tolist() == [1.0 - 2.0 + 1.0 + 1.0] * N


def test_tensors_round_trip_and_refuse_overruns(target):
    plan = tiny_plan(target)
    backend = NvSimBackend(plan, kernels=KERNELS)
    data = np.arange(N, dtype=np.float32).tobytes()
    backend.write_tensor("x", data)
    assert backend.read_tensor("x") == data
    backend.write_tensor("x", struct.pack("<f", 7.0), offset=4 * (N - 1))
    assert _f32(backend, "x")[-1] == 7.0
    with pytest.raises(RunFailure, match=f"do not fit tensor 'x' \\({4 * N} bytes\\)"):
        backend.write_tensor("x", data, offset=4)


@pytest.mark.parametrize("backend_class", [CpuBackend, NvSimBackend])
def test_every_backend_refuses_what_the_plan_lacks_in_one_way(target, backend_class):
    """The range checks live in the base class: one error type, one message each."""
    backend = backend_class(tiny_plan(target), kernels=KERNELS)
    with pytest.raises(RunFailure, match=rf"^8 bytes at offset {4 * N - 4} do not fit "
                                              rf"tensor 'y' \({4 * N} bytes\)$"):
        backend.write_tensor("y", bytes(8), offset=4 * N - 4)
    with pytest.raises(RunFailure, match="at offset -4 do not fit"):
        backend.write_tensor("y", bytes(4), offset=-4)
    with pytest.raises(RunFailure, match=r"^submission -1 is not in the plan's 4$"):
        backend.run(range(-1, 2))
    with pytest.raises(TypeError, match="range of submissions"):
        backend.run([0])  # type: ignore[arg-type]
    assert backend.read_tensor("y") == bytes(4 * N)  # nothing was written, nothing ran
    assert backend.last_semaphore == 0
    backend.run(range(0))  # an empty range runs nothing
    assert backend.last_semaphore == 0


def test_regions_without_code_still_have_their_own_addresses(target):
    """Placement gives a region without code a slot, so a QMD still names its kernel."""
    plan = build_plan(BobConfig(prompts=1, updates=1), target)
    addresses = [p.address for p in plan.placed_regions]
    assert len(set(addresses)) == len(addresses) == 5  # the seed's four and bob-health
    NvSimBackend(plan)  # opens: the program addresses tell the regions apart


def test_a_corrupt_program_address_is_caught(target):
    plan = tiny_plan(target)
    backend = NvSimBackend(plan, kernels=KERNELS)
    _, table = backend._components["qmd-table"]
    lower = TABLES.qmd["03_00" if target is SM86 else "04_00"].field("PROGRAM_ADDRESS_LOWER")
    word = lower.low // 32 * 4
    table[word:word + 4] = struct.pack("<I", 0x1234_5600)  # QMD 0's program address
    with pytest.raises(NvSimError, match="no region's"):
        backend.run(range(1))


@pytest.mark.parametrize("offset, what", [(0x0, "blockDim"), (0xC, "gridDim"),
                                          (0x18, "shared window"), (0x20, "local window")])
def test_a_wrong_driver_area_is_caught(target, offset, what):
    """The GPU's compiled code reads these; the simulator refuses what would mislead it."""
    plan = tiny_plan(target)
    backend = NvSimBackend(plan, kernels=KERNELS)
    _, program = backend._components["program"]
    start = plan.parameter_block_address(0) - plan.address_map.program.base + offset
    program[start:start + 4] = struct.pack("<I", 3)
    with pytest.raises(NvSimError, match=f"driver area holds {what}"):
        backend.run(range(1))


def test_missing_kernel_is_reported(target):
    plan = tiny_plan(target)
    backend = NvSimBackend(plan, kernels={"fill": fill})
    backend.run(range(1))
    with pytest.raises(NvSimError, match="no kernel for region 'axpy'"):
        backend.run(range(1, 2))


# -- Bob's own plan, with stand-in code and kernels that record what they got ------------------


def test_bobs_plan_runs_every_launch_with_its_arguments(target):
    config = BobConfig(vocab=64, prompts=2, updates=3)
    plan = build_plan(config, target, compiled=stand_in_regions(config))
    calls: list[tuple[str, dict]] = []

    def recorder(name):
        def kernel(memory, args):
            calls.append((name, dict(args)))
        return kernel

    backend = NvSimBackend(plan, kernels={r.name: recorder(r.name) for r in plan.regions})
    patched = adam_scalars(Hyper(lr=0.05), 2)
    backend.set_scalars(config.adamw_launch(1), patched)
    backend.run(range(plan.submission_count))
    expected = [launch for s in plan.submissions for launch in s.launches]
    assert len(calls) == len(expected)
    for (name, args), index in zip(calls, expected, strict=True):
        launch = plan.launches[index]
        if index == config.adamw_launch(1):
            launch = with_scalars(plan, launch, patched)
        region = plan.region(launch.region)
        assert name == launch.region
        for param, arg in zip(region.params, launch.args, strict=True):
            if isinstance(arg, Address):
                assert args[param.name] == arg.address
            elif arg.dtype == "f32":
                assert args[param.name].view(np.uint32) == arg.bits
            else:
                assert args[param.name] == arg.bits
    assert backend.last_semaphore == plan.submissions[-1].semaphore


def test_bobs_plan_matches_the_cpu_backend_byte_for_byte(target):
    from bob.backends.cpu import CpuBackend

    config = BobConfig(vocab=32, prompts=3, updates=4)
    plan = build_plan(config, target, compiled=stand_in_regions(config))
    rng = np.random.default_rng(7)
    record = np.concatenate([rng.integers(0, config.vocab, config.vocab),
                             rng.integers(0, config.vocab, config.prompts)]).astype("<u4")
    table = rng.standard_normal((config.vocab, config.vocab)).astype("<f4")
    backends = [CpuBackend(plan), NvSimBackend(plan)]
    for backend in backends:
        backend.write_tensor("input", record.tobytes())
        backend.write_tensor("parameters", table.tobytes())
        backend.set_scalars(config.adamw_launch(2), adam_scalars(Hyper(lr=0.02), 3))
        backend.run(range(plan.submission_count))
    for tensor in plan.tensors:
        assert backends[0].read_tensor(tensor.name) == backends[1].read_tensor(tensor.name), (
            tensor.name)
    assert any(backends[1].read_tensor("training_loss"))  # the kernels did run
