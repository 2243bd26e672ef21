"""PYTHONPATH=src python3 -m dev.cuda.bench_fused [--cpu] [--gpu] [--experiments]

The fused schedule and the fast CPU kernels beside the seed schedule, per
AdamW update (hard targets, from the zero table, median of 5 timings after a
warm-up; the state is reloaded before each timing, untimed):

- GPU (cuda backend): one invocation's run (one graph launch + synchronize) at
  V = 256 and 1024 (1000 updates) and V = 8192 (100 updates), seed and fused;
  at V = 8192 the bandwidth of the fused run counted at 24 bytes per parameter
  per update, beside the device-to-device copy bandwidth.
  ``--experiments`` adds the seed schedule's variants (the knob source's SEED_KEPT,
  SEED_FAST_DIVIDE, and SEED_LAUNCH_ONLY, the launches alone: wrong bytes by design) on
  cuda and nv (chained) at V = 256 and 1024 beside the shipped kernels, variants of the
  fused kernel (its tuning macros: BATCH, FUSED_BOUNDS, KEPT_EXPONENTIALS) at V = 8192,
  and all the updates in one launch rather than one launch per update at V = 2048, 4096
  and 8192. Each row ends with a digest of the trained state (equal digests, equal
  bytes), a variant's beside the shipped kernels' ("= shipped" or "DIFFERS").
- CPU (cpu backend, V = 256, 100 updates): the run with the fast kernels and
  with the NumPy reference, seed and fused, beside the plain NumPy loop a user
  would write (``dev.bench.peers.numpy_train``).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import bob.program.bob as program
from bob.backends import BackendChoice, choose_backend
from bob.backends.cpu import CpuBackend
from bob.config import Hyper
from bob.host.session import Session
from bob.kernels import reference
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint
from dev.bench.measurement import copy_bandwidth
from dev.bench.peers import bench_targets, numpy_train
from dev.cuda.variants import SHIPPED, against_shipped, shipped_and_variants, variant_choice

REPEATS = 5
BYTES_PER_PARAMETER = 24  # read + write of W, m, v: what one streaming update moves


@dataclass(frozen=True)
class Timing:
    name: str
    vocab: int
    updates: int
    seconds: float  # median of the timings of one run of `updates` updates
    loss: float | None = None
    digest: str = ""  # of the parameters, moments, gradients and losses after one run

    @property
    def us_per_update(self) -> float:
        return self.seconds / self.updates * 1e6

    def line(self, bandwidth: bool = False, shipped: str | None = None) -> str:
        """The row; `shipped`: the shipped kernels' digest, this variant's verdict."""
        text = f"{self.name:<44} V={self.vocab:<5} N={self.updates:<5} " \
               f"{self.us_per_update:10.2f} us/update"
        if bandwidth:
            rate = BYTES_PER_PARAMETER * self.vocab**2 / (self.seconds / self.updates)
            text += f"  {rate / 1e9:8.1f} GB/s at 24 B/parameter"
        if self.loss is not None:
            text += f"  loss {self.loss:.6f}"
        if self.digest:
            text += f"  state {self.digest}"
        return text + ("" if shipped is None else " " + against_shipped(self.digest, shipped))


def median_seconds(run: Callable[[], None], reset: Callable[[], None]) -> float:
    reset()
    run()  # warm-up: graph instantiation, JIT compilation
    samples = []
    for _ in range(REPEATS):
        reset()
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def time_bob(name: str, choice: BackendChoice, config: BobConfig) -> Timing:
    """Bob's run alone (backend.run over every submission) for one invocation."""
    hyper = Hyper()
    record = InputRecord.hard(bench_targets(config.vocab), (), source="bench targets")
    zero = Checkpoint.zeros(config.vocab, hyper, "hard")
    with Session(choice, hyper) as session:
        session.invoke(config, zero, record, "train")  # opens the plan, writes the scalars
        backend = session.last_backend
        assert backend is not None
        everything = range(session.plan_for(config).submission_count)
        seconds = median_seconds(lambda: backend.run(everything),
                                 lambda: Session.load(backend, zero, record))
        loss = session.collect(config, backend, zero, "train").loss
        digest = hashlib.sha256()
        for tensor in ("parameters", "first_moment", "second_moment", "gradients",
                       "training_loss"):
            digest.update(backend.read_tensor(tensor))
    return Timing(name, config.vocab, config.updates, seconds, loss, digest.hexdigest()[:12])


def cpu_choice(kernels: str) -> BackendChoice:
    """The cpu backend with its default (fast) kernels, or the NumPy reference."""
    choice = choose_backend("cpu")
    if kernels == "fast":
        return choice
    return BackendChoice("cpu", choice.target, None,
                         lambda plan: CpuBackend(plan, kernels=reference.KERNELS))


def bench_cpu() -> None:
    vocab, updates = 256, 100
    config = BobConfig(vocab=vocab, prompts=0, updates=updates)
    targets = bench_targets(vocab)
    state: list[np.ndarray] = []

    def reset() -> None:
        state[:] = [np.zeros((vocab, vocab), np.float32) for _ in range(3)]

    loop = median_seconds(lambda: numpy_train(*state, targets, updates), reset)
    rows = [Timing("numpy loop (float32, a new array per op)", vocab, updates, loop)]
    for kernels in ("fast", "reference"):
        for schedule in ("seed", "fused"):
            name = f"bob cpu {schedule} run, {kernels} kernels"
            rows.append(time_bob(name, cpu_choice(kernels), BobConfig(
                vocab=vocab, prompts=0, updates=updates, schedule=schedule)))
    print(f"CPU: {CpuBackend(program.build_plan(config)).kernel_set} kernels by default")
    for row in rows:
        print(row.line() + f"  ({loop / row.seconds:.2f}x the numpy loop)")


# The seed schedule's kernels (the knob source): their tuning macros, and the launch floor.
SEED_VARIANTS = {
    "defaults": "",
    "SEED_KEPT 1": "#define SEED_KEPT 1u\n",
    "division intrinsics (SEED_FAST_DIVIDE 0)": "#define SEED_FAST_DIVIDE 0\n",
    "launch floor (SEED_LAUNCH_ONLY: empty kernels, wrong bytes)": "#define SEED_LAUNCH_ONLY 1\n",
}


def bench_seed_variants() -> None:
    """The seed schedule (two launches per update) on cuda (graph) and nv (chained) at
    V = 256 and 1024: the shipped kernels, each variant beside them and the launches
    alone."""
    policies = {"cuda": "per-launch", "nv": "chained"}
    choices = {backend: shipped_and_variants(SEED_VARIANTS, backend) for backend in policies}
    for vocab in (256, 1024):
        for backend, policy in policies.items():
            config = BobConfig(vocab=vocab, prompts=0, updates=1000,
                               submission=policy)  # type: ignore[arg-type]
            shipped = time_bob(f"{backend} seed, {SHIPPED}", choices[backend][SHIPPED], config)
            print(shipped.line(), flush=True)
            for name, choice in choices[backend].items():
                if name != SHIPPED:
                    timing = time_bob(f"{backend} seed, {name}", choice, config)
                    print(timing.line(shipped=shipped.digest), flush=True)


VARIANTS = {
    "no launch bounds": "#define FUSED_BOUNDS\n",
    "BATCH 2": "#define BATCH 2u\n",
    "BATCH 8": "#define BATCH 8u\n",
    "no kept exponentials": "#define KEPT_EXPONENTIALS 0u\n",
}


def bench_gpu(experiments: bool) -> None:
    choice = choose_backend("cuda")
    copy = copy_bandwidth()
    if copy is not None:
        print(f"device-to-device copy: {copy / 1e9:.1f} GB/s "
              f"(a 24 B/parameter update at V = 8192 then takes "
              f"{BYTES_PER_PARAMETER * 8192**2 / copy * 1e6:.0f} us)")
    shipped_fused = ""  # the shipped fused kernels' digest at V = 8192: the variants' reference
    for vocab, updates in ((256, 1000), (1024, 1000), (8192, 100)):
        for schedule in ("seed", "fused"):
            config = BobConfig(vocab=vocab, prompts=0, updates=updates, schedule=schedule)
            timing = time_bob(f"bob cuda {schedule} run", choice, config)
            print(timing.line(bandwidth=vocab > 1024 and schedule == "fused"), flush=True)
            if (vocab, schedule) == (8192, "fused"):
                shipped_fused = timing.digest
    if not experiments:
        return
    bench_seed_variants()
    fused = BobConfig(vocab=8192, prompts=0, updates=100, schedule="fused")
    for name, macros in VARIANTS.items():
        timing = time_bob(f"fused, {name}", variant_choice(macros), fused)
        print(timing.line(bandwidth=True, shipped=shipped_fused), flush=True)
    limit = program.ONE_LAUNCH_MAX_VOCAB
    for vocab in (2048, 4096, 8192):
        config = BobConfig(vocab=vocab, prompts=0, updates=100, schedule="fused")
        for one_launch in (False, True):
            program.ONE_LAUNCH_MAX_VOCAB = 16384 if one_launch else 1024
            try:
                name = "all updates in one launch" if one_launch else "one launch per update"
                timing = time_bob(f"fused, {name}", choice, config)
            finally:
                program.ONE_LAUNCH_MAX_VOCAB = limit
            print(timing.line(bandwidth=not one_launch), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU table only")
    parser.add_argument("--gpu", action="store_true", help="the GPU table only")
    parser.add_argument("--experiments", action="store_true",
                        help="variants of the fused kernel at V = 8192 (GPU)")
    args = parser.parse_args()
    if not args.gpu:
        bench_cpu()
    if not args.cpu:
        bench_gpu(args.experiments)


if __name__ == "__main__":
    main()
