"""The CUDA backend against the CPU backend, tensor by tensor, byte for byte.

    PYTHONPATH=src python -m pytest -m gpu tests/test_cuda_backend.py     # on a GPU machine

The tests marked ``gpu`` need an NVIDIA GPU; the others (refusal before any
driver call, pointer relocation, the kernel-module probe) run anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bob.backends.cpu import CpuBackend
from bob.backends.cuda import CudaBackend, CudaError, kernel_module, kernel_parameters
from bob.errors import RunFailure
from bob.host.check import random_record
from bob.kernels.cuda.compile import KernelSource
from bob.kernels.cuda.cubin import Cubin, Kernel
from bob.kernels.cuda.regions import CompiledRegions, compiled_regions
from bob.plan.certificate import CertificateError
from bob.plan.model import (
    Dim3,
    Footprint,
    LaunchSpec,
    Plan,
    PointerParam,
    ProgramSpec,
    Region,
    Scalar,
    ScalarParam,
    Submission,
    TensorRef,
    TensorSpec,
)
from bob.plan.placement import SM86, TARGETS, argument_slots, place
from bob.program.bob import WEIGHTS_TENSOR, BobConfig, Hyper, adam_scalars, build_plan
from conftest import assert_same_tensors, bob_config

HERE = Path(__file__).parent / "cuda"


# -- runs anywhere --------------------------------------------------------------------------


class _RecordingDriver:
    """Stands in for cuda.bindings.driver: records every function looked up."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        self.calls.append(name)
        raise AssertionError(f"driver.{name} was reached")


def test_an_uncertified_plan_is_refused_before_any_driver_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bob.backends.cuda import driver as cuda_driver

    driver = _RecordingDriver()
    monkeypatch.setattr(cuda_driver, "bindings", lambda: driver)
    plan = build_plan(BobConfig(vocab=256, prompts=1, updates=1))
    first, second, *rest = plan.tensors
    overlapping = replace(plan, tensors=(first, replace(second, address=first.address), *rest))
    with pytest.raises(CertificateError, match="tensor-overlap"):
        CudaBackend(overlapping, CompiledRegions(b"", {}))
    assert driver.calls == []  # no cuInit, no cuMemAlloc, nothing


def test_a_plan_not_built_from_the_given_image_is_refused_before_any_driver_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bob.backends.cuda import driver as cuda_driver
    from bob.kernels import signatures as sig

    driver = _RecordingDriver()
    monkeypatch.setattr(cuda_driver, "bindings", lambda: driver)
    plan = build_plan(BobConfig(vocab=256, prompts=1, updates=1))  # declared regions, no code
    compiled = CompiledRegions(b"", {
        name: sig.declared_region(name, code=b"\x01" * 16) for name in sig.ENTRIES})
    with pytest.raises(RunFailure, match=r"^region '[a-z-]+' of the plan differs from the "
                                         "compiled image's"):
        CudaBackend(plan, compiled)
    assert driver.calls == []


@pytest.mark.parametrize("target", [TARGETS["sm_86"], TARGETS["sm_90"]])
def test_parameter_buffers_relocate_pointers_and_keep_scalars(target) -> None:
    plan = build_plan(BobConfig(vocab=256, prompts=2, updates=2), target)
    device_base = 0x7F12_3400_0000
    arena = plan.address_map.arena
    cpu = CpuBackend(plan)
    for index, launch in enumerate(plan.launches):
        region = plan.region(launch.region)
        block = cpu.parameter_block(index)
        buffer = kernel_parameters(plan, region, block, device_base)
        slots = argument_slots(target, region.params)
        assert len(buffer) == max(s.offset + s.size for s in slots) - target.parameter_base
        for slot, arg in zip(slots, _ordered_args(region, launch.args), strict=True):
            at = slot.offset - target.parameter_base
            word = buffer[at:at + slot.size]
            if isinstance(slot.param, PointerParam):
                expected = device_base + arg.address - arena.base
                assert int.from_bytes(word, "little") == expected
            else:
                assert int.from_bytes(word, "little") == arg.bits


def _ordered_args(region: Region, args: tuple) -> list:
    by_name = dict(zip((p.name for p in region.params), args, strict=True))
    return [by_name[slot.param.name] for slot in argument_slots(SM86, region.params)]


def test_a_pointer_outside_the_arena_is_not_relocated() -> None:
    plan = build_plan(BobConfig(vocab=256, prompts=1, updates=0))
    region = plan.region(plan.launches[0].region)
    block = bytearray(CpuBackend(plan).parameter_block(0))
    block[plan.target.parameter_base:plan.target.parameter_base + 8] = (16).to_bytes(8, "little")
    with pytest.raises(ValueError, match="outside the arena"):
        kernel_parameters(plan, region, bytes(block), 0x1000)


def test_the_kernel_module_probe(tmp_path: Path) -> None:
    open_module = tmp_path / "open"
    open_module.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15\n"
                           "GCC version: gcc 12\n")
    proprietary = tmp_path / "proprietary"
    proprietary.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05\n")
    assert kernel_module(open_module)[0] == "open"
    assert kernel_module(proprietary) == (
        "proprietary", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05")
    assert kernel_module(tmp_path / "absent") == (None, None)


# -- on a GPU ---------------------------------------------------------------------------------

gpu = pytest.mark.gpu


@pytest.fixture(scope="module")
def arch(cuda_arch: str) -> str:
    return cuda_arch


# A program of three small kernels (tests/cuda/plan_test_kernels.cu): the backend's
# mechanics without Bob's arithmetic. Launch 1 and 2 are submitted twice.
TEST_SOURCE = KernelSource("plan_test_kernels.cu",
                           (HERE / "plan_test_kernels.cu").read_text())
N = 1024
_ELEMENTS = Footprint(4, ("n",))
TEST_REGIONS = (
    Region("test-axpy", entry="test_axpy", params=(
        PointerParam("y", _ELEMENTS, "readwrite"), PointerParam("x", _ELEMENTS),
        ScalarParam("a", "f32"), ScalarParam("n", "u32"))),
    Region("test-reverse", entry="test_reverse", params=(
        PointerParam("out", _ELEMENTS, "write"), PointerParam("in", _ELEMENTS),
        ScalarParam("n", "u32"))),
    Region("test-iota", entry="test_iota", params=(
        PointerParam("out", _ELEMENTS, "write"), ScalarParam("start", "u32"),
        ScalarParam("n", "u32"))),
)


def _cpu_axpy(memory, args) -> None:
    y = memory.array(args["y"], "f32", args["n"])
    x = memory.array(args["x"], "f32", args["n"])
    y[:] = args["a"] * x + y  # binary32: the product rounded, then the sum


def _cpu_reverse(memory, args) -> None:
    source = memory.array(args["in"], "f32", args["n"]).copy()
    memory.array(args["out"], "f32", args["n"])[:] = source.reshape(-1, 256)[:, ::-1].ravel()


def _cpu_iota(memory, args) -> None:
    values = (args["start"] + 3 * np.arange(args["n"], dtype=np.uint64)) & 0xFFFF_FFFF
    memory.array(args["out"], "u32", args["n"])[:] = values.astype(np.uint32)


TEST_CPU_KERNELS = {"test-axpy": _cpu_axpy, "test-reverse": _cpu_reverse,
                    "test-iota": _cpu_iota}


def build_test_program(arch: str, source: KernelSource = TEST_SOURCE,
                       ) -> tuple[Plan, CompiledRegions]:
    """The test program's plan, and the compiled regions (with their image) it is built from."""
    target = TARGETS[arch]
    compiled = compiled_regions(arch, source, TEST_REGIONS)
    regions = tuple(compiled.values())
    grid, block, n = Dim3(N // 256), Dim3(256), Scalar.u32(N)
    launches = (
        LaunchSpec("test-axpy", grid, block, (TensorRef("y"), TensorRef("x"), Scalar.f32(0.5), n)),
        LaunchSpec("test-reverse", grid, block, (TensorRef("r"), TensorRef("y"), n)),
        LaunchSpec("test-iota", grid, block, (TensorRef("k"), Scalar.u32(7), n)),
        LaunchSpec("test-axpy", grid, block,
                   (TensorRef("y"), TensorRef("r"), Scalar.f32(-1.25), n)),
    )
    submissions = (Submission(0, 1, 1), Submission(1, 1, 2), Submission(2, 1, 3),
                   Submission(3, 1, 4), Submission(1, 1, 5), Submission(2, 2, 6))
    tensors = (TensorSpec("x", "f32", (N,)), TensorSpec("y", "f32", (N,)),
               TensorSpec("r", "f32", (N,)), TensorSpec("k", "u32", (N,)))
    return place(ProgramSpec(regions, tensors, launches, submissions, forward_launches=2,
                             forward_submissions=2), target), compiled


def image_kernels(compiled: CompiledRegions) -> dict[str, Kernel]:
    """Each region's kernel as the ELF reader finds it in the image."""
    cubin = Cubin(compiled.image)
    return {name: cubin.kernel(region.entry) for name, region in compiled.items()}




@gpu
@pytest.mark.parametrize("arena", ["device", "host"])
@pytest.mark.parametrize("params", ["extra", "pointers"])
def test_the_test_program_matches_the_cpu(arch: str, arena: str, params: str) -> None:
    plan, compiled = build_test_program(arch)
    rng = np.random.default_rng(7)
    cpu = CpuBackend(plan, kernels=TEST_CPU_KERNELS)
    x = rng.standard_normal(N).astype(np.float32).tobytes()
    with CudaBackend(plan, compiled, arena=arena, params=params) as cuda:
        for backend in (cpu, cuda):
            backend.write_tensor("x", x)
            backend.write_tensor("y", x[: 4 * N // 2], offset=4 * N // 2)  # a write at an offset
        assert_same_tensors(plan, cpu, cuda, "writing the inputs")
        count = plan.submission_count
        steps = [range(2), range(count), range(count), range(2, count), range(3, 4),
                 range(count - 1, -1, -1)]
        for step, submissions in enumerate(steps):
            if step == 2:  # patch a scalar of a launch that runs in every cached graph
                for backend in (cpu, cuda):
                    backend.set_scalars(0, {"a": Scalar.f32(-3.0)})
                    backend.set_scalars(2, {"start": Scalar.u32(1 << 31)})
            for backend in (cpu, cuda):
                backend.run(submissions)
            assert cuda.last_semaphore == cpu.last_semaphore
            assert_same_tensors(plan, cpu, cuda, f"run {step} of {submissions}")
        assert len(cuda._graphs) == 5  # one per distinct range, reused for the repeat


@gpu
def test_the_reader_agrees_with_the_driver(arch: str) -> None:
    plan, compiled = build_test_program(arch)
    kernels = image_kernels(compiled)
    with CudaBackend(plan, compiled) as cuda:
        for name, kernel in kernels.items():
            reported = cuda.driver_attributes(name)
            print(name, reported, "read:", kernel.registers, kernel.shared_bytes,
                  kernel.reserved_shared_bytes)
            assert reported["registers"] == kernel.registers, name
            assert reported["shared_bytes"] == kernel.static_shared_bytes, name
        assert kernels["test-reverse"].static_shared_bytes == 256 * 4
        from bob.backends.cuda.driver import bindings, call
        from bob.kernels.cuda.cubin import RESERVED_SHARED_BYTES

        attribute = bindings().CUdevice_attribute
        reserved = attribute.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK
        assert call("cuDeviceGetAttribute", reserved, cuda._device) == RESERVED_SHARED_BYTES
        assert cuda.driver_attributes("test-iota")["max_threads"] == 256


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_bobs_kernels_as_read_agree_with_the_driver(arch: str, bob_regions: CompiledRegions,
                                                    mode: str) -> None:
    plan = build_plan(bob_config(vocab=256, prompts=1, updates=1, mode=mode,
                                 validation_pairs=100 if mode == "corpus" else 0),
                      TARGETS[arch], compiled=bob_regions)
    kernels = image_kernels(bob_regions)
    with CudaBackend(plan, bob_regions) as cuda:
        for placed in plan.placed_regions:
            region = plan.region(placed.name)
            kernel = kernels[region.name]
            reported = cuda.driver_attributes(region.name)
            print(region.name, reported, "read:", region.registers, region.shared_bytes,
                  kernel.reserved_shared_bytes)
            assert reported["registers"] == region.registers, region.name
            assert region.shared_bytes == kernel.shared_bytes, region.name
            assert reported["shared_bytes"] == kernel.static_shared_bytes, region.name


@gpu
def test_close_is_idempotent_and_errors_are_typed(arch: str) -> None:
    from bob.backends.cuda.driver import call

    plan, compiled = build_test_program(arch)
    cuda = CudaBackend(plan, compiled)
    cuda.run(range(plan.submission_count))
    with pytest.raises(CudaError) as caught:
        call("cuMemAlloc", 1 << 60)
    assert caught.value.call == "cuMemAlloc"
    assert caught.value.status == "CUDA_ERROR_OUT_OF_MEMORY"
    assert caught.value.description
    cuda.close()
    cuda.close()
    with pytest.raises(Exception, match="closed"):
        cuda.run(range(1))


@gpu
def test_an_image_that_differs_from_the_plan_is_refused(arch: str) -> None:
    plan, _ = build_test_program(arch)
    other = KernelSource("other.cu", TEST_SOURCE.text.replace("3u * i", "5u * i"))
    _, other_compiled = build_test_program(arch, other)
    with pytest.raises(Exception, match="differ"):
        CudaBackend(plan, other_compiled)


# -- Bob against the CPU ------------------------------------------------------------------------


def _bob_inputs(config: BobConfig, seed: int) -> dict[str, bytes]:
    """The writes before the plan runs from its first submission: the input (corpus: its
    config.pairs sparse pairs, and the table they are scattered into cleared, as the host
    clears it) and the parameters."""
    rng = np.random.default_rng(seed)
    v = config.vocab
    prompts = rng.integers(0, v, config.prompts, dtype=np.uint32)
    writes = {}
    if config.mode == "hard":
        targets = rng.integers(0, v, v, dtype=np.uint32).tobytes()
    else:
        targets = random_record(config, seed).payload()[:config.input_targets_bytes]
        writes[WEIGHTS_TENSOR] = bytes(4 * v * v)
    parameters = (rng.standard_normal(v * v, dtype=np.float32) * np.float32(0.5))
    parameters[: v] = 0.0  # a row of equal logits: the argmax takes the lowest index
    return {**writes, "input": targets + prompts.tobytes(), "parameters": parameters.tobytes()}


def _scatter_tables(config: BobConfig) -> tuple[str, ...]:
    return () if config.mode == "hard" else ("weights",)


def _invocations(config: BobConfig, plan: Plan, split: str) -> Iterator[tuple[str, range]]:
    """The ranges a host asks for, and pieces of them (the backend takes any range)."""
    total, forward = plan.submission_count, plan.forward_submissions
    if split == "forward-then-all":
        yield "forward", range(forward)
        yield "all", range(total)
    elif split == "two-invocations":
        yield "all", range(total)
        yield "next-invocation", range(total)
    else:  # pieces: an invocation cut in the middle of its updates
        middle = forward + max(1, config.updates)
        yield "first-piece", range(middle)
        yield "second-piece", range(middle, total)


def _run_bob(config: BobConfig, regions: CompiledRegions, arch: str, split: str,
             arena: str = "device") -> None:
    plan = build_plan(config, TARGETS[arch], compiled=regions)
    cpu = CpuBackend(plan)
    with CudaBackend(plan, regions, arena=arena) as cuda:
        for name, data in _bob_inputs(config, seed=config.vocab).items():
            cpu.write_tensor(name, data)
            cuda.write_tensor(name, data)
        cpu.clear_tensors(_scatter_tables(config))  # the scatter writes only its cells
        cuda.clear_tensors(_scatter_tables(config))
        for what, submissions in _invocations(config, plan, split):
            if what == "next-invocation":  # the global step continues across invocations
                for k in range(config.updates):
                    scalars = adam_scalars(Hyper(), 1 + config.updates + k)
                    cpu.set_scalars(config.adamw_launch(k), scalars)
                    cuda.set_scalars(config.adamw_launch(k), scalars)
            cpu.run(submissions)
            cuda.run(submissions)
            assert_same_tensors(plan, cpu, cuda, f"{what} ({config}, {split}, {arena} arena)")


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab", [256, 300, 1024])  # 300: a lane's kept elements in part
@pytest.mark.parametrize("split", ["forward-then-all", "two-invocations", "pieces"])
def test_bob_matches_the_cpu(arch: str, bob_regions: CompiledRegions, vocab: int, mode: str,
                             split: str) -> None:
    config = bob_config(vocab=vocab, prompts=3, updates=3, mode=mode)
    _run_bob(config, bob_regions, arch, split)


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_bob_matches_the_cpu_at_vocab_8192(arch: str, bob_regions: CompiledRegions,
                                           mode: str) -> None:
    config = bob_config(vocab=8192, prompts=2, updates=1, mode=mode)
    _run_bob(config, bob_regions, arch, "forward-then-all")


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_host_mapped_and_device_arenas_agree(arch: str, bob_regions: CompiledRegions,
                                             mode: str) -> None:
    config = bob_config(vocab=1024, prompts=2, updates=2, mode=mode)
    plan = build_plan(config, TARGETS[arch], compiled=bob_regions)
    with CudaBackend(plan, bob_regions, arena="device") as device, \
            CudaBackend(plan, bob_regions, arena="host") as host:
        for name, data in _bob_inputs(config, seed=5).items():
            device.write_tensor(name, data)
            host.write_tensor(name, data)
        device.clear_tensors(_scatter_tables(config))
        host.clear_tensors(_scatter_tables(config))
        for submissions in (range(plan.forward_submissions), range(plan.submission_count)):
            device.run(submissions)
            host.run(submissions)
            assert_same_tensors(plan, device, host, f"{submissions} ({config})")
    _run_bob(config, bob_regions, arch, "two-invocations", arena="host")

