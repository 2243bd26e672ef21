"""PYTHONPATH=src python3 bench/bench_stream.py [--variants]   (B=cuda VS=32768,65536 by default)

The fused schedule's streaming path at large V: one invocation of N = 2 updates on zero
tables (written once; the timings reuse the state), the median of three runs after a
warm-up, as bandwidth at 24 bytes per parameter beside the device-to-device copy
(docs/BENCHMARKS.md, issue 14). B picks the backend, VS the sizes (B=cpu VS=300 checks
the script without a GPU). Each row ends with the digest of the state the runs leave
(parameters, moments, gradients, losses): equal digests, equal bytes.

``--variants`` (cuda): the stream kernels' tuning macros (bob_kernels.cu: STREAM_VECTOR,
STREAM_FAST_DIVIDE, VECTOR_DEPTH, UPDATE_DEPTH, STREAM_BOUNDS, KEPT_EXPONENTIALS), each
compiled into this process, timed the same way at V = 32768 (and 65536 with BIG=1), hard
targets; then the digests alone of V = 4100 (hard and corpus, N = 20: the stream kernels,
every update in one launch) and V = 8193 (N = 2: the narrow kernels' scalar path, which
the macros leave alone) for the vector path, its fast-divide variant and its scalar twin
(STREAM_VECTOR 0).
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
from dataclasses import dataclass

from bob.backends import BackendChoice, choose_backend
from bob.bench.measurement import time_runs
from bob.bench.suite import copy_bandwidth
from bob.bench.tables import BYTES_PER_PARAMETER
from bob.bench.variants import compiled_variants, input_bytes, state_digest
from bob.config import Hyper, Mode
from bob.host.session import Session
from bob.plan.certificate import require_certified
from bob.program.bob import BobConfig, build_plan

VARIANTS = {
    "vector (default)": "",
    "vector, fast divide, 3 blocks/SM (STREAM_FAST_DIVIDE 1)":
        "#define STREAM_FAST_DIVIDE 1\n#define STREAM_BOUNDS __launch_bounds__(256, 3)\n",
    "scalar twin (STREAM_VECTOR 0)": "#define STREAM_VECTOR 0\n",
    "vector, VECTOR_DEPTH 2": "#define VECTOR_DEPTH 2u\n",
    "vector, 3 blocks/SM": "#define STREAM_BOUNDS __launch_bounds__(256, 3)\n",
    "vector, 2 blocks/SM, VECTOR_DEPTH 8, UPDATE_DEPTH 2":
        "#define STREAM_BOUNDS __launch_bounds__(256, 2)\n#define VECTOR_DEPTH 8u\n"
        "#define UPDATE_DEPTH 2u\n",
    "vector, no kept exponentials": "#define KEPT_EXPONENTIALS 0u\n",
}
DIGEST_VARIANTS = ("vector (default)", "vector, fast divide, 3 blocks/SM (STREAM_FAST_DIVIDE 1)",
                   "scalar twin (STREAM_VECTOR 0)")
DIGEST_CASES = ((4100, "hard", 20), (4100, "corpus", 20), (8193, "hard", 2))


@dataclass(frozen=True)
class StreamRun:
    config: BobConfig
    seconds: float  # per update: the median run over config.updates
    digest: str  # of DIGEST_TENSORS after the warm-up and the timed runs
    launches: int

    def line(self, name: str, copy: float | None) -> str:
        vocab = self.config.vocab
        rate = BYTES_PER_PARAMETER * vocab * vocab / self.seconds
        share = f" = {rate / copy:.1%} of the copy" if copy else ""
        return (f"V={vocab} {self.config.mode} N={self.config.updates} {name}: "
                f"{self.seconds * 1e3:.3f} ms/update, {rate / 1e9:.0f} GB/s at "
                f"{BYTES_PER_PARAMETER} B/parameter{share}; {self.launches} launches of "
                f"{self.config.fused_region}; state {self.digest}")






def run_stream(choice: BackendChoice, config: BobConfig) -> StreamRun:
    """Zero tables, then a warm-up and three timed runs of the invocation, in turn."""
    plan = build_plan(config, choice.target, Hyper(), compiled=choice.regions)
    backend = choice.open(require_certified(plan))
    try:
        for name in ("parameters", "first_moment", "second_moment"):
            backend.write_tensor(name, bytes(plan.tensor(name).bytes))
        backend.write_tensor("input", input_bytes(config, plan.tensor("input").bytes))
        Session(choice).write_update_scalars(config, backend, 1)
        run = functools.partial(backend.run, range(plan.submission_count))
        samples = time_runs(run, lambda: None, repeats=3)
        return StreamRun(config, statistics.median(samples) / config.updates,
                         state_digest(backend), plan.launch_count)
    finally:
        backend.close()


def fused(vocab: int, mode: Mode = "hard", updates: int = 2) -> BobConfig:
    return BobConfig(vocab=vocab, prompts=0, updates=updates, mode=mode, schedule="fused")


def bench_variants(copy: float | None) -> None:
    sizes = (32768, 65536) if os.environ.get("BIG") == "1" else (32768,)
    choices = compiled_variants(VARIANTS)
    for vocab in sizes:
        for name, choice in choices.items():
            print(run_stream(choice, fused(vocab)).line(name, copy), flush=True)
    for vocab, mode, updates in DIGEST_CASES:
        for name in DIGEST_VARIANTS:
            choice = choices.get(name)
            if choice is not None:
                print(run_stream(choice, fused(vocab, mode, updates)).line(name, copy),
                      flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", action="store_true",
                        help="the stream kernels' tuning macros, timed and digested (cuda)")
    args = parser.parse_args()
    copy = copy_bandwidth()
    print("device-to-device copy: " + (f"{copy / 1e9:.1f} GB/s" if copy else
                                       "not measured (needs PyTorch with CUDA)"), flush=True)
    if args.variants:
        bench_variants(copy)
        return
    choice = choose_backend(os.environ.get("B", "cuda"))
    for vocab in (int(v) for v in os.environ.get("VS", "32768,65536").split(",")):
        print(run_stream(choice, fused(vocab)).line("fused streaming", copy), flush=True)


if __name__ == "__main__":
    main()
