"""The trained table at work: predictions, generated text, the loss on data.

    >>> from bob.host import inference
    >>> inference.predict("bob.safetensors", [b"def"])  # bob predict def
    >>> inference.generate("bob.safetensors", b"def ", length=40)  # bob generate -p "def "
    >>> inference.evaluate("bob.safetensors", ["notes.txt"])  # bob eval --text notes.txt

Each verb is forward invocations only (``Session.invoke(..., "predict")``): the
prompts' logit rows and greedy predictions, or the exact loss of a corpus record. The
checkpoint is never written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from bob.backends import choose_backend, resolve_submission
from bob.config import AUTO_SUBMISSION, DEFAULT_TARGET
from bob.errors import BadInput
from bob.host import sampling
from bob.host.data import CorpusSpec, corpus_record, count_corpus, replace_prompts
from bob.host.session import Session
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord, ResultRecord
from bob.records.checkpoint import Checkpoint


def forward(checkpoint: Checkpoint, prompts: Sequence[int], backend: str,
            arch: str = DEFAULT_TARGET, record: InputRecord | None = None) -> ResultRecord:
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


def validation_loss(session: Session, state: Checkpoint, record: InputRecord) -> float:
    """The model's exact loss on the record: one forward invocation, as `bob eval` runs it."""
    config = BobConfig(vocab=state.vocab, prompts=0, updates=0, mode="corpus",
                       submission=resolve_submission(AUTO_SUBMISSION, session.choice.name))
    return session.invoke(config, state, record, "predict").initial_loss


def predict(checkpoint: str, prompts: Sequence[bytes], backend: str = "auto",
            ) -> list[tuple[bytes, int, np.ndarray]]:
    """For each prompt: the prompt, the predicted next byte and its row of logits."""
    if not prompts:
        raise BadInput("give at least one prompt")
    if any(len(p) == 0 for p in prompts):
        raise BadInput("a prompt must have at least one byte")
    state = Checkpoint.load(checkpoint)
    _require_bytes(state, checkpoint)
    result = forward(state, [p[-1] for p in prompts], backend)
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
    result = forward(state, range(state.vocab), backend)
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
    result = forward(state, [p[-1] for p in prompts], backend)
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
            result = forward(state, [token], backend)
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
