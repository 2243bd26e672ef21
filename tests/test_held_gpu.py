"""The held kernels (a row's w in dynamic shared memory, any V: a row of V % 4 != 0 moves
as quads from its 16-byte boundary, its first and last element by element) on the GPU, byte
for byte against the seed schedule on the CPU: as shipped, with their other shapes, and with
a launch given too little shared memory for the whole row (the rest read from memory in each
pass, as the stream kernels read it).

    PYTHONPATH=src python -m pytest -m gpu tests/test_held_gpu.py     # on a GPU machine

The start table has a row of zeros (train_both), so the order-key max's fall back to the
literal lane-order max runs too; a row whose max stays zero from update to update takes it
in the running max as well.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import bob.kernels.signatures as sig
import bob.program.bob as program
from bob.backends import BackendChoice, choose_backend
from bob.backends.cuda import CudaBackend
from bob.kernels.cuda.regions import CompiledRegions
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord
from conftest import bob_config
from dev.cuda.variants import variant_choice
from test_fused_gpu import train_both

gpu = pytest.mark.gpu

# The shipped kernels, and other shapes: the knob source (dev/cuda) with these #defines.
SHAPES = {
    "shipped": "",
    "768 threads": "#define HELD_THREADS 768u\n#define HELD_UPDATE_DEPTH 1u\n"
                   "#define HELD_DEPTH 2u\n#define HELD_RUNNING_MAX 0\n"
                   "#define HELD_KEEP_EXPONENTIALS 0\n#define HELD_PREFETCH_CHUNK 6144u\n",
    "a max pass every update, a prefetch at the first": "#define HELD_RUNNING_MAX 0\n"
                                                         "#define HELD_L2_PREFETCH_EACH 0\n",
    "at most 4096 of w held": "#define HELD_W_LIMIT 4096u\n",
    "512, one round in flight, no fast divide": "#define HELD_UPDATE_DEPTH 1u\n"
                                                "#define HELD_FAST_DIVIDE 0\n",
    "no L2 prefetch": "#define HELD_L2_PREFETCH 0u\n#define HELD_L2_AHEAD 0u\n",
    "half of m and v asked into L2, 4 rounds ahead": "#define HELD_L2_PREFETCH 4u\n"
                                                      "#define HELD_L2_AHEAD 4u\n",
}


def kernels_of(shape: str) -> BackendChoice:
    return choose_backend("cuda") if shape == "shipped" else variant_choice(SHAPES[shape])


def held_capacity(choice: BackendChoice, dynamic_bytes: int) -> BackendChoice:
    """The same kernels, the held regions launched with `dynamic_bytes` of shared memory."""
    assert isinstance(choice.regions, CompiledRegions)
    regions = CompiledRegions(choice.regions.image, {
        name: replace(region, dynamic_shared_bytes=dynamic_bytes)
        if name in sig.SHARED_REST else region for name, region in choice.regions.items()})
    return BackendChoice(choice.name, choice.target, regions,
                         lambda plan: CudaBackend(plan, regions))


CASES = [
    (9216, 3, 1),  # one update per invocation (so per launch); whole rounds
    (9000, 3, 2),  # a last round in part; every update of an invocation in one launch
    (4100, 5, 3),  # (held from 4097) w and the running max stay with the row between updates
    (9001, 3, 2),  # V % 4 != 0: rows start off 16-byte boundaries, a partial last quad
    (4103, 5, 3),  # V % 4 == 3: the last quad one element short
]


@gpu
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab,steps,per_invocation", CASES)
def test_the_held_kernels_equal_the_seed_on_the_cpu(monkeypatch: pytest.MonkeyPatch,
                                                    shape: str, mode: str, vocab: int,
                                                    steps: int, per_invocation: int) -> None:
    monkeypatch.setattr(program, "HELD_FROM_VOCAB", 4097)
    config = bob_config(vocab=vocab, prompts=1, updates=per_invocation, mode=mode)
    choice = kernels_of(shape)
    assert config.fused_region(choice.target) in (sig.FUSED_HELD_HARD, sig.FUSED_HELD_CORPUS)
    train_both(choice, config, steps)


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab,steps,per_invocation", CASES[1:])
@pytest.mark.parametrize("held_bytes", [0, 20480, 49152])
def test_a_row_held_in_part_equals_the_seed_on_the_cpu(monkeypatch: pytest.MonkeyPatch,
                                                       mode: str, vocab: int, steps: int,
                                                       per_invocation: int,
                                                       held_bytes: int) -> None:
    """Nothing held; 5120 elements (at V = 9000 the held quads and the read ones meet
    inside a round; at V = 4100 all held and 1020 exponentials kept, a round in part); or
    12288 (at V = 9000 all held and 3288 exponentials kept)."""
    monkeypatch.setattr(program, "HELD_FROM_VOCAB", 4097)
    config = bob_config(vocab=vocab, prompts=1, updates=per_invocation, mode=mode)
    train_both(held_capacity(kernels_of("shipped"), held_bytes), config, steps)


@gpu
@pytest.mark.parametrize("vocab,steps,per_invocation", [(9000, 4, 2), (4100, 3, 3), (9001, 4, 2)])
def test_a_max_that_stays_zero_takes_the_lane_order_tree_each_update(
        monkeypatch: pytest.MonkeyPatch, vocab: int, steps: int, per_invocation: int) -> None:
    """Rows 1 and 2: zero at their target, -1e30 elsewhere. The target's probability is 1
    and every gradient 0, so w keeps those values through AdamW and every update's max
    (taken from the update before it, HELD_RUNNING_MAX) is a zero: the lane-order tree
    gives its sign, on the GPU as on the CPU."""
    monkeypatch.setattr(program, "HELD_FROM_VOCAB", 4097)
    config = BobConfig(vocab=vocab, prompts=1, updates=per_invocation, mode="hard")

    def zero_max_rows(parameters: np.ndarray, record: InputRecord) -> None:
        assert record.targets is not None
        for row in (1, 2):
            parameters[row] = -1e30
            parameters[row, record.targets[row]] = 0.0 if row == 1 else -0.0

    train_both(kernels_of("shipped"), config, steps, shape_start=zero_max_rows)


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_an_invocation_of_several_held_launches_equals_the_seed_on_the_cpu(
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Two updates a launch (HELD_UPDATES_PER_LAUNCH 2), so an invocation of 5 is three
    launches of 2, 2 and 1: w goes back to memory between them, the last finishes."""
    monkeypatch.setattr(program, "HELD_UPDATES_PER_LAUNCH", 2)
    config = bob_config(vocab=9000, prompts=1, updates=5, mode=mode)
    choice = kernels_of("shipped")
    assert replace(config, schedule="fused").training_launches(choice.target) == 3 + 1
    train_both(choice, config, 5)
