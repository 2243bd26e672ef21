"""The held kernels (a row's w in dynamic shared memory, V % 4 == 0) on the GPU, byte for
byte against the seed schedule on the CPU: as shipped, with their other shapes, and with a
launch given too little shared memory for the whole row (the rest read from memory in each
pass, as the stream kernels read it).

    PYTHONPATH=src python -m pytest -m gpu tests/test_held_gpu.py     # on a GPU machine

The start table has a row of zeros (train_both), so the order-key max's fall back to the
literal lane-order max runs too.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import bob.kernels.signatures as sig
import bob.program.bob as program
from bob.backends import BackendChoice
from bob.backends.cuda import CudaBackend
from bob.bench.variants import variant_choice
from bob.kernels.cuda.regions import CompiledRegions
from bob.program.bob import BobConfig
from test_fused_gpu import train_both

gpu = pytest.mark.gpu

SHAPES = {
    "shipped": "",
    "768 threads": "#define HELD_THREADS 768u\n#define HELD_UPDATE_DEPTH 1u\n"
                   "#define HELD_DEPTH 2u\n",
    "512, one round in flight, no fast divide": "#define HELD_UPDATE_DEPTH 1u\n"
                                                "#define HELD_FAST_DIVIDE 0\n",
    "no L2 prefetch": "#define HELD_L2_PREFETCH 0u\n#define HELD_L2_AHEAD 0u\n",
    "half of m and v asked into L2, 4 rounds ahead": "#define HELD_L2_PREFETCH 4u\n"
                                                      "#define HELD_L2_AHEAD 4u\n",
}


def held_capacity(choice: BackendChoice, dynamic_bytes: int) -> BackendChoice:
    """The same kernels, the held regions launched with `dynamic_bytes` of shared memory."""
    assert isinstance(choice.regions, CompiledRegions)
    regions = CompiledRegions(choice.regions.image, {
        name: replace(region, dynamic_shared_bytes=dynamic_bytes)
        if name in sig.SHARED_REST else region for name, region in choice.regions.items()})
    return BackendChoice(choice.name, choice.target, regions,
                         lambda plan: CudaBackend(plan, regions))


CASES = [
    (9216, 3, 2),  # one launch per update; whole rounds
    (9000, 3, 2),  # a last round in part
    (4100, 5, 3),  # (held from 4097) every update in one launch: w stays held between them
]


@gpu
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab,steps,per_invocation", CASES)
def test_the_held_kernels_equal_the_seed_on_the_cpu(monkeypatch: pytest.MonkeyPatch,
                                                    shape: str, mode: str, vocab: int,
                                                    steps: int, per_invocation: int) -> None:
    monkeypatch.setattr(program, "HELD_FROM_VOCAB", 4097)
    config = BobConfig(vocab=vocab, prompts=1, updates=per_invocation, mode=mode)
    assert config.fused_region in (sig.FUSED_HELD_HARD, sig.FUSED_HELD_CORPUS)
    train_both(variant_choice(SHAPES[shape]), config, steps)


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
    config = BobConfig(vocab=vocab, prompts=1, updates=per_invocation, mode=mode)
    train_both(held_capacity(variant_choice(""), held_bytes), config, steps)
