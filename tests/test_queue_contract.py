"""The queue contract every backend keeps (bob.backends.base), on the CPU backends: a clear
and a streamed read give what `read_tensor` gives, a clear is ordered after the work
started before it, a stream holds a few chunks of host memory and never a table, and
timing launches is a capability a backend declares. The same contract on the nv backend
over the scripted driver: tests/test_nv_stream.py; on the cuda backend's primitives with a
driver over host memory: tests/test_cuda_reads.py.

    PYTHONPATH=src .venv/bin/python -m pytest -q tests/test_queue_contract.py
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from bob.backends import Backend, choose_backend, spec
from bob.errors import RunFailure
from bob.host.check import random_record
from bob.plan.model import Plan
from bob.program.bob import HEALTH_TENSOR, BobConfig, build_plan

BACKENDS = ("cpu", "nv-sim")
CHECKPOINT = ("parameters", "first_moment", "second_moment")
CLEARED = ("training_loss", HEALTH_TENSOR, "gradients")


def _opened(name: str, config: BobConfig) -> tuple[Plan, Backend]:
    choice = choose_backend(name)
    plan = build_plan(config, choice.target, compiled=choice.regions)
    return plan, choice.open(plan)


def _filled(backend: Backend, seed: int = 0) -> dict[str, bytes]:
    """Every tensor written with random bytes; what was written."""
    rng = np.random.default_rng(seed)
    written = {}
    for tensor in backend.plan.tensors:
        data = rng.integers(1, 256, tensor.bytes, np.uint8).tobytes()  # no zero byte
        backend.write_tensor(tensor.name, data)
        written[tensor.name] = data
    return written


@pytest.mark.parametrize("name", BACKENDS)
def test_a_clear_zeroes_its_tensors_and_nothing_else(name):
    plan, backend = _opened(name, BobConfig(vocab=64, prompts=2, updates=2))
    with backend:
        written = _filled(backend)
        backend.clear_tensors(CLEARED)
        for tensor in plan.tensors:
            want = bytes(tensor.bytes) if tensor.name in CLEARED else written[tensor.name]
            assert backend.read_tensor(tensor.name) == want, tensor.name
        with pytest.raises(KeyError, match="no tensor named 'nope'"):
            backend.clear_tensors(["parameters", "nope"])  # checked before any byte goes
        assert backend.read_tensor("parameters") == written["parameters"]
        backend.clear_tensors([])


@pytest.mark.parametrize("name", BACKENDS)
def test_a_clear_is_ordered_after_the_work_started_before_it(name):
    """Training writes the training loss; a clear queued after the run leaves it zero, one
    queued before the run is overwritten by it, as a write would be."""
    config = BobConfig(vocab=64, prompts=1, updates=2)
    plan, backend = _opened(name, config)
    with backend:
        backend.write_tensor("input", random_record(config, 3).payload())
        zeros = bytes(plan.tensor("training_loss").bytes)
        backend.clear_tensors(["training_loss"])
        backend.start(range(plan.submission_count))
        backend.wait()
        trained = backend.read_tensor("training_loss")
        assert trained != zeros  # the run wrote it after the clear
        backend.start(range(plan.submission_count))
        backend.clear_tensors(["training_loss"])
        backend.wait()
        assert backend.read_tensor("training_loss") == zeros


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("chunk", [7, 4096, 1 << 20])
def test_a_streamed_read_gives_read_tensors_bytes_in_arena_order(name, chunk):
    plan, backend = _opened(name, BobConfig(vocab=64, prompts=2, updates=2))
    with backend:
        _filled(backend, chunk)
        names = [HEALTH_TENSOR, *reversed(CHECKPOINT), "predictions"]
        got: dict[str, bytearray] = {}
        order: list[str] = []

        def sink(tensor: str, offset: int, view: np.ndarray) -> None:
            assert view.dtype == np.uint8 and view.ndim == 1 and 0 < view.size <= chunk
            if tensor not in got:
                order.append(tensor)
                got[tensor] = bytearray()
            assert offset == len(got[tensor])  # each tensor's chunks in turn, from 0
            got[tensor] += view.tobytes()

        backend.stream_read(names, sink, chunk)
        assert order == sorted(names, key=lambda n: plan.tensor(n).address)
        assert {n: bytes(data) for n, data in got.items()} == \
            {n: backend.read_tensor(n) for n in names}
        backend.stream_read([], sink, chunk)  # nothing to read: no call


@pytest.mark.parametrize("name", BACKENDS)
def test_a_streamed_read_holds_a_few_chunks_of_host_memory_not_a_table(name):
    plan, backend = _opened(name, BobConfig(vocab=1024, prompts=0, updates=1))
    chunk = 64 << 10
    tables = sum(plan.tensor(n).bytes for n in CHECKPOINT)
    assert tables >= 150 * chunk  # 12 MiB of tables
    with backend:
        _filled(backend)
        sums: list[int] = []
        tracemalloc.start()
        try:
            backend.stream_read(CHECKPOINT, lambda _, __, view: sums.append(int(view[0])),
                                chunk)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(sums) == tables // chunk
        assert peak < 8 * chunk, f"{peak} bytes held for a stream of {tables}"


@pytest.mark.parametrize("chunk", [0, -1, True, 1.5, "64"])
def test_a_stream_refuses_a_chunk_that_is_not_a_positive_integer(chunk):
    _, backend = _opened("cpu", BobConfig(vocab=64, prompts=0, updates=1))
    with backend, pytest.raises(ValueError, match="chunk_bytes must be a positive integer"):
        backend.stream_read(CHECKPOINT, lambda *_: None, chunk)


@pytest.mark.parametrize("name", BACKENDS)
def test_timing_launches_is_a_declared_capability(name):
    plan, backend = _opened(name, BobConfig(vocab=64, prompts=0, updates=1))
    with backend:
        assert backend.can_profile is spec(name).can_profile is False
        with pytest.raises(RunFailure, match=f"^the {name} backend cannot time its launches$"):
            backend.profile(range(plan.submission_count))


def test_the_gpu_backends_declare_what_their_specs_say():
    from bob.backends.cuda import CudaBackend
    from bob.backends.nv.rm.backend import NvBackend

    for backend in (CudaBackend, NvBackend):
        assert backend.can_profile is spec(backend.name).can_profile is True


def test_a_run_outside_the_plan_is_refused_by_start_and_profile():
    plan, backend = _opened("cpu", BobConfig(vocab=64, prompts=0, updates=1))
    count = plan.submission_count
    with backend:
        with pytest.raises(RunFailure, match=f"^submission {count} is not in the plan's"):
            backend.start(range(count + 1))
        with pytest.raises(TypeError, match="a range of submissions, not list"):
            backend.start([0])  # type: ignore[arg-type]
