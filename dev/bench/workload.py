"""What the contenders train on: one input record per table, and token files for the
whole-command rows.

- Hard mode: one random target per row (`bench_targets`, seed TARGET_SEED).
- Corpus mode: a sparse random corpus of `typical_pairs(V)` pairs
  (``bob.host.check.random_record``, seed TARGET_SEED), or the pairs of a token file counted
  with Bob's counter. The peers make it a dense T on their own device; Bob's arena scatters
  it.
- Token files (train.bin/val.bin, nanoGPT's uint16): the ones given, or a corpus made here,
  by `dev/bench/token_corpus.py` (a BPE tokenizer over text that ships with Python) where
  the tokenizers package is installed and V is above the byte alphabet, else a Zipf-like
  stream of ids, as `dev/bench/bench_count.py` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bob.config import Mode
from bob.host.check import random_record
from bob.host.data import CorpusSpec, corpus_record, count_corpus
from bob.program.bob import BobConfig, typical_pairs
from bob.records.binary import InputRecord
from dev.bench.peers import bench_targets
from dev.bench.tables import TARGET_SEED

BYTE_ALPHABET = 256  # ids a byte-level BPE tokenizer has before its first merge
ZIPF_TOKENS = 300_000  # about what token_corpus.py's default text gives
ZIPF_HEAD_IDS = 21553  # ids a BPE tokenizer's head uses in practice; the rest stay rare
ZIPF_EXPONENT = 1.1
ZIPF_OFFSET = 10.0  # flattens the very top ranks, as merges of frequent bytes do
VAL_FRACTION = 0.1


@dataclass(frozen=True)
class Workload:
    """The record every contender of one table trains on, and what it is."""

    record: InputRecord
    data: str  # "random targets (seed 0)", "random corpus ...", "tokens FILE"
    tokens: TokenCorpus | None = None  # given token files (corpus mode), else made per table


@dataclass(frozen=True)
class TokenCorpus:
    """A training and a validation token file (raw uint16)."""

    train: Path
    val: Path
    how: str  # where they come from
    made: tuple[Path, ...] = ()  # the files written here (the caller deletes them)


def bench_workload(mode: Mode, vocab: int, tokens: str | None = None,
                   val_tokens: str | None = None) -> Workload:
    """The table's record: random targets, a random sparse corpus, or a token file's pairs."""
    if mode == "hard":
        record = InputRecord.hard(bench_targets(vocab), (), source="bench targets")
        return Workload(record, f"random targets (seed {TARGET_SEED})")
    if tokens is None:
        config = BobConfig(vocab=vocab, prompts=0, updates=0, mode="corpus",
                           pairs=typical_pairs(vocab))
        record = random_record(config, TARGET_SEED)
        return Workload(record, f"random corpus, {record.pairs:,} pairs (seed {TARGET_SEED})")
    counted = count_corpus(CorpusSpec(tokens=(tokens,), vocab=vocab))
    record = corpus_record(counted, counted.name)
    # Absolute: the commands run in directories of their own.
    given = TokenCorpus(Path(tokens).resolve(), Path(val_tokens or tokens).resolve(), "given")
    return Workload(record, f"tokens {tokens}, {record.pairs:,} pairs", given)


def zipf_tokens(count: int, vocab: int, seed: int = TARGET_SEED) -> np.ndarray:
    """`count` uint16 ids below V: rank r drawn with weight 1/(r + 10)^1.1, ids permuted."""
    ids = min(vocab, ZIPF_HEAD_IDS)
    rng = np.random.default_rng(seed)
    weights = 1.0 / (np.arange(ids) + ZIPF_OFFSET) ** ZIPF_EXPONENT
    cdf = np.cumsum(weights) / weights.sum()
    ranks = np.minimum(np.searchsorted(cdf, rng.random(count)), ids - 1)
    return rng.permutation(ids).astype("<u2")[ranks]


def token_corpus(directory: Path, vocab: int) -> TokenCorpus:
    """`directory`'s train.bin and val.bin, made there first where both are missing."""
    train, val = directory / "train.bin", directory / "val.bin"
    if train.exists() and val.exists():
        return TokenCorpus(train, val, f"given ({directory})")
    if train.exists() or val.exists():
        raise ValueError(f"{directory}: has one of train.bin and val.bin; give both or neither")
    directory.mkdir(parents=True, exist_ok=True)
    if vocab > BYTE_ALPHABET:
        try:
            from dev.bench.token_corpus import TOKEN_FILES, write_token_corpus

            summary = write_token_corpus(directory, vocab, VAL_FRACTION)
            return TokenCorpus(train, val, f"BPE of Python's own text ({summary})",
                               tuple(directory / name for name in TOKEN_FILES))
        except ImportError:
            pass  # no tokenizers package: the Zipf-like stream stands in
    ids = zipf_tokens(ZIPF_TOKENS, vocab)
    split = int(len(ids) * (1.0 - VAL_FRACTION))
    ids[:split].tofile(train)
    ids[split:].tofile(val)
    return TokenCorpus(train, val, f"a Zipf-like stream of {len(ids):,} ids below "
                       f"{min(vocab, ZIPF_HEAD_IDS)}", (train, val))
