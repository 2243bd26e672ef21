"""The RM object tree Bob needs before it can allocate memory or a channel.

    client (NV01_ROOT_CLIENT, on /dev/nvidiactl)
     └ device (NV01_DEVICE_0)           every VA space explicit
        ├ subdevice (NV20_SUBDEVICE_0)
        │  └ usermode (HOPPER_USERMODE_A) mapped: the doorbell page
        └ VA space (FERMI_VASPACE_A)    RM-owned page tables

The VA space is owned by RM (no UVM): memory is placed at a chosen GPU
address by reserving the range (``NV50_MEMORY_VIRTUAL``) and mapping into it
(``RM_MAP_MEMORY_DMA``). That is the path NVIDIA's own ``nvidia-push``
library takes for its channels; it needs no ``/dev/nvidia-uvm`` and none of
UVM's registration calls, and the GPU addresses need not be CPU addresses.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import re
from collections.abc import Callable
from pathlib import Path

from bob.backends.nv.encoder import ARCHITECTURES
from bob.errors import BackendUnavailable

from . import structs as s
from .ioctl import RmError, Transport, check_status, escape

Log = Callable[[str], None]
# The architecture the kernel-driver path submits to: the one whose compute class is the
# Hopper class every device here must list (structs.HOPPER_REQUIRED_CLASSES).
SUBMITTED_TARGET = next(arch.target for arch in ARCHITECTURES.values()
                        if arch.compute.number == s.HOPPER_COMPUTE_A)
CLASS_LIST_CAPACITY = 1024  # a GPU lists a few hundred classes


def _class_name(number: int) -> str:
    return s.CLASS_NAMES.get(number, f"class 0x{number:04x}")


NVIDIA_VERSION_FILE = Path("/proc/driver/nvidia/version")
_MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


def module_version(text: str | None = None) -> str | None:
    """The driver version the kernel module states ("580.159.04"), or None."""
    if text is None:
        try:
            text = NVIDIA_VERSION_FILE.read_text()
        except OSError:
            return None
    found = _MODULE_VERSION.search(text)
    return found.group(1) if found else None


class RmClient:
    """One RM client: the control file, the root handle, and the calls on it."""

    def __init__(self, transport: Transport | None = None, minor: int = 0, log: Log | None = None):
        self.transport = transport or Transport()
        self.minor = minor
        self.log = log or (lambda message: None)
        self._fds: list[int] = []
        self.ctl = self.transport.open(s.CONTROL_DEVICE)
        self._fds.append(self.ctl)
        self.root = 0
        self.root = self.alloc(0, s.NV01_ROOT_CLIENT)

    # -- the escapes ------------------------------------------------------------
    def alloc(self, parent: int, cls: int, params: ctypes.Structure | None = None) -> int:
        """RM_ALLOC: a new object of `cls` under `parent`; returns its handle.

        The parameter block travels with a zero tail and ``paramsSize = 0`` so
        the driver reads its own size for the class (see structs.py). Output
        fields are copied back into `params`.
        """
        buffer = s.alloc_buffer(params) if params is not None else None
        request = s.NVOS21_PARAMETERS(
            hRoot=self.root, hObjectParent=parent, hObjectNew=0, hClass=cls,
            pAllocParms=ctypes.addressof(buffer) if buffer is not None else 0, paramsSize=0)
        call = f"RM_ALLOC({_class_name(cls)} under 0x{parent:x})"
        escape(self.transport, self.ctl, s.NV_ESC_RM_ALLOC, request, call)
        check_status(call, request.status)
        if params is not None:
            ctypes.memmove(ctypes.addressof(params), buffer, ctypes.sizeof(params))
        self.log(f"{call} -> handle 0x{request.hObjectNew:08x}")
        return request.hObjectNew

    def control(self, handle: int, cmd: int, params: ctypes.Structure) -> ctypes.Structure:
        """RM_CONTROL: the parameter block must be exactly the driver's size."""
        request = s.NVOS54_PARAMETERS(
            hClient=self.root, hObject=handle, cmd=cmd, flags=0,
            params=ctypes.addressof(params), paramsSize=ctypes.sizeof(params))
        name = s.CONTROL_NAMES.get(cmd, f"control 0x{cmd:08x}")
        call = f"RM_CONTROL({name} on 0x{handle:x})"
        escape(self.transport, self.ctl, s.NV_ESC_RM_CONTROL, request, call)
        check_status(call, request.status)
        return params

    def free(self, handle: int, parent: int = 0) -> None:
        request = s.NVOS00_PARAMETERS(hRoot=self.root, hObjectParent=parent, hObjectOld=handle)
        call = f"RM_FREE(0x{handle:x})"
        escape(self.transport, self.ctl, s.NV_ESC_RM_FREE, request, call)
        check_status(call, request.status)

    def open_gpu_file(self) -> int:
        """A new /dev/nvidiaN file registered with this client's control file."""
        fd = self.transport.open(s.GPU_DEVICE.format(minor=self.minor))
        self._fds.append(fd)
        register = s.nv_ioctl_register_fd_t(ctl_fd=self.ctl)
        escape(self.transport, fd, s.NV_ESC_REGISTER_FD, register, "REGISTER_FD")
        return fd

    def open_control_file(self) -> int:
        fd = self.transport.open(s.CONTROL_DEVICE)
        self._fds.append(fd)
        return fd

    def map_cpu(self, device: int, memory: int, length: int, file: int,
                flags: int = 0) -> mmap.mmap:
        """RM_MAP_MEMORY on `file`, then mmap of that file: a CPU view of the memory."""
        request = s.nv_ioctl_nvos33_parameters_with_fd(
            params=s.NVOS33_PARAMETERS(hClient=self.root, hDevice=device, hMemory=memory,
                                       offset=0, length=length, flags=flags),
            fd=file)
        call = f"RM_MAP_MEMORY(0x{memory:x}, {length} bytes)"
        escape(self.transport, self.ctl, s.NV_ESC_RM_MAP_MEMORY, request, call)
        check_status(call, request.params.status)
        try:
            return self.transport.mmap(file, length)
        except OSError as error:
            raise RmError(f"mmap of {call}", "mmap", error.strerror or str(error),
                          error.errno or 0) from None

    def close(self) -> None:
        """Free the client (the driver frees every object under it) and close the files."""
        if self.root:
            try:
                self.free(self.root)
            except RmError as error:
                self.log(f"freeing the client: {error}")
            self.root = 0
        for fd in reversed(self._fds):
            with contextlib.suppress(OSError):
                self.transport.close(fd)
        self._fds.clear()


class RmDevice:
    """Device, subdevice, class list, VA space and doorbell of one GPU."""

    def __init__(self, client: RmClient):
        self.client = client
        self.gpu_file = client.open_gpu_file()  # attaches the GPU to this client
        self.driver_version = self._driver_version()
        self.device = client.alloc(client.root, s.NV01_DEVICE_0, s.NV0080_ALLOC_PARAMETERS(
            deviceId=0, hClientShare=client.root,
            vaMode=s.NV_DEVICE_ALLOCATION_VAMODE_MULTIPLE_VASPACES))
        self.subdevice = client.alloc(self.device, s.NV20_SUBDEVICE_0,
                                      s.NV2080_ALLOC_PARAMETERS(subDeviceId=0))
        self.classes = self._class_list()
        self.boost = self._boost_clocks()
        missing = [c for c in s.HOPPER_REQUIRED_CLASSES if c not in self.classes]
        if missing:
            compute = sorted(c for c in self.classes if c & 0xFF == 0xC0)
            raise BackendUnavailable(
                "this GPU lacks " + ", ".join(f"{_class_name(c)} (0x{c:04x})" for c in missing)
                + f"; the nv backend submits to Hopper ({SUBMITTED_TARGET}) only. Compute "
                "classes here: "
                + (", ".join(f"0x{c:04x}" for c in compute) or "none"))
        self.vaspace = client.alloc(self.device, s.FERMI_VASPACE_A,
                                    s.NV_VASPACE_ALLOCATION_PARAMETERS(
                                        index=s.NV_VASPACE_ALLOCATION_INDEX_GPU_NEW,
                                        flags=s.NV_VASPACE_ALLOCATION_FLAGS_NONE))
        self.usermode = client.alloc(self.subdevice, s.HOPPER_USERMODE_A)
        self._usermode_file = client.open_gpu_file()
        self.usermode_map = client.map_cpu(self.device, self.usermode, s.NVC361_NV_USERMODE_SIZE,
                                           self._usermode_file,
                                           flags=s.NVOS33_FLAGS_ACCESS_WRITE_ONLY)
        self._doorbell = ctypes.c_uint32.from_buffer(self.usermode_map,
                                                     s.NVC361_NOTIFY_CHANNEL_PENDING)

    def _driver_version(self) -> str:
        params = s.NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS()
        try:
            self.client.control(self.client.root, s.NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2,
                                params)
        except RmError as error:  # informational only: the version is not needed
            # Some drivers refuse this query's layout; the module states its version too.
            return module_version() or f"unknown ({error.status_name})"
        return params.driverVersionBuffer.decode(errors="replace")

    def _boost_clocks(self) -> str:
        """Ask for the highest P-state while this client lives, as the CUDA driver does for
        its contexts. Without it the GPU idles at low clocks between Bob's submissions,
        and short launches run several times slower. A refusal is not fatal; it is
        reported."""
        params = s.NV2080_CTRL_PERF_BOOST_PARAMS(
            flags=(s.NV2080_CTRL_PERF_BOOST_FLAGS_CMD_BOOST_TO_MAX
                   | s.NV2080_CTRL_PERF_BOOST_FLAGS_CUDA_YES
                   | s.NV2080_CTRL_PERF_BOOST_FLAGS_CUDA_PRIORITY_HIGH),
            duration=s.NV2080_CTRL_PERF_BOOST_DURATION_INFINITE)
        try:
            self.client.control(self.subdevice, s.NV2080_CTRL_CMD_PERF_BOOST, params)
        except RmError as error:
            return f"refused: {error}"
        return "highest P-state"

    def _class_list(self) -> frozenset[int]:
        # One call with room to spare; the driver writes the count it filled in.
        classes = (s.NvU32 * CLASS_LIST_CAPACITY)()
        listing = s.NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS(numClasses=CLASS_LIST_CAPACITY,
                                                        classList=ctypes.addressof(classes))
        self.client.control(self.device, s.NV0080_CTRL_CMD_GPU_GET_CLASSLIST, listing)
        return frozenset(classes[i] for i in range(listing.numClasses))

    def ring_doorbell(self, token: int) -> None:
        """Tell the host a channel has new GPFIFO entries (a 32-bit store to usermode)."""
        self._doorbell.value = token

    def close(self) -> None:
        del self._doorbell
        self.usermode_map.close()
