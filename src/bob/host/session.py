"""The host: turns requests into certified plans, runs them, keeps the records.

One invocation = one plan run on one backend, as its layout says
(``bob.program.invocation``):

1. build the plan for (V, P, N, mode, schedule; K and K_val pairs in corpus mode) and
   certify it (refusing it otherwise);
2. load the starting point's tables into the arena (a checkpoint in memory, a checkpoint
   file streamed in chunks, or zeros cleared on the device: no V x V table need be on the
   host), the input payload and the validation input, and clear what a request may leave
   unwritten or adds to;
3. give each update its AdamW scalars (global step t = checkpoint step + k + 1), written
   as a tensor's rows or patched into launches: the layout says which;
4. submit: the load submissions (the scatters) when the inputs were just written, then the
   forward submissions only (predict) or all of them (train);
5. read back the result record, the validation losses, the health check's counts (24
   bytes: is every table still finite?) and, when the caller wants the state on the host,
   the new tables.

Resident state: the session remembers which starting point each arena holds (the
one its last invocation produced there, by identity). An invocation from
exactly that state skips step 2's tables: it writes the inputs only when a
record changed, and clears only what the layout clears for a resident arena.

Long training runs as several invocations as a pipeline (`train`): invocation k's
result record (and its tables, where asked for) is read back while invocation k+1 runs
(``Backend.begin_read``), and the caller's `after_invocation` runs meanwhile; where the
caller asks for k's state in the arena itself (`holds_state`), k+1 waits until the
callback is done (a streamed checkpoint save reads the tables from the arena).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from bob.backends import Backend, BackendChoice
from bob.backends.base import ReadHandle
from bob.config import CHECKPOINT_TENSORS
from bob.errors import RunFailure
from bob.host import own_code, stops
from bob.plan.certificate import require_certified
from bob.plan.model import Plan
from bob.program.bob import BobConfig, Hyper, adam_scalar_table
from bob.program.invocation import InvocationLayout, ScalarRows, invocation_layout, plan_config
from bob.program.plans import build_plan
from bob.records.binary import InputRecord, ResultRecord
from bob.records.checkpoint import (
    CHUNK_BYTES,
    Checkpoint,
    StartingPoint,
    TableSink,
    TrainingState,
)
from bob.records.collapsed import CollapsedCheckpoint

Operation = Literal["predict", "train"]
# Where an invocation starts from: a checkpoint in host memory (dense or collapsed), or a
# dense state whose tables are a file's or zeros.
Start = Checkpoint | CollapsedCheckpoint | StartingPoint


@dataclass(frozen=True)
class Invocation:
    """What one invocation produced."""

    # The state after it, with its tables when they were read back (else None: they are in
    # the arena, `state` says where the run stands).
    checkpoint: Checkpoint | None
    result: ResultRecord
    initial_loss: float  # the objective before the first update
    loss: float  # the objective after the last update (the initial loss when predicting)
    state: TrainingState | None = None
    # The validation losses of the starting and of the trained table, where the program
    # validates (the trained one is the starting one's when predicting).
    validation: tuple[float, float] | None = None
    # Its own time: the host's part of its start, then its wait once the work before it
    # was done (a pipelined invocation's device time, not the one it ran beside).
    seconds: float = 0.0
    began: float = 0.0  # perf_counter as the host began to start it
    # perf_counter once its work was done, as near as the host sees it: as its start
    # returned where the backend runs it there (cpu), else as its read came back.
    finished: float = 0.0


# AdamW rows computed at once for a training run's coming invocations: NumPy's per-call
# costs spread over several invocations' rows (larger tables leave the caches).
SCALAR_ROWS_AHEAD = 4096
CACHED_ZEROS_BYTES = 1 << 20  # zeros kept for reuse up to this size: never a table's


def _bytes_view(array: np.ndarray) -> np.ndarray:
    """A flat byte view of a table, so writing it to the arena copies it once."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


@dataclass(eq=False)
class _Arena:
    """What one backend's arena holds: the tables after `step` (the starting point's
    object once it is known on the host, None before) and the input records last
    written."""

    step: int | None = None  # None: the tables are not a known state
    checkpoint: Start | None = None
    record: InputRecord | None = None
    validation: InputRecord | None = None
    pending: Running | None = None  # the last invocation started here, until settled


@dataclass(eq=False)
class Running:
    """An invocation whose submissions are started, not yet waited for."""

    config: BobConfig
    backend: Backend
    start: Start  # the state it began from (its metadata is the result's)
    first_step: int  # the step the tables were at before it
    operation: Operation
    arena: _Arena
    tables: bool = True  # whether its read brings the tables back to the host
    starting: float = 0.0  # perf_counter before its start, and after it
    started: float = 0.0


@dataclass(eq=False)
class Settled:
    """An invocation done on the device: its result record read and its loss checked; the
    tables on their way to the host (`tables`), None when predicting or not asked for."""

    running: Running
    result: ResultRecord
    initial_loss: float
    loss: float
    tables: ReadHandle | None = None
    invocation: Invocation | None = field(default=None)
    validation: tuple[float, float] | None = None
    seconds: float = 0.0  # Invocation.seconds
    finished: float = 0.0  # Invocation.finished


def _require_finite_loss(initial: float, final: float, step: int) -> None:
    if not (math.isfinite(final) and math.isfinite(initial)):
        raise RunFailure(
            f"the loss became non-finite ({final}) by step {step};"
            " the last good checkpoint is kept (try a smaller --lr)")


def _keep_compiling() -> bool:
    """Between the kernels a backend compiles ahead: a stop that waited out a compilation
    is raised now; a run asked to finish (its first signal) compiles no more."""
    stops.raise_pending()
    return stops.stop_requested() is None


class Session:
    """A backend with the plans it has opened, reused across invocations."""

    def __init__(self, choice: BackendChoice, hyper: Hyper = Hyper()):
        self.choice = choice
        self.hyper = hyper
        self._open: dict[BobConfig, tuple[Plan, Backend]] = {}
        self._arenas: dict[BobConfig, _Arena] = {}
        self.last_backend: Backend | None = None  # the arena of the latest invocation
        self._last_arena: _Arena | None = None
        self._last_settled = 0.0  # perf_counter when the last invocation settled
        self._last_finished = 0.0  # the last invocation's Invocation.finished
        # AdamW rows computed ahead for later invocations of a training run: (first
        # step, rows), or None.
        self._scalar_rows: tuple[int, np.ndarray] | None = None

    def plan_for(self, config: BobConfig) -> Plan:
        return self._backend_for(config)[0]

    def _backend_for(self, config: BobConfig) -> tuple[Plan, Backend]:
        if config not in self._open:
            plan = build_plan(config, self.choice.target, self.hyper,
                              compiled=self.choice.regions)
            # Bob's own code: a region it has none for would launch no code (callers hold
            # their plans to this before any work; this is the backstop).
            own_code.require_regions_covered(
                self.choice, (placed.name for placed in plan.placed_regions), config.vocab)
            certified = require_certified(plan)  # once: the backend takes it as certified
            backend = self.choice.open(certified)
            backend.between_kernels = stops.raise_pending  # past a compilation, at once
            self._open[config] = (plan, backend)
            stops.raise_pending()  # a stop that waited out the backend's imports
            backend.compile_ahead(_keep_compiling)
            self._arenas[config] = _Arena()
        return self._open[config]

    def holds(self, config: BobConfig, checkpoint: Start) -> bool:
        """Whether the arena for `config` holds exactly this starting point's tables."""
        arena = self._arenas.get(self._key(config, "train"))
        return (arena is not None and arena.checkpoint is checkpoint
                and arena.step == state_of(checkpoint).step)

    def close(self) -> None:
        for _, backend in self._open.values():
            backend.close()
        self._open.clear()
        self._arenas.clear()

    def release(self, keep: BobConfig | None = None) -> None:
        """Close every arena but `keep`'s (its device memory freed for another plan)."""
        for config in [c for c in self._open if c != keep]:
            _, backend = self._open.pop(config)
            self._arenas.pop(config, None)
            backend.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _key(config: BobConfig, operation: Operation) -> BobConfig:
        return replace(config, updates=0) if operation == "predict" else config

    def invoke(self, config: BobConfig, checkpoint: Start, record: InputRecord,
               operation: Operation, *, validation: InputRecord | None = None) -> Invocation:
        return self.finish(self.settle(self.begin(config, checkpoint, record, operation,
                                                  validation=validation)))

    # -- one invocation in three steps, so that train can overlap them ------------------
    def begin(self, config: BobConfig, checkpoint: Start, record: InputRecord,
              operation: Operation, *, ahead: int = 0,
              validation: InputRecord | None = None, tables: bool = True) -> Running:
        """Load what the arena lacks, write the scalars, start the submissions.

        `ahead`: how many updates follow in later invocations of the same run, whose
        AdamW rows may be computed now with this one's (fewer, larger NumPy calls).
        `validation`: the validation record, where `config` validates. `tables`: whether
        settling it brings the trained tables back to the host."""
        config = self._key(config, operation)
        resident = self.holds(config, checkpoint)
        plan, backend = self._backend_for(config)
        return self._start(config, plan, backend, checkpoint, state_of(checkpoint).step,
                           record, validation, operation, resident, ahead, tables)

    def begin_after(self, previous: Running, config: BobConfig, record: InputRecord, *,
                    ahead: int = 0, validation: InputRecord | None = None,
                    tables: bool = True) -> Running:
        """Start training from the state `previous` leaves in its arena, before it is read
        back or even done: the backend runs the two in order, and `read_after(previous)`,
        queued first, still gives previous's state.

        The configuration must open the same arena (``continues``)."""
        if not self.continues(previous, config):
            raise ValueError("begin_after needs the arena the previous invocation ran in")
        return self._start(config, *self._backend_for(config), previous.start,
                           previous.first_step + previous.config.updates, record, validation,
                           "train", True, ahead, tables)

    def continues(self, previous: Running, config: BobConfig) -> bool:
        """Whether `config` trains in the arena `previous` leaves its state in."""
        arena = self._arenas.get(config)
        end = previous.first_step + previous.config.updates
        return (previous.operation == "train" and arena is previous.arena
                and (arena.pending is previous
                     or (arena.pending is None and arena.step == end)))

    def _start(self, config: BobConfig, plan: Plan, backend: Backend, start: Start,
               first_step: int, record: InputRecord, validation: InputRecord | None,
               operation: Operation, resident: bool, ahead: int = 0,
               tables: bool = True) -> Running:
        layout = invocation_layout(config)
        _require_inputs(config, record, validation)
        starting = time.perf_counter()
        self.last_backend = backend
        arena = self._last_arena = self._arenas[config]
        held = arena.checkpoint if resident else None
        arena.step = arena.checkpoint = None  # in flux until the invocation settles
        inputs = self.input_writes(layout, record, validation)
        if resident:  # the inputs where they changed, the scalars and the clears: one batch
            fresh = record is not arena.record or validation is not arena.validation
            self._write_and_clear(backend, [*(inputs if fresh else []),
                                            *self.update_scalar_writes(config, backend,
                                                                       first_step + 1, ahead)],
                                  (*layout.cleared_when_resident,
                                   *(layout.input_tables if fresh else ())))
        else:
            arena.record = arena.validation = None
            fresh = True
            self.load(backend, start, record, validation, forward=operation == "predict")
            backend.write_tensors(self.update_scalar_writes(config, backend, first_step + 1,
                                                            ahead))
        arena.record, arena.validation = record, validation
        first = 0 if fresh else layout.load_submissions
        last = plan.submission_count if operation == "train" else plan.forward_submissions
        backend.start(range(first, last))
        running = Running(config, backend, start, first_step, operation, arena, tables,
                          starting, time.perf_counter())
        arena.pending = running
        if operation == "predict":  # forward launches leave the tables as they were
            arena.step, arena.checkpoint = first_step, held
        return running

    @staticmethod
    def input_writes(layout: InvocationLayout, record: InputRecord,
                     validation: InputRecord | None) -> list[tuple[str, bytes]]:
        """The input and, where the program validates, the validation input."""
        writes = [(layout.input, record.payload())]
        if layout.validation_input is not None and validation is not None:
            writes.append((layout.validation_input, validation.payload()))
        return writes

    def read_after(self, running: Running) -> ReadHandle:
        """Queue the read of all that settling `running` needs (the result record, the
        validation losses, the health counts and the tables when it trained and they are
        wanted): later submissions do not change it."""
        layout = invocation_layout(running.config)
        return running.backend.begin_read(layout.reads(_trains(running), running.tables))

    def abandon(self, running: Running) -> None:
        """`running` will not be settled (an earlier invocation failed): let it finish and
        forget what its arena holds."""
        try:
            running.backend.wait()
        finally:
            running.arena.step = running.arena.checkpoint = None
            running.arena.pending = None

    def settle(self, running: Running, read: ReadHandle | None = None) -> Settled:
        """Wait for the read of `running` (`read_after`, queued now if not given): the
        result record, the loss and the health counts checked, the tables with it."""
        config = running.config
        layout = invocation_layout(config)
        read = read or self.read_after(running)
        ready = read.complete  # done as it was started: the backend ran it then
        got = read.wait()
        settled_at = time.perf_counter()
        seconds = (running.started - running.starting
                   + settled_at - max(running.started, self._last_settled))
        self._last_settled = settled_at
        finished = max(running.started, self._last_finished) if ready else settled_at
        self._last_finished = finished
        result = ResultRecord.from_arena(
            config.mode, config.vocab, **{name: got[name] for name in layout.results})
        initial = result.initial_objective
        validation = None
        if layout.validation_losses is not None:
            start, trained = (ResultRecord.objective("corpus", got[name].view(np.float32))
                              for name in layout.validation_losses)
            validation = (start, trained if _trains(running) else start)
        if running.arena.pending is running:
            running.arena.pending = None
        if not _trains(running):
            return Settled(running, result, initial, initial, validation=validation,
                           seconds=seconds, finished=finished)
        final = result.training_objective
        step = running.first_step + config.updates
        _require_finite_loss(initial, final, step)
        require_finite_counts(got[layout.health], step)
        if running.arena.step is None and running.arena.pending is None:
            running.arena.step = step  # nothing started after it: the arena holds its state
        tables = ReadHandle({name: got[name] for name in layout.checkpoint}) \
            if running.tables else None
        return Settled(running, result, initial, final, tables, validation=validation,
                       seconds=seconds, finished=finished)

    def finish(self, settled: Settled) -> Invocation:
        """The tables read back and checked: the invocation's checkpoint."""
        if settled.invocation is not None:
            return settled.invocation
        running = settled.running
        start = state_of(running.start)
        if not _trains(running):
            checkpoint = running.start if isinstance(running.start, Checkpoint) else None
            invocation = Invocation(checkpoint, settled.result, settled.initial_loss,
                                    settled.loss, start, settled.validation, settled.seconds,
                                    running.starting, settled.finished)
        else:
            step = running.first_step + running.config.updates
            state = replace(start, step=step)
            trained = None
            if settled.tables is not None:
                # A checkpoint of the starting point's own kind, over the tables read back.
                trained = running.start.evolved(state, settled.tables.wait())
            invocation = Invocation(trained, settled.result, settled.initial_loss,
                                    settled.loss, state, settled.validation, settled.seconds,
                                    running.starting, settled.finished)
            arena = running.arena
            if trained is not None and arena.step == step and arena.checkpoint is None \
                    and arena.record is not None:
                arena.checkpoint = trained  # still the arena's state: the next may start here
        settled.invocation = invocation
        return invocation

    def stream_tables(self, step: int, sink: TableSink, chunk_bytes: int = CHUNK_BYTES) -> None:
        """The tables the latest invocation left in its arena, the state after `step`
        updates, to `sink` in pieces (a streamed save): nothing may run there now."""
        arena, backend = self._last_arena, self.last_backend
        if arena is None or backend is None or arena.pending is not None or arena.step != step:
            raise ValueError(f"the arena does not hold the state after step {step}")
        backend.stream_read(CHECKPOINT_TENSORS, sink, chunk_bytes)

    def write_update_scalars(self, config: BobConfig, backend: Backend, first_step: int) -> None:
        """Update k's AdamW scalars, for global step first_step + k, where the plan reads them."""
        backend.write_tensors(self.update_scalar_writes(config, backend, first_step))

    def update_scalar_writes(self, config: BobConfig, backend: Backend, first_step: int,
                             ahead: int = 0) -> list[tuple[str, bytes]]:
        """The AdamW table where the layout puts it: as the write of a tensor's rows, left
        to the caller; or patched into the launches here, leaving nothing to write.
        `ahead`: updates of later invocations whose rows may be computed now."""
        scalars = invocation_layout(config).adam_scalars
        if scalars is None:
            return []
        table = self._adam_rows(first_step, config.updates, ahead)
        if isinstance(scalars, ScalarRows):
            return [(scalars.tensor, table.tobytes())]
        bits = table.view(np.uint32)[:, :len(scalars.names)]
        backend.set_scalars_many(scalars.launches, scalars.names, bits)
        return []

    def _adam_rows(self, first_step: int, updates: int, ahead: int) -> np.ndarray:
        """adam_scalar_table(hyper, first_step, updates): rows computed ahead before, or
        computed now with up to SCALAR_ROWS_AHEAD rows of the `ahead` updates after them
        (fewer, larger NumPy calls cost less per row)."""
        if self._scalar_rows is not None:
            start, rows = self._scalar_rows
            if start <= first_step and first_step + updates <= start + len(rows):
                return rows[first_step - start:first_step - start + updates]
        count = updates + min(max(ahead, 0), max(0, SCALAR_ROWS_AHEAD - updates))
        rows = adam_scalar_table(self.hyper, first_step, count)
        self._scalar_rows = (first_step, rows) if count > updates else None
        return rows[:updates]

    @staticmethod
    def load(backend: Backend, start: Start, record: InputRecord,
             validation: InputRecord | None = None, *, forward: bool = False) -> None:
        """The starting point's tables (a checkpoint's arrays, a file's chunks, or zeros
        cleared on the device) and the inputs into the arena, and the tensors a load clears
        zeroed (the layout of the backend's plan). With `forward` (a forward invocation:
        no launch reads a moment) only the parameters are loaded, the moments cleared."""
        layout = invocation_layout(plan_config(backend.plan))
        loaded = layout.checkpoint[:1] if forward else layout.checkpoint
        if not isinstance(start, StartingPoint):  # its tables in host memory
            for name in (*loaded, *layout.index):
                backend.write_tensor(name, _bytes_view(getattr(start, name)))
        elif start.source is not None:
            start.source.deliver(
                lambda name, offset, data: backend.write_tensor(name, data, offset),
                names=loaded)
        else:
            backend.clear_tensors(loaded)
        backend.clear_tensors(layout.checkpoint[len(loaded):])
        for name, data in Session.input_writes(layout, record, validation):
            backend.write_tensor(name, data)
        Session._write_and_clear(backend, [], (*layout.cleared_on_load, *layout.input_tables))

    @staticmethod
    def _write_and_clear(backend: Backend, writes: list[tuple[str, bytes]],
                         cleared: tuple[str, ...]) -> None:
        """`writes`, then every tensor of `cleared` zeroed whole. Small ones (a resident
        invocation's loss and health counts) join the writes' batch as zeros, one staging
        slot for all; a table is cleared on the device, no zero crossing to it."""
        small = [name for name in cleared if backend.plan.tensor(name).bytes
                 <= CACHED_ZEROS_BYTES]
        backend.write_tensors([*writes, *((name, _small_zeros(backend.plan.tensor(name).bytes))
                                          for name in small)])
        backend.clear_tensors([name for name in cleared if name not in small])

    def collect(self, config: BobConfig, backend: Backend, checkpoint: Start,
                operation: Operation) -> Invocation:
        """The invocation just run on `backend` from `checkpoint`: results, checks, tables."""
        running = Running(config, backend, checkpoint, state_of(checkpoint).step, operation,
                          _Arena())
        return self.finish(self.settle(running))


@functools.lru_cache(maxsize=16)
def _small_zeros(size: int) -> bytes:
    return bytes(size)


def _next_start(last: Invocation, reload: Callable[[Invocation], Start] | None) -> Start:
    """Where the invocation after `last` starts when it needs another arena."""
    if reload is not None:
        return reload(last)
    if last.checkpoint is None:
        raise ValueError("the next invocation opens another arena, and the last one's "
                         "tables were not read back: ask for them (`tables`) or give "
                         "`reload`")
    return last.checkpoint


def state_of(start: Start) -> TrainingState:
    """Where a starting point stands (its metadata)."""
    return start.state


def _require_inputs(config: BobConfig, record: InputRecord,
                    validation: InputRecord | None) -> None:
    """The records must be the ones `config`'s plan was built for: its K pairs and, where
    it validates, the validation record's."""
    if record.mode != config.mode or record.pairs != config.pairs:
        raise ValueError(f"the input record ({record.mode}, K={record.pairs}) is not the one "
                         f"the plan is built for ({config.mode}, K={config.pairs})")
    wanted = config.validation_pairs
    if (validation is None) != (wanted == 0) or (validation is not None
                                                  and validation.pairs != wanted):
        given = "none" if validation is None else f"K={validation.pairs}"
        raise ValueError(f"the validation record ({given}) is not the one the plan is built "
                         f"for (K={wanted})")


def _trains(running: Running) -> bool:
    """Whether `running` made updates (and so has health counts and tables to read)."""
    return running.operation == "train" and running.config.updates > 0


def require_finite_counts(health: bytes | np.ndarray, step: int) -> None:
    """Raise RunFailure unless the health check counted no non-finite element in the
    parameters or either moment: 24 bytes decide it, no table is scanned on the host."""
    counts = np.frombuffer(health, np.uint64)
    if counts.any():
        raise RunFailure(
            f"the table became non-finite by step {step}; the last good checkpoint "
            "is kept (try a smaller --lr)")


@dataclass(frozen=True)
class InvocationSizes(Sequence[int]):
    """Updates of each invocation of a run: full ones, then the remainder. Computed per
    index, not listed: a run of 2**53 updates holds two integers, not 10**13."""

    steps: int
    per_invocation: int

    def __post_init__(self) -> None:
        if self.steps < 0 or self.per_invocation < 1:
            raise ValueError("steps must be >= 0 and updates per invocation >= 1")

    def __len__(self) -> int:
        return -(-self.steps // self.per_invocation)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return min(self.per_invocation, self.steps - index * self.per_invocation)


def split_updates(steps: int, per_invocation: int) -> InvocationSizes:
    """Updates of each invocation: full ones, then the remainder."""
    return InvocationSizes(steps, per_invocation)


ProgressCallback = Callable[[Invocation, int], None]
# Asked of invocation k (from 0) of a run, with the updates done once it is done.
InvocationTest = Callable[[int, int], bool]


def _always(index: int, done: int) -> bool:
    return True


def _never(index: int, done: int) -> bool:
    return False


def train(session: Session, config: BobConfig, checkpoint: Start, record: InputRecord,
          steps: int, after_invocation: ProgressCallback | None = None,
          keep_all: bool = True, *, validation: InputRecord | None = None,
          tables: InvocationTest = _always, holds_state: InvocationTest = _never,
          stop: Callable[[], bool] = lambda: False,
          reload: Callable[[Invocation], Start] | None = None) -> list[Invocation]:
    """Run `steps` updates as invocations of at most `config.updates` each.

    Returns every invocation, or with `keep_all` False only the last: a long run then
    holds no earlier invocation's tables (each is given to `after_invocation` and freed
    once the caller lets it go; their memory is reused instead of faulted in afresh).

    `after_invocation(invocation, done)` runs after each one (the CLI saves the
    checkpoint and advances its progress bar there). Pipelined: each invocation's
    read (result record, validation losses, health counts, and its tables where
    `tables(k, done)`) is queued right behind it, and invocation k+1 is started from
    the state k leaves in the arena before k is done, so the device runs k+1 while the
    host settles k (checks, tables, the callback); where `holds_state(k, done)`, k+1
    starts only after k's callback, which then finds k's state in the arena
    (`Session.stream_tables`). Once `stop()` is true no invocation is started; those
    started are finished and given to the callback. Where the next invocation needs
    another plan (the last, shorter one), it starts from the last invocation's
    checkpoint, or from what `reload(last)` gives (a file just saved, say, where its
    tables were not read back). Each invocation is exactly the one
    `Session.invoke` gives; a failure in k+1 is raised after k's callback has run, and a
    failure in k abandons k+1 (waited for, its arena forgotten).
    """
    invocations: list[Invocation] = []
    done = 0

    def settle_and_finish(current: Running, read: ReadHandle, following: Running | None,
                          ) -> None:
        """Settle `current` and run its callback; if either fails, `following` (started
        from current's state) is abandoned before the failure is raised."""
        nonlocal done
        try:
            invocation = session.finish(session.settle(current, read))
            done += current.config.updates
            if not keep_all:
                invocations.clear()
            invocations.append(invocation)
            if after_invocation is not None:
                after_invocation(invocation, done)
        except BaseException:
            if following is not None:
                with contextlib.suppress(Exception):  # the first failure is the one to report
                    session.abandon(following)
            raise

    running: Running | None = None  # started, its read queued behind it, not yet settled
    read: ReadHandle | None = None
    held = False  # whether `running`'s callback wants its state in the arena
    started = 0  # updates of the invocations started so far, this one's included
    for index, updates in enumerate(split_updates(steps, max(1, config.updates))):
        if stop():
            break
        step_config = replace(config, updates=updates)
        started += updates
        wants_tables = tables(index, started)
        previous: Running | None = None  # settled already, its state still in the arena
        if running is not None and read is not None and held:
            settle_and_finish(running, read, None)  # its callback reads the arena first
            previous, running, read = running, None, None
            if stop():
                break
        if running is not None and read is not None and session.continues(running,
                                                                          step_config):
            try:
                following = session.begin_after(running, step_config, record,
                                                ahead=steps - started, validation=validation,
                                                tables=wants_tables)
            except BaseException:
                settle_and_finish(running, read, None)  # k is complete whatever stopped k+1
                raise
            settle_and_finish(running, read, following)  # while the device runs k+1
        elif previous is not None and session.continues(previous, step_config):
            following = session.begin_after(previous, step_config, record,
                                            ahead=steps - started, validation=validation,
                                            tables=wants_tables)
        else:
            if running is not None and read is not None:  # another arena: it loads k's
                settle_and_finish(running, read, None)   # tables, so finish k first
            if invocations:
                checkpoint = _next_start(invocations[-1], reload)
            following = session.begin(step_config, checkpoint, record, "train",
                                      ahead=steps - started, validation=validation,
                                      tables=wants_tables)
        running, read = following, session.read_after(following)
        held = holds_state(index, started)
    if running is not None and read is not None:
        settle_and_finish(running, read, None)
    return invocations
