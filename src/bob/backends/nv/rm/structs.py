"""ctypes layouts and constants of the NVIDIA kernel driver ABI (580 release).

Every structure here is a transcription of a public header of
NVIDIA/open-gpu-kernel-modules; the path is named beside each one and the
tests pin sizes and offsets, so a wrong field is a failing test, not a
driver reading the wrong bytes. Facts, not code, were carried over.

Where a structure changed between releases, the variants are kept side by
side with the release that introduced them:

- ``NVOS46_PARAMETERS`` (map into a GPU VA space) gained ``flags2`` and
  ``kindOverride`` (56 -> 64 bytes). The escape handler compares the ioctl
  size with its own, so a wrong guess fails with EINVAL before anything
  happens; ``memory.py`` tries the newer one first.
- ``NV_CHANNEL_ALLOC_PARAMS`` gained ``tpcConfigID`` at the end (570 -> 590:
  360 -> 368 bytes) and, after 590.48, a ``hHandleVASpace`` in the middle.
  580 has neither mid-struct change: the 590.48.01 header (commit 877fd23)
  still has ``hVASpace`` followed directly by ``hUserdMemory``.
- Allocation parameter blocks are passed with ``paramsSize = 0`` (the driver
  then reads its own size for the class) and a zero tail of ``ALLOC_SLACK``
  bytes, so a field appended in a later release reads as zero.
- Control parameter blocks are checked by size in the driver: a mismatch is
  NV_ERR_INVALID_PARAM_STRUCT or NV_ERR_INVALID_ARGUMENT. The one control
  Bob needs that changed, the channel group schedule, gained ``bSkipEnable``
  (2 -> 3 bytes): 580.159.04 refused the 2-byte block with
  NV_ERR_INVALID_ARGUMENT on the H200. ``channel.py`` sends the 3-byte block
  and falls back to the 2-byte one.
- The build-version control (NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2)
  answered NV_ERR_INVALID_ARGUMENT to the 776-byte block on 580.159.04; the
  version is informational only (the driver file /proc/driver/nvidia/version
  has it).
"""

from __future__ import annotations

import ctypes

NvHandle = ctypes.c_uint32
NvU8 = ctypes.c_uint8
NvU16 = ctypes.c_uint16
NvU32 = ctypes.c_uint32
NvS32 = ctypes.c_int32
NvU64 = ctypes.c_uint64
NvBool = ctypes.c_uint8
NvP64 = ctypes.c_uint64  # user pointers travel as 64-bit integers

# Zero bytes after every allocation parameter block (see the module docstring).
ALLOC_SLACK = 256


class Struct(ctypes.Structure):
    """A C structure with natural alignment, printable for probes and errors."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name, *_ in self._fields_)
        return f"{type(self).__name__}({fields})"


# -- device files and ioctl numbers -------------------------------------------
# kernel-open/common/inc/nv-ioctl-numbers.h, src/nvidia/arch/nvalloc/unix/include/nv_escape.h
CONTROL_DEVICE = "/dev/nvidiactl"
GPU_DEVICE = "/dev/nvidia{minor}"
UVM_DEVICE = "/dev/nvidia-uvm"  # not used: the VA space is RM-owned (see device.py)

NV_IOCTL_MAGIC = ord("F")
NV_ESC_RM_ALLOC_MEMORY = 0x27
NV_ESC_RM_FREE = 0x29
NV_ESC_RM_CONTROL = 0x2A
NV_ESC_RM_ALLOC = 0x2B
NV_ESC_RM_MAP_MEMORY = 0x4E
NV_ESC_RM_UNMAP_MEMORY = 0x4F
NV_ESC_RM_MAP_MEMORY_DMA = 0x57
NV_ESC_RM_UNMAP_MEMORY_DMA = 0x58
NV_ESC_CARD_INFO = 200  # NV_IOCTL_BASE + 0
NV_ESC_REGISTER_FD = 201  # NV_IOCTL_BASE + 1

ESCAPE_NAMES = {
    NV_ESC_RM_ALLOC_MEMORY: "RM_ALLOC_MEMORY",
    NV_ESC_RM_FREE: "RM_FREE",
    NV_ESC_RM_CONTROL: "RM_CONTROL",
    NV_ESC_RM_ALLOC: "RM_ALLOC",
    NV_ESC_RM_MAP_MEMORY: "RM_MAP_MEMORY",
    NV_ESC_RM_UNMAP_MEMORY: "RM_UNMAP_MEMORY",
    NV_ESC_RM_MAP_MEMORY_DMA: "RM_MAP_MEMORY_DMA",
    NV_ESC_RM_UNMAP_MEMORY_DMA: "RM_UNMAP_MEMORY_DMA",
    NV_ESC_CARD_INFO: "CARD_INFO",
    NV_ESC_REGISTER_FD: "REGISTER_FD",
}

# -- classes (src/common/sdk/nvidia/inc/class/) -------------------------------
NV01_ROOT_CLIENT = 0x41
NV01_DEVICE_0 = 0x80
NV20_SUBDEVICE_0 = 0x2080
NV01_MEMORY_SYSTEM = 0x3E
NV01_MEMORY_LOCAL_USER = 0x40
NV01_MEMORY_SYSTEM_OS_DESCRIPTOR = 0x71  # host memory the process already owns
NV50_MEMORY_VIRTUAL = 0x50A0
FERMI_VASPACE_A = 0x90F1
FERMI_CONTEXT_SHARE_A = 0x9067
KEPLER_CHANNEL_GROUP_A = 0xA06C
HOPPER_USERMODE_A = 0xC661
HOPPER_CHANNEL_GPFIFO_A = 0xC86F
HOPPER_COMPUTE_A = 0xCBC0
HOPPER_DMA_COPY_A = 0xC8B5  # the copy engine, allocated on the channel (rm/stream.py)

CLASS_NAMES = {
    NV01_ROOT_CLIENT: "NV01_ROOT_CLIENT",
    NV01_DEVICE_0: "NV01_DEVICE_0",
    NV20_SUBDEVICE_0: "NV20_SUBDEVICE_0",
    NV01_MEMORY_SYSTEM: "NV01_MEMORY_SYSTEM",
    NV01_MEMORY_LOCAL_USER: "NV01_MEMORY_LOCAL_USER",
    NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR",
    NV50_MEMORY_VIRTUAL: "NV50_MEMORY_VIRTUAL",
    FERMI_VASPACE_A: "FERMI_VASPACE_A",
    FERMI_CONTEXT_SHARE_A: "FERMI_CONTEXT_SHARE_A",
    KEPLER_CHANNEL_GROUP_A: "KEPLER_CHANNEL_GROUP_A",
    HOPPER_USERMODE_A: "HOPPER_USERMODE_A",
    HOPPER_CHANNEL_GPFIFO_A: "HOPPER_CHANNEL_GPFIFO_A",
    HOPPER_COMPUTE_A: "HOPPER_COMPUTE_A",
    HOPPER_DMA_COPY_A: "HOPPER_DMA_COPY_A",
}

# The classes a Hopper submission needs, all of which must be in the class list.
HOPPER_REQUIRED_CLASSES = (HOPPER_USERMODE_A, HOPPER_CHANNEL_GPFIFO_A, HOPPER_COMPUTE_A)

# -- controls (src/common/sdk/nvidia/inc/ctrl/) --------------------------------
NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2 = 0x13E  # ctrl0000system.h
NV0080_CTRL_CMD_GPU_GET_CLASSLIST = 0x800201  # ctrl0080gpu.h
NVA06C_CTRL_CMD_GPFIFO_SCHEDULE = 0xA06C0101  # ctrla06c.h
NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN = 0xC36F0108  # ctrlc36f.h
NV2080_CTRL_CMD_PERF_BOOST = 0x2080200A  # ctrl2080perf.h
NV2080_CTRL_CMD_GPU_GET_ENGINES_V2 = 0x20800170  # ctrl2080gpu.h: the engines the GPU has

CONTROL_NAMES = {
    NV2080_CTRL_CMD_PERF_BOOST: "NV2080_CTRL_CMD_PERF_BOOST",
    NV2080_CTRL_CMD_GPU_GET_ENGINES_V2: "NV2080_CTRL_CMD_GPU_GET_ENGINES_V2",
    NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2: "NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2",
    NV0080_CTRL_CMD_GPU_GET_CLASSLIST: "NV0080_CTRL_CMD_GPU_GET_CLASSLIST",
    NVA06C_CTRL_CMD_GPFIFO_SCHEDULE: "NVA06C_CTRL_CMD_GPFIFO_SCHEDULE",
    NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN: "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN",
}

# -- escape parameter blocks (src/common/sdk/nvidia/inc/nvos.h) ----------------


class NVOS00_PARAMETERS(Struct):  # RM_FREE
    _fields_ = [
        ("hRoot", NvHandle),
        ("hObjectParent", NvHandle),
        ("hObjectOld", NvHandle),
        ("status", NvU32),
    ]


class NVOS21_PARAMETERS(Struct):  # RM_ALLOC
    _fields_ = [
        ("hRoot", NvHandle),
        ("hObjectParent", NvHandle),
        ("hObjectNew", NvHandle),
        ("hClass", NvU32),
        ("pAllocParms", NvP64),
        ("paramsSize", NvU32),
        ("status", NvU32),
    ]


class NVOS54_PARAMETERS(Struct):  # RM_CONTROL
    _fields_ = [
        ("hClient", NvHandle),
        ("hObject", NvHandle),
        ("cmd", NvU32),
        ("flags", NvU32),
        ("params", NvP64),
        ("paramsSize", NvU32),
        ("status", NvU32),
    ]


class NVOS02_PARAMETERS(Struct):  # RM_ALLOC_MEMORY (nvos.h)
    _fields_ = [
        ("hRoot", NvHandle),
        ("hObjectParent", NvHandle),
        ("hObjectNew", NvHandle),
        ("hClass", NvU32),
        ("flags", NvU32),
        ("pMemory", NvP64),
        ("limit", NvU64),
        ("status", NvU32),
    ]


class nv_ioctl_nvos02_parameters_with_fd(Struct):  # nv-ioctl.h
    _fields_ = [("params", NVOS02_PARAMETERS), ("fd", ctypes.c_int)]


# NVOS02 flags (nvos.h): the OS descriptor of host memory Bob allocated itself.
NVOS02_FLAGS_PHYSICALITY_NONCONTIGUOUS = 0x1 << 4  # 7:4
NVOS02_FLAGS_LOCATION_PCI = 0x0 << 8  # 11:8
NVOS02_FLAGS_COHERENCY_CACHED = 0x1 << 12  # 15:12
NVOS02_FLAGS_MAPPING_NO_MAP = 0x1 << 30  # 31:30: RM makes no CPU mapping of its own


class NVOS33_PARAMETERS(Struct):  # RM_MAP_MEMORY (CPU mapping)
    _fields_ = [
        ("hClient", NvHandle),
        ("hDevice", NvHandle),
        ("hMemory", NvHandle),
        ("offset", NvU64),
        ("length", NvU64),
        ("pLinearAddress", NvP64),
        ("status", NvU32),
        ("flags", NvU32),
    ]


class NVOS34_PARAMETERS(Struct):  # RM_UNMAP_MEMORY
    _fields_ = [
        ("hClient", NvHandle),
        ("hDevice", NvHandle),
        ("hMemory", NvHandle),
        ("pLinearAddress", NvP64),
        ("status", NvU32),
        ("flags", NvU32),
    ]


class NVOS46_PARAMETERS(Struct):  # RM_MAP_MEMORY_DMA, 580/590 layout
    _fields_ = [
        ("hClient", NvHandle),
        ("hDevice", NvHandle),
        ("hDma", NvHandle),
        ("hMemory", NvHandle),
        ("offset", NvU64),
        ("length", NvU64),
        ("flags", NvU32),
        ("flags2", NvU32),
        ("kindOverride", NvU32),
        ("dmaOffset", NvU64),
        ("status", NvU32),
    ]


class NVOS46_PARAMETERS_LEGACY(Struct):  # RM_MAP_MEMORY_DMA before flags2/kindOverride
    _fields_ = [
        ("hClient", NvHandle),
        ("hDevice", NvHandle),
        ("hDma", NvHandle),
        ("hMemory", NvHandle),
        ("offset", NvU64),
        ("length", NvU64),
        ("flags", NvU32),
        ("dmaOffset", NvU64),
        ("status", NvU32),
    ]


class NVOS47_PARAMETERS(Struct):  # RM_UNMAP_MEMORY_DMA
    _fields_ = [
        ("hClient", NvHandle),
        ("hDevice", NvHandle),
        ("hDma", NvHandle),
        ("hMemory", NvHandle),
        ("flags", NvU32),
        ("dmaOffset", NvU64),
        ("size", NvU64),
        ("status", NvU32),
    ]


# kernel-open/common/inc/nv-ioctl.h
class nv_ioctl_nvos33_parameters_with_fd(Struct):
    _fields_ = [("params", NVOS33_PARAMETERS), ("fd", ctypes.c_int)]


class nv_ioctl_register_fd_t(Struct):
    _fields_ = [("ctl_fd", ctypes.c_int)]


# -- allocation parameter blocks ----------------------------------------------


class NV0080_ALLOC_PARAMETERS(Struct):  # class/cl0080.h
    _fields_ = [
        ("deviceId", NvU32),
        ("hClientShare", NvHandle),
        ("hTargetClient", NvHandle),
        ("hTargetDevice", NvHandle),
        ("flags", NvU32),
        ("vaSpaceSize", NvU64),
        ("vaStartInternal", NvU64),
        ("vaLimitInternal", NvU64),
        ("vaMode", NvU32),
    ]


NV_DEVICE_ALLOCATION_VAMODE_MULTIPLE_VASPACES = 0x2  # nvos.h: every VA space explicit


class NV2080_ALLOC_PARAMETERS(Struct):  # class/cl2080.h
    _fields_ = [("subDeviceId", NvU32)]


class NV_VASPACE_ALLOCATION_PARAMETERS(Struct):  # class/cl90f1.h (later: + pasid)
    _fields_ = [
        ("index", NvU32),
        ("flags", NvU32),
        ("vaSize", NvU64),
        ("vaStartInternal", NvU64),
        ("vaLimitInternal", NvU64),
        ("bigPageSize", NvU32),
        ("vaBase", NvU64),
    ]


NV_VASPACE_ALLOCATION_INDEX_GPU_NEW = 0x00
# Flags 0: RM owns the page tables; no page faulting, no UVM.
NV_VASPACE_ALLOCATION_FLAGS_NONE = 0x0


class NV_MEMORY_ALLOCATION_PARAMS(Struct):  # nvos.h
    _fields_ = [
        ("owner", NvU32),
        ("type", NvU32),
        ("flags", NvU32),
        ("width", NvU32),
        ("height", NvU32),
        ("pitch", NvS32),
        ("attr", NvU32),
        ("attr2", NvU32),
        ("format", NvU32),
        ("comprCovg", NvU32),
        ("zcullCovg", NvU32),
        ("rangeLo", NvU64),
        ("rangeHi", NvU64),
        ("size", NvU64),
        ("alignment", NvU64),
        ("offset", NvU64),
        ("limit", NvU64),
        ("address", NvP64),
        ("ctagOffset", NvU32),
        ("hVASpace", NvHandle),
        ("internalflags", NvU32),
        ("tag", NvU32),
        ("numaNode", NvS32),
    ]


# NVOS32 surface types, attribute and flag fields (nvos.h).
NVOS32_TYPE_IMAGE = 0
NVOS32_TYPE_NOTIFIER = 13

NVOS32_ATTR_PAGE_SIZE_SHIFT = 23  # 24:23
NVOS32_ATTR_PAGE_SIZE_4KB = 0x1
NVOS32_ATTR_PAGE_SIZE_BIG = 0x2
NVOS32_ATTR_LOCATION_SHIFT = 25  # 26:25
NVOS32_ATTR_LOCATION_VIDMEM = 0x0
NVOS32_ATTR_LOCATION_PCI = 0x1
NVOS32_ATTR_PHYSICALITY_SHIFT = 27  # 28:27
NVOS32_ATTR_PHYSICALITY_NONCONTIGUOUS = 0x1
NVOS32_ATTR_PHYSICALITY_CONTIGUOUS = 0x2
NVOS32_ATTR_PHYSICALITY_ALLOW_NONCONTIGUOUS = 0x3
NVOS32_ATTR_COHERENCY_SHIFT = 29  # 31:29
NVOS32_ATTR_COHERENCY_UNCACHED = 0x0
NVOS32_ATTR_COHERENCY_CACHED = 0x1

NVOS32_ATTR2_ZBC_PREFER_NO_ZBC = 0x1  # 1:0
NVOS32_ATTR2_GPU_CACHEABLE_SHIFT = 2  # 3:2
NVOS32_ATTR2_GPU_CACHEABLE_YES = 0x1
NVOS32_ATTR2_GPU_CACHEABLE_NO = 0x2

NVOS32_ALLOC_FLAGS_FIXED_ADDRESS_ALLOCATE = 0x00000010
NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE = 0x00000100
NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED = 0x00004000
NVOS32_ALLOC_FLAGS_MAP_NOT_REQUIRED = 0x00008000
NVOS32_ALLOC_FLAGS_PERSISTENT_VIDMEM = 0x00010000
NVOS32_ALLOC_FLAGS_VIRTUAL = 0x00080000

# NVOS33 (CPU mapping) flags.
NVOS33_FLAGS_ACCESS_READ_WRITE = 0x0  # 1:0
NVOS33_FLAGS_ACCESS_WRITE_ONLY = 0x2
NVOS33_FLAGS_CACHING_TYPE_SHIFT = 23  # 25:23
NVOS33_FLAGS_CACHING_TYPE_UNCACHED = 1
NVOS33_FLAGS_CACHING_TYPE_WRITECOMBINED = 2

# NVOS46 (GPU mapping) flags.
NVOS46_FLAGS_ACCESS_READ_WRITE = 0x0  # 1:0
NVOS46_FLAGS_CACHE_SNOOP_ENABLE = 0x1 << 4  # 4:4
NVOS46_FLAGS_PAGE_SIZE_SHIFT = 8  # 11:8
NVOS46_FLAGS_PAGE_SIZE_4KB = 0x1
NVOS46_FLAGS_PAGE_SIZE_BIG = 0x2
NVOS46_FLAGS_DMA_OFFSET_FIXED = 0x1 << 15  # 15:15: dmaOffset is an absolute VA


class NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS(Struct):  # class/cla06c.h
    _fields_ = [
        ("hObjectError", NvHandle),
        ("hObjectEccError", NvHandle),
        ("hVASpace", NvHandle),
        ("engineType", NvU32),
        ("bIsCallingContextVgpuPlugin", NvBool),
    ]


NV2080_ENGINE_TYPE_GRAPHICS = 0x1  # ctrl2080gpu.h: compute runs on the graphics engine
# The copy engines COPY0 .. COPY9 (cl2080.h): a channel group on one of them runs beside
# the graphics engine's (rm/stream.py's copy channel).
NV2080_ENGINE_TYPE_COPY = tuple(range(0x9, 0x13))
NV2080_GPU_MAX_ENGINES_LIST_SIZE = 0x54


class NV_CTXSHARE_ALLOCATION_PARAMETERS(Struct):  # class/cl9067.h
    _fields_ = [
        ("hVASpace", NvHandle),
        ("flags", NvU32),
        ("subctxId", NvU32),
    ]


NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC = 0x1  # 1:0


class NV_MEMORY_DESC_PARAMS(Struct):  # alloc/alloc_channel.h
    _fields_ = [
        ("base", NvU64),
        ("size", NvU64),
        ("addressSpace", NvU32),
        ("cacheAttrib", NvU32),
    ]


NV_MAX_SUBDEVICES = 8  # nvlimits.h


class NV_CHANNEL_ALLOC_PARAMS(Struct):  # alloc/alloc_channel.h, 580 and 590.48
    _fields_ = [
        ("hObjectError", NvHandle),
        ("hObjectBuffer", NvHandle),
        ("gpFifoOffset", NvU64),
        ("gpFifoEntries", NvU32),
        ("flags", NvU32),
        ("hContextShare", NvHandle),
        ("hVASpace", NvHandle),
        ("hUserdMemory", NvHandle * NV_MAX_SUBDEVICES),
        ("userdOffset", NvU64 * NV_MAX_SUBDEVICES),
        ("engineType", NvU32),
        ("cid", NvU32),
        ("subDeviceId", NvU32),
        ("hObjectEccError", NvHandle),
        ("instanceMem", NV_MEMORY_DESC_PARAMS),
        ("userdMem", NV_MEMORY_DESC_PARAMS),
        ("ramfcMem", NV_MEMORY_DESC_PARAMS),
        ("mthdbufMem", NV_MEMORY_DESC_PARAMS),
        ("hPhysChannelGroup", NvHandle),
        ("internalFlags", NvU32),
        ("errorNotifierMem", NV_MEMORY_DESC_PARAMS),
        ("eccErrorNotifierMem", NV_MEMORY_DESC_PARAMS),
        ("ProcessID", NvU32),
        ("SubProcessID", NvU32),
        ("encryptIv", NvU32 * 3),
        ("decryptIv", NvU32 * 3),
        ("hmacNonce", NvU32 * 8),
        ("tpcConfigID", NvU32),
    ]


# -- control parameter blocks --------------------------------------------------


class NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS(Struct):  # ctrl0000system.h
    _fields_ = [
        ("driverVersionBuffer", ctypes.c_char * 256),
        ("versionBuffer", ctypes.c_char * 256),
        ("titleBuffer", ctypes.c_char * 256),
        ("changelistNumber", NvU32),
        ("officialChangelistNumber", NvU32),
    ]


class NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS(Struct):  # ctrl0080gpu.h
    _fields_ = [("numClasses", NvU32), ("classList", NvP64)]


class NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS(Struct):  # ctrla06f/ctrla06fgpfifo.h, 580.159
    _fields_ = [("bEnable", NvBool), ("bSkipSubmit", NvBool), ("bSkipEnable", NvBool)]


class NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS_570(Struct):  # 570.144: no bSkipEnable
    _fields_ = [("bEnable", NvBool), ("bSkipSubmit", NvBool)]


class NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS(Struct):  # ctrlc36f.h
    _fields_ = [("workSubmitToken", NvU32)]


# -- channel memory the host reads (class/clc86f.h, class/clc661.h) ------------
NVC361_NV_USERMODE_SIZE = 0x10000
NVC361_NOTIFY_CHANNEL_PENDING = 0x90  # the doorbell: write the work submit token here

USERD_BYTES = 0x200  # HopperAControlGPFifo
USERD_GP_GET = 0x88  # read only: the next entry the host will fetch
USERD_GP_PUT = 0x8C  # one past the last entry the host may fetch

GP_ENTRY_BYTES = 8

# NvNotification (nvgputypes.h): the channel error notifier is an array of these.
NOTIFICATION_BYTES = 16
NV_CHANNELGPFIFO_NOTIFICATION_TYPE_ERROR = 0
NV_CHANNELGPFIFO_NOTIFICATION_TYPE_WORK_SUBMIT_TOKEN = 1
NV_CHANNELGPFIFO_NOTIFICATION_TYPE_SIZE = 3


class NV2080_CTRL_GPU_GET_ENGINES_V2_PARAMS(Struct):  # ctrl2080gpu.h
    _fields_ = [
        ("engineCount", NvU32),
        ("engineList", NvU32 * NV2080_GPU_MAX_ENGINES_LIST_SIZE),
    ]


class NV2080_CTRL_PERF_BOOST_PARAMS(Struct):  # ctrl2080perf.h
    _fields_ = [("flags", NvU32), ("duration", NvU32)]


# Boost to the highest P-state as a CUDA client with high priority, until the client goes
# (flags CMD 1:0 = BOOST_TO_MAX, CUDA 4:4 = YES, CUDA_PRIORITY 6:6 = HIGH).
NV2080_CTRL_PERF_BOOST_FLAGS_CMD_BOOST_TO_MAX = 0x2
NV2080_CTRL_PERF_BOOST_FLAGS_CUDA_YES = 0x1 << 4
NV2080_CTRL_PERF_BOOST_FLAGS_CUDA_PRIORITY_HIGH = 0x1 << 6
NV2080_CTRL_PERF_BOOST_DURATION_INFINITE = 0xFFFFFFFF


def alloc_buffer(params: ctypes.Structure) -> ctypes.Array:
    """The bytes of an allocation parameter block followed by ALLOC_SLACK zeros."""
    buffer = (ctypes.c_char * (ctypes.sizeof(params) + ALLOC_SLACK))()
    ctypes.memmove(buffer, ctypes.addressof(params), ctypes.sizeof(params))
    return buffer
