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
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from bob.config import DEFAULT_TARGET
from bob.errors import RunFailure
from bob.kernels.cuda.compile import KernelSource, compile_source, normalize_arch
from bob.kernels.cuda.cubin import Cubin, Kernel

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


@dataclass(frozen=True)
class CopyKernel:
    """One entry of the image, with what its launch needs."""

    entry: str
    unit: int  # bytes per unit copied
    kernel: Kernel


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
    """The copy kernels for `arch`, compiled through the cubin cache and checked."""
    image = compile_source(SOURCE, normalize_arch(arch)).image
    cubin = Cubin(image)
    found = {}
    for entry, unit in UNITS.items():
        kernel = cubin.kernel(entry)
        check_copy_kernel(kernel)
        found[entry] = CopyKernel(entry, unit, kernel)
    return found


def choose(source: int, destination: int, size: int) -> str:
    """The entry that copies `size` bytes between these addresses."""
    if size % 4 or source % 4 or destination % 4:
        raise ValueError(f"the copy kernels move whole 4-byte words: {size} bytes from "
                         f"{source:#x} to {destination:#x}")
    wide = not (size % 16 or source % 16 or destination % 16)
    return "bob_copy_16" if wide else "bob_copy_4"


__all__ = ["PARAMETER_BYTES", "SOURCE", "THREADS", "CopyKernel", "check_copy_kernel", "choose",
           "copy_kernels"]
