"""The peers: the objective trained by NumPy, PyTorch and JAX as their users would write it.

Each trains what Bob's input record asks (``bob.records.binary.InputRecord``): hard targets
(the mean over rows of each row's cross-entropy against its target) or a corpus (the sum
over rows of sum_n T[r][n] (lse_r - W[r][n]), T the record's sparse weights made a dense
table on the peer's own device). A peer whose package or device is missing, or whose tables
do not fit in its device's memory, raises Unavailable when it is made.
"""

from __future__ import annotations

import math
import os
import sys
from abc import ABC, abstractmethod

import numpy as np

from bob.config import Hyper, Mode
from bob.records.binary import InputRecord
from dev.bench.tables import TARGET_SEED, Device


class Unavailable(Exception):
    """A contender cannot run here (a missing package or device, too little device memory);
    the message says why."""


def bench_targets(vocab: int, seed: int = TARGET_SEED) -> np.ndarray:
    """Row r's target byte, uniformly random: u32[V]."""
    return np.random.default_rng(seed).integers(0, vocab, vocab, dtype=np.uint32)


def numpy_objective(table: np.ndarray, targets: np.ndarray) -> float:
    """Mean over rows of -log softmax(W[r])[t_r], in float64 (a referee, not a contender)."""
    w = table.astype(np.float64)
    shifted = w - w.max(axis=1, keepdims=True)
    log_sums = np.log(np.exp(shifted).sum(axis=1))
    return float(np.mean(log_sums - shifted[np.arange(len(w)), targets]))


def numpy_corpus_objective(table: np.ndarray, weights: np.ndarray) -> float:
    """Sum over rows of sum_n T[r][n] (lse_r - W[r][n]), in float64 (a referee)."""
    w = table.astype(np.float64)
    shifted = w - w.max(axis=1, keepdims=True)
    log_sums = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(np.sum(weights.astype(np.float64) * (log_sums - shifted)))


def _adamw(w: np.ndarray, m: np.ndarray, v: np.ndarray, grad: np.ndarray, t: int,
           hyper: Hyper) -> None:
    """One AdamW step in place, with torch.optim.AdamW's formula."""
    lr, wd, b1, b2, eps = hyper.lr, hyper.weight_decay, hyper.beta1, hyper.beta2, hyper.eps
    w *= 1 - lr * wd
    m[:] = b1 * m + (1 - b1) * grad
    v[:] = b2 * v + (1 - b2) * grad * grad
    bias1 = 1 - b1**t
    bias2 = 1 - b2**t
    w -= lr / bias1 * m / (np.sqrt(v) / math.sqrt(bias2) + eps)


def numpy_train(w: np.ndarray, m: np.ndarray, v: np.ndarray, targets: np.ndarray,
                updates: int, hyper: Hyper = Hyper(), first_step: int = 1) -> list[float]:
    """The plain float32 NumPy loop: `updates` AdamW steps on (w, m, v), in place.

    Written the straightforward way a user would (a new array per operation),
    with torch.optim.AdamW's formula. Returns the objective before each update.
    """
    vocab = w.shape[0]
    rows = np.arange(vocab)
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
        _adamw(w, m, v, grad, t, hyper)
    return losses


def numpy_corpus_train(w: np.ndarray, m: np.ndarray, v: np.ndarray, weights: np.ndarray,
                       updates: int, hyper: Hyper = Hyper(), first_step: int = 1,
                       ) -> list[float]:
    """The same loop on the corpus objective: `weights` is the dense T[V][V]."""
    mass = weights.sum(axis=1, keepdims=True)  # [V, 1]: each row's share of the corpus
    losses = []
    for t in range(first_step, first_step + updates):
        shifted = w - w.max(axis=1, keepdims=True)  # [V, V]
        exp = np.exp(shifted)  # [V, V]
        total = exp.sum(axis=1, keepdims=True)  # [V, 1]
        losses.append(float(np.sum(weights * (np.log(total) - shifted))))
        # backward: d objective / d W = rowsum(T) softmax - T
        grad = exp / total * mass - weights  # [V, V]
        _adamw(w, m, v, grad, t, hyper)
    return losses


# -- device memory ---------------------------------------------------------------------
# Estimated V x V float32 tables alive at a peer's peak: W, its gradient, both moments, the
# log-softmax output its backward keeps and the gradient that flows into it (hard mode);
# the corpus adds T. A CUDA graph keeps its temporaries in a pool of its own (one more);
# JAX's loop carries w, m and v beside the gradient's temporaries. A peer is made only where
# they fit; an out-of-memory error while it runs is reported the same way.
PEAK_TABLES: dict[tuple[str, Mode], int] = {
    ("torch eager", "hard"): 6, ("torch eager", "corpus"): 7,
    ("torch graph", "hard"): 7, ("torch graph", "corpus"): 8,
    ("jax", "hard"): 7, ("jax", "corpus"): 8,
}
# JAX's allocator stops at this share of the device's memory unless told otherwise.
JAX_MEMORY_FRACTION = "0.90"


def require_room(name: str, kind: str, mode: Mode, vocab: int, free: int | None) -> None:
    """Unavailable, before anything is allocated, when the peer's tables cannot fit."""
    tables = PEAK_TABLES[(kind, mode)]
    need = tables * 4 * vocab * vocab
    if free is not None and need > free:
        raise Unavailable(f"{name} needs about {need / 2**30:.1f} GiB of device memory at "
                          f"V={vocab} ({tables} tables of V x V f32: W, gradient, m, v"
                          f"{', T' if mode == 'corpus' else ''} and the loss's temporaries); "
                          f"{free / 2**30:.1f} GiB is free")


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` is a device allocation that failed (torch's or XLA's)."""
    text = f"{type(error).__name__}: {error}"
    return ("OutOfMemoryError" in text or "RESOURCE_EXHAUSTED" in text
            or "out of memory" in text.lower())


def free_cached_memory() -> None:
    """Give the device memory PyTorch's allocator caches back (after a peer, or a failed
    one), so that the next contender finds it free."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


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

    def __init__(self, record: InputRecord, updates: int, hyper: Hyper):
        self.vocab, self.updates, self.hyper, self.mode = record.vocab, updates, hyper, record.mode
        # Hard targets, or the dense T (a CPU peer: small tables only).
        self.target = record.targets if record.mode == "hard" else record.dense_weights()
        self.note = f"float32, numpy {np.__version__}"
        self.reset()

    def reset(self) -> None:
        shape = (self.vocab, self.vocab)
        self.w, self.m, self.v = (np.zeros(shape, np.float32) for _ in range(3))

    def run(self) -> None:
        train = numpy_train if self.mode == "hard" else numpy_corpus_train
        train(self.w, self.m, self.v, self.target, self.updates, self.hyper)

    def loss(self) -> float:
        if self.mode == "hard":
            return numpy_objective(self.w, self.target)
        return numpy_corpus_objective(self.w, self.target)


def torch_modules():
    try:
        import torch
        import torch.nn.functional as functional
    except ImportError as error:
        raise Unavailable(f"PyTorch is not installed ({error})") from None
    return torch, functional


def torch_corpus_loss(functional, w, weights):
    """The corpus objective as a PyTorch user writes it: sum of T * -log_softmax(W)."""
    return -(weights * functional.log_softmax(w, dim=1)).sum()


def torch_dense_weights(torch, vocab: int, keys: np.ndarray, values: np.ndarray, device: str):
    """T[V][V] on `device` from sparse (row * V + column, weight) pairs: zeros, then the
    pairs scattered in (no V x V table on the host)."""
    table = torch.zeros(vocab * vocab, dtype=torch.float32, device=device)
    # Copies of K elements: a record's arrays are read-only, which torch will not wrap.
    table[torch.as_tensor(keys.astype(np.int64), device=device)] = torch.as_tensor(
        np.array(values, np.float32), device=device)
    return table.view(vocab, vocab)


def torch_free_bytes(torch) -> int:
    return int(torch.cuda.mem_get_info()[0])


class TorchEager(Peer):
    """The eager loop: the loss (cross_entropy of the targets, or the corpus loss over
    log_softmax), backward, AdamW.step (torch's default implementation)."""

    memory_kind = "torch eager"

    def __init__(self, record: InputRecord, updates: int, hyper: Hyper, device: Device):
        torch, self.functional = torch_modules()
        if device == "cuda" and not torch.cuda.is_available():
            raise Unavailable("PyTorch sees no CUDA device")
        self.torch, self.device, self.updates, self.hyper = torch, device, updates, hyper
        self.mode = record.mode
        self.name = self._name(device)
        if device == "cuda":
            require_room(self.name, self.memory_kind, record.mode, record.vocab,
                         torch_free_bytes(torch))
        threads = "" if device == "cuda" else f", {torch.get_num_threads()} threads"
        self.note = f"torch {torch.__version__}{threads}"
        vocab = record.vocab
        if record.mode == "hard":
            self.target = torch.as_tensor(record.targets.astype(np.int64), device=device)
        else:
            self.target = torch_dense_weights(torch, vocab, record.keys, record.values, device)
        self.w = torch.zeros((vocab, vocab), dtype=torch.float32, device=device,
                             requires_grad=True)
        self.reset()

    @staticmethod
    def _name(device: Device) -> str:
        return "pytorch eager" if device == "cuda" else "pytorch cpu eager"

    def objective(self, w):
        if self.mode == "hard":
            return self.functional.cross_entropy(w, self.target)
        return torch_corpus_loss(self.functional, w, self.target)

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
        objective, optimizer = self.objective, self.optimizer
        for _ in range(self.updates):
            optimizer.zero_grad(set_to_none=True)
            loss = objective(self.w)
            loss.backward()
            optimizer.step()
        self._synchronize()

    def loss(self) -> float:
        with self.torch.no_grad():
            return float(self.objective(self.w))

    def close(self) -> None:
        for name in ("optimizer", "w", "target"):
            self.__dict__.pop(name, None)
        if self.device == "cuda":
            self.torch.cuda.empty_cache()


class TorchGraph(TorchEager):
    """One training step captured as a CUDA graph (capturable AdamW), replayed N times."""

    memory_kind = "torch graph"

    def __init__(self, record: InputRecord, updates: int, hyper: Hyper):
        super().__init__(record, updates, hyper, "cuda")
        torch, objective = self.torch, self.objective
        # As torch's "whole network capture": warm up on a side stream, then capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.optimizer.zero_grad(set_to_none=True)
                objective(self.w).backward()
                self.optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        # The warm-up's temporaries stay cached where the graph's own pool cannot reuse
        # them: at token-sized V they are tables the capture needs room for.
        torch.cuda.empty_cache()
        with torch.cuda.graph(self.graph):
            objective(self.w).backward()
            self.optimizer.step()
        self.reset()

    @staticmethod
    def _name(device: Device) -> str:
        return "pytorch cuda graph"

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
        self.__dict__.pop("graph", None)
        super().close()


def jax_free_bytes(jax) -> int | None:
    """What JAX's allocator may still take on its first device, where it says."""
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


class JaxLoop(Peer):
    """jit(fori_loop) over N updates; AdamW in jnp as torch.optim.AdamW computes it."""

    name = "jax jit(fori_loop)"

    def __init__(self, record: InputRecord, updates: int, hyper: Hyper):
        # JAX takes 75% of the GPU at its first use unless told otherwise; without
        # preallocation its allocator still stops at that share unless a fraction is given.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        if not {"XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"} & set(os.environ):
            os.environ["XLA_CLIENT_MEM_FRACTION"] = JAX_MEMORY_FRACTION
            os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = JAX_MEMORY_FRACTION
        try:
            import jax
            import jax.numpy as jnp
        except ImportError as error:
            raise Unavailable(f"JAX is not installed ({error})") from None
        if jax.default_backend() not in ("gpu", "cuda"):
            raise Unavailable(f"JAX runs on {jax.default_backend()} here, not a GPU")
        vocab = record.vocab
        require_room(self.name, "jax", record.mode, vocab, jax_free_bytes(jax))
        self.jax, self.jnp, self.vocab, self.updates = jax, jnp, vocab, updates
        self.note = f"jax {jax.__version__}"
        lr, wd, b1, b2, eps = hyper.lr, hyper.weight_decay, hyper.beta1, hyper.beta2, hyper.eps

        if record.mode == "hard":
            self.target = jnp.asarray(record.targets.astype(np.int32))

            def objective(w, targets):
                log_p = jax.nn.log_softmax(w, axis=1)  # [V, V]
                return -jnp.mean(jnp.take_along_axis(log_p, targets[:, None], axis=1))
        else:
            # Two int32 indices: V * V passes 2**31 at token-sized V.
            keys = record.keys.astype(np.int64)
            rows, columns = (jnp.asarray(part.astype(np.int32))
                             for part in (keys // vocab, keys % vocab))
            self.target = jnp.zeros((vocab, vocab), jnp.float32).at[rows, columns].set(
                jnp.asarray(record.values))
            del rows, columns

            def objective(w, weights):
                return -jnp.sum(weights * jax.nn.log_softmax(w, axis=1))

        gradient = jax.grad(objective)

        def train(state, target):
            def update(i, state):
                w, m, v = state
                g = gradient(w, target)
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
        self.state: tuple = ()
        self.reset()

    def reset(self) -> None:
        self.close_state()
        shape = (self.vocab, self.vocab)
        self.state = tuple(self.jnp.zeros(shape, self.jnp.float32) for _ in range(3))
        self.jax.block_until_ready(self.state)

    def run(self) -> None:
        self.state = self._train(self.state, self.target)
        self.jax.block_until_ready(self.state)

    def loss(self) -> float:
        return float(self._objective(self.state[0], self.target))

    def close_state(self) -> None:
        for array in self.state:
            array.delete()
        self.state = ()

    def close(self) -> None:
        self.close_state()
        self.target.delete()
