"""The training driver: one `TrainRequest` run to its checkpoint and report.

    >>> from bob.host.training import TrainRequest, run_training
    >>> run_training(TrainRequest(steps=200, backend="cpu"))  # bob train --steps 200 --backend cpu
    >>> run_training(TrainRequest(steps=200, resume=True))  # bob train --steps 200 --resume

A request is checked once, when it is made: its values, and that its outputs can be
written. The run then chooses the backend, reads or counts the data (refusing a table
the CPU should not train before its weights are built), finds the starting point (a
fresh table, or the checkpoint to resume, with this run's data and hyperparameters),
and trains as a pipeline of invocations (``bob.host.session.train``). Each
invocation's checkpoint is saved by a `BackgroundWriter` while the next one runs; a
SIGINT or SIGTERM waits for the save in flight, so the file it names is whole.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from bob.backends import BackendChoice, choose_backend, resolve_submission
from bob.config import (
    ARENA_KINDS,
    AUTO_SUBMISSION,
    DEFAULT_TARGET,
    SCHEDULES,
    SUBMISSION_CHOICES,
    Hyper,
    require_choice,
)
from bob.errors import BadInput, Interrupted
from bob.files import check_output_file
from bob.host import stops
from bob.host.data import (
    CorpusSpec,
    TrainingData,
    require_one_source,
    training_data,
    validation_record,
)
from bob.host.inference import validation_loss
from bob.host.session import Invocation, Session
from bob.host.session import train as train_invocations
from bob.host.writer import BackgroundWriter
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord, ResultRecord
from bob.records.checkpoint import HYPER_FIELDS, Checkpoint, History, Segment, checkpoint_lock

DEFAULT_CHECKPOINT = "bob.safetensors"
DEFAULT_UPDATES_PER_INVOCATION = 100

Progress = Callable[[Invocation, int], None]  # (the invocation, updates done so far)


@dataclass(frozen=True)
class TrainRequest:
    """Everything one training run is asked to do (`api.train`'s keywords, `bob train`'s
    options in the API's words).

    Made once and checked once: a bad value, or an output that cannot be written, is a
    BadInput here, before any work and with nothing written.
    """

    texts: tuple[str, ...] | None = None  # text files (corpus mode); "-" is stdin
    steps: int = 1000  # AdamW updates this run makes
    checkpoint: str = DEFAULT_CHECKPOINT
    resume: bool = False  # continue the checkpoint's run (its step, history, hyperparameters)
    backend: str = "auto"  # cuda where a GPU is usable, else cpu
    # AdamW's hyperparameters in full; None: hyper_changes over the checkpoint's own on
    # resume, else over the defaults.
    hyper: Hyper | None = None
    # Updates in one plan: a checkpoint is saved after each invocation.
    updates_per_invocation: int = DEFAULT_UPDATES_PER_INVOCATION
    input_record: str | None = None  # an input record file instead of texts
    overwrite: bool = False  # start again over an existing checkpoint
    arch: str = DEFAULT_TARGET  # the nv-sim backend's target (cuda reads its device's)
    arena: str = ARENA_KINDS[0]  # cuda, nv: device memory; "host": mapped system memory
    result_path: str | None = None  # where the last invocation's result record goes
    schedule: str = "seed"  # the reference; "fused" leaves the same bytes, faster
    hyper_changes: Mapping[str, float] | None = None  # the fields the user stated
    # A resumed run trains on the checkpoint's data unless the data changes on purpose (a
    # new segment records where).
    new_data: bool = False
    data_spec: CorpusSpec | None = None  # token files or a counts file, instead of texts
    val_spec: CorpusSpec | None = None  # validation data: its exact loss after each invocation
    # "auto": chained on nv and nv-sim, per-launch elsewhere (bob.backends.resolve_submission).
    submission: str = AUTO_SUBMISSION

    def __post_init__(self) -> None:
        if self.texts is not None:  # any sequence of names, kept as a tuple
            object.__setattr__(self, "texts", tuple(self.texts))
        if self.hyper_changes is not None:  # a copy: the caller's mapping stays its own
            object.__setattr__(self, "hyper_changes", dict(self.hyper_changes))
        if self.steps < 0:
            raise BadInput(f"steps must be >= 0, not {self.steps}")
        if self.updates_per_invocation < 1:
            raise BadInput("updates_per_invocation must be at least 1, not "
                           f"{self.updates_per_invocation}")
        require_choice("schedule", self.schedule, SCHEDULES)
        require_choice("submission", self.submission, SUBMISSION_CHOICES)
        if self.new_data and not self.resume:
            raise BadInput("--new-data continues a checkpoint on other data: it needs --resume")
        unknown = sorted(set(self.hyper_changes or ()) - set(HYPER_FIELDS))
        if unknown:
            raise BadInput(f"unknown hyperparameter {unknown[0]!r}; Bob's are "
                           f"{', '.join(HYPER_FIELDS)}")
        # Every output is checked before any work, so a bad path costs nothing.
        if self.steps > 0:
            check_output_file(self.checkpoint, "checkpoint")
        if self.result_path is not None:
            check_output_file(self.result_path, "result record")
        require_one_source(self.texts, self.input_record, self.data_spec)


@dataclass(frozen=True)
class TrainReport:
    checkpoint: str
    backend: str
    data: str
    mode: str
    steps: int  # updates made by this run
    global_step: int  # the checkpoint's update count after it
    initial_loss: float
    loss: float
    optimum: float | None
    history: tuple[tuple[int, float], ...]
    last_result: ResultRecord | None
    written: tuple[str, ...] = ()  # the files this run wrote, in order
    segments: tuple[Segment, ...] = ()  # what trained each step range, this run's last
    val_loss: float | None = None  # the exact validation loss after the run (--val)
    val_history: tuple[tuple[int, float], ...] = ()
    wall_seconds: float = 0.0  # run_training from call to return: data, backend, updates, saves

    @property
    def updates_per_second(self) -> float:
        """This run's updates over its wall time (0 when it made none)."""
        return self.steps / self.wall_seconds if self.steps and self.wall_seconds > 0 else 0.0

    @property
    def gap(self) -> float | None:
        """Relative distance of the loss above the optimum."""
        if self.optimum is None or self.optimum == 0:
            return None
        return (self.loss - self.optimum) / self.optimum

    def to_json(self) -> dict:
        return {
            "loss": self.loss, "initial_loss": self.initial_loss, "optimum": self.optimum,
            "gap": self.gap, "steps": self.steps, "global_step": self.global_step,
            "checkpoint": self.checkpoint if self.checkpoint in self.written else None,
            "written": list(self.written), "backend": self.backend, "mode": self.mode,
            "data": self.data, "segments": [segment.to_json() for segment in self.segments],
            **({"val_loss": self.val_loss} if self.val_loss is not None else {}),
            "wall_seconds": self.wall_seconds, "updates_per_second": self.updates_per_second,
        }


def run_training(request: TrainRequest, progress: Progress | None = None) -> TrainReport:
    """Train for `request.steps` updates, saving the checkpoint after every invocation.

    `progress(invocation, done)` runs after each invocation (the CLI advances its bar
    there). One run holds CKPT.lock while it works; a second is refused.
    """
    begun = time.perf_counter()
    choice = choose_backend(request.backend, arch=request.arch, arena=request.arena)
    data = training_data(request.texts, request.input_record, request.data_spec,
                         admit=lambda vocab: refuse_slow_cpu(choice.name, vocab, request.steps))
    validation = validation_record(request.val_spec, data.record.vocab)
    lock = checkpoint_lock(request.checkpoint) if request.steps > 0 else contextlib.nullcontext()
    with lock:
        start = _starting_point(request, data)
        report = _train_from(request, start, data, choice, progress, validation)
    return replace(report, wall_seconds=time.perf_counter() - begun)


def _starting_point(request: TrainRequest, data: TrainingData) -> Checkpoint:
    """The checkpoint the run starts from, carrying this run's data and hyperparameters."""
    checkpoint = request.checkpoint
    exists = os.path.exists(checkpoint)
    digest = data.record.data_digest
    changes = request.hyper_changes or {}
    if not request.resume:
        if exists and not request.overwrite:
            raise BadInput(f"{checkpoint}: exists; pass --resume to continue it or --overwrite "
                           "to start again")
        chosen = replace(request.hyper or Hyper(), **changes)
        return Checkpoint.zeros(data.record.vocab, chosen, data.record.mode, data_digest=digest,
                                ).with_segments((Segment(0, digest, chosen),))
    if not exists:
        raise BadInput(f"{checkpoint}: no checkpoint to resume from")
    start = Checkpoint.load(checkpoint)
    if start.vocab != data.record.vocab:
        raise BadInput(f"{checkpoint}: the checkpoint has V={start.vocab}, the data "
                       f"V={data.record.vocab}")
    if start.data_digest and start.data_digest != digest and not request.new_data:
        raise BadInput(f"{checkpoint}: trained on data {start.data_digest[:12]}, this data "
                       f"({data.description}) is {digest[:12]}; pass --new-data to continue "
                       "on other data")
    chosen = replace(request.hyper or start.hyper, **changes)
    return _continued(start, data.record, chosen)


def _continued(start: Checkpoint, record: InputRecord, hyper: Hyper) -> Checkpoint:
    """`start` set to train on `record` with `hyper`, a new segment where either changed."""
    segments = start.segments or (Segment(0, start.data_digest, start.hyper),)
    now = Segment(start.step, record.data_digest, hyper)
    last = segments[-1]
    if (last.data_digest, last.hyper) != (now.data_digest, now.hyper):
        # A segment that never ran an update is replaced, not kept.
        segments = (*segments[:-1], now) if last.first_step == start.step else (*segments, now)
    return replace(start, hyper=hyper, data_digest=record.data_digest, mode=record.mode,
                   segments=segments)


def _train_from(request: TrainRequest, start: Checkpoint, data: TrainingData,
                choice: BackendChoice, progress: Progress | None,
                validation: InputRecord | None) -> TrainReport:
    steps, checkpoint = request.steps, request.checkpoint
    config = BobConfig(vocab=data.record.vocab, prompts=0,
                       updates=min(request.updates_per_invocation, max(steps, 1)),
                       mode=data.record.mode, schedule=request.schedule,  # type: ignore[arg-type]
                       submission=resolve_submission(request.submission, choice.name))
    # The loss and validation histories so far, each extended by what an invocation adds
    # (only that is checked: a long run's history is not checked again at every step).
    history = History.of(start.history)
    val_history = History.of(start.val_history)
    written: list[str] = []
    kept = [start.step if request.resume else None]  # the step of the checkpoint on disk

    def validate(state: Checkpoint) -> None:
        nonlocal val_history
        if validation is not None:
            val_history = val_history.extended(
                [(state.step, validation_loss(session, state, validation))])

    first_initial: list[float] = []  # the first invocation's initial loss

    def after(invocation: Invocation, done: int) -> None:
        nonlocal history
        if not first_initial:
            first_initial.append(invocation.initial_loss)
        first = [] if history else [(start.step, invocation.initial_loss)]
        history = history.extended([*first, (invocation.checkpoint.step, invocation.loss)])
        if validation is not None and not val_history:
            validate(start)
        validate(invocation.checkpoint)
        state = replace(invocation.checkpoint, history=history, optimum=data.optimum,
                        val_history=val_history)

        def save() -> None:  # on the writer's thread, while the next invocation runs
            state.save(checkpoint)
            kept[0] = state.step  # the interrupt message names the checkpoint on disk
            if checkpoint not in written:
                written.append(checkpoint)

        writer.submit(save, supersede=True)  # every save goes to the one file
        if progress is not None:
            progress(invocation, done)

    refuse_slow_cpu(choice.name, data.record.vocab, steps)  # an input record's V
    writer = BackgroundWriter()
    try:
        try:
            with Session(choice, start.hyper) as session:
                if steps == 0:
                    invocation = session.invoke(config, start, data.record, "predict")
                    initial = final = invocation.initial_loss
                    result = invocation.result
                    validate(start)
                else:
                    # Only the last invocation is held: a long run keeps no old tables.
                    (last,) = train_invocations(session, config, start, data.record, steps,
                                                after, keep_all=False)
                    initial, final = first_initial[0], last.loss
                    result = last.result
        finally:
            # Every checkpoint handed over is written before anything is reported (a stop
            # waits for the save in flight: the file it names is whole).
            with stops.held():
                writer.close()
        if request.result_path is not None and result is not None:
            result.write(request.result_path)
            written.append(request.result_path)
    except KeyboardInterrupt as stop:
        raise _interrupted(stop, start.step, steps, config.updates, kept[0]) from None
    return TrainReport(
        checkpoint=checkpoint, backend=choice.name, data=data.description,
        mode=data.record.mode, steps=steps, global_step=start.step + steps,
        initial_loss=initial, loss=final, optimum=data.optimum, history=history,
        last_result=result, written=tuple(written), segments=start.segments,
        val_loss=val_history[-1][1] if val_history else None,
        val_history=val_history,
    )


def _interrupted(stop: KeyboardInterrupt, first: int, steps: int, per_invocation: int,
                 kept: int | None) -> Interrupted:
    """Where the run stood: the update its abandoned invocation was reaching, what is kept."""
    signum = stop.signum if isinstance(stop, Interrupted) else signal.SIGINT
    done = first if kept is None else kept
    reached = min(done + per_invocation, first + steps) if steps else done
    if kept is None:
        return Interrupted(signum, f"interrupted at update {reached}; no checkpoint written "
                                   "by this run")
    return Interrupted(signum, f"interrupted at update {reached}; checkpoint at update {kept} "
                               "kept")


# The CPU backend makes at least this many parameter-updates a second: the NumPy
# reference kernels' seed schedule (the slowest path); the Numba kernels are faster.
# Beyond an hour of that, a run belongs on a GPU.
CPU_PARAMETER_UPDATES_PER_SECOND = 2.0e8
CPU_MAX_SECONDS = 3600.0
# The CPU backend holds the whole arena in host memory, and the NumPy reference adds working
# arrays of the table's size: about 7 tables of 4 V^2 bytes in corpus mode. Up to V = 32768
# that is 28 GiB; at V = 50257 (GPT-2's vocabulary) 66 GiB, past most hosts: such tables
# train on a GPU, whatever the number of updates.
CPU_MAX_VOCAB = 32768
CPU_TABLES_IN_MEMORY = 7


def refuse_slow_cpu(backend: str, vocab: int, steps: int) -> None:
    """BadInput when training V x V on the CPU needs more memory than Bob allows it, or
    `steps` updates would take over an hour."""
    if backend != "cpu":
        return
    if vocab > CPU_MAX_VOCAB:
        gib = CPU_TABLES_IN_MEMORY * 4 * vocab * vocab / 2**30
        raise BadInput(f"V={vocab} is above the largest table the CPU backend trains "
                       f"(V={CPU_MAX_VOCAB}): it would hold about {gib:.1f} GiB in host "
                       f"memory; train on a GPU (--backend cuda)")
    seconds = vocab * vocab * steps / CPU_PARAMETER_UPDATES_PER_SECOND
    if seconds > CPU_MAX_SECONDS:
        raise BadInput(f"V={vocab} for {steps} updates on the CPU backend would take about "
                       f"{seconds / 3600:.1f} hours; train on a GPU (--backend cuda) or make "
                       f"fewer --steps")
