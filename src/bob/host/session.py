"""The host: turns requests into certified plans, runs them, keeps the records.

One invocation = one plan run on one backend:

1. build the plan for (V, P, N, mode) and certify it (refusing it otherwise);
2. load the checkpoint (parameters, both moments) and the input payload into
   the arena;
3. write each update's AdamW scalars (global step t = checkpoint step + k + 1):
   into that update's parameter block (seed schedule), or as the rows of the
   ``adam_scalars`` tensor (fused schedule);
4. submit: the forward submissions only (predict) or all of them (train);
5. read back the result record, the health check's counts (24 bytes: is every
   table still finite?) and the new checkpoint.

Resident state: the session remembers which checkpoint each arena holds (the
one its last invocation produced there, by identity). An invocation from
exactly that checkpoint skips step 2's tables: it writes the input only when
the record changed, and clears the training loss and the health counts.

Long training runs as several invocations, a checkpoint after each, as a
pipeline (`train`): invocation k's tables are read back while invocation k+1
runs (``Backend.begin_read``: on CUDA, a device snapshot copied out on a second
stream), and the caller's `after_invocation` (the API saves the checkpoint on a
background writer) runs meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from bob.backends import Backend, BackendChoice
from bob.backends.base import ReadHandle
from bob.config import CHECKPOINT_TENSORS
from bob.errors import NonFiniteLoss
from bob.plan.certificate import require_certified
from bob.plan.model import Plan
from bob.program.bob import (
    ADAM_SCALAR_NAMES,
    ADAM_SCALARS_TENSOR,
    HEALTH_TENSOR,
    BobConfig,
    Hyper,
    adam_scalar_table,
    build_plan,
)
from bob.records.binary import InputRecord, ResultRecord
from bob.records.checkpoint import Checkpoint

Operation = Literal["predict", "train"]


@dataclass(frozen=True)
class Invocation:
    """What one invocation produced."""

    checkpoint: Checkpoint
    result: ResultRecord
    initial_loss: float  # the objective before the first update
    loss: float  # the objective after the last update (the initial loss when predicting)


RESULT_TENSORS = ("initial_loss", "training_loss", "logit_rows", "predictions")


def _bytes_view(array: np.ndarray) -> np.ndarray:
    """A flat byte view of a table, so writing it to the arena copies it once."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


@dataclass(eq=False)
class _Arena:
    """What one backend's arena holds: the tables after `step` (the checkpoint object
    once it is read back, None before) and the input record last written."""

    step: int | None = None  # None: the tables are not a known state
    checkpoint: Checkpoint | None = None
    record: InputRecord | None = None


@dataclass(eq=False)
class Running:
    """An invocation whose submissions are started, not yet waited for."""

    config: BobConfig
    backend: Backend
    start: Checkpoint  # the state it began from (its metadata is the result's)
    first_step: int  # the step the tables were at before it
    operation: Operation
    arena: _Arena


@dataclass(eq=False)
class Settled:
    """An invocation done on the device: its result record read and its loss checked; the
    tables on their way to the host (`tables`), None when predicting."""

    running: Running
    result: ResultRecord
    initial_loss: float
    loss: float
    tables: ReadHandle | None = None
    invocation: Invocation | None = field(default=None)


def _require_finite_loss(initial: float, final: float, step: int) -> None:
    if not (math.isfinite(final) and math.isfinite(initial)):
        raise NonFiniteLoss(
            f"the loss became non-finite ({final}) by step {step};"
            " the last good checkpoint is kept (try a smaller --lr)")


class Session:
    """A backend with the plans it has opened, reused across invocations."""

    def __init__(self, choice: BackendChoice, hyper: Hyper = Hyper()):
        self.choice = choice
        self.hyper = hyper
        self._open: dict[BobConfig, tuple[Plan, Backend]] = {}
        self._arenas: dict[BobConfig, _Arena] = {}
        self.last_backend: Backend | None = None  # the arena of the latest invocation

    def plan_for(self, config: BobConfig) -> Plan:
        return self._backend_for(config)[0]

    def _backend_for(self, config: BobConfig) -> tuple[Plan, Backend]:
        if config not in self._open:
            plan = build_plan(config, self.choice.target, self.hyper,
                              compiled=self.choice.regions)
            certified = require_certified(plan)  # once: the backend takes it as certified
            self._open[config] = (plan, self.choice.open(certified))
            self._arenas[config] = _Arena()
        return self._open[config]

    def holds(self, config: BobConfig, checkpoint: Checkpoint) -> bool:
        """Whether the arena for `config` holds exactly this checkpoint's tables."""
        arena = self._arenas.get(self._key(config, "train"))
        return (arena is not None and arena.checkpoint is checkpoint
                and arena.step == checkpoint.step)

    def close(self) -> None:
        for _, backend in self._open.values():
            backend.close()
        self._open.clear()
        self._arenas.clear()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _key(config: BobConfig, operation: Operation) -> BobConfig:
        return replace(config, updates=0) if operation == "predict" else config

    def invoke(self, config: BobConfig, checkpoint: Checkpoint, record: InputRecord,
               operation: Operation) -> Invocation:
        return self.finish(self.settle(self.begin(config, checkpoint, record, operation)))

    # -- one invocation in three steps, so that train can overlap them ------------------
    def begin(self, config: BobConfig, checkpoint: Checkpoint, record: InputRecord,
              operation: Operation) -> Running:
        """Load what the arena lacks, write the scalars, start the submissions."""
        config = self._key(config, operation)
        resident = self.holds(config, checkpoint)
        plan, backend = self._backend_for(config)
        return self._start(config, plan, backend, checkpoint, checkpoint.step, record,
                           operation, resident)

    def begin_after(self, settled: Settled, config: BobConfig, record: InputRecord) -> Running:
        """Start training from the state `settled` left in its arena, before it is read back.

        The configuration must open the same arena (``continues``)."""
        if not self.continues(settled, config):
            raise ValueError("begin_after needs the arena the settled invocation ran in")
        previous = settled.running
        return self._start(config, *self._backend_for(config), previous.start,
                           previous.first_step + previous.config.updates, record, "train",
                           True)

    def continues(self, settled: Settled, config: BobConfig) -> bool:
        """Whether `config` trains in the arena `settled` left its state in."""
        arena = self._arenas.get(config)
        return (settled.running.operation == "train" and arena is settled.running.arena
                and arena.step == settled.running.first_step + settled.running.config.updates)

    def _start(self, config: BobConfig, plan: Plan, backend: Backend, start: Checkpoint,
               first_step: int, record: InputRecord, operation: Operation,
               resident: bool) -> Running:
        self.last_backend = backend
        arena = self._arenas[config]
        held = arena.checkpoint if resident else None
        arena.step = arena.checkpoint = None  # in flux until the invocation settles
        if resident:
            self.load_input(backend, record, unless=arena.record)
        else:
            arena.record = None
            self.load(backend, start, record)
        arena.record = record
        self.write_update_scalars(config, backend, first_step + 1)
        submissions = plan.submission_count if operation == "train" else plan.forward_submissions
        backend.start(range(submissions))
        running = Running(config, backend, start, first_step, operation, arena)
        if operation == "predict":  # forward launches leave the tables as they were
            arena.step, arena.checkpoint = first_step, held
        return running

    def settle(self, running: Running) -> Settled:
        """Wait for the device, read the result record, check the loss and the health
        counts, start the tables' read-back."""
        config, backend = running.config, running.backend
        backend.wait()
        result = ResultRecord.from_arena(
            config.mode, config.vocab, **{name: backend.read_tensor(name)
                                          for name in RESULT_TENSORS})
        initial = result.initial_objective
        if running.operation == "predict" or config.updates == 0:
            return Settled(running, result, initial, initial)
        final = result.training_objective
        _require_finite_loss(initial, final, running.first_step + config.updates)
        require_finite_tables(backend, running.first_step + config.updates)
        tables = backend.begin_read(CHECKPOINT_TENSORS)
        running.arena.step = running.first_step + config.updates
        return Settled(running, result, initial, final, tables)

    def finish(self, settled: Settled) -> Invocation:
        """The tables read back and checked: the invocation's checkpoint."""
        if settled.invocation is not None:
            return settled.invocation
        running = settled.running
        if settled.tables is None:
            invocation = Invocation(running.start, settled.result, settled.initial_loss,
                                    settled.loss)
        else:
            step = running.first_step + running.config.updates
            v = running.config.vocab
            tables = {name: _table(data, v) for name, data in settled.tables.wait().items()}
            trained = replace(running.start, step=step, **tables)
            invocation = Invocation(trained, settled.result, settled.initial_loss,
                                    settled.loss)
            arena = running.arena
            if arena.step == step and arena.checkpoint is None and arena.record is not None:
                arena.checkpoint = trained  # still the arena's state: the next may start here
        settled.invocation = invocation
        return invocation

    def write_update_scalars(self, config: BobConfig, backend: Backend, first_step: int) -> None:
        """Update k's AdamW scalars, for global step first_step + k, where the plan reads them."""
        if config.updates == 0:
            return
        table = adam_scalar_table(self.hyper, first_step, config.updates)
        if config.schedule == "fused":
            backend.write_tensor(ADAM_SCALARS_TENSOR, table.tobytes())
            return
        # The same table, its rows patched into each update's AdamW parameter block at once.
        launches = [config.adamw_launch(k) for k in range(config.updates)]
        bits = table.view(np.uint32)[:, :len(ADAM_SCALAR_NAMES)]
        backend.set_scalars_many(launches, ADAM_SCALAR_NAMES, bits)

    @staticmethod
    def load(backend: Backend, checkpoint: Checkpoint, record: InputRecord) -> None:
        for name in CHECKPOINT_TENSORS:
            backend.write_tensor(name, _bytes_view(getattr(checkpoint, name)))
        backend.write_tensor("input", record.payload())
        # Not every request writes every block: clear what could be stale.
        # health is added to, never overwritten, by the health check (atomics on a GPU).
        for name in ("gradients", "training_loss", HEALTH_TENSOR):
            backend.write_tensor(name, bytes(backend.plan.tensor(name).bytes))

    @staticmethod
    def load_input(backend: Backend, record: InputRecord, unless: InputRecord | None) -> None:
        """The arena holds the tables: the input only where it changed, the loss and the
        health counts cleared.

        Launch 0 (the initial loss) writes every gradient of every request, so a
        resident arena's gradients need no clearing; a forward request does not
        write the training loss.
        """
        if record is not unless:
            backend.write_tensor("input", record.payload())
        for name in ("training_loss", HEALTH_TENSOR):  # health is added to: zero it first
            backend.write_tensor(name, bytes(backend.plan.tensor(name).bytes))

    def collect(self, config: BobConfig, backend: Backend, checkpoint: Checkpoint,
                operation: Operation) -> Invocation:
        """The invocation just run on `backend` from `checkpoint`: results, checks, tables."""
        running = Running(config, backend, checkpoint, checkpoint.step, operation, _Arena())
        return self.finish(self.settle(running))


def _table(data: np.ndarray, vocab: int) -> np.ndarray:
    """A V x V float32 table over the bytes read back (read-only: the arena may hold it)."""
    table = data.view(np.float32).reshape(vocab, vocab)
    table.flags.writeable = False
    return table


def require_finite_tables(backend: Backend, step: int) -> None:
    """Raise NonFiniteLoss unless the health check counted no non-finite element in the
    parameters or either moment: 24 bytes read back instead of the three tables."""
    counts = np.frombuffer(backend.read_tensor(HEALTH_TENSOR), np.uint64)
    if counts.any():
        raise NonFiniteLoss(
            f"the table became non-finite by step {step}; the last good checkpoint "
            "is kept (try a smaller --lr)")


def split_updates(steps: int, per_invocation: int) -> list[int]:
    """Updates of each invocation: full ones, then the remainder."""
    if steps < 0 or per_invocation < 1:
        raise ValueError("steps must be >= 0 and updates per invocation >= 1")
    full, rest = divmod(steps, per_invocation)
    return [per_invocation] * full + ([rest] if rest else [])


ProgressCallback = Callable[[Invocation, int], None]


def train(session: Session, config: BobConfig, checkpoint: Checkpoint, record: InputRecord,
          steps: int, after_invocation: ProgressCallback | None = None,
          keep_all: bool = True) -> list[Invocation]:
    """Run `steps` updates as invocations of at most `config.updates` each.

    Returns every invocation, or with `keep_all` False only the last: a long run then
    holds no earlier invocation's tables (each is given to `after_invocation` and freed
    once the caller lets it go; their memory is reused instead of faulted in afresh).

    `after_invocation(invocation, done)` runs after each one (the CLI saves the
    checkpoint and advances its progress bar there). Pipelined: invocation k+1
    starts from the state k left in the arena before k's tables are read back,
    and k is finished (tables, checks, the callback) while k+1 runs. Each
    invocation is exactly the one `Session.invoke` gives; a failure in k+1 is
    raised after k's callback has run.
    """
    invocations: list[Invocation] = []
    done = 0
    pending: Settled | None = None  # settled on the device, not yet finished

    def finish(settled: Settled) -> None:
        nonlocal done
        invocation = session.finish(settled)
        done += settled.running.config.updates
        if not keep_all:
            invocations.clear()
        invocations.append(invocation)
        if after_invocation is not None:
            after_invocation(invocation, done)

    for updates in split_updates(steps, max(1, config.updates)):
        step_config = replace(config, updates=updates)
        if pending is not None and session.continues(pending, step_config):
            try:
                running = session.begin_after(pending, step_config, record)
            except BaseException:
                finish(pending)  # k is complete whatever stopped k+1: keep it, then stop
                raise
        else:
            if pending is not None:  # another arena: it loads k's tables, so finish k first
                finish(pending)
                checkpoint = invocations[-1].checkpoint
                pending = None
            running = session.begin(step_config, checkpoint, record, "train")
        if pending is not None:
            finish(pending)  # while the device runs the next invocation
        pending = session.settle(running)
    if pending is not None:
        finish(pending)
    return invocations
