"""Collapsed tables against their oracle, the dense tables, byte for byte.

The arithmetic (runs of equal additions, the lanes' replay), every collapsed reference
kernel on edge rows, whole invocations of both schedules and both modes through the
session across invocation boundaries, the conversion both ways, and the layout's choice.
"""

from __future__ import annotations

import numpy as np
import pytest

from bob.backends import choose_backend
from bob.config import Hyper
from bob.host.session import Session
from bob.host.tables import choose_tables, starting_tables
from bob.kernels import reference as ref
from bob.kernels import signatures as sig
from bob.kernels.arith import row_max, row_sum
from bob.kernels.collapsed import reference as collapsed
from bob.kernels.collapsed.runs import add_run, add_runs, lane_sums
from bob.program.bob import BobConfig
from bob.records.binary import InputRecord
from bob.records.checkpoint import Checkpoint, TrainingState
from bob.records.collapsed import ClassIndex, CollapsedCheckpoint
from conftest import assert_same_bits

TABLES = ("parameters", "first_moment", "second_moment")


def _one_by_one(acc: float, x: float, n: int) -> np.float32:
    total, term = np.float32(acc), np.float32(x)
    with np.errstate(all="ignore"):
        for _ in range(n):
            total = np.float32(total + term)
    return total


def _bits(x: np.ndarray | np.float32) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


# -- the arithmetic ---------------------------------------------------------------------


EDGES = np.array([0.0, -0.0, 1e-45, 2e-45, 1.1754942e-38, 1.1754944e-38, 1.0, 0.5, 1.5,
                  3.0e38, np.inf, -np.inf, np.nan, -1.0, 1e-3, 16777216.0, 16777215.0],
                 np.float32)


def test_a_run_of_additions_is_exact_on_edge_values_and_ties() -> None:
    rng = np.random.default_rng(11)
    cases = [(a, x, int(n)) for a in EDGES for x in EDGES for n in (0, 1, 2, 3, 700)]
    # Ties: x an odd multiple of half acc's spacing, from acc's of both parities.
    for _ in range(600):
        exponent = int(rng.integers(-140, 120))
        acc = np.float32(np.ldexp(1.0 + int(rng.integers(0, 2**23)) / 2**23, exponent))
        spacing = max(exponent, -126) - 23
        x = np.float32(np.ldexp(int(rng.integers(0, 64)) * 2 + 1, spacing - int(
            rng.integers(1, 8))))
        cases.append((acc, x, int(rng.integers(1, 3000))))
    for acc, x, n in cases:
        want = _one_by_one(acc, x, n)
        for got in (add_run(acc, x, n), add_runs(np.array([acc]), np.array([x]),
                                                 np.array([n]))[0]):
            assert _bits(got) == _bits(want) or (np.isnan(got) and np.isnan(want)), (
                acc, x, n, got, want)


def test_runs_from_zero_of_small_terms_match_the_chain() -> None:
    rng = np.random.default_rng(12)
    acc = np.zeros(3000, np.float32)
    x = (rng.random(3000) * 10.0 ** rng.integers(-44, 3, 3000)).astype(np.float32)
    n = rng.integers(0, 4097, 3000)
    got = add_runs(acc, x, n)
    want = np.array([_one_by_one(0.0, x[i], int(n[i])) for i in range(3000)], np.float32)
    assert_same_bits("runs", got, want)


@pytest.mark.parametrize("vocab", [2, 3, 255, 256, 257, 1000, 4099])
def test_the_lanes_replay_gives_the_dense_row_sum(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    rows = 24
    rest = (rng.random(rows) * 10.0 ** rng.integers(-40, 2, rows)).astype(np.float32)
    rest[:4] = [0.0, 1e-45, 1.0, 3e38]
    dense = np.repeat(rest[:, None], vocab, axis=1)
    keys = []
    for r in range(rows):
        count = vocab if r == 5 else int(rng.integers(0, min(vocab, 30) + 1))
        columns = np.sort(rng.choice(vocab, count, replace=False))
        dense[r, columns] = (rng.random(count) * 10.0 ** rng.integers(-40, 3, count)
                             ).astype(np.float32)
        keys.append(r * vocab + columns)
    keys = np.concatenate(keys)
    rows_of, columns = keys // vocab, keys % vocab
    got = lane_sums(vocab, rest, rows_of, columns, dense[rows_of, columns])
    assert_same_bits("row sums", got, row_sum(dense))


# -- the reference kernels on edge rows -------------------------------------------------


def _random_index(rng: np.random.Generator, vocab: int, density: float,
                  named: np.ndarray | None = None, full_rows: tuple[int, ...] = ()) -> ClassIndex:
    keys = []
    for r in range(vocab):
        count = vocab if r in full_rows else int(rng.binomial(vocab, density))
        keys.append(r * vocab + rng.choice(vocab, count, replace=False))
    if named is not None:
        keys.append(named)
    return ClassIndex.from_keys(vocab, np.unique(np.concatenate(keys)))


def _rows(index: ClassIndex) -> collapsed.RowClasses:
    return collapsed.RowClasses.of(index.vocab, index.offsets, index.columns)


def _edge_table(rng: np.random.Generator, index: ClassIndex) -> np.ndarray:
    """Classes of every kind: normal values, zeros of both signs (rows whose max is a zero
    of both signs among them), subnormals, huge values whose differences overflow."""
    vocab, classes = index.vocab, index.classes
    w = (rng.standard_normal(classes) * rng.choice([1e-3, 1.0, 10.0], classes)).astype(np.float32)
    w[:vocab][rng.random(vocab) < 0.2] = 0.0
    w[rng.random(classes) < 0.05] = -0.0
    w[rng.random(classes) < 0.02] = np.float32(1e-45)
    w[rng.random(classes) < 0.01] = np.float32(-3e38)
    w[rng.random(classes) < 0.01] = np.float32(3e38)
    # Rows 1 and 2: every value a zero, of both signs: the max's sign takes the order.
    for r in (1, 2)[:vocab - 1]:
        w[r] = np.float32(-0.0) if r == 1 else np.float32(0.0)
        first, last = index.offsets[r], index.offsets[r + 1]
        w[vocab + first:vocab + last] = np.where(rng.random(last - first) < 0.5, -0.0, 0.0)
    return w


@pytest.mark.parametrize("vocab", [2, 3, 256, 257, 1000, 4099])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_every_loss_kernel_equals_the_dense_reference_on_edge_rows(vocab: int, mode: str) -> None:
    rng = np.random.default_rng(vocab + len(mode))
    targets = rng.integers(0, vocab, vocab).astype(np.uint32)
    named = np.arange(vocab) * vocab + targets if mode == "hard" else None
    index = _random_index(rng, vocab, min(0.05, 6 / vocab), named, full_rows=(0,))
    rows = _rows(index)
    w = _edge_table(rng, index)
    dense = index.expand(w, np.arange(vocab))
    scalars = ref.LossScalars.for_vocab(vocab)
    assert_same_bits("row max", collapsed.class_row_max(rows, w), row_max(dense))
    if mode == "hard":
        loss, grad = collapsed.loss_gradient_hard_classes(rows, w, targets, scalars)
        want_loss, want_grad = ref.loss_gradient_hard_rows(dense, targets, scalars)
    else:
        weights = rng.random(index.exceptions).astype(np.float32)
        weights[rng.random(index.exceptions) < 0.3] = 0.0
        weights[rng.random(index.exceptions) < 0.05] = -0.0
        loss, grad = collapsed.loss_gradient_corpus_classes(rows, w, weights, scalars)
        full = np.concatenate([np.zeros(vocab, np.float32), weights])
        dense_weights = index.expand(full, np.arange(vocab))
        want_loss, want_grad = ref.loss_gradient_corpus_rows(dense, dense_weights, scalars)
        assert_same_bits("validation loss", collapsed.loss_corpus_classes(
            rows, w, weights, scalars), want_loss)
    assert_same_bits("loss", loss, want_loss)
    assert_same_bits("gradients", index.expand(grad, np.arange(vocab)), want_grad)


def test_a_nan_and_infinities_in_the_table_give_the_dense_bytes() -> None:
    rng = np.random.default_rng(3)
    vocab = 300
    index = _random_index(rng, vocab, 0.02)
    rows = _rows(index)
    w = rng.standard_normal(index.classes).astype(np.float32)
    w[[7, vocab + 3]] = np.nan
    w[[9, vocab + 11]] = np.inf
    w[[10, vocab + 20]] = -np.inf
    dense = index.expand(w, np.arange(vocab))
    scalars = ref.LossScalars.for_vocab(vocab)
    weights = rng.random(index.exceptions).astype(np.float32)
    loss, grad = collapsed.loss_gradient_corpus_classes(rows, w, weights, scalars)
    full = np.concatenate([np.zeros(vocab, np.float32), weights])
    want_loss, want_grad = ref.loss_gradient_corpus_rows(
        dense, index.expand(full, np.arange(vocab)), scalars)
    assert_same_bits("loss", loss, want_loss)
    assert_same_bits("gradients", index.expand(grad, np.arange(vocab)), want_grad)


def test_a_hard_target_that_is_no_exception_gives_a_nan_loss_and_no_minus_one() -> None:
    index = ClassIndex.from_keys(4, np.array([1, 4 + 2]))  # row 0: column 1; row 1: 2
    rows = _rows(index)
    w = np.zeros(index.classes, np.float32)
    loss, grad = collapsed.loss_gradient_hard_classes(
        rows, w, np.array([1, 3, 0, 0], np.uint32), ref.LossScalars.for_vocab(4))
    assert np.isfinite(loss[0]) and np.isnan(loss[1:]).all()
    assert (grad[1:4] > 0).all()  # the rest's p / V: no -1 term anywhere but row 0's


# -- whole invocations through the session ---------------------------------------------


def _records(rng: np.random.Generator, vocab: int, mode: str, prompts=(1, 0)) -> InputRecord:
    if mode == "hard":
        return InputRecord.hard(rng.integers(0, vocab, vocab).astype(np.uint32), prompts)
    keys = np.unique(rng.integers(0, vocab * vocab, 6 * vocab))
    values = rng.random(keys.size)
    return InputRecord.sparse(vocab, keys, (values / values.sum()).astype(np.float32), prompts)


def _same_checkpoints(dense: Checkpoint, folded: CollapsedCheckpoint, when: str) -> None:
    expanded = folded.dense()
    for name in TABLES:
        assert_same_bits(f"{when}: {name}", getattr(expanded, name), getattr(dense, name))
    assert expanded.state == dense.state


@pytest.mark.parametrize("schedule", ["seed", "fused"])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("vocab", [256, 1000])
def test_invocations_of_collapsed_tables_leave_the_dense_bytes(vocab: int, mode: str,
                                                              schedule: str) -> None:
    rng = np.random.default_rng(vocab)
    record = _records(rng, vocab, mode)
    state = TrainingState(vocab, 0, Hyper(), mode, "")
    dense_start = Checkpoint.zeros(vocab, Hyper(), mode)
    folded_start = starting_tables("collapsed", state, record.named_keys())
    common = dict(vocab=vocab, prompts=2, updates=3, mode=mode, schedule=schedule,
                  pairs=record.pairs)
    dense_config = BobConfig(**common)
    folded_config = BobConfig(**common, tables="collapsed",
                              exceptions=folded_start.index.exceptions)
    with Session(choose_backend("cpu")) as session:
        dense, folded = dense_start, folded_start
        for step in range(2):  # across an invocation boundary
            d = session.invoke(dense_config, dense, record, "train")
            f = session.invoke(folded_config, folded, record, "train")
            assert f.result == d.result, f"invocation {step}: the result records differ"
            _same_checkpoints(d.checkpoint, f.checkpoint, f"invocation {step}")
            dense, folded = d.checkpoint, f.checkpoint
        # Other data: the collapsed table takes its new cells as exceptions, exactly.
        other = _records(np.random.default_rng(vocab + 1), vocab, mode)
        again = folded.reindexed(other.named_keys())
        assert again.index.exceptions >= folded.index.exceptions
        d = session.invoke(replace_pairs(dense_config, other), dense, other, "train")
        f = session.invoke(replace_pairs(folded_config, other, again), again, other, "train")
        assert f.result == d.result
        _same_checkpoints(d.checkpoint, f.checkpoint, "on new data")


def replace_pairs(config: BobConfig, record: InputRecord,
                  start: CollapsedCheckpoint | None = None) -> BobConfig:
    from dataclasses import replace

    changes = {"pairs": record.pairs}
    if start is not None:
        changes["exceptions"] = start.index.exceptions
    return replace(config, **changes)


# -- the layout: conversion, files, the choice ------------------------------------------


def test_dense_tables_collapse_and_expand_exactly() -> None:
    rng = np.random.default_rng(4)
    vocab = 200
    index = _random_index(rng, vocab, 0.03, full_rows=(3,))
    state = TrainingState(vocab, 7, Hyper(), "corpus", "")
    tables = [rng.standard_normal(index.classes).astype(np.float32) for _ in range(3)]
    tables[2] = np.abs(tables[2])
    folded = CollapsedCheckpoint.zeros(state, index).evolved(state, dict(zip(TABLES, tables,
                                                                             strict=True)))
    dense = folded.dense()
    again = CollapsedCheckpoint.of_dense(dense.state, *(getattr(dense, n) for n in TABLES),
                                         index.keys())
    assert again.index == index  # every named column stays an exception
    for name in TABLES:  # the rest of row 3, every column of which is named, stands for none
        assert_same_bits(name, getattr(again.dense(), name), getattr(dense, name))
    unnamed = CollapsedCheckpoint.of_dense(dense.state, *(getattr(dense, n) for n in TABLES))
    for name in TABLES:
        assert_same_bits(name, getattr(unnamed.dense(), name), getattr(dense, name))
    assert unnamed.index.exceptions <= index.exceptions


def test_the_layout_follows_the_data() -> None:
    assert choose_tables("auto", 256, 5000).tables == "dense"
    assert choose_tables("auto", 50257, 93454).tables == "collapsed"
    assert choose_tables("auto", 4096, 4096 * 4096 // 4).tables == "dense"
    assert choose_tables("auto", 65537, 10).tables == "collapsed"
    assert choose_tables("collapsed", 256, 5000).reason == "--tables collapsed"
    with pytest.raises(Exception, match="past the largest dense table"):
        choose_tables("dense", 65537, 10)


@pytest.mark.parametrize("vocab", [65537, 1 << 20])
def test_vocabularies_past_65536_plan_collapsed_and_are_refused_dense(vocab: int) -> None:
    from bob.errors import BadInput
    from bob.plan.certificate import certify
    from bob.program.plans import build_plan

    config = BobConfig(vocab=vocab, prompts=1, updates=2, mode="corpus", pairs=1000,
                       tables="collapsed", exceptions=1000)
    for schedule in ("seed", "fused"):
        from dataclasses import replace

        plan = build_plan(replace(config, schedule=schedule))
        assert certify(plan).holds
        assert plan.tensor("parameters").bytes == 4 * (vocab + 1000)
    with pytest.raises(BadInput, match="vocab must be an integer"):
        BobConfig(vocab=vocab, prompts=1, updates=2, mode="corpus", pairs=1000)


# -- the checkpoint file and the command line --------------------------------------------


def _collapsed_file(path, vocab: int = 300, seed: int = 9) -> CollapsedCheckpoint:
    rng = np.random.default_rng(seed)
    index = _random_index(rng, vocab, 0.02)
    state = TrainingState(vocab, 4, Hyper(), "corpus", "")
    tables = [rng.standard_normal(index.classes).astype(np.float32) for _ in range(3)]
    tables[2] = np.abs(tables[2])
    folded = CollapsedCheckpoint.zeros(state, index).evolved(state, dict(zip(TABLES, tables,
                                                                             strict=True)))
    folded.save(path)
    return folded


def _rewrite(source, target, change) -> None:
    """A copy of a collapsed checkpoint with `change(tensors, metadata)` applied."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(source), framework="numpy") as file:
        metadata = dict(file.metadata())
        tensors = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118
    change(tensors, metadata)
    save_file(tensors, str(target), metadata=metadata)


def _decreasing(tensors, metadata) -> None:
    tensors["row_offsets"] = tensors["row_offsets"].copy()
    tensors["row_offsets"][5] = tensors["row_offsets"][6] + 1


def _unsorted(tensors, metadata) -> None:
    offsets, columns = tensors["row_offsets"], tensors["columns"].copy()
    row = int(np.flatnonzero(np.diff(offsets) >= 2)[0])
    first = int(offsets[row])
    columns[first], columns[first + 1] = columns[first + 1], columns[first]
    tensors["columns"] = columns


def _duplicate(tensors, metadata) -> None:
    offsets, columns = tensors["row_offsets"], tensors["columns"].copy()
    row = int(np.flatnonzero(np.diff(offsets) >= 2)[0])
    columns[int(offsets[row]) + 1] = columns[int(offsets[row])]
    tensors["columns"] = columns


def _outside(tensors, metadata) -> None:
    columns = tensors["columns"].copy()
    columns[-1] = int(metadata["vocab"])
    tensors["columns"] = columns


def _short_offsets(tensors, metadata) -> None:
    tensors["row_offsets"] = tensors["row_offsets"].copy()
    tensors["row_offsets"][-1] -= 1  # the rows' exceptions do not add up to K


def _wrong_count(tensors, metadata) -> None:
    metadata["exceptions"] = str(int(metadata["exceptions"]) + 1)


def _nan(tensors, metadata) -> None:
    tensors["first_moment"] = tensors["first_moment"].copy()
    tensors["first_moment"][3] = np.nan


BAD_FILES = {
    "decreasing offsets": (_decreasing, "row_offsets decrease at row 5"),
    "unsorted columns": (_unsorted, "columns are not strictly increasing"),
    "duplicate columns": (_duplicate, "columns are not strictly increasing"),
    "a column past V": (_outside, "is not below V=300"),
    "offsets that miss K": (_short_offsets, "row_offsets run from 0 to"),
    "a count that lies": (_wrong_count, "expected"),
    "a NaN": (_nan, "not finite"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_a_bad_collapsed_checkpoint_is_refused_in_one_line(tmp_path, capsys, kind) -> None:
    from bob.cli.main import main
    from conftest import contents

    good = tmp_path / "good.safetensors"
    _collapsed_file(good)
    bad = tmp_path / "bad.safetensors"
    change, message = BAD_FILES[kind]
    _rewrite(good, bad, change)
    before = contents(tmp_path)
    for command in (["generate", "-c", str(bad), "--ids", "3", "-n", "5"],
                    ["export", "-c", str(bad), "-o", str(tmp_path / "out.safetensors")]):
        status = main(command)
        err = capsys.readouterr().err.strip()
        assert status == 2, err
        assert len(err.splitlines()) == 1 and str(bad) in err and message in err, err
    assert contents(tmp_path) == before


def test_a_truncated_collapsed_checkpoint_is_refused_in_one_line(tmp_path, capsys) -> None:
    from bob.cli.main import main

    path = tmp_path / "ckpt.safetensors"
    _collapsed_file(path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 100])
    assert main(["generate", "-c", str(path), "--ids", "3", "-n", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err, err


def test_a_collapsed_checkpoint_round_trips_and_is_small(tmp_path) -> None:
    from bob.records.shards import open_checkpoint

    path = tmp_path / "ckpt.safetensors"
    folded = _collapsed_file(path)
    assert open_checkpoint(path) == folded
    assert path.stat().st_size == folded.state.file_bytes
    assert path.stat().st_size < 12 * folded.vocab * folded.vocab / 10


def _text(tmp_path, size: int = 4000):
    text = tmp_path / "small.txt"
    rng = np.random.default_rng(1)
    words = [b"the", b"cat", b"sat", b"on", b"a", b"mat", b"\n", b"dog", b"ran"]
    text.write_bytes(b" ".join(words[i] for i in rng.integers(0, len(words), size)))
    return text


def test_train_says_which_tables_ran_and_resumes_to_the_bytes_of_one_run(tmp_path,
                                                                          capsys) -> None:
    import json

    from bob.cli.main import main

    text = _text(tmp_path)
    whole, half = tmp_path / "whole.safetensors", tmp_path / "half.safetensors"
    common = ["--text", str(text), "--backend", "cpu", "--tables", "collapsed", "-N", "5"]
    assert main(["train", *common, "--steps", "20", "-c", str(whole), "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert (report["tables"], report["tables_reason"]) == ("collapsed", "--tables collapsed")
    assert "collapsed: --tables collapsed" in captured.err
    assert main(["train", *common, "--steps", "10", "-c", str(half)]) == 0
    assert main(["train", *common, "--steps", "10", "-c", str(half), "--resume"]) == 0
    assert whole.read_bytes() == half.read_bytes()
    dense = tmp_path / "dense.safetensors"
    assert main(["train", "--text", str(text), "--backend", "cpu", "--tables", "dense",
                 "-N", "5", "--steps", "20", "-c", str(dense)]) == 0
    from bob.records.shards import open_checkpoint

    expanded = open_checkpoint(whole).dense()
    stored = open_checkpoint(dense).load()
    for name in TABLES:
        assert_same_bits(name, getattr(expanded, name), getattr(stored, name))


def test_dense_tables_past_65536_and_their_export_are_refused_in_one_line(tmp_path,
                                                                          capsys) -> None:
    from bob.cli.main import main
    from conftest import contents

    vocab = 65537
    tokens = tmp_path / "train.bin"
    np.random.default_rng(2).integers(0, vocab, 2000).astype("<u4").tofile(tokens)
    before = contents(tmp_path)
    status = main(["train", "--tokens", str(tokens), "--vocab", str(vocab), "--token-dtype",
                   "uint32", "--tables", "dense", "--backend", "cpu", "--steps", "1",
                   "-c", str(tmp_path / "c.safetensors")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert "V=65537 is past the largest dense table (V=65536" in err
    assert contents(tmp_path) == before
    # A collapsed checkpoint of that V exports no dense table either.
    index = ClassIndex.from_keys(vocab, np.array([5, vocab + 7]))
    path = tmp_path / "big.safetensors"
    CollapsedCheckpoint.zeros(TrainingState(vocab, 0, Hyper(), "corpus", "",
                                            tables="collapsed"), index).save(path)
    before = contents(tmp_path)
    status = main(["export", "-c", str(path), "-o", str(tmp_path / "params.safetensors")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert "the dense parameters of V=65537 are 16 GiB" in err
    assert contents(tmp_path) == before


@pytest.mark.parametrize("region", sorted(sig.COLLAPSED_REGIONS))
@pytest.mark.parametrize("vocab", [256, 300])
def test_collapsed_kernels_write_only_their_declared_footprints(region: str, vocab: int) -> None:
    """Every pointer in its own span between poisoned gaps, a sound index: each kernel of
    the reference (and the Numba set) writes nothing outside its write footprints."""
    from bob.kernels.collapsed import fast
    from bob.kernels.memory import Memory
    from bob.plan.model import PointerParam, ScalarParam
    from bob.program.bob import adam_scalar_table

    rng = np.random.default_rng(vocab)
    index = _random_index(rng, vocab, 0.02, full_rows=(1,))
    pairs = index.keys()[::3]
    values = {"vocab": vocab, "exceptions": index.exceptions, "classes": index.classes,
              "offsets": vocab + 1, "updates": 2, "finish": 1, "count": pairs.size}
    params = sig.SIGNATURES[region]
    base, gap = 0x40000, 512
    spans, address = {}, base + gap
    for p in params:
        if isinstance(p, PointerParam):
            size = p.footprint.evaluate(values)
            spans[p.name] = (address, size, p.access)
            address += -(-(size + gap) // 256) * 256
    for kernels in (collapsed.KERNELS, fast.KERNELS):
        buffer = rng.integers(0, 256, address + gap - base, dtype=np.uint8)  # poison
        memory = Memory(buffer, base)

        def array(name: str, dtype: str, count: int, memory=memory) -> np.ndarray:
            return memory.array(spans[name][0], dtype, count)

        args: dict = {p.name: spans[p.name][0] for p in params if isinstance(p, PointerParam)}
        args.update({p.name: values[p.name] if p.dtype == "u32" else np.float32(0.0)
                     for p in params if isinstance(p, ScalarParam)})
        scalars = ref.LossScalars.for_vocab(vocab)
        for name in ("log2e", "ln2", "inverse_rows"):
            if name in args:
                args[name] = getattr(scalars, name)
        for name, data in (("row_offsets", index.offsets.astype(np.uint32)),
                           ("columns", index.columns), ("lane_order", index.lane_order())):
            if name in spans:
                array(name, "u32", data.size)[:] = data
        for name in ("parameters", "first_moment", "second_moment"):
            if name in spans and spans[name][2] != "write":
                array(name, "f32", index.classes)[:] = np.abs(
                    rng.standard_normal(index.classes))
        if "targets" in spans:
            array("targets", "u32", vocab)[:] = index.columns[index.offsets[:-1].clip(
                max=index.exceptions - 1)]
        if "weights" in spans and spans["weights"][2] == "read":
            array("weights", "f32", index.exceptions)[:] = 1.0 / index.exceptions
        if "adam_scalars" in spans:
            array("adam_scalars", "f32", 16)[:] = adam_scalar_table(Hyper(), 3, 2).reshape(-1)
        if "keys" in spans:
            array("keys", "u64", pairs.size)[:] = pairs
            array("values", "f32", pairs.size)[:] = 0.5
        if "prompt" in spans:
            array("prompt", "u32", 1)[:] = 3
        if "health" in spans:
            array("health", "u32", 6)[:] = 0
        before = buffer.copy()
        kernels[region](memory, args)
        writable = np.zeros(buffer.size, bool)
        for start, size, access in spans.values():
            if access != "read":
                writable[start - base:start - base + size] = True
        changed = buffer != before
        assert not (changed & ~writable).any(), (
            f"{region} wrote outside its footprints at offset "
            f"{np.flatnonzero(changed & ~writable)[0]:#x}")
