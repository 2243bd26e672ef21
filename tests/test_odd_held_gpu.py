"""The held kernels at a V that is not a multiple of 4 (rows 4-byte, not 16-byte, aligned):
byte for byte against the CPU on cuda and nv, every tensor, pipelined invocations.

    PYTHONPATH=src python -m pytest -m gpu tests/test_odd_held_gpu.py
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bob.backends import choose_backend
from bob.config import Hyper
from bob.errors import BackendUnavailable
from bob.host.check import compare_backends, random_record
from bob.host.session import Session, train
from bob.kernels import signatures as sig
from bob.program.bob import BobConfig
from bob.records.checkpoint import Checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.smoke]


@pytest.mark.parametrize("vocab", [9001])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("backend", ["cuda", "nv"])
def test_the_held_kernels_at_an_odd_vocabulary_give_the_cpu_s_bytes(backend: str, mode: str,
                                                                    vocab: int) -> None:
    try:
        choice = choose_backend(backend)
    except BackendUnavailable as why:
        pytest.skip(str(why))
    config = BobConfig(vocab=vocab, prompts=1, updates=3, mode=mode, schedule="fused",
                       pairs=8 * vocab if mode == "corpus" else 0)
    assert config.fused_region(choice.target) in (sig.FUSED_HELD_HARD, sig.FUSED_HELD_CORPUS)
    record = random_record(config, seed=vocab)
    rng = np.random.default_rng(vocab)
    parameters = rng.standard_normal((vocab, vocab), dtype=np.float32)
    parameters[0] = 0.0  # a row of ties
    start = replace(Checkpoint.zeros(vocab, Hyper(), mode), parameters=parameters)
    seed = replace(config, schedule="seed")  # the CPU runs the reference schedule
    with Session(choose_backend("cpu")) as cpu, Session(choice) as gpu:
        done = [train(cpu, seed, start, record, 6, tables=lambda k, d: False)[-1],
                train(gpu, config, start, record, 6, tables=lambda k, d: False)[-1]]
        difference = compare_backends(cpu.last_backend, gpu.last_backend, 1)
        assert difference is None, f"{backend} V={vocab} {mode}: {difference}"
        assert (done[0].loss, done[0].initial_loss) == (done[1].loss, done[1].initial_loss)
