"""PYTHONPATH=src:. python3 -m dev.bench.compute_floor [-c 8192:hard -c 50257:corpus ...]

The fused kernels against two floors, per update at each V and mode:

- the copy floor: 24 bytes per parameter (read W, m, v; write them) over the device's
  measured device-to-device copy, and over the 4.27 TB/s goal;
- the compute floor: the warp instructions the fused kernels execute per update (NCU's
  smsp__inst_executed.sum, for the launches of the fused region only) over the device's
  issue rate, one warp instruction a cycle on each of the four schedulers of every SM at
  the device's rated clock. No kernel can finish before its instructions are issued. A
  kernel that takes all of an SM's shared memory (the held and cluster kernels) runs one
  CTA an SM, so it issues on its grid's SMs only (a cluster grid: as many CTAs as the SMs
  hold clusters of, 120 of the H200's 132): its floor over those SMs is printed too.

Instructions are counted in child processes under `ncu` (kernels named bob_fused_*), for
invocations of SHORT and LONG updates from zero tables: (count(LONG) - count(SHORT)) /
(LONG - SHORT) is what one more update executes, beside the thread instructions per
parameter-update it makes. The time is measured in this process the same way
(dev/cuda/bench_stream.py's run_stream: T(LONG) - T(SHORT) over LONG - SHORT), so every
printed figure is per update of the same kernels. `--no-ncu` prints the times and copy
floors only. `bob bench --compute-floor` prints the same floors as rows beside its memory
floor (compute_floor_rows).
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

from bob.backends import BackendChoice, choose_backend
from bob.backends.cuda.driver import bindings, call, describe_device
from bob.config import Hyper, Mode
from bob.kernels import signatures as sig
from bob.program.bob import build_plan
from dev.bench.measurement import GOAL_COPY_BANDWIDTH, command_env, copy_bandwidth
from dev.bench.tables import BYTES_PER_PARAMETER, Row
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

    def on(self, multiprocessors: int) -> Issue:
        """The issue of `multiprocessors` of these SMs."""
        return Issue(multiprocessors, self.clock_hz)

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


@dataclass(frozen=True)
class PerUpdate:
    """What one more update executes: (LONG - SHORT) invocations' counts over LONG - SHORT."""
    warp: float
    thread: float

    @staticmethod
    def of(short: Count, long: Count) -> PerUpdate:
        return PerUpdate((long.warp - short.warp) / (LONG - SHORT),
                         (long.thread - short.thread) / (LONG - SHORT))

    def floor(self, issue: Issue) -> float:
        """Seconds an update's warp instructions take to issue at `issue`'s rate."""
        return self.warp / issue.warp_instructions_per_second


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


def multiprocessors_used(vocab: int, mode: Mode, multiprocessors: int,
                         choice: BackendChoice | None = None) -> int:
    """The SMs the fused launches of a LONG invocation on `choice` (default: cuda) issue on:
    a region that asks for all the shared memory its target leaves (the held and cluster
    ones) runs one CTA an SM, so as many SMs as its grid has CTAs; any other, all of them."""
    choice = choice or choose_backend("cuda")
    config = variants.fused(vocab, mode, LONG)
    region = config.fused_region(choice.target)
    if region not in sig.WHOLE_SM_SHARED:
        return multiprocessors
    plan = build_plan(config, choice.target, Hyper(), compiled=choice.regions)
    grids = [launch.grid.x for launch in plan.launches if launch.region == region]
    return min(max(grids, default=multiprocessors), multiprocessors)


def floor_words(per_update: PerUpdate, issue: Issue, used: int, measured: float | None,
                parameters: int) -> str:
    """The compute floor over every SM and, where the kernel runs on fewer, over those."""
    def against(floor: float) -> str:
        return f" ({measured / floor:.2f}x)" if measured else ""

    floor = per_update.floor(issue)
    words = f"compute floor {floor * 1e3:.3f} ms{against(floor)}"
    if used < issue.multiprocessors:
        on_grid = per_update.floor(issue.on(used))
        words += f", {on_grid * 1e3:.3f} ms on the {used} SMs its grid holds{against(on_grid)}"
    return (f"{words}; {per_update.thread / parameters:.1f} thread and "
            f"{32 * per_update.warp / parameters:.1f} lane-slot instructions per "
            "parameter-update")


def compute_floor_rows(vocab: int, mode: Mode, updates: int) -> list[Row]:
    """`bob bench --compute-floor`'s rows: the fused kernels' instructions counted by ncu
    (invocations of SHORT and LONG updates from zero tables, child processes) over the
    issue rate of every SM, and of the SMs the kernel's grid holds where those are fewer;
    one skipped row saying why where ncu or the count is not to be had."""
    try:
        issue = Issue.of_device()
        per_update = PerUpdate.of(ncu_count(vocab, mode, SHORT), ncu_count(vocab, mode, LONG))
        used = multiprocessors_used(vocab, mode, issue.multiprocessors)
    except (SystemExit, Exception) as error:  # noqa: BLE001 - the floor row is a courtesy
        return [Row("compute floor", "floor", updates, error=f"skipped: {error}")]
    note = (f"{32 * per_update.warp / (vocab * vocab):.1f} instructions per "
            "parameter-update (ncu) / issue rate")
    rows = [Row(f"compute floor ({issue.multiprocessors} SMs' issue)", "floor", updates,
                per_update.floor(issue) * updates, (), None, note)]
    if used < issue.multiprocessors:
        rows.append(Row(f"compute floor (the {used} SMs its grid holds)", "floor", updates,
                        per_update.floor(issue.on(used)) * updates, (), None, note))
    return rows


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
        used = multiprocessors_used(vocab, mode, issue.multiprocessors)
        words.append(floor_words(PerUpdate.of(*counted), issue, used, measured, parameters))
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
