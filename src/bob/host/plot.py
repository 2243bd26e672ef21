"""Pictures of a run through matplotlib (the `plot` extra): the loss curve and the
learned transition probabilities, over the symbols the data uses (at large V the most
frequent of them, read a few rows at a time from the checkpoint file).

The figures are built by pure functions that return a `Figure` (no pyplot, no
global state), so a test can read what a figure holds before it is saved.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bob.errors import BackendUnavailable
from bob.kernels.arith import exp2

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from bob.records.counting import PairCounts

Curve = Sequence[tuple[int, float]]  # (update, loss) points

TRAIN_LABEL = "training loss"
VALIDATION_LABEL = "validation loss"
OPTIMUM_LABEL = "optimum (exact bigram entropy)"


def _figure_class() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise BackendUnavailable(
            f"plots need matplotlib ({error}); pip install 'bob-bigram[plot]'") from None
    return Figure


def loss_figure(training: Curve, optimum: float | None = None,
                validation: Curve = (), changes: Sequence[int] = ()) -> Figure:
    """Loss against update on a log scale, from the first invocation on, with the optimum
    and the validation points; beside it, the training loss's excess over the optimum from
    update 0 (log scale too).

    The loss before any update (5.55 nats for V = 256) is left off the first panel: beside
    it a converging curve would look flat. `validation` adds the validation points where
    the history has them; `changes` are the updates where a resumed run changed its data
    or hyperparameters.
    """
    if not training:
        raise ValueError("a loss curve needs at least one (update, loss) point")
    panels = 2 if optimum is not None else 1
    figure = _figure_class()(figsize=(6.4 * panels, 4.8), layout="constrained")
    figure.suptitle("Bob: loss per invocation")
    loss_axes = figure.add_subplot(1, panels, 1)
    first = training[0][0]
    trained = _after(training, first)
    validated = _after(validation, first)
    if len(trained) < 2:  # one invocation: its start and its end, a line and not a dot
        trained, validated = list(training), list(validation)
    _curves(loss_axes, trained, validated, lambda loss: loss if loss > 0 else math.nan)
    if optimum is not None and optimum > 0:  # an optimum of 0 has no place on a log scale
        loss_axes.axhline(optimum, color="tab:red", linestyle="--", label=OPTIMUM_LABEL)
    _mark_changes(loss_axes, changes)
    values = [loss for _, loss in (*trained, *validated) if loss > 0]
    if values:
        loss_axes.set_yscale("log")
        _readable_log_ticks(loss_axes, [*values, *([optimum] if optimum else [])])
    loss_axes.set(title="loss from the first invocation", xlabel="update",
                  ylabel="loss (nats per transition, log scale)")
    loss_axes.legend()
    if optimum is not None:
        excess_axes = figure.add_subplot(1, panels, 2)
        # The log scale cannot show 0: a loss equal to the optimum is left out. The
        # optimum is the training data's: validation losses are not measured against it.
        _curves(excess_axes, training, (),
                lambda loss: loss - optimum if loss > optimum else math.nan)
        _mark_changes(excess_axes, changes)
        excess_axes.set_yscale("log")
        excess_axes.set(title="excess over the optimum", xlabel="update",
                        ylabel="loss - optimum (nats, log scale)")
        excess_axes.legend()
    return figure


def _after(points: Curve, first: int) -> list[tuple[int, float]]:
    """The points past update `first`, or all of them when there are none."""
    later = [(step, loss) for step, loss in points if step > first]
    return later or list(points)


def _readable_log_ticks(axes, values: Sequence[float]) -> None:
    """Plain numbers on a log axis that may span less than a decade (2.45 to 2.60), where
    matplotlib's own log ticks would label nothing or write 2.5 x 10^0: nice numbers from
    one at or below the lowest value (the optimum, where it is drawn: so the optimum has
    ticks on both sides) to one at or above the highest, the axis between them."""
    from matplotlib.ticker import MaxNLocator, NullLocator

    finite = [value for value in values if math.isfinite(value) and value > 0]
    if not finite:
        return
    low, high = min(finite), max(finite)
    if high <= low:
        high = low * 1.01
    found = [float(t) for t in MaxNLocator(6).tick_values(low, high)]
    ticks = [t for t in found if t > 0 and low <= t <= high]
    below = [t for t in found if 0 < t <= low]
    above = [t for t in found if t >= high]
    ticks = sorted({*(below[-1:]), *ticks, *(above[:1])}) or [low]
    step = min((b - a for a, b in zip(ticks, ticks[1:], strict=False)), default=low)
    decimals = max(0, math.ceil(-math.log10(step)) if step > 0 else 4)
    ticks = [round(t, decimals) for t in ticks]  # where the labels say: 2.4, not 2.4000000004
    axes.yaxis.set_minor_locator(NullLocator())
    axes.set_yticks(ticks, [f"{t:.{decimals}f}" for t in ticks])
    axes.set_ylim(min(ticks[0], low), max(ticks[-1], high))


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


# Rows `indices` of the parameters, f32[len][V] (a checkpoint file's, read a few at a time).
Rows = Callable[[Sequence[int]], np.ndarray]
FULL_MAP_MAX_VOCAB = 512  # up to this V the map shows every symbol the data uses
TOP_SYMBOLS = 64  # above it, the most frequent ones
ROWS_READ_BYTES = 8 << 20  # a pass over the rows reads this much at a time
LABELLED_SYMBOLS = 128  # every symbol labelled up to this many, else every k-th
# The heat map's scale, at the PNG's 100 dpi: a cell of 0.2 in (20 px) a symbol, labels of
# 10 pt (14 px) that fit one to a cell, whatever the count; at most 30 in a side.
CELL_INCHES = 0.2
TICK_POINTS = 10.0
MAX_SIDE_INCHES = 30.0
LABEL_CHARACTERS = 10  # a token's text is cut to this many characters on its tick
COLOUR_SCALE = "square-root colour scale"  # PowerNorm(0.5): named on the colour bar


@dataclass(frozen=True)
class Selection:
    """The symbols a heat map shows (its rows and columns, in order) and why."""

    symbols: tuple[int, ...]
    used: int  # the symbols the data uses
    vocab: int
    ranked_by: str | None = None  # "counts" or "model" when the top ones were picked


def table_rows(table: np.ndarray) -> Rows:
    """A table in memory as `Rows`."""
    return lambda indices: np.asarray(table)[list(indices)]


def symbol_counts(counts: PairCounts) -> np.ndarray:
    """How often each symbol occurs in the counted data, as previous or next (u64[V])."""
    rows, columns, values = counts.entries()
    weights = values.astype(np.float64)
    return (np.bincount(rows, weights, counts.vocab)
            + np.bincount(columns, weights, counts.vocab))


def choose_symbols(rows: Rows, vocab: int, frequency: np.ndarray | None = None) -> Selection:
    """The symbols the data uses: those counted (`frequency`, from a counts file), else the
    rows training moved off their start (a row it never saw stays constant). Above
    FULL_MAP_MAX_VOCAB only the TOP_SYMBOLS most frequent, by count or else by the model's
    own estimate (the summed P(next | previous) of the trained rows). One pass over the
    rows, a few at a time: no V x V array on the host."""
    if frequency is not None:
        used = np.flatnonzero(frequency > 0)
        ranked_by = "counts"
    else:
        trained = np.zeros(vocab, bool)
        frequency = np.zeros(vocab)
        block = max(1, ROWS_READ_BYTES // (4 * vocab))
        for first in range(0, vocab, block):
            indices = range(first, min(first + block, vocab))
            part = rows(indices)
            moved = part.max(axis=1) != part.min(axis=1)
            trained[first:first + len(part)] = moved
            if moved.any():
                frequency += transition_probabilities(part[moved]).sum(axis=0)
        used = np.flatnonzero(trained)
        ranked_by = "model"
    if vocab <= FULL_MAP_MAX_VOCAB or len(used) <= TOP_SYMBOLS:
        return Selection(tuple(int(s) for s in used), len(used), vocab)
    order = np.argsort(-frequency[used], kind="stable")[:TOP_SYMBOLS]
    return Selection(tuple(int(s) for s in used[order]), len(used), vocab, ranked_by)


def symbol_label(symbol: int, vocab: int, decode: Callable[[int], str] | None = None) -> str:
    """A byte as a reader knows it ('a', ' ', '\\n', 0x9f); a token as its text where
    `decode` gives it ('th', ' the', cut to LABEL_CHARACTERS), else as its id."""
    if vocab != 256:
        if decode is None:
            return str(symbol)
        text = repr(decode(symbol))
        return text if len(text) <= LABEL_CHARACTERS else text[:LABEL_CHARACTERS - 1] + "…"
    character = chr(symbol)
    if (character.isprintable() and symbol < 0x7F) or character in "\n\t\r":
        return repr(character)
    return f"0x{symbol:02x}"


def transitions_figure(rows: Rows | np.ndarray, vocab: int | None = None,
                       frequency: np.ndarray | None = None,
                       decode: Callable[[int], str] | None = None) -> Figure:
    """The learned P(next | previous) as a heat map with a colour bar, over the symbols
    `choose_symbols` picks (only their rows are read: no V x V array on the host); a token
    model's ticks show each token's text where `decode` (its tokenizer's) gives it."""
    if isinstance(rows, np.ndarray):
        vocab = len(rows)
        rows = table_rows(rows)
    if vocab is None:
        raise ValueError("give V with a row reader")
    selection = choose_symbols(rows, vocab, frequency)
    symbols = list(selection.symbols) or list(range(min(vocab, TOP_SYMBOLS)))
    probabilities = transition_probabilities(rows(symbols))[:, symbols]
    shown = len(symbols)
    every = max(1, math.ceil(shown / LABELLED_SYMBOLS))
    ticks = list(range(0, shown, every))
    labels = [symbol_label(symbols[t], vocab, decode) for t in ticks]
    # Cells that each hold a label's height, and room beside them for the longest label
    # (a character is about 0.6 em wide; a token's text is longer than a byte's).
    longest = max((len(label) for label in labels), default=1)
    margin = 1.5 + longest * 0.6 * TICK_POINTS / 72
    side = min(MAX_SIDE_INCHES, max(6.4, margin + CELL_INCHES * shown))
    figure = _figure_class()(figsize=(side + 1.6, side), layout="constrained")
    axes = figure.add_subplot()
    # sqrt-scaled colours: most mass sits in a few cells, the rest would all look white
    from matplotlib.colors import PowerNorm

    image = axes.imshow(probabilities, cmap="Blues", norm=PowerNorm(0.5, vmin=0, vmax=1),
                        interpolation="nearest", aspect="equal")
    unit = "byte" if vocab == 256 else "token"
    axes.set_title(_transitions_title(selection, shown, unit), fontsize=TICK_POINTS + 3)
    axes.set_xlabel(f"next {unit}", fontsize=TICK_POINTS + 2)
    axes.set_ylabel(f"previous {unit}", fontsize=TICK_POINTS + 2)
    axes.set_xticks(ticks, labels, fontsize=TICK_POINTS, rotation=90)
    axes.set_yticks(ticks, labels, fontsize=TICK_POINTS)
    colour_bar = figure.colorbar(image, ax=axes, shrink=0.8)
    # The scale is not linear: its ticks show where the colours sit.
    colour_bar.set_ticks([0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0])
    colour_bar.ax.tick_params(labelsize=TICK_POINTS)
    colour_bar.set_label(f"P(next | previous), {COLOUR_SCALE}", fontsize=TICK_POINTS + 2)
    return figure


def _transitions_title(selection: Selection, shown: int, unit: str) -> str:
    if not selection.symbols:
        return f"Learned transitions: no row trained yet, the first {shown} {unit}s " \
               f"(V={selection.vocab})"
    if selection.ranked_by is None:
        return (f"Learned transitions: the {shown} {unit}s the data uses "
                f"(V={selection.vocab})")
    by = "count" if selection.ranked_by == "counts" else "the model's estimate"
    return (f"Learned transitions: the {shown} most frequent of the {selection.used} "
            f"{unit}s the data uses, by {by} (V={selection.vocab})")


def png_bytes(figure: Figure) -> bytes:
    """The figure as PNG, rendered by Agg (no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
