"""The corpus plan on the sparse input: its structure, its certificate, and nv-sim.

A corpus plan carries the input's K pairs (keys u64[K], values f32[K], then the prompts)
and, with validation, K_val pairs of its own; the load launches (bob-scatter) write them
into the `weights` (and `validation_weights`) tables the loss reads. Here: the tensors,
launches and submissions of every schedule and policy, with and without validation, as
the module docstring of bob.program.bob states them; the certificate refusing a scatter
that reaches past its pairs; and the command stream (nv-sim) leaving the cpu backend's
bytes in every tensor, the scatter alone and whole invocations.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from bob.backends import choose_backend
from bob.backends.cpu import CpuBackend
from bob.backends.nv.sim import NvSimBackend
from bob.config import Hyper
from bob.host.check import random_record
from bob.host.session import Session
from bob.kernels import signatures as sig
from bob.plan.certificate import certify
from bob.plan.model import Address, Plan, Scalar
from bob.plan.placement import SM86, SM90
from bob.program.bob import (
    ADAM_SCALARS_TENSOR,
    HEALTH_TENSOR,
    PAIR_BYTES,
    TENSOR_NAMES,
    VALIDATION_INITIAL_LOSS,
    VALIDATION_INPUT,
    VALIDATION_LOSS,
    VALIDATION_WEIGHTS,
    WEIGHTS_TENSOR,
    BobConfig,
    build_plan,
)
from bob.program.invocation import invocation_layout
from bob.records.checkpoint import Checkpoint
from conftest import assert_same_tensors, stand_in_regions, validation_record

V, P, N, K, K_VAL = 64, 2, 3, 700, 90  # K > 2 x 256: a scatter of three blocks


def corpus_config(schedule: str = "seed", submission: str = "per-launch",
                  validation_pairs: int = K_VAL, updates: int = N, vocab: int = V,
                  pairs: int = K) -> BobConfig:
    return BobConfig(vocab=vocab, prompts=P, updates=updates, mode="corpus",
                     schedule=schedule,  # type: ignore[arg-type]
                     submission=submission,  # type: ignore[arg-type]
                     pairs=pairs, validation_pairs=validation_pairs)


def args_of(plan: Plan, index: int) -> dict[str, Address | Scalar]:
    launch = plan.launches[index]
    params = plan.region(launch.region).params
    return {p.name: arg for p, arg in zip(params, launch.args, strict=True)}


def with_args(plan: Plan, index: int, **changed: Address | Scalar) -> Plan:
    launch = plan.launches[index]
    params = [p.name for p in plan.region(launch.region).params]
    args = list(launch.args)
    for name, value in changed.items():
        args[params.index(name)] = value
    launches = list(plan.launches)
    launches[index] = replace(launch, args=tuple(args))
    return replace(plan, launches=tuple(launches))


# -- the structure, per schedule and policy ------------------------------------------------

CASES = [(schedule, submission, validation) for schedule in ("seed", "fused")
         for submission in ("per-launch", "chained") for validation in (0, K_VAL)]


@pytest.mark.parametrize(("schedule", "submission", "validation"), CASES)
def test_a_corpus_plan_loads_first_then_runs_the_seeds_launches(schedule, submission,
                                                                 validation):
    config = corpus_config(schedule, submission, validation)
    for target in (SM86, SM90):
        plan = build_plan(config, target)
        assert certify(plan).holds, certify(plan).hazards
        validates = validation > 0
        # The tensors: the seed's nine in their order (the input K pairs and the prompts),
        # the fused schedule's scalars, the weights, the validation's four, health last.
        names = [t.name for t in plan.tensors]
        assert names == [*TENSOR_NAMES, *([ADAM_SCALARS_TENSOR] if schedule == "fused" else []),
                         WEIGHTS_TENSOR,
                         *([VALIDATION_INPUT, VALIDATION_WEIGHTS, VALIDATION_INITIAL_LOSS,
                            VALIDATION_LOSS] if validates else []), HEALTH_TENSOR]
        assert plan.tensor("input").bytes == PAIR_BYTES * K + 4 * P == config.input_bytes
        assert plan.tensor(WEIGHTS_TENSOR).shape == (V, V)
        if validates:
            assert plan.tensor(VALIDATION_INPUT).bytes == PAIR_BYTES * K_VAL
            assert plan.tensor(VALIDATION_WEIGHTS).shape == (V, V)
            assert plan.tensor(VALIDATION_INITIAL_LOSS).shape == (V,)
            assert plan.tensor(VALIDATION_LOSS).shape == (V,)
        hard = build_plan(BobConfig(vocab=V, prompts=P, updates=N, schedule=schedule,
                                    submission=submission), target)  # type: ignore[arg-type]
        for name in ("parameters", "first_moment", "second_moment", "gradients", "input"):
            assert plan.tensor(name).address == hard.tensor(name).address, name

        # The launches: the loads, the starting losses, the predictions, training, the
        # health check and the trained table's validation loss.
        loads = 1 + int(validates)
        assert config.load_launches == loads
        assert config.first_prediction == loads + 1 + int(validates)
        forward = loads + 1 + int(validates) + 2 * P
        assert config.forward_launches == plan.forward_launches == forward
        labels = [launch.label for launch in plan.launches]
        assert labels[:forward] == [
            "scatter->weights", *(["scatter->validation_weights"] if validates else []),
            "loss->initial_loss",
            *(["validation->validation_initial_loss"] if validates else []),
            "gather[0]", "argmax[0]", "gather[1]", "argmax[1]"]
        training = config.training_launches(target)
        assert len(plan.launches) == forward + training == config.launch_count(target)
        closing = ["health", *(["validation->validation_loss"] if validates else [])]
        assert labels[forward + training - len(closing):] == closing
        if schedule == "seed":
            assert training == 2 * N + len(closing)
            for k in range(N):
                assert config.adamw_launch(k) == forward + 2 * k
                assert labels[forward + 2 * k] == f"adamw[{k}]"
                assert labels[forward + 2 * k + 1] == "loss->training_loss"
        else:
            assert training == 1 + len(closing)  # V = 64: every update in one launch
            with pytest.raises(ValueError, match="no AdamW launches"):
                config.adamw_launch(0)

        # Every loss reads the scattered table, the trained validation loss the trained
        # parameters: no launch but the scatter reads the input's pairs.
        weights, pairs = plan.tensor(WEIGHTS_TENSOR).address, plan.tensor("input").address
        for index, launch in enumerate(plan.launches):
            args = args_of(plan, index)
            if launch.region in (sig.LOSS_CORPUS, config.fused_region(target)):
                assert args["weights"] == Address(weights), launch.label
            if launch.region == sig.LOSS_ONLY_CORPUS:
                assert args["weights"] == Address(plan.tensor(VALIDATION_WEIGHTS).address)
                assert args["parameters"] == Address(plan.tensor("parameters").address)
            if launch.region == sig.GATHER:  # the prompts, past the pairs
                i = int(launch.label[len("gather["):-1])
                assert args["prompt"] == Address(pairs + PAIR_BYTES * K + 4 * i)

        # The submissions: the loads first, alone or as one chain.
        layout = invocation_layout(config)
        submissions = plan.submissions
        if submission == "per-launch":
            assert config.load_submissions == layout.load_submissions == loads
            assert [(s.first_launch, s.count) for s in submissions[:loads]] == [
                (i, 1) for i in range(loads)]
            assert plan.forward_submissions == config.forward_submissions == forward
            assert len(submissions) == forward + training + 2 * P
            # the predictions again, from the first gather
            assert [s.first_launch for s in submissions[forward + training:]] == [
                config.first_prediction + i for i in range(2 * P)]
        else:
            assert config.load_submissions == layout.load_submissions == 1
            assert [(s.first_launch, s.count) for s in submissions] == [
                (0, loads), (loads, forward - loads), (forward, training),
                (config.first_prediction, 2 * P)]
            assert plan.forward_submissions == config.forward_submissions == 2
        assert len(submissions) == config.submission_count(target)
        assert [s.semaphore for s in submissions] == list(range(1, len(submissions) + 1))


@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_a_forward_plan_has_the_starting_validation_loss_and_no_training(schedule):
    config = corpus_config(schedule, updates=0)
    plan = build_plan(config)
    assert [launch.label for launch in plan.launches] == [
        "scatter->weights", "scatter->validation_weights", "loss->initial_loss",
        "validation->validation_initial_loss", "gather[0]", "argmax[0]", "gather[1]",
        "argmax[1]"]
    assert config.training_launches(plan.target) == 0
    assert certify(plan).holds


@pytest.mark.parametrize("pairs", [1, 255, 256, 257, V * V])
def test_a_scatter_launch_has_a_thread_per_pair(pairs):
    config = corpus_config(pairs=pairs, validation_pairs=0)
    plan = build_plan(config)
    (scatter,) = [launch for launch in plan.launches if launch.region == sig.SCATTER]
    assert scatter.grid.x == math.ceil(pairs / sig.BLOCK) and scatter.block.x == sig.BLOCK
    args = args_of(plan, plan.launches.index(scatter))
    pairs_at = plan.tensor("input").address
    assert args == {"table": Address(plan.tensor(WEIGHTS_TENSOR).address),
                    "keys": Address(pairs_at), "values": Address(pairs_at + 8 * pairs),
                    "count": Scalar.u32(pairs), "vocab": Scalar.u32(V)}
    # past 4096 blocks the threads stride: the grid stays within a launch's reach
    huge = BobConfig(vocab=65536, prompts=0, updates=0, mode="corpus", pairs=1 << 31)
    (launch,) = [x for x in build_plan(huge).launches if x.region == sig.SCATTER]
    assert launch.grid.x == 4096


# -- the certificate ------------------------------------------------------------------------


def scatter_index(plan: Plan, table: str) -> int:
    return next(i for i, launch in enumerate(plan.launches)
                if launch.label == f"scatter->{table}")


def test_the_certificate_refuses_a_scatter_whose_values_reach_past_the_input():
    """One pair more than the input holds, no prompts after it: the values run 4 bytes past
    the input's end (the keys, 8 bytes more, still end inside it)."""
    config = replace(corpus_config(validation_pairs=0), prompts=0)
    plan = build_plan(config)
    index = scatter_index(plan, WEIGHTS_TENSOR)
    planted = with_args(plan, index, count=Scalar.u32(K + 1))
    hazards = certify(planted).hazards
    assert [(h.kind, h.launch, h.argument, h.tensor) for h in hazards] == [
        ("footprint-overflow", index, "values", "input")]
    values = plan.tensor("input").address + 8 * K
    assert hazards[0].addresses == (values, values + 4 * (K + 1), plan.tensor("input").end)
    assert "scatter->weights" in hazards[0].message and "'values'" in hazards[0].message


def test_the_certificate_refuses_a_scatter_whose_keys_reach_past_the_input():
    """A count past what the input's bytes hold at 8 bytes a key: the keys overflow it, and
    the values with them; the prompts after the pairs do not save it."""
    plan = build_plan(corpus_config(validation_pairs=0))
    index = scatter_index(plan, WEIGHTS_TENSOR)
    count = plan.tensor("input").bytes // 8 + 1
    hazards = certify(with_args(plan, index, count=Scalar.u32(count))).hazards
    assert [(h.kind, h.argument, h.tensor) for h in hazards] == [
        ("footprint-overflow", "keys", "input"), ("footprint-overflow", "values", "input")]
    assert all(h.launch == index for h in hazards)


def test_the_certificate_refuses_a_validation_scatter_past_its_own_input():
    plan = build_plan(corpus_config())
    index = scatter_index(plan, VALIDATION_WEIGHTS)
    hazards = certify(with_args(plan, index, count=Scalar.u32(K_VAL + 1))).hazards
    assert [(h.kind, h.argument, h.tensor) for h in hazards] == [
        ("footprint-overflow", "values", VALIDATION_INPUT)]


def test_the_certificate_refuses_a_scatter_into_a_table_too_small_for_its_vocab():
    plan = build_plan(corpus_config(validation_pairs=0))
    index = scatter_index(plan, WEIGHTS_TENSOR)
    hazards = certify(with_args(plan, index, vocab=Scalar.u32(V + 1))).hazards
    assert [(h.kind, h.argument, h.tensor) for h in hazards] == [
        ("footprint-overflow", "table", WEIGHTS_TENSOR)]


def test_the_certificate_refuses_misaligned_keys():
    plan = build_plan(corpus_config(validation_pairs=0))
    index = scatter_index(plan, WEIGHTS_TENSOR)
    keys = args_of(plan, index)["keys"]
    assert isinstance(keys, Address)
    hazards = certify(with_args(plan, index, keys=Address(keys.address + 4))).hazards
    assert ("misaligned", "keys") in {(h.kind, h.argument) for h in hazards}


# -- on the command stream: nv-sim against the cpu ----------------------------------------


@pytest.mark.parametrize("target", [SM86, SM90], ids=lambda t: t.name)
@pytest.mark.parametrize("submission", ["per-launch", "chained"])
@pytest.mark.parametrize("vocab", [64, 300])
def test_the_scatter_on_nv_sim_leaves_the_dense_tables(target, submission, vocab):
    """The load submissions alone on the encoded stream: `weights` and `validation_weights`
    are the records' dense tables, every other tensor is as it was."""
    config = corpus_config(submission=submission, vocab=vocab, pairs=vocab * vocab // 3)
    record = random_record(config, 3)
    held_out = validation_record(config, 4)
    # the table's last cell among the pairs: the largest key
    assert record.keys is not None and record.keys[-1] < vocab * vocab
    plan = build_plan(config, target, compiled=stand_in_regions(config, target))
    layout = invocation_layout(config)
    backend = NvSimBackend(plan)
    rng = np.random.default_rng(vocab)
    poison = {t.name: rng.integers(0, 256, t.bytes, dtype=np.uint8).tobytes()
              for t in plan.tensors}
    for name, data in poison.items():
        backend.write_tensor(name, data)
    backend.write_tensor("input", record.payload())
    backend.write_tensor(VALIDATION_INPUT, held_out.payload())
    backend.clear_tensors(layout.input_tables)
    backend.run(range(layout.load_submissions))
    assert backend.read_tensor(WEIGHTS_TENSOR) == record.dense_weights().tobytes()
    assert backend.read_tensor(VALIDATION_WEIGHTS) == held_out.dense_weights().tobytes()
    for name, data in poison.items():
        if name not in (*layout.input_tables, "input", VALIDATION_INPUT):
            assert backend.read_tensor(name) == data, name
    assert backend.last_semaphore == plan.submissions[layout.load_submissions - 1].semaphore


@pytest.mark.parametrize("submission", ["per-launch", "chained"])
@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_whole_invocations_with_validation_on_nv_sim_equal_the_cpu(schedule, submission):
    """Through the Session: a full load, a resident invocation (no loads), one with a new
    input (loaded again), a forward one; after each every tensor of the arena holds the cpu
    backend's bytes, and the validation losses are the same numbers."""
    config = corpus_config(schedule, submission, vocab=40, pairs=300, validation_pairs=70)
    record, other = random_record(config, 5), random_record(config, 6)
    held_out = validation_record(config, 7)
    rng = np.random.default_rng(8)
    start = replace(Checkpoint.zeros(config.vocab, Hyper(), "corpus"),
                    parameters=rng.standard_normal((40, 40), dtype=np.float32))
    with Session(choose_backend("cpu")) as cpu, \
            Session(choose_backend("nv-sim", arch="sm_90")) as sim:
        states = [start, start]
        results = []
        for number, data in enumerate((record, record, other)):
            invocations = []
            for i, session in enumerate((cpu, sim)):
                invocation = session.invoke(config, states[i], data, "train",
                                            validation=held_out)
                states[i] = invocation.checkpoint
                invocations.append(invocation)
            assert isinstance(sim.last_backend, NvSimBackend)
            assert_same_tensors(sim.last_backend.plan, cpu.last_backend, sim.last_backend,
                                f"invocation {number} ({config})")
            assert invocations[0].validation == invocations[1].validation
            results.append(invocations[0])
        # the trained table's validation loss is the next one's starting one, and training
        # on the corpus moved it
        first, second = (r.validation for r in results[:2])
        assert first is not None and second is not None
        assert second[0] == first[1] and first[1] != first[0]
        for session in (cpu, sim):
            session.invoke(config, states[0], record, "predict", validation=held_out)
        assert_same_tensors(sim.last_backend.plan, cpu.last_backend, sim.last_backend,
                            f"the forward invocation ({config})")


def test_a_corpus_plan_on_nv_sim_equals_the_cpu_launch_by_launch():
    """Every submission in turn on both backends, the arenas compared after each: the
    scatters, the validation losses and the training launches each leave the same bytes."""
    config = corpus_config(vocab=33, pairs=200, validation_pairs=40, updates=2)
    plan = build_plan(config, SM90, compiled=stand_in_regions(config, SM90))
    record, held_out = random_record(config, 9), validation_record(config, 10)
    layout = invocation_layout(config)
    backends = (CpuBackend(plan), NvSimBackend(plan))
    rng = np.random.default_rng(11)
    table = rng.standard_normal((33, 33), dtype=np.float32).tobytes()
    for backend in backends:
        backend.write_tensor("parameters", table)
        backend.write_tensor("input", record.payload())
        backend.write_tensor(VALIDATION_INPUT, held_out.payload())
        Session(choose_backend("cpu")).write_update_scalars(config, backend, 1)
    for submission in range(plan.submission_count):
        for backend in backends:
            backend.run(range(submission, submission + 1))
        assert_same_tensors(plan, backends[0], backends[1], f"submission {submission}")
    assert any(backends[1].read_tensor(VALIDATION_LOSS))
    assert layout.validation_losses == (VALIDATION_INITIAL_LOSS, VALIDATION_LOSS)
    assert backends[1].read_tensor(HEALTH_TENSOR) == bytes(24)
