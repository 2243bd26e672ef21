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
@needs_nvrtc
def test_nv_queued_read_is_the_state_before_later_runs_and_writes():
    """A read queued behind a run gives the state the run left, though a write and the
    next run were queued after it; the host waited for none of them. The read is large
    enough to be detached: its snapshot is what the run left."""
    from bob.backends import choose_backend
    from bob.config import CHECKPOINT_TENSORS, Hyper
    from bob.host.check import random_record
    from bob.host.session import Session
    from bob.program.bob import BobConfig, typical_pairs
    from bob.records.checkpoint import Checkpoint

    config = BobConfig(vocab=1024, prompts=0, updates=2, mode="corpus", submission="chained",
                       pairs=typical_pairs(1024))
    record = random_record(config, 2)
    with Session(choose_backend("nv")) as session:
        session.invoke(config, Checkpoint.zeros(1024, Hyper(), "corpus"), record, "train")
        backend = session.last_backend
        count = backend.plan.submission_count
        backend.run(range(count))
        before = {name: backend.read_tensor(name) for name in CHECKPOINT_TENSORS}
        backend.start(range(count))
        handle = backend.begin_read(CHECKPOINT_TENSORS)  # queued behind the run
        zeros = bytes(backend.plan.tensor("training_loss").bytes)
        backend.write_tensor("training_loss", zeros)  # staged, queued behind the read
        backend.start(range(count))  # and the next run behind that
        assert backend._stream.pending  # the host has not waited
        tables = handle.wait()
        backend.wait()
        after = {name: backend.read_tensor(name) for name in CHECKPOINT_TENSORS}
        assert all(tables[name].tobytes() != before[name] for name in CHECKPOINT_TENSORS)
        assert all(tables[name].tobytes() != after[name] for name in CHECKPOINT_TENSORS)
        assert backend.read_tensor("training_loss") != zeros  # the last run wrote it again
        for name in CHECKPOINT_TENSORS:  # one run from `before`, waited for: the same bytes
            backend.write_tensor(name, before[name])
        backend.run(range(count))
        assert all(tables[name].tobytes() == backend.read_tensor(name)
                   for name in CHECKPOINT_TENSORS)
        stream = backend._stream
        # 16 MB: detached (a snapshot by the copy kernels, the copy out on the copy channel)
        assert stream.detach_refused == "" and stream.reads >= 1
        assert stream.completed_reads == stream.reads
        print(f"queued read of {sum(len(t) for t in tables.values()):,} bytes; "
              f"{stream.counter} runtime items, {stream.reads} detached reads on copy engine "
              f"type {stream.copy_channel.engine:#x}")


def check_clear_and_stream(name: str, arena: str = "device") -> None:
    """A clear queued behind a run, then a streamed read of the tables behind it (from a
    snapshot where there is room, so the next run may start beside it): the bytes
    `read_tensor` gives, the cleared tensors zero."""
    from bob.backends import choose_backend
    from bob.config import CHECKPOINT_TENSORS, Hyper
    from bob.host.check import random_record
    from bob.host.session import Session
    from bob.program.bob import HEALTH_TENSOR, BobConfig, typical_pairs
    from bob.records.checkpoint import Checkpoint

    config = BobConfig(vocab=2048, prompts=0, updates=2, mode="corpus",
                       submission="chained" if name == "nv" else "per-launch",
                       pairs=typical_pairs(2048))
    record = random_record(config, 4)
    with Session(choose_backend(name, arena=arena)) as session:
        session.invoke(config, Checkpoint.zeros(2048, Hyper(), "corpus"), record, "train")
        backend = session.last_backend
        count = backend.plan.submission_count
        backend.start(range(count))
        backend.clear_tensors(["training_loss", HEALTH_TENSOR])  # behind the run
        got: dict[str, bytearray] = {}
        started = time.perf_counter()
        backend.stream_read(CHECKPOINT_TENSORS, lambda tensor, offset, view: got.setdefault(
            tensor, bytearray()).extend(view.tobytes()), 4 << 20)
        seconds = time.perf_counter() - started
        backend.wait()
        assert list(got) == list(CHECKPOINT_TENSORS)
        assert all(bytes(got[n]) == backend.read_tensor(n) for n in CHECKPOINT_TENSORS)
        for cleared in ("training_loss", HEALTH_TENSOR):
            assert backend.read_tensor(cleared) == bytes(backend.plan.tensor(cleared).bytes)
        print(f"{name} ({arena}): {sum(len(t) for t in got.values()):,} bytes streamed in "
              f"4 MiB chunks in {seconds * 1e3:.1f} ms")


@pytest.mark.gpu
@pytest.mark.smoke
@nv_present
@needs_nvrtc
def test_nv_clear_and_streamed_read_give_read_tensors_bytes():
    check_clear_and_stream("nv")


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
    from bob.host.profiling import profiled_invocation, region_times
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


# A sticky fault leaves the whole process unable to use the GPU through CUDA on the H200's
# driver (the primary context reset, and a new context, both answer
# CUDA_ERROR_LAUNCH_FAILED), so each cuda fault runs in a process of its own: the test
# process stays usable for the GPU tests after it.
CUDA_TRAP_SCRIPT = """
import sys, time
sys.path[:0] = [{tests!r}]
import numpy as np
from bob.backends.cuda import STICKY_ERRORS, CudaBackend, CudaError
from trap_plan import TRAP_MAGIC, expected_out, one_launch_plan, trap_regions

arch, profiled = sys.argv[1], sys.argv[2] == "profiled"
compiled = trap_regions(arch)
region = compiled["test-trap"]
backend = CudaBackend(one_launch_plan(region, TRAP_MAGIC, arch=arch), compiled)
run = backend.profile if profiled else backend.run
started = time.monotonic()
try:
    run(range(1))
    print("trap: no error")
except CudaError as error:
    print(f"trap: {{time.monotonic() - started:.3f}} s {{error.status in STICKY_ERRORS}} "
          f"closed={{backend._closed}} {{error}}")
try:
    again = CudaBackend(one_launch_plan(region, 5, arch=arch), compiled)
except CudaError as error:
    print(f"next: refused {{error}}")
else:
    (again.profile if profiled else again.run)(range(1))
    out = np.frombuffer(again.read_tensor("out"), np.uint32).tolist()
    print(f"next: ran {{out == expected_out(5)}}")
    again.close()
"""


def _cuda_trap_in_a_process(arch: str, profiled: bool) -> tuple[str, str]:
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).parent)
    script = CUDA_TRAP_SCRIPT.format(tests=tests)
    done = subprocess.run([sys.executable, "-c", script, arch,
                           "profiled" if profiled else "graph"],
                          capture_output=True, text=True, timeout=120)
    print(done.stdout.strip())
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 2, done.stdout + done.stderr
    return lines[0], lines[1]


@pytest.mark.gpu
@needs_nvrtc
@pytest.mark.parametrize("how", ["graph", "profiled"])
def test_cuda_trap_is_one_line_and_the_next_backend_runs_or_says_to_restart(cuda_arch, how):
    """The trap ends in one sticky-error line within FAULT_SECONDS and closes the backend;
    the next backend then runs the plan correctly, or (where the driver keeps the process
    poisoned) is refused in one line that says to restart the process."""
    trap, after = _cuda_trap_in_a_process(cuda_arch, how == "profiled")
    words = trap.split()
    assert words[0] == "trap:" and float(words[1]) < FAULT_SECONDS, trap
    assert words[3:5] == ["True", "closed=True"], trap
    assert after == "next: ran True" or (
        after.startswith("next: refused ") and after.endswith("restart the process)")), after
