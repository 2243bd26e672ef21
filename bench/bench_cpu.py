"""PYTHONPATH=src python3 bench/bench_cpu.py

The CPU table of `bob bench`: Bob's cpu backend (one invocation of N updates,
the run alone, and the host's share) beside the plain float32 NumPy loop a
user would write (`bob.host.bench.numpy_train`) and PyTorch's eager loop with
torch.optim.AdamW, at V = 256, 100 updates per timing, median of 5 timings.
The same as `bob bench --backend cpu`; further arguments go to `bob bench`
(`--vocab`, `--updates`, `--repeats`, `--json`, `--save FILE`).
"""

from __future__ import annotations

import sys

from bob.cli.main import main


def run(argv: list[str]) -> int:
    return main(["bench", "--backend", "cpu", *argv])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
