"""The nv backend's host copies on the scripted driver: an invocation's AdamW scalars in one
pass, only the changed words stored, and the semaphore slots zeroed in spans; the same device
bytes as the launch-by-launch path.

    .venv/bin/python -m pytest -q tests/test_nv_rm_patches.py
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from bob.backends.nv.rm import channel as ch
from bob.backends.nv.rm.backend import SEMAPHORE_BYTES, NvBackend, semaphore_spans
from bob.backends.nv.rm.memory import Allocation
from bob.kernels import signatures as sig
from bob.plan.placement import SM90
from bob.program.bob import ADAM_SCALAR_NAMES, BobConfig, Hyper, adam_scalar_table, build_plan
from nv_fakes import FakeDriver


def _plan(config: BobConfig):
    code = bytes(range(256)) * 2  # stand-in machine code: nothing runs on the fake driver
    compiled = {name: sig.declared_region(name, code, registers=24, shared_bytes=2048)
                for name in sig.SIGNATURES}
    return build_plan(config, SM90, compiled=compiled)


@pytest.fixture
def writes(monkeypatch) -> list[tuple[str, int, int]]:
    """Every Allocation.write as (allocation, offset, bytes) and every store_words as
    (allocation, "words", word count); each Channel.wait met at once."""
    monkeypatch.setattr(ch.Channel, "wait",
                        lambda channel, read, target, deadline, what: target)
    seen: list = []
    original, original_words = Allocation.write, Allocation.store_words

    def recording(block, offset, data):
        seen.append((block.name, offset, len(data)))
        original(block, offset, data)

    def recording_words(block, offset, indices, values):
        seen.append((block.name, "words", len(indices)))
        original_words(block, offset, indices, values)

    monkeypatch.setattr(Allocation, "write", recording)
    monkeypatch.setattr(Allocation, "store_words", recording_words)
    return seen


def _open(plan) -> NvBackend:
    return NvBackend(plan, transport=FakeDriver().transport(), deadline_s=0.01)


def _program(backend: NvBackend) -> bytes:
    return backend.blocks["program"].read(0, backend.blocks["program"].size)


def _patch_one_by_one(backend: NvBackend, launches, bits) -> None:
    from bob.plan.model import Scalar

    for launch, row in zip(launches, bits.tolist(), strict=True):
        backend.set_scalars(launch, {name: Scalar("f32", word)
                                     for name, word in zip(ADAM_SCALAR_NAMES, row, strict=True)})


@pytest.mark.parametrize("first_step", [1, 101, 7])
def test_set_scalars_many_leaves_the_bytes_launch_by_launch_patches_leave(first_step, writes):
    config = BobConfig(vocab=256, prompts=1, updates=20)
    plan = _plan(config)
    launches = [config.adamw_launch(k) for k in range(config.updates)]
    bits = adam_scalar_table(Hyper(), first_step, config.updates).view(np.uint32)[
        :, :len(ADAM_SCALAR_NAMES)]
    with _open(plan) as many, _open(plan) as one_by_one:
        before = _program(many)
        writes.clear()
        many.set_scalars_many(launches, ADAM_SCALAR_NAMES, bits)
        program_writes = [w for w in writes if w[0] == "program"]
        _patch_one_by_one(one_by_one, launches, bits)
        assert _program(many) == _program(one_by_one)
        for launch in launches:  # and the base class's blocks agree with the device
            offset = plan.parameter_block_address(launch) - plan.address_map.program.base
            block = _program(many)[offset:offset + plan.target.parameter_block_bytes]
            assert block[0x30:] == many.parameter_block(launch)[0x30:]
        changed = before != _program(many)
        # Step 1 is what the plan was built with: nothing changes, nothing is stored.
        assert len(program_writes) == (1 if changed else 0), program_writes
        assert changed == (first_step != 1)


def test_an_invocations_patches_are_one_store_of_the_changed_words(writes):
    config = BobConfig(vocab=256, prompts=0, updates=50)
    plan = _plan(config)
    launches = [config.adamw_launch(k) for k in range(config.updates)]
    bits = adam_scalar_table(Hyper(), 201, config.updates).view(np.uint32)[
        :, :len(ADAM_SCALAR_NAMES)]
    with _open(plan) as backend:
        before = np.frombuffer(_program(backend), np.uint32).copy()
        writes.clear()
        backend.set_scalars_many(launches, ADAM_SCALAR_NAMES, bits)
        after = np.frombuffer(_program(backend), np.uint32)
        differ = np.flatnonzero(before != after)
        # Two of the seven scalars move between two invocations: step_size and eps_hat.
        # They, and nothing between them, are stored: in one call.
        assert len(differ) == 2 * config.updates
        assert writes == [("program", "words", len(differ))]
        writes.clear()
        backend.set_scalars_many(launches, ADAM_SCALAR_NAMES, bits)  # the same again
        assert writes == []


def test_a_store_outside_the_mapping_is_refused_and_nothing_is_written(writes):
    config = BobConfig(vocab=256, prompts=0, updates=2)
    with _open(_plan(config)) as backend:
        program = backend.blocks["program"]
        before = _program(backend)
        with pytest.raises(IndexError, match="a word outside program"):
            program.store_words(0, np.array([0, program.size // 4]), np.ones(2, np.uint32))
        with pytest.raises(ValueError, match="not 4-byte aligned"):
            program.store_words(2, np.array([0]), np.ones(1, np.uint32))
        assert _program(backend) == before


def test_calls_with_other_launches_patch_their_own_blocks(writes):
    """The word table is kept for the launches last asked: other launches get theirs."""
    config = BobConfig(vocab=256, prompts=0, updates=6)
    plan = _plan(config)
    adamw = [config.adamw_launch(k) for k in range(config.updates)]
    with _open(plan) as many, _open(plan) as one_by_one:
        for step, launches in ((11, adamw), (21, adamw[1::2]), (31, adamw[:2]), (41, adamw)):
            bits = adam_scalar_table(Hyper(), step, len(launches)).view(np.uint32)[
                :, :len(ADAM_SCALAR_NAMES)]
            many.set_scalars_many(launches, ADAM_SCALAR_NAMES, bits)
            _patch_one_by_one(one_by_one, launches, bits)
            assert _program(many) == _program(one_by_one), (step, launches)


def test_set_scalars_many_on_a_closed_backend_says_so(writes):
    config = BobConfig(vocab=256, prompts=0, updates=2)
    backend = _open(_plan(config))
    backend.close()
    bits = np.zeros((1, len(ADAM_SCALAR_NAMES)), np.uint32)
    from bob.errors import RunFailure
    with pytest.raises(RunFailure, match="^the nv backend is closed$"):
        backend.set_scalars_many([config.adamw_launch(0)], ADAM_SCALAR_NAMES, bits)


# -- the semaphore slots ----------------------------------------------------------------------


def test_semaphore_spans_join_consecutive_slots_but_leave_the_launch_progress():
    assert semaphore_spans(0x1000, range(0, 5)) == [(0x1000, 8), (0x1010, 16 * 3 + 8)]
    assert semaphore_spans(0x1000, range(2, 5)) == [(0x1020, 16 * 2 + 8)]
    assert semaphore_spans(0x1000, range(0, 1)) == [(0x1000, 8)]
    assert semaphore_spans(0x1000, range(1, 2)) == [(0x1010, 8)]
    assert semaphore_spans(0x1000, range(3, 3)) == []
    assert semaphore_spans(0x1000, range(1, 6, 2)) == [(0x1010, 8), (0x1030, 8), (0x1050, 8)]


@pytest.mark.parametrize(("submissions", "copies"), [(range(0, 5), 2), (range(2, 5), 1)])
def test_run_zeroes_the_slots_in_spans_and_keeps_the_launch_progress(submissions, copies,
                                                                     writes, monkeypatch):
    monkeypatch.setattr(NvBackend, "queue_runs", False)  # runs waited for by their slots
    config = BobConfig(vocab=256, prompts=1, updates=3)
    plan = _plan(config)
    with _open(plan) as backend:
        semaphores = backend.blocks["semaphores"]
        # As an earlier run leaves them: every slot released, the progress of its last
        # launch in slot 0's spare half, the other spare halves as uploaded (zero).
        slots = [backend.encoded.submission_semaphore(i) - semaphores.gpu_va
                 for i in range(plan.submission_count)]
        for slot in slots:
            semaphores.write(slot, b"\xff" * SEMAPHORE_BYTES)
        progress = backend.encoded.launch_progress_address - semaphores.gpu_va
        semaphores.write(progress, struct.pack("<I", plan.launch_count))
        expected = bytearray(semaphores.read(0, semaphores.size))
        for index in submissions:  # what zeroing slot by slot leaves
            expected[slots[index]:slots[index] + SEMAPHORE_BYTES] = bytes(SEMAPHORE_BYTES)
        writes.clear()
        backend.run(submissions)
        assert len([w for w in writes if w[0] == "semaphores"]) == copies
        assert semaphores.read(0, semaphores.size) == bytes(expected)
        assert backend.launch_progress() == plan.launch_count
        assert [backend.semaphore(i) for i in submissions] == [0] * len(submissions)
        assert backend.semaphore(1 if submissions.start else 6) == 2**64 - 1  # not run
