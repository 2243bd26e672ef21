"""The vendor-neutral core every backend implements.

A backend is opened on a certified plan and owns one arena laid out as the
plan says. The host writes tensors, patches scalar arguments (never pointers:
the certificate stays valid), runs a range of submissions and reads tensors
back. Backends know the plan, never the host.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from bob.plan.certificate import require_certified
from bob.plan.model import Launch, Plan, PointerParam, Scalar, ScalarParam
from bob.plan.placement import encode_parameter_block


class Backend(ABC):
    name = "abstract"

    def __init__(self, plan: Plan):
        require_certified(plan)  # before any allocation
        self.plan = plan
        self.launches: list[Launch] = list(plan.launches)
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
        certificate still holds for the patched launch.
        """
        launch = self.launches[launch_index]
        patchable = self._patchable_scalars(launch.region)
        args = list(launch.args)
        for name, value in values.items():
            if name not in patchable:
                raise KeyError(f"region {launch.region!r} has no patchable scalar argument "
                               f"{name!r} (pointers and footprint sizes are fixed by the plan)")
            position, dtype = patchable[name]
            if value.dtype != dtype:
                raise TypeError(f"argument {name!r} is {dtype}, not {value.dtype}")
            args[position] = value
        self.launches[launch_index] = Launch(launch.region, launch.grid, launch.block,
                                             tuple(args), launch.label)
        self._parameter_block_changed(launch_index)

    def _patchable_scalars(self, region_name: str) -> dict[str, tuple[int, str]]:
        """Scalar arguments no footprint depends on: name -> (position, dtype)."""
        cache = self.__dict__.setdefault("_patchable_cache", {})
        if region_name not in cache:
            region = self.plan.region(region_name)
            sizing = {factor for p in region.params if isinstance(p, PointerParam)
                      for factor in p.footprint.factors}
            cache[region_name] = {
                p.name: (i, p.dtype) for i, p in enumerate(region.params)
                if isinstance(p, ScalarParam) and p.name not in sizing
            }
        return cache[region_name]

    def parameter_block(self, launch_index: int) -> bytes:
        launch = self.launches[launch_index]
        return encode_parameter_block(self.plan.target, self.plan.region(launch.region), launch)

    @abstractmethod
    def _parameter_block_changed(self, launch_index: int) -> None:
        """Carry launch `launch_index`'s new parameter block to where the device reads it."""
