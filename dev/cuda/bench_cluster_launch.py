"""PYTHONPATH=src:. python3 -m dev.cuda.bench_cluster_launch [-c 50257:corpus ...] [-b nv]

The fused kernels as the backends launch them, per update at each V and mode: cuda (the
registry's backend: cluster launches where the program chooses them) and nv, on the target
with clusters (dev/cuda/clusters.py). Each figure is
dev/cuda/bench_stream.py's run_stream, (T(LONG) - T(SHORT)) / (LONG - SHORT) from zero
tables, beside the copy floor: 24 bytes per parameter over the device-to-device copy
measured in the same process.
"""
from __future__ import annotations

import argparse
import os
import sys

from bob.backends import BackendChoice, choose_backend
from dev.bench.compute_floor import parse_case
from dev.bench.measurement import copy_bandwidth
from dev.bench.tables import BYTES_PER_PARAMETER
from dev.cuda.bench_stream import LONG, fused, run_stream
from dev.cuda.clusters import nv_with_clusters

DEFAULT_CASES = ("8192:hard", "8192:corpus", "21553:hard", "21553:corpus", "50257:hard",
                 "50257:corpus", "65536:hard", "65536:corpus")


def case_line(name: str, choice: BackendChoice, vocab: int, mode: str,
              copy: float | None) -> str:
    config = fused(vocab, mode, LONG)  # type: ignore[arg-type]
    run = run_stream(choice, config)
    plan_cluster = max((launch.cluster for launch in _fused_launches(choice, config)),
                       default=1)
    shape = f" in clusters of {plan_cluster}" if plan_cluster > 1 else ""
    words = [f"V={vocab} {mode} {name} {run.region}{shape}: {run.update * 1e3:.3f} ms/update"]
    if copy:
        floor = BYTES_PER_PARAMETER * vocab * vocab / copy
        words.append(f"copy floor {floor * 1e3:.3f} ms ({run.update / floor:.2f}x)")
    return "; ".join(words)


def _fused_launches(choice: BackendChoice, config):
    from bob.config import Hyper
    from bob.program.bob import build_plan

    plan = build_plan(config, choice.target, Hyper(), compiled=choice.regions)
    region = config.fused_region(choice.target)
    return [launch for launch in plan.launches if launch.region == region]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("-c", "--case", action="append", help="V:hard or V:corpus")
    parser.add_argument("-b", "--backend", action="append", choices=("cuda", "nv"),
                        help="cuda (default), nv (on the target with clusters); repeatable")
    options = parser.parse_args()
    cases = [parse_case(text) for text in options.case or DEFAULT_CASES]
    copy = copy_bandwidth()
    print(f"device-to-device copy: {copy / 1e12:.2f} TB/s" if copy else "copy: not measured",
          flush=True)
    makers = {"cuda": lambda: choose_backend("cuda"), "nv": nv_with_clusters}
    choices = [(name, makers[name]()) for name in options.backend or ["cuda"]]
    for vocab, mode in cases:
        for name, choice in choices:
            print(case_line(name, choice, vocab, mode, copy), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
