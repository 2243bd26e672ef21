"""Bob beside its peers, per AdamW update, in one process.

    bob bench                                  # the tables for the hardware present
    bob bench --backend cuda --backend cpu --vocab 256 --vocab 8192 --repeats 5 --json

Every contender trains the same thing: the hard-target objective (mean over
the V rows of the cross-entropy of one random target per row) from a zero
table and zero moments, with AdamW at lr 0.1, betas (0.9, 0.999), eps 1e-8,
weight decay 0.01. A timing is N updates from that state; it is repeated and
the median kept, after one untimed warm-up (compilation, graph capture, plan
building and certification stay out of the numbers). Each contender runs as
its users would run it:

- Bob (``cuda`` or ``cpu``): ``Session.invoke`` of an N-update plan (load
  the checkpoint and input, write N updates' AdamW scalars, run, read back and
  check), and, separately, the run alone (``backend.run`` over all
  submissions: on ``cuda`` one graph launch and a stream synchronize). The
  host's share of an invocation is timed piece by piece: ``set_scalars`` of the
  N AdamW launches, loading the checkpoint and input, collecting the results.
- PyTorch eager: ``F.cross_entropy(W, targets)``, ``backward()``,
  ``torch.optim.AdamW.step()`` (default implementation) per update.
- PyTorch with a CUDA graph: that step captured once (``capturable=True``)
  and replayed N times.
- JAX: ``jit`` of a ``fori_loop`` over N updates, AdamW written in ``jnp``
  as torch.optim.AdamW computes it, state buffers donated.
- NumPy: the float32 loop a user would write (``numpy_train``).
- PyTorch on the CPU: the eager loop above.

A row's ratio is its time over Bob's: over Bob's run (the device program
alone, comparable with the peers' training loops, which read and write no
checkpoint) and over Bob's whole invocation. Bandwidth counts 24 bytes per
parameter per update: one read and one write of W, m and v, the least any
AdamW step moves (a fused step computes the gradient on the fly). Bob's seed
schedule itself moves 36: the loss-gradient launch reads W and writes the
gradient, then AdamW reads W, g, m, v and writes W, m, v.

A contender that cannot run here (no torch, no JAX, no GPU) is reported as
skipped; one that fails is reported with its error and the others still run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import platform
import statistics
import sys
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from bob.backends import BackendChoice, choose_backend
from bob.config import DEFAULT_SUBMISSION_POLICY
from bob.program.bob import BobConfig, Hyper, adam_scalars
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint

Device = Literal["cpu", "cuda"]
RowKind = Literal["bob", "host", "peer", "floor"]
DEVICES: tuple[Device, ...] = ("cpu", "cuda")

BYTES_PER_PARAMETER = 24  # read + write of W, m, v: the least an AdamW update moves
BOB_SEED_BYTES_PER_PARAMETER = 36  # the seed schedule: loss-gradient 8, AdamW 28
# Bandwidth is shown from this V on: smaller tables live in the caches (an H200's
# L2 holds 60 MB, so V = 1024's 12 MB of state never leaves it).
BANDWIDTH_MIN_VOCAB = 2048
TARGET_SEED = 0  # the random targets every contender trains on
SPEC_COPY_BANDWIDTH = 4.27e12  # bytes/s: SPEC section 10's H200 memory floor assumes this


def default_vocabs(device: Device) -> tuple[int, ...]:
    """The byte vocabulary everywhere; a token-sized, memory-bound table on the GPU."""
    return (256, 8192) if device == "cuda" else (256,)


def default_updates(device: Device, vocab: int) -> int:
    """Updates per timing: enough that one timing lasts tens of milliseconds."""
    if device == "cuda":
        return 1000 if vocab <= 1024 else 100  # ~3 us vs ~1 ms per update
    return 100 if vocab <= 1024 else 5  # ~0.4 ms vs ~0.5 s per update


# -- rows and tables ------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One contender (or one piece of Bob's host work) at one V."""

    contender: str
    kind: RowKind
    updates: int  # N: updates per timing
    seconds: float | None = None  # median seconds of one timing (None: skipped or failed)
    samples: tuple[float, ...] = ()  # every timing, in order
    loss: float | None = None  # the objective after N updates from the zero table
    note: str = ""
    error: str | None = None  # "skipped: ..." or "failed: ..."

    @property
    def us_per_update(self) -> float | None:
        if self.seconds is None:
            return None
        return self.seconds / self.updates * 1e6

    @property
    def spread(self) -> float | None:
        """(slowest - fastest) / median of the timings."""
        if self.seconds is None or len(self.samples) < 2 or self.seconds <= 0:
            return None
        return (max(self.samples) - min(self.samples)) / self.seconds


@dataclass(frozen=True)
class BenchTable:
    """Every contender on one device at one V."""

    device: Device
    device_name: str
    vocab: int
    updates: int
    repeats: int
    rows: tuple[Row, ...]

    @property
    def parameters(self) -> int:
        return self.vocab * self.vocab

    @property
    def shows_bandwidth(self) -> bool:
        return self.vocab >= BANDWIDTH_MIN_VOCAB

    def bandwidth(self, row: Row) -> float | None:
        """Bytes/s at 24 bytes per parameter per update."""
        us = row.us_per_update
        if row.kind == "host" or us is None or us <= 0:
            return None
        return BYTES_PER_PARAMETER * self.parameters / (us * 1e-6)

    def _bob(self, suffix: str) -> Row | None:
        name = f"bob {self.device} {suffix}"
        return next((r for r in self.rows if r.contender == name and r.seconds), None)

    def ratio(self, row: Row, against: Literal["run", "invocation"]) -> float | None:
        """This row's time over Bob's run (or whole invocation): > 1 means Bob is faster."""
        bob = self._bob(against)
        if bob is None or row.kind == "host" or row.us_per_update is None:
            return None
        assert bob.us_per_update is not None
        return row.us_per_update / bob.us_per_update

    @property
    def bob_failed(self) -> bool:
        return any(r.kind == "bob" and r.error and r.error.startswith("failed")
                   for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "device_name": self.device_name,
            "vocab": self.vocab,
            "updates": self.updates,
            "repeats": self.repeats,
            "rows": [self.row_json(row) for row in self.rows],
        }

    def row_json(self, row: Row) -> dict[str, Any]:
        bandwidth = self.bandwidth(row)
        return {
            "contender": row.contender,
            "kind": row.kind,
            "updates": row.updates,
            "seconds": row.seconds,
            "samples": list(row.samples),
            "us_per_update": row.us_per_update,
            "spread": row.spread,
            "gb_per_s": None if bandwidth is None else bandwidth / 1e9,
            "ratio_to_bob_run": self.ratio(row, "run"),
            "ratio_to_bob_invocation": self.ratio(row, "invocation"),
            "loss": row.loss,
            "note": row.note,
            "error": row.error,
        }


@dataclass(frozen=True)
class BenchReport:
    tables: tuple[BenchTable, ...]
    hyper: Hyper
    date: str  # UTC, ISO 8601
    command: str
    environment: dict[str, str] = field(default_factory=dict)

    @property
    def bob_failed(self) -> bool:
        return any(table.bob_failed for table in self.tables)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "bob-bench",
            "format_version": 1,
            "date": self.date,
            "command": self.command,
            "bytes_per_parameter": BYTES_PER_PARAMETER,
            "hyper": dataclasses.asdict(self.hyper),
            "target_seed": TARGET_SEED,
            "environment": self.environment,
            "tables": [table.to_json() for table in self.tables],
        }


# -- timing ---------------------------------------------------------------------------


class Unavailable(Exception):
    """A contender cannot run here (a missing package or device); the message says why."""


def time_runs(run: Callable[[], None], reset: Callable[[], None], repeats: int,
              ) -> tuple[float, ...]:
    """One untimed warm-up, then `repeats` timings of run(), each after an untimed reset()."""
    reset()
    run()
    samples = []
    for _ in range(repeats):
        reset()
        start = time.perf_counter()
        run()  # returns only when the device is done
        samples.append(time.perf_counter() - start)
    return tuple(samples)


def _error_text(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _failed(name: str, kind: RowKind, updates: int, error: BaseException) -> Row:
    if isinstance(error, Unavailable):
        return Row(name, kind, updates, error=f"skipped: {error}")
    if os.environ.get("BOB_BENCH_TRACEBACK"):
        traceback.print_exception(error, file=sys.stderr)
    return Row(name, kind, updates, error=f"failed: {_error_text(error)}")


# -- the objective and the plain NumPy loop -----------------------------------------------


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


# -- the peers ---------------------------------------------------------------------------


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


def _torch():
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
        torch, self.functional = _torch()
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


def measure_peer(make: Callable[[], Peer], name: str, updates: int, repeats: int) -> Row:
    try:
        peer = make()
    except Exception as error:  # noqa: BLE001 - a peer that cannot start is reported
        return _failed(name, "peer", updates, error)
    try:
        samples = time_runs(peer.run, peer.reset, repeats)
        return Row(peer.name, "peer", updates, statistics.median(samples), samples,
                   peer.loss(), peer.note)
    except Exception as error:  # noqa: BLE001 - one failing peer must not end the bench
        return _failed(peer.name, "peer", updates, error)
    finally:
        with contextlib.suppress(Exception):
            peer.close()


# -- Bob ---------------------------------------------------------------------------------


def bob_configs(vocab: int, updates: int, submission: str = DEFAULT_SUBMISSION_POLICY,
                ) -> Iterator[tuple[str, BobConfig]]:
    """The seed schedule, then any other schedule this Bob has ("fused" when it exists)."""
    seed = BobConfig(vocab=vocab, prompts=0, updates=updates, mode="hard",
                     submission=submission)  # type: ignore[arg-type]
    yield "", seed
    if "schedule" not in {f.name for f in dataclasses.fields(BobConfig)}:
        return
    try:
        fused = replace(seed, schedule="fused")  # type: ignore[call-arg]
    except (TypeError, ValueError):
        return
    yield " fused", fused


def measure_bob(choice: BackendChoice, config: BobConfig, hyper: Hyper, repeats: int,
                label: str = "") -> list[Row]:
    """Bob's invocation, its run alone, and the host's pieces of an invocation.

    Only the seed schedule's rows ("bob cuda run", label "") are the ratios'
    reference; another schedule's rows carry its label ("bob cuda fused run").
    """
    from bob.host.session import Invocation, Session

    n = config.updates
    name = f"bob {choice.name}{label}"
    record = InputRecord.hard(bench_targets(config.vocab), (), source="bench targets")
    zero = Checkpoint.zeros(config.vocab, hyper, "hard")
    session = Session(choice, hyper)
    try:
        last: list[Invocation] = []

        def invoke() -> None:
            last[:] = [session.invoke(config, zero, record, "train")]

        try:
            samples = time_runs(invoke, lambda: None, repeats)
        except Exception as error:  # noqa: BLE001 - reported as Bob's failure
            return [_failed(f"{name} invocation", "bob", n, error)]
        loss = last[0].loss
        rows = [Row(f"{name} invocation", "bob", n, statistics.median(samples), samples, loss,
                    "Session.invoke: load, scalars, run, read back and check")]
        backend = session.last_backend
        assert backend is not None
        plan = session.plan_for(config)

        def load() -> None:
            Session.load(backend, zero, record)

        def run() -> None:
            backend.run(range(plan.submission_count))

        def compute_scalars() -> None:
            for k in range(n):
                adam_scalars(hyper, k + 1)

        def set_scalars() -> None:
            if config.schedule == "fused":  # the scalars are a tensor: write it
                session.write_update_scalars(config, backend, 1)
                return
            for k in range(n):
                backend.set_scalars(config.adamw_launch(k), step_scalars[k])

        def collect() -> None:
            session.collect(config, backend, zero, "train")

        step_scalars = [adam_scalars(hyper, k + 1) for k in range(n)]
        what = ("one graph launch + stream synchronize" if choice.name == "cuda"
                else "backend.run over every submission")
        timed = (
            (f"{name} run", "bob", run, load, f"{what}; {plan.launch_count} launches"),
            (f"{name} host: adam_scalars x{n}", "host", compute_scalars, None,
             "N updates' AdamW scalars (float64, rounded to binary32)"),
            (f"{name} host: set_scalars x{n}", "host", set_scalars, None,
             "patching N AdamW launches' parameter blocks"),
            (f"{name} host: load", "host", load, None, "checkpoint + input into the arena"),
            (f"{name} host: collect", "host", collect, None,
             "results + checkpoint out, finiteness checks"),
        )
        for row_name, kind, work, reset, note in timed:
            try:
                samples = time_runs(work, reset or (lambda: None), repeats)
            except Exception as error:  # noqa: BLE001 - one failing piece is reported
                rows.append(_failed(row_name, kind, n, error))
                continue
            rows.append(Row(row_name, kind, n, statistics.median(samples), samples,
                            loss if kind == "bob" else None, note))
        return rows
    finally:
        session.close()


# -- one table per device and V -------------------------------------------------------------


def cpu_name() -> str:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores"


def gpu_name() -> str:
    from bob.backends.cuda import describe_device

    info = describe_device()
    return f"{info.name} ({info.arch}), driver {info.driver_version}"


def copy_bandwidth() -> float | None:
    """Device-to-device copy bandwidth (bytes read + written per second) through torch."""
    try:
        torch, _ = _torch()
        if not torch.cuda.is_available():
            return None
        source = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
        target = torch.empty_like(source)
        target.copy_(source)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            target.copy_(source)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1e-3)
        del source, target
        torch.cuda.empty_cache()
        return 2 * (1 << 30) / statistics.median(times)
    except Exception:  # noqa: BLE001 - the floor row is a courtesy
        return None


def floor_rows(vocab: int, updates: int, measured: float | None) -> list[Row]:
    rows = []
    for bandwidth, source in ((measured, "measured copy"), (SPEC_COPY_BANDWIDTH, "SPEC")):
        if bandwidth is None:
            continue
        seconds = BYTES_PER_PARAMETER * vocab * vocab / bandwidth * updates
        rows.append(Row(f"memory floor ({source} {bandwidth / 1e12:.2f} TB/s)", "floor",
                        updates, seconds, (), None, "24 B/param / bandwidth (computed)"))
    return rows


Progress = Callable[[str], None]

# Bob's own command stream through the kernel driver reads tensors back through
# BAR1 (slow for large tables); beyond this V it would time the copies, not Bob.
NV_MAX_VOCAB = 1024


def nv_rows(vocab: int, updates: int, repeats: int, hyper: Hyper,
            progress: Progress, submission: str = DEFAULT_SUBMISSION_POLICY) -> list[Row]:
    """The same invocation on the `nv` backend (no CUDA runtime), where it can run."""
    try:
        choice = choose_backend("nv")
    except Exception as error:  # noqa: BLE001 - nv is optional: say why it is absent
        return [Row("bob nv invocation", "peer", updates,
                    error=f"skipped: {_error_text(error)}")]
    progress(f"cuda V={vocab}: bob nv ({updates} updates per invocation)")
    config = BobConfig(vocab=vocab, prompts=0, updates=updates, mode="hard",
                       submission=submission)  # type: ignore[arg-type]
    return measure_bob(choice, config, hyper, repeats)


def bench_device(device: Device, vocab: int, updates: int, repeats: int, hyper: Hyper,
                 choice: BackendChoice, device_name: str, progress: Progress,
                 copy: float | None = None,
                 submission: str = DEFAULT_SUBMISSION_POLICY) -> BenchTable:
    targets = bench_targets(vocab)
    rows: list[Row] = []
    for label, config in bob_configs(vocab, updates, submission):
        progress(f"{device} V={vocab}: bob{label} ({updates} updates per invocation)")
        try:
            rows.extend(measure_bob(choice, config, hyper, repeats, label))
        except Exception as error:  # noqa: BLE001 - a failing variant must not end the bench
            rows.append(_failed(f"bob {device}{label} invocation", "bob", updates, error))

    if device == "cuda" and vocab <= NV_MAX_VOCAB:
        rows.extend(nv_rows(vocab, updates, repeats, hyper, progress, submission))

    peers: list[tuple[str, Callable[[], Peer]]]
    if device == "cuda":
        peers = [
            ("pytorch eager", lambda: TorchEager(vocab, updates, targets, hyper, "cuda")),
            ("pytorch cuda graph", lambda: TorchGraph(vocab, updates, targets, hyper)),
            ("jax jit(fori_loop)", lambda: JaxLoop(vocab, updates, targets, hyper)),
        ]
    else:
        peers = [
            ("numpy loop", lambda: NumpyPeer(vocab, updates, targets, hyper)),
            ("pytorch cpu eager", lambda: TorchEager(vocab, updates, targets, hyper, "cpu")),
        ]
    for name, make in peers:
        progress(f"{device} V={vocab}: {name}")
        rows.append(measure_peer(make, name, updates, repeats))
    if device == "cuda" and vocab >= BANDWIDTH_MIN_VOCAB:
        rows.extend(floor_rows(vocab, updates, copy))
    return BenchTable(device, device_name, vocab, updates, repeats, tuple(rows))


def resolve_devices(backends: Sequence[str],
                    ) -> tuple[list[Device], dict[Device, BackendChoice]]:
    """The devices to bench and Bob's backend choice for each; `auto` as choose_backend."""
    choices: dict[Device, BackendChoice] = {}
    devices: list[Device] = []
    for name in backends or ("auto",):
        choice = choose_backend(name)  # raises BackendUnavailable for an unusable cuda
        device: Device = "cuda" if choice.name == "cuda" else "cpu"
        if device not in choices:
            choices[device] = choice
            devices.append(device)
    return devices, choices


def environment() -> dict[str, str]:
    found = {"python": platform.python_version(), "numpy": np.__version__}
    for module in ("torch", "jax"):
        if module in sys.modules:
            found[module] = str(getattr(sys.modules[module], "__version__", "?"))
    for variable in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS"):
        if variable in os.environ:
            found[variable] = os.environ[variable]
    return found


def run_bench(backends: Sequence[str] = (), vocabs: Sequence[int] = (),
              updates: int | None = None, repeats: int = 5, hyper: Hyper = Hyper(),
              progress: Progress | None = None, command: str = "",
              submission: str = DEFAULT_SUBMISSION_POLICY) -> BenchReport:
    """Every table: for each device, for each V, Bob and its peers side by side."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, not {repeats}")
    say = progress or (lambda text: None)
    devices, choices = resolve_devices(backends)
    tables = []
    for device in devices:
        name = gpu_name() if device == "cuda" else cpu_name()
        copy = copy_bandwidth() if device == "cuda" else None
        for vocab in vocabs or default_vocabs(device):
            n = updates or default_updates(device, vocab)
            tables.append(bench_device(device, vocab, n, repeats, hyper, choices[device],
                                       name, say, copy, submission))
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return BenchReport(tuple(tables), hyper, date, command, environment())
