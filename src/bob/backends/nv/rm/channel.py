"""A GPFIFO channel for HOPPER_COMPUTE_A, its doorbell and its deadlines.

    device
     └ channel group (KEPLER_CHANNEL_GROUP_A, engine GRAPHICS)
        ├ context share (FERMI_CONTEXT_SHARE_A, Bob's VA space)
        └ channel (HOPPER_CHANNEL_GPFIFO_A)
           └ compute object (HOPPER_COMPUTE_A)

The GPFIFO ring and the channel's USERD live in one system-memory block
(uncached: the CPU's stores to GP_PUT are ordered without fences); the ring
is at a fixed GPU address outside any plan's window. The channel error
notifier is a second system-memory block the driver writes when it stops
the channel.

Submitting is: write GP entries at GP_PUT, advance GP_PUT in USERD, write the
work submit token to the usermode doorbell. Waiting is polling a semaphore
with a deadline; a timeout reports GP_GET/GP_PUT, the entries and the error
notifier.

This module also holds the few pushbuffer words the runtime itself emits
(binding the compute class, the shared/local memory windows): each comes
from a named builder that checks its fields.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from . import structs as s
from .device import RmDevice
from .ioctl import (
    NV_ERR_INVALID_ARGUMENT,
    NV_ERR_INVALID_PARAM_STRUCT,
    ChannelError,
    RmStatusError,
    SubmissionTimeout,
)
from .memory import Allocation, allocate, round_up, store_fence

RUNTIME_VA_BASE = 0x10_0000_0000  # below every plan (DEFAULT_VA_BASE is 0x20_0000_0000)
GPFIFO_ENTRIES = 1024

# -- pushbuffer words (class/clc86f.h, class/clcbc0.h) ---------------------------
SUBCHANNEL_HOST = 0  # host methods (semaphores) need no object
SUBCHANNEL_COMPUTE = 1
SEC_OP_INC_METHOD = 1  # 31:29: the count data words go to consecutive methods

NVC86F_SEM_ADDR_LO = 0x5C  # then ADDR_HI, PAYLOAD_LO, PAYLOAD_HI, EXECUTE
SEM_EXECUTE_RELEASE = 0x1  # OPERATION 2:0
SEM_EXECUTE_RELEASE_WFI = 0x1 << 20  # wait for the engine to idle first
SEM_EXECUTE_PAYLOAD_SIZE_64BIT = 0x1 << 24

NVCBC0_SET_OBJECT = 0x0
NVCBC0_SET_SHADER_SHARED_MEMORY_WINDOW_A = 0x2A0  # A: upper bits, B: lower
NVCBC0_SET_SHADER_LOCAL_MEMORY_WINDOW_A = 0x7B0
NVCBC0_SEND_PCAS_A = 0x2B4  # QMD address >> 8
NVCBC0_SEND_SIGNALING_PCAS2_B = 0x2C0
PCAS_ACTION_INVALIDATE_COPY_SCHEDULE = 0x3

# Where generic addresses alias shared and local memory; 4 GiB aligned on Hopper
# and far from every buffer (plans live below 2^40).
SHARED_MEMORY_WINDOW = 0x7294_0000_0000
LOCAL_MEMORY_WINDOW = 0x7293_0000_0000


def method_header(subchannel: int, method: int, count: int) -> int:
    """An incrementing-method header: `count` data words for `method`, `method`+4, ..."""
    if not 0 <= subchannel <= 7:
        raise ValueError(f"subchannel {subchannel} is outside 0..7")
    if method % 4 or not 0 <= method <= 0x7FFC:
        raise ValueError(f"method 0x{method:x} is not a 4-byte aligned offset below 0x8000")
    if not 1 <= count <= 0x1FFF:
        raise ValueError(f"a method header carries 1..8191 data words, not {count}")
    return (SEC_OP_INC_METHOD << 29) | (count << 16) | (subchannel << 13) | (method >> 2)


def methods(subchannel: int, method: int, *data: int) -> list[int]:
    for word in data:
        if not 0 <= word <= 0xFFFF_FFFF:
            raise ValueError(f"method data 0x{word:x} does not fit in 32 bits")
    return [method_header(subchannel, method, len(data)), *data]


def split64(value: int) -> tuple[int, int]:
    """(upper, lower) 32-bit halves, the order of the class methods' A/B pairs."""
    return value >> 32, value & 0xFFFF_FFFF


def bind_compute(compute_class: int = s.HOPPER_COMPUTE_A) -> list[int]:
    return methods(SUBCHANNEL_COMPUTE, NVCBC0_SET_OBJECT, compute_class)


def memory_windows(shared: int = SHARED_MEMORY_WINDOW,
                   local: int = LOCAL_MEMORY_WINDOW) -> list[int]:
    for name, window in (("shared", shared), ("local", local)):
        if window % (1 << 32):
            raise ValueError(f"the {name} memory window 0x{window:x} is not 4 GiB aligned")
    return (methods(SUBCHANNEL_COMPUTE, NVCBC0_SET_SHADER_SHARED_MEMORY_WINDOW_A, *split64(shared))
            + methods(SUBCHANNEL_COMPUTE, NVCBC0_SET_SHADER_LOCAL_MEMORY_WINDOW_A, *split64(local)))


def launch_qmd(qmd_va: int) -> list[int]:
    """SEND_PCAS_A with the QMD address, then schedule it (invalidate, copy, schedule)."""
    if qmd_va % 256 or not 0 < qmd_va < 1 << 40:
        raise ValueError(f"a QMD address must be 256-byte aligned below 2^40, not 0x{qmd_va:x}")
    return (methods(SUBCHANNEL_COMPUTE, NVCBC0_SEND_PCAS_A, qmd_va >> 8)
            + methods(SUBCHANNEL_COMPUTE, NVCBC0_SEND_SIGNALING_PCAS2_B,
                      PCAS_ACTION_INVALIDATE_COPY_SCHEDULE))


def semaphore_release(address: int, payload: int, wait_for_idle: bool = True) -> list[int]:
    """A host semaphore release of a 64-bit payload (after the engine idles)."""
    if address % 8 or not 0 < address < 1 << 57:
        raise ValueError(f"a 64-bit semaphore address must be 8-byte aligned, not 0x{address:x}")
    if not 0 <= payload < 1 << 64:
        raise ValueError(f"semaphore payload {payload} does not fit in 64 bits")
    execute = SEM_EXECUTE_RELEASE | SEM_EXECUTE_PAYLOAD_SIZE_64BIT
    if wait_for_idle:
        execute |= SEM_EXECUTE_RELEASE_WFI
    upper, lower = split64(address)
    payload_upper, payload_lower = split64(payload)
    return methods(SUBCHANNEL_HOST, NVC86F_SEM_ADDR_LO, lower, upper, payload_lower,
                   payload_upper, execute)


def gp_entry(address: int, words: int) -> int:
    """One GPFIFO entry: a pushbuffer segment of `words` 32-bit words at `address`.

    Entry word 0 holds address bits 31:2, word 1 bits 39:32 (GET_HI), the
    LEVEL bit 9 (set: subroutine, as tinygrad submits) and LENGTH in 30:10.
    """
    if address % 4 or not 0 < address < 1 << 40:
        raise ValueError(f"a pushbuffer segment must be 4-byte aligned below 2^40, "
                         f"not 0x{address:x}")
    if not 1 <= words < 1 << 21:
        raise ValueError(f"a GPFIFO entry covers 1..2^21-1 words, not {words}")
    return address | (1 << 41) | (words << 42)


def words_bytes(words: list[int]) -> bytes:
    return struct.pack(f"<{len(words)}I", *words)


# -- the channel -------------------------------------------------------------------


@dataclass(frozen=True)
class ChannelState:
    """What a timeout or channel error reports."""

    gp_get: int
    gp_put: int
    put_count: int
    notifiers: tuple[tuple[int, int, int, int], ...]  # (time, info32, info16, status)

    def describe(self) -> str:
        lines = [f"GP_GET={self.gp_get} GP_PUT={self.gp_put} (entries submitted: "
                 f"{self.put_count})"]
        names = ("error", "work-submit-token", "key-rotation")
        for name, (stamp, info32, info16, status) in zip(names, self.notifiers, strict=True):
            lines.append(f"notifier[{name}]: status=0x{status:04x} info32=0x{info32:08x} "
                         f"info16=0x{info16:04x} time={stamp}")
        return "; ".join(lines)

    @property
    def error(self) -> bool:
        _, info32, _, status = self.notifiers[s.NV_CHANNELGPFIFO_NOTIFICATION_TYPE_ERROR]
        return status != 0 or info32 != 0


class Channel:
    """A scheduled GPFIFO channel with the compute class bound to an object."""

    def __init__(self, device: RmDevice, entries: int = GPFIFO_ENTRIES,
                 ring_va: int = RUNTIME_VA_BASE):
        if entries & (entries - 1) or entries < 2:
            raise ValueError(f"GPFIFO entries must be a power of two, not {entries}")
        client = device.client
        self.device = device
        self.entries = entries
        self.userd_offset = round_up(entries * s.GP_ENTRY_BYTES, 4096)
        self.notifier = allocate(device, 4096, location="sysmem", map_gpu=False,
                                 name="error notifier")
        self.ring = allocate(device, round_up(self.userd_offset + s.USERD_BYTES, 4096),
                             location="sysmem", gpu_va=ring_va, name="GPFIFO ring + USERD")
        self.group = client.alloc(device.device, s.KEPLER_CHANNEL_GROUP_A,
                                  s.NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS(
                                      engineType=s.NV2080_ENGINE_TYPE_GRAPHICS))
        self.context_share = client.alloc(self.group, s.FERMI_CONTEXT_SHARE_A,
                                          s.NV_CTXSHARE_ALLOCATION_PARAMETERS(
                                              hVASpace=device.vaspace,
                                              flags=s.NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC))
        params = s.NV_CHANNEL_ALLOC_PARAMS(
            hObjectError=self.notifier.memory, hObjectBuffer=self.ring.memory,
            gpFifoOffset=self.ring.gpu_va, gpFifoEntries=entries,
            hContextShare=self.context_share)
        params.hUserdMemory[0] = self.ring.memory
        params.userdOffset[0] = self.userd_offset
        self.handle = client.alloc(self.group, s.HOPPER_CHANNEL_GPFIFO_A, params)
        self.compute = client.alloc(self.handle, s.HOPPER_COMPUTE_A)
        token = s.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS(workSubmitToken=0xFFFF_FFFF)
        client.control(self.handle, s.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN, token)
        self.token = token.workSubmitToken
        self._schedule()
        self._gp_put = self.ring.u32(self.userd_offset + s.USERD_GP_PUT)
        self._gp_get = self.ring.u32(self.userd_offset + s.USERD_GP_GET)
        self.put_count = 0

    def _schedule(self) -> None:
        """Put the channel group on the runlist (580 layout first, then 570's)."""
        client = self.device.client
        last: RmStatusError | None = None
        for layout in (s.NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS,
                       s.NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS_570):
            try:
                client.control(self.group, s.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE,
                               layout(bEnable=1, bSkipSubmit=0))
                return
            except RmStatusError as error:
                if error.code not in (NV_ERR_INVALID_ARGUMENT, NV_ERR_INVALID_PARAM_STRUCT):
                    raise
                last = error
        assert last is not None
        raise last

    # -- submission ------------------------------------------------------------------
    def submit(self, entries: list[int]) -> None:
        """Append GP entries, advance GP_PUT, ring the doorbell."""
        if len(entries) >= self.entries:
            raise ValueError(f"{len(entries)} entries do not fit a ring of {self.entries}")
        in_flight = (self.put_count - self.gp_get) % self.entries
        if in_flight + len(entries) >= self.entries:
            raise SubmissionTimeout(f"the GPFIFO ring is full: {self.state().describe()}")
        for entry in entries:
            slot = self.put_count % self.entries
            self.ring.write(slot * s.GP_ENTRY_BYTES, struct.pack("<Q", entry))
            self.put_count += 1
        store_fence()
        self._gp_put.value = self.put_count % self.entries
        store_fence()
        self.device.ring_doorbell(self.token)

    @property
    def gp_get(self) -> int:
        return self._gp_get.value

    def state(self) -> ChannelState:
        notes = []
        for index in range(s.NV_CHANNELGPFIFO_NOTIFICATION_TYPE_SIZE):
            raw = self.notifier.read(index * s.NOTIFICATION_BYTES, s.NOTIFICATION_BYTES)
            notes.append(struct.unpack("<QIHH", raw))
        return ChannelState(self.gp_get, self._gp_put.value, self.put_count, tuple(notes))

    def wait(self, read_value, target: int, deadline_s: float, what: str) -> int:
        """Poll `read_value()` until it reaches `target`; a deadline, never a hang."""
        start = time.monotonic()
        delay = 1e-6
        while True:
            value = read_value()
            if value >= target:
                return value
            state = self.state()
            if state.error:
                raise ChannelError(f"the driver stopped the channel while waiting for {what}: "
                                   f"{state.describe()}")
            if time.monotonic() - start > deadline_s:
                raise SubmissionTimeout(
                    f"{what} is {value}, not {target}, after {deadline_s:g} s: "
                    f"{state.describe()}")
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)

    def close(self) -> None:
        del self._gp_put, self._gp_get
        self.ring.close()
        self.notifier.close()


__all__ = [
    "Allocation", "Channel", "ChannelState", "bind_compute", "gp_entry", "launch_qmd",
    "memory_windows", "method_header", "methods", "semaphore_release", "words_bytes",
]
