"""PYTHONPATH=src:. python3 -m dev.cuda.bench_cluster [-V 50257] [-N 32] [--mode hard]

The cluster kernels (dev/cuda/bob_cluster.cuh, the knob copy of the shipped
src/bob/kernels/cuda/bob_cluster.cuh: a row past one SM held in the distributed shared
memory of a thread-block cluster for all of a launch's updates), outside the plan: the
knob source compiled with a variant's macros, launched through cuLaunchKernelEx with the
cluster dimension, on tables of V x V. The cluster size is the program's
(bob.program.bob.cluster_ctas) for the device's opt-in shared memory.

First the check: from a seeded random table (row 0 all zeros, so the literal max runs
too), N updates and the finish; sampled rows' parameters, moments, gradients and loss
against the cpu backend's fused kernels run on those rows (bob.kernels.fast), byte for
byte. Then the timing: from the zero table, N updates in launches of --per-launch, the
median of --repeats, in ms per update, beside the copy floor (24 bytes per parameter per
update over a measured device-to-device copy).
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import statistics
import sys
from dataclasses import dataclass, replace

import numpy as np

from bob.backends.cuda import driver
from bob.config import Hyper
from bob.kernels import reference as ref
from bob.kernels import signatures as sig
from bob.kernels.cuda.compile import KernelSource, compile_source
from bob.plan.placement import SM90
from bob.program import bob as program
from bob.program.bob import adam_scalar_table
from dev.cuda.variants import knob_source

CHUNK_ROWS = 256  # rows generated (and regenerated for the check) together
REGIONS = {"hard": sig.FUSED_CLUSTER_HARD, "corpus": sig.FUSED_CLUSTER_CORPUS}


def cluster_source(macros: str = "") -> KernelSource:
    """The knob source (its bob_cluster.cuh included) with these #defines in front."""
    return knob_source(macros)


def cluster_ctas(vocab: int, mode: str, limit: int) -> tuple[int, int]:
    """The program's cluster for a row of `vocab` where a block may opt in to `limit`
    bytes of shared memory (clusters up to 16 CTAs), and a CTA's slice bytes."""
    target = replace(SM90, max_shared_bytes_per_block=limit, max_cluster_ctas=16)
    ctas = program.cluster_ctas(mode, vocab, target)  # type: ignore[arg-type]
    if ctas is None:
        raise SystemExit(f"V={vocab} {mode}: a slice of 16 CTAs needs more than {limit} "
                         "bytes")
    return ctas, sig.CLUSTER_SLICES[REGIONS[mode]].slice_bytes(vocab, ctas)


@functools.cache
def base_chunk(vocab: int, mode: str, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {"parameters": rng.standard_normal((CHUNK_ROWS, vocab), dtype=np.float32),
           "first_moment": rng.standard_normal((CHUNK_ROWS, vocab), dtype=np.float32) * 1e-3,
           "second_moment": rng.random((CHUNK_ROWS, vocab), dtype=np.float32) * 1e-6}
    if mode == "corpus":
        dense = rng.random((CHUNK_ROWS, vocab), dtype=np.float32)
        out["weights"] = np.where(dense < 0.01, dense, 0.0).astype(np.float32) / vocab
    return out


def rows_chunk(vocab: int, mode: str, chunk: int, seed: int) -> dict[str, np.ndarray]:
    """Rows [chunk * CHUNK_ROWS, ...) of the random start state: one seeded chunk, rolled
    by `chunk` columns (so rows differ), row 0 all zeros."""
    first = chunk * CHUNK_ROWS
    count = min(CHUNK_ROWS, vocab - first)
    out = {name: np.roll(rows[:count], chunk, axis=1)
           for name, rows in base_chunk(vocab, mode, seed).items()}
    if first == 0:
        out["parameters"][0] = 0.0
    return out


def targets_of(vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 1 << 20]).integers(0, vocab, vocab).astype(np.uint32)


@dataclass
class Device:
    function: object
    stream: object
    ctas: int
    dynamic: int
    threads: int
    clusters: int

    @staticmethod
    def open(vocab: int, mode: str, threads: int, macros: str = "",
             stream_weights: bool = False) -> Device:
        api = driver.bindings()
        driver.initialize()
        device = driver.call("cuDeviceGet", 0)
        context = driver.call("cuDevicePrimaryCtxRetain", device)
        driver.call("cuCtxSetCurrent", context)
        attribute = api.CUdevice_attribute
        limit = driver.call("cuDeviceGetAttribute",
                            attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                            device)
        ctas, dynamic = cluster_ctas(vocab, mode, limit)
        if not stream_weights:  # all the plan asks for: a corpus slice holds its weights too
            target = replace(SM90, max_shared_bytes_per_block=limit)
            dynamic = sig.shared_rest(target, sig.CLUSTER_STATIC_SHARED_BYTES)
        image = compile_source(cluster_source(f"#define CLUSTER_THREADS {threads}u\n{macros}"),
                               "sm_90").image
        module = driver.call("cuModuleLoadData", np.frombuffer(image, np.uint8).ctypes.data)
        function = driver.call("cuModuleGetFunction", module,
                               f"bob_fused_train_cluster_{mode}".encode())
        fa = api.CUfunction_attribute
        driver.call("cuFuncSetAttribute", function,
                    fa.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic)
        driver.call("cuFuncSetAttribute", function,
                    fa.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        stream = driver.call("cuStreamCreate", 0)
        found = Device(function, stream, ctas, dynamic, threads, 0)
        found.clusters = int(driver.call("cuOccupancyMaxActiveClusters", function,
                                         found.config(1)))
        return found

    def config(self, clusters: int):
        api = driver.bindings()
        config = api.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = clusters * self.ctas, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = self.threads, 1, 1
        config.sharedMemBytes = self.dynamic
        config.hStream = self.stream
        attribute = api.CUlaunchAttribute()
        attribute.id = api.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attribute.value.clusterDim.x = self.ctas
        attribute.value.clusterDim.y = 1
        attribute.value.clusterDim.z = 1
        config.attrs = [attribute]
        config.numAttrs = 1
        return config

    def launch(self, values: list[tuple[type, object]]) -> None:
        holders = [kind(value) for kind, value in values]
        pointers = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
        driver.call("cuLaunchKernelEx", self.config(self.clusters), self.function,
                    ctypes.addressof(pointers), 0)


class Tables:
    """The device tables of one V x V run and the launches over them."""

    def __init__(self, vocab: int, mode: str):
        self.vocab, self.mode = vocab, mode
        size = 4 * vocab * vocab
        names = ["parameters", "first_moment", "second_moment", "gradients"]
        if mode == "corpus":
            names.append("weights")
        self.tables = {name: int(driver.call("cuMemAlloc", size)) for name in names}
        self.targets = int(driver.call("cuMemAlloc", 4 * vocab))
        self.loss = int(driver.call("cuMemAlloc", 4 * vocab))
        self.scalars = 0

    def zero(self) -> None:
        for name in ("parameters", "first_moment", "second_moment"):
            driver.call("cuMemsetD8", self.tables[name], 0, 4 * self.vocab * self.vocab)

    def random(self, seed: int) -> None:
        for chunk in range(-(-self.vocab // CHUNK_ROWS)):
            for name, rows in rows_chunk(self.vocab, self.mode, chunk, seed).items():
                offset = 4 * chunk * CHUNK_ROWS * self.vocab
                driver.call("cuMemcpyHtoD", self.tables[name] + offset,
                            np.ascontiguousarray(rows).ctypes.data, rows.nbytes)
        targets = targets_of(self.vocab, seed)
        driver.call("cuMemcpyHtoD", self.targets, targets.ctypes.data, targets.nbytes)

    def set_steps(self, steps: np.ndarray) -> None:
        if self.scalars:
            driver.call("cuMemFree", self.scalars)
        self.scalars = int(driver.call("cuMemAlloc", max(steps.nbytes, 4)))
        driver.call("cuMemcpyHtoD", self.scalars, steps.ctypes.data, steps.nbytes)

    def run(self, device: Device, updates: int, per_launch: int, finish: bool) -> None:
        scalars = ref.LossScalars.for_vocab(self.vocab)
        t = self.tables
        done = 0
        while done < updates or (finish and done == 0 and updates == 0):
            n = min(per_launch, updates - done)
            last = done + n == updates
            common = [(ctypes.c_void_p, t["parameters"]), (ctypes.c_void_p, t["first_moment"]),
                      (ctypes.c_void_p, t["second_moment"]), (ctypes.c_void_p, t["gradients"])]
            source = t["weights"] if self.mode == "corpus" else self.targets
            args = [*common, (ctypes.c_void_p, source), (ctypes.c_void_p, self.loss),
                    (ctypes.c_void_p, self.scalars + 32 * done),
                    (ctypes.c_float, float(scalars.log2e)), (ctypes.c_float, float(scalars.ln2))]
            if self.mode == "hard":
                args.append((ctypes.c_float, float(scalars.inverse_rows)))
            args += [(ctypes.c_uint, self.vocab), (ctypes.c_uint, n),
                     (ctypes.c_uint, int(finish and last))]
            device.launch(args)
            done += n
            if n == 0:
                break

    def row(self, name: str, r: int) -> np.ndarray:
        out = np.empty(self.vocab, np.float32)
        driver.call("cuMemcpyDtoH", out.ctypes.data, self.tables[name] + 4 * r * self.vocab,
                    out.nbytes)
        return out

    def losses(self) -> np.ndarray:
        out = np.empty(self.vocab, np.float32)
        driver.call("cuMemcpyDtoH", out.ctypes.data, self.loss, out.nbytes)
        return out


def check(device: Device, tables: Tables, updates: int, per_launch: int, rows: list[int]) -> bool:
    from bob.kernels import fast

    vocab, mode = tables.vocab, tables.mode
    seed = 11
    steps = adam_scalar_table(Hyper(), 1, updates)
    tables.random(seed)
    tables.set_steps(steps)
    tables.run(device, updates, per_launch, finish=True)
    driver.call("cuStreamSynchronize", device.stream)
    loss = tables.losses()
    targets = targets_of(vocab, seed)
    scalars = ref.LossScalars.for_vocab(vocab)
    same = True
    for r in rows:
        chunk = rows_chunk(vocab, mode, r // CHUNK_ROWS, seed)
        i = r % CHUNK_ROWS
        w, m, v = (chunk[name][i:i + 1].copy() for name in
                   ("parameters", "first_moment", "second_moment"))
        grad, want_loss = np.empty_like(w), np.empty(1, np.float32)
        if mode == "hard":
            fast.fused_hard_rows(w, m, v, targets[r:r + 1], steps, scalars.log2e, scalars.ln2,
                                 scalars.inverse_rows, True, grad, want_loss)
        else:
            fast.fused_corpus_rows(w, m, v, chunk["weights"][i:i + 1], steps, scalars.log2e,
                                   scalars.ln2, True, grad, want_loss)
        verdicts = []
        for name, want in (("parameters", w), ("first_moment", m), ("second_moment", v),
                           ("gradients", grad)):
            got = tables.row(name, r)
            differ = np.flatnonzero(got.view(np.uint32) != want[0].view(np.uint32))
            verdicts.append(f"{name} {'=' if not len(differ) else f'DIFFERS at {differ[:4]}'}")
            same &= not len(differ)
        loss_same = loss[r:r + 1].view(np.uint32)[0] == want_loss.view(np.uint32)[0]
        same &= bool(loss_same)
        verdicts.append(f"loss {'=' if loss_same else f'DIFFERS {loss[r]} {want_loss[0]}'}")
        print(f"  row {r}: " + ", ".join(verdicts), flush=True)
    return same


def copy_bandwidth(bytes_: int = 1 << 30) -> float:
    a, b = (int(driver.call("cuMemAlloc", bytes_)) for _ in range(2))
    start, end = (driver.call("cuEventCreate", 0) for _ in range(2))
    times = []
    for _ in range(5):
        driver.call("cuEventRecord", start, 0)
        driver.call("cuMemcpyDtoD", b, a, bytes_)
        driver.call("cuEventRecord", end, 0)
        driver.call("cuEventSynchronize", end)
        times.append(driver.call("cuEventElapsedTime", start, end) / 1e3)
    driver.call("cuMemFree", a)
    driver.call("cuMemFree", b)
    return 2 * bytes_ / min(times)


def timing(device: Device, tables: Tables, updates: int, per_launch: int, repeats: int) -> float:
    tables.set_steps(adam_scalar_table(Hyper(), 1, updates))
    start, end = (driver.call("cuEventCreate", 0) for _ in range(2))
    times = []
    for _ in range(repeats + 1):
        tables.zero()
        driver.call("cuCtxSynchronize")
        driver.call("cuEventRecord", start, device.stream)
        tables.run(device, updates, per_launch, finish=False)
        driver.call("cuEventRecord", end, device.stream)
        driver.call("cuEventSynchronize", end)
        times.append(driver.call("cuEventElapsedTime", start, end) / 1e3 / updates)
    return statistics.median(times[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-V", "--vocab", type=int, action="append")
    parser.add_argument("--mode", action="append", choices=("hard", "corpus"))
    parser.add_argument("-N", "--updates", type=int, default=32)
    parser.add_argument("--per-launch", type=int, default=32)
    parser.add_argument("--check-updates", type=int, default=3)
    parser.add_argument("--threads", type=int, default=512)
    parser.add_argument("-r", "--repeats", type=int, default=3)
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("-D", "--define", action="append", default=[],
                        help="NAME=VALUE put in front of the source as a #define")
    parser.add_argument("--no-time", action="store_true")
    parser.add_argument("--stream-weights", action="store_true",
                        help="ask for the four arrays' shared memory only, so that a corpus "
                             "row's weights are read from global memory every update")
    args = parser.parse_args()
    driver.initialize()
    same = True
    for vocab in args.vocab or [50257]:
        for mode in args.mode or ["hard", "corpus"]:
            macros = "".join(f"#define {d.replace('=', ' ', 1)}\n" for d in args.define)
            device = Device.open(vocab, mode, args.threads, macros, args.stream_weights)
            print(f"V={vocab} {mode} {' '.join(args.define)}: clusters of {device.ctas} CTAs "
                  f"x {device.threads} threads, {device.dynamic} B of shared memory, "
                  f"{device.clusters} clusters",
                  flush=True)
            tables = Tables(vocab, mode)
            if not args.no_check:
                rows = sorted({0, 1, 2, vocab // 2, vocab - 2, vocab - 1, device.clusters,
                               device.clusters + 1})
                ok = check(device, tables, args.check_updates, 2, rows)
                print(f"  check ({args.check_updates} updates in launches of 2): "
                      f"{'= cpu' if ok else 'DIFFERS from cpu'}", flush=True)
                same &= ok
            if not args.no_time:
                if args.no_check:
                    tables.random(11)  # the corpus weights and the targets
                seconds = timing(device, tables, args.updates, args.per_launch, args.repeats)
                floor = 24 * vocab * vocab / copy_bandwidth()
                print(f"  {seconds * 1e3:.3f} ms/update (N={args.updates}, "
                      f"{args.per_launch} a launch); copy floor {floor * 1e3:.3f} ms "
                      f"({seconds / floor:.2f} x)", flush=True)
            for pointer in (*tables.tables.values(), tables.targets, tables.loss,
                            tables.scalars):
                if pointer:
                    driver.call("cuMemFree", pointer)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
