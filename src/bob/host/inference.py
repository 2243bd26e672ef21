"""The trained table at work: predictions, generated text, the loss on data.

    >>> from bob.host import inference
    >>> inference.predict("bob.safetensors", [b"def"])  # bob predict def
    >>> inference.generate("bob.safetensors", b"def ", length=40)  # bob generate -p "def "
    >>> inference.evaluate("bob.safetensors", ["notes.txt"])  # bob eval --text notes.txt

Nothing reads more of the checkpoint than it needs, and none opens more than one
session: `predict` and `evaluate` are one forward invocation (``Session.invoke(...,
"predict")``) whose table is streamed into the arena from the file (the parameters
alone: a forward invocation reads no moment); `generate` reads the rows it visits from
the file (a row is what the device's gather copies, and its greedy next token is the
reference argmax of it: the same bytes), so a token model generates without loading its
table. The checkpoint is never written.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from bob.backends import choose_backend, resolve_submission
from bob.config import AUTO_SUBMISSION, DEFAULT_TARGET
from bob.errors import BadInput
from bob.host import sampling
from bob.host.data import CorpusSpec, corpus_record, count_corpus, replace_prompts
from bob.host.session import Session
from bob.kernels.reference import greedy_argmax_rows
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord, ResultRecord
from bob.records.checkpoint import Checkpoint, CheckpointFile, StartingPoint

# Where a forward invocation's table comes from: a checkpoint in memory or on disk.
Table = Checkpoint | CheckpointFile


def _start(table: Table) -> Checkpoint | StartingPoint:
    return table if isinstance(table, Checkpoint) else StartingPoint(table.state, table)


def forward(checkpoint: Table, prompts: Sequence[int], backend: str,
            arch: str = DEFAULT_TARGET, record: InputRecord | None = None) -> ResultRecord:
    """One forward invocation: the prompts' logit rows and greedy predictions (and, with a
    corpus `record`, its loss as the result's initial loss)."""
    state = checkpoint.state
    if record is None:
        # Prediction needs no targets; the loss block of this request is not reported.
        record = InputRecord.hard(np.zeros(state.vocab, np.uint32), prompts, source="prompts")
    else:
        record = replace_prompts(record, prompts)
    choice = choose_backend(backend, arch=arch)
    config = BobConfig(vocab=state.vocab, prompts=len(prompts), updates=0, mode=record.mode,
                       submission=resolve_submission(AUTO_SUBMISSION, choice.name),
                       pairs=record.pairs)
    with Session(choice, state.hyper) as session:
        return session.invoke(config, _start(checkpoint), record, "predict").result


class Rows:
    """A checkpoint's parameter rows as generation visits them: each read from the file
    once (a row of V floats), with its greedy next token."""

    def __init__(self, stored: CheckpointFile):
        self.stored = stored
        self._rows: dict[int, tuple[np.ndarray, int]] = {}

    def __getitem__(self, token: int) -> tuple[np.ndarray, int]:
        if token not in self._rows:
            row = self.stored.rows("parameters", [token])
            self._rows[token] = (row[0], int(greedy_argmax_rows(row)[0]))
        return self._rows[token]


def predict(checkpoint: str, prompts: Sequence[bytes], backend: str = "auto",
            ) -> list[tuple[bytes, int, np.ndarray]]:
    """For each prompt: the prompt, the predicted next byte and its row of logits."""
    if not prompts:
        raise BadInput("give at least one prompt")
    if any(len(p) == 0 for p in prompts):
        raise BadInput("a prompt must have at least one byte")
    stored = CheckpointFile.open(checkpoint)
    _require_bytes(stored, checkpoint)
    result = forward(stored, [p[-1] for p in prompts], backend)
    return [(p, int(result.predictions[i]), result.logit_rows[i])
            for i, p in enumerate(prompts)]


def _require_bytes(stored: CheckpointFile, path: str) -> None:
    if stored.state.vocab != 256:
        raise BadInput(f"{path}: V={stored.state.vocab}; text needs a byte table (V=256)")


def _check_sampling(length: int, temperature: float, top_k: int | None) -> None:
    if length < 0:
        raise BadInput(f"length must be >= 0, not {length}")
    if not math.isfinite(temperature) or temperature < 0:
        raise BadInput(f"--temperature must be a finite number >= 0, not {temperature}")
    if top_k is not None and top_k < 1:
        raise BadInput(f"--top-k must be at least 1, not {top_k}")


def _continue(rows: Rows, last: int, length: int, temperature: float, seed: int,
              top_k: int | None) -> list[int]:
    """`length` tokens after `last`: greedy, or sampled with `seed` (position by position,
    as `sampling.generate` draws them)."""
    out = []
    for position in range(length):
        logits, greedy = rows[last]
        if temperature == 0:
            last = greedy
        else:
            last = sampling.sample_row(logits, temperature, sampling.uniform(seed, position),
                                       top_k)
        out.append(last)
    return out


def generate(checkpoint: str, prompt: bytes, length: int, temperature: float = 0.0,
             seed: int = 0, backend: str = "auto", top_k: int | None = None) -> bytes:
    """Continue `prompt` by `length` bytes, greedily or sampled with `seed` (from the
    `top_k` most likely bytes only, when given)."""
    if not prompt:
        raise BadInput("the prompt must have at least one byte")
    _check_sampling(length, temperature, top_k)
    choose_backend(backend)  # a name it does not know is refused as everywhere
    stored = CheckpointFile.open(checkpoint)
    _require_bytes(stored, checkpoint)
    return bytes(_continue(Rows(stored), prompt[-1], length, temperature, seed, top_k))


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
    """The model's loss on text files (or tokens, or a counts file), beside the optimum: one
    forward invocation with the data as its corpus input, the table streamed in."""
    stored = CheckpointFile.open(checkpoint)
    vocab = stored.state.vocab
    if spec is None or not spec.given:
        _require_bytes(stored, checkpoint)
        spec = CorpusSpec(texts=tuple(texts))
    elif texts:
        raise BadInput("give one kind of data: text inputs, --tokens files or --counts")
    counted = count_corpus(replace(spec, vocab=spec.vocab or (None if spec.counts else vocab)))
    if counted.vocab != vocab:
        raise BadInput(f"{counted.name}: V={counted.vocab}, the checkpoint V={vocab}")
    record = corpus_record(counted, counted.name)
    loss = forward(stored, (), backend, record=record).initial_objective
    return EvalReport(checkpoint, counted.name, counted.transitions, loss, counted.optimum)


def _require_tokens(stored: CheckpointFile, path: str, ids: Sequence[int]) -> list[int]:
    ids = [int(i) for i in ids]
    if not ids:
        raise BadInput("a prompt needs at least one token id")
    vocab = stored.state.vocab
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise BadInput(f"{path}: token id {bad[0]} is not in [0, V={vocab})")
    return ids


def predict_ids(checkpoint: str, prompts: Sequence[Sequence[int]], backend: str = "auto",
                ) -> list[tuple[list[int], int, float]]:
    """Token checkpoints: for each prompt of ids, the predicted next id and its logit."""
    if not prompts:
        raise BadInput("give at least one prompt")
    stored = CheckpointFile.open(checkpoint)
    prompts = [_require_tokens(stored, checkpoint, p) for p in prompts]
    result = forward(stored, [p[-1] for p in prompts], backend)
    return [(p, int(result.predictions[i]), float(result.logit_rows[i][result.predictions[i]]))
            for i, p in enumerate(prompts)]


def generate_ids(checkpoint: str, prompt: Sequence[int], length: int, temperature: float = 0.0,
                 seed: int = 0, backend: str = "auto", top_k: int | None = None) -> list[int]:
    """Token checkpoints: continue the ids by `length` ids, as `generate` does bytes (the
    rows visited read from the file, each once)."""
    _check_sampling(length, temperature, top_k)
    choose_backend(backend)  # a name it does not know is refused as everywhere
    stored = CheckpointFile.open(checkpoint)
    last = _require_tokens(stored, checkpoint, prompt)[-1]
    return _continue(Rows(stored), last, length, temperature, seed, top_k)


def export(checkpoint: str, out: str, overwrite: bool = False) -> int:
    """Write the parameters alone (safetensors, one tensor `parameters`, the checkpoint's
    metadata), streamed from the checkpoint a chunk at a time; the bytes written."""
    from bob.files import check_output_file
    from bob.records.checkpoint import export_parameters

    check_output_file(out, "parameters file")
    if os.path.exists(out) and not overwrite:
        raise BadInput(f"{out}: exists; pass --overwrite to replace it")
    stored = CheckpointFile.open(checkpoint)
    return export_parameters(stored, out)
