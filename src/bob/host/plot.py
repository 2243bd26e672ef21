"""Pictures of a run: the loss curve and the learned transition probabilities."""

from __future__ import annotations

import math

import numpy as np

from bob.kernels.arith import exp2

# A 3x5 pixel font: enough for axis numbers.
_GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001010010010", "8": "111101111101111",
    "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
    "e": "000111111100111", " ": "000000000000000",
}
_INK = np.array([30, 30, 30], np.uint8)


def _text(image: np.ndarray, x: int, y: int, text: str, scale: int = 2) -> None:
    for i, char in enumerate(text):
        bits = _GLYPHS.get(char, _GLYPHS[" "])
        for k, bit in enumerate(bits):
            if bit == "1":
                row, col = divmod(k, 3)
                y0, x0 = y + row * scale, x + (i * 4 + col) * scale
                image[y0:y0 + scale, x0:x0 + scale] = _INK


def _line(image: np.ndarray, x0: float, y0: float, x1: float, y1: float,
          colour: tuple[int, int, int]) -> None:
    steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    xs = np.linspace(x0, x1, steps).round().astype(int)
    ys = np.linspace(y0, y1, steps).round().astype(int)
    height, width, _ = image.shape
    keep = (xs >= 0) & (xs < width) & (ys >= 0) & (ys < height)
    image[ys[keep], xs[keep]] = colour
    image[np.minimum(ys[keep] + 1, height - 1), xs[keep]] = colour


def loss_curve(steps: list[int], losses: list[float], optimum: float | None = None,
               width: int = 640, height: int = 400,
               validation: list[tuple[int, float]] | None = None) -> np.ndarray:
    """Loss against update, with the optimum as a dashed line where known.

    `validation` (step, loss) pairs are drawn in orange beside the training loss.
    """
    if len(steps) != len(losses) or not steps:
        raise ValueError("a loss curve needs as many steps as losses, at least one")
    validation = validation or []
    image = np.full((height, width, 3), 255, np.uint8)
    left, right, top, bottom = 70, width - 20, 20, height - 40
    val_losses = [loss for _, loss in validation]
    low = min(losses + val_losses + ([optimum] if optimum is not None else []))
    high = max(losses + val_losses)
    if high - low < 1e-12:
        high = low + 1.0
    first = min(steps + [s for s, _ in validation])
    last = max(steps + [s for s, _ in validation])
    span = max(last - first, 1)

    def px(step: float, loss: float) -> tuple[float, float]:
        return (left + (step - first) / span * (right - left),
                bottom - (loss - low) / (high - low) * (bottom - top))

    for x0, y0, x1, y1 in ((left, top, left, bottom), (left, bottom, right, bottom)):
        _line(image, x0, y0, x1, y1, (30, 30, 30))
    for loss in (low, (low + high) / 2, high):
        _, y = px(first, loss)
        _line(image, left - 5, y, left, y, (30, 30, 30))
        _text(image, 4, int(y) - 5, f"{loss:.3f}")
    for step in (first, last):
        x, _ = px(step, low)
        _text(image, int(x) - 10, bottom + 10, str(step))
    if optimum is not None:
        _, y = px(first, optimum)
        for x in range(left, right, 12):
            _line(image, x, y, min(x + 6, right), y, (200, 60, 60))
    val_points = [px(s, v) for s, v in validation]
    for (x0, y0), (x1, y1) in zip(val_points, val_points[1:], strict=False):
        _line(image, x0, y0, x1, y1, (230, 140, 20))
    points = [px(s, v) for s, v in zip(steps, losses, strict=True)]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        _line(image, x0, y0, x1, y1, (40, 90, 200))
    if len(points) == 1:
        x, y = points[0]
        image[int(y) - 2:int(y) + 3, int(x) - 2:int(x) + 3] = (40, 90, 200)
    return image


def transition_heat_map(table: np.ndarray, pixels_per_cell: int = 2) -> np.ndarray:
    """Row-softmax of the table (previous byte down, next byte across), sqrt-scaled."""
    table = table.astype(np.float32)
    z = (table - table.max(axis=1, keepdims=True)) * np.float32(math.log2(math.e))
    probabilities = exp2(z).astype(np.float64)
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    level = np.sqrt(probabilities / max(probabilities.max(), 1e-300))
    # white -> deep blue
    colours = np.stack([255 - 225 * level, 255 - 175 * level, 255 - 55 * level], axis=-1)
    image = colours.round().astype(np.uint8)
    return image.repeat(pixels_per_cell, axis=0).repeat(pixels_per_cell, axis=1)
