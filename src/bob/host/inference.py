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

import contextlib
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from bob.backends import choose_backend, resolve_submission
from bob.config import AUTO_SUBMISSION, DEFAULT_TARGET
from bob.errors import BadInput
from bob.files import read_bounded, read_bytes, reading_input, stream_kind
from bob.host import sampling
from bob.host.data import (
    CorpusSpec,
    corpus_record,
    count_corpus,
    count_sequences,
    replace_prompts,
)
from bob.host.session import Session, Start
from bob.host.tables import starting_tables
from bob.kernels.reference import greedy_argmax_rows
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord, ResultRecord
from bob.records.checkpoint import Checkpoint, CheckpointFile
from bob.records.collapsed import CollapsedCheckpoint
from bob.records.corpus import BYTE_VOCAB
from bob.records.countsfile import CountsFile
from bob.records.shards import ShardedCheckpoint, open_checkpoint
from bob.records.sources import STDIN
from bob.records.tokenizer import Tokenizer

# Where a forward invocation's table comes from: a checkpoint in memory or on disk.
Table = Checkpoint | CheckpointFile | CollapsedCheckpoint
# The most of a stream (standard input, a pipe, a device) read whole for a tokenizer to
# encode: the text and its ids are held in memory at once, a Python int a token.
TEXT_STREAM_MAX_BYTES = 1 << 30
TEXT_STREAM_BOUND = "the most Bob reads from a stream for a tokenizer to encode"


def _start(table: Table, named: np.ndarray) -> Start:
    """The table as a forward invocation starts from it, in its own layout: a collapsed
    one with the cells `named` by the data as exceptions."""
    if isinstance(table, Checkpoint):
        return table
    return starting_tables(table.state.tables, table.state, named, table)


def forward(checkpoint: Table, prompts: Sequence[int], backend: str,
            arch: str = DEFAULT_TARGET, record: InputRecord | None = None) -> ResultRecord:
    """One forward invocation: the prompts' logit rows and greedy predictions (and, with a
    corpus `record`, its loss as the result's initial loss)."""
    state = checkpoint.state
    if record is None:
        # Prediction needs no targets; the loss block of this request is not reported (a
        # collapsed table's targets are then no exceptions: its losses are NaN).
        record = InputRecord.hard(np.zeros(state.vocab, np.uint32), prompts, source="prompts")
        named = np.zeros(0, np.int64)
    else:
        record = replace_prompts(record, prompts)
        named = record.named_keys()
    choice = choose_backend(backend, arch=arch)
    start = _start(checkpoint, named)
    config = BobConfig(vocab=state.vocab, prompts=len(prompts), updates=0, mode=record.mode,
                       submission=resolve_submission(AUTO_SUBMISSION, choice.name),
                       pairs=record.pairs, tables=start.state.tables,
                       exceptions=start.state.exceptions)
    with Session(choice, state.hyper) as session:
        return session.invoke(config, start, record, "predict").result


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
    stored = open_checkpoint(checkpoint)
    _require_bytes(stored, checkpoint)
    result = forward(stored, [p[-1] for p in prompts], backend)
    return [(p, int(result.predictions[i]), result.logit_rows[i])
            for i, p in enumerate(prompts)]


def _require_bytes(stored: CheckpointFile, path: str) -> None:
    if stored.state.vocab != BYTE_VOCAB:
        raise BadInput(f"{path}: V={stored.state.vocab}; text needs a byte table (V=256), or "
                       "a --tokenizer for a token model")


def _check_sampling(length: int, temperature: float, top_k: int | None,
                    samples: int = 1) -> None:
    if length < 0:
        raise BadInput(f"length must be >= 0, not {length}")
    if not math.isfinite(temperature) or temperature < 0:
        raise BadInput(f"--temperature must be a finite number >= 0, not {temperature}")
    if top_k is not None and top_k < 1:
        raise BadInput(f"--top-k must be at least 1, not {top_k}")
    if samples < 1:
        raise BadInput(f"--num-samples must be at least 1, not {samples}")


def seen_symbols(stored: CheckpointFile, seen_only: bool | None) -> np.ndarray | None:
    """The symbols generation may draw: None for all of them, or the mask of those the
    training data has as a next symbol (the checkpoint's `successors`).

    `seen_only` None is on for a byte model trained on a corpus whose checkpoint records
    them, off otherwise; True refuses a checkpoint that cannot tell.
    """
    state = stored.state
    seen = state.seen()
    if seen is not None and not seen.any():  # a state made in memory, not read from a file
        raise BadInput(f"{stored.path}: the checkpoint records no symbol its training data "
                       "has as a next symbol: there is nothing to draw; pass --no-seen-only")
    if seen_only is None:
        return seen if state.vocab == BYTE_VOCAB and state.mode == "corpus" else None
    if not seen_only:
        return None
    if seen is None:
        raise BadInput(f"{stored.path}: the checkpoint does not record which symbols its "
                       "training data has as a next symbol (written before Bob kept them, "
                       "or resumed on other data from such a checkpoint): --seen-only cannot "
                       "tell; pass --no-seen-only")
    return seen


def _continue(rows: Rows, last: int, length: int, temperature: float, seed: int,
              top_k: int | None, allowed: np.ndarray | None = None,
              first_position: int = 0, stop: int | None = None,
              lines: int | None = None) -> list[int]:
    """`length` tokens after `last` (fewer with `lines`: up to the `lines`-th `stop`
    symbol): greedy, or sampled with `seed` (position by position, as `sampling.generate`
    draws them, from `first_position` on), among the `allowed` symbols where given."""
    out = []
    ended = 0  # lines ended so far
    for position in range(first_position, first_position + length):
        logits, greedy = rows[last]
        if temperature == 0:
            last = greedy if allowed is None else sampling.greedy(logits, allowed)
        else:
            last = sampling.sample_row(logits, temperature, sampling.uniform(seed, position),
                                       top_k, allowed)
        out.append(last)
        if lines is not None and last == stop:
            ended += 1
            if ended == lines:
                break
    return out


LINE_END = 0x0A  # a byte model's line ends at a newline, and a line starts after one


@dataclass(frozen=True)
class GenerationStart:
    """Where generation without a prompt starts: the symbols it shows before the
    continuation, and the symbol the first draw continues."""

    shown: bytes | list[int]
    last: int


def generation_start(checkpoint: str, tokenizer: Tokenizer | None = None) -> GenerationStart:
    """Where `bob generate` starts without a prompt, as makemore samples a name from its
    start token: a byte model at the start of a line (after a newline, shown as nothing);
    a token model at the symbol its training data starts with (the checkpoint records it,
    shown), else after its tokenizer's newline where that is one token."""
    stored = open_checkpoint(checkpoint)
    state = stored.state
    if state.vocab == BYTE_VOCAB:
        return GenerationStart(b"", LINE_END)
    first = None if state.sources is None else state.sources.first_symbol
    if first is not None and first < state.vocab:
        return GenerationStart([first], first)
    newline = line_end(tokenizer)
    if newline is not None:
        return GenerationStart([], newline)
    raise BadInput(f"{checkpoint}: the checkpoint does not record a symbol its data starts "
                   "with (trained from a counts file, or written before Bob kept it): give "
                   "--prompt or --ids, or a --tokenizer that has a newline token")


def line_end(tokenizer: Tokenizer | None) -> int | None:
    """The token a line ends with for a token model: its tokenizer's newline, where that
    is one token (a character-level meta.pkl's is), else None."""
    if tokenizer is None:
        return None
    with contextlib.suppress(BadInput, ValueError, KeyError):
        ids = tokenizer.encode("\n")
        if len(ids) == 1:
            return int(ids[0])
    return None


def stop_symbol(checkpoint: str, stop: int | None, tokenizer: Tokenizer | None = None) -> int:
    """The symbol that ends a line for --lines: `stop` where given (checked against V),
    a newline for a byte model, the tokenizer's newline token for a token model."""
    vocab = open_checkpoint(checkpoint).state.vocab
    if stop is not None:
        if not 0 <= stop < vocab:
            raise BadInput(f"--stop {stop} is not a symbol of this model: [0, V={vocab})")
        return stop
    found = LINE_END if vocab == BYTE_VOCAB else line_end(tokenizer)
    if found is None:
        raise BadInput(f"{checkpoint}: --lines ends a sample at its lines' ends: a token "
                       "model needs --stop ID (or a --tokenizer with a newline token)")
    return found


def generate_samples(checkpoint: str, prompt: bytes | Sequence[int] | None, length: int,
                     temperature: float = 0.0, seed: int = 0, backend: str = "auto",
                     top_k: int | None = None, seen_only: bool | None = False,
                     samples: int = 1, lines: int | None = None, stop: int | None = None,
                     tokenizer: Tokenizer | None = None) -> list[list[int]]:
    """`samples` continuations of `prompt` (bytes for a byte table, else token ids; None:
    `generation_start`), each `length` symbols, from the rows of the checkpoint it visits
    (each read once). With `lines` K, a sample ends at its K-th `stop` symbol
    (`stop_symbol`), `length` being the most it draws.

    Sample k draws the uniforms after those of the samples before it (k * length on,
    without `lines`): one seed's stream cut into samples, so sample 0 is what one sample
    with that seed gives.
    """
    _check_sampling(length, temperature, top_k, samples)
    if lines is not None and lines < 1:
        raise BadInput(f"--lines must be at least 1, not {lines}")
    choose_backend(backend)  # a name it does not know is refused as everywhere
    stored = open_checkpoint(checkpoint)
    if prompt is None:
        last = generation_start(checkpoint, tokenizer).last
    elif isinstance(prompt, bytes | bytearray):
        if not prompt:
            raise BadInput("the prompt must have at least one byte")
        _require_bytes(stored, checkpoint)
        last = prompt[-1]
    else:
        last = _require_tokens(stored, checkpoint, prompt)[-1]
    ending = None if lines is None else stop_symbol(checkpoint, stop, tokenizer)
    allowed = seen_symbols(stored, seen_only)
    rows = Rows(stored)
    drawn: list[list[int]] = []
    position = 0
    for _ in range(samples):
        drawn.append(_continue(rows, last, length, temperature, seed, top_k, allowed,
                               position, ending, lines))
        position += length if lines is None else len(drawn[-1])
    return drawn


def generate(checkpoint: str, prompt: bytes, length: int, temperature: float = 0.0,
             seed: int = 0, backend: str = "auto", top_k: int | None = None,
             seen_only: bool | None = False) -> bytes:
    """Continue `prompt` by `length` bytes, greedily or sampled with `seed` (from the
    `top_k` most likely bytes only, when given; only bytes the training data has as a
    next byte with `seen_only`)."""
    (sample,) = generate_samples(checkpoint, bytes(prompt), length, temperature, seed,
                                 backend, top_k, seen_only)
    return bytes(sample)


@dataclass(frozen=True)
class EvalReport:
    checkpoint: str
    text: str
    transitions: int
    nats: float  # mean negative log-likelihood per transition
    optimum: float
    unit: str = "byte"  # what a symbol is: "byte" (V = 256) or "token"

    @property
    def bits(self) -> float:
        """Bits per symbol: per byte, or per token."""
        return self.nats / math.log(2)

    def to_json(self) -> dict:
        return {"checkpoint": self.checkpoint, "text": self.text,
                "transitions": self.transitions, "nats_per_transition": self.nats,
                f"bits_per_{self.unit}": self.bits, "optimum": self.optimum,
                f"optimum_bits_per_{self.unit}": self.optimum / math.log(2),
                "unit": self.unit, "loss": self.nats}


def symbol_unit(vocab: int) -> str:
    """What one symbol of a V-symbol model is called: a byte (V = 256) or a token."""
    return "byte" if vocab == BYTE_VOCAB else "token"


def evaluate(checkpoint: str, texts: Sequence[str], backend: str = "auto",
             spec: CorpusSpec | None = None, tokenizer: Tokenizer | None = None) -> EvalReport:
    """The model's loss on text files (or tokens, or a counts file), beside the optimum: one
    forward invocation with the data as its corpus input, the table streamed in. With a
    `tokenizer`, a token model reads text files as the tokens it encodes them to."""
    stored = open_checkpoint(checkpoint)
    vocab = stored.state.vocab
    if tokenizer is not None:
        tokenizer.require_vocab(vocab, checkpoint)
    if spec is not None and spec.given and texts:
        raise BadInput("give one kind of data: text inputs, --tokens files or --counts")
    if texts and tokenizer is not None:
        counted = count_sequences([(name, np.asarray(tokenizer.encode(_text_of(name)),
                                                     np.int64))
                                   for name in texts], vocab)
    else:
        if spec is None or not spec.given:
            _require_bytes(stored, checkpoint)
            spec = CorpusSpec(texts=tuple(texts))
        counted = count_corpus(replace(spec, vocab=spec.vocab
                                       or (None if spec.counts else vocab)))
        if spec.counts:  # a refusal names the counts file, not the sources it records
            return _evaluate_counts(stored, counted, backend, spec.counts)
    return _evaluate_counts(stored, counted, backend)


def evaluate_symbols(checkpoint: Table, symbols: Sequence[int] | np.ndarray | bytes,
                     name: str, backend: str = "auto") -> EvalReport:
    """The model's loss on one sequence of symbols in memory (bytes, or token ids)."""
    stored = open_checkpoint(checkpoint) if isinstance(checkpoint, str) else checkpoint
    array = (np.frombuffer(symbols, np.uint8) if isinstance(symbols, bytes | bytearray)
             else np.asarray(symbols))
    return _evaluate_counts(stored, count_sequences([(name, array)], stored.state.vocab),
                            backend)


def _evaluate_counts(stored: Table, counted: CountsFile, backend: str,
                     source: str | None = None) -> EvalReport:
    """The loss on the counts; `source` is the file a refusal names (a counts file), else
    the files counted."""
    vocab = stored.state.vocab
    if counted.vocab != vocab:
        raise BadInput(f"{source or counted.name}: V={counted.vocab}, the checkpoint "
                       f"V={vocab}")
    record = corpus_record(counted, counted.name)
    loss = forward(stored, (), backend, record=record).initial_objective
    path = getattr(stored, "path", "checkpoint")
    return EvalReport(path, counted.name, counted.transitions, loss, counted.optimum,
                      symbol_unit(vocab))


def _text_of(name: str) -> str:
    """A text file (or stdin, "-", or another stream, up to TEXT_STREAM_MAX_BYTES) as text,
    for a tokenizer to encode."""
    if name == STDIN:
        data = read_bounded(sys.stdin.buffer, name, TEXT_STREAM_MAX_BYTES, TEXT_STREAM_BOUND)
    elif stream_kind(name) is not None:
        with reading_input(name, "text file") as stream:
            data = read_bounded(stream, name, TEXT_STREAM_MAX_BYTES, TEXT_STREAM_BOUND)
    else:
        data = read_bytes(name, "text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadInput(f"{name}: not UTF-8 text (byte {error.start}), which a tokenizer "
                       "encodes") from None


def require_tokenizer(checkpoint: str, tokenizer: Tokenizer) -> None:
    """BadInput unless the checkpoint's V is the tokenizer's."""
    tokenizer.require_vocab(open_checkpoint(checkpoint).state.vocab, checkpoint)


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
    stored = open_checkpoint(checkpoint)
    prompts = [_require_tokens(stored, checkpoint, p) for p in prompts]
    result = forward(stored, [p[-1] for p in prompts], backend)
    return [(p, int(result.predictions[i]), float(result.logit_rows[i][result.predictions[i]]))
            for i, p in enumerate(prompts)]


def generate_ids(checkpoint: str, prompt: Sequence[int], length: int, temperature: float = 0.0,
                 seed: int = 0, backend: str = "auto", top_k: int | None = None,
                 seen_only: bool | None = False) -> list[int]:
    """Token checkpoints: continue the ids by `length` ids, as `generate` does bytes (the
    rows visited read from the file, each once)."""
    (sample,) = generate_samples(checkpoint, [int(i) for i in prompt], length, temperature,
                                 seed, backend, top_k, seen_only)
    return sample


def export(checkpoint: str, out: str, overwrite: bool = False) -> int:
    """Write the parameters alone (safetensors, one tensor `parameters`, the checkpoint's
    metadata), streamed from the checkpoint a chunk at a time; the bytes written."""
    from bob.files import check_output_file, require_apart
    from bob.host.training import require_disk_room
    from bob.records.checkpoint import export_parameters

    check_output_file(out, "parameters file")
    if os.path.exists(out) and not overwrite:
        raise BadInput(f"{out}: exists; pass --overwrite to replace it")
    stored = open_checkpoint(checkpoint)
    require_apart(out, "parameters file", checkpoint_files(stored))
    require_disk_room(out, 4 * stored.state.vocab ** 2, "parameters file")
    return export_parameters(stored, out)


def checkpoint_files(stored: CheckpointFile | ShardedCheckpoint) -> list[tuple[str, str]]:
    """(path, what) of every file a checkpoint is read from: the one file, or a sharded
    checkpoint's index and shards. An output must be none of them."""
    if isinstance(stored, ShardedCheckpoint):
        directory = os.path.dirname(stored.path)
        return [(stored.path, "checkpoint index"),
                *((os.path.join(directory, s.file), "checkpoint shard") for s in stored.shards)]
    return [(stored.path, "checkpoint")]
