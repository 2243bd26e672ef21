"""``CudaBackend``: a certified plan through the CUDA driver API, as one CUDA graph.

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
- Parameters (``parameters.py``): each launch's kernel parameter buffer, its
  pointer words relocated, handed to the kernel node through ``extra``
  (``CU_LAUNCH_PARAM_BUFFER_POINTER`` / ``_SIZE``); ``params="pointers"`` passes
  ``kernelParams`` (one pointer per argument into the same buffer) instead.
- Submission: the launches of a range of submissions, in submission order
  (a launch submitted twice is two nodes), become one graph of kernel nodes,
  each depending on the one before; it is instantiated once per distinct range
  and launched with one ``cuGraphLaunch`` (``start``); ``wait`` synchronizes the
  stream. ``set_scalars`` updates the affected nodes of every executable graph
  in place (``cuGraphExecKernelNodeSetParams``); nothing is rebuilt.
- Transfers (``transfer.py``): writes through pinned chunks and small-write
  slots on the graph's stream; a clear is ``cuMemsetD8Async`` there; reads
  queued on a second stream, from the device snapshot the graph's stream fills
  in its order (``cuMemcpyDtoDAsync``), or from the arena where there is no room
  for one (the graph's stream then waits for the copy).
- Clusters: a launch in clusters (``Launch.cluster`` CTAs along x, a cluster region's)
  is a kernel node with the cluster dimension as its attribute, and alone (``profile``)
  a ``cuLaunchKernelEx`` with it; a device below sm_90 refuses such a plan.
- A timed run (``profile``) launches each kernel alone on the stream between two
  events, not the graph, whose launches cannot be bracketed.

The read pipeline itself (which reads land, the staging, the handle) is the base
class's; this backend supplies its primitives.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bob.backends.base import (
    Backend,
    Completion,
    Copy,
    Patch,
    host_memory_available,
    require_memory,
)
from bob.config import ARENA_KINDS
from bob.errors import RunFailure
from bob.kernels.cuda.regions import CompiledRegions
from bob.plan.certificate import CertifiedPlan
from bob.plan.model import Plan, Scalar

from . import driver, transfer
from .driver import STICKY_ERRORS, CudaError
from .parameters import (
    PARAMETER_MODES,
    LaunchTables,
    ParameterMode,
    ParameterStore,
    kernel_parameter_buffers,
)
from .transfer import (
    SMALL_WRITE_BYTES,
    SMALL_WRITE_SLOTS,
    UPLOAD_CHUNK_BYTES,
    PinnedChunk,
    ReadPath,
)

_POISONED: set[int] = set()  # device ordinals whose primary context a fault poisoned


def _require_clusters_on(plan: Plan, capability: tuple[int, int]) -> None:
    """Refuse a plan that launches clusters on a device without them (before sm_90)."""
    clustered = next((index for index, launch in enumerate(plan.launches)
                      if launch.cluster > 1), None)
    if clustered is not None and capability < (9, 0):
        launch = plan.launches[clustered]
        raise RunFailure(f"launch {clustered} ({launch.region}) runs in clusters of "
                         f"{launch.cluster} CTAs; sm_{capability[0]}{capability[1]} has no "
                         "thread-block clusters: build the plan for this device's target")


def _require_regions_of(plan: Plan, compiled: CompiledRegions) -> None:
    """Refuse a plan whose retained regions were not read from this image: the code the
    plan places is the code that runs."""
    for placed in plan.placed_regions:
        if plan.region(placed.name) != compiled.get(placed.name):
            raise RunFailure(f"region {placed.name!r} of the plan differs from the compiled "
                             "image's; build the plan from the regions the backend is given")


@dataclass
class Graph:
    """One executable graph of a range of submissions, and its nodes by launch."""

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


class CudaBackend(Backend):
    name = "cuda"
    can_profile = True
    # Consecutive graph nodes joined by programmatic edges (programmatic dependent launch)
    # where the GPU has them; False gives plain edges (the bench compares the two).
    programmatic_edges = True

    def __init__(self, plan: Plan | CertifiedPlan, compiled: CompiledRegions,
                 arena: str = ARENA_KINDS[0], *, device: int = 0,
                 params: ParameterMode = "extra"):
        # Refuses an uncertified plan and an unknown arena before anything is allocated.
        super().__init__(plan, arena)
        _require_regions_of(self.plan, compiled)
        if params not in PARAMETER_MODES:
            raise ValueError(f"params must be one of {PARAMETER_MODES}, not {params!r}")
        self.parameter_mode = params
        self._context = None
        self._own_context = False  # a context of its own after a fault (_fresh_context)
        self._device = None
        self._stream = None
        self._module = None
        self._arena = 0  # device address of the arena (of the mapping, for host)
        self._host_arena = 0  # host address of a host arena
        self._graphs: dict[range, Graph] = {}
        self._store: ParameterStore | None = None  # every launch's kernel parameters
        self._launch_tables: LaunchTables | None = None  # what the driver reads of them
        self._functions: dict[str, Any] = {}
        # The two large pinned chunks, then the small-write slots, each kind made at its
        # first use (a small run never writes more than a slot; pinning is slow).
        self._uploads: list[PinnedChunk] = []  # the two large chunks
        self._slots: list[PinnedChunk] = []  # the small-write slots
        self._next_upload = 0
        self._next_slot = 0
        self._reads = ReadPath()  # the copy stream, the snapshot, the staging
        self._closed = False
        self._ordinal = device

        self.image = compiled.image  # referenced while the driver reads it
        self.entries = {placed.name: self.plan.region(placed.name).entry
                        for placed in self.plan.placed_regions}
        driver.initialize()
        self._device = driver.call("cuDeviceGet", device)
        self.capability = driver.compute_capability(self._device)
        self.arch = "sm_{}{}".format(*self.capability)
        _require_clusters_on(self.plan, self.capability)
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    # -- setup ---------------------------------------------------------------
    def _open(self) -> None:
        api = driver.bindings()
        self._context = self._fresh_context() if self._ordinal in _POISONED else \
            driver.call("cuDevicePrimaryCtxRetain", self._device)
        driver.call("cuCtxSetCurrent", self._context)
        self._stream = driver.call("cuStreamCreate", 0)
        image = np.frombuffer(self.image, dtype=np.uint8)
        self._module = driver.call("cuModuleLoadData", image.ctypes.data)
        for name, entry in self.entries.items():
            self._functions[name] = driver.call("cuModuleGetFunction", self._module,
                                                entry.encode())
            dynamic = self.plan.region(name).dynamic_shared_bytes
            if dynamic:  # past 48 KiB a kernel's dynamic shared memory must be allowed first
                driver.call("cuFuncSetAttribute", self._functions[name],
                            api.CUfunction_attribute
                            .CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic)
        size = max(1, self.plan.arena_bytes)
        if self.arena_kind == "device":
            free, _ = driver.call("cuMemGetInfo")
            require_memory("cuda", "device memory", size, int(free))
            self._arena = int(driver.call("cuMemAlloc", size))
            driver.call("cuMemsetD8", self._arena, 0, size)
            driver.call("cuCtxSynchronize")
        else:
            require_memory("cuda", "host memory (the mapped arena)", size,
                           host_memory_available())
            self._host_arena = int(driver.call("cuMemHostAlloc", size,
                                               api.CU_MEMHOSTALLOC_DEVICEMAP))
            ctypes.memset(self._host_arena, 0, size)
            self._arena = int(driver.call("cuMemHostGetDevicePointer", self._host_arena, 0))
        self._make_arguments()

    def _make_arguments(self) -> None:
        self._apply_pending_rows()  # a block patched before a fresh context's arguments
        patched = {index: bytes(block) for index, block in self._blocks.items()}
        self._store = ParameterStore(kernel_parameter_buffers(self.plan, self._arena, patched))
        api = driver.bindings()
        constants = (int(api.CU_LAUNCH_PARAM_BUFFER_POINTER),
                     int(api.CU_LAUNCH_PARAM_BUFFER_SIZE), int(api.CU_LAUNCH_PARAM_END))
        self._launch_tables = LaunchTables(self.plan, self._store,
                                           {name: int(function)
                                            for name, function in self._functions.items()},
                                           self.parameter_mode, constants)

    def _node_params(self, index: int) -> Any:
        """Launch `index`'s CUDA_KERNEL_NODE_PARAMS through cuda-bindings, made when first
        asked for: only where libcuda's own entry points cannot be found by ctypes."""
        tables = self._launch_tables
        assert tables is not None
        node = tables.node_params.get(index)
        if node is None:
            native = tables.native[index]
            node = driver.bindings().CUDA_KERNEL_NODE_PARAMS()
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

    def _build_graph(self, submissions: range) -> Graph:
        graph = driver.call("cuGraphCreate", 0)
        built = Graph(submissions, graph, None)
        try:
            order = []
            for submission in submissions:
                for index in self.plan.submissions[submission].launches:
                    node = self._add_node(graph, index)
                    built.nodes.setdefault(index, []).append(node)
                    built.native_nodes.setdefault(index, []).append(int(node))
                    order.append(node)
            self._add_chain(graph, order)
            built.exec = driver.call("cuGraphInstantiate", graph, 0)
        except BaseException:
            with contextlib.suppress(CudaError):  # the first error is the one to report
                driver.call("cuGraphDestroy", graph)
            raise
        return built

    def _add_node(self, graph: Any, index: int) -> Any:
        """Launch `index`'s kernel node, with no dependencies yet (`_add_chain` adds them),
        in clusters where the launch asks for them."""
        add = driver.native_add_node()
        if add is None:
            node = driver.call("cuGraphAddKernelNode", graph, None, 0, self._node_params(index))
        else:
            assert self._launch_tables is not None
            handle = ctypes.c_void_p()
            status = add(ctypes.byref(handle), int(graph), None, 0,
                         self._launch_tables.native_address(index))
            if status:
                raise driver.failed("cuGraphAddKernelNode", status)
            node = driver.bindings().CUgraphNode(handle.value)
        ctas = self.plan.launches[index].cluster
        if ctas > 1:
            driver.set_node_cluster(node, ctas)
        return node

    def _add_chain(self, graph: Any, order: list[Any]) -> None:
        """Each node runs after the one before it, all edges added in one driver call: on
        sm_90 and later through programmatic edges, so the driver may start a node while
        its predecessor's last blocks finish (every kernel of Bob's waits for its
        predecessors first: bob_kernels.cu, wait_for_prerequisites)."""
        if len(order) < 2:
            return
        api = driver.bindings()
        data = api.CUgraphEdgeData()
        if self.programmatic_edges and self.capability >= (9, 0):
            data.type = api.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
            data.from_port = api.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
        edges = len(order) - 1
        befores, afters, datas = order[:-1], order[1:], [data] * edges
        add = getattr(api, "cuGraphAddDependencies_v2", None)  # cuda-bindings 12.x
        if add is not None:
            driver.check("cuGraphAddDependencies_v2", add(graph, befores, afters, datas, edges))
        else:
            driver.call("cuGraphAddDependencies", graph, befores, afters, datas, edges)

    # -- runs ------------------------------------------------------------------------
    def _run(self, submissions: range) -> None:
        self._start_submissions(submissions)
        self._wait_started()

    def _start_submissions(self, submissions: range) -> None:
        self._require_open()
        try:
            driver.call("cuCtxSetCurrent", self._context)
            graph = self._graphs.get(submissions)
            if graph is None:
                graph = self._graphs[submissions] = self._build_graph(submissions)
            driver.call("cuGraphLaunch", graph.exec, self._stream)
        except CudaError as error:
            self._after_fault(error)
            raise

    def _wait_started(self) -> None:
        self._require_open()
        try:
            driver.call("cuCtxSetCurrent", self._context)
            driver.call("cuStreamSynchronize", self._stream)  # a kernel's fault shows here
        except CudaError as error:
            self._after_fault(error)
            raise

    def _timed_run(self, submissions: range) -> list[tuple[int, int]]:
        """Each launch alone on the stream between two events; their elapsed time."""
        self._require_open()
        try:
            return self._launch_timed(submissions)
        except CudaError as error:
            self._after_fault(error)
            raise

    def _launch_timed(self, submissions: range) -> list[tuple[int, int]]:
        launch = driver.native_launch()
        if launch is None:
            raise RunFailure("profiling on cuda needs libcuda's cuLaunchKernel (ctypes)")
        assert self._launch_tables is not None
        driver.call("cuCtxSetCurrent", self._context)
        order = [index for submission in submissions
                 for index in self.plan.submissions[submission].launches]
        events = [driver.call("cuEventCreate", 0) for _ in range(2 * len(order))]
        try:
            stream = int(self._stream)
            for position, index in enumerate(order):
                spec = self.plan.launches[index]
                driver.call("cuEventRecord", events[2 * position], self._stream)
                dynamic = self.plan.region(spec.region).dynamic_shared_bytes
                parameters = self._launch_tables.pointers_address(index)
                if spec.cluster > 1:
                    driver.launch_cluster(self._functions[spec.region],
                                          (spec.grid.x, spec.grid.y, spec.grid.z),
                                          (spec.block.x, spec.block.y, spec.block.z),
                                          dynamic, self._stream, spec.cluster, parameters)
                else:
                    status = launch(int(self._functions[spec.region]), spec.grid.x,
                                    spec.grid.y, spec.grid.z, spec.block.x, spec.block.y,
                                    spec.block.z, dynamic, stream, parameters, None)
                    if status:
                        raise driver.failed(f"cuLaunchKernel(launch {index}, {spec.region})",
                                            status)
                driver.call("cuEventRecord", events[2 * position + 1], self._stream)
            driver.call("cuStreamSynchronize", self._stream)
            times = []
            for position, index in enumerate(order):
                milliseconds = driver.call("cuEventElapsedTime", events[2 * position],
                                           events[2 * position + 1])
                times.append((index, round(milliseconds * 1e6)))
            return times
        finally:
            for event in events:
                with contextlib.suppress(CudaError):
                    driver.call("cuEventDestroy", event)

    def _fresh_context(self) -> Any:
        """A context for a device whose primary context a fault poisoned: the primary one
        reset, or, where the driver keeps it poisoned, a context of this backend's own."""
        with contextlib.suppress(CudaError):
            driver.call("cuDevicePrimaryCtxReset", self._device)
            context = driver.call("cuDevicePrimaryCtxRetain", self._device)
            _POISONED.discard(self._ordinal)
            return context
        api = driver.bindings()
        try:
            try:  # cuda-bindings 13: cuCtxCreate(params, flags, device)
                result = api.cuCtxCreate(None, 0, self._device)
            except TypeError:  # 12.x: cuCtxCreate(flags, device)
                result = api.cuCtxCreate(0, self._device)
            context = driver.check("cuCtxCreate", result)
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

    # -- copy in, copy out, clear --------------------------------------------------------
    def _write_arena(self, offset: int, data: memoryview) -> None:
        self._require_open()
        source = np.frombuffer(data, dtype=np.uint8)
        if self.arena_kind == "host":
            self._wait_started()  # the host arena is the device's memory: no write under a kernel
            ctypes.memmove(self._host_arena + offset, source.ctypes.data, source.size)
            return
        driver.call("cuCtxSetCurrent", self._context)
        if source.size <= SMALL_WRITE_BYTES:
            transfer.upload(self._small_slot(), [(self._arena + offset, source.ctypes.data,
                                                  source.size)], self._stream)
            return
        uploads = self._uploads = self._uploads or transfer.pinned((UPLOAD_CHUNK_BYTES,) * 2)
        position = 0
        while position < source.size:
            # Fill one pinned chunk while the other's copy runs.
            chunk = uploads[self._next_upload]
            self._next_upload = 1 - self._next_upload
            count = min(UPLOAD_CHUNK_BYTES, source.size - position)
            transfer.upload(chunk, [(self._arena + offset + position,
                                     source.ctypes.data + position, count)], self._stream)
            position += count

    def _write_arena_many(self, writes: list[tuple[int, memoryview]]) -> None:
        """Small writes together through one slot: its last copy waited for once, one
        event recorded after them all."""
        if (self.arena_kind == "host" or len(writes) < 2
                or sum(data.nbytes for _, data in writes) > SMALL_WRITE_BYTES):
            super()._write_arena_many(writes)
            return
        self._require_open()
        driver.call("cuCtxSetCurrent", self._context)
        sources = [np.frombuffer(data, dtype=np.uint8) for _, data in writes]
        transfer.upload(self._small_slot(),
                        [(self._arena + offset, source.ctypes.data, source.size)
                         for (offset, _), source in zip(writes, sources, strict=True)],
                        self._stream)

    def _small_slot(self) -> PinnedChunk:
        """The next of the small-write slots (made the first time)."""
        slots = self._slots = self._slots or transfer.pinned((SMALL_WRITE_BYTES,) *
                                                             SMALL_WRITE_SLOTS)
        slot = slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(slots)
        return slot

    def _read_arena(self, offset: int, size: int) -> bytes:
        self._require_open()
        self._wait_started()  # the started work and queued writes land first
        if self.arena_kind == "host":
            return ctypes.string_at(self._host_arena + offset, size)
        out = np.empty(size, dtype=np.uint8)
        if size:
            driver.call("cuMemcpyDtoH", out.ctypes.data, self._arena + offset, size)
        return out.tobytes()

    def _clear_arena(self, spans: list[tuple[int, int]]) -> None:
        """cuMemsetD8Async on the graph's stream (a host arena: memset once it is idle)."""
        self._require_open()
        if self.arena_kind == "host":
            self._wait_started()
            for offset, size in spans:
                ctypes.memset(self._host_arena + offset, 0, size)
            return
        driver.call("cuCtxSetCurrent", self._context)
        for offset, size in spans:
            driver.call("cuMemsetD8Async", self._arena + offset, 0, size, self._stream)

    # -- reads queued on the copy stream -------------------------------------------------
    def _reads_queue(self) -> bool:
        self._require_open()
        return self.arena_kind == "device"  # a host arena is read where it lies

    def _snapshot_room(self, spans: list[tuple[int, int, int]], size: int) -> bool:
        driver.call("cuCtxSetCurrent", self._context)
        self._reads.open()
        return self._reads.room(size)

    def _queue_snapshot(self, spans: list[tuple[int, int, int]]) -> None:
        """Device-to-device copies on the graph's stream, once the last copy out of the
        snapshot is done."""
        reads = self._reads
        driver.call("cuCtxSetCurrent", self._context)
        if reads.snapshot_read is not None:
            driver.call("cuEventSynchronize", reads.snapshot_read)
            reads.snapshot_read = None
        for offset, size, position in spans:
            driver.call("cuMemcpyDtoDAsync", reads.snapshot + position, self._arena + offset,
                        size, self._stream)

    def _queue_copy_out(self, host: np.ndarray, copies: list[Copy],
                        from_snapshot: bool) -> Completion:
        """Device-to-host copies on the copy stream, after what the graph's stream holds
        now; from the arena, the graph's stream then waits for them."""
        reads = self._reads
        driver.call("cuCtxSetCurrent", self._context)
        reads.open()
        driver.call("cuEventRecord", reads.snapped, self._stream)
        driver.call("cuStreamWaitEvent", reads.stream, reads.snapped, 0)
        base = reads.snapshot if from_snapshot else self._arena
        for source, size, position in copies:
            driver.call("cuMemcpyDtoHAsync", host.ctypes.data + position, base + source, size,
                        reads.stream)
        if not from_snapshot:  # later work writes what is being copied: it waits
            driver.call("cuEventRecord", reads.copied, reads.stream)
            driver.call("cuStreamWaitEvent", self._stream, reads.copied, 0)
        done = reads.next_event()
        driver.call("cuEventRecord", done, reads.stream)
        if from_snapshot:
            reads.snapshot_read = done

        def wait() -> None:
            self._require_open()
            driver.call("cuCtxSetCurrent", self._context)
            driver.call("cuEventSynchronize", done)
            if reads.snapshot_read is done:
                reads.snapshot_read = None

        return wait

    def _read_staging(self, size: int) -> np.ndarray | None:
        driver.call("cuCtxSetCurrent", self._context)
        self._reads.open()
        return self._reads.staging_for(size)

    def _register_host(self, address: int, size: int) -> None:
        driver.call("cuCtxSetCurrent", self._context)
        driver.call("cuMemHostRegister", address, size, 0)

    def _unregister_host(self, address: int) -> None:
        driver.call("cuMemHostUnregister", address)

    def _wait_reads(self) -> None:
        if self._reads.stream is not None and not self._closed:
            driver.call("cuCtxSetCurrent", self._context)
            driver.call("cuStreamSynchronize", self._reads.stream)

    # -- scalar patches ------------------------------------------------------------------
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
        # (the defaults' step size and epsilon stop changing late in a long run).
        self._update_nodes(np.asarray(launches, np.int64)[changed])

    def _update_nodes(self, launches: Sequence[int]) -> None:
        """Carry these launches' parameter buffers into every instantiated graph's nodes
        (a running graph keeps the parameters it was launched with)."""
        if not self._graphs:
            return
        driver.call("cuCtxSetCurrent", self._context)
        native = driver.native_node_update()
        graphs = list(self._graphs.values())
        tables = self._launch_tables
        assert tables is not None
        if native is None:
            for index in launches:
                for graph in graphs:
                    for node in graph.nodes.get(index, ()):
                        driver.call("cuGraphExecKernelNodeSetParams", graph.exec, node,
                                    self._node_params(index))
            return
        chosen = np.zeros(len(self.plan.launches), bool)
        chosen[np.asarray(launches, np.int64)] = True
        for graph in graphs:
            nodes, of = graph.nodes_of(chosen)
            # An invocation's node updates as one map over plain ints: the Python around
            # each driver call cut to the least.
            statuses = list(map(native, itertools.repeat(int(graph.exec)), nodes,
                                tables.native_addresses(of)))
            failed = next((status for status in statuses if status), 0)
            if failed:
                raise driver.failed("cuGraphExecKernelNodeSetParams", failed)

    def driver_attributes(self, region: str) -> dict[str, int]:
        """What the driver reports for a region's loaded function (to check the reader)."""
        self._require_open()
        attribute = driver.bindings().CUfunction_attribute
        function = self._functions[region]
        queries = {
            "registers": attribute.CU_FUNC_ATTRIBUTE_NUM_REGS,
            "shared_bytes": attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            "max_threads": attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            "local_bytes": attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
            "constant_bytes": attribute.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
        }
        driver.call("cuCtxSetCurrent", self._context)
        return {name: int(driver.call("cuFuncGetAttribute", query, function))
                for name, query in queries.items()}

    def _require_open(self) -> None:
        if self._closed:
            raise RunFailure("the CUDA backend is closed")

    # -- teardown ------------------------------------------------------------------
    def close(self) -> None:
        """Free graph executables, graphs, module, arena, stream, context; once."""
        if self._closed:
            return
        errors: list[RunFailure] = []

        def release(name: str, *args: Any) -> None:
            try:
                driver.call(name, *args)
            except CudaError as error:
                errors.append(error)

        if self._context is not None:
            release("cuCtxSetCurrent", self._context)
        if self._stream is not None:
            release("cuStreamSynchronize", self._stream)  # nothing freed under running work
        try:  # the copies out finish before their host memory goes
            self._wait_reads()
            self._close_reads()
        except RunFailure as error:
            errors.append(error)
        self._closed = True
        errors.extend(self._reads.free())
        for chunk in self._uploads + self._slots:
            release("cuEventDestroy", chunk.copied)
            release("cuMemFreeHost", chunk.host)
        self._uploads, self._slots = [], []
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
