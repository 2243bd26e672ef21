"""Bring-up probe: Bob's submission path on a real GPU, one printed step at a time.

    PYTHONPATH=src python3 -m dev.bringup.probe --stages 1,2,3 --deadline 10

Stages (each needs the ones before it; the probe stops at the first failure
and prints what the driver returned):

1. client, device, subdevice, class list, VA space, doorbell; video and
   system memory allocated, mapped for the CPU and at chosen GPU addresses;
2. a channel (group, context share, GPFIFO, compute object, work submit
   token, schedule) and a pushbuffer holding only a host semaphore release;
3. one compute dispatch: a QMD V04 built here for a trivial kernel;
4. Bob's plan through ``NvBackend``, compared with the CPU backend.

Every wait has a deadline; a timeout prints GP_GET/GP_PUT and the channel's
error notifier. Nothing changes GPU settings.

Every word the probe submits comes from Bob's command-stream builders: the
pushbuffer packets and GPFIFO entries from ``bob.backends.nv.pushbuffer``, the
QMD from ``encoder.build_qmd`` (the recipe of every plan launch) and constant
bank 0's driver area from ``encoder.driver_area``.
"""

from __future__ import annotations

import argparse
import os
import platform
import struct
import sys
import time
import traceback

from bob.backends.nv.encoder import (
    ARCHITECTURES,
    LOCAL_MEMORY_WINDOW,
    SHARED_MEMORY_WINDOW,
    Dispatch,
    build_qmd,
    driver_area,
)
from bob.backends.nv.pushbuffer import WORD_BYTES, CommandWriter, Pushbuffer, gpfifo_entry
from bob.backends.nv.rm import structs as s
from bob.backends.nv.rm.channel import Channel
from bob.backends.nv.rm.device import RmClient, RmDevice
from bob.backends.nv.rm.memory import allocate, round_up
from dev.bringup import probe_kernel

# Probe addresses: the layout of a placed plan (2 MiB components from 0x20_0000_0000).
PROGRAM_VA = 0x20_0000_0000
QMD_VA = 0x20_0020_0000
PUSHBUFFER_VA = 0x20_0040_0000
SEMAPHORE_VA = 0x20_0060_0000
ARENA_VA = 0x20_0080_0000
PARAMETER_BLOCK_OFFSET = 0x1000  # inside the program component
PARAMETER_BLOCK_BYTES = 1024  # the sm_90 block (driver area, arguments from 0x210)
SEGMENT_ALIGNMENT = 256  # where the probe starts each pushbuffer segment
HOPPER = ARCHITECTURES["sm_90"]


def probe_qmd(program_va: int, cb0_va: int, cb0_bytes: int, grid: int, block: int,
              release_va: int, release_payload: int) -> bytes:
    """The probe kernel's QMD V04, built as every plan launch's is."""
    qmd = build_qmd(HOPPER, Dispatch(
        program_address=program_va, grid=(grid, 1, 1), block=(block, 1, 1),
        registers=probe_kernel.REGISTERS, shared_bytes=probe_kernel.SHARED_BYTES,
        constant_buffer=(cb0_va, cb0_bytes), release=(release_va, release_payload)))
    return qmd.to_bytes()


def probe_parameter_block(out_va: int, magic: int, grid: int, block_x: int) -> bytes:
    """Constant bank 0: the driver area, then the arguments from the parameter base.

    The driver area is not optional: compiled code reads blockDim from
    c[0][0x0..0x8] and gridDim from c[0][0xc..0x14] (seen on the H200: with
    zeros there every CTA computed blockIdx.x * 0 + threadIdx.x). Then the
    shared and local windows and the initial stack pointer.
    """
    block = bytearray(PARAMETER_BLOCK_BYTES)
    area = driver_area((block_x, 1, 1), (grid, 1, 1))
    block[:len(area)] = area
    struct.pack_into("<QI", block, probe_kernel.PARAMETER_BASE, out_va, magic)
    return bytes(block)


# -- the probe ------------------------------------------------------------------------


class Probe:
    def __init__(self, deadline_s: float, transport=None, regions: str | None = None,
                 plans: tuple[tuple[int, int, int, str], ...] = ((256, 2, 3, "hard"),)):
        self.deadline_s = deadline_s
        self.regions = regions
        self.plans = plans
        self.transport = transport
        self.client: RmClient | None = None
        self.device: RmDevice | None = None
        self.channel: Channel | None = None
        self.blocks: dict = {}
        self.push_cursor = 0
        self.start = time.monotonic()

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:7.3f}s] {message}", flush=True)

    # stage 1 ---------------------------------------------------------------------------
    def environment(self) -> None:
        try:
            with open("/proc/driver/nvidia/version") as version:
                self.say("driver: " + version.readline().strip())
        except OSError as error:
            self.say(f"driver: /proc/driver/nvidia/version unreadable ({error.strerror})")
        self.say(f"kernel {platform.release()}, python {platform.python_version()}, "
                 f"uid {os.getuid()}")
        for path in (s.CONTROL_DEVICE, s.GPU_DEVICE.format(minor=0), s.UVM_DEVICE):
            try:
                self.say(f"{path}: mode {oct(os.stat(path).st_mode & 0o777)}")
            except OSError as error:
                self.say(f"{path}: {error.strerror}")

    def stage1(self) -> None:
        self.environment()
        self.client = RmClient(self.transport, log=lambda message: self.say("  " + message))
        self.say(f"root client 0x{self.client.root:08x} on {s.CONTROL_DEVICE}")
        self.device = RmDevice(self.client)
        device = self.device
        self.say(f"driver build version (RM control): {device.driver_version}")
        hopper = [f"{s.CLASS_NAMES[c]} 0x{c:04x}" for c in (
            s.HOPPER_USERMODE_A, s.HOPPER_CHANNEL_GPFIFO_A, s.HOPPER_COMPUTE_A)]
        self.say(f"class list: {len(device.classes)} classes; present: {', '.join(hopper)}")
        compute = sorted(c for c in device.classes if c & 0xFF == 0xC0)
        self.say("  compute classes: " + ", ".join(f"0x{c:04x}" for c in compute))
        self.say(f"device 0x{device.device:08x}, subdevice 0x{device.subdevice:08x}, "
                 f"VA space 0x{device.vaspace:08x}, usermode 0x{device.usermode:08x} mapped")
        layout = (("program", 2 << 20, "vidmem", PROGRAM_VA),
                  ("qmd", 64 << 10, "vidmem", QMD_VA),
                  ("pushbuffer", 64 << 10, "sysmem", PUSHBUFFER_VA),
                  ("semaphores", 4 << 10, "sysmem", SEMAPHORE_VA),
                  ("arena", 2 << 20, "vidmem", ARENA_VA))
        for name, size, location, va in layout:
            block = allocate(device, size, location=location, gpu_va=va, name=name)
            pattern = bytes((i * 37 + len(name)) & 0xFF for i in range(4096))
            block.write(0, pattern)
            block.write(size - 4096, pattern)
            same = block.read(0, 4096) == pattern and block.read(size - 4096, 4096) == pattern
            block.write(0, bytes(4096))
            block.write(size - 4096, bytes(4096))
            self.blocks[name] = block
            self.say(f"{name}: {size} bytes of {location}, memory 0x{block.memory:08x}, "
                     f"virtual 0x{block.virtual:08x}, GPU VA 0x{block.gpu_va:x}, "
                     f"CPU write/read {'ok' if same else 'MISMATCH'}")
            if not same:
                raise RuntimeError(f"{name}: CPU read-back differs from what was written")

    # stage 2 ---------------------------------------------------------------------------
    def push(self, build) -> bytes:
        """Write the commands `build(writer)` emits as one segment; return its GPFIFO entry."""
        block = self.blocks["pushbuffer"]
        base = block.gpu_va + self.push_cursor
        segment = Pushbuffer(base, block.gpu_va + block.size)
        build(CommandWriter(segment, HOPPER.compute, HOPPER.host))
        data = segment.to_bytes()
        block.write(self.push_cursor, data)
        self.push_cursor = round_up(self.push_cursor + len(data), SEGMENT_ALIGNMENT)
        return gpfifo_entry(HOPPER.host, base, len(data) // WORD_BYTES)

    def semaphore(self, offset: int) -> int:
        return struct.unpack("<Q", self.blocks["semaphores"].read(offset, 8))[0]

    def stage2(self) -> None:
        assert self.device is not None
        self.channel = Channel(self.device)
        channel = self.channel
        self.say(f"channel group 0x{channel.group:08x}, context share 0x{channel.context_share:08x}"
                 f", channel 0x{channel.handle:08x}, compute 0x{channel.engine_object:08x}")
        self.say(f"GPFIFO ring at GPU VA 0x{channel.ring.gpu_va:x} ({channel.entries} entries), "
                 f"USERD at +0x{channel.userd_offset:x}, work submit token 0x{channel.token:x}")
        self.say("channel state after schedule: " + channel.state().describe())
        semaphores = self.blocks["semaphores"]

        def setup(writer: CommandWriter) -> None:
            writer.bind_compute()
            writer.shared_memory_window(SHARED_MEMORY_WINDOW)
            writer.local_memory_window(LOCAL_MEMORY_WINDOW)
            writer.release_semaphore(semaphores.gpu_va, 1)

        entry = self.push(setup)
        self.say(f"submit: SET_OBJECT 0x{s.HOPPER_COMPUTE_A:04x}, windows, host semaphore "
                 f"release 1; GP entry {entry.hex()}")
        began = time.monotonic()
        channel.submit([entry])
        channel.wait(lambda: self.semaphore(0), 1, self.deadline_s, "semaphore[0]")
        elapsed = (time.monotonic() - began) * 1e6
        self.say(f"semaphore[0] = {self.semaphore(0)} after {elapsed:.0f} us; "
                 f"{channel.state().describe()}")

    # stage 3 ---------------------------------------------------------------------------
    def stage3(self) -> None:
        assert self.channel is not None
        channel = self.channel
        program, qmd_block = self.blocks["program"], self.blocks["qmd"]
        arena, semaphores = self.blocks["arena"], self.blocks["semaphores"]
        grid, block, magic = 4, 128, 0xB0B00000
        threads = grid * block
        program.write(0, probe_kernel.CODE)
        cb0_va = program.gpu_va + PARAMETER_BLOCK_OFFSET
        program.write(PARAMETER_BLOCK_OFFSET,
                      probe_parameter_block(arena.gpu_va, magic, grid, block))
        arena.write(0, b"\xff" * (4 * threads))
        qmd = probe_qmd(program.gpu_va, cb0_va, PARAMETER_BLOCK_BYTES, grid, block,
                        semaphores.gpu_va + 16, 3)
        qmd_block.write(0, qmd)
        self.say(f"kernel {probe_kernel.ENTRY}: {len(probe_kernel.CODE)} bytes at "
                 f"0x{program.gpu_va:x}, {probe_kernel.REGISTERS} registers, "
                 f"cb0 at 0x{cb0_va:x}; QMD V04 at "
                 f"0x{qmd_block.gpu_va:x}: {qmd[:64].hex()}...")
        entry = self.push(self._dispatch_and_release(qmd_block.gpu_va, semaphores.gpu_va + 8, 2))
        began = time.monotonic()
        channel.submit([entry])
        channel.wait(lambda: self.semaphore(8), 2, self.deadline_s, "semaphore[1] (host, WFI)")
        elapsed = (time.monotonic() - began) * 1e6
        qmd_release = struct.unpack("<I", semaphores.read(16, 4))[0]
        out = struct.unpack(f"<{threads}I", arena.read(0, 4 * threads))
        wrong = [i for i, value in enumerate(out) if value != (magic + i) & 0xFFFF_FFFF]
        self.say(f"dispatch {grid}x{block}: host semaphore 2 after {elapsed:.0f} us, QMD release "
                 f"semaphore = {qmd_release} (expected 3); out[0:4] = "
                 + ", ".join(f"0x{v:08x}" for v in out[:4])
                 + f"; {threads - len(wrong)}/{threads} correct")
        if wrong:
            i = wrong[0]
            raise RuntimeError(f"out[{i}] = 0x{out[i]:08x}, expected 0x{(magic + i):08x}")
        self.round_trips(qmd_block.gpu_va, semaphores.gpu_va + 8, first_value=3)

    def round_trips(self, qmd_va: int, semaphore_va: int, first_value: int,
                    count: int = 50) -> None:
        """Dispatch + host release + CPU wait, `count` times: the submission round trip."""
        assert self.channel is not None
        times = []
        for value in range(first_value, first_value + count):
            entry = self.push(self._dispatch_and_release(qmd_va, semaphore_va, value))
            began = time.monotonic()
            self.channel.submit([entry])
            self.channel.wait(lambda: self.semaphore(8), value, self.deadline_s,
                              f"semaphore[1] round trip {value}")
            times.append((time.monotonic() - began) * 1e6)
            if self.push_cursor > 60 << 10:
                self.push_cursor = 0  # the entries before have been consumed (waited on)
        times.sort()
        self.say(f"{count} dispatch round trips (submit -> host semaphore seen by the CPU): "
                 f"median {times[count // 2]:.1f} us, min {times[0]:.1f} us, "
                 f"max {times[-1]:.1f} us")

    @staticmethod
    def _dispatch_and_release(qmd_va: int, semaphore_va: int, value: int):
        def build(writer: CommandWriter) -> None:
            writer.dispatch(qmd_va)
            writer.release_semaphore(semaphore_va, value)
        return build

    # stage 4 ---------------------------------------------------------------------------
    def stage4(self) -> None:
        from dev.bringup.plan_check import run_plan_check

        self.close()  # the backend opens its own client
        failures = []
        for spec in self.plans:
            vocab, prompts, updates, mode = spec
            try:
                run_plan_check(deadline_s=self.deadline_s, regions_path=self.regions,
                               vocab=vocab, prompts=prompts, updates=updates, mode=mode,
                               say=self.say, transport=self.transport)
            except Exception as error:  # report, then go on with the next plan
                failures.append(f"{spec}: {type(error).__name__}: {error}")
                self.say(f"plan {spec} FAILED: {type(error).__name__}: {error}")
        if failures:
            raise RuntimeError("; ".join(failures))

    def close(self) -> None:
        for block in self.blocks.values():
            block.close()
        self.blocks.clear()
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.device is not None:
            self.device.close()
            self.device = None
        if self.client is not None:
            self.client.close()
            self.client = None


def regenerate_kernel() -> int:
    """Compile probe_kernel.SOURCE with nvcc and rewrite probe_kernel.py's resources."""
    import pathlib
    import subprocess
    import tempfile
    import textwrap

    from bob.kernels.cuda.cubin import Cubin

    with tempfile.TemporaryDirectory() as work:
        source = pathlib.Path(work) / "probe.cu"
        source.write_text(probe_kernel.SOURCE)
        image = pathlib.Path(work) / "probe.cubin"
        subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", "-o", str(image), str(source)],
                       check=True)
        kernel = Cubin(image.read_bytes()).kernel(probe_kernel.ENTRY)
    path = pathlib.Path(probe_kernel.__file__)
    text = path.read_text()
    head = text[:text.index("REGISTERS = ")]
    code = "\n".join(f'    "{line}"' for line in textwrap.wrap(kernel.code.hex(), 96))
    path.write_text(head + f"REGISTERS = {kernel.registers}\n"
                    f"SHARED_BYTES = {kernel.shared_bytes}\n"
                    f"PARAMETER_BASE = 0x{kernel.parameter_base:x}\n"
                    f"PARAMETER_BYTES = {kernel.parameter_bytes}\n"
                    f"CODE = bytes.fromhex(\n{code}\n)\n")
    print(f"rewrote {path}: {len(kernel.code)} bytes, {kernel.registers} registers")
    return 0


def main(argv: list[str] | None = None, transport=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", default="1,2,3", help="comma-separated stages to run")
    parser.add_argument("--deadline", type=float, default=10.0, help="seconds per wait")
    parser.add_argument("--regions", help="compiled sm_90 regions (JSON) for stage 4")
    parser.add_argument("--plans", default="256:2:3:hard",
                        help="stage 4 plans, V:P:N:mode separated by commas")
    parser.add_argument("--regenerate-kernel", action="store_true",
                        help="rebuild probe_kernel.py from its CUDA C with nvcc, exit")
    parser.add_argument("--export-regions", metavar="PATH",
                        help="compile Bob's regions for sm_90 here, write them to PATH, exit")
    args = parser.parse_args(argv)
    if args.regenerate_kernel:
        return regenerate_kernel()
    if args.export_regions:
        from bob.kernels.cuda.regions import export_regions

        regions = export_regions(args.export_regions)
        print(f"wrote {len(regions)} sm_90 regions to {args.export_regions}")
        return 0
    stages = sorted({int(x) for x in args.stages.split(",") if x.strip()})
    plans = tuple((int(v), int(p), int(n), mode) for v, p, n, mode in
                  (spec.split(":") for spec in args.plans.split(",") if spec.strip()))
    probe = Probe(args.deadline, transport, args.regions, plans)
    status = 0
    current = 0
    try:
        for stage in range(1, max(stages) + 1):
            current = stage
            probe.say(f"== stage {stage} ==")
            getattr(probe, f"stage{stage}")()
            probe.say(f"== stage {stage}: ok ==")
    except Exception as error:  # report, never hang: this is a probe
        status = 1
        probe.say(f"!! stage {current} FAILED: {type(error).__name__}: {error}")
        traceback.print_exc(limit=4, file=sys.stdout)
        if probe.channel is not None:
            try:
                probe.say("channel state: " + probe.channel.state().describe())
            except Exception as state_error:  # noqa: BLE001 - best effort report
                probe.say(f"channel state unreadable: {state_error}")
    finally:
        probe.close()
    return status


if __name__ == "__main__":
    raise SystemExit(main())
