"""Bob's own machine code on the GPU (marked `gpu`; the lead runs them on an H200).

    pytest -m gpu tests/test_own_kernels_gpu.py -v -s

The seed's five regions run from the images bob.kernels.own encodes (`--kernels own`, the
nv backend), and every byte they leave must equal NVRTC's kernels' and the CPU's: the
arena after each invocation, the checkpoints, the predictions. Edge inputs are planted in
the starting checkpoint (NaN, +-inf, subnormals, a negative second moment, ties in the rows
the prompts predict from). The profile test prints each region's mean device time with
both kernels and the ratio (-s shows it): record those lines with the run.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest

from bob.backends import choose_backend
from bob.backends.nv.rm import structs as s
from bob.config import Hyper
from bob.errors import BackendUnavailable, RunFailure
from bob.host.check import compare_backends, random_record
from bob.host.session import Session, train
from bob.isa.builder import ORDERINGS, ordering
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint
from conftest import bob_config

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not os.path.exists(s.CONTROL_DEVICE),
                                 reason="no NVIDIA kernel driver here")]

STEPS, PER_INVOCATION = 4, 2  # two invocations of two updates
TABLES = ("parameters", "first_moment", "second_moment")
SUBNORMAL = np.uint32(0x00000003).view(np.float32)
NEGATIVE_SUBNORMAL = np.uint32(0x80400000).view(np.float32)


def opened(name: str, kernels: str = "nvrtc"):
    try:
        return choose_backend(name, kernels=kernels)
    except BackendUnavailable as why:
        pytest.skip(str(why))


def starting_point(vocab: int, mode: str, planted: bool = False) -> Checkpoint:
    """A table that is not zero; with `planted`, the edge inputs in rows 0..3."""
    rng = np.random.default_rng(vocab)
    start = Checkpoint.zeros(vocab, Hyper(), mode)
    parameters = rng.standard_normal((vocab, vocab), dtype=np.float32)
    first = (rng.standard_normal((vocab, vocab), dtype=np.float32) * 1e-3).astype(np.float32)
    second = (rng.random((vocab, vocab), dtype=np.float32) * 1e-4).astype(np.float32)
    if planted:
        parameters[0, :6] = [np.nan, np.inf, -np.inf, SUBNORMAL, NEGATIVE_SUBNORMAL, -0.0]
        parameters[1, :] = 0.5  # a row of ties: the lowest index wins
        parameters[2, [5, 9]] = 40.0  # two equal maxima
        parameters[3, [7, 3]] = np.nan  # NaN above every number, the lowest index
        parameters[4, 1:] = np.float32(-1e-38)  # subnormal-adjacent exponentials
        first[5, :4] = [np.inf, -np.inf, np.nan, SUBNORMAL]
        second[5, :4] = [-1.0, SUBNORMAL, np.inf, 0.0]  # sqrt of a negative: NaN
        second[6, :] = SUBNORMAL
    return replace(start, parameters=parameters, first_moment=first, second_moment=second)


def trained(choice, config, start, record):
    with Session(choice) as session:
        done = train(session, config, start, record, STEPS)[-1]
        session.invoke(replace(config, updates=0), done.checkpoint, record, "predict")
        backend = session.last_backend
        arena = {name: backend.read_tensor(name) for name in
                 (t.name for t in backend.plan.tensors)}
        return done, arena


def assert_same(left, right, what: str) -> None:
    (done_a, arena_a), (done_b, arena_b) = left, right
    for name in TABLES:
        a = getattr(done_a.checkpoint, name).tobytes()
        b = getattr(done_b.checkpoint, name).tobytes()
        if a != b:
            x = np.frombuffer(a, np.uint32)
            y = np.frombuffer(b, np.uint32)
            first = int(np.argmax(x != y))
            raise AssertionError(f"{what}: checkpoint {name} differs at {first}: "
                                 f"{x[first]:#010x} vs {y[first]:#010x} "
                                 f"({int((x != y).sum())} elements)")
    assert (done_a.loss, done_a.initial_loss) == (done_b.loss, done_b.initial_loss), what
    for name, data in arena_a.items():
        assert data == arena_b[name], f"{what}: tensor {name} differs after predicting"


@pytest.mark.parametrize("order", ORDERINGS)
@pytest.mark.parametrize("vocab", [256, 300, 2053, 8192])
def test_each_own_region_alone_leaves_nvrtc_s_and_the_reference_s_bytes(vocab: int,
                                                                      order: str) -> None:
    """Each region launched once (tests/own_launch.py: edges planted), its own image (in
    each ordering of its straight runs) and NVRTC's on nv, the reference on nv-sim: every
    output byte for byte. A fault or a difference is recorded and the other regions still
    run, so one call names them all."""
    from bob.backends.nv.rm.backend import NvBackend
    from bob.backends.nv.sim import NvSimBackend
    from bob.kernels.cuda.regions import compiled_regions
    from bob.kernels.own_regions import OWN_REGIONS, own_regions
    from bob.plan.placement import SM90
    from own_launch import first_difference, inputs, one_launch_plan, run_alone

    opened("nv", "own")
    with ordering(order):
        own = own_regions(SM90)
    nvrtc = compiled_regions("sm_90")
    failures = []
    from bob.kernels import own as own_code

    for name in (name for name in OWN_REGIONS if own_code.covers(name, vocab)):
        arrays = inputs(name, vocab)
        reference = run_alone(NvSimBackend(one_launch_plan(own[name], vocab)), arrays)
        for who, region in (("own", own[name]), ("nvrtc", nvrtc[name])):
            try:
                with NvBackend(one_launch_plan(region, vocab)) as backend:
                    got = run_alone(backend, arrays)
            except Exception as error:  # noqa: BLE001 - record it, run the rest
                failures.append(f"{name} V={vocab} {who}: {type(error).__name__}: {error}")
                continue
            differences = [d for d in (first_difference(tensor, reference[tensor], got[tensor])
                                       for tensor in reference) if d]
            print(f"alone V={vocab} {name} {who} ({order}): "
                  f"{'; '.join(differences) or 'the reference bytes'}")
            failures += [f"{name} V={vocab} {who}: {d}" for d in differences]
    assert not failures, "\n".join(failures)


@pytest.mark.smoke
@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize(("mode", "vocab"), [
    ("hard", 256), ("corpus", 300)])
def test_check_nv_cpu_with_own_kernels_agrees(mode: str, vocab: int, schedule: str,
                                              capsys) -> None:
    from bob.cli.main import main

    opened("nv", "own")
    status = main(["check", "--backends", "nv,cpu", "--kernels", "own", "-V", str(vocab),
                   "--mode", mode, "--schedule", schedule, "--steps", "5", "-N", "2",
                   "--json"])
    captured = capsys.readouterr()
    with capsys.disabled():
        print(f"check nv,cpu --kernels own {mode} {schedule} V={vocab}: exit {status}: "
              f"{captured.out.strip() or captured.err.strip()}")
    assert status == 0, captured.err
    assert json.loads(captured.out)["identical"] is True


@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab", [256, 1024, 8192])
def test_own_kernels_leave_nvrtc_s_bytes(vocab: int, mode: str) -> None:
    config = bob_config(vocab=vocab, prompts=3, updates=PER_INVOCATION, mode=mode)
    record = random_record(config, seed=vocab + 1)
    start = starting_point(vocab, mode)
    own = trained(opened("nv", "own"), config, start, record)
    nvrtc = trained(opened("nv"), config, start, record)
    assert_same(own, nvrtc, f"V={vocab} {mode}: own vs nvrtc")
    print(f"own == nvrtc at V={vocab} {mode}: loss {own[0].loss!r}")


def edge_run(choice, config, start, record, operation: str) -> tuple[str, dict[str, bytes]]:
    """One invocation from `start`: how it ended (a planted NaN makes the loss non-finite,
    which the session refuses after the run) and every tensor of the arena it left."""
    with Session(choice) as session:
        outcome = "settled"
        try:
            session.invoke(config, start, record, operation)  # type: ignore[arg-type]
        except RunFailure as failure:
            outcome = str(failure)
        backend = session.last_backend
        assert backend is not None
        return outcome, {t.name: backend.read_tensor(t.name) for t in backend.plan.tensors}


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_edge_inputs_give_the_cpu_s_and_nvrtc_s_bytes(mode: str) -> None:
    vocab = 256
    prompts = np.arange(7, dtype=np.uint32)  # the planted rows predict
    if mode == "hard":
        targets = np.random.default_rng(3).integers(0, vocab, vocab, dtype=np.uint32)
        record = InputRecord.hard(targets, prompts, source="edges")
    else:
        weights = np.zeros((vocab, vocab), np.float32)
        weights[np.arange(vocab), (np.arange(vocab) * 7 + 1) % vocab] = 1.0 / vocab
        weights[0, 2:10] = SUBNORMAL  # subnormal weights too (column 1 holds row 0's share)
        record = InputRecord.corpus(weights, prompts, source="edges")
    config = bob_config(vocab=vocab, prompts=len(prompts), updates=PER_INVOCATION, mode=mode,
                        **({"pairs": record.pairs} if mode == "corpus" else {}))
    start = starting_point(vocab, mode, planted=True)
    choices = {"cpu": choose_backend("cpu"), "own": opened("nv", "own"), "nvrtc": opened("nv")}
    for operation, run_config in (("predict", replace(config, updates=0)), ("train", config)):
        runs = {name: edge_run(choice, run_config, start, record, operation)
                for name, choice in choices.items()}
        for other in ("cpu", "nvrtc"):
            assert runs["own"][0] == runs[other][0], (operation, other)
            for name, data in runs["own"][1].items():
                assert data == runs[other][1][name], \
                    f"edges {mode} {operation}: tensor {name} differs from {other}'s"
        predictions = np.frombuffer(runs["own"][1]["predictions"], np.uint32).tolist()
        print(f"edges {mode} {operation}: {runs['own'][0]}; predictions {predictions}")
        if operation == "predict":
            assert predictions[:4] == [0, 0, 5, 3]  # NaN first, ties to the lowest index


def test_an_own_session_compares_with_nvrtc_s_arena_each_invocation() -> None:
    config = bob_config(vocab=512, prompts=2, updates=PER_INVOCATION)
    record = random_record(config, seed=9)
    start = starting_point(512, "hard")
    with Session(opened("nv", "own")) as own, Session(opened("nv")) as nvrtc:
        for session in (own, nvrtc):
            train(session, config, start, record, STEPS)
        assert compare_backends(own.last_backend, nvrtc.last_backend, 1) is None


@pytest.mark.parametrize("order", ORDERINGS)
@pytest.mark.parametrize(("vocab", "mode", "schedule"), [
    (256, "hard", "seed"), (256, "corpus", "seed"), (1024, "hard", "seed"),
    (1024, "corpus", "seed"), (8192, "hard", "seed"), (8192, "corpus", "seed"),
    (256, "hard", "fused"), (1024, "corpus", "fused")])
def test_own_kernels_time_beside_nvrtc_s(vocab: int, mode: str, schedule: str,
                                         order: str) -> None:
    from bob.host.profiling import profiled_invocation, region_times
    from bob.program.bob import BobConfig

    opened("nv", "own")
    config = BobConfig(vocab=vocab, prompts=0, updates=20, mode=mode,  # type: ignore[arg-type]
                       pairs=bob_config(vocab=vocab, mode=mode).pairs,
                       schedule=schedule)  # type: ignore[arg-type]
    rows = {}
    for kernels in ("nvrtc", "own"):
        with ordering(order):
            plan, times = profiled_invocation("nv", config, kernels=kernels)
        rows[kernels] = {row.region: row for row in region_times(plan, times)}
    for region, theirs in rows["nvrtc"].items():
        mine = rows["own"][region]
        assert mine.launches == theirs.launches
        print(f"profile V={vocab} {mode} {schedule} {order} {region}: {mine.launches} "
              f"launches, own {mine.mean_ns / 1000:.2f} us, nvrtc {theirs.mean_ns / 1000:.2f} us, "
              f"own/nvrtc {mine.mean_ns / theirs.mean_ns:.2f}")
    total = {k: sum(row.total_ns for row in r.values()) for k, r in rows.items()}
    print(f"profile V={vocab} {mode} {schedule} {order} all: own {total['own'] / 1000:.1f} us, "
          f"nvrtc {total['nvrtc'] / 1000:.1f} us, own/nvrtc {total['own'] / total['nvrtc']:.2f}")
