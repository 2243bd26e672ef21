"""The vendor-neutral core every backend implements.

A backend is opened on a certified plan and owns one arena laid out as the
plan says. The host writes tensors, patches scalar arguments (never pointers:
the certificate stays valid), runs a range of submissions and reads tensors
back. Backends know the plan, never the host.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod

from bob.plan.certificate import require_certified
from bob.plan.model import Launch, Plan, PointerParam, Scalar, ScalarParam
from bob.plan.placement import argument_slots, encode_parameter_block

_WORD = struct.Struct("<I")


class Backend(ABC):
    name = "abstract"

    def __init__(self, plan: Plan):
        require_certified(plan)  # before any allocation
        self.plan = plan
        self.launches: list[Launch] = list(plan.launches)
        self._blocks: dict[int, bytearray] = {}  # parameter blocks patched since opening
        self._patchable: dict[str, dict[str, tuple[int, str, int]]] = {}
        self.last_semaphore = 0

    # -- what the host uses ----------------------------------------------
    @abstractmethod
    def write_tensor(self, name: str, data: bytes, offset: int = 0) -> None:
        """Copy `data` (any bytes-like object: bytes, memoryview, a uint8 array) in."""

    @abstractmethod
    def read_tensor(self, name: str) -> bytes: ...

    @abstractmethod
    def run(self, submissions: range) -> None:
        """Execute these submissions in order and wait until the last completes."""

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
        launch = self.launches[launch_index]
        patchable = self._patchable_scalars(launch.region)
        args = list(launch.args)
        patches: list[tuple[int, bytes]] = []
        for name, value in values.items():
            if name not in patchable:
                raise KeyError(f"region {launch.region!r} has no patchable scalar argument "
                               f"{name!r} (pointers and footprint sizes are fixed by the plan)")
            position, dtype, offset = patchable[name]
            if value.dtype != dtype:
                raise TypeError(f"argument {name!r} is {dtype}, not {value.dtype}")
            args[position] = value
            patches.append((offset, _WORD.pack(value.bits)))
        block = self._blocks.get(launch_index)
        if block is None:
            block = self._blocks[launch_index] = bytearray(self.parameter_block(launch_index))
        for offset, word in patches:
            block[offset:offset + 4] = word
        self.launches[launch_index] = Launch(launch.region, launch.grid, launch.block,
                                             tuple(args), launch.label)
        self._scalars_patched(launch_index, values, patches)

    def _scalars_patched(self, launch_index: int, values: dict[str, Scalar],
                         patches: list[tuple[int, bytes]]) -> None:
        """These scalars changed, their words at these block offsets; by default the
        backend re-reads the whole block."""
        self._parameter_block_changed(launch_index)

    def _patchable_scalars(self, region_name: str) -> dict[str, tuple[int, str, int]]:
        """Scalars no footprint depends on: name -> (position, dtype, offset in the block)."""
        if region_name not in self._patchable:
            region = self.plan.region(region_name)
            sizing = {factor for p in region.params if isinstance(p, PointerParam)
                      for factor in p.footprint.factors}
            offsets = {slot.param.name: slot.offset
                       for slot in argument_slots(self.plan.target, region.params)}
            self._patchable[region_name] = {
                p.name: (i, p.dtype, offsets[p.name]) for i, p in enumerate(region.params)
                if isinstance(p, ScalarParam) and p.name not in sizing
            }
        return self._patchable[region_name]

    def parameter_block(self, launch_index: int) -> bytes:
        """Launch `launch_index`'s parameter block as it stands (patches included)."""
        block = self._blocks.get(launch_index)
        if block is not None:
            return bytes(block)
        launch = self.launches[launch_index]
        return encode_parameter_block(self.plan.target, self.plan.region(launch.region), launch)

    @abstractmethod
    def _parameter_block_changed(self, launch_index: int) -> None:
        """Carry launch `launch_index`'s new parameter block to where the device reads it."""
