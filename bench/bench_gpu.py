"""PYTHONPATH=src python3 bench/bench_gpu.py

The GPU tables of `bob bench`: Bob's cuda backend (one invocation of N
updates, the graph launch alone, and the host's share) beside PyTorch eager,
PyTorch with a CUDA graph and JAX jit(fori_loop), at V = 256 (1000 updates per
timing) and V = 8192 (100 updates per timing), median of 5 timings. The same
as `bob bench --backend cuda`; further arguments go to `bob bench`
(`--vocab`, `--updates`, `--repeats`, `--json`, `--save FILE`).
"""

from __future__ import annotations

import sys

from bob.cli.main import main


def run(argv: list[str]) -> int:
    return main(["bench", "--backend", "cuda", *argv])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
