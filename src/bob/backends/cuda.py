"""The CUDA backend: a certified plan through the driver API, as one CUDA graph.

    regions = compiled_regions(device_arch())     # bob.kernels.cuda.regions
    backend = CudaBackend(build_plan(config, target, compiled=regions), regions)
    backend.write_tensor("input", record)
    backend.run(range(plan.submission_count))
    losses = backend.read_tensor("training_loss")

How the plan maps onto CUDA:

- Kernels: the compiled image the plan's regions were read from
  (``CompiledRegions``, checked against the declared regions when it was
  composed), loaded with ``cuModuleLoadData``. The backend compiles and
  checks nothing again: before anything is allocated it only refuses a plan
  whose retained regions are not the ones read from that image.
- Arena: ONE allocation of ``plan.arena_bytes``, zeroed: device memory
  (``cuMemAlloc``) by default, or, as the seed does, one host-mapped
  system-memory buffer (``cuMemHostAlloc`` with ``DEVICEMAP``). A plan address
  ``a`` becomes ``arena_device_base + (a - plan arena base)``.
- Parameters: the bytes of a launch's parameter block from the target's
  parameter base to the end of its arguments are exactly CUDA's kernel
  parameter buffer (pointers, then scalars). The backend relocates the pointer
  words and hands that buffer to the kernel node through ``extra``
  (``CU_LAUNCH_PARAM_BUFFER_POINTER`` / ``_SIZE``); ``params="pointers"`` passes
  ``kernelParams`` (one pointer per argument into the same buffer) instead.
  The driver copies either when a node is added or updated; the backend keeps
  every host buffer alive as long as it lives anyway.
- Submission: the launches of a range of submissions, in submission order
  (a launch submitted twice is two nodes), become one graph of kernel nodes,
  each depending on the one before; it is instantiated once per distinct range
  (the host asks for all submissions, or the first ``forward_submissions``) and
  launched with one ``cuGraphLaunch``, then the stream is synchronized.
  ``set_scalars`` updates the affected nodes of every executable graph in place
  (``cuGraphExecKernelNodeSetParams``); nothing is rebuilt. ``start`` launches
  the graph and returns; ``wait`` synchronizes the stream.
- Staging (device arena): writes go through two pinned chunks allocated once
  (``cuMemHostAlloc``), each copied with ``cuMemcpyHtoDAsync`` on the stream
  while the next chunk is filled. ``begin_read`` snapshots the tensors into a
  second device buffer on the stream (ordered after the work started before
  it, before any started after; neighbouring tensors as one copy,
  ``landing.read_spans``), then a second, non-blocking stream copies the
  snapshot into pinned host buffers allocated once (``cuMemcpyDtoHAsync``)
  while the next graph runs; the handle's ``wait`` copies them out.

Every driver result passes ``check``: a ``CudaError`` names the call, the
status name and the driver's description of it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bob.backends.base import Backend, Patch, ReadHandle
from bob.backends.landing import LANDING_MIN_BYTES, Landing, read_spans
from bob.config import ARENA_KINDS
from bob.errors import BackendUnavailable, RunFailure
from bob.kernels.cuda.compile import NvrtcError, nvrtc_version
from bob.kernels.cuda.regions import CompiledRegions
from bob.plan.certificate import CertifiedPlan
from bob.plan.model import Plan, Region, Scalar
from bob.plan.placement import ArgumentLayout, argument_layout, argument_slots

ArenaKind = Literal["device", "host"]
ParameterMode = Literal["extra", "pointers"]
PARAMETER_MODES = ("extra", "pointers")
NVIDIA_VERSION_FILE = Path("/proc/driver/nvidia/version")


class CudaError(RunFailure):
    """A driver call failed: the call, the status name and its description."""

    def __init__(self, call: str, status: str, description: str):
        self.call = call
        self.status = status
        self.description = description
        super().__init__(f"{call} failed: {status} ({description})")


class CudaUnavailable(BackendUnavailable):
    """The CUDA backend cannot run here; the message says why."""


@functools.cache  # imported once: every driver call looks the module up
def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as error:
        raise CudaUnavailable(
            f"cuda-bindings is not installed ({error}): pip install 'bob[cuda]'"
        ) from error
    return driver


def _status_text(driver, status) -> tuple[str, str]:
    """The driver's name and description of a status (numbers where it has none)."""
    try:
        named, name = driver.cuGetErrorName(status)
        described, description = driver.cuGetErrorString(status)
    except Exception:  # the status is reported by number if the driver cannot name it
        return f"CUresult {int(status)}", "no description"
    success = driver.CUresult.CUDA_SUCCESS
    name = name.decode() if named == success and name else f"CUresult {int(status)}"
    text = description.decode() if described == success and description else "no description"
    return name, text


def check(call: str, result: tuple) -> Any:
    """Every driver result passes here: the values on success, CudaError otherwise."""
    driver = _driver()
    status, *values = result
    if status != driver.CUresult.CUDA_SUCCESS:
        raise CudaError(call, *_status_text(driver, status))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _call(name: str, *args: Any) -> Any:
    """Call driver function `name` and check its result (looked up at call time)."""
    driver = _driver()
    return check(name, getattr(driver, name)(*args))


# -- availability and device facts ---------------------------------------------


def _initialize() -> None:
    """cuInit, turning a missing driver library into CudaUnavailable."""
    driver = _driver()
    try:
        result = driver.cuInit(0)
    except Exception as error:  # cuda-bindings raises when libcuda.so cannot be loaded
        raise CudaUnavailable(f"no NVIDIA driver library (libcuda.so): {error}") from error
    status = result[0]
    if status != driver.CUresult.CUDA_SUCCESS:
        name, description = _status_text(driver, status)
        raise CudaUnavailable(f"cuInit failed: {name} ({description})")


def cuda_available() -> tuple[bool, str]:
    """(True, device summary) where the CUDA backend can run, else (False, why not)."""
    try:
        _initialize()
        count = _call("cuDeviceGetCount")
        if count < 1:
            return False, "the NVIDIA driver reports no CUDA device"
        nvrtc_version()
        info = describe_device()
    except (CudaUnavailable, CudaError, NvrtcError) as error:
        return False, str(error)
    return True, f"{info.name} ({info.arch}), driver {info.driver_version}"


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: tuple[int, int]
    driver_version: str  # the CUDA version the driver supports, "13.0"

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


def kernel_module(path: Path = NVIDIA_VERSION_FILE) -> tuple[str | None, str | None]:
    """('open' | 'proprietary', the NVRM line) from /proc/driver/nvidia/version."""
    try:
        text = path.read_text()
    except OSError:
        return None, None
    if not text.strip():
        return None, None
    kind = "open" if "Open Kernel Module" in text else "proprietary"
    return kind, text.strip().splitlines()[0].strip()


def _compute_capability(device: Any) -> tuple[int, int]:
    driver = _driver()
    attribute = driver.CUdevice_attribute
    major = _call("cuDeviceGetAttribute",
                  attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
    minor = _call("cuDeviceGetAttribute",
                  attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
    return int(major), int(minor)


def device_arch(ordinal: int = 0) -> str:
    """The architecture of device `ordinal`, as NVRTC names it: 'sm_90'."""
    _initialize()
    major, minor = _compute_capability(_call("cuDeviceGet", ordinal))
    return f"sm_{major}{minor}"


def describe_device(ordinal: int = 0) -> DeviceInfo:
    _initialize()
    device = _call("cuDeviceGet", ordinal)
    name = _call("cuDeviceGetName", 256, device)
    version = int(_call("cuDriverGetVersion"))
    return DeviceInfo(
        name=name.split(b"\0", 1)[0].decode(errors="replace"),
        compute_capability=_compute_capability(device),
        driver_version=f"{version // 1000}.{version % 1000 // 10}",
    )


# -- the plan's parameter blocks as CUDA parameter buffers -----------------------


def kernel_parameters(plan: Plan, region: Region, block: bytes, arena_base: int) -> bytes:
    """The kernel's parameter buffer for one launch, pointers relocated to the arena.

    `block` is the launch's parameter block in the plan; the buffer is its
    bytes from the target's parameter base to the end of the last argument,
    with every pointer word moved from the plan's arena to `arena_base`.
    """
    layout = argument_layout(plan.target, region.params)
    return _relocated(plan, region, layout, list(layout.packer.unpack_from(block, layout.base)),
                      arena_base)


def kernel_parameter_buffers(plan: Plan, arena_base: int,
                             patched: Mapping[int, bytes]) -> list[bytes]:
    """Every launch's kernel parameter buffer (as `kernel_parameters` makes it), packed
    from the launch's arguments with one struct per region, or, for a launch in
    `patched`, from its block as the host patched it.

    A training plan has thousands of launches: laid out launch by launch, the buffers
    were most of the first invocation's start-up."""
    layouts: dict[str, tuple[Region, ArgumentLayout]] = {}
    buffers = []
    for index, launch in enumerate(plan.launches):
        if launch.region not in layouts:
            region = plan.region(launch.region)
            layouts[launch.region] = (region, argument_layout(plan.target, region.params))
        region, layout = layouts[launch.region]
        if len(launch.args) != len(layout.order):
            raise ValueError(f"launch {index} has {len(launch.args)} arguments for "
                             f"{len(layout.order)} parameters of {launch.region!r}")
        block = patched.get(index)
        values = layout.values(launch) if block is None else \
            list(layout.packer.unpack_from(block, layout.base))
        buffers.append(_relocated(plan, region, layout, values, arena_base))
    return buffers


def _relocated(plan: Plan, region: Region, layout: ArgumentLayout, values: list[int],
               arena_base: int) -> bytes:
    """The arguments packed, each pointer moved from the plan's arena to `arena_base`."""
    window = plan.address_map.arena
    for slot in range(layout.pointers):
        address = values[slot]
        if not window.base <= address < window.end:
            raise ValueError(
                f"region {region.name!r} argument {region.params[layout.order[slot]].name!r}: "
                f"0x{address:x} is outside the arena [0x{window.base:x}, 0x{window.end:x})")
        values[slot] = arena_base + address - window.base
    return layout.packer.pack(*values)


# -- the backend -------------------------------------------------------------------


def _require_regions_of(plan: Plan, compiled: CompiledRegions) -> None:
    """Refuse a plan whose retained regions were not read from this image: the code the
    plan places is the code that runs."""
    for placed in plan.placed_regions:
        if plan.region(placed.name) != compiled.get(placed.name):
            raise RunFailure(f"region {placed.name!r} of the plan differs from the compiled "
                             "image's; build the plan from the regions the backend is given")


class _NativeKernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2 (cuda.h, CUDA 12+) as the C ABI lays it out."""

    _fields_ = (
        ("func", ctypes.c_void_p),
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("kernelParams", ctypes.c_void_p),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    )


_NATIVE_SET_PARAMS: list[Any] = []  # [function or None], looked up once


def _native_node_update() -> Any:
    """libcuda's cuGraphExecKernelNodeSetParams_v2 through ctypes, or None.

    Patching an update's AdamW scalars is one node update per launch per
    invocation; through cuda-bindings each costs tens of microseconds of
    argument conversion, through ctypes about one. Where the symbol cannot be
    found the bindings are used.
    """
    if not _NATIVE_SET_PARAMS:
        function = None
        with contextlib.suppress(OSError, AttributeError):
            function = ctypes.CDLL("libcuda.so.1").cuGraphExecKernelNodeSetParams_v2
            # Plain addresses: the hot loop passes ints, converted at C speed.
            function.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
            function.restype = ctypes.c_int
        _NATIVE_SET_PARAMS.append(function)
    return _NATIVE_SET_PARAMS[0]


_NATIVE_ADD_NODE: list[Any] = []  # [cuGraphAddKernelNode_v2 or None], looked up once


def _native_add_node() -> Any:
    """libcuda's cuGraphAddKernelNode_v2 through ctypes, or None: a training graph has
    1 + 2N nodes, and each added through cuda-bindings costs tens of microseconds of
    argument conversion (the first invocation's start-up)."""
    if not _NATIVE_ADD_NODE:
        function = None
        with contextlib.suppress(OSError, AttributeError):
            function = ctypes.CDLL("libcuda.so.1").cuGraphAddKernelNode_v2
            function.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
            function.restype = ctypes.c_int
        _NATIVE_ADD_NODE.append(function)
    return _NATIVE_ADD_NODE[0]


_NATIVE_LAUNCH: list[Any] = []  # [cuLaunchKernel or None], looked up once

# A kernel fault leaves these sticky errors in its context: every later call in it fails
# the same way, so the primary context is reset before the device is used again.
STICKY_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_ASSERT",
})
_POISONED: set[int] = set()  # device ordinals whose primary context a fault poisoned


def _native_launch() -> Any:
    """libcuda's cuLaunchKernel through ctypes (profiling launches one kernel at a time)."""
    if not _NATIVE_LAUNCH:
        function = None
        with contextlib.suppress(OSError, AttributeError):
            function = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
            function.argtypes = (ctypes.c_void_p, *(ctypes.c_uint,) * 7, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_void_p)
            function.restype = ctypes.c_int
        _NATIVE_LAUNCH.append(function)
    return _NATIVE_LAUNCH[0]


class LaunchTables:
    """What the driver reads for every launch, as three numpy tables beside the parameter
    store (host memory graph nodes and launches point into; it lives as long as they do):

    - ``pointers``: per launch, one address per argument into its parameter buffer (the
      kernelParams array);
    - ``extra``: per launch, [BUFFER_POINTER, &buffer, BUFFER_SIZE, &size, END], with the
      sizes in ``sizes``;
    - ``native``: per launch, CUDA_KERNEL_NODE_PARAMS_v2 (`_NativeKernelNodeParams`).

    A training plan has thousands of launches; made as tables, not a ctypes object or
    three per launch, they cost the first invocation a few milliseconds, not a hundred.
    """

    def __init__(self, plan: Plan, store: ParameterStore, functions: Mapping[str, int],
                 parameter_mode: ParameterMode, constants: tuple[int, int, int]):
        launches = plan.launches
        count = len(launches)
        base = plan.target.parameter_base
        regions = {launch.region for launch in launches}
        offsets = {name: np.array([slot.offset - base for slot in
                                   argument_slots(plan.target, plan.region(name).params)],
                                  np.uint64) for name in regions}
        region_of = np.array([launch.region for launch in launches], dtype=object)
        arguments = np.array([max(1, len(offsets[launch.region])) for launch in launches],
                             np.int64)
        self.pointer_starts = np.zeros(count, np.int64)
        np.cumsum(arguments[:-1], out=self.pointer_starts[1:])
        self.pointers = np.zeros(max(1, int(arguments.sum())), np.uint64)
        buffers = store.addresses()
        self.sizes = store.sizes().astype(np.uint64)
        native = np.zeros(count, np.dtype(_NativeKernelNodeParams))
        for name in regions:
            chosen = np.flatnonzero(region_of == name)
            relative = offsets[name]
            if len(relative):
                places = self.pointer_starts[chosen][:, None] + np.arange(len(relative))
                self.pointers[places] = buffers[chosen][:, None] + relative[None, :]
            native["func"][chosen] = functions[name]
            native["sharedMemBytes"][chosen] = plan.region(name).dynamic_shared_bytes
        for axis, values in (("gridDim", [launch.grid for launch in launches]),
                             ("blockDim", [launch.block for launch in launches])):
            for coordinate in "XYZ":
                native[axis + coordinate] = [getattr(value, coordinate.lower())
                                             for value in values]
        buffer_pointer, buffer_size, end = constants
        self.extra = np.zeros((count, 5), np.uint64)
        self.extra[:, 0], self.extra[:, 2], self.extra[:, 4] = buffer_pointer, buffer_size, end
        self.extra[:, 1] = buffers
        self.extra[:, 3] = self.sizes.ctypes.data + 8 * np.arange(count, dtype=np.uint64)
        if parameter_mode == "extra":
            native["extra"] = self.extra.ctypes.data + 40 * np.arange(count, dtype=np.uint64)
        else:
            native["kernelParams"] = self.pointers.ctypes.data + 8 * self.pointer_starts
        self.native = native
        self.node_params: dict[int, Any] = {}  # cuda-bindings' structures, where made

    def native_address(self, index: int) -> int:
        """Launch `index`'s CUDA_KERNEL_NODE_PARAMS_v2, for libcuda's own entry points."""
        return self.native.ctypes.data + index * self.native.itemsize

    def native_addresses(self, launches: np.ndarray) -> list[int]:
        """`native_address` of each launch."""
        return (self.native.ctypes.data + launches * self.native.itemsize).tolist()

    def pointers_address(self, index: int) -> int:
        """Launch `index`'s kernelParams array."""
        return self.pointers.ctypes.data + 8 * int(self.pointer_starts[index])


class ParameterStore:
    """Every launch's kernel parameter buffer, side by side in one host array.

    Graph nodes and launches point into it; an invocation's AdamW scalars for all
    its launches are then one indexed numpy store instead of a loop over buffers.
    """

    ALIGN = 16  # each buffer starts here: a scalar's 4-byte boundary stays one in the store

    def __init__(self, blocks: Sequence[bytes]):
        sizes = np.array([len(data) for data in blocks], np.int64)
        starts = np.zeros(len(blocks) + 1, np.int64)
        np.cumsum(-(-np.maximum(sizes, 1) // self.ALIGN) * self.ALIGN, out=starts[1:])
        self._bytes = np.zeros(max(self.ALIGN, int(starts[-1])), np.uint8)
        self._words = self._bytes.view(np.uint32)
        self._starts, self._sizes = starts[:-1], sizes
        for start, data in zip(starts.tolist(), blocks, strict=False):
            self._bytes[start:start + len(data)] = np.frombuffer(data, np.uint8)

    def size(self, index: int) -> int:
        return int(self._sizes[index])

    def sizes(self) -> np.ndarray:
        return self._sizes.copy()

    def addresses(self) -> np.ndarray:
        """Each launch's buffer's host address (uint64)."""
        return (self._bytes.ctypes.data + self._starts).astype(np.uint64)

    def buffer(self, index: int) -> ctypes.Array:
        """Launch `index`'s parameter buffer: a ctypes view into the store (never a copy)."""
        return (ctypes.c_char * max(1, self.size(index))).from_buffer(
            self._bytes, int(self._starts[index]))

    def write_words(self, launches: Sequence[int], relative: np.ndarray,
                    words: np.ndarray) -> np.ndarray:
        """words[i][j] (uint32) at byte relative[i][j] of launch launches[i]'s buffer;
        whether each launch's words changed."""
        chosen = np.asarray(launches, np.int64)
        outside = (relative < 0) | (relative % 4 != 0) | \
            (relative > (self._sizes[chosen] - 4)[:, None])
        if outside.any():
            row = int(np.argwhere(outside)[0][0])
            raise RunFailure(f"launch {launches[row]}: a scalar's block offset is outside its "
                             "parameter buffer")
        places = (self._starts[chosen][:, None] + relative) // 4
        changed = (self._words[places] != words).any(axis=1)
        self._words[places] = words
        return changed


@dataclass
class _Graph:
    submissions: range
    graph: Any  # CUgraph
    exec: Any  # CUgraphExec
    nodes: dict[int, list[Any]] = field(default_factory=dict)  # launch -> its nodes
    # launch -> its nodes' handles as ints, for the ctypes node update
    native_nodes: dict[int, list[int]] = field(default_factory=dict)
    # Every node's handle and launch, in two arrays (made the first time asked)
    _flat: tuple[np.ndarray, np.ndarray] | None = None

    def nodes_of(self, chosen: np.ndarray) -> tuple[list[int], np.ndarray]:
        """The handles of the nodes of the launches `chosen` marks (a boolean per launch),
        and each one's launch."""
        if self._flat is None:
            pairs = [(node, index) for index, nodes in self.native_nodes.items()
                     for node in nodes]
            self._flat = (np.array([node for node, _ in pairs], np.uint64),
                          np.array([index for _, index in pairs], np.int64))
        handles, launches = self._flat
        picked = chosen[launches]
        return handles[picked].tolist(), launches[picked]


UPLOAD_CHUNK_BYTES = 16 << 20  # each of the two pinned chunks a large write goes through
# Writes up to SMALL_WRITE_BYTES (an invocation's input, cleared loss and health counts,
# AdamW scalars) each take the next of a ring of pinned slots. A slot's last copy was
# queued writes ago, before the graph still running, so the host does not wait for that
# graph; through the two large chunks, an invocation's third write waited for the
# previous invocation's graph, and the host could not prepare the next one beside it.
SMALL_WRITE_BYTES = 1 << 20
SMALL_WRITE_SLOTS = 8
COPY_OUT_CHUNK_BYTES = 32 << 20  # a larger tensor leaves the pinned staging in parallel pieces
COPY_OUT_THREADS = 8


def copy_out(address: int, size: int, pool: ThreadPoolExecutor | None = None,
             chunk: int = COPY_OUT_CHUNK_BYTES) -> np.ndarray:
    """`size` bytes of host memory at `address` in a new array of their own.

    With a pool, a large copy goes in `chunk`-byte pieces on its threads: NumPy's copy
    releases the GIL, and the new array's first-touch page faults spread over cores
    (one thread copies about 5-10 GB/s; the three tables are 768 MiB at V = 8192).
    """
    out = np.empty(size, dtype=np.uint8)
    if not size:
        return out
    source = np.frombuffer((ctypes.c_char * size).from_address(address), np.uint8)
    if pool is None or size <= chunk:
        np.copyto(out, source)
        return out
    pieces = [pool.submit(np.copyto, out[start:start + chunk], source[start:start + chunk])
              for start in range(0, size, chunk)]
    for piece in pieces:
        piece.result()
    return out


@dataclass
class _UploadChunk:
    host: int  # pinned host memory: UPLOAD_CHUNK_BYTES, or SMALL_WRITE_BYTES for a slot
    copied: Any  # CUevent recorded after this chunk's last copy was queued


@dataclass
class _ReadStaging:
    """Where `begin_read` puts tensors: a device snapshot and pinned host memory, both
    `size` bytes, reused by every read; the copy stream; the event the snapshot ends with.

    Where the device has no room for the snapshot beside the arena (V = 65536 on a GPU
    of 80 GB), reads copy from the arena itself and later work waits for them (`copied`).
    """

    size: int
    snapshot: int  # device memory; 0 where there was none to be had
    host: int  # pinned host memory, 0 until a read finds no landing buffer free
    stream: Any  # CUstream, non-blocking: it runs beside the graph's stream
    snapped: Any  # CUevent
    copied: Any = None  # CUevent, without a snapshot: the copy the graph's stream waits for


class _CudaRead(ReadHandle):
    """Tensors on their way from the snapshot to pinned memory; `wait` gives them, in
    the landing buffer they were copied to, or copied out of the shared staging."""

    def __init__(self, backend: CudaBackend, layout: list[tuple[str, int, int]],
                 landing: np.ndarray | None):
        super().__init__({})
        self._backend = backend
        self._layout = layout  # (name, offset in the staging, bytes)
        self._landing = landing
        self._done = False

    def wait(self) -> dict[str, np.ndarray]:
        if not self._done:
            self._tables = self._backend._finish_read(self._layout, self._landing)
            self._landing = None
            self._done = True
        return self._tables


class CudaBackend(Backend):
    name = "cuda"
    # Consecutive graph nodes joined by programmatic edges (programmatic dependent launch)
    # where the GPU has them; False gives plain edges (the bench compares the two).
    programmatic_edges = True

    def __init__(self, plan: Plan | CertifiedPlan, compiled: CompiledRegions,
                 arena: ArenaKind = "device", *, device: int = 0,
                 params: ParameterMode = "extra"):
        super().__init__(plan)  # refuses an uncertified plan before anything is allocated
        _require_regions_of(self.plan, compiled)
        if arena not in ARENA_KINDS:
            raise ValueError(f"arena must be one of {ARENA_KINDS}, not {arena!r}")
        if params not in PARAMETER_MODES:
            raise ValueError(f"params must be one of {PARAMETER_MODES}, not {params!r}")
        self.arena_kind = arena
        self.parameter_mode = params
        self._context = None
        self._own_context = False  # a context of its own after a fault (_fresh_context)
        self._device = None
        self._stream = None
        self._module = None
        self._arena = 0  # device address of the arena (of the mapping, for host)
        self._host_arena = 0  # host address of a host arena
        self._graphs: dict[range, _Graph] = {}
        self._store: ParameterStore | None = None  # every launch's kernel parameters
        self._launch_tables: LaunchTables | None = None  # what the driver reads of them
        self._functions: dict[str, Any] = {}
        # The two large pinned chunks, then the small-write slots, once written through.
        # Pinned host memory writes go through, each kind made at its first use: a V = 256
        # run never writes more than a slot, and pinning costs milliseconds at start-up.
        self._uploads: list[_UploadChunk] = []  # the two large chunks
        self._slots: list[_UploadChunk] = []  # the small-write slots
        self._next_upload = 0
        self._next_slot = 0
        self._staging: _ReadStaging | None = None
        self._reading: _CudaRead | None = None  # the read whose copies may be in flight
        self._landing: Landing | None = None  # page-locked buffers reads are handed out in
        self._copiers: ThreadPoolExecutor | None = None  # copy_out's threads, once needed
        self._closed = False
        # Set to a list by `bob profile`: runs then launch on the stream one kernel at a
        # time between two events (not the graph) and append (launch, device ns).
        self.launch_times: list[tuple[int, int]] | None = None
        self._ordinal = device

        self.image = compiled.image  # referenced while the driver reads it
        self.entries = {placed.name: self.plan.region(placed.name).entry
                        for placed in self.plan.placed_regions}
        _initialize()
        self._device = _call("cuDeviceGet", device)
        self.capability = _compute_capability(self._device)
        self.arch = "sm_{}{}".format(*self.capability)
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    # -- setup ---------------------------------------------------------------
    def _open(self) -> None:
        driver = _driver()
        self._context = self._fresh_context() if self._ordinal in _POISONED else \
            _call("cuDevicePrimaryCtxRetain", self._device)
        _call("cuCtxSetCurrent", self._context)
        self._stream = _call("cuStreamCreate", 0)
        image = np.frombuffer(self.image, dtype=np.uint8)
        self._module = _call("cuModuleLoadData", image.ctypes.data)
        for name, entry in self.entries.items():
            self._functions[name] = _call("cuModuleGetFunction", self._module, entry.encode())
            dynamic = self.plan.region(name).dynamic_shared_bytes
            if dynamic:  # past 48 KiB a kernel's dynamic shared memory must be allowed first
                _call("cuFuncSetAttribute", self._functions[name], driver.CUfunction_attribute
                      .CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic)
        size = max(1, self.plan.arena_bytes)
        if self.arena_kind == "device":
            self._arena = int(_call("cuMemAlloc", size))
            _call("cuMemsetD8", self._arena, 0, size)
            _call("cuCtxSynchronize")
        else:
            self._host_arena = int(_call("cuMemHostAlloc", size,
                                         driver.CU_MEMHOSTALLOC_DEVICEMAP))
            ctypes.memset(self._host_arena, 0, size)
            self._arena = int(_call("cuMemHostGetDevicePointer", self._host_arena, 0))
        self._make_arguments()

    def _make_arguments(self) -> None:
        self._apply_pending_rows()  # a block patched before a fresh context's arguments
        patched = {index: bytes(block) for index, block in self._blocks.items()}
        self._store = ParameterStore(kernel_parameter_buffers(self.plan, self._arena, patched))
        driver = _driver()
        constants = (int(driver.CU_LAUNCH_PARAM_BUFFER_POINTER),
                     int(driver.CU_LAUNCH_PARAM_BUFFER_SIZE), int(driver.CU_LAUNCH_PARAM_END))
        self._launch_tables = LaunchTables(self.plan, self._store,
                                    {name: int(function)
                                     for name, function in self._functions.items()},
                                    self.parameter_mode, constants)

    def _node_params(self, index: int) -> Any:
        """Launch `index`'s CUDA_KERNEL_NODE_PARAMS through cuda-bindings, made when first
        asked for: only where libcuda's own entry points cannot be found by ctypes."""
        tables = self._launch_tables
        node = tables.node_params.get(index)
        if node is None:
            native = tables.native[index]
            node = _driver().CUDA_KERNEL_NODE_PARAMS()
            node.func = self._functions[self.plan.launches[index].region]
            node.gridDimX, node.gridDimY, node.gridDimZ = (
                int(native["gridDimX"]), int(native["gridDimY"]), int(native["gridDimZ"]))
            node.blockDimX, node.blockDimY, node.blockDimZ = (
                int(native["blockDimX"]), int(native["blockDimY"]), int(native["blockDimZ"]))
            node.sharedMemBytes = int(native["sharedMemBytes"])  # past the image's static
            if self.parameter_mode == "extra":
                node.extra = int(native["extra"])
            else:
                node.kernelParams = int(native["kernelParams"])
            tables.node_params[index] = node
        return node

    def _build_graph(self, submissions: range) -> _Graph:
        graph = _call("cuGraphCreate", 0)
        built = _Graph(submissions, graph, None)
        try:
            order = []
            for submission in submissions:
                for index in self.plan.submissions[submission].launches:
                    node = self._add_node(graph, index)
                    built.nodes.setdefault(index, []).append(node)
                    built.native_nodes.setdefault(index, []).append(int(node))
                    order.append(node)
            self._add_chain(graph, order)
            built.exec = _call("cuGraphInstantiate", graph, 0)
        except BaseException:
            with contextlib.suppress(CudaError):  # the first error is the one to report
                _call("cuGraphDestroy", graph)
            raise
        return built

    def _add_node(self, graph: Any, index: int) -> Any:
        """Launch `index`'s kernel node, with no dependencies yet (`_add_chain` adds them)."""
        add = _native_add_node()
        if add is None:
            return _call("cuGraphAddKernelNode", graph, None, 0, self._node_params(index))
        assert self._launch_tables is not None
        node = ctypes.c_void_p()
        status = add(ctypes.byref(node), int(graph), None, 0,
                     self._launch_tables.native_address(index))
        driver = _driver()
        if status:
            raise CudaError("cuGraphAddKernelNode", *_status_text(driver, driver.CUresult(status)))
        return driver.CUgraphNode(node.value)

    def _add_chain(self, graph: Any, order: list[Any]) -> None:
        """Each node runs after the one before it, all edges added in one driver call: on
        sm_90 and later through programmatic edges, so the driver may start a node while
        its predecessor's last blocks finish (every kernel of Bob's waits for its
        predecessors first: bob_kernels.cu, wait_for_prerequisites)."""
        if len(order) < 2:
            return
        driver = _driver()
        data = driver.CUgraphEdgeData()
        if self.programmatic_edges and self.capability >= (9, 0):
            data.type = driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
            data.from_port = driver.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
        edges = len(order) - 1
        befores, afters, datas = order[:-1], order[1:], [data] * edges
        add = getattr(driver, "cuGraphAddDependencies_v2", None)  # cuda-bindings 12.x
        if add is not None:
            check("cuGraphAddDependencies_v2", add(graph, befores, afters, datas, edges))
        else:
            _call("cuGraphAddDependencies", graph, befores, afters, datas, edges)

    # -- what the base class asks of a backend -------------------------------------------
    def _run(self, submissions: range) -> None:
        self._start_submissions(submissions)
        self._wait_started()

    def _start_submissions(self, submissions: range) -> None:
        self._require_open()
        try:
            if self.launch_times is not None:
                self._profile(submissions)
                return
            _call("cuCtxSetCurrent", self._context)
            graph = self._graphs.get(submissions)
            if graph is None:
                graph = self._graphs[submissions] = self._build_graph(submissions)
            _call("cuGraphLaunch", graph.exec, self._stream)
        except CudaError as error:
            self._after_fault(error)
            raise

    def _wait_started(self) -> None:
        self._require_open()
        try:
            _call("cuCtxSetCurrent", self._context)
            _call("cuStreamSynchronize", self._stream)  # a kernel's fault is reported here
        except CudaError as error:
            self._after_fault(error)
            raise

    def _fresh_context(self) -> Any:
        """A context for a device whose primary context a fault poisoned: the primary one
        reset, or, where the driver keeps it poisoned, a context of this backend's own."""
        with contextlib.suppress(CudaError):
            _call("cuDevicePrimaryCtxReset", self._device)
            context = _call("cuDevicePrimaryCtxRetain", self._device)
            _POISONED.discard(self._ordinal)
            return context
        driver = _driver()
        try:
            try:  # cuda-bindings 13: cuCtxCreate(params, flags, device)
                result = driver.cuCtxCreate(None, 0, self._device)
            except TypeError:  # 12.x: cuCtxCreate(flags, device)
                result = driver.cuCtxCreate(0, self._device)
            context = check("cuCtxCreate", result)
        except CudaError as error:
            raise CudaError(error.call, error.status,
                            f"{error.description}; an earlier fault poisoned this GPU's "
                            "context and no new one could be made: restart the process") \
                from None
        self._own_context = True
        return context

    def _after_fault(self, error: CudaError) -> None:
        """A sticky error poisons the context: close this backend and reset the context
        when the device is next opened."""
        if error.status not in STICKY_ERRORS:
            return
        _POISONED.add(self._ordinal)
        with contextlib.suppress(CudaError):  # every call in the context fails now
            self.close()

    def _profile(self, submissions: range) -> None:
        """Each launch alone on the stream between two events; their elapsed time."""
        assert self.launch_times is not None
        launch = _native_launch()
        if launch is None:
            raise RunFailure("profiling on cuda needs libcuda's cuLaunchKernel (ctypes)")
        _call("cuCtxSetCurrent", self._context)
        order = [index for submission in submissions
                 for index in self.plan.submissions[submission].launches]
        events = [_call("cuEventCreate", 0) for _ in range(2 * len(order))]
        try:
            stream = int(self._stream)
            for position, index in enumerate(order):
                spec = self.plan.launches[index]
                _call("cuEventRecord", events[2 * position], self._stream)
                status = launch(int(self._functions[spec.region]), spec.grid.x, spec.grid.y,
                                spec.grid.z, spec.block.x, spec.block.y, spec.block.z,
                                self.plan.region(spec.region).dynamic_shared_bytes, stream,
                                self._launch_tables.pointers_address(index), None)
                if status:
                    driver = _driver()
                    raise CudaError(f"cuLaunchKernel(launch {index}, {spec.region})",
                                    *_status_text(driver, driver.CUresult(status)))
                _call("cuEventRecord", events[2 * position + 1], self._stream)
            _call("cuStreamSynchronize", self._stream)
            for position, index in enumerate(order):
                milliseconds = _call("cuEventElapsedTime", events[2 * position],
                                     events[2 * position + 1])
                self.launch_times.append((index, round(milliseconds * 1e6)))
        finally:
            for event in events:
                with contextlib.suppress(CudaError):
                    _call("cuEventDestroy", event)

    def _write_arena(self, offset: int, data: memoryview) -> None:
        self._require_open()
        source = np.frombuffer(data, dtype=np.uint8)
        if self.arena_kind == "host":
            self._wait_started()  # the host arena is the device's memory: no write under a kernel
            ctypes.memmove(self._host_arena + offset, source.ctypes.data, source.size)
            return
        _call("cuCtxSetCurrent", self._context)
        if source.size <= SMALL_WRITE_BYTES:
            self._upload(self._small_slot(), [(offset, source.ctypes.data, source.size)])
            return
        uploads = self._uploads = self._uploads or self._pinned((UPLOAD_CHUNK_BYTES,) * 2)
        position = 0
        while position < source.size:
            # Fill one pinned chunk while the other's copy runs.
            chunk = uploads[self._next_upload]
            self._next_upload = 1 - self._next_upload
            count = min(UPLOAD_CHUNK_BYTES, source.size - position)
            self._upload(chunk, [(offset + position, source.ctypes.data + position, count)])
            position += count

    def _write_arena_many(self, writes: list[tuple[int, memoryview]]) -> None:
        """Small writes together through one slot: its last copy waited for once, one
        event recorded after them all."""
        if (self.arena_kind == "host" or len(writes) < 2
                or sum(data.nbytes for _, data in writes) > SMALL_WRITE_BYTES):
            super()._write_arena_many(writes)
            return
        self._require_open()
        _call("cuCtxSetCurrent", self._context)
        sources = [np.frombuffer(data, dtype=np.uint8) for _, data in writes]
        self._upload(self._small_slot(), [(offset, source.ctypes.data, source.size)
                                          for (offset, _), source in zip(writes, sources,
                                                                         strict=True)])

    def _small_slot(self) -> _UploadChunk:
        """The next of the small-write slots (made the first time)."""
        slots = self._slots = self._slots or self._pinned((SMALL_WRITE_BYTES,) *
                                                         SMALL_WRITE_SLOTS)
        slot = slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(slots)
        return slot

    def _upload(self, chunk: _UploadChunk, pieces: list[tuple[int, int, int]]) -> None:
        """Each (arena offset, host address, bytes) piece to the arena through `chunk`, one
        after another in it (its own last copy waited for first)."""
        _call("cuEventSynchronize", chunk.copied)  # an event never recorded is complete
        position = chunk.host
        for offset, source, count in pieces:
            ctypes.memmove(position, source, count)
            _call("cuMemcpyHtoDAsync", self._arena + offset, position, count, self._stream)
            position += count
        _call("cuEventRecord", chunk.copied, self._stream)

    def _read_arena(self, offset: int, size: int) -> bytes:
        self._require_open()
        self._wait_started()  # the started work and queued writes land first
        if self.arena_kind == "host":
            return ctypes.string_at(self._host_arena + offset, size)
        out = np.empty(size, dtype=np.uint8)
        if size:
            _call("cuMemcpyDtoH", out.ctypes.data, self._arena + offset, size)
        return out.tobytes()

    # -- staging: pinned memory allocated once, copies beside the graph ----------------
    @staticmethod
    def _pinned(sizes: tuple[int, ...]) -> list[_UploadChunk]:
        """Pinned chunks of these sizes, each with its event: all made, or none kept."""
        flags = int(_driver().CUevent_flags.CU_EVENT_DISABLE_TIMING)
        made: list[_UploadChunk] = []
        try:
            for size in sizes:
                host = int(_call("cuMemHostAlloc", size, 0))
                try:
                    made.append(_UploadChunk(host, _call("cuEventCreate", flags)))
                except BaseException:
                    _call("cuMemFreeHost", host)
                    raise
        except BaseException:
            for chunk in made:  # the first error is the one to report
                with contextlib.suppress(CudaError):
                    _call("cuEventDestroy", chunk.copied)
                    _call("cuMemFreeHost", chunk.host)
            raise
        return made

    def begin_read(self, names: Sequence[str]) -> ReadHandle:
        """Snapshot the tensors after the started work; copy them out beside later work."""
        if self.arena_kind == "host":
            return super().begin_read(names)  # the arena is host memory already
        self._require_open()
        if self._reading is not None:
            self._reading.wait()  # the staging is reused: the previous read completes first
        sizes = [self.plan.tensor(name).bytes for name in names]
        # Tensors near each other in the arena go as one copy: at V = 256 the host's driver
        # calls take longer than the device's whole invocation.
        spans, positions, end = read_spans(
            [(self._arena_offset(name, 0, size), size)
             for name, size in zip(names, sizes, strict=True)])
        layout = list(zip(names, positions, sizes, strict=True))
        staging = self._read_staging(end)
        _call("cuCtxSetCurrent", self._context)
        # A small read (a prediction's) neither lands nor replaces the landing buffers.
        landing = self._landing_for(end).take() if end >= LANDING_MIN_BYTES else None
        host = self._staging_host(staging) if landing is None else landing.ctypes.data
        if staging.snapshot:
            for offset, size, position in spans:
                _call("cuMemcpyDtoDAsync", staging.snapshot + position, self._arena + offset,
                      size, self._stream)
        _call("cuEventRecord", staging.snapped, self._stream)
        _call("cuStreamWaitEvent", staging.stream, staging.snapped, 0)
        for offset, size, position in spans:
            source = staging.snapshot + position if staging.snapshot else self._arena + offset
            _call("cuMemcpyDtoHAsync", host + position, source, size, staging.stream)
        if not staging.snapshot:  # later work writes what is being copied: it waits
            _call("cuEventRecord", staging.copied, staging.stream)
            _call("cuStreamWaitEvent", self._stream, staging.copied, 0)
        self._reading = _CudaRead(self, layout, landing)
        return self._reading

    def _landing_for(self, size: int) -> Landing:
        """The landing buffers for reads of `size` bytes (made anew when the size changes)."""
        if self._landing is None or self._landing.size != size:
            if self._landing is not None:
                self._landing.close()
            self._landing = Landing(
                size, lambda address, count: _call("cuMemHostRegister", address, count, 0),
                lambda address: _call("cuMemHostUnregister", address))
        return self._landing

    def _staging_host(self, staging: _ReadStaging) -> int:
        """The staging's own pinned memory (reads that find no landing buffer)."""
        if not staging.host:
            staging.host = int(_call("cuMemHostAlloc", staging.size, 0))
        return staging.host

    def _finish_read(self, layout: list[tuple[str, int, int]],
                     landing: np.ndarray | None) -> dict[str, np.ndarray]:
        """Wait for the copy stream; the tensors are the landing buffer's, or copied out of
        the pinned staging."""
        self._require_open()
        staging = self._staging
        assert staging is not None  # begin_read made it
        _call("cuCtxSetCurrent", self._context)
        _call("cuStreamSynchronize", staging.stream)
        self._reading = None
        if landing is not None:
            assert self._landing is not None
            whole = self._landing.hand_out(landing)
            return {name: whole[position:position + size] for name, position, size in layout}
        end = max((position + size for _, position, size in layout), default=0)
        if end <= COPY_OUT_CHUNK_BYTES:  # small (V = 256: 0.8 MB): one copy, views of it
            whole = copy_out(staging.host, end)
            return {name: whole[position:position + size] for name, position, size in layout}
        if self._copiers is None:
            self._copiers = ThreadPoolExecutor(min(COPY_OUT_THREADS, os.cpu_count() or 1),
                                               thread_name_prefix="bob-copy-out")
        return {name: copy_out(staging.host + position, size, self._copiers)
                for name, position, size in layout}

    def _read_staging(self, size: int) -> _ReadStaging:
        """The read-back staging, at least `size` bytes: allocated once, grown if asked."""
        if self._staging is not None and self._staging.size >= size:
            return self._staging
        self._free_read_staging()
        _call("cuCtxSetCurrent", self._context)
        driver = _driver()
        staging = _ReadStaging(max(1, size), 0, 0, None, None)
        try:
            try:
                staging.snapshot = int(_call("cuMemAlloc", staging.size))
            except CudaError as error:
                if error.status != "CUDA_ERROR_OUT_OF_MEMORY":
                    raise
                staging.snapshot = 0  # no room beside the arena: reads copy from it, in order
            staging.stream = _call("cuStreamCreate",
                                   int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
            staging.snapped = _call("cuEventCreate",
                                    int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING))
            if not staging.snapshot:
                staging.copied = _call("cuEventCreate",
                                       int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING))
        except BaseException:
            self._staging = staging
            with contextlib.suppress(CudaError):  # the allocation's error is the one to report
                self._free_read_staging()
            raise
        self._staging = staging
        return staging

    def _free_read_staging(self) -> None:
        """Free the read-back staging (all of it, whatever fails); raise the first error."""
        staging, self._staging = self._staging, None
        self._reading = None
        if staging is None:
            return
        calls = [("cuStreamSynchronize", staging.stream), ("cuEventDestroy", staging.snapped),
                 ("cuEventDestroy", staging.copied), ("cuStreamDestroy", staging.stream),
                 ("cuMemFreeHost", staging.host), ("cuMemFree", staging.snapshot)]
        errors = []
        for call, handle in calls:
            if handle is None or (isinstance(handle, int) and handle == 0):
                continue  # never made (pointers are ints, streams and events objects)
            try:
                _call(call, handle)
            except CudaError as error:
                errors.append(error)
        landing, self._landing = self._landing, None
        if landing is not None:  # after the copy stream's sync: nothing lands in it now
            try:
                landing.close()
            except CudaError as error:
                errors.append(error)
        if errors:
            raise errors[0]

    def _carry_patches(self, launch_index: int, values: dict[str, Scalar],
                       patches: list[Patch]) -> None:
        """Scalars are not relocated: their words go straight into the kernel's buffer."""
        self._require_open()
        assert self._store is not None
        size, buffer = self._store.size(launch_index), self._store.buffer(launch_index)
        base = self.plan.target.parameter_base
        for offset, word in patches:
            if not 0 <= offset - base <= size - len(word):
                raise RunFailure(f"launch {launch_index}: scalar at block offset {offset} is "
                                 "outside its parameter buffer")
            ctypes.memmove(ctypes.addressof(buffer) + offset - base, word, len(word))
        self._update_nodes([launch_index])

    def _carry_scalar_rows(self, launches: list[int], names: tuple[str, ...], dtype: str,
                           words: np.ndarray, offsets: np.ndarray) -> None:
        """Every launch's words into the parameter store in one indexed store, then the
        graphs' nodes."""
        self._require_open()
        if not launches:
            return
        relative = np.asarray(offsets, np.int64) - self.plan.target.parameter_base
        assert self._store is not None
        changed = self._store.write_words(launches, relative, words)
        # Every graph's nodes hold what the store held: an unchanged launch needs no update
        # (past about step 17,000 the defaults' step size and epsilon stay the same).
        self._update_nodes(np.asarray(launches, np.int64)[changed])

    def _update_nodes(self, launches: Sequence[int]) -> None:
        """Carry these launches' parameter buffers into every instantiated graph's nodes
        (a running graph keeps the parameters it was launched with)."""
        if not self._graphs:
            return
        _call("cuCtxSetCurrent", self._context)
        native = _native_node_update()
        graphs = list(self._graphs.values())
        tables = self._launch_tables
        assert tables is not None
        if native is None:
            for index in launches:
                for graph in graphs:
                    for node in graph.nodes.get(index, ()):
                        _call("cuGraphExecKernelNodeSetParams", graph.exec, node,
                              self._node_params(index))
            return
        chosen = np.zeros(len(self.plan.launches), bool)
        chosen[np.asarray(launches, np.int64)] = True
        for graph in graphs:
            nodes, of = graph.nodes_of(chosen)
            # A thousand node updates an invocation at V = 256 (seed): one map over
            # plain ints, the Python around each driver call cut to the least.
            statuses = list(map(native, itertools.repeat(int(graph.exec)), nodes,
                                tables.native_addresses(of)))
            failed = next((status for status in statuses if status), 0)
            if failed:
                driver = _driver()
                raise CudaError("cuGraphExecKernelNodeSetParams",
                                *_status_text(driver, driver.CUresult(failed)))

    def driver_attributes(self, region: str) -> dict[str, int]:
        """What the driver reports for a region's loaded function (to check the reader)."""
        self._require_open()
        attribute = _driver().CUfunction_attribute
        function = self._functions[region]
        queries = {
            "registers": attribute.CU_FUNC_ATTRIBUTE_NUM_REGS,
            "shared_bytes": attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            "max_threads": attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            "local_bytes": attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
            "constant_bytes": attribute.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
        }
        _call("cuCtxSetCurrent", self._context)
        return {name: int(_call("cuFuncGetAttribute", query, function))
                for name, query in queries.items()}

    def _require_open(self) -> None:
        if self._closed:
            raise RunFailure("the CUDA backend is closed")

    # -- teardown ------------------------------------------------------------------
    def close(self) -> None:
        """Free graph executables, graphs, module, arena, stream, context; once."""
        if self._closed:
            return
        self._closed = True
        errors: list[CudaError] = []

        def release(call: str, *args: Any) -> None:
            try:
                _call(call, *args)
            except CudaError as error:
                errors.append(error)

        if self._context is not None:
            release("cuCtxSetCurrent", self._context)
        if self._stream is not None:
            release("cuStreamSynchronize", self._stream)  # nothing freed under running work
        try:
            self._free_read_staging()
        except CudaError as error:
            errors.append(error)
        for chunk in self._uploads + self._slots:
            release("cuEventDestroy", chunk.copied)
            release("cuMemFreeHost", chunk.host)
        self._uploads, self._slots = [], []
        if self._copiers is not None:
            self._copiers.shutdown()
            self._copiers = None
        graphs = list(self._graphs.values())
        self._graphs.clear()
        for graph in graphs:
            if graph.exec is not None:
                release("cuGraphExecDestroy", graph.exec)
        for graph in graphs:
            release("cuGraphDestroy", graph.graph)
        if self._module is not None:
            release("cuModuleUnload", self._module)
            self._module = None
        if self._host_arena:
            release("cuMemFreeHost", self._host_arena)
        elif self._arena:
            release("cuMemFree", self._arena)
        self._arena = self._host_arena = 0
        if self._stream is not None:
            release("cuStreamDestroy", self._stream)
            self._stream = None
        if self._context is not None:
            if self._own_context:
                release("cuCtxDestroy", self._context)
            else:
                release("cuDevicePrimaryCtxRelease", self._device)
            self._context = None
        self._functions.clear()
        self._store = self._launch_tables = None
        if errors:
            raise errors[0]
