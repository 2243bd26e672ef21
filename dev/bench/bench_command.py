"""PYTHONPATH=src python3 -m dev.bench.bench_command   (B=cuda V=256 N=1000 STEPS=10000)

The start-up target: `bob train --steps 10000` as a user runs it, against process
start-up plus 1.3x the device time of its updates. Side by side in one process:

- the device program alone: one invocation of N updates run on the backend (the bench's
  "run" row), per update;
- `bob train --steps 0`: the process with nothing to train (interpreter, imports, the
  corpus, the backend opened for the forward invocation that reports the loss);
- `bob train --steps N -N N`: the same plus one invocation's plan, graph and checkpoint;
- `bob train --steps STEPS -N N`: the command the target is about.

Each command runs REPEATS times (5), in rounds of one of each, in a fresh temporary
directory. Printed: the median and least seconds of each, the device time of STEPS
updates, and start-up + 1.3x device beside the command, by either statistic. B=cpu
checks the script without a GPU.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bob.backends import choose_backend, resolve_schedule, resolve_submission
from bob.config import Hyper
from bob.host.session import Session
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint
from dev.bench.measurement import command_env, time_runs
from dev.bench.peers import bench_targets

REPEATS = int(os.environ.get("REPEATS", "5"))


def device_seconds_per_update(backend_name: str, vocab: int, updates: int) -> float:
    """The device program of one N-update invocation, per update (median of three)."""
    config = BobConfig(vocab=vocab, prompts=0, updates=updates, mode="hard",  # as bob train
                       schedule=resolve_schedule("auto", backend_name).schedule,
                       submission=resolve_submission("auto", backend_name))
    record = InputRecord.hard(bench_targets(vocab), (), source="bench targets")
    with Session(choose_backend(backend_name), Hyper()) as session:
        session.invoke(config, Checkpoint.zeros(vocab, Hyper(), "hard"), record, "train")
        backend = session.last_backend
        plan = session.plan_for(config)
        samples = time_runs(lambda: backend.run(range(plan.submission_count)),
                            lambda: None, REPEATS)
    return statistics.median(samples) / updates


def command_seconds(backend_name: str, vocab: int, updates: int, steps: int) -> float:
    """`bob train` from process start to exit, on V-byte bench targets, once."""
    with tempfile.TemporaryDirectory(prefix="bob-command-") as directory:
        source = Path(directory) / "input.bin"
        InputRecord.hard(bench_targets(vocab), (), source="bench targets").write(source)
        argv = [sys.executable, "-m", "bob", "train", "--input", str(source),
                "--backend", backend_name, "--steps", str(steps), "-N", str(updates),
                "--json", "-c", str(Path(directory) / "bob.safetensors")]
        begun = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=False,
                              cwd=directory, env=command_env())
        seconds = time.perf_counter() - begun
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv[3:])}: {done.stderr.strip()[-400:]}")
    return seconds


def commands_seconds(backend_name: str, vocab: int, updates: int, steps: tuple[int, ...],
                     ) -> dict[int, list[float]]:
    """Each `bob train --steps S` REPEATS times, in rounds of one of each: the machine's
    drift over the minutes they take falls on all of them alike."""
    samples: dict[int, list[float]] = {count: [] for count in steps}
    for _ in range(REPEATS):
        for count in steps:
            samples[count].append(command_seconds(backend_name, vocab, updates, count))
    return samples


def main() -> None:
    backend = os.environ.get("B", "cuda")
    vocab, updates = int(os.environ.get("V", "256")), int(os.environ.get("N", "1000"))
    steps = int(os.environ.get("STEPS", "10000"))
    device = device_seconds_per_update(backend, vocab, updates) * steps
    samples = commands_seconds(backend, vocab, updates, (0, updates, steps))
    print(f"{backend} V={vocab}, N={updates}: device program {device / steps * 1e6:.2f} "
          f"us/update, {device * 1e3:.1f} ms for {steps} updates")
    for count, note in ((0, "start-up"), (updates, "start-up + one invocation"),
                        (steps, "")):
        print(f"bob train --steps {count:<6}: median {statistics.median(samples[count]) * 1e3:8.1f}"
              f" ms, least {min(samples[count]) * 1e3:8.1f} ms  {note}")
    for statistic, pick in (("median", statistics.median), ("least", min)):
        idle, one, whole = (pick(samples[count]) for count in (0, updates, steps))
        for label, start in (("--steps 0", idle), (f"--steps {updates}", one)):
            bound = start + 1.3 * device
            print(f"{statistic}: start-up ({label}) + 1.3 x device = {bound * 1e3:.1f} ms: "
                  f"the command is {whole / bound:.3f}x of it")
        later = device * (steps - updates) / steps
        print(f"{statistic}: the {steps - updates} updates after the first invocation cost "
              f"{(whole - one) * 1e3:.1f} ms: {(whole - one) / later:.3f}x their device time")


if __name__ == "__main__":
    main()
