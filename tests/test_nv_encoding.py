"""The command-stream encoder, checked against the independent decoder.

Every field the encoder sets is read back through the decoder's own tables
(parsed from the headers, not the generated module) for every launch of a real
Bob plan on both targets; builders refuse what cannot be encoded.
"""

from __future__ import annotations

import importlib.util
import json
import re
import struct
import sys
from pathlib import Path

import pytest

from bob.backends.nv import decoder, encoder
from bob.backends.nv import fields_generated as g
from bob.backends.nv.encoder import EncodeError, emitted, encode, encode_qmd
from bob.backends.nv.pushbuffer import (
    AMPERE_CHANNEL_GPFIFO_A,
    HOPPER_CHANNEL_GPFIFO_A,
    CommandError,
    Pushbuffer,
    gpfifo_entry,
    immediate_header,
    incrementing_header,
    non_incrementing_header,
    pack_word,
)
from bob.backends.nv.qmd import Qmd, QmdFieldError, QmdV03, QmdV04, SharedMemoryConfig
from bob.plan.model import Scalar
from bob.plan.placement import SM86, SM90, encode_parameter_block, place
from bob.program.bob import BobConfig, build_plan, build_program
from conftest import stand_in_regions

ROOT = Path(__file__).resolve().parent.parent
TARGETS = (SM86, SM90)
CONFIG = BobConfig(vocab=256, prompts=2, updates=3)


@pytest.fixture(params=TARGETS, ids=lambda t: t.name)
def plan(request):
    return build_plan(CONFIG, request.param, compiled=stand_in_regions(CONFIG))


@pytest.fixture(params=TARGETS, ids=lambda t: t.name)
def bare_plan(request):
    """Bob's plan as declared, before compilation: every region's code is empty."""
    return build_plan(CONFIG, request.param)


# -- the generated tables --------------------------------------------------------------


def _generator():
    spec = importlib.util.spec_from_file_location("gen_nv_tables",
                                                  ROOT / "tools" / "gen_nv_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def test_generator_reproduces_the_checked_in_module():
    generated = ROOT / "src" / "bob" / "backends" / "nv" / "fields_generated.py"
    assert _generator().render() == generated.read_text()
    assert _generator().main(["--check"]) == 0


def test_vendored_qmd_header_is_the_whole_published_file():
    # NVIDIA/open-gpu-doc classes/compute/clcbc0qmd.h at 5d957df is 42268 characters.
    text = (decoder.HEADERS / "clcbc0qmd.h").read_text()
    assert len(text) == 42268
    assert text.startswith("/****")
    assert "Permission is hereby granted" in text


@pytest.mark.parametrize("version, fields", [("03_00", g.QMDV03_00_FIELDS),
                                             ("04_00", g.QMDV04_00_FIELDS)])
def test_generated_qmd_fields_match_the_decoder_tables(version, fields):
    layout = decoder.TABLES.qmd[version]
    for name, (high, low) in fields.items():
        f = layout.field(name)
        assert (f.high, f.low) == (high, low), name


@pytest.mark.parametrize("number, methods, fields", [
    (g.AMPERE_COMPUTE_B, g.NVC7C0_METHODS, g.NVC7C0_FIELDS),
    (g.HOPPER_COMPUTE_A, g.NVCBC0_METHODS, g.NVCBC0_FIELDS),
    (g.AMPERE_CHANNEL_GPFIFO_A, g.NVC56F_METHODS, g.NVC56F_FIELDS),
    (g.HOPPER_CHANNEL_GPFIFO_A, g.NVC86F_METHODS, g.NVC86F_FIELDS),
])
def test_generated_class_tables_match_the_decoder_tables(number, methods, fields):
    info = decoder.TABLES.classes[number]
    for name, offset in methods.items():
        assert info.methods[offset] == name
    for name, (high, low) in fields.items():
        assert (info.fields[name].high, info.fields[name].low) == (high, low), name


def test_qmd_record_sizes_follow_from_the_headers():
    assert decoder.TABLES.qmd["03_00"].record_bytes == QmdV03.record_bytes == 256
    assert decoder.TABLES.qmd["04_00"].record_bytes == QmdV04.record_bytes == 384
    assert SM86.qmd_record_bytes == 256 and SM90.qmd_record_bytes == 384


def test_decoder_counts_indexed_instances():
    v03, v04 = decoder.TABLES.qmd["03_00"], decoder.TABLES.qmd["04_00"]
    assert len(v03.families["CONSTANT_BUFFER_VALID"]) == 8
    assert len(v04.families["CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6"]) == 8
    assert len(v04.families["RELEASE_ENABLE"]) == 3
    assert len(v04.families["DEPENDENT_QMD_ENABLE"]) == 2


# -- QMDs --------------------------------------------------------------------------------


def test_every_field_the_encoder_sets_decodes_to_its_value(plan):
    encoded = encode(plan)
    for index, launch in enumerate(plan.launches):
        qmd = encode_qmd(plan, index)
        record = encoded.qmd_table.data[index * encoded.qmd_stride:][:qmd.record_bytes]
        decoded = decoder.decode_qmd(record, encoded.compute_class)
        for name, value in qmd.fields_set.items():
            assert decoded.get(name) == value, (index, name)
        assert decoded.unexplained() == 0
        assert {f.name for f, _ in decoded.nonzero()} <= set(qmd.fields_set)

        dispatch = decoded.dispatch()
        region = plan.region(launch.region)
        assert dispatch.major_version == qmd.major_version
        assert dispatch.program_address == plan.placed_region(launch.region).address
        assert dispatch.grid == (launch.grid.x, launch.grid.y, launch.grid.z)
        assert dispatch.block == (launch.block.x, launch.block.y, launch.block.z)
        assert dispatch.registers == region.registers
        assert dispatch.barriers == encoder.BARRIERS
        assert dispatch.constant_buffers == {
            0: (plan.parameter_block_address(index), plan.target.parameter_block_bytes)
        }
        assert [(r.address, r.payload, r.structure) for r in dispatch.releases] == [
            (encoded.launch_progress_address, index + 1, "SEMAPHORE_ONE_WORD")
        ]


def test_qmd_shared_memory_and_carveouts_are_what_ran_on_hardware(plan):
    """1 KiB of system shared memory on top of the region's; carve-outs 32 / 100 / 32 KiB."""
    encoded = encode(plan)
    for index, launch in enumerate(plan.launches):
        record = encoded.qmd_table.data[index * encoded.qmd_stride:][:plan.target.qmd_record_bytes]
        decoded = decoder.decode_qmd(record, encoded.compute_class)
        shared = plan.region(launch.region).shared_bytes
        assert decoded.dispatch().shared_memory == 1024 + shared
        # (KiB / 4) + 1: 32 KiB -> 9, 100 KiB -> 0x1a
        assert decoded.get("MIN_SM_CONFIG_SHARED_MEM_SIZE") == 9
        assert decoded.get("TARGET_SM_CONFIG_SHARED_MEM_SIZE") == 9
        assert decoded.get("MAX_SM_CONFIG_SHARED_MEM_SIZE") == 0x1A


@pytest.mark.parametrize("size, expected", [(0, (32, 100, 32)), (33 * 1024, (64, 100, 64)),
                                            (100 * 1024, (100, 100, 100))])
def test_carveout_choice(size, expected):
    config = encoder.shared_memory_config(encoder.ARCHITECTURES["sm_86"], size, "k")
    assert (config.minimum_kib, config.maximum_kib, config.target_kib) == expected
    hopper = encoder.shared_memory_config(encoder.ARCHITECTURES["sm_90"], 130 * 1024, "k")
    assert (hopper.minimum_kib, hopper.maximum_kib, hopper.target_kib) == (132, 132, 132)
    with pytest.raises(EncodeError, match="at most 100 KiB"):
        encoder.shared_memory_config(encoder.ARCHITECTURES["sm_86"], 101 * 1024, "k")


@pytest.mark.parametrize("threads, registers, blocks", [
    (256, 26, 6),    # the seed's loss gradient: 1536 threads an SM (sm_86's count) hold 6
    (256, 61, 4),    # the fused kernel: 8 warps x 2048 registers, 4 blocks in 65536
    (256, 118, 2),   # the wide kernel: 120 registers a thread
    (1024, 62, 1),   # the tall kernel: 64 x 1024 registers fill the SM
    (32, 8, 16),     # small blocks: the SM's 16 block slots
])
def test_resident_blocks_by_threads_registers_and_slots(threads, registers, blocks):
    assert encoder.resident_blocks(threads, registers) == blocks


@pytest.mark.parametrize("shared, registers, target_kib", [
    (37888, 61, 100),  # fused, V <= 1024: two blocks in 100 KiB, one in 64 (two waves)
    (37888, 118, 100),  # wide: its two blocks
    (2048, 26, 32),    # the seed's kernels keep what ran on the H200
    (47248, 62, 64),   # tall: one block of 1024 threads an SM whatever the carve-out
])
def test_the_carveout_holds_as_many_blocks_as_the_sm_can_run(shared, registers, target_kib):
    threads = 1024 if shared == 47248 else 256
    dispatch = encoder.Dispatch(0x20_0000_0000, (256, 1, 1), (threads, 1, 1), registers,
                                shared, (0x20_0001_0000, 256), None)
    qmd = encoder.build_qmd(encoder.ARCHITECTURES["sm_90"], dispatch)
    assert qmd.read("TARGET_SM_CONFIG_SHARED_MEM_SIZE") == target_kib // 4 + 1
    assert qmd.read("MIN_SM_CONFIG_SHARED_MEM_SIZE") == target_kib // 4 + 1
    assert qmd.read("MAX_SM_CONFIG_SHARED_MEM_SIZE") == 100 // 4 + 1  # never above 100 KiB


def test_the_carveout_for_several_blocks_stays_within_100_kib_unless_one_needs_more():
    hopper = encoder.ARCHITECTURES["sm_90"]
    assert encoder.shared_memory_config(hopper, 20 * 1024, "k", blocks=3).target_kib == 64
    assert encoder.shared_memory_config(hopper, 40 * 1024, "k", blocks=3).target_kib == 100
    assert encoder.shared_memory_config(hopper, 130 * 1024, "k", blocks=4).target_kib == 132


def test_qmd_sets_the_minimal_dispatch_fields():
    v03, v04 = QmdV03(), QmdV04()
    for qmd in (v03, v04):
        qmd.set_grid(3, 2, 1)
        qmd.set_block(256, 1, 1)
        qmd.set_registers(32)
        qmd.set_barriers(1)
        qmd.set_shared_memory(1024, SharedMemoryConfig(8, 100, 8))
        qmd.set_program_address(0x20_0000_0100)
        qmd.set_constant_buffer(0, 0x20_0000_0400, 512)
        qmd.set_release_semaphore(0x20_0060_0008, 7)
    assert v03.read("QMD_MAJOR_VERSION") == 3 and v04.read("QMD_MAJOR_VERSION") == 4
    assert v03.read("SM_GLOBAL_CACHING_ENABLE") == 1
    assert v04.read("QMD_TYPE") == g.QMDV04_00_VALUES["QMD_TYPE_GRID_CTA"]
    assert v03.read("CTA_RASTER_WIDTH") == 3 and v04.read("GRID_WIDTH") == 3
    assert v03.read("CONSTANT_BUFFER_ADDR_LOWER(0)") == 0x0000_0400
    assert v04.read("CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(0)") == 0x20_0000_0400 >> 6 & 0xFFFFFFFF
    assert v03.read("CONSTANT_BUFFER_SIZE_SHIFTED4(0)") == 512 >> 4
    assert v03.read("MAX_SM_CONFIG_SHARED_MEM_SIZE") == 0x1A  # tinygrad's value for 100 KiB
    assert v03.read("MIN_SM_CONFIG_SHARED_MEM_SIZE") == 3
    assert len(v03.to_bytes()) == 256 and len(v04.to_bytes()) == 384


@pytest.mark.parametrize("cls", [QmdV03, QmdV04])
def test_qmd_writes_refuse_what_does_not_fit(cls):
    qmd = cls()
    with pytest.raises(QmdFieldError, match="CTA_THREAD_DIMENSION1"):
        qmd.set_block(256, 1 << 16, 1)
    with pytest.raises(QmdFieldError, match="zero dimension"):
        qmd.set_grid(0, 1, 1)
    with pytest.raises(QmdFieldError, match="registers"):
        qmd.set_registers(256)
    with pytest.raises(QmdFieldError, match="aligned"):
        qmd.set_constant_buffer(0, 0x1000, 500)  # size not a multiple of 16
    with pytest.raises(QmdFieldError, match="PROGRAM_ADDRESS_UPPER"):
        qmd.set_program_address(1 << 60)
    with pytest.raises(QmdFieldError, match="4-byte aligned"):
        qmd.set_release_semaphore(0x1002, 1)
    with pytest.raises(QmdFieldError, match="bank 0 only"):
        qmd.set_constant_buffer(1, 0x1000, 512)
    with pytest.raises(QmdFieldError, match="no field"):
        qmd.write("NOT_A_FIELD", 1)
    with pytest.raises(QmdFieldError, match="cannot hold"):
        qmd.write("BARRIER_COUNT", -1)
    with pytest.raises(QmdFieldError, match="cannot hold"):
        qmd.write("BARRIER_COUNT", True)


def test_v04_constant_buffer_address_must_be_64_byte_aligned():
    with pytest.raises(QmdFieldError, match="64-byte aligned"):
        QmdV04().set_constant_buffer(0, 0x20_0000_0020, 512)
    QmdV03().set_constant_buffer(0, 0x20_0000_0020, 512)  # V03 holds it unshifted


def test_qmd_refuses_overlapping_fields():
    class Overlapping(QmdV03):
        FIELDS = {**QmdV03.FIELDS, "ALIAS": (583, 576)}

    qmd = Overlapping()
    with pytest.raises(QmdFieldError, match="overlaps field QMD_"):
        qmd.write("ALIAS", 1)


# -- the program component and the QMD table -----------------------------------------------


def test_program_component_holds_code_then_parameter_blocks(plan):
    encoded = encode(plan)
    data, base = encoded.program.data, encoded.program.base
    assert len(data) == plan.program_bytes
    for placed in plan.placed_regions:
        code = plan.region(placed.name).code
        assert data[placed.address - base:][:len(code)] == code
    for index, launch in enumerate(plan.launches):
        offset = plan.parameter_block_address(index) - base
        arguments = encode_parameter_block(plan.target, plan.region(launch.region), launch)
        block = data[offset:offset + plan.target.parameter_block_bytes]
        area = encoder.DRIVER_AREA_BYTES
        assert block[area:] == arguments[area:]  # the arguments as the plan encodes them
        assert block == encoder.parameter_block(plan, index)
        # The driver area, read back by the decoder's own layout.
        driver = decoder.decode_driver_area(block)
        assert driver.block == (launch.block.x, launch.block.y, launch.block.z)
        assert driver.grid == (launch.grid.x, launch.grid.y, launch.grid.z)
        assert driver.shared_window == encoded.shared_memory_window == 0x7294_0000_0000
        assert driver.local_window == encoded.local_memory_window == 0x7293_0000_0000
        assert driver.stack_top == encoder.STACK_TOP == 0xFFFDC0


def test_driver_area_layout():
    area = encoder.driver_area((256, 1, 1), (64, 2, 1), 0x1_2000)
    assert len(area) == 0x30 == encoder.DRIVER_AREA_BYTES
    assert struct.unpack_from("<6I", area, 0) == (256, 1, 1, 64, 2, 1)  # blockDim, gridDim
    assert struct.unpack_from("<2Q2I", area, 0x18) == (
        encoder.SHARED_MEMORY_WINDOW, encoder.LOCAL_MEMORY_WINDOW, 0xFFFDC0, 0x1_2000)
    assert encoder.driver_area((256, 1, 1), (64, 2, 1))[0x2C:] == bytes(4)  # none by default
    assert [(name, offset) for name, offset, _ in decoder.DRIVER_AREA_WORDS] == [
        ("blockDim.x", 0x0), ("blockDim.y", 0x4), ("blockDim.z", 0x8), ("gridDim.x", 0xC),
        ("gridDim.y", 0x10), ("gridDim.z", 0x14), ("shared_window", 0x18),
        ("local_window", 0x20), ("stack_top", 0x28), ("dynamic_shared", 0x2C),
        ("explicit_cluster", 0x140), ("cluster_nctaid.x", 0x144), ("cluster_nctaid.y", 0x148),
        ("cluster_nctaid.z", 0x14C), ("cluster_reciprocal.x", 0x150),
        ("cluster_reciprocal.y", 0x154), ("cluster_reciprocal.z", 0x158),
        ("nclusterid.x", 0x15C), ("nclusterid.y", 0x160), ("nclusterid.z", 0x164),
        ("cluster_nctarank", 0x188)]


def test_patched_parameter_block_keeps_the_driver_area(plan):
    from dataclasses import replace

    index = next(i for i, launch in enumerate(plan.launches) if launch.region == "bob-adamw")
    launch = plan.launches[index]
    position = [p.name for p in plan.region(launch.region).params].index("step_size")
    args = list(launch.args)
    args[position] = Scalar.f32(-0.25)
    patched = replace(launch, args=tuple(args))
    block = encoder.parameter_block(plan, index, patched)
    assert block[:encoder.DRIVER_AREA_BYTES] == encoder.parameter_block(plan, index)[:0x30]
    assert block != encoder.parameter_block(plan, index)
    with pytest.raises(EncodeError, match="only scalar arguments"):
        encoder.parameter_block(plan, index, replace(launch, grid=replace(launch.grid, x=7)))


def test_qmd_table_has_one_record_per_launch(plan):
    encoded = encode(plan)
    record = plan.target.qmd_record_bytes
    assert len(encoded.qmd_table.data) == plan.launch_count * encoded.qmd_stride
    assert len(encoded.qmd_table.data) == plan.qmd_table_bytes
    if plan.target is SM86:
        assert encoded.qmd_stride == record
    else:
        # 384-byte V04 records sit 512 bytes apart: SEND_PCAS_A takes address >> 8.
        assert encoded.qmd_stride == 512
        for index in range(plan.launch_count):
            slot = encoded.qmd_table.data[index * 512:(index + 1) * 512]
            assert slot[record:] == bytes(512 - record)
    for index in range(plan.launch_count):
        assert encoded.qmd_address(index) % 256 == 0


def test_bare_plan_encodes_too(bare_plan):
    encoded = encode(bare_plan)
    assert len(encoded.program.data) == bare_plan.program_bytes
    assert encoded.gpfifo_entries == 1 + bare_plan.submission_count


def test_encoding_is_deterministic(plan):
    first, second = encode(plan), encode(plan)
    assert first == second
    rebuilt = build_plan(CONFIG, plan.target, compiled=stand_in_regions(CONFIG))
    assert encode(rebuilt) == first


# -- pushbuffer and GPFIFO -------------------------------------------------------------------


def _segments(encoded):
    entries = decoder.decode_gpfifo(encoded.gpfifo.data, encoded.host_class)
    bindings: dict[int, int] = {}
    segments = []
    for entry in entries:
        offset = entry.address - encoded.pushbuffer.base
        words = struct.unpack_from(f"<{entry.words}I", encoded.pushbuffer.data, offset)
        segments.append(decoder.decode_segment(words, entry.address, encoded.host_class,
                                               bindings))
    return entries, segments


def test_gpfifo_has_the_setup_then_one_entry_per_submission(plan):
    encoded = encode(plan)
    entries, segments = _segments(encoded)
    assert len(entries) == 1 + plan.submission_count
    assert len(encoded.gpfifo.data) == 8 * len(entries)
    assert all((e.fetch, e.level, e.sync) == ("UNCONDITIONAL", "SUBROUTINE", "PROCEED")
               for e in entries)
    assert entries[0].address == plan.address_map.pushbuffer.base
    setup = [(c.name, c.subchannel) for c in segments[0]]
    assert setup == [
        ("SET_OBJECT", 1),
        ("SET_SHADER_SHARED_MEMORY_WINDOW_A", 1), ("SET_SHADER_SHARED_MEMORY_WINDOW_B", 1),
        ("SET_SHADER_LOCAL_MEMORY_WINDOW_A", 1), ("SET_SHADER_LOCAL_MEMORY_WINDOW_B", 1),
    ]
    assert segments[0][0].field("NVCLASS").value == encoded.compute_class
    shared = segments[0][1].field("BASE_ADDRESS_UPPER").value << 32 | segments[0][2].data
    assert shared == encoder.SHARED_MEMORY_WINDOW and shared % (4 << 30) == 0
    end = plan.address_map.pushbuffer.end
    for entry in entries:
        assert plan.address_map.pushbuffer.base <= entry.address
        assert entry.address + 4 * entry.words <= end


def test_each_submission_dispatches_its_launches_then_releases_its_value(plan):
    encoded = encode(plan)
    _, segments = _segments(encoded)
    for index, (submission, calls) in enumerate(zip(plan.submissions, segments[1:],
                                                    strict=True)):
        expected = []
        for position, launch in enumerate(submission.launches):
            if position:
                expected.append(("WAIT_FOR_IDLE", None))
            expected += [("SEND_PCAS_A", encoded.qmd_address(launch)),
                         ("SEND_SIGNALING_PCAS2_B", "INVALIDATE_COPY_SCHEDULE")]
        expected += [("SEM_ADDR_LO", None), ("SEM_ADDR_HI", None), ("SEM_PAYLOAD_LO", None),
                     ("SEM_PAYLOAD_HI", None), ("SEM_EXECUTE", "RELEASE")]
        seen = []
        for call in calls:
            detail = None
            if call.name == "SEND_PCAS_A":
                detail = call.field("QMD_ADDRESS_SHIFTED8").unshifted
            elif call.name == "SEND_SIGNALING_PCAS2_B":
                detail = call.field("PCAS_ACTION").value_name
            elif call.name == "SEM_EXECUTE":
                detail = call.field("OPERATION").value_name
                assert call.field("RELEASE_WFI").value_name == "EN"
                assert call.field("PAYLOAD_SIZE").value_name == "64BIT"
            seen.append((call.name, detail))
        assert seen == expected
        by_name = {call.name: call for call in calls}
        address = (by_name["SEM_ADDR_LO"].field("OFFSET").in_place
                   | by_name["SEM_ADDR_HI"].field("OFFSET").value << 32)
        # Each submission its own 16-byte slot, a 64-bit payload.
        assert address == encoded.submission_semaphore(index)
        assert address == plan.address_map.semaphores.base + 16 * index
        assert by_name["SEM_PAYLOAD_LO"].data == submission.semaphore
        assert by_name["SEM_PAYLOAD_HI"].data == 0
        entry = decoder.decode_gpfifo(encoded.submission_entry(index), encoded.host_class)[0]
        assert entry.address == calls[0].address - 4  # the segment starts with a header


def test_method_headers_have_the_published_layout():
    # opcode 1 (incrementing) at 31:29, count at 28:16, subchannel at 15:13, method / 4.
    assert incrementing_header(1, 0x2B4, 1) == (1 << 29) | (1 << 16) | (1 << 13) | (0x2B4 >> 2)
    assert non_incrementing_header(0, 0x5C, 5) == (3 << 29) | (5 << 16) | (0x5C >> 2)
    assert immediate_header(1, 0x2C0, 3) == (4 << 29) | (3 << 16) | (1 << 13) | (0x2C0 >> 2)


@pytest.mark.parametrize("build, args, message", [
    (incrementing_header, (8, 0x100, 1), "subchannel"),
    (incrementing_header, (-1, 0x100, 1), "subchannel"),
    (incrementing_header, (True, 0x100, 1), "subchannel"),
    (incrementing_header, (1, 0x100, 0), "at least one"),
    (incrementing_header, (1, 0x100, 1 << 13), "DMA_INCR_COUNT"),
    (non_incrementing_header, (1, 0x100, 1 << 13), "DMA_NONINCR_COUNT"),
    (incrementing_header, (1, 0x102, 1), "aligned"),
    (incrementing_header, (1, 0x4000, 1), "DMA_INCR_ADDRESS"),
    (immediate_header, (1, 0x110, 1 << 13), "DMA_IMMD_DATA"),
    (immediate_header, (1, 0x110, -1), "DMA_IMMD_DATA"),
])
def test_method_header_builders_refuse_bad_values(build, args, message):
    with pytest.raises(CommandError, match=message):
        build(*args)


@pytest.mark.parametrize("host", [AMPERE_CHANNEL_GPFIFO_A, HOPPER_CHANNEL_GPFIFO_A],
                         ids=lambda h: h.name)
def test_gpfifo_entries_check_alignment_and_limits(host):
    entry = gpfifo_entry(host, 0x12_3456_7890, 9)
    decoded = decoder.decode_gpfifo(entry, host.number)[0]
    assert (decoded.address, decoded.words) == (0x12_3456_7890, 9)
    with pytest.raises(CommandError, match="4-byte aligned"):
        gpfifo_entry(host, 0x1002, 1)
    with pytest.raises(CommandError, match="at least one word"):
        gpfifo_entry(host, 0x1000, 0)
    with pytest.raises(CommandError, match="GP_ENTRY1_LENGTH"):
        gpfifo_entry(host, 0x1000, 1 << 21)
    with pytest.raises(CommandError, match="GP_ENTRY1_GET_HI"):
        gpfifo_entry(host, 1 << 40, 1)


def test_pushbuffer_refuses_overflow_and_wide_words():
    pushbuffer = Pushbuffer(0x1000, 0x1010)
    pushbuffer.incrementing(0, 0x5C, [1, 2])
    with pytest.raises(CommandError, match="full"):
        pushbuffer.incrementing(0, 0x5C, [1, 2])
    with pytest.raises(CommandError, match="32 bits"):
        Pushbuffer(0x1000, 0x2000).incrementing(0, 0x5C, [1 << 32])
    with pytest.raises(CommandError, match="word aligned"):
        Pushbuffer(0x1002, 0x2000)


def test_pack_word_names_the_field():
    with pytest.raises(CommandError, match=r"SEM_ADDR_HI_OFFSET \(bits 7:0"):
        AMPERE_CHANNEL_GPFIFO_A.pack({"SEM_ADDR_HI_OFFSET": 256})
    with pytest.raises(CommandError, match="overlaps"):
        pack_word("test", {"A": (3, 0), "B": (4, 2)}, {"A": 1, "B": 1})


def test_hopper_semaphore_address_may_exceed_40_bits():
    # SEM_ADDR_HI_OFFSET is 7:0 in clc56f.h, 24:0 in clc86f.h.
    assert HOPPER_CHANNEL_GPFIFO_A.pack({"SEM_ADDR_HI_OFFSET": 1 << 20}) == 1 << 20
    with pytest.raises(CommandError):
        AMPERE_CHANNEL_GPFIFO_A.pack({"SEM_ADDR_HI_OFFSET": 1 << 20})


# -- layout checks, files and the listing ---------------------------------------------------


def test_encoder_refuses_a_plan_inside_a_memory_window():
    program = build_program(CONFIG, compiled=stand_in_regions(CONFIG))
    plan = place(program, SM86, va_base=encoder.SHARED_MEMORY_WINDOW)
    with pytest.raises(EncodeError, match="shared memory window"):
        encode(plan)


def test_emit_holds_every_component_and_an_index(plan):
    encoded = encode(plan)
    files = emitted(encoded)
    index = json.loads(files["index.json"])
    assert index["format"] == "bob-nv-components" and index["version"] == 3
    assert index["submission_policy"] == plan.submission_policy == "per-launch"
    assert index["semaphores"]["submission_slots"] == f"0x{encoded.submission_semaphore(0):x}"
    assert index["semaphores"]["slot_bytes"] == 16
    assert index["target"] == plan.target.name
    assert set(files) == {"program.bin", "qmd-table.bin", "pushbuffer.bin", "gpfifo.bin",
                          "semaphores.bin", "index.json"}
    for component, listed in zip(encoded.components, index["components"], strict=True):
        assert files[listed["file"]] == component.data
        assert listed["bytes"] == len(component.data)
        assert listed["base"] == (None if component.base is None else f"0x{component.base:x}")


def test_disassembly_lists_entries_methods_qmds_and_parameters(plan):
    encoded = encode(plan)
    text = decoder.disassemble(encoded, plan)
    for index in range(1 + plan.submission_count):
        assert f"GPFIFO entry {index} " in text
    assert text.count("SEND_PCAS_A") == sum(s.count for s in plan.submissions)
    assert text.count("    QMD V") == plan.launch_count  # each QMD listed once
    assert "CTA_RASTER_WIDTH" in text or "GRID_WIDTH" in text
    assert "(tensor parameters+0x0)" in text
    assert "step_size" in text and "unexplained" not in text
    assert "(unlabelled)" not in text
    assert text.count("blockDim.x") == plan.launch_count  # every driver area, labelled
    assert "DISAGREES" not in text


def test_disassembly_is_deterministic(plan):
    encoded = encode(plan)
    assert decoder.disassemble(encoded, plan) == decoder.disassemble(encode(plan), plan)


# -- docs/NV-FIELDS.md -------------------------------------------------------------------------


def test_nv_fields_doc_lists_every_qmd_field_with_its_bits():
    text = (ROOT / "docs" / "NV-FIELDS.md").read_text()
    rows = re.findall(r"^\| (V0[34]_00) \| `([A-Z0-9_()]+)` \| (\d+):(\d+) \|", text, re.M)
    documented = {(version, name): (int(high), int(low)) for version, name, high, low in rows}
    for version, cls in (("V03_00", QmdV03), ("V04_00", QmdV04)):
        target = SM86 if cls is QmdV03 else SM90
        plan = build_plan(CONFIG, target, compiled=stand_in_regions(CONFIG))
        qmd: Qmd = encode_qmd(plan, 0)
        for name in qmd.fields_set:
            assert documented.get((version, name)) == cls.FIELDS[name], (version, name)
