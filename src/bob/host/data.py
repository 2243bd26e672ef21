"""Training and evaluation data: where it comes from, counted into input records.

    >>> from bob.host import data
    >>> data.count(data.CorpusSpec(texts=("corpus/",)), "corpus.counts")  # bob count
    >>> data.training_data(["notes.txt"]).record  # the corpus-mode input record

Corpus data reaches the device through its V x V transition counts: text files, token
files or a counts file (`CorpusSpec`) are counted by the streamed engine
(``bob.records.counting``, or a Dask cluster) and become the sparse weights of an input
record: its K pairs, never a V x V table on the host. A hard-target input record is read
as it is. Every V up to MAX_VOCAB (2^20) takes this path; raw token files are read as
uint16 up to V = 65536 and uint32 above unless the spec names their type.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from bob.config import MAX_VOCAB
from bob.errors import BadInput
from bob.files import check_output_file, require_apart, require_named, stream_kind
from bob.records import corpus, counting, sources
from bob.records.binary import InputRecord
from bob.records.checkpoint import Ranges, symbol_ranges
from bob.records.countsfile import CountsFile
from bob.records.data_sources import DataSources
from bob.records.digest import weights_of


@dataclass(frozen=True)
class TrainingData:
    record: InputRecord
    counts: np.ndarray | None  # corpus mode: transition counts
    description: str
    known_optimum: float | None = None  # from a counts file or the counting engine
    # How the data was given, for the checkpoint (--resume with no data reads it again).
    sources: DataSources | None = None
    # The held-out part's corpus record, where --val-fraction split the data.
    validation: InputRecord | None = None
    notes: tuple[str, ...] = ()  # said after the description: how the data was cut, reused

    @property
    def shown(self) -> str:
        """The description with its notes, as the run's report names the data."""
        return f"{self.description} ({'; '.join(self.notes)})" if self.notes else \
            self.description

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
    # Raw token files' type; None: by V (uint16 up to 65536, nanoGPT's; uint32 above).
    token_dtype: str | None = None

    def __post_init__(self) -> None:
        # An empty name is refused, not taken for "not given" (it is falsy): `--counts ''`
        # would otherwise train on the built-in corpus.
        for name in self.texts:
            require_named(name, "corpus file")
        for name in self.tokens:
            require_named(name, "token file")
        if self.counts is not None:
            require_named(self.counts, "counts file")
        if self.tokens and self.vocab is not None:
            # A type that cannot hold V's ids is refused with the options, before any work
            # (where V comes later, from a checkpoint, the count refuses it).
            sources.token_dtype(self.vocab, self.token_dtype)

    @property
    def given(self) -> bool:
        return bool(self.texts or self.tokens or self.counts)

    def tokens_read_as(self, vocab: int) -> str | None:
        """How raw --tokens files of V are read, in words for the run's description
        ("uint32 tokens, the default above V=65536"); None for text, counts or .npy files
        alone (they carry their type)."""
        if not self.tokens or all(name.endswith(".npy") for name in self.tokens):
            return None
        dtype = sources.token_dtype(vocab, self.token_dtype)
        if self.token_dtype is not None:
            return f"{dtype} tokens"
        side = "up to" if vocab <= sources.UINT16_MAX_VOCAB else "above"
        return f"{dtype} tokens, the default {side} V={sources.UINT16_MAX_VOCAB}"


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
    return count_found(resolve_spec(spec), _spec_vocab(spec), workers, progress, dask,
                       dask_workers)


def _spec_vocab(spec: CorpusSpec) -> int:
    if spec.tokens and spec.vocab is None:
        raise BadInput("--tokens needs --vocab V (the tokenizer's vocabulary size)")
    return spec.vocab if spec.vocab is not None else corpus.BYTE_VOCAB


def resolve_spec(spec: CorpusSpec) -> tuple[sources.Source, ...]:
    """The files a spec's text or token inputs name, raw tokens read as V says."""
    dtype = sources.token_dtype(_spec_vocab(spec), spec.token_dtype) if spec.tokens else None
    return sources.resolve(spec.texts or spec.tokens, dtype)


def count_found(found: Sequence[sources.Source], vocab: int, workers: int | None = None,
                progress: counting.Progress | None = None, dask: str | None = None,
                dask_workers: int = 2) -> CountsFile:
    """Count resolved sources, as `count_corpus` counts a spec's."""
    streamed: dict[str, int] = {}  # a stream's size is known only once it has ended
    if dask is None:
        counts = counting.count_sources(found, vocab, workers, progress=progress,
                                        stream_bytes=streamed)
    else:
        from bob.records.dask_count import count_on_dask
        counts = count_on_dask(found, vocab, None if dask == "local" else dask,
                               workers=dask_workers, progress=progress)
    return CountsFile.of(counts, [(s.name, streamed[s.name] if s.is_stream else s.size)
                                  for s in found])


def count_sequences(sequences: Sequence[tuple[str, np.ndarray]], vocab: int) -> CountsFile:
    """The counts of symbol sequences in memory (a text's bytes, a tokenizer's ids): the
    pairs within each, none across two, as `count_corpus` counts files."""
    tally = counting.Tally(vocab)
    sizes = []
    for name, symbols in sequences:
        symbols = np.asarray(symbols).reshape(-1)
        if symbols.size and symbols.dtype.kind not in "iu":
            raise BadInput(f"{name}: symbols are integers, not {symbols.dtype}")
        outside = (symbols < 0) | (symbols >= vocab)
        if outside.any():
            i = int(np.argmax(outside))
            raise BadInput(f"{name}: symbol {int(symbols[i])} at position {i} is not in "
                           f"[0, V={vocab})")
        if symbols.size:
            tally.add_block(symbols.astype(np.uint32), -1)
        sizes.append((name, int(symbols.size)))
    counts = tally.result()
    if counts.transitions == 0:
        raise BadInput(f"{', '.join(name for name, _ in sequences)}: no transitions (at least "
                       "two symbols are needed)")
    return CountsFile.of(counts, sizes)


def corpus_record(counted: CountsFile, description: str) -> InputRecord:
    """The corpus-mode input record of counts the device table can hold: the K pairs that
    were counted and their weights C / N (each formed as `corpus.weights` forms it)."""
    if counted.vocab > MAX_VOCAB:
        raise BadInput(f"{description}: V={counted.vocab} is above the largest table Bob "
                       f"trains (V={MAX_VOCAB})")
    keys, values = counted.counts.pairs()
    return InputRecord.sparse(counted.vocab, keys, weights_of(values, counted.transitions),
                              (), source=description)


def require_one_source(texts: Sequence[str] | None, input_record: str | None,
                       spec: CorpusSpec | None) -> None:
    """BadInput when the training data is given two ways (texts or a corpus spec, and an
    input record)."""
    if spec is not None and spec.given:
        if input_record is not None or texts:
            raise BadInput("give either --text files or an --input record, not both")
    elif input_record is not None and texts:
        raise BadInput("give either texts or an input_record, not both")


def training_data(texts: Sequence[str] | None = None, input_record: str | None = None,
                  spec: CorpusSpec | None = None,
                  admit: Callable[[int], None] | None = None,
                  val_fraction: float | None = None) -> TrainingData:
    """The training data: text files (corpus mode), an input record, or the built-in corpus.

    `admit(V)` runs once V is known, before the data is counted where it can be (token
    files name V) and before any record is built: a refusal there costs nothing.
    `val_fraction` F holds the last F of the data out as validation (texts, token files,
    the built-in corpus): the record is the rest's, `validation` the held-out part's.
    """
    require_one_source(texts, input_record, spec)
    check_val_fraction(val_fraction)
    admit = admit or (lambda vocab: None)
    if spec is None or not spec.given:
        spec = CorpusSpec(texts=tuple(texts or ()))
    if val_fraction is not None and (spec.counts or input_record is not None):
        given = (f"a counts file ({spec.counts})" if spec.counts
                 else f"an input record ({input_record})")
        raise BadInput(f"--val-fraction holds out the end of a text or token sequence; "
                       f"{given} keeps no order to cut: give the texts or token files, or "
                       "validation data (--val-text, --val-tokens, --val-counts)")
    if spec.counts:
        counted = count_corpus(spec)
        admit(counted.vocab)
        return TrainingData(corpus_record(counted, counted.name), None, counted.name,
                            known_optimum=counted.optimum,
                            sources=DataSources("counts", (spec.counts,)))
    if input_record is not None:
        streamed = stream_kind(input_record) is not None
        record = InputRecord.read(input_record)
        return TrainingData(replace_prompts(record, ()), None, input_record,
                            sources=DataSources("input", (input_record,), stream=streamed))
    if spec.given:
        return _sequence_data(spec, admit, val_fraction)
    return _builtin_data(val_fraction)


def _sequence_data(spec: CorpusSpec, admit: Callable[[int], None],
                   val_fraction: float | None) -> TrainingData:
    """Text or token files counted by the streamed, parallel engine (directories, globs
    and URLs too), split where --val-fraction asks."""
    vocab = _spec_vocab(spec)
    if spec.tokens:
        admit(vocab)  # token files: refused before they are counted
    found = resolve_spec(spec)
    given = spec.texts or spec.tokens
    # Texts as given; token files as found (a directory's files), as a counts file names them.
    names = ", ".join("stdin" if name == sources.STDIN else name
                      for name in (given if spec.texts else (s.name for s in found)))
    recorded = DataSources(
        "tokens" if spec.tokens else "text", given, vocab if spec.tokens else None,
        sources.token_dtype(vocab, spec.token_dtype) if spec.tokens else None, val_fraction,
        next((token for token in map(sources.first_token, found) if token is not None),
             None), stream=any(source.is_stream for source in found))
    validation, notes = None, ()
    if val_fraction is None:
        counted = count_corpus(spec)  # as `bob count` counts it
    else:
        found, held_out = sources.split_tail(found, val_fraction)
        _require_both_parts(found, held_out, val_fraction, names)
        validation = corpus_record(count_found(held_out, vocab),
                                   f"the last {percent(val_fraction)} of {names}")
        notes = (held_out_note(val_fraction),)
        counted = count_found(found, vocab)
    admit(counted.vocab)
    read_as = spec.tokens_read_as(vocab)
    description = names if read_as is None else f"{names} ({read_as})"
    return TrainingData(corpus_record(counted, names), None, description,
                        known_optimum=counted.optimum, sources=recorded,
                        validation=validation, notes=notes)


def percent(fraction: float) -> str:
    """0.1 as 10%, 0.005 as 0.5%."""
    return f"{100 * fraction:.6g}%"


def held_out_note(fraction: float) -> str:
    """What --val-fraction did to the data, as the report's data row says it."""
    return f"the first {percent(1 - fraction)}; the last {percent(fraction)} validates"


BUILTIN_DESCRIPTION = "the built-in corpus (CPython's pydoc topics)"


def _builtin_data(val_fraction: float | None) -> TrainingData:
    """The built-in corpus (its bytes in memory), split where --val-fraction asks."""
    text = corpus.builtin_corpus()
    recorded = DataSources("builtin", val_fraction=val_fraction,
                           first_symbol=text[0] if text else None)
    validation, notes = None, ()
    if val_fraction is not None:
        cut = int(len(text) * (1.0 - val_fraction))
        text, held_out = text[:cut], text[cut:]
        if len(text) < 2 or len(held_out) < 2:
            raise BadInput(f"--val-fraction {val_fraction:g} leaves {len(text)} bytes to train "
                           f"on and {len(held_out)} to validate: each needs a pair")
        validation = InputRecord.corpus(
            corpus.weights(corpus.counts_from_bytes(held_out, "the built-in corpus")), (),
            source=f"the last {percent(val_fraction)} of the built-in corpus")
        notes = (held_out_note(val_fraction),)
    counts = corpus.counts_from_bytes(text, "the built-in corpus")
    record = InputRecord.corpus(corpus.weights(counts), (), source=BUILTIN_DESCRIPTION)
    return TrainingData(record, counts, BUILTIN_DESCRIPTION, sources=recorded,
                        validation=validation, notes=notes)


def check_val_fraction(fraction: float | None) -> None:
    """BadInput unless `fraction` is None or a number in (0, 1)."""
    if fraction is None:
        return
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not (
            0 < fraction < 1):
        raise BadInput(f"--val-fraction {fraction!r} is not a fraction in (0, 1): the last "
                       "F of the data validates, the rest trains")


def _require_both_parts(before: Sequence[sources.Source], after: Sequence[sources.Source],
                        fraction: float, names: str) -> None:
    """BadInput unless each side of the cut holds a pair of symbols."""
    def pairs(part: Sequence[sources.Source]) -> int:
        return sum(max(source.tokens - 1, 0) for source in part)

    if not pairs(before) or not pairs(after):
        unit = "byte" if all(s.dtype == "|u1" for s in (*before, *after)) else "token"
        raise BadInput(f"{names}: --val-fraction {fraction:g} leaves "
                       f"{sum(s.tokens for s in before)} {unit}s to train on and "
                       f"{sum(s.tokens for s in after)} to validate: each needs a pair")


def data_given_by(recorded: DataSources) -> tuple[tuple[str, ...] | None, str | None,
                                                   CorpusSpec | None]:
    """(texts, input record, spec) that give the data the sources recorded again."""
    if recorded.kind == "text":
        return recorded.paths, None, None
    if recorded.kind == "input":
        return None, recorded.paths[0], None
    if recorded.kind == "counts":
        return None, None, CorpusSpec(counts=recorded.paths[0])
    if recorded.kind == "tokens":
        return None, None, CorpusSpec(tokens=recorded.paths, vocab=recorded.vocab,
                                      token_dtype=recorded.token_dtype or "uint16")
    return None, None, None  # the built-in corpus


def validation_record(spec: CorpusSpec | None, vocab: int) -> InputRecord | None:
    """The validation data's corpus record (--val, --val-tokens, --val-counts), or None."""
    if spec is None or not spec.given:
        return None
    counted = count_corpus(replace(spec, vocab=spec.vocab or (None if spec.counts else vocab)))
    if counted.vocab != vocab:  # named by the counts file where one was given
        raise BadInput(f"{spec.counts or counted.name}: validation data has "
                       f"V={counted.vocab}, the model V={vocab}")
    return corpus_record(counted, counted.name)


SUCCESSOR_BLOCK = 1 << 24  # keys examined at a time: a bounded temporary beside the record


def successor_ranges(record: InputRecord) -> Ranges:
    """The symbols the record's data has as a next symbol (its targets, or the columns of
    its pairs), as ranges: what a checkpoint records for generation's --seen-only."""
    seen = np.zeros(record.vocab, bool)
    if record.mode == "hard":
        assert record.targets is not None
        seen[record.targets] = True
        return symbol_ranges(seen)
    assert record.keys is not None and record.values is not None
    vocab = np.uint64(record.vocab)
    for start in range(0, record.keys.size, SUCCESSOR_BLOCK):
        keys = record.keys[start:start + SUCCESSOR_BLOCK]
        counted = record.values[start:start + SUCCESSOR_BLOCK] > 0
        seen[(keys[counted].astype(np.uint64) % vocab).astype(np.intp)] = True
    return symbol_ranges(seen)


def replace_prompts(record: InputRecord, prompts: Sequence[int]) -> InputRecord:
    prompts_array = np.asarray(prompts, dtype=np.uint32)
    if record.mode == "hard":
        return InputRecord(mode="hard", vocab=record.vocab, targets=record.targets,
                           prompts=prompts_array, source=record.source)
    return InputRecord(mode="corpus", vocab=record.vocab, keys=record.keys,
                       values=record.values, prompts=prompts_array, source=record.source)


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
    where: str  # "this machine, N threads at most" or the Dask cluster
    tokens_read_as: str | None = None  # raw token files' type, in words (text: None)

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else float("inf")

    def to_json(self) -> dict:
        return {"counts": self.out, "vocab": self.vocab,
                "layout": "sparse" if self.sparse else "dense", "files": self.files,
                "bytes": self.bytes, "transitions": self.transitions,
                "optimum": self.optimum, "digest": self.digest, "seconds": self.seconds,
                "bytes_per_second": self.bytes_per_second, "where": self.where,
                "tokens_read_as": self.tokens_read_as}


def count(spec: CorpusSpec, out: str, overwrite: bool = False, workers: int | None = None,
          dask: str | None = None, dask_workers: int = 2,
          progress: counting.Progress | None = None) -> CountReport:
    """Count a corpus into a counts file (`bob count`)."""
    if spec.counts:
        raise BadInput("bob count reads text or token files, not a counts file")
    check_output_file(out, "counts file")  # before the count, which may take hours
    if os.path.exists(out) and not overwrite:
        raise BadInput(f"{out}: exists; pass --overwrite to replace it")
    if os.path.lexists(out):  # only an existing file can be an input: list them only then
        role = "token file" if spec.tokens else "counted file"
        require_apart(out, "counts file",
                      [(path, role) for path in sources.local_files(spec.texts or spec.tokens)])
    if workers is not None and workers < 1:
        raise BadInput(f"--workers must be >= 1, not {workers}")
    begun = time.perf_counter()
    counted = count_corpus(spec, workers, progress, dask, dask_workers)
    seconds = time.perf_counter() - begun
    counted.save(out)
    if dask is None:
        where = f"this machine, {workers or counting.default_workers()} threads at most"
    else:
        where = (f"a Dask LocalCluster of {dask_workers} workers" if dask == "local"
                 else f"the Dask scheduler at {dask}")
    return CountReport(out, counted.vocab, counted.counts.is_sparse, len(counted.sources),
                       sum(size for _, size in counted.sources), counted.transitions,
                       counted.optimum, counted.digest, seconds, where,
                       spec.tokens_read_as(counted.vocab))
