"""Encode a certified plan into NVIDIA's command-stream components.

    encoded = encode(plan)          # deterministic bytes, at the plan's virtual addresses
    emitted(encoded)                # {"program.bin": ..., "index.json": ...}: --emit's files

These bytes are the only command stream Bob has: the simulator (``nv-sim``),
the disassembler (``bob plan --disasm``), ``bob plan --emit`` and the GPU (the
``nv`` backend uploads them unchanged) all read them. The components, at the
addresses of ``plan.address_map``:

- program: each retained region's code at its placed address, then one
  parameter block per launch at ``plan.parameter_block_address(i)`` (the
  launch's constant buffer 0), exactly ``plan.program_bytes`` long. A block
  starts with the driver area compiled code reads (``driver_area``: blockDim,
  gridDim, the shared and local memory windows, the stack top; a cluster launch's
  cluster words too, ``cluster_area``), then the arguments from the target's
  parameter base.
- QMD table: one QMD per launch (V03_00 on sm_86, V04_00 on sm_90). QMD i is
  at ``qmd_table.base + i * qmd_stride``; the stride is the record size rounded
  up to 256 bytes because SEND_PCAS_A takes the address >> 8: 256 on sm_86,
  512 on sm_90 (384-byte records; the target says so, see ``qmd_stride``).
- pushbuffer: a set-up segment at the component's base (bind the compute
  class on subchannel 1, set the shared and local memory windows), then from
  ``base + target.pushbuffer_setup_bytes`` one segment per submission, by the
  plan's submission policy. ``per-launch``: each launch dispatched
  (SEND_PCAS_A, SEND_SIGNALING_PCAS2_B), a WAIT_FOR_IDLE between consecutive
  launches of one submission. ``chained``: the submission's first launch
  dispatched; each later one is its predecessor's dependent QMD (enable,
  action QMD_SCHEDULE, prefetch, pointer = address >> 8), scheduled by the
  compute engine when the predecessor's grid completes (``chain_links``).
  Either way the segment ends with a host semaphore release (with
  wait-for-idle) of the submission's value into its own slot.
- GPFIFO: entry 0 fetches the set-up segment; entry s + 1 fetches submission
  s (LEVEL = SUBROUTINE). The set-up is its own entry so that any range of
  submissions can run after it, in any later call. The entries point into the
  pushbuffer at the plan's addresses; they have no address of their own: the
  ring is the channel's, and a host copies them into it.
- semaphores: one 16-byte slot per submission, zero at start. Submission s
  releases its 64-bit value at ``base + 16 * s`` (``submission_semaphore``):
  a host zeroes the slots it is about to run and waits for the last one.
  The spare second half of slot 0, ``base + 8``, is launch progress: each QMD
  releases ``launch index + 1`` there (one word) when its grid completes,
  which names the last kernel finished when something hangs. A QMD belongs to
  a launch, and a launch may be in several submissions (Bob predicts twice),
  so the QMD cannot carry a submission's value.

The choices where two were possible follow what ran on the H200
(docs/RAW-HOPPER.md, docs/NV-FIELDS.md): SUBROUTINE GPFIFO entries, 64-bit
per-submission slots, shared-memory carve-outs of 32 KiB up to 100 KiB, 1 KiB of
system shared memory, the driver area in constant bank 0.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass

from bob.backends.nv.pushbuffer import (
    AMPERE_CHANNEL_GPFIFO_A,
    AMPERE_COMPUTE_B,
    HOPPER_CHANNEL_GPFIFO_A,
    HOPPER_COMPUTE_A,
    SEMAPHORE_BYTES,
    WORD_BYTES,
    ClassTable,
    CommandError,
    CommandWriter,
    Pushbuffer,
    gpfifo_entry,
)
from bob.backends.nv.qmd import Qmd, QmdFieldError, QmdV03, QmdV04, SharedMemoryConfig, field_shift
from bob.errors import BadInput
from bob.plan.certificate import CertifiedPlan, require_certified
from bob.plan.model import Component, Launch, Plan
from bob.plan.placement import SEMAPHORE_STRIDE, SM86, SM90, align_up
from bob.plan.placement import encode_parameter_block as encode_arguments

EMIT_FORMAT = "bob-nv-components"
EMIT_VERSION = 3  # 3: the submission policy (chained QMDs); 2: 64-bit slots, driver areas

# SEND_PCAS_A_QMD_ADDRESS_SHIFTED8: a QMD must be 256-byte aligned.
QMD_ALIGNMENT = 1 << field_shift("SEND_PCAS_A_QMD_ADDRESS_SHIFTED8")
SHARED_MEMORY_ALIGNMENT = 256  # NVK rounds a launch's shared memory up to 0x100
# From sm_80 on, CUDA reserves 1 KiB of shared memory per block for the system.
# Bob asks for it on top of the region's shared bytes, as the plans that ran on
# the H200 did. (NVRTC 13 already counts it in an sm_90 kernel that declares
# shared memory, so such a kernel gets 1 KiB more than it needs: harmless.)
SYSTEM_SHARED_BYTES = 1024
# SM shared-memory carve-outs: the smallest one that is at least 32 KiB and holds
# as many blocks as the SM's threads and registers allow (shared_memory_config),
# with 100 KiB as the most the SM may configure: tinygrad's values, and what Bob's
# plans ran with on the H200 (sm_90 could offer 228 KiB).
MINIMUM_CARVEOUT_KIB = 32
MAXIMUM_CARVEOUT_KIB = 100
# An SM's limits (sm_86 and sm_90 alike): what resident_blocks counts against.
WARP_THREADS = 32
REGISTER_UNIT = 256  # registers are allocated per warp in units of this many
SM_THREADS = 1536  # sm_86's; sm_90 holds 2048, so this never asks sm_90 for too much
SM_REGISTERS = 65536
SM_BLOCKS = 16  # sm_86's; sm_90 holds 32
BARRIERS = 1  # Bob's kernels synchronise their blocks with __syncthreads (barrier 0)
# Generic-address windows for shared and local memory: tinygrad's Hopper values,
# which Bob's plans run with on the H200; 4 GiB aligned (Hopper's requirement)
# and far above the plan's components (the default plan base is
# 0x20_0000_0000). The encoder refuses a plan that reaches into them.
SHARED_MEMORY_WINDOW = 0x7294_0000_0000
LOCAL_MEMORY_WINDOW = 0x7293_0000_0000
WINDOW_BYTES = 4 << 30
# The driver area at the start of constant bank 0, as the CUDA driver fills it and
# compiled code reads it (seen on the H200: without blockDim and gridDim there,
# every CTA computed blockIdx.x * 0 + threadIdx.x). The initial stack pointer is
# tinygrad's value; Bob's regions use no stack. The last word is the launch's dynamic
# shared memory in bytes: PTX's %dynamic_smem_size compiles to a load of c[0x0][0x2c].
DRIVER_AREA = struct.Struct("<3I3IQQII")  # blockDim, gridDim, shared window, local window,
# stack top, dynamic shared bytes
DRIVER_AREA_BYTES = DRIVER_AREA.size  # 0x30
# A cluster launch's words of the driver area, as compiled code reads them (NVRTC's sm_90
# code for each of PTX's cluster registers): %is_explicit_cluster at 0x140, %cluster_nctaid
# at 0x144, the reciprocals of its y and z (f32: clusterid.y and .z are products) at 0x150,
# %nclusterid at 0x15c; %cluster_nctarank at 0x188. %clusterid.x is ctaid.x / 0x144's
# word and %cluster_ctarank a special register. A launch without clusters leaves them zero
# (Bob's other regions read none of them).
CLUSTER_AREA = struct.Struct("<I3I3f3I")  # explicit, CTAs a cluster, reciprocals, clusters
CLUSTER_AREA_OFFSET = 0x140
CLUSTER_CTAS = struct.Struct("<I")  # CTAs of one cluster in all
CLUSTER_CTAS_OFFSET = 0x188
STACK_TOP = 0xFFFDC0
SEMAPHORE_SLOT_BYTES = SEMAPHORE_STRIDE  # the plan reserves one slot per submission
LAUNCH_PROGRESS_OFFSET = 8  # the spare half of slot 0
SETUP_ENTRIES = 1  # GPFIFO entry 0 is the set-up; submission s is entry s + 1


class EncodeError(BadInput):
    """A plan that cannot be encoded for its target; the message says what and where."""


@dataclass(frozen=True)
class Architecture:
    """What the encoder needs to know of a target beyond the plan's Target."""

    target: str
    compute: ClassTable
    host: ClassTable
    qmd: type[Qmd]
    carveouts_kib: tuple[int, ...]  # the SM shared-memory carve-outs, ascending


ARCHITECTURES = {
    arch.target: arch
    for arch in (
        Architecture(SM86.name, AMPERE_COMPUTE_B, AMPERE_CHANNEL_GPFIFO_A, QmdV03,
                     (0, 8, 16, 32, 64, 100)),
        Architecture(SM90.name, HOPPER_COMPUTE_A, HOPPER_CHANNEL_GPFIFO_A, QmdV04,
                     (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)),
    )
}


@dataclass(frozen=True)
class EncodedComponent:
    name: str
    base: int | None  # the plan's virtual address; None for the GPFIFO (the channel's ring)
    data: bytes

    @property
    def end(self) -> int | None:
        return None if self.base is None else self.base + len(self.data)


@dataclass(frozen=True)
class EncodedProgram:
    """Every byte the command-stream backend hands the GPU, and where it goes."""

    target: str
    compute_class: int
    host_class: int
    qmd_version: str
    qmd_stride: int
    submission_policy: str
    program: EncodedComponent
    qmd_table: EncodedComponent
    pushbuffer: EncodedComponent
    gpfifo: EncodedComponent
    semaphores: EncodedComponent
    shared_memory_window: int
    local_memory_window: int

    @property
    def components(self) -> tuple[EncodedComponent, ...]:
        return (self.program, self.qmd_table, self.pushbuffer, self.gpfifo, self.semaphores)

    def submission_semaphore(self, submission: int) -> int:
        """The address of submission `submission`'s 64-bit semaphore slot."""
        return _base(self.semaphores) + submission * SEMAPHORE_SLOT_BYTES

    @property
    def launch_progress_address(self) -> int:
        return _base(self.semaphores) + LAUNCH_PROGRESS_OFFSET

    def qmd_address(self, launch_index: int) -> int:
        return _base(self.qmd_table) + launch_index * self.qmd_stride

    @property
    def gpfifo_entries(self) -> int:
        return len(self.gpfifo.data) // self.entry_bytes

    @property
    def entry_bytes(self) -> int:
        host = _host_table(self.host_class)
        return host.constants["GP_ENTRY__SIZE"]

    def entry(self, index: int) -> bytes:
        """GPFIFO entry `index` as the ring holds it (0: set-up; s + 1: submission s)."""
        if not 0 <= index < self.gpfifo_entries:
            raise IndexError(f"GPFIFO entry {index} is not among the {self.gpfifo_entries}")
        return self.gpfifo.data[index * self.entry_bytes:(index + 1) * self.entry_bytes]

    def submission_entry(self, submission: int) -> bytes:
        return self.entry(SETUP_ENTRIES + submission)


def _base(component: EncodedComponent) -> int:
    if component.base is None:
        raise ValueError(f"component {component.name} has no plan address")
    return component.base


def _host_table(number: int) -> ClassTable:
    for arch in ARCHITECTURES.values():
        if arch.host.number == number:
            return arch.host
    raise KeyError(f"no channel class {number:#x}")


def architecture(plan: Plan) -> Architecture:
    if plan.target.name not in ARCHITECTURES:
        raise EncodeError(f"no NVIDIA command-stream encoding for target {plan.target.name!r} "
                          f"(known: {', '.join(ARCHITECTURES)})")
    arch = ARCHITECTURES[plan.target.name]
    if plan.target.qmd_record_bytes != arch.qmd.record_bytes:
        raise EncodeError(f"target {plan.target.name} says QMD records are "
                          f"{plan.target.qmd_record_bytes} bytes; QMD {arch.qmd.version} is "
                          f"{arch.qmd.record_bytes}")
    return arch


def qmd_stride(plan: Plan) -> int:
    """Bytes from one QMD to the next: the plan's stride, checked against the version."""
    stride = plan.target.qmd_stride_bytes
    record = architecture(plan).qmd.record_bytes
    if stride < record or stride % QMD_ALIGNMENT:
        raise EncodeError(f"target {plan.target.name}: a QMD stride of {stride} bytes cannot "
                          f"hold {record}-byte records at {QMD_ALIGNMENT}-byte alignment")
    return stride


# -- constant bank 0 ----------------------------------------------------------------


def driver_area(block: tuple[int, int, int], grid: tuple[int, int, int],
                dynamic_shared_bytes: int = 0) -> bytes:
    """The first 0x30 bytes of constant bank 0, as the CUDA driver fills them."""
    return DRIVER_AREA.pack(*block, *grid, SHARED_MEMORY_WINDOW, LOCAL_MEMORY_WINDOW, STACK_TOP,
                            dynamic_shared_bytes)


def cluster_area(grid: tuple[int, int, int], cluster: tuple[int, int, int]) -> dict[int, bytes]:
    """The cluster words of constant bank 0 of a grid of clusters: offset -> bytes."""
    if any(size % ctas for size, ctas in zip(grid, cluster, strict=True)):
        raise EncodeError(f"grid {grid} is not a whole number of clusters of {cluster}")
    clusters = tuple(size // ctas for size, ctas in zip(grid, cluster, strict=True))
    reciprocals = tuple(1.0 / ctas for ctas in cluster)
    return {CLUSTER_AREA_OFFSET: CLUSTER_AREA.pack(1, *cluster, *reciprocals, *clusters),
            CLUSTER_CTAS_OFFSET: CLUSTER_CTAS.pack(cluster[0] * cluster[1] * cluster[2])}


def _dims(dim) -> tuple[int, int, int]:
    return (dim.x, dim.y, dim.z)


def parameter_block(plan: Plan, index: int, launch: Launch | None = None) -> bytes:
    """Launch `index`'s constant bank 0: the driver area, then its arguments.

    `launch` replaces the plan's launch (a host that patched its scalars); its
    grid and block must stay the plan's.
    """
    planned = plan.launches[index]
    launch = planned if launch is None else launch
    if (launch.region, launch.grid, launch.block) != (planned.region, planned.grid,
                                                       planned.block):
        raise EncodeError(f"launch {index}: only scalar arguments may change, not the region, "
                          "grid or block the QMD holds")
    region = plan.region(launch.region)
    if DRIVER_AREA_BYTES > plan.target.parameter_base:
        raise EncodeError(f"target {plan.target.name}: the {DRIVER_AREA_BYTES}-byte driver area "
                          f"overlaps the arguments at {plan.target.parameter_base:#x}")
    block = bytearray(encode_arguments(plan.target, region, launch))
    if len(block) != plan.target.parameter_block_bytes:
        raise EncodeError(f"launch {index}: parameter block is {len(block)} bytes, not "
                          f"{plan.target.parameter_block_bytes}")
    if any(block[:DRIVER_AREA_BYTES]):
        raise EncodeError(f"launch {index}: the plan's parameter block is not zero where the "
                          "driver area goes")
    block[:DRIVER_AREA_BYTES] = driver_area(_dims(launch.block), _dims(launch.grid),
                                            region.dynamic_shared_bytes)
    if planned.cluster > 1:
        for offset, words in cluster_area(_dims(launch.grid), (planned.cluster, 1, 1)).items():
            if offset + len(words) > plan.target.parameter_base or any(
                    block[offset:offset + len(words)]):
                raise EncodeError(f"launch {index}: the cluster's driver words at "
                                  f"{offset:#x} do not fit below the arguments")
            block[offset:offset + len(words)] = words
    return bytes(block)


# -- the components ---------------------------------------------------------------


def encode_program(plan: Plan) -> bytes:
    """Retained code at the placed regions, then every launch's parameter block."""
    program = plan.address_map.program
    data = bytearray(plan.program_bytes)
    for placed in plan.placed_regions:
        code = plan.region(placed.name).code
        offset = placed.address - program.base
        data[offset:offset + len(code)] = code
    for index in range(plan.launch_count):
        block = parameter_block(plan, index)
        offset = plan.parameter_block_address(index) - program.base
        data[offset:offset + len(block)] = block
    if len(data) != plan.program_bytes:
        raise EncodeError(f"program component is {len(data)} bytes, the plan says "
                          f"{plan.program_bytes}")
    return bytes(data)


def shared_memory_config(arch: Architecture, size: int, what: str,
                         blocks: int = 1) -> SharedMemoryConfig:
    """The smallest carve-out of at least 32 KiB that holds `size` bytes for `blocks`
    blocks at once, or as many of them as 100 KiB holds; 100 KiB at most unless one
    block needs more.

    Without room for a second block the SM runs one at a time whatever its threads
    and registers allow (the CUDA driver picks the carve-out for occupancy the same
    way): at V = 256 the fused schedule's 256 blocks would take two waves, not one.
    """
    needed = max(size, MINIMUM_CARVEOUT_KIB * 1024)
    fitting = [kib for kib in arch.carveouts_kib if kib * 1024 >= needed]
    if not fitting:
        raise EncodeError(f"{what} needs {size} bytes of shared memory; {arch.target} "
                          f"offers at most {arch.carveouts_kib[-1]} KiB")
    allowed = [kib for kib in fitting if kib <= MAXIMUM_CARVEOUT_KIB] or fitting[:1]
    chosen = next((kib for kib in allowed if size * blocks <= kib * 1024), allowed[-1])
    return SharedMemoryConfig(chosen, max(chosen, MAXIMUM_CARVEOUT_KIB), chosen)


def resident_blocks(threads: int, registers: int) -> int:
    """How many blocks of `threads` threads using `registers` each one SM holds at once
    by its threads, registers and block slots (shared memory aside): registers are
    allocated per warp in units of 256."""
    warps = -(-threads // WARP_THREADS)
    per_warp = -(-registers * WARP_THREADS // REGISTER_UNIT) * REGISTER_UNIT
    return max(1, min(SM_BLOCKS, SM_THREADS // (warps * WARP_THREADS),
                      SM_REGISTERS // (warps * per_warp)))


@dataclass(frozen=True)
class Dispatch:
    """One grid, as a QMD describes it: what a plan's launch (or the probe) fills in."""

    program_address: int
    grid: tuple[int, int, int]  # in CTAs, a grid of clusters too
    block: tuple[int, int, int]
    registers: int
    shared_bytes: int  # the block's shared memory: the image's static and the dynamic bytes
    constant_buffer: tuple[int, int]  # bank 0: (address, bytes)
    release: tuple[int, int] | None  # a one-word release on completion: (address, payload)
    dependent: int | None = None  # the QMD this one schedules when it completes (chained)
    arrive_latch: int | None = None  # the latch this grid arrives at (it has a dependent)
    wait_latch: int | None = None  # the latch this grid waits on (it is a dependent)
    cluster: tuple[int, int, int] | None = None  # CTAs of a thread-block cluster; None: none


def build_qmd(arch: Architecture, dispatch: Dispatch) -> Qmd:
    """The QMD of one dispatch, with the log of every field set."""
    shared = align_up(SYSTEM_SHARED_BYTES + dispatch.shared_bytes, SHARED_MEMORY_ALIGNMENT)
    qmd = arch.qmd()
    qmd.set_program_address(dispatch.program_address)
    if dispatch.cluster is None:
        qmd.set_grid(*dispatch.grid)
    else:  # a grid of clusters counts clusters, not CTAs (Qmd.set_cluster)
        if any(size % ctas for size, ctas in zip(dispatch.grid, dispatch.cluster, strict=True)):
            raise EncodeError(f"grid {dispatch.grid} is not a whole number of clusters of "
                              f"{dispatch.cluster}")
        qmd.set_grid(*(size // ctas for size, ctas in zip(dispatch.grid, dispatch.cluster,
                                                           strict=True)))
        qmd.set_cluster(*dispatch.cluster)
    qmd.set_block(*dispatch.block)
    qmd.set_registers(dispatch.registers)
    qmd.set_barriers(BARRIERS)
    threads = dispatch.block[0] * dispatch.block[1] * dispatch.block[2]
    qmd.set_shared_memory(shared, shared_memory_config(
        arch, shared, "the kernel", resident_blocks(threads, dispatch.registers)))
    qmd.set_constant_buffer(0, *dispatch.constant_buffer)
    if dispatch.release is not None:
        qmd.set_release_semaphore(*dispatch.release)
    if dispatch.dependent is not None:
        qmd.set_dependent_qmd(dispatch.dependent)
    if dispatch.arrive_latch is not None or dispatch.wait_latch is not None:
        qmd.set_latched_chain(dispatch.arrive_latch, dispatch.wait_latch)
    return qmd


def chain_links(plan: Plan) -> dict[int, int]:
    """Launch -> the launch its QMD schedules on completion, for a chained plan ({} for
    per-launch).

    A QMD belongs to a launch, not to a submission, so its link must suit every
    submission that holds the launch: launch i links to i + 1 when some submission
    holds both, and then no submission may end at i (its chain would run on past its
    end). Bob's plans keep this: the predictions again, launches 1 .. 2P, end where
    the forward submission ends.
    """
    if plan.submission_policy == "per-launch":
        return {}
    if plan.submission_policy != "chained":
        raise EncodeError(f"unknown submission policy {plan.submission_policy!r}")
    links: dict[int, int] = {}
    ends: dict[int, int] = {}  # a launch that ends a submission -> that submission
    for index, submission in enumerate(plan.submissions):
        launches = submission.launches
        for launch in launches[:-1]:
            links[launch] = launch + 1
        if len(launches):
            ends.setdefault(launches[-1], index)
    for launch, submission in ends.items():
        if launch in links:
            raise EncodeError(
                f"chained plan: launch {launch} ends submission {submission} but continues to "
                f"launch {launch + 1} in another; its QMD can link to the next launch for every "
                "submission or for none")
    return links


def encode_qmd(plan: Plan, index: int, links: dict[int, int] | None = None) -> Qmd:
    """The QMD of launch `index`, with the log of every field set (`links`: the plan's
    ``chain_links``, computed when not given)."""
    links = chain_links(plan) if links is None else links
    arch = architecture(plan)
    launch = plan.launches[index]
    region = plan.region(launch.region)
    # Latched chains (QMD V04): launch i arrives at latch i + 1, its dependent waits on it.
    latched = arch.qmd.LATCHES
    follows = index > 0 and links.get(index - 1) == index
    dispatch = Dispatch(
        program_address=plan.placed_region(launch.region).address,
        grid=_dims(launch.grid),
        block=_dims(launch.block),
        registers=region.registers,
        shared_bytes=region.shared_window_bytes,
        constant_buffer=(plan.parameter_block_address(index), plan.target.parameter_block_bytes),
        release=(plan.address_map.semaphores.base + LAUNCH_PROGRESS_OFFSET, index + 1),
        dependent=(plan.address_map.qmd_table.base + links[index] * qmd_stride(plan)
                   if index in links else None),
        arrive_latch=index + 1 if latched and index in links else None,
        wait_latch=index if latched and follows else None,
        cluster=(launch.cluster, 1, 1) if launch.cluster > 1 else None,
    )
    try:
        return build_qmd(arch, dispatch)
    except (QmdFieldError, EncodeError) as error:
        raise EncodeError(f"launch {index} ({launch.label or launch.region}, region "
                          f"{region.name!r}): {error}") from None


def encode_qmd_table(plan: Plan) -> bytes:
    stride = qmd_stride(plan)
    links = chain_links(plan)
    table = bytearray()
    for index in range(plan.launch_count):
        table += encode_qmd(plan, index, links).to_bytes().ljust(stride, b"\0")
    return bytes(table)


def _check_layout(plan: Plan, stride: int) -> None:
    """The QMD table and the semaphore slots fit their components; no component meets a
    window."""
    amap = plan.address_map
    qmd_end = amap.qmd_table.base + plan.launch_count * stride
    if amap.qmd_table.base % QMD_ALIGNMENT:
        raise EncodeError(f"QMD table at {amap.qmd_table.base:#x} is not {QMD_ALIGNMENT}-byte "
                          "aligned")
    following = [c.base for c in amap.components if c.base > amap.qmd_table.base]
    if following and qmd_end > min(following):
        raise EncodeError(
            f"{plan.launch_count} QMDs at a {stride}-byte stride end at {qmd_end:#x}, into the "
            f"component at {min(following):#x}; placement must reserve "
            f"{plan.launch_count * stride} bytes for the QMD table"
        )
    slots = max(plan.submission_count, 1) * SEMAPHORE_SLOT_BYTES
    if amap.semaphores.base % SEMAPHORE_BYTES or amap.semaphores.bytes < slots:
        raise EncodeError(f"the semaphore component ({amap.semaphores.bytes} bytes at "
                          f"{amap.semaphores.base:#x}) cannot hold {plan.submission_count} "
                          f"{SEMAPHORE_SLOT_BYTES}-byte slots at {SEMAPHORE_BYTES}-byte alignment")
    for window, name in ((SHARED_MEMORY_WINDOW, "shared"), (LOCAL_MEMORY_WINDOW, "local")):
        for component in amap.components:
            if component.base < window + WINDOW_BYTES and window < component.end:
                raise EncodeError(f"component {component.name} [{component.base:#x}, "
                                  f"{component.end:#x}) meets the {name} memory window at "
                                  f"{window:#x}")


def _encode_commands(plan: Plan, arch: Architecture, stride: int) -> tuple[bytes, bytes]:
    """The pushbuffer component and the GPFIFO entries."""
    component: Component = plan.address_map.pushbuffer
    pushbuffer = Pushbuffer(component.base, component.end)
    writer = CommandWriter(pushbuffer, arch.compute, arch.host)
    entries: list[bytes] = []
    semaphores = plan.address_map.semaphores.base
    try:
        writer.bind_compute()
        writer.shared_memory_window(SHARED_MEMORY_WINDOW)
        writer.local_memory_window(LOCAL_MEMORY_WINDOW)
        setup_words = (pushbuffer.address - component.base) // WORD_BYTES
        if pushbuffer.address > component.base + plan.target.pushbuffer_setup_bytes:
            raise EncodeError(f"set-up segment overflows its {plan.target.pushbuffer_setup_bytes}"
                              " bytes")
        entries.append(gpfifo_entry(arch.host, component.base, setup_words))
        pushbuffer.pad_to(component.base + plan.target.pushbuffer_setup_bytes)
        chained = plan.submission_policy == "chained"
        for index, submission in enumerate(plan.submissions):
            start = pushbuffer.address
            # Chained: the later launches are the first's dependent QMDs.
            dispatched = submission.launches[:1] if chained else submission.launches
            for position, launch in enumerate(dispatched):
                if position:
                    writer.wait_for_idle()
                writer.dispatch(plan.address_map.qmd_table.base + launch * stride)
            writer.release_semaphore(semaphores + index * SEMAPHORE_SLOT_BYTES,
                                     submission.semaphore)
            words = (pushbuffer.address - start) // WORD_BYTES
            entries.append(gpfifo_entry(arch.host, start, words))
    except CommandError as error:
        raise EncodeError(f"{plan.target.name} command stream: {error}") from None
    return pushbuffer.to_bytes(component.bytes), b"".join(entries)


def encode(certified: CertifiedPlan | Plan) -> EncodedProgram:
    """Every component of a certified plan, deterministically (a bare plan is certified
    first; a CertifiedPlan is not checked again)."""
    plan = require_certified(certified).plan
    arch = architecture(plan)
    stride = qmd_stride(plan)
    _check_layout(plan, stride)
    chain_links(plan)  # a chain the QMDs cannot hold is refused before any encoding
    amap = plan.address_map
    pushbuffer, gpfifo = _encode_commands(plan, arch, stride)
    return EncodedProgram(
        target=plan.target.name,
        compute_class=arch.compute.number,
        host_class=arch.host.number,
        qmd_version=arch.qmd.version,
        qmd_stride=stride,
        submission_policy=plan.submission_policy,
        program=EncodedComponent("program", amap.program.base, encode_program(plan)),
        qmd_table=EncodedComponent("qmd-table", amap.qmd_table.base, encode_qmd_table(plan)),
        pushbuffer=EncodedComponent("pushbuffer", amap.pushbuffer.base, pushbuffer),
        gpfifo=EncodedComponent("gpfifo", None, gpfifo),
        semaphores=EncodedComponent("semaphores", amap.semaphores.base,
                                    bytes(amap.semaphores.bytes)),
        shared_memory_window=SHARED_MEMORY_WINDOW,
        local_memory_window=LOCAL_MEMORY_WINDOW,
    )


# -- files ----------------------------------------------------------------------------


def emitted(encoded: EncodedProgram) -> dict[str, bytes]:
    """The files `bob plan --emit` writes, name to bytes: each component as `<name>.bin`,
    then index.json describing them (the writing, all or nothing, is the CLI's)."""
    files: dict[str, bytes] = {}
    listing = []
    for component in encoded.components:
        name = f"{component.name}.bin"
        files[name] = component.data
        listing.append({
            "name": component.name,
            "file": name,
            "base": None if component.base is None else f"0x{component.base:x}",
            "bytes": len(component.data),
            "sha256": hashlib.sha256(component.data).hexdigest(),
        })
    index = {
        "format": EMIT_FORMAT,
        "version": EMIT_VERSION,
        "target": encoded.target,
        "compute_class": f"0x{encoded.compute_class:x}",
        "host_class": f"0x{encoded.host_class:x}",
        "qmd_version": encoded.qmd_version,
        "qmd_stride": encoded.qmd_stride,
        "submission_policy": encoded.submission_policy,
        "gpfifo": {
            "entries": encoded.gpfifo_entries,
            "entry_bytes": encoded.entry_bytes,
            "setup_entries": SETUP_ENTRIES,
            "submission_entry": "submission s is entry s + setup_entries",
        },
        "semaphores": {
            "submission_slots": f"0x{encoded.submission_semaphore(0):x}",
            "slot_bytes": SEMAPHORE_SLOT_BYTES,
            "payload_bytes": SEMAPHORE_BYTES,
            "submission_slot": "submission s releases its value at submission_slots + "
                               "slot_bytes * s",
            "launch_progress": f"0x{encoded.launch_progress_address:x}",
        },
        "windows": {
            "shared_memory": f"0x{encoded.shared_memory_window:x}",
            "local_memory": f"0x{encoded.local_memory_window:x}",
        },
        "components": listing,
    }
    files["index.json"] = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
    return files
