"""The fused schedule on the GPU against the seed schedule on the CPU, byte for byte.

    PYTHONPATH=src python -m pytest -m gpu tests/test_fused_gpu.py     # on a GPU machine

Training runs through ``Session`` on both sides, so the host's writing of the
``adam_scalars`` tensor is covered too. After every invocation every tensor the
seed schedule has (parameters, moments, gradients, input, both loss blocks,
logit rows, predictions; in corpus mode the weights scattered from the sparse
input, and with validation its table and losses) must hold the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

import bob.kernels.signatures as sig
import bob.program.bob as program
from bob.backends import BackendChoice, choose_backend
from bob.host.check import compare_backends, differential_check, random_record
from bob.host.session import Session, split_updates
from bob.plan.certificate import certify
from bob.program.bob import BobConfig, Hyper
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint
from conftest import bob_config, validation_record

gpu = pytest.mark.gpu


def train_both(cuda: BackendChoice, config: BobConfig, steps: int, seed: int = 3,
               shape_start: Callable[[np.ndarray, InputRecord], None] | None = None) -> None:
    """`steps` updates in invocations of config.updates: seed on the CPU, fused on the GPU.
    `shape_start` may change the start table in place (given the record) first."""
    record = random_record(config, seed)
    held_out = validation_record(config, seed + 1) if config.validates else None
    seed_config = replace(config, schedule="seed")
    fused_config = replace(config, schedule="fused")
    start = Checkpoint.zeros(config.vocab, Hyper(), config.mode)
    # a table that is not zero: rows with distinct maxima, and row 0 all equal (ties)
    rng = np.random.default_rng(seed)
    parameters = rng.standard_normal((config.vocab, config.vocab), dtype=np.float32)
    parameters[0] = 0.0
    if shape_start is not None:
        shape_start(parameters, record)
    start = replace(start, parameters=parameters)
    states = [start, start]
    with Session(choose_backend("cpu")) as cpu, Session(cuda) as gpu_session:
        plan = gpu_session.plan_for(fused_config)
        assert certify(plan).holds, certify(plan).hazards
        for number, updates in enumerate(split_updates(steps, config.updates)):
            for i, (session, schedule_config) in enumerate(
                    ((cpu, seed_config), (gpu_session, fused_config))):
                step_config = replace(schedule_config, updates=updates)
                states[i] = session.invoke(step_config, states[i], record, "train",
                                           validation=held_out).checkpoint
            assert cpu.last_backend is not None and gpu_session.last_backend is not None
            difference = compare_backends(cpu.last_backend, gpu_session.last_backend, number)
            assert difference is None, f"{config}: {difference}"
        for session in (cpu, gpu_session):  # and a forward-only invocation afterwards
            session.invoke(replace(fused_config, updates=0), states[0], record, "predict",
                           validation=held_out)
        difference = compare_backends(cpu.last_backend, gpu_session.last_backend, -1)
        assert difference is None, f"{config} predict: {difference}"
    print(f"{config}: {steps} updates in {split_updates(steps, config.updates)}, "
          f"{plan.launch_count} launches per invocation: identical")


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab,steps,per_invocation", [
    (256, 12, 12), (256, 12, 5), (200, 5, 5), (300, 7, 3), (1024, 6, 4), (1100, 4, 3),
    (6000, 3, 2), (8192, 3, 2),
])
def test_fused_on_the_gpu_equals_the_seed_on_the_cpu(cuda_choice: BackendChoice, mode: str,
                                                      vocab: int, steps: int,
                                                      per_invocation: int) -> None:
    config = bob_config(vocab=vocab, prompts=2, updates=per_invocation, mode=mode)
    train_both(cuda_choice, config, steps)


@gpu
@pytest.mark.parametrize("vocab,steps,per_invocation", [(256, 12, 5), (1100, 4, 3),
                                                         (8192, 3, 2)])
def test_fused_with_validation_on_the_gpu_equals_the_seed_on_the_cpu(
        cuda_choice: BackendChoice, vocab: int, steps: int, per_invocation: int) -> None:
    """Both scatters and the validation loss of the starting and the trained table."""
    config = bob_config(vocab=vocab, prompts=2, updates=per_invocation, mode="corpus",
                        validation_pairs=3 * vocab)
    train_both(cuda_choice, config, steps)


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab,one_launch_max,steps,per_invocation", [
    (256, 16, 6, 4), (1100, 1024, 6, 4), (8192, 1024, 3, 2),
])
def test_either_launch_split_on_either_kernel_path(cuda_choice: BackendChoice,
                                                   monkeypatch: pytest.MonkeyPatch, mode: str,
                                                   vocab: int, one_launch_max: int, steps: int,
                                                   per_invocation: int) -> None:
    """One launch per update, on the resident path and on the streaming path.

    (Bob's default runs every update in one launch up to V = 8192.)
    """
    monkeypatch.setattr(program, "ONE_LAUNCH_MAX_VOCAB", one_launch_max)
    config = bob_config(vocab=vocab, prompts=1, updates=per_invocation, mode=mode)
    train_both(cuda_choice, config, steps)


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_the_streaming_path_still_serves_rows_the_tall_kernels_could(
        cuda_choice: BackendChoice, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """With the tall kernels switched off, V = 8192 streams through the stream kernel (on
    float4 quads, V % 4 == 0): the same bytes (the path corpus rows with V % 4 == 0 take
    past those the held kernels hold)."""
    monkeypatch.setattr(program, "TALL_VOCAB", 4096)
    config = bob_config(vocab=8192, prompts=1, updates=2, mode=mode)
    assert config.fused_region(cuda_choice.target) in (sig.FUSED_STREAM_HARD,
                                                       sig.FUSED_STREAM_CORPUS)
    train_both(cuda_choice, config, 3)


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab", [200, 256, 5200])
def test_small_and_tall_kernels_on_the_nv_stream_equal_the_cpu(mode: str, vocab: int) -> None:
    """The paths with other block shapes on Bob's own stream: V <= 256 (128 threads at a
    counted barrier) and the tall kernels (1024 threads, 45 KiB of shared memory)."""
    from bob.backends.nv.rm.backend import nv_available

    pytest.importorskip("cuda.bindings.nvrtc", reason="the nv backend compiles with NVRTC")
    usable, reason = nv_available()
    if not usable:
        pytest.skip(f"no nv backend here: {reason}")
    updates, steps = (6, 12) if vocab <= 256 else (1, 1)
    config = bob_config(vocab=vocab, prompts=1, updates=updates, mode=mode, schedule="fused")
    report = differential_check(("cpu", "nv"), config, steps)
    print(f"V={vocab} {mode} fused on nv: {report.invocations} invocations, "
          f"{report.bytes_compared:,} bytes, identical={report.identical}")
    assert report.identical, report.difference
