"""Bob's Python API: the same verbs as the command line.

    >>> from bob.host import api
    >>> report = api.train(steps=200, checkpoint="bob.safetensors", backend="cpu")
    >>> api.generate("bob.safetensors", b"def ", length=40)
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from bob.backends import choose_backend
from bob.config import ARENA_KINDS, DEFAULT_SUBMISSION_POLICY, DEFAULT_TARGET, Hyper
from bob.errors import BadInput
from bob.host import sampling
from bob.host.session import Invocation, Session
from bob.host.session import train as train_invocations
from bob.program.bob import BobConfig
from bob.records import corpus
from bob.records.binary import InputRecord, ResultRecord
from bob.records.checkpoint import Checkpoint

DEFAULT_CHECKPOINT = "bob.safetensors"
DEFAULT_UPDATES_PER_INVOCATION = 100


@dataclass(frozen=True)
class TrainingData:
    record: InputRecord
    counts: np.ndarray | None  # corpus mode: transition counts
    description: str

    @property
    def optimum(self) -> float | None:
        return None if self.counts is None else corpus.optimum(self.counts)


def training_data(texts: Sequence[str] | None = None, input_record: str | None = None,
                  ) -> TrainingData:
    """The training data: text files (corpus mode), an input record, or the built-in corpus."""
    if input_record is not None:
        if texts:
            raise BadInput("give either texts or an input_record, not both")
        record = InputRecord.read(input_record)
        counts = None
        return TrainingData(replace_prompts(record, ()), counts, input_record)
    if texts:
        counts = corpus.counts_from_files(texts)
        description = ", ".join(texts)
    else:
        counts = corpus.counts_from_bytes(corpus.builtin_corpus(), "the built-in corpus")
        description = "the built-in corpus (CPython's pydoc topics)"
    record = InputRecord.corpus(corpus.weights(counts), (), source=description)
    return TrainingData(record, counts, description)


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
            "checkpoint": self.checkpoint, "backend": self.backend, "mode": self.mode,
            "data": self.data,
        }


def train(texts: Sequence[str] | None = None, steps: int = 1000,
          checkpoint: str = DEFAULT_CHECKPOINT, resume: bool = False, backend: str = "auto",
          hyper: Hyper | None = None, updates_per_invocation: int = DEFAULT_UPDATES_PER_INVOCATION,
          input_record: str | None = None, overwrite: bool = False, arch: str = DEFAULT_TARGET,
          arena: str = ARENA_KINDS[0], result_path: str | None = None, schedule: str = "seed",
          progress: Callable[[Invocation, int], None] | None = None,
          submission: str = DEFAULT_SUBMISSION_POLICY) -> TrainReport:
    """Train for `steps` updates, saving the checkpoint after every invocation.

    `schedule` "fused" runs the fused kernel: the same bytes as "seed", faster.
    `submission` "chained" links each invocation's launches in the command stream.
    """
    if steps < 0:
        raise BadInput(f"steps must be >= 0, not {steps}")
    if updates_per_invocation < 1:
        raise BadInput(f"updates_per_invocation must be at least 1, not {updates_per_invocation}")
    data = training_data(texts, input_record)
    exists = os.path.exists(checkpoint)
    if resume:
        if not exists:
            raise BadInput(f"{checkpoint}: no checkpoint to resume from")
        start = Checkpoint.load(checkpoint)
        if hyper is not None and hyper != start.hyper:
            start = replace(start, hyper=hyper)
        if start.vocab != data.record.vocab:
            raise BadInput(f"{checkpoint}: the checkpoint has V={start.vocab}, the data "
                           f"V={data.record.vocab}")
    else:
        if exists and not overwrite:
            raise BadInput(f"{checkpoint}: exists; resume it to continue its run, or "
                           "overwrite it to start again")
        start = Checkpoint.zeros(data.record.vocab, hyper or Hyper(), data.record.mode,
                                 data_digest=data.record.data_digest)
    hyper = start.hyper
    config = BobConfig(vocab=data.record.vocab, prompts=0,
                       updates=min(updates_per_invocation, max(steps, 1)),
                       mode=data.record.mode, schedule=schedule,  # type: ignore[arg-type]
                       submission=submission)  # type: ignore[arg-type]
    history = list(start.history)

    def after(invocation: Invocation, done: int) -> None:
        if not history:
            history.append((start.step, invocation.initial_loss))
        history.append((invocation.checkpoint.step, invocation.loss))
        replace(invocation.checkpoint.with_history(tuple(history)),
                optimum=data.optimum).save(checkpoint)
        if progress is not None:
            progress(invocation, done)

    choice = choose_backend(backend, arch=arch, arena=arena)
    with Session(choice, hyper) as session:
        if steps == 0:
            invocation = session.invoke(config, start, data.record, "predict")
            initial = final = invocation.initial_loss
            result = invocation.result
        else:
            invocations = train_invocations(session, config, start, data.record, steps, after)
            initial, final = invocations[0].initial_loss, invocations[-1].loss
            result = invocations[-1].result
    if result_path is not None and result is not None:
        result.write(result_path)
    return TrainReport(
        checkpoint=checkpoint, backend=choice.name, data=data.description,
        mode=data.record.mode, steps=steps, global_step=start.step + steps,
        initial_loss=initial, loss=final, optimum=data.optimum, history=tuple(history),
        last_result=result,
    )


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
    config = BobConfig(vocab=checkpoint.vocab, prompts=len(prompts), updates=0, mode=record.mode)
    with Session(choose_backend(backend, arch=arch), checkpoint.hyper) as session:
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
             seed: int = 0, backend: str = "auto") -> bytes:
    """Continue `prompt` by `length` bytes, greedily or sampled with `seed`."""
    if not prompt:
        raise BadInput("the prompt must have at least one byte")
    if length < 0:
        raise BadInput(f"length must be >= 0, not {length}")
    if not math.isfinite(temperature) or temperature < 0:
        raise BadInput(f"temperature must be a finite number >= 0, not {temperature}")
    state = Checkpoint.load(checkpoint)
    _require_bytes(state, checkpoint)
    # Every row at once: one forward invocation with all 256 bytes as prompts.
    result = _forward(state, range(state.vocab), backend)
    return sampling.generate(result.logit_rows, result.predictions, prompt, length,
                             temperature, seed)


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


def evaluate(checkpoint: str, texts: Sequence[str], backend: str = "auto") -> EvalReport:
    """The model's loss on text files, beside the best any bigram table could reach."""
    state = Checkpoint.load(checkpoint)
    _require_bytes(state, checkpoint)
    counts = corpus.counts_from_files(texts)
    record = InputRecord.corpus(corpus.weights(counts), (), source=", ".join(texts))
    result = _forward(state, (), backend, record=record)
    return EvalReport(checkpoint, ", ".join(texts), int(counts.sum()),
                      result.initial_objective, corpus.optimum(counts))
