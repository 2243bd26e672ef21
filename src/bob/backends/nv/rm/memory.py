"""Memory the GPU sees at a chosen address and the CPU sees through a mapping.

One ``Allocation`` is three RM objects:

1. physical memory: video memory (``NV01_MEMORY_LOCAL_USER``) or system
   memory (``NV01_MEMORY_SYSTEM``);
2. a reserved GPU VA range in Bob's VA space (``NV50_MEMORY_VIRTUAL`` with
   ``FIXED_ADDRESS_ALLOCATE`` when the address is chosen);
3. the mapping of 1 into 2 (``RM_MAP_MEMORY_DMA``, offset 0 of the range),
   whose returned address is checked against the one asked for;

plus a CPU mapping (``RM_MAP_MEMORY`` on a fresh device file, then mmap).
Video memory is reached through BAR1; system memory is allocated uncached
on both sides, so the CPU sees GPU writes (semaphores) without flushes.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import threading
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from . import structs as s
from .device import RmDevice
from .ioctl import RmError, RmIoctlError, check_status, escape

Location = Literal["vidmem", "sysmem"]

VIDMEM_GRANULE = 64 << 10  # big page: sizes and addresses of video memory round to it
SYSMEM_GRANULE = 4 << 10
GPU_VA_LIMIT = 1 << 49  # Hopper's VA space is 49 bits wide in RM's default layout


def round_up(value: int, granule: int) -> int:
    return (value + granule - 1) // granule * granule


_fence_lock = threading.Lock()
_layouts_reported: set[type] = set()  # which NVOS46 layout the driver took, said once


def store_fence() -> None:
    """Drain the CPU's write-combining buffers before the doorbell.

    BAR1 mappings are write-combined: stores may sit in WC buffers past a
    later uncached store (the doorbell). A locked instruction drains them on
    x86; taking and releasing a lock executes one.
    """
    with _fence_lock:
        pass


@dataclass
class Allocation:
    """A block of GPU-visible memory: handles, GPU address, CPU view."""

    name: str
    location: Location
    size: int
    memory: int  # physical memory handle
    virtual: int = 0  # reserved VA range handle (0 when not GPU-mapped)
    gpu_va: int | None = None
    cpu: mmap.mmap | None = None
    _views: list = field(default_factory=list, repr=False)
    _words: np.ndarray | None = field(default=None, repr=False)  # store_words' view

    def _check(self, offset: int, size: int) -> None:
        if self.cpu is None:
            raise RmError(f"CPU access to {self.name}", "unmapped",
                          "this allocation has no CPU mapping")
        if offset < 0 or size < 0 or offset + size > self.size:
            raise IndexError(f"{size} bytes at +0x{offset:x} are outside {self.name} "
                             f"({self.size} bytes)")

    def write(self, offset: int, data: bytes | memoryview) -> None:
        self._check(offset, len(data))
        self.cpu[offset:offset + len(data)] = data

    def read(self, offset: int, size: int) -> bytes:
        self._check(offset, size)
        return bytes(self.cpu[offset:offset + size])

    def store_words(self, offset: int, indices: np.ndarray, values: np.ndarray) -> None:
        """uint32 `values` at bytes offset + 4 * index, one indexed store through the CPU
        mapping: scattered words are written alone, not the bytes between them (each
        write through BAR1 costs, so an invocation's changed scalars go as words)."""
        self._check(offset, 0)
        if offset % 4:
            raise ValueError(f"+0x{offset:x} in {self.name} is not 4-byte aligned")
        if self._words is None:
            self._words = np.frombuffer(self.cpu, np.uint32)  # type: ignore[arg-type]
        places = np.asarray(indices, np.int64) + offset // 4
        if places.size and (places.min() < 0 or places.max() >= self._words.size):
            raise IndexError(f"a word outside {self.name} ({self.size} bytes)")
        self._words[places] = values

    def u32(self, offset: int) -> ctypes.c_uint32:
        """A 32-bit view for single aligned loads and stores (doorbell-style registers)."""
        return self._view(ctypes.c_uint32, offset)

    def u64(self, offset: int) -> ctypes.c_uint64:
        return self._view(ctypes.c_uint64, offset)

    def _view(self, ctype, offset: int):
        size = ctypes.sizeof(ctype)
        self._check(offset, size)
        if offset % size:
            raise ValueError(f"+0x{offset:x} in {self.name} is not {size}-byte aligned")
        view = ctype.from_buffer(self.cpu, offset)
        self._views.append(view)  # tracked, so close() drops them before the mapping
        return view

    def close(self) -> None:
        self._views.clear()
        self._words = None
        if self.cpu is not None:
            # A view still referenced (a traceback's frame) keeps the mapping until it goes;
            # closing after a fault must not raise.
            with contextlib.suppress(BufferError):
                self.cpu.close()
            self.cpu = None


def _physical_params(size: int, location: Location, contiguous: bool, owner: int,
                     cached: bool = False) -> tuple[int, s.NV_MEMORY_ALLOCATION_PARAMS]:
    flags = (s.NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE | s.NVOS32_ALLOC_FLAGS_MAP_NOT_REQUIRED
             | s.NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED)
    physicality = (s.NVOS32_ATTR_PHYSICALITY_CONTIGUOUS if contiguous
                   else s.NVOS32_ATTR_PHYSICALITY_ALLOW_NONCONTIGUOUS)
    attr = physicality << s.NVOS32_ATTR_PHYSICALITY_SHIFT
    if location == "vidmem":
        cls, kind, granule = s.NV01_MEMORY_LOCAL_USER, s.NVOS32_TYPE_IMAGE, VIDMEM_GRANULE
        flags |= s.NVOS32_ALLOC_FLAGS_PERSISTENT_VIDMEM
        attr |= s.NVOS32_ATTR_LOCATION_VIDMEM << s.NVOS32_ATTR_LOCATION_SHIFT
        attr2 = s.NVOS32_ATTR2_GPU_CACHEABLE_YES << s.NVOS32_ATTR2_GPU_CACHEABLE_SHIFT
    else:
        cls, kind, granule = s.NV01_MEMORY_SYSTEM, s.NVOS32_TYPE_NOTIFIER, SYSMEM_GRANULE
        # Uncached unless asked: the CPU sees the GPU's semaphore writes at once. A staging
        # buffer the CPU copies megabytes out of is cached (the GPU's writes snoop).
        coherency = s.NVOS32_ATTR_COHERENCY_CACHED if cached else s.NVOS32_ATTR_COHERENCY_UNCACHED
        attr |= (s.NVOS32_ATTR_LOCATION_PCI << s.NVOS32_ATTR_LOCATION_SHIFT
                 | coherency << s.NVOS32_ATTR_COHERENCY_SHIFT)
        attr2 = s.NVOS32_ATTR2_GPU_CACHEABLE_NO << s.NVOS32_ATTR2_GPU_CACHEABLE_SHIFT
    attr2 |= s.NVOS32_ATTR2_ZBC_PREFER_NO_ZBC
    if size % granule:
        raise ValueError(f"{location} allocations are whole {granule}-byte pages, not {size}")
    return cls, s.NV_MEMORY_ALLOCATION_PARAMS(
        owner=owner, type=kind, flags=flags, attr=attr, attr2=attr2, format=6,
        size=size, alignment=granule, offset=0, limit=size - 1)


def _map_dma(device: RmDevice, virtual: int, memory: int, size: int, flags: int,
             name: str) -> int:
    """RM_MAP_MEMORY_DMA at offset 0 of the reserved range; returns the GPU address."""
    client = device.client
    call = f"RM_MAP_MEMORY_DMA({name})"
    last: RmError | None = None
    for layout in (s.NVOS46_PARAMETERS, s.NVOS46_PARAMETERS_LEGACY):
        request = layout(hClient=client.root, hDevice=device.device, hDma=virtual,
                         hMemory=memory, offset=0, length=size, flags=flags, dmaOffset=0)
        try:
            escape(client.transport, client.ctl, s.NV_ESC_RM_MAP_MEMORY_DMA, request, call)
        except RmIoctlError as error:  # EINVAL: the other parameter block size
            last = error
            continue
        check_status(call, request.status)
        if layout not in _layouts_reported:
            _layouts_reported.add(layout)
            client.log(f"{call}: the driver took {layout.__name__} "
                       f"({ctypes.sizeof(layout)} bytes)")
        return request.dmaOffset
    assert last is not None
    raise last


def _reserve_and_map(device: RmDevice, block: Allocation, gpu_va: int | None,
                     snoop: bool) -> None:
    """Reserve a VA range (at `gpu_va` if given) and map `block.memory` at its start."""
    client, size, name = device.client, block.size, block.name
    reserve = s.NV_MEMORY_ALLOCATION_PARAMS(
        owner=client.root, type=s.NVOS32_TYPE_IMAGE,
        flags=s.NVOS32_ALLOC_FLAGS_VIRTUAL | s.NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED,
        size=size, hVASpace=device.vaspace)
    if gpu_va is not None:
        if gpu_va % SYSMEM_GRANULE or not 0 < gpu_va < GPU_VA_LIMIT - size:
            raise ValueError(f"GPU address 0x{gpu_va:x} for {name} is not a page "
                             f"address below 2^49")
        reserve.flags |= (s.NVOS32_ALLOC_FLAGS_FIXED_ADDRESS_ALLOCATE
                          | s.NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE)
        reserve.offset = gpu_va
        reserve.alignment = SYSMEM_GRANULE
    block.virtual = client.alloc(device.device, s.NV50_MEMORY_VIRTUAL, reserve)
    flags = s.NVOS46_FLAGS_ACCESS_READ_WRITE
    if snoop:  # GPU writes snoop the CPU caches: semaphores are coherent
        flags |= s.NVOS46_FLAGS_CACHE_SNOOP_ENABLE
    block.gpu_va = _map_dma(device, block.virtual, block.memory, size, flags, name)
    if gpu_va is not None and block.gpu_va != gpu_va:
        raise RmError(f"RM_MAP_MEMORY_DMA({name})", "misplaced",
                      f"asked for GPU address 0x{gpu_va:x}, the driver mapped at "
                      f"0x{block.gpu_va:x}")


_host_handles = itertools.count(0xB0B0_0001)  # below RM's own handles, from 0xcaf00000


def describe_host(device: RmDevice, address: int, size: int, *, gpu_va: int | None = None,
                  name: str = "host buffer", cpu: mmap.mmap | None = None) -> Allocation:
    """Process memory at `address` (whole pages the caller keeps mapped) pinned by RM as
    an OS descriptor and mapped for the GPU; `release` undoes it.

    The CPU keeps reading it at memory speed. RM's own system memory reaches the
    process through the driver's mapping, which reads far slower
    (docs/RAW-HOPPER.md), so large transfers land in memory of Bob's own instead.
    """
    if size <= 0 or size % SYSMEM_GRANULE or address % SYSMEM_GRANULE:
        raise ValueError(f"{name}: host memory is described in whole {SYSMEM_GRANULE}-byte "
                         f"pages, not {size} bytes at 0x{address:x}")
    client = device.client
    flags = (s.NVOS02_FLAGS_PHYSICALITY_NONCONTIGUOUS | s.NVOS02_FLAGS_LOCATION_PCI
             | s.NVOS02_FLAGS_COHERENCY_CACHED | s.NVOS02_FLAGS_MAPPING_NO_MAP)
    call = f"RM_ALLOC_MEMORY(NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, {name}, {size} bytes)"
    request = s.nv_ioctl_nvos02_parameters_with_fd(
        params=s.NVOS02_PARAMETERS(hRoot=client.root, hObjectParent=device.device,
                                   hObjectNew=next(_host_handles),
                                   hClass=s.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR,
                                   flags=flags, pMemory=address, limit=size - 1),
        fd=-1)
    # The GPU file, as the driver's own clients send it.
    escape(client.transport, client.open_gpu_file(), s.NV_ESC_RM_ALLOC_MEMORY, request, call)
    check_status(call, request.params.status)
    block = Allocation(name, "sysmem", size, request.params.hObjectNew, cpu=cpu)
    try:
        _reserve_and_map(device, block, gpu_va, snoop=True)
    except BaseException:
        release(device, block)
        raise
    client.log(f"{call} -> handle 0x{block.memory:08x} at GPU 0x{block.gpu_va:x}")
    return block


def release(device: RmDevice, block: Allocation) -> None:
    """Free a block's GPU mapping and memory objects (the root client's teardown frees
    what is left; this is for blocks that go earlier)."""
    block.close()
    for handle in (block.virtual, block.memory):
        if handle:
            device.client.free(handle, device.device)
    block.virtual = block.memory = 0
    block.gpu_va = None


def host_allocation(device: RmDevice, size: int, *, gpu_va: int | None = None,
                    name: str = "host buffer") -> Allocation:
    """`size` bytes of fresh process memory (cached, shared anonymous pages) described to
    RM and mapped for the GPU; the CPU view is the mapping itself."""
    if size <= 0 or size % SYSMEM_GRANULE:
        raise ValueError(f"host allocations are whole {SYSMEM_GRANULE}-byte pages, not {size}")
    memory = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    anchor = ctypes.c_char.from_buffer(memory)
    address = ctypes.addressof(anchor)
    del anchor  # the address stays valid while `memory` is mapped
    try:
        return describe_host(device, address, size, gpu_va=gpu_va, name=name, cpu=memory)
    except BaseException:
        memory.close()
        raise


def allocate(device: RmDevice, size: int, *, location: Location = "vidmem",
             gpu_va: int | None = None, map_gpu: bool = True, map_cpu: bool = True,
             contiguous: bool = False, cached: bool = False, name: str = "buffer") -> Allocation:
    """Allocate `size` bytes, map them for the GPU (at `gpu_va` if given) and the CPU."""
    client = device.client
    cls, params = _physical_params(size, location, contiguous, client.root, cached)
    memory = client.alloc(device.device, cls, params)
    block = Allocation(name, location, size, memory)
    if map_gpu:
        _reserve_and_map(device, block, gpu_va, snoop=location == "sysmem")
    if map_cpu:
        # System memory maps through the control file, video memory through BAR1 on
        # the GPU file; try the other file if the first one is refused.
        files = ((client.open_control_file, client.open_gpu_file) if location == "sysmem"
                 else (client.open_gpu_file,))
        error: RmError | None = None
        for open_file in files:
            try:
                block.cpu = client.map_cpu(device.device, memory, size, open_file())
                break
            except RmError as refused:
                error = refused
        if block.cpu is None:
            assert error is not None
            raise error
    return block
