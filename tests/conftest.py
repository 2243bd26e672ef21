"""What several test modules share: the GPU fixtures, plan builders and the first-difference check.

Fixtures are found by name; the plain helpers are imported (``from conftest import ...``:
pytest puts this directory on the path of the modules in it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bob.backends import Backend, BackendChoice, choose_backend
from bob.host.check import random_record
from bob.kernels import signatures as sig
from bob.plan.model import Plan, Region, Target
from bob.plan.placement import SM86, TARGETS
from bob.program.bob import BobConfig, build_plan, declared_regions, typical_pairs
from bob.records.binary import InputRecord

_DTYPES = {"f32": np.float32, "u32": np.uint32, "u64": np.uint64, "u8": np.uint8}


# -- the first difference ----------------------------------------------------------------


def first_bit_difference(name: str, got: np.ndarray, want: np.ndarray,
                         labels: tuple[str, str] = ("got", "want")) -> str | None:
    """None when the two arrays hold the same bits, else the first element that differs.

    Bits, not values: NaN equals the same NaN and -0.0 differs from 0.0. The message
    names the element's index, how many differ, and both values with their bits.
    """
    if got.shape != want.shape or got.dtype != want.dtype:
        return (f"{name}: {labels[0]} is {got.dtype}{list(got.shape)}, {labels[1]} "
                f"{want.dtype}{list(want.shape)}")
    unsigned = np.dtype(f"u{got.dtype.itemsize}")
    got_bits = np.ascontiguousarray(got).view(unsigned)
    want_bits = np.ascontiguousarray(want).view(unsigned)
    differ = got_bits != want_bits
    if not differ.any():
        return None
    index = tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(differ)[0]), got.shape))
    width = 2 * got.dtype.itemsize
    return (f"{name}: {int(differ.sum())} of {differ.size} elements differ, the first at "
            f"{list(index)}: {labels[0]} {got[index]!r} (0x{int(got_bits[index]):0{width}x}), "
            f"{labels[1]} {want[index]!r} (0x{int(want_bits[index]):0{width}x})")


def assert_same_bits(name: str, got: np.ndarray, want: np.ndarray,
                     labels: tuple[str, str] = ("got", "want")) -> None:
    difference = first_bit_difference(name, got, want, labels)
    if difference is not None:
        pytest.fail(difference)


def tensor_array(plan: Plan, name: str, data: bytes) -> np.ndarray:
    """A tensor's bytes as the array its dtype and shape say (u8 tensors stay flat)."""
    tensor = plan.tensor(name)
    array = np.frombuffer(data, _DTYPES[tensor.dtype])
    return array if tensor.dtype == "u8" else array.reshape(tensor.shape)


def first_difference(plan: Plan, reference: Backend, candidate: Backend,
                     names: Iterable[str] | None = None) -> str | None:
    """None when every tensor (or each of `names`) is byte-identical on both backends."""
    for name in names or [t.name for t in plan.tensors]:
        difference = first_bit_difference(
            f"tensor {name!r}", tensor_array(plan, name, candidate.read_tensor(name)),
            tensor_array(plan, name, reference.read_tensor(name)),
            (candidate.name, reference.name))
        if difference is not None:
            return difference
    return None


def assert_same_tensors(plan: Plan, reference: Backend, candidate: Backend, when: str) -> None:
    difference = first_difference(plan, reference, candidate)
    if difference is not None:
        pytest.fail(f"after {when}: {difference}")


def listing(directory: Path) -> list[str]:
    """The names in a directory, sorted: to show that a refusal wrote nothing."""
    return sorted(p.name for p in directory.iterdir())


def contents(directory: Path) -> dict[str, bytes]:
    """Every file under a directory with its bytes: to show that a refusal wrote nothing
    and changed nothing."""
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def text(tmp_path: Path) -> Path:
    """A small text to train on (a module may define its own)."""
    path = tmp_path / "a.txt"
    path.write_bytes(b"the cat sat on the mat; the rat ate the hat. " * 20)
    return path


def train_cpu(*argv: str) -> int:
    """`bob train` on the cpu backend, 5 updates an invocation, in this process."""
    from bob.cli.main import main

    return main(["train", "--backend", "cpu", "-N", "5", *argv])


# -- plans -----------------------------------------------------------------------------


def stand_in_regions(config: BobConfig, target: Target = SM86,
                     **resources: int) -> dict[str, Region]:
    """Bob's regions for `target` with stand-in machine code, distinct in content and length
    per region.

    Nothing runs the code: it gives each region its own bytes and address, as
    compiled regions have. `resources` (registers, shared_bytes, ...) go to every region.
    """
    names = [region.name for region in declared_regions(config, target)]
    return {name: sig.declared_region(name, code=bytes([i + 1]) * (96 + 160 * i), **resources)
            for i, name in enumerate(names)}


def bob_config(**fields: object) -> BobConfig:
    """A BobConfig of these fields; a corpus one with no `pairs` given has
    typical_pairs(V), the K the tools plan with when no corpus is given."""
    if fields.get("mode") == "corpus" and "pairs" not in fields:
        fields["pairs"] = typical_pairs(int(fields.get("vocab", BobConfig.vocab)))
    return BobConfig(**fields)  # type: ignore[arg-type]


def bob_plan(prompts: int = 2, updates: int = 3, mode: str = "hard", target: Target = SM86,
             *, vocab: int = 256, schedule: str = "seed", compiled: bool = False,
             pairs: int | None = None, validation_pairs: int = 0,
             **resources: int) -> Plan:
    """Bob's plan for a small configuration (corpus: `pairs` or typical_pairs(V), and
    `validation_pairs`); with stand-in code where `compiled`."""
    extra = {} if pairs is None else {"pairs": pairs}
    if validation_pairs:
        extra["validation_pairs"] = validation_pairs
    config = bob_config(vocab=vocab, prompts=prompts, updates=updates, mode=mode,
                        schedule=schedule, **extra)
    regions = stand_in_regions(config, target, **resources) if compiled else None
    return build_plan(config, target, compiled=regions)


def validation_record(config: BobConfig, seed: int) -> InputRecord:
    """A validation record for a config that validates: `config.validation_pairs` random
    corpus pairs (host.check.random_record's), no prompts (the validation input holds
    pairs only)."""
    return random_record(replace(config, pairs=config.validation_pairs, prompts=0), seed)


# -- on a GPU ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cuda_arch() -> str:
    """The GPU's architecture, where the cuda backend can run; the test skips otherwise."""
    try:
        from bob.backends.cuda import cuda_available, device_arch
    except ImportError as error:
        pytest.skip(f"the cuda backend is not installed: {error}")
    usable, why = cuda_available()
    if not usable:
        pytest.skip(f"no usable CUDA device: {why}")
    name = device_arch()
    if name not in TARGETS:
        pytest.skip(f"the device is {name}; plans are built for {', '.join(TARGETS)}")
    return name


@pytest.fixture(scope="session")
def cuda_choice(cuda_arch: str) -> BackendChoice:
    return choose_backend("cuda")


@pytest.fixture(scope="session")
def bob_regions(cuda_arch: str):
    """Bob's kernels compiled for the GPU present."""
    from bob.kernels.cuda.regions import compiled_regions

    return compiled_regions(cuda_arch)


def nvrtc_problem() -> str | None:
    """Why NVRTC cannot compile here, or None where it can."""
    try:
        from bob.kernels.cuda.compile import NvrtcError, nvrtc_version
    except ImportError as error:
        return f"the NVRTC bindings are not installed ({error})"
    try:
        nvrtc_version()
    except NvrtcError as error:
        return f"NVRTC is not usable here ({error})"
    except ImportError as error:
        return f"the NVRTC bindings are not installed ({error})"
    return None


needs_nvrtc = pytest.mark.skipif(nvrtc_problem() is not None,
                                 reason=str(nvrtc_problem()))


def shipped_ptx(arch: str, source=None) -> str:
    """bob_kernels.cu as shipped (or `source`, a KernelSource: a variant from dev/cuda)
    compiled to PTX by NVRTC with Bob's arithmetic options (tests that read the
    instructions the compiler chose)."""
    from cuda.bindings import nvrtc

    from bob.kernels.cuda.compile import options_for, shipped_source

    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    kernels = source or shipped_source()
    headers = [text.encode() for _, text in kernels.headers]
    names = [name.encode() for name, _ in kernels.headers]
    err, program = nvrtc.nvrtcCreateProgram(kernels.text.encode(), kernels.name.encode(),
                                            len(headers), headers, names)
    assert err == ok, err
    options = [option.encode() for option in options_for(arch)]
    try:
        (err,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        # NVRTC writes into these buffers: bytearrays, never bytes. An empty log has size 1,
        # and b" " * 1 is CPython's shared b" ": NVRTC's NUL would turn every b" " in the
        # process into b"\0" (the padding of checkpoint and counts-file headers among them).
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(program, log)
        assert err == ok, log.decode(errors="replace")
        _, size = nvrtc.nvrtcGetPTXSize(program)
        ptx = bytearray(size)
        nvrtc.nvrtcGetPTX(program, ptx)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return ptx.decode(errors="replace")
