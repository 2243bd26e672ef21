"""``NvBackend``: a certified plan submitted to a Hopper GPU through the kernel driver.

    backend = NvBackend(plan)           # plan built for sm_90 with compiled regions
    backend.write_tensor("input", record)
    backend.run(range(plan.submission_count))
    backend.read_tensor("predictions")

Each component of the plan's address map (program, QMD table, pushbuffer,
semaphores, arena) becomes one allocation mapped at exactly the plan's
address, so the encoded bytes need no relocation: the pointer words in the
parameter blocks, the QMDs' program and constant-bank addresses and the
GPFIFO entries are already right. Program, QMD table and arena sit in video
memory (the arena in system memory with ``arena="host"``); pushbuffer and
semaphores in uncached system memory, so the CPU sees releases without
flushes.

What is submitted comes from a ``PlanImage``: the bytes of program and QMD
table, the channel set-up words and one pushbuffer segment per submission
ending in a semaphore release. ``plan_image`` builds it with the QMD V04
class of ``bob.backends.nv.qmd``; an image from elsewhere (the command-stream
encoder) can be passed as ``NvBackend(plan, image=...)``.

Checked on an H200 (580.159.04): Bob's plans run bit-identical to the CPU
backend (docs/RAW-HOPPER.md).

Every launch's constant bank 0 starts with the driver area the compiled code
reads (blockDim at 0x0, gridDim at 0xc, the shared and local windows at 0x18
and 0x20, the stack top at 0x28); the plan's parameter blocks leave it zero,
so it is filled here (see ``driver_area``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from bob.backends.base import Backend
from bob.errors import BackendUnavailable, RunFailure
from bob.plan.model import Component, Plan

from .channel import (
    LOCAL_MEMORY_WINDOW,
    SHARED_MEMORY_WINDOW,
    Channel,
    bind_compute,
    gp_entry,
    launch_qmd,
    memory_windows,
    semaphore_release,
    words_bytes,
)
from .device import RmClient, RmDevice
from .ioctl import RmError, Transport
from .memory import VIDMEM_GRANULE, Allocation, allocate, round_up

SUPPORTED_TARGET = "sm_90"
STACK_TOP = 0xFFFDC0  # the initial stack pointer CUDA's driver area carries (tinygrad's value)
DRIVER_AREA_BYTES = 0x30
RESERVED_SHARED_BYTES = 1024  # sm_80+ reserve 1 KiB of shared memory per CTA for the system
SHARED_CARVEOUT_KIB = 32  # every Bob region fits (the largest uses 3 KiB)
MAX_CARVEOUT_KIB = 100
SEMAPHORE_SLOT_BYTES = 16
# SEND_PCAS_A takes the QMD address >> 8: every QMD must start on 256 bytes. A V04
# record is 384 bytes, so records are laid at a 512-byte stride, not at the plan's
# qmd_record_bytes (the table then needs launches * 512 bytes; _map checks it
# still ends before the next component).
QMD_STRIDE = 512
DEFAULT_DEADLINE_S = 30.0  # without progress; the clock restarts whenever GP_GET moves


def driver_area(block: tuple[int, int, int], grid: tuple[int, int, int]) -> bytes:
    """The first 0x30 bytes of constant bank 0, as the CUDA driver fills them."""
    return (struct.pack("<3I3I", *block, *grid)
            + struct.pack("<QQQ", SHARED_MEMORY_WINDOW, LOCAL_MEMORY_WINDOW, STACK_TOP))


@dataclass(frozen=True)
class SubmissionImage:
    pushbuffer_offset: int  # bytes into the pushbuffer component
    words: tuple[int, ...]
    semaphore_offset: int  # bytes into the semaphores component (a 64-bit slot)
    value: int


@dataclass(frozen=True)
class PlanImage:
    """Everything the GPU reads, at offsets of the plan's components."""

    program: bytes
    qmd_table: bytes
    setup_words: tuple[int, ...]  # run once per channel, from pushbuffer offset 0
    submissions: tuple[SubmissionImage, ...]

    def pushbuffer(self) -> bytes:
        end = max([len(self.setup_words) * 4]
                  + [x.pushbuffer_offset + 4 * len(x.words) for x in self.submissions])
        data = bytearray(end)
        data[:4 * len(self.setup_words)] = words_bytes(list(self.setup_words))
        for sub in self.submissions:
            data[sub.pushbuffer_offset:sub.pushbuffer_offset + 4 * len(sub.words)] = \
                words_bytes(list(sub.words))
        return bytes(data)


def parameter_block_with_driver_area(plan: Plan, backend: Backend, index: int) -> bytes:
    launch = backend.launches[index]
    block = bytearray(backend.parameter_block(index))
    block[:DRIVER_AREA_BYTES] = driver_area(
        (launch.block.x, launch.block.y, launch.block.z),
        (launch.grid.x, launch.grid.y, launch.grid.z))
    return bytes(block)


def launch_qmd_record(plan: Plan, index: int) -> bytes:
    """One launch's QMD V04 from ``bob.backends.nv.qmd`` (generated field tables).

    Checked on the H200 (580.159.04): these records run Bob's plan bit-identical
    to the CPU backend. The probe's own QMD additionally sets QMD_GROUP_ID,
    SASS_VERSION and the instruction/constant cache invalidations; neither set
    of fields made a difference there.
    """
    from bob.backends.nv.qmd import QmdV04, SharedMemoryConfig

    launch = plan.launches[index]
    region = plan.region(launch.region)
    qmd = QmdV04()
    qmd.set_program_address(plan.placed_region(launch.region).address)
    qmd.set_grid(launch.grid.x, launch.grid.y, launch.grid.z)
    qmd.set_block(launch.block.x, launch.block.y, launch.block.z)
    qmd.set_registers(region.registers)
    qmd.set_barriers(1)
    qmd.set_shared_memory(RESERVED_SHARED_BYTES + region.shared_bytes,
                          SharedMemoryConfig(SHARED_CARVEOUT_KIB, MAX_CARVEOUT_KIB,
                                             SHARED_CARVEOUT_KIB))
    qmd.set_constant_buffer(0, plan.parameter_block_address(index),
                            plan.target.parameter_block_bytes)
    return qmd.to_bytes()


def plan_image(plan: Plan, backend: Backend) -> PlanImage:
    """The bring-up image of a plan: program, QMDs, one segment per submission."""
    target = plan.target
    amap = plan.address_map
    program = bytearray(plan.program_bytes)
    for placed in plan.placed_regions:
        code = plan.region(placed.name).code
        if not code:
            raise RunFailure(f"region {placed.name!r} has no machine code: build the plan with "
                             "compiled sm_90 regions (bob.kernels.cuda.compile.compiled_regions)")
        start = placed.address - amap.program.base
        program[start:start + len(code)] = code
    for index in range(plan.launch_count):
        start = plan.parameter_block_address(index) - amap.program.base
        program[start:start + target.parameter_block_bytes] = \
            parameter_block_with_driver_area(plan, backend, index)
    qmds = b"".join(launch_qmd_record(plan, i).ljust(QMD_STRIDE, b"\0")
                    for i in range(plan.launch_count))
    setup = tuple(bind_compute() + memory_windows())
    if len(setup) * 4 > target.pushbuffer_setup_bytes:
        raise RunFailure("the channel set-up words overflow the plan's pushbuffer set-up area")
    submissions = []
    for index, submission in enumerate(plan.submissions):
        words: list[int] = []
        for launch_index in submission.launches:
            words += launch_qmd(amap.qmd_table.base + launch_index * QMD_STRIDE)
        slot = index * SEMAPHORE_SLOT_BYTES
        words += semaphore_release(amap.semaphores.base + slot, submission.semaphore)
        offset = target.pushbuffer_setup_bytes + index * target.pushbuffer_bytes_per_submission
        if 4 * len(words) > target.pushbuffer_bytes_per_submission:
            raise RunFailure(f"submission {index} needs {4 * len(words)} pushbuffer bytes, the "
                             f"plan reserves {target.pushbuffer_bytes_per_submission}")
        submissions.append(SubmissionImage(offset, tuple(words), slot, submission.semaphore))
    return PlanImage(bytes(program), qmds, setup, tuple(submissions))


def nv_available() -> tuple[bool, str]:
    """Whether a Hopper GPU answers through the kernel driver here, and why not."""
    client = None
    try:
        client = RmClient()
        device = RmDevice(client)
        device.close()
        return True, f"HOPPER_COMPUTE_A through the kernel driver ({device.driver_version})"
    except (BackendUnavailable, RmError) as error:
        return False, str(error)
    finally:
        if client is not None:
            client.close()


class NvBackend(Backend):
    name = "nv"

    def __init__(self, plan: Plan, arena: str = "device", *, transport: Transport | None = None,
                 deadline_s: float = DEFAULT_DEADLINE_S, image: PlanImage | None = None):
        super().__init__(plan)
        if plan.target.name != SUPPORTED_TARGET:
            raise BackendUnavailable(f"the nv backend submits sm_90 plans (QMD V04, "
                                     f"HOPPER_COMPUTE_A); this plan targets {plan.target.name}")
        if arena not in ("device", "host"):
            raise ValueError(f"arena must be 'device' or 'host', not {arena!r}")
        self.deadline_s = deadline_s
        self.image = image or plan_image(plan, self)
        self.client = RmClient(transport)
        self.blocks: dict[str, Allocation] = {}
        self.channel: Channel | None = None
        try:
            self.device = RmDevice(self.client)
            amap = plan.address_map
            where = {"program": "vidmem", "qmd-table": "vidmem", "pushbuffer": "sysmem",
                     "semaphores": "sysmem", "arena": "vidmem" if arena == "device" else "sysmem"}
            for component in amap.components:
                self.blocks[component.name] = self._map(component, where[component.name])
            self.blocks["program"].write(0, self.image.program)
            self.blocks["qmd-table"].write(0, self.image.qmd_table)
            self.blocks["pushbuffer"].write(0, self.image.pushbuffer())
            self.channel = Channel(self.device)
            setup = gp_entry(amap.pushbuffer.base, len(self.image.setup_words))
            self.channel.submit([setup])
            self.channel.wait(lambda: self.channel.gp_get, 1, deadline_s, "channel set-up")
        except BaseException:
            self.close()
            raise

    def _map(self, component: Component, location: str) -> Allocation:
        granule = VIDMEM_GRANULE if location == "vidmem" else 4096
        needed = component.bytes
        if component.name == "qmd-table":
            needed = len(self.image.qmd_table)
        size = round_up(max(needed, 1), granule)
        later = [c.base for c in self.plan.address_map.components if c.base > component.base]
        if later and component.base + size > min(later):
            raise RunFailure(f"the {component.name} component needs {size} bytes at "
                             f"0x{component.base:x} and would overlap the next component at "
                             f"0x{min(later):x}")
        return allocate(self.device, size, location=location, gpu_va=component.base,
                        name=component.name)

    # -- tensors ------------------------------------------------------------------------
    def _arena_offset(self, name: str, offset: int, size: int) -> int:
        tensor = self.plan.tensor(name)
        if offset < 0 or offset + size > tensor.bytes:
            raise ValueError(f"{size} bytes at offset {offset} do not fit tensor {name!r} "
                             f"({tensor.bytes} bytes)")
        return tensor.address - self.plan.address_map.arena.base + offset

    def write_tensor(self, name: str, data: bytes, offset: int = 0) -> None:
        self.blocks["arena"].write(self._arena_offset(name, offset, len(data)), bytes(data))

    def read_tensor(self, name: str) -> bytes:
        size = self.plan.tensor(name).bytes
        return self.blocks["arena"].read(self._arena_offset(name, 0, size), size)

    # -- submission ---------------------------------------------------------------------
    def run(self, submissions: range) -> None:
        if len(submissions) == 0:
            return
        assert self.channel is not None
        semaphores = self.blocks["semaphores"]
        pushbuffer_base = self.plan.address_map.pushbuffer.base
        room = self.channel.entries // 2
        for start in range(0, len(submissions), room):
            batch = submissions[start:start + room]
            entries = []
            for index in batch:
                sub = self.image.submissions[index]
                semaphores.write(sub.semaphore_offset, bytes(8))  # a slot from an earlier run
                entries.append(gp_entry(pushbuffer_base + sub.pushbuffer_offset, len(sub.words)))
            self.channel.submit(entries)
            last = self.image.submissions[batch[-1]]
            self._wait(last, f"submission {batch[-1]}'s semaphore")
        self.last_semaphore = self.plan.submissions[submissions[-1]].semaphore

    def _wait(self, sub: SubmissionImage, what: str) -> None:
        assert self.channel is not None
        semaphores = self.blocks["semaphores"]

        def value() -> int:
            return struct.unpack("<Q", semaphores.read(sub.semaphore_offset, 8))[0]

        while True:  # the deadline restarts while the channel makes progress
            before = self.channel.gp_get
            try:
                self.channel.wait(value, sub.value, self.deadline_s, what)
                return
            except RunFailure:
                if self.channel.gp_get == before or self.channel.state().error:
                    raise

    def _parameter_block_changed(self, launch_index: int) -> None:
        address = self.plan.parameter_block_address(launch_index)
        block = parameter_block_with_driver_area(self.plan, self, launch_index)
        self.blocks["program"].write(address - self.plan.address_map.program.base, block)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        for block in self.blocks.values():
            block.close()
        self.blocks.clear()
        device = getattr(self, "device", None)
        if device is not None:
            device.close()
            self.device = None
        if self.client is not None:
            self.client.close()
            self.client = None


# -- the device check the probe's stage 4 runs ---------------------------------------------


def run_plan_check(deadline_s: float = 10.0, regions_path: str | None = None,
                   vocab: int = 256, prompts: int = 2, updates: int = 3, mode: str = "hard",
                   say=print) -> None:
    """Bob's plan on the GPU and on the CPU backend, every tensor compared bit for bit."""
    import numpy as np

    from bob.backends.cpu import CpuBackend
    from bob.plan.placement import SM90
    from bob.program.bob import BobConfig, build_plan

    from .regions import load_regions

    regions = load_regions(regions_path)
    config = BobConfig(vocab=vocab, prompts=prompts, updates=updates, mode=mode)
    plan = build_plan(config, SM90, compiled=regions)
    say(f"plan: V={vocab} P={prompts} N={updates} {mode}: {plan.launch_count} launches, "
                 f"{plan.submission_count} submissions, program {plan.program_bytes} bytes, "
                 f"arena {plan.arena_bytes} bytes at 0x{plan.address_map.arena.base:x}")
    rng = np.random.default_rng(7)
    if mode == "hard":
        targets = rng.integers(0, vocab, vocab, dtype=np.uint32).tobytes()
    else:  # corpus weights: a random distribution over transitions
        weights = rng.random(vocab * vocab)
        targets = (weights / weights.sum()).astype(np.float32).tobytes()
    record = targets + rng.integers(0, vocab, prompts, dtype=np.uint32).tobytes()
    table = (rng.standard_normal(vocab * vocab) * 0.5).astype(np.float32).tobytes()
    backends = {"cpu": CpuBackend(plan)}
    import time

    began = time.monotonic()
    backends["nv"] = NvBackend(plan, deadline_s=deadline_s)
    say(f"NvBackend opened in {(time.monotonic() - began) * 1e3:.1f} ms")
    try:
        for backend in backends.values():
            backend.write_tensor("input", record)
            backend.write_tensor("parameters", table)
        timings = {}
        for name, backend in backends.items():
            began = time.monotonic()
            backend.run(range(plan.submission_count))
            timings[name] = (time.monotonic() - began) * 1e3
        say("run all submissions: " + ", ".join(
            f"{name} {ms:.2f} ms" for name, ms in timings.items())
            + (f"; nv per AdamW update {timings['nv'] * 1e3 / updates:.1f} us "
               "(update = AdamW + loss-gradient, each submitted alone)" if updates else ""))
        mismatches = 0
        for tensor in plan.tensors:
            cpu = backends["cpu"].read_tensor(tensor.name)
            gpu = backends["nv"].read_tensor(tensor.name)
            if cpu == gpu:
                say(f"  {tensor.name}: {len(cpu)} bytes identical")
                continue
            mismatches += 1
            a = np.frombuffer(cpu, np.uint8)
            b = np.frombuffer(gpu, np.uint8)
            first = int(np.flatnonzero(a != b)[0]) // 4 * 4
            cv, gv = (struct.unpack_from("<I", x, first)[0] for x in (cpu, gpu))
            say(f"  {tensor.name}: DIFFERS, first at byte {first}: cpu 0x{cv:08x}, "
                         f"nv 0x{gv:08x} ({int((a != b).sum())} bytes differ)")
        predictions = np.frombuffer(backends["nv"].read_tensor("predictions"), np.uint32)
        say(f"predictions (nv): {predictions.tolist()}; "
                     f"{'all tensors bit-identical' if not mismatches else f'{mismatches} differ'}")
        if mismatches:
            raise RunFailure(f"{mismatches} tensors differ between nv and cpu")
    finally:
        for backend in backends.values():
            backend.close()


__all__ = ["NvBackend", "PlanImage", "SubmissionImage", "driver_area", "nv_available",
           "plan_image", "run_plan_check"]
