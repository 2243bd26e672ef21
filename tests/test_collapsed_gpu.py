"""Collapsed tables on the GPU backends, byte for byte against the CPU (`pytest -m gpu`).

Every GPU backend x schedule x mode (corpus with and without validation on the device)
trains collapsed tables pipelined from a table that is not zero, then predicts, and every
tensor of the arena is compared with the CPU backend's after the same invocations. The
index has light rows (a warp each on the GPU) and heavy ones (the whole block), rows whose
max is a zero of both signs, and rows no data names. One large V (a token corpus's shape
at GPT-2's vocabulary) is in the smoke tier too.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bob.backends import choose_backend
from bob.config import Hyper
from bob.errors import BackendUnavailable
from bob.host.check import compare_backends
from bob.host.session import Session, train
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord
from bob.records.checkpoint import TrainingState
from bob.records.collapsed import ClassIndex, CollapsedCheckpoint

pytestmark = pytest.mark.gpu

TABLES = ("parameters", "first_moment", "second_moment")


def opened(name: str):
    try:
        return choose_backend(name)
    except BackendUnavailable as why:
        pytest.skip(str(why))


def corpus_record(rng: np.random.Generator, vocab: int, pairs: int, heavy_rows: int = 3,
                  prompts=(1, 0)) -> InputRecord:
    """Zipf-like successors, a few rows naming hundreds of columns (block rows): the first
    rows, and the last, which is not its light rows' block's."""
    rows = np.minimum(rng.zipf(1.3, pairs) - 1, vocab - 1)
    columns = rng.integers(0, vocab, pairs)
    keys = [rows * vocab + columns]
    for k, r in enumerate([*range(heavy_rows - 1), vocab - 1][:heavy_rows]):
        keys.append(r * vocab + rng.choice(vocab, min(vocab, 150 + 40 * k), replace=False))
    keys = np.unique(np.concatenate(keys))
    values = rng.random(keys.size)
    return InputRecord.sparse(vocab, keys, (values / values.sum()).astype(np.float32), prompts)


def hard_record(rng: np.random.Generator, vocab: int, prompts=(1, 0)) -> InputRecord:
    return InputRecord.hard(rng.integers(0, vocab, vocab).astype(np.uint32), prompts)


def start_table(rng: np.random.Generator, mode: str, index: ClassIndex) -> CollapsedCheckpoint:
    """A table that is not zero: normal values, and rows 1 and 2 all zeros of both signs."""
    vocab = index.vocab
    state = TrainingState(vocab, 0, Hyper(), mode, "", tables="collapsed",
                          exceptions=index.exceptions)
    w = (0.3 * rng.standard_normal(index.classes)).astype(np.float32)
    m = (0.01 * rng.standard_normal(index.classes)).astype(np.float32)
    v = (1e-4 * rng.random(index.classes)).astype(np.float32)
    for r in (1, 2):
        first, last = index.offsets[r], index.offsets[r + 1]
        w[r] = -0.0 if r == 1 else 0.0
        w[vocab + first:vocab + last] = np.where(rng.random(last - first) < 0.5, -0.0, 0.0)
    return CollapsedCheckpoint(state, index, w, m, v)


def run_both(backend: str, config: BobConfig, start: CollapsedCheckpoint,
             record: InputRecord, steps: int, validation: InputRecord | None = None) -> None:
    """`steps` updates in invocations of config.updates on the CPU and on `backend`, then a
    prediction: every tensor of both arenas compared after each."""
    choices = (choose_backend("cpu"), opened(backend))
    with Session(choices[0]) as cpu, Session(choices[1]) as gpu:
        done = [train(session, config, start, record, steps, validation=validation)[-1]
                for session in (cpu, gpu)]
        difference = compare_backends(cpu.last_backend, gpu.last_backend, 2)
        assert difference is None, f"{backend} {config}: {difference}"
        for name in TABLES:
            assert getattr(done[0].checkpoint, name).tobytes() == \
                getattr(done[1].checkpoint, name).tobytes(), name
        assert (done[0].loss, done[0].initial_loss) == (done[1].loss, done[1].initial_loss)
        assert done[0].validation == done[1].validation
        predict = replace(config, updates=0)
        for session in (cpu, gpu):
            session.invoke(predict, done[0].checkpoint, record, "predict",
                           validation=validation)
        difference = compare_backends(cpu.last_backend, gpu.last_backend, -1)
        assert difference is None, f"{backend} {config} predict: {difference}"


def case(vocab: int, mode: str, validation: bool, schedule: str, updates: int,
         seed: int = 7,
         ) -> tuple[BobConfig, CollapsedCheckpoint, InputRecord, InputRecord | None]:
    rng = np.random.default_rng(seed)
    record = hard_record(rng, vocab) if mode == "hard" else corpus_record(rng, vocab, 6 * vocab)
    held_out = corpus_record(rng, vocab, 2 * vocab, heavy_rows=1, prompts=()) \
        if validation else None
    named = record.named_keys()
    if held_out is not None:
        named = np.union1d(named, held_out.named_keys())
    index = ClassIndex.from_keys(vocab, named)
    start = start_table(rng, mode, index)
    config = BobConfig(vocab=vocab, prompts=2, updates=updates, mode=mode, schedule=schedule,
                       pairs=record.pairs,
                       validation_pairs=0 if held_out is None else held_out.pairs,
                       tables="collapsed", exceptions=index.exceptions)
    return config, start, record, held_out


MODES = [("hard", False), ("corpus", False), ("corpus", True)]
MODE_IDS = ["hard", "corpus", "corpus-validation"]


@pytest.mark.smoke
@pytest.mark.parametrize(("mode", "validation"), MODES, ids=MODE_IDS)
@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("backend", ["cuda", "nv"])
def test_collapsed_tables_train_to_the_cpu_s_bytes(backend: str, schedule: str, mode: str,
                                                   validation: bool) -> None:
    config, start, record, held_out = case(300, mode, validation, schedule, updates=3)
    run_both(backend, config, start, record, 7, held_out)


@pytest.mark.parametrize("vocab", [256, 1000, 4099, 8192])
@pytest.mark.parametrize(("mode", "validation"), MODES, ids=MODE_IDS)
@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("backend", ["cuda", "nv"])
def test_collapsed_tables_at_every_size(backend: str, schedule: str, mode: str,
                                        validation: bool, vocab: int) -> None:
    config, start, record, held_out = case(vocab, mode, validation, schedule, updates=2,
                                           seed=vocab)
    run_both(backend, config, start, record, 4, held_out)


@pytest.mark.smoke
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_a_gpt2_sized_vocabulary_trains_to_the_cpu_s_bytes(schedule: str, mode: str) -> None:
    """V = 50257 with a token corpus's shape: most rows named by no data, a few by
    thousands of columns; every tensor compared after two invocations."""
    rng = np.random.default_rng(50257)
    vocab = 50257
    if mode == "hard":
        record = hard_record(rng, vocab)
    else:
        record = corpus_record(rng, vocab, 100_000, heavy_rows=4)
    index = ClassIndex.from_keys(vocab, record.named_keys())
    start = start_table(rng, mode, index)
    config = BobConfig(vocab=vocab, prompts=2, updates=3, mode=mode, schedule=schedule,
                       pairs=record.pairs, tables="collapsed", exceptions=index.exceptions)
    run_both("cuda", config, start, record, 6)


def past_dense_case(vocab: int, mode: str, schedule: str):
    """A vocabulary no dense table holds: V = 200019 hard (a target a row) or V = 262144
    corpus (a Zipf-like stream's pairs: most rows unnamed, a few of thousands of columns)."""
    rng = np.random.default_rng(vocab)
    if mode == "hard":
        record = hard_record(rng, vocab)
    else:
        tokens = np.minimum(rng.zipf(1.2, 400_000) - 1, vocab - 1).astype(np.int64)
        keys, counts = np.unique(tokens[:-1] * vocab + tokens[1:], return_counts=True)
        record = InputRecord.sparse(vocab, keys.astype(np.uint64),
                                    (counts / counts.sum()).astype(np.float32), (1, 0))
    index = ClassIndex.from_keys(vocab, record.named_keys())
    start = start_table(rng, mode, index)
    config = BobConfig(vocab=vocab, prompts=2, updates=2, mode=mode, schedule=schedule,
                       pairs=record.pairs, tables="collapsed", exceptions=index.exceptions)
    return config, start, record


@pytest.mark.parametrize(("vocab", "mode"), [(200019, "hard"), (262144, "corpus")])
@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("backend", ["cuda", "nv"])
def test_vocabularies_past_the_dense_tables_train_to_the_cpu_s_bytes(
        backend: str, schedule: str, vocab: int, mode: str) -> None:
    """Past V = 65536 (keys past 2^32): the whole arena is O(K + V), so every tensor is
    compared, not sampled rows, after two invocations and a prediction."""
    config, start, record = past_dense_case(vocab, mode, schedule)
    run_both(backend, config, start, record, 4)
