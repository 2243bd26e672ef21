"""Checkpoints: round trips, every bad file, and crash safety of the atomic save."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from bob import files
from bob.config import CHECKPOINT_TENSORS, Hyper
from bob.errors import BadInput, RunFailure
from bob.records import checkpoint as checkpoint_module
from bob.records.checkpoint import Checkpoint, History, Segment
from conftest import listing

DIGEST = "ab" * 32


def sample(v: int = 8, step: int = 7, seed: int = 0) -> Checkpoint:
    rng = np.random.default_rng(seed)
    tables = [rng.standard_normal((v, v)).astype(np.float32) for _ in range(3)]
    tables[2] = np.abs(tables[2])
    tables[0][0, 0] = -0.0  # bit patterns survive, not only values
    tables[0][0, 1] = np.float32(1e-45)  # a subnormal
    hyper = Hyper(lr=0.1 + 0.2, beta1=0.85, beta2=0.9995, eps=1e-300, weight_decay=0.0)
    return Checkpoint(*tables, step=step, hyper=hyper, mode="corpus", data_digest=DIGEST)


def good_tensors(v: int = 4) -> dict[str, np.ndarray]:
    return {name: np.ones((v, v), np.float32) for name in
            ("parameters", "first_moment", "second_moment")}


def good_metadata(v: int = 4) -> dict[str, str]:
    return {"format": "bob-checkpoint", "format_version": "1", "vocab": str(v), "step": "3",
            "mode": "hard", "lr": "0.1", "beta1": "0.9", "beta2": "0.999", "eps": "1e-08",
            "weight_decay": "0.01", "data_digest": DIGEST, "created_by": "bob test"}


# -- round trips ---------------------------------------------------------------
def test_round_trip(tmp_path: Path) -> None:
    checkpoint = sample()
    path = tmp_path / "model.safetensors"
    checkpoint.save(path)
    loaded = Checkpoint.load(path)
    assert loaded == checkpoint
    assert loaded.hyper.lr == 0.1 + 0.2  # repr round-trips floats exactly
    assert loaded.parameters.flags.c_contiguous and loaded.parameters.dtype == np.float32
    assert listing(tmp_path) == ["model.safetensors"]


def test_history_and_optimum_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    plain = sample()
    plain.save(path)
    from safetensors import safe_open
    with safe_open(str(path), framework="numpy") as file:
        assert "history" not in file.metadata() and "optimum" not in file.metadata()
    assert Checkpoint.load(path).history == () and Checkpoint.load(path).optimum is None
    history = ((0, 5.545177444479562), (100, 2.9 + 1e-15), (np.int64(200), np.float32(2.5)))
    rich = replace(plain, optimum=2.452522431109189).with_history(history)
    assert rich.history == ((0, 5.545177444479562), (100, 2.9 + 1e-15), (200, 2.5))
    rich.save(path)
    loaded = Checkpoint.load(path)
    assert loaded == rich and loaded != plain
    assert loaded.history == rich.history and loaded.optimum == 2.452522431109189
    with pytest.raises(ValueError, match="history entry"):
        plain.with_history(((1, float("nan")),))
    with pytest.raises(ValueError, match="optimum"):
        replace(plain, optimum=-1.0)


def test_a_history_is_checked_once_and_extending_it_checks_only_the_new_pairs(monkeypatch):
    """A long run extends its history at every invocation: each pair is checked when it
    is added, not again at every later invocation, nor by a Checkpoint given a History."""
    plain = Checkpoint.zeros(4, Hyper(), "hard")
    checked: list[int] = []
    problem = checkpoint_module._history_problem
    monkeypatch.setattr(checkpoint_module, "_history_problem",
                        lambda pairs: checked.append(len(pairs)) or problem(pairs))
    history = History.of([(0, 5.5)])
    for step in range(1, 301):
        history = history.extended([(step, np.float32(1.0 / step))])
        state = replace(plain, step=step, history=history, val_history=plain.val_history)
        assert state.history is history
    assert checked == [1] * 301  # each pair once, when it was added
    assert history[-1] == (300, float(np.float32(1.0 / 300))) and type(history[-1][1]) is float
    assert history == tuple((step, loss) for step, loss in history)  # equal to a tuple
    with pytest.raises(ValueError, match=r"history entry \(301, inf\) is not a \[step, "
                                         r"finite loss\] pair"):
        history.extended([(301, float("inf"))])
    assert len(history) == 301  # nothing was added
    with pytest.raises(ValueError, match="history entry"):
        History.of([(-1, 1.0)])


def test_segments_round_trip_and_old_checkpoints_have_none(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    other = "cd" * 32
    segments = (Segment(0, DIGEST, Hyper()), Segment(3, other, Hyper(lr=0.05)),
                Segment(7, other, Hyper(lr=0.1 + 0.2)))
    rich = sample().with_segments(segments)
    rich.save(path)
    loaded = Checkpoint.load(path)
    assert loaded == rich and loaded.segments == segments and loaded != sample()
    save_file(good_tensors(), str(path), metadata=good_metadata())  # no segments field
    assert Checkpoint.load(path).segments == ()
    with pytest.raises(ValueError, match="beyond the checkpoint's step 7"):
        sample().with_segments((Segment(8, DIGEST, Hyper()),))


def test_zeros() -> None:
    zeros = Checkpoint.zeros(16, mode="corpus")
    assert zeros.step == 0 and zeros.vocab == 16 and zeros.data_digest == ""
    assert zeros.hyper == Hyper()
    assert not zeros.parameters.any() and not zeros.second_moment.any()


def test_any_safetensors_reader_loads_it(tmp_path: Path) -> None:
    checkpoint = sample()
    path = tmp_path / "model.safetensors"
    checkpoint.save(path)
    tensors = load_file(str(path))
    assert sorted(tensors) == ["first_moment", "parameters", "second_moment"]
    for name, array in tensors.items():
        assert array.tobytes() == getattr(checkpoint, name).tobytes()
    from safetensors import safe_open
    with safe_open(str(path), framework="numpy") as file:
        metadata = file.metadata()
    assert metadata["format"] == "bob-checkpoint" and metadata["format_version"] == "1"
    assert metadata["vocab"] == "8" and metadata["step"] == "7" and metadata["mode"] == "corpus"
    assert metadata["lr"] == repr(0.1 + 0.2) and metadata["eps"] == "1e-300"
    assert metadata["data_digest"] == DIGEST and metadata["created_by"].startswith("bob ")


def test_loads_what_the_safetensors_library_wrote(tmp_path: Path) -> None:
    path = tmp_path / "other.safetensors"
    save_file(good_tensors(), str(path), metadata=good_metadata())
    loaded = Checkpoint.load(path)
    assert loaded.step == 3 and loaded.vocab == 4 and loaded.mode == "hard"
    assert loaded.hyper == Hyper() and loaded.data_digest == DIGEST
    assert (loaded.parameters == 1).all()


def test_arena_bytes() -> None:
    checkpoint = sample(v=4)
    data = checkpoint.arena_bytes()
    assert data == b"".join(getattr(checkpoint, n).tobytes() for n in
                            ("parameters", "first_moment", "second_moment"))
    rebuilt = Checkpoint.from_arena(data, 4, step=checkpoint.step, hyper=checkpoint.hyper,
                                    mode=checkpoint.mode, data_digest=DIGEST)
    assert rebuilt == checkpoint
    with pytest.raises(ValueError, match="V=4 needs 192"):
        Checkpoint.from_arena(data[:-4], 4, step=0, hyper=Hyper(), mode="hard", data_digest="")


def test_construction_checks() -> None:
    table = np.zeros((4, 4), np.float32)
    with pytest.raises(TypeError, match="float32"):
        Checkpoint(table.astype(np.float64), table, table, 0, Hyper(), "hard", "")
    with pytest.raises(ValueError, match="shape"):
        Checkpoint(table, np.zeros((5, 5), np.float32), table, 0, Hyper(), "hard", "")
    with pytest.raises(ValueError, match="step"):
        Checkpoint(table, table, table, -1, Hyper(), "hard", "")
    with pytest.raises(TypeError, match="hyper must be a Hyper"):
        Checkpoint(table, table, table, 0, {"lr": 0.1}, "hard", "")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="data_digest"):
        Checkpoint(table, table, table, 0, Hyper(), "hard", "ABC")


# -- saving refuses what would not load ----------------------------------------
@pytest.mark.parametrize(("name", "value", "fragment"), [
    ("parameters", np.nan, "parameters[1][2] is nan (not finite)"),
    ("first_moment", np.inf, "first_moment[1][2] is inf (not finite)"),
    ("second_moment", -np.inf, "second_moment[1][2] is -inf (not finite)"),
    ("second_moment", -1.0, "second_moment[1][2] = -1.0 is negative (it is a mean of squares)"),
])
def test_save_refuses_what_would_not_load(name: str, value: float, fragment: str,
                                          tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    good = sample()
    good.save(path)
    before = path.read_bytes()
    tables = {n: getattr(good, n).copy() for n in ("parameters", "first_moment",
                                                    "second_moment")}
    tables[name][1, 2] = value
    bad = Checkpoint(**tables, step=8, hyper=good.hyper, mode=good.mode, data_digest=DIGEST)
    with pytest.raises(RunFailure) as caught:
        bad.save(path)
    assert str(caught.value) == (f"{path}: checkpoint not written: {fragment}; the previous "
                                 f"checkpoint is kept")
    assert path.read_bytes() == before
    assert listing(tmp_path) == ["model.safetensors"]


# -- bad checkpoints -----------------------------------------------------------
def _with(**changes: object) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    tensors, metadata = good_tensors(), good_metadata()
    for key, value in changes.items():
        if key.startswith("drop_"):
            name = key[5:]
            tensors.pop(name, None)
            metadata.pop(name, None)
        elif isinstance(value, np.ndarray):
            tensors[key] = value
        else:
            metadata[key] = value  # type: ignore[assignment]
    return tensors, metadata


def _one_value(name: str, index: tuple[int, int], value: float) -> dict[str, np.ndarray]:
    array = np.ones((4, 4), np.float32)
    array[index] = value
    return {name: array}


SEGMENT = {"first_step": 0, "data_digest": DIGEST, "lr": 0.1, "beta1": 0.9, "beta2": 0.999,
           "eps": 1e-8, "weight_decay": 0.01}

BAD_CHECKPOINTS: dict[str, tuple[object, str]] = {
    "missing tensor": (_with(drop_first_moment=1), "no tensor 'first_moment'"),
    "foreign": (({"model.embed": np.ones((4, 4), np.float32)}, {"format": "pt"}),
                "not a Bob checkpoint (format 'pt' in the metadata, expected 'bob-checkpoint')"),
    "extra tensor": (_with(gradients=np.ones((4, 4), np.float32)),
                     "unexpected tensor 'gradients'"),
    "float16": (_with(first_moment=np.ones((4, 4), np.float16)),
                "tensor first_moment is F16, not F32 (float32)"),
    "float64": (_with(parameters=np.ones((4, 4), np.float64)),
                "tensor parameters is F64, not F32 (float32)"),
    "int32": (_with(second_moment=np.ones((4, 4), np.int32)),
              "tensor second_moment is I32, not F32 (float32)"),
    "shape": (_with(first_moment=np.ones((4, 5), np.float32)),
              "tensor first_moment has shape [4, 5], expected [4, 4] (V=4)"),
    "vocab vs shape": (_with(vocab="5"), "tensor parameters has shape [4, 4], expected [5, 5]"),
    "nan": (_with(**_one_value("parameters", (2, 3), np.nan)),
            "parameters[2][3] is nan (not finite)"),
    "inf": (_with(**_one_value("first_moment", (0, 1), np.inf)),
            "first_moment[0][1] is inf (not finite)"),
    "negative v": (_with(**_one_value("second_moment", (3, 3), -2.0)),
                   "second_moment[3][3] = -2.0 is negative"),
    "no metadata": ((good_tensors(), None), "not a Bob checkpoint (no format field"),
    "format": (_with(format="gguf"), "not a Bob checkpoint (format 'gguf' in the metadata"),
    "version": (_with(format_version="2"),
                "unsupported checkpoint format version 2 (this Bob reads version 1)"),
    "version text": (_with(format_version="one"),
                     "format_version 'one' is not a non-negative integer"),
    "no step": (_with(drop_step=1), "metadata field 'step' is missing"),
    "no lr": (_with(drop_lr=1), "metadata field 'lr' is missing"),
    "no digest": (_with(drop_data_digest=1), "metadata field 'data_digest' is missing"),
    "vocab text": (_with(vocab="four"), "metadata vocab 'four' is not a non-negative integer"),
    "vocab small": (_with(vocab="1"), "metadata vocab 1 is outside [2, 65536]"),
    "step negative": (_with(step="-1"), "metadata step '-1' is not a non-negative integer"),
    "mode": (_with(mode="soft"), "metadata mode 'soft' is not 'hard' or 'corpus'"),
    "lr text": (_with(lr="fast"), "metadata lr 'fast' is not a number"),
    "lr nan": (_with(lr="nan"), "metadata lr = nan is not a finite number"),
    "beta1": (_with(beta1="1.0"), "metadata beta1 = 1.0 is outside [0, 1)"),
    "eps": (_with(eps="-1e-8"), "metadata eps = -1e-08 is negative"),
    # The CLI refuses --lr 0 and --eps 0; a checkpoint is held to the same rule.
    "lr zero": (_with(lr="0.0"), "metadata lr = 0.0 is zero (it must be positive)"),
    "eps zero": (_with(eps="0"), "metadata eps = 0.0 is zero (it must be positive)"),
    "weight decay": (_with(weight_decay="-0.5"), "metadata weight_decay = -0.5 is negative"),
    "digest": (_with(data_digest="xyz"), "metadata data_digest 'xyz' is not 64 lowercase hex"),
    "history json": (_with(history="[[0, 1.0]"), "metadata history is not JSON"),
    "history deep": (_with(history="[" * 100_000), "metadata history is not JSON"),
    "history shape": (_with(history='{"0": 1.0}'),
                      "metadata history is not a list of [step, loss] pairs"),
    "history entry": (_with(history="[[0, 1.0], [-5, 2.0]]"),
                      "metadata history entry [-5, 2.0] is not a [step, finite loss] pair"),
    "history nan": (_with(history="[[0, NaN]]"), "history entry [0, nan] is not a"),
    "optimum text": (_with(optimum="low"), "metadata optimum 'low' is not a number"),
    "optimum inf": (_with(optimum="inf"), "metadata optimum inf is not a finite number >= 0"),
    "segments json": (_with(segments="[{"), "metadata segments is not JSON"),
    "segments deep": (_with(segments="[" * 100_000), "metadata segments is not JSON"),
    "segments shape": (_with(segments='{"first_step": 0}'), "metadata segments is not a list"),
    "segment keys": (_with(segments='[{"first_step": 0}]'),
                     "metadata segment {'first_step': 0} is not an object with beta1, beta2, "
                     "data_digest, eps, first_step, lr, weight_decay (and optionally "
                     "lr_decay_steps, min_lr, sources, warmup_steps)"),
    "segment step": (_with(segments=json.dumps([{**SEGMENT, "first_step": -1}])),
                     "segment first_step -1 is not a non-negative integer"),
    "segment order": (_with(segments=json.dumps([SEGMENT, SEGMENT])),
                      "segment first_step 0 does not follow 0 (steps increase)"),
    "segment beyond": (_with(segments=json.dumps([{**SEGMENT, "first_step": 4}])),
                       "segment first_step 4 is beyond the checkpoint's step 3"),
    "segment lr": (_with(segments=json.dumps([{**SEGMENT, "lr": "fast"}])),
                   "segment at step 0: a hyperparameter is not a finite number"),
    "segment beta": (_with(segments=json.dumps([{**SEGMENT, "beta2": 1.5}])),
                     "segment at step 0: beta2 = 1.5 is outside [0, 1)"),
    "segment digest": (_with(segments=json.dumps([{**SEGMENT, "data_digest": "x"}])),
                       "segment at step 0: data_digest 'x' is not 64 lowercase hex"),
}


@pytest.mark.parametrize("case", list(BAD_CHECKPOINTS))
def test_bad_checkpoint(case: str, tmp_path: Path) -> None:
    (tensors, metadata), fragment = BAD_CHECKPOINTS[case]  # type: ignore[misc]
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    expect_bad(path, fragment, tmp_path)


def expect_bad(path: Path, fragment: str, directory: Path) -> None:
    before = listing(directory)
    with pytest.raises(BadInput) as caught:
        Checkpoint.load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and fragment in message, message
    assert "\n" not in message
    assert listing(directory) == before


def test_bfloat16_tensor(tmp_path: Path) -> None:
    # NumPy cannot even hold bfloat16: the header alone must decide.
    layout: dict[str, object] = {"__metadata__": good_metadata()}
    offsets = {"parameters": ("BF16", 0, 32), "first_moment": ("F32", 32, 96),
               "second_moment": ("F32", 96, 160)}
    for name, (dtype, start, end) in offsets.items():
        layout[name] = {"dtype": dtype, "shape": [4, 4], "data_offsets": [start, end]}
    header = json.dumps(layout).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(160))
    expect_bad(path, "tensor parameters is BF16, not F32 (float32)", tmp_path)


@pytest.mark.parametrize(("data", "fragment"), [
    (b"", "empty file, not a checkpoint"),
    (b"BOBINPUT" + bytes(40), "this is a Bob input record, not a checkpoint"),
    (b"BOBRESLT" + bytes(40), "this is a Bob result record, not a checkpoint"),
    (b"hello world, this is text\n", "not a readable safetensors file"),
    (b"\x05\0\0\0\0\0\0\0{nope", "not a readable safetensors file"),
])
def test_not_a_checkpoint(data: bytes, fragment: str, tmp_path: Path) -> None:
    path = tmp_path / "file.safetensors"
    path.write_bytes(data)
    expect_bad(path, fragment, tmp_path)


def test_truncated_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    sample().save(path)
    data = path.read_bytes()
    for cut in (4, 40, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        expect_bad(path, "not a readable safetensors file", tmp_path)


def test_missing_checkpoint_and_directory(tmp_path: Path) -> None:
    expect_bad(tmp_path / "none.safetensors", "no such file", tmp_path)
    (tmp_path / "dir").mkdir()
    expect_bad(tmp_path / "dir", "is a directory", tmp_path)


# -- the streamed save ----------------------------------------------------------
def pieces_of(checkpoint: Checkpoint, sizes: tuple[int, ...]):
    """A delivery of the checkpoint's tables in pieces of these sizes, in turn (the last
    of each table shorter): as a device's stream hands them over."""
    def deliver(sink, chunk_bytes: int) -> None:
        turn = 0
        for name in CHECKPOINT_TENSORS:
            data = memoryview(getattr(checkpoint, name).tobytes())
            offset = 0
            while offset < len(data):
                size = min(sizes[turn % len(sizes)], chunk_bytes)
                turn += 1
                sink(name, offset, data[offset:offset + size])
                offset += size
    return deliver


@pytest.mark.parametrize("vocab", [2, 3, 17, 256, 1000])
def test_the_streamed_save_is_the_whole_table_writer_byte_for_byte(tmp_path: Path,
                                                                    vocab: int) -> None:
    checkpoint = replace(sample(vocab), history=((0, 5.5), (7, 2.25)), optimum=1.5,
                         segments=(Segment(0, DIGEST, sample().hyper),),
                         val_history=((0, 5.75),))
    whole = tmp_path / "whole.safetensors"
    checkpoint.save(whole)
    expected = whole.read_bytes()
    assert len(expected) == checkpoint.state.file_bytes
    state = checkpoint.state
    for name, deliver, chunk in (
            ("small chunks", checkpoint.tables().deliver, 12),
            ("one chunk", checkpoint.tables().deliver, 1 << 30),
            ("ragged pieces", pieces_of(checkpoint, (4, 28, 400, 8)), 1 << 30),
    ):
        for checked in (False, True):
            streamed = tmp_path / "streamed.safetensors"
            state.save(streamed, deliver, checked=checked, chunk_bytes=chunk)
            assert streamed.read_bytes() == expected, (name, checked)
    assert listing(tmp_path) == ["streamed.safetensors", "whole.safetensors"]
    assert Checkpoint.load(tmp_path / "streamed.safetensors") == checkpoint


@pytest.mark.parametrize("vocab", [16, 100, 300])
def test_the_save_streamed_from_a_backend_is_the_checkpoint_read_back(tmp_path: Path,
                                                                       vocab: int) -> None:
    """Session.stream_tables hands the arena's tables to the save through the backend's
    stream_read, in chunks: the file is the one the tables read back would write."""
    from bob.backends import choose_backend
    from bob.host.check import random_record
    from bob.host.session import Session
    from bob.program.bob import BobConfig

    config = BobConfig(vocab=vocab, prompts=1, updates=3, mode="corpus", pairs=vocab * 3)
    record = random_record(config, vocab)
    with Session(choose_backend("cpu")) as session:
        done = session.invoke(config, Checkpoint.zeros(vocab, Hyper(), "corpus"), record,
                              "train")
        whole, streamed = tmp_path / "whole.safetensors", tmp_path / "streamed.safetensors"
        done.checkpoint.save(whole)
        for chunk in (4 * vocab, 4 * vocab * vocab - 4, 1 << 20):  # a row, a table less 4
            done.state.save(streamed, lambda sink, size: session.stream_tables(3, sink, size),
                            checked=True, chunk_bytes=chunk)
            assert streamed.read_bytes() == whole.read_bytes(), chunk
        with pytest.raises(ValueError, match="does not hold the state after step 2"):
            session.stream_tables(2, lambda *piece: None)
    assert listing(tmp_path) == ["streamed.safetensors", "whole.safetensors"]


@pytest.mark.parametrize("checked", [False, True])
def test_a_bad_chunk_leaves_the_old_file_and_no_temporary(tmp_path: Path,
                                                          checked: bool) -> None:
    """A negative second moment in a later chunk of the last table: found as it passes (its
    sign is checked even when the device vouched for finiteness), the temporary abandoned,
    the previous checkpoint kept."""
    path = tmp_path / "model.safetensors"
    sample(step=1).save(path)
    before = path.read_bytes()
    bad = sample(v=8, step=2, seed=3)
    tables = {name: np.array(getattr(bad, name)) for name in CHECKPOINT_TENSORS}
    tables["second_moment"][5, 6] = -1.0
    bad = replace(bad, **tables)
    with pytest.raises(RunFailure) as caught:
        bad.state.save(path, bad.tables().deliver, checked=checked, chunk_bytes=64)
    assert str(caught.value) == (f"{path}: checkpoint not written: second_moment[5][6] = -1.0 "
                                 "is negative (it is a mean of squares); the previous "
                                 "checkpoint is kept")
    assert path.read_bytes() == before and listing(tmp_path) == ["model.safetensors"]


@pytest.mark.parametrize(("what", "message"), [
    ("nan", "parameters[1][2] is nan (not finite)"),
    ("out of order", "the tables came out of order (first_moment at byte 0)"),
    ("short", "the tables ended early"),
    ("too long", "the tables came out of order (second_moment at byte 256)"),
])
def test_a_delivery_that_is_not_the_tables_leaves_the_old_file(tmp_path: Path, what: str,
                                                               message: str) -> None:
    path = tmp_path / "model.safetensors"
    sample(step=1).save(path)
    before = path.read_bytes()
    good = sample(v=8, step=2, seed=3)
    parameters = np.array(good.parameters)
    parameters[1, 2] = np.nan

    def deliver(sink, chunk_bytes: int) -> None:
        tables = [getattr(good, name).tobytes() for name in CHECKPOINT_TENSORS]
        if what == "nan":
            tables[0] = parameters.tobytes()
        order = (1, 0, 2) if what == "out of order" else (0, 1, 2)
        for index in order:
            data = tables[index]
            if what == "short" and index == 2:
                data = data[:-4]
            sink(CHECKPOINT_TENSORS[index], 0, memoryview(data))
        if what == "too long":
            sink("second_moment", 256, memoryview(b"\0" * 4))

    with pytest.raises(RunFailure) as caught:
        good.state.save(path, deliver)
    assert str(caught.value) == (f"{path}: checkpoint not written: {message}; the previous "
                                 "checkpoint is kept")
    assert path.read_bytes() == before and listing(tmp_path) == ["model.safetensors"]


# -- crash safety --------------------------------------------------------------
def test_a_disk_full_midway_keeps_the_old_checkpoint(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.safetensors"
    old = sample(step=1)
    old.save(path)

    class FullDisk(io.BufferedWriter):
        writes = 0

        def write(self, data: object) -> int:  # type: ignore[override]
            FullDisk.writes += 1
            if FullDisk.writes == 3:  # the header and a table are in, the next is not
                raise OSError(28, "No space left on device")
            return super().write(data)  # type: ignore[arg-type]

    real_fdopen = os.fdopen
    monkeypatch.setattr(files.os, "fdopen",
                        lambda fd, mode: FullDisk(real_fdopen(fd, mode, buffering=0)))
    with pytest.raises(RunFailure, match="No space left on device"):
        sample(step=2, seed=5).save(path)
    monkeypatch.undo()
    assert FullDisk.writes == 3
    assert Checkpoint.load(path) == old
    assert listing(tmp_path) == ["model.safetensors"]


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from bob.config import CHECKPOINT_TENSORS, Hyper
    from bob.records.checkpoint import Checkpoint

    def state(step, v):
        table = np.full((v, v), step, np.float32)
        return Checkpoint(table, table + 0.5, table * 2, step, Hyper(), "hard", "")

    path, v, step, how = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    while True:
        checkpoint = state(step, v)
        if how == "streamed":  # the header, then the tables in 64 KiB pieces as they come
            checkpoint.state.save(path, checkpoint.tables().deliver, chunk_bytes=1 << 16)
        else:
            checkpoint.save(path)
        print(step, flush=True)
        step += 1
""")


def expected_state(step: int, v: int) -> Checkpoint:
    table = np.full((v, v), step, np.float32)
    return Checkpoint(table, table + 0.5, table * 2, step, Hyper(), "hard", "")


def _kill_while_writing(child: subprocess.Popen[str], directory: Path, deadline: float) -> None:
    """SIGKILL as soon as the child's temporary appears: it is mid-write then."""
    prefix = f".model.safetensors.{files._host()}.{child.pid}."
    while time.monotonic() < deadline:
        if any(name.startswith(prefix) for name in os.listdir(directory)):
            break
    child.send_signal(signal.SIGKILL)


@pytest.mark.parametrize("how", ["whole", "streamed"])
def test_sigkill_while_saving_keeps_a_loadable_checkpoint(tmp_path: Path, how: str) -> None:
    """Kill a process saving 12 MiB checkpoints in a loop, six times: saved whole
    (Checkpoint.save) or streamed a chunk at a time (TrainingState.save).

    Three kills come at random moments, three the moment a temporary appears,
    so some land mid-write for certain.
    """
    v = 1024
    work = tmp_path / "run"
    work.mkdir()
    path = work / "model.safetensors"
    expected_state(0, v).save(path)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(files.__file__).parents[1])}
    rng = random.Random(20240601)
    step = 0
    killed_mid_write = 0
    for kill in range(6):
        child = subprocess.Popen([sys.executable, str(script), str(path), str(v), str(step + 1),
                                  how], stdout=subprocess.PIPE, text=True, env=env)
        assert child.stdout is not None
        first = child.stdout.readline()  # it has saved once: now it is mid-loop
        assert first.strip() == str(step + 1), first
        if kill % 2:
            _kill_while_writing(child, work, time.monotonic() + 10)
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=rng.uniform(0.01, 0.3))
            child.send_signal(signal.SIGKILL)
        reported = [int(line) for line in [first, *child.stdout.read().split()]]
        assert child.wait() == -signal.SIGKILL
        loaded = Checkpoint.load(path)
        # The last save it reported, or one it finished before it could say so.
        assert loaded.step in (reported[-1], reported[-1] + 1)
        assert loaded == expected_state(loaded.step, v)
        step = loaded.step
        # At most the one temporary of the killed writer is left, and it breaks nothing.
        left = listing(work)
        assert len(left) <= 2 and "model.safetensors" in left
        killed_mid_write += len(left) == 2
    assert killed_mid_write >= 1
    expected_state(step + 1, v).save(path)  # a live writer clears the dead ones' leftovers
    assert listing(work) == ["model.safetensors"]
    assert Checkpoint.load(path) == expected_state(step + 1, v)


def _kill_export_while_writing(child: subprocess.Popen[bytes], directory: Path, name: str,
                               deadline: float) -> None:
    """SIGKILL as soon as the exporting child's temporary appears: it is mid-write then."""
    prefix = f".{name}.{files._host()}.{child.pid}."
    while time.monotonic() < deadline and child.poll() is None:
        if any(entry.startswith(prefix) for entry in os.listdir(directory)):
            break
    child.send_signal(signal.SIGKILL)


def test_sigkill_while_exporting_keeps_the_old_export(tmp_path: Path) -> None:
    """Kill `bob export --overwrite` six times as it replaces an export of checkpoint A
    with one of checkpoint B (16 MiB of parameters): three kills at random moments, three
    the moment its temporary appears, so some land mid-write for certain. The file there
    is always one whole export, A's or B's, and a later export clears the leftovers."""
    v = 2048
    work = tmp_path / "run"
    work.mkdir()
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    expected_state(1, v).save(first)
    expected_state(2, v).save(second)
    out = work / "e.safetensors"
    env = {**os.environ, "PYTHONPATH": str(Path(files.__file__).parents[1])}

    def export(source: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "bob", "export", "-c", str(source),
                                 "-o", str(out), "--overwrite"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    assert export(second).wait() == 0
    exported = {"b": out.read_bytes()}
    assert export(first).wait() == 0
    exported["a"] = out.read_bytes()
    rng = random.Random(20261207)
    killed_mid_write = 0
    for kill in range(6):
        before = out.read_bytes()
        child = export(second if before == exported["a"] else first)
        if kill % 2:
            _kill_export_while_writing(child, work, out.name, time.monotonic() + 30)
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=rng.uniform(0.3, 1.5))  # start-up is most of a run
            child.send_signal(signal.SIGKILL)
        status = child.wait()
        now = out.read_bytes()
        assert now in exported.values()  # one whole export, never a mix
        assert status == 0 or now == before  # killed: the old export stands
        parameters = load_file(str(out))["parameters"]
        assert parameters.shape == (v, v)
        left = listing(work)
        assert len(left) <= 2 and "e.safetensors" in left
        killed_mid_write += status == -signal.SIGKILL and len(left) == 2
    assert killed_mid_write >= 1
    assert export(first).wait() == 0  # a live writer clears the dead ones' leftovers
    assert listing(work) == ["e.safetensors"] and out.read_bytes() == exported["a"]
