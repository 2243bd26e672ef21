"""PYTHONPATH=src python3 -m dev.cuda.bench_small [--variants]   (B=cuda VS=256,255,128 N=1000)

The fused schedule at small V, where one launch runs every update of an invocation on the
small-row path of bob_kernels.cu (one block per row, V <= 256): per update, the median of
three runs after a warm-up, hard targets and corpus weights, each run from the same
pseudo-random table (written, untimed, before it). B picks the backend, VS the sizes, N the
updates (B=cpu VS=100 N=20 checks the script without a GPU). Each row ends with the digest
of the state a run leaves (parameters, moments, gradients, losses): equal digests, equal
bytes. Then the same at N = 20 beside the cpu backend's digest (the reference).

``--variants`` (cuda): the shipped kernels, then the small path's tuning macros (the knob
source, dev/cuda/bob_kernels.cu: SMALL_THREADS, SMALL_FAST_DIVIDE, SMALL_FULL_ROWS), each
compiled into this process and timed the same way, its digest beside the shipped kernels'
("= shipped" or "DIFFERS"); then each digest at N = 20 against the cpu backend's:
"identical" or "DIFFERS".
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from dataclasses import dataclass

import numpy as np

from bob.backends import BackendChoice, choose_backend
from bob.config import MIN_VOCAB, Hyper, Mode
from bob.errors import BadInput, BobError
from bob.host.session import Session
from bob.plan.certificate import require_certified
from bob.program.bob import BobConfig, build_plan
from dev.bench.measurement import time_runs
from dev.cuda.variants import (
    SHIPPED,
    against_shipped,
    fused,
    load_input,
    shipped_and_variants,
    state_digest,
)

# Name -> the #defines put in front of the knob source.
VARIANTS = {
    "128 threads, fast divide, full rows (default)": "",
    "128 threads (the previous default)":
        "#define SMALL_FAST_DIVIDE 0\n#define SMALL_FULL_ROWS 0\n",
    "128 threads, fast divide": "#define SMALL_FULL_ROWS 0\n",
    "64 threads":
        "#define SMALL_THREADS 64u\n#define SMALL_FAST_DIVIDE 0\n#define SMALL_FULL_ROWS 0\n",
    "64 threads, fast divide": "#define SMALL_THREADS 64u\n#define SMALL_FULL_ROWS 0\n",
    "64 threads, fast divide, full rows": "#define SMALL_THREADS 64u\n",
    "32 threads":
        "#define SMALL_THREADS 32u\n#define SMALL_FAST_DIVIDE 0\n#define SMALL_FULL_ROWS 0\n",
    "32 threads, fast divide": "#define SMALL_THREADS 32u\n#define SMALL_FULL_ROWS 0\n",
    "32 threads, fast divide, full rows": "#define SMALL_THREADS 32u\n",
}
MODES: tuple[Mode, ...] = ("hard", "corpus")
CHECK_UPDATES = 20
SMALL_VOCAB = 256  # the small-row path's rows: V <= 256


@dataclass(frozen=True)
class SmallRun:
    config: BobConfig
    seconds: float | None  # per update, the median run; None where only the digest was taken
    digest: str  # of DIGEST_TENSORS after one run from the start state

    def line(self, name: str, shipped: str | None = None) -> str:
        """The row; `shipped`: the shipped kernels' digest, this variant's verdict."""
        config = self.config
        time = "" if self.seconds is None else f" {self.seconds * 1e6:.3f} us/update;"
        verdict = "" if shipped is None else " " + against_shipped(self.digest, shipped)
        return (f"V={config.vocab} {config.mode} N={config.updates} {name}:{time} "
                f"state {self.digest}{verdict}")


def start_parameters(vocab: int) -> bytes:
    """Standard normal rows, and row 0 all zero: a tie whose maximum is a zero, so the
    kernels' literal max tree runs too."""
    table = np.random.default_rng(14).standard_normal((vocab, vocab), dtype=np.float32)
    table[0] = 0.0
    return table.tobytes()


def run_small(choice: BackendChoice, config: BobConfig, timed: bool) -> SmallRun:
    """The start state, then one run (its digest), timed as a warm-up and three runs."""
    plan = build_plan(config, choice.target, Hyper(), compiled=choice.regions)
    backend = choice.open(require_certified(plan))
    try:
        parameters = start_parameters(config.vocab)
        zeros = bytes(len(parameters))
        first = load_input(backend, config)
        Session(choice).write_update_scalars(config, backend, 1)

        def reset() -> None:
            backend.write_tensor("parameters", parameters)
            backend.write_tensor("first_moment", zeros)
            backend.write_tensor("second_moment", zeros)

        run = functools.partial(backend.run, range(first, plan.submission_count))
        seconds = None
        if timed:
            samples = time_runs(run, reset, repeats=3)
            seconds = statistics.median(samples) / config.updates
        else:
            reset()
            run()
        return SmallRun(config, seconds, state_digest(backend))
    finally:
        backend.close()


def check_against_cpu(choices: dict[str, BackendChoice], sizes: tuple[int, ...]) -> int:
    """Each choice's digest at N = CHECK_UPDATES beside the cpu backend's; the differing."""
    cpu = choose_backend("cpu")
    differing = 0
    for vocab in sizes:
        for mode in MODES:
            config = fused(vocab, mode, CHECK_UPDATES)
            reference = run_small(cpu, config, timed=False).digest
            for name, choice in choices.items():
                digest = run_small(choice, config, timed=False).digest
                verdict = "identical" if digest == reference else "DIFFERS"
                differing += digest != reference
                print(f"V={vocab} {mode} N={CHECK_UPDATES} {name}: state {digest}, "
                      f"cpu {reference}: {verdict}", flush=True)
    return differing


def bench(choices: dict[str, BackendChoice], sizes: tuple[int, ...], updates: int) -> int:
    """Every choice timed (SHIPPED first: each variant's digest beside its), then the check
    against the cpu backend; the count of differing digests."""
    differing = 0
    for vocab in sizes:
        for mode in MODES:
            shipped = run_small(choices[SHIPPED], fused(vocab, mode, updates), timed=True)
            print(shipped.line(SHIPPED), flush=True)
            for name, choice in choices.items():
                if name != SHIPPED:
                    run = run_small(choice, fused(vocab, mode, updates), timed=True)
                    differing += run.digest != shipped.digest
                    print(run.line(name, shipped.digest), flush=True)
    return differing + check_against_cpu(choices, sizes)


def settings() -> tuple[tuple[int, ...], int]:
    """VS and N from the environment: sizes within the small path, N >= 1."""
    try:
        sizes = tuple(int(v) for v in os.environ.get("VS", "256,255,128").split(","))
        updates = int(os.environ.get("N", "1000"))
    except ValueError as error:
        raise BadInput(f"VS and N must be integers: {error}") from None
    if not all(MIN_VOCAB <= v <= SMALL_VOCAB for v in sizes) or updates < 1:
        raise BadInput(f"VS must lie in [{MIN_VOCAB}, {SMALL_VOCAB}] and N be >= 1, not "
                       f"VS={','.join(map(str, sizes))} N={updates}")
    return sizes, updates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", action="store_true",
                        help="the small path's tuning macros, timed and checked (cuda)")
    args = parser.parse_args()
    try:
        sizes, updates = settings()
        if args.variants:
            choices = shipped_and_variants(VARIANTS)
        else:
            choices = {SHIPPED: choose_backend(os.environ.get("B", "cuda"))}
        differing = bench(choices, sizes, updates)
    except BobError as error:
        print(f"bench_small: {error}", file=sys.stderr)
        return error.exit_status
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
