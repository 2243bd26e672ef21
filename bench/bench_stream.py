"""PYTHONPATH=src python3 bench/bench_stream.py   (B=cuda VS=32768,65536 by default)

The fused schedule's streaming path at large V: one invocation of N = 2 updates on zero
tables (written once; the timings reuse the state), the median of three runs after a
warm-up, as bandwidth at 24 bytes per parameter beside the device-to-device copy
(docs/BENCHMARKS.md, issue 14). B picks the backend, VS the sizes (B=cpu VS=300 checks
the script without a GPU)."""
import os
import statistics
import time

import numpy as np

from bob.backends import choose_backend
from bob.bench.peers import bench_targets
from bob.bench.suite import copy_bandwidth
from bob.config import Hyper
from bob.host.session import Session
from bob.plan.certificate import require_certified
from bob.program.bob import BobConfig, build_plan

choice = choose_backend(os.environ.get("B", "cuda"))
copy = copy_bandwidth()
copy = copy or 1e12
print(f"device-to-device copy: {copy / 1e9:.1f} GB/s", flush=True)
for vocab in tuple(int(v) for v in os.environ.get("VS", "32768,65536").split(",")):
    config = BobConfig(vocab=vocab, prompts=0, updates=2, schedule="fused")
    plan = build_plan(config, choice.target, Hyper(), compiled=choice.regions)
    backend = choice.open(require_certified(plan))
    try:
        table = vocab * vocab * 4
        for name in ("parameters", "first_moment", "second_moment"):
            backend.write_tensor(name, bytes(table))
        targets = bench_targets(vocab).astype(np.uint32).tobytes()
        backend.write_tensor("input", targets + bytes(plan.tensor("input").bytes - len(targets)))
        Session(choice).write_update_scalars(config, backend, 1)
        everything = range(plan.submission_count)
        backend.run(everything)  # warm-up
        samples = []
        for _ in range(3):
            start = time.perf_counter()
            backend.run(everything)
            samples.append(time.perf_counter() - start)
        seconds = statistics.median(samples) / config.updates
        rate = 24 * vocab * vocab / seconds
        print(f"V={vocab}: fused streaming {seconds * 1e3:.2f} ms/update, "
              f"{rate / 1e9:.0f} GB/s at 24 B/parameter = {rate / copy:.1%} of the copy; "
              f"{plan.launch_count} launches", flush=True)
    finally:
        backend.close()
