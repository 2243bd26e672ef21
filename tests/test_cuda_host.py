"""The shipped CUDA kernels, compiled for the host (tests/cuda_host.py), against the CPU's
kernels: whole invocations, every tensor byte for byte after each, on the dense and the
collapsed tables, both schedules and modes. It checks the CUDA source's arithmetic,
indexing, reductions and barriers without a GPU; what only the GPU can show (its memory
model, NVRTC's code, the launches' timing) stays with the gpu-marked tests.
"""

from __future__ import annotations

import numpy as np
import pytest

from bob.backends import choose_backend
from bob.config import Hyper
from bob.host.check import compare_backends, random_record
from bob.host.session import Session
from bob.kernels import signatures as sig
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint, TrainingState
from bob.records.collapsed import ClassIndex, CollapsedCheckpoint
from conftest import bob_config

cuda_host = pytest.importorskip("cuda_host")

F32 = np.float32


@pytest.fixture(scope="module", autouse=True)
def built():
    why = cuda_host.unavailable()
    if why:
        pytest.skip(f"the host build of the CUDA kernels cannot be made here: {why}")
    cuda_host.library()


def _same_every_invocation(config, states, record, invocations: int = 2) -> set[str]:
    """Train both sessions invocation by invocation; the regions the host build ran."""
    ran: set[str] = set()
    with Session(cuda_host.host_cuda_choice()) as host, \
            Session(choose_backend("cpu")) as cpu:
        for invocation in range(invocations):
            for i, session in enumerate((host, cpu)):
                states[i] = session.invoke(config, states[i], record, "train").checkpoint
            difference = compare_backends(host.last_backend, cpu.last_backend, invocation)
            assert difference is None, str(difference)
            assert isinstance(host.last_backend, cuda_host.HostCudaBackend)
            ran |= {launch.region for launch in host.last_backend.plan.launches}
    assert ran <= set(cuda_host.regions())
    return ran


@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize(("mode", "vocab"), [("hard", 37), ("corpus", 37), ("hard", 300),
                                             ("corpus", 300), ("hard", 1030)])
def test_dense_invocations_give_the_cpu_s_bytes(schedule: str, mode: str, vocab: int) -> None:
    """V = 37 takes the fused kernel's small-row path (two rows a block), 300 its
    register-resident one, 1030 the wide kernel; the seed schedule its two kernels."""
    config = bob_config(vocab=vocab, prompts=2, updates=3, mode=mode, schedule=schedule)
    record = random_record(config, vocab)
    ran = _same_every_invocation(config, [Checkpoint.zeros(vocab, Hyper(), mode)] * 2,
                                 record)
    fused = {name for name in ran if name.startswith("bob-fused-train")}
    assert bool(fused) == (schedule == "fused")


@pytest.mark.parametrize(("mode", "vocab", "region"), [
    ("hard", 4097, sig.FUSED_HARD), ("corpus", 4100, sig.FUSED_STREAM_CORPUS),
    ("hard", 4700, sig.FUSED_TALL_HARD), ("corpus", 5200, sig.FUSED_TALL_CORPUS),
    ("hard", 8193, sig.FUSED_HELD_HARD)])
def test_long_rows_give_the_cpu_s_bytes(mode: str, vocab: int, region: str) -> None:
    """Past the wide kernel's rows: the fused kernel's path through global memory (V =
    4097), the streamed kernel on quads (V % 4 == 0), the tall kernels (a block of 1024
    threads a hard row, 512 a corpus row), and past them the held kernel (w in dynamic
    shared memory, the row of V % 4 != 0 moved from its 16-byte boundary)."""
    config = bob_config(vocab=vocab, prompts=1, updates=2, mode=mode, schedule="fused")
    record = random_record(config, vocab)
    ran = _same_every_invocation(config, [Checkpoint.zeros(vocab, Hyper(), mode)] * 2,
                                 record, invocations=1)
    assert region in ran


def _collapsed_case(mode: str, vocab: int, heavy_row: int, seed: int):
    """Random data with two rows of `heavy_row` columns (a block each on the GPU past 96
    exceptions: row 7, and the last row, which is not its light rows' block's), rows with
    none, and a target per row in hard mode."""
    rng = np.random.default_rng(seed)
    if mode == "hard":
        targets = rng.integers(0, vocab, vocab).astype(np.uint32)
        record = InputRecord.hard(targets, prompts=[1, 5])
        keys = np.arange(vocab, dtype=np.int64) * vocab + targets
    else:
        keys = np.unique(rng.integers(0, vocab * vocab, 3 * vocab))
        heavy = [r * vocab + rng.choice(vocab, heavy_row, replace=False)
                 for r in (7, vocab - 1)]
        keys = np.unique(np.concatenate([keys, *heavy]))
        keys = keys[keys // vocab != 11]  # a row the data never names
        values = rng.random(keys.size)
        record = InputRecord.sparse(vocab, keys.astype(np.uint64),
                                    (values / values.sum()).astype(F32), prompts=[1, 5])
    index = ClassIndex.from_keys(vocab, np.unique(keys))
    state = CollapsedCheckpoint.zeros(TrainingState(vocab, 0, Hyper(), mode, ""), index)
    return record, index, state


@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize(("vocab", "heavy_row"), [(300, 200), (2053, 1500)])
def test_collapsed_invocations_give_the_cpu_s_bytes(schedule: str, mode: str, vocab: int,
                                                    heavy_row: int) -> None:
    record, index, state = _collapsed_case(mode, vocab, heavy_row, vocab)
    config = bob_config(vocab=vocab, prompts=2, updates=3, mode=mode, schedule=schedule,
                        pairs=record.pairs, tables="collapsed", exceptions=index.exceptions)
    ran = _same_every_invocation(config, [state, state], record)
    fused = {sig.COLLAPSED_FUSED_HARD, sig.COLLAPSED_FUSED_CORPUS}
    assert ran & set(sig.COLLAPSED_REGIONS) and bool(ran & fused) == (schedule == "fused")


@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_a_token_vocabulary_s_collapsed_invocations_give_the_cpu_s_bytes(schedule: str) -> None:
    """V = 50257, a Zipf-like token stream of 200k tokens (72,595 distinct pairs in 14,367
    rows of one to 4,660 exceptions, the other rows none): two invocations, every class."""
    vocab = 50257
    rng = np.random.default_rng(vocab)
    tokens = np.minimum(rng.zipf(1.2, 200_000) - 1, vocab - 1).astype(np.int64)
    keys, counts = np.unique(tokens[:-1] * vocab + tokens[1:], return_counts=True)
    record = InputRecord.sparse(vocab, keys.astype(np.uint64),
                                (counts / counts.sum()).astype(F32), prompts=[1, 5])
    index = ClassIndex.from_keys(vocab, keys)
    state = CollapsedCheckpoint.zeros(TrainingState(vocab, 0, Hyper(), "corpus", ""), index)
    config = bob_config(vocab=vocab, prompts=2, updates=2, mode="corpus", schedule=schedule,
                        pairs=record.pairs, tables="collapsed", exceptions=index.exceptions)
    ran = _same_every_invocation(config, [state, state], record)
    assert sig.COLLAPSED_LOSS_CORPUS in ran


def test_the_host_build_runs_every_region_but_the_ones_it_cannot_model() -> None:
    left_out = set(sig.SIGNATURES) - set(cuda_host.regions())
    assert left_out == set(cuda_host.LEFT_OUT_REGIONS)
    assert all(name.startswith("bob-fused-train-cluster") for name in left_out)


def test_a_kernel_that_never_reaches_its_barrier_is_reported_not_hung(tmp_path) -> None:
    """The host model's own guard: a barrier that cannot complete (it counts 128 threads
    in a block of 64) aborts with one line, rather than spinning."""
    import subprocess
    import sys

    script = tmp_path / "deadlock.py"
    script.write_text(
        "import ctypes, subprocess, cuda_host\n"
        "src = '#include \"cuda_host.h\"\\n' + r'''\n"
        "extern \"C\" void go() { cuda_host::run(dim3{1,1,1}, dim3{64,1,1}, 0, [] {\n"
        "    bob_host_counted_barrier(128); }); }\n"
        "'''\n"
        f"open({str(tmp_path / 'd.cpp')!r}, 'w').write(src)\n"
        f"subprocess.run([cuda_host.compiler(), *cuda_host.COMPILER_FLAGS, '-I', "
        f"{str(cuda_host.HERE)!r}, '-o', {str(tmp_path / 'd.so')!r}, "
        f"{str(tmp_path / 'd.cpp')!r}], check=True)\n"
        f"ctypes.CDLL({str(tmp_path / 'd.so')!r}).go()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(cuda_host.HERE), "PATH": "/usr/bin:/bin"},
                          timeout=300, check=False)
    assert done.returncode != 0
    assert "cuda_host: block 0 deadlocked at a barrier" in done.stderr


def test_the_ptx_the_host_replaces_is_still_in_the_source() -> None:
    """host_source refuses a kernel source whose inline PTX it would not replace."""
    source = cuda_host.host_source()
    assert "bob_host_rcp_approx_ftz(b)" in source and "asm(\"rcp" not in source
