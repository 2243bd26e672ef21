"""Large vocabularies on the GPU (V up to 65536, and a GPT-2-sized V = 50257).

    PYTHONPATH=src python -m pytest -m gpu tests/test_vocab64_gpu.py -s    # on an H200

- V = 16384: byte identity with the CPU over 2 updates, hard and corpus: the fused
  schedule on cuda (against the seed schedule on the CPU), the seed schedule on cuda,
  and the fused schedule on nv.
- V = 32768 and 65536: one fused invocation of 2 updates on cuda, the whole plan (in
  corpus mode the scatter of 64 sparse pairs a row into the weights table first, keys past
  2**32 among them). The whole table is checked finite and a few rows, the first and the
  last among them (offsets past 2**32 and 2**34 bytes), against the NumPy reference run
  on those rows alone; the full CPU run would take hours and 100 GiB.
- V = 50257: `bob count --tokens` then `bob train --counts --backend cuda` end to end.

Memory: at V = 65536 a table is 16 GiB; the corpus plan holds five (the scattered weights
the fifth: 80 GiB of the H200's 139), and the host reads one table back at a time.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bob.kernels.signatures as sig
from bob.backends import BackendChoice, choose_backend
from bob.cli.main import main
from bob.config import Hyper
from bob.errors import BackendUnavailable
from bob.host.check import differential_check
from bob.kernels import reference as ref
from bob.plan.certificate import require_certified
from bob.program.bob import (
    HEALTH_TENSOR,
    WEIGHTS_TENSOR,
    BobConfig,
    adam_scalar_table,
    build_plan,
)
from bob.records.binary import InputRecord
from conftest import bob_config
from large_vocab import Rows, fused_rows_reference
from test_fused_gpu import train_both

gpu = pytest.mark.gpu
BLOCK_ROWS = 1024  # rows generated and written at a time: 256 MiB at V = 65536


# -- V = 16384: every byte ------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_fused_on_cuda_at_16384_equals_the_cpu(cuda_choice: BackendChoice, mode: str) -> None:
    train_both(cuda_choice, bob_config(vocab=16384, prompts=2, updates=2, mode=mode), 2)


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_seed_on_cuda_at_16384_equals_the_cpu(cuda_choice: BackendChoice, mode: str) -> None:
    config = bob_config(vocab=16384, prompts=2, updates=2, mode=mode, schedule="seed")
    report = differential_check(("cpu", "cuda"), config, 2)
    assert report.identical, report.difference


@gpu
@pytest.mark.parametrize("arena", ["device", "host"])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_fused_on_nv_at_16384_equals_the_cpu(mode: str, arena: str) -> None:
    pytest.importorskip("cuda.bindings.nvrtc", reason="the nv backend compiles with NVRTC")
    try:
        choose_backend("nv")
    except BackendUnavailable as why:
        pytest.skip(f"the nv backend cannot run here: {why}")
    config = bob_config(vocab=16384, prompts=2, updates=2, mode=mode, schedule="fused")
    report = differential_check(("cpu", "nv"), config, 2, arenas=("device", arena))
    assert report.identical, report.difference


# -- V = 32768 and 65536: finite everywhere, exact on sampled rows -------------------------


def write_blocks(backend, name: str, vocab: int, make_block) -> None:
    """Write tensor `name` (f32[V][V]) BLOCK_ROWS rows at a time: make_block(first, rows)."""
    for first in range(0, vocab, BLOCK_ROWS):
        rows = min(BLOCK_ROWS, vocab - first)
        block = np.ascontiguousarray(make_block(first, rows), np.float32)
        backend.write_tensor(name, block.reshape(-1).view(np.uint8), offset=4 * first * vocab)


def read_rows(backend, name: str, vocab: int, rows: np.ndarray) -> np.ndarray:
    """Rows of a V x V tensor, after checking every element of it is finite."""
    table = np.frombuffer(backend.read_tensor(name), np.float32).reshape(vocab, vocab)
    assert np.isfinite(table).all(), f"{name} has non-finite elements"
    picked = table[rows].copy()
    del table
    return picked


PAIRS_PER_ROW = 64  # typical_pairs: the successors per previous token of a large text


def sparse_record(rng: np.random.Generator, vocab: int, prompt: np.ndarray) -> InputRecord:
    """Up to PAIRS_PER_ROW random columns a row (duplicates fall away), weights summing to
    1: keys reach (V - 1) V + V - 1, past 2**32 at V = 65536."""
    columns = rng.integers(0, vocab, (vocab, PAIRS_PER_ROW), dtype=np.uint64)
    keys = np.unique(np.arange(vocab, dtype=np.uint64)[:, None] * np.uint64(vocab) + columns)
    values = rng.random(keys.size, dtype=np.float32)
    values = (values / values.sum(dtype=np.float64)).astype(np.float32)
    return InputRecord.sparse(vocab, keys, values, prompt)


def dense_rows(record: InputRecord, rows: np.ndarray) -> np.ndarray:
    """These rows of the record's V x V weights, built from its pairs alone."""
    vocab = record.vocab
    assert record.keys is not None and record.values is not None
    out = np.zeros((len(rows), vocab), np.float32)
    for i, row in enumerate(rows.tolist()):
        first, last = np.searchsorted(record.keys, [row * vocab, (row + 1) * vocab])
        out[i, (record.keys[first:last] - np.uint64(row * vocab)).astype(np.int64)] = \
            record.values[first:last]
    return out


@gpu
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab", [pytest.param(32768, marks=pytest.mark.smoke), 65536])
def test_a_large_fused_invocation_matches_the_reference_rows(cuda_choice: BackendChoice,
                                                             vocab: int, mode: str) -> None:
    """The sparse pairs go into `input` and the whole plan runs, the scatter included: a
    corpus of every cell (the dense weights a table is) would be 2**32 pairs at V = 65536,
    past MAX_PAIRS, so the corpus here is PAIRS_PER_ROW columns a row."""
    updates = 2
    rng = np.random.default_rng(vocab)
    prompt = np.array([vocab - 1], np.uint32)
    record = sparse_record(rng, vocab, prompt) if mode == "corpus" else None
    config = BobConfig(vocab=vocab, prompts=1, updates=updates, mode=mode,  # type: ignore[arg-type]
                       schedule="fused", pairs=0 if record is None else record.pairs)
    plan = build_plan(config, cuda_choice.target, Hyper(), compiled=cuda_choice.regions)
    region = config.fused_region(cuda_choice.target)
    fused = [launch for launch in plan.launches if launch.region == region]
    # the held and cluster kernels run both updates in one launch; streamed rows take one
    assert len(fused) == (1 if region in sig.HELD_ROWS else updates)
    checked = np.array([0, 1, vocab // 2 + 3, vocab - 1])
    parameters = {}  # the checked rows' initial parameters

    def parameter_block(first: int, rows: int) -> np.ndarray:
        block = (rng.random((rows, vocab), dtype=np.float32) - np.float32(0.5)) * np.float32(8)
        if first == 0:
            block[0] = 0.0  # a row of ties
        for r in checked[(checked >= first) & (checked < first + rows)]:
            parameters[int(r)] = block[r - first].copy()
        return block

    targets = rng.integers(0, vocab, vocab, dtype=np.uint32)
    targets[vocab - 1] = vocab - 1

    def zeros(first: int, rows: int) -> np.ndarray:
        return np.zeros((rows, vocab), np.float32)

    steps = adam_scalar_table(Hyper(), 1, updates)
    with cuda_choice.open(require_certified(plan)) as backend:
        write_blocks(backend, "parameters", vocab, parameter_block)
        write_blocks(backend, "first_moment", vocab, zeros)
        write_blocks(backend, "second_moment", vocab, zeros)
        if record is None:
            backend.write_tensor("input", targets.tobytes() + prompt.tobytes())
        else:  # the pairs, scattered by the load submission into the cleared table
            backend.write_tensor("input", record.payload())
            backend.clear_tensors([WEIGHTS_TENSOR])
        backend.write_tensor("adam_scalars", steps.tobytes())
        backend.run(range(plan.submission_count))
        got = {name: read_rows(backend, name, vocab, checked)
               for name in ("parameters", "first_moment", "second_moment", "gradients")}
        loss = np.frombuffer(backend.read_tensor("training_loss"), np.float32)
        initial = np.frombuffer(backend.read_tensor("initial_loss"), np.float32)
        logits = np.frombuffer(backend.read_tensor("logit_rows"), np.float32)
        prediction = np.frombuffer(backend.read_tensor("predictions"), np.uint32)
        health = np.frombuffer(backend.read_tensor(HEALTH_TENSOR), np.uint64)
        if record is not None:  # the table the loss read: the pairs' cells, zeros elsewhere
            weights = read_rows(backend, WEIGHTS_TENSOR, vocab, checked)
            assert weights.tobytes() == dense_rows(record, checked).tobytes()

    start = np.stack([parameters[int(r)] for r in checked])
    zero = np.zeros_like(start)
    rows = (Rows(start, zero, zero, targets=targets[checked]) if mode == "hard" else
            Rows(start, zero, zero, weights=dense_rows(record, checked)))
    want = fused_rows_reference(rows, steps, vocab)
    for name, expected in zip(("parameters", "first_moment", "second_moment", "gradients"),
                              want, strict=False):
        assert got[name].tobytes() == expected.tobytes(), f"V={vocab} {mode}: {name}"
    assert loss[checked].tobytes() == want[4].tobytes()
    assert np.isfinite(loss).all() and np.isfinite(initial).all()
    assert health.tolist() == [0, 0, 0]  # bob-health over 2^32-element tables agrees
    scalars = ref.LossScalars.for_vocab(vocab)
    if mode == "hard":
        first_loss, _ = ref.loss_gradient_hard_rows(start, targets[checked], scalars)
    else:
        first_loss, _ = ref.loss_gradient_corpus_rows(
            start, rows.weights, ref.LossScalars(scalars.log2e, scalars.ln2))
    assert initial[checked].tobytes() == first_loss.tobytes()
    # The predictions run after training: the gather reads row V - 1, 16 GiB in at 65536.
    assert logits.tobytes() == got["parameters"][-1].tobytes()
    assert prediction[0] == ref.greedy_argmax_rows(got["parameters"][-1:])[0]
    print(f"V={vocab} {mode}: {len(checked)} rows identical to the reference, all finite")


# -- V = 50257: a token file counted sparse, then trained -----------------------------------


@gpu
def test_count_then_train_gpt2_sized_tokens_on_cuda(cuda_choice: BackendChoice, tmp_path: Path,
                                                    capsys) -> None:
    """A GPT-2-sized corpus: a train.bin of 100M uint16 tokens at V = 50257, counted sparse,
    trained on the GPU, with the exact validation loss of a held-out token file."""
    vocab, tokens, held_out = 50257, 100_000_000, 1_000_000
    rng = np.random.default_rng(15)
    # A walk with small steps: sparse counts with structure, every token below V.
    walk = np.cumsum(rng.integers(1, 50, tokens + held_out)) % vocab
    path, val, counts = tmp_path / "train.bin", tmp_path / "val.bin", tmp_path / "train.counts"
    walk[:tokens].astype("<u2").tofile(path)
    walk[tokens:].astype("<u2").tofile(val)
    del walk
    assert main(["count", "--tokens", str(path), "--vocab", str(vocab), "-o", str(counts),
                 "--json"]) == 0
    counted = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counted["transitions"] == tokens - 1
    checkpoint = tmp_path / "bob.safetensors"
    assert main(["train", "--counts", str(counts), "--backend", "cuda", "--schedule", "fused",
                 "--steps", "2", "-N", "2", "-c", str(checkpoint), "--val-tokens", str(val),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["global_step"] == 2 and report["steps"] == 2
    assert np.isfinite(report["loss"]) and report["loss"] < report["initial_loss"]
    assert report["optimum"] == pytest.approx(counted["optimum"])
    # The held-out walk has the training walk's statistics: its loss is finite, near the
    # training loss, and above the training data's optimum only by what 2 updates leave.
    assert np.isfinite(report["val_loss"])
    assert abs(report["val_loss"] - report["loss"]) < 0.05 * report["loss"]
    print(f"V={vocab}, {tokens:,} tokens: loss {report['initial_loss']:.6f} -> "
          f"{report['loss']:.6f}, validation {report['val_loss']:.6f}, optimum "
          f"{report['optimum']:.6f}")
    # The checkpoint holds three 10 GiB tables; its header and one row are read, not all.
    from safetensors import safe_open
    with safe_open(str(checkpoint), framework="numpy") as opened:
        assert opened.metadata()["vocab"] == str(vocab)
        row = opened.get_slice("parameters")[vocab - 1:vocab, :]
        assert row.shape == (1, vocab) and np.isfinite(row).all()
    assert checkpoint.stat().st_size > 3 * 4 * vocab * vocab


@gpu
def test_cuda_seed_schedule_plan_at_65536_certifies(cuda_choice: BackendChoice) -> None:
    """The seed schedule's AdamW launch at 2**32 elements: certified with compiled code."""
    config = BobConfig(vocab=65536, prompts=1, updates=1, schedule="seed")
    plan = build_plan(config, cuda_choice.target, Hyper(), compiled=cuda_choice.regions)
    require_certified(plan)
