"""Test doubles for the nv backend's kernel-driver layer: a scripted transport (no device
files, no driver) and a driver behind it that answers escapes the way RM does."""

from __future__ import annotations

import errno
import mmap

from bob.backends.nv.rm import structs as s
from bob.backends.nv.rm.ioctl import Transport
from bob.errors import BackendUnavailable


class FakeTransport(Transport):
    """A scripted stand-in for tests: no device files, no driver.

    ``files`` maps paths to what opening them does: an int fd, or an
    exception to raise. ``handler(fd, escape, argument)`` answers ioctls by
    filling the argument in place (status fields included) or raising
    OSError.
    """

    def __init__(self, files: dict[str, int | BaseException], handler=None):
        self.files = files
        self.handler = handler
        self.calls: list[tuple[int, int, str]] = []

    def open(self, path: str) -> int:
        what = self.files.get(path, FileNotFoundError(errno.ENOENT, "No such file", path))
        if isinstance(what, FileNotFoundError):
            raise BackendUnavailable(f"{path} does not exist: the NVIDIA kernel driver is not "
                                     "loaded here") from None
        if isinstance(what, PermissionError):
            raise BackendUnavailable(f"cannot open {path}: permission denied") from None
        if isinstance(what, BaseException):
            raise what
        return what

    def close(self, fd: int) -> None:
        pass

    def ioctl(self, fd: int, request: int, argument) -> None:
        number = request & 0xFF
        self.calls.append((fd, number, type(argument).__name__))
        if self.handler is None:
            raise OSError(errno.ENOTTY, "no driver")
        self.handler(fd, number, argument)

    def mmap(self, fd: int, length: int, offset: int = 0) -> mmap.mmap:
        return mmap.mmap(-1, length)


CTL, GPU = 10, 11
HOPPER_CLASSES = (s.NV01_ROOT_CLIENT, s.NV01_DEVICE_0, s.NV20_SUBDEVICE_0, s.FERMI_VASPACE_A,
                  s.HOPPER_USERMODE_A, s.HOPPER_CHANNEL_GPFIFO_A, s.HOPPER_COMPUTE_A,
                  s.KEPLER_CHANNEL_GROUP_A, 0xC8B5)
AMPERE_CLASSES = (s.NV01_ROOT_CLIENT, s.NV01_DEVICE_0, 0xC561, 0xC56F, 0xC6C0, 0xC7C0)


class FakeDriver:
    """Answers escapes the way RM does, from a few rules; records every object."""

    def __init__(self, classes=HOPPER_CLASSES, refuse=None, legacy_map_dma=False,
                 refuse_controls=None, engines=(s.NV2080_ENGINE_TYPE_GRAPHICS, 0x9, 0xA)):
        self.classes = classes
        self.engines = engines  # what NV2080_CTRL_CMD_GPU_GET_ENGINES_V2 lists
        self.refuse = refuse or {}  # class -> status
        self.refuse_controls = refuse_controls or {}  # control -> status
        self.boosts: list[tuple[int, int, int]] = []  # (object, flags, duration)
        self.legacy_map_dma = legacy_map_dma
        self.objects: dict[int, tuple[int, int]] = {}  # handle -> (class, parent)
        self.virtual_va: dict[int, int] = {}
        self.next_handle = 0xC1D00000
        self.next_va = 0x40_0000_0000
        self.controls: list[int] = []
        self.host_memory: dict[int, tuple[int, int, int, int]] = {}  # -> address, size, flags, fd
        self.freed: list[int] = []

    def transport(self, files=None) -> FakeTransport:
        files = files or {s.CONTROL_DEVICE: CTL, s.GPU_DEVICE.format(minor=0): GPU}
        return FakeTransport(files, self.handle)

    def handle(self, fd, number, argument):
        if number == s.NV_ESC_RM_ALLOC:
            self.alloc(argument)
        elif number == s.NV_ESC_RM_CONTROL:
            self.control(argument)
        elif number == s.NV_ESC_RM_MAP_MEMORY_DMA:
            if self.legacy_map_dma and isinstance(argument, s.NVOS46_PARAMETERS):
                raise OSError(errno.EINVAL, "Invalid argument")
            argument.dmaOffset = self.virtual_va[argument.hDma] + argument.dmaOffset
            argument.status = 0
        elif number == s.NV_ESC_RM_MAP_MEMORY:
            argument.params.status = 0
        elif number == s.NV_ESC_RM_ALLOC_MEMORY:
            self.alloc_memory(fd, argument.params)
        elif number == s.NV_ESC_RM_FREE:
            self.freed.append(argument.hObjectOld)
            argument.status = 0
        elif number == s.NV_ESC_REGISTER_FD:
            pass
        else:
            raise OSError(errno.ENOTTY, "unknown escape")

    def alloc(self, request):
        if request.hClass in self.refuse:
            request.status = self.refuse[request.hClass]
            return
        handle = self.next_handle
        self.next_handle += 1
        self.objects[handle] = (request.hClass, request.hObjectParent)
        if request.hClass == s.NV50_MEMORY_VIRTUAL:
            params = s.NV_MEMORY_ALLOCATION_PARAMS.from_address(request.pAllocParms)
            if not params.flags & s.NVOS32_ALLOC_FLAGS_FIXED_ADDRESS_ALLOCATE:
                params.offset = self.next_va
                self.next_va += 1 << 30
            self.virtual_va[handle] = params.offset
        request.hObjectNew = handle
        request.status = 0

    def alloc_memory(self, fd, params):
        """RM_ALLOC_MEMORY: only OS descriptors (process memory) are described here."""
        assert params.hClass == s.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
        if params.hClass in self.refuse:
            params.status = self.refuse[params.hClass]
            return
        assert params.hObjectNew not in self.objects  # the caller chose a fresh handle
        self.objects[params.hObjectNew] = (params.hClass, params.hObjectParent)
        self.host_memory[params.hObjectNew] = (params.pMemory, params.limit + 1, params.flags, fd)
        params.status = 0

    def control(self, request):
        self.controls.append(request.cmd)
        if request.cmd in self.refuse_controls:
            request.status = self.refuse_controls[request.cmd]
            return
        if request.cmd == s.NV2080_CTRL_CMD_PERF_BOOST:
            params = s.NV2080_CTRL_PERF_BOOST_PARAMS.from_address(request.params)
            self.boosts.append((request.hObject, params.flags, params.duration))
        if request.cmd == s.NV0080_CTRL_CMD_GPU_GET_CLASSLIST:
            params = s.NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS.from_address(request.params)
            if params.classList:
                array = (s.NvU32 * params.numClasses).from_address(params.classList)
                for i, cls in enumerate(self.classes[:params.numClasses]):
                    array[i] = cls
            filled = min(len(self.classes), params.numClasses)
            params.numClasses = filled if params.classList else len(self.classes)
        elif request.cmd == s.NV2080_CTRL_CMD_GPU_GET_ENGINES_V2:
            params = s.NV2080_CTRL_GPU_GET_ENGINES_V2_PARAMS.from_address(request.params)
            params.engineCount = len(self.engines)
            for index, engine in enumerate(self.engines):
                params.engineList[index] = engine
        elif request.cmd == s.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN:
            if not any(parent == request.hObject for _, parent in self.objects.values()):
                request.status = 0x40  # NV_ERR_INVALID_STATE: no engine object binds it yet
                return  # (the H200's 580 driver answers so)
            params = s.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS.from_address(
                request.params)
            params.workSubmitToken = 0x10023
        elif request.cmd == s.NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2:
            params = s.NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS.from_address(
                request.params)
            params.driverVersionBuffer = b"580.159.04"
        request.status = 0
