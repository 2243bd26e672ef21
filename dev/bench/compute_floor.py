"""PYTHONPATH=src:. python3 -m dev.bench.compute_floor [-c 8192:hard -c 50257:corpus ...]

The fused kernels against two floors, per update at each V and mode:

- the copy floor: 24 bytes per parameter (read W, m, v; write them) over the device's
  measured device-to-device copy, and over the 4.27 TB/s goal;
- the compute floor: the warp instructions the fused kernels execute per update (NCU's
  smsp__inst_executed.sum, for the launches of the fused region only) over the device's
  issue rate, one warp instruction a cycle on each of the four schedulers of every SM at
  the device's rated clock. No kernel can finish before its instructions are issued.

Instructions are counted in child processes under `ncu` (kernels named bob_fused_*), for
invocations of SHORT and LONG updates from zero tables: (count(LONG) - count(SHORT)) /
(LONG - SHORT) is what one more update executes, beside the thread instructions per
parameter-update it makes. The time is measured in this process the same way
(dev/cuda/bench_stream.py's run_stream: T(LONG) - T(SHORT) over LONG - SHORT), so every
printed figure is per update of the same kernels. `--no-ncu` prints the times and copy
floors only.
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from bob.backends import choose_backend
from bob.backends.cuda.driver import bindings, call, describe_device
from bob.config import Mode
from dev.bench.measurement import GOAL_COPY_BANDWIDTH, command_env
from dev.bench.suite import copy_bandwidth
from dev.bench.tables import BYTES_PER_PARAMETER
from dev.cuda import variants
from dev.cuda.bench_stream import LONG, SHORT, invocation, run_stream

SCHEDULERS_PER_SM = 4  # Hopper: four warp schedulers, each issuing one instruction a cycle
KERNEL_NAMES = "regex:bob_fused"
METRICS = ("smsp__inst_executed.sum", "smsp__thread_inst_executed.sum")
DEFAULT_CASES = ("8192:hard", "8192:corpus", "32768:hard", "32768:corpus", "50257:hard",
                 "65536:hard")


@dataclass(frozen=True)
class Issue:
    """The device's instruction issue: SMs x schedulers x clock."""
    multiprocessors: int
    clock_hz: float

    @property
    def warp_instructions_per_second(self) -> float:
        return self.multiprocessors * SCHEDULERS_PER_SM * self.clock_hz

    @staticmethod
    def of_device(ordinal: int = 0) -> Issue:
        info = describe_device(ordinal)  # initializes the driver
        khz = int(call("cuDeviceGetAttribute",
                       bindings().CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
                       call("cuDeviceGet", ordinal)))
        return Issue(info.multiprocessors, khz * 1e3)


@dataclass(frozen=True)
class Count:
    """Instructions the fused launches of one invocation executed."""
    launches: int
    warp: float
    thread: float


def parse_case(text: str) -> tuple[int, Mode]:
    vocab, _, mode = text.partition(":")
    if mode not in ("hard", "corpus") or not vocab.isdigit():
        raise SystemExit(f"compute_floor: a case is V:hard or V:corpus, not {text!r}")
    return int(vocab), mode  # type: ignore[return-value]


def run_child(vocab: int, mode: Mode, updates: int) -> None:
    """One invocation of `updates` updates from zero tables, on cuda: what ncu counts."""
    with invocation(choose_backend("cuda"), variants.fused(vocab, mode, updates)) as (
            backend, run, _):
        run()
        backend.read_tensor("training_loss")  # the invocation has finished


def ncu_count(vocab: int, mode: Mode, updates: int) -> Count:
    ncu = shutil.which("ncu")
    if ncu is None:
        raise SystemExit("compute_floor: ncu is not on PATH (or pass --no-ncu)")
    command = [ncu, "--clock-control", "none", "--csv", "--print-units", "base",
               "--kernel-name", KERNEL_NAMES, "--metrics", ",".join(METRICS),
               sys.executable, "-m", "dev.bench.compute_floor", "--child",
               f"{vocab}:{mode}", "--updates", str(updates)]
    done = subprocess.run(command, capture_output=True, text=True, env=command_env(True),
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"compute_floor: ncu failed ({done.returncode}): "
                         f"{(done.stderr or done.stdout)[-2000:]}")
    return parse_ncu_csv(done.stdout)


def parse_ncu_csv(text: str) -> Count:
    """The sums of METRICS over the launches ncu reported (its CSV rows, one per metric)."""
    start = text.find('"ID"')
    if start < 0:
        raise SystemExit(f"compute_floor: no ncu table in its output: {text[-2000:]}")
    totals = dict.fromkeys(METRICS, 0.0)
    launches = set()
    for row in csv.DictReader(io.StringIO(text[start:])):
        name = row.get("Metric Name")
        if name in totals:
            totals[name] += float(row["Metric Value"].replace(",", ""))
            launches.add(row["ID"])
    return Count(len(launches), totals[METRICS[0]], totals[METRICS[1]])


def case_line(vocab: int, mode: Mode, issue: Issue | None, copy: float | None,
              counted: tuple[Count, Count] | None) -> str:
    run = run_stream(choose_backend("cuda"), variants.fused(vocab, mode, LONG))
    parameters = vocab * vocab
    measured = run.update
    words = [f"V={vocab} {mode} {run.region}: {measured * 1e3:.3f} ms/update"]
    for bandwidth, source in ((copy, "copy"), (GOAL_COPY_BANDWIDTH, "goal copy")):
        if bandwidth:
            floor = BYTES_PER_PARAMETER * parameters / bandwidth
            words.append(f"{source} floor {floor * 1e3:.3f} ms ({measured / floor:.2f}x)")
    if counted is not None and issue is not None:
        short, long = counted
        warp = (long.warp - short.warp) / (LONG - SHORT)
        thread = (long.thread - short.thread) / (LONG - SHORT)
        floor = warp / issue.warp_instructions_per_second
        words.append(f"compute floor {floor * 1e3:.3f} ms ({measured / floor:.2f}x; "
                     f"{thread / parameters:.1f} thread and {32 * warp / parameters:.1f} "
                     f"lane-slot instructions per parameter-update)")
    return "; ".join(words)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("-c", "--case", action="append", help="V:hard or V:corpus")
    parser.add_argument("--no-ncu", action="store_true", help="times and copy floors only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--updates", type=int, default=LONG, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        run_child(*parse_case(options.child), options.updates)
        return 0
    cases = [parse_case(text) for text in options.case or DEFAULT_CASES]
    issue = None if options.no_ncu else Issue.of_device()
    if issue is not None:
        print(f"issue rate: {issue.multiprocessors} SMs x {SCHEDULERS_PER_SM} schedulers x "
              f"{issue.clock_hz / 1e9:.2f} GHz = "
              f"{issue.warp_instructions_per_second / 1e12:.3f} T warp instructions/s",
              flush=True)
    copy = copy_bandwidth()
    print(f"device-to-device copy: {copy / 1e12:.2f} TB/s" if copy else "copy: not measured",
          flush=True)
    for vocab, mode in cases:
        counted = None
        if issue is not None:
            counted = (ncu_count(vocab, mode, SHORT), ncu_count(vocab, mode, LONG))
        print(case_line(vocab, mode, issue, copy, counted), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
