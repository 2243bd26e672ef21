"""The host end to end on the CPU backend: invocations, checkpoints, the CLI."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest

from bob.backends import choose_backend
from bob.backends.cpu import CpuBackend
from bob.cli.main import main
from bob.config import Hyper
from bob.host import api
from bob.host.check import random_record
from bob.host.session import Session, split_updates, train
from bob.kernels.cuda.regions import catalogue
from bob.plan.certificate import CertificateError
from bob.plan.jsonio import plan_from_json, plan_to_json
from bob.program.bob import BobConfig, build_plan, typical_pairs
from bob.records.checkpoint import Checkpoint


def run_split(config: BobConfig, steps: int, per_invocation: int, seed: int = 1):
    record = random_record(replace(config, prompts=2), seed)
    with Session(choose_backend("cpu")) as session:
        start = Checkpoint.zeros(config.vocab, Hyper(), config.mode)
        runs = train(session, replace(config, prompts=2, updates=per_invocation), start, record,
                     steps)
        arena = {name: session.last_backend.read_tensor(name)
                 for name in ("parameters", "first_moment", "second_moment", "gradients",
                              "training_loss", "logit_rows", "predictions")}
    return runs[-1], arena


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_invocation_splits_give_identical_bytes(mode):
    config = BobConfig(vocab=256, mode=mode, pairs=typical_pairs(256) if mode == "corpus" else 0)
    whole, arena_whole = run_split(config, 100, 100)
    parts, arena_parts = run_split(config, 100, 25)
    assert whole.checkpoint.step == parts.checkpoint.step == 100
    for name in arena_whole:
        assert arena_whole[name] == arena_parts[name], name
    assert whole.loss == parts.loss


def test_split_updates():
    assert list(split_updates(1000, 100)) == [100] * 10
    assert list(split_updates(250, 100)) == [100, 100, 50]
    assert list(split_updates(0, 100)) == []
    most = split_updates(2**53, 100)  # computed per index: nothing of its length is listed
    assert len(most) == 2**53 // 100 + 1 and most[-1] == 2**53 % 100 and most[-2] == 100


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_matches_torch_adamw(mode):
    torch = pytest.importorskip("torch")
    vocab, steps = 64, 40
    config = BobConfig(vocab=vocab, prompts=0, updates=steps, mode=mode,
                       pairs=typical_pairs(vocab) // 2 if mode == "corpus" else 0)
    record = random_record(config, 7)
    hyper = Hyper()
    with Session(choose_backend("cpu"), hyper) as session:
        ours = session.invoke(config, Checkpoint.zeros(vocab, hyper, mode), record, "train")

    table = torch.zeros(vocab, vocab, dtype=torch.float32, requires_grad=True)
    optimizer = torch.optim.AdamW([table], lr=hyper.lr, betas=(hyper.beta1, hyper.beta2),
                                  eps=hyper.eps, weight_decay=hyper.weight_decay)
    losses = []
    for _ in range(steps + 1):
        optimizer.zero_grad()
        if mode == "hard":
            loss = torch.nn.functional.cross_entropy(table, torch.as_tensor(
                record.targets.astype(np.int64)))
        else:
            weights = torch.tensor(record.dense_weights())
            loss = -(weights * torch.log_softmax(table, dim=1)).sum()
        losses.append(loss.item())
        loss.backward()
        if len(losses) <= steps:
            optimizer.step()
    reference = table.detach().numpy()
    difference = np.abs(ours.checkpoint.parameters - reference).max()
    print(f"largest difference from torch.optim.AdamW after {steps} updates: {difference:.3g}")
    assert difference < 2e-4
    assert ours.initial_loss == pytest.approx(losses[0], rel=1e-6)
    assert ours.loss == pytest.approx(losses[steps], rel=1e-5)


def test_resume_continues_the_step_count_exactly(tmp_path):
    straight, resumed = tmp_path / "straight.safetensors", tmp_path / "resumed.safetensors"
    api.train(steps=50, checkpoint=str(straight), backend="cpu", updates_per_invocation=20)
    api.train(steps=30, checkpoint=str(resumed), backend="cpu", updates_per_invocation=20)
    assert Checkpoint.load(resumed).step == 30
    report = api.train(steps=20, checkpoint=str(resumed), backend="cpu", resume=True,
                       updates_per_invocation=20)
    assert report.global_step == 50
    a, b = Checkpoint.load(straight), Checkpoint.load(resumed)
    assert a.step == b.step == 50
    for name in ("parameters", "first_moment", "second_moment"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), name


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    path = tmp_path / "bob.safetensors"
    assert main(["train", "--steps", "10", "-N", "5", "-c", str(path), "--backend", "cpu"]) == 0
    before = path.read_bytes()
    status = main(["train", "--steps", "10", "-N", "5", "-c", str(path), "--backend", "cpu",
                   "--resume", "--lr", "1e38"])
    assert status == 1
    assert "non-finite" in capsys.readouterr().err
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["bob.safetensors"]


def test_default_training_reaches_the_optimum(tmp_path, capsys):
    """The bar: within 0.2% of the optimum in 1000 updates on the built-in corpus."""
    path = tmp_path / "bob.safetensors"
    assert main(["train", "-c", str(path), "--backend", "cpu", "--json"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 1000 and summary["checkpoint"] == str(path)
    assert summary["loss"] < summary["initial_loss"]
    assert (summary["loss"] - summary["optimum"]) / summary["optimum"] < 0.002
    assert "optimum" in out and "loss" in out
    state = Checkpoint.load(path)
    assert state.step == 1000 and len(state.history) == 11


def test_predict_generate_eval(tmp_path, capsys):
    path = tmp_path / "bob.safetensors"
    text = tmp_path / "text.txt"
    text.write_bytes(b"abababab abba cab " * 50)
    assert main(["train", "--text", str(text), "--steps", "200", "-c", str(path),
                 "--backend", "cpu"]) == 0
    capsys.readouterr()
    assert main(["predict", "-c", str(path), "--backend", "cpu", "--json", "a", "xb"]) == 0
    predictions = json.loads(capsys.readouterr().out)
    assert [p["next_text"] for p in predictions] == ["b", "a"]
    assert main(["generate", "-c", str(path), "-p", "a", "-n", "6", "-t", "0",
                 "--backend", "cpu"]) == 0
    assert capsys.readouterr().out == "abababa\n"  # -t 0: greedy
    sampled = [api.generate(str(path), b"a", 40, 1.0, seed, "cpu") for seed in (1, 1, 2)]
    assert sampled[0] == sampled[1] != sampled[2]
    assert main(["eval", "-c", str(path), "--text", str(text), "--backend", "cpu",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["optimum"] <= report["nats_per_transition"] < report["optimum"] * 1.05
    assert report["bits_per_byte"] == pytest.approx(report["nats_per_transition"] / np.log(2))
    assert main(["plot", "-c", str(path), "--out", str(tmp_path / "plots")]) == 0
    for name in ("loss.png", "transitions.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_predict_leaves_the_checkpoint_alone(tmp_path):
    path = tmp_path / "bob.safetensors"
    api.train(steps=20, checkpoint=str(path), backend="cpu")
    before = path.read_bytes()
    api.predict(str(path), [b"x"], backend="cpu")
    assert path.read_bytes() == before


@pytest.mark.parametrize("argv,message", [
    (["predict", "-c", "{dir}/absent.safetensors", "a"], "absent.safetensors"),
    (["train", "--text", "{dir}/absent.txt", "-c", "{dir}/new.safetensors"], "absent.txt"),
    (["train", "--steps", "5", "-c", "{dir}/existing.safetensors"], "exists"),
    (["train", "--resume", "-c", "{dir}/new.safetensors"], "no checkpoint to resume"),
    (["train", "--lr", "-1", "-c", "{dir}/new.safetensors"], "--lr"),
    (["generate", "-c", "{dir}/existing.safetensors", "-p", "", "-n", "3"], "at least one byte"),
    (["eval", "-c", "{dir}/existing.safetensors", "--text", "{dir}/empty.txt"], "empty.txt"),
    (["train", "--input", "{dir}/existing.safetensors", "-c", "{dir}/new.safetensors"],
     "existing.safetensors"),
    (["train", "--backend", "quantum"], "quantum"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, argv, message):
    existing = tmp_path / "existing.safetensors"
    Checkpoint.zeros(256, Hyper(), "corpus").save(existing)
    (tmp_path / "empty.txt").write_bytes(b"")
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    status = main([arg.format(dir=tmp_path) for arg in argv])
    err = capsys.readouterr().err
    assert status == 2, err
    assert message in err
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_an_uncertified_plan_is_refused_before_allocation(monkeypatch):
    data = plan_to_json(build_plan(BobConfig(prompts=1, updates=1)))
    data["launches"][1]["args"][2]["pointer"] = hex(int(data["launches"][1]["args"][2]
                                                       ["pointer"], 16) + 1024)
    allocations = []
    monkeypatch.setattr(np, "zeros", lambda *a, **k: allocations.append(a))
    with pytest.raises(CertificateError, match="footprint-overflow"):
        CpuBackend(plan_from_json(data, regions=catalogue()))
    assert allocations == []


def test_text_commands_refuse_a_table_that_is_not_bytes(tmp_path, capsys):
    path = tmp_path / "tokens.safetensors"
    Checkpoint.zeros(300, Hyper(), "hard").save(path)
    (tmp_path / "text.txt").write_bytes(b"abc")
    before = sorted(p.name for p in tmp_path.iterdir())
    for argv in (["predict", "-c", str(path), "a"],
                 ["generate", "-c", str(path), "-p", "a", "-n", "3"],
                 ["eval", "-c", str(path), "--text", str(tmp_path / "text.txt")]):
        assert main([*argv, "--backend", "cpu"]) == 2
        assert "V=300; text needs a byte table (V=256)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_plan_emit_refuses_a_file_for_a_directory(tmp_path, capsys):
    target = tmp_path / "plain-file"
    target.write_text("keep me")
    status = main(["plan", "-N", "1", "--emit", str(target)])
    assert status == 2
    assert "is a file" in capsys.readouterr().err
    assert target.read_text() == "keep me"


def test_plot_and_bench_refuse_an_output_they_cannot_write(tmp_path, capsys):
    path = tmp_path / "model.safetensors"
    Checkpoint.zeros(4, Hyper(), "hard").save(path)
    (tmp_path / "plain").write_text("keep me")
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(["plot", "-c", str(path), "--out", str(tmp_path / "plain" / "plots")]) == 2
    assert "plain does not exist" in capsys.readouterr().err
    assert main(["bench", "--backend", "cpu", "-V", "4", "-N", "1", "-r", "1", "--save",
                 str(tmp_path / "missing" / "bench.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before
