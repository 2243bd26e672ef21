"""The peers: the objective trained by NumPy, PyTorch and JAX as their users would write it.

A peer whose package or device is missing raises Unavailable when it is made.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod

import numpy as np

from bob.config import Hyper
from dev.bench.tables import TARGET_SEED, Device


class Unavailable(Exception):
    """A contender cannot run here (a missing package or device); the message says why."""


def bench_targets(vocab: int, seed: int = TARGET_SEED) -> np.ndarray:
    """Row r's target byte, uniformly random: u32[V]."""
    return np.random.default_rng(seed).integers(0, vocab, vocab, dtype=np.uint32)


def numpy_objective(table: np.ndarray, targets: np.ndarray) -> float:
    """Mean over rows of -log softmax(W[r])[t_r], in float64 (a referee, not a contender)."""
    w = table.astype(np.float64)
    shifted = w - w.max(axis=1, keepdims=True)
    log_sums = np.log(np.exp(shifted).sum(axis=1))
    return float(np.mean(log_sums - shifted[np.arange(len(w)), targets]))


def numpy_train(w: np.ndarray, m: np.ndarray, v: np.ndarray, targets: np.ndarray,
                updates: int, hyper: Hyper = Hyper(), first_step: int = 1) -> list[float]:
    """The plain float32 NumPy loop: `updates` AdamW steps on (w, m, v), in place.

    Written the straightforward way a user would (a new array per operation),
    with torch.optim.AdamW's formula. Returns the objective before each update.
    """
    vocab = w.shape[0]
    rows = np.arange(vocab)
    lr, wd, b1, b2, eps = hyper.lr, hyper.weight_decay, hyper.beta1, hyper.beta2, hyper.eps
    losses = []
    for t in range(first_step, first_step + updates):
        # forward: softmax cross-entropy of each row against its target
        shifted = w - w.max(axis=1, keepdims=True)  # [V, V]
        exp = np.exp(shifted)  # [V, V]
        total = exp.sum(axis=1, keepdims=True)  # [V, 1]
        losses.append(float(np.mean(np.log(total[:, 0]) - shifted[rows, targets])))
        # backward: d mean / d W = (softmax - onehot) / V
        grad = exp / total  # [V, V]
        grad[rows, targets] -= 1
        grad /= vocab
        # AdamW
        w *= 1 - lr * wd
        m[:] = b1 * m + (1 - b1) * grad
        v[:] = b2 * v + (1 - b2) * grad * grad
        bias1 = 1 - b1**t
        bias2 = 1 - b2**t
        w -= lr / bias1 * m / (np.sqrt(v) / math.sqrt(bias2) + eps)
    return losses


class Peer(ABC):
    """A contender that trains the objective its own way."""

    name = "peer"
    note = ""

    @abstractmethod
    def reset(self) -> None:
        """Back to the zero table and moments at step 0 (untimed)."""

    @abstractmethod
    def run(self) -> None:
        """N updates; returns when the work is done."""

    @abstractmethod
    def loss(self) -> float:
        """The objective of the current table (untimed)."""

    def close(self) -> None:  # noqa: B027 - most peers free nothing
        """Free what the peer holds."""


class NumpyPeer(Peer):
    name = "numpy loop"

    def __init__(self, vocab: int, updates: int, targets: np.ndarray, hyper: Hyper):
        self.vocab, self.updates, self.targets, self.hyper = vocab, updates, targets, hyper
        self.note = f"float32, numpy {np.__version__}"
        self.reset()

    def reset(self) -> None:
        shape = (self.vocab, self.vocab)
        self.w, self.m, self.v = (np.zeros(shape, np.float32) for _ in range(3))

    def run(self) -> None:
        numpy_train(self.w, self.m, self.v, self.targets, self.updates, self.hyper)

    def loss(self) -> float:
        return numpy_objective(self.w, self.targets)


def torch_modules():
    try:
        import torch
        import torch.nn.functional as functional
    except ImportError as error:
        raise Unavailable(f"PyTorch is not installed ({error})") from None
    return torch, functional


class TorchEager(Peer):
    """The eager loop: cross_entropy, backward, AdamW.step (torch's default implementation)."""

    def __init__(self, vocab: int, updates: int, targets: np.ndarray, hyper: Hyper,
                 device: Device):
        torch, self.functional = torch_modules()
        if device == "cuda" and not torch.cuda.is_available():
            raise Unavailable("PyTorch sees no CUDA device")
        self.torch, self.device, self.updates, self.hyper = torch, device, updates, hyper
        self.name = "pytorch eager" if device == "cuda" else "pytorch cpu eager"
        threads = "" if device == "cuda" else f", {torch.get_num_threads()} threads"
        self.note = f"torch {torch.__version__}{threads}"
        self.targets = torch.as_tensor(targets.astype(np.int64), device=device)
        self.w = torch.zeros((vocab, vocab), dtype=torch.float32, device=device,
                             requires_grad=True)
        self.reset()

    def _optimizer(self):
        h = self.hyper
        return self.torch.optim.AdamW([self.w], lr=h.lr, betas=(h.beta1, h.beta2), eps=h.eps,
                                      weight_decay=h.weight_decay)

    def _synchronize(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def reset(self) -> None:
        with self.torch.no_grad():
            self.w.zero_()
        self.w.grad = None
        self.optimizer = self._optimizer()
        self._synchronize()

    def run(self) -> None:
        cross_entropy, optimizer = self.functional.cross_entropy, self.optimizer
        for _ in range(self.updates):
            optimizer.zero_grad(set_to_none=True)
            loss = cross_entropy(self.w, self.targets)
            loss.backward()
            optimizer.step()
        self._synchronize()

    def loss(self) -> float:
        with self.torch.no_grad():
            return float(self.functional.cross_entropy(self.w, self.targets))

    def close(self) -> None:
        del self.optimizer, self.w
        if self.device == "cuda":
            self.torch.cuda.empty_cache()


class TorchGraph(TorchEager):
    """One training step captured as a CUDA graph (capturable AdamW), replayed N times."""

    def __init__(self, vocab: int, updates: int, targets: np.ndarray, hyper: Hyper):
        super().__init__(vocab, updates, targets, hyper, "cuda")
        self.name = "pytorch cuda graph"
        torch, cross_entropy = self.torch, self.functional.cross_entropy
        # As torch's "whole network capture": warm up on a side stream, then capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.optimizer.zero_grad(set_to_none=True)
                cross_entropy(self.w, self.targets).backward()
                self.optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            cross_entropy(self.w, self.targets).backward()
            self.optimizer.step()
        self.reset()

    def _optimizer(self):
        h = self.hyper
        return self.torch.optim.AdamW([self.w], lr=h.lr, betas=(h.beta1, h.beta2), eps=h.eps,
                                      weight_decay=h.weight_decay, capturable=True)

    def reset(self) -> None:
        if not hasattr(self, "graph"):  # before capture: a fresh optimizer
            super().reset()
            return
        # The graph reads these very buffers: zero them in place.
        with self.torch.no_grad():
            self.w.zero_()
            state = self.optimizer.state[self.w]
            for name in ("exp_avg", "exp_avg_sq", "step"):
                state[name].zero_()
        self._synchronize()

    def run(self) -> None:
        for _ in range(self.updates):
            self.graph.replay()
        self._synchronize()

    def close(self) -> None:
        del self.graph
        super().close()


class JaxLoop(Peer):
    """jit(fori_loop) over N updates; AdamW in jnp as torch.optim.AdamW computes it."""

    name = "jax jit(fori_loop)"

    def __init__(self, vocab: int, updates: int, targets: np.ndarray, hyper: Hyper):
        # JAX takes 75% of the GPU at its first use unless told otherwise.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        try:
            import jax
            import jax.numpy as jnp
        except ImportError as error:
            raise Unavailable(f"JAX is not installed ({error})") from None
        if jax.default_backend() not in ("gpu", "cuda"):
            raise Unavailable(f"JAX runs on {jax.default_backend()} here, not a GPU")
        self.jax, self.vocab, self.updates = jax, vocab, updates
        self.note = f"jax {jax.__version__}"
        self.targets = jnp.asarray(targets.astype(np.int32))
        lr, wd, b1, b2, eps = hyper.lr, hyper.weight_decay, hyper.beta1, hyper.beta2, hyper.eps

        def objective(w, targets):
            log_p = jax.nn.log_softmax(w, axis=1)  # [V, V]
            return -jnp.mean(jnp.take_along_axis(log_p, targets[:, None], axis=1))

        gradient = jax.grad(objective)

        def train(state, targets):
            def update(i, state):
                w, m, v = state
                g = gradient(w, targets)
                t = (i + 1).astype(jnp.float32)
                w = w * (1 - lr * wd)
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                bias1 = 1 - b1**t
                bias2 = 1 - b2**t
                w = w - lr / bias1 * m / (jnp.sqrt(v) / jnp.sqrt(bias2) + eps)
                return w, m, v
            return jax.lax.fori_loop(0, updates, update, state)

        self._train = jax.jit(train, donate_argnums=0)
        self._objective = jax.jit(objective)
        self.reset()

    def reset(self) -> None:
        zeros = np.zeros((self.vocab, self.vocab), np.float32)
        self.state = tuple(self.jax.device_put(zeros) for _ in range(3))
        self.jax.block_until_ready(self.state)

    def run(self) -> None:
        self.state = self._train(self.state, self.targets)
        self.jax.block_until_ready(self.state)

    def loss(self) -> float:
        return float(self._objective(self.state[0], self.targets))

    def close(self) -> None:
        for array in self.state:
            array.delete()
        self.state = ()

