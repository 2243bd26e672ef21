"""Backends: where a certified plan runs, and the one registry of them.

- ``cpu``: the oracle, NumPy over one byte buffer.
- ``cuda``: the driver API, one CUDA graph per invocation.
- ``nv-sim``: the plan encoded as QMDs, pushbuffer and GPFIFO, executed by a
  simulator that reads nothing but those bytes and the arena.
- ``nv``: the same bytes submitted to an NVIDIA GPU through the kernel
  driver, without the CUDA runtime.
- ``auto``: ``cuda`` where a GPU is usable, else ``cpu``.

A backend decides the target (parameter block layout) and the compiled
regions the plan is built with; the plan then decides everything else.
Whether a backend can run here, and why not, is decided once, in its
``_choose_*`` function below: ``choose_backend`` opens one, ``availability``
reports on it (``bob doctor``), and ``auto`` is written in terms of them.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from bob.config import ARENA_KINDS, BACKEND_NAMES
from bob.errors import BackendUnavailable, BadInput, BobError
from bob.plan.certificate import CertifiedPlan
from bob.plan.model import Region, Target
from bob.plan.placement import SM86, TARGETS

from .base import ArenaRangeError, Backend


@dataclass(frozen=True)
class BackendChoice:
    """A backend picked for this machine: what to build the plan for, and how to open it."""

    name: str
    target: Target
    regions: Mapping[str, Region] | None = field(default=None, compare=False)
    opener: Callable[[CertifiedPlan], Backend] | None = field(default=None, compare=False)
    reason: str = ""  # what it runs on; for `auto`, why it was chosen

    def open(self, plan: CertifiedPlan) -> Backend:
        assert self.opener is not None
        return self.opener(plan)


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here, and what on (or why not)."""

    backend: str
    usable: bool
    details: str

    def to_json(self) -> dict[str, object]:
        return {"backend": self.backend, "usable": self.usable, "details": self.details}


def _choose_cpu(arch: str, arena: str) -> BackendChoice:
    from .cpu import CpuBackend

    return BackendChoice("cpu", SM86, None, CpuBackend,
                         f"NumPy {np.__version__} on {platform.machine()}, "
                         f"Python {platform.python_version()}")


def _choose_cuda(arch: str, arena: str) -> BackendChoice:
    try:
        from bob.kernels.cuda.regions import compiled_regions

        from .cuda import CudaBackend, cuda_available, device_arch
    except ImportError as error:
        raise BackendUnavailable(
            f"the cuda backend needs cuda-bindings and NVRTC (pip install 'bob[cuda]'): {error}"
        ) from None
    usable, device = cuda_available()  # NVRTC loads, the driver answers, a device exists
    if not usable:
        raise BackendUnavailable(f"the cuda backend cannot run here: {device}")
    gpu_arch = device_arch()
    target = TARGETS.get(gpu_arch)
    if target is None:
        raise BackendUnavailable(
            f"the GPU is {gpu_arch}; Bob's plans are built for {', '.join(sorted(TARGETS))}")
    try:
        regions = compiled_regions(gpu_arch)
    except BobError as error:
        raise BackendUnavailable(f"Bob's kernels do not compile for {gpu_arch}: {error}") from None
    return BackendChoice("cuda", target, regions,
                         lambda plan: CudaBackend(plan, regions, arena=arena),
                         f"{device}; {len(regions)} kernels compiled for {gpu_arch}")


def _choose_nv_sim(arch: str, arena: str) -> BackendChoice:
    from .nv.sim import NvSimBackend

    return BackendChoice("nv-sim", TARGETS[arch], None, NvSimBackend,
                         "encodes QMDs/pushbuffer/GPFIFO and simulates them on the CPU")


def _choose_nv(arch: str, arena: str) -> BackendChoice:
    try:
        from .nv.rm.backend import NvBackend, nv_available
    except ImportError as error:
        raise BackendUnavailable(f"the nv backend is not built here: {error}") from None
    usable, device = nv_available()
    if not usable:
        raise BackendUnavailable(f"the nv backend cannot run here: {device}")
    try:
        from bob.kernels.cuda.regions import compiled_regions

        regions = compiled_regions("sm_90")
    except (ImportError, BobError) as error:
        raise BackendUnavailable(f"the nv backend needs Bob's kernels compiled for sm_90 "
                                 f"(NVRTC): {error}") from None
    return BackendChoice("nv", TARGETS["sm_90"], regions,
                         lambda plan: NvBackend(plan, arena=arena), device)


def _choose_auto(arch: str, arena: str) -> BackendChoice:
    try:
        choice = _choose_cuda(arch, arena)
    except BackendUnavailable as why:
        return replace(_choose_cpu(arch, arena), reason=str(why))
    return replace(choice, reason="a GPU is usable")


_CHOOSERS: dict[str, Callable[[str, str], BackendChoice]] = {
    "cpu": _choose_cpu, "cuda": _choose_cuda, "nv-sim": _choose_nv_sim, "nv": _choose_nv,
    "auto": _choose_auto,
}


def choose_backend(name: str, arch: str = "sm_90", arena: str = "device") -> BackendChoice:
    """Resolve a backend name (``auto`` included) for this machine."""
    if name not in BACKEND_NAMES:
        raise BadInput(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if arch not in TARGETS:
        raise BadInput(f"unknown architecture {arch!r}; choose one of {', '.join(TARGETS)}")
    if arena not in ARENA_KINDS:
        raise BadInput(f"unknown arena placement {arena!r}; choose {' or '.join(ARENA_KINDS)}")
    return _CHOOSERS[name](arch, arena)


def availability(name: str) -> Availability:
    """Whether backend `name` can run here: what it would run on, or why not."""
    try:
        choice = choose_backend(name)
    except BackendUnavailable as why:
        return Availability(name, False, str(why))
    if name == "auto":
        return Availability(name, True, f"picks {choice.name}")
    return Availability(name, True, choice.reason)


__all__ = ["ARENA_KINDS", "BACKEND_NAMES", "ArenaRangeError", "Availability", "Backend",
           "BackendChoice", "availability", "choose_backend"]
