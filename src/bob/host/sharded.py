"""Training in row shards: each invocation's N updates run shard by shard, in turn on one
device or side by side on Dask workers, rows streamed from and to the checkpoint files.

    bob train --shards 4                      # in turn, in this process (out of core)
    bob train --device-memory 8G              # in turn, as many shards as the budget needs
    bob train --shards 4 --workers 4          # side by side: a LocalCluster of 4 workers
    bob train --gpus 0,1,2,3                  # side by side: a worker per GPU
    bob train --shards 8 --dask tcp://h:8786  # on a running Dask scheduler

The table's rows are independent: the objective is a sum over rows, AdamW is elementwise
and its step size depends only on the global step. So the plan for rows [a, b)
(``BobConfig.rows``) is a complete training program for them, and shards exchange nothing
but their row losses. Each task loads its rows of the last checkpoint (or zeros), its
targets or its rows of the corpus weights, runs its certified plan for the invocation's N
updates and streams its tables out to its shard file (``bob.records.shards``); the client
joins the row losses in row order into the invocation's loss (``ResultRecord.objective``:
an exact sum, so the split never changes a bit), then writes the index, which commits the
invocation. The host never holds a whole table: a task holds one of its shard's tables at
a time on the way in, and a piece on the way out.

On Dask a task is any shard on any worker (one thread each; with --gpus, worker i sees GPU
i alone through CUDA_VISIBLE_DEVICES). Bob's own cluster allows no retry: a worker lost
mid-invocation ends the run with one line naming it, and the last index, with every
shard it names, stays as it was.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from bob.backends import choose_backend
from bob.config import CHECKPOINT_TENSORS, Hyper, Mode
from bob.errors import BadInput, Interrupted, RunFailure
from bob.plan.certificate import require_certified
from bob.program.bob import (
    ADAM_SCALAR_NAMES,
    WEIGHTS_TENSOR,
    BobConfig,
    adam_scalar_table,
    build_plan,
    shard_boundaries,
)
from bob.records.binary import F32, U32, InputRecord, ResultRecord
from bob.records.checkpoint import CHUNK_BYTES, CheckpointFile, History, TrainingState
from bob.records.dask_count import quiet_dask_logs
from bob.records.shards import (
    Rows,
    ShardedCheckpoint,
    ShardEntry,
    shard_file,
    write_index,
    write_shard,
)

# Where a task reads its rows: a checkpoint opened on the client (picklable: paths and
# offsets), or None for a fresh table of zeros.
RowSource = CheckpointFile | ShardedCheckpoint | None


@dataclass(frozen=True)
class ShardInputs:
    """A shard's part of the training data: hard targets of its rows, or its rows' corpus
    pairs with keys counted from the shard's first row (row - first) * V + column."""

    targets: np.ndarray | None = None  # u32[R]
    keys: np.ndarray | None = None  # u64[K_shard], increasing
    values: np.ndarray | None = None  # f32[K_shard]


def shard_inputs(record: InputRecord, rows: Rows) -> ShardInputs:
    first, last = rows
    if record.mode == "hard":
        assert record.targets is not None
        return ShardInputs(targets=np.ascontiguousarray(record.targets[first:last]))
    assert record.keys is not None and record.values is not None
    v = record.vocab
    low, high = np.searchsorted(record.keys, [first * v, last * v])
    keys = record.keys[low:high] - np.uint64(first * v)
    return ShardInputs(keys=keys, values=np.ascontiguousarray(record.values[low:high]))


def shard_config(vocab: int, mode: Mode, updates: int, rows: Rows,
                 submission: str = "per-launch") -> BobConfig:
    return BobConfig(vocab=vocab, prompts=0, updates=updates, mode=mode, schedule="seed",
                     submission=submission, rows=rows)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ShardOutcome:
    """What one shard's task gives back: its row losses and the file it wrote."""

    index: int
    initial_loss: np.ndarray  # f32[R]
    training_loss: np.ndarray  # f32[R]
    entry: ShardEntry
    seconds: float  # the task's own time: load, updates, save
    load_seconds: float = 0.0  # plan and backend opened, rows and data written in
    run_seconds: float = 0.0  # the updates, losses read back
    save_seconds: float = 0.0  # the tables streamed out to the shard file


@dataclass(frozen=True)
class ShardTask:
    """One shard of one invocation, as a task runs it (picklable: Dask ships it)."""

    index: int
    count: int
    config: BobConfig
    hyper: Hyper
    first_step: int  # the tables' step before it: its updates are first_step + 1 ...
    source: RowSource
    inputs: ShardInputs
    out: str  # the shard file it writes
    backend: str
    arch: str
    arena: str


@functools.lru_cache(maxsize=4)
def _choice(backend: str, arch: str, arena: str):
    return choose_backend(backend, arch=arch, arena=arena)


def run_shard(task: ShardTask) -> ShardOutcome:
    """Load the shard's rows, run its plan's N updates, stream its tables to its file."""
    begun = time.perf_counter()
    config, (first, last) = task.config, task.config.rows or (0, task.config.vocab)
    choice = _choice(task.backend, task.arch, task.arena)
    plan = build_plan(config, choice.target, task.hyper, compiled=choice.regions)
    backend = choice.open(require_certified(plan))
    try:
        v = config.vocab
        piece_rows = max(1, CHUNK_BYTES // (4 * v))  # the host holds one piece of rows
        pieces = [(a, min(last, a + piece_rows)) for a in range(first, last, piece_rows)]
        for name in CHECKPOINT_TENSORS:
            if task.source is None:
                backend.clear_tensors([name])
                continue
            for a, b in pieces:
                block = task.source.row_block(name, a, b)
                backend.write_tensor(name, memoryview(block.reshape(-1)).cast("B"),
                                     4 * v * (a - first))
        if config.mode == "hard":
            assert task.inputs.targets is not None
            backend.write_tensor("input", task.inputs.targets.astype(U32).tobytes())
        else:
            keys, values = task.inputs.keys, task.inputs.values
            assert keys is not None and values is not None
            for a, b in pieces:  # the scatter's cells, bit for bit, a piece of rows at a time
                low, high = np.searchsorted(keys, [(a - first) * v, (b - first) * v])
                weights = np.zeros((b - a) * v, F32)
                weights.view(U32)[(keys[low:high] - np.uint64((a - first) * v))
                                  .astype(np.int64)] = values[low:high].view(U32)
                backend.write_tensor(WEIGHTS_TENSOR, memoryview(weights).cast("B"),
                                     4 * v * (a - first))
        backend.clear_tensors(["gradients", "training_loss"])
        updates = config.updates
        scalars = adam_scalar_table(task.hyper, task.first_step + 1, updates)
        backend.set_scalars_many([config.adamw_launch(k) for k in range(updates)],
                                 ADAM_SCALAR_NAMES,
                                 scalars.view(np.uint32)[:, :len(ADAM_SCALAR_NAMES)])
        loaded = time.perf_counter()
        backend.run(range(plan.submission_count))
        initial = np.frombuffer(backend.read_tensor("initial_loss"), F32).copy()
        trained = np.frombuffer(backend.read_tensor("training_loss"), F32).copy()
        ran = time.perf_counter()
        entry = write_shard(task.out, config.vocab, task.first_step + updates, (first, last),
                            lambda sink, chunk: backend.stream_read(CHECKPOINT_TENSORS, sink,
                                                                    chunk))
    finally:
        backend.close()
    ended = time.perf_counter()
    return ShardOutcome(task.index, initial, trained, entry, ended - begun,
                        loaded - begun, ran - loaded, ended - ran)


def shard_arena_bytes(vocab: int, mode: Mode, updates: int, rows: Rows, target) -> int:
    """The arena of rows [first, last)'s plan, placed for `target`."""
    return build_plan(shard_config(vocab, mode, updates, rows), target).arena_bytes


def shards_for_budget(vocab: int, mode: Mode, updates: int, budget: int, target) -> int:
    """The fewest even row shards whose largest arena fits `budget` bytes; BadInput (one
    line) when even a shard of one row does not."""
    one_row = shard_arena_bytes(vocab, mode, updates, (0, 1), target)
    if one_row > budget:
        raise BadInput(f"a shard of one row needs {one_row} bytes of device memory; the "
                       f"budget is {budget} bytes")
    low, high = 1, vocab  # the arena shrinks as the shards do: bisect on K
    while low < high:
        middle = (low + high) // 2
        if largest_shard_bytes(vocab, mode, updates, middle, target) <= budget:
            high = middle
        else:
            low = middle + 1
    return low


def largest_shard_bytes(vocab: int, mode: Mode, updates: int, shards: int, target) -> int:
    widest = max(shard_boundaries(vocab, shards), key=lambda rows: rows[1] - rows[0])
    return shard_arena_bytes(vocab, mode, updates, (0, widest[1] - widest[0]), target)


def require_shard_fits(vocab: int, mode: Mode, updates: int, shards: int, budget: int,
                       target) -> None:
    need = largest_shard_bytes(vocab, mode, updates, shards, target)
    if need > budget:
        raise BadInput(f"a shard of {math.ceil(vocab / shards)} rows needs {need} bytes of "
                       f"device memory, the budget is {budget} bytes: ask for more --shards")


# -- the client -----------------------------------------------------------------------
Runner = Callable[[Sequence[ShardTask]], list[ShardOutcome]]


def in_turn(tasks: Sequence[ShardTask]) -> list[ShardOutcome]:
    """The shards one after the other in this process (one device, out of core)."""
    return [run_shard(task) for task in tasks]


def _distributed():
    try:
        import distributed
    except ImportError:
        raise BadInput("--workers, --gpus and --dask need Dask: pip install 'bob-bigram[dask]'") \
            from None
    return distributed


class DaskShards:
    """Shards side by side on a Dask cluster: Bob's own (a worker per GPU, or `workers`
    cpu workers, no retries), or the scheduler at `address`."""

    def __init__(self, workers: int = 0, gpus: Sequence[int] = (), address: str | None = None):
        distributed = _distributed()
        import dask

        self._distributed = distributed
        self.cluster = None
        self._quiet = contextlib.ExitStack()  # Dask's INFO lines kept off Bob's stderr
        self._quiet.enter_context(quiet_dask_logs())
        if address is None:
            # No retry: a lost worker ends the run (one line), the checkpoint kept.
            dask.config.set({"distributed.scheduler.allowed-failures": 0})
            env = [{"CUDA_VISIBLE_DEVICES": str(gpu)} for gpu in gpus] or [{}] * workers
            specs = {i: {"cls": distributed.Nanny,
                         "options": {"nthreads": 1, "env": each, "memory_limit": 0}}
                     for i, each in enumerate(env)}
            # The worker processes log only errors: set in their environment before they
            # start, as their logging is set up on import.
            spawn = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}),
                     "DASK_LOGGING__DISTRIBUTED": "error"}
            with dask.config.set({"distributed.nanny.pre-spawn-environ": spawn}):
                self.cluster = distributed.SpecCluster(
                    workers=specs, scheduler={"cls": distributed.Scheduler,
                                              "options": {"dashboard": False}},
                    silence_logs=50)
            address = self.cluster.scheduler_address
        try:
            self.client = distributed.Client(address, set_as_default=False, timeout="10s")
        except (OSError, TimeoutError) as error:
            self.close()
            raise BadInput(f"--dask {address}: cannot reach the scheduler ({error})") from None
        if self.cluster is not None:
            self.client.wait_for_workers(len(specs))

    def __call__(self, tasks: Sequence[ShardTask]) -> list[ShardOutcome]:
        futures = [self.client.submit(run_shard, task, pure=False,
                                      key=f"bob-shard-{task.first_step}-{task.index}")
                   for task in tasks]
        try:
            return [future.result() for future in futures]
        except self._distributed.KilledWorker as error:
            worker = getattr(error, "last_worker", None)
            worker = getattr(worker, "address", worker) or "a worker"
            task = tasks[_task_index(error, tasks)]
            failure: Exception = RunFailure(
                f"Dask worker {worker} was lost with shard {task.index + 1} of {task.count} "
                f"(rows [{task.config.rows[0]}, {task.config.rows[1]})) of the updates after "
                f"step {task.first_step} on it; the checkpoint at step {task.first_step} is "
                "kept")
        except Exception as error:  # a task's own error, raised as it is
            failure = error
        except BaseException:  # a stop: our own workers are stopped, nothing waited for
            self.client.cancel([f for f in futures if not f.done()])
            self.close()
            raise
        # A task running on another worker cannot be stopped: wait for it to end, so that
        # no shard file appears after the caller has removed those no index names.
        self.client.gather([f for f in futures if not f.done()], errors="skip")
        raise failure from None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.close()
        self._quiet.close()


def _task_index(error: Exception, tasks: Sequence[ShardTask]) -> int:
    key = str(getattr(error, "task", ""))
    for position, task in enumerate(tasks):
        if key.endswith(f"-{task.index}") and str(task.first_step) in key:
            return position
    return 0


@dataclass(frozen=True)
class ShardedInvocation:
    """One invocation of a sharded run, as the progress callback sees it (the fields
    `bob.host.session.Invocation` gives that the CLI reads)."""

    result: ResultRecord
    initial_loss: float
    loss: float
    state: TrainingState
    seconds: float
    shard_seconds: tuple[float, ...]
    shards: tuple[ShardOutcome, ...]  # each shard's outcome, its times among them
    began: float  # perf_counter at its start and after its index was written
    finished: float
    checkpoint: None = None
    validation: None = None


def train_in_shards(*, checkpoint: str, start: TrainingState, source: RowSource,
                    record: InputRecord, steps: int, updates_per_invocation: int,
                    boundaries: Sequence[Rows], runner: Runner, backend: str, arch: str,
                    arena: str, optimum: float | None,
                    progress: Callable[[ShardedInvocation, int], None] | None = None,
                    replaces: str | None = None,
                    ) -> tuple[list[ShardedInvocation], TrainingState]:
    """`steps` updates in invocations of `updates_per_invocation`, each run shard by shard
    through `runner`; after each, the index (the commit). The invocations and the state
    the last index holds. The one-piece checkpoint it resumed, or `replaces` (one that
    --overwrite starts again over), is removed after the first commit: it would hide the
    index, the one-piece file being what the name reads first.

    As one-piece training does: the first SIGINT/SIGTERM lets the invocation in flight
    finish and be committed, then stops; a second (or one outside the run) stops at once,
    its shard files removed; either way Interrupted says which update was reached and
    which checkpoint is kept."""
    from bob.host import stops
    from bob.host.session import split_updates

    committed = [start.step if source is not None else None]
    try:
        with stops.finishing():
            done = _train_in_shards(checkpoint, start, source, record, steps,
                                    updates_per_invocation, boundaries, runner, backend,
                                    arch, arena, optimum, progress, split_updates,
                                    committed, stop=stops.stop_requested, replaces=replaces)
            stopped = stops.stop_requested()
    except KeyboardInterrupt as stop:
        signum = stop.signum if isinstance(stop, Interrupted) else signal.SIGINT
        reached = (committed[0] if committed[0] is not None else start.step) + min(
            updates_per_invocation, steps)
        raise _interrupted(signum, min(reached, start.step + steps), committed[0]) from None
    invocations, state = done
    if stopped is not None and state.step < start.step + steps:
        raise _interrupted(stopped, state.step, state.step)
    return invocations, state


def _interrupted(signum: int, reached: int, kept: int | None) -> Interrupted:
    if kept is None:
        return Interrupted(signum, f"interrupted at update {reached}; no checkpoint written "
                                   "by this run")
    return Interrupted(signum, f"interrupted at update {reached}; checkpoint at update {kept} "
                               "kept")


def _train_in_shards(checkpoint, start, source, record, steps, updates_per_invocation,
                     boundaries, runner, backend, arch, arena, optimum, progress,
                     split_updates, committed: list[int | None],
                     stop: Callable[[], int | None], replaces: str | None = None,
                     ) -> tuple[list[ShardedInvocation], TrainingState]:
    from bob.host import stops

    state = start
    history = History.of(start.history)
    invocations: list[ShardedInvocation] = []
    done = 0
    count = len(boundaries)
    one_piece = source.path if isinstance(source, CheckpointFile) else replaces
    for updates in split_updates(steps, updates_per_invocation):
        begun = time.perf_counter()
        tasks = [ShardTask(i, count, shard_config(record.vocab, record.mode, updates, rows),
                           state.hyper, state.step, source, shard_inputs(record, rows),
                           shard_file(checkpoint, state.step + updates, i, count),
                           backend, arch, arena)
                 for i, rows in enumerate(boundaries)]
        try:
            outcomes = sorted(runner(tasks), key=lambda outcome: outcome.index)
        except BaseException:
            _remove_unnamed(tasks, source)
            raise
        initial_rows = np.concatenate([o.initial_loss for o in outcomes])
        trained_rows = np.concatenate([o.training_loss for o in outcomes])
        initial = ResultRecord.objective(record.mode, initial_rows)
        final = ResultRecord.objective(record.mode, trained_rows)
        step = state.step + updates
        if not (math.isfinite(initial) and math.isfinite(final)):
            _remove_unnamed(tasks, source)
            raise RunFailure(f"the loss became non-finite ({final}) by step {step}; the last "
                             "good checkpoint is kept (try a smaller --lr)")
        done += updates
        first = [] if history else [(start.step, initial)]
        history = history.extended([*first, (step, final)])
        state = replace(state, step=step, history=history, optimum=optimum)
        entries = [o.entry for o in outcomes]
        with stops.held():  # a stop waits: the index names whole files, and is named kept
            where = write_index(checkpoint, state, entries)
            committed[0] = step
        source = ShardedCheckpoint.written(where, state, tuple(entries))
        if one_piece is not None:  # the one-piece checkpoint it resumed or replaces
            with contextlib.suppress(OSError):
                os.unlink(one_piece)
            one_piece = None
        result = ResultRecord(mode=record.mode, vocab=record.vocab,
                              initial_loss=initial_rows, training_loss=trained_rows,
                              logit_rows=np.zeros((0, record.vocab), F32),
                              predictions=np.zeros(0, U32))
        finished = time.perf_counter()
        invocation = ShardedInvocation(result, initial, final, state, finished - begun,
                                       tuple(o.seconds for o in outcomes), tuple(outcomes),
                                       begun, finished)
        invocations.append(invocation)
        if progress is not None:
            progress(invocation, done)
        if stop() is not None:  # the invocation in flight is committed: stop here
            break
    return invocations, state


def _remove_unnamed(tasks: Sequence[ShardTask], source: RowSource) -> None:
    """The shard files a failed invocation wrote (no index names them)."""
    named = set()
    if isinstance(source, ShardedCheckpoint):
        named = {os.path.join(os.path.dirname(source.path), s.file) for s in source.shards}
    for task in tasks:
        if task.out not in named:
            with contextlib.suppress(OSError):
                os.unlink(task.out)


def sharded_checkpoint_bytes(vocab: int, boundaries: Sequence[Rows]) -> int:
    """About the bytes a sharded save writes: the three tables and a header per shard."""
    return 3 * 4 * vocab * vocab + 4096 * len(boundaries)

