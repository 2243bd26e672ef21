"""The nv backend's host copies on the scripted driver: an invocation's AdamW scalars in one
pass and one copy, and the semaphore slots zeroed in spans; the same device bytes as the
launch-by-launch path.

    .venv/bin/python -m pytest -q tests/test_nv_rm_patches.py
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from bob.backends.nv.rm import channel as ch
from bob.backends.nv.rm.backend import (
    MERGE_GAP_BYTES,
    SEMAPHORE_BYTES,
    NvBackend,
    semaphore_spans,
    word_spans,
)
from bob.backends.nv.rm.memory import Allocation
from bob.kernels import signatures as sig
from bob.plan.placement import SM90
from bob.program.bob import ADAM_SCALAR_NAMES, BobConfig, Hyper, adam_scalar_table, build_plan
from test_nv_rm import FakeDriver


def _plan(config: BobConfig):
    code = bytes(range(256)) * 2  # stand-in machine code: nothing runs on the fake driver
    compiled = {name: sig.declared_region(name, code, registers=24, shared_bytes=2048)
                for name in sig.SIGNATURES}
    return build_plan(config, SM90, compiled=compiled)


@pytest.fixture
def writes(monkeypatch) -> list[tuple[str, int, int]]:
    """Every Allocation.write as (allocation, offset, bytes); each Channel.wait met at once."""
    monkeypatch.setattr(ch.Channel, "wait",
                        lambda channel, read, target, deadline, what: target)
    seen: list[tuple[str, int, int]] = []
    original = Allocation.write

    def recording(block, offset, data):
        seen.append((block.name, offset, len(data)))
        original(block, offset, data)

    monkeypatch.setattr(Allocation, "write", recording)
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
        # Step 1 is what the plan was built with: nothing changes, nothing is copied.
        assert len(program_writes) == (1 if changed else 0), program_writes
        assert changed == (first_step != 1)


def test_an_invocations_patches_are_one_copy_of_the_changed_span(writes):
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
        assert writes == [("program", 4 * differ[0], 4 * (differ[-1] + 1 - differ[0]))]
        # Two of the seven scalars move between two invocations: step_size and eps_hat.
        assert len(differ) == 2 * config.updates
        writes.clear()
        backend.set_scalars_many(launches, ADAM_SCALAR_NAMES, bits)  # the same again
        assert writes == []


def test_patches_far_apart_are_separate_copies(writes):
    config = BobConfig(vocab=256, prompts=0, updates=8)
    plan = _plan(config)
    near, far = config.adamw_launch(0), config.adamw_launch(7)
    gap = plan.parameter_block_address(far) - plan.parameter_block_address(near)
    assert gap > MERGE_GAP_BYTES  # the launches' blocks are far enough apart
    bits = adam_scalar_table(Hyper(), 301, 2).view(np.uint32)[:, :len(ADAM_SCALAR_NAMES)]
    with _open(plan) as many, _open(plan) as one_by_one:
        writes.clear()
        many.set_scalars_many([near, far], ADAM_SCALAR_NAMES, bits)
        assert len([w for w in writes if w[0] == "program"]) == 2
        _patch_one_by_one(one_by_one, [near, far], bits)
        assert _program(many) == _program(one_by_one)


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


def test_word_spans_join_indices_within_the_gap():
    assert word_spans(np.array([3, 4, 5, 100, 2000, 2001]), 1024) == [(3, 101), (2000, 2002)]
    assert word_spans(np.array([7]), 1) == [(7, 8)]
    assert word_spans(np.array([1, 3]), 1) == [(1, 2), (3, 4)]
    assert word_spans(np.array([1, 3]), 2) == [(1, 4)]


@pytest.mark.parametrize(("submissions", "copies"), [(range(0, 5), 2), (range(2, 5), 1)])
def test_run_zeroes_the_slots_in_spans_and_keeps_the_launch_progress(submissions, copies,
                                                                     writes):
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
