"""Placement: from a declared program to a plan at virtual addresses.

- Tensors in declaration order, each after the previous at page alignment.
- Regions that no launch uses are pruned; the survivors are packed in
  declaration order at the region alignment.
- The program component is the retained code, then one parameter block per
  launch. Each block is the architecture's driver area, then 8-byte pointer
  words from the parameter base, then 4-byte scalars (two to a word). This is
  the CUDA kernel parameter layout for a signature of pointers then scalars.
- The address map lays program, QMD table, pushbuffer, semaphores and arena
  one after another, each at a 2 MiB boundary.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from bob.errors import BadInput
from bob.plan.model import (
    Address,
    AddressMap,
    Component,
    Launch,
    LaunchSpec,
    Param,
    PlacedRegion,
    Plan,
    PointerParam,
    ProgramSpec,
    Region,
    Scalar,
    ScalarParam,
    Target,
    Tensor,
    TensorRef,
)

PAGE_BYTES = 4096
REGION_ALIGNMENT = 256
COMPONENT_ALIGNMENT = 2 << 20
# Far from zero and below 2^40 (the QMD's program and PCAS address limit).
DEFAULT_VA_BASE = 0x20_0000_0000
SEMAPHORE_STRIDE = 16

POINTER_WORD_BYTES = 8
SCALAR_BYTES = 4

# Shared memory per block with opt-in: 99 KiB on compute capability 8.6, 227 KiB on 9.0.
# SM counts (Target.for_device gives a device's own): sm_90's is the H200's, 132; sm_86's the
# A40's (and RTX A6000's), 84, the full GA102: the data-centre part of the architecture, as
# the H200 is of sm_90's, and the most SMs any sm_86 part has.
SM86 = Target("sm_86", parameter_base=0x160, parameter_block_bytes=512, qmd_record_bytes=256,
              max_shared_bytes_per_block=99 * 1024, multiprocessors=84)
# Clusters: sm_90 launches up to 8 CTAs a cluster portably (the CUDA C++ Programming Guide,
# "Thread Block Clusters"; 16 only as a non-portable size, never needed below V = 65536);
# of the H200's 132 SMs, 120 hold clusters of 4 or 8 at once (cuOccupancyMaxActiveClusters,
# docs/BENCHMARKS.md).
SM90 = Target("sm_90", parameter_base=0x210, parameter_block_bytes=1024, qmd_record_bytes=384,
              max_shared_bytes_per_block=227 * 1024, multiprocessors=132,
              max_cluster_ctas=8, cluster_multiprocessors=120)
TARGETS = {target.name: target for target in (SM86, SM90)}


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


# -- parameter blocks ------------------------------------------------------


@dataclass(frozen=True)
class ArgumentSlot:
    """Where one argument lives inside a parameter block."""

    param: Param
    offset: int  # bytes from the start of the block
    size: int


@functools.lru_cache(maxsize=256)
def argument_slots(target: Target, params: tuple[Param, ...]) -> tuple[ArgumentSlot, ...]:
    """Pointers first, one 8-byte word each; then scalars, 4 bytes each."""
    slots: list[ArgumentSlot] = []
    offset = target.parameter_base
    for param in params:
        if isinstance(param, PointerParam):
            slots.append(ArgumentSlot(param, offset, POINTER_WORD_BYTES))
            offset += POINTER_WORD_BYTES
    for param in params:
        if isinstance(param, ScalarParam):
            slots.append(ArgumentSlot(param, offset, SCALAR_BYTES))
            offset += SCALAR_BYTES
    return tuple(slots)


def argument_bytes_end(target: Target, params: tuple[Param, ...]) -> int:
    """The first byte past the last argument, rounded to a whole word.

    The end of argument_slots' last slot, counted rather than laid out: hashing the
    parameters to find the cached slots costs more than counting them.
    """
    pointers = sum(isinstance(param, PointerParam) for param in params)
    scalars = sum(isinstance(param, ScalarParam) for param in params)
    end = target.parameter_base + pointers * POINTER_WORD_BYTES + scalars * SCALAR_BYTES
    return align_up(end, POINTER_WORD_BYTES)


@dataclass(frozen=True)
class ArgumentLayout:
    """One region's arguments as a single struct from the target's parameter base, in
    argument_slots' order: pointer words first, then scalars. Made once per region, so
    encoding a plan's thousands of launches packs each in one call."""

    base: int  # the target's parameter base: where the struct starts in a block
    block_bytes: int  # a whole parameter block (the driver area included)
    order: tuple[int, ...]  # the position in Launch.args of each slot's argument
    pointers: int  # how many of the slots (the first ones) are pointer words
    packer: struct.Struct

    def values(self, launch: Launch) -> list[int]:
        """The launch's arguments as the struct's integers (addresses, then scalar bits)."""
        values = []
        for slot, position in enumerate(self.order):
            arg = launch.args[position]
            pointer = slot < self.pointers
            if not isinstance(arg, Address if pointer else Scalar):
                raise TypeError(f"argument {position} of a {launch.region!r} launch is a "
                                f"{'pointer' if pointer else 'scalar'} parameter given {arg!r}")
            values.append(arg.address if pointer else arg.bits)
        return values

    def encode(self, launch: Launch) -> bytes:
        """The parameter block of one launch: driver area zero, arguments after."""
        block = bytearray(self.block_bytes)
        self.packer.pack_into(block, self.base, *self.values(launch))
        return bytes(block)


@functools.lru_cache(maxsize=256)
def argument_layout(target: Target, params: tuple[Param, ...]) -> ArgumentLayout:
    """A region's arguments (its `params`) as one struct (see ArgumentLayout)."""
    slots = argument_slots(target, params)
    position = {param.name: index for index, param in enumerate(params)}
    pointers = sum(isinstance(slot.param, PointerParam) for slot in slots)
    packer = struct.Struct("<" + "Q" * pointers + "I" * (len(slots) - pointers))
    end = argument_bytes_end(target, params)
    return ArgumentLayout(target.parameter_base, max(end, target.parameter_block_bytes),
                          tuple(position[slot.param.name] for slot in slots), pointers, packer)


def encode_parameter_block(target: Target, region: Region, launch: Launch) -> bytes:
    """The parameter block of one launch: driver area zero, arguments after."""
    if len(launch.args) != len(region.params):
        raise ValueError(f"a {region.name!r} launch has {len(launch.args)} arguments for "
                         f"{len(region.params)} parameters")
    return argument_layout(target, region.params).encode(launch)


def decode_parameter_block(
    target: Target, region: Region, block: bytes
) -> dict[str, Address | Scalar]:
    """The arguments a kernel finds in its parameter block, by parameter name."""
    args: dict[str, Address | Scalar] = {}
    for slot in argument_slots(target, region.params):
        if isinstance(slot.param, PointerParam):
            (address,) = struct.unpack_from("<Q", block, slot.offset)
            args[slot.param.name] = Address(address)
        else:
            (bits,) = struct.unpack_from("<I", block, slot.offset)
            args[slot.param.name] = Scalar(slot.param.dtype, bits)
    return args


# -- placement -------------------------------------------------------------


def place(
    program: ProgramSpec,
    target: Target,
    va_base: int = DEFAULT_VA_BASE,
    page_bytes: int = PAGE_BYTES,
    region_alignment: int = REGION_ALIGNMENT,
) -> Plan:
    """Place a declared program: the plan every backend executes."""
    used = {launch.region for launch in program.launches}
    placed_regions: list[PlacedRegion] = []
    cursor = 0
    for region in program.regions:
        if region.name not in used:
            continue  # pruned: no launch uses it
        placed_regions.append(PlacedRegion(region.name, va_base + cursor, len(region.code)))
        # Even a region without code yet takes a slot: its address names it.
        cursor = align_up(cursor + max(len(region.code), 1), region_alignment)
    code_extent = cursor

    launch_count = len(program.launches)
    program_bytes = code_extent + launch_count * target.parameter_block_bytes
    submissions = len(program.submissions)
    sizes = (
        ("program", program_bytes),
        ("qmd-table", launch_count * target.qmd_stride_bytes),
        (
            "pushbuffer",
            target.pushbuffer_setup_bytes + submissions * target.pushbuffer_bytes_per_submission,
        ),
        ("semaphores", max(1, submissions) * SEMAPHORE_STRIDE),
    )
    components: list[Component] = []
    base = va_base
    for name, size in sizes:
        components.append(Component(name, base, size))
        base = align_up(base + max(size, 1), COMPONENT_ALIGNMENT)
    arena_base = base

    tensors: list[Tensor] = []
    address = arena_base
    for spec in program.tensors:
        address = align_up(address, page_bytes)
        tensors.append(Tensor(spec.name, spec.dtype, spec.shape, address, spec.bytes, page_bytes))
        address += spec.bytes
    arena = Component("arena", arena_base, address - arena_base)
    address_map = AddressMap(*components, arena)

    launches = _place_launches(program.launches, {t.name: t for t in tensors})
    return Plan(
        target=target,
        address_map=address_map,
        region_alignment=region_alignment,
        page_bytes=page_bytes,
        regions=program.regions,
        placed_regions=tuple(placed_regions),
        code_extent=code_extent,
        tensors=tuple(tensors),
        launches=launches,
        submissions=program.submissions,
        forward_launches=program.forward_launches,
        forward_submissions=program.forward_submissions,
        submission_policy=program.submission_policy,
        attributes=dict(program.attributes),
    )


def _place_launches(specs: tuple[LaunchSpec, ...], tensors: dict[str, Tensor],
                    ) -> tuple[Launch, ...]:
    """Each launch with its pointers at addresses. A program may repeat one spec (the
    seed's training loss): placing is a pure function of the spec, so once is enough."""
    addresses: dict[TensorRef, Address] = {}
    placed: dict[int, Launch] = {}  # by id: every spec stays alive in `specs`
    for spec in specs:
        if id(spec) not in placed:
            placed[id(spec)] = _place_launch(spec, tensors, addresses)
    return tuple(placed[id(spec)] for spec in specs)


def _place_launch(spec: LaunchSpec, tensors: dict[str, Tensor],
                  addresses: dict[TensorRef, Address]) -> Launch:
    args: list[Address | Scalar] = []
    for arg in spec.args:
        if isinstance(arg, TensorRef):
            address = addresses.get(arg)
            if address is None:
                address = addresses[arg] = _place_pointer(spec, arg, tensors)
            args.append(address)
        else:
            args.append(arg)
    return Launch(spec.region, spec.grid, spec.block, tuple(args), spec.label, spec.cluster)


def _place_pointer(spec: LaunchSpec, ref: TensorRef, tensors: dict[str, Tensor]) -> Address:
    if ref.tensor not in tensors:
        raise BadInput(
            f"launch {spec.label or spec.region!r} names tensor {ref.tensor!r}, "
            "which the program does not declare"
        )
    return Address(tensors[ref.tensor].address + ref.offset)
