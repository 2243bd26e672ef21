"""``NvBackend``: a certified plan submitted to a Hopper GPU through the kernel driver.

    backend = NvBackend(plan)           # plan built for sm_90 with compiled regions
    backend.write_tensor("input", record)
    backend.run(range(plan.submission_count))
    backend.read_tensor("predictions")

What the GPU runs is Bob's command stream, ``encoder.encode(plan)``: the same
bytes ``nv-sim`` executes, ``bob plan --disasm`` lists and ``bob plan --emit``
writes. Each component of the plan's address map (program, QMD table,
pushbuffer, semaphores, arena) becomes one allocation mapped at exactly the
plan's address, and the encoded components are copied there unchanged: the
driver areas and pointer words in the parameter blocks, the QMDs' program,
constant-bank and release addresses and the GPFIFO entries are already right.
Program, QMD table and arena sit in video memory (the arena in system memory
with ``arena="host"``); pushbuffer and semaphores in uncached system memory,
so the CPU sees releases without flushes.

Opening runs GPFIFO entry 0 (the set-up: compute class, memory windows) once.
``run(submissions)`` zeroes each submission's 64-bit semaphore slot, copies
the submissions' encoded GPFIFO entries into the channel's ring and waits for
the last slot to reach its value. ``set_scalars`` re-encodes the launch's
parameter block (driver area included) into the mapped program component.

Checked on an H200 (580.159.04): Bob's plans run bit-identical to the CPU
backend (docs/RAW-HOPPER.md).
"""

from __future__ import annotations

import struct

from bob.backends.base import Backend
from bob.backends.nv.encoder import SETUP_ENTRIES, EncodedProgram, encode, parameter_block
from bob.errors import BackendUnavailable, RunFailure
from bob.plan.model import Component, Plan

from .channel import Channel
from .device import RmClient, RmDevice
from .ioctl import ChannelError, RmError, SubmissionTimeout, Transport
from .memory import SYSMEM_GRANULE, VIDMEM_GRANULE, Allocation, allocate, round_up

SUPPORTED_TARGET = "sm_90"
DEFAULT_DEADLINE_S = 30.0  # without progress; the clock restarts whenever GP_GET moves
SEMAPHORE_BYTES = 8  # each submission releases a 64-bit value into its slot


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


def _require_code(plan: Plan) -> None:
    for placed in plan.placed_regions:
        if not plan.region(placed.name).code:
            raise RunFailure(f"region {placed.name!r} has no machine code: build the plan with "
                             "compiled sm_90 regions (bob.kernels.cuda.compile.compiled_regions)")


class NvBackend(Backend):
    name = "nv"

    def __init__(self, plan: Plan, arena: str = "device", *, transport: Transport | None = None,
                 deadline_s: float = DEFAULT_DEADLINE_S):
        super().__init__(plan)
        if plan.target.name != SUPPORTED_TARGET:
            raise BackendUnavailable(f"the nv backend submits sm_90 plans (QMD V04, "
                                     f"HOPPER_COMPUTE_A); this plan targets {plan.target.name}")
        if arena not in ("device", "host"):
            raise ValueError(f"arena must be 'device' or 'host', not {arena!r}")
        _require_code(plan)
        self.deadline_s = deadline_s
        self.encoded: EncodedProgram = encode(plan)
        self.client = RmClient(transport)
        self.blocks: dict[str, Allocation] = {}
        self.channel: Channel | None = None
        try:
            self.device = RmDevice(self.client)
            where = {"program": "vidmem", "qmd-table": "vidmem", "pushbuffer": "sysmem",
                     "semaphores": "sysmem", "arena": "vidmem" if arena == "device" else "sysmem"}
            for component in plan.address_map.components:
                self.blocks[component.name] = self._map(component, where[component.name])
            for encoded in self.encoded.components:
                if encoded.base is not None:  # the GPFIFO entries go to the channel's ring
                    self._upload(encoded.name, encoded.base, encoded.data)
            self.channel = Channel(self.device)
            self.channel.submit([self.encoded.entry(i) for i in range(SETUP_ENTRIES)])
            self.channel.wait(lambda: self.channel.gp_get, SETUP_ENTRIES, deadline_s,
                              "channel set-up")
        except BaseException:
            self.close()
            raise

    def _map(self, component: Component, location: str) -> Allocation:
        granule = VIDMEM_GRANULE if location == "vidmem" else SYSMEM_GRANULE
        size = round_up(max(component.bytes, 1), granule)
        later = [c.base for c in self.plan.address_map.components if c.base > component.base]
        if later and component.base + size > min(later):
            raise RunFailure(f"the {component.name} component needs {size} bytes at "
                             f"0x{component.base:x} and would overlap the next component at "
                             f"0x{min(later):x}")
        return allocate(self.device, size, location=location, gpu_va=component.base,
                        name=component.name)

    def _upload(self, name: str, address: int, data: bytes) -> None:
        """Copy encoded bytes to their plan address inside the component `name`."""
        block = self.blocks[name]
        assert block.gpu_va is not None
        block.write(address - block.gpu_va, data)

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
        for index in submissions:
            if not 0 <= index < self.plan.submission_count:
                raise ValueError(f"submission {index} is not in the plan's "
                                 f"{self.plan.submission_count}")
        room = self.channel.entries // 2
        for start in range(0, len(submissions), room):
            batch = submissions[start:start + room]
            for index in batch:  # a slot may hold its value from an earlier run
                self._upload("semaphores", self.encoded.submission_semaphore(index),
                             bytes(SEMAPHORE_BYTES))
            self.channel.submit([self.encoded.submission_entry(index) for index in batch])
            self._wait(batch[-1])
        self.last_semaphore = self.plan.submissions[submissions[-1]].semaphore

    def semaphore(self, submission: int) -> int:
        """The 64-bit value in submission `submission`'s semaphore slot."""
        block = self.blocks["semaphores"]
        assert block.gpu_va is not None
        offset = self.encoded.submission_semaphore(submission) - block.gpu_va
        return struct.unpack("<Q", block.read(offset, SEMAPHORE_BYTES))[0]

    def launch_progress(self) -> int:
        """Launch index + 1 of the last grid that completed (its QMD's release)."""
        block = self.blocks["semaphores"]
        assert block.gpu_va is not None
        offset = self.encoded.launch_progress_address - block.gpu_va
        return struct.unpack("<I", block.read(offset, 4))[0]

    def _wait(self, submission: int) -> None:
        assert self.channel is not None
        target = self.plan.submissions[submission].semaphore
        what = f"submission {submission}'s semaphore"
        while True:  # the deadline restarts while the channel makes progress
            before = self.channel.gp_get
            try:
                self.channel.wait(lambda: self.semaphore(submission), target, self.deadline_s,
                                  what)
                return
            except ChannelError as error:
                raise ChannelError(f"{error}; {self._progress()}") from None
            except SubmissionTimeout as error:
                if self.channel.gp_get == before:
                    raise SubmissionTimeout(f"{error}; {self._progress()}") from None

    def _progress(self) -> str:
        done = self.launch_progress()
        if done == 0:
            return "no launch has completed"
        launch = self.plan.launches[done - 1] if done <= self.plan.launch_count else None
        label = (launch.label or launch.region) if launch else "not in the plan"
        return f"the last launch completed is {done - 1} ({label})"

    def _parameter_block_changed(self, launch_index: int) -> None:
        block = parameter_block(self.plan, launch_index, self.launches[launch_index])
        self._upload("program", self.plan.parameter_block_address(launch_index), block)

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
    say("uploaded, read back from the GPU's memory: " + ", ".join(
        f"{name} {size} bytes {'= encode(plan)' if same else 'DIFFERS from encode(plan)'}"
        for name, size, same in _read_back(backends["nv"])))
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
        nv = backends["nv"]
        last = plan.submission_count - 1
        say(f"semaphores: submission {last}'s slot = {nv.semaphore(last)} (plan: "
            f"{plan.submissions[last].semaphore}); launch progress = {nv.launch_progress()}")
        predictions = np.frombuffer(backends["nv"].read_tensor("predictions"), np.uint32)
        say(f"predictions (nv): {predictions.tolist()}; "
                     f"{'all tensors bit-identical' if not mismatches else f'{mismatches} differ'}")
        if mismatches:
            raise RunFailure(f"{mismatches} tensors differ between nv and cpu")
    finally:
        for backend in backends.values():
            backend.close()


def _read_back(backend: NvBackend) -> list[tuple[str, int, bool]]:
    """Each encoded component as the GPU's memory holds it, against the encoder's bytes."""
    found = []
    for encoded in backend.encoded.components:
        if encoded.base is None:
            continue
        block = backend.blocks[encoded.name]
        assert block.gpu_va is not None
        data = block.read(encoded.base - block.gpu_va, len(encoded.data))
        found.append((encoded.name, len(data), data == encoded.data))
    return found


__all__ = ["NvBackend", "nv_available", "run_plan_check"]
