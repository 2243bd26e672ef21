"""nanoGPT's learning-rate schedule (--warmup-steps, --lr-decay-steps, --min-lr): every
update's rate is nanoGPT's get_lr, its AdamW scalars are those rounded once, the
checkpoint records the schedule, and --resume continues it to the bytes of a run never
stopped. A constant rate writes what Bob wrote before the schedule existed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import bob
from bob.cli.main import main
from bob.config import Hyper
from bob.errors import BadInput
from bob.program.bob import ADAM_SCALAR_NAMES, adam_scalar_table, adam_scalars
from bob.records.checkpoint import Checkpoint
from conftest import contents

TEXT = b"the cat sat on the mat; the rat ate the hat. " * 20


def nanogpt_get_lr(it: int, learning_rate: float, warmup_iters: int, lr_decay_iters: int,
                   min_lr: float) -> float:
    """nanoGPT's train.py get_lr, as it is written there (decay_lr True)."""
    # 1) linear warmup for warmup_iters steps
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    # 2) if it > lr_decay_iters, return min learning rate
    if it > lr_decay_iters:
        return min_lr
    # 3) in between, use cosine decay down to min learning rate
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # coeff ranges 0..1
    return min_lr + coeff * (learning_rate - min_lr)


@pytest.mark.parametrize("lr,warmup,decay,min_lr", [
    (6e-4, 2000, 600000, 6e-5),  # nanoGPT's GPT-2 defaults
    (1e-3, 100, 5000, 1e-4),  # its shakespeare_char config
    (0.1, 0, 1000, 0.0),
    (0.3, 7, 8, 0.3),
])
def test_every_updates_rate_is_nanogpts_get_lr(lr, warmup, decay, min_lr):
    hyper = Hyper(lr=lr, warmup_steps=warmup, lr_decay_steps=decay, min_lr=min_lr)
    for step in [*range(1, 50), *range(warmup - 3, warmup + 5), *range(decay - 3, decay + 5),
                 decay * 2]:
        if step >= 1:
            assert hyper.lr_at(step) == nanogpt_get_lr(step - 1, lr, warmup, decay, min_lr)


def test_warmup_alone_then_the_rate_stays_and_min_lr_defaults_to_a_tenth():
    hyper = Hyper(lr=0.2, warmup_steps=4)
    assert [hyper.lr_at(t) for t in range(1, 7)] == [0.2 * k / 5 for k in range(1, 5)] + [0.2] * 2
    assert Hyper(lr=0.2, lr_decay_steps=10).min_lr == 0.2 / 10
    assert not Hyper().scheduled and Hyper().lr_at(123) == 0.1


@pytest.mark.parametrize("hyper", [
    Hyper(warmup_steps=30, lr_decay_steps=900, min_lr=0.004),
    Hyper(lr=0.05, weight_decay=0.3, warmup_steps=0, lr_decay_steps=40),
    Hyper(warmup_steps=1000),
])
def test_the_scalar_table_is_each_steps_scalars_rounded_once(hyper):
    """The fast table (NumPy powers, C's pow where a rounding is in doubt) against the
    float64 expressions step by step: decay and step size follow the step's rate."""
    first, count = 1, 1200
    table = adam_scalar_table(hyper, first, count).view(np.uint32)
    want = np.array([[adam_scalars(hyper, step)[name].bits for name in ADAM_SCALAR_NAMES]
                     for step in range(first, first + count)], np.uint32)
    assert (table[:, :len(ADAM_SCALAR_NAMES)] == want).all()
    decay = ADAM_SCALAR_NAMES.index("decay")
    assert len(set(table[:, decay].tolist())) > 10  # it varies with the step
    # and each row is a slice of the same table started elsewhere: resuming changes nothing
    later = adam_scalar_table(hyper, 700, 200).view(np.uint32)
    assert (later == table[699:899]).all()


def test_a_constant_rate_keeps_the_scalars_and_the_file_as_before(tmp_path):
    hyper = Hyper()
    table = adam_scalar_table(hyper, 1, 64).view(np.uint32)
    decay = ADAM_SCALAR_NAMES.index("decay")
    assert set(table[:, decay].tolist()) == {np.float32(1 - 0.1 * 0.01).view(np.uint32)}
    (tmp_path / "a.txt").write_bytes(TEXT)
    path = tmp_path / "c.safetensors"
    assert main(["train", "--backend", "cpu", "--text", str(tmp_path / "a.txt"), "--steps", "4",
                 "-c", str(path)]) == 0
    metadata = Checkpoint.load(path).metadata()
    assert not {"warmup_steps", "lr_decay_steps", "min_lr"} & set(metadata)
    assert not {"warmup_steps", "lr_decay_steps", "min_lr"} & set(
        json.loads(metadata["segments"])[0])


SCHEDULE = ("--warmup-steps", "20", "--lr-decay-steps", "250", "--min-lr", "0.02")


@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_resume_continues_the_schedule_to_the_bytes_of_a_run_never_stopped(tmp_path, capsys,
                                                                          schedule):
    text = tmp_path / "a.txt"
    text.write_bytes(TEXT)
    whole, halves = tmp_path / "whole.safetensors", tmp_path / "halves.safetensors"
    common = ("train", "--backend", "cpu", "--schedule", schedule, "--text", str(text),
              "-N", "50")
    assert main([*common, *SCHEDULE, "--steps", "300", "-c", str(whole)]) == 0
    assert main([*common, *SCHEDULE, "--steps", "150", "-c", str(halves)]) == 0
    # The schedule is the checkpoint's: the resumed run states none of it.
    assert main([*common, "--resume", "--steps", "150", "-c", str(halves)]) == 0
    one, two = Checkpoint.load(whole), Checkpoint.load(halves)
    assert one == two  # every table's bytes, the histories, the segments
    assert one.hyper == Hyper(warmup_steps=20, lr_decay_steps=250, min_lr=0.02)
    assert [segment.hyper for segment in one.segments] == [one.hyper]
    assert "lr 0.1 (warmup 20, cosine to 0.02 at update 250)" in capsys.readouterr().out
    # The schedule changed the run: a constant rate ends elsewhere.
    constant = tmp_path / "constant.safetensors"
    assert main([*common, "--steps", "300", "-c", str(constant)]) == 0
    assert Checkpoint.load(constant).parameters.tobytes() != one.parameters.tobytes()


def test_a_schedule_stated_on_resume_starts_a_segment(tmp_path):
    text = tmp_path / "a.txt"
    text.write_bytes(TEXT)
    path = tmp_path / "m.safetensors"
    common = ("train", "--backend", "cpu", "--text", str(text), "-c", str(path))
    assert main([*common, "--steps", "10"]) == 0
    assert main([*common, "--resume", "--steps", "10", "--lr-decay-steps", "40"]) == 0
    segments = Checkpoint.load(path).segments
    assert [s.first_step for s in segments] == [0, 10]
    assert segments[1].hyper == Hyper(lr_decay_steps=40, min_lr=0.01)
    assert json.loads(Checkpoint.load(path).metadata()["segments"])[1]["lr_decay_steps"] == 40


def test_the_api_takes_the_schedule(tmp_path):
    model = bob.train(bob.TrainConfig(text=str(_text(tmp_path)), steps=20, warmup_steps=5,
                                      lr_decay_steps=15, min_lr=0.01, backend="cpu",
                                      out=str(tmp_path / "api.safetensors")))
    assert model.state.hyper == Hyper(warmup_steps=5, lr_decay_steps=15, min_lr=0.01)
    with pytest.raises(BadInput, match="--min-lr 0.5 is above --lr 0.1"):
        bob.TrainConfig(lr_decay_steps=15, min_lr=0.5)


def _text(tmp_path: Path) -> Path:
    path = tmp_path / "a.txt"
    path.write_bytes(TEXT)
    return path


@pytest.mark.parametrize("argv,message", [
    (["--min-lr", "0.5", "--lr-decay-steps", "10"],
     "--min-lr 0.5 is above --lr 0.1: the decay would raise the learning rate"),
    (["--min-lr", "0.05"], "--min-lr is where the cosine decay ends: it needs --lr-decay-steps"),
    (["--min-lr", "-1", "--lr-decay-steps", "10"], "--min-lr -1.0 is not a finite number >= 0"),
    (["--lr-decay-steps", "10", "--warmup-steps", "10"],
     "--lr-decay-steps 10 is not past --warmup-steps 10: the cosine decay runs from the end of "
     "the warmup to it"),
    (["--warmup-steps", "-1"], "--warmup-steps -1 is not a whole number of updates in "
                               "[0, 2**53]"),
    (["--lr-decay-steps", "-5"], "--lr-decay-steps -5 is not a whole number of updates in "
                                 "[0, 2**53]"),
])
def test_a_bad_schedule_is_refused_in_one_line_with_nothing_written(tmp_path, capsys, argv,
                                                                    message):
    text = _text(tmp_path)
    before = contents(tmp_path)
    status = main(["train", "--backend", "cpu", "--text", str(text), "--steps", "3", *argv,
                   "-c", str(tmp_path / "m.safetensors")])
    out, err = capsys.readouterr()
    assert status == 2 and out == "" and err == f"bob: {message}\n"
    assert contents(tmp_path) == before


def test_a_bad_schedule_stated_on_resume_is_refused_against_the_checkpoints_lr(tmp_path,
                                                                              capsys):
    text = _text(tmp_path)
    path = tmp_path / "m.safetensors"
    assert main(["train", "--backend", "cpu", "--text", str(text), "--steps", "3", "--lr",
                 "0.01", "-c", str(path)]) == 0
    capsys.readouterr()
    before = contents(tmp_path)
    status = main(["train", "--backend", "cpu", "--resume", "--steps", "3",
                   "--lr-decay-steps", "10", "--min-lr", "0.05", "-c", str(path)])
    out, err = capsys.readouterr()
    assert status == 2 and err == ("bob: --min-lr 0.05 is above --lr 0.01: the decay would "
                                   "raise the learning rate\n")
    assert contents(tmp_path) == before


@pytest.mark.parametrize("field,value,problem", [
    ("warmup_steps", "x", "metadata warmup_steps 'x' is not"),
    ("min_lr", "0.5", "metadata --min-lr is where the cosine decay ends: it needs "
                      "--lr-decay-steps"),
])
def test_a_bad_schedule_in_a_checkpoint_is_refused_naming_it(tmp_path, capsys, field, value,
                                                             problem):
    from safetensors.numpy import load_file, save_file

    text = _text(tmp_path)
    path = tmp_path / "m.safetensors"
    assert main(["train", "--backend", "cpu", "--text", str(text), "--steps", "3", "-c",
                 str(path)]) == 0
    metadata = {**Checkpoint.load(path).metadata(), field: value}
    save_file(load_file(path), path, metadata=metadata)
    capsys.readouterr()
    assert main(["predict", "-c", str(path), "a"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bob: {path}: {problem}") and err.count("\n") == 1, err


def test_scheduled_columns_stay_exact_with_powers_a_few_ulps_off(monkeypatch):
    """The fast path's exactness argument holds with a rate per step: with NumPy's powers
    moved by up to 32 ulps, every row still has the bits of C's pow and the step's rate."""
    import bob.program.bob as program

    hyper = Hyper(beta2=0.99999, warmup_steps=500, lr_decay_steps=40_000, min_lr=0.003)
    steps = np.arange(1, 50_001, dtype=np.int64)
    rates = program.learning_rates(hyper, steps)
    want = program._exact_step_columns(hyper, steps, rates)
    rng = np.random.default_rng(7)
    true_power = np.power

    def shaky_power(base, exponents):
        exact = true_power(base, exponents)
        moves = rng.integers(-32, 33, exact.shape)
        return (exact.view(np.int64) + moves * (exact > 0)).view(np.float64)

    monkeypatch.setattr(program.np, "power", shaky_power)
    got = program._step_columns(hyper, steps, rates)
    for column, exact in zip(got, want, strict=True):
        assert (column.view(np.uint32) == exact.view(np.uint32)).all()
