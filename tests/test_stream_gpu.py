"""The stream kernels (rows as float4 quads, V % 4 == 0) on the GPU, byte for byte against
the seed schedule on the CPU: as shipped, and the knob source (dev/cuda) compiled with
STREAM_VECTOR 0 (the scalar streaming path in the same kernels) or the fast divide.

    PYTHONPATH=src python -m pytest -m gpu tests/test_stream_gpu.py     # on a GPU machine

The start table has a row of zeros (train_both), so the order-key max's fall back to the
literal lane-order max (a maximum of zero) runs too.
"""

from __future__ import annotations

import pytest

import bob.kernels.signatures as sig
import bob.program.bob as program
from bob.backends import choose_backend
from conftest import bob_config
from dev.cuda.variants import variant_choice
from test_fused_gpu import train_both

gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("macros", [
    "", "#define STREAM_VECTOR 0\n",
    "#define STREAM_FAST_DIVIDE 1\n#define STREAM_BOUNDS __launch_bounds__(256, 3)\n",
], ids=["vector", "scalar", "fast-divide"])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab,steps,per_invocation", [
    (1028, 3, 2),  # with the wide kernels off: two rounds, the last of one quad per warp
    (4100, 5, 3),  # every update in one launch; a last round of a single quad
    (9000, 3, 2),  # one launch per update; rounds past the kept exponentials, a partial one
])
def test_the_stream_kernels_equal_the_seed_on_the_cpu(monkeypatch: pytest.MonkeyPatch,
                                                      macros: str, mode: str, vocab: int,
                                                      steps: int, per_invocation: int) -> None:
    monkeypatch.setattr(program, "WIDE_VOCAB", 1024)  # rows past 1024 stream
    monkeypatch.setattr(program, "HELD_FROM_VOCAB", program.MAX_VOCAB + 1)  # and past 8192
    config = bob_config(vocab=vocab, prompts=1, updates=per_invocation, mode=mode)
    choice = variant_choice(macros) if macros else choose_backend("cuda")
    assert config.fused_region(choice.target) in (sig.FUSED_STREAM_HARD, sig.FUSED_STREAM_CORPUS)
    train_both(choice, config, steps)
