"""The certificate: a plan is admitted only when no hazard is found.

Each check reports every violation it finds, with the launch, argument,
tensor and addresses involved, so a user sees all that is wrong at once.
The kinds, by name:

- ``tensor-overlap``: two tensors share bytes.
- ``tensor-outside-arena``: a tensor reaches outside the arena window.
- ``misaligned``: a tensor, region or pointer argument off its alignment.
- ``region-overlap``: two retained regions share program bytes.
- ``pointer-outside-tensors``: a pointer argument lies in no tensor.
- ``footprint-overflow``: the bytes a kernel reaches through a pointer run
  past the end of the tensor the pointer lies in.
- ``parameter-block-overflow``: a launch's arguments do not fit its block.
- ``argument-mismatch``: a launch's arguments do not match its region's list.
- ``unknown-region``: a launch names a region the plan does not declare.
- ``pruned-region``: a launch names a region the program component lacks.
- ``submission-range``: a submission names launches that do not exist.
- ``submission-order``: the submissions do not cover the launches in order.
- ``semaphore-order``: semaphore values do not strictly increase.
- ``geometry``: a launch's block differs from its region's block width, or a
  dimension is zero; or its clusters do not fit its region (a cluster region
  launched without clusters or in clusters that do not split its lanes into
  whole quads, another region in clusters, a grid not whole clusters).
- ``hardware-limit``: a launch's grid or block, or a region's shared memory or
  registers, exceed what the target's hardware can launch; a cluster larger
  than the target allows, or a cluster CTA's slice of a row larger than the
  shared memory its region asks for.

A cluster region's table pointers are checked slice by slice: CTA c of C reaches the
columns of its lanes in every row (``ClusterSlices``), so a footprint past its tensor
names the CTA whose slice of the last row runs out of it.

Launches alike in everything their checks read (``_launch_key``: all but the index
and label, which only name a launch in a hazard) pass or fail alike: a key that
passed is not checked again, and a launch that fails is checked where it stands.
The seed's 2N training launches are two keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bob.errors import BadInput
from bob.plan.model import (
    Address,
    ClusterSlices,
    Launch,
    Plan,
    PointerParam,
    Region,
    Scalar,
    ScalarParam,
    Target,
)
from bob.plan.placement import argument_bytes_end

HAZARD_KINDS = (
    "tensor-overlap",
    "tensor-outside-arena",
    "misaligned",
    "region-overlap",
    "pointer-outside-tensors",
    "footprint-overflow",
    "parameter-block-overflow",
    "argument-mismatch",
    "unknown-region",
    "pruned-region",
    "submission-range",
    "submission-order",
    "semaphore-order",
    "geometry",
    "hardware-limit",
)


@dataclass(frozen=True)
class Hazard:
    kind: str
    message: str
    launch: int | None = None
    argument: str | None = None
    tensor: str | None = None
    addresses: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "message": self.message,
            "launch": self.launch,
            "argument": self.argument,
            "tensor": self.tensor,
            "addresses": [f"0x{a:x}" for a in self.addresses],
        }


@dataclass(frozen=True)
class Certificate:
    hazards: tuple[Hazard, ...]

    @property
    def holds(self) -> bool:
        return not self.hazards

    def kinds(self) -> set[str]:
        return {h.kind for h in self.hazards}


class CertificateError(BadInput):
    """Raised when a backend or host is handed a plan whose certificate fails."""

    def __init__(self, certificate: Certificate):
        self.certificate = certificate
        lines = "; ".join(str(h) for h in certificate.hazards[:5])
        more = len(certificate.hazards) - 5
        suffix = f" (and {more} more)" if more > 0 else ""
        super().__init__(f"the plan is not certified: {lines}{suffix}")


_ISSUED = object()  # only require_certified holds it


@dataclass(frozen=True)
class CertifiedPlan:
    """A plan whose certificate holds. Only ``require_certified`` makes one, so a
    backend or the encoder handed one knows the plan was checked, and checks nothing again."""

    plan: Plan
    _issuer: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._issuer is not _ISSUED:
            raise TypeError("a CertifiedPlan comes only from require_certified(plan)")


def certify(plan: Plan) -> Certificate:
    hazards: list[Hazard] = []
    hazards += _check_tensors(plan)
    hazards += _check_regions(plan)
    hazards += _check_launches(plan)
    hazards += _check_submissions(plan)
    hazards += _check_hardware_limits(plan)
    return Certificate(tuple(hazards))


def require_certified(plan: Plan | CertifiedPlan) -> CertifiedPlan:
    """The plan, certified (once: a CertifiedPlan passes through), or CertificateError."""
    if isinstance(plan, CertifiedPlan):
        return plan
    certificate = certify(plan)
    if not certificate.holds:
        raise CertificateError(certificate)
    return CertifiedPlan(plan, _ISSUED)


def _check_tensors(plan: Plan) -> list[Hazard]:
    hazards = []
    arena = plan.address_map.arena
    ordered = sorted(plan.tensors, key=lambda t: t.address)
    for tensor in plan.tensors:
        if tensor.address < arena.base or tensor.end > arena.end:
            hazards.append(Hazard(
                "tensor-outside-arena",
                f"tensor {tensor.name!r} [0x{tensor.address:x}, 0x{tensor.end:x}) is outside "
                f"the arena window [0x{arena.base:x}, 0x{arena.end:x})",
                tensor=tensor.name, addresses=(tensor.address, tensor.end),
            ))
        if tensor.align <= 0 or tensor.address % tensor.align:
            hazards.append(Hazard(
                "misaligned",
                f"tensor {tensor.name!r} at 0x{tensor.address:x} is not {tensor.align}-byte "
                "aligned",
                tensor=tensor.name, addresses=(tensor.address,),
            ))
    for i, first in enumerate(ordered):
        for second in ordered[i + 1:]:
            if second.address >= first.end:
                break
            hazards.append(Hazard(
                "tensor-overlap",
                f"tensors {first.name!r} [0x{first.address:x}, 0x{first.end:x}) and "
                f"{second.name!r} [0x{second.address:x}, 0x{second.end:x}) overlap",
                tensor=f"{first.name},{second.name}",
                addresses=(first.address, first.end, second.address, second.end),
            ))
    return hazards


def _check_regions(plan: Plan) -> list[Hazard]:
    hazards = []
    program = plan.address_map.program
    code_end = program.base + plan.code_extent
    ordered = sorted(plan.placed_regions, key=lambda r: r.address)
    for placed in plan.placed_regions:
        if plan.region_alignment < 1 or placed.address % plan.region_alignment:
            hazards.append(Hazard(
                "misaligned",
                f"region {placed.name!r} at 0x{placed.address:x} is not "
                f"{plan.region_alignment}-byte aligned",
                addresses=(placed.address,),
            ))
        if placed.address < program.base or placed.address + placed.bytes > code_end:
            hazards.append(Hazard(
                "region-overlap",
                f"region {placed.name!r} [0x{placed.address:x}, "
                f"0x{placed.address + placed.bytes:x}) is outside the code extent "
                f"[0x{program.base:x}, 0x{code_end:x})",
                addresses=(placed.address, placed.address + placed.bytes),
            ))
    for i, first in enumerate(ordered):
        for second in ordered[i + 1:]:
            if second.address >= first.address + first.bytes:
                break
            hazards.append(Hazard(
                "region-overlap",
                f"regions {first.name!r} and {second.name!r} overlap at 0x{second.address:x}",
                addresses=(first.address, second.address),
            ))
    return hazards


# What an f32 argument contributes to a launch's key (see _launch_key).
_F32_THAT_FITS = object()


def _launch_key(launch: Launch) -> tuple:
    """Everything the checks of one launch read but its index and label, which only name it
    in a hazard: the region's name (the plan's regions, tensors and target are the same for
    every launch), grid, block, and each argument, whole, but an f32 scalar that fits 32
    bits: no footprint reads its value, so only that it is one enters the key."""
    args = tuple(
        _F32_THAT_FITS
        if isinstance(arg, Scalar) and arg.dtype == "f32" and 0 <= arg.bits < 1 << 32
        else arg
        for arg in launch.args
    )
    return launch.region, launch.grid, launch.block, launch.cluster, args


def _check_launches(plan: Plan) -> list[Hazard]:
    """Every launch's region, geometry, arguments and footprints.

    Launches with one key (_launch_key) pass or fail together, so a key that passed once
    passes again unchecked: the seed's 2N training launches have two keys. A launch that
    fails is checked in full, so each hazard names its own launch. A launch object seen
    to pass (a plan may hold one many times) passes again without its key being built.
    """
    declared = {r.name: r for r in plan.regions}
    retained = {p.name for p in plan.placed_regions}
    passed: set[tuple] = set()
    passed_objects: set[int] = set()  # ids: plan.launches keeps every launch alive
    hazards: list[Hazard] = []
    for index, launch in enumerate(plan.launches):
        if id(launch) in passed_objects:
            continue
        key = _launch_key(launch)
        if key not in passed:
            found = _check_launch(plan, declared, retained, index, launch)
            if found:
                hazards += found
                continue
            passed.add(key)
        passed_objects.add(id(launch))
    return hazards


def _check_launch(plan: Plan, declared: dict[str, Region], retained: set[str], index: int,
                  launch: Launch) -> list[Hazard]:
    where = f"launch {index} ({launch.label or launch.region})"
    region = declared.get(launch.region)
    if region is None:
        return [Hazard(
            "unknown-region", f"{where} names region {launch.region!r}, which is not declared",
            launch=index,
        )]
    hazards = []
    if launch.region not in retained:
        hazards.append(Hazard(
            "pruned-region",
            f"{where} names region {launch.region!r}, which is not retained in the program "
            "component",
            launch=index,
        ))
    if min(launch.grid.x, launch.grid.y, launch.grid.z,
           launch.block.x, launch.block.y, launch.block.z) < 1:
        hazards.append(Hazard("geometry", f"{where} has a zero grid or block dimension",
                              launch=index))
    if launch.block.x != region.block_x:
        hazards.append(Hazard(
            "geometry",
            f"{where} uses block width {launch.block.x}, region {region.name!r} is built for "
            f"{region.block_x}",
            launch=index,
        ))
    hazards += _check_cluster_geometry(where, index, launch, region)
    end = argument_bytes_end(plan.target, region.params)
    if end > plan.target.parameter_block_bytes:
        hazards.append(Hazard(
            "parameter-block-overflow",
            f"{where}: arguments end at byte {end}, past the {plan.target.parameter_block_bytes}"
            "-byte parameter block",
            launch=index, addresses=(plan.parameter_block_address(index) + end,),
        ))
    if len(launch.args) != len(region.params):
        hazards.append(Hazard(
            "argument-mismatch",
            f"{where} passes {len(launch.args)} arguments, region {region.name!r} takes "
            f"{len(region.params)}",
            launch=index,
        ))
        return hazards
    values: dict[str, int] = {
        "grid.x": launch.grid.x, "grid.y": launch.grid.y, "grid.z": launch.grid.z,
        "block.x": launch.block.x, "block.y": launch.block.y, "block.z": launch.block.z,
    }
    for param, arg in zip(region.params, launch.args, strict=True):
        if isinstance(param, ScalarParam):
            if not isinstance(arg, Scalar) or arg.dtype != param.dtype:
                hazards.append(Hazard(
                    "argument-mismatch",
                    f"{where}: argument {param.name!r} must be a {param.dtype} scalar",
                    launch=index, argument=param.name,
                ))
            elif not 0 <= arg.bits < 1 << 32:
                hazards.append(Hazard(
                    "argument-mismatch",
                    f"{where}: argument {param.name!r} does not fit 32 bits",
                    launch=index, argument=param.name,
                ))
            elif param.dtype == "u32":
                values[param.name] = arg.bits
    for param, arg in zip(region.params, launch.args, strict=True):
        if isinstance(param, PointerParam):
            if not isinstance(arg, Address):
                hazards.append(Hazard(
                    "argument-mismatch", f"{where}: argument {param.name!r} must be a pointer",
                    launch=index, argument=param.name,
                ))
                continue
            hazards += _check_pointer(plan, index, where, param, arg.address, values,
                                      _sliced(region, launch, param, values))
    hazards += _check_cluster_shared(plan, index, where, launch, region, values)
    return hazards


def _check_cluster_geometry(where: str, index: int, launch: Launch, region: Region,
                            ) -> list[Hazard]:
    """A cluster region in clusters that split its lanes, other regions alone, whole
    clusters in the grid."""
    slices, ctas = region.cluster_slices, launch.cluster
    problem = None
    if ctas < 1:
        problem = f"asks for clusters of {ctas} CTAs"
    elif slices is None and ctas != 1:
        problem = (f"runs region {region.name!r}, whose CTAs run alone, in clusters of "
                   f"{ctas}")
    elif slices is not None and not slices.allows(ctas):
        problem = (f"runs cluster region {region.name!r} in clusters of {ctas} CTAs; its "
                   f"{slices.lanes} lanes split over a power of two from 2 to "
                   f"{slices.lanes // 4} CTAs")
    elif launch.grid.x % ctas:
        problem = f"has grid.x = {launch.grid.x}, not a whole number of clusters of {ctas}"
    if problem is None:
        return []
    return [Hazard("geometry", f"{where} {problem}", launch=index)]


def _sliced(region: Region, launch: Launch, param: PointerParam, values: dict[str, int],
            ) -> tuple[ClusterSlices, int, int] | None:
    """(slices, CTAs, row columns) where `param` is a table a cluster launch reaches slice by
    slice (its footprint rows of the slices' columns), else None."""
    slices = region.cluster_slices
    if slices is None or not slices.allows(launch.cluster):
        return None
    factors = param.footprint.factors
    if factors[:2] != (slices.columns, slices.columns) or slices.columns not in values:
        return None
    return slices, launch.cluster, values[slices.columns]


def _check_cluster_shared(plan: Plan, index: int, where: str, launch: Launch, region: Region,
                          values: dict[str, int]) -> list[Hazard]:
    """A CTA's slice of a row within the shared memory its region asks for at launch (a
    region without an image: what its target leaves it)."""
    slices = region.cluster_slices
    if slices is None or not slices.allows(launch.cluster) or slices.columns not in values:
        return []
    need = slices.slice_bytes(values[slices.columns], launch.cluster)
    target = plan.target
    room = region.dynamic_shared_bytes if region.code else \
        target.max_shared_bytes_per_block - region.shared_bytes
    if need <= room:
        return []
    return [Hazard(
        "hardware-limit",
        f"{where}: a CTA of a cluster of {launch.cluster} holds {need} bytes of a row of "
        f"{values[slices.columns]} columns ({slices.arrays} arrays), region "
        f"{region.name!r} has {room} bytes of dynamic shared memory on {target.name}",
        launch=index,
    )]


def _check_pointer(
    plan: Plan, index: int, where: str, param: PointerParam, address: int,
    values: dict[str, int], sliced: tuple[ClusterSlices, int, int] | None = None,
) -> list[Hazard]:
    hazards = []
    if param.align < 1 or address % param.align:
        hazards.append(Hazard(
            "misaligned",
            f"{where}: pointer {param.name!r} = 0x{address:x} is not {param.align}-byte aligned",
            launch=index, argument=param.name, addresses=(address,),
        ))
    tensor = plan.tensor_at(address)
    if tensor is None:
        hazards.append(Hazard(
            "pointer-outside-tensors",
            f"{where}: pointer {param.name!r} = 0x{address:x} lies in no tensor",
            launch=index, argument=param.name, addresses=(address,),
        ))
        return hazards
    try:
        reach = param.footprint.evaluate(values)
    except KeyError as missing:
        hazards.append(Hazard(
            "argument-mismatch",
            f"{where}: footprint of {param.name!r} needs u32 argument {missing}, which the "
            "launch lacks",
            launch=index, argument=param.name,
        ))
        return hazards
    if sliced is not None:
        hazards += _check_slices(index, where, param, address, reach, tensor.name,
                                 tensor.end, sliced)
    elif address + reach > tensor.end:
        hazards.append(Hazard(
            "footprint-overflow",
            f"{where}: pointer {param.name!r} reaches [0x{address:x}, 0x{address + reach:x}) "
            f"({param.footprint.describe()} = {reach} bytes), past the end of tensor "
            f"{tensor.name!r} at 0x{tensor.end:x}",
            launch=index, argument=param.name, tensor=tensor.name,
            addresses=(address, address + reach, tensor.end),
        ))
    return hazards


def _check_slices(index: int, where: str, param: PointerParam, address: int, reach: int,
                  tensor: str, tensor_end: int, sliced: tuple[ClusterSlices, int, int],
                  ) -> list[Hazard]:
    """Each CTA's slice of the last row the footprint reaches: its last column's end within
    the tensor (the slices' union is the footprint itself)."""
    slices, ctas, columns = sliced
    if reach == 0 or columns == 0:
        return []
    hazards = []
    for rank in range(ctas):
        last = slices.last_column(columns, ctas, rank)
        if last is None:
            continue
        end = address + reach - 4 * (columns - 1 - last)
        if end > tensor_end:
            hazards.append(Hazard(
                "footprint-overflow",
                f"{where}: pointer {param.name!r}: the slice of CTA {rank} of {ctas} reaches "
                f"column {last} of the last row at [0x{end - 4:x}, 0x{end:x}) "
                f"({param.footprint.describe()} = {reach} bytes from 0x{address:x}), past "
                f"the end of tensor {tensor!r} at 0x{tensor_end:x}",
                launch=index, argument=param.name, tensor=tensor,
                addresses=(address, end, tensor_end),
            ))
    return hazards


def _check_submissions(plan: Plan) -> list[Hazard]:
    hazards = []
    launch_count = plan.launch_count
    expected = 0  # the next launch the first pass must submit
    previous_semaphore: int | None = None
    for index, submission in enumerate(plan.submissions):
        where = f"submission {index}"
        if (submission.count < 1 or submission.first_launch < 0
                or submission.first_launch + submission.count > launch_count):
            hazards.append(Hazard(
                "submission-range",
                f"{where} covers launches [{submission.first_launch}, "
                f"{submission.first_launch + submission.count}), outside the {launch_count} "
                "launches of the plan",
            ))
        elif expected < launch_count:
            if submission.first_launch != expected:
                hazards.append(Hazard(
                    "submission-order",
                    f"{where} starts at launch {submission.first_launch}; the launches must "
                    f"first be submitted in order, and launch {expected} is next",
                    launch=submission.first_launch,
                ))
            expected = max(expected, submission.first_launch + submission.count)
        if previous_semaphore is not None and submission.semaphore <= previous_semaphore:
            hazards.append(Hazard(
                "semaphore-order",
                f"{where} releases semaphore value {submission.semaphore}, not above "
                f"{previous_semaphore} of the submission before",
            ))
        previous_semaphore = submission.semaphore
    if expected < launch_count and not any(h.kind == "submission-range" for h in hazards):
        hazards.append(Hazard(
            "submission-order",
            f"launches from {expected} on are never submitted",
            launch=expected,
        ))
    if not 0 <= plan.forward_submissions <= len(plan.submissions):
        hazards.append(Hazard(
            "submission-range",
            f"the forward submissions ({plan.forward_submissions}) exceed the schedule",
        ))
    return hazards


# -- hardware limits -------------------------------------------------------------


def _check_hardware_limits(plan: Plan) -> list[Hazard]:
    """Every launch within what the target's hardware launches at all."""
    hazards = [h for region in plan.regions for h in _region_limits(plan, region)]
    declared = {r.name: r for r in plan.regions}
    # A launch's limits read its region, grid and block (its index only names it): what
    # passed once passes again unchecked, and what fails is checked at each launch.
    passed: set[tuple] = set()
    for index, launch in enumerate(plan.launches):
        key = (launch.region, launch.grid, launch.block, launch.cluster)
        if key in passed:
            continue
        found = _launch_limits(plan, index, launch, declared.get(launch.region))
        if found:
            hazards += found
        else:
            passed.add(key)
    return hazards


def _region_limits(plan: Plan, region: Region) -> list[Hazard]:
    target, hazards = plan.target, []
    if region.shared_window_bytes > target.max_shared_bytes_per_block:
        hazards.append(Hazard(
            "hardware-limit",
            f"region {region.name!r} uses {region.shared_window_bytes} bytes of shared memory, "
            f"{target.name} allows {target.max_shared_bytes_per_block} per block",
        ))
    if region.registers > target.max_registers_per_thread:
        hazards.append(Hazard(
            "hardware-limit",
            f"region {region.name!r} uses {region.registers} registers per thread, "
            f"{target.name} allows {target.max_registers_per_thread}",
        ))
    return hazards


def _launch_limits(plan: Plan, index: int, launch: Launch, region: Region | None,
                   ) -> list[Hazard]:
    target = plan.target
    where = f"launch {index} ({launch.label or launch.region})"
    hazards = []
    dims = (("grid", launch.grid, target.max_grid), ("block", launch.block, target.max_block))
    for kind, dim, limits in dims:
        for axis, value, limit in zip("xyz", (dim.x, dim.y, dim.z), limits, strict=True):
            if value > limit:
                hazards.append(Hazard(
                    "hardware-limit",
                    f"{where}: {kind}.{axis} = {value}, {target.name} allows {limit}",
                    launch=index,
                ))
    if launch.cluster > target.max_cluster_ctas:
        allowed = (f"at most {target.max_cluster_ctas} CTAs a cluster"
                   if target.max_cluster_ctas > 1 else "no clusters")
        hazards.append(Hazard(
            "hardware-limit",
            f"{where}: clusters of {launch.cluster} CTAs, {target.name} allows {allowed}",
            launch=index,
        ))
    threads = launch.block.count
    if threads > target.max_threads_per_block:
        hazards.append(Hazard(
            "hardware-limit",
            f"{where}: {threads} threads per block, {target.name} allows "
            f"{target.max_threads_per_block}",
            launch=index,
        ))
    elif region is not None and _block_registers(target, region, threads) > \
            target.registers_per_block:
        hazards.append(Hazard(
            "hardware-limit",
            f"{where}: {threads} threads of region {region.name!r} need "
            f"{_block_registers(target, region, threads)} registers, {target.name} has "
            f"{target.registers_per_block} per block",
            launch=index,
        ))
    return hazards


def _block_registers(target: Target, region: Region, threads: int) -> int:
    """Registers a block takes: whole warps, each thread's count rounded to the unit."""
    unit = target.register_unit_per_thread
    per_thread = -(-region.registers // unit) * unit
    return -(-threads // 32) * 32 * per_thread
