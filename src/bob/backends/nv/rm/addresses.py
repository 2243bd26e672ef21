"""Where the nv runtime's own memory sits in the GPU's address space: one table.

A plan places its components from ``plan.placement.DEFAULT_VA_BASE`` up; what the runtime
adds (channels, its queue, copy kernels, staging, profiling, read snapshots) lives in
one window below it, each area at a fixed offset from RUNTIME_VA_BASE::

    + 0        gpfifo          the compute channel's GPFIFO ring and USERD (channel.py)
    + 1 MiB    runtime block   the queue's pushbuffer segments, then its counters (stream.py)
    + 64 MiB   copy ring       the copy channel's GPFIFO ring and USERD (stream.py)
    + 80 MiB   copy kernels    the snapshot kernels, their QMDs and banks (snapshot.py)
    + 128 MiB  write slots     process memory small writes are staged in (stream.py)
    + 256 MiB  staging         process memory pinned for copy-engine transfers (stream.py)
    + 512 MiB  profile         timestamp structures and their segments (stream.py)
    + 1 GiB    snapshot        video memory a detached read copies into (backend.py),
                               up to the plan's lowest component

Each area's size is the most it may take; `area_for` checks an allocation against it.
"""

from __future__ import annotations

from dataclasses import dataclass

from bob.plan.placement import DEFAULT_VA_BASE

MIB = 1 << 20
RUNTIME_VA_BASE = 0x10_0000_0000  # the runtime's window: below every plan


@dataclass(frozen=True)
class Area:
    """One area of the runtime's window: `bytes` from RUNTIME_VA_BASE + `offset`."""

    name: str
    offset: int
    bytes: int

    @property
    def address(self) -> int:
        return RUNTIME_VA_BASE + self.offset

    @property
    def end(self) -> int:
        return self.address + self.bytes


RUNTIME_AREAS: tuple[Area, ...] = (
    Area("gpfifo", 0, 1 * MIB),
    Area("runtime block", 1 * MIB, 63 * MIB),
    Area("copy ring", 64 * MIB, 16 * MIB),
    Area("copy kernels", 80 * MIB, 48 * MIB),
    Area("write slots", 128 * MIB, 128 * MIB),
    Area("staging", 256 * MIB, 256 * MIB),
    Area("profile", 512 * MIB, 512 * MIB),
    Area("snapshot", 1024 * MIB, DEFAULT_VA_BASE - RUNTIME_VA_BASE - 1024 * MIB),
)
_AREAS = {area.name: area for area in RUNTIME_AREAS}


def area(name: str) -> Area:
    return _AREAS[name]


def area_for(name: str, size: int) -> int:
    """The address of area `name` for an allocation of `size` bytes; ValueError where the
    area cannot hold it."""
    found = _AREAS[name]
    if size > found.bytes:
        raise ValueError(f"{size} bytes do not fit the runtime's {name} area "
                         f"({found.bytes} bytes at {found.address:#x})")
    return found.address


GPFIFO_RING_VA = area("gpfifo").address
RUNTIME_BLOCK_VA = area("runtime block").address
COPY_RING_VA = area("copy ring").address
KERNELS_VA = area("copy kernels").address
WRITES_VA = area("write slots").address
STAGING_VA = area("staging").address
PROFILE_VA = area("profile").address
SNAPSHOT_VA = area("snapshot").address

__all__ = ["COPY_RING_VA", "GPFIFO_RING_VA", "KERNELS_VA", "PROFILE_VA", "RUNTIME_AREAS",
           "RUNTIME_BLOCK_VA", "RUNTIME_VA_BASE", "SNAPSHOT_VA", "STAGING_VA", "WRITES_VA",
           "Area", "area", "area_for"]
