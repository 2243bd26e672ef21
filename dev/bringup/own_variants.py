"""Own images of several builds timed side by side on nv, in one process, against NVRTC's.

    PYTHONPATH=src:.:tests python3 -m dev.bringup.own_variants save LABEL DIR [--ordering latency]
    PYTHONPATH=src:.:tests python3 -m dev.bringup.own_variants time DIR/*.pickle [--case ...]

`save` builds every own image of this tree for sm_90 and keeps them in DIR/LABEL.pickle (xz), so
that builds of different commits (one change each) can be saved on a CPU machine and
timed together on the GPU. `time` runs, for each case (V, mode, schedule), one profiled
training invocation with NVRTC's kernels and one with each saved build's (its images in
place of this tree's), in rounds, and prints each region's mean device time and the
ratio to NVRTC's: the same plan, inputs and launches for every contender.
"""

from __future__ import annotations

import argparse
import lzma
import pickle
import subprocess
from pathlib import Path

ARCH = "sm_90"
CASES = ("256:hard:seed", "256:corpus:seed", "1024:hard:seed", "1024:corpus:seed",
         "8192:hard:seed", "8192:corpus:seed", "256:hard:fused", "256:corpus:fused",
         "1024:hard:fused", "1024:corpus:fused")


def save(label: str, folder: Path, order: str = "written") -> Path:
    from bob.isa.builder import ordering
    from bob.kernels import own

    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                            text=True, check=False).stdout.strip() or "not a git checkout"
    with ordering(order):
        images = {name: own.image(name, ARCH) for name in own.BUILDERS}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{label}.pickle"
    path.write_bytes(lzma.compress(pickle.dumps({"label": label, "commit": commit,
                                                 "images": images})))
    print(f"{path}: {len(images)} images of {commit}")
    return path


def load(path: Path) -> dict:
    """A saved build: its label, the commit it was saved from and its images by region."""
    return pickle.loads(lzma.decompress(path.read_bytes()))


def times(case: str, kernels: str, images: dict | None) -> dict[str, float]:
    """Region -> mean device µs of one profiled invocation of `case`."""
    from bob.host.profiling import profiled_invocation, region_times
    from bob.kernels import own
    from bob.program.bob import BobConfig
    from conftest import bob_config

    vocab, mode, schedule = case.split(":")
    v = int(vocab)
    config = BobConfig(vocab=v, prompts=0, updates=20, mode=mode,  # type: ignore[arg-type]
                       pairs=bob_config(vocab=v, mode=mode).pairs,
                       schedule=schedule)  # type: ignore[arg-type]
    saved = dict(own.BUILDERS)
    if images:
        for name, image in images.items():
            if name in own.BUILDERS:
                own.BUILDERS[name] = lambda arch, image=image: image
    try:
        plan, launches = profiled_invocation("nv", config, kernels=kernels)
    finally:
        own.BUILDERS.clear()
        own.BUILDERS.update(saved)
    regions = region_times(plan, launches)
    rows = {row.region: row.mean_ns / 1000 for row in regions}
    rows["all"] = sum(row.total_ns for row in regions) / 1000
    return rows


def time_builds(paths: list[Path], cases: list[str], rounds: int) -> None:
    builds = [load(path) for path in paths]
    for build in builds:
        print(f"build {build['label']}: {build['commit']}")
    for case in cases:
        results: dict[str, list[dict[str, float]]] = {"nvrtc": []}
        for build in builds:
            results[build["label"]] = []
        for _ in range(rounds):
            results["nvrtc"].append(times(case, "nvrtc", None))
            for build in builds:
                results[build["label"]].append(times(case, "own", build["images"]))
        best = {name: {region: min(run[region] for run in runs) for region in runs[0]}
                for name, runs in results.items()}
        for region, theirs in best["nvrtc"].items():
            cells = "  ".join(f"{name} {mine[region]:9.2f} ({mine[region] / theirs:.3f})"
                              for name, mine in best.items() if name != "nvrtc")
            print(f"{case} {region:28s} nvrtc {theirs:9.2f}  {cells}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    saving = commands.add_parser("save")
    saving.add_argument("label")
    saving.add_argument("folder", type=Path)
    saving.add_argument("--ordering", default="written", help="the builders' ordering")
    timing = commands.add_parser("time")
    timing.add_argument("builds", type=Path, nargs="+")
    timing.add_argument("--case", action="append", help=f"V:mode:schedule (all of {CASES})")
    timing.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.command == "save":
        save(args.label, args.folder, args.ordering)
    else:
        time_builds(args.builds, args.case or list(CASES), args.rounds)


if __name__ == "__main__":
    main()
