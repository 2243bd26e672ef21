"""The vendor-neutral core every backend implements.

A backend is opened on a certified plan and owns one arena laid out as the
plan says. The host writes tensors, patches scalar arguments (never pointers:
the certificate stays valid), runs a range of submissions and reads tensors
back. Backends know the plan, never the host.

This class does the checking and the bookkeeping once: which bytes of the
arena a tensor range is, whether a submission is in the plan, which scalars
may be patched, the patched parameter blocks, the last semaphore reached. A
backend supplies only its arena access (``_write_arena``, ``_read_arena``),
``_run`` and ``_carry_patches`` (the patched words to where its device reads
the parameter block).
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod

from bob.errors import RunFailure
from bob.plan.certificate import CertifiedPlan, require_certified
from bob.plan.model import Plan, PointerParam, Scalar, ScalarParam
from bob.plan.placement import argument_slots, encode_parameter_block

_WORD = struct.Struct("<I")

# (offset in the parameter block, the 4-byte word written there)
Patch = tuple[int, bytes]


class ArenaRangeError(RunFailure):
    """A tensor byte range or a submission the plan does not have."""


class Backend(ABC):
    name = "abstract"

    def __init__(self, plan: Plan | CertifiedPlan):
        self.certified = require_certified(plan)  # before any allocation; a no-op when done
        self.plan = self.certified.plan
        # The one store of patched parameter blocks (the bytes); unpatched blocks
        # are encoded from the plan when asked for.
        self._blocks: dict[int, bytearray] = {}
        self._patchable: dict[str, dict[str, tuple[str, int]]] = {}
        self.last_semaphore = 0

    # -- what the host uses ----------------------------------------------
    def write_tensor(self, name: str, data: bytes, offset: int = 0) -> None:
        """Copy `data` (any bytes-like object: bytes, memoryview, a uint8 array) in."""
        view = memoryview(data).cast("B")
        start = self._arena_offset(name, offset, view.nbytes)
        if view.nbytes:
            self._write_arena(start, view)

    def read_tensor(self, name: str) -> bytes:
        size = self.plan.tensor(name).bytes
        return self._read_arena(self._arena_offset(name, 0, size), size)

    def run(self, submissions: range) -> None:
        """Execute these submissions in order and wait until the last completes."""
        if not isinstance(submissions, range):
            raise TypeError(f"run takes a range of submissions, not {type(submissions).__name__}")
        if len(submissions) == 0:
            return
        count = self.plan.submission_count
        for index in (submissions[0], submissions[-1]):  # a range is monotonic
            if not 0 <= index < count:
                raise ArenaRangeError(f"submission {index} is not in the plan's {count}")
        self._run(submissions)
        self.last_semaphore = self.plan.submissions[submissions[-1]].semaphore

    def close(self) -> None:  # noqa: B027 - a backend with nothing to free keeps this
        """Free what the backend holds."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_scalars(self, launch_index: int, values: dict[str, Scalar]) -> None:
        """Rewrite scalar arguments of one launch (e.g. an update's AdamW scalars).

        Only scalars that no footprint depends on may change, so the plan's
        certificate still holds for the patched launch. The parameter block is
        patched in place (one 4-byte word per scalar), not encoded again.
        """
        region = self.plan.launches[launch_index].region
        patchable = self._patchable_scalars(region)
        patches: list[Patch] = []
        for name, value in values.items():
            if name not in patchable:
                raise KeyError(f"region {region!r} has no patchable scalar argument "
                               f"{name!r} (pointers and footprint sizes are fixed by the plan)")
            dtype, offset = patchable[name]
            if value.dtype != dtype:
                raise TypeError(f"argument {name!r} is {dtype}, not {value.dtype}")
            patches.append((offset, _WORD.pack(value.bits)))
        block = self._blocks.get(launch_index)
        if block is None:
            block = self._blocks[launch_index] = bytearray(self.parameter_block(launch_index))
        for offset, word in patches:
            block[offset:offset + len(word)] = word
        self._carry_patches(launch_index, values, patches)

    def parameter_block(self, launch_index: int) -> bytes:
        """Launch `launch_index`'s parameter block as it stands (patches included)."""
        block = self._blocks.get(launch_index)
        if block is not None:
            return bytes(block)
        launch = self.plan.launches[launch_index]
        return encode_parameter_block(self.plan.target, self.plan.region(launch.region), launch)

    def _arena_offset(self, name: str, offset: int, size: int) -> int:
        """Where bytes [offset, offset + size) of tensor `name` start in the arena."""
        tensor = self.plan.tensor(name)
        if offset < 0 or offset + size > tensor.bytes:
            raise ArenaRangeError(f"{size} bytes at offset {offset} do not fit tensor {name!r} "
                                  f"({tensor.bytes} bytes)")
        return tensor.address - self.plan.address_map.arena.base + offset

    def _patchable_scalars(self, region_name: str) -> dict[str, tuple[str, int]]:
        """Scalars no footprint depends on: name -> (dtype, offset in the block)."""
        if region_name not in self._patchable:
            region = self.plan.region(region_name)
            sizing = {factor for p in region.params if isinstance(p, PointerParam)
                      for factor in p.footprint.factors}
            self._patchable[region_name] = {
                slot.param.name: (slot.param.dtype, slot.offset)
                for slot in argument_slots(self.plan.target, region.params)
                if isinstance(slot.param, ScalarParam) and slot.param.name not in sizing
            }
        return self._patchable[region_name]

    # -- what each backend supplies -----------------------------------------------
    @abstractmethod
    def _write_arena(self, offset: int, data: memoryview) -> None:
        """Copy `data` to the arena at byte `offset` (checked: inside one tensor)."""

    @abstractmethod
    def _read_arena(self, offset: int, size: int) -> bytes:
        """`size` bytes of the arena from byte `offset` (checked: inside one tensor)."""

    @abstractmethod
    def _run(self, submissions: range) -> None:
        """Run these submissions (checked: non-empty, in the plan) and wait for the last."""

    @abstractmethod
    def _carry_patches(self, launch_index: int, values: dict[str, Scalar],
                       patches: list[Patch]) -> None:
        """These scalars changed, their words at these block offsets: carry them to where
        the device reads launch `launch_index`'s parameter block."""
