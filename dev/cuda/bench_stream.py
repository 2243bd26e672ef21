"""PYTHONPATH=src python3 -m dev.cuda.bench_stream [--variants]   (B=cuda VS=32768,65536)

The fused schedule past the tall kernels' rows, where a row no longer fits one SM and
every update moves it through DRAM: the held kernels (the row's w in shared memory) and
the stream kernels (w read three times). Per V: invocations of N = 2 and N = 6 updates on
zero tables (written once; the timings reuse the state), each the median of three runs
after a warm-up. Two figures per row (docs/BENCHMARKS.md):

- invocation: the N = 6 invocation over its 6 updates. An invocation also runs the initial
  loss, the finish (gradients and loss of the final table, in the last update's launch)
  and the health check: at N = 2 these weigh as much as an update.
- per update: (T(6) - T(2)) / 4, the time one more update adds (the held kernels run all
  of an invocation's updates in one launch, the stream kernels one launch each): the
  path itself, as bandwidth at 24 bytes per parameter beside the device-to-device copy.

B picks the backend, VS the sizes (B=cpu VS=300 checks the script without a GPU). With
DIGEST=1 each row ends with the digest of the state the runs leave (at V = 32768 that
reads 16 GB back).

``--variants`` (cuda): the shipped held and stream kernels, then their tuning macros (the
knob source in dev/cuda, bob_held.cuh: HELD_THREADS, HELD_DEPTH, HELD_UPDATE_DEPTH,
HELD_KEEP_EXPONENTIALS, HELD_FAST_DIVIDE, HELD_L2_PREFETCH, HELD_L2_PREFETCH_EACH,
HELD_L2_AHEAD, HELD_RUNNING_MAX, HELD_W_LIMIT, HELD_PREFETCH_CHUNK; bob_kernels.cu:
STREAM_VECTOR, STREAM_FAST_DIVIDE, VECTOR_DEPTH, UPDATE_DEPTH, STREAM_BOUNDS,
KEPT_EXPONENTIALS, STREAM_CACHE_HINTS), each compiled into this process and timed the
same way at V = 32768 (and 65536 with BIG=1), hard targets; then the digests alone of
V = 4100 (hard and corpus, N = 20: every update in one launch) and 8196 (N = 2) for the
shipped kernels and a few variants, each variant's beside the shipped kernels' ("= shipped"
or "DIFFERS").
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import bob.program.bob as program
from bob.backends import Backend, BackendChoice, choose_backend
from bob.config import Hyper, Mode
from bob.host.session import Session
from bob.plan.certificate import require_certified
from bob.program.bob import BobConfig, build_plan
from dev.bench.measurement import copy_bandwidth, time_runs
from dev.bench.tables import BYTES_PER_PARAMETER
from dev.cuda import variants
from dev.cuda.variants import (
    SHIPPED,
    against_shipped,
    load_input,
    shipped_and_variants,
    state_digest,
)

SHORT, LONG = 2, 6  # the two invocations whose difference is LONG - SHORT updates

KERNELS = ("held", "stream")
# name -> (the kernels: "held" or "stream", the #defines put in front of the knob source)
VARIANTS = {
    "held (defaults)": ("held", ""),
    "held, no kept exponentials": ("held", "#define HELD_KEEP_EXPONENTIALS 0\n"),
    "held, element by element (HELD_FAST_DIVIDE 0)": ("held", "#define HELD_FAST_DIVIDE 0\n"),
    "held, HELD_UPDATE_DEPTH 1": ("held", "#define HELD_UPDATE_DEPTH 1u\n"),
    "held, 768 threads": ("held", "#define HELD_THREADS 768u\n#define HELD_UPDATE_DEPTH 1u\n"
                                  "#define HELD_DEPTH 2u\n#define HELD_RUNNING_MAX 0\n"
                                  "#define HELD_KEEP_EXPONENTIALS 0\n"
                                  "#define HELD_PREFETCH_CHUNK 6144u\n"),
    "held, a max pass every update (HELD_RUNNING_MAX 0)": ("held",
                                                           "#define HELD_RUNNING_MAX 0\n"),
    "held, m and v asked into L2 at a row's first update only": (
        "held", "#define HELD_L2_PREFETCH_EACH 0\n"),
    "held, at most 45056 of w held (HELD_W_LIMIT)": ("held", "#define HELD_W_LIMIT 45056u\n"),
    "held, no L2 prefetch": ("held", "#define HELD_L2_PREFETCH 0u\n#define HELD_L2_AHEAD 0u\n"),
    "held, 2/8 of m and v asked into L2 first, none ahead": (
        "held", "#define HELD_L2_PREFETCH 2u\n#define HELD_L2_AHEAD 0u\n"),
    "held, 2/8 first, 4 rounds ahead": ("held", "#define HELD_L2_PREFETCH 2u\n"
                                                "#define HELD_L2_AHEAD 4u\n"),
    "stream (defaults: vector)": ("stream", ""),
    "stream, fast divide, 3 blocks/SM": ("stream", "#define STREAM_FAST_DIVIDE 1\n"
                                         "#define STREAM_BOUNDS __launch_bounds__(256, 3)\n"),
    "stream, cache hints": ("stream", "#define STREAM_CACHE_HINTS 1\n"),
    "stream, evict-last w": ("stream", "#define STREAM_CACHE_HINTS 2\n"),
    "stream, scalar twin (STREAM_VECTOR 0)": ("stream", "#define STREAM_VECTOR 0\n"),
    "stream, VECTOR_DEPTH 2": ("stream", "#define VECTOR_DEPTH 2u\n"),
}
DIGEST_VARIANTS = ("held (defaults)", "held, 768 threads", "held, no L2 prefetch",
                   "stream (defaults: vector)", "stream, fast divide, 3 blocks/SM")
DIGEST_CASES = ((4100, "hard", 20), (4100, "corpus", 20), (8196, "hard", 2))


@dataclass(frozen=True)
class StreamRun:
    config: BobConfig  # of the long invocation
    invocation: float  # seconds per update of the long invocation
    update: float  # seconds one more update adds: (T(LONG) - T(SHORT)) / (LONG - SHORT)
    digest: str  # of DIGEST_TENSORS after the long invocation's runs
    launches: int  # of the long invocation
    region: str  # its fused region

    def line(self, name: str, copy: float | None) -> str:
        vocab = self.config.vocab
        rate = BYTES_PER_PARAMETER * vocab * vocab / self.update
        share = f" = {rate / copy:.1%} of the copy" if copy else ""
        return (f"V={vocab} {self.config.mode} {name}: {self.update * 1e3:.3f} ms per update "
                f"({rate / 1e9:.0f} GB/s at {BYTES_PER_PARAMETER} B/parameter{share}); "
                f"invocation of N={self.config.updates} {self.invocation * 1e3:.3f} ms/update, "
                f"{self.launches} launches of {self.region}; state {self.digest}")


@contextlib.contextmanager
def invocation(choice: BackendChoice,
               config: BobConfig) -> Iterator[tuple[Backend, Callable[[], None], int]]:
    """The backend on the config's plan from zero tables, its input loaded and its first
    update's scalars written: (the backend, a run of the invocation, its launches)."""
    plan = build_plan(config, choice.target, Hyper(), compiled=choice.regions)
    backend = choice.open(require_certified(plan))
    try:
        # Zero tables cleared on the device: at V = 65536 three 16 GiB uploads of zeros
        # took longer than the runs.
        backend.clear_tensors(["parameters", "first_moment", "second_moment"])
        first = load_input(backend, config)
        Session(choice).write_update_scalars(config, backend, 1)
        yield (backend, functools.partial(backend.run, range(first, plan.submission_count)),
               plan.launch_count)
    finally:
        backend.close()


def time_invocation(choice: BackendChoice, config: BobConfig,
                    digest: bool) -> tuple[float, str, int]:
    """A warm-up and three timed runs of the invocation, in turn: the median's seconds, the
    state's digest (unless `digest` is false) and the launches."""
    with invocation(choice, config) as (backend, run, launches):
        seconds = statistics.median(time_runs(run, lambda: None, repeats=3))
        return seconds, state_digest(backend) if digest else "not digested", launches


def run_stream(choice: BackendChoice, config: BobConfig, digest: bool = False) -> StreamRun:
    """The invocations of SHORT and config.updates (LONG) updates, timed apart."""
    short, _, _ = time_invocation(choice, fused(config.vocab, config.mode, SHORT), False)
    long, state, launches = time_invocation(choice, config, digest)
    return StreamRun(config, long / config.updates,
                     (long - short) / (config.updates - SHORT), state, launches,
                     config.fused_region(choice.target))


def digest_only(choice: BackendChoice, config: BobConfig) -> str:
    _, state, _ = time_invocation(choice, config, True)
    return state


def fused(vocab: int, mode: Mode = "hard", updates: int = LONG) -> BobConfig:
    return variants.fused(vocab, mode, updates)


@contextlib.contextmanager
def with_kernels(kernels: str):
    """The plan picks the held kernels (from V = 4097, any V) or the stream ones past the
    tall kernels' rows, inside the block."""
    held_from, held_to = program.HELD_FROM_VOCAB, program.held_to_vocab
    if kernels == "stream":
        program.HELD_FROM_VOCAB = program.MAX_VOCAB + 1
    else:
        program.HELD_FROM_VOCAB = 4097
        program.held_to_vocab = lambda mode, target: program.MAX_VOCAB
    try:
        yield
    finally:
        program.HELD_FROM_VOCAB, program.held_to_vocab = held_from, held_to


def of_kernels(choices: dict[str, BackendChoice], kernels: str) -> dict[str, BackendChoice]:
    """The shipped kernels (as `kernels, shipped`), then the variants of these kernels."""
    return {f"{kernels}, {SHIPPED}": choices[SHIPPED],
            **{name: choice for name, choice in choices.items()
               if name != SHIPPED and VARIANTS[name][0] == kernels}}


def bench_variants(copy: float | None) -> int:
    """Each choice timed, then the digests: the count that differ from the shipped kernels'."""
    sizes = (32768, 65536) if os.environ.get("BIG") == "1" else (32768,)
    choices = shipped_and_variants({name: macros for name, (_, macros) in VARIANTS.items()})
    for vocab in sizes:
        for kernels in KERNELS:
            with with_kernels(kernels):
                for name, choice in of_kernels(choices, kernels).items():
                    print(run_stream(choice, fused(vocab)).line(name, copy), flush=True)
    differing = 0
    for vocab, mode, updates in DIGEST_CASES:
        config = fused(vocab, mode, updates)
        head = f"V={vocab} {mode} N={updates}"
        region = config.fused_region(choices[SHIPPED].target)
        for kernels in KERNELS:
            with with_kernels(kernels):
                shipped = digest_only(choices[SHIPPED], config)
                print(f"{head} {kernels}, {SHIPPED} ({region}): state {shipped}",
                      flush=True)
                for name in DIGEST_VARIANTS:
                    if VARIANTS[name][0] != kernels or name not in choices:
                        continue
                    digest = digest_only(choices[name], config)
                    differing += digest != shipped
                    print(f"{head} {name} ({region}): state {digest} "
                          f"{against_shipped(digest, shipped)}", flush=True)
    return differing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", action="store_true",
                        help="the held and stream kernels' tuning macros, timed and digested "
                             "(cuda)")
    args = parser.parse_args()
    copy = copy_bandwidth()
    print("device-to-device copy: " + (f"{copy / 1e9:.1f} GB/s" if copy else
                                       "not measured (needs PyTorch with CUDA)"), flush=True)
    if args.variants:
        return 1 if bench_variants(copy) else 0
    choice = choose_backend(os.environ.get("B", "cuda"))
    digest = os.environ.get("DIGEST") == "1"
    for vocab in (int(v) for v in os.environ.get("VS", "32768,65536").split(",")):
        for kernels in KERNELS:
            with with_kernels(kernels):
                config = fused(vocab)
                print(run_stream(choice, config, digest).line(kernels, copy), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
