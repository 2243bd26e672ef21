"""Encode a certified plan into NVIDIA's command-stream components.

    encoded = encode(plan)          # deterministic bytes, at the plan's virtual addresses
    emit(encoded, Path("out/"))     # one file per component and index.json

The components, at the addresses of ``plan.address_map``:

- program: each retained region's code at its placed address, then one
  parameter block per launch at ``plan.parameter_block_address(i)`` (the
  launch's constant buffer 0), exactly ``plan.program_bytes`` long.
- QMD table: one QMD per launch (V03_00 on sm_86, V04_00 on sm_90). QMD i is
  at ``qmd_table.base + i * qmd_stride``; the stride is the record size rounded
  up to 256 bytes because SEND_PCAS_A takes the address >> 8. That is the
  record size on sm_86 (256) but 512 on sm_90 (384-byte records), more than
  the plan's QMD table component reserves: see ``qmd_stride``.
- pushbuffer: a set-up segment at the component's base (bind the compute
  class on subchannel 1, set the shared and local memory windows), then from
  ``base + target.pushbuffer_setup_bytes`` one segment per submission: each
  launch dispatched (SEND_PCAS_A, SEND_SIGNALING_PCAS2_B), a WAIT_FOR_IDLE
  between consecutive launches of one submission, then a host semaphore
  release (with wait-for-idle) of the submission's value.
- GPFIFO: entry 0 fetches the set-up segment; entry s + 1 fetches submission
  s. The set-up is its own entry so that any range of submissions can run
  after it, in any later call. The entries have no plan address: the ring is
  the channel's, and a host copies them into it.
- semaphores: two 32-bit words, zero at start. At ``base + 0`` the submission
  timeline: the pushbuffer releases each submission's value there (values
  strictly increase, so one word tells which submission completed last). At
  ``base + 8`` launch progress: each QMD releases ``launch index + 1`` there
  when its grid completes. A QMD belongs to a launch, and a launch may be in
  several submissions (Bob predicts twice), so the QMD cannot carry a
  submission's value; the submission's release lives in the pushbuffer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from bob.backends.nv.pushbuffer import (
    AMPERE_CHANNEL_GPFIFO_A,
    AMPERE_COMPUTE_B,
    HOPPER_CHANNEL_GPFIFO_A,
    HOPPER_COMPUTE_A,
    WORD_BYTES,
    ClassTable,
    CommandError,
    CommandWriter,
    Pushbuffer,
    gpfifo_entry,
)
from bob.backends.nv.qmd import Qmd, QmdFieldError, QmdV03, QmdV04, SharedMemoryConfig, field_shift
from bob.plan.certificate import require_certified
from bob.plan.model import Component, Plan
from bob.plan.placement import align_up, encode_parameter_block

EMIT_FORMAT = "bob-nv-components"
EMIT_VERSION = 1

# SEND_PCAS_A_QMD_ADDRESS_SHIFTED8: a QMD must be 256-byte aligned.
QMD_ALIGNMENT = 1 << field_shift("SEND_PCAS_A_QMD_ADDRESS_SHIFTED8")
SHARED_MEMORY_ALIGNMENT = 256  # NVK rounds a launch's shared memory up to 0x100
# From sm_80 on, CUDA reserves 1 KiB of shared memory per block for the system;
# compiled kernels expect it (the rm backend adds it on the H200 too).
SYSTEM_SHARED_BYTES = 1024
MINIMUM_CARVEOUT_KIB = 8  # the smallest SM shared-memory carve-out NVK asks for
BARRIERS = 1  # Bob's kernels synchronise their blocks with __syncthreads (barrier 0)
# Generic-address windows for shared and local memory: tinygrad's Hopper values,
# which the rm backend also runs with on the H200; 4 GiB aligned (Hopper's
# requirement) and far above the plan's components (the default plan base is
# 0x20_0000_0000). The encoder refuses a plan that reaches into them.
SHARED_MEMORY_WINDOW = 0x7294_0000_0000
LOCAL_MEMORY_WINDOW = 0x7293_0000_0000
WINDOW_BYTES = 4 << 30
TIMELINE_OFFSET = 0
LAUNCH_PROGRESS_OFFSET = 8
SETUP_ENTRIES = 1  # GPFIFO entry 0 is the set-up; submission s is entry s + 1


class EncodeError(ValueError):
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
        Architecture("sm_86", AMPERE_COMPUTE_B, AMPERE_CHANNEL_GPFIFO_A, QmdV03,
                     (0, 8, 16, 32, 64, 100)),
        Architecture("sm_90", HOPPER_COMPUTE_A, HOPPER_CHANNEL_GPFIFO_A, QmdV04,
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

    @property
    def timeline_address(self) -> int:
        return _base(self.semaphores) + TIMELINE_OFFSET

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


# -- the components ---------------------------------------------------------------


def encode_program(plan: Plan) -> bytes:
    """Retained code at the placed regions, then every launch's parameter block."""
    program = plan.address_map.program
    data = bytearray(plan.program_bytes)
    for placed in plan.placed_regions:
        code = plan.region(placed.name).code
        offset = placed.address - program.base
        data[offset:offset + len(code)] = code
    for index, launch in enumerate(plan.launches):
        block = encode_parameter_block(plan.target, plan.region(launch.region), launch)
        if len(block) != plan.target.parameter_block_bytes:
            raise EncodeError(f"launch {index}: parameter block is {len(block)} bytes, not "
                              f"{plan.target.parameter_block_bytes}")
        offset = plan.parameter_block_address(index) - program.base
        data[offset:offset + len(block)] = block
    if len(data) != plan.program_bytes:
        raise EncodeError(f"program component is {len(data)} bytes, the plan says "
                          f"{plan.program_bytes}")
    return bytes(data)


def shared_memory_config(arch: Architecture, size: int, region: str) -> SharedMemoryConfig:
    """The smallest carve-out (at least 8 KiB) that holds `size` bytes, up to the SM's maximum."""
    needed = max(size, MINIMUM_CARVEOUT_KIB * 1024)
    for kib in arch.carveouts_kib:
        if kib * 1024 >= needed:
            return SharedMemoryConfig(kib, arch.carveouts_kib[-1], kib)
    raise EncodeError(f"region {region!r} needs {size} bytes of shared memory; {arch.target} "
                      f"offers at most {arch.carveouts_kib[-1]} KiB")


def encode_qmd(plan: Plan, index: int) -> Qmd:
    """The QMD of launch `index`, with the log of every field set."""
    arch = architecture(plan)
    launch = plan.launches[index]
    region = plan.region(launch.region)
    placed = plan.placed_region(launch.region)
    shared = align_up(SYSTEM_SHARED_BYTES + region.shared_bytes, SHARED_MEMORY_ALIGNMENT)
    qmd = arch.qmd()
    try:
        qmd.set_program_address(placed.address)
        qmd.set_grid(launch.grid.x, launch.grid.y, launch.grid.z)
        qmd.set_block(launch.block.x, launch.block.y, launch.block.z)
        qmd.set_registers(region.registers)
        qmd.set_barriers(BARRIERS)
        qmd.set_shared_memory(shared, shared_memory_config(arch, shared, region.name))
        qmd.set_constant_buffer(0, plan.parameter_block_address(index),
                                plan.target.parameter_block_bytes)
        qmd.set_release_semaphore(plan.address_map.semaphores.base + LAUNCH_PROGRESS_OFFSET,
                                  index + 1)
    except QmdFieldError as error:
        raise EncodeError(f"launch {index} ({launch.label or launch.region}): {error}") from None
    return qmd


def encode_qmd_table(plan: Plan) -> bytes:
    stride = qmd_stride(plan)
    table = bytearray()
    for index in range(plan.launch_count):
        table += encode_qmd(plan, index).to_bytes().ljust(stride, b"\0")
    return bytes(table)


def _check_layout(plan: Plan, stride: int) -> None:
    """The QMD table fits before the next component; no component meets a window."""
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
    timeline = plan.address_map.semaphores.base + TIMELINE_OFFSET
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
        for submission in plan.submissions:
            start = pushbuffer.address
            for position, launch in enumerate(submission.launches):
                if position:
                    writer.wait_for_idle()
                writer.dispatch(plan.address_map.qmd_table.base + launch * stride)
            writer.release_semaphore(timeline, submission.semaphore)
            words = (pushbuffer.address - start) // WORD_BYTES
            entries.append(gpfifo_entry(arch.host, start, words))
    except CommandError as error:
        raise EncodeError(f"{plan.target.name} command stream: {error}") from None
    return pushbuffer.to_bytes(component.bytes), b"".join(entries)


def encode(plan: Plan) -> EncodedProgram:
    """Every component of a certified plan, deterministically."""
    require_certified(plan)
    arch = architecture(plan)
    stride = qmd_stride(plan)
    _check_layout(plan, stride)
    amap = plan.address_map
    pushbuffer, gpfifo = _encode_commands(plan, arch, stride)
    return EncodedProgram(
        target=plan.target.name,
        compute_class=arch.compute.number,
        host_class=arch.host.number,
        qmd_version=arch.qmd.version,
        qmd_stride=stride,
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


def emit(encoded: EncodedProgram, directory: Path) -> list[Path]:
    """Write each component as `<name>.bin` and an index.json describing them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    listing = []
    for component in encoded.components:
        path = directory / f"{component.name}.bin"
        path.write_bytes(component.data)
        written.append(path)
        listing.append({
            "name": component.name,
            "file": path.name,
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
        "gpfifo": {
            "entries": encoded.gpfifo_entries,
            "entry_bytes": encoded.entry_bytes,
            "setup_entries": SETUP_ENTRIES,
            "submission_entry": "submission s is entry s + setup_entries",
        },
        "semaphores": {
            "timeline": f"0x{encoded.timeline_address:x}",
            "launch_progress": f"0x{encoded.launch_progress_address:x}",
        },
        "windows": {
            "shared_memory": f"0x{encoded.shared_memory_window:x}",
            "local_memory": f"0x{encoded.local_memory_window:x}",
        },
        "components": listing,
    }
    path = directory / "index.json"
    path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    written.append(path)
    return written
