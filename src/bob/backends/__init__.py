"""Backends: where a certified plan runs.

- ``cpu``: the oracle, NumPy over one byte buffer.
- ``cuda``: the driver API, one CUDA graph per invocation.
- ``nv-sim``: the plan encoded as QMDs, pushbuffer and GPFIFO, executed by a
  simulator that reads nothing but those bytes and the arena.
- ``nv``: the same bytes submitted to an NVIDIA GPU through the kernel
  driver, without the CUDA runtime.
- ``auto``: ``cuda`` where a GPU is usable, else ``cpu``.

A backend decides the target (parameter block layout) and the compiled
regions the plan is built with; the plan then decides everything else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bob.errors import BackendUnavailable, BadInput
from bob.plan.model import Plan, Region, Target
from bob.plan.placement import SM86, TARGETS

from .base import Backend

BACKEND_NAMES = ("cpu", "cuda", "nv-sim", "nv", "auto")


@dataclass(frozen=True)
class BackendChoice:
    """A backend picked for this machine: what to build the plan for, and how to open it."""

    name: str
    target: Target
    regions: dict[str, Region] | None = field(default=None, compare=False)
    opener: Callable[[Plan], Backend] | None = field(default=None, compare=False)
    reason: str = ""  # why `auto` chose it

    def open(self, plan: Plan) -> Backend:
        assert self.opener is not None
        return self.opener(plan)


def _cpu(reason: str = "") -> BackendChoice:
    from .cpu import CpuBackend

    return BackendChoice("cpu", SM86, None, CpuBackend, reason)


def _cuda(arena: str) -> BackendChoice:
    try:
        from .cuda import CudaBackend, cuda_available, device_arch
    except ImportError as error:
        raise BackendUnavailable(
            f"the cuda backend needs cuda-bindings and NVRTC (pip install 'bob[cuda]'): {error}"
        ) from None
    usable, why = cuda_available()
    if not usable:
        raise BackendUnavailable(f"the cuda backend cannot run here: {why}")
    arch = device_arch()
    from bob.kernels.cuda.compile import compiled_regions

    target = TARGETS.get(arch)
    if target is None:
        raise BackendUnavailable(
            f"the GPU is {arch}; Bob's plans are built for {', '.join(sorted(TARGETS))}")
    regions = compiled_regions(arch)
    return BackendChoice("cuda", target, regions,
                         lambda plan: CudaBackend(plan, arena=arena))


def _nv_sim(arch: str) -> BackendChoice:
    from .nv.sim import NvSimBackend

    return BackendChoice("nv-sim", TARGETS[arch], None, NvSimBackend)


def _nv(arena: str) -> BackendChoice:
    try:
        from .nv.rm.backend import NvBackend, nv_available
    except ImportError as error:
        raise BackendUnavailable(f"the nv backend is not built here: {error}") from None
    usable, why = nv_available()
    if not usable:
        raise BackendUnavailable(f"the nv backend cannot run here: {why}")
    from bob.kernels.cuda.compile import compiled_regions

    return BackendChoice("nv", TARGETS["sm_90"], compiled_regions("sm_90"),
                         lambda plan: NvBackend(plan, arena=arena))


def choose_backend(name: str, arch: str = "sm_90", arena: str = "device") -> BackendChoice:
    """Resolve a backend name (``auto`` included) for this machine."""
    if name not in BACKEND_NAMES:
        raise BadInput(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if arch not in TARGETS:
        raise BadInput(f"unknown architecture {arch!r}; choose one of {', '.join(TARGETS)}")
    if arena not in ("device", "host"):
        raise BadInput(f"unknown arena placement {arena!r}; choose 'device' or 'host'")
    if name == "cpu":
        return _cpu()
    if name == "cuda":
        return _cuda(arena)
    if name == "nv-sim":
        return _nv_sim(arch)
    if name == "nv":
        return _nv(arena)
    try:
        choice = _cuda(arena)
    except BackendUnavailable as why:
        return _cpu(reason=str(why))
    return BackendChoice(choice.name, choice.target, choice.regions, choice.opener,
                         "a GPU is usable")


__all__ = ["BACKEND_NAMES", "Backend", "BackendChoice", "choose_backend"]
