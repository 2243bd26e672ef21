"""The plan's parameter blocks as CUDA kernel parameters, and what the driver reads of them.

The bytes of a launch's parameter block from the target's parameter base to the end of
its arguments are exactly CUDA's kernel parameter buffer (pointers, then scalars): the
pointer words are relocated from the plan's arena to the device's
(`kernel_parameters`, `kernel_parameter_buffers`). Every launch's buffer sits side by
side in one host store (`ParameterStore`), and what the driver reads of them, the
kernelParams arrays, the `extra` arrays and the node parameter records, in numpy tables
beside it (`LaunchTables`): an invocation's scalars are then one indexed store.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from bob.errors import RunFailure
from bob.plan.model import Plan, Region
from bob.plan.placement import ArgumentLayout, argument_layout, argument_slots

from .driver import NativeKernelNodeParams

ParameterMode = Literal["extra", "pointers"]
PARAMETER_MODES = ("extra", "pointers")


def kernel_parameters(plan: Plan, region: Region, block: bytes, arena_base: int) -> bytes:
    """The kernel's parameter buffer for one launch, pointers relocated to the arena.

    `block` is the launch's parameter block in the plan; the buffer is its
    bytes from the target's parameter base to the end of the last argument,
    with every pointer word moved from the plan's arena to `arena_base`.
    """
    layout = argument_layout(plan.target, region.params)
    return _relocated(plan, region, layout, list(layout.packer.unpack_from(block, layout.base)),
                      arena_base)


def kernel_parameter_buffers(plan: Plan, arena_base: int,
                             patched: Mapping[int, bytes]) -> list[bytes]:
    """Every launch's kernel parameter buffer (as `kernel_parameters` makes it), packed
    from the launch's arguments with one struct per region, or, for a launch in
    `patched`, from its block as the host patched it.

    A training plan has thousands of launches: each region's layout is made once."""
    layouts: dict[str, tuple[Region, ArgumentLayout]] = {}
    buffers = []
    for index, launch in enumerate(plan.launches):
        if launch.region not in layouts:
            region = plan.region(launch.region)
            layouts[launch.region] = (region, argument_layout(plan.target, region.params))
        region, layout = layouts[launch.region]
        if len(launch.args) != len(layout.order):
            raise ValueError(f"launch {index} has {len(launch.args)} arguments for "
                             f"{len(layout.order)} parameters of {launch.region!r}")
        block = patched.get(index)
        values = layout.values(launch) if block is None else \
            list(layout.packer.unpack_from(block, layout.base))
        buffers.append(_relocated(plan, region, layout, values, arena_base))
    return buffers


def _relocated(plan: Plan, region: Region, layout: ArgumentLayout, values: list[int],
               arena_base: int) -> bytes:
    """The arguments packed, each pointer moved from the plan's arena to `arena_base`."""
    window = plan.address_map.arena
    for slot in range(layout.pointers):
        address = values[slot]
        if not window.base <= address < window.end:
            raise ValueError(
                f"region {region.name!r} argument {region.params[layout.order[slot]].name!r}: "
                f"0x{address:x} is outside the arena [0x{window.base:x}, 0x{window.end:x})")
        values[slot] = arena_base + address - window.base
    return layout.packer.pack(*values)


# -- the backend -------------------------------------------------------------------


class LaunchTables:
    """What the driver reads for every launch, as three numpy tables beside the parameter
    store (host memory graph nodes and launches point into; it lives as long as they do):

    - ``pointers``: per launch, one address per argument into its parameter buffer (the
      kernelParams array);
    - ``extra``: per launch, [BUFFER_POINTER, &buffer, BUFFER_SIZE, &size, END], with the
      sizes in ``sizes``;
    - ``native``: per launch, CUDA_KERNEL_NODE_PARAMS_v2 (`NativeKernelNodeParams`).

    A training plan has thousands of launches: tables, not a ctypes object or three per
    launch, keep the first invocation's start-up short.
    """

    def __init__(self, plan: Plan, store: ParameterStore, functions: Mapping[str, int],
                 parameter_mode: ParameterMode, constants: tuple[int, int, int]):
        launches = plan.launches
        count = len(launches)
        base = plan.target.parameter_base
        regions = {launch.region for launch in launches}
        offsets = {name: np.array([slot.offset - base for slot in
                                   argument_slots(plan.target, plan.region(name).params)],
                                  np.uint64) for name in regions}
        region_of = np.array([launch.region for launch in launches], dtype=object)
        arguments = np.array([max(1, len(offsets[launch.region])) for launch in launches],
                             np.int64)
        self.pointer_starts = np.zeros(count, np.int64)
        np.cumsum(arguments[:-1], out=self.pointer_starts[1:])
        self.pointers = np.zeros(max(1, int(arguments.sum())), np.uint64)
        buffers = store.addresses()
        self.sizes = store.sizes().astype(np.uint64)
        native = np.zeros(count, np.dtype(NativeKernelNodeParams))
        for name in regions:
            chosen = np.flatnonzero(region_of == name)
            relative = offsets[name]
            if len(relative):
                places = self.pointer_starts[chosen][:, None] + np.arange(len(relative))
                self.pointers[places] = buffers[chosen][:, None] + relative[None, :]
            native["func"][chosen] = functions[name]
            native["sharedMemBytes"][chosen] = plan.region(name).dynamic_shared_bytes
        for axis, values in (("gridDim", [launch.grid for launch in launches]),
                             ("blockDim", [launch.block for launch in launches])):
            for coordinate in "XYZ":
                native[axis + coordinate] = [getattr(value, coordinate.lower())
                                             for value in values]
        buffer_pointer, buffer_size, end = constants
        self.extra = np.zeros((count, 5), np.uint64)
        self.extra[:, 0], self.extra[:, 2], self.extra[:, 4] = buffer_pointer, buffer_size, end
        self.extra[:, 1] = buffers
        self.extra[:, 3] = self.sizes.ctypes.data + 8 * np.arange(count, dtype=np.uint64)
        if parameter_mode == "extra":
            native["extra"] = self.extra.ctypes.data + 40 * np.arange(count, dtype=np.uint64)
        else:
            native["kernelParams"] = self.pointers.ctypes.data + 8 * self.pointer_starts
        self.native = native
        self.node_params: dict[int, Any] = {}  # cuda-bindings' structures, where made

    def native_address(self, index: int) -> int:
        """Launch `index`'s CUDA_KERNEL_NODE_PARAMS_v2, for libcuda's own entry points."""
        return self.native.ctypes.data + index * self.native.itemsize

    def native_addresses(self, launches: np.ndarray) -> list[int]:
        """`native_address` of each launch."""
        return (self.native.ctypes.data + launches * self.native.itemsize).tolist()

    def pointers_address(self, index: int) -> int:
        """Launch `index`'s kernelParams array."""
        return self.pointers.ctypes.data + 8 * int(self.pointer_starts[index])


class ParameterStore:
    """Every launch's kernel parameter buffer, side by side in one host array.

    Graph nodes and launches point into it; an invocation's AdamW scalars for all
    its launches are then one indexed numpy store instead of a loop over buffers.
    """

    ALIGN = 16  # each buffer starts here: a scalar's 4-byte boundary stays one in the store

    def __init__(self, blocks: Sequence[bytes]):
        sizes = np.array([len(data) for data in blocks], np.int64)
        starts = np.zeros(len(blocks) + 1, np.int64)
        np.cumsum(-(-np.maximum(sizes, 1) // self.ALIGN) * self.ALIGN, out=starts[1:])
        self._bytes = np.zeros(max(self.ALIGN, int(starts[-1])), np.uint8)
        self._words = self._bytes.view(np.uint32)
        self._starts, self._sizes = starts[:-1], sizes
        for start, data in zip(starts.tolist(), blocks, strict=False):
            self._bytes[start:start + len(data)] = np.frombuffer(data, np.uint8)

    def size(self, index: int) -> int:
        return int(self._sizes[index])

    def sizes(self) -> np.ndarray:
        return self._sizes.copy()

    def addresses(self) -> np.ndarray:
        """Each launch's buffer's host address (uint64)."""
        return (self._bytes.ctypes.data + self._starts).astype(np.uint64)

    def buffer(self, index: int) -> ctypes.Array:
        """Launch `index`'s parameter buffer: a ctypes view into the store (never a copy)."""
        return (ctypes.c_char * max(1, self.size(index))).from_buffer(
            self._bytes, int(self._starts[index]))

    def write_words(self, launches: Sequence[int], relative: np.ndarray,
                    words: np.ndarray) -> np.ndarray:
        """words[i][j] (uint32) at byte relative[i][j] of launch launches[i]'s buffer;
        whether each launch's words changed."""
        chosen = np.asarray(launches, np.int64)
        outside = (relative < 0) | (relative % 4 != 0) | \
            (relative > (self._sizes[chosen] - 4)[:, None])
        if outside.any():
            row = int(np.argwhere(outside)[0][0])
            raise RunFailure(f"launch {launches[row]}: a scalar's block offset is outside its "
                             "parameter buffer")
        places = (self._starts[chosen][:, None] + relative) // 4
        changed = (self._words[places] != words).any(axis=1)
        self._words[places] = words
        return changed
