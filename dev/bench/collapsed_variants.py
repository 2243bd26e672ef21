"""Variants of the collapsed training kernels beside the shipped build: registers and
local bytes, and on a GPU the device time per update, in one process.

    PYTHONPATH=src:. python3 -m dev.bench.collapsed_variants DIR [--variants contiguous
        bounds4] [--split] [--static]

DIR holds a token corpus (train.bin, val.bin; bench_collapsed makes one). `boundsB` caps
the collapsed loss-gradient and fused kernels at LANES threads and B resident blocks per
SM (`__launch_bounds__(LANES, B)`): at most 65536 / (LANES x B) registers a thread, more
warps to hide the latency of the rows' serial sums (a variant that spills is refused by
the image reader: Bob's launches have no local memory). `contiguous` gives block b the
heavy rows among its own light rows' ids, as the kernels once did. `--split` times the
corpus's heavy and light rows apart; `--static` compiles and prints the registers alone,
without a GPU.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

import bob.kernels.cuda.regions as cuda_regions
from bob.kernels.cuda.compile import KernelSource, compile_source, shipped_source
from bob.kernels.cuda.cubin import Cubin
from bob.records.binary import InputRecord

KERNELS = ("bob_collapsed_loss_gradient", "bob_collapsed_loss_gradient_corpus",
           "bob_collapsed_fused_train", "bob_collapsed_fused_train_corpus")
HEADER = "bob_collapsed.cuh"
HEAVY_EXCEPTIONS = 96  # the CUDA source's: a row of more exceptions is a block's


CONTIGUOUS_HEAVY = (
    "    for (u32 k = 0; k < ROWS_PER_BLOCK && blockIdx.x * ROWS_PER_BLOCK + k < ix.vocab; ++k) {\n"
    "        const Row row = row_of(ix, blockIdx.x * ROWS_PER_BLOCK + k);")
SHIPPED_HEAVY = """    for (u32 r = blockIdx.x; r < ix.vocab; r += gridDim.x) {
        const Row row = row_of(ix, r);"""


def variant_source(variant: str) -> KernelSource:
    """The shipped source, or a variant of it: `boundsB` puts the collapsed training
    kernels under __launch_bounds__(LANES, B); `contiguous` gives block b the heavy ones of
    its own rows 8b .. 8b + 7 (not rows b, b + G, ...)."""
    source = shipped_source()
    if variant == "shipped":
        return source
    headers = []
    for name, text in source.headers:
        if name == HEADER:
            text = patched(text, variant)
        headers.append((name, text))
    return KernelSource(source.name, source.text, tuple(headers))


def patched(text: str, variant: str) -> str:
    if variant == "contiguous":
        if text.count(SHIPPED_HEAVY) != 1:
            raise SystemExit(f"each_row's heavy loop is not in {HEADER} as this script knows it")
        return text.replace(SHIPPED_HEAVY, CONTIGUOUS_HEAVY)
    blocks = int(variant.removeprefix("bounds"))
    for kernel in KERNELS:
        text, found = re.subn(
            rf'extern "C" __global__ void {kernel}\(',
            f'extern "C" __global__ void __launch_bounds__(LANES, {blocks}) {kernel}(', text)
        if found != 1:
            raise SystemExit(f"{kernel}: {found} declarations in {HEADER}")
    return text


def resources(variant: str) -> str:
    image = compile_source(variant_source(variant), "sm_90").image
    kernels = Cubin(image).kernels()
    return ", ".join(
        f"{name.removeprefix('bob_collapsed_')} {kernel.registers} regs"
        + (f" +{kernel.frame_bytes} B local" if kernel.frame_bytes else "")
        for name, kernel in ((name, kernels[name]) for name in KERNELS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--variants", nargs="*", default=["bounds3", "bounds4"],
                        help="beside the shipped build: contiguous, boundsB")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--static", action="store_true")
    parser.add_argument("--split", action="store_true",
                        help="also time the corpus's heavy rows and its light rows apart")
    args = parser.parse_args(argv)
    variants = ["shipped", *args.variants]
    for variant in variants:
        print(f"{variant}: {resources(variant)}", flush=True)
    if args.static:
        return 0
    from dev.bench.bench_collapsed import per_update, token_records

    records = token_records(args.directory, 50257)[1]
    shipped = cuda_regions.shipped_source
    base: dict[tuple[str, str], float] = {}
    try:
        for variant in variants:
            cuda_regions.shipped_source = lambda v=variant: variant_source(v)
            for mode in ("corpus", "hard"):
                for schedule in ("fused", "seed"):
                    us = per_update("cuda", records[mode], schedule, args.steps)["us_per_update"]
                    ratio = us / base.setdefault((mode, schedule), us)
                    print(f"{variant} {mode:6} {schedule:5}: {us:8.2f} us/update,"
                          f" {ratio:.3f}x the shipped build", flush=True)
    finally:
        cuda_regions.shipped_source = shipped
    if args.split:
        for part, record in split_rows(records["corpus"]).items():
            us = per_update("cuda", record, "fused", args.steps)["us_per_update"]
            print(f"shipped corpus fused, {part}: {us:8.2f} us/update", flush=True)
    return 0


def split_rows(record: InputRecord) -> dict[str, InputRecord]:
    """The corpus record's rows of more than HEAVY_EXCEPTIONS pairs (a block each on the
    GPU) and the others (a warp each), as two records of the same V."""
    vocab = record.vocab
    rows = record.keys // vocab
    counts = np.bincount(rows.astype(np.int64), minlength=vocab)
    heavy = counts[rows.astype(np.int64)] > HEAVY_EXCEPTIONS
    parts = {}
    for name, keep in ((f"{int((counts > HEAVY_EXCEPTIONS).sum())} heavy rows", heavy),
                       (f"{int(((counts > 0) & (counts <= HEAVY_EXCEPTIONS)).sum())} light rows",
                        ~heavy)):
        values = record.values[keep]
        parts[name] = InputRecord.sparse(vocab, record.keys[keep],
                                         (values / values.sum()).astype(np.float32))
    return parts


if __name__ == "__main__":
    raise SystemExit(main())
