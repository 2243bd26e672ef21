"""The plan as plain data: regions, tensors, launches and submissions.

A *program* (``ProgramSpec``) is what a client declares: regions with their
parameter lists, tensors by name and size, launches whose pointer arguments
name a tensor and an offset, and the submission schedule. ``placement.place``
turns it into a *plan* (``Plan``): every tensor, region and parameter block at
a virtual address, every pointer argument an absolute address. The certificate
judges a plan; backends execute one.

Nothing here knows what the kernels compute.
"""

from __future__ import annotations

import bisect
import functools
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from bob.config import DEFAULT_SUBMISSION_POLICY, SubmissionPolicy

ScalarType = Literal["f32", "u32"]
Access = Literal["read", "write", "readwrite"]

# The launch-dependent names a footprint may multiply by, besides the
# launch's own u32 scalar arguments.
GEOMETRY_FACTORS = ("grid.x", "grid.y", "grid.z", "block.x", "block.y", "block.z")


@dataclass(frozen=True)
class Footprint:
    """Bytes a kernel reaches through one pointer: scale times the factors.

    Factors name u32 scalar arguments of the launch or its geometry
    (``grid.x`` ...), so one region declares a footprint that each launch
    evaluates with its own values (the gather reads any row of the table:
    ``Footprint(4, ("vocab", "vocab"))``).
    """

    scale: int
    factors: tuple[str, ...] = ()

    def evaluate(self, values: dict[str, int]) -> int:
        return self.scale * math.prod(values[name] for name in self.factors)

    def describe(self) -> str:
        return " * ".join([str(self.scale), *self.factors])


@dataclass(frozen=True)
class PointerParam:
    name: str
    footprint: Footprint
    access: Access = "read"
    align: int = 4  # the element size the kernel loads through it


@dataclass(frozen=True)
class ScalarParam:
    name: str
    dtype: ScalarType


Param = PointerParam | ScalarParam


@dataclass(frozen=True)
class ClusterSlices:
    """How a cluster region splits a row over the CTAs of a thread-block cluster.

    A row of n columns (the u32 argument `columns`) has `lanes` tree lanes; CTA c of C
    holds lanes c L .. c L + L - 1 (L = lanes / C), so its slice is the row's columns j
    with j % lanes in that range: L of every `lanes`, ceil(n / lanes) L positions, each of
    `arrays` float arrays (w, m, v, ...) in the CTA's dynamic shared memory. C is a power
    of two of at most lanes / 4 (a slice moves whole quads).
    """

    arrays: int
    columns: str = "vocab"
    lanes: int = 256

    def lanes_per_cta(self, ctas: int) -> int:
        return self.lanes // ctas

    def slice_bytes(self, columns: int, ctas: int) -> int:
        """The dynamic shared memory one CTA of `ctas` needs for a row of `columns`."""
        return self.arrays * 4 * -(-columns // self.lanes) * self.lanes_per_cta(ctas)

    def allows(self, ctas: int) -> bool:
        """Whether a cluster of `ctas` CTAs splits the lanes into whole quads."""
        return 2 <= ctas <= self.lanes // 4 and ctas & (ctas - 1) == 0

    def last_column(self, columns: int, ctas: int, rank: int) -> int | None:
        """The last column of a row of `columns` in CTA `rank`'s slice (None: none)."""
        width = self.lanes_per_cta(ctas)
        first = rank * width
        if first >= columns:
            return None
        last_chain = (columns - 1 - first) // self.lanes  # its last chain position inside
        return min(columns - 1, last_chain * self.lanes + first + width - 1)


@dataclass(frozen=True)
class Region:
    """One kernel: its machine code and the resources and arguments it takes."""

    name: str
    code: bytes = b""
    registers: int = 32
    block_x: int = 256
    shared_bytes: int = 0  # static: what the image declares
    params: tuple[Param, ...] = ()
    entry: str = ""  # the symbol in the compiled image, where there is one
    dynamic_shared_bytes: int = 0  # asked for at launch, beyond the image's
    # A cluster region's slices (launched in clusters of Launch.cluster CTAs); None: a
    # region whose CTAs are alone.
    cluster_slices: ClusterSlices | None = None

    @property
    def shared_window_bytes(self) -> int:
        """The block's whole shared memory: the image's and the launch's."""
        return self.shared_bytes + self.dynamic_shared_bytes


@dataclass(frozen=True)
class TensorSpec:
    """One arena tensor as declared: name, element type and shape."""

    name: str
    dtype: str  # "f32" | "u32" | "u8"
    shape: tuple[int, ...]

    @property
    def bytes(self) -> int:
        return DTYPE_BYTES[self.dtype] * math.prod(self.shape)


DTYPE_BYTES = {"f32": 4, "u32": 4, "u8": 1}


@dataclass(frozen=True)
class Tensor:
    """A placed tensor: its declaration, address and alignment."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    address: int
    bytes: int
    align: int

    @property
    def end(self) -> int:
        return self.address + self.bytes


@dataclass(frozen=True)
class TensorRef:
    """A pointer argument as a program declares it: a tensor and a byte offset."""

    tensor: str
    offset: int = 0


@dataclass(frozen=True)
class Scalar:
    """A scalar argument, held as its 32-bit pattern so JSON round-trips exactly."""

    dtype: ScalarType
    bits: int

    @staticmethod
    def f32(value: float) -> Scalar:
        return Scalar("f32", struct.unpack("<I", struct.pack("<f", value))[0])

    @staticmethod
    def f32_bits(bits: int) -> Scalar:
        return Scalar("f32", bits)

    @staticmethod
    def u32(value: int) -> Scalar:
        return Scalar("u32", value)

    @property
    def value(self) -> float | int:
        if self.dtype == "f32":
            return struct.unpack("<f", struct.pack("<I", self.bits))[0]
        return self.bits


@dataclass(frozen=True)
class Address:
    """A placed pointer argument: an absolute virtual address."""

    address: int


@dataclass(frozen=True)
class Dim3:
    x: int = 1
    y: int = 1
    z: int = 1

    @property
    def count(self) -> int:
        return self.x * self.y * self.z


@dataclass(frozen=True)
class LaunchSpec:
    """A launch as a program declares it."""

    region: str
    grid: Dim3
    block: Dim3
    args: tuple[TensorRef | Scalar, ...]
    label: str = ""  # what this launch does in the program, for listings
    cluster: int = 1  # CTAs per thread-block cluster, along x (1: no clusters)


@dataclass(frozen=True)
class Launch:
    """A placed launch: pointer arguments are addresses."""

    region: str
    grid: Dim3
    block: Dim3
    args: tuple[Address | Scalar, ...]
    label: str = ""
    cluster: int = 1  # CTAs per thread-block cluster, along x (grid.x a multiple of it)


@dataclass(frozen=True)
class Submission:
    """A batch of consecutive launches, released to the semaphore with a value.

    How its launches reach the device is the plan's ``submission_policy``:
    ``per-launch``, each dispatched by the host's command stream with a
    wait-for-idle between them; ``chained``, the first dispatched, each later
    one scheduled by its predecessor's completion. Either way the value is
    released once, after the last launch.
    """

    first_launch: int
    count: int
    semaphore: int

    @property
    def launches(self) -> range:
        return range(self.first_launch, self.first_launch + self.count)


@dataclass(frozen=True)
class Target:
    """What a plan needs to know of an architecture: the parameter block shape,
    the launch limits of the hardware and the size of the device.

    The seed's 512-byte block holds Ampere's driver area (0x160 bytes) and the
    arguments; Hopper's driver area ends at 0x210, past 512, so its blocks are
    1024 bytes.

    The limits are facts of the architecture (the CUDA C++ Programming Guide,
    "Technical Specifications per Compute Capability"): the defaults hold from
    compute capability 7.0 through 9.0; shared memory per block differs, and
    each target states its own. The SM count is a fact of one part, not of the
    architecture: each target states a documented part's, and ``for_device``
    gives the same target with the count of the device at hand.
    """

    name: str
    parameter_base: int
    parameter_block_bytes: int
    qmd_record_bytes: int
    # QMDs are dispatched by address >> 8, so records sit at a 256-byte multiple.
    qmd_stride_bytes: int = 0
    pushbuffer_setup_bytes: int = 4096
    pushbuffer_bytes_per_submission: int = 256
    max_block: tuple[int, int, int] = (1024, 1024, 64)  # threads along x, y, z
    max_threads_per_block: int = 1024
    max_grid: tuple[int, int, int] = ((1 << 31) - 1, 65535, 65535)  # blocks along x, y, z
    # Static shared memory alone stops at 48 KiB; a block may opt in to more, up to this.
    max_shared_bytes_per_block: int = 48 * 1024
    # Streaming multiprocessors of the part the target stands for (for_device: of one
    # device): a program sizes a grid of one block per SM by it.
    multiprocessors: int = field(kw_only=True)
    max_registers_per_thread: int = 255
    registers_per_block: int = 65536
    # Registers are allocated per warp, in units of 256 (8 per thread).
    register_unit_per_thread: int = 8
    # Thread-block clusters (sm_90): the most CTAs a cluster may have (1: no clusters), and
    # how many of the part's SMs hold clusters at once (fewer than all: a cluster's CTAs
    # share one GPC, and GPCs have SMs left over); a cluster grid is that many CTAs.
    max_cluster_ctas: int = 1
    cluster_multiprocessors: int = 0

    def __post_init__(self) -> None:
        if self.qmd_stride_bytes == 0:
            stride = -(-self.qmd_record_bytes // 256) * 256
            object.__setattr__(self, "qmd_stride_bytes", stride)
        if self.multiprocessors < 1:
            raise ValueError(f"{self.name}: a device has at least one SM, not "
                             f"{self.multiprocessors!r}")

    def for_device(self, *, multiprocessors: int) -> Target:
        """This target with one device's own SM count (the driver's
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT): the same layout and limits; of the SMs
        that hold clusters, no more than the device has."""
        return replace(self, multiprocessors=multiprocessors,
                       cluster_multiprocessors=min(self.cluster_multiprocessors,
                                                   multiprocessors))

    def without_clusters(self) -> Target:
        """This target for a backend that launches no clusters: the same in all else."""
        return replace(self, max_cluster_ctas=1, cluster_multiprocessors=0)

    def cluster_grid(self, ctas: int) -> int:
        """The CTAs of a grid of as many clusters of `ctas` as the target holds at once."""
        return max(1, self.cluster_multiprocessors // ctas) * ctas


@dataclass(frozen=True)
class ProgramSpec:
    """A whole device program as declared, before placement."""

    regions: tuple[Region, ...]
    tensors: tuple[TensorSpec, ...]
    launches: tuple[LaunchSpec, ...]
    submissions: tuple[Submission, ...]
    forward_launches: int = 0  # launches a forward-only request runs
    forward_submissions: int = 0
    submission_policy: SubmissionPolicy = DEFAULT_SUBMISSION_POLICY  # see Submission
    attributes: dict[str, str | int] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Component:
    """One component of the virtual address map."""

    name: str
    base: int
    bytes: int

    @property
    def end(self) -> int:
        return self.base + self.bytes


@dataclass(frozen=True)
class AddressMap:
    program: Component
    qmd_table: Component
    pushbuffer: Component
    semaphores: Component
    arena: Component

    @property
    def components(self) -> tuple[Component, ...]:
        return (self.program, self.qmd_table, self.pushbuffer, self.semaphores, self.arena)


@dataclass(frozen=True)
class PlacedRegion:
    """A retained region at its place in the program component."""

    name: str
    address: int
    bytes: int


@dataclass(frozen=True)
class Plan:
    """A placed program: everything a backend needs, at virtual addresses."""

    target: Target
    address_map: AddressMap
    region_alignment: int
    page_bytes: int
    regions: tuple[Region, ...]
    placed_regions: tuple[PlacedRegion, ...]
    code_extent: int
    tensors: tuple[Tensor, ...]
    launches: tuple[Launch, ...]
    submissions: tuple[Submission, ...]
    forward_launches: int
    forward_submissions: int
    submission_policy: SubmissionPolicy = DEFAULT_SUBMISSION_POLICY  # see Submission
    attributes: dict[str, str | int] = field(default_factory=dict, compare=False)

    # -- lookups -----------------------------------------------------------
    def region(self, name: str) -> Region:
        for region in self.regions:
            if region.name == name:
                return region
        raise KeyError(f"no region named {name!r} in the plan")

    def placed_region(self, name: str) -> PlacedRegion:
        for placed in self.placed_regions:
            if placed.name == name:
                return placed
        raise KeyError(f"region {name!r} is not retained in the program component")

    def tensor(self, name: str) -> Tensor:
        tensor = self._tensors_by_name.get(name)
        if tensor is None:
            raise KeyError(f"no tensor named {name!r} in the plan")
        return tensor

    @functools.cached_property
    def _tensors_by_name(self) -> dict[str, Tensor]:
        """Each name's first tensor (the host looks tensors up many times an invocation)."""
        named: dict[str, Tensor] = {}
        for tensor in self.tensors:
            named.setdefault(tensor.name, tensor)
        return named

    def tensor_at(self, address: int) -> Tensor | None:
        """The tensor holding `address`; where tensors overlap, the one starting last (of
        those starting together, the first in the plan)."""
        starts, ordered = self._tensors_by_start
        found = None
        # Back from the last tensor starting at or below `address`: the first holder met
        # starts last; past its start, no later holder can win.
        for i in range(bisect.bisect_right(starts, address) - 1, -1, -1):
            tensor = ordered[i]
            if found is not None and tensor.address < found.address:
                break
            if address < tensor.end:
                found = tensor  # an equal start earlier in the plan replaces it
        return found

    @functools.cached_property
    def _tensors_by_start(self) -> tuple[list[int], list[Tensor]]:
        """The tensors by address (a stable sort: equal starts keep the plan's order), and
        their starts: tensor_at's index, built once per plan (the plan never changes)."""
        ordered = sorted(self.tensors, key=lambda t: t.address)
        return [t.address for t in ordered], ordered

    def parameter_block_address(self, launch_index: int) -> int:
        return (
            self.address_map.program.base
            + self.code_extent
            + launch_index * self.target.parameter_block_bytes
        )

    # -- derived figures ---------------------------------------------------
    @property
    def launch_count(self) -> int:
        return len(self.launches)

    @property
    def submission_count(self) -> int:
        return len(self.submissions)

    @property
    def program_bytes(self) -> int:
        return self.code_extent + self.launch_count * self.target.parameter_block_bytes

    @property
    def qmd_table_bytes(self) -> int:
        return self.launch_count * self.target.qmd_stride_bytes

    @property
    def arena_bytes(self) -> int:
        return self.address_map.arena.bytes


@dataclass(frozen=True)
class RegionCatalogue:
    """The regions a plan reader may admit, from the client's own code, never from a file.

    ``declared`` holds each region as its client declares it, before
    compilation (no code); ``compiled(target)`` gives the regions read from the
    client's compiled image for a target (code, registers, shared memory). A
    plan read from JSON names its regions; their footprints, parameters and
    code are taken from here and the file's copy must agree.
    """

    declared: Mapping[str, Region]
    compiled: Callable[[Target], Mapping[str, Region]] | None = None
    owner: str = "the program"  # whose regions these are, for messages
