"""Bob's Python API: the same verbs as the command line.

    >>> from bob.host import api
    >>> report = api.train(steps=200, checkpoint="bob.safetensors", backend="cpu")
    >>> api.generate("bob.safetensors", b"def ", length=40)
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bob.backends import BackendChoice, choose_backend
from bob.config import (
    ARENA_KINDS,
    AUTO_SUBMISSION,
    DEFAULT_SUBMISSION_POLICY,
    DEFAULT_TARGET,
    MAX_VOCAB,
    SCHEDULES,
    SUBMISSION_CHOICES,
    Hyper,
    resolve_submission,
)
from bob.errors import BadInput, Interrupted
from bob.host import sampling, stops
from bob.host.session import Invocation, Session
from bob.host.session import train as train_invocations
from bob.host.writer import BackgroundWriter
from bob.program.bob import BobConfig
from bob.records import corpus, counting, sources
from bob.records.binary import InputRecord, ResultRecord
from bob.records.checkpoint import HYPER_FIELDS, Checkpoint, History, Segment, checkpoint_lock
from bob.records.countsfile import CountsFile, table_weights

DEFAULT_CHECKPOINT = "bob.safetensors"
DEFAULT_UPDATES_PER_INVOCATION = 100
STDIN = "-"  # a --text of "-" reads standard input


@dataclass(frozen=True)
class TrainingData:
    record: InputRecord
    counts: np.ndarray | None  # corpus mode: transition counts
    description: str
    known_optimum: float | None = None  # from a counts file or the counting engine

    @property
    def optimum(self) -> float | None:
        if self.known_optimum is not None:
            return self.known_optimum
        return None if self.counts is None else corpus.optimum(self.counts)


@dataclass(frozen=True)
class CorpusSpec:
    """Where corpus-mode data comes from: text files, token files, or a counts file."""

    texts: tuple[str, ...] = ()  # files, directories, globs, URLs, "-"
    tokens: tuple[str, ...] = ()  # token files (raw uint16/uint32 or .npy)
    counts: str | None = None  # a counts file written by `bob count`
    vocab: int | None = None  # V of token files (texts: 256 unless given)
    token_dtype: str = "uint16"

    @property
    def given(self) -> bool:
        return bool(self.texts or self.tokens or self.counts)


def count_corpus(spec: CorpusSpec, workers: int | None = None,
                 progress: counting.Progress | None = None, dask: str | None = None,
                 dask_workers: int = 2) -> CountsFile:
    """Count the spec's inputs (or load its counts file): counts, sources, digest, optimum.

    `dask` None counts here on all cores; "local" on a LocalCluster; else the
    scheduler at that address.
    """
    kinds = sum(1 for part in (spec.texts, spec.tokens, spec.counts) if part)
    if kinds != 1:
        raise BadInput("give one kind of data: text inputs, --tokens files or --counts")
    if spec.counts:
        loaded = CountsFile.load(spec.counts)
        if spec.vocab is not None and spec.vocab != loaded.vocab:
            raise BadInput(f"{spec.counts}: V={loaded.vocab}, not --vocab {spec.vocab}")
        return loaded
    if spec.tokens and spec.vocab is None:
        raise BadInput("--tokens needs --vocab V (the tokenizer's vocabulary size)")
    vocab = spec.vocab if spec.vocab is not None else corpus.BYTE_VOCAB
    found = sources.resolve(spec.texts or spec.tokens,
                            spec.token_dtype if spec.tokens else None)
    seen = [0]  # bytes counted: standard input's size is known only afterwards

    def tracking(done: int) -> None:
        seen[0] += done
        if progress is not None:
            progress(done)

    if dask is None:
        counts = counting.count_sources(found, vocab, workers, progress=tracking)
    else:
        from bob.records.dask_count import count_on_dask
        counts = count_on_dask(found, vocab, None if dask == "local" else dask,
                               workers=dask_workers, progress=tracking)
    stdin_bytes = seen[0] - sum(s.tokens * s.itemsize for s in found if not s.is_stdin)
    return CountsFile.of(counts, [(s.name, stdin_bytes if s.is_stdin else s.size)
                                  for s in found])


def corpus_record(counted: CountsFile, description: str) -> InputRecord:
    """The corpus-mode input record of counts the device table can hold."""
    if counted.vocab > MAX_VOCAB:
        raise BadInput(f"{description}: V={counted.vocab} is above the largest table Bob "
                       f"trains (V={MAX_VOCAB})")
    return InputRecord.corpus(table_weights(counted.counts), (), source=description)


def training_data(texts: Sequence[str] | None = None, input_record: str | None = None,
                  spec: CorpusSpec | None = None,
                  admit: Callable[[int], None] | None = None) -> TrainingData:
    """The training data: text files (corpus mode), an input record, or the built-in corpus.

    `admit(V)` runs once V is known from counts, before their V x V weights are built
    (10 GiB at V = 50257): a refusal there costs nothing.
    """
    admit = admit or (lambda vocab: None)
    if spec is not None and spec.given:
        if input_record is not None or texts:
            raise BadInput("give either --text files or an --input record, not both")
        if spec.vocab is not None:
            admit(spec.vocab)  # token files: refused before they are counted
        counted = count_corpus(spec)
        admit(counted.vocab)
        record = corpus_record(counted, counted.name)
        return TrainingData(record, None, counted.name, known_optimum=counted.optimum)
    if input_record is not None:
        if texts:
            raise BadInput("give either texts or an input_record, not both")
        record = InputRecord.read(input_record)
        counts = None
        return TrainingData(replace_prompts(record, ()), counts, input_record)
    if texts:
        # The streamed, parallel engine: directories, globs and URLs work here too.
        counted = count_corpus(CorpusSpec(texts=tuple(texts)))
        admit(counted.vocab)
        name = ", ".join("stdin" if t == STDIN else t for t in texts)
        record = corpus_record(counted, name)
        return TrainingData(record, None, name, known_optimum=counted.optimum)
    else:
        counts = corpus.counts_from_bytes(corpus.builtin_corpus(), "the built-in corpus")
        description = "the built-in corpus (CPython's pydoc topics)"
    record = InputRecord.corpus(corpus.weights(counts), (), source=description)
    return TrainingData(record, counts, description)


def text_counts(texts: Sequence[str]) -> np.ndarray:
    """Transition counts of text files, "-" meaning standard input (read once)."""
    files = [t for t in texts if t != STDIN]
    counts = corpus.counts_from_files(files) if files else None
    if STDIN in texts:
        # Pairs never cross texts, so the counts of each text add up.
        piped = corpus.counts_from_bytes(sys.stdin.buffer.read(), "stdin")
        counts = piped if counts is None else counts + piped
    return counts


def replace_prompts(record: InputRecord, prompts: Sequence[int]) -> InputRecord:
    prompts_array = np.asarray(prompts, dtype=np.uint32)
    if record.mode == "hard":
        return InputRecord(mode="hard", vocab=record.vocab, targets=record.targets,
                           prompts=prompts_array, source=record.source)
    return InputRecord(mode="corpus", vocab=record.vocab, weights=record.weights,
                       prompts=prompts_array, source=record.source)


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
    wall_seconds: float = 0.0  # api.train from call to return: data, backend, updates, saves

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


def train(texts: Sequence[str] | None = None, steps: int = 1000,
          checkpoint: str = DEFAULT_CHECKPOINT, resume: bool = False, backend: str = "auto",
          hyper: Hyper | None = None, updates_per_invocation: int = DEFAULT_UPDATES_PER_INVOCATION,
          input_record: str | None = None, overwrite: bool = False, arch: str = DEFAULT_TARGET,
          arena: str = ARENA_KINDS[0], result_path: str | None = None, schedule: str = "seed",
          progress: Callable[[Invocation, int], None] | None = None,
          hyper_changes: Mapping[str, float] | None = None,
          new_data: bool = False,
          data_spec: CorpusSpec | None = None, val_spec: CorpusSpec | None = None,
          submission: str = AUTO_SUBMISSION) -> TrainReport:
    """Train for `steps` updates, saving the checkpoint after every invocation.

    `schedule` "fused" runs the fused kernel: the same bytes as "seed", faster.
    Hyperparameters: `hyper` in full, or `hyper_changes` (the fields the user
    stated) over the checkpoint's own on --resume, else over the defaults.
    A resumed run must train on the checkpoint's data unless `new_data` says
    the data changes on purpose (a new segment records where).
    `submission` "chained" links each invocation's launches in the command stream;
    "auto" is chained on nv and nv-sim, per-launch elsewhere (config.resolve_submission).
    One run holds CKPT.lock while it works; a second is refused.
    """
    begun = time.perf_counter()
    report = _train(texts, steps, checkpoint, resume, backend, hyper, updates_per_invocation,
                    input_record, overwrite, arch, arena, result_path, schedule, progress,
                    hyper_changes, new_data, data_spec, val_spec, submission)
    return replace(report, wall_seconds=time.perf_counter() - begun)


def _train(texts: Sequence[str] | None, steps: int, checkpoint: str, resume: bool, backend: str,
           hyper: Hyper | None, updates_per_invocation: int, input_record: str | None,
           overwrite: bool, arch: str, arena: str, result_path: str | None, schedule: str,
           progress: Callable[[Invocation, int], None] | None,
           hyper_changes: Mapping[str, float] | None, new_data: bool,
           data_spec: CorpusSpec | None, val_spec: CorpusSpec | None,
           submission: str) -> TrainReport:
    if steps < 0:
        raise BadInput(f"steps must be >= 0, not {steps}")
    if updates_per_invocation < 1:
        raise BadInput(f"updates_per_invocation must be at least 1, not {updates_per_invocation}")
    if schedule not in SCHEDULES:
        raise BadInput(f"schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    if submission not in SUBMISSION_CHOICES:
        raise BadInput(f"submission must be one of {', '.join(SUBMISSION_CHOICES)}, not "
                       f"{submission!r}")
    if new_data and not resume:
        raise BadInput("--new-data continues a checkpoint on other data: it needs --resume")
    _check_hyper_changes(hyper_changes)
    # Every output is checked before any work, so a bad path costs nothing.
    if steps > 0:
        check_output_file(checkpoint, "checkpoint")
    if result_path is not None:
        check_output_file(result_path, "result record")
    choice = choose_backend(backend, arch=arch, arena=arena)
    data = training_data(texts, input_record, data_spec,
                         admit=lambda vocab: refuse_slow_cpu(choice.name, vocab, steps))
    validation = validation_record(val_spec, data.record.vocab)
    with checkpoint_lock(checkpoint) if steps > 0 else contextlib.nullcontext():
        start = _starting_point(checkpoint, data, resume, overwrite, new_data, hyper,
                                hyper_changes)
        return _train_from(start, data, steps, checkpoint, resume, choice,
                           updates_per_invocation, result_path, schedule, progress,
                           validation, resolve_submission(submission, choice.name))


def check_output_file(path: str, what: str) -> None:
    """BadInput unless `path` can be written as a file (its directory exists, writable)."""
    target = Path(path)
    directory = target.parent
    if not directory.is_dir():
        raise BadInput(f"{path}: directory {directory} does not exist (the {what} goes there)")
    if target.is_dir():
        raise BadInput(f"{path}: is a directory, not a {what} file")
    probe_directory(directory, f"{path}: cannot write the {what} in {directory}")


def probe_directory(directory: str | Path, failure: str) -> None:
    """Create and remove a file in `directory`: the only sure test that writing works there
    (permissions, read-only mounts, /proc and the like); BadInput `failure (reason)` if not."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".bob-probe-"):
            pass
    except OSError as error:
        raise BadInput(f"{failure} ({error.strerror or error})") from None


def _check_hyper_changes(changes: Mapping[str, float] | None) -> None:
    unknown = sorted(set(changes or ()) - set(HYPER_FIELDS))
    if unknown:
        raise BadInput(f"unknown hyperparameter {unknown[0]!r}; Bob's are "
                       f"{', '.join(HYPER_FIELDS)}")


def _starting_point(checkpoint: str, data: TrainingData, resume: bool, overwrite: bool,
                    new_data: bool, hyper: Hyper | None,
                    hyper_changes: Mapping[str, float] | None) -> Checkpoint:
    """The checkpoint the run starts from, carrying this run's data and hyperparameters."""
    exists = os.path.exists(checkpoint)
    digest = data.record.data_digest
    if not resume:
        if exists and not overwrite:
            raise BadInput(f"{checkpoint}: exists; pass --resume to continue it or --overwrite "
                           "to start again")
        chosen = replace(hyper or Hyper(), **(hyper_changes or {}))
        return Checkpoint.zeros(data.record.vocab, chosen, data.record.mode, data_digest=digest,
                                ).with_segments((Segment(0, digest, chosen),))
    if not exists:
        raise BadInput(f"{checkpoint}: no checkpoint to resume from")
    start = Checkpoint.load(checkpoint)
    if start.vocab != data.record.vocab:
        raise BadInput(f"{checkpoint}: the checkpoint has V={start.vocab}, the data "
                       f"V={data.record.vocab}")
    if start.data_digest and start.data_digest != digest and not new_data:
        raise BadInput(f"{checkpoint}: trained on data {start.data_digest[:12]}, this data "
                       f"({data.description}) is {digest[:12]}; pass --new-data to continue "
                       "on other data")
    chosen = replace(hyper or start.hyper, **(hyper_changes or {}))
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


def _train_from(start: Checkpoint, data: TrainingData, steps: int, checkpoint: str,
                resume: bool, choice: BackendChoice, updates_per_invocation: int,
                result_path: str | None, schedule: str,
                progress: Callable[[Invocation, int], None] | None,
                validation: InputRecord | None = None,
                submission: str = DEFAULT_SUBMISSION_POLICY) -> TrainReport:
    config = BobConfig(vocab=data.record.vocab, prompts=0,
                       updates=min(updates_per_invocation, max(steps, 1)),
                       mode=data.record.mode, schedule=schedule,  # type: ignore[arg-type]
                       submission=submission)  # type: ignore[arg-type]
    # The loss and validation histories so far, each extended by what an invocation adds
    # (only that is checked: a long run's history is not checked again at every step).
    history = History.of(start.history)
    val_history = History.of(start.val_history)
    written: list[str] = []
    kept = [start.step if resume else None]  # the step of the checkpoint on disk

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
        if result_path is not None and result is not None:
            result.write(result_path)
            written.append(result_path)
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
# reference kernels' seed schedule at V=256 (the slowest path) runs about 340 us per
# update on this 2-core machine, 1.9e8; the Numba kernels are 4-8x faster. Beyond an
# hour of that, a run belongs on a GPU.
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


def validation_record(spec: CorpusSpec | None, vocab: int) -> InputRecord | None:
    """The validation data's corpus record (--val, --val-tokens, --val-counts), or None."""
    if spec is None or not spec.given:
        return None
    counted = count_corpus(replace(spec, vocab=spec.vocab or (None if spec.counts else vocab)))
    if counted.vocab != vocab:
        raise BadInput(f"{counted.name}: validation data has V={counted.vocab}, the model "
                       f"V={vocab}")
    return corpus_record(counted, counted.name)


def validation_loss(session: Session, state: Checkpoint, record: InputRecord) -> float:
    """The model's exact loss on the record: one forward invocation, as `bob eval` runs it."""
    config = BobConfig(vocab=state.vocab, prompts=0, updates=0, mode="corpus",
                       submission=resolve_submission(AUTO_SUBMISSION, session.choice.name))
    return session.invoke(config, state, record, "predict").initial_loss


def _forward(checkpoint: Checkpoint, prompts: Sequence[int], backend: str,
             arch: str = DEFAULT_TARGET,
             record: InputRecord | None = None) -> ResultRecord:
    """One forward invocation: the prompts' logit rows and greedy predictions."""
    if record is None:
        # Prediction needs no targets; the loss block of this request is not reported.
        record = InputRecord.hard(np.zeros(checkpoint.vocab, np.uint32), prompts,
                                  source="prompts")
    else:
        record = replace_prompts(record, prompts)
    choice = choose_backend(backend, arch=arch)
    config = BobConfig(vocab=checkpoint.vocab, prompts=len(prompts), updates=0, mode=record.mode,
                       submission=resolve_submission(AUTO_SUBMISSION, choice.name))
    with Session(choice, checkpoint.hyper) as session:
        return session.invoke(config, checkpoint, record, "predict").result


def predict(checkpoint: str, prompts: Sequence[bytes], backend: str = "auto",
            ) -> list[tuple[bytes, int, np.ndarray]]:
    """For each prompt: the prompt, the predicted next byte and its row of logits."""
    if not prompts:
        raise BadInput("give at least one prompt")
    if any(len(p) == 0 for p in prompts):
        raise BadInput("a prompt must have at least one byte")
    state = Checkpoint.load(checkpoint)
    _require_bytes(state, checkpoint)
    result = _forward(state, [p[-1] for p in prompts], backend)
    return [(p, int(result.predictions[i]), result.logit_rows[i])
            for i, p in enumerate(prompts)]


def _require_bytes(state: Checkpoint, path: str) -> None:
    if state.vocab != 256:
        raise BadInput(f"{path}: V={state.vocab}; text needs a byte table (V=256)")


def generate(checkpoint: str, prompt: bytes, length: int, temperature: float = 0.0,
             seed: int = 0, backend: str = "auto", top_k: int | None = None) -> bytes:
    """Continue `prompt` by `length` bytes, greedily or sampled with `seed` (from the
    `top_k` most likely bytes only, when given)."""
    if not prompt:
        raise BadInput("the prompt must have at least one byte")
    if length < 0:
        raise BadInput(f"length must be >= 0, not {length}")
    if not math.isfinite(temperature) or temperature < 0:
        raise BadInput(f"--temperature must be a finite number >= 0, not {temperature}")
    if top_k is not None and top_k < 1:
        raise BadInput(f"--top-k must be at least 1, not {top_k}")
    state = Checkpoint.load(checkpoint)
    _require_bytes(state, checkpoint)
    # Every row at once: one forward invocation with all 256 bytes as prompts.
    result = _forward(state, range(state.vocab), backend)
    return sampling.generate(result.logit_rows, result.predictions, prompt, length,
                             temperature, seed, top_k)


@dataclass(frozen=True)
class EvalReport:
    checkpoint: str
    text: str
    transitions: int
    nats: float  # mean negative log-likelihood per transition
    optimum: float

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2)

    def to_json(self) -> dict:
        return {"checkpoint": self.checkpoint, "text": self.text,
                "transitions": self.transitions, "nats_per_transition": self.nats,
                "bits_per_byte": self.bits_per_byte, "optimum": self.optimum,
                "optimum_bits_per_byte": self.optimum / math.log(2),
                "loss": self.nats}


def evaluate(checkpoint: str, texts: Sequence[str], backend: str = "auto",
             spec: CorpusSpec | None = None) -> EvalReport:
    """The model's loss on text files (or tokens, or a counts file), beside the optimum."""
    state = Checkpoint.load(checkpoint)
    if spec is None or not spec.given:
        _require_bytes(state, checkpoint)
        spec = CorpusSpec(texts=tuple(texts))
    elif texts:
        raise BadInput("give one kind of data: text inputs, --tokens files or --counts")
    vocab = spec.vocab or (None if spec.counts else state.vocab)
    counted = count_corpus(replace(spec, vocab=vocab))
    if counted.vocab != state.vocab:
        raise BadInput(f"{counted.name}: V={counted.vocab}, the checkpoint V={state.vocab}")
    record = corpus_record(counted, counted.name)
    with Session(choose_backend(backend), state.hyper) as session:
        loss = validation_loss(session, state, record)
    return EvalReport(checkpoint, counted.name, counted.transitions, loss, counted.optimum)


@dataclass(frozen=True)
class CountReport:
    out: str
    vocab: int
    sparse: bool
    files: int
    bytes: int
    transitions: int
    optimum: float
    digest: str
    seconds: float
    where: str  # "this machine (N threads at most)" or the Dask cluster

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else float("inf")

    def to_json(self) -> dict:
        return {"counts": self.out, "vocab": self.vocab,
                "layout": "sparse" if self.sparse else "dense", "files": self.files,
                "bytes": self.bytes, "transitions": self.transitions,
                "optimum": self.optimum, "digest": self.digest, "seconds": self.seconds,
                "bytes_per_second": self.bytes_per_second, "where": self.where}


def count(spec: CorpusSpec, out: str, overwrite: bool = False, workers: int | None = None,
          dask: str | None = None, dask_workers: int = 2,
          progress: counting.Progress | None = None) -> CountReport:
    """Count a corpus into a counts file (`bob count`)."""
    if spec.counts:
        raise BadInput("bob count reads text or token files, not a counts file")
    if os.path.exists(out) and not overwrite:
        raise BadInput(f"{out}: exists; pass --overwrite to replace it")
    if workers is not None and workers < 1:
        raise BadInput(f"--workers must be >= 1, not {workers}")
    begun = time.perf_counter()
    counted = count_corpus(spec, workers, progress, dask, dask_workers)
    seconds = time.perf_counter() - begun
    counted.save(out)
    if dask is None:
        where = f"this machine ({workers or counting.default_workers()} threads at most)"
    else:
        where = f"Dask LocalCluster ({dask_workers} workers)" if dask == "local" else dask
    return CountReport(out, counted.vocab, counted.counts.is_sparse, len(counted.sources),
                       sum(size for _, size in counted.sources), counted.transitions,
                       counted.optimum, counted.digest, seconds, where)


def _require_tokens(state: Checkpoint, path: str, ids: Sequence[int]) -> list[int]:
    ids = [int(i) for i in ids]
    if not ids:
        raise BadInput("a prompt needs at least one token id")
    bad = [i for i in ids if not 0 <= i < state.vocab]
    if bad:
        raise BadInput(f"{path}: token id {bad[0]} is not in [0, V={state.vocab})")
    return ids


def predict_ids(checkpoint: str, prompts: Sequence[Sequence[int]], backend: str = "auto",
                ) -> list[tuple[list[int], int, float]]:
    """Token checkpoints: for each prompt of ids, the predicted next id and its logit."""
    if not prompts:
        raise BadInput("give at least one prompt")
    state = Checkpoint.load(checkpoint)
    prompts = [_require_tokens(state, checkpoint, p) for p in prompts]
    result = _forward(state, [p[-1] for p in prompts], backend)
    return [(p, int(result.predictions[i]), float(result.logit_rows[i][result.predictions[i]]))
            for i, p in enumerate(prompts)]


def generate_ids(checkpoint: str, prompt: Sequence[int], length: int, temperature: float = 0.0,
                 seed: int = 0, backend: str = "auto") -> list[int]:
    """Token checkpoints: continue the ids by `length` ids, as `generate` does bytes."""
    if length < 0:
        raise BadInput(f"--length must be >= 0, not {length}")
    if not math.isfinite(temperature) or temperature < 0:
        raise BadInput(f"--temperature must be a finite number >= 0, not {temperature}")
    state = Checkpoint.load(checkpoint)
    last = _require_tokens(state, checkpoint, prompt)[-1]
    rows: dict[int, tuple[np.ndarray, int]] = {}

    def row(token: int) -> tuple[np.ndarray, int]:
        # One forward invocation per row first needed: P is at most MAX_PROMPTS, V may exceed it.
        if token not in rows:
            result = _forward(state, [token], backend)
            rows[token] = (result.logit_rows[0], int(result.predictions[0]))
        return rows[token]

    out = []
    for position in range(length):
        logits, greedy = row(last)
        if temperature == 0:
            last = greedy
        else:
            last = sampling.sample_row(logits, temperature, sampling.uniform(seed, position))
        out.append(last)
    return out
