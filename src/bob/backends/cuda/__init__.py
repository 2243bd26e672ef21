"""The cuda backend: a certified plan through the CUDA driver API, as one CUDA graph.

- ``driver``: the driver module, the one checker (``check``, ``CudaError``), availability
  and device facts, the kernel module's ``/proc`` line, libcuda's ctypes entry points;
- ``parameters``: parameter blocks as kernel parameter buffers (``ParameterStore``,
  ``LaunchTables``);
- ``transfer``: pinned chunks, small-write slots, and the read path (copy stream,
  device snapshot, pinned staging);
- ``backend``: ``CudaBackend``.
"""

from __future__ import annotations

from .backend import CudaBackend
from .driver import (
    STICKY_ERRORS,
    CudaError,
    DeviceInfo,
    cuda_available,
    describe_device,
    device_arch,
    kernel_module,
)
from .parameters import LaunchTables, ParameterStore, kernel_parameter_buffers, kernel_parameters

__all__ = ["STICKY_ERRORS", "CudaBackend", "CudaError", "DeviceInfo", "LaunchTables",
           "ParameterStore", "cuda_available", "describe_device", "device_arch",
           "kernel_module", "kernel_parameter_buffers", "kernel_parameters"]
