"""What the kernel-variant benches share (dev/cuda: bench_small, bench_tall, bench_stream,
bench_fused): the knob source beside this file compiled with a variant's macros in front,
the shipped kernels every variant is checked against, the configuration and the input they
train on (loaded once, the corpus pairs scattered by the plan's loads), and a digest of the
state a run leaves.

A variant changes speed, never bits: its digest is the shipped kernels', its bytes too.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from bob.backends import Backend, BackendChoice, choose_backend
from bob.config import MAX_PAIRS, Mode
from bob.kernels.cuda.compile import SOURCE_NAME, KernelSource
from bob.program.bob import BobConfig, typical_pairs
from bob.program.invocation import invocation_layout
from bob.records.binary import InputRecord
from dev.bench.peers import bench_targets

KNOB_DIRECTORY = Path(__file__).resolve().parent  # bob_kernels.cu with its tuning macros
SHIPPED = "shipped"  # the shipped kernels' name among a bench's choices: the reference

# What a run leaves, digested: the tables, the gradients and the losses.
DIGEST_TENSORS = ("parameters", "first_moment", "second_moment", "gradients",
                  "training_loss")


def knob_source(macros: str = "") -> KernelSource:
    """The knob source (bob_kernels.cu and every ``*.cuh`` beside it) with these #defines
    in front; with none it compiles to the shipped image."""
    headers = tuple((header.name, header.read_text())
                    for header in sorted(KNOB_DIRECTORY.glob("*.cuh")))
    return KernelSource(SOURCE_NAME, macros + (KNOB_DIRECTORY / SOURCE_NAME).read_text(),
                        headers)


def variant_choice(macros: str, backend: str = "cuda") -> BackendChoice:
    """The cuda (or nv) backend on the knob source compiled with these #defines in front."""
    from bob.kernels.cuda.regions import compiled_regions
    from bob.plan.placement import TARGETS

    source = knob_source(macros)
    if backend == "nv":
        from bob.backends.nv.rm.backend import NvBackend

        regions = compiled_regions("sm_90", source)
        return BackendChoice("nv", TARGETS["sm_90"], regions, NvBackend)
    from bob.backends.cuda import CudaBackend, device_arch

    arch = device_arch()
    regions = compiled_regions(arch, source)
    return BackendChoice("cuda", TARGETS[arch], regions,
                         lambda plan: CudaBackend(plan, regions))


def shipped_and_variants(variants: Mapping[str, str],
                         backend: str = "cuda") -> dict[str, BackendChoice]:
    """SHIPPED (the shipped kernels on `backend`) first, then each variant by name; a
    variant the compiler or the regions refuse (a spill) is named on stdout and left out:
    it ends no bench."""
    choices = {SHIPPED: choose_backend(backend)}
    for name, macros in variants.items():
        try:
            choices[name] = variant_choice(macros, backend)
        except Exception as error:  # noqa: BLE001 - reported, and the others still run
            print(f"{name}: not compiled: {type(error).__name__}: {error}", flush=True)
    return choices


def against_shipped(digest: str, shipped: str) -> str:
    """A variant's verdict: its state's digest beside the shipped kernels'."""
    return "= shipped" if digest == shipped else f"DIFFERS from shipped {shipped}"


@functools.lru_cache(maxsize=4)
def bench_record(mode: Mode, vocab: int) -> InputRecord:
    """The input the benches train on: hard, the bench targets; corpus, fixed pseudo-random
    weights summing to 1 in (nearly) every cell, as sparse pairs. No prompts."""
    if mode == "hard":
        return InputRecord.hard(bench_targets(vocab).astype(np.uint32))
    rng = np.random.default_rng(0)
    if vocab * vocab > MAX_PAIRS:  # every cell is more pairs than a plan takes
        keys = np.unique(rng.integers(0, vocab * vocab, typical_pairs(vocab), np.uint64))
        values = rng.random(keys.size, np.float32)
        return InputRecord.sparse(vocab, keys, (values / values.sum(dtype=np.float64))
                                  .astype(np.float32))
    weights = rng.random((vocab, vocab), np.float32)
    return InputRecord.corpus((weights / weights.sum(dtype=np.float64)).astype(np.float32))


def fused(vocab: int, mode: Mode, updates: int) -> BobConfig:
    """The fused schedule's configuration a bench runs: no prompts; corpus mode with the
    pairs of bench_record."""
    return BobConfig(vocab=vocab, prompts=0, updates=updates, mode=mode, schedule="fused",
                     pairs=bench_record(mode, vocab).pairs)


def load_input(backend: Backend, config: BobConfig) -> int:
    """bench_record's input into the arena and, in corpus mode, scattered into its table
    (cleared first, by the load submissions): the first submission of a timed run, past
    the loads. Training never writes that table, so it holds across runs."""
    layout = invocation_layout(config)
    backend.write_tensor(layout.input, bench_record(config.mode, config.vocab).payload())
    backend.clear_tensors(layout.input_tables)
    backend.run(range(layout.load_submissions))
    return layout.load_submissions


def state_digest(backend, names: tuple[str, ...] = DIGEST_TENSORS) -> str:
    """The first 12 hex digits of SHA-256 over these tensors' bytes, in order."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(backend.read_tensor(name))
    return digest.hexdigest()[:12]
