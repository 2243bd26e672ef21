"""Backends: where a certified plan runs.

- ``cpu``: the oracle, the reference kernels over one byte buffer.
- ``cuda``: the driver API, one CUDA graph per invocation.
- ``nv-sim``: the plan encoded as QMDs, pushbuffer and GPFIFO, executed by a
  simulator that reads nothing but those bytes and the arena.
- ``nv``: the same bytes submitted to an NVIDIA GPU through the kernel
  driver, without the CUDA runtime.
- ``auto``: ``cuda`` where a GPU is usable, else ``nv`` (Bob's own machine code where
  NVRTC is not installed), else ``cpu``.

Every backend implements ``base.Backend``; ``registry`` holds one spec per backend, from
which every list of backends is derived. A backend decides the target (parameter block
layout) and the compiled regions the plan is built with; the plan then decides
everything else.
"""

from __future__ import annotations

from .base import Backend, ReadHandle
from .registry import (
    AUTO,
    BACKEND_NAMES,
    BACKENDS,
    SPECS,
    Availability,
    BackendChoice,
    BackendSpec,
    ScheduleChoice,
    availability,
    choose_backend,
    resolve_schedule,
    resolve_submission,
    spec,
)

__all__ = ["AUTO", "BACKENDS", "BACKEND_NAMES", "SPECS", "Availability", "Backend",
           "BackendChoice", "BackendSpec", "ReadHandle", "ScheduleChoice", "availability",
           "choose_backend", "resolve_schedule", "resolve_submission", "spec"]
