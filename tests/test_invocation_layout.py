"""The program's invocation layout, and the Session applying it: for each schedule and
mode, a full load and a resident invocation, training and predicting, the writes, clears,
scalar patches and reads the host makes are the ones the layout asks for."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bob.backends import choose_backend
from bob.backends.cpu import CpuBackend
from bob.config import CHECKPOINT_TENSORS, Hyper
from bob.host.check import random_record
from bob.host.session import Session
from bob.program.bob import (
    ADAM_SCALAR_NAMES,
    ADAM_SCALARS_TENSOR,
    HEALTH_TENSOR,
    BobConfig,
    adam_scalar_table,
    build_plan,
)
from bob.program.invocation import ScalarPatches, ScalarRows, invocation_layout, plan_config
from bob.records.binary import RESULT_TENSORS
from bob.records.checkpoint import Checkpoint


class RecordingCpu(CpuBackend):
    """The CPU backend, keeping every host call that moves data, in order."""

    def __init__(self, plan, *args, **kwargs):
        super().__init__(plan, *args, **kwargs)
        self.calls: list[tuple] = []

    def write_tensor(self, name, data, offset=0):
        self.calls.append(("write", name, bytes(data)))
        super().write_tensor(name, data, offset)

    def write_tensors(self, writes):
        self.calls.append(("batch", tuple((name, bytes(data)) for name, data in writes)))
        super().write_tensors(writes)

    def set_scalars_many(self, launches, names, words, dtype="f32"):
        self.calls.append(("patch", tuple(launches), tuple(names), np.array(words)))
        super().set_scalars_many(launches, names, words, dtype)

    def begin_read(self, names):
        self.calls.append(("read", tuple(names)))
        return super().begin_read(names)


def written(calls: list[tuple]) -> dict[str, bytes]:
    """Every tensor written by `calls`, by name, with the bytes written last."""
    out: dict[str, bytes] = {}
    for call in calls:
        if call[0] == "write":
            out[call[1]] = call[2]
        elif call[0] == "batch":
            out.update(call[1])
    return out


def zeroed(calls: list[tuple], plan) -> set[str]:
    return {name for name, data in written(calls).items()
            if data == bytes(plan.tensor(name).bytes)}


SCHEDULES_AND_MODES = [(schedule, mode) for schedule in ("seed", "fused")
                       for mode in ("hard", "corpus")]


@pytest.mark.parametrize(("schedule", "mode"), SCHEDULES_AND_MODES)
def test_the_layout_names_the_plans_tensors(schedule, mode):
    config = BobConfig(vocab=32, prompts=2, updates=3, mode=mode, schedule=schedule)
    plan = build_plan(config)
    layout = invocation_layout(config)
    assert plan_config(plan) == config
    names = {tensor.name for tensor in plan.tensors}
    assert {*layout.checkpoint, layout.input, *layout.cleared_on_load,
            *layout.cleared_when_resident, *layout.results, layout.health,
            *layout.training_reads} <= names
    # The checkpoint's tables lie in arena order, one after another.
    addresses = [plan.tensor(name).address for name in layout.checkpoint]
    assert layout.checkpoint == CHECKPOINT_TENSORS and addresses == sorted(addresses)
    assert layout.results == RESULT_TENSORS  # the result record's one definition
    assert layout.health == HEALTH_TENSOR
    assert layout.cleared_on_load == ("gradients", "training_loss", HEALTH_TENSOR)
    assert layout.cleared_when_resident == ("training_loss", HEALTH_TENSOR)
    assert layout.training_reads == (*RESULT_TENSORS, HEALTH_TENSOR, *CHECKPOINT_TENSORS)
    assert layout.reads(False) == RESULT_TENSORS
    if schedule == "fused":
        assert layout.adam_scalars == ScalarRows(ADAM_SCALARS_TENSOR)
    else:
        # Update k's AdamW launch: after the forward launches, every other launch.
        assert layout.adam_scalars == ScalarPatches(
            tuple(1 + 2 * 2 + 2 * k for k in range(3)), ADAM_SCALAR_NAMES)
        assert [plan.launches[i].label for i in layout.adam_scalars.launches] == \
            ["adamw[0]", "adamw[1]", "adamw[2]"]


@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_an_invocation_without_updates_has_no_scalars_and_reads_the_results(schedule):
    layout = invocation_layout(BobConfig(vocab=16, updates=0, schedule=schedule))
    assert layout.adam_scalars is None
    assert layout.training_reads == layout.reads(True) == RESULT_TENSORS


def test_a_plan_of_another_program_has_no_configuration():
    plan = build_plan(BobConfig(vocab=16))
    with pytest.raises(ValueError, match="not a plan of Bob's program"):
        plan_config(replace(plan, attributes={}))


@pytest.mark.parametrize(("schedule", "mode"), SCHEDULES_AND_MODES)
def test_the_session_applies_the_layout(schedule, mode):
    config = BobConfig(vocab=32, prompts=2, updates=3, mode=mode, schedule=schedule)
    layout = invocation_layout(config)
    hyper = Hyper(lr=0.05)
    record = random_record(config, 7)
    start = Checkpoint.zeros(32, hyper, mode)
    choice = replace(choose_backend("cpu"), opener=RecordingCpu)
    with Session(choice, hyper) as session:
        # A full load: the tables, the input, the clears, the scalars; then the reads.
        first = session.invoke(config, start, record, "train")
        backend = session.last_backend
        plan = backend.plan
        calls, backend.calls = backend.calls, []
        wrote = written(calls)
        assert set(wrote) == {*layout.checkpoint, layout.input, *layout.cleared_on_load,
                              *([ADAM_SCALARS_TENSOR] if schedule == "fused" else [])}
        for name in layout.checkpoint:
            assert wrote[name] == getattr(start, name).tobytes()
        assert wrote[layout.input] == record.payload()
        assert zeroed(calls, plan) >= set(layout.cleared_on_load)
        table = adam_scalar_table(hyper, 1, 3)
        patches = [call for call in calls if call[0] == "patch"]
        if schedule == "fused":
            assert wrote[ADAM_SCALARS_TENSOR] == table.tobytes() and patches == []
        else:
            ((_, launches, names, words),) = patches
            assert (launches, names) == (layout.adam_scalars.launches, ADAM_SCALAR_NAMES)
            assert words.tobytes() == \
                np.ascontiguousarray(table.view(np.uint32)[:, :len(names)]).tobytes()
        assert [call for call in calls if call[0] == "read"] == [("read",
                                                                  layout.training_reads)]

        # Resident: no table, not the unchanged input; the resident clears and the scalars
        # of steps 4-6 in one batch.
        session.invoke(config, first.checkpoint, record, "train")
        calls, backend.calls = backend.calls, []
        batches = [call for call in calls if call[0] in ("write", "batch")]
        assert len(batches) == 1 and batches[0][0] == "batch"
        wrote = written(calls)
        assert set(wrote) == {*layout.cleared_when_resident,
                              *([ADAM_SCALARS_TENSOR] if schedule == "fused" else [])}
        assert zeroed(calls, plan) == set(layout.cleared_when_resident)
        table = adam_scalar_table(hyper, 4, 3)
        if schedule == "fused":
            assert wrote[ADAM_SCALARS_TENSOR] == table.tobytes()
        else:
            ((_, launches, _, words),) = [call for call in calls if call[0] == "patch"]
            assert launches == layout.adam_scalars.launches
            assert words.tobytes() == np.ascontiguousarray(
                table.view(np.uint32)[:, :len(ADAM_SCALAR_NAMES)]).tobytes()
        assert [call for call in calls if call[0] == "read"] == [("read",
                                                                  layout.training_reads)]

        # A changed input is written in that batch too.
        other = random_record(config, 8)
        state = session.invoke(config, first.checkpoint, record, "train").checkpoint
        backend.calls = []
        session.invoke(config, state, other, "train")
        assert written(backend.calls)[layout.input] == other.payload()

        # Predicting: its own arena (no updates), loaded, no scalars, the results read.
        session.invoke(config, start, record, "predict")
        predicting = session.last_backend
        forward = invocation_layout(replace(config, updates=0))
        assert predicting is not backend
        assert not [call for call in predicting.calls if call[0] == "patch"]
        assert set(written(predicting.calls)) == {*forward.checkpoint, forward.input,
                                                  *forward.cleared_on_load}
        assert [call for call in predicting.calls if call[0] == "read"] == [
            ("read", RESULT_TENSORS)]
