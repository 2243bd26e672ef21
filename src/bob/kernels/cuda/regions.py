"""Regions from compiled images: the one place that composes the compiler and the ELF reader.

    python -m bob.kernels.cuda.regions sm_90      # print each entry of Bob's compiled kernels

``compile`` turns CUDA C into a cubin; ``cubin`` reads a cubin. This module
checks an image against the regions a program declares (every entry present,
its parameters where the plan writes them, the plan's block allowed) and
gives the declared regions the image's code and resources. The result,
``CompiledRegions``, is a mapping name -> Region that also carries the image
it was read from: a plan is built from the regions, the CUDA backend loads the
image, and neither compiles or checks again. ``catalogue`` gives a plan reader
Bob's regions: the declared ones, and the compiled ones for a plan with code.

Compiled regions also travel as a file, to a GPU machine without NVRTC
(``export_regions``, ``load_regions``); the file starts with its format name
and version.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from bob.config import DEFAULT_TARGET
from bob.errors import BadInput, RunFailure
from bob.kernels import signatures as sig
from bob.kernels.cuda.compile import KernelSource, compile_source, normalize_arch, shipped_source
from bob.kernels.cuda.cubin import Cubin, Kernel, KernelParam, describe
from bob.plan.model import Param, Region, RegionCatalogue, Target
from bob.plan.placement import TARGETS, argument_slots

REGIONS_FORMAT = "bob-nv-regions"
REGIONS_VERSION = 1


class CompiledRegions(Mapping[str, Region]):
    """Regions read from one compiled image (name -> Region), and the image itself."""

    def __init__(self, image: bytes, regions: Mapping[str, Region]):
        self.image = image  # the cubin; empty for regions loaded from a file
        self._regions = dict(regions)

    def __getitem__(self, name: str) -> Region:
        return self._regions[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._regions)

    def __len__(self) -> int:
        return len(self._regions)


def bob_declared_regions() -> tuple[Region, ...]:
    """Bob's regions as declared: no code yet."""
    return tuple(sig.declared_region(name) for name in sig.ENTRIES)


# -- the image against the plan ----------------------------------------------


def check_parameter_layout(kernel: Kernel, target: Target, params: tuple[Param, ...],
                           *, check_base: bool = True) -> None:
    """Raise unless the kernel reads its arguments exactly where the plan writes them.

    The plan's parameter block holds pointers (8 bytes) then scalars (4 bytes)
    from the target's parameter base; the kernel's parameters, by ordinal, must
    sit at the same offsets with the same sizes, and nothing else. With
    ``check_base`` the kernel's parameter base must also be the target's (an
    image for another architecture has another base).
    """
    where = f"kernel {kernel.entry!r}"
    if check_base and kernel.parameter_base != target.parameter_base:
        raise RunFailure(
            f"{where}: parameters start at 0x{kernel.parameter_base:x} in constant bank 0, "
            f"but the plan's target {target.name} puts them at 0x{target.parameter_base:x}"
        )
    slots = argument_slots(target, params)
    expected = tuple(
        KernelParam(ordinal, slot.offset - target.parameter_base, slot.size)
        for ordinal, slot in enumerate(slots)
    )
    expected_bytes = max((p.offset + p.size for p in expected), default=0)
    if kernel.parameter_bytes != expected_bytes:
        raise RunFailure(f"{where}: takes {kernel.parameter_bytes} parameter bytes, the plan's "
                         f"signature {expected_bytes}")
    if kernel.params and kernel.params != expected:
        found = ", ".join(f"#{p.ordinal}@{p.offset}:{p.size}" for p in kernel.params)
        wanted = ", ".join(f"{slot.param.name}@{p.offset}:{p.size}"
                           for slot, p in zip(slots, expected, strict=True))
        raise RunFailure(f"{where}: parameters [{found}] do not match the plan's [{wanted}]")


def check_block(kernel: Kernel, block_x: int) -> None:
    """Raise if the kernel's launch bounds forbid the plan's block width."""
    if kernel.max_threads is not None:
        limit = kernel.max_threads[0] * kernel.max_threads[1] * kernel.max_threads[2]
        if block_x > limit:
            raise RunFailure(f"kernel {kernel.entry!r} allows {limit} threads per block, "
                             f"the plan launches {block_x}")
    if kernel.required_block is not None and kernel.required_block != (block_x, 1, 1):
        raise RunFailure(f"kernel {kernel.entry!r} requires block {kernel.required_block}, "
                         f"the plan launches ({block_x}, 1, 1)")


def check_no_local_memory(kernel: Kernel) -> None:
    """Raise if the kernel needs a per-thread stack (spilled registers, local arrays): a
    region's resources are its code, registers and shared memory, and Bob's own stream
    gives its launches no local memory."""
    if kernel.frame_bytes:
        raise RunFailure(f"kernel {kernel.entry!r} needs {kernel.frame_bytes} bytes of local "
                         "memory per thread (a stack frame); regions may use none")


def image_block(kernel: Kernel, declared: Region) -> int:
    """The block the plan launches: the declared one, or for sig.BLOCK_FROM_IMAGE the
    kernel's launch bounds (a variant compiled with another TALL_THREADS)."""
    if declared.name in sig.BLOCK_FROM_IMAGE and kernel.max_threads is not None:
        return kernel.max_threads[0] * kernel.max_threads[1] * kernel.max_threads[2]
    return declared.block_x


def region_from_kernel(kernel: Kernel, declared: Region, target: Target) -> Region:
    """The declared region with the image's code and resources, after checking the image."""
    check_parameter_layout(kernel, target, declared.params)
    block_x = image_block(kernel, declared)
    check_block(kernel, block_x)
    check_no_local_memory(kernel)
    return Region(
        name=declared.name,
        code=kernel.code,
        registers=kernel.registers,
        block_x=block_x,
        shared_bytes=kernel.shared_bytes,
        params=declared.params,
        entry=kernel.entry,
        dynamic_shared_bytes=(sig.shared_rest(target, kernel.shared_bytes)
                              if declared.name in sig.WHOLE_SM_SHARED
                              else 0),
        cluster_slices=declared.cluster_slices,
    )


def image_regions(image: bytes, target: Target,
                  declared: Iterable[Region] | None = None) -> CompiledRegions:
    """The declared regions (Bob's by default) read from a compiled image for `target`."""
    cubin = Cubin(image)
    expected_sm = int(target.name.removeprefix("sm_"))
    if cubin.sm != expected_sm:
        raise RunFailure(f"the image is for sm_{cubin.sm}, the plan's target is {target.name}")
    regions = {}
    for region in bob_declared_regions() if declared is None else declared:
        regions[region.name] = region_from_kernel(cubin.kernel(region.entry), region, target)
    return CompiledRegions(bytes(image), regions)


def compiled_regions(arch: str | int | tuple[int, int], source: KernelSource | None = None,
                     declared: Iterable[Region] | None = None,
                     **compile_options) -> CompiledRegions:
    """Compile `source` (Bob's kernels by default) for `arch`, cached, and read its regions."""
    arch = normalize_arch(arch)
    if arch not in TARGETS:
        raise RunFailure(f"no plan target for {arch} (targets: {', '.join(TARGETS)})")
    compiled = compile_source(source or shipped_source(), arch, **compile_options)
    return image_regions(compiled.image, TARGETS[arch], declared)


def catalogue() -> RegionCatalogue:
    """Bob's regions for a plan reader: the signatures and, for plans that carry code,
    the regions of Bob's kernels compiled for the plan's target."""
    return RegionCatalogue(
        declared={name: sig.declared_region(name) for name in sig.SIGNATURES},
        compiled=_compiled_regions,
        owner="Bob",
    )


def _compiled_regions(target: Target) -> CompiledRegions:
    return compiled_regions(target.name)  # NVRTC runs only here: for plans with code


# -- compiled regions as a file ------------------------------------------------------


def export_regions(path: str | Path, arch: str = DEFAULT_TARGET) -> CompiledRegions:
    """Compile Bob's regions for `arch` here and write their code and resources to `path`."""
    regions = compiled_regions(arch)
    document = {
        "format": REGIONS_FORMAT, "version": REGIONS_VERSION, "arch": normalize_arch(arch),
        "regions": {name: {"code": region.code.hex(), "registers": region.registers,
                           "shared_bytes": region.shared_bytes, "block_x": region.block_x,
                           "dynamic_shared_bytes": region.dynamic_shared_bytes}
                    for name, region in regions.items()},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document, indent=1))
    return regions


def load_regions(path: str | Path | None = None, arch: str = DEFAULT_TARGET,
                 ) -> Mapping[str, Region]:
    """Bob's regions for `arch` from an exported file, or compiled here without a path."""
    if path is None:
        return compiled_regions(arch)
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise BadInput(f"{path}: not a readable regions file ({error})") from None
    if document.get("format") != REGIONS_FORMAT or document.get("version") != REGIONS_VERSION:
        raise BadInput(f"{path}: expected a {REGIONS_FORMAT} file version {REGIONS_VERSION}; "
                       "re-export it with --export-regions")
    if document.get("arch") != arch:
        raise BadInput(f"{path}: regions for {document.get('arch')}, not {arch}")
    return {name: sig.declared_region(name, bytes.fromhex(entry["code"]), entry["registers"],
                                      entry["shared_bytes"], file_block(path, name, entry),
                                      entry.get("dynamic_shared_bytes", 0))
            for name, entry in document["regions"].items()}


def file_block(path: str | Path, name: str, entry: dict) -> int | None:
    """A region's exported block; None (the declared one) in files written before blocks
    were exported."""
    block = entry.get("block_x")
    if block is not None and (isinstance(block, bool) or not isinstance(block, int)
                              or not 0 < block <= 1024):
        raise BadInput(f"{path}: region {name}: block_x must be an integer in [1, 1024], "
                       f"not {block!r}")
    return block


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    for arch in args or list(TARGETS):
        cubin = Cubin(compiled_regions(arch).image)
        print(f"{arch} (image for sm_{cubin.sm}, ELF ABI {cubin.abi_version}):")
        for kernel in cubin.kernels().values():
            print("  " + describe(kernel))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
