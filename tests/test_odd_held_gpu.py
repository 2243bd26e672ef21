"""The held kernels at a V that is not a multiple of 4 (rows 4-byte, not 16-byte, aligned:
each moves as quads from its 16-byte boundary): byte for byte against the CPU on cuda and
nv, every tensor, pipelined invocations, and on a grid whose blocks change skew row to row.

    PYTHONPATH=src python -m pytest -m gpu tests/test_odd_held_gpu.py
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bob.backends import BackendChoice, choose_backend
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
    held_against_the_cpu(choice, mode, vocab)


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_a_grid_whose_blocks_change_skew_from_row_to_row_gives_the_cpu_s_bytes(
        mode: str) -> None:
    """A block takes rows b, b + G, ...: on the H200's G = 132 blocks every row of a block
    starts at the same skew ((b + G) V % 4 == b V % 4), on a grid of 131 the skew changes
    from one row to the next, so the next row's quads are copied in at another skew, and
    where its skew is larger one more quad past this row's end (NextRow::copy_rest)."""
    try:
        choice = choose_backend("cuda")
    except BackendUnavailable as why:
        pytest.skip(str(why))
    target = replace(choice.target, multiprocessors=131)
    held_against_the_cpu(replace(choice, target=target), mode, 9001)


def held_against_the_cpu(choice: BackendChoice, mode: str, vocab: int) -> None:
    """Six updates, two invocations of three, from a random table with a row of ties, on
    `choice` (the fused schedule, held kernels) and on the CPU (the seed schedule): every
    tensor and both losses byte for byte."""
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
        assert difference is None, f"{choice.name} V={vocab} {mode}: {difference}"
        assert (done[0].loss, done[0].initial_loss) == (done[1].loss, done[1].initial_loss)
