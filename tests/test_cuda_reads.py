"""The cuda backend's read pipeline, clears and batched writes on the CPU: the driver
replaced by one whose "device" memory is host memory and whose copies are memmove, so what
the base class's pipeline asks of the cuda primitives (one copy per span of neighbouring
tensors, a snapshot, a staging, landing buffers, a ring) and what `wait` hands out are
checked byte for byte. The same reads and writes on a GPU: tests/test_host_pipe_cuda.py and
tests/test_cuda_backend.py."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from bob.backends import cuda
from bob.backends.base import Backend
from bob.backends.cuda import driver as cuda_driver
from bob.backends.cuda.transfer import ReadPath
from bob.backends.landing import PACKING, SPAN_GAP, STREAM_RING_BUFFERS, read_spans
from bob.config import CHECKPOINT_TENSORS, RESULT_TENSORS
from bob.errors import RunFailure
from bob.program.bob import HEALTH_TENSOR, BobConfig, build_plan

READ = (*RESULT_TENSORS, HEALTH_TENSOR, *CHECKPOINT_TENSORS)  # what an invocation reads


class HostDriver:
    """Driver calls on host memory: allocations are NumPy buffers, copies memmove."""

    def __init__(self):
        self.buffers: list[np.ndarray] = []
        self.copies: list[tuple[str, int]] = []  # (call, bytes)
        self.names: list[str] = []  # every call's name, in order
        self.calls: list[tuple[str, tuple]] = []
        self.registered: dict[int, int] = {}  # page-locked host memory: address -> bytes

    def allocate(self, size: int) -> int:
        buffer = np.zeros(size, np.uint8)
        self.buffers.append(buffer)
        return buffer.ctypes.data

    def __call__(self, name: str, *args):
        self.names.append(name)
        self.calls.append((name, args))
        if name in ("cuMemAlloc", "cuMemHostAlloc"):
            return self.allocate(args[0])
        if name in ("cuMemcpyDtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync",
                    "cuMemcpyDtoH"):
            destination, source, size = args[:3]
            ctypes.memmove(destination, source, size)
            self.copies.append((name, size))
            return None
        if name == "cuMemsetD8Async":
            destination, value, size, _stream = args
            ctypes.memset(destination, value, size)
            return None
        if name == "cuMemHostRegister":
            self.registered[args[0]] = args[1]
            return None
        if name == "cuMemHostUnregister":
            del self.registered[args[0]]
            return None
        if name in ("cuStreamCreate", "cuEventCreate"):
            return f"{name} handle"
        assert name in ("cuCtxSetCurrent", "cuEventRecord", "cuStreamWaitEvent",
                        "cuStreamSynchronize", "cuEventSynchronize", "cuMemFree",
                        "cuMemFreeHost"), name
        return None


def _reading_backend(monkeypatch, vocab: int, schedule: str = "fused",
                     ) -> tuple[cuda.CudaBackend, HostDriver, np.ndarray]:
    """A cuda backend with only what reads, writes and clears use, its arena random bytes."""
    driver = HostDriver()
    monkeypatch.setattr(cuda_driver, "call", driver)
    monkeypatch.setattr(cuda_driver, "bindings", lambda: SimpleNamespace(
        CUstream_flags=SimpleNamespace(CU_STREAM_NON_BLOCKING=1),
        CUevent_flags=SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)))
    plan = build_plan(BobConfig(vocab=vocab, prompts=2, updates=3, schedule=schedule))
    arena = np.random.default_rng(vocab).integers(0, 256, plan.address_map.arena.bytes,
                                                  np.uint8)
    backend = object.__new__(cuda.CudaBackend)
    Backend.__init__(backend, plan)  # the base's bookkeeping and read pipeline, no device
    backend._closed = False
    backend._context = None
    backend._stream = "graph stream"
    backend._arena = arena.ctypes.data
    backend._reads = ReadPath()
    backend._slots, backend._next_slot = [], 0
    return backend, driver, arena


def _arena_bytes(backend: cuda.CudaBackend, arena: np.ndarray, name: str) -> bytes:
    start = backend._arena_offset(name, 0, 0)
    return arena[start:start + backend.plan.tensor(name).bytes].tobytes()


@pytest.mark.parametrize("vocab", [256, 1000])
@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_a_read_copies_each_span_once_and_hands_out_every_tensor(monkeypatch, vocab: int,
                                                                 schedule: str) -> None:
    backend, driver, arena = _reading_backend(monkeypatch, vocab, schedule)
    expected = {name: _arena_bytes(backend, arena, name) for name in READ}
    tables = backend.begin_read(READ).wait()
    assert {name: tables[name].tobytes() for name in READ} == expected
    spans, _, _ = read_spans([(backend._arena_offset(name, 0, 0),
                               backend.plan.tensor(name).bytes) for name in READ])
    # The three tables lie together, and so do the losses, predictions and health counts.
    assert len(spans) == 2
    assert [call for call, _ in driver.copies] == ["cuMemcpyDtoDAsync"] * 2 + \
        ["cuMemcpyDtoHAsync"] * 2
    # The snapshot on the graph's stream, the copy out on the copy stream after it.
    snapshot = [args[3] for name, args in driver.calls if name == "cuMemcpyDtoDAsync"]
    out = [args[3] for name, args in driver.calls if name == "cuMemcpyDtoHAsync"]
    assert set(snapshot) == {"graph stream"} and set(out) == {backend._reads.stream}


def test_a_read_through_the_staging_is_a_copy_of_its_own(monkeypatch) -> None:
    """Copied out of the staging in one piece, the tensors are views of one new array:
    the next read, through the same staging, does not show through them."""
    backend, driver, arena = _reading_backend(monkeypatch, 256)
    backend.landing_min_bytes = 1 << 30  # no read lands
    expected = {name: _arena_bytes(backend, arena, name) for name in READ}
    first = backend.begin_read(READ).wait()
    arena[:] = 255 - arena
    second = backend.begin_read(READ).wait()
    assert {name: first[name].tobytes() for name in READ} == expected
    assert {name: second[name].tobytes() for name in READ} == \
        {name: bytes(255 - b for b in data) for name, data in expected.items()}
    base = first[READ[0]].base
    assert base is not None and all(first[name].base is base for name in READ)
    staging = backend._reads.staging
    assert staging is not None and not np.shares_memory(base, staging)
    assert backend._landing is None and driver.registered == {}


def test_a_staged_read_not_yet_waited_for_leaves_the_staging_before_the_next(monkeypatch):
    backend, driver, arena = _reading_backend(monkeypatch, 256)
    backend.landing_min_bytes = 1 << 30
    expected = {name: _arena_bytes(backend, arena, name) for name in READ}
    first = backend.begin_read(READ)  # not waited for
    arena[:] = 255 - arena
    backend.begin_read(READ).wait()  # reuses the staging: the first is copied out first
    assert {name: data.tobytes() for name, data in first.wait().items()} == expected


class NoRoomDriver(HostDriver):
    """A device with no room for the snapshot beside the arena."""

    def __call__(self, name: str, *args):
        if name == "cuMemAlloc":
            self.names.append(name)
            self.calls.append((name, args))
            raise cuda.CudaError("cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
        return super().__call__(name, *args)


def test_with_no_room_for_a_snapshot_a_read_copies_from_the_arena_and_later_work_waits(
        monkeypatch) -> None:
    backend, _, arena = _reading_backend(monkeypatch, 256)
    driver = NoRoomDriver()
    monkeypatch.setattr(cuda_driver, "call", driver)
    expected = {name: _arena_bytes(backend, arena, name) for name in READ}
    for _ in range(2):  # refused once: not asked again at that size
        tables = backend.begin_read(READ).wait()
        assert {name: tables[name].tobytes() for name in READ} == expected
    names = [name for name, _ in driver.calls]
    assert names.count("cuMemAlloc") == 1 and "cuMemcpyDtoDAsync" not in names
    assert [call for call, _ in driver.copies] == ["cuMemcpyDtoHAsync"] * 4
    arena_range = range(arena.ctypes.data, arena.ctypes.data + arena.size)
    assert all(args[1] in arena_range for name, args in driver.calls
               if name == "cuMemcpyDtoHAsync")  # straight from the arena
    # The copy waits for the work before it, and the graph's stream for the copy.
    waits = [args[0] for name, args in driver.calls if name == "cuStreamWaitEvent"]
    assert waits == [backend._reads.stream, "graph stream"] * 2


def test_a_snapshot_refused_for_another_reason_is_reported(monkeypatch) -> None:
    backend, driver, _ = _reading_backend(monkeypatch, 256)

    def refuse(name: str, *args):
        if name == "cuMemAlloc":
            raise cuda.CudaError(name, "CUDA_ERROR_INVALID_VALUE", "invalid argument")
        return driver(name, *args)

    monkeypatch.setattr(cuda_driver, "call", refuse)
    with pytest.raises(cuda.CudaError, match="cuMemAlloc failed: CUDA_ERROR_INVALID_VALUE"):
        backend.begin_read(READ)
    assert backend._reads.snapshot == 0 and backend._reads.no_room == 0  # nothing half made
    landing = backend._landing
    assert landing is not None and landing._free == landing._made  # the buffer came back


def test_a_read_into_a_landing_buffer_hands_out_the_same_bytes(monkeypatch) -> None:
    backend, driver, arena = _reading_backend(monkeypatch, 256)
    expected = {name: _arena_bytes(backend, arena, name) for name in READ}
    first = backend.begin_read(READ).wait()
    arena[:] = 255 - arena  # the next read must not show through the first's arrays
    second = backend.begin_read(READ).wait()
    assert {name: first[name].tobytes() for name in READ} == expected
    assert {name: second[name].tobytes() for name in READ} == \
        {name: bytes(255 - b for b in data) for name, data in expected.items()}
    assert len(driver.registered) == 2  # two landing buffers: the first's is still held


def test_read_spans_joins_neighbours_and_places_every_range() -> None:
    gap = SPAN_GAP
    ranges = [(gap * 10, 100), (0, 10), (5, 20), (25 + gap, 4), (gap * 10 + 50, 0),
              (gap * 10 + 100, 8), (30 + 2 * gap, 1)]
    spans, positions, end = read_spans(ranges)
    # [0, 25) and [25 + gap, 29 + gap) are a gap apart: one span; 30 + 2 gap is a byte
    # too far for it; the last pair is another.
    second = PACKING * -(-(29 + gap) // PACKING)
    assert spans == [(0, 29 + gap, 0), (30 + 2 * gap, 1, second),
                     (gap * 10, 108, second + PACKING)]
    assert positions == [second + PACKING, 0, 5, 25 + gap, 0, second + PACKING + 100, second]
    assert end == second + 2 * PACKING
    assert read_spans([]) == ([], [], 0)
    assert read_spans([(7, 0)]) == ([], [0], 0)


def test_read_spans_reads_what_a_tensor_by_tensor_copy_would() -> None:
    hypothesis = pytest.importorskip("hypothesis")
    strategies = pytest.importorskip("hypothesis.strategies")
    arena = np.random.default_rng(1).integers(0, 256, 1 << 20, np.uint8)

    @hypothesis.given(strategies.lists(strategies.tuples(strategies.integers(0, 1 << 19),
                                                         strategies.integers(0, 1 << 18)),
                                       max_size=8),
                      strategies.sampled_from([0, 16, SPAN_GAP]))
    def check(ranges: list[tuple[int, int]], gap: int) -> None:
        spans, positions, end = read_spans(ranges, gap)
        buffer = np.zeros(end, np.uint8)
        for offset, size, at in spans:
            assert at % PACKING == 0 and at + size <= end
            buffer[at:at + size] = arena[offset:offset + size]
        for (offset, size), at in zip(ranges, positions, strict=True):
            assert buffer[at:at + size].tobytes() == arena[offset:offset + size].tobytes()
        assert sum(size for _, size, _ in spans) <= max(
            [0] + [offset + size for offset, size in ranges])

    check()


def test_an_invocations_small_writes_go_through_one_slot_in_one_batch(monkeypatch) -> None:
    backend, driver, arena = _reading_backend(monkeypatch, 256)
    rng = np.random.default_rng(1)
    writes = [(name, rng.integers(0, 256, backend.plan.tensor(name).bytes, np.uint8).tobytes())
              for name in ("adam_scalars", "training_loss", HEALTH_TENSOR)]
    backend.write_tensors(writes)
    for name, data in writes:
        assert _arena_bytes(backend, arena, name) == data, name
    # The slot's last copy waited for once, a copy per tensor, one event after them.
    assert [call for call in driver.names if call not in ("cuMemHostAlloc", "cuEventCreate")] \
        == ["cuCtxSetCurrent", "cuEventSynchronize", *["cuMemcpyHtoDAsync"] * 3, "cuEventRecord"]
    assert backend._next_slot == 1


def test_a_batch_with_one_bad_write_writes_nothing(monkeypatch) -> None:
    backend, driver, arena = _reading_backend(monkeypatch, 256)
    before = arena.copy()
    too_long = bytes(backend.plan.tensor(HEALTH_TENSOR).bytes + 4)
    with pytest.raises(RunFailure, match="do not fit tensor 'health'"):
        backend.write_tensors([("training_loss", b"\1" * 8), (HEALTH_TENSOR, too_long)])
    with pytest.raises(KeyError, match="no tensor named 'helth'"):
        backend.write_tensors([("training_loss", b"\1" * 8), ("helth", b"\0")])
    assert (arena == before).all() and driver.names == []


def test_a_training_read_lands_and_a_small_read_leaves_the_landing_buffers(monkeypatch):
    """An invocation's read lands in a page-locked buffer handed out as the tables (no
    copy on the host); a prediction's small read is copied out of the staging and does
    not replace the landing buffers."""
    backend, driver, arena = _reading_backend(monkeypatch, 256)
    expected = {name: _arena_bytes(backend, arena, name) for name in READ}
    tables = backend.begin_read(READ).wait()
    landing = backend._landing
    assert landing is not None and len(landing._made) == 1
    assert tables[READ[0]].base is not None
    assert {name: tables[name].tobytes() for name in READ} == expected
    lands = landing._made[0].ctypes.data
    assert lands <= tables["parameters"].ctypes.data < lands + landing.size
    small = backend.begin_read(["predictions"]).wait()
    assert small["predictions"].tobytes() == expected["predictions"]
    assert backend._landing is landing and "cuMemHostUnregister" not in driver.names


# -- clears and streamed reads --------------------------------------------------------------


def test_a_clear_is_one_memset_per_tensor_on_the_graphs_stream(monkeypatch):
    """Ordered like a write: queued on the stream the runs are launched on, behind them."""
    backend, driver, arena = _reading_backend(monkeypatch, 256)
    names = ("training_loss", HEALTH_TENSOR, "gradients")
    backend.clear_tensors(names)
    memsets = [args for name, args in driver.calls if name == "cuMemsetD8Async"]
    assert [(args[1], args[3]) for args in memsets] == [(0, "graph stream")] * 3
    for name in names:
        assert backend.read_tensor(name) == bytes(backend.plan.tensor(name).bytes)
        assert _arena_bytes(backend, arena, name) == backend.read_tensor(name)
    assert backend.read_tensor("parameters") == _arena_bytes(backend, arena, "parameters")
    assert any(byte for byte in backend.read_tensor("parameters"))  # others as they were
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        backend.clear_tensors(["training_loss", "nope"])


@pytest.mark.parametrize("snapshot", [True, False])
def test_a_streamed_read_goes_in_arena_order_through_a_ring_of_chunks(monkeypatch, snapshot):
    backend, driver, arena = _reading_backend(monkeypatch, 1000)
    if not snapshot:
        monkeypatch.setattr(cuda_driver, "call", NoRoomDriver())
        driver = cuda_driver.call
    chunk = 100_000  # the tables are 4 MB each: many chunks, the ring reused
    got: dict[str, bytearray] = {name: bytearray() for name in CHECKPOINT_TENSORS}
    seen: list[tuple[str, int]] = []
    views: list[int] = []

    def sink(name: str, offset: int, view: np.ndarray) -> None:
        assert view.dtype == np.uint8 and 0 < view.size <= chunk
        assert offset == len(got[name])
        seen.append((name, offset))
        views.append(view.ctypes.data)
        got[name] += view.tobytes()

    names = list(reversed(CHECKPOINT_TENSORS))  # delivered in arena order whatever the order
    backend.stream_read(names, sink, chunk)
    assert list(dict.fromkeys(name for name, _ in seen)) == list(CHECKPOINT_TENSORS)
    for name in CHECKPOINT_TENSORS:
        assert bytes(got[name]) == backend.read_tensor(name)
    # The host memory it held: the ring's buffers, each one chunk, and nothing else.
    ring = backend._ring
    assert ring is not None and len(ring.buffers) == STREAM_RING_BUFFERS
    assert set(driver.registered) == {buffer.ctypes.data for buffer in ring.buffers}
    assert all(size == chunk for size in driver.registered.values())
    assert set(views) <= set(driver.registered)
    copied = [name for name, _ in driver.copies]
    assert copied.count("cuMemcpyDtoDAsync") == (1 if snapshot else 0)
    assert copied.count("cuMemcpyDtoHAsync") == len(seen)
