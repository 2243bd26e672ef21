"""The sparse corpus input's kernels: bob-scatter and bob-loss-corpus, on the CPU.

The scatter against a dense assignment (every key once, out-of-table keys never written);
the loss alone against bob-loss-gradient-corpus's loss, bit for bit, in the NumPy reference
and the Numba kernels, with no byte of the gradients touched; both compiled by NVRTC.
"""

from __future__ import annotations

import numpy as np
import pytest

from bob.kernels import reference as ref
from bob.kernels import signatures as sig
from bob.kernels.memory import Memory
from conftest import assert_same_bits

BASE = 0x20_0000_0000
F32 = np.float32


class Arena:
    """Tensors side by side in one byte buffer, 256-aligned, as a plan would place them."""

    def __init__(self, sizes: dict[str, int]):
        self.at: dict[str, int] = {}
        end = 0
        for name, size in sizes.items():
            self.at[name] = BASE + end
            end += -(-size // 256) * 256
        self.buffer = np.zeros(end, np.uint8)
        self.memory = Memory(self.buffer, BASE)

    def array(self, name: str, dtype: str, count: int) -> np.ndarray:
        return self.memory.array(self.at[name], dtype, count)


def sparse_weights(rng: np.random.Generator, vocab: int, pairs: int,
                   ) -> tuple[np.ndarray, np.ndarray]:
    keys = np.sort(rng.choice(vocab * vocab, size=pairs, replace=False)).astype(np.uint64)
    counts = rng.integers(1, 50, size=pairs)
    return keys, (counts / counts.sum()).astype(F32)


def scatter_args(arena: Arena, vocab: int, count: int) -> dict:
    return {"table": arena.at["table"], "keys": arena.at["keys"],
            "values": arena.at["values"], "count": count, "vocab": vocab}


@pytest.mark.parametrize("vocab", [2, 7, 256, 1031])
def test_the_scatter_writes_each_pair_into_its_cell(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    pairs = min(vocab * vocab, 3 * vocab)
    keys, values = sparse_weights(rng, vocab, pairs)
    arena = Arena({"table": 4 * vocab * vocab, "keys": 8 * pairs, "values": 4 * pairs})
    arena.array("keys", "u64", pairs)[:] = keys
    arena.array("values", "f32", pairs)[:] = values
    ref.scatter(arena.memory, scatter_args(arena, vocab, pairs))
    want = np.zeros(vocab * vocab, F32)
    want[keys.astype(np.int64)] = values
    assert_same_bits("table", arena.array("table", "f32", vocab * vocab), want)


def test_the_scatter_never_writes_a_key_outside_the_table() -> None:
    vocab = 5
    keys = np.array([0, 24, 25, 2**40], np.uint64)  # two past V x V = 25
    arena = Arena({"table": 4 * 32, "keys": 8 * 4, "values": 4 * 4})
    arena.array("keys", "u64", 4)[:] = keys
    arena.array("values", "f32", 4)[:] = np.float32(0.25)
    ref.scatter(arena.memory, scatter_args(arena, vocab, 4))
    table = arena.array("table", "f32", 32)
    assert table[0] == table[24] == np.float32(0.25)
    assert not table[1:24].any() and not table[25:].any()  # the bytes past the table too


def test_the_scatter_of_no_pairs_writes_nothing() -> None:
    arena = Arena({"table": 16, "keys": 8, "values": 4})
    ref.scatter(arena.memory, scatter_args(arena, 2, 0))
    assert not arena.buffer.any()


def loss_arena(rng: np.random.Generator, vocab: int) -> tuple[Arena, dict]:
    cells = vocab * vocab
    arena = Arena({"parameters": 4 * cells, "weights": 4 * cells, "gradients": 4 * cells,
                   "loss": 4 * vocab, "loss_alone": 4 * vocab})
    table = rng.normal(0.0, 3.0, cells).astype(F32)
    table[rng.integers(0, cells, size=max(1, cells // 50))] = F32(-1e30)
    arena.array("parameters", "f32", cells)[:] = table
    keys, values = sparse_weights(rng, vocab, max(1, cells // 7))
    weights = np.zeros(cells, F32)
    weights[keys.astype(np.int64)] = values
    arena.array("weights", "f32", cells)[:] = weights
    args = {"parameters": arena.at["parameters"], "weights": arena.at["weights"],
            "gradients": arena.at["gradients"], "loss": arena.at["loss"],
            "log2e": ref.LOG2E.value, "ln2": ref.LN2.value, "vocab": vocab}
    return arena, args


KERNEL_SETS = ["reference"]
try:
    from bob.kernels import fast
except ImportError:  # numba is optional
    fast = None
else:
    KERNEL_SETS.append("fast")


@pytest.mark.parametrize("kernels", KERNEL_SETS)
@pytest.mark.parametrize("vocab", [2, 3, 256, 300, 1100])
def test_the_loss_alone_is_the_loss_gradient_s_loss(kernels: str, vocab: int) -> None:
    """Bit for bit, through the same implementation's loss-gradient; no gradient written."""
    table = ref.KERNELS if kernels == "reference" else fast.KERNELS
    arena, args = loss_arena(np.random.default_rng(vocab), vocab)
    table[sig.LOSS_CORPUS](arena.memory, args)
    alone = {**args, "loss": arena.at["loss_alone"]}
    del alone["gradients"]
    gradients = arena.array("gradients", "f32", vocab * vocab).copy()
    arena.array("gradients", "f32", vocab * vocab)[:] = np.float32(7.0)
    table[sig.LOSS_ONLY_CORPUS](arena.memory, alone)
    assert_same_bits("loss", arena.array("loss_alone", "f32", vocab),
                     arena.array("loss", "f32", vocab))
    assert (arena.array("gradients", "f32", vocab * vocab) == np.float32(7.0)).all()
    assert gradients.any()  # the loss-gradient did write them


def test_the_reference_loss_alone_takes_the_table_a_block_of_rows_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = 64
    arena, args = loss_arena(np.random.default_rng(1), vocab)
    ref.loss_gradient_corpus(arena.memory, args)
    monkeypatch.setattr(ref, "_LOSS_BLOCK_ELEMENTS", 5 * vocab)  # 13 blocks, the last of 4
    alone = {**args, "loss": arena.at["loss_alone"]}
    ref.loss_corpus(arena.memory, alone)
    assert_same_bits("loss", arena.array("loss_alone", "f32", vocab),
                     arena.array("loss", "f32", vocab))
