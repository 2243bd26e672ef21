"""What the kernel-variant benches share (bench/bench_small.py, bench_tall.py,
bench_stream.py, bench_fused.py): Bob's kernels compiled with tuning macros in front,
the input they train on, and a digest of the state a run leaves.

A variant changes speed, never bits: equal digests, equal bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from bob.backends import BackendChoice
from bob.bench.peers import bench_targets
from bob.program.bob import BobConfig

# What a run leaves, digested: the tables, the gradients and the losses.
DIGEST_TENSORS = ("parameters", "first_moment", "second_moment", "gradients",
                  "training_loss")


def variant_choice(macros: str, backend: str = "cuda") -> BackendChoice:
    """The cuda (or nv) backend on Bob's kernels compiled with these #defines in front."""
    from bob.kernels.cuda.compile import KernelSource, shipped_source
    from bob.kernels.cuda.regions import compiled_regions
    from bob.plan.placement import TARGETS

    shipped = shipped_source()
    source = KernelSource(shipped.name, macros + shipped.text, shipped.headers)
    if backend == "nv":
        from bob.backends.nv.rm.backend import NvBackend

        regions = compiled_regions("sm_90", source)
        return BackendChoice("nv", TARGETS["sm_90"], regions, NvBackend)
    from bob.backends.cuda import CudaBackend, device_arch

    arch = device_arch()
    regions = compiled_regions(arch, source)
    return BackendChoice("cuda", TARGETS[arch], regions,
                         lambda plan: CudaBackend(plan, regions))


def compiled_variants(variants: Mapping[str, str]) -> dict[str, BackendChoice]:
    """name -> the cuda backend on that variant's #defines; a variant the compiler or the
    regions refuse (a spill) is named on stdout and left out: it ends no bench."""
    choices = {}
    for name, macros in variants.items():
        try:
            choices[name] = variant_choice(macros)
        except Exception as error:  # noqa: BLE001 - reported, and the others still run
            print(f"{name}: not compiled: {type(error).__name__}: {error}", flush=True)
    return choices


def input_bytes(config: BobConfig, size: int) -> bytes:
    """The input tensor's `size` bytes: hard, the bench targets; corpus, fixed
    pseudo-random weights summing to 1."""
    vocab = config.vocab
    if config.mode == "hard":
        head = bench_targets(vocab).astype(np.uint32).tobytes()
    else:
        weights = np.random.default_rng(0).random((vocab, vocab), np.float32)
        head = (weights / weights.sum(dtype=np.float64)).astype(np.float32).tobytes()
    return head + bytes(size - len(head))


def state_digest(backend, names: tuple[str, ...] = DIGEST_TENSORS) -> str:
    """The first 12 hex digits of SHA-256 over these tensors' bytes, in order."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(backend.read_tensor(name))
    return digest.hexdigest()[:12]
