"""Text generation from a table of logit rows: greedy or sampled.

Sampling is reproducible everywhere: the uniform number for position i is a
pure function of (seed, i) (SplitMix64, a counter-based generator), and the
probabilities use Bob's own exp2, so the same seed gives the same text on
every backend and every machine.
"""

from __future__ import annotations

import numpy as np

from bob.kernels.arith import exp2

_MASK = (1 << 64) - 1
_LOG2E = np.float32(1.4426950408889634)


def splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def uniform(seed: int, position: int) -> float:
    """A number in [0, 1) determined by (seed, position) alone."""
    mixed = splitmix64((seed & _MASK) ^ splitmix64(position & _MASK))
    return (mixed >> 11) * 2.0**-53


def top_k_mask(logits: np.ndarray, k: int | None) -> np.ndarray:
    """True for the k largest logits; ties go to the lower index, so the choice is fixed."""
    if k is None or k >= len(logits):
        return np.ones(len(logits), bool)
    if k < 1:
        raise ValueError(f"top-k must be at least 1, not {k}")
    # The k-th largest value by a partition (linear in V: a token row is 50257 wide), then
    # every larger value and the lowest-indexed equal ones: a stable sort's first k.
    values = logits.astype(np.float32)
    kth = np.partition(values, len(values) - k)[len(values) - k]
    mask = values > kth
    mask[np.flatnonzero(values == kth)[:k - int(mask.sum())]] = True
    return mask


def candidates(logits: np.ndarray, top_k: int | None = None,
               allowed: np.ndarray | None = None) -> np.ndarray:
    """True for the symbols a draw may give: the `top_k` most likely of the `allowed` ones
    (all of them where None)."""
    if allowed is None:
        return top_k_mask(logits, top_k)
    if not allowed.any():
        raise ValueError("no symbol is allowed")
    ranked = np.where(allowed, logits.astype(np.float32), np.float32(-np.inf))
    return top_k_mask(ranked, top_k) & allowed


def weights(logits: np.ndarray, temperature: float, top_k: int | None = None,
            allowed: np.ndarray | None = None) -> np.ndarray:
    """softmax(logits / temperature)'s weights before normalising (float64, the largest
    1), zero outside `candidates`: what a draw chooses among.

    A temperature so small that the scaled logits or their distances from the largest
    leave binary32's range (1e-39, 1e-45, one that rounds to 0) takes the limit of small
    temperatures instead: weight 1 on the largest candidates, 0 elsewhere, so a unique
    largest logit is drawn every time, as greedy generation chooses it.
    """
    keep = candidates(logits, top_k, allowed)
    # Out of range, quietly: the limit below replaces any value that left it.
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        scaled = logits.astype(np.float32) / np.float32(temperature)
        exponents = (scaled - scaled[keep].max()) * _LOG2E
    if not np.isfinite(exponents[keep]).all():
        return _coldest(logits, keep)
    # The largest candidate weighs 1 (without `allowed`, the largest of all: the likeliest
    # symbol is always a candidate).
    found = exp2(exponents).astype(np.float64)
    found[~keep] = 0.0
    return found


def _coldest(logits: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The weights as the temperature goes to 0: 1 on the candidates of the largest logit,
    0 elsewhere."""
    values = logits.astype(np.float32)
    return (keep & (values == values[keep].max())).astype(np.float64)


def probabilities(logits: np.ndarray, temperature: float = 1.0, top_k: int | None = None,
                  allowed: np.ndarray | None = None) -> np.ndarray:
    """The distribution a draw follows (float64, summing to 1)."""
    found = weights(logits, temperature, top_k, allowed)
    return found / found.sum()


def greedy(logits: np.ndarray, allowed: np.ndarray | None = None) -> int:
    """The most likely symbol (of the `allowed` ones), the lowest index among equals."""
    if allowed is None:
        return int(np.argmax(logits))
    return int(np.argmax(np.where(allowed, logits.astype(np.float32), np.float32(-np.inf))))


def sample_row(logits: np.ndarray, temperature: float, u: float, top_k: int | None = None,
               allowed: np.ndarray | None = None) -> int:
    """Inverse-CDF sample of softmax(logits / temperature) with the uniform u.

    With `top_k`, only the k most likely symbols can be drawn (the others weigh 0); with
    `allowed`, only those it marks (the k most likely of them).
    """
    cumulative = np.cumsum(weights(logits, temperature, top_k, allowed))  # in index order
    index = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    return min(index, len(cumulative) - 1)


def generate(logit_rows: np.ndarray, greedy_next: np.ndarray, prompt: bytes, length: int,
             temperature: float = 0.0, seed: int = 0, top_k: int | None = None) -> bytes:
    """Continue `prompt` by `length` bytes.

    `logit_rows[r]` are the logits after byte r and `greedy_next[r]` their argmax
    (both computed by the device program); temperature 0 follows the argmax
    (which is always among the top k).
    """
    if not prompt:
        raise ValueError("the prompt must have at least one byte")
    if temperature < 0:
        raise ValueError("the temperature must be >= 0")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top-k must be at least 1, not {top_k}")
    out = bytearray()
    last = prompt[-1]
    for position in range(length):
        if temperature == 0:
            nxt = int(greedy_next[last])
        else:
            nxt = sample_row(logit_rows[last], temperature, uniform(seed, position), top_k)
        out.append(nxt)
        last = nxt
    return bytes(out)
