"""The program's invocation layout, and the Session applying it: for each schedule and
mode (corpus with and without validation), a full load and a resident invocation, training
and predicting, the writes, clears, scalar patches, submissions and reads the host makes are
the ones the layout asks for."""

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
    VALIDATION_INITIAL_LOSS,
    VALIDATION_INPUT,
    VALIDATION_LOSS,
    VALIDATION_WEIGHTS,
    WEIGHTS_TENSOR,
    BobConfig,
    adam_scalar_table,
    build_plan,
)
from bob.program.invocation import ScalarPatches, ScalarRows, invocation_layout, plan_config
from bob.records.binary import RESULT_TENSORS
from bob.records.checkpoint import Checkpoint
from conftest import bob_config, validation_record


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

    def clear_tensors(self, names):
        self.calls.append(("clear", tuple(names)))
        super().clear_tensors(names)

    def start(self, submissions):
        self.calls.append(("start", submissions))
        super().start(submissions)

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
    """Every tensor written as zeros or cleared on the device by `calls`."""
    cleared = {name for call in calls if call[0] == "clear" for name in call[1]}
    return cleared | {name for name, data in written(calls).items()
                      if data == bytes(plan.tensor(name).bytes)}


def started(calls: list[tuple]) -> list[range]:
    return [call[1] for call in calls if call[0] == "start"]


# (schedule, mode, validation pairs): corpus with K = 40 pairs, and K_val = 10 or none
CASES = [(schedule, mode, validation) for schedule in ("seed", "fused")
         for mode, validation in (("hard", 0), ("corpus", 0), ("corpus", 10))]


def case_config(schedule: str, mode: str, validation: int) -> BobConfig:
    sparse = {"pairs": 40, "validation_pairs": validation} if mode == "corpus" else {}
    return BobConfig(vocab=32, prompts=2, updates=3, mode=mode, schedule=schedule, **sparse)


@pytest.mark.parametrize(("schedule", "mode", "validation"), CASES)
def test_the_layout_names_the_plans_tensors(schedule, mode, validation):
    config = case_config(schedule, mode, validation)
    plan = build_plan(config)
    layout = invocation_layout(config)
    assert plan_config(plan) == config
    names = {tensor.name for tensor in plan.tensors}
    assert {*layout.checkpoint, layout.input, *layout.cleared_on_load,
            *layout.cleared_when_resident, *layout.results, layout.health,
            *layout.training_reads, *layout.input_tables, *(layout.validation_losses or ()),
            *([layout.validation_input] if layout.validation_input else [])} <= names
    # The checkpoint's tables lie in arena order, one after another.
    addresses = [plan.tensor(name).address for name in layout.checkpoint]
    assert layout.checkpoint == CHECKPOINT_TENSORS and addresses == sorted(addresses)
    assert layout.results == RESULT_TENSORS  # the result record's one definition
    assert layout.health == HEALTH_TENSOR
    assert layout.cleared_on_load == ("gradients", "training_loss", HEALTH_TENSOR)
    assert layout.cleared_when_resident == ("training_loss", HEALTH_TENSOR)
    losses = (VALIDATION_INITIAL_LOSS, VALIDATION_LOSS) if validation else ()
    assert layout.validation_losses == (losses or None)
    assert layout.training_reads == (*RESULT_TENSORS, *losses, HEALTH_TENSOR)
    assert layout.reads(True) == (*layout.training_reads, *CHECKPOINT_TENSORS)
    assert layout.reads(True, tables=False) == layout.training_reads
    assert layout.reads(False) == (*RESULT_TENSORS, *losses)
    # The inputs' pairs are scattered into tables the host zeroes first, by the first
    # submissions: per-launch one per scatter.
    assert layout.validation_input == (VALIDATION_INPUT if validation else None)
    assert layout.input_tables == (() if mode == "hard" else (
        WEIGHTS_TENSOR, *([VALIDATION_WEIGHTS] if validation else [])))
    assert layout.load_submissions == len(layout.input_tables) == config.load_launches
    assert [plan.launches[s.first_launch].label for s in
            plan.submissions[:layout.load_submissions]] == [
        f"scatter->{table}" for table in layout.input_tables]
    if schedule == "fused":
        assert layout.adam_scalars == ScalarRows(ADAM_SCALARS_TENSOR)
    else:
        # Update k's AdamW launch: after the forward launches (the loads, the initial loss,
        # with validation the starting table's validation loss, 2P predictions), every
        # other launch.
        forward = config.load_launches + 1 + int(validation > 0) + 2 * 2
        assert layout.adam_scalars == ScalarPatches(
            tuple(forward + 2 * k for k in range(3)), ADAM_SCALAR_NAMES)
        assert [plan.launches[i].label for i in layout.adam_scalars.launches] == \
            ["adamw[0]", "adamw[1]", "adamw[2]"]


def test_chained_corpus_plans_load_in_one_submission():
    config = bob_config(vocab=32, prompts=2, updates=3, mode="corpus", pairs=40,
                        validation_pairs=10, submission="chained")
    plan = build_plan(config)
    layout = invocation_layout(config)
    assert layout.load_submissions == 1
    loads = plan.submissions[0]
    assert (loads.first_launch, loads.count) == (0, 2)
    assert plan.forward_submissions == 2


@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_an_invocation_without_updates_has_no_scalars_and_reads_the_results(schedule):
    layout = invocation_layout(BobConfig(vocab=16, updates=0, schedule=schedule))
    assert layout.adam_scalars is None
    # no health check runs: a request without updates reads the result record alone
    assert layout.training_reads == layout.reads(True, tables=False) == layout.reads(False) \
        == RESULT_TENSORS
    validating = invocation_layout(bob_config(vocab=16, updates=0, schedule=schedule,
                                              mode="corpus", validation_pairs=3))
    assert validating.training_reads == validating.reads(False) == (
        *RESULT_TENSORS, VALIDATION_INITIAL_LOSS, VALIDATION_LOSS)


def test_a_plan_of_another_program_has_no_configuration():
    plan = build_plan(BobConfig(vocab=16))
    with pytest.raises(ValueError, match="not a plan of Bob's program"):
        plan_config(replace(plan, attributes={}))


@pytest.mark.parametrize(("schedule", "mode", "validation"), CASES)
def test_the_session_applies_the_layout(schedule, mode, validation):
    config = case_config(schedule, mode, validation)
    layout = invocation_layout(config)
    hyper = Hyper(lr=0.05)
    record = random_record(config, 7)
    held_out = validation_record(config, 9) if validation else None
    inputs = {layout.input: record.payload()}
    if held_out is not None:
        inputs[VALIDATION_INPUT] = held_out.payload()
    start = Checkpoint.zeros(32, hyper, mode)
    choice = replace(choose_backend("cpu"), opener=RecordingCpu)
    with Session(choice, hyper) as session:
        # A full load: the tables, the inputs, the clears (the scatters' tables among them),
        # the scalars; every submission, the loads first; then the reads.
        first = session.invoke(config, start, record, "train", validation=held_out)
        backend = session.last_backend
        plan = backend.plan
        calls, backend.calls = backend.calls, []
        wrote = written(calls)
        assert set(wrote) == {*layout.checkpoint, *inputs, *layout.cleared_on_load,
                              *layout.input_tables,
                              *([ADAM_SCALARS_TENSOR] if schedule == "fused" else [])}
        for name in layout.checkpoint:
            assert wrote[name] == getattr(start, name).tobytes()
        for name, payload in inputs.items():
            assert wrote[name] == payload
        assert zeroed(calls, plan) >= {*layout.cleared_on_load, *layout.input_tables}
        assert started(calls) == [range(0, plan.submission_count)]
        if mode == "corpus":  # the scatters left the records' dense tables
            assert backend.read_tensor(WEIGHTS_TENSOR) == record.dense_weights().tobytes()
        if held_out is not None:
            assert backend.read_tensor(VALIDATION_WEIGHTS) == \
                held_out.dense_weights().tobytes()
            assert first.validation is not None
        else:
            assert first.validation is None
        table = adam_scalar_table(hyper, 1, 3)
        patches = [call for call in calls if call[0] == "patch"]
        if schedule == "fused":
            assert wrote[ADAM_SCALARS_TENSOR] == table.tobytes() and patches == []
        else:
            ((_, launches, names, words),) = patches
            assert (launches, names) == (layout.adam_scalars.launches, ADAM_SCALAR_NAMES)
            assert words.tobytes() == \
                np.ascontiguousarray(table.view(np.uint32)[:, :len(names)]).tobytes()
        assert [call for call in calls if call[0] == "read"] == [("read", layout.reads(True))]

        # Resident: no table, not the unchanged inputs; the resident clears and the scalars
        # of steps 4-6 in one batch; the loads are not run again (their tables hold them).
        session.invoke(config, first.checkpoint, record, "train", validation=held_out)
        calls, backend.calls = backend.calls, []
        batches = [call for call in calls if call[0] in ("write", "batch")]
        assert len(batches) == 1 and batches[0][0] == "batch"
        wrote = written(calls)
        assert set(wrote) == {*layout.cleared_when_resident,
                              *([ADAM_SCALARS_TENSOR] if schedule == "fused" else [])}
        assert zeroed(calls, plan) == set(layout.cleared_when_resident)
        assert started(calls) == [range(layout.load_submissions, plan.submission_count)]
        table = adam_scalar_table(hyper, 4, 3)
        if schedule == "fused":
            assert wrote[ADAM_SCALARS_TENSOR] == table.tobytes()
        else:
            ((_, launches, _, words),) = [call for call in calls if call[0] == "patch"]
            assert launches == layout.adam_scalars.launches
            assert words.tobytes() == np.ascontiguousarray(
                table.view(np.uint32)[:, :len(ADAM_SCALAR_NAMES)]).tobytes()
        assert [call for call in calls if call[0] == "read"] == [("read", layout.reads(True))]

        # A changed input is written in that batch too, its tables cleared and loaded again.
        other = random_record(config, 8)
        state = session.invoke(config, first.checkpoint, record, "train",
                               validation=held_out).checkpoint
        backend.calls = []
        session.invoke(config, state, other, "train", validation=held_out)
        assert written(backend.calls)[layout.input] == other.payload()
        assert zeroed(backend.calls, plan) >= set(layout.input_tables)
        assert started(backend.calls) == [range(0, plan.submission_count)]
        if mode == "corpus":
            assert backend.read_tensor(WEIGHTS_TENSOR) == other.dense_weights().tobytes()

        # Predicting: its own arena (no updates), the parameters loaded (no forward launch
        # reads a moment: they are cleared), no scalars, the forward submissions, the
        # results (and the validation losses) read.
        session.invoke(config, start, record, "predict", validation=held_out)
        predicting = session.last_backend
        forward = invocation_layout(replace(config, updates=0))
        assert predicting is not backend
        assert not [call for call in predicting.calls if call[0] == "patch"]
        assert set(written(predicting.calls)) == {forward.checkpoint[0], *inputs,
                                                  *forward.cleared_on_load,
                                                  *forward.input_tables}
        assert zeroed(predicting.calls, predicting.plan) >= {
            *forward.checkpoint[1:], *forward.cleared_on_load, *forward.input_tables}
        assert started(predicting.calls) == [range(0, predicting.plan.forward_submissions)]
        assert [call for call in predicting.calls if call[0] == "read"] == [
            ("read", forward.reads(False))]
