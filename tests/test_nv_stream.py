"""The nv runtime stream on the CPU: copy-engine and timestamp encodings against the
headers, and NvBackend's copies, profile and channel errors on the scripted driver with
a fake GPU that executes the runtime segments it is handed (decoded from the bytes).
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
from dataclasses import dataclass

import numpy as np
import pytest

from bob.backends.landing import STREAM_RING_BUFFERS
from bob.backends.nv import decoder
from bob.backends.nv.pushbuffer import (
    COPY_SUBCHANNEL,
    HOPPER_CHANNEL_GPFIFO_A,
    HOPPER_COMPUTE_A,
    CommandError,
    CommandWriter,
    CopyWriter,
    Pushbuffer,
    incrementing_header,
)
from bob.backends.nv.rm import backend as nv_backend
from bob.backends.nv.rm import channel as ch
from bob.backends.nv.rm import ioctl
from bob.backends.nv.rm import snapshot as st_snapshot
from bob.backends.nv.rm import stream as st
from bob.backends.nv.rm import structs as s
from bob.errors import RunFailure
from conftest import bob_plan, needs_nvrtc
from nv_fakes import FakeDriver

CE = decoder.TABLES.classes[0xC8B5]  # HOPPER_DMA_COPY_A as the decoder's own parser read it
HOST = decoder.TABLES.classes[0xC86F]


def _words(pushbuffer: Pushbuffer) -> list[int]:
    data = pushbuffer.to_bytes()
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def _calls(words: list[int], address: int = 0x1000, bindings=None) -> list[decoder.MethodCall]:
    return decoder.decode_segment(words, address, 0xC86F, {} if bindings is None else bindings)


# -- encodings -----------------------------------------------------------------------------


def test_the_copy_methods_sit_where_clc8b5_puts_them():
    pushbuffer = Pushbuffer(0x1000, 0x2000)
    writer = CopyWriter(pushbuffer)
    writer.bind()
    writer.copy(0x20_1234_5600, 0x10_1000_0000, 0x4_0000, release=(0x10_0010_0008, 2**32 + 7))
    words = _words(pushbuffer)
    # SET_OBJECT on subchannel 4 names the class number (NVC56F_SET_OBJECT_NVCLASS 15:0).
    assert words[:2] == [incrementing_header(COPY_SUBCHANNEL, 0, 1), 0xC8B5]
    # OFFSET_IN_UPPER .. OFFSET_OUT_LOWER: four consecutive methods from 0x400.
    assert words[2:7] == [incrementing_header(4, 0x400, 4), 0x20, 0x1234_5600, 0x10, 0x1000_0000]
    assert words[7:9] == [incrementing_header(4, 0x418, 1), 0x4_0000]
    # SET_SEMAPHORE_A/B, PAYLOAD, PAYLOAD_UPPER from 0x240: the 64-bit payload in two words.
    assert words[9:14] == [incrementing_header(4, 0x240, 4), 0x10, 0x0010_0008, 7, 1]
    # LAUNCH_DMA: NON_PIPELINED (2, bits 1:0), FLUSH_ENABLE (bit 2), ONE_WORD semaphore
    # (1, bits 4:3), pitch source and destination (bits 7, 8), TWO_WORD payload (bit 27).
    assert words[14:] == [incrementing_header(4, 0x300, 1),
                          2 | 1 << 2 | 1 << 3 | 1 << 7 | 1 << 8 | 1 << 27]
    calls = _calls(words)
    launch = calls[-1]
    assert (launch.class_name, launch.name) == ("HOPPER_DMA_COPY_A", "LAUNCH_DMA")
    named = {f.name: f.value_name for f in launch.fields}
    assert named["DATA_TRANSFER_TYPE"] == "NON_PIPELINED"
    assert named["SEMAPHORE_PAYLOAD_SIZE"] == "TWO_WORD"
    assert named["SRC_TYPE"] == named["DST_TYPE"] == "VIRTUAL"


def test_a_copy_without_a_release_neither_flushes_nor_releases():
    pushbuffer = Pushbuffer(0x1000, 0x2000)
    CopyWriter(pushbuffer).copy(0x1000, 0x2000, 64)
    launch = _calls(_words(pushbuffer), bindings={COPY_SUBCHANNEL: 0xC8B5})[-1]
    assert launch.data == 2 | 1 << 7 | 1 << 8
    assert {f.name: f.value_name for f in launch.fields}["SEMAPHORE_TYPE"] == "NONE"


@pytest.mark.parametrize(("call", "message"), [
    (lambda w: w.copy(0x1000, 0x2000, 0), "1 to 4294967295 bytes"),
    (lambda w: w.copy(0x1000, 0x2000, 1 << 32), "1 to 4294967295 bytes"),
    (lambda w: w.copy(1 << 57, 0x2000, 4), "57-bit GPU address"),
    (lambda w: w.copy(0x1000, -4, 4), "destination -4"),
    (lambda w: w.copy(0x1000, 0x2000, 4, release=(0x3004, 1)), "not 8-byte aligned"),
    (lambda w: w.copy(0x1000, 0x2000, 4, release=(0x3000, 1 << 64)), "does not fit 64 bits"),
])
def test_copy_refusals_name_the_problem(call, message):
    pushbuffer = Pushbuffer(0x1000, 0x2000)
    with pytest.raises(CommandError, match=message):
        call(CopyWriter(pushbuffer))
    assert pushbuffer.to_bytes() == b""  # nothing half-written


def test_a_timestamped_release_sets_release_timestamp_and_is_16_byte_aligned():
    pushbuffer = Pushbuffer(0x1000, 0x2000)
    writer = CommandWriter(pushbuffer, HOPPER_COMPUTE_A, HOPPER_CHANNEL_GPFIFO_A)
    writer.release_semaphore(0x10_2000_0010, 2**32 + 3, timestamp=True)
    words = _words(pushbuffer)
    # SEM_EXECUTE: RELEASE (1), RELEASE_WFI (bit 20), 64-bit payload (bit 24), timestamp (25).
    assert words[-1] == 1 | 1 << 20 | 1 << 24 | 1 << 25
    assert words[3:5] == [3, 1]  # SEM_PAYLOAD_LO, SEM_PAYLOAD_HI
    execute = _calls(words)[-1]
    assert {f.name: f.value_name for f in execute.fields}["RELEASE_TIMESTAMP"] == "EN"
    assert HOST.fields["SEM_EXECUTE_RELEASE_TIMESTAMP"].low == 25  # from clc86f.h itself
    with pytest.raises(CommandError, match="timestamped 64-bit semaphore .* 16-byte aligned"):
        writer.release_semaphore(0x10_2000_0008, 1, timestamp=True)


def test_a_plain_release_has_no_timestamp():
    pushbuffer = Pushbuffer(0x1000, 0x2000)
    CommandWriter(pushbuffer, HOPPER_COMPUTE_A, HOPPER_CHANNEL_GPFIFO_A).release_semaphore(
        0x10_2000_0008, 1)
    assert not _words(pushbuffer)[-1] & 1 << 25


def test_stamps_pair_into_launch_times():
    data = b"".join(struct.pack("<QQ", payload, ns) for payload, ns in
                    ((2**32 - 1, 100), (2**32, 350), (2**32 + 1, 400), (2**32 + 2, 1400)))
    stamps = st.read_stamps(data)
    assert stamps[1] == st.Stamp(2**32, 350)
    assert st.launch_nanoseconds(stamps, 2**32 - 1) == [250, 1000]
    with pytest.raises(RunFailure, match="launch 0's timestamps carry 4294967295, 4294967296, "
                       "not 4294967296, 4294967297"):
        st.launch_nanoseconds(stamps, 2**32)
    backwards = st.read_stamps(struct.pack("<QQQQ", 5, 900, 6, 800))
    with pytest.raises(RunFailure, match="launch 0 ended at 800 ns, before it began at 900"):
        st.launch_nanoseconds(backwards, 5)


# -- a fake GPU for the runtime stream ---------------------------------------------------------


@dataclass
class Reached:
    """Memory the fake GPU reaches other than through an allocation's own mapping."""

    block: object

    @property
    def gpu_va(self) -> int:
        return self.block.gpu_va

    @property
    def size(self) -> int:
        return self.block.size


@dataclass
class HostMemory(Reached):
    """A landing buffer as the fake GPU reaches it: process memory at `address`."""

    address: int

    def read(self, offset: int, size: int) -> bytes:
        return ctypes.string_at(self.address + offset, size)

    def write(self, offset: int, data: bytes) -> None:
        ctypes.memmove(self.address + offset, data, len(data))


@dataclass
class DeviceOnly(Reached):
    """Video memory with no CPU mapping (a read's snapshot) as the fake GPU reaches it."""

    data: bytearray

    def read(self, offset: int, size: int) -> bytes:
        return bytes(self.data[offset:offset + size])

    def write(self, offset: int, data: bytes) -> None:
        self.data[offset:offset + len(data)] = data


class FakeGpu:
    """Executes what the channels were handed: runtime segments (copies, releases, the
    copy kernels' QMDs) from the bytes, plan submissions as launches of a known duration
    (1 us * (launch + 1)). A channel holds at a segment whose acquires are not met, and
    the other channel runs meanwhile, as the GPU's do."""

    def __init__(self, monkeypatch, error_after_launch: int | None = None,
                 error_on_copy: bool = False):
        self.backend = None
        self.executed: dict[int, int] = {}  # id of a channel -> entries it has run
        self.clock = 10_000
        self.bindings: dict[int, int] = {1: 0xCBC0}  # what the skipped set-up entry binds
        self.copy_state: dict[str, int] = {}
        self.error_after_launch = error_after_launch
        self.error_on_copy = error_on_copy
        self.launches: list[int] = []
        self.acquires: list[int] = []
        self.acquired: list[tuple[int, int]] = []  # (semaphore address, payload)
        self.kernel_copies: list[tuple[int, int, int]] = []  # (source, destination, bytes)
        self.device_only: dict[int, DeviceOnly] = {}  # id of an allocation -> its bytes
        monkeypatch.setattr(ch.Channel, "wait", lambda channel, *args: self.wait(channel, *args))

    def blocks(self):
        backend = self.backend
        found = list(backend.blocks.values())
        stream = backend._stream
        if stream is not None:
            found += [b for b in (stream.block, stream.staging, stream.writes,
                                  stream.profile_buffer) if b]
            if stream.copy_channel is not None:
                found.append(stream.copy_channel.ring)
            if stream.snapshots is not None:
                found.append(stream.snapshots.block)
        found.append(backend.channel.ring)
        found += [HostMemory(block, address) for address, block in backend._described.items()]
        snapshot = backend._snapshot
        if snapshot is not None:
            if id(snapshot) not in self.device_only:
                self.device_only[id(snapshot)] = DeviceOnly(snapshot, bytearray(snapshot.size))
            found.append(self.device_only[id(snapshot)])
        return found

    def memory(self, address: int, size: int):
        for block in self.blocks():
            if block.gpu_va is not None and block.gpu_va <= address < block.gpu_va + block.size:
                assert address + size <= block.gpu_va + block.size
                return block, address - block.gpu_va
        raise AssertionError(f"the fake GPU touched unmapped {address:#x}")

    def read(self, address: int, size: int) -> bytes:
        block, offset = self.memory(address, size)
        return block.read(offset, size)

    def write(self, address: int, data: bytes) -> None:
        block, offset = self.memory(address, len(data))
        block.write(offset, data)

    def channels(self) -> list:
        stream = self.backend._stream
        copy = stream.copy_channel if stream is not None else None
        return [self.backend.channel] + ([copy] if copy is not None else [])

    def _calls(self, channel, index: int, bindings: dict[int, int]) -> list:
        slot = index % channel.entries
        entry = decoder.decode_gpfifo(channel.ring.read(8 * slot, 8), 0xC86F)[0]
        words = struct.unpack(f"<{entry.words}I", self.read(entry.address, 4 * entry.words))
        return decoder.decode_segment(words, entry.address, 0xC86F, bindings)

    def _acquires_met(self, calls) -> bool:
        """Whether every acquire of a segment (they open it) would pass now."""
        state = {}
        for call in calls:
            if call.class_name == "HOPPER_CHANNEL_GPFIFO_A" and call.name.startswith("SEM_"):
                state[call.name] = call.data
                if call.name == "SEM_EXECUTE" and call.field("OPERATION").value == 3:
                    address = state["SEM_ADDR_HI"] << 32 | state["SEM_ADDR_LO"]
                    payload = state["SEM_PAYLOAD_HI"] << 32 | state["SEM_PAYLOAD_LO"]
                    if struct.unpack("<Q", self.read(address, 8))[0] < payload:
                        return False
        return True

    def execute(self, channel=None) -> None:
        """Run every channel's entries in order until each is done or held by an acquire."""
        moved = True
        while moved:
            moved = False
            for each in self.channels():
                if each.state().error:  # a stopped channel runs nothing more
                    continue
                done = self.executed.setdefault(id(each), 0)
                while done < each.put_count:
                    if not self._acquires_met(self._calls(each, done, dict(self.bindings))):
                        break
                    calls = self._calls(each, done, self.bindings)
                    done += 1
                    self.executed[id(each)] = done
                    moved = True
                    for call in calls:
                        self.method(call)

    def method(self, call: decoder.MethodCall) -> None:
        if call.class_name == "HOPPER_DMA_COPY_A":
            self.copy_state[call.name] = call.data
            if call.name == "LAUNCH_DMA":
                self.launch_dma(call)
        elif call.class_name == "HOPPER_CHANNEL_GPFIFO_A" and call.name.startswith("SEM_"):
            self.copy_state[call.name] = call.data
            if call.name == "SEM_EXECUTE":
                self.host_release(call)
        elif call.name == "SEND_PCAS_A":
            address = call.field("QMD_ADDRESS_SHIFTED8").unshifted
            snapshots = self.backend._stream.snapshots if self.backend._stream else None
            if snapshots is not None and snapshots.block.gpu_va <= address < \
                    snapshots.block.gpu_va + snapshots.block.size:
                self.copy_kernel(snapshots, address)
                return
            launch = decoder.qmd_launch(self.backend.encoded, address)
            self.launches.append(launch)
            self.clock += 1000 * (launch + 1)
            if self.error_after_launch is not None and launch >= self.error_after_launch:
                self.stop(13)

    def copy_kernel(self, snapshots, address: int) -> None:
        """A copy kernel's launch, read from its QMD and constant bank as the GPU would."""
        record = self.read(address, snapshots.target.qmd_record_bytes)
        dispatch = decoder.decode_qmd(record, 0xCBC0).dispatch()
        copy = snapshots.entry_at(dispatch.program_address)
        bank, size = dispatch.constant_buffers[0]
        source, destination, units = st_snapshot.COPY_ARGUMENTS.unpack(
            self.read(bank + copy.kernel.parameter_base, st_snapshot.COPY_ARGUMENTS.size))
        assert dispatch.block == (256, 1, 1) and dispatch.grid[0] >= 1
        self.write(destination, self.read(source, units * copy.unit))
        self.kernel_copies.append((source, destination, units * copy.unit))

    def stop(self, error: int) -> None:
        """What RM does to a channel that faults: the error notifier, then nothing runs."""
        notifier = self.backend.channel.notifier
        notifier.write(0, struct.pack("<QIHH", 1, error, 0, 0xFFFF))
        raise _Stopped

    def launch_dma(self, call) -> None:
        if self.error_on_copy:
            self.stop(31)
        state = self.copy_state
        fields = {f.name: f.value_name for f in call.fields}
        source = state["OFFSET_IN_UPPER"] << 32 | state["OFFSET_IN_LOWER"]
        destination = state["OFFSET_OUT_UPPER"] << 32 | state["OFFSET_OUT_LOWER"]
        self.write(destination, self.read(source, state["LINE_LENGTH_IN"]))
        if fields["SEMAPHORE_TYPE"] != "NONE":
            assert fields["SEMAPHORE_PAYLOAD_SIZE"] == "TWO_WORD"
            address = state["SET_SEMAPHORE_A"] << 32 | state["SET_SEMAPHORE_B"]
            payload = state["SET_SEMAPHORE_PAYLOAD_UPPER"] << 32 | state["SET_SEMAPHORE_PAYLOAD"]
            self.write(address, struct.pack("<Q", payload))

    def host_release(self, call) -> None:
        state = self.copy_state
        fields = {f.name: f.value_name for f in call.fields}
        address = state["SEM_ADDR_HI"] << 32 | state["SEM_ADDR_LO"]
        payload = state["SEM_PAYLOAD_HI"] << 32 | state["SEM_PAYLOAD_LO"]
        if call.field("OPERATION").value != 1:  # an acquire: in order, it is always met here
            assert call.field("OPERATION").value == 3 and fields["PAYLOAD_SIZE"] == "64BIT"
            value, = struct.unpack("<Q", self.read(address, 8))
            assert value >= payload, f"acquired {payload} with the semaphore at {value}"
            self.acquires.append(payload)
            self.acquired.append((address, payload))
            return
        data = struct.pack("<Q", payload)
        if fields.get("RELEASE_TIMESTAMP") == "EN":
            data += struct.pack("<Q", self.clock)
        self.write(address, data)

    def wait(self, channel, read_value, target, deadline_s, what):
        if self.backend is None:  # the channel set-up, while the backend opens
            self.executed[id(channel)] = channel.put_count
            return target
        with contextlib.suppress(_Stopped):  # the channel's error notifier says so below
            self.execute(channel)
        if channel.state().error:  # as the real wait: a stopped channel runs nothing more
            raise ioctl.ChannelError(f"the driver stopped the channel while waiting for {what}: "
                                     f"{channel.state().describe()}")
        if not what.startswith("submission"):  # the runtime's own releases: executed here
            value = read_value()
            if value < target and any(each.state().error for each in self.channels()):
                # held behind the other, stopped channel: this wait's slice runs out
                raise ioctl.SubmissionTimeout(f"{what} is {value}, not {target}")
            assert value >= target, (what, value, target)
            return value
        return target  # the plan's own releases are the QMDs': not simulated here


class _Stopped(Exception):
    pass


def _open(monkeypatch, plan=None, **options):
    gpu = FakeGpu(monkeypatch, options.pop("error_after_launch", None),
                  options.pop("error_on_copy", False))
    backend = nv_backend.NvBackend(plan or bob_plan(1, 2, target=_sm90(), compiled=True,
                                                    registers=24, shared_bytes=2048),
                                   transport=FakeDriver().transport(), deadline_s=0.01,
                                   **options)
    gpu.backend = backend
    return backend, gpu


def _sm90():
    from bob.plan.placement import TARGETS

    return TARGETS["sm_90"]


def test_large_reads_and_writes_go_through_the_copy_engine(monkeypatch):
    monkeypatch.setattr(nv_backend, "COPY_THRESHOLD", 4096)
    monkeypatch.setattr(st, "STAGING_BYTES", 64 << 10)  # parameters: 256 KiB in 4 chunks
    backend, gpu = _open(monkeypatch)
    table = np.arange(256 * 256, dtype=np.float32).tobytes()
    backend.write_tensor("parameters", table)
    stream = backend._stream
    assert stream is not None and stream.copies and stream.copy_object
    arena = backend.blocks["arena"]
    start = backend._arena_offset("parameters", 0, len(table))
    assert arena.read(start, len(table)) == table  # the fake copy engine put it there
    arena.write(start, table[::-1])  # what the GPU would have computed
    assert backend.read_tensor("parameters") == table[::-1]
    # 4 chunks in + 4 chunks out, each waited for by its own counter value.
    assert stream.counter == stream.completed == 8
    small = backend.read_tensor("initial_loss")  # below the threshold: read through BAR1
    assert stream.counter == 8 and len(small) == backend.plan.tensor("initial_loss").bytes < 4096
    backend.close()


def test_a_large_read_lands_in_a_described_host_buffer_handed_out_as_the_tables(monkeypatch):
    monkeypatch.setattr(nv_backend, "COPY_THRESHOLD", 4096)
    backend, gpu = _open(monkeypatch)
    driver = backend.client.transport.handler.__self__
    names = ("parameters", "first_moment", "initial_loss")
    written = {name: np.random.default_rng(len(name)).integers(
        0, 255, backend.plan.tensor(name).bytes, np.uint8) for name in names}
    for name, data in written.items():
        backend.write_tensor(name, data)
    staging = set(driver.host_memory)  # the staging is process memory described once too
    tables = backend.begin_read(names).wait()
    for name in names:
        assert np.array_equal(tables[name], written[name])
    (landing, (address, size, _, _)), = {h: m for h, m in driver.host_memory.items()
                                         if h not in staging}.items()
    # The tables are views of the described buffer itself, packed in the order asked.
    assert tables["parameters"].ctypes.data == address and address % 4096 == 0
    assert size >= sum(len(t) for t in tables.values())
    del tables
    again = backend.begin_read(names).wait()  # the buffer came back: no new description
    assert len(driver.host_memory) == len(staging) + 1
    assert again["parameters"].ctypes.data == address
    backend.close()
    assert landing in driver.freed  # closing releases the description; the arrays stay
    assert np.array_equal(again["first_moment"], written["first_moment"])


def test_a_read_copies_neighbouring_tensors_as_one_piece(monkeypatch):
    """An invocation's read: the three tables lie together in the arena (one copy), the
    losses and health counts together (another); every tensor comes back as written."""
    from bob.config import CHECKPOINT_TENSORS, RESULT_TENSORS
    from bob.program.bob import HEALTH_TENSOR

    monkeypatch.setattr(nv_backend, "COPY_THRESHOLD", 4096)
    backend, gpu = _open(monkeypatch)
    names = (*RESULT_TENSORS, HEALTH_TENSOR, *CHECKPOINT_TENSORS)
    written = {name: np.random.default_rng(len(name)).integers(
        0, 255, backend.plan.tensor(name).bytes, np.uint8) for name in names}
    for name, data in written.items():
        backend.write_tensor(name, data)
    stream = backend._stream
    assert stream is not None
    queued: list[list[tuple[int, int, int]]] = []
    queue_copies = stream.queue_copies
    monkeypatch.setattr(stream, "queue_copies",
                        lambda pieces: queued.append(pieces) or queue_copies(pieces))
    tables = backend.begin_read(names).wait()
    assert all(np.array_equal(tables[name], written[name]) for name in names)
    (pieces,) = queued
    assert sorted(size for _, _, size in pieces)[-1] == 3 * backend.plan.tensor(
        "parameters").bytes and len(pieces) == 2
    backend.close()


def test_a_read_while_every_landing_buffer_is_held_goes_through_the_staging(monkeypatch):
    monkeypatch.setattr(nv_backend, "COPY_THRESHOLD", 4096)
    backend, gpu = _open(monkeypatch)
    table = np.arange(256 * 256, dtype=np.float32)
    backend.write_tensor("parameters", table)
    held = [backend.begin_read(["parameters"]).wait() for _ in range(4)]
    assert len({h["parameters"].ctypes.data for h in held}) == 4  # LANDING_BUFFERS
    extra = backend.begin_read(["parameters"]).wait()["parameters"]
    assert extra.ctypes.data not in {h["parameters"].ctypes.data for h in held}
    assert np.array_equal(extra.view(np.float32), table)
    backend.close()


def test_a_refused_os_descriptor_leaves_the_staging_in_rm_memory(monkeypatch):
    from bob.backends.nv.rm import structs as s

    monkeypatch.setattr(nv_backend, "COPY_THRESHOLD", 4096)
    gpu = FakeGpu(monkeypatch)
    driver = FakeDriver(refuse={s.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: 0x51})
    backend = nv_backend.NvBackend(bob_plan(1, 2, target=_sm90(), compiled=True, registers=24,
                                            shared_bytes=2048),
                                   transport=driver.transport(), deadline_s=0.01)
    gpu.backend = backend
    table = np.arange(256 * 256, dtype=np.float32).tobytes()
    backend.write_tensor("parameters", table)
    assert "RM system memory" in backend.stream.staging_note
    assert "NV_ERR_NO_MEMORY" in backend.stream.staging_note
    assert backend.read_tensor("parameters") == table
    backend.close()


def test_small_plans_never_set_up_the_stream(monkeypatch):
    backend, gpu = _open(monkeypatch)
    backend.write_tensor("parameters", bytes(256 * 256 * 4))  # 256 KiB < 1 MiB
    backend.read_tensor("parameters")
    assert backend._stream is None
    backend.close()


def test_the_counter_runs_past_2_to_the_32(monkeypatch):
    monkeypatch.setattr(nv_backend, "COPY_THRESHOLD", 4096)
    backend, gpu = _open(monkeypatch, counter_start=2**32 - 2)
    for _ in range(3):
        backend.read_tensor("parameters")
    assert backend._stream.completed == 2**32 + 1  # three reads: 64 bits, no wrap
    backend.close()


def test_a_gpu_without_the_copy_class_reads_through_bar1(monkeypatch):
    from nv_fakes import HOPPER_CLASSES

    monkeypatch.setattr(nv_backend, "COPY_THRESHOLD", 4096)
    gpu = FakeGpu(monkeypatch)
    driver = FakeDriver(classes=tuple(c for c in HOPPER_CLASSES if c != 0xC8B5))
    backend = nv_backend.NvBackend(bob_plan(1, 2, target=_sm90(), compiled=True, registers=24,
                                            shared_bytes=2048),
                                   transport=driver.transport(), deadline_s=0.01)
    gpu.backend = backend
    backend.write_tensor("parameters", b"\x01" * (256 * 256 * 4))
    assert backend.read_tensor("parameters") == b"\x01" * (256 * 256 * 4)
    assert not backend._stream.copies
    assert backend._stream.copy_refused == "this GPU lists no HOPPER_DMA_COPY_A"
    backend.close()


def test_profiling_brackets_every_launch_with_timestamps(monkeypatch):
    backend, gpu = _open(monkeypatch)
    plan = backend.plan
    assert backend.can_profile
    times = backend.profile(range(plan.submission_count))
    # The fake GPU spends 1 us * (launch + 1) on each launch; the stamps say exactly that.
    # (A plan may submit a launch twice: the forward pass before and after training.)
    order = [s.first_launch for s in plan.submissions]
    assert len(order) > plan.launch_count
    assert times == [(i, 1000 * (i + 1)) for i in order]
    assert gpu.launches == order
    assert backend.last_semaphore == plan.submissions[-1].semaphore
    # A second profiled run reuses the buffer; payloads continue.
    assert backend.profile(range(2, 4)) == [(i, 1000 * (i + 1)) for i in order[2:4]]
    monkeypatch.setattr(st, "PROFILE_LIMIT", 3)  # a run longer than the buffer: in fills
    assert backend.profile(range(plan.submission_count)) == [(i, 1000 * (i + 1))
                                                             for i in order]
    assert backend.profile(range(0)) == []
    backend.close()


def test_profiling_refuses_a_chained_plan(monkeypatch):
    from bob.program.bob import BobConfig, build_plan
    from conftest import stand_in_regions

    config = BobConfig(vocab=256, prompts=1, updates=2, submission="chained")
    plan = build_plan(config, _sm90(), compiled=stand_in_regions(config, registers=24,
                                                                 shared_bytes=2048))
    backend, gpu = _open(monkeypatch, plan)
    with pytest.raises(RunFailure, match="profiling times one launch per submission; "
                       "submission 0 has"):
        backend.profile(range(plan.submission_count))
    backend.close()


def test_a_channel_error_names_the_launch_and_closes_the_backend(monkeypatch):
    backend, gpu = _open(monkeypatch, error_after_launch=0)
    plan = backend.plan
    label = plan.launches[0].label or plan.launches[0].region
    with pytest.raises(ioctl.ChannelError) as raised:
        backend.run(range(plan.submission_count))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"launch 0 ({label}) failed with channel error 13 (graphics "
                              "engine exception")
    assert message.endswith("the nv backend closed its channel and memory")
    assert backend.channel is None and backend.blocks == {} and backend.client is None
    with pytest.raises(RunFailure, match="the nv backend is closed after: launch 0"):
        backend.read_tensor("parameters")
    backend.close()  # a second close is harmless
    again, _ = _open(monkeypatch)  # the next backend in the same process opens
    again.close()


@needs_nvrtc
def test_the_trap_region_is_a_test_helper_certified_like_any_plan():
    from bob.backends.nv.decoder import disassemble
    from bob.backends.nv.encoder import encode
    from bob.kernels.cuda.regions import bob_declared_regions
    from bob.plan.certificate import require_certified
    from trap_plan import TRAP_MAGIC, one_launch_plan, trap_regions

    region = trap_regions("sm_90")["test-trap"]
    assert region.code and region.entry == "bob_test_trap"
    assert "test-trap" not in {r.name for r in bob_declared_regions()}  # not Bob's
    plan = one_launch_plan(region, TRAP_MAGIC)
    certified = require_certified(plan)
    assert (plan.launch_count, plan.submission_count) == (1, 1)
    assert "trap-test-0" in disassemble(encode(certified), plan)


def test_staging_memory_is_cached_and_semaphore_memory_is_not():
    from bob.backends.nv.rm import memory
    from bob.backends.nv.rm import structs as s

    def coherency(cached: bool) -> int:
        _, params = memory._physical_params(4096, "sysmem", False, 1, cached)
        return params.attr >> s.NVOS32_ATTR_COHERENCY_SHIFT & 0x7

    assert coherency(False) == s.NVOS32_ATTR_COHERENCY_UNCACHED
    assert coherency(True) == s.NVOS32_ATTR_COHERENCY_CACHED


def test_a_faulting_copy_is_named_as_the_copy(monkeypatch):
    monkeypatch.setattr(nv_backend, "COPY_THRESHOLD", 4096)
    backend, gpu = _open(monkeypatch, error_on_copy=True)
    with pytest.raises(ioctl.ChannelError, match=r"^copy-engine batch 1 failed with channel "
                       r"error 31 \(MMU fault"):
        backend.read_tensor("parameters")
    with pytest.raises(RunFailure, match="the nv backend is closed after: copy-engine batch 1"):
        backend.set_scalars(0, {})
    backend.close()


def test_without_a_runtime_area_large_reads_stay_on_bar1(monkeypatch):
    def refused(*args, **kwargs):
        raise ioctl.RmStatusError("RM_ALLOC(NV01_MEMORY_SYSTEM under 0x1)", "NV_ERR_NO_MEMORY",
                                  "no memory", 0x51)

    monkeypatch.setattr(nv_backend, "COPY_THRESHOLD", 4096)
    monkeypatch.setattr(nv_backend, "RuntimeStream", refused)
    backend, gpu = _open(monkeypatch)
    backend.write_tensor("parameters", b"\x02" * (256 * 256 * 4))
    assert backend.read_tensor("parameters") == b"\x02" * (256 * 256 * 4)
    assert "NV_ERR_NO_MEMORY" in backend._no_stream
    backend.close()


# -- the runtime stream as a queue ------------------------------------------------------------


def test_an_acquire_waits_for_a_64_bit_value_as_clc56f_defines_it():
    pushbuffer = Pushbuffer(0x1000, 0x2000)
    CommandWriter(pushbuffer, HOPPER_COMPUTE_A, HOPPER_CHANNEL_GPFIFO_A).acquire_semaphore(
        0x10_0010_0008, 2**32 + 5)
    words = _words(pushbuffer)
    # SEM_ADDR_LO .. SEM_EXECUTE: five consecutive host methods from 0x5c on subchannel 0.
    assert words[0] == incrementing_header(0, 0x5C, 5)
    assert words[1:5] == [0x0010_0008, 0x10, 5, 1]
    # OPERATION ACQ_CIRC_GEQ (3, bits 2:0), PAYLOAD_SIZE 64BIT (bit 24), no release bits.
    assert words[5] == 3 | 1 << 24
    execute = _calls(words)[-1]
    assert execute.field("OPERATION").value == 3
    assert {f.name: f.value_name for f in execute.fields}["PAYLOAD_SIZE"] == "64BIT"
    with pytest.raises(CommandError, match="not 8-byte aligned"):
        CommandWriter(pushbuffer, HOPPER_COMPUTE_A, HOPPER_CHANNEL_GPFIFO_A).acquire_semaphore(
            0x10_0010_0004, 1)


def _tensor_bytes(backend, name: str) -> bytes:
    size = backend.plan.tensor(name).bytes
    return backend.blocks["arena"].read(backend._arena_offset(name, 0, size), size)


def test_queued_work_runs_in_the_order_it_was_queued(monkeypatch):
    backend, gpu = _open(monkeypatch)  # this fake GPU runs what it was handed when waited on
    before = np.full(256 * 256, 1.0, np.float32).tobytes()
    after = np.full(256 * 256, 2.0, np.float32).tobytes()
    backend.write_tensor("parameters", before)  # nothing queued: straight into the mapping
    backend.start(range(backend.plan.submission_count))
    read = backend.begin_read(["parameters", "first_moment"])  # queued behind the run
    backend.write_tensor("parameters", after)  # staged, queued behind the read
    assert gpu.launches == [] and _tensor_bytes(backend, "parameters") == before
    tables = read.wait()
    assert tables["parameters"].tobytes() == before  # the state the run left, not the write
    assert gpu.launches  # the run went first
    backend.wait()
    assert _tensor_bytes(backend, "parameters") == after
    # Each item acquired the value of the one before: run, read, write.
    assert gpu.acquires == [0, 1, 2]
    assert backend._stream.completed == backend._stream.counter == 3
    backend.close()


def test_a_write_slot_is_reused_only_after_its_copy_ran(monkeypatch):
    backend, gpu = _open(monkeypatch)
    backend.start(range(backend.plan.submission_count))
    chunks = [bytes([index]) * 4096 for index in range(3 * st.WRITE_SLOTS)]  # three rounds
    for index, chunk in enumerate(chunks):
        backend.write_tensor("parameters", chunk, offset=index * 4096)
    backend.wait()
    assert _tensor_bytes(backend, "parameters")[:len(chunks) * 4096] == b"".join(chunks)
    assert backend._stream.counter == 1 + len(chunks)
    backend.close()


@pytest.mark.parametrize("bind", [False, True])
@pytest.mark.parametrize("count", [1, 3, st.PIECES_PER_SEGMENT])
def test_segments_from_templates_are_the_words_the_builders_write(bind, count):
    """The runtime stream encodes each distinct copy segment once and writes only its
    values after: every value the builders would write lands where they would."""
    rng = np.random.default_rng(count)
    pieces = [(int(rng.integers(0, 1 << 48)), int(rng.integers(0, 1 << 48)),
               int(rng.integers(1, st.COPY_PIECE_BYTES))) for _ in range(count)]
    for after, payload in ((0, 1), (5, 6), ((1 << 32) - 1, 1 << 32),
                           (int(rng.integers(0, 1 << 63)), (1 << 64) - 1)):
        for release_to in (st.COUNTER_ADDRESS, st.READS_ADDRESS):
            assert st.copy_segment(st.RUNTIME_BLOCK_VA, pieces, after, payload, bind=bind,
                                   release_to=release_to) == st.encode_copy_segment(
                st.RUNTIME_BLOCK_VA, pieces, after, payload, bind=bind, release_to=release_to)
        assert st.acquire_segment(st.RUNTIME_BLOCK_VA, after) == \
            st.encode_acquire_segment(st.RUNTIME_BLOCK_VA, after)
        assert st.release_segment(st.RUNTIME_BLOCK_VA, payload) == \
            st.encode_release_segment(st.RUNTIME_BLOCK_VA, payload)


@pytest.mark.parametrize("value", [-1, 1 << 64, True, 2.0])
def test_a_templated_segment_refuses_a_value_the_builders_refuse(value):
    with pytest.raises(CommandError, match="does not fit 64 bits"):
        st.copy_segment(st.RUNTIME_BLOCK_VA, [(0, 4096, 8)], value, 1)
    with pytest.raises(CommandError, match="does not fit 64 bits"):
        st.copy_segment(st.RUNTIME_BLOCK_VA, [(0, 4096, 8)], 1, value)
    with pytest.raises(CommandError, match="does not fit 64 bits"):
        st.acquire_segment(st.RUNTIME_BLOCK_VA, value)
    with pytest.raises(CommandError, match="does not fit 64 bits"):
        st.encode_acquire_segment(st.RUNTIME_BLOCK_VA, value)


def test_small_writes_in_one_batch_are_one_slot_and_one_queued_copy_item(monkeypatch):
    backend, gpu = _open(monkeypatch)
    backend.start(range(backend.plan.submission_count))
    rng = np.random.default_rng(3)
    writes = [(name, rng.integers(0, 256, backend.plan.tensor(name).bytes, np.uint8).tobytes())
              for name in ("input", "training_loss", "health")]
    backend.write_tensors(writes)
    assert all(_tensor_bytes(backend, name) != data for name, data in writes)  # still queued
    backend.wait()
    for name, data in writes:
        assert _tensor_bytes(backend, name) == data, name
    assert backend._stream.counter == 2 and gpu.acquires == [0, 1]  # the run, the batch
    assert backend._stream._next_slot == 1
    with pytest.raises(ValueError, match="queued writes are 1 to"):
        backend._stream.queue_writes([(0, memoryview(b"x")), (8, memoryview(b""))])
    backend.close()


def test_small_and_host_side_access_waits_for_the_queue_first(monkeypatch):
    monkeypatch.setattr(nv_backend, "WRITE_SLOT_BYTES", 64 << 10)
    backend, gpu = _open(monkeypatch)
    count = backend.plan.submission_count
    backend.start(range(count))
    small = backend.begin_read(["initial_loss"])  # below QUEUED_READ_MIN_BYTES: waits, reads
    assert gpu.launches and not backend._stream.pending
    assert len(small.wait()["initial_loss"]) == backend.plan.tensor("initial_loss").bytes
    backend.start(range(count))
    backend.read_tensor("parameters")
    assert not backend._stream.pending
    backend.start(range(count))
    backend.write_tensor("parameters", bytes(256 << 10))  # larger than a write slot: waits
    assert not backend._stream.pending
    backend.close()


def test_closing_lets_queued_work_finish_before_memory_goes(monkeypatch):
    backend, gpu = _open(monkeypatch)
    backend.start(range(backend.plan.submission_count))
    backend.write_tensor("parameters", bytes(4096))
    stream = backend._stream
    assert stream.pending
    drained = []
    original = st.RuntimeStream.drain
    monkeypatch.setattr(st.RuntimeStream, "drain", lambda stream: drained.append(
        (stream.counter, stream.completed)) or original(stream))
    backend.close()
    assert drained == [(2, 0)]  # waited for both items before anything was freed
    assert gpu.launches and gpu.acquires == [0, 1]


def test_a_patch_of_the_parameter_blocks_waits_for_the_queued_runs(monkeypatch):
    """Queued launches read the parameter blocks: a patch writes them only once the queue
    is drained (one AdamW launch, set_scalars and set_scalars_many)."""
    import numpy as np

    from bob.backends.nv.rm.memory import Allocation
    from bob.config import Hyper
    from bob.program.bob import ADAM_SCALAR_NAMES, BobConfig, adam_scalar_table, adam_scalars

    backend, gpu = _open(monkeypatch)
    seen: list[bool] = []
    original, original_words = Allocation.write, Allocation.store_words

    def write(block, offset, data):
        if block.name == "program":
            seen.append(backend._stream.pending)
        original(block, offset, data)

    def store_words(block, offset, indices, values):
        if block.name == "program":
            seen.append(backend._stream.pending)
        original_words(block, offset, indices, values)

    monkeypatch.setattr(Allocation, "write", write)
    monkeypatch.setattr(Allocation, "store_words", store_words)
    count = backend.plan.submission_count
    config = BobConfig(vocab=256, prompts=1, updates=2)
    launch = config.adamw_launch(1)
    backend.start(range(count))
    backend.set_scalars(launch, adam_scalars(Hyper(lr=0.05), 9))
    backend.start(range(count))
    bits = adam_scalar_table(Hyper(lr=0.07), 3, 2).view(np.uint32)[:, :len(ADAM_SCALAR_NAMES)]
    backend.set_scalars_many([config.adamw_launch(k) for k in range(2)], ADAM_SCALAR_NAMES,
                             bits)
    assert seen and not any(seen)  # every write to the blocks came after the drain
    assert gpu.acquires == [0, 1]  # both runs were queued and ran
    backend.close()


# -- detached reads: a snapshot by the copy kernels, the copy out on the copy channel ------

CHECKPOINT = ("parameters", "first_moment", "second_moment")


def _detached(monkeypatch, **options):
    monkeypatch.setattr(nv_backend.NvBackend, "snapshot_min_bytes", 4096)
    backend, gpu = _open(monkeypatch, **options)
    tables = {name: np.random.default_rng(len(name)).integers(
        0, 255, backend.plan.tensor(name).bytes, np.uint8) for name in CHECKPOINT}
    for name, data in tables.items():
        backend.write_tensor(name, data)  # nothing queued: straight into the mapping
    return backend, gpu, tables


@needs_nvrtc
def test_a_large_read_is_detached_and_the_next_run_waits_for_its_snapshot_only(monkeypatch):
    backend, gpu, tables = _detached(monkeypatch)
    count = backend.plan.submission_count
    backend.start(range(count))  # counter 1
    read = backend.begin_read(CHECKPOINT)  # the snapshot: counter 2; the copy out: reads 1
    later = np.full(backend.plan.tensor("parameters").bytes, 7, np.uint8)
    backend.write_tensor("parameters", later)  # queued behind the snapshot: counter 3
    backend.start(range(count))  # counter 4
    stream = backend._stream
    assert stream.copy_channel is not None and stream.copy_channel.engine == 0x9
    assert (stream.counter, stream.reads) == (4, 1) and gpu.launches == []
    got = read.wait()
    for name in CHECKPOINT:  # the state the first run left, not the write queued after
        assert np.array_equal(got[name], tables[name])
    assert stream.completed_reads == 1
    backend.wait()
    assert np.array_equal(np.frombuffer(_tensor_bytes(backend, "parameters"), np.uint8), later)
    counter, reads = st.COUNTER_ADDRESS, st.READS_ADDRESS
    # Run 1; the snapshot, after run 1 and after no read; the copy out, after the snapshot;
    # the write and run 2 after the item before them, never after the copy out.
    order = list(gpu.acquired)
    assert sorted(order) == sorted([(counter, 0), (counter, 1), (reads, 0), (counter, 2),
                                    (counter, 2), (counter, 3)])
    assert order.index((reads, 0)) == order.index((counter, 1)) + 1  # the snapshot's two
    # The three tensors are neighbours in the arena: one kernel copy, one copy out.
    arena = backend.blocks["arena"].gpu_va
    first = min(backend._arena_offset(name, 0, 1) for name in CHECKPOINT)
    end = sum(backend.plan.tensor(name).bytes for name in CHECKPOINT)
    assert gpu.kernel_copies == [(arena + first, nv_backend.SNAPSHOT_VA, end)]
    snapshot = backend._snapshot
    again = backend.begin_read(CHECKPOINT).wait()  # the same snapshot, after read 1's copy
    assert backend._snapshot is snapshot and len(gpu.kernel_copies) == 2
    assert gpu.acquired[-3:] == [(counter, 4), (reads, 1), (counter, 5)]
    assert np.array_equal(again["parameters"], later)
    assert all(np.array_equal(again[name], tables[name]) for name in CHECKPOINT[1:])
    backend.close()


@needs_nvrtc
def test_the_copy_kernels_qmds_are_written_once_for_the_same_copies(monkeypatch):
    from bob.backends.nv.rm.memory import Allocation

    backend, gpu, _ = _detached(monkeypatch)
    backend.begin_read(CHECKPOINT).wait()
    snapshots = backend._stream.snapshots
    writes: list[int] = []
    original = Allocation.write
    monkeypatch.setattr(Allocation, "write", lambda block, offset, data: (
        writes.append(offset) if block is snapshots.block else None,
        original(block, offset, data))[1])
    backend.begin_read(CHECKPOINT).wait()
    assert writes == []  # the same tensors: the QMD and its bank as they were
    got = backend.begin_read(CHECKPOINT[1:]).wait()  # other copies: written again
    assert writes == [st_snapshot.BANKS_OFFSET, st_snapshot.QMDS_OFFSET]
    assert set(got) == set(CHECKPOINT[1:])
    backend.close()


@needs_nvrtc
def test_a_copy_kernel_launch_is_a_qmd_the_decoder_reads_back(monkeypatch):
    from bob.backends.nv.encoder import DRIVER_AREA

    backend, gpu, _ = _detached(monkeypatch)
    stream = backend.stream
    assert stream.detaches()
    snapshots = stream.snapshots
    copies = ((0x20_0100_0000, 0x10_4000_0000, 1 << 20),  # 16-byte units
              (0x20_0200_0004, 0x10_5000_0004, 4096 + 4))  # 4-byte units
    addresses = snapshots.write(copies)
    assert addresses == [st_snapshot.KERNELS_VA + st_snapshot.QMDS_OFFSET + i * 512
                         for i in range(2)]
    for address, (source, destination, size), (entry, unit) in zip(
            addresses, copies, [("bob_copy_16", 16), ("bob_copy_4", 4)], strict=True):
        record = snapshots.block.read(address - st_snapshot.KERNELS_VA, 384)
        dispatch = decoder.decode_qmd(record, 0xCBC0).dispatch()
        kernel = snapshots.kernels[entry].kernel
        assert dispatch.program_address == snapshots.code_address[entry]
        assert dispatch.block == (256, 1, 1) and dispatch.registers == kernel.registers
        assert dispatch.releases == () and dispatch.dependents == ()
        blocks = min(st_snapshot.MAX_BLOCKS, -(-(size // unit) // 256))
        assert dispatch.grid == (blocks, 1, 1)
        bank, bank_size = dispatch.constant_buffers[0]
        data = snapshots.block.read(bank - st_snapshot.KERNELS_VA, bank_size)
        assert DRIVER_AREA.unpack_from(data)[:6] == (256, 1, 1, blocks, 1, 1)
        assert st_snapshot.COPY_ARGUMENTS.unpack_from(data, kernel.parameter_base) == (
            source, destination, size // unit)
    backend.close()


@needs_nvrtc
def test_runs_and_patches_wait_for_the_queue_not_for_a_copy_out(monkeypatch):
    """The copy out reads only the snapshot: later runs, arena writes and parameter-block
    patches wait for the compute channel's queue, never for the copy to the host."""
    from bob.config import Hyper
    from bob.program.bob import BobConfig, adam_scalars

    backend, gpu, tables = _detached(monkeypatch)
    waited = []
    original = st.RuntimeStream.wait_for_read
    monkeypatch.setattr(st.RuntimeStream, "wait_for_read", lambda stream, target, what="":
                        waited.append(target) or original(stream, target, what))
    count = backend.plan.submission_count
    backend.start(range(count))
    read = backend.begin_read(CHECKPOINT)
    backend.wait()  # the run and the snapshot
    stream = backend._stream
    assert stream.completed == stream.counter == 2
    backend.set_scalars(BobConfig(vocab=256, prompts=1, updates=2).adamw_launch(1),
                        adam_scalars(Hyper(lr=0.05), 9))
    backend.write_tensor("parameters", bytes(4096))
    backend.run(range(count))
    assert waited == []  # nothing waited for the copy out (this fake GPU ran it anyway)
    got = read.wait()
    assert waited == [1] and all(np.array_equal(got[n], tables[n]) for n in CHECKPOINT)
    backend.close()


@needs_nvrtc
def test_closing_and_new_landing_buffers_wait_for_a_detached_read(monkeypatch):
    backend, gpu, _ = _detached(monkeypatch)
    waited = []
    original = st.RuntimeStream.wait_for_read
    monkeypatch.setattr(st.RuntimeStream, "wait_for_read", lambda stream, target, what="":
                        waited.append(target) or original(stream, target, what))
    backend.begin_read(CHECKPOINT)
    assert waited == [] and backend._stream.reads == 1
    backend.begin_read(CHECKPOINT[:2])  # another size: the old buffers go once it landed
    assert waited == [1] and backend._stream.reads == 2
    backend.close()
    assert waited == [1, 2] and backend._snapshot is None


@needs_nvrtc
def test_a_read_with_no_snapshot_to_be_had_goes_in_the_queues_order(monkeypatch):
    backend, gpu, tables = _detached(monkeypatch)
    allocate = nv_backend.allocate

    def no_video_memory(device, size, **options):
        if options.get("name") == "read snapshot":
            raise ioctl.RmError("NV01_MEMORY_LOCAL_USER", "NV_ERR_NO_MEMORY", "out of memory")
        return allocate(device, size, **options)

    monkeypatch.setattr(nv_backend, "allocate", no_video_memory)
    for _ in range(2):  # refused once, not asked again at the same size
        got = backend.begin_read(CHECKPOINT).wait()
        assert all(np.array_equal(got[name], tables[name]) for name in CHECKPOINT)
    stream = backend._stream
    assert backend._snapshot is None and stream.reads == 0 and stream.counter == 2
    assert backend._no_snapshot > 0 and gpu.kernel_copies == []
    backend.close()


def test_without_a_copy_engine_reads_stay_in_order_and_say_why(monkeypatch):
    monkeypatch.setattr(nv_backend.NvBackend, "snapshot_min_bytes", 4096)
    gpu = FakeGpu(monkeypatch)
    driver = FakeDriver(engines=(s.NV2080_ENGINE_TYPE_GRAPHICS,))
    backend = nv_backend.NvBackend(bob_plan(1, 2, target=_sm90(), compiled=True, registers=24,
                                            shared_bytes=2048),
                                   transport=driver.transport(), deadline_s=0.01)
    gpu.backend = backend
    table = np.arange(256 * 256, dtype=np.float32)
    backend.write_tensor("parameters", table.tobytes())
    got = backend.begin_read(CHECKPOINT).wait()
    assert np.array_equal(got["parameters"].view(np.float32), table)
    stream = backend._stream
    assert "the GPU lists no copy engine" in stream.detach_refused
    assert stream.copy_channel is None and stream.reads == 0 and stream.counter == 1
    backend.close()


def test_without_the_copy_kernels_reads_stay_in_order_and_the_copy_channel_goes(monkeypatch):
    from bob.kernels.cuda.compile import NvrtcError

    def no_nvrtc(device):
        raise NvrtcError("import cuda.bindings.nvrtc", "ModuleNotFoundError",
                         "install nvidia-cuda-nvrtc")

    monkeypatch.setattr(st, "SnapshotKernels", no_nvrtc)
    backend, gpu, tables = _detached(monkeypatch)
    driver = backend.client.transport.handler.__self__
    got = backend.begin_read(CHECKPOINT).wait()
    assert all(np.array_equal(got[name], tables[name]) for name in CHECKPOINT)
    stream = backend._stream
    assert "install nvidia-cuda-nvrtc" in stream.detach_refused
    assert stream.copy_channel is None and stream.reads == 0 and stream.counter == 1
    groups = [h for h, (cls, _) in driver.objects.items() if cls == s.KEPLER_CHANNEL_GROUP_A]
    assert len(groups) == 2 and groups[1] in driver.freed  # the copy channel's, given up
    assert backend.begin_read(CHECKPOINT).wait() and stream.counter == 2  # not asked again
    assert len([h for h, (c, _) in driver.objects.items() if c == s.KEPLER_CHANNEL_GROUP_A]) == 2
    backend.close()


def test_a_copy_channel_tries_each_copy_engine_and_names_every_refusal():
    driver = FakeDriver(engines=(1, 0x9, 0xA, 0x13))
    refused = []
    original = driver.alloc

    def alloc(request):  # RM refuses a channel on COPY0 and COPY1, as it may on some parts
        if request.hClass == s.HOPPER_CHANNEL_GPFIFO_A:
            params = s.NV_CHANNEL_ALLOC_PARAMS.from_address(request.pAllocParms)
            refused.append(params.engineType)
            request.status = 0x1F
            return
        original(request)

    driver.alloc = alloc
    from bob.backends.nv.rm.device import RmClient, RmDevice

    device = RmDevice(RmClient(driver.transport()))
    with pytest.raises(ioctl.RmError) as raised:
        ch.copy_channel(device, st.COPY_RING_VA)
    assert refused == [0x9, 0xA]  # the copy engines only, each named in its channel
    message = str(raised.value)
    assert "COPY0: RM_ALLOC(HOPPER_CHANNEL_GPFIFO_A" in message and "COPY1:" in message
    # The groups of the refused channels were freed.
    groups = [h for h, (cls, _) in driver.objects.items() if cls == s.KEPLER_CHANNEL_GROUP_A]
    assert sorted(groups) == sorted(h for h in driver.freed if h in groups) and len(groups) == 2


@needs_nvrtc
def test_a_detached_read_refuses_copies_out_one_segment_cannot_hold(monkeypatch):
    backend, gpu, _ = _detached(monkeypatch)
    stream = backend.stream
    assert stream.detaches()
    piece = (0x1000, 0x2000, 4096)
    with pytest.raises(ValueError, match="copy out is 1 to 64 copies"):
        stream.queue_detached_read((piece,), [piece] * 65)
    with pytest.raises(ValueError, match="copy out is 1 to 64 copies"):
        stream.queue_detached_read((piece,), [])
    with pytest.raises(ValueError, match="a snapshot is 1 to 64 copies"):
        stream.queue_detached_read((piece,) * 65, [piece])
    assert (stream.counter, stream.reads) == (0, 0)  # nothing was queued
    backend.close()


@needs_nvrtc
def test_a_fault_on_the_compute_channel_ends_a_wait_for_a_detached_read(monkeypatch):
    monkeypatch.setattr(nv_backend, "COPY_WAIT_SLICE_S", 0.001)
    backend, gpu, _ = _detached(monkeypatch, error_after_launch=0)
    backend.start(range(backend.plan.submission_count))
    read = backend.begin_read(CHECKPOINT)
    with pytest.raises(ioctl.ChannelError, match="channel error 13") as raised:
        read.wait()
    assert "closed its channel and memory" in str(raised.value)
    assert backend.channel is None


# -- clears and streamed reads (the base class's contract, nv's primitives) ------------------


def test_a_clear_behind_queued_work_is_one_queued_copy_item_after_it(monkeypatch):
    backend, gpu = _open(monkeypatch)
    names = ("training_loss", "health", "parameters")
    for name in names:  # nothing queued: straight into the mapping
        backend.write_tensor(name, b"\x05" * backend.plan.tensor(name).bytes)
    backend.start(range(backend.plan.submission_count))
    backend.clear_tensors(names)  # behind the run: staged zeros, one queued copy item
    assert all(_tensor_bytes(backend, name) != bytes(backend.plan.tensor(name).bytes)
               for name in names)  # still queued
    backend.wait()
    for name in names:
        assert _tensor_bytes(backend, name) == bytes(backend.plan.tensor(name).bytes), name
        assert backend.read_tensor(name) == _tensor_bytes(backend, name)
    stream = backend._stream
    assert stream.counter == 2 and gpu.acquires == [0, 1]  # the run, then the clear
    assert backend.read_tensor("first_moment") == bytes(backend.plan.tensor(
        "first_moment").bytes)  # never written, never cleared: as the arena began
    backend.close()


def test_an_idle_clear_goes_through_the_mapping_or_the_copy_engine(monkeypatch):
    monkeypatch.setattr(nv_backend, "COPY_THRESHOLD", 4096)
    backend, gpu = _open(monkeypatch)
    for name in ("health", "parameters"):
        backend.write_tensor(name, b"\x07" * backend.plan.tensor(name).bytes)
    counter = backend._stream.counter  # the large write went by copy engine
    backend.clear_tensors(["health"])  # 24 bytes, nothing queued: through the mapping
    assert backend._stream.counter == counter
    assert _tensor_bytes(backend, "health") == bytes(24)
    backend.clear_tensors(["parameters"])  # large: the copy engine, from a zeroed slot
    assert backend._stream.counter == counter + 1
    assert backend.read_tensor("parameters") == bytes(backend.plan.tensor("parameters").bytes)
    backend.close()


def test_zeros_over_many_slots_worth_are_queued_in_batches(monkeypatch):
    monkeypatch.setattr(st, "WRITE_SLOT_BYTES", 4096)
    monkeypatch.setattr(st, "PIECES_PER_SEGMENT", 4)
    backend, gpu = _open(monkeypatch)
    backend.write_tensor("parameters", b"\x09" * backend.plan.tensor("parameters").bytes)
    backend.start(range(backend.plan.submission_count))
    backend.clear_tensors(["parameters"])  # 64 pieces of 4 KiB, 4 to a segment, 31 a batch
    backend.wait()
    assert _tensor_bytes(backend, "parameters") == bytes(backend.plan.tensor(
        "parameters").bytes)
    with pytest.raises(ValueError, match="at least 1 byte"):
        backend.stream.queue_zeros([(0x1000, 0)])
    backend.close()


def _streamed(backend, names, chunk):
    got: dict[str, bytearray] = {}
    views: list[int] = []

    def sink(name: str, offset: int, view: np.ndarray) -> None:
        assert 0 < view.size <= chunk and offset == len(got.setdefault(name, bytearray()))
        views.append(view.ctypes.data)
        got[name] += view.tobytes()

    backend.stream_read(names, sink, chunk)
    return {name: bytes(data) for name, data in got.items()}, views


@needs_nvrtc
def test_a_streamed_read_crosses_from_a_snapshot_through_a_ring(monkeypatch):
    backend, gpu, tables = _detached(monkeypatch)
    driver = backend.client.transport.handler.__self__
    backend.start(range(backend.plan.submission_count))
    before = set(driver.host_memory)  # the runtime stream's own, described as it is made
    chunk = 64 << 10
    got, views = _streamed(backend, list(reversed(CHECKPOINT)), chunk)
    assert list(got) == list(CHECKPOINT)  # arena order
    assert got == {name: tables[name].tobytes() for name in CHECKPOINT}
    stream = backend._stream
    pieces = sum(-(-len(tables[name]) // chunk) for name in CHECKPOINT)
    assert stream.reads == pieces and len(views) == pieces  # one copy out per chunk
    assert len(gpu.kernel_copies) == 1  # one snapshot of the three neighbours
    # The host memory described for it: the ring, a chunk a buffer, and nothing more.
    ring = {address for handle, (address, size, _, _) in driver.host_memory.items()
            if handle not in before}
    assert len(ring) == STREAM_RING_BUFFERS and set(views) <= ring
    backend.close()


def test_a_streamed_read_without_a_snapshot_goes_in_the_queues_order(monkeypatch):
    backend, gpu = _open(monkeypatch)  # 768 KiB of tables: below the snapshot's minimum
    tables = {name: np.random.default_rng(len(name)).integers(
        0, 255, backend.plan.tensor(name).bytes, np.uint8).tobytes() for name in CHECKPOINT}
    for name, data in tables.items():
        backend.write_tensor(name, data)
    backend.start(range(backend.plan.submission_count))  # counter 1
    got, _ = _streamed(backend, CHECKPOINT, 100_000)
    assert got == tables
    stream = backend._stream
    chunks = sum(-(-len(data) // 100_000) for data in tables.values())
    assert stream.reads == 0 and stream.counter == 1 + chunks  # each chunk a queued copy
    assert gpu.acquires == list(range(1 + chunks))  # after the run, in turn
    backend.close()


def test_the_runtime_window_holds_every_area_below_the_plans():
    from bob.backends.nv.rm import addresses
    from bob.backends.nv.rm.channel import GPFIFO_ENTRIES
    from bob.plan.placement import DEFAULT_VA_BASE

    areas = sorted(addresses.RUNTIME_AREAS, key=lambda area: area.address)
    for first, second in zip(areas, areas[1:], strict=False):
        assert first.end <= second.address, (first.name, second.name)
    assert areas[0].address == addresses.RUNTIME_VA_BASE and areas[-1].end <= DEFAULT_VA_BASE
    fixed = {"gpfifo": GPFIFO_ENTRIES * s.GP_ENTRY_BYTES + 4096 + s.USERD_BYTES,
             "runtime block": st.RUNTIME_BLOCK_BYTES,
             "copy ring": GPFIFO_ENTRIES * s.GP_ENTRY_BYTES + 4096 + s.USERD_BYTES,
             "copy kernels": st_snapshot.KERNELS_BYTES,
             "write slots": st.WRITE_SLOTS * st.WRITE_SLOT_BYTES,
             "staging": st.STAGING_BYTES, "profile": st.PROFILE_BYTES}
    for name, size in fixed.items():
        assert addresses.area_for(name, size) == addresses.area(name).address
    with pytest.raises(ValueError, match="do not fit the runtime's staging area"):
        addresses.area_for("staging", addresses.area("staging").bytes + 1)
