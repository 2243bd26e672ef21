"""PYTHONPATH=src python3 bench/bench_stream.py   (B=cuda VS=32768,65536 by default)

The fused schedule's streaming path at large V: one invocation of N = 2 updates on zero
tables (written once; the timings reuse the state), the median of three runs after a
warm-up, as bandwidth at 24 bytes per parameter beside the device-to-device copy
(docs/BENCHMARKS.md, issue 14). B picks the backend, VS the sizes (B=cpu VS=300 checks
the script without a GPU)."""
import functools
import os
import statistics

import numpy as np

from bob.backends import choose_backend
from bob.bench.measurement import time_runs
from bob.bench.peers import bench_targets
from bob.bench.suite import copy_bandwidth
from bob.bench.tables import BYTES_PER_PARAMETER
from bob.config import Hyper
from bob.host.session import Session
from bob.plan.certificate import require_certified
from bob.program.bob import BobConfig, build_plan


def main() -> None:
    choice = choose_backend(os.environ.get("B", "cuda"))
    copy = copy_bandwidth()
    print("device-to-device copy: " + (f"{copy / 1e9:.1f} GB/s" if copy else
                                       "not measured (needs PyTorch with CUDA)"), flush=True)
    for vocab in (int(v) for v in os.environ.get("VS", "32768,65536").split(",")):
        config = BobConfig(vocab=vocab, prompts=0, updates=2, schedule="fused")
        plan = build_plan(config, choice.target, Hyper(), compiled=choice.regions)
        backend = choice.open(require_certified(plan))
        try:
            for name in ("parameters", "first_moment", "second_moment"):
                backend.write_tensor(name, bytes(plan.tensor(name).bytes))
            targets = bench_targets(vocab).astype(np.uint32).tobytes()
            backend.write_tensor("input",
                                 targets + bytes(plan.tensor("input").bytes - len(targets)))
            Session(choice).write_update_scalars(config, backend, 1)
            run = functools.partial(backend.run, range(plan.submission_count))
            samples = time_runs(run, lambda: None, repeats=3)
            seconds = statistics.median(samples) / config.updates
            rate = BYTES_PER_PARAMETER * vocab * vocab / seconds
            share = f" = {rate / copy:.1%} of the copy" if copy else ""
            print(f"V={vocab}: fused streaming {seconds * 1e3:.2f} ms/update, "
                  f"{rate / 1e9:.0f} GB/s at {BYTES_PER_PARAMETER} B/parameter{share}; "
                  f"{plan.launch_count} launches", flush=True)
        finally:
            backend.close()


if __name__ == "__main__":
    main()
