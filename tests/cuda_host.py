"""The shipped CUDA kernels compiled for the host and run as a backend's kernels (a test
double of the GPU: tests/cuda_host.h says what it models and what it does not).

    kernels = host_kernels()                     # region -> kernel, as CpuBackend takes them
    choice = host_cuda_choice()                  # the cpu backend's choice on those kernels

The kernel source is bob_kernels.cu with the files it includes, less the kernels that
need what the host cannot model (the cluster kernels: thread-block clusters); its few
lines of inline PTX are replaced by what computes the same on the host (cuda_host.h). Each
region's kernel is called through a wrapper that takes the launch's grid, block and
dynamic shared bytes and its arguments as words, so the
pointers are the arena's own bytes: what a kernel writes lands in the backend's arena.
The library is built once per source by the host's C++ compiler (g++), into a cache
directory; `unavailable()` says why it cannot be where it cannot.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np

from bob.backends import choose_backend
from bob.backends.cpu import CpuBackend
from bob.kernels import signatures as sig
from bob.kernels.memory import Memory
from bob.plan.model import PointerParam

HERE = Path(__file__).resolve().parent
SOURCE_DIRECTORY = Path(sig.__file__).resolve().parent / "cuda"
HEADER = HERE / "cuda_host.h"
# Kernels the host does not model, with why; their regions are left out.
LEFT_OUT = {
    "bob_cluster.cuh": "thread-block clusters and distributed shared memory",
}
LEFT_OUT_REGIONS = frozenset((sig.FUSED_CLUSTER_HARD, sig.FUSED_CLUSTER_CORPUS))
# The namespaces the source declares kernels in (extern "C" keeps their symbols' names).
NAMESPACES = {**dict.fromkeys(sig.COLLAPSED_REGIONS, "collapsed"),
              sig.FUSED_TALL_HARD: "tall_hard", sig.FUSED_TALL_CORPUS: "tall_corpus"}
# The source's inline PTX, and what computes the same on the host.
PTX = {
    'asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(b));': "r0 = bob_host_rcp_approx_ftz(b);",
    'asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));':
        "r = bob_host_rsqrt_approx_ftz(x);",
    'asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(y) : "f"(x), "f"(r));': "y = bob_host_mul_ftz(x, r);",
    'asm("mul.rn.ftz.f32 %0, %1, 0f3F000000;" : "=f"(h) : "f"(r));':
        "h = bob_host_mul_ftz(r, 0.5f);",
    'asm volatile("bar.sync 0, %0;" ::"n"(T) : "memory");': "bob_host_counted_barrier(T);",
    # The held kernels: the launch's dynamic shared memory, and cp.async's copies made at
    # once (one order a GPU may take: they land before the wait that reads them).
    'asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));':
        "bytes = bob_host_dynamic_shared_bytes();",
    'asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(address), "l"(from)\n'
    '                 : "memory");': "std::memcpy(to, from, 16);",
    'asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" : : "r"(address + 4u * c),\n'
    '                         "l"(at + p + c) : "memory");':
        "std::memcpy((char*)to + 4u * c, at + p + c, 4);",
    'asm volatile("cp.async.wait_all;" : : : "memory");': "",
    "extern __shared__ float4 held_row[];":
        "float4* held_row = (float4*)bob_host_dynamic_shared();",
}
# Inline PTX under `#if __CUDA_ARCH__`, which the host's compiler never sees.
UNDER_CUDA_ARCH = ("griddepcontrol.wait", "cp.async.bulk.prefetch.L2")
COMPILER_FLAGS = ("-std=c++17", "-O1", "-ffp-contract=off", "-fno-fast-math", "-fPIC",
                  "-shared", "-w")


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


def unavailable() -> str:
    """Why the host build cannot be made here ("" where it can)."""
    return "" if compiler() else "no C++ compiler (g++, or $CXX) on this machine"


def regions() -> tuple[str, ...]:
    """The dense and collapsed regions the host build runs."""
    return tuple(name for name in sig.SIGNATURES if name not in LEFT_OUT_REGIONS)


def host_source() -> str:
    """The translation unit: the header, the kernel source with its includes inlined (less
    LEFT_OUT) and its PTX replaced, and a wrapper per region."""
    text = (SOURCE_DIRECTORY / "bob_kernels.cu").read_text()

    def include(match: re.Match) -> str:
        name = match.group(1)
        if name in LEFT_OUT:
            return f"// {name} left out: {LEFT_OUT[name]}"
        return (SOURCE_DIRECTORY / name).read_text()

    text = re.sub(r'^#include "([\w.]+)"\s*$', include, text, flags=re.M)
    for ptx, host in PTX.items():
        if ptx not in text:
            raise RuntimeError(f"the kernel source no longer holds {ptx!r}: update PTX")
        text = text.replace(ptx, host)
    left = [line for line in text.splitlines() if re.search(r"\basm\b", line)
            and not any(guarded in line for guarded in UNDER_CUDA_ARCH)]
    if left:
        raise RuntimeError(f"inline PTX the host build does not replace: {left}")
    wrappers = []
    for name in regions():
        entry = sig.declared_region(name).entry
        if name in NAMESPACES:
            entry = f"{NAMESPACES[name]}::{entry}"
        arguments = ", ".join(
            f"cuda_host_pointer{{a[{i}]}}" if isinstance(param, PointerParam)
            else f"cuda_host_word{{a[{i}]}}"
            for i, param in enumerate(sig.SIGNATURES[name]))
        wrappers.append(
            f'extern "C" void host_{entry.split("::")[-1]}'
            f"(unsigned int grid, unsigned int block, unsigned int shared, void** a) "
            f"{{ cuda_host::run(dim3{{grid, 1, 1}}, dim3{{block, 1, 1}}, shared, [&] {{ "
            f"{entry}({arguments}); }}); }}")
    return "\n".join([
        '#include "cuda_host.h"',
        "struct cuda_host_pointer { void* p; template <typename T> operator T*() const "
        "{ return (T*)p; } };",
        "struct cuda_host_word { void* p; template <typename T> operator T() const "
        "{ T v{}; std::memcpy(&v, p, sizeof(T) < 4 ? sizeof(T) : 4); return v; } };",
        text, *wrappers, ""])


def cache_directory() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "bob" / "cuda-host"


@functools.cache
def library() -> ctypes.CDLL:
    """The host build, compiled where its cache lacks this source's."""
    why = unavailable()
    if why:
        raise RuntimeError(why)
    source = host_source()
    header = HEADER.read_text()
    key = hashlib.sha256("\n".join([source, header, *COMPILER_FLAGS]).encode()).hexdigest()[:16]
    directory = cache_directory()
    built = directory / f"bob-cuda-host-{key}.so"
    if not built.exists():
        directory.mkdir(parents=True, exist_ok=True)
        unit = directory / f"bob-cuda-host-{key}.cpp"
        unit.write_text(source)
        shutil.copyfile(HEADER, directory / "cuda_host.h")
        partial = built.with_suffix(f".{os.getpid()}.tmp")
        done = subprocess.run([compiler(), *COMPILER_FLAGS, "-o", str(partial), str(unit)],
                              capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"the host build did not compile:\n{done.stderr[-4000:]}")
        partial.replace(built)
    return ctypes.CDLL(str(built))


def host_kernel(region: str):
    """Region `region`'s CUDA kernel as a CpuBackend kernel: (memory, args) -> None, with
    the grid, block and dynamic shared bytes the launch gave (args "grid.x", "block.x",
    "shared.dynamic")."""
    function = getattr(library(), f"host_{sig.declared_region(region).entry}")
    function.argtypes = (ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                         ctypes.POINTER(ctypes.c_void_p))
    function.restype = None
    params = sig.SIGNATURES[region]

    def run(memory: Memory, args: dict) -> None:
        base = memory.buffer.ctypes.data - memory.base
        words = np.zeros(len(params), np.uint32)
        slots = (ctypes.c_void_p * len(params))()
        for i, param in enumerate(params):
            value = args[param.name]
            if isinstance(param, PointerParam):
                slots[i] = base + int(value)
            else:
                bits = np.float32(value).view(np.uint32) if param.dtype == "f32" else value
                words[i] = np.uint32(int(bits))
                slots[i] = words.ctypes.data + 4 * i
        function(int(args["grid.x"]), int(args["block.x"]), int(args.get("shared.dynamic", 0)),
                 slots)

    return run


def host_kernels() -> dict:
    return {name: host_kernel(name) for name in regions()}


class HostCudaBackend(CpuBackend):
    """The cpu backend's arena and plan, each launch run by the CUDA source's kernel."""

    def __init__(self, plan):
        super().__init__(plan, host_kernels())

    def _decode(self, launch_index: int) -> dict:
        args = super()._decode(launch_index)
        launch = self.plan.launches[launch_index]
        args["block.x"] = launch.block.x
        args["shared.dynamic"] = self.plan.region(launch.region).dynamic_shared_bytes
        return args


def host_cuda_choice():
    """The cpu backend's choice (its target, the SM86 plan) opening HostCudaBackend."""
    return replace(choose_backend("cpu"), opener=HostCudaBackend)
