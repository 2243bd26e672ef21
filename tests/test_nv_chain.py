"""Chained submissions: the policy in the plan, the dependent-QMD fields, the chain
followed by the decoder and nv-sim, byte identity with the CPU, and the nv backend's
one doorbell and cheap patches on the scripted driver.

The dependent fields are checked three ways: against the encoder's log, through the
decoder's own tables, and word by word against bit ranges this file reads from the
vendored header itself.
"""

from __future__ import annotations

import re
import struct
from dataclasses import replace

import numpy as np
import pytest

from bob.backends.cpu import CpuBackend
from bob.backends.nv import decoder, encoder
from bob.backends.nv.decoder import DecodeError, follow_chain
from bob.backends.nv.encoder import EncodeError, chain_links, encode, encode_qmd
from bob.backends.nv.qmd import QmdFieldError, QmdV03
from bob.backends.nv.sim import NvSimBackend, NvSimError
from bob.cli.main import main
from bob.config import SUBMISSION_POLICIES
from bob.errors import BadInput
from bob.host.check import differential_check
from bob.kernels import signatures as sig
from bob.kernels.cuda.regions import catalogue
from bob.plan.certificate import certify
from bob.plan.jsonio import dumps, loads
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
    Target,
    TensorRef,
    TensorSpec,
)
from bob.plan.placement import SM86, SM90, place
from bob.program.bob import BobConfig, Hyper, adam_scalars, build_plan, declared_regions
from conftest import bob_config

TARGETS = (SM86, SM90)
CHAINED = BobConfig(vocab=256, prompts=2, updates=3, submission="chained")


def _compiled(config: BobConfig, target: Target) -> dict:
    """Stand-in machine code, distinct per region."""
    names = [r.name for r in declared_regions(config, target)]
    return {name: sig.declared_region(name, code=bytes([i + 1]) * (96 + 160 * i))
            for i, name in enumerate(names)}


@pytest.fixture(params=TARGETS, ids=lambda t: t.name)
def target(request):
    return request.param


def _plan(target, config=CHAINED):
    return build_plan(config, target, compiled=_compiled(config, target))


# -- the policy in the program and the plan --------------------------------------------------


def test_chained_program_has_a_forward_a_training_and_a_prediction_submission():
    plan = build_plan(CHAINED)
    forward, training = CHAINED.forward_launches, CHAINED.training_launches(plan.target)
    assert plan.submission_policy == "chained"
    assert plan.submissions == (Submission(0, forward, 1), Submission(forward, training, 2),
                                Submission(1, 2 * CHAINED.prompts, 3))
    assert plan.forward_submissions == CHAINED.forward_submissions == 1
    assert plan.submission_count == CHAINED.submission_count(plan.target) == 3
    assert plan.attributes["submission"] == "chained"
    assert certify(plan).holds


@pytest.mark.parametrize("prompts, updates, schedule, expected", [
    (0, 3, "seed", 2), (2, 0, "seed", 2), (0, 0, "seed", 1), (1, 5, "fused", 3),
])
def test_chained_submission_counts(prompts, updates, schedule, expected):
    config = BobConfig(vocab=64, prompts=prompts, updates=updates, schedule=schedule,
                       submission="chained")
    plan = build_plan(config)
    assert plan.submission_count == config.submission_count(plan.target) == expected
    assert certify(plan).holds
    covered = sorted({launch for s in plan.submissions for launch in s.launches})
    assert covered == list(range(plan.launch_count))


def test_per_launch_is_the_default_and_the_same_launches():
    per_launch = build_plan(replace(CHAINED, submission="per-launch"))
    assert BobConfig().submission == "per-launch" == SUBMISSION_POLICIES[0]
    assert build_plan(replace(CHAINED, submission="per-launch")) == build_plan(
        BobConfig(vocab=256, prompts=2, updates=3))
    chained = build_plan(CHAINED)
    assert chained.launches == per_launch.launches  # only the grouping differs
    assert all(s.count == 1 for s in per_launch.submissions)


def test_bob_config_refuses_an_unknown_policy():
    with pytest.raises(BadInput, match=r"^submission must be one of per-launch, chained, not "
                                       r"'batched'$"):
        BobConfig(submission="batched")  # type: ignore[arg-type]


def test_plan_json_keeps_the_policy():
    plan = build_plan(CHAINED)
    text = dumps(plan)
    assert loads(text, regions=catalogue()).submission_policy == "chained"
    assert loads(text, regions=catalogue()) == plan
    older = re.sub(r'\s*"submission_policy": "chained",', "", text)
    assert '"submission_policy"' not in older
    # plans from before the policy
    assert loads(older, regions=catalogue()).submission_policy == "per-launch"
    with pytest.raises(BadInput, match=r"submission_policy: 'x' is not one of per-launch, "
                                       r"chained$"):
        loads(text.replace('"submission_policy": "chained"', '"submission_policy": "x"'),
              regions=catalogue())


# -- the dependent-QMD fields ----------------------------------------------------------------

_PREFIX = {"V03_00": "NVCBC0_QMDV03_00_", "V04_00": "NVCBC0_QMDV04_00_"}
# The header's names for dependent QMD 0 (the field names differ between versions).
_DEPENDENT_DEFINES = {
    "V03_00": ("DEPENDENT_QMD0_ENABLE", "DEPENDENT_QMD0_ACTION", "DEPENDENT_QMD0_PREFETCH",
               "DEPENDENT_QMD0_POINTER"),
    "V04_00": ("DEPENDENT_QMD_ENABLE(i)", "DEPENDENT_QMD_ACTION(i)",
               "DEPENDENT_QMD_PREFETCH(i)", "DEPENDENT_QMD0_POINTER"),
}


def _header_bits(version: str) -> dict[str, tuple[int, int]]:
    """(high, low) of the dependent fields, read from the header's text by this test."""
    text = (decoder.HEADERS / "clcbc0qmd.h").read_text()
    found = {}
    for name in _DEPENDENT_DEFINES[version]:
        line = re.search(rf"^#define {_PREFIX[version]}{re.escape(name)}\s+(\S+)", text, re.M)
        assert line, name
        # MW(high:low), or MW((high0+(i)*stride):(low0+(i)*stride)): instance 0's bits
        # are the first number of each side.
        high, low = (int(re.findall(r"\d+", side)[0])
                     for side in line.group(1)[3:-1].split(":"))
        found[name.replace("(i)", "")] = (high, low)
    return found


def _header_value(version: str, name: str) -> int:
    text = (decoder.HEADERS / "clcbc0qmd.h").read_text()
    line = re.search(rf"^#define {_PREFIX[version]}{name}\s+(0x[0-9a-fA-F]+)", text, re.M)
    assert line, name
    return int(line.group(1), 16)


def _bits(record: bytes, high: int, low: int) -> int:
    """Bits high:low of a record, read as little-endian 32-bit words (NVIDIA's MW)."""
    words = struct.unpack(f"<{len(record) // 4}I", record)
    value = 0
    for bit in range(low, high + 1):
        value |= (words[bit // 32] >> (bit % 32) & 1) << (bit - low)
    return value


def _record(encoded, plan, index):
    return encoded.qmd_table.data[index * encoded.qmd_stride:][:plan.target.qmd_record_bytes]


def test_encoder_writes_the_dependent_fields_where_the_header_says(target):
    plan = _plan(target)
    encoded = encode(plan)
    version = encoded.qmd_version
    bits = _header_bits(version)
    names = list(bits)  # enable, action, prefetch, pointer
    schedule_value = _header_value(version, names[1] + "_QMD_SCHEDULE")
    links = chain_links(plan)
    # the training submission: three updates' AdamW and loss, then the health check (11)
    assert links == {0: 1, 1: 2, 2: 3, 3: 4, 5: 6, 6: 7, 7: 8, 8: 9, 9: 10, 10: 11}
    for index in range(plan.launch_count):
        record = _record(encoded, plan, index)
        got = [_bits(record, *bits[name]) for name in names]
        if index in links:
            assert got == [1, schedule_value, 1, encoded.qmd_address(links[index]) >> 8], index
        else:
            assert got == [0, 0, 0, 0], index  # the last launch of a chain names no QMD


def test_decoder_reads_the_dependents_back(target):
    plan = _plan(target)
    encoded = encode(plan)
    links = chain_links(plan)
    for index in range(plan.launch_count):
        qmd = encode_qmd(plan, index, links)
        decoded = decoder.decode_qmd(_record(encoded, plan, index), encoded.compute_class)
        for name, value in qmd.fields_set.items():
            assert decoded.get(name) == value, (index, name)
        assert decoded.unexplained() == 0
        dependents = decoded.dispatch().dependents
        if index in links:
            assert dependents == (decoder.Dependent(encoded.qmd_address(links[index]),
                                                    "QMD_SCHEDULE", True),)
        else:
            assert dependents == ()


_LATCH_DEFINES = ("ENABLE_PROGRAM_PRE_EXIT", "ARRIVE_AT_LATCH_VALID", "ARRIVE_AT_LATCH_ID",
                  "WAIT_ON_LATCH_VALID", "WAIT_ON_LATCH_ID",
                  "LATCH_ACQUIRE_INVALIDATE_SHADER_DATA_CACHE",
                  "LATCH_ACQUIRE_INVALIDATE_TEXTURE_DATA_CACHE")


def _latch_bits() -> dict[str, tuple[int, int]]:
    """(high, low) of V04's latch and pre-exit fields, read from the header by this test."""
    text = (decoder.HEADERS / "clcbc0qmd.h").read_text()
    found = {}
    for name in _LATCH_DEFINES:
        line = re.search(rf"^#define NVCBC0_QMDV04_00_{name}\s+MW\((\d+):(\d+)\)", text, re.M)
        assert line, name
        found[name] = (int(line.group(1)), int(line.group(2)))
    return found


def test_hopper_chains_pre_exit_into_a_latch_the_dependent_waits_on():
    plan = _plan(SM90)
    encoded = encode(plan)
    assert encoded.qmd_version == "V04_00"
    bits = _latch_bits()
    links = chain_links(plan)
    for index in range(plan.launch_count):
        got = {name: _bits(_record(encoded, plan, index), *place)
               for name, place in bits.items()}
        arrives = index in links
        waits = links.get(index - 1) == index
        assert got == {
            "ENABLE_PROGRAM_PRE_EXIT": int(arrives), "ARRIVE_AT_LATCH_VALID": int(arrives),
            "ARRIVE_AT_LATCH_ID": index + 1 if arrives else 0,
            "WAIT_ON_LATCH_VALID": int(waits), "WAIT_ON_LATCH_ID": index if waits else 0,
            "LATCH_ACQUIRE_INVALIDATE_SHADER_DATA_CACHE": int(waits),
            "LATCH_ACQUIRE_INVALIDATE_TEXTURE_DATA_CACHE": int(waits),
        }, index
    per_launch = encode(_plan(SM90, replace(CHAINED, submission="per-launch")))
    for index in range(plan.launch_count):  # one submission per launch: nothing to latch
        assert not any(_bits(_record(per_launch, plan, index), *place)
                       for place in bits.values()), index


def test_ampere_qmds_have_no_latches_and_chain_by_completion():
    plan = _plan(SM86)
    assert encode(plan).qmd_version == "V03_00"
    for index in range(plan.launch_count):
        assert not any("LATCH" in name or "PRE_EXIT" in name
                       for name in encode_qmd(plan, index).fields_set), index
    with pytest.raises(QmdFieldError, match="QMD V03_00 has no latches"):
        QmdV03().set_latched_chain(1, None)


@pytest.mark.parametrize("field, message", [
    ("WAIT_ON_LATCH_VALID", "launch 1 may start before its predecessor completes .* waits on "
                            "latch None, not on the predecessor's 1"),
    ("ARRIVE_AT_LATCH_VALID", "launch 1 may start before .* latch 1, not on the "
                              "predecessor's None"),
])
def test_decoder_refuses_an_early_dependent_without_its_latch(field, message):
    plan = _plan(SM90)
    encoded = encode(plan)
    bad = _plant(encoded, 1 if field.startswith("WAIT") else 0, {field: 0})
    with pytest.raises(DecodeError, match=message):
        follow_chain(bad, bad.qmd_address(0))
    with pytest.raises(DecodeError, match=message):
        decoder.disassemble(bad, plan)


def test_disasm_lists_the_latches():
    plan = _plan(SM90)
    text = decoder.disassemble(encode(plan), plan)
    links = chain_links(plan)
    assert text.count("on completion: arrive at latch") == len(links)
    assert text.count("before running: wait on latch") == len(links)
    assert text.count("(program pre-exit)") == len(links)
    assert "before running: wait on latch 1, then invalidate the data caches" in text


def test_only_the_chain_fields_differ_from_the_per_launch_qmds(target):
    chained = encode(_plan(target))
    per_launch = encode(_plan(target, replace(CHAINED, submission="per-launch")))
    assert chained.program == per_launch.program
    layout = decoder.TABLES.qmd[chained.qmd_version[1:]]
    mask = 0
    for name, f in layout.fields.items():
        if name.startswith("DEPENDENT_QMD") or "LATCH" in name or "PRE_EXIT" in name:
            mask |= f.mask
    for index in range(len(chained.qmd_table.data) // chained.qmd_stride):
        a = int.from_bytes(_record(chained, _plan(target), index), "little")
        b = int.from_bytes(_record(per_launch, _plan(target), index), "little")
        assert a & ~mask == b and b & mask == 0, index


def test_chained_segments_dispatch_the_first_launch_and_release_once(target):
    plan = _plan(target)
    encoded = encode(plan)
    entries = decoder.decode_gpfifo(encoded.gpfifo.data, encoded.host_class)
    bindings: dict[int, int] = {}
    segments = []
    for entry in entries:
        words = struct.unpack_from(f"<{entry.words}I", encoded.pushbuffer.data,
                                   entry.address - encoded.pushbuffer.base)
        segments.append(decoder.decode_segment(words, entry.address, encoded.host_class,
                                               bindings))
    for submission, calls in zip(plan.submissions, segments[1:], strict=True):
        assert [c.name for c in calls] == [
            "SEND_PCAS_A", "SEND_SIGNALING_PCAS2_B", "SEM_ADDR_LO", "SEM_ADDR_HI",
            "SEM_PAYLOAD_LO", "SEM_PAYLOAD_HI", "SEM_EXECUTE"]
        assert calls[0].field("QMD_ADDRESS_SHIFTED8").unshifted == encoded.qmd_address(
            submission.first_launch)
        assert calls[4].data == submission.semaphore
        assert calls[6].field("RELEASE_WFI").value_name == "EN"
        chain = follow_chain(encoded, encoded.qmd_address(submission.first_launch))
        assert [encoded.qmd_address(i) for i in submission.launches] == [a for a, _ in chain]


FILL = Region("fill", code=b"\x11" * 40, registers=16, block_x=64,
              params=(PointerParam("out", Footprint(4, ("count",)), "write"),
                      ScalarParam("value", "f32"), ScalarParam("count", "u32")))


def test_encoder_refuses_a_chain_a_qmd_cannot_hold(target):
    """Launch 0 continues to launch 1 in one submission and ends another: one QMD cannot
    say both."""
    launches = tuple(LaunchSpec("fill", Dim3(1), Dim3(64),
                                (TensorRef("x"), Scalar.f32(value), Scalar.u32(16)))
                     for value in (1.0, 2.0))
    program = ProgramSpec(
        regions=(FILL,), tensors=(TensorSpec("x", "f32", (16,)),), launches=launches,
        submissions=(Submission(0, 2, 1), Submission(0, 1, 2)), submission_policy="chained")
    plan = place(program, target)
    assert certify(plan).holds
    with pytest.raises(EncodeError, match=r"^chained plan: launch 0 ends submission 1 but "
                                          r"continues to launch 1 in another; [^\n]*$"):
        encode(plan)
    encode(replace(plan, submission_policy="per-launch"))  # the same plan, unchained


# -- planted bad chains ----------------------------------------------------------------------


def _plant(encoded, index, field_values):
    """The encoded program with QMD `index`'s fields set to these values."""
    layout = decoder.TABLES.qmd[encoded.qmd_version[1:]]
    table = bytearray(encoded.qmd_table.data)
    start = index * encoded.qmd_stride
    bits = int.from_bytes(table[start:start + layout.record_bytes], "little")
    for name, value in field_values.items():
        f = layout.field(name)
        bits = bits & ~f.mask | value << f.low
    table[start:start + layout.record_bytes] = bits.to_bytes(layout.record_bytes, "little")
    return replace(encoded, qmd_table=replace(encoded.qmd_table, data=bytes(table)))


@pytest.mark.parametrize("where, message", [
    ("program", "is not a QMD: the table holds"),
    ("misaligned", "is not a QMD: the table holds"),
    ("cycle", "cycles: launch 0 -> 1 -> 0"),
    ("zeroed", "says major version 0, not"),
])
def test_decoder_refuses_a_planted_bad_chain_in_one_line(target, where, message):
    plan = _plan(target)
    encoded = encode(plan)
    if where == "zeroed":  # QMD 1, which QMD 0 names, holds no QMD
        table = bytearray(encoded.qmd_table.data)
        table[encoded.qmd_stride:2 * encoded.qmd_stride] = bytes(encoded.qmd_stride)
        bad = replace(encoded, qmd_table=replace(encoded.qmd_table, data=bytes(table)))
    else:
        pointer = {"program": plan.address_map.program.base,
                   "misaligned": encoded.qmd_address(1) + 256 if encoded.qmd_stride > 256
                   else encoded.qmd_table.base + len(encoded.qmd_table.data),
                   "cycle": encoded.qmd_address(0)}[where]
        index = 1 if where == "cycle" else 0
        bad = _plant(encoded, index, {"DEPENDENT_QMD0_POINTER": pointer >> 8})
    with pytest.raises(DecodeError, match=message) as caught:
        follow_chain(bad, bad.qmd_address(0))
    assert "\n" not in str(caught.value)
    with pytest.raises(DecodeError, match=message):
        decoder.disassemble(bad, plan)


def test_nv_sim_refuses_a_planted_cycle_before_running_anything(target):
    plan = _plan(target)
    backend = NvSimBackend(plan)
    _, table = backend._components["qmd-table"]
    layout = decoder.TABLES.qmd[backend.encoded.qmd_version[1:]]
    f = layout.field("DEPENDENT_QMD0_POINTER")
    start = 2 * backend.encoded.qmd_stride + f.low // 32 * 4  # QMD 2 names QMD 1 again
    table[start:start + 4] = struct.pack("<I", backend.encoded.qmd_address(1) >> 8)
    with pytest.raises(NvSimError, match=r"cycles: launch 1 -> 2 -> 1$") as caught:
        backend.run(range(1))
    assert "\n" not in str(caught.value)
    assert not backend.launched  # the chain was refused before its first kernel


# -- nv-sim follows the chain ------------------------------------------------------------------


def test_nv_sim_runs_chained_launches_from_their_predecessors(target):
    plan = _plan(target)
    calls: list[str] = []
    kernels = {r.name: (lambda name: lambda memory, args: calls.append(name))(r.name)
               for r in plan.regions}
    backend = NvSimBackend(plan, kernels=kernels)
    backend.run(range(plan.submission_count))
    address = backend.encoded.qmd_address
    expected = [launch for s in plan.submissions for launch in s.launches]
    # The first launch of a submission comes from the pushbuffer (no predecessor); each
    # later one from the completion of the launch before it.
    predecessors = [None if launch == s.first_launch else address(launch - 1)
                    for s in plan.submissions for launch in s.launches]
    assert [(x.qmd_address, x.predecessor) for x in backend.launched] == [
        (address(i), before) for i, before in zip(expected, predecessors, strict=True)]
    assert calls == [plan.launches[i].region for i in expected]
    host = [(r.address, r.value) for r in backend.releases if r.source == "host"]
    assert host == [(backend.encoded.submission_semaphore(i), s.semaphore)
                    for i, s in enumerate(plan.submissions)]  # one release per submission
    progress = [r.value for r in backend.releases if r.source == "qmd"]
    assert progress == [i + 1 for i in expected]
    assert backend.last_semaphore == 3


@pytest.mark.parametrize("vocab", [256, 300])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_chained_nv_sim_is_byte_identical_to_the_cpu(vocab, mode, schedule):
    """Three invocations (2, 2 and 1 updates), two prompts, on both targets."""
    config = bob_config(vocab=vocab, prompts=2, updates=2, mode=mode, schedule=schedule,
                        submission="chained")
    for arch in ("sm_86", "sm_90"):
        report = differential_check(("cpu", "nv-sim"), config, 5, seed=vocab, arch=arch)
        assert report.identical, report.difference
        assert report.invocations == 3


def test_chained_and_per_launch_leave_the_same_bytes(target):
    config = BobConfig(vocab=64, prompts=3, updates=4)
    rng = np.random.default_rng(3)
    record = np.concatenate([rng.integers(0, 64, 64), rng.integers(0, 64, 3)]).astype("<u4")
    table = rng.standard_normal((64, 64)).astype("<f4")
    results = []
    for backend in (CpuBackend(_plan(target, config)),
                    NvSimBackend(_plan(target, replace(config, submission="chained")))):
        backend.write_tensor("input", record.tobytes())
        backend.write_tensor("parameters", table.tobytes())
        backend.set_scalars(config.adamw_launch(1), adam_scalars(Hyper(lr=0.03), 2))
        backend.run(range(backend.plan.submission_count))
        results.append({t.name: backend.read_tensor(t.name) for t in backend.plan.tensors})
    assert results[0] == results[1]


# -- the nv backend on the scripted driver ---------------------------------------------------


def _hopper_plan(config):
    code = bytes(range(256)) * 2
    compiled = {name: sig.declared_region(name, code, registers=24, shared_bytes=2048)
                for name in sig.SIGNATURES}
    return build_plan(config, SM90, compiled=compiled)


def _open(monkeypatch, plan):
    from bob.backends.nv.rm import channel as ch
    from bob.backends.nv.rm.backend import NvBackend
    from bob.backends.nv.rm.device import RmDevice
    from nv_fakes import FakeDriver

    waits: list[tuple[int, str]] = []
    doorbells: list[int] = []
    monkeypatch.setattr(ch.Channel, "wait",
                        lambda channel, read, target, deadline, what: waits.append(
                            (target, what)) or target)
    original = RmDevice.ring_doorbell
    monkeypatch.setattr(RmDevice, "ring_doorbell",
                        lambda device, token: doorbells.append(token) or original(device, token))
    backend = NvBackend(plan, transport=FakeDriver().transport(), deadline_s=0.01)
    return backend, waits, doorbells


@pytest.mark.parametrize("queued", [True, False])
def test_nv_backend_runs_a_chained_invocation_with_one_doorbell(monkeypatch, queued):
    from bob.backends.nv.rm.backend import NvBackend
    from bob.backends.nv.rm.stream import RUNTIME_BLOCK_VA, SEGMENT_BYTES

    monkeypatch.setattr(NvBackend, "queue_runs", queued)
    plan = _hopper_plan(replace(CHAINED, updates=20))
    backend, waits, doorbells = _open(monkeypatch, plan)
    assert doorbells == [backend.channel.token]  # the set-up
    backend.run(range(plan.submission_count))
    assert len(doorbells) == 2  # the whole invocation: one more
    ring = backend.channel.ring
    entries = [ring.read(8 * slot, 8) for slot in range(1, backend.channel.put_count)]
    plan_entries = [backend.encoded.submission_entry(i) for i in range(3)]
    if queued:  # between the runtime's acquire and its release of counter value 1
        assert entries[1:4] == plan_entries and len(entries) == 5
        addresses = [decoder.decode_gpfifo(entry, 0xC86F)[0].address
                     for entry in (entries[0], entries[4])]
        assert addresses == [RUNTIME_BLOCK_VA, RUNTIME_BLOCK_VA + SEGMENT_BYTES]
        assert waits[-1] == (1, "submissions 0 to 2 (runtime item 1)")
    else:
        assert entries == plan_entries
        assert waits[-1] == (3, "submission 2's semaphore")
    program = backend.blocks["qmd-table"]
    assert program.read(0, len(backend.encoded.qmd_table.data)) == backend.encoded.qmd_table.data
    backend.close()


def test_nv_backend_patches_only_the_changed_words(monkeypatch):
    from bob.backends.nv.rm.memory import Allocation

    config = BobConfig(vocab=256, prompts=1, updates=3)
    plan = _hopper_plan(config)
    backend, _, _ = _open(monkeypatch, plan)
    writes: list[tuple[str, int, int]] = []
    original = Allocation.write
    monkeypatch.setattr(Allocation, "write", lambda block, offset, data: writes.append(
        (block.name, offset, len(data))) or original(block, offset, data))
    hyper = Hyper()
    launch = config.adamw_launch(1)
    backend.set_scalars(launch, adam_scalars(hyper, 2))  # the values the plan holds
    assert writes == []
    backend.set_scalars(launch, adam_scalars(hyper, 7))  # step 7: step_size and eps_hat
    block = plan.parameter_block_address(launch) - plan.address_map.program.base
    params = [p.name for p in plan.region(sig.ADAMW).params]
    from bob.plan.placement import argument_slots
    slots = {s.param.name: s.offset for s in argument_slots(plan.target,
                                                            plan.region(sig.ADAMW).params)}
    assert params.index("eps_hat") == params.index("step_size") + 1
    assert writes == [("program", block + slots["step_size"], 8)]  # one copy, two words
    device = backend.blocks["program"].read(block, plan.target.parameter_block_bytes)
    assert device[0x30:] == backend.parameter_block(launch)[0x30:]
    assert device[:0x30] == encoder.parameter_block(plan, launch)[:0x30]  # driver area stays
    backend.close()


# -- the command line ----------------------------------------------------------------------------


def test_plan_disasm_shows_the_chain(capsys):
    assert main(["plan", "-N", "2", "-P", "1", "--submission", "chained", "--disasm"]) == 0
    out = capsys.readouterr().out
    plan = build_plan(BobConfig(prompts=1, updates=2, submission="chained"))
    assert "(chained submissions)" in out
    assert out.count("GPFIFO entry") == plan.submission_count + 1 == 4
    assert out.count("SEND_PCAS_A") == plan.submission_count
    assert out.count(", scheduled by launch") == sum(s.count - 1 for s in plan.submissions)
    assert out.count("QMD_SCHEDULE the QMD at") == len(chain_links(plan))
    assert out.count("QMD V03_00 at") == plan.launch_count


def test_plan_json_and_check_take_the_policy(capsys):
    assert main(["plan", "-N", "2", "--submission", "chained", "--json"]) == 0
    plan = loads(capsys.readouterr().out, regions=catalogue())
    assert plan.submission_policy == "chained"
    assert main(["check", "--backends", "cpu,nv-sim", "--submission", "chained", "--steps", "4",
                 "-N", "2", "--json"]) == 0
    assert '"identical": true' in capsys.readouterr().out


@pytest.mark.parametrize("command", [
    ["plan", "--emit", "{out}"], ["check"], ["train", "--checkpoint", "{out}/c.safetensors"],
    ["bench", "--save", "{out}/b.json"],
])
def test_an_unknown_policy_is_refused_and_nothing_is_written(command, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [word.format(out=out) for word in command] + ["--submission", "batched"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--submission': 'batched' is not one of 'auto', " \
           "'per-launch', 'chained'." in err
    assert not out.exists()


def test_nv_fields_doc_lists_the_dependent_fields_with_their_bits(target):
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "NV-FIELDS.md").read_text()
    rows = re.findall(r"^\| (V0[34]_00) \| `([A-Z0-9_()]+)` \| (\d+):(\d+) \|", text, re.M)
    documented = {(version, name): (int(high), int(low)) for version, name, high, low in rows}
    plan = _plan(target)
    for launch in (0, 1):  # launch 0 is chained to launch 1, which is chained to 2
        qmd = encode_qmd(plan, launch)
        assert any(name.startswith("DEPENDENT_QMD") for name in qmd.fields_set)
        for name in qmd.fields_set:
            assert documented.get((qmd.version, name)) == qmd.FIELDS[name], name


# -- the probe kernel's two-launch submission, chained; and Bob's plan on the H200 -----------


def _chained_two_launch_plan():
    from test_nv_rm import _two_launch_plan

    return replace(_two_launch_plan(), submission_policy="chained")


def test_chained_two_launch_submission_on_nv_sim():
    from test_nv_rm import _exercise_two_launches, _probe_reference

    backend = NvSimBackend(_chained_two_launch_plan(), kernels={"probe": _probe_reference})
    encoded = _exercise_two_launches(backend)
    text = decoder.disassemble(encoded, backend.plan)
    assert "WAIT_FOR_IDLE" not in text and "(b, scheduled by launch 0 on completion)" in text


def _nv_present() -> bool:
    from test_nv_rm import _nv_present as present

    return present()


@pytest.mark.gpu
@pytest.mark.skipif(not _nv_present(), reason="no NVIDIA kernel driver here")
def test_chained_two_launch_submission_on_hopper():
    """b runs because a's QMD schedules it; a re-run and patched scalars, as per-launch."""
    from bob.backends.nv.rm.backend import NvBackend
    from test_nv_rm import _exercise_two_launches

    with NvBackend(_chained_two_launch_plan(), deadline_s=10) as backend:
        _exercise_two_launches(backend)
        assert backend.launch_progress() == 2  # launch 1 (b) completed last


@pytest.mark.gpu
@pytest.mark.skipif(not _nv_present(), reason="no NVIDIA kernel driver here")
@pytest.mark.parametrize("vocab", [256, 1024, 8192])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_chained_bob_plan_on_hopper_is_byte_identical_to_cpu(vocab, mode, schedule):
    pytest.importorskip("cuda.bindings.nvrtc", reason="the nv backend compiles with NVRTC")
    updates, steps = (10, 25) if vocab <= 1024 else (1, 2)
    config = bob_config(vocab=vocab, prompts=2, updates=updates, mode=mode, schedule=schedule,
                        submission="chained")
    report = differential_check(("cpu", "nv"), config, steps, arenas=("device", "host"))
    print(f"V={vocab} {mode} {schedule} chained: {report.invocations} invocations, "
          f"{report.bytes_compared:,} bytes, identical={report.identical}")
    assert report.identical, report.difference


def test_train_chained_on_nv_sim_writes_the_cpu_checkpoint(tmp_path, capsys):
    chained, reference = tmp_path / "chained.safetensors", tmp_path / "cpu.safetensors"
    assert main(["train", "--backend", "nv-sim", "--submission", "chained", "--steps", "3",
                 "-N", "2", "--checkpoint", str(chained)]) == 0
    assert main(["train", "--backend", "cpu", "--steps", "3", "-N", "2",
                 "--checkpoint", str(reference)]) == 0
    capsys.readouterr()
    assert chained.read_bytes() == reference.read_bytes()


def test_plan_table_names_the_policy(capsys):
    for policy in SUBMISSION_POLICIES:
        assert main(["plan", "-N", "2", "--submission", policy]) == 0
        assert f"Submissions ({policy})" in capsys.readouterr().out


def test_nv_backend_wait_restarts_its_deadline_while_a_chain_makes_progress(monkeypatch):
    """One long chained submission moves GP_GET once; its launches' releases show it runs."""
    from bob.backends.nv.rm import channel as ch
    from bob.backends.nv.rm.ioctl import SubmissionTimeout

    plan = _hopper_plan(replace(CHAINED, updates=20))
    backend, _, _ = _open(monkeypatch, plan)
    semaphores = backend.blocks["semaphores"]
    progress = backend.encoded.launch_progress_address - semaphores.gpu_va
    calls: list[int] = []

    def slow_chain(channel, read, target, deadline, what):
        calls.append(target)
        if len(calls) < 3:  # two deadlines pass, each with one more launch completed
            semaphores.write(progress, struct.pack("<I", 5 + len(calls)))
            raise SubmissionTimeout(f"{what} is 0, not {target}")
        return target

    monkeypatch.setattr(ch.Channel, "wait", slow_chain)
    backend.run(range(1, 2))
    assert calls == [1, 1, 1]  # the runtime counter's first value: the run queued

    def stuck(channel, read, target, deadline, what):
        raise SubmissionTimeout(f"{what} is 0, not {target}")

    monkeypatch.setattr(ch.Channel, "wait", stuck)
    with pytest.raises(SubmissionTimeout, match=r"submissions 1 to 1 \(runtime item 2\) is 0, "
                                                r"not 2; the last launch completed is 6 \("):
        backend.run(range(1, 2))
    backend.close()
