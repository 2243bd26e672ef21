"""Bob's public Python API, what `import bob` names: train a model, load one, use it.

    import bob
    model = bob.train(bob.TrainConfig(text="input.txt", steps=1000, out="bob.safetensors"))
    model = bob.load("bob.safetensors")
    model.generate("ROMEO:", 100)     # sampled at 0.8 among the top 200, as nanoGPT's sample.py
    model.probs("R")                  # f64[1][V]: the next symbol's distribution after "R"
    model.eval("a text to score")     # an EvalReport: nats per transition, bits per byte
    model.table                       # f32[V][V], memory-mapped from the checkpoint

A model is its checkpoint on disk: rows are read from it as they are asked for, and no
call loads the table but `.table` (mapped, its pages read as they are touched) and
`.to_torch()`. Everything runs through the host's verbs (`bob.host.training`,
`bob.host.inference`, `bob.host.sampling`); errors are `bob.errors.BobError`s with a
one-line message.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bob.config import HYPER_FIELDS, SCHEDULE_FIELDS, Hyper
from bob.errors import BadInput
from bob.files import atomic_write, check_output_file, reading
from bob.host import inference, sampling
from bob.host.data import CorpusSpec
from bob.host.inference import EvalReport
from bob.host.sharded_run import run_training
from bob.host.training import TrainRequest
from bob.records.checkpoint import CheckpointFile, TrainingState
from bob.records.corpus import BYTE_VOCAB
from bob.records.shards import open_checkpoint
from bob.records.tokenizer import Tokenizer, load_tokenizer, resolve_vocab

__all__ = ["Model", "TrainConfig", "load", "train"]

# A prompt or data: text (UTF-8 for a byte model, a tokenizer's for a token model), bytes,
# or symbol ids.
Symbols = str | bytes | Sequence[int] | np.ndarray
Progress = Callable[[int, float], None]  # (updates done so far, the loss after them)


def _names(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str | os.PathLike) else tuple(value)


@dataclass(frozen=True)
class TrainConfig:
    """One training run in a user's words: `bob train`'s options without the device's.

    Checked when made (a BadInput naming the field); `bob.train` checks the files.
    """

    text: str | Sequence[str] | None = None  # text files, dirs, globs; none: the built-in corpus
    tokens: str | Sequence[str] | None = None  # token files (raw uint16/uint32, or .npy)
    vocab: int | None = None  # V of the token files; None: the tokenizer's
    # A tokenizers JSON, nanoGPT's meta.pkl or a tiktoken name: V of the token files, and
    # the text the model's generate and eval speak.
    tokenizer: str | None = None
    # Raw token files' type; None: uint16 up to V=65536 (nanoGPT's train.bin), uint32 above.
    token_dtype: str | None = None
    counts: str | None = None  # a counts file from `bob count` (no recount)
    val_text: str | Sequence[str] | None = None  # validation data: its exact loss is kept
    val_tokens: str | Sequence[str] | None = None
    steps: int = 1000  # AdamW updates; 1000 come within 0.2% of the optimum on text
    # AdamW; None: Hyper's default (lr 0.1, betas 0.9/0.999, eps 1e-8, weight decay 0.01),
    # or the checkpoint's own on resume.
    lr: float | None = None
    beta1: float | None = None
    beta2: float | None = None
    eps: float | None = None
    weight_decay: float | None = None
    # nanoGPT's learning-rate schedule (bob.config.Hyper.lr_at): a linear warmup over
    # warmup_steps updates, a cosine decay to min_lr (None: lr / 10) at lr_decay_steps.
    warmup_steps: int | None = None
    lr_decay_steps: int | None = None
    min_lr: float | None = None
    val_fraction: float | None = None  # the last fraction of the data validates, as nanoGPT's
    out: str | None = None  # the checkpoint; None: a temporary file the model keeps
    resume: bool = False  # continue `out`'s run
    overwrite: bool = False  # start again over an existing `out`
    backend: str = "auto"  # cuda where a GPU is usable, else nv, else cpu
    # How the tables are held: "auto" (collapsed where the data names few of the V x V
    # cells, and past V = 65536), "dense" or "collapsed" (bob.host.tables).
    tables: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise BadInput(f"steps must be an integer >= 0, not {self.steps!r}")
        stated = self.hyper_changes()
        # Each stated value by Hyper's rule; a resumed run's schedule is checked against
        # the checkpoint's own lr as it starts.
        Hyper(**{name: value for name, value in stated.items()
                 if not self.resume or name in HYPER_FIELDS})
        if self.resume and self.out is None:
            raise BadInput("resume continues a checkpoint: give it as out")
        if self.tokenizer is not None and not (self.tokens or self.counts or self.val_tokens):
            raise BadInput("tokenizer gives the V of token files; text trains on bytes (V=256)")

    def hyper_changes(self) -> dict[str, float]:
        """The hyperparameters (and schedule) this configuration states."""
        return {name: getattr(self, name) for name in (*HYPER_FIELDS, *SCHEDULE_FIELDS)
                if getattr(self, name) is not None}

    def request(self, checkpoint: str, tokenizer: Tokenizer | None = None) -> TrainRequest:
        """The training driver's request for this run, writing `checkpoint`."""
        tokens = _names(self.tokens)
        vocab = resolve_vocab(self.vocab, tokenizer) if tokens or self.counts else self.vocab
        data = CorpusSpec(tokens=tokens, counts=self.counts, vocab=vocab,
                          token_dtype=self.token_dtype)
        val = CorpusSpec(texts=_names(self.val_text), tokens=_names(self.val_tokens),
                         token_dtype=self.token_dtype)
        return TrainRequest(
            texts=_names(self.text) or None, steps=self.steps, checkpoint=checkpoint,
            resume=self.resume, backend=self.backend, hyper_changes=self.hyper_changes(),
            overwrite=self.overwrite, data_spec=data if data.given else None,
            val_spec=val if val.given else None, save_start=True,
            val_fraction=self.val_fraction, tables=self.tables)


def train(config: TrainConfig | None = None, progress: Progress | None = None) -> Model:
    """Train as `config` says and return the model (`steps=0`: the untrained table, still
    written). `progress(done, loss)` runs after each invocation of updates."""
    config = config or TrainConfig()
    tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else None
    temporary = None
    out = config.out
    if out is None:
        temporary = tempfile.mkdtemp(prefix="bob-model-")
        out = os.path.join(temporary, "model.safetensors")
    try:
        request = config.request(out, tokenizer)
        run_training(request, None if progress is None
                     else lambda invocation, done: progress(done, invocation.loss))
        return Model(open_checkpoint(out), tokenizer, config.backend, temporary)
    except BaseException:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        raise


def load(path: str | os.PathLike[str], tokenizer: str | Tokenizer | None = None,
         backend: str = "auto") -> Model:
    """The model in a checkpoint (its header read and checked; no table loaded). A
    `tokenizer` (a file, a tiktoken name or a loaded one) lets a token model read and write
    text; `backend` is where `eval` runs."""
    stored = open_checkpoint(path)
    if isinstance(tokenizer, str | os.PathLike):
        tokenizer = load_tokenizer(tokenizer)
    return Model(stored, tokenizer, backend)


class Model:
    """A bigram table: V x V logits, row r the next symbol's logits after symbol r.

    A byte model (V = 256) reads and writes text as UTF-8; a token model through its
    tokenizer, or as ids.
    """

    def __init__(self, stored: CheckpointFile, tokenizer: Tokenizer | None = None,
                 backend: str = "auto", temporary: str | None = None) -> None:
        if tokenizer is not None:
            tokenizer.require_vocab(stored.state.vocab, stored.path)
        self._stored = stored
        self.tokenizer = tokenizer
        self.backend = backend
        if temporary is not None:  # a checkpoint in a temporary directory lives with it
            weakref.finalize(self, shutil.rmtree, temporary, ignore_errors=True)

    @property
    def path(self) -> str:
        """The checkpoint file."""
        return self._stored.path

    @property
    def state(self) -> TrainingState:
        """The checkpoint's metadata: step, hyperparameters, loss history, optimum..."""
        return self._stored.state

    @property
    def vocab(self) -> int:
        return self._stored.state.vocab

    @property
    def step(self) -> int:
        return self._stored.state.step

    def __repr__(self) -> str:
        kind = "bytes" if self.vocab == BYTE_VOCAB else "tokens"
        return f"Model(V={self.vocab} {kind}, step={self.step}, {self.path!r})"

    # -- symbols ---------------------------------------------------------------------
    def encode(self, data: Symbols) -> list[int]:
        """Symbol ids of text (UTF-8 bytes, or the tokenizer's ids), bytes or ids."""
        if isinstance(data, str):
            if self.tokenizer is not None:
                ids = self.tokenizer.encode(data)
            elif self.vocab == BYTE_VOCAB:
                ids = list(data.encode("utf-8"))
            else:
                raise BadInput(f"{self.path}: V={self.vocab}; text needs a byte table "
                               "(V=256), or a tokenizer for a token model "
                               "(bob.load(path, tokenizer=...))")
        elif isinstance(data, bytes | bytearray):
            if self.vocab != BYTE_VOCAB:
                raise BadInput(f"{self.path}: V={self.vocab}; bytes need a byte table "
                               "(V=256)")
            ids = list(data)
        else:
            ids = [int(i) for i in np.asarray(data).reshape(-1)]
        outside = [i for i in ids if not 0 <= i < self.vocab]
        if outside:
            raise BadInput(f"{self.path}: symbol {outside[0]} is not in [0, V={self.vocab})")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of symbol ids: the tokenizer's, or UTF-8 bytes (invalid ones as U+FFFD)."""
        if self.tokenizer is not None:
            return self.tokenizer.decode(ids)
        if self.vocab != BYTE_VOCAB:
            raise BadInput(f"{self.path}: V={self.vocab}; text needs a tokenizer for a token "
                           "model (bob.load(path, tokenizer=...))")
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    # -- the table at work -----------------------------------------------------------------
    def logits(self, prev: int | Symbols) -> np.ndarray:
        """The next symbol's logits after `prev`: f32[V] for one symbol id, else f32[n][V],
        one row for each symbol of `prev` (text, bytes or ids)."""
        if isinstance(prev, int | np.integer):
            return self.logits([int(prev)])[0]
        ids = self.encode(prev)
        if not ids:
            raise BadInput("give at least one symbol")
        return self._stored.rows("parameters", ids)  # read from the file, checked

    def probs(self, prev: int | Symbols, temperature: float = 1.0) -> np.ndarray:
        """The next symbol's distribution after `prev` (f64, rows summing to 1), as
        `generate` draws from it at this temperature (Bob's exp2, the same everywhere)."""
        if not temperature > 0:
            raise BadInput(f"temperature must be > 0, not {temperature}")
        rows = np.atleast_2d(self.logits(prev))
        found = np.stack([sampling.probabilities(row, temperature) for row in rows])
        return found[0] if isinstance(prev, int | np.integer) else found

    def generate(self, prompt: Symbols | None = None, n: int | None = None,
                 temperature: float = 0.8, top_k: int | None = 200, seed: int = 0,
                 seen_only: bool | None = None, num_samples: int | None = None,
                 lines: int | None = None, stop: int | None = None):
        """The `n` symbols after `prompt` (200; with `lines`, at most 1000 a line), sampled
        as nanoGPT's sample.py does (0.8, the 200 most likely; `temperature=0` is greedy),
        the same for a seed on every machine.

        Text gives text (decoded), bytes bytes, ids a list of ids. No prompt: as `bob
        generate` with none, from the start of a line (a byte model) or the symbol the data
        starts with (a token model, given back with what follows it): text where the model
        has text, else ids. `lines` K ends a sample at its K-th line's end (a newline, the
        tokenizer's newline token, or `stop`). `seen_only` draws only symbols the training
        data has as a next symbol (None: on for a byte model trained on text whose
        checkpoint records them). With `num_samples` K: a list of K samples, as `bob
        generate --num-samples K` prints them.
        """
        if n is None:
            n = 200 if lines is None else 1000 * lines
        if prompt is None:
            start = inference.generation_start(self.path, self.tokenizer)
            samples = inference.generate_samples(
                self.path, None, n, temperature, seed, self.backend, top_k, seen_only,
                1 if num_samples is None else num_samples, lines, stop, self.tokenizer)
            whole = [[*start.shown, *more] for more in samples]
            speaks = self.tokenizer is not None or self.vocab == BYTE_VOCAB
            shown = [self.decode(ids) for ids in whole] if speaks else whole
            return shown[0] if num_samples is None else shown
        ids = self.encode(prompt)
        given: bytes | list[int] = bytes(ids) if isinstance(prompt, bytes | bytearray) \
            or (isinstance(prompt, str) and self.tokenizer is None) else ids
        samples = inference.generate_samples(
            self.path, given, n, temperature, seed, self.backend, top_k, seen_only,
            1 if num_samples is None else num_samples, lines, stop, self.tokenizer)
        if isinstance(prompt, str):
            shown = [self.decode(more) for more in samples]
        elif isinstance(prompt, bytes | bytearray):
            shown = [bytes(more) for more in samples]
        else:
            shown = samples
        return shown[0] if num_samples is None else shown

    def eval(self, data: Symbols) -> EvalReport:
        """The model's loss on `data` (text, bytes or ids: its adjacent pairs) beside the
        bigram optimum of that data: nats per transition, bits per byte or token."""
        ids = self.encode(data)
        name = "text" if isinstance(data, str | bytes | bytearray) else "ids"
        return inference.evaluate_symbols(self._stored, np.asarray(ids, np.int64), name,
                                          self.backend)

    # -- the table itself --------------------------------------------------------------------
    @property
    def table(self) -> np.ndarray:
        """The parameters, f32[V][V] (row: previous symbol, column: next), memory-mapped
        read-only from the checkpoint: 4 V^2 bytes (256 KiB at V = 256, 9.4 GiB at
        V = 50257), read from disk as its pages are touched."""
        return self._stored.mapped("parameters")

    def to_torch(self):
        """The table as a torch.Tensor (f32[V][V], a copy in memory): makemore's bigram is
        `torch.nn.Embedding.from_pretrained(model.to_torch())`. Needs PyTorch."""
        try:
            import torch
        except ImportError:
            raise BadInput("Model.to_torch needs PyTorch, which is not installed here "
                           "(pip install torch)") from None
        return torch.from_numpy(np.array(self.table))

    def save(self, path: str | os.PathLike[str], overwrite: bool = False) -> None:
        """Copy the checkpoint to `path` (atomically): a temporary model kept."""
        check_output_file(path, "checkpoint")
        if os.path.exists(path) and not overwrite:
            raise BadInput(f"{path}: exists; pass overwrite=True to replace it")

        def copy(file) -> None:
            with reading(self.path, "checkpoint") as source:
                shutil.copyfileobj(source, file, 16 << 20)

        atomic_write(path, copy)

