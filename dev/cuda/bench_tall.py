"""PYTHONPATH=src python3 -m dev.cuda.bench_tall [--variants]   (B=cuda VS=8192 N=100)

The fused schedule's tall kernels (bob-fused-train-tall(-corpus), a row on chip per block)
at V = 8192: one invocation of N = 100 updates, hard and corpus, from the zero table
(reloaded, untimed, before each run), the median of three runs after a warm-up, in us
per update (docs/BENCHMARKS.md). Each row ends with the digest of the state one run
leaves (parameters, moments, gradients, losses): equal digests, equal bytes.

Then the check: from a random table (row 0 all zeros, so the literal max's fallback runs
too), N = 3 updates at V = 4608 and 8192 (CHECK_VS), hard and corpus, with the plan's tall
kernels from that V in both modes (corpus rows of 4608 stream by default), the digests of
each kernel beside those of the CPU backend; a row that differs from the CPU says DIFFERS.

``--variants`` (cuda): beside the shipped kernels, every entry of VARIANTS (the knob
source's TALL_* macros, dev/cuda/bob_kernels.cu), each compiled into this process, timed
(its digest beside the shipped kernels') and checked the same way; a variant that does not
compile (a spill: regions refuse a stack frame) is named and skipped.

B picks the backend: B=cpu runs the same logic on the cpu backend (no GPU, no variants)
at a small V, e.g. ``B=cpu VS=300 CHECK_VS=300 N=3`` to check the script itself.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

import bob.program.bob as program
from bob.backends import BackendChoice, choose_backend
from bob.config import Hyper, Mode
from bob.host.session import Session
from bob.plan.certificate import require_certified
from bob.program.bob import BobConfig, build_plan
from dev.bench.measurement import time_runs
from dev.cuda.variants import SHIPPED, fused, load_input, shipped_and_variants, state_digest

# name -> the #defines put in front of the knob source. The first is its defaults: the shipped
# kernels' shapes.


def both(threads: int, unguarded: int = 0, flags: str = "") -> str:
    """#defines giving both modes' tall kernels one shape (the knob source)."""
    return (f"#define TALL_HARD_THREADS {threads}u\n#define TALL_CORPUS_THREADS {threads}u\n"
            f"#define TALL_HARD_UNGUARDED {unguarded}\n"
            f"#define TALL_CORPUS_UNGUARDED {unguarded}\n{flags}")


EVERY_WARP = "#define TALL_EVERY_WARP_TREE 1\n"
NO_CHAIN = "#define TALL_REGISTER_CHAIN 0\n"
FAST = "#define TALL_FAST_DIVIDE 1\n"
VARIANTS = {
    "defaults (hard: 1024 threads unguarded; corpus: 512 with the register chain)": "",
    "1024 threads x 8": both(1024),
    "1024 threads, every warp runs the tree": both(1024, 0, EVERY_WARP),
    "1024 threads, unguarded arithmetic": both(1024, 1),
    "1024 threads, unguarded, every warp runs the tree": both(1024, 1, EVERY_WARP),
    "512 threads x 16, register chain": both(512),
    "512 threads x 16, register chain, every warp runs the tree": both(512, 0, EVERY_WARP),
    "512 threads x 16 (weights held, corpus full path)": both(512, 0, NO_CHAIN),
    "512 threads x 16, every warp runs the tree": both(512, 0, NO_CHAIN + EVERY_WARP),
    "512 threads x 16, weights read from L1, corpus counted":
        both(512, 0, NO_CHAIN + "#define TALL_HOLD_WEIGHTS 0\n#define TALL_CORPUS_FULL 0\n"),
    "512 threads x 16, weights held, corpus counted":
        both(512, 0, NO_CHAIN + "#define TALL_CORPUS_FULL 0\n"),
    "fast divide (adamw_together), chunks of 2": FAST + "#define TALL_FAST_CHUNK 2u\n",
    "fast divide, chunks of 4, hard at 512 threads": (
        FAST + "#define TALL_HARD_THREADS 512u\n#define TALL_FAST_CHUNK 4u\n"),
}
MODES: tuple[Mode, ...] = ("hard", "corpus")


@dataclass(frozen=True)
class TallRun:
    config: BobConfig
    seconds: float | None  # per update: the median run; None for a check (untimed)
    digest: str  # of DIGEST_TENSORS after one run from the start state
    region: str
    block: int

    def line(self, name: str, reference: str | None = None, against: str = "cpu") -> str:
        """The row; `reference`: the digest of `against` (the cpu backend, or the shipped
        kernels), this row's verdict."""
        config = self.config
        head = f"V={config.vocab} {config.mode:<6} N={config.updates} {name}: "
        timing = f"{self.seconds * 1e6:8.1f} us/update; " if self.seconds is not None else ""
        verdict = ""
        if reference is not None:
            verdict = (f" = {against}" if self.digest == reference
                       else f" DIFFERS from {against} {reference}")
        return (f"{head}{timing}{self.region} x{self.block} threads; "
                f"state {self.digest}{verdict}")


def start_parameters(vocab: int, random: bool) -> bytes:
    """Zeros (the timed runs, as the recorded figures), or a seeded normal table whose row
    0 is all zeros: rows with distinct maxima and one whose maximum is a zero."""
    if not random:
        return bytes(4 * vocab * vocab)
    table = np.random.default_rng(3).standard_normal((vocab, vocab), dtype=np.float32)
    table[0] = 0.0
    return table.tobytes()


def run_tall(choice: BackendChoice, config: BobConfig, timed: bool) -> TallRun:
    """Timed: a warm-up and three runs from the zero table. Untimed: one run from the
    random table. Either way the digest is of the state one run from the start leaves."""
    plan = build_plan(config, choice.target, Hyper(), compiled=choice.regions)
    backend = choice.open(require_certified(plan))
    try:
        parameters = start_parameters(config.vocab, random=not timed)
        first = load_input(backend, config)

        def reset() -> None:
            backend.write_tensor("parameters", parameters)
            for name in ("first_moment", "second_moment"):
                backend.write_tensor(name, bytes(plan.tensor(name).bytes))
            Session(choice).write_update_scalars(config, backend, 1)

        def run() -> None:
            backend.run(range(first, plan.submission_count))

        seconds = None
        if timed:
            seconds = statistics.median(time_runs(run, reset, repeats=3)) / config.updates
        reset()  # the digest of exactly one run from the start
        run()
        region = config.fused_region(choice.target)
        fused = next(launch for launch in plan.launches if launch.region == region)
        return TallRun(config, seconds, state_digest(backend), region, fused.block.x)
    finally:
        backend.close()


def sizes(variable: str, default: str) -> tuple[int, ...]:
    return tuple(int(v) for v in os.environ.get(variable, default).split(","))


@contextlib.contextmanager
def tall_from(vocab: int) -> Iterator[None]:
    """The plan's tall kernels from `vocab` in both modes (corpus rows of 4608 stream by
    default): the check runs the kernels under test."""
    shipped = program.TALL_FROM_VOCAB
    program.TALL_FROM_VOCAB = {mode: min(start, vocab) for mode, start in shipped.items()}
    try:
        yield
    finally:
        program.TALL_FROM_VOCAB = shipped


def bench(choices: dict[str, BackendChoice], cpu: Callable[[], BackendChoice]) -> None:
    """Every choice timed (SHIPPED first: each variant's digest beside its), then each
    checked against the cpu backend."""
    updates = int(os.environ.get("N", "100"))
    for vocab in sizes("VS", "8192"):
        for mode in MODES:
            config = fused(vocab, mode, updates)
            shipped = run_tall(choices[SHIPPED], config, timed=True)
            print(shipped.line(SHIPPED), flush=True)
            for name, choice in choices.items():
                if name != SHIPPED:
                    run = run_tall(choice, config, timed=True)
                    print(run.line(name, shipped.digest, SHIPPED), flush=True)
    reference_choice = cpu()
    for vocab in sizes("CHECK_VS", "4608,8192"):
        for mode in MODES:
            config = fused(vocab, mode, 3)
            with tall_from(vocab):
                reference = run_tall(reference_choice, config, timed=False)
                print(reference.line("cpu backend"), flush=True)
                for name, choice in choices.items():
                    print(run_tall(choice, config, timed=False).line(name, reference.digest),
                          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", action="store_true",
                        help="every TALL_* variant of the kernels, timed and checked (cuda)")
    parser.add_argument("--only", metavar="TEXT",
                        help="with --variants: only the variants whose name holds TEXT")
    args = parser.parse_args()
    backend = os.environ.get("B", "cuda")
    if args.variants and backend != "cuda":
        print("--variants needs B=cuda: the variants are CUDA kernels", file=sys.stderr)
        return 2
    chosen = {name: macros for name, macros in VARIANTS.items()
              if args.only is None or args.only in name}
    choices = shipped_and_variants(chosen) if args.variants else {
        SHIPPED: choose_backend(backend)}
    bench(choices, lambda: choose_backend("cpu"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
