"""The CUDA driver as the cuda backend reaches it: one checker, device facts, fast paths,
thread-block clusters.

Every driver result passes `check` (`call` looks a function up and checks it): a
`CudaError` names the call, the status name and the driver's description of it. The
driver module (cuda-bindings) is imported once, when first needed, so importing this
module needs no CUDA. Beside the bindings, libcuda's own entry points for the hot paths
(a graph node added or updated, a kernel launched alone) are found through ctypes, where
they take plain ints; where they cannot be found the bindings serve. A launch in clusters
(`Launch.cluster` CTAs along x) carries the cluster dimension: a graph node as its
attribute (`set_node_cluster`), a launch alone through cuLaunchKernelEx (`launch_cluster`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bob.errors import BackendUnavailable, RunFailure

NVIDIA_VERSION_FILE = Path("/proc/driver/nvidia/version")
# A kernel fault leaves these sticky errors in its context: every later call in it fails
# the same way, so the primary context is reset before the device is used again.
STICKY_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_ASSERT",
})


class CudaError(RunFailure):
    """A driver call failed: the call, the status name and its description."""

    def __init__(self, call: str, status: str, description: str):
        self.call = call
        self.status = status
        self.description = description
        super().__init__(f"{call} failed: {status} ({description})")


@functools.cache  # imported once: every driver call looks the module up
def bindings():
    """cuda-bindings' driver module (BackendUnavailable where it is not installed)."""
    try:
        from cuda.bindings import driver
    except ImportError as error:
        raise BackendUnavailable(
            f"cuda-bindings is not installed ({error}): pip install 'bob-bigram[cuda]'"
        ) from error
    return driver


def status_text(api, status) -> tuple[str, str]:
    """The driver's name and description of a status (numbers where it has none)."""
    try:
        named, name = api.cuGetErrorName(status)
        described, description = api.cuGetErrorString(status)
    except Exception:  # the status is reported by number if the driver cannot name it
        return f"CUresult {int(status)}", "no description"
    success = api.CUresult.CUDA_SUCCESS
    name = name.decode() if named == success and name else f"CUresult {int(status)}"
    text = description.decode() if described == success and description else "no description"
    return name, text


def check(name: str, result: tuple) -> Any:
    """Every driver result passes here: the values on success, CudaError otherwise."""
    api = bindings()
    status, *values = result
    if status != api.CUresult.CUDA_SUCCESS:
        raise CudaError(name, *status_text(api, status))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def call(name: str, *args: Any) -> Any:
    """Call driver function `name` and check its result (looked up at call time)."""
    return check(name, getattr(bindings(), name)(*args))


def failed(name: str, status: int) -> CudaError:
    """The CudaError of a ctypes entry point's nonzero status."""
    api = bindings()
    return CudaError(name, *status_text(api, api.CUresult(status)))


# -- availability and device facts ---------------------------------------------


def initialize() -> None:
    """cuInit, turning a missing driver library into BackendUnavailable."""
    api = bindings()
    try:
        result = api.cuInit(0)
    except Exception as error:  # cuda-bindings raises when libcuda.so cannot be loaded
        raise BackendUnavailable(f"no NVIDIA driver library (libcuda.so): {error}") from error
    status = result[0]
    if status != api.CUresult.CUDA_SUCCESS:
        name, description = status_text(api, status)
        raise BackendUnavailable(f"cuInit failed: {name} ({description})")


def cuda_available() -> tuple[bool, str]:
    """(True, device summary) where the CUDA backend can run, else (False, why not)."""
    from bob.kernels.cuda.compile import NvrtcError, nvrtc_version

    try:
        initialize()
        count = call("cuDeviceGetCount")
        if count < 1:
            return False, "the NVIDIA driver reports no CUDA device"
        nvrtc_version()
        info = describe_device()
    except (BackendUnavailable, CudaError, NvrtcError) as error:
        return False, str(error)
    return True, f"{info.name} ({info.arch}), driver {info.driver_version}"


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: tuple[int, int]
    driver_version: str  # the CUDA version the driver supports, "13.0"
    multiprocessors: int = 0  # SMs: the held kernels run a block on each

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


def kernel_module(path: Path = NVIDIA_VERSION_FILE) -> tuple[str | None, str | None]:
    """('open' | 'proprietary', the NVRM line) from /proc/driver/nvidia/version."""
    try:
        text = path.read_text()
    except OSError:
        return None, None
    if not text.strip():
        return None, None
    kind = "open" if "Open Kernel Module" in text else "proprietary"
    return kind, text.strip().splitlines()[0].strip()


def compute_capability(device: Any) -> tuple[int, int]:
    attribute = bindings().CUdevice_attribute
    major = call("cuDeviceGetAttribute", attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                 device)
    minor = call("cuDeviceGetAttribute", attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                 device)
    return int(major), int(minor)


def device_arch(ordinal: int = 0) -> str:
    """The architecture of device `ordinal`, as NVRTC names it: 'sm_90'."""
    initialize()
    major, minor = compute_capability(call("cuDeviceGet", ordinal))
    return f"sm_{major}{minor}"


def describe_device(ordinal: int = 0) -> DeviceInfo:
    initialize()
    device = call("cuDeviceGet", ordinal)
    name = call("cuDeviceGetName", 256, device)
    version = int(call("cuDriverGetVersion"))
    return DeviceInfo(
        name=name.split(b"\0", 1)[0].decode(errors="replace"),
        compute_capability=compute_capability(device),
        driver_version=f"{version // 1000}.{version % 1000 // 10}",
        multiprocessors=int(call("cuDeviceGetAttribute", bindings().CUdevice_attribute
                                 .CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)),
    )


# -- libcuda's own entry points, through ctypes ---------------------------------


class NativeKernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2 (cuda.h, CUDA 12+) as the C ABI lays it out."""

    _fields_ = (
        ("func", ctypes.c_void_p),
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("kernelParams", ctypes.c_void_p),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    )


def _entry_point(name: str, argtypes: tuple) -> Any:
    """libcuda's function `name` with these argument types, or None where it is missing."""
    with contextlib.suppress(OSError, AttributeError):
        function = getattr(ctypes.CDLL("libcuda.so.1"), name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int
        return function
    return None


@functools.cache  # looked up once
def native_node_update() -> Any:
    """cuGraphExecKernelNodeSetParams_v2, or None: an invocation updates a node per AdamW
    launch whose words changed, and the bindings' argument conversion would dominate
    each. Plain addresses: the hot loop passes ints, converted at C speed."""
    return _entry_point("cuGraphExecKernelNodeSetParams_v2",
                        (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p))


@functools.cache
def native_add_node() -> Any:
    """cuGraphAddKernelNode_v2, or None: a training graph has 1 + 2N nodes, added at the
    first invocation's start-up."""
    return _entry_point("cuGraphAddKernelNode_v2",
                        (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_size_t, ctypes.c_void_p))


@functools.cache
def native_launch() -> Any:
    """cuLaunchKernel, or None (a timed run launches one kernel at a time)."""
    return _entry_point("cuLaunchKernel", (ctypes.c_void_p, *(ctypes.c_uint,) * 7,
                                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p))


# -- thread-block clusters --------------------------------------------------------


def _cluster_attribute(kind: Any) -> Any:
    """The cluster-dimension member of a launch attribute enum: cuda-bindings 13 names the
    kernel node's attributes as the launch's (CU_LAUNCH_ATTRIBUTE_*), 12.x as its own."""
    for name in ("CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION",
                 "CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_DIMENSION"):
        member = getattr(kind, name, None)
        if member is not None:
            return member
    raise BackendUnavailable(f"cuda-bindings names no cluster dimension in {kind.__name__}: "
                             "a cluster launch needs cuda-bindings 12 or later")


def set_node_cluster(node: Any, ctas: int) -> None:
    """Graph kernel node `node` launches in clusters of `ctas` CTAs along x (before the
    graph is instantiated: the executable graph keeps it)."""
    api = bindings()
    value = api.CUkernelNodeAttrValue()
    value.clusterDim.x, value.clusterDim.y, value.clusterDim.z = ctas, 1, 1
    call("cuGraphKernelNodeSetAttribute", node, _cluster_attribute(api.CUkernelNodeAttrID),
         value)


def launch_cluster(function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
                   shared_bytes: int, stream: Any, ctas: int, kernel_params: int) -> None:
    """One kernel launched alone in clusters of `ctas` CTAs along x (cuLaunchKernelEx);
    `kernel_params` is the address of its kernelParams array."""
    api = bindings()
    config = api.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared_bytes
    config.hStream = stream
    attribute = api.CUlaunchAttribute()
    attribute.id = _cluster_attribute(api.CUlaunchAttributeID)
    attribute.value.clusterDim.x, attribute.value.clusterDim.y = ctas, 1
    attribute.value.clusterDim.z = 1
    config.attrs = [attribute]
    config.numAttrs = 1
    call("cuLaunchKernelEx", config, function, kernel_params, 0)
