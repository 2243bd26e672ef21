"""Pictures of a run through matplotlib (the `plot` extra): the loss curve and the
learned transition probabilities.

The figures are built by pure functions that return a `Figure` (no pyplot, no
global state), so a test can read what a figure holds before it is saved.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from bob.errors import BackendUnavailable
from bob.kernels.arith import exp2

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Curve = Sequence[tuple[int, float]]  # (update, loss) points

TRAIN_LABEL = "training loss"
VALIDATION_LABEL = "validation loss"
OPTIMUM_LABEL = "optimum (exact bigram entropy)"


def _figure_class() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise BackendUnavailable(
            f"plots need matplotlib ({error}); pip install 'bob[plot]'") from None
    return Figure


def loss_figure(training: Curve, optimum: float | None = None,
                validation: Curve = (), changes: Sequence[int] = ()) -> Figure:
    """Loss against update; beside it, the excess over the optimum on a log scale.

    `validation` adds a second curve where the history has one; `changes` are
    the updates where a resumed run changed its data or hyperparameters.
    """
    if not training:
        raise ValueError("a loss curve needs at least one (update, loss) point")
    panels = 2 if optimum is not None else 1
    figure = _figure_class()(figsize=(6.4 * panels, 4.8), layout="constrained")
    figure.suptitle("Bob: loss per invocation")
    loss_axes = figure.add_subplot(1, panels, 1)
    _curves(loss_axes, training, validation, lambda loss: loss)
    if optimum is not None:
        loss_axes.axhline(optimum, color="tab:red", linestyle="--", label=OPTIMUM_LABEL)
    _mark_changes(loss_axes, changes)
    loss_axes.set(title="loss", xlabel="update", ylabel="loss (nats per transition)")
    loss_axes.legend()
    if optimum is not None:
        excess_axes = figure.add_subplot(1, panels, 2)
        # The log scale cannot show 0: a loss equal to the optimum is left out.
        _curves(excess_axes, training, validation,
                lambda loss: loss - optimum if loss > optimum else math.nan)
        _mark_changes(excess_axes, changes)
        excess_axes.set_yscale("log")
        excess_axes.set(title="excess over the optimum", xlabel="update",
                        ylabel="loss - optimum (nats, log scale)")
        excess_axes.legend()
    return figure


def _curves(axes, training: Curve, validation: Curve, value) -> None:
    for points, label, style in ((training, TRAIN_LABEL, "o-"),
                                 (validation, VALIDATION_LABEL, "s--")):
        if points:
            steps = [step for step, _ in points]
            axes.plot(steps, [value(loss) for _, loss in points], style, label=label,
                      markersize=3)


def _mark_changes(axes, changes: Sequence[int]) -> None:
    for i, step in enumerate(changes):
        axes.axvline(step, color="grey", linewidth=0.8, linestyle=":",
                     label="data or hyperparameters changed" if i == 0 else None)


def transition_probabilities(table: np.ndarray) -> np.ndarray:
    """Row-softmax of the table with Bob's exp2: P(next | previous) for each row."""
    table = table.astype(np.float32)
    z = (table - table.max(axis=1, keepdims=True)) * np.float32(math.log2(math.e))
    probabilities = exp2(z).astype(np.float64)
    return probabilities / probabilities.sum(axis=1, keepdims=True)


def transitions_figure(table: np.ndarray) -> Figure:
    """The learned P(next byte | previous byte) as a heat map with a colour bar."""
    probabilities = transition_probabilities(table)
    vocab = len(probabilities)
    figure = _figure_class()(figsize=(7.2, 6.4), layout="constrained")
    axes = figure.add_subplot()
    # sqrt-scaled colours: most mass sits in a few cells, the rest would all look white
    from matplotlib.colors import PowerNorm

    image = axes.imshow(probabilities, cmap="Blues", norm=PowerNorm(0.5, vmin=0, vmax=1),
                        interpolation="nearest", aspect="equal")
    axes.set(title=f"Learned transitions (V={vocab})", xlabel="next byte",
             ylabel="previous byte")
    ticks = list(range(0, vocab, max(1, vocab // 8)))
    axes.set_xticks(ticks, [_tick(t, vocab) for t in ticks], fontsize=7)
    axes.set_yticks(ticks, [_tick(t, vocab) for t in ticks], fontsize=7)
    colour_bar = figure.colorbar(image, ax=axes)
    colour_bar.set_label("P(next | previous)")
    return figure


def _tick(value: int, vocab: int) -> str:
    if vocab == 256 and 0x21 <= value < 0x7F:
        return f"{value} {chr(value)}"
    return str(value)


def png_bytes(figure: Figure) -> bytes:
    """The figure as PNG, rendered by Agg (no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
