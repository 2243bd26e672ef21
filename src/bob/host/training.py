"""The training driver: one `TrainRequest` run to its checkpoint and report.

    >>> from bob.host.api import TrainRequest, run_training
    >>> run_training(TrainRequest(steps=200, backend="cpu"))  # bob train --steps 200 --backend cpu
    >>> run_training(TrainRequest(steps=200, resume=True))  # bob train --steps 200 --resume

A request is checked once, when it is made: its values, and that its outputs can be
written. The run then chooses the backend, reads or counts the data (refusing a table
the CPU should not train before any work), finds the starting point (a fresh table, or
the checkpoint to resume, with this run's data and hyperparameters; neither is read
into host memory: zeros are cleared on the device, a checkpoint is streamed in), checks
that the disk has room for the checkpoint, and trains as a pipeline of invocations
(``bob.host.session.train``), the validation loss computed on the device.

Checkpoints follow a policy (`SavePolicy`): every invocation while the checkpoint is at
most SMALL_CHECKPOINT_BYTES (its tables read back beside the next invocation and saved
by a `BackgroundWriter`), past that every DEFAULT_SAVE_SECONDS (the tables streamed
from the arena to the file through a few pinned buffers, the next invocation waiting),
or as `save_every_seconds`/`save_every_updates` ask; always at the end. The first
SIGINT or SIGTERM lets the invocation in flight finish and saves it; a second stops at
once, keeping the last file. Every file is an invocation-boundary state, so a resumed
run reaches the bytes of an uninterrupted one.

Eval points (`eval_every`, else every invocation, and the end) are where the caller's
progress reports the losses; invocations end there, while the checkpoint's histories and
the policy keep the `updates_per_invocation` grain, so the file is the same with or
without them. With `keep_best`, the state of the lowest validation loss at an eval point
is saved beside the checkpoint as well (`best_checkpoint_path`).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from bob.backends import BackendChoice, choose_backend, resolve_submission
from bob.backends.registry import ASKED_FOR, ScheduleChoice, require_kernels
from bob.config import (
    ARENA_KINDS,
    AUTO_SCHEDULE,
    AUTO_SUBMISSION,
    CHECKPOINT_TENSORS,
    DEFAULT_KERNELS,
    DEFAULT_TARGET,
    MAX_DENSE_VOCAB,
    MIN_VOCAB,
    SCHEDULE_CHOICES,
    SCHEDULE_FIELDS,
    SUBMISSION_CHOICES,
    TABLES_CHOICES,
    Hyper,
    Tables,
    require_choice,
)
from bob.errors import BadInput, Interrupted, size_text
from bob.files import check_output_file, require_apart, write_target
from bob.host import own_code, stops
from bob.host.data import (
    CorpusSpec,
    TrainingData,
    check_val_fraction,
    data_given_by,
    require_one_source,
    successor_ranges,
    training_data,
    validation_record,
)
from bob.host.session import Invocation, Session, Start
from bob.host.session import train as train_invocations
from bob.host.tables import choose_tables, named_keys, starting_tables
from bob.host.writer import BackgroundWriter
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord, ResultRecord
from bob.records.checkpoint import (
    HYPER_FIELDS,
    MAX_STEP,
    History,
    Ranges,
    Segment,
    StartingPoint,
    TableDelivery,
    TableSink,
    TrainingState,
    checkpoint_lock,
    ranges_mask,
    symbol_ranges,
)
from bob.records.corpus import BYTE_VOCAB
from bob.records.data_sources import DataSources
from bob.records.shards import (
    checkpoint_exists,
    index_path,
    old_shard_files,
    open_checkpoint,
    remove_sharded,
)
from bob.records.sources import local_files

DEFAULT_CHECKPOINT = "bob.safetensors"
DEFAULT_UPDATES_PER_INVOCATION = 100

Progress = Callable[[Invocation, int], None]  # (the invocation, updates done so far)
Announce = Callable[["TrainPlan"], None]  # what the run is about to do, once it is known
# A checkpoint up to this size is saved after every invocation by default, its tables read
# back beside the next one; a larger one is streamed from the arena when a save is due.
SMALL_CHECKPOINT_BYTES = 256 << 20
DEFAULT_SAVE_SECONDS = 600.0  # a large checkpoint's default period


@dataclass(frozen=True)
class SavePolicy:
    """When a run writes its checkpoint: always after its last invocation, and after an
    invocation whose end is due by seconds or updates since the last save."""

    every_invocation: bool = True
    every_seconds: float | None = None
    every_updates: int | None = None

    @classmethod
    def of(cls, request: TrainRequest, checkpoint_bytes: int) -> SavePolicy:
        """The request's periods, or the default for a checkpoint of this size."""
        if request.save_every_seconds is None and request.save_every_updates is None:
            if checkpoint_bytes <= SMALL_CHECKPOINT_BYTES:
                return cls(True)
            return cls(False, DEFAULT_SAVE_SECONDS)
        return cls(False, request.save_every_seconds, request.save_every_updates)

    def due(self, done: int, saved_done: int, since_save: float) -> bool:
        """Whether a save is due once `done` updates are made (`saved_done` at the last
        save, `since_save` seconds ago)."""
        return (self.every_invocation
                or (self.every_updates is not None and done - saved_done >= self.every_updates)
                or (self.every_seconds is not None and since_save >= self.every_seconds))


KEEP_BEST_NEEDS_VALIDATION = (
    "--keep-best keeps the checkpoint of the lowest validation loss: it needs validation "
    "data (--val-fraction, --val-text, --val-tokens or --val-counts)")


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
    backend: str = "auto"  # cuda where a GPU is usable, else nv, else cpu
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
    # "seed" (the reference) or "fused" (the same bytes, faster); "auto": fused wherever
    # Bob has fused kernels for the run, else seed (bob.backends.resolve_schedule).
    schedule: str = AUTO_SCHEDULE
    hyper_changes: Mapping[str, float] | None = None  # the fields the user stated
    # A resumed run trains on the checkpoint's data unless the data changes on purpose (a
    # new segment records where).
    new_data: bool = False
    data_spec: CorpusSpec | None = None  # token files or a counts file, instead of texts
    val_spec: CorpusSpec | None = None  # validation data: its exact loss after each invocation
    # "auto": chained on nv and nv-sim, per-launch elsewhere (bob.backends.resolve_submission).
    submission: str = AUTO_SUBMISSION
    # Checkpoint periods; None for both: every invocation while the checkpoint is at most
    # SMALL_CHECKPOINT_BYTES, else every DEFAULT_SAVE_SECONDS (SavePolicy). Always at the end.
    save_every_seconds: float | None = None
    save_every_updates: int | None = None
    # An eval point every this many updates of the run (a progress line, the validation
    # loss); None: every invocation. Invocations end at eval points (`invocation_updates`);
    # the checkpoint, its histories and the save policy keep the -N grain.
    eval_every: int | None = None
    # At each eval point whose validation loss is the lowest so far, save the checkpoint to
    # `best_checkpoint_path(checkpoint)` as well (atomically); needs val_spec.
    keep_best: bool = False
    # steps = 0: still write the starting point (a fresh run's zero table) as the checkpoint,
    # so that a model exists to load; `bob train --steps 0` writes nothing.
    save_start: bool = False
    # Row shards (bob.host.sharded): K shards of the table's rows, trained shard by shard
    # each invocation and saved as a sharded checkpoint; None: one piece (unless the
    # options below ask for shards, or the checkpoint resumed is sharded: its own K).
    shards: int | None = None
    workers: int | None = None  # side by side on a LocalCluster of this many workers
    gpus: tuple[int, ...] | None = None  # side by side, a Dask worker per GPU listed
    device_memory: int | None = None  # bytes a shard's arena may take: K follows from it
    dask_address: str | None = None  # side by side on the Dask scheduler at this address
    # Whose machine code the plan's regions run: "nvrtc", or "own" (Bob's, bob.kernels.own:
    # nv and nv-sim, the table in one piece, the plans own code covers: bob.host.own_code).
    kernels: str = DEFAULT_KERNELS
    # How the tables are held: "auto" (chosen from the data, bob.host.tables), "dense" or
    # "collapsed".
    tables: str = "auto"
    # The last fraction of the training data held out as validation (nanoGPT's 90/10 split
    # is 0.1): the run trains on the rest. Texts, token files and the built-in corpus.
    val_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.texts is not None:  # any sequence of names, kept as a tuple
            object.__setattr__(self, "texts", tuple(self.texts))
        if self.hyper_changes is not None:  # a copy: the caller's mapping stays its own
            object.__setattr__(self, "hyper_changes", dict(self.hyper_changes))
        if self.steps < 0:
            raise BadInput(f"steps must be >= 0, not {self.steps}")
        if self.steps > MAX_STEP:  # before any work: no run could record its step
            raise BadInput(f"--steps {self.steps} is above 2**53 = {MAX_STEP}, the largest "
                           "step a checkpoint holds")
        if self.updates_per_invocation < 1:
            raise BadInput("updates_per_invocation must be at least 1, not "
                           f"{self.updates_per_invocation}")
        require_choice("schedule", self.schedule, SCHEDULE_CHOICES)
        require_choice("tables", self.tables, TABLES_CHOICES)
        require_choice("submission", self.submission, SUBMISSION_CHOICES)
        require_kernels(self.kernels, (self.backend,))
        if self.tables == "collapsed" and self.kernels == "own":
            refused = own_code.collapsed_refusal()
            if refused:
                raise BadInput(refused)
        if self.save_every_seconds is not None and not (
                math.isfinite(self.save_every_seconds) and self.save_every_seconds > 0):
            raise BadInput(f"save_every_seconds must be a positive number, not "
                           f"{self.save_every_seconds!r}")
        if self.save_every_updates is not None and self.save_every_updates < 1:
            raise BadInput(f"save_every_updates must be at least 1, not "
                           f"{self.save_every_updates}")
        if self.eval_every is not None and self.eval_every < 1:
            raise BadInput(f"eval_every must be at least 1, not {self.eval_every}")
        check_val_fraction(self.val_fraction)
        if self.val_fraction is not None and self.val_spec is not None:
            raise BadInput("--val-fraction holds the end of the training data out as "
                           "validation; --val-text, --val-tokens and --val-counts name other "
                           "data: choose one")
        # A resumed run may validate on the part its recorded data held out: checked once
        # the data is read (`require_validation`).
        if self.keep_best and not self.validates and not self.resume:
            raise BadInput(KEEP_BEST_NEEDS_VALIDATION)
        if self.resume and self.overwrite:
            raise BadInput("--resume continues the checkpoint, --overwrite starts again over "
                           "it: choose one")
        if self.new_data and not self.resume:
            raise BadInput("--new-data continues a checkpoint on other data: it needs --resume")
        unknown = sorted(set(self.hyper_changes or ()) - {*HYPER_FIELDS, *SCHEDULE_FIELDS})
        if unknown:
            raise BadInput(f"unknown hyperparameter {unknown[0]!r}; Bob's are "
                           f"{', '.join(HYPER_FIELDS)} (and the schedule's "
                           f"{', '.join(SCHEDULE_FIELDS)})")
        # Every output is checked before any work, so a bad path costs nothing.
        if self.writes_checkpoint:
            check_output_file(self.checkpoint, "checkpoint")
        if self.result_path is not None:
            check_output_file(self.result_path, "result record")
            require_apart(self.result_path, "result record", [(self.checkpoint, "checkpoint")])
        if self.keep_best and self.steps > 0:
            check_output_file(self.best_checkpoint, "best checkpoint")
            require_apart(self.best_checkpoint, "best checkpoint",
                          [(self.checkpoint, "checkpoint")])
            if self.result_path is not None:
                require_apart(self.result_path, "result record",
                              [(self.best_checkpoint, "best checkpoint")])
        require_one_source(self.texts, self.input_record, self.data_spec)
        self._check_shards()
        self._check_inputs_apart()

    def _check_inputs_apart(self) -> None:
        """BadInput when a file this run writes (or, starting again, removes) is one of its
        inputs under any name (a link, a hard link, a directory's file): `--text s.txt -c
        s.txt --overwrite` would replace the text with the checkpoint. Only outputs that
        exist can be inputs, so the inputs are listed only then."""
        outputs = [(path, what) for path, what in self.outputs() if os.path.lexists(path)]
        if not outputs:
            return
        inputs = self._inputs()
        for path, what in outputs:
            require_apart(path, what, inputs)

    def outputs(self) -> list[tuple[str, str]]:
        """(path, what) of every file the run may write, and of the old checkpoint's shard
        files that a new save removes (they are the checkpoint's too)."""
        found = []
        if self.writes_checkpoint:
            found.append((self.checkpoint, "checkpoint"))
            if self.asks_shards:
                found.append((index_path(self.checkpoint), "checkpoint index"))
            # A sharded save (or a one-piece one over a sharded name) removes these; none
            # when there is no sound index under the name.
            found += [(path, "checkpoint") for path in old_shard_files(self.checkpoint)]
        if self.result_path is not None:
            found.append((self.result_path, "result record"))
        if self.keep_best and self.steps > 0:
            found.append((self.best_checkpoint, "best checkpoint"))
        return found

    def _inputs(self) -> list[tuple[str, str]]:
        """(path, what) of every local file the run reads its data from."""
        found = [(path, "text file") for path in local_files(self.texts or ())]
        if self.input_record is not None:
            found.append((self.input_record, "input record"))
        for spec, role in ((self.data_spec, ""), (self.val_spec, "validation ")):
            if spec is None:
                continue
            found += [(path, f"{role}text file") for path in local_files(spec.texts)]
            found += [(path, f"{role}token file") for path in local_files(spec.tokens)]
            if spec.counts is not None:
                found.append((spec.counts, f"{role}counts file"))
        return found

    @property
    def validates(self) -> bool:
        """Whether the request names validation data (a held-out fraction or files)."""
        return self.val_spec is not None or self.val_fraction is not None

    @property
    def names_data(self) -> bool:
        """Whether the request names its training data (else a resumed run reads the data
        its checkpoint recorded, and a fresh one the built-in corpus)."""
        return bool(self.texts) or self.input_record is not None or (
            self.data_spec is not None and self.data_spec.given)

    @property
    def asks_shards(self) -> bool:
        """Whether an option asks for row shards."""
        return any(value is not None for value in (self.shards, self.workers, self.gpus,
                                                   self.device_memory, self.dask_address))

    def _check_shards(self) -> None:
        """The shard options' values, and the options a sharded run does not take."""
        if self.gpus is not None:
            object.__setattr__(self, "gpus", tuple(self.gpus))
        for name in ("shards", "workers", "device_memory"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                flag = "--" + name.replace("_", "-")
                raise BadInput(f"{flag} must be an integer of at least 1, not {value!r}")
        if self.gpus is not None:
            if not self.gpus or any(isinstance(g, bool) or not isinstance(g, int) or g < 0
                                    for g in self.gpus) or len(set(self.gpus)) != len(self.gpus):
                raise BadInput(f"--gpus must list distinct GPU numbers (0,1,...), not "
                               f"{','.join(map(str, self.gpus)) or 'nothing'}")
            if self.workers is not None:
                raise BadInput("--gpus runs a worker per GPU listed; --workers is for the cpu "
                               "backend: choose one")
            if self.backend == "cpu":
                raise BadInput("--gpus runs shards on GPUs; --backend cpu runs none")
        if self.dask_address is not None and (self.workers is not None or self.gpus is not None):
            raise BadInput("--dask runs on a scheduler's own workers; --workers and --gpus "
                           "start a cluster here: choose one")
        if not self.asks_shards:
            return
        refused = (("--schedule fused", self.schedule == "fused"),
                   ("validation data", self.validates),
                   ("--keep-best", self.keep_best), ("--eval-every", self.eval_every is not None),
                   ("--save-every-seconds", self.save_every_seconds is not None),
                   ("--save-every-updates", self.save_every_updates is not None),
                   ("--result", self.result_path is not None),
                   ("--steps 0", self.steps == 0), ("--kernels own", self.kernels == "own"),
                   ("--tables collapsed", self.tables == "collapsed"))
        for option, given in refused:
            if given:
                raise BadInput(f"row shards (--shards, --workers, --gpus, --device-memory, "
                               f"--dask) do not take {option}")

    @property
    def writes_checkpoint(self) -> bool:
        """Whether the run may write its checkpoint (and so holds its lock)."""
        return self.steps > 0 or self.save_start

    @property
    def best_checkpoint(self) -> str:
        return best_checkpoint_path(self.checkpoint)

    @property
    def invocation_updates(self) -> int:
        """Updates of one invocation: -N, or its greatest common divisor with eval_every,
        so that every eval point ends an invocation."""
        if self.eval_every is None:
            return self.updates_per_invocation
        return math.gcd(self.updates_per_invocation, self.eval_every)

    def eval_point(self, done: int) -> bool:
        """Whether the run reports (a line, the validation loss, --keep-best) once `done`
        of its updates are made: every eval_every (else every invocation) and at the end."""
        return done == self.steps or done % (self.eval_every or self.invocation_updates) == 0


def best_checkpoint_path(checkpoint: str) -> str:
    """Where --keep-best saves: beside the checkpoint, `.best` before its extension
    (bob.safetensors: bob.best.safetensors)."""
    stem, extension = os.path.splitext(checkpoint)
    return f"{stem}.best{extension}"


# Roughly what an update costs each backend, for the first invocation's estimate before
# any is measured (the progress lines then measure the run): a fixed part (launches, the
# host's work; 0.1 ms on the cpu at V = 256) and parameter-updates a second (the Numba
# kernels make about 1e8 at V = 2048 on a 2-core machine; the GPUs' figure is well below
# an H200's 1e11 at V = 8192, so as not to promise; nv-sim simulates every launch).
ESTIMATED_UPDATE_SECONDS = {"cpu": 1e-4, "nv-sim": 1e-3, "cuda": 1e-5, "nv": 1e-5}
ESTIMATED_PARAMETER_UPDATES_PER_SECOND = {"cpu": 1.0e8, "nv-sim": 2.0e7, "cuda": 2.0e10,
                                          "nv": 2.0e10}


@dataclass(frozen=True)
class TrainPlan:
    """What a run is about to do, known once its data and starting point are (before its
    backend starts: compiling, the first invocation): `run_training`'s `announce` gets it."""

    backend: str
    vocab: int
    mode: str
    schedule: str
    data: str  # the training data, as the report names it
    first_step: int  # the update count the run starts from
    steps: int  # updates this run makes
    sizes: Sequence[int]  # each invocation's updates

    @property
    def estimate_seconds(self) -> float | None:
        """The first invocation's wall time at the backend's nominal rate (None: unknown)."""
        rate = ESTIMATED_PARAMETER_UPDATES_PER_SECOND.get(self.backend)
        fixed = ESTIMATED_UPDATE_SECONDS.get(self.backend)
        if rate is None or fixed is None or not self.sizes:
            return None
        return self.sizes[0] * (fixed + self.vocab * self.vocab / rate)


@dataclass(frozen=True)
class BestCheckpoint:
    """The checkpoint of the lowest validation loss so far: its file, update and loss,
    and whether this run wrote it (else it is an earlier run's, not beaten)."""

    path: str
    step: int
    val_loss: float
    written: bool = False


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
    best: BestCheckpoint | None = None  # --keep-best's checkpoint
    tables: str = "dense"  # how the run held its tables (bob.host.tables), and why
    tables_reason: str = ""
    # A sharded run's row ranges, in order, and where they ran ("in turn", "on 4 Dask
    # workers"); () for a one-piece run.
    shard_rows: tuple[tuple[int, int], ...] = ()
    shards_ran: str = ""
    # The schedule the run's plans were built with, and why (auto's choice, or asked for).
    schedule: ScheduleChoice = ScheduleChoice("seed", ASKED_FOR)

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
            **({"best_checkpoint": self.best.path, "best_step": self.best.step,
                "best_val_loss": self.best.val_loss} if self.best is not None else {}),
            **({"shards": [list(rows) for rows in self.shard_rows],
                "shards_ran": self.shards_ran} if self.shard_rows else {}),
            "tables": self.tables, "tables_reason": self.tables_reason,
            **self.schedule.to_json(),
            "wall_seconds": self.wall_seconds, "updates_per_second": self.updates_per_second,
        }


def run_one_piece(request: TrainRequest, progress: Progress | None = None,
                  announce: Announce | None = None) -> TrainReport:
    """Train the whole table in one piece for `request.steps` updates, saving the
    checkpoint as `SavePolicy` says (`bob.host.sharded_run.run_training` sends a sharded
    request to the shards instead).

    `announce(plan)` runs once before the backend starts, `progress(invocation, done)`
    after each invocation (the CLI says what the run does, and advances its bar, there).
    One run holds CKPT.lock while it works; a second is refused.
    """
    begun = time.perf_counter()
    _require_checkpoint_as_asked(request)  # before the data, which may take hours to count
    choice = choose_backend(request.backend, arch=request.arch, arena=request.arena,
                            kernels=request.kernels)
    foreseen = _foreseen_config(request, choice)
    if foreseen is not None:  # the data's V and mode are known before it is read
        own_code.require_covered(choice, foreseen)
    data = request_data(request, choice.name)
    validation = data.validation or validation_record(request.val_spec, data.record.vocab)
    if request.keep_best and validation is None:
        raise BadInput(KEEP_BEST_NEEDS_VALIDATION)
    named = named_keys(data.record, validation)
    own_dense = choice.kernels == "own" and request.tables == "auto" \
        and own_code.collapsed_refusal() is not None  # own code lacks the collapsed seed kernels
    layout = choose_tables("dense" if own_dense else request.tables, data.record.vocab,
                           named.size)
    if choice.kernels == "own":  # the plan as the data makes it, before anything is written
        config, _ = run_config(request, data.record, choice, validation,
                               tables=layout.tables)
        own_code.require_covered(choice, config)
    refuse_slow_cpu(choice.name, data.record.vocab, request.steps, layout.tables, named.size)
    lock = (checkpoint_lock(request.checkpoint) if request.writes_checkpoint
            else contextlib.nullcontext())
    with lock:
        start = _starting_point(request, data, layout.tables, named)
        earlier_best = _earlier_best(request)
        if request.writes_checkpoint:
            require_disk_room(request.checkpoint, start.state.file_bytes
                              * (2 if request.keep_best else 1))
        report = _train_from(request, start, data, choice, progress, validation,
                             earlier_best, announce)
    return replace(report, wall_seconds=time.perf_counter() - begun, tables=layout.tables,
                   tables_reason=layout.reason)


def request_data(request: TrainRequest, backend: str, dense: bool = False) -> TrainingData:
    """The data the request trains on: the data it names, or, resuming with none named,
    the data its checkpoint recorded (`Segment.sources`), read again and held to the
    checkpoint's digest; a checkpoint that records none trains on the built-in corpus."""
    def admit(vocab: int) -> None:
        """Before counting, only a run that holds dense tables is refused by V alone (row
        shards, `dense`, or one asked for them)."""
        if dense or request.tables == "dense":
            choose_tables("dense", vocab, 0)
            refuse_slow_cpu(backend, vocab, request.steps)

    recorded = None
    if request.resume and not request.names_data:
        recorded = open_checkpoint(request.checkpoint).state.sources
    if recorded is None:
        return training_data(request.texts, request.input_record, request.data_spec, admit,
                             request.val_fraction)
    if request.new_data:
        raise BadInput("--new-data continues the checkpoint on other data: name it (--text, "
                       "--tokens, --counts or --input)")
    return _recorded_data(request, recorded, admit)


def _recorded_data(request: TrainRequest, recorded: DataSources,
                   admit: Callable[[int], None]) -> TrainingData:
    """The data a checkpoint recorded, read again: refused in one line where it is gone,
    cannot be read again or has changed since."""
    checkpoint, named = request.checkpoint, recorded.describe()
    retrain = "name the data to train on (--text, --tokens, --counts or --input)"
    if not recorded.rereadable:
        raise BadInput(f"{checkpoint}: trained on {named}, which cannot be read again; "
                       f"{retrain}")
    for path in recorded.paths:
        if "://" not in path and not any(c in path for c in "*?[") \
                and not os.path.lexists(path):
            raise BadInput(f"{checkpoint}: trained on {named}, and {path} is gone; {retrain}")
    if request.val_fraction not in (None, recorded.val_fraction):
        held = ("held none of it out" if recorded.val_fraction is None
                else f"held out its last {recorded.val_fraction:g}")
        raise BadInput(f"{checkpoint}: trained on {named} and {held}; --val-fraction "
                       f"{request.val_fraction:g} trains on other data: {retrain}, with "
                       "--new-data")
    texts, input_record, spec = data_given_by(recorded)
    data = training_data(texts, input_record, spec, admit, recorded.val_fraction)
    expected = open_checkpoint(checkpoint).state.data_digest
    if expected and not data.record.digest_matches(expected):
        raise BadInput(f"{checkpoint}: trained on {named}, which has changed since (data "
                       f"{_short(expected)} then, {_short(data.record.data_digest)} now); "
                       f"{retrain}, with --new-data for other data")
    return replace(data, notes=(*data.notes, "the checkpoint's data, unchanged"))


def require_disk_room(path: str, size: int, what: str = "checkpoint") -> None:
    """BadInput, before any work, when the file system of `path` cannot hold a new file of
    `size` bytes (written beside the old, which a rename then replaces)."""
    directory = os.path.dirname(os.path.abspath(write_target(path)))  # a link's target's
    free = shutil.disk_usage(directory).free
    if free < size:
        raise BadInput(f"{path}: the {what} needs {size_text(size)} on disk, "
                       f"{directory} has {size_text(free)} free")


def _require_checkpoint_as_asked(request: TrainRequest) -> None:
    """BadInput unless the checkpoint is there to resume (--resume), or is not there or may
    be started over (--overwrite)."""
    exists = checkpoint_exists(request.checkpoint)
    if request.resume and not exists:
        raise BadInput(f"{request.checkpoint}: no checkpoint to resume from")
    if not request.resume and exists and not request.overwrite:
        raise BadInput(f"{request.checkpoint}: exists; pass --resume to continue it or "
                       "--overwrite to start again")
    if request.resume:
        _require_room_for_steps(request, open_checkpoint(request.checkpoint).state.step)


def _require_room_for_steps(request: TrainRequest, step: int) -> None:
    """BadInput when resuming at `step` would pass the largest step a checkpoint holds."""
    if step + request.steps > MAX_STEP:
        raise BadInput(f"{request.checkpoint}: step {step} + {request.steps} updates is "
                       f"above 2**53 = {MAX_STEP}, the largest step a checkpoint holds")


def _starting_point(request: TrainRequest, data: TrainingData, tables: Tables = "dense",
                    named: np.ndarray | None = None) -> Start:
    """Where the run starts, carrying this run's data and hyperparameters, its tables held
    as `tables` (`named`: the cells the data names): zero tables, or the checkpoint to
    resume (dense: its header read, its tables streamed into the arena; collapsed: in
    host memory), converted exactly where it holds its tables the other way. Row shards
    hold dense tables."""
    if named is None:
        named = data.record.named_keys()
    checkpoint = request.checkpoint
    _require_checkpoint_as_asked(request)  # again, under the lock
    record = data.record
    digest = record.data_digest
    changes = request.hyper_changes or {}
    if not request.resume:
        chosen = replace(request.hyper or Hyper(), **changes)
        state = TrainingState(record.vocab, 0, chosen, record.mode, digest,
                              segments=(Segment(0, digest, chosen, data.sources),),
                              successors=successor_ranges(record), tables=tables)
        return starting_tables(tables, state, named)
    stored = open_checkpoint(checkpoint)
    start = stored.state
    _require_room_for_steps(request, start.step)  # the file under the lock
    if start.vocab != record.vocab:
        raise BadInput(f"{checkpoint}: the checkpoint has V={start.vocab}, the data "
                       f"V={record.vocab}")
    if start.data_digest and not record.digest_matches(start.data_digest) \
            and not request.new_data:
        raise BadInput(f"{checkpoint}: trained on data {_short(start.data_digest)}, this data "
                       f"({data.description}) is {_short(digest)}; pass --new-data to "
                       "continue on other data")
    chosen = replace(request.hyper or start.hyper, **changes)
    return starting_tables(tables, _continued(start, record, chosen, data.sources), named,
                           stored)


def _earlier_best(request: TrainRequest) -> BestCheckpoint | None:
    """The best checkpoint a resumed run must beat (its own last validation loss); an
    existing one is refused without --resume or --overwrite, as the checkpoint is."""
    path = request.best_checkpoint
    if not request.keep_best or request.steps == 0 or not os.path.exists(path):
        return None
    if not request.resume:
        if not request.overwrite:
            raise BadInput(f"{path}: exists; pass --resume to keep it until a lower "
                           "validation loss beats it, or --overwrite to start again")
        return None
    state = open_checkpoint(path).state
    run = open_checkpoint(request.checkpoint).state
    if not _same_run(state, run):
        raise BadInput(f"{path}: another run's best checkpoint (its loss history is not "
                       f"{request.checkpoint}'s); move it away to keep this run's best")
    if not state.val_history or state.val_history[-1][0] != state.step:
        return None  # no validation loss of its own: any eval point beats it
    return BestCheckpoint(path, state.step, state.val_history[-1][1])


def _same_run(best: TrainingState, run: TrainingState) -> bool:
    """Whether `best` is a state `run` passed through: no later, and the same loss history
    before its own update (the best file adds its own update's point)."""
    def before(state: TrainingState) -> list[tuple[int, float]]:
        return [point for point in state.history if point[0] < best.step]

    return best.step <= run.step and before(best) == before(run)


def _short(digest: str) -> str:
    """A digest as messages name it: its first hex digits (past a version prefix)."""
    return digest.rsplit(":", 1)[-1][:12]


def _continued(start: TrainingState, record: InputRecord, hyper: Hyper,
               sources: DataSources | None = None) -> TrainingState:
    """`start` set to train on `record` (given as `sources` say) with `hyper`, a new
    segment where either changed (the same data named by an older form of its digest is
    the same data); the same data given another way is recorded the way it was given
    last, so that a later --resume reads it from there."""
    segments = start.segments or (Segment(0, start.data_digest, start.hyper),)
    now = Segment(start.step, record.data_digest, hyper, sources)
    last = segments[-1]
    same_data = last.data_digest == now.data_digest or (
        bool(last.data_digest) and record.digest_matches(last.data_digest))
    if not (same_data and last.hyper == now.hyper):
        # A segment that never ran an update is replaced, not kept.
        segments = (*segments[:-1], now) if last.first_step == start.step else (*segments, now)
    elif sources is not None and sources != last.sources:
        segments = (*segments[:-1], replace(last, sources=sources))
    return replace(start, hyper=hyper, data_digest=record.data_digest, mode=record.mode,
                   segments=segments, successors=_successors(start, record, segments))


def _successors(start: TrainingState, record: InputRecord,
                segments: tuple[Segment, ...]) -> Ranges | None:
    """The next symbols of all the data the run trains on: this record's where every
    segment's data is this record's, else their union with the checkpoint's (None where
    the checkpoint cannot tell)."""
    now = successor_ranges(record)
    earlier = [s.data_digest for s in segments
               if s.data_digest and s.first_step < start.step]
    if all(record.digest_matches(digest) for digest in earlier):
        return now
    if start.successors is None:
        return None
    either = ranges_mask(start.successors, start.vocab) | ranges_mask(now, record.vocab)
    return symbol_ranges(either)


def run_config(request: TrainRequest, record: InputRecord, choice: BackendChoice,
               validation: InputRecord | None = None, start: TrainingState | None = None,
               tables: str | None = None) -> tuple[BobConfig, ScheduleChoice]:
    """The configuration of a one-piece run's invocations on `choice` (a resolved backend),
    its schedule and submission policy resolved, and why that schedule; its tables those
    of the starting point `start` (else `tables`, else dense)."""
    held = ({"tables": start.tables, "exceptions": start.exceptions} if start is not None
            else {"tables": tables} if tables is not None else {})
    config = BobConfig(vocab=record.vocab, prompts=0,
                       updates=min(request.invocation_updates, max(request.steps, 1)),
                       mode=record.mode, schedule="seed",
                       submission=resolve_submission(request.submission, choice.name),
                       pairs=record.pairs,
                       validation_pairs=0 if validation is None else validation.pairs,
                       **held)  # type: ignore[arg-type]
    schedule = own_code.schedule_for(request.schedule, choice, config)
    return replace(config, schedule=schedule.schedule), schedule


def _foreseen_config(request: TrainRequest, choice: BackendChoice) -> BobConfig | None:
    """The configuration of the run's plan (its schedule resolved) where it follows from the
    request alone, its data unread: texts, token files or the built-in corpus (corpus mode,
    V from the request); None for the data whose V or mode only the data says, or where the
    choice runs NVRTC's code (nothing to hold before the data)."""
    if choice.kernels != "own" or (request.resume and not request.names_data):
        return None
    spec = request.data_spec
    if request.input_record is not None or (spec is not None and spec.counts):
        return None
    if spec is not None and spec.tokens and spec.vocab is None:
        return None  # refused where the data is read: token files need --vocab
    vocab = spec.vocab if spec is not None and spec.vocab is not None else BYTE_VOCAB
    if not MIN_VOCAB <= vocab <= MAX_DENSE_VOCAB:
        return None  # refused where the tables are chosen, in its own words
    config = BobConfig(vocab=vocab, prompts=0,
                       updates=min(request.invocation_updates, max(request.steps, 1)),
                       mode="corpus", submission=resolve_submission(request.submission,
                                                                    choice.name),
                       pairs=1, validation_pairs=int(request.validates),
                       tables="collapsed" if request.tables == "collapsed" else "dense")
    return replace(config,
                   schedule=own_code.schedule_for(request.schedule, choice, config).schedule)


def _train_from(request: TrainRequest, start: StartingPoint, data: TrainingData,
                choice: BackendChoice, progress: Progress | None,
                validation: InputRecord | None,
                earlier_best: BestCheckpoint | None = None,
                announce: Announce | None = None) -> TrainReport:
    steps, checkpoint = request.steps, request.checkpoint
    record = data.record
    # The checkpoint's grain: its histories gain a point, and the save policy may save,
    # every -N updates (and at the end), however often eval points end invocations.
    grain = request.updates_per_invocation
    config, schedule = run_config(request, record, choice, validation, start.state)
    policy = SavePolicy.of(request, start.state.file_bytes)
    # Collapsed tables are O(V + K) bytes: every invocation's come back to the host (a
    # save, a stop, the last shorter invocation start from them), never streamed.
    on_host = start.state.tables == "collapsed"
    streamed = not on_host and start.state.file_bytes > SMALL_CHECKPOINT_BYTES
    sizes = split_sizes(steps, config.updates)
    if announce is not None and steps:
        announce(TrainPlan(choice.name, record.vocab, record.mode, config.schedule,
                           data.shown, start.state.step, steps, sizes))
    # The loss and validation histories so far, each extended by what an invocation adds
    # (only that is checked: a long run's history is not checked again at every step).
    history = History.of(start.state.history)
    val_history = History.of(start.state.val_history)
    written: list[str] = []
    kept = [start.state.step if request.resume else None]  # the step of the checkpoint on disk
    # The last save decided: updates done, when. Periods count from the decision, made as
    # an invocation starts: the save itself lands while later invocations run.
    planned = {"done": 0, "at": time.monotonic()}
    first_initial: list[float] = []  # the first invocation's initial loss
    finals: list[TrainingState] = []  # the last invocation's state, as saved

    decided: dict[int, bool] = {}  # invocation -> whether its end is saved, decided at its start

    def due(index: int, done: int) -> bool:
        """Whether invocation `index`'s end is saved (decided once, as it starts): the
        policy's, the last one's, and the one before a shorter last invocation (its plan is
        another, which starts from the file)."""
        if index not in decided:
            last = index == len(sizes) - 1
            before_change = not last and sizes[index + 1] != sizes[index]
            decided[index] = last or before_change or (done % grain == 0 and policy.due(
                done, planned["done"], time.monotonic() - planned["at"]))
            if decided[index]:
                planned["done"], planned["at"] = done, time.monotonic()
        return decided[index]

    best = [earlier_best]  # the lowest validation loss so far, and its file

    def best_candidate(index: int, done: int) -> bool:
        """Whether invocation `index` ends at an eval point that --keep-best judges (its
        tables wanted in case its validation loss is the lowest)."""
        return request.keep_best and request.eval_point(done)

    def new_best(invocation: Invocation, done: int) -> bool:
        if not best_candidate(len(finals_done), done) or invocation.validation is None:
            return False
        return best[0] is None or invocation.validation[1] < best[0].val_loss

    def best_state(state: TrainingState, invocation: Invocation) -> TrainingState:
        """The best checkpoint's metadata: its histories end at its own update, so a
        resumed run reads the loss to beat from it."""
        assert invocation.validation is not None
        step = state.step
        loss = [] if state.history and state.history[-1][0] == step else [
            (step, invocation.loss)]
        val = [] if state.val_history and state.val_history[-1][0] == step else [
            (step, invocation.validation[1])]
        return replace(state, history=state.history.extended(loss),
                       val_history=state.val_history.extended(val))

    def chose_best(state: TrainingState, invocation: Invocation) -> None:
        assert invocation.validation is not None
        best[0] = BestCheckpoint(request.best_checkpoint, state.step,
                                 invocation.validation[1], written=True)

    # A new run owns the best file beside its checkpoint: an earlier run's is removed as
    # this run first writes the checkpoint (not before: a run that fails first leaves the
    # earlier run's two files as they were), unless this run has written its own there.
    stale_best = [not request.resume]
    best_saved = [False]  # this run wrote the best file

    def saved_best() -> None:
        best_saved[0] = True

    def wrote(state: TrainingState) -> None:
        kept[0] = state.step  # the interrupt message names the checkpoint on disk
        if checkpoint not in written:
            written.append(checkpoint)
            if request.overwrite:  # the one-piece file answers to the name now
                remove_sharded(checkpoint)
        if stale_best[0]:
            stale_best[0] = False
            if not best_saved[0]:
                remove_stale_best(request.best_checkpoint)

    def stream_save(state: TrainingState) -> None:
        """The arena's tables (the last invocation's state) to the checkpoint, streamed."""
        with stops.held():  # a stop waits: the file it names is whole
            state.save(checkpoint, lambda sink, chunk: session.stream_tables(
                state.step, sink, chunk), checked=True)
            wrote(state)

    def after(invocation: Invocation, done: int) -> None:
        nonlocal history, val_history
        assert invocation.state is not None
        if not first_initial:
            first_initial.append(invocation.initial_loss)
        step = invocation.state.step
        # A point at the grain, at the end, and where a stop makes this the last one.
        recorded = done % grain == 0 or done == steps or stops.stop_requested() is not None
        first = [] if history else [(start.state.step, invocation.initial_loss)]
        history = history.extended([*first, *([(step, invocation.loss)] if recorded else [])])
        if invocation.validation is not None:
            begun = [] if val_history else [(start.state.step, invocation.validation[0])]
            val_history = val_history.extended(
                [*begun, *([(step, invocation.validation[1])] if recorded else [])])
        state = replace(invocation.state, history=history, optimum=data.optimum,
                        val_history=val_history)
        finals[:] = [state]
        index = len(finals_done)
        saved, lowest = bool(decided.get(index)), new_best(invocation, done)
        if invocation.checkpoint is not None:  # read back beside the next invocation
            tables = invocation.checkpoint
            last_read[:] = [tables.with_state(state)]
            saving = last_read[0] if saved else None
            better = tables.with_state(best_state(state, invocation)) if lowest else None

            def save() -> None:  # on the writer's thread, while the next invocation runs
                if saving is not None:
                    saving.save(checkpoint)
                    wrote(state)
                if better is not None:
                    better.save(request.best_checkpoint)
                    saved_best()

            if lowest:
                chose_best(state, invocation)
            if saved or lowest:
                # A save of the checkpoint alone replaces one still waiting (the one file);
                # a best checkpoint's save is never dropped.
                writer.submit(save, supersede=not lowest, keep=lowest)
        elif streamed:
            if due(index, done):
                stream_save(state)
            if lowest:
                with stops.held():
                    best_state(state, invocation).save(
                        request.best_checkpoint, lambda sink, chunk: session.stream_tables(
                            state.step, sink, chunk), checked=True)
                    saved_best()
                chose_best(state, invocation)
        finals_done.append(done)
        if progress is not None:
            progress(invocation, done)

    def reload(last: Invocation) -> Start:
        """The shorter last invocation's start: the tables read back, or the file just
        saved (the arena freed)."""
        writer.drain()
        session.release()
        if last_read:
            return last_read[0]
        return StartingPoint(finals[0], open_checkpoint(checkpoint))

    finals_done: list[int] = []  # updates done after each invocation settled so far
    last_read: list = []  # the last invocation's tables read back, with its state
    stopped: int | None = None  # the signal that stopped the run at a boundary
    writer = BackgroundWriter()
    try:
        try:
            with Session(choice, start.state.hyper) as session, stops.finishing():
                if steps == 0:
                    invocation = session.invoke(replace(config, updates=0), start, record,
                                                "predict", validation=validation)
                    initial = final = invocation.initial_loss
                    result = invocation.result
                    if invocation.validation is not None:
                        val_history = val_history.extended(
                            [(start.state.step, invocation.validation[0])])
                    if request.save_start and not request.resume:
                        history = history.extended([(start.state.step, initial)])
                        state = replace(start.state, history=history, optimum=data.optimum,
                                        val_history=val_history)
                        with stops.held():
                            if isinstance(start, StartingPoint):  # dense: zeros streamed
                                state.save(checkpoint, zero_tables(state.table_bytes),
                                           checked=True)
                            else:
                                start.with_state(state).save(checkpoint)
                        wrote(state)
                else:
                    # Only the last invocation is held: a long run keeps no old tables.
                    (last,) = train_invocations(
                        session, config, start, record, steps, after, keep_all=False,
                        validation=validation,
                        tables=lambda index, done: on_host or (not streamed and (
                            due(index, done) | best_candidate(index, done))),
                        holds_state=lambda index, done: streamed and (
                            due(index, done) | best_candidate(index, done)),
                        stop=lambda: stops.stop_requested() is not None, reload=reload)
                    initial, final = first_initial[0], last.loss
                    result = last.result
                    writer.drain()
                    if finals and kept[0] != finals[0].step:  # stopped before its save
                        if last_read and last_read[0].state.step == finals[0].step:
                            with stops.held():
                                last_read[0].save(checkpoint)
                                wrote(finals[0])
                        else:
                            stream_save(finals[0])
                    stopped = stops.stop_requested()
        finally:
            # Every checkpoint handed over is written before anything is reported (a stop
            # waits for the save in flight: the file it names is whole).
            with stops.held():
                writer.close()
        if best[0] is not None and best[0].written:
            written.append(best[0].path)
        if request.result_path is not None and result is not None:
            result.write(request.result_path)
            written.append(request.result_path)
    except KeyboardInterrupt as stop:
        raise _interrupted(stop, start.state.step, steps, config.updates, kept[0]) from None
    if stopped is not None:  # the invocation in flight was finished and saved
        raise Interrupted(stopped, f"interrupted at update {finals[0].step}; checkpoint at "
                                   f"update {kept[0]} kept")
    return TrainReport(
        checkpoint=checkpoint, backend=choice.name, data=data.shown,
        mode=record.mode, steps=steps, global_step=start.state.step + steps,
        initial_loss=initial, loss=final, optimum=data.optimum, history=history,
        last_result=result, written=tuple(written), segments=start.state.segments,
        val_loss=val_history[-1][1] if val_history else None,
        val_history=val_history, best=best[0], schedule=schedule,
    )


def remove_stale_best(path: str) -> None:
    """Remove an earlier run's best checkpoint (the run holds the lock of the checkpoint
    beside it); one already gone is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def zero_tables(table_bytes: int) -> TableDelivery:
    """A save's delivery of three zero tables, a piece at a time (no table in memory)."""
    def deliver(sink: TableSink, chunk_bytes: int) -> None:
        zeros = memoryview(bytes(min(chunk_bytes, table_bytes)))
        for name in CHECKPOINT_TENSORS:
            for offset in range(0, table_bytes, chunk_bytes):
                sink(name, offset, zeros[:min(chunk_bytes, table_bytes - offset)])
    return deliver


def split_sizes(steps: int, per_invocation: int) -> Sequence[int]:
    """Each invocation's updates (as `bob.host.session.train` splits a run)."""
    from bob.host.session import split_updates

    return split_updates(steps, max(1, per_invocation))


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
# A collapsed table's update costs about this many dense parameter-updates a row (its
# 256 lanes' replay and tree) and a class (exp2, the gradient and AdamW).
COLLAPSED_WORK_PER_ROW = 512
COLLAPSED_WORK_PER_CLASS = 8


def refuse_slow_cpu(backend: str, vocab: int, steps: int, tables: str = "dense",
                    named: int = 0) -> None:
    """BadInput when training V x V (or V + K classes collapsed) on the CPU needs more
    memory than Bob allows it, or `steps` updates would take over an hour."""
    if backend != "cpu":
        return
    if tables == "dense" and vocab > CPU_MAX_VOCAB:
        gib = CPU_TABLES_IN_MEMORY * 4 * vocab * vocab / 2**30
        raise BadInput(f"V={vocab} is above the largest dense table the CPU backend trains "
                       f"(V={CPU_MAX_VOCAB}): it would hold about {gib:.1f} GiB in host "
                       f"memory; train on a GPU (--backend cuda) or with --tables collapsed")
    work = (vocab * vocab if tables == "dense"
            else COLLAPSED_WORK_PER_ROW * vocab + COLLAPSED_WORK_PER_CLASS * (vocab + named))
    seconds = work * steps / CPU_PARAMETER_UPDATES_PER_SECOND
    if seconds > CPU_MAX_SECONDS:
        raise BadInput(f"V={vocab} for {steps} updates on the CPU backend would take about "
                       f"{seconds / 3600:.1f} hours; train on a GPU (--backend cuda) or make "
                       f"fewer --steps")
