"""The CUDA backend's host side: staged writes, the snapshot read-back, start/wait, the
scalar rows. The `gpu` tests need a GPU; the others run anywhere (no driver call)."""

from __future__ import annotations

import ctypes
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from bob.backends import BackendChoice, choose_backend
from bob.backends.base import Backend
from bob.backends.cuda import (
    CudaBackend,
    LaunchTables,
    ParameterStore,
    kernel_parameter_buffers,
    kernel_parameters,
)
from bob.backends.cuda import driver as cuda_driver
from bob.backends.cuda.backend import Graph
from bob.backends.cuda.driver import NativeKernelNodeParams
from bob.backends.cuda.transfer import UPLOAD_CHUNK_BYTES
from bob.backends.landing import LANDING_BYTES, LANDING_MIN_BYTES, Landing, copy_out
from bob.config import CHECKPOINT_TENSORS, Hyper
from bob.errors import RunFailure
from bob.host.check import random_record
from bob.host.session import Session, train
from bob.plan.model import Scalar
from bob.plan.placement import TARGETS, argument_slots
from bob.program.bob import (
    ADAM_SCALAR_NAMES,
    BobConfig,
    adam_scalar_table,
    build_plan,
    typical_pairs,
)
from bob.records.checkpoint import Checkpoint, StartingPoint
from bob.records.shards import open_checkpoint
from conftest import assert_same_tensors

gpu = pytest.mark.gpu


FAKE_ARENA = 0x7F00_0000_0000


def _driverless_cuda(plan, mode: str = "extra") -> CudaBackend:
    """A CudaBackend's host-side state for `plan`, opened without the driver: the kernel
    parameter buffers and launch tables as _open builds them (each region's function a
    made-up handle), no graphs (so no node is updated)."""
    backend = object.__new__(CudaBackend)
    Backend.__init__(backend, plan)  # the blocks' bookkeeping, no allocation
    backend._closed = False
    backend._graphs = {}
    backend._arena = FAKE_ARENA
    backend.parameter_mode = mode
    backend._functions = {placed.name: 0x1000 + 0x100 * index
                          for index, placed in enumerate(plan.placed_regions)}
    backend._make_arguments()
    return backend


def _buffer(backend: CudaBackend, index: int) -> bytes:
    return bytes(backend._store.buffer(index))


@pytest.mark.parametrize("arch", ["sm_86", "sm_90"])
def test_cuda_scalar_rows_write_the_words_set_scalars_writes(arch):
    config = BobConfig(vocab=64, prompts=1, updates=6)
    plan = build_plan(config, TARGETS[arch])
    one, many = _driverless_cuda(plan), _driverless_cuda(plan)
    words = adam_scalar_table(Hyper(lr=0.02), 40, 6).view(np.uint32)[:, :len(ADAM_SCALAR_NAMES)]
    launches = [config.adamw_launch(k) for k in range(6)]
    for launch, row in zip(launches, words.tolist(), strict=True):
        one.set_scalars(launch, {name: Scalar("f32", word)
                                 for name, word in zip(ADAM_SCALAR_NAMES, row, strict=True)})
    many.set_scalars_many(launches, ADAM_SCALAR_NAMES, words)
    for index in range(plan.launch_count):
        assert _buffer(one, index) == _buffer(many, index)
        assert one.parameter_block(index) == many.parameter_block(index)
    assert _buffer(many, launches[0]) != _buffer(_driverless_cuda(plan), launches[0])


@pytest.mark.parametrize("arch", ["sm_86", "sm_90"])
@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_the_buffers_packed_by_region_are_the_plan_blocks_relocated(arch, schedule):
    config = BobConfig(vocab=64, prompts=2, updates=5, schedule=schedule)
    plan = build_plan(config, TARGETS[arch])
    backend = object.__new__(CudaBackend)
    Backend.__init__(backend, plan)
    expected = [kernel_parameters(plan, plan.region(launch.region),
                                  backend.parameter_block(index), FAKE_ARENA)
                for index, launch in enumerate(plan.launches)]
    assert kernel_parameter_buffers(plan, FAKE_ARENA, {}) == expected
    patched = bytearray(backend.parameter_block(1))
    patched[-4:] = b"\x01\x02\x03\x04"
    buffers = kernel_parameter_buffers(plan, FAKE_ARENA, {1: bytes(patched)})
    assert buffers[1] == kernel_parameters(plan, plan.region(plan.launches[1].region),
                                           bytes(patched), FAKE_ARENA)
    assert buffers[:1] + buffers[2:] == expected[:1] + expected[2:]


def test_a_pointer_outside_the_arena_is_refused_by_the_packed_buffers():
    plan = build_plan(BobConfig(vocab=64, prompts=1, updates=2), TARGETS["sm_90"])
    launch = plan.launches[0]
    region = plan.region(launch.region)
    moved = replace(launch, args=tuple(
        replace(arg, address=plan.address_map.arena.end) if hasattr(arg, "address") else arg
        for arg in launch.args))
    outside = replace(plan, launches=(moved, *plan.launches[1:]))
    with pytest.raises(ValueError, match=f"region '{region.name}' argument .* is outside "
                                         "the arena"):
        kernel_parameter_buffers(outside, FAKE_ARENA, {})


def test_a_launch_with_too_few_arguments_is_refused_by_the_packed_buffers():
    plan = build_plan(BobConfig(vocab=64, prompts=1, updates=2), TARGETS["sm_90"])
    later = [i for i, launch in enumerate(plan.launches)
             if launch.region == plan.launches[0].region][1]  # its region's layout made
    launch = plan.launches[later]
    launches = list(plan.launches)
    launches[later] = replace(launch, args=launch.args[:-1])
    short = replace(plan, launches=tuple(launches))
    with pytest.raises(ValueError, match=f"launch {later} has {len(launch.args) - 1} arguments for "
                                         f"{len(launch.args)} parameters of "
                                         f"'{launch.region}'"):
        kernel_parameter_buffers(short, FAKE_ARENA, {})


@pytest.mark.parametrize("mode", ["extra", "pointers"])
def test_the_launch_tables_point_at_each_launchs_buffer(mode):
    """What a graph node or cuLaunchKernel reads, followed through the tables' addresses:
    the function, grid, block and shared bytes of the launch, and its kernel parameters."""
    plan = build_plan(BobConfig(vocab=300, prompts=2, updates=4), TARGETS["sm_90"])
    backend = _driverless_cuda(plan, mode)
    tables = backend._launch_tables
    assert isinstance(tables, LaunchTables)
    base = plan.target.parameter_base
    for index, launch in enumerate(plan.launches):
        region = plan.region(launch.region)
        native = NativeKernelNodeParams.from_address(tables.native_address(index))
        assert native.func == backend._functions[launch.region]
        assert (native.gridDimX, native.gridDimY, native.gridDimZ) == \
            (launch.grid.x, launch.grid.y, launch.grid.z)
        assert (native.blockDimX, native.blockDimY, native.blockDimZ) == \
            (launch.block.x, launch.block.y, launch.block.z)
        assert native.sharedMemBytes == region.dynamic_shared_bytes
        assert native.kern is None and native.ctx is None
        expected = _buffer(backend, index)[:backend._store.size(index)]
        assert expected == kernel_parameters(plan, region, backend.parameter_block(index),
                                             FAKE_ARENA)
        slots = argument_slots(plan.target, region.params)
        pointers = (ctypes.c_uint64 * max(1, len(slots))).from_address(
            tables.pointers_address(index))
        for slot, pointer in zip(slots, pointers, strict=False):
            assert ctypes.string_at(pointer, slot.size) == \
                expected[slot.offset - base:slot.offset - base + slot.size]
        if mode == "extra":
            assert native.kernelParams is None
            extra = (ctypes.c_uint64 * 5).from_address(native.extra)
            assert list(extra)[0::2] == [1, 2, 0]  # BUFFER_POINTER, BUFFER_SIZE, END
            size = ctypes.c_uint64.from_address(extra[3]).value
            assert size == len(expected) and ctypes.string_at(extra[1], size) == expected
        else:
            assert native.extra is None
            assert native.kernelParams == tables.pointers_address(index)


def test_an_invocations_scalars_update_the_nodes_of_the_launches_they_change(monkeypatch):
    """set_scalars_many on a cuda backend with two graphs (one holding a launch twice):
    every node of a launch whose words changed is updated in every graph, with that
    launch's node parameters; launches whose words are the same are left alone; a failed
    update names the call."""
    config = BobConfig(vocab=64, prompts=1, updates=4)
    plan = build_plan(config, TARGETS["sm_90"])
    backend = _driverless_cuda(plan)
    adamw = [config.adamw_launch(k) for k in range(4)]
    train = Graph(range(1), "graph", 0x7000, native_nodes={
        index: [0x9000 + index] for index in range(len(plan.launches))})
    twice = Graph(range(1), "graph", 0x7100, native_nodes={adamw[1]: [0xA001, 0xA002],
                                                             adamw[3]: [0xA003]})
    backend._graphs = {range(1): train, range(2): twice}
    backend._context = "context"
    updated: list[tuple[int, int, int]] = []

    def native(handle, node, params):
        updated.append((handle, node, params))
        return 0
    monkeypatch.setattr(cuda_driver, "native_node_update", lambda: native)
    monkeypatch.setattr(cuda_driver, "call", lambda *args: None)
    tables = backend._launch_tables
    # Steps 41-44: the plan's blocks hold steps 1-4, so every AdamW launch changes.
    words = adam_scalar_table(Hyper(), 41, 4).view(np.uint32)[:, :len(ADAM_SCALAR_NAMES)]
    backend.set_scalars_many(adamw, ADAM_SCALAR_NAMES, words)
    assert sorted(updated) == sorted(
        [(0x7000, 0x9000 + index, tables.native_address(index)) for index in adamw]
        + [(0x7100, 0xA001, tables.native_address(adamw[1])),
           (0x7100, 0xA002, tables.native_address(adamw[1])),
           (0x7100, 0xA003, tables.native_address(adamw[3]))])
    updated.clear()
    again = words.copy()
    again[2, ADAM_SCALAR_NAMES.index("step_size")] += 1  # only update 2's words change
    backend.set_scalars_many(adamw, ADAM_SCALAR_NAMES, again)
    assert updated == [(0x7000, 0x9000 + adamw[2], tables.native_address(adamw[2]))]
    monkeypatch.setattr(cuda_driver, "native_node_update", lambda: lambda *args: 1)
    monkeypatch.setattr(cuda_driver, "bindings", lambda: SimpleNamespace(
        CUresult=lambda status: status))
    monkeypatch.setattr(cuda_driver, "status_text", lambda driver, status: (
        "CUDA_ERROR_INVALID_VALUE", "invalid argument"))
    with pytest.raises(RunFailure, match="cuGraphExecKernelNodeSetParams"):
        backend.set_scalars_many(adamw, ADAM_SCALAR_NAMES, words[::-1].copy())


def test_the_parameter_store_is_one_array_of_aligned_views():
    blocks = [bytes(range(1, 9)), b"", bytes(range(20, 41))]
    store = ParameterStore(blocks)
    assert [bytes(store.buffer(i))[:store.size(i)] for i in range(3)] == blocks
    words = np.array([[0xAABBCCDD], [0x11223344]], np.uint32)
    assert store.write_words([0, 2], np.array([[4], [16]]), words).tolist() == [True, True]
    assert bytes(store.buffer(0)) == bytes(range(1, 5)) + words[0].tobytes()
    # The same words again change nothing: those launches' graph nodes are left alone.
    again = np.array([[0xAABBCCDD], [0x11223345]], np.uint32)
    assert store.write_words([0, 2], np.array([[4], [16]]), again).tolist() == [False, True]
    words = again
    assert bytes(store.buffer(2)) == bytes(range(20, 36)) + words[1].tobytes() + bytes([40])
    store.buffer(2)[0] = b"\xff"  # a view: what a graph node reads is the store itself
    assert bytes(store.buffer(2))[0] == 0xFF


@pytest.mark.parametrize("offset", [-4, 2, 24])
def test_a_scalar_outside_its_buffer_is_refused_and_nothing_is_written(offset):
    store = ParameterStore([bytes(8), bytes(24)])
    with pytest.raises(RunFailure, match="launch 1: a scalar's block offset is outside"):
        store.write_words([0, 1], np.array([[0], [offset]]), np.ones((2, 1), np.uint32))
    assert bytes(store.buffer(0)) == bytes(8) and bytes(store.buffer(1)) == bytes(24)


class Registry:
    """Stands in for cuMemHostRegister/Unregister: which addresses are page-locked."""

    def __init__(self):
        self.locked: dict[int, int] = {}

    def register(self, address: int, size: int) -> None:
        assert address % 4096 == 0 and address not in self.locked
        self.locked[address] = size

    def unregister(self, address: int) -> None:
        del self.locked[address]


def test_a_landing_buffer_is_reused_only_when_no_array_of_it_is_alive():
    registry = Registry()
    landing = Landing(LANDING_MIN_BYTES, registry.register, registry.unregister)
    first = landing.take()
    tables = landing.hand_out(first)[:16].view(np.float32)  # what a checkpoint keeps
    first = None
    tables[:] = 1.5
    second = landing.take()
    assert second is not None and len(registry.locked) == 2
    assert second.ctypes.data != tables.ctypes.data  # the first is still in use
    landing.hand_out(second)  # dropped at once: free again
    assert landing.take() is second
    address = tables.ctypes.data
    del tables
    assert landing.take().ctypes.data == address  # given back by the last array's end


def test_landing_buffers_are_bounded_and_closing_keeps_live_arrays_valid(monkeypatch):
    registry = Registry()
    landing = Landing(LANDING_MIN_BYTES, registry.register, registry.unregister)
    held = [landing.hand_out(landing.take()) for _ in range(landing.limit)]
    assert landing.limit >= 2 and landing.take() is None  # all in use: the staging is used
    held[0][:4] = 7
    landing.close()
    assert registry.locked == {} and landing.take() is None
    assert held[0][:4].tolist() == [7] * 4  # ordinary memory now, still the same bytes
    small = Landing(LANDING_MIN_BYTES - 1, registry.register, registry.unregister)
    huge = Landing(LANDING_BYTES, registry.register, registry.unregister)
    assert small.take() is None and huge.take() is None and registry.locked == {}


# -- on a GPU ------------------------------------------------------------------------
@pytest.fixture
def cuda_arena(cuda_arch: str):
    """choose_backend("cuda") with the arena kind asked for; the test skips without a GPU."""
    def choose(arena: str) -> BackendChoice:
        return choose_backend("cuda", arena=arena)
    return choose


def assert_same_invocations(got, want) -> None:
    """Every invocation's checkpoint tables byte for byte, and its two losses."""
    for mine, theirs in zip(got, want, strict=True):
        for name in CHECKPOINT_TENSORS:
            assert getattr(mine.checkpoint, name).tobytes() == \
                getattr(theirs.checkpoint, name).tobytes(), (name, mine.checkpoint.step)
        assert (mine.loss, mine.initial_loss) == (theirs.loss, theirs.initial_loss)


@gpu
@pytest.mark.parametrize("arena", ["device", "host"])
@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("vocab", [256, 1024])
def test_pipelined_training_on_cuda_matches_the_cpu(cuda_arena, arena, schedule, vocab):
    config = BobConfig(vocab=vocab, prompts=2, updates=3, mode="corpus", schedule=schedule,
                       pairs=typical_pairs(vocab))
    record = random_record(config, vocab)
    start = Checkpoint.zeros(vocab, Hyper(), "corpus")
    with Session(cuda_arena(arena)) as cuda, Session(choose_backend("cpu")) as cpu:
        got = train(cuda, config, start, record, 11)
        want = train(cpu, config, start, record, 11)
        assert_same_invocations(got, want)
        assert_same_tensors(cuda.plan_for(replace(config, updates=2)), cpu.last_backend,
                            cuda.last_backend, "after the remainder invocation")


@gpu
@pytest.mark.parametrize("first_step", [14_000, 60_000])
def test_seed_training_where_the_scalars_stop_changing_matches_the_cpu(cuda_arena,
                                                                       first_step):
    """Past step 16,915 the defaults' step size and epsilon round to the same binary32
    every step, so the graph's AdamW nodes are updated only where a launch's words
    changed: from 14,000 (3,000 updates) some change and the rest are left alone; from
    60,000 none changes after the first invocation."""
    config = BobConfig(vocab=256, prompts=1, updates=1000, schedule="seed")
    record = random_record(config, 7)
    start = replace(Checkpoint.zeros(256, Hyper(), "hard"), step=first_step)
    with Session(cuda_arena("device")) as cuda, Session(choose_backend("cpu")) as cpu:
        got = train(cuda, config, start, record, 3000)
        want = train(cpu, config, start, record, 3000)
        assert_same_invocations(got, want)


@gpu
@pytest.mark.parametrize("arena", ["device", "host"])
def test_a_checkpoint_streamed_from_the_cuda_arena_is_the_cpus(cuda_arena, arena, tmp_path):
    """Tables never read back whole: the save streamed from the arena (stream_read's ring)
    is the file the CPU's tables write, and a run started from that file (streamed in)
    continues to the CPU's bytes."""
    vocab = 1024
    config = BobConfig(vocab=vocab, prompts=0, updates=3, mode="corpus",
                       pairs=typical_pairs(vocab))
    record = random_record(config, 4)
    start = Checkpoint.zeros(vocab, Hyper(), "corpus")
    streamed, whole = tmp_path / "cuda.safetensors", tmp_path / "cpu.safetensors"
    with Session(choose_backend("cpu")) as cpu:
        want = train(cpu, config, start, record, 6)
        want[0].checkpoint.save(whole)
    with Session(cuda_arena(arena)) as cuda:
        (first,) = train(cuda, config, StartingPoint(start.state), record, 3,
                         tables=lambda index, done: False)
        assert first.checkpoint is None
        first.state.save(streamed, lambda sink, chunk: cuda.stream_tables(3, sink, chunk),
                         checked=True, chunk_bytes=1 << 20)
        assert streamed.read_bytes() == whole.read_bytes()
    with Session(cuda_arena(arena)) as cuda:
        resumed = StartingPoint(first.state, open_checkpoint(streamed))
        (second,) = train(cuda, config, resumed, record, 3)
    assert_same_invocations([second], want[1:])


@gpu
def test_a_write_larger_than_the_staging_chunks_lands_whole(cuda_arena):
    config = BobConfig(vocab=4096, prompts=0, updates=1)
    assert 4 * 4096 * 4096 > 2 * UPLOAD_CHUNK_BYTES  # the chunks are reused mid-write
    choice = cuda_arena("device")
    plan = build_plan(config, choice.target, compiled=choice.regions)
    table = np.random.default_rng(1).standard_normal(4096 * 4096, dtype=np.float32)
    with choice.open(plan) as backend:
        backend.write_tensor("parameters", table.tobytes())
        backend.write_tensor("first_moment", table[::-1].tobytes())
        assert backend.read_tensor("parameters") == table.tobytes()
        assert backend.read_tensor("first_moment") == table[::-1].tobytes()


@gpu
def test_a_begun_read_is_the_state_before_later_runs(cuda_arena):
    config = BobConfig(vocab=1024, prompts=0, updates=2, mode="corpus",
                       pairs=typical_pairs(1024))
    record = random_record(config, 2)
    with Session(cuda_arena("device")) as session:
        session.invoke(config, Checkpoint.zeros(1024, Hyper(), "corpus"), record, "train")
        backend = session.last_backend
        before = {name: backend.read_tensor(name) for name in CHECKPOINT_TENSORS}
        handle = backend.begin_read(CHECKPOINT_TENSORS)
        backend.start(range(backend.plan.submission_count))  # runs while the copy is made
        tables = handle.wait()
        backend.wait()
        assert backend.read_tensor("parameters") != before["parameters"]
        assert {name: tables[name].tobytes() for name in tables} == before
        again = backend.begin_read(CHECKPOINT_TENSORS).wait()  # the staging is reused
        assert again["parameters"].tobytes() == backend.read_tensor("parameters")


@gpu
@pytest.mark.smoke
@pytest.mark.parametrize("arena", ["device", "host"])
def test_a_clear_and_a_streamed_read_on_cuda_give_read_tensors_bytes(cuda_arena, arena):
    from test_nv_stream_gpu import check_clear_and_stream

    cuda_arena(arena)  # skips without a GPU
    check_clear_and_stream("cuda", arena)


@pytest.mark.parametrize("size", [0, 1, 1000, 4096, 4097, 10_000])
def test_copy_out_gives_the_bytes_in_a_buffer_of_its_own(size):
    from concurrent.futures import ThreadPoolExecutor

    source = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    address = source.ctypes.data
    with ThreadPoolExecutor(3) as pool:
        for chunk_pool, chunk in ((None, 4096), (pool, 4096), (pool, 999)):
            out = copy_out(address, size, chunk_pool, chunk)
            assert out.tobytes() == source.tobytes()
            assert not np.shares_memory(out, source)
            source[:1] ^= 0xFF  # a later change of the source is not seen
            if size:
                assert out[0] != source[0]
            source[:1] ^= 0xFF
