"""Transport to the NVIDIA kernel driver, and the one checker every result passes.

Two layers, kept apart:

- ``Transport`` moves bytes: it opens device files, issues ``ioctl`` on a
  ctypes buffer, maps a file into memory. It knows nothing of RM objects.
  The tests stand a scripted one in for it (``tests/nv_fakes.py``).
- ``check_errno`` / ``check_status`` turn what came back into a typed error
  naming the call, the status, and what the status means. Every ioctl result
  in this package goes through them.

Errors a user can act on derive from Bob's own: a missing driver, a missing
permission or a GPU without the Hopper classes is ``BackendUnavailable``
(the backend cannot run here, the message says why); a driver refusing a call
is ``RmStatusError``, an ioctl that fails with an errno ``RmIoctlError``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
from dataclasses import dataclass

from bob.errors import BackendUnavailable, RunFailure

from . import structs as s

# -- ioctl number encoding (linux/ioctl.h: dir 31:30, size 29:16, type 15:8, nr 7:0)
IOC_WRITE = 1
IOC_READ = 2
IOC_SIZE_BITS = 14
IOC_SIZE_MAX = (1 << IOC_SIZE_BITS) - 1


def iowr(type_: int, nr: int, size: int) -> int:
    """_IOWR(type, nr, size): the request number of a read-write ioctl."""
    if not 0 <= nr <= 0xFF or not 0 <= type_ <= 0xFF:
        raise ValueError(f"ioctl type 0x{type_:x} / number 0x{nr:x} must fit in 8 bits")
    if not 0 < size <= IOC_SIZE_MAX:
        raise ValueError(f"ioctl argument of {size} bytes does not fit in {IOC_SIZE_BITS} bits")
    return ((IOC_READ | IOC_WRITE) << 30) | (size << 16) | (type_ << 8) | nr


def nv_ioctl_number(escape: int, size: int) -> int:
    """The request number of an NVIDIA escape: _IOWR('F', escape, size)."""
    return iowr(s.NV_IOCTL_MAGIC, escape, size)


# -- RM status codes (src/common/sdk/nvidia/inc/nvstatuscodes.h) --------------
NV_OK = 0x0
NV_ERR_INVALID_ARGUMENT = 0x1F
NV_ERR_INVALID_PARAM_STRUCT = 0x3A
NV_ERR_INSUFFICIENT_PERMISSIONS = 0x1B
NV_ERR_NOT_SUPPORTED = 0x56

_STATUS_TABLE = """\
0x0000FFFF NV_ERR_GENERIC generic error
0x00000001 NV_ERR_BROKEN_FB frame buffer broken
0x00000002 NV_ERR_BUFFER_TOO_SMALL buffer passed in is too small
0x00000003 NV_ERR_BUSY_RETRY system is busy, retry later
0x00000005 NV_ERR_CARD_NOT_PRESENT card not detected
0x0000000F NV_ERR_GPU_IS_LOST GPU lost from the bus
0x00000010 NV_ERR_GPU_IN_FULLCHIP_RESET GPU currently in full-chip reset
0x00000011 NV_ERR_GPU_NOT_FULL_POWER GPU not in full power
0x00000016 NV_ERR_ILLEGAL_ACTION current action is not allowed
0x00000017 NV_ERR_IN_USE generic busy error
0x0000001A NV_ERR_INSUFFICIENT_RESOURCES ran out of a critical resource, other than memory
0x0000001B NV_ERR_INSUFFICIENT_PERMISSIONS the requester does not have sufficient permissions
0x0000001D NV_ERR_INVALID_ACCESS_TYPE this type of access is not allowed
0x0000001E NV_ERR_INVALID_ADDRESS address not valid
0x0000001F NV_ERR_INVALID_ARGUMENT invalid argument to call
0x00000020 NV_ERR_INVALID_BASE invalid base
0x00000021 NV_ERR_INVALID_CHANNEL given channel-id not valid
0x00000022 NV_ERR_INVALID_CLASS given class-id not valid
0x00000023 NV_ERR_INVALID_CLIENT given client not valid
0x00000024 NV_ERR_INVALID_COMMAND command passed is not valid
0x00000025 NV_ERR_INVALID_DATA invalid data passed
0x00000026 NV_ERR_INVALID_DEVICE current device is not valid
0x00000027 NV_ERR_INVALID_DMA_SPECIFIER the requested DMA specifier is not valid
0x00000029 NV_ERR_INVALID_FLAGS invalid flags passed
0x0000002A NV_ERR_INVALID_FUNCTION called function is not valid
0x0000002C NV_ERR_INVALID_INDEX index invalid
0x0000002E NV_ERR_INVALID_LIMIT invalid limit
0x0000002F NV_ERR_INVALID_LOCK_STATE requested lock state not valid
0x00000030 NV_ERR_INVALID_METHOD requested method not valid
0x00000031 NV_ERR_INVALID_OBJECT object not valid
0x00000032 NV_ERR_INVALID_OBJECT_BUFFER object buffer passed is not valid
0x00000033 NV_ERR_INVALID_OBJECT_HANDLE object handle is not valid
0x00000034 NV_ERR_INVALID_OBJECT_NEW new object is not valid
0x00000035 NV_ERR_INVALID_OBJECT_OLD old object is not valid
0x00000036 NV_ERR_INVALID_OBJECT_PARENT object parent is not valid
0x00000037 NV_ERR_INVALID_OFFSET the offset passed is not valid
0x00000038 NV_ERR_INVALID_OPERATION requested operation is not valid
0x00000039 NV_ERR_INVALID_OWNER owner not valid
0x0000003A NV_ERR_INVALID_PARAM_STRUCT a parameter block of the wrong size (ABI mismatch)
0x0000003B NV_ERR_INVALID_PARAMETER at least one of the parameters passed is not valid
0x0000003D NV_ERR_INVALID_POINTER pointer not valid
0x0000003F NV_ERR_INVALID_REQUEST invalid request
0x00000040 NV_ERR_INVALID_STATE invalid state
0x00000044 NV_ERR_INVALID_XLATE the requested translate operation is not valid
0x0000004E NV_ERR_MULTIPLE_MEMORY_TYPES multiple memory types found
0x0000004F NV_ERR_NO_FREE_FIFOS no more free FIFOs found
0x00000051 NV_ERR_NO_MEMORY out of memory
0x00000054 NV_ERR_NOT_COMPATIBLE incompatible types
0x00000055 NV_ERR_NOT_READY not ready
0x00000056 NV_ERR_NOT_SUPPORTED call not supported
0x00000057 NV_ERR_OBJECT_NOT_FOUND requested object not found
0x00000058 NV_ERR_OBJECT_TYPE_MISMATCH specified objects do not match
0x00000059 NV_ERR_OPERATING_SYSTEM generic operating system error
0x0000005B NV_ERR_OUT_OF_RANGE the specified value is out of bounds
0x0000005D NV_ERR_PAGE_TABLE_NOT_AVAIL requested page table not available
0x0000005F NV_ERR_PROTECTION_FAULT protection fault
0x00000060 NV_ERR_RC_ERROR generic RC (robust channel) error
0x00000062 NV_ERR_RESET_REQUIRED reset required
0x00000063 NV_ERR_STATE_IN_USE state in use
0x00000065 NV_ERR_TIMEOUT call timed out
0x00000066 NV_ERR_TIMEOUT_RETRY call timed out, please retry later
0x00000068 NV_ERR_UVM_ADDRESS_IN_USE unified virtual memory requested address already in use
0x0000006B NV_ERR_PRIV_SEC_VIOLATION priv security violation
0x0000006D NV_ERR_FEATURE_NOT_ENABLED requested feature functionality is not enabled
0x0000006E NV_ERR_RESOURCE_LOST requested resource has been destroyed
0x00000071 NV_ERR_FATAL_ERROR fatal/unrecoverable error
0x00000072 NV_ERR_MEMORY_ERROR generic memory error
0x00000079 NV_ERR_RISCV_ERROR generic RISC-V (GSP) assert or halt
"""


@dataclass(frozen=True)
class Status:
    code: int
    name: str
    explanation: str


STATUSES: dict[int, Status] = {}
for _line in _STATUS_TABLE.splitlines():
    _code, _name, _text = _line.split(" ", 2)
    STATUSES[int(_code, 16)] = Status(int(_code, 16), _name, _text)


def describe_status(code: int) -> Status:
    if code == NV_OK:
        return Status(NV_OK, "NV_OK", "success")
    return STATUSES.get(code, Status(code, f"NV_STATUS_0x{code:x}", "a status this table lacks"))


# -- errors ---------------------------------------------------------------------


class RmError(RunFailure):
    """A call into the NVIDIA kernel driver failed; the message names call and status."""

    def __init__(self, call: str, name: str, explanation: str, code: int = 0):
        self.call = call
        self.status_name = name
        self.code = code
        self.explanation = explanation
        super().__init__(f"{call} failed: {name} (0x{code:x}): {explanation}")


class RmStatusError(RmError):
    """The driver accepted the ioctl and refused the request (an RM status)."""


class RmIoctlError(RmError):
    """The ioctl itself failed (an errno): a wrong request size or a refused file."""


class SubmissionTimeout(RunFailure):
    """A semaphore missed its deadline; the message says where the channel stood."""


class ChannelError(RunFailure):
    """The driver reported an error on the channel (its error notifier is set)."""


def check_errno(call: str, error: OSError) -> RmError:
    """The typed error for an ioctl that failed with an errno."""
    code = error.errno or 0
    name = errno.errorcode.get(code, f"errno {code}")
    if code == errno.EINVAL:
        why = ("the driver refused the request; for an NVIDIA escape this usually means the "
               "parameter block size differs from the running driver's (ABI mismatch)")
    elif code in (errno.EACCES, errno.EPERM):
        why = "permission denied by the driver"
    else:
        why = os.strerror(code) if code else str(error)
    return RmIoctlError(call, name, why, code)


def check_status(call: str, status: int) -> None:
    """Raise the typed error for an RM status other than NV_OK."""
    if status == NV_OK:
        return
    info = describe_status(status)
    raise RmStatusError(call, info.name, info.explanation, status)


# -- transport ------------------------------------------------------------------


class Transport:
    """Real device files: open, ioctl on a ctypes object, mmap a file."""

    def open(self, path: str) -> int:
        try:
            return os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise BackendUnavailable(
                f"{path} does not exist: the NVIDIA kernel driver is not loaded here "
                "(the nv backend needs the open kernel module, 580 or later)") from None
        except PermissionError:
            raise BackendUnavailable(
                f"cannot open {path}: permission denied (add the user to the group that "
                "owns the device file, or run as root)") from None
        except OSError as error:
            raise BackendUnavailable(f"cannot open {path}: {error.strerror}") from None

    def close(self, fd: int) -> None:
        os.close(fd)

    def ioctl(self, fd: int, request: int, argument: ctypes.Structure | ctypes.Array) -> None:
        """Issue one ioctl; the argument is read and written in place. Raises OSError."""
        fcntl.ioctl(fd, request, argument, True)

    def mmap(self, fd: int, length: int, offset: int = 0) -> mmap.mmap:
        return mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                         offset=offset)


def escape(transport: Transport, fd: int, number: int,
           argument: ctypes.Structure | ctypes.Array, call: str) -> None:
    """One NVIDIA escape: the ioctl with its size-encoded number, errno checked."""
    request = nv_ioctl_number(number, ctypes.sizeof(argument))
    try:
        transport.ioctl(fd, request, argument)
    except OSError as error:
        raise check_errno(call, error) from None
