"""The nv backend's kernel-driver layer: ABI layouts, ioctl numbers, failure paths.

CPU-side tests run everywhere: structure sizes and offsets against the 580
headers, the escape numbers, the typed errors for a missing driver, a refused
permission, a GPU without the Hopper classes and a driver refusing a call,
and a whole bring-up (probe stages 1-2) against a scripted fake driver.
GPU tests (``-m gpu``) run the probe on a real Hopper GPU.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import struct
from dataclasses import replace

import numpy as np
import pytest

from bob.backends.nv.pushbuffer import HOPPER_CHANNEL_GPFIFO_A, gpfifo_entry
from bob.backends.nv.rm import channel as ch
from bob.backends.nv.rm import ioctl
from bob.backends.nv.rm import structs as s
from bob.backends.nv.rm.addresses import GPFIFO_RING_VA, RUNTIME_VA_BASE
from bob.backends.nv.rm.device import RmClient, RmDevice
from bob.errors import BackendUnavailable, RunFailure
from conftest import bob_plan
from nv_fakes import AMPERE_CLASSES, GPU, FakeDriver, FakeTransport

# -- ABI layouts (hand-summed from the headers, not from our own definitions) ------


@pytest.mark.parametrize("struct_type, size", [
    (s.NVOS00_PARAMETERS, 16),
    (s.NVOS21_PARAMETERS, 32),
    (s.NVOS54_PARAMETERS, 32),
    (s.NVOS33_PARAMETERS, 48),
    (s.nv_ioctl_nvos33_parameters_with_fd, 56),
    (s.NVOS46_PARAMETERS, 64),
    (s.NVOS46_PARAMETERS_LEGACY, 56),
    (s.NVOS47_PARAMETERS, 48),
    (s.nv_ioctl_register_fd_t, 4),
    (s.NV0080_ALLOC_PARAMETERS, 56),
    (s.NV2080_ALLOC_PARAMETERS, 4),
    (s.NV_VASPACE_ALLOCATION_PARAMETERS, 48),
    (s.NV_MEMORY_ALLOCATION_PARAMS, 128),
    (s.NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS, 20),
    (s.NV_CTXSHARE_ALLOCATION_PARAMETERS, 12),
    (s.NV_MEMORY_DESC_PARAMS, 24),
    (s.NV_CHANNEL_ALLOC_PARAMS, 368),
    (s.NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS, 776),
    (s.NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS, 16),
    (s.NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS, 3),
    (s.NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS_570, 2),
    (s.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS, 4),
])
def test_structure_sizes_match_the_580_headers(struct_type, size):
    assert ctypes.sizeof(struct_type) == size


@pytest.mark.parametrize("struct_type, field, offset", [
    (s.NVOS21_PARAMETERS, "pAllocParms", 16),
    (s.NVOS21_PARAMETERS, "paramsSize", 24),
    (s.NVOS21_PARAMETERS, "status", 28),
    (s.NVOS54_PARAMETERS, "params", 16),
    (s.NVOS54_PARAMETERS, "status", 28),
    (s.NVOS33_PARAMETERS, "offset", 16),
    (s.NVOS33_PARAMETERS, "pLinearAddress", 32),
    (s.NVOS33_PARAMETERS, "flags", 44),
    (s.nv_ioctl_nvos33_parameters_with_fd, "fd", 48),
    (s.NVOS46_PARAMETERS, "flags", 32),
    (s.NVOS46_PARAMETERS, "kindOverride", 40),
    (s.NVOS46_PARAMETERS, "dmaOffset", 48),
    (s.NVOS46_PARAMETERS, "status", 56),
    (s.NVOS46_PARAMETERS_LEGACY, "dmaOffset", 40),
    (s.NV0080_ALLOC_PARAMETERS, "vaSpaceSize", 24),
    (s.NV0080_ALLOC_PARAMETERS, "vaMode", 48),
    (s.NV_VASPACE_ALLOCATION_PARAMETERS, "vaBase", 40),
    (s.NV_MEMORY_ALLOCATION_PARAMS, "rangeLo", 48),
    (s.NV_MEMORY_ALLOCATION_PARAMS, "size", 64),
    (s.NV_MEMORY_ALLOCATION_PARAMS, "offset", 80),
    (s.NV_MEMORY_ALLOCATION_PARAMS, "hVASpace", 108),
    (s.NV_MEMORY_ALLOCATION_PARAMS, "numaNode", 120),
    # 580 has no hHandleVASpace (added after 590.48): hUserdMemory follows hVASpace.
    (s.NV_CHANNEL_ALLOC_PARAMS, "gpFifoOffset", 8),
    (s.NV_CHANNEL_ALLOC_PARAMS, "hContextShare", 24),
    (s.NV_CHANNEL_ALLOC_PARAMS, "hVASpace", 28),
    (s.NV_CHANNEL_ALLOC_PARAMS, "hUserdMemory", 32),
    (s.NV_CHANNEL_ALLOC_PARAMS, "userdOffset", 64),
    (s.NV_CHANNEL_ALLOC_PARAMS, "engineType", 128),
    (s.NV_CHANNEL_ALLOC_PARAMS, "instanceMem", 144),
    (s.NV_CHANNEL_ALLOC_PARAMS, "hPhysChannelGroup", 240),
    (s.NV_CHANNEL_ALLOC_PARAMS, "errorNotifierMem", 248),
    (s.NV_CHANNEL_ALLOC_PARAMS, "hmacNonce", 328),
    (s.NV_CHANNEL_ALLOC_PARAMS, "tpcConfigID", 360),
    (s.NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS, "classList", 8),
])
def test_field_offsets_match_the_580_headers(struct_type, field, offset):
    assert getattr(struct_type, field).offset == offset


def test_allocation_blocks_carry_a_zero_tail():
    params = s.NV_VASPACE_ALLOCATION_PARAMETERS(index=0, flags=0, vaBase=0x1234)
    buffer = s.alloc_buffer(params)
    assert len(buffer) == ctypes.sizeof(params) + s.ALLOC_SLACK
    assert bytes(buffer)[:ctypes.sizeof(params)] == bytes(params)
    assert set(bytes(buffer)[ctypes.sizeof(params):]) == {0}


# -- ioctl numbers -------------------------------------------------------------------


@pytest.mark.parametrize("escape, size, number", [
    (s.NV_ESC_RM_ALLOC, 32, 0xC020462B),
    (s.NV_ESC_RM_CONTROL, 32, 0xC020462A),
    (s.NV_ESC_RM_FREE, 16, 0xC0104629),
    (s.NV_ESC_RM_MAP_MEMORY, 56, 0xC038464E),
    (s.NV_ESC_RM_MAP_MEMORY_DMA, 64, 0xC0404657),
    (s.NV_ESC_REGISTER_FD, 4, 0xC00446C9),
])
def test_escape_numbers_are_iowr_F(escape, size, number):
    assert ioctl.nv_ioctl_number(escape, size) == number


def test_ioctl_number_rejects_what_does_not_fit():
    with pytest.raises(ValueError, match="14 bits"):
        ioctl.iowr(ord("F"), 0x2B, 1 << 14)
    with pytest.raises(ValueError, match="8 bits"):
        ioctl.iowr(ord("F"), 0x100, 8)


def test_statuses_have_names_and_explanations():
    assert ioctl.describe_status(0x1F).name == "NV_ERR_INVALID_ARGUMENT"
    assert "ABI" in ioctl.describe_status(0x3A).explanation
    assert ioctl.describe_status(0x12345).name == "NV_STATUS_0x12345"
    with pytest.raises(ioctl.RmStatusError) as raised:
        ioctl.check_status("RM_ALLOC(HOPPER_CHANNEL_GPFIFO_A under 0x1)", 0x51)
    message = str(raised.value)
    assert "RM_ALLOC(HOPPER_CHANNEL_GPFIFO_A" in message and "NV_ERR_NO_MEMORY" in message
    assert raised.value.code == 0x51


def test_einval_is_explained_as_an_abi_mismatch():
    error = ioctl.check_errno("RM_MAP_MEMORY_DMA(arena)", OSError(errno.EINVAL, "Invalid"))
    assert isinstance(error, ioctl.RmIoctlError)
    assert "EINVAL" in str(error) and "parameter block size" in str(error)


# -- failure paths -----------------------------------------------------------------------


def test_no_driver_is_backend_unavailable():
    transport = FakeTransport({})
    with pytest.raises(BackendUnavailable, match="/dev/nvidiactl does not exist"):
        RmClient(transport)


def test_no_permission_is_backend_unavailable():
    transport = FakeTransport({s.CONTROL_DEVICE: PermissionError(errno.EACCES, "no")})
    with pytest.raises(BackendUnavailable, match="permission denied"):
        RmClient(transport)


def test_real_transport_reports_a_missing_device_file(tmp_path):
    with pytest.raises(BackendUnavailable, match="does not exist"):
        ioctl.Transport().open(str(tmp_path / "nvidiactl"))


def test_real_transport_reports_permission(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root opens any file")
    path = tmp_path / "nvidiactl"
    path.write_bytes(b"")
    path.chmod(0)
    with pytest.raises(BackendUnavailable, match="permission denied"):
        ioctl.Transport().open(str(path))


def test_a_gpu_without_hopper_classes_is_unsupported():
    driver = FakeDriver(classes=AMPERE_CLASSES)
    client = RmClient(driver.transport())
    with pytest.raises(BackendUnavailable) as raised:
        RmDevice(client)
    message = str(raised.value)
    assert "HOPPER_COMPUTE_A (0xcbc0)" in message and "0xc7c0" in message
    assert isinstance(raised.value, BackendUnavailable)


def test_a_refused_allocation_names_class_and_status():
    driver = FakeDriver(refuse={s.FERMI_VASPACE_A: 0x1F})
    client = RmClient(driver.transport())
    with pytest.raises(ioctl.RmStatusError, match=r"RM_ALLOC\(FERMI_VASPACE_A under .*"
                       r"NV_ERR_INVALID_ARGUMENT \(0x1f\)"):
        RmDevice(client)


def test_device_bring_up_order_and_handles():
    driver = FakeDriver()
    client = RmClient(driver.transport())
    device = RmDevice(client)
    classes = [cls for cls, _ in driver.objects.values()]
    assert classes == [s.NV01_ROOT_CLIENT, s.NV01_DEVICE_0, s.NV20_SUBDEVICE_0,
                       s.FERMI_VASPACE_A, s.HOPPER_USERMODE_A]
    assert driver.objects[device.usermode][1] == device.subdevice
    assert device.driver_version == "580.159.04"
    assert s.HOPPER_COMPUTE_A in device.classes
    device.ring_doorbell(0x10023)
    word = struct.unpack_from("<I", device.usermode_map, s.NVC361_NOTIFY_CHANNEL_PENDING)[0]
    assert word == 0x10023
    device.close()
    client.close()


def test_the_device_asks_for_the_highest_p_state_for_as_long_as_it_lives():
    driver = FakeDriver()
    device = RmDevice(RmClient(driver.transport()))
    # BOOST_TO_MAX (1:0 = 2), as a CUDA client (4:4) of high priority (6:6), no end.
    assert driver.boosts == [(device.subdevice, 0x52, 0xFFFF_FFFF)]
    assert device.boost == "highest P-state"


def test_a_refused_boost_is_reported_and_the_device_still_opens():
    driver = FakeDriver(refuse_controls={s.NV2080_CTRL_CMD_PERF_BOOST: 0x56})
    device = RmDevice(RmClient(driver.transport()))
    assert device.boost.startswith("refused: RM_CONTROL(NV2080_CTRL_CMD_PERF_BOOST")
    assert device.vaspace and device.usermode  # the rest of the bring-up went on


def test_map_dma_falls_back_to_the_pre_580_layout():
    from bob.backends.nv.rm.memory import allocate

    driver = FakeDriver(legacy_map_dma=True)
    client = RmClient(driver.transport())
    device = RmDevice(client)
    block = allocate(device, 64 << 10, location="vidmem", gpu_va=0x20_0000_0000, name="arena")
    assert block.gpu_va == 0x20_0000_0000
    block.write(100, b"bob")
    assert block.read(100, 3) == b"bob"
    with pytest.raises(IndexError, match="outside arena"):
        block.read((64 << 10) - 2, 4)


def test_allocation_sizes_and_addresses_are_checked():
    from bob.backends.nv.rm.memory import allocate

    device = RmDevice(RmClient(FakeDriver().transport()))
    with pytest.raises(ValueError, match="65536-byte pages"):
        allocate(device, 4096, location="vidmem")
    with pytest.raises(ValueError, match="not a page address"):
        allocate(device, 4096, location="sysmem", gpu_va=0x1234)


def test_host_memory_is_described_to_the_driver_on_the_gpu_file():
    from bob.backends.nv.rm.memory import describe_host, release

    driver = FakeDriver()
    device = RmDevice(RmClient(driver.transport()))
    buffer = np.zeros(3 * 4096 + 4096, np.uint8)
    address = buffer.ctypes.data + (-buffer.ctypes.data % 4096)
    block = describe_host(device, address, 3 * 4096, name="landing")
    (handle, (described, size, flags, fd)), = driver.host_memory.items()
    assert (block.memory, described, size, fd) == (handle, address, 3 * 4096, GPU)
    assert driver.objects[handle] == (s.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, device.device)
    # non-contiguous (7:4 = 1), PCI (11:8 = 0), cached (15:12 = 1), no CPU mapping (31:30 = 1)
    assert flags == 0x4000_1010
    assert block.gpu_va == driver.virtual_va[block.virtual]
    virtual = block.virtual
    release(device, block)
    assert driver.freed[-2:] == [virtual, handle]  # the mapping goes before the memory
    assert block.gpu_va is None and block.memory == 0


def test_host_memory_must_be_whole_pages_and_a_refusal_names_the_class():
    from bob.backends.nv.rm.memory import describe_host, host_allocation

    driver = FakeDriver(refuse={s.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: 0x51})
    device = RmDevice(RmClient(driver.transport()))
    with pytest.raises(ValueError, match="whole 4096-byte pages, not 4096 bytes at 0x1001"):
        describe_host(device, 0x1001, 4096)
    with pytest.raises(ValueError, match="whole 4096-byte pages, not 100"):
        host_allocation(device, 100)
    with pytest.raises(ioctl.RmStatusError, match=r"NV01_MEMORY_SYSTEM_OS_DESCRIPTOR.*"
                       r"NV_ERR_NO_MEMORY"):
        host_allocation(device, 4096, name="staging")
    assert not driver.host_memory and not driver.virtual_va  # nothing described or mapped


def test_a_host_allocation_is_process_memory_the_cpu_reads_directly():
    from bob.backends.nv.rm.memory import host_allocation

    driver = FakeDriver()
    device = RmDevice(RmClient(driver.transport()))
    block = host_allocation(device, 8192, gpu_va=0x30_0000_0000, name="staging")
    block.write(4090, b"bob!")
    (described, size, _, _), = driver.host_memory.values()
    assert ctypes.string_at(described + 4090, 4) == b"bob!" and size == 8192
    assert block.gpu_va == 0x30_0000_0000 and block.read(4090, 4) == b"bob!"


# -- the channel ---------------------------------------------------------------------------


def make_channel(driver=None):
    driver = driver or FakeDriver()
    device = RmDevice(RmClient(driver.transport()))
    return driver, device, ch.Channel(device, entries=16)


def test_channel_objects_and_parameters():
    driver, device, channel = make_channel()
    by_class = {cls: (handle, parent) for handle, (cls, parent) in driver.objects.items()}
    assert by_class[s.KEPLER_CHANNEL_GROUP_A][1] == device.device
    assert by_class[s.FERMI_CONTEXT_SHARE_A][1] == channel.group
    assert by_class[s.HOPPER_CHANNEL_GPFIFO_A][1] == channel.group
    assert by_class[s.HOPPER_COMPUTE_A][1] == channel.handle
    assert channel.ring.gpu_va == GPFIFO_RING_VA == RUNTIME_VA_BASE
    assert channel.token == 0x10023
    assert driver.controls[-2:] == [s.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN,
                                    s.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE]


def _entry(address: int, words: int) -> bytes:
    return gpfifo_entry(HOPPER_CHANNEL_GPFIFO_A, address, words)


def test_submit_writes_the_entry_gp_put_and_doorbell():
    _, device, channel = make_channel()
    entry = _entry(0x20_0040_0000, 12)
    channel.submit([entry])
    assert channel.ring.read(0, 8) == entry  # the encoder's bytes, as they are
    gp_put = channel.userd_offset + s.USERD_GP_PUT
    assert struct.unpack("<I", channel.ring.read(gp_put, 4))[0] == 1
    doorbell = struct.unpack_from("<I", device.usermode_map, s.NVC361_NOTIFY_CHANNEL_PENDING)
    assert doorbell[0] == channel.token


def test_a_wait_past_its_deadline_reports_the_channel():
    _, _, channel = make_channel()
    channel.submit([_entry(0x20_0040_0000, 6)])
    with pytest.raises(ioctl.SubmissionTimeout, match=r"semaphore\[0\] is 0, not 1.*"
                       r"GP_GET=0 GP_PUT=1.*notifier\[error\]"):
        channel.wait(lambda: 0, 1, 0.01, "semaphore[0]")


def test_an_error_notifier_stops_the_wait():
    _, _, channel = make_channel()
    channel.notifier.write(0, struct.pack("<QIHH", 5, 31, 0, 0xFFFF))  # e.g. an MMU fault
    with pytest.raises(ioctl.ChannelError, match="info32=0x0000001f"):
        channel.wait(lambda: 0, 1, 5.0, "semaphore[0]")


def test_the_ring_refuses_more_than_it_holds():
    _, _, channel = make_channel()
    with pytest.raises(ValueError, match="do not fit"):
        channel.submit([_entry(0x1000, 1)] * 16)
    with pytest.raises(ValueError, match="8 bytes, not 4"):
        channel.submit([bytes(4)])


# -- the probe's words come from the shared builders ------------------------------------------


def test_probe_qmd_decodes_to_its_dispatch():
    from bob.backends.nv import decoder
    from dev.bringup import probe

    image = probe.probe_qmd(0x20_0000_0000, 0x20_0000_1000, 1024, 4, 128, 0x20_0060_0010, 3)
    qmd = decoder.decode_qmd(image, s.HOPPER_COMPUTE_A)
    dispatch = qmd.dispatch()
    assert dispatch.major_version == 4 and qmd.unexplained() == 0
    assert dispatch.program_address == 0x20_0000_0000
    assert dispatch.constant_buffers == {0: (0x20_0000_1000, 1024)}
    assert dispatch.grid == (4, 1, 1) and dispatch.block == (128, 1, 1)
    assert dispatch.shared_memory == 1024  # the system's 1 KiB; the kernel declares none
    assert [(r.address, r.payload) for r in dispatch.releases] == [(0x20_0060_0010, 3)]


def test_probe_parameter_block_has_the_driver_area():
    from bob.backends.nv import decoder
    from dev.bringup import probe, probe_kernel

    block = probe.probe_parameter_block(0x20_0080_0000, 0xB0B0_0000, 4, 128)
    area = decoder.decode_driver_area(block)
    assert area.block == (128, 1, 1) and area.grid == (4, 1, 1)
    assert struct.unpack_from("<QI", block, probe_kernel.PARAMETER_BASE) == (0x20_0080_0000,
                                                                          0xB0B0_0000)


def test_probe_stages_one_and_two_against_the_fake_driver(capsys):
    from dev.bringup import probe

    status = probe.main(["--stages", "1,2", "--deadline", "0.05"],
                        transport=FakeDriver().transport())
    out = capsys.readouterr().out
    assert "== stage 1: ok ==" in out
    assert "CPU write/read ok" in out
    # No GPU behind the fake: the semaphore never moves and the wait times out cleanly.
    assert status == 1
    assert "stage 2 FAILED: SubmissionTimeout" in out and "GP_PUT=1" in out


# -- the real GPU ------------------------------------------------------------------------------


def _nv_present() -> bool:
    return os.path.exists(s.CONTROL_DEVICE)


@pytest.mark.gpu
@pytest.mark.skipif(not _nv_present(), reason="no NVIDIA kernel driver here")
def test_probe_dispatches_a_kernel_on_hopper(capsys):
    from dev.bringup import probe

    status = probe.main(["--stages", "1,2,3", "--deadline", "10"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "512/512 correct" in out


def test_schedule_falls_back_to_the_570_layout():
    class OldDriver(FakeDriver):
        def control(self, request):
            old_size = ctypes.sizeof(s.NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS_570)
            if request.cmd == s.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE and request.paramsSize != old_size:
                self.controls.append(request.cmd)
                request.status = 0x1F  # what 580 answered to the other size
                return
            super().control(request)

    driver, _, channel = make_channel(OldDriver())
    assert driver.controls.count(s.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE) == 2
    assert channel.token == 0x10023


# -- NvBackend: the encoder's bytes at the plan's addresses ----------------------------------


def _plan(target_name="sm_90", updates=2):
    from bob.plan.placement import TARGETS

    # Stand-in machine code: the image copies it, nothing runs.
    return bob_plan(1, updates, target=TARGETS[target_name], compiled=True, registers=24,
                    shared_bytes=2048)


def _open_on_fake_driver(monkeypatch, plan):
    """NvBackend on the scripted driver, with every Channel.wait met at once (no GPU)."""
    from bob.backends.nv.rm.backend import NvBackend

    waits: list[tuple[int, str]] = []

    def completes(channel, read_value, target, deadline_s, what):
        waits.append((target, what))
        return target

    monkeypatch.setattr(ch.Channel, "wait", completes)
    backend = NvBackend(plan, transport=FakeDriver().transport(), deadline_s=0.01)
    return backend, waits


def _component_bytes(backend, encoded):
    block = backend.blocks[encoded.name]
    return block.read(encoded.base - block.gpu_va, len(encoded.data))


def test_nv_backend_uploads_the_encoders_bytes_at_the_plans_addresses(monkeypatch):
    from bob.backends.nv.encoder import encode

    plan = _plan()
    backend, completes = _open_on_fake_driver(monkeypatch, plan)
    encoded = encode(plan)
    assert backend.encoded == encoded
    for component in encoded.components:
        if component.base is None:
            continue
        block = backend.blocks[component.name]
        assert block.gpu_va == getattr(plan.address_map, component.name.replace("-", "_")).base
        assert _component_bytes(backend, component) == component.data, component.name
    # The set-up entry went to the ring first, as encoded.
    assert backend.channel.ring.read(0, 8) == encoded.entry(0)
    assert completes == [(1, "channel set-up")]
    backend.close()


def test_the_plan_check_names_what_differs_on_a_driver_that_runs_nothing(monkeypatch, tmp_path):
    """Stage 4 end to end on the scripted driver: no kernel runs there, so what the CPU's
    kernels wrote differs and the input written to both agrees."""
    import json

    from bob.errors import RunFailure
    from bob.kernels import signatures as sig
    from bob.kernels.cuda.regions import REGIONS_FORMAT, REGIONS_VERSION
    from dev.bringup.plan_check import run_plan_check

    regions = tmp_path / "regions.json"
    regions.write_text(json.dumps({
        "format": REGIONS_FORMAT, "version": REGIONS_VERSION, "arch": "sm_90",
        "regions": {name: {"code": "00" * 256, "registers": 24, "shared_bytes": 2048}
                    for name in sig.SIGNATURES}}))
    monkeypatch.setattr(ch.Channel, "wait", lambda channel, read, target, deadline, what: target)
    said: list[str] = []
    with pytest.raises(RunFailure, match=r"^\d+ tensors differ between nv and cpu$"):
        run_plan_check(regions_path=str(regions), prompts=1, updates=1, say=said.append,
                       transport=FakeDriver().transport())
    verdicts = {line.split(":")[0].strip(): line for line in said if line.startswith("  ")}
    assert verdicts["input"] == "  input: 1028 bytes identical"
    for trained in ("parameters", "first_moment", "second_moment"):
        assert "DIFFERS, first at [0, 0]: cpu " in verdicts[trained]
    assert any("= encode(plan)" in line and "DIFFERS" not in line for line in said
               if line.startswith("uploaded"))


def test_nv_backend_run_submits_the_encoded_entries_and_waits_for_the_last_slot(monkeypatch):
    # The run waited for by its own slot, not queued on the runtime stream.
    monkeypatch.setattr("bob.backends.nv.rm.backend.NvBackend.queue_runs", False)
    plan = _plan()
    backend, completes = _open_on_fake_driver(monkeypatch, plan)
    semaphores = backend.blocks["semaphores"]
    semaphores.write(0, b"\xff" * semaphores.size)  # stale values from an earlier run
    backend.run(range(2, 5))
    ring = backend.channel.ring
    assert [ring.read(8 * slot, 8) for slot in (1, 2, 3)] == [
        backend.encoded.submission_entry(i) for i in (2, 3, 4)]
    assert completes[-1] == (plan.submissions[4].semaphore, "submission 4's semaphore")
    assert [backend.semaphore(i) for i in (2, 3, 4)] == [0, 0, 0]  # zeroed before submitting
    assert backend.semaphore(1) == 2**64 - 1  # not submitted, not touched
    assert backend.last_semaphore == plan.submissions[4].semaphore
    count = plan.submission_count
    with pytest.raises(RunFailure, match=f"submission {count} is not in the plan's {count}"):
        backend.run(range(count, count + 1))
    backend.close()


def test_nv_backend_set_scalars_writes_the_patched_words_into_the_block(monkeypatch):
    from bob.backends.nv import encoder
    from bob.program.bob import BobConfig, Hyper, adam_scalars

    plan = _plan()
    backend, _ = _open_on_fake_driver(monkeypatch, plan)
    index = BobConfig(vocab=256, prompts=1, updates=2).adamw_launch(1)
    values = adam_scalars(Hyper(lr=0.05), 2)
    backend.set_scalars(index, values)
    program = backend.blocks["program"]
    offset = plan.parameter_block_address(index) - program.gpu_va
    block = program.read(offset, plan.target.parameter_block_bytes)
    launch = plan.launches[index]
    names = [p.name for p in plan.region(launch.region).params]
    patched = replace(launch, args=tuple(values.get(name, arg)
                                         for name, arg in zip(names, launch.args, strict=True)))
    assert block == encoder.parameter_block(plan, index, patched)
    assert block != encoder.parameter_block(plan, index)  # the scalars did change
    assert block[:encoder.DRIVER_AREA_BYTES] == encoder.parameter_block(plan, index)[:0x30]
    backend.close()


def test_nv_backend_timeout_names_the_last_launch_completed(monkeypatch):
    plan = _plan()
    backend, _ = _open_on_fake_driver(monkeypatch, plan)
    monkeypatch.undo()  # the real wait: no GPU moves the runtime counter
    with pytest.raises(ioctl.SubmissionTimeout, match=r"submissions 0 to 0 \(runtime item 1\) "
                       r"is 0, not 1.*no launch has completed"):
        backend.run(range(1))
    progress = backend.encoded.launch_progress_address - backend.blocks["semaphores"].gpu_va
    backend.blocks["semaphores"].write(progress, struct.pack("<I", 3))
    label = plan.launches[2].label or plan.launches[2].region
    with pytest.raises(ioctl.SubmissionTimeout,
                       match=re.escape(f"last launch completed is 2 ({label})")):
        backend.run(range(1))
    backend.close()


def test_nv_backend_refuses_regions_without_code():
    from bob.backends.nv.rm.backend import NvBackend
    from bob.errors import RunFailure
    from bob.plan.placement import SM90
    from bob.program.bob import BobConfig, build_plan

    with pytest.raises(RunFailure, match="no machine code"):
        NvBackend(build_plan(BobConfig(vocab=256, prompts=1, updates=1), SM90),
                  transport=FakeTransport({}))


def test_nv_backend_refuses_a_non_hopper_plan_before_opening_the_driver():
    from bob.backends.nv.rm.backend import NvBackend

    with pytest.raises(BackendUnavailable, match="sm_90 plans"):
        NvBackend(_plan("sm_86"), transport=FakeTransport({}))


def test_nv_backend_without_a_gpu_times_out_and_frees_everything():
    from bob.backends.nv.rm.backend import NvBackend

    driver = FakeDriver()
    transport = driver.transport()
    with pytest.raises(ioctl.SubmissionTimeout, match="channel set-up"):
        NvBackend(_plan(), transport=transport, deadline_s=0.01)
    # The last escape frees the client (and with it every object under it).
    assert transport.calls[-1][1] == s.NV_ESC_RM_FREE


def test_nv_available_says_why_not():
    from bob.backends.nv.rm import backend

    if _nv_present():
        pytest.skip("a driver is present")
    usable, why = backend.nv_available()
    assert not usable and "/dev/nvidiactl" in why


def test_regions_file_round_trip_and_refusals(tmp_path):
    import json

    from bob.errors import BadInput
    from bob.kernels.cuda.regions import REGIONS_FORMAT as FORMAT
    from bob.kernels.cuda.regions import REGIONS_VERSION as VERSION
    from bob.kernels.cuda.regions import load_regions

    path = tmp_path / "regions.json"
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "arch": "sm_90",
                                "regions": {"bob-adamw": {"code": "00ff", "registers": 24,
                                                          "shared_bytes": 0}}}))
    regions = load_regions(path)
    assert regions["bob-adamw"].code == b"\x00\xff" and regions["bob-adamw"].registers == 24
    path.write_text(json.dumps({"format": "other", "version": 1}))
    with pytest.raises(BadInput, match="re-export"):
        load_regions(path)
    with pytest.raises(BadInput, match="not a readable"):
        load_regions(tmp_path / "missing.json")


@pytest.mark.gpu
@pytest.mark.skipif(not _nv_present(), reason="no NVIDIA kernel driver here")
def test_bob_plan_on_hopper_is_bit_identical_to_cpu(capsys):
    """Stage 4: regions from BOB_NV_REGIONS (an exported file) or compiled with NVRTC."""
    from dev.bringup import probe

    regions = os.environ.get("BOB_NV_REGIONS")
    if regions is None:
        pytest.importorskip("cuda.bindings.nvrtc", reason="no NVRTC and no BOB_NV_REGIONS file")
    argv = ["--stages", "1,2,3,4", "--plans", "256:2:3:hard,256:1:2:corpus"]
    status = probe.main(argv + (["--regions", regions] if regions else []))
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.count("all tensors bit-identical") == 2



# -- a submission of two launches (WAIT_FOR_IDLE between them), on the probe kernel ------------


def _two_launch_plan():
    """The probe kernel (out[i] = magic + i) as a region: a, then b, in one submission;
    then a again alone."""
    from bob.plan.model import (
        Dim3,
        Footprint,
        LaunchSpec,
        PointerParam,
        ProgramSpec,
        Region,
        Scalar,
        ScalarParam,
        Submission,
        TensorRef,
        TensorSpec,
    )
    from bob.plan.placement import SM90, place
    from dev.bringup import probe_kernel

    region = Region("probe", code=probe_kernel.CODE, registers=probe_kernel.REGISTERS,
                    block_x=128, shared_bytes=probe_kernel.SHARED_BYTES,
                    params=(PointerParam("out", Footprint(4, ("grid.x", "block.x")), "write"),
                            ScalarParam("magic", "u32")),
                    entry=probe_kernel.ENTRY)
    launches = tuple(
        LaunchSpec("probe", Dim3(4), Dim3(128), (TensorRef(name), Scalar.u32(magic)), name)
        for name, magic in (("a", 0xA000_0000), ("b", 0xB000_0000), ("a", 0xC000_0000)))
    program = ProgramSpec(regions=(region,),
                          tensors=(TensorSpec("a", "u32", (512,)), TensorSpec("b", "u32", (512,))),
                          launches=launches,
                          submissions=(Submission(0, 2, 1), Submission(2, 1, 2)))
    return place(program, SM90)


def _probe_reference(memory, args):
    import numpy as np

    out = memory.array(args["out"], "u32", 512)
    out[:] = (np.arange(512, dtype=np.uint64) + args["magic"]).astype(np.uint32)


def _check_two_launches(backend, first_a: int, b: int):
    import numpy as np

    index = np.arange(512, dtype=np.uint64)
    for name, magic in (("a", first_a), ("b", b)):
        got = np.frombuffer(backend.read_tensor(name), np.uint32)
        assert got.tolist() == ((index + magic) % 2**32).astype(np.uint32).tolist(), name


def _exercise_two_launches(backend):
    from bob.plan.model import Scalar

    plan = backend.plan
    encoded = backend.encoded
    assert [s.count for s in plan.submissions] == [2, 1]
    backend.run(range(1))  # a and b, a WAIT_FOR_IDLE between them
    _check_two_launches(backend, 0xA000_0000, 0xB000_0000)
    backend.run(range(1, 2))  # a again, alone
    _check_two_launches(backend, 0xC000_0000, 0xB000_0000)
    backend.set_scalars(0, {"magic": Scalar.u32(0x1234_0000)})
    backend.set_scalars(1, {"magic": Scalar.u32(0x5678_0000)})
    backend.run(range(1))  # patched parameter blocks; slot 0 zeroed and released again
    _check_two_launches(backend, 0x1234_0000, 0x5678_0000)
    return encoded


def test_two_launch_submission_on_nv_sim():
    from bob.backends.nv.decoder import disassemble
    from bob.backends.nv.sim import NvSimBackend

    backend = NvSimBackend(_two_launch_plan(), kernels={"probe": _probe_reference})
    encoded = _exercise_two_launches(backend)
    assert "WAIT_FOR_IDLE" in disassemble(encoded, backend.plan)


@pytest.mark.gpu
@pytest.mark.skipif(not _nv_present(), reason="no NVIDIA kernel driver here")
def test_two_launch_submission_on_hopper():
    """WAIT_FOR_IDLE between launches, a re-run, patched scalars: all from encode(plan)."""
    from bob.backends.nv.rm.backend import NvBackend

    with NvBackend(_two_launch_plan(), deadline_s=10) as backend:
        _exercise_two_launches(backend)
        assert backend.launch_progress() == 2  # launch 1 (b) completed last


def test_the_driver_version_is_read_from_the_kernel_module_line():
    """When the RM build-version query is refused, doctor shows the module's own version."""
    from bob.backends.nv.rm.device import module_version

    line = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  "
            "Release Build  (nixbld@)  Tue Oct 14 2025\n")
    assert module_version(line) == "580.159.04"
    assert module_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu") \
        == "550.54.14"
    assert module_version("no driver here") is None
