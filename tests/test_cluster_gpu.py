"""Rows held by thread-block clusters, launched by the backends, byte for byte against the
CPU: cuda's graph nodes with their cluster dimension, and nv's QMDs of GPC clusters.

    PYTHONPATH=src:. python -m pytest -m gpu tests/test_cluster_gpu.py -s    # on an H200

- V = 256, 1000, 1024, 8191 and 8192, hard and corpus: every tensor after two invocations
  (2 updates, then 1) against the seed schedule on the CPU, for the kernels the program
  chooses (on cuda and nv) and for the cluster kernels at that V (the program made to take
  them wherever a cluster holds the row: dev/cuda/clusters.py), on cuda and on nv.
- V = 21553, 50257 and 65536, hard and corpus: one invocation of 2 updates on the whole
  table, sampled rows (the first, the last, the first rows of the second round of
  clusters) against the NumPy reference run on those rows alone; the program's own choice
  is the cluster kernels at 50257 and at 65536 corpus, at 21553 the held ones and, made
  to, the cluster ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import pytest

import bob.kernels.signatures as sig
from bob.backends import BackendChoice, choose_backend
from bob.config import Hyper
from bob.errors import BackendUnavailable, BobError
from bob.host.check import compare_backends, random_record
from bob.host.session import Session, split_updates
from bob.plan.certificate import require_certified
from bob.plan.model import Plan
from bob.program.bob import WEIGHTS_TENSOR, BobConfig, adam_scalar_table, build_plan
from bob.records.checkpoint import Checkpoint
from dev.cuda.clusters import clusters_wherever_they_fit, nv_with_clusters
from large_vocab import Rows, fused_rows_reference
from test_vocab64_gpu import dense_rows, sparse_record

pytestmark = pytest.mark.gpu

SMALL = [256, 1000, 1024, 8191, 8192]
STEPS, PER_INVOCATION = 3, 2  # two invocations: 2 updates, then 1
# The nv backend's cluster launches, once one has failed: the rest are skipped (a launch
# that faults or hangs would fail each the same way, a deadline each).
NV_CLUSTERS_FAILED: list[str] = []


@dataclass(frozen=True)
class Snapshot:
    """A backend's tensors after an invocation, kept to compare later runs against."""

    plan: Plan
    tensors: dict[str, bytes]

    def read_tensor(self, name: str) -> bytes:
        return self.tensors[name]


def start_table(vocab: int, seed: int) -> np.ndarray:
    """A random table with row 0 all zeros (ties: the literal lane-order max)."""
    parameters = np.random.default_rng(seed).standard_normal((vocab, vocab), dtype=np.float32)
    parameters[0] = 0.0
    return parameters


def invocations(choice: BackendChoice, config: BobConfig, seed: int) -> Iterator[Snapshot]:
    """STEPS updates in invocations of PER_INVOCATION from the start table: the backend's
    tensors after each (the fused schedule, or the config's)."""
    record = random_record(config, seed)
    state = replace(Checkpoint.zeros(config.vocab, Hyper(), config.mode),
                    parameters=start_table(config.vocab, seed))
    with Session(choice) as session:
        for updates in split_updates(STEPS, PER_INVOCATION):
            state = session.invoke(replace(config, updates=updates), state, record,
                                   "train").checkpoint
            backend = session.last_backend
            assert backend is not None
            yield Snapshot(backend.plan, {tensor.name: backend.read_tensor(tensor.name)
                                          for tensor in backend.plan.tensors})


def cpu_reference(config: BobConfig, seed: int) -> list[Snapshot]:
    return list(invocations(choose_backend("cpu"), replace(config, schedule="seed"), seed))


def same_as(reference: list[Snapshot], choice: BackendChoice, config: BobConfig,
            seed: int) -> str:
    """Run `choice` as the reference ran; the kernel it ran, after checking every tensor."""
    fused = replace(config, schedule="fused")
    region = fused.fused_region(choice.target)
    with Session(choice) as session:
        plan = session.plan_for(fused)
    require_certified(plan)
    for number, (want, got) in enumerate(zip(reference, invocations(choice, fused, seed),
                                             strict=True)):
        difference = compare_backends(want, got, number)  # type: ignore[arg-type]
        assert difference is None, f"{choice.name} {region} {config}: {difference}"
    clustered = {launch.cluster for launch in plan.launches if launch.region == region}
    return f"{region} in clusters of {max(clustered)}" if clustered != {1} else region


def small_config(vocab: int, mode: str) -> BobConfig:
    return BobConfig(vocab=vocab, prompts=1, updates=PER_INVOCATION, mode=mode,  # type: ignore[arg-type]
                     schedule="seed", pairs=8 * vocab if mode == "corpus" else 0)


def gpu_choice(name: str) -> BackendChoice:
    try:
        return nv_with_clusters() if name == "nv clusters" else choose_backend(name)
    except BackendUnavailable as why:
        pytest.skip(str(why))


@pytest.mark.parametrize(("vocab", "mode"), [
    pytest.param(vocab, mode, marks=[pytest.mark.smoke] if (vocab, mode) == (1000, "corpus")
                 else []) for vocab in SMALL for mode in ("hard", "corpus")])
def test_cuda_s_kernels_and_its_clusters_give_the_cpu_s_bytes(vocab: int, mode: str) -> None:
    cuda = gpu_choice("cuda")
    config = small_config(vocab, mode)
    reference = cpu_reference(config, vocab)
    ran = [same_as(reference, cuda, config, vocab)]
    with clusters_wherever_they_fit():
        ran.append(same_as(reference, cuda, config, vocab))
    assert sig.FUSED_CLUSTER_HARD in ran[-1] or sig.FUSED_CLUSTER_CORPUS in ran[-1]
    nv = None
    with contextlib.suppress(BackendUnavailable):
        nv = choose_backend("nv")
    if nv is not None:
        ran.append(same_as(reference, nv, config, vocab))
    print(f"V={vocab} {mode}: cuda {ran[0]}; cuda {ran[1]}"
          + (f"; nv {ran[2]}" if nv is not None else "") + ": identical to the cpu")


@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab", SMALL)
def test_nv_s_cluster_launches_give_the_cpu_s_bytes(vocab: int, mode: str) -> None:
    """The nv backend on the target with clusters: QMD_TYPE GRID_GPC_CGA, the cluster's CTAs
    in GPC_CGA_WIDTH and the driver area's cluster words."""
    if NV_CLUSTERS_FAILED:
        pytest.skip(f"an nv cluster launch failed before: {NV_CLUSTERS_FAILED[0]}")
    nv = gpu_choice("nv clusters")
    config = small_config(vocab, mode)
    reference = cpu_reference(config, vocab)
    try:
        with clusters_wherever_they_fit():
            ran = same_as(reference, nv, config, vocab)
    except (AssertionError, BobError) as error:
        NV_CLUSTERS_FAILED.append(f"V={vocab} {mode}: {str(error).splitlines()[0][:400]}")
        raise
    print(f"V={vocab} {mode}: nv {ran}: identical to the cpu")


@pytest.mark.parametrize("name", ["cuda", "nv clusters"])
def test_a_profiled_cluster_launch_gives_the_bytes_of_a_run(name: str) -> None:
    """`profile` launches each kernel alone (cuda: cuLaunchKernelEx with the cluster
    dimension; nv: one QMD a submission): the bytes of `run`, and a time for each launch."""
    if name == "nv clusters" and NV_CLUSTERS_FAILED:
        pytest.skip(f"an nv cluster launch failed before: {NV_CLUSTERS_FAILED[0]}")
    choice = gpu_choice(name)
    config = BobConfig(vocab=1000, prompts=1, updates=2, mode="hard", schedule="fused")
    with clusters_wherever_they_fit():
        plan = build_plan(config, choice.target, Hyper(), compiled=choice.regions)
    record, table = random_record(config, 1), start_table(1000, 1)
    results, times = [], []
    for timed in (False, True):
        with choice.open(require_certified(plan)) as backend:
            backend.write_tensor("input", record.payload())
            backend.write_tensor("parameters", table.tobytes())
            backend.write_tensor("adam_scalars", adam_scalar_table(Hyper(), 1, 2).tobytes())
            if timed:
                times = backend.profile(range(plan.submission_count))
            else:
                backend.run(range(plan.submission_count))
            results.append({tensor.name: backend.read_tensor(tensor.name)
                            for tensor in plan.tensors})
    assert results[0] == results[1]
    clustered = {index for index, launch in enumerate(plan.launches) if launch.cluster > 1}
    timed_clusters = [nanoseconds for index, nanoseconds in times if index in clustered]
    assert clustered and len(timed_clusters) == len(clustered) and min(timed_clusters) > 0
    print(f"{name}: profiled {len(times)} launches, the cluster ones "
          f"{[round(ns / 1e3, 1) for ns in timed_clusters]} us: the bytes of a run")


# -- V = 21553 and 50257: sampled rows ------------------------------------------------------

PATTERN_ROWS = 512  # the start table repeats a random block of this many rows


def checked_rows(vocab: int, clusters: int) -> np.ndarray:
    """The first rows, the first of the second round (cluster 0's second row), the middle
    and the last rows."""
    return np.unique(np.array([0, 1, clusters - 1, clusters, clusters + 1, vocab // 2 + 3,
                               vocab - 2, vocab - 1]))


def sampled_rows_equal_the_reference(choice: BackendChoice, vocab: int, mode: str) -> str:
    """One invocation of 2 updates on a V x V table whose rows repeat a random block; the
    checked rows of every table, their losses and initial losses against the reference."""
    updates = 2
    rng = np.random.default_rng(vocab)
    prompt = np.array([vocab - 1], np.uint32)
    record = sparse_record(rng, vocab, prompt) if mode == "corpus" else None
    config = BobConfig(vocab=vocab, prompts=1, updates=updates, mode=mode,  # type: ignore[arg-type]
                       schedule="fused", pairs=0 if record is None else record.pairs)
    region = config.fused_region(choice.target)
    plan = build_plan(config, choice.target, Hyper(), compiled=choice.regions)
    fused = [launch for launch in plan.launches if launch.region == region]
    clusters = fused[0].grid.x // fused[0].cluster if region in sig.CLUSTER_SLICES else 1
    checked = checked_rows(vocab, clusters)
    pattern = (rng.random((PATTERN_ROWS, vocab), dtype=np.float32) - np.float32(0.5)) \
        * np.float32(8)
    pattern[0] = 0.0  # rows 0, 512, ...: ties
    targets = rng.integers(0, vocab, vocab, dtype=np.uint32)
    targets[vocab - 1] = vocab - 1
    steps = adam_scalar_table(Hyper(), 1, updates)
    row_bytes = 4 * vocab
    with choice.open(require_certified(plan)) as backend:
        for first in range(0, vocab, PATTERN_ROWS):
            rows = min(PATTERN_ROWS, vocab - first)
            backend.write_tensor("parameters", pattern[:rows].reshape(-1).view(np.uint8),
                                 offset=first * row_bytes)
        backend.clear_tensors(["first_moment", "second_moment"])
        if record is None:
            backend.write_tensor("input", targets.tobytes() + prompt.tobytes())
        else:  # the pairs, scattered by the load submission into the cleared table
            backend.write_tensor("input", record.payload())
            backend.clear_tensors([WEIGHTS_TENSOR])
        backend.write_tensor("adam_scalars", steps.tobytes())
        backend.run(range(plan.submission_count))

        def rows_of(name: str) -> np.ndarray:
            return np.stack([np.frombuffer(backend.read_tensor(name, int(r) * row_bytes,
                                                               row_bytes), np.float32)
                             for r in checked])

        got = {name: rows_of(name) for name in ("parameters", "first_moment", "second_moment",
                                                  "gradients")}
        loss = np.frombuffer(backend.read_tensor("training_loss"), np.float32)
        weights = rows_of(WEIGHTS_TENSOR) if record is not None else None
    start = pattern[checked % PATTERN_ROWS]
    zero = np.zeros_like(start)
    if record is None:
        rows = Rows(start, zero, zero, targets=targets[checked])
    else:
        assert weights is not None
        assert weights.tobytes() == dense_rows(record, checked).tobytes()
        rows = Rows(start, zero, zero, weights=weights)
    want = fused_rows_reference(rows, steps, vocab)
    for name, expected in zip(("parameters", "first_moment", "second_moment", "gradients"),
                              want, strict=False):
        assert got[name].tobytes() == expected.tobytes(), (
            f"V={vocab} {mode} {region}: {name} of rows {checked.tolist()}")
    assert loss[checked].tobytes() == want[4].tobytes()
    assert np.isfinite(loss).all()
    where = f"in clusters of {fused[0].cluster}" if region in sig.CLUSTER_SLICES else "alone"
    return f"{region} {where}, rows {checked.tolist()}"


@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize(("vocab", "clusters"), [(21553, False), (21553, True), (50257, False),
                                                  (65536, False)])
def test_large_rows_on_cuda_equal_the_reference_rows(vocab: int, clusters: bool,
                                                     mode: str) -> None:
    cuda = gpu_choice("cuda")
    with clusters_wherever_they_fit() if clusters else contextlib.nullcontext():
        ran = sampled_rows_equal_the_reference(cuda, vocab, mode)
    if vocab == 50257 or (vocab == 65536 and mode == "corpus"):  # the program's choice
        assert "cluster" in ran
    print(f"V={vocab} {mode}: cuda {ran}: identical to the reference")


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_gpt2_sized_rows_on_nv_s_clusters_equal_the_reference_rows(mode: str) -> None:
    if NV_CLUSTERS_FAILED:
        pytest.skip(f"an nv cluster launch failed before: {NV_CLUSTERS_FAILED[0]}")
    ran = sampled_rows_equal_the_reference(gpu_choice("nv clusters"), 50257, mode)
    assert "cluster" in ran
    print(f"V=50257 {mode}: nv {ran}: identical to the reference")
