"""Helpers for tables too large to hold whole in a test: lazy arenas and row-wise oracles.

At V = 65536 a table is 16 GiB. The CPU tests never allocate one: an arena that is
only addressed (a few rows touched) is an anonymous mapping reserved without backing,
and the oracle of a few rows runs the reference kernels on those rows alone (a row's
update depends on that row only, ARITHMETIC.md).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np
import pytest

from bob.kernels import reference as ref

MAP_NORESERVE = 0x4000  # Linux; Python's mmap module does not name it
ADAM_STRIDE = 8


def lazy_bytes(size: int) -> np.ndarray:
    """`size` zero bytes that take memory only where written (Linux, MAP_NORESERVE), so a
    16 GiB arena can be addressed on a 4 GiB machine."""
    try:
        mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                            | MAP_NORESERVE)
    except OSError as error:
        pytest.skip(f"cannot reserve {size} bytes of address space: {error}")
    return np.frombuffer(mapping, np.uint8)


@dataclass(frozen=True)
class Rows:
    """Some rows of a training state: parameters, moments, and the mode's data."""

    parameters: np.ndarray  # f32[R][V]
    first_moment: np.ndarray
    second_moment: np.ndarray
    targets: np.ndarray | None = None  # u32[R], hard mode
    weights: np.ndarray | None = None  # f32[R][V], corpus mode


def fused_rows_reference(rows: Rows, steps: np.ndarray, vocab: int,
                         ) -> tuple[np.ndarray, ...]:
    """The fused kernel on these rows alone, by the NumPy reference: parameters, moments,
    gradients and row losses after len(steps) updates (steps: f32[N][8])."""
    w, m, v = (np.array(a, np.float32, copy=True)
               for a in (rows.parameters, rows.first_moment, rows.second_moment))
    scalars = ref.LossScalars.for_vocab(vocab)  # 1/V of the whole table, not of R rows
    if rows.targets is not None:
        def loss_gradient(table: np.ndarray, out: np.ndarray) -> tuple:
            return ref.loss_gradient_hard_rows(table, rows.targets, scalars, out=out)
    else:
        corpus = ref.LossScalars(scalars.log2e, scalars.ln2)

        def loss_gradient(table: np.ndarray, out: np.ndarray) -> tuple:
            return ref.loss_gradient_corpus_rows(table, rows.weights, corpus, out=out)
    gradients = np.empty_like(w)
    loss = ref.fused_train_rows(w, m, v, loss_gradient, steps.reshape(-1, ADAM_STRIDE),
                                gradients)
    return w, m, v, gradients, loss
