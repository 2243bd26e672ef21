"""PYTHONPATH=src python3 -m dev.bench.bench_host   (V=256 N=1000 S=fused by default)

The host's part of a steady invocation, with no device to wait for: `session.train` on
the cpu backend whose device program is made instant (its run does nothing), over
INVOCATIONS invocations, timed as `bob bench`'s steady row times them (from the first
invocation's completion to the last's, per invocation). What is left is what the host
does per invocation on any backend (the AdamW table, the scalars and small tensors
written, the read queued, the result record, loss and health checks, the checkpoint
state), plus the cpu backend's own copies in and out of its arena.

Then the same invocations with the session's steps timed apart (each call's median).
The target is a whole invocation within 1.3x its device program; at
V = 256 fused an H200 runs that program in about 0.47 ms, so this is the budget the host
shares with the backend's own calls. No bits are checked: nothing runs.
"""
from __future__ import annotations

import functools
import os
import statistics
import time
from collections import defaultdict

import bob.host.session as session_module
from bob.backends import choose_backend
from bob.backends.cpu import CpuBackend
from bob.config import Hyper
from bob.host.check import random_record
from bob.host.session import Session, train
from bob.program.bob import BobConfig
from bob.records.checkpoint import Checkpoint

INVOCATIONS = 50
REPEATS = 5
STEPS = ("begin_after", "_start", "update_scalar_writes", "read_after", "settle", "finish")


def steady_host_seconds(session: Session, config: BobConfig, record, start) -> float:
    stamps: list[float] = []
    train(session, config, start, record, INVOCATIONS * config.updates,
          lambda invocation, done: stamps.append(time.perf_counter()), keep_all=False)
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def timed_steps() -> dict[str, list[float]]:
    """Wrap the session's steps; their durations by name."""
    durations: dict[str, list[float]] = defaultdict(list)
    for name in STEPS:
        step = getattr(Session, name)

        def timed(*args, _step=step, _name=name, **kwargs):
            begun = time.perf_counter()
            try:
                return _step(*args, **kwargs)
            finally:
                durations[_name].append(time.perf_counter() - begun)

        setattr(Session, name, functools.wraps(step)(timed))
    return durations


def main() -> None:
    config = BobConfig(vocab=int(os.environ.get("V", "256")), prompts=0,
                       updates=int(os.environ.get("N", "1000")),
                       schedule=os.environ.get("S", "fused"))  # type: ignore[arg-type]
    CpuBackend._run = lambda self, submissions: None  # the device program made instant
    record = random_record(config, 0)
    start = Checkpoint.zeros(config.vocab, Hyper(), config.mode)
    with Session(choose_backend("cpu")) as session:
        steady_host_seconds(session, config, record, start)  # warm-up
        samples = [steady_host_seconds(session, config, record, start)
                   for _ in range(REPEATS)]
        print(f"V={config.vocab} N={config.updates} {config.schedule}: host part "
              f"{statistics.median(samples) * 1e6:.1f} us per steady invocation (median of "
              f"{REPEATS}: {', '.join(f'{s * 1e6:.1f}' for s in samples)})", flush=True)
        durations = timed_steps()
        steady_host_seconds(session, config, record, start)
    for name in STEPS:
        print(f"  {session_module.__name__}.Session.{name}: "
              f"{statistics.median(durations[name]) * 1e6:.1f} us median of "
              f"{len(durations[name])} calls")


if __name__ == "__main__":
    main()
