"""The V = 50257 acceptance run: Bob's commands on a token corpus, each a process, beside
PyTorch's eager loop of the same updates on the same counts.

    PYTHONPATH=src python3 -m dev.bench.bench_tokens DIR --json bench-tokens.json
    PYTHONPATH=src python3 -m dev.bench.bench_tokens DIR --vocab 512 --steps 20 -N 10 \\
        --backend cpu --skip-torch            # the same run in seconds, without a GPU

DIR holds nanoGPT's train.bin and val.bin (uint16); where both are missing they are made
there first (`dev/bench/token_corpus.py`, or a Zipf-like stream of ids without the
tokenizers package). Each command runs as a user runs it, under `/usr/bin/time -v` where
it is installed (else its own resource usage as it is reaped), its wall seconds and peak
RSS recorded:

    python -m bob generate --help                      start-up: interpreter and imports
    python -m bob count --tokens train.bin --vocab V -o c.counts
    python -m bob train --counts c.counts --vocab V --steps S -N N --val-tokens val.bin
        --schedule fused --backend B -c ckpt.safetensors
    python -m bob eval -c ckpt.safetensors --tokens val.bin --vocab V
    python -m bob generate -c ckpt.safetensors --ids "464 3290" -n 200 --seed 1 -t 0.8
        --top-k 200
    python -m dev.bench.torch_corpus --counts c.counts --steps S   (unless --skip-torch)

Between train and eval the disk's write speed is sampled (up to 4 GiB written beside the
checkpoint and fsynced) to price one checkpoint write, and the device program's time is
read from `bob train`'s progress lines (their wall time from the first invocation's start
to the last line: the device's, in a run the device bounds). Printed: each command, then the targets
(SPEC.md §10) with their ratios: peak RSS <= 4 GB for each of Bob's commands; the train
command within 1.3 x its device program + start-up + one checkpoint write; the device
program per update within 1.15 x the 24 B/parameter copy floor (at the goal's 4.27 TB/s);
PyTorch's end to end >= 4 x `bob train` (both start from the same counts file; and against
count + train); generate within 2 s of start-up. `--json OUT` writes the report. Whatever
the run writes (a V = 50257 checkpoint is 30 GB) is deleted at the end unless --keep.
Exit status 1 when a command failed; a target not met is a finding, not a failure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bob.files import atomic_write
from dev.bench.measurement import GOAL_COPY_BANDWIDTH, command_env
from dev.bench.processes import ProcessRun, run_process
from dev.bench.tables import BYTES_PER_PARAMETER
from dev.bench.workload import TokenCorpus, token_corpus

GPT2_VOCAB = 50257
RSS_LIMIT_BYTES = 4_000_000_000  # "host memory under 4 GB"
TRAIN_SLACK = 1.3  # the train command against 1.3 x device + start-up + one write
FLOOR_SLACK = 1.15  # the device program against the copy floor
TORCH_FACTOR = 4.0  # Bob at least this much faster than PyTorch eager end to end
GENERATE_SECONDS = 2.0  # generate's own time past start-up
PROBE_BYTES = 4 << 30  # disk write sampled to price one checkpoint write
PROBE_CHUNK = 64 << 20
DEFAULT_IDS = "464 3290"  # GPT-2's "The" and " dog"
_PROGRESS_LINE = re.compile(r"^step (\d+): train [\d.]+(?:, val [\d.]+)?  \(([\d.]+) ms/update")


@dataclass(frozen=True)
class Step:
    """One command of the run, as it went."""

    name: str
    argv: tuple[str, ...]
    seconds: float | None = None
    peak_rss_bytes: int | None = None
    rss_source: str = ""
    error: str | None = None  # why it failed, or why it did not run

    @classmethod
    def of(cls, name: str, run: ProcessRun) -> Step:
        return cls(name, run.argv, run.seconds, run.peak_rss_bytes, run.rss_source,
                   None if run.returncode == 0 else run.failure)


@dataclass(frozen=True)
class Target:
    name: str
    value: float | None
    limit: float | None
    relation: str  # "<=" or ">="
    unit: str  # "GB", "s", "x", "ms"

    @property
    def met(self) -> bool | None:
        if self.value is None or self.limit is None:
            return None
        return self.value <= self.limit if self.relation == "<=" else self.value >= self.limit

    def to_json(self) -> dict:
        return {**asdict(self), "met": self.met}


def device_seconds(train_stderr: str) -> float | None:
    """The training's time from `bob train`'s lines (`step K: train ... (X ms/update, ...)`:
    each the wall time since the line before, over the updates made in it)."""
    total, before = 0.0, 0
    found = False
    for line in train_stderr.splitlines():
        match = _PROGRESS_LINE.match(line.strip())
        if match:
            step, per_update = int(match.group(1)), float(match.group(2))
            total += (step - before) * per_update / 1e3
            before, found = step, True
    return total if found else None


def write_seconds(directory: Path, size: int) -> tuple[float, int]:
    """Seconds to write `size` bytes to a new file in `directory` and fsync it, from a
    sample of at most PROBE_BYTES (and half the free space); and the bytes sampled."""
    room = shutil.disk_usage(directory).free // 2
    sample = max(PROBE_CHUNK, min(size, PROBE_BYTES, room) // PROBE_CHUNK * PROBE_CHUNK)
    chunk = np.random.default_rng(0).integers(0, 256, PROBE_CHUNK, np.uint8).tobytes()
    probe = directory / "write-probe.bin"
    begun = time.perf_counter()
    descriptor = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(sample // PROBE_CHUNK):
            view = memoryview(chunk)
            while view:
                view = view[os.write(descriptor, view):]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
        seconds = time.perf_counter() - begun
        probe.unlink(missing_ok=True)
    return seconds * size / sample, sample


def prompt_ids(text: str, vocab: int) -> str:
    """The ids, each below V (GPT-2's ids folded into a smaller vocabulary)."""
    return " ".join(str(int(word) % vocab) for word in text.split())


def bob(*words: str) -> list[str]:
    return [sys.executable, "-m", "bob", *words]


class Run:
    """The commands in order, each recorded; later ones skipped once one they need failed."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.steps: list[Step] = []
        self.outputs: dict[str, ProcessRun] = {}

    def command(self, name: str, argv: list[str], needs: tuple[str, ...] = ()) -> bool:
        missing = [need for need in needs if need not in self.outputs]
        if missing:
            self.steps.append(Step(name, tuple(argv), error=f"not run: {missing[0]} failed"))
            return False
        print(f"bench_tokens: {shlex.join(argv[1:])}", file=sys.stderr, flush=True)
        done = run_process(argv, None, command_env(with_dev=True), self.timeout)
        self.steps.append(Step.of(name, done))
        if done.returncode != 0:
            print(f"bench_tokens: {name} failed: {done.stderr.strip()[-2000:]}",
                  file=sys.stderr)
            return False
        self.outputs[name] = done
        return True

    def seconds(self, name: str) -> float | None:
        found = self.outputs.get(name)
        return None if found is None else found.seconds

    def report(self, name: str) -> dict | None:
        found = self.outputs.get(name)
        if found is None:
            return None
        lines = found.stdout.strip().splitlines()
        return json.loads(lines[-1]) if lines else None


def targets(run: Run, vocab: int, steps: int, device: float | None,
            write: float | None, torch: dict | None) -> list[Target]:
    found = []
    for name in ("count", "train", "eval", "generate"):
        step = next((s for s in run.steps if s.name == name), None)
        peak = None if step is None or step.peak_rss_bytes is None else step.peak_rss_bytes / 1e9
        found.append(Target(f"bob {name}: peak RSS", peak, RSS_LIMIT_BYTES / 1e9, "<=", "GB"))
    startup, train = run.seconds("start-up"), run.seconds("train")
    bound = None
    if device is not None and startup is not None and write is not None:
        bound = TRAIN_SLACK * device + startup + write
    found.append(Target(f"bob train wall vs {TRAIN_SLACK} x device {device or 0:.2f} s + "
                        f"start-up {startup or 0:.2f} s + one checkpoint write {write or 0:.2f} s",
                        train, bound, "<=", "s"))
    floor = BYTES_PER_PARAMETER * vocab * vocab / GOAL_COPY_BANDWIDTH
    per_update = None if device is None or not steps else device / steps
    found.append(Target(f"device program per update vs {FLOOR_SLACK} x the copy floor "
                        f"({floor * 1e3:.2f} ms at {GOAL_COPY_BANDWIDTH / 1e12:.2f} TB/s)",
                        None if per_update is None else per_update * 1e3,
                        FLOOR_SLACK * floor * 1e3, "<=", "ms"))
    torch_wall = run.seconds("pytorch")
    if torch is not None and "skipped" not in torch:
        count = run.seconds("count")
        found.append(Target("pytorch eager end to end / bob train", None if not train
                            else torch_wall / train, TORCH_FACTOR, ">=", "x"))
        found.append(Target("pytorch eager end to end / (bob count + bob train)",
                            None if not (train and count) else torch_wall / (count + train),
                            TORCH_FACTOR, ">=", "x"))
    generate = run.seconds("generate")
    found.append(Target("bob generate past start-up", None if generate is None or startup is None
                        else generate - startup, GENERATE_SECONDS, "<=", "s"))
    return found


def print_report(run: Run, found: list[Target], notes: list[str]) -> None:
    print(f"{'command':<10} {'wall s':>9} {'peak RSS':>10}  argv")
    for step in run.steps:
        wall = "" if step.seconds is None else f"{step.seconds:9.2f}"
        peak = "" if step.peak_rss_bytes is None else f"{step.peak_rss_bytes / 1e9:7.2f} GB"
        print(f"{step.name:<10} {wall:>9} {peak:>10}  {shlex.join(step.argv[1:])}")
        if step.error:
            print(f"{'':<10} {step.error}")
    for note in notes:
        print(note)
    print(f"{'target':<100} {'value':>10} {'limit':>10}  met")
    for target in found:
        value = "" if target.value is None else f"{target.value:.3f}"
        limit = "" if target.limit is None else f"{target.relation} {target.limit:.3f}"
        met = {True: "yes", False: "NO", None: "-"}[target.met]
        print(f"{target.name:<100} {value:>10} {limit:>10}  {met} {target.unit}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="holds (or gets) train.bin and val.bin")
    parser.add_argument("--vocab", "-V", type=int, default=GPT2_VOCAB)
    parser.add_argument("--steps", type=int, default=1000, help="AdamW updates")
    parser.add_argument("-N", "--updates-per-invocation", type=int, default=100)
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--schedule", default="fused")
    parser.add_argument("--skip-torch", action="store_true", help="no PyTorch loop")
    parser.add_argument("--torch-device", choices=("cuda", "cpu"),
                        help="PyTorch's device (default: cpu with --backend cpu, else cuda)")
    parser.add_argument("--ids", default=DEFAULT_IDS, help="generate's prompt (mod V)")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--keep", action="store_true", help="keep what the run writes")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per command")
    args = parser.parse_args(argv)
    began = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    made_directory = not args.directory.exists()
    corpus: TokenCorpus = token_corpus(args.directory, args.vocab)
    work = Path(tempfile.mkdtemp(prefix="bench-tokens-", dir=args.directory))
    counts, checkpoint = work / "c.counts", work / "ckpt.safetensors"
    vocab, steps = str(args.vocab), args.steps
    run = Run(args.timeout)
    notes = [f"tokens: {corpus.train} and {corpus.val}: {corpus.how}"]
    device = write = None
    torch: dict | None = None
    try:
        run.command("start-up", bob("generate", "--help"))
        run.command("count", bob("count", "--tokens", str(corpus.train), "--vocab", vocab,
                                 "-o", str(counts), "--json"))
        if run.command("train", bob("train", "--counts", str(counts), "--vocab", vocab,
                                    "--steps", str(steps), "-N",
                                    str(args.updates_per_invocation), "--val-tokens",
                                    str(corpus.val), "--schedule", args.schedule,
                                    "--backend", args.backend, "-c", str(checkpoint), "--json"),
                       needs=("count",)):
            device = device_seconds(run.outputs["train"].stderr)
            size = checkpoint.stat().st_size
            write, sampled = write_seconds(work, size)
            notes.append(f"device program {device or 0:.3f} s (the invocations' own time); "
                         f"one checkpoint write of {size / 1e6:,.1f} MB: {write:.2f} s "
                         f"({sampled / 2**30:.1f} GiB written and fsynced beside it, scaled)")
        run.command("eval", bob("eval", "-c", str(checkpoint), "--tokens", str(corpus.val),
                                "--vocab", vocab, "--backend", args.backend, "--json"),
                    needs=("train",))
        run.command("generate", bob("generate", "-c", str(checkpoint), "--ids",
                                    prompt_ids(args.ids, args.vocab), "-n", "200", "--seed",
                                    "1", "-t", "0.8", "--top-k", "200"), needs=("train",))
        checkpoint.unlink(missing_ok=True)  # the disk back before PyTorch's run
        if not args.skip_torch:
            torch_device = args.torch_device or ("cpu" if args.backend == "cpu" else "cuda")
            if run.command("pytorch", [sys.executable, "-m", "dev.bench.torch_corpus",
                                       "--counts", str(counts), "--steps", str(steps),
                                       "--device", torch_device], needs=("count",)):
                torch = run.report("pytorch")
                if torch is not None and "skipped" in torch:
                    notes.append(f"pytorch skipped: {torch['skipped']}")
                elif torch is not None:
                    notes.append(f"pytorch: T prepared in {torch['prepare_seconds']:.2f} s, "
                                 f"{torch['seconds_per_update'] * 1e3:.2f} ms/update, loss "
                                 f"{torch['loss']:.6f}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            for path in corpus.made:
                path.unlink(missing_ok=True)
            if made_directory:
                shutil.rmtree(args.directory, ignore_errors=True)
    trained = run.report("train")
    if trained is not None:
        notes.append(f"bob train: loss {trained['loss']:.6f}, validation "
                     f"{trained.get('val_loss', float('nan')):.6f}, optimum "
                     f"{trained['optimum']:.6f}")
    found = targets(run, args.vocab, steps, device, write, torch)
    print_report(run, found, notes)
    if args.keep:
        print(f"kept: {work}")
    failed = [step.name for step in run.steps if step.error]
    if args.json is not None:
        from dev.bench.suite import environment

        document = {
            "format": "bob-bench-tokens", "format_version": 1, "date": began,
            "command": shlex.join(["python", "-m", "dev.bench.bench_tokens",
                                   *(sys.argv[1:] if argv is None else argv)]),
            "vocab": args.vocab, "steps": steps,
            "updates_per_invocation": args.updates_per_invocation, "backend": args.backend,
            "schedule": args.schedule,
            "tokens": {"train": str(corpus.train), "val": str(corpus.val), "how": corpus.how},
            "commands": [asdict(step) for step in run.steps],
            "count": run.report("count"), "train": trained, "eval": run.report("eval"),
            "pytorch": torch, "device_seconds": device, "checkpoint_write_seconds": write,
            "targets": [target.to_json() for target in found], "notes": notes,
            "failed": failed, "environment": environment(),
        }
        atomic_write(args.json, (json.dumps(document, indent=1) + "\n").encode("utf-8"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
