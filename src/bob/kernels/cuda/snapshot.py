"""The copy kernels the nv backend takes a read-back's snapshot with.

A read of the tables at V = 8192 is 805 MB. The copy engine moves it to the host
at PCIe speed, and the next run writes the same tables, so it would wait. The
backend therefore first copies the tensors into spare video memory with these
kernels, at memory bandwidth, lets the next run start, and copies the snapshot to
the host on a copy engine meanwhile. The copy engine itself copies video memory to
video memory far slower than the kernels do.

They are not a plan's regions: they move bytes the plan already wrote, they change
no value, and no plan launches them. Each copies `count` units from `source` to
`destination` with a grid-stride loop; ``bob_copy_16`` moves 16-byte units (both
addresses 16-byte aligned), ``bob_copy_4`` 4-byte ones (every tensor is a whole
number of 4-byte elements).

NVRTC compiles them where it is installed; elsewhere (the nv backend needs no NVIDIA
userspace but the kernel driver) they are Bob's own images (``bob.kernels.own.copy``),
decoded and checked as the plan's own regions are, in the same ``Kernel`` shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from bob.config import DEFAULT_TARGET
from bob.errors import RunFailure
from bob.isa.builder import ARCH_FACTS
from bob.kernels.cuda.compile import (
    KernelSource,
    NvrtcError,
    compile_source,
    normalize_arch,
    nvrtc_version,
)
from bob.kernels.cuda.cubin import Cubin, Kernel, KernelParam
from bob.kernels.own.copy import copy_image
from bob.kernels.own_regions import check_schedule, decoded, parameter_reads
from bob.plan.placement import TARGETS

SOURCE_TEXT = r"""
#define BOB_COPY_THREADS 256
#define BOB_COPY_UNROLL 8

/* Every thread keeps BOB_COPY_UNROLL loads in flight before it stores: one load at
   a time leaves too little memory traffic in flight to reach the bandwidth. */
#define BOB_COPY_BODY(T)                                                              \
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;     \
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; \
    for (; i + (BOB_COPY_UNROLL - 1) * stride < count; i += BOB_COPY_UNROLL * stride) { \
        T held[BOB_COPY_UNROLL];                                                      \
        _Pragma("unroll")                                                             \
        for (int k = 0; k < BOB_COPY_UNROLL; ++k) held[k] = source[i + k * stride];  \
        _Pragma("unroll")                                                             \
        for (int k = 0; k < BOB_COPY_UNROLL; ++k) destination[i + k * stride] = held[k]; \
    }                                                                                 \
    for (; i < count; i += stride) destination[i] = source[i];

extern "C" __global__ void __launch_bounds__(BOB_COPY_THREADS)
bob_copy_16(const uint4 *__restrict__ source, uint4 *__restrict__ destination,
            unsigned long long count)
{
    BOB_COPY_BODY(uint4)
}

extern "C" __global__ void __launch_bounds__(BOB_COPY_THREADS)
bob_copy_4(const unsigned int *__restrict__ source, unsigned int *__restrict__ destination,
           unsigned long long count)
{
    BOB_COPY_BODY(unsigned int)
}
"""
SOURCE = KernelSource("bob_copy.cu", SOURCE_TEXT)
THREADS = 256  # BOB_COPY_THREADS
PARAMETER_BYTES = 24  # source, destination, count: three 8-byte values
UNITS = {"bob_copy_16": 16, "bob_copy_4": 4}  # entry -> the bytes one unit is


NVRTC, OWN = "nvrtc", "own"  # who wrote a copy kernel's code


@dataclass(frozen=True)
class CopyKernel:
    """One entry of the image, with what its launch needs."""

    entry: str
    unit: int  # bytes per unit copied
    kernel: Kernel
    origin: str = NVRTC  # NVRTC's compiled code, or Bob's OWN image


def check_copy_kernel(kernel: Kernel) -> None:
    """The layout the backend writes: three 8-byte parameters, no stack, no shared memory."""
    offsets = [(param.offset, param.size) for param in kernel.params]
    if offsets != [(0, 8), (8, 8), (16, 8)]:
        raise RunFailure(f"copy kernel {kernel.entry!r} takes {offsets} (offset, size), not "
                         "three 8-byte parameters")
    if kernel.frame_bytes or kernel.shared_bytes - kernel.reserved_shared_bytes:
        raise RunFailure(f"copy kernel {kernel.entry!r} needs local or shared memory")


@functools.cache
def copy_kernels(arch: str = DEFAULT_TARGET) -> dict[str, CopyKernel]:
    """The copy kernels for `arch`: NVRTC's where NVRTC is installed and loads, else
    Bob's own images."""
    if nvrtc_problem() is not None:
        return own_copy_kernels(arch)
    return compiled_copy_kernels(arch)


def nvrtc_problem() -> str | None:
    """Why NVRTC cannot compile the copy kernels here (not installed, or its library does
    not load), or None where it can."""
    try:
        nvrtc_version()
    except NvrtcError as error:
        return str(error)
    return None


def compiled_copy_kernels(arch: str = DEFAULT_TARGET) -> dict[str, CopyKernel]:
    """The copy kernels for `arch` compiled by NVRTC through the cubin cache, checked."""
    image = compile_source(SOURCE, normalize_arch(arch)).image
    cubin = Cubin(image)
    found = {}
    for entry, unit in UNITS.items():
        kernel = cubin.kernel(entry)
        check_copy_kernel(kernel)
        found[entry] = CopyKernel(entry, unit, kernel, NVRTC)
    return found


def own_copy_kernels(arch: str = DEFAULT_TARGET) -> dict[str, CopyKernel]:
    """The copy kernels for `arch` from Bob's own images (no compiler), checked."""
    arch = normalize_arch(arch)
    found = {}
    for entry, unit in UNITS.items():
        kernel = own_kernel(entry, arch)
        check_copy_kernel(kernel)
        found[entry] = CopyKernel(entry, unit, kernel, OWN)
    return found


def own_kernel(entry: str, arch: str) -> Kernel:
    """Bob's own image of `entry` as the cubin reader describes a compiled kernel: its
    parameters are the constant-bank reads its decoded code makes past the parameter
    base (so ``check_copy_kernel`` checks what the code reads), its schedule checked."""
    image = copy_image(entry, arch)
    instructions = decoded(image)
    check_schedule(entry, image)
    base = TARGETS[arch].parameter_base
    reads = sorted(parameter_reads(instructions, TARGETS[arch]).items())
    params = tuple(KernelParam(ordinal, offset - base, size)
                   for ordinal, (offset, size) in enumerate(reads))
    reserved = ARCH_FACTS[arch].reserved_shared if image.shared_bytes else 0
    return Kernel(entry, image.code, image.registers, image.shared_bytes, base,
                  PARAMETER_BYTES, params, max_threads=(THREADS, 1, 1),
                  reserved_shared_bytes=reserved)


def choose(source: int, destination: int, size: int) -> str:
    """The entry that copies `size` bytes between these addresses."""
    if size % 4 or source % 4 or destination % 4:
        raise ValueError(f"the copy kernels move whole 4-byte words: {size} bytes from "
                         f"{source:#x} to {destination:#x}")
    wide = not (size % 16 or source % 16 or destination % 16)
    return "bob_copy_16" if wide else "bob_copy_4"


__all__ = ["NVRTC", "OWN", "PARAMETER_BYTES", "SOURCE", "THREADS", "CopyKernel",
           "check_copy_kernel", "choose", "compiled_copy_kernels", "copy_kernels",
           "nvrtc_problem", "own_copy_kernels"]
