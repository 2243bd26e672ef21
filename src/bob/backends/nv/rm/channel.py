"""A GPFIFO channel for HOPPER_COMPUTE_A (or a copy engine), its doorbell and its deadlines.

    device
     └ channel group (KEPLER_CHANNEL_GROUP_A, engine GRAPHICS, or COPYn)
        ├ context share (FERMI_CONTEXT_SHARE_A, Bob's VA space)
        └ channel (HOPPER_CHANNEL_GPFIFO_A)
           └ engine object (HOPPER_COMPUTE_A, or HOPPER_DMA_COPY_A)

A channel group is one engine's: a second channel in the compute channel's group
ran its copies after the compute work, never beside it (measured on the H200). A
copy channel (``copy_channel``) has a group of its own on a copy engine; its
copies run while the compute channel computes.

The GPFIFO ring and the channel's USERD live in one system-memory block
(uncached: the CPU's stores to GP_PUT are ordered without fences); the ring
is at a fixed GPU address outside any plan's window (``addresses.py``). The channel error
notifier is a second system-memory block the driver writes when it stops
the channel.

Submitting is: write GP entries at GP_PUT, advance GP_PUT in USERD, write the
work submit token to the usermode doorbell. Waiting is polling a semaphore
with a deadline; a timeout reports GP_GET/GP_PUT, the entries and the error
notifier.

What the channel runs comes from Bob's command-stream encoder
(``bob.backends.nv.encoder``): pushbuffer segments at the plan's addresses and
the GPFIFO entries pointing at them, which ``submit`` copies into the ring as
they are. Nothing here builds a pushbuffer word.
"""

from __future__ import annotations

import contextlib
import struct
import time
from dataclasses import dataclass

from . import structs as s
from .addresses import GPFIFO_RING_VA
from .device import RmDevice
from .ioctl import (
    NV_ERR_INVALID_ARGUMENT,
    NV_ERR_INVALID_PARAM_STRUCT,
    ChannelError,
    RmError,
    RmStatusError,
    SubmissionTimeout,
)
from .memory import Allocation, allocate, round_up, store_fence

GPFIFO_ENTRIES = 1024
SPIN_S = 0.005  # a wait polls without sleeping this long before it backs off
LONGEST_SLEEP_S = 1e-4  # then sleeps between polls, doubling from 50 us up to this

# What the driver writes as info32 of the error notifier when it stops a channel: the
# robust-channel error, the number nvidia-smi and the kernel log call an Xid
# (NVIDIA's "XID Errors" document; ROBUST_CHANNEL_* in the driver's nverror.h).
ROBUST_CHANNEL_ERRORS = {
    8: "the GPU stopped processing: the channel timed out",
    13: "graphics engine exception (an SM trap, illegal instruction or bad address in a kernel)",
    31: "MMU fault (a kernel or engine touched an unmapped or read-only address)",
    32: "PBDMA error (a malformed pushbuffer or GPFIFO entry)",
    43: "the GPU stopped processing: the channel was reset after a fault in its work",
    45: "preemptive cleanup (the driver killed the channel)",
    68: "video processor exception",
    69: "graphics engine class error (a method the class refused)",
}


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

    def reason(self) -> str:
        """The error notifier in words: the robust-channel error and its status."""
        _, info32, info16, status = self.notifiers[s.NV_CHANNELGPFIFO_NOTIFICATION_TYPE_ERROR]
        if not self.error:
            return "no channel error recorded"
        what = ROBUST_CHANNEL_ERRORS.get(info32, "an error the table here does not name")
        return f"channel error {info32} ({what}; status 0x{status:04x}, info16 0x{info16:04x})"

    @property
    def error(self) -> bool:
        _, info32, _, status = self.notifiers[s.NV_CHANNELGPFIFO_NOTIFICATION_TYPE_ERROR]
        return status != 0 or info32 != 0


class Channel:
    """A scheduled GPFIFO channel with the compute class bound to an object."""

    def __init__(self, device: RmDevice, entries: int = GPFIFO_ENTRIES,
                 ring_va: int = GPFIFO_RING_VA, *,
                 engine: int = s.NV2080_ENGINE_TYPE_GRAPHICS,
                 engine_class: int = s.HOPPER_COMPUTE_A):
        if entries & (entries - 1) or entries < 2:
            raise ValueError(f"GPFIFO entries must be a power of two, not {entries}")
        client = device.client
        self.device = device
        self.entries = entries
        self.engine = engine
        self.userd_offset = round_up(entries * s.GP_ENTRY_BYTES, 4096)
        self.notifier = allocate(device, 4096, location="sysmem", map_gpu=False,
                                 name="error notifier")
        self.ring = allocate(device, round_up(self.userd_offset + s.USERD_BYTES, 4096),
                             location="sysmem", gpu_va=ring_va, name="GPFIFO ring + USERD")
        self.group = client.alloc(device.device, s.KEPLER_CHANNEL_GROUP_A,
                                  s.NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS(engineType=engine))
        try:
            self.context_share = client.alloc(
                self.group, s.FERMI_CONTEXT_SHARE_A, s.NV_CTXSHARE_ALLOCATION_PARAMETERS(
                    hVASpace=device.vaspace,
                    flags=s.NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC))
            # The graphics channel takes its engine from its group; a copy channel names it
            # (RM refused one without: NV_ERR_INVALID_ARGUMENT on the H200's 580 driver).
            params = s.NV_CHANNEL_ALLOC_PARAMS(
                hObjectError=self.notifier.memory, hObjectBuffer=self.ring.memory,
                gpFifoOffset=self.ring.gpu_va, gpFifoEntries=entries,
                hContextShare=self.context_share,
                engineType=0 if engine == s.NV2080_ENGINE_TYPE_GRAPHICS else engine)
            params.hUserdMemory[0] = self.ring.memory
            params.userdOffset[0] = self.userd_offset
            self.handle = client.alloc(self.group, s.HOPPER_CHANNEL_GPFIFO_A, params)
            self.engine_object = client.alloc(self.handle, engine_class)
        except BaseException:
            self.free()
            raise
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
    def submit(self, entries: list[bytes]) -> None:
        """Copy encoded GPFIFO entries into the ring, advance GP_PUT, ring the doorbell."""
        if len(entries) >= self.entries:
            raise ValueError(f"{len(entries)} entries do not fit a ring of {self.entries}")
        for entry in entries:
            if len(entry) != s.GP_ENTRY_BYTES:
                raise ValueError(f"a GPFIFO entry is {s.GP_ENTRY_BYTES} bytes, not {len(entry)}")
        in_flight = (self.put_count - self.gp_get) % self.entries
        if in_flight + len(entries) >= self.entries:
            raise SubmissionTimeout(f"the GPFIFO ring is full: {self.state().describe()}")
        for entry in entries:
            slot = self.put_count % self.entries
            self.ring.write(slot * s.GP_ENTRY_BYTES, bytes(entry))
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
        """Poll `read_value()` until it reaches `target`; a deadline, never a hang.

        The first SPIN_S are a busy poll: a sleep is never shorter than the kernel's timer
        slack (about 50 us), which would add that much to every short wait. Longer waits
        back off to sleeps of up to 1 ms."""
        start = time.monotonic()
        spin_until = start + SPIN_S
        polls = 0
        while time.monotonic() < spin_until:
            value = read_value()
            if value >= target:
                return value
            polls += 1
            if polls % 256 == 0 and self.state().error:
                break  # reported below
        delay = 50e-6
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
            delay = min(delay * 2, LONGEST_SLEEP_S)

    def free(self) -> None:
        """Free the channel group (and what was made under it) and the channel's memory:
        for a channel given up before its client closes."""
        with contextlib.suppress(RmError):
            self.device.client.free(self.group)
        self.ring.close()
        self.notifier.close()

    def close(self) -> None:
        del self._gp_put, self._gp_get
        self.ring.close()
        self.notifier.close()


def gpu_engines(device: RmDevice) -> tuple[int, ...]:
    """The engine types the GPU has (NV2080_ENGINE_TYPE_*)."""
    params = s.NV2080_CTRL_GPU_GET_ENGINES_V2_PARAMS()
    device.client.control(device.subdevice, s.NV2080_CTRL_CMD_GPU_GET_ENGINES_V2, params)
    return tuple(params.engineList[:min(params.engineCount, len(params.engineList))])


def copy_channel(device: RmDevice, ring_va: int, entries: int = GPFIFO_ENTRIES) -> Channel:
    """A channel on the first of the GPU's copy engines that RM gives one on, with
    HOPPER_DMA_COPY_A bound; RmError naming every refusal where none does."""
    refusals = []
    for engine in gpu_engines(device):
        if engine not in s.NV2080_ENGINE_TYPE_COPY:
            continue
        try:
            return Channel(device, entries, ring_va, engine=engine,
                           engine_class=s.HOPPER_DMA_COPY_A)
        except RmError as error:
            refusals.append(f"COPY{engine - s.NV2080_ENGINE_TYPE_COPY[0]}: {error}")
    raise RmError("a copy channel", "no copy engine",
                  "; ".join(refusals) or "the GPU lists no copy engine")


__all__ = ["Allocation", "Channel", "ChannelState", "GPFIFO_ENTRIES", "copy_channel",
           "gpu_engines"]
