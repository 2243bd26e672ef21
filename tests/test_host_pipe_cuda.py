"""Issue 13 on the CUDA backend: staged writes, the snapshot read-back, start/wait, the
scalar rows. The `gpu` tests need a GPU; the first runs anywhere (no driver call)."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import numpy as np
import pytest

from bob.backends import BackendChoice, choose_backend
from bob.backends.base import Backend
from bob.backends.cuda import (
    UPLOAD_CHUNK_BYTES,
    CudaBackend,
    ParameterStore,
    _LaunchArguments,
    kernel_parameters,
)
from bob.backends.landing import LANDING_BYTES, LANDING_MIN_BYTES, Landing
from bob.config import CHECKPOINT_TENSORS, Hyper
from bob.errors import RunFailure
from bob.host.check import random_record
from bob.host.session import Session, train
from bob.plan.model import Scalar
from bob.plan.placement import TARGETS
from bob.program.bob import ADAM_SCALAR_NAMES, BobConfig, adam_scalar_table, build_plan
from bob.records.checkpoint import Checkpoint
from conftest import assert_same_tensors

gpu = pytest.mark.gpu


def _driverless_cuda(plan) -> CudaBackend:
    """A CudaBackend's host-side state for `plan`, opened without the driver: the kernel
    parameter buffers as _open builds them, no graphs (so no node is updated)."""
    backend = object.__new__(CudaBackend)
    Backend.__init__(backend, plan)  # the blocks' bookkeeping, no allocation
    backend._closed = False
    backend._graphs = {}
    backend._arguments = {}
    backend._store = ParameterStore([
        kernel_parameters(plan, plan.region(launch.region), backend.parameter_block(index),
                          0x7f00_0000_0000) for index, launch in enumerate(plan.launches)])
    for index in range(plan.launch_count):
        backend._arguments[index] = _LaunchArguments(
            backend._store.buffer(index), ctypes.c_size_t(backend._store.size(index)), None,
            None, None, None)
    return backend


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
        assert bytes(one._arguments[index].buffer) == bytes(many._arguments[index].buffer)
        assert one.parameter_block(index) == many.parameter_block(index)
    assert bytes(many._arguments[launches[0]].buffer) != bytes(
        _driverless_cuda(plan)._arguments[launches[0]].buffer)  # something did change


def test_the_parameter_store_is_one_array_of_aligned_views():
    blocks = [bytes(range(1, 9)), b"", bytes(range(20, 41))]
    store = ParameterStore(blocks)
    assert [bytes(store.buffer(i))[:store.size(i)] for i in range(3)] == blocks
    words = np.array([[0xAABBCCDD], [0x11223344]], np.uint32)
    store.write_words([0, 2], np.array([[4], [16]]), words)
    assert bytes(store.buffer(0)) == bytes(range(1, 5)) + words[0].tobytes()
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


@gpu
@pytest.mark.parametrize("arena", ["device", "host"])
@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("vocab", [256, 1024])
def test_pipelined_training_on_cuda_matches_the_cpu(cuda_arena, arena, schedule, vocab):
    config = BobConfig(vocab=vocab, prompts=2, updates=3, mode="corpus", schedule=schedule)
    record = random_record(config, vocab)
    start = Checkpoint.zeros(vocab, Hyper(), "corpus")
    with Session(cuda_arena(arena)) as cuda, Session(choose_backend("cpu")) as cpu:
        got = train(cuda, config, start, record, 11)
        want = train(cpu, config, start, record, 11)
        for mine, theirs in zip(got, want, strict=True):
            for name in CHECKPOINT_TENSORS:
                assert getattr(mine.checkpoint, name).tobytes() == \
                    getattr(theirs.checkpoint, name).tobytes(), (name, mine.checkpoint.step)
            assert (mine.loss, mine.initial_loss) == (theirs.loss, theirs.initial_loss)
        assert_same_tensors(cuda.plan_for(replace(config, updates=2)), cpu.last_backend,
                            cuda.last_backend, "after the remainder invocation")


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
    config = BobConfig(vocab=1024, prompts=0, updates=2, mode="corpus")
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


@pytest.mark.parametrize("size", [0, 1, 1000, 4096, 4097, 10_000])
def test_copy_out_gives_the_bytes_in_a_buffer_of_its_own(size):
    from concurrent.futures import ThreadPoolExecutor

    from bob.backends.cuda import copy_out

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
