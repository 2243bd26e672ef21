"""Counting throughput: NumPy vs one core (Numba) vs all cores vs a Dask LocalCluster.

    PYTHONPATH=src python3 -m dev.bench.bench_count --mb 2048

Builds a byte corpus (the built-in corpus repeated) of --mb MiB in --dir, reads
it once so it is page-cached, then counts it each way and prints MB/s side by
side with the peak memory of each. Every way must give the same counts.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from bob.records import corpus, counting
from bob.records.sources import resolve


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
    with path.open("rb") as file:  # page-cache it
        while file.read(1 << 24):
            pass
    return path


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="corpus size in MiB")
    parser.add_argument("--dir", default="/tmp", help="where the corpus file goes")
    parser.add_argument("--numpy-mb", type=int, default=256,
                        help="MiB for the slow NumPy row (a prefix of the corpus)")
    parser.add_argument("--no-dask", action="store_true")
    args = parser.parse_args()
    path = make_corpus(Path(args.dir), args.mb)
    small = make_corpus(Path(args.dir), min(args.numpy_mb, args.mb))
    found = resolve([str(path)])
    size = found[0].size
    cores = counting.default_workers()
    print(f"corpus {path} ({size / 1e6:.0f} MB, page-cached), {cores} cores")
    counting.count_sources(resolve([str(small)])[:1], 256, workers=1)  # compile Numba first
    rows = [timed(f"numpy (1 core, {small.stat().st_size >> 20} MiB)", small.stat().st_size,
                  lambda: counting.count_sources(resolve([str(small)]), 256, workers=1,
                                                 engine="numpy"))]
    rows.append(timed("numba, 1 core", size,
                      lambda: counting.count_sources(found, 256, workers=1)))
    rows.append(timed(f"numba, {cores} processes", size,
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


if __name__ == "__main__":
    main()
