"""The nv runtime stream and faults on a GPU (marked `gpu`; the lead runs them on an H200).

    pytest -m gpu tests/test_nv_stream_gpu.py -v -s

Each test prints what it measured (-s shows it): record those lines with the run.
The CPU side of the same machinery is tests/test_nv_stream.py.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from bob.backends.nv.rm import structs as s
from bob.plan.model import Scalar
from conftest import needs_nvrtc
from trap_plan import TRAP_MAGIC, expected_out, one_launch_plan, trap_regions

nv_present = pytest.mark.skipif(not os.path.exists(s.CONTROL_DEVICE),
                                reason="no NVIDIA kernel driver here")
FAULT_SECONDS = 10.0  # "a few seconds": well under the 30 s submission deadline


@pytest.fixture(scope="module")
def trap_region():
    return trap_regions("sm_90")["test-trap"]


def _out(backend) -> list[int]:
    return np.frombuffer(backend.read_tensor("out"), np.uint32).tolist()


# -- nv ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@nv_present
@needs_nvrtc
def test_nv_trap_ends_in_one_line_and_the_next_backend_works(trap_region):
    from bob.backends.nv.rm.backend import NvBackend
    from bob.backends.nv.rm.ioctl import ChannelError

    backend = NvBackend(one_launch_plan(trap_region, TRAP_MAGIC))
    started = time.monotonic()
    with pytest.raises(ChannelError) as raised:
        backend.run(range(1))
    elapsed = time.monotonic() - started
    message = str(raised.value)
    print(f"nv trap: {elapsed:.3f} s: {message}")
    assert elapsed < FAULT_SECONDS
    assert "\n" not in message
    assert message.startswith("launch 0 (trap-test-0) failed with channel error ")
    assert backend.channel is None and backend.blocks == {}  # torn down
    backend.close()
    with NvBackend(one_launch_plan(trap_region, 0x1000)) as again:  # same process
        again.run(range(1))
        assert _out(again) == expected_out(0x1000)


@pytest.mark.gpu
@nv_present
@needs_nvrtc
def test_nv_copy_engine_read_back_across_2_to_the_32(trap_region):
    """A 1 MiB tensor (the copy-engine threshold) read back by copy engine, the runtime
    counter starting just below 2**32 and crossing it; BAR1 agrees with every copy."""
    from bob.backends.nv.rm.backend import NvBackend

    blocks = (1 << 20) // (4 * 128)
    with NvBackend(one_launch_plan(trap_region, 7, blocks=blocks),
                   counter_start=2**32 - 3) as backend:
        for round_ in range(6):
            magic = 0x100 * round_
            backend.set_scalars(0, {"magic": Scalar.u32(magic)})
            backend.run(range(1))
            started = time.perf_counter()
            got = backend.read_tensor("out")
            seconds = time.perf_counter() - started
            assert backend.stream.copies, backend.stream.copy_refused
            assert np.frombuffer(got, np.uint32).tolist() == expected_out(magic, blocks)
            start = backend._arena_offset("out", 0, len(got))
            assert got == backend.blocks["arena"].read(start, len(got))  # BAR1 agrees
            print(f"round {round_}: counter {backend.stream.completed:#x}, 1 MiB by copy "
                  f"engine in {seconds * 1e6:.0f} us")
        assert backend.stream.completed > 2**32
        zeros = bytes(len(got))
        backend.write_tensor("out", zeros)  # a large write goes through the copy engine too
        assert backend.blocks["arena"].read(start, len(got)) == zeros


@pytest.mark.gpu
@nv_present
@needs_nvrtc
def test_nv_100k_launches_in_one_process_do_not_hang(trap_region):
    from bob.backends.nv.rm.backend import NvBackend

    plan = one_launch_plan(trap_region, 3, launches=1)
    runs = 100_000
    with NvBackend(plan, deadline_s=10) as backend:
        started = time.monotonic()
        for _ in range(runs):
            backend.run(range(1))
        elapsed = time.monotonic() - started
        assert _out(backend) == expected_out(3)
    print(f"{runs} launches (one submission each) in {elapsed:.2f} s, "
          f"{elapsed / runs * 1e6:.1f} us per run")


@pytest.mark.gpu
@nv_present
@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_nv_profile_counts_equal_the_plans(schedule):
    _check_profile_counts("nv", schedule)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_cuda_profile_counts_equal_the_plans(cuda_arch, schedule):
    _check_profile_counts("cuda", schedule)


def _check_profile_counts(backend: str, schedule: str) -> None:
    from bob.cli.profile_cmd import profiled_invocation, region_times
    from bob.program.bob import BobConfig

    config = BobConfig(vocab=256, prompts=0, updates=100, schedule=schedule)  # type: ignore[arg-type]
    plan, times = profiled_invocation(backend, config)
    planned: dict[str, int] = {}
    for submission in plan.submissions:
        for launch in submission.launches:
            region = plan.launches[launch].region
            planned[region] = planned.get(region, 0) + 1
    rows = region_times(plan, times)
    assert {row.region: row.launches for row in rows} == planned
    assert [launch for launch, _ in times] == [launch for submission in plan.submissions
                                               for launch in submission.launches]
    for row in rows:
        assert row.total_ns > 0
        print(f"{backend} {schedule}: {row.region}: {row.launches} launches, "
              f"mean {row.mean_ns / 1000:.2f} us, max {row.max_ns / 1000:.2f} us")


# -- cuda -------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_nvrtc
def test_cuda_trap_poisons_the_context_and_the_next_backend_gets_a_fresh_one(cuda_arch):
    from bob.backends.cuda import STICKY_ERRORS, CudaBackend, CudaError

    compiled = trap_regions(cuda_arch)
    region = compiled["test-trap"]
    backend = CudaBackend(one_launch_plan(region, TRAP_MAGIC, arch=cuda_arch), compiled)
    started = time.monotonic()
    with pytest.raises(CudaError) as raised:
        backend.run(range(1))
    elapsed = time.monotonic() - started
    print(f"cuda trap: {elapsed:.3f} s: {raised.value}")
    assert raised.value.status in STICKY_ERRORS
    assert "\n" not in str(raised.value) and elapsed < FAULT_SECONDS
    assert backend._closed
    again = CudaBackend(one_launch_plan(region, 0x2000, arch=cuda_arch), compiled)
    try:
        again.run(range(1))
        assert _out(again) == expected_out(0x2000)
    finally:
        again.close()


@pytest.mark.gpu
@needs_nvrtc
def test_cuda_profiled_trap_is_detected_and_profiling_works_after(cuda_arch):
    from bob.backends.cuda import STICKY_ERRORS, CudaBackend, CudaError

    compiled = trap_regions(cuda_arch)
    region = compiled["test-trap"]
    plan = one_launch_plan(region, TRAP_MAGIC, arch=cuda_arch)
    backend = CudaBackend(plan, compiled)
    backend.launch_times = []
    with pytest.raises(CudaError) as raised:
        backend.run(range(1))
    assert raised.value.status in STICKY_ERRORS
    ok = CudaBackend(one_launch_plan(region, 5, arch=cuda_arch), compiled)
    try:
        ok.launch_times = []
        ok.run(range(1))
        assert [launch for launch, _ in ok.launch_times] == [0]
        assert _out(ok) == expected_out(5)
    finally:
        ok.close()
