"""Counting throughput: the engines in one process, and `bob count` as a user runs it.

    PYTHONPATH=src python3 -m dev.bench.bench_count --mb 2048
    PYTHONPATH=src python3 -m dev.bench.bench_count --commands --baseline REF

Engines (the default): builds a byte corpus (the built-in corpus repeated) of
--mb MiB in --dir, reads it once so it is page-cached, then counts it with NumPy,
Numba on one thread, all cores and a Dask LocalCluster, printing MB/s and the peak
memory of each. Every way must give the same counts.

Commands (--commands): `python -m bob count` from process start to exit on page-cached
inputs: --token-mb MB of uint16 tokens at V = 50257 (a Zipf-like stream of BPE-like ids:
below 21553, a heavy head, a fixed seed), 1 MB of the same, and --text-mb MiB of byte
text. With --baseline REF, the same commands also run from the `src` of git revision
REF, in rounds of one of each (--repeats rounds), and every counts file the baseline
writes must hold the same counts and optimum as this tree's. Printed per command: the
least and median seconds, MB/s of the least, the peak RSS of the command's processes
together (sampled every 10 ms), and baseline / this tree. The start-up row is
`bob count --help`: the interpreter and the imports.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bob.records import corpus, counting
from bob.records.countsfile import CountsFile
from bob.records.sources import resolve
from dev.bench.measurement import command_env

TOKEN_VOCAB = 50257  # GPT-2's vocabulary
BPE_IDS = 21553  # ids a BPE tokenizer's head uses in practice; the rest stay rare
ZIPF_EXPONENT = 1.1
ZIPF_OFFSET = 10.0  # flattens the very top ranks, as merges of frequent bytes do
TOKEN_SEED = 50257
SAMPLE_SECONDS = 0.01


# -- inputs ---------------------------------------------------------------------------
def page_cache(path: Path) -> Path:
    with path.open("rb") as file:
        while file.read(1 << 24):
            pass
    return path


def make_corpus(directory: Path, mebibytes: int) -> Path:
    path = directory / f"bench-corpus-{mebibytes}m.txt"
    want = mebibytes << 20
    if not path.exists() or path.stat().st_size != want:
        text = corpus.builtin_corpus()
        with path.open("wb") as file:
            written = 0
            while written < want:
                piece = text[: want - written]
                file.write(piece)
                written += len(piece)
    return page_cache(path)


def make_tokens(directory: Path, size: int) -> Path:
    """`size` bytes of uint16 ids: rank r drawn with weight 1/(r + 10)^1.1, ids permuted."""
    path = directory / f"bench-tokens-{size}.bin"
    if not path.exists() or path.stat().st_size != size:
        rng = np.random.default_rng(TOKEN_SEED)
        weights = 1.0 / (np.arange(BPE_IDS) + ZIPF_OFFSET) ** ZIPF_EXPONENT
        cdf = np.cumsum(weights) / weights.sum()
        ids = rng.permutation(BPE_IDS).astype("<u2")
        with path.open("wb") as file:
            left = size // 2
            while left:
                chunk = min(left, 1 << 24)
                ids[np.searchsorted(cdf, rng.random(chunk))].tofile(file)
                left -= chunk
    return page_cache(path)


# -- the engines in one process --------------------------------------------------------
def peak_mb(children: bool = False) -> float:
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return resource.getrusage(who).ru_maxrss / 1024


def timed(name: str, size: int, count) -> tuple[str, float, object]:
    begun = time.perf_counter()
    counts = count()
    seconds = time.perf_counter() - begun
    rate = size / seconds / 1e6
    print(f"{name:<34} {rate:9.0f} MB/s  {seconds:7.2f} s  peak RSS self "
          f"{peak_mb():6.0f} MB, children {peak_mb(True):6.0f} MB", flush=True)
    return name, rate, counts


def engines(args: argparse.Namespace) -> None:
    path = make_corpus(Path(args.dir), args.mb)
    small = make_corpus(Path(args.dir), min(args.numpy_mb, args.mb))
    found = resolve([str(path)])
    size = found[0].size
    cores = counting.default_workers()
    print(f"corpus {path} ({size / 1e6:.0f} MB, page-cached), {cores} cores")
    counting.count_sources(resolve([str(small)])[:1], 256, workers=1,
                           engine="numba")  # compile Numba first
    rows = [timed(f"numpy (1 core, {small.stat().st_size >> 20} MiB)", small.stat().st_size,
                  lambda: counting.count_sources(resolve([str(small)]), 256, workers=1,
                                                 engine="numpy"))]
    rows.append(timed("numba, 1 core", size,
                      lambda: counting.count_sources(found, 256, workers=1)))
    rows.append(timed(f"numba, {cores} threads", size,
                      lambda: counting.count_sources(found, 256, workers=cores)))
    if not args.no_dask:
        import logging

        from bob.records.dask_count import count_on_dask
        logging.getLogger("distributed").setLevel(logging.ERROR)
        rows.append(timed(f"dask LocalCluster, {cores} thread workers", size,
                          lambda: count_on_dask(found, 256, workers=cores)))
        rows.append(timed(f"dask LocalCluster, {cores} process workers", size,
                          lambda: count_on_dask(found, 256, workers=cores, processes=True)))
    reference = rows[1][2]
    assert all(r[2].same_as(reference) for r in rows[2:]), "counts differ"
    parallel = rows[2][1]
    print(f"all cores / one core: {parallel / rows[1][1]:.2f}x; numba / numpy: "
          f"{rows[1][1] / rows[0][1]:.1f}x" + (f"; dask / all cores: {rows[3][1] / parallel:.2f}x"
                                               if len(rows) > 3 else ""))
    print("identical counts: yes")


# -- the commands -------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    seconds: float  # process start to exit
    peak_rss: int  # bytes: the largest sampled sum over the command's processes
    report: dict  # the --json line ({} for --help)


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants, from /proc."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    pending.extend(int(child) for child in children.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def run_command(argv: list[str], env: dict[str, str], cwd: str) -> Run:
    peak = [0]
    begun = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env, cwd=cwd)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(child.pid))
            done.wait(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = child.communicate()
    seconds = time.perf_counter() - begun
    done.set()
    sampler.join()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv[2:])}: {err.strip()[-400:]}")
    lines = out.strip().splitlines()
    report = json.loads(lines[-1]) if "--json" in argv else {}
    return Run(seconds, peak[0], report)


def baseline_env(revision: str, directory: Path) -> dict[str, str]:
    """PYTHONPATH for git revision `revision`'s src, exported into `directory`."""
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(root), "archive", revision, "src"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)
    inherited = [str(Path(entry).resolve()) for entry in
                 os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry
                 and Path(entry).resolve() != (root / "src").resolve()]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(directory / "src"), *inherited])}


def commands(args: argparse.Namespace) -> None:
    inputs = Path(args.dir)
    big = make_tokens(inputs, args.token_mb * 1_000_000)
    small = make_tokens(inputs, 1_000_000)
    text = make_corpus(inputs, args.text_mb)
    workloads = {
        "start-up (bob count --help)": (["count", "--help"], 0),
        f"tokens {args.token_mb} MB, V={TOKEN_VOCAB}": (
            ["count", "--tokens", str(big), "--vocab", str(TOKEN_VOCAB)], big.stat().st_size),
        f"tokens 1 MB, V={TOKEN_VOCAB}": (
            ["count", "--tokens", str(small), "--vocab", str(TOKEN_VOCAB)],
            small.stat().st_size),
        f"text {args.text_mb} MiB, V=256": (["count", str(text)], text.stat().st_size),
    }
    with tempfile.TemporaryDirectory(prefix="bob-bench-count-") as scratch:
        trees = {"this tree": command_env()}
        if args.baseline:
            old = Path(scratch) / "baseline"
            old.mkdir()
            trees[f"baseline {args.baseline}"] = baseline_env(args.baseline, old)
        print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start; "
              f"{args.repeats} rounds")
        for tree, env in trees.items():  # Numba's cache filled, the tokens page-cached
            for words, _ in workloads.values():
                if "--help" not in words:
                    run_command(command(words, scratch, tree), env, scratch)
        runs: dict[tuple[str, str], list[Run]] = {}
        for _ in range(args.repeats):
            for name, (words, _) in workloads.items():
                for tree, env in trees.items():
                    runs.setdefault((name, tree), []).append(
                        run_command(command(words, scratch, tree), env, scratch))
        if args.baseline:
            check_same_counts(workloads, trees, scratch)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    print(f"{'command':<32} {'tree':<18} {'least s':>8} {'median s':>9} {'MB/s':>7} "
          f"{'count s':>8} {'peak RSS MB':>12} {'baseline/this':>14}")
    for name, (_, size) in workloads.items():
        least_this = None
        for tree in trees:
            samples = runs[(name, tree)]
            least = min(r.seconds for r in samples)
            least_this = least if least_this is None else least_this
            rate = f"{size / least / 1e6:7.1f}" if size else f"{'':>7}"
            counted = [r.report.get("seconds") for r in samples if r.report]
            count_s = f"{min(counted):8.2f}" if counted else f"{'':>8}"
            ratio = f"{least / least_this:13.2f}x" if tree != "this tree" else ""
            print(f"{name:<32} {tree:<18} {least:8.2f} "
                  f"{statistics.median(r.seconds for r in samples):9.2f} {rate} {count_s} "
                  f"{max(r.peak_rss for r in samples) / 1e6:12.0f} {ratio}", flush=True)
    start_up, one_mb = list(workloads)[0], list(workloads)[2]
    for tree in trees:
        beyond = (min(r.seconds for r in runs[(one_mb, tree)])
                  - min(r.seconds for r in runs[(start_up, tree)]))
        print(f"{tree}: {one_mb} takes {beyond:.2f} s beyond start-up")


def counts_path(words: list[str], scratch: str, tree: str) -> str:
    """Where one tree's command writes its counts file (one file per input and tree)."""
    slug = "-".join(Path(word).name for word in words if not word.startswith("-"))
    return str(Path(scratch) / f"{tree.replace(' ', '-')}-{slug}.counts")


def command(words: list[str], scratch: str, tree: str) -> list[str]:
    if "--help" in words:
        return [sys.executable, "-m", "bob", *words]
    return [sys.executable, "-m", "bob", *words, "-o", counts_path(words, scratch, tree),
            "--overwrite", "--json"]


def check_same_counts(workloads: dict, trees: dict, scratch: str) -> None:
    """Every counts file of the baseline holds this tree's counts and optimum."""
    for words, _ in workloads.values():
        if "--help" in words:
            continue
        files = [CountsFile.load(counts_path(words, scratch, tree)) for tree in trees]
        for other in files[1:]:
            if not (other.counts.same_as(files[0].counts) and other.optimum == files[0].optimum):
                raise SystemExit(f"{' '.join(words)}: the counts differ between the trees")
    print("identical counts and optima in both trees: yes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="engines: corpus size in MiB")
    parser.add_argument("--dir", default="/tmp", help="where the corpus files go")
    parser.add_argument("--numpy-mb", type=int, default=256,
                        help="engines: MiB for the slow NumPy row (a prefix of the corpus)")
    parser.add_argument("--no-dask", action="store_true")
    parser.add_argument("--commands", action="store_true", help="time `bob count` instead")
    parser.add_argument("--baseline", metavar="REF",
                        help="commands: also run git revision REF's src, side by side")
    parser.add_argument("--token-mb", type=int, default=200,
                        help="commands: MB (10**6 bytes) of uint16 tokens")
    parser.add_argument("--text-mb", type=int, default=200, help="commands: MiB of byte text")
    parser.add_argument("--repeats", type=int, default=3, help="commands: rounds")
    args = parser.parse_args()
    if args.commands:
        commands(args)
    else:
        engines(args)


if __name__ == "__main__":
    main()
