"""`bob train` in row shards: a `TrainRequest` that asks for shards (or resumes a sharded
checkpoint) checked, placed and run by `bob.host.sharded`.

Everything is refused before any work with one line: a shard count outside [1, V], a
budget too small for one row's arena, a disk without room for the new shards beside the
old. How many shards: --shards, else one per GPU of --gpus, else one per worker of
--workers, else the fewest whose arena fits --device-memory, else (resuming a sharded
checkpoint) the checkpoint's own.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

from bob.backends import choose_backend, resolve_schedule
from bob.errors import BadInput
from bob.host.sharded import (
    DaskShards,
    in_turn,
    require_shard_fits,
    sharded_checkpoint_bytes,
    shards_for_budget,
    train_in_shards,
)
from bob.host.training import (
    Announce,
    Progress,
    TrainReport,
    TrainRequest,
    _require_checkpoint_as_asked,
    _starting_point,
    request_data,
    require_disk_room,
    run_one_piece,
)
from bob.program.bob import shard_boundaries
from bob.records.checkpoint import checkpoint_lock
from bob.records.shards import ShardedCheckpoint, index_path, is_sharded, one_piece_path


def shard_count(request: TrainRequest, vocab: int, mode: str, updates: int, target,
                resumed: ShardedCheckpoint | None) -> int:
    """K as the module docstring says, checked against the budget where one is given."""
    count = request.shards or (len(request.gpus) if request.gpus else None) or request.workers
    if count is None and request.device_memory is not None:
        count = shards_for_budget(vocab, mode, updates, request.device_memory, target)  # type: ignore[arg-type]
    if count is None:
        count = len(resumed.shards) if resumed is not None else 1
    if count > vocab:
        raise BadInput(f"--shards must be an integer in [1, V={vocab}], not {count}")
    if request.device_memory is not None:
        require_shard_fits(vocab, mode, updates, count, request.device_memory, target)  # type: ignore[arg-type]
    return count


def run_training(request: TrainRequest, progress: Progress | None = None,
                 announce: Announce | None = None) -> TrainReport:
    """Train as `request` asks: in row shards where it asks for them or resumes a sharded
    checkpoint, else in one piece (`bob.host.training.run_one_piece`, which announces its
    plan before its backend starts)."""
    if not (request.asks_shards or (request.resume and is_sharded(request.checkpoint))):
        return run_one_piece(request, progress, announce)
    if request.kernels == "own":  # a sharded checkpoint resumed: its shards run NVRTC's
        raise BadInput(f"{request.checkpoint} is sharded; row shards do not take --kernels own")
    if request.schedule == "fused":  # a sharded checkpoint resumed: its shards run the seed's
        raise BadInput(f"{request.checkpoint} is sharded; row shards do not take "
                       "--schedule fused")
    begun = time.perf_counter()
    _require_checkpoint_as_asked(request)  # before the data, which may take hours to count
    report = run_sharded_training(request, progress)
    return replace(report, wall_seconds=time.perf_counter() - begun)


def run_sharded_training(request: TrainRequest, progress: Progress | None = None,
                         ) -> TrainReport:
    backend = request.backend
    if request.gpus is not None and backend == "auto":
        backend = "cuda"
    choice = choose_backend(backend, arch=request.arch, arena=request.arena)
    data = request_data(request, choice.name, dense=True)
    record = data.record
    updates = min(request.updates_per_invocation, request.steps)
    with checkpoint_lock(request.checkpoint):
        start = _starting_point(request, data)
        source = start.source
        resumed = source if isinstance(source, ShardedCheckpoint) else None
        count = shard_count(request, record.vocab, record.mode, updates, choice.target,
                            resumed)
        boundaries = shard_boundaries(record.vocab, count)
        require_disk_room(index_path(request.checkpoint),
                          sharded_checkpoint_bytes(record.vocab, boundaries))
        side_by_side = (request.workers is not None or request.gpus is not None
                        or request.dask_address is not None)
        runner = DaskShards(request.workers or 0, request.gpus or (),
                            request.dask_address) if side_by_side else None
        try:
            invocations, state = train_in_shards(
                checkpoint=request.checkpoint, start=start.state, source=source,
                record=record, steps=request.steps,
                updates_per_invocation=request.updates_per_invocation,
                boundaries=boundaries, runner=runner or in_turn, backend=choice.name,
                arch=request.arch, arena=request.arena, optimum=data.optimum,
                progress=progress, replaces=_replaced_one_piece(request))  # type: ignore[arg-type]
        finally:
            if runner is not None:
                runner.close()
    where = index_path(request.checkpoint)
    return TrainReport(
        checkpoint=where, backend=choice.name, data=data.shown, mode=record.mode,
        steps=request.steps, global_step=state.step,
        initial_loss=invocations[0].initial_loss, loss=invocations[-1].loss,
        optimum=data.optimum, history=state.history, last_result=invocations[-1].result,
        written=(where,), segments=state.segments, shard_rows=tuple(boundaries),
        shards_ran=_where_shards_ran(request, runner),
        schedule=resolve_schedule(request.schedule, choice.name, request.kernels,
                                  row_shards=True))


def _replaced_one_piece(request: TrainRequest) -> str | None:
    """The one-piece checkpoint under the name that --overwrite starts again over in
    shards, if there is one: removed once the first index is written."""
    path = one_piece_path(request.checkpoint)
    return path if request.overwrite and os.path.lexists(path) else None


def _where_shards_ran(request: TrainRequest, runner: DaskShards | None) -> str:
    if runner is None:
        return "in turn, in this process"
    if request.dask_address is not None:
        return f"on the Dask scheduler {request.dask_address}'s workers"
    if request.gpus is not None:
        return f"side by side on GPUs {','.join(map(str, request.gpus))} (a Dask worker each)"
    return f"side by side on {request.workers} Dask worker processes"
