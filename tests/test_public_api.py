"""The public API, `import bob`: TrainConfig, train, load and Model, held against what the
command line does with the same data; `import bob` stays cheap; the README's example runs
as written and prints what it shows."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bob
from bob.cli.main import main
from bob.errors import BadInput
from bob.host import sampling
from bob.records.checkpoint import Checkpoint
from bob.records.shards import open_checkpoint
from conftest import listing

ROOT = Path(__file__).resolve().parent.parent
TEXT = b"the cat sat on the mat; the rat ate the hat. " * 30


def source_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, bob.Model]:
    """The same run through the API and the command line: (text, CLI checkpoint, model)."""
    directory = tmp_path_factory.mktemp("api")
    text = directory / "cat.txt"
    text.write_bytes(TEXT)
    cli = directory / "cli.safetensors"
    assert main(["train", "--text", str(text), "--steps", "60", "-c", str(cli),
                 "--backend", "cpu"]) == 0
    model = bob.train(bob.TrainConfig(text=str(text), steps=60, out=str(directory / "m.st"),
                                      backend="cpu"))
    return text, cli, model


def cli_out(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_import_bob_loads_nothing_else():
    code = ("import sys, bob\n"
            "print(sorted(m for m in sys.modules if m.startswith('bob') or m == 'numpy'))\n"
            "print(sorted(bob.__all__))\n"
            "bob.TrainConfig\n"
            "print('numpy' in sys.modules, 'bob.host.model' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], env=source_env(), capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.splitlines() == [
        "['bob']", "['Model', 'TrainConfig', 'load', 'train']", "True True"]


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'bob' has no attribute 'trian'"):
        bob.trian  # noqa: B018


def test_train_is_bob_train_of_the_same_data(trained):
    _, cli, model = trained
    assert isinstance(model, bob.Model)
    assert (model.vocab, model.step) == (256, 60)
    api_state, cli_state = Checkpoint.load(model.path), Checkpoint.load(cli)
    for name in ("parameters", "first_moment", "second_moment"):
        assert getattr(api_state, name).tobytes() == getattr(cli_state, name).tobytes(), name
    assert api_state.history == cli_state.history
    assert api_state.successors == cli_state.successors is not None


def test_logits_and_probs_are_the_tables_rows(trained):
    _, cli, model = trained
    table = Checkpoint.load(cli).parameters
    assert model.logits(ord("t")).shape == (256,)
    assert model.logits(ord("t")).tobytes() == table[ord("t")].tobytes()
    rows = model.logits("th")
    assert rows.shape == (2, 256) and rows.tobytes() == table[[ord("t"), ord("h")]].tobytes()
    assert model.logits(b"th").tobytes() == rows.tobytes()
    assert model.logits([116, 104]).tobytes() == rows.tobytes()
    probs = model.probs(ord("t"))
    softmax = np.exp(table[ord("t")].astype(np.float64) - table[ord("t")].max())
    assert probs == pytest.approx(softmax / softmax.sum(), rel=1e-5)
    assert probs.sum() == pytest.approx(1.0)
    assert int(probs.argmax()) == int(np.argmax(table[ord("t")]))
    cooler = model.probs("t", temperature=0.5)
    assert cooler.shape == (1, 256) and cooler[0].max() > probs.max()
    with pytest.raises(BadInput, match="temperature must be > 0, not 0"):
        model.probs("t", temperature=0)
    with pytest.raises(BadInput, match=r"symbol 256 is not in \[0, V=256\)"):
        model.logits([256])


def test_generate_is_bob_generate(trained, capsys):
    _, cli, model = trained
    common = ("generate", "-c", str(cli), "--backend", "cpu", "-p", "the ", "-n", "50")
    assert "the " + model.generate("the ", 50) + "\n" == cli_out(capsys, *common)
    assert "the " + model.generate("the ", 50, seed=9) + "\n" == cli_out(capsys, *common,
                                                                         "--seed", "9")
    greedy = model.generate("the ", 50, temperature=0)
    assert "the " + greedy + "\n" == cli_out(capsys, *common, "-t", "0")
    table = Checkpoint.load(cli).parameters
    last, want = ord(" "), []
    for _ in range(50):
        last = int(np.argmax(table[last]))
        want.append(last)
    assert greedy == bytes(want).decode()
    assert model.generate(b"the ", 50, temperature=0) == bytes(want)
    assert model.generate(list(b"the "), 50, temperature=0) == want
    three = model.generate("the ", 50, seed=2, num_samples=3)
    printed = cli_out(capsys, *common, "--seed", "2", "--num-samples", "3")
    assert printed == "\n---------------\n".join("the " + s for s in three) + "\n"
    hot = model.generate(b"t", 400, temperature=5, top_k=None, seed=1)
    seen = open_checkpoint(cli).state.seen()
    assert set(hot) <= set(np.flatnonzero(seen))  # a byte model of text: seen bytes only
    wild = model.generate(b"t", 400, temperature=5, top_k=None, seed=1, seen_only=False)
    assert set(wild) - set(np.flatnonzero(seen))
    want_hot = []
    last = ord("t")
    for position in range(400):
        last = sampling.sample_row(table[last], 5, sampling.uniform(1, position), None, seen)
        want_hot.append(last)
    assert list(hot) == want_hot


def test_eval_is_bob_eval(trained, capsys):
    text, cli, model = trained
    printed = json.loads(cli_out(capsys, "eval", "-c", str(cli), "--text", str(text),
                                 "--backend", "cpu", "--json"))
    report = model.eval(TEXT.decode())
    assert report.nats == printed["nats_per_transition"]
    assert report.optimum == printed["optimum"] and report.transitions == len(TEXT) - 1
    assert report.unit == "byte" and report.bits == pytest.approx(report.nats / np.log(2))
    assert model.eval(TEXT).nats == model.eval(list(TEXT)).nats == report.nats
    with pytest.raises(BadInput, match=r"no transitions \(at least two symbols"):
        model.eval("a")


def test_the_table_is_mapped_read_only_and_to_torch_copies_it(trained, monkeypatch):
    _, cli, model = trained
    table = model.table
    assert isinstance(table, np.memmap) and table.shape == (256, 256)
    assert table.dtype == np.float32
    assert table.tobytes() == Checkpoint.load(cli).parameters.tobytes()
    with pytest.raises(ValueError):
        table[0, 0] = 1.0
    pytest.importorskip("torch")
    tensor = model.to_torch()
    assert tuple(tensor.shape) == (256, 256) and tensor.numpy().tobytes() == table.tobytes()
    monkeypatch.setitem(sys.modules, "torch", None)  # as where PyTorch is not installed
    with pytest.raises(BadInput, match=r"Model.to_torch needs PyTorch, which is not installed "
                                       r"here \(pip install torch\)"):
        model.to_torch()


def test_load_gives_the_same_model(trained, capsys):
    _, cli, _ = trained
    loaded = bob.load(cli)
    assert (loaded.vocab, loaded.step, loaded.path) == (256, 60, str(cli))
    assert repr(loaded) == f"Model(V=256 bytes, step=60, {str(cli)!r})"
    assert loaded.generate("a", 30, seed=4) == bob.load(str(cli)).generate("a", 30, seed=4)
    with pytest.raises(BadInput, match="absent.safetensors: no such file"):
        bob.load(cli.parent / "absent.safetensors")


def test_steps_0_still_writes_the_checkpoint(tmp_path):
    text = tmp_path / "cat.txt"
    text.write_bytes(TEXT)
    out = tmp_path / "zero.safetensors"
    model = bob.train(bob.TrainConfig(text=str(text), steps=0, out=str(out), backend="cpu"))
    stored = Checkpoint.load(out)
    assert stored.step == 0 and model.step == 0
    for name in ("parameters", "first_moment", "second_moment"):
        assert not getattr(stored, name).any(), name
    assert stored.history == ((0, pytest.approx(np.log(256))),)
    assert stored.successors is not None and stored.optimum is not None
    resumed = bob.train(bob.TrainConfig(text=str(text), steps=20, out=str(out), resume=True,
                                        backend="cpu"))
    straight = bob.train(bob.TrainConfig(text=str(text), steps=20, backend="cpu"))
    assert resumed.table.tobytes() == straight.table.tobytes()


def test_a_model_without_out_lives_in_a_temporary_file(tmp_path):
    model = bob.train(bob.TrainConfig(steps=0, backend="cpu"))
    path = Path(model.path)
    assert path.exists() and model.step == 0
    kept = tmp_path / "kept.safetensors"
    model.save(kept)
    assert kept.read_bytes() == path.read_bytes()
    with pytest.raises(BadInput, match="kept.safetensors: exists; pass overwrite=True"):
        model.save(kept)
    del model
    gc.collect()
    assert not path.exists() and not path.parent.exists()
    assert bob.load(kept).step == 0


@pytest.mark.parametrize(("fields", "message"), [
    ({"steps": -1}, "steps must be an integer >= 0, not -1"),
    ({"steps": 1.5}, "steps must be an integer >= 0, not 1.5"),
    ({"lr": -1.0}, "lr = -1.0 is negative"),
    ({"beta1": 1.0}, "beta1 = 1.0 is outside [0, 1)"),
    ({"resume": True}, "resume continues a checkpoint: give it as out"),
    ({"tokenizer": "meta.pkl"},
     "tokenizer gives the V of token files; text trains on bytes (V=256)"),
])
def test_a_bad_config_is_refused_when_made(fields, message):
    with pytest.raises(BadInput) as refused:
        bob.TrainConfig(**fields)
    assert message in str(refused.value)


def test_train_refuses_what_bob_train_refuses_and_writes_nothing(tmp_path):
    existing = tmp_path / "m.safetensors"
    existing.write_bytes(b"keep")
    before = listing(tmp_path)
    with pytest.raises(BadInput, match="m.safetensors: exists; pass --resume to continue it "
                                       "or --overwrite"):
        bob.train(bob.TrainConfig(steps=5, out=str(existing), backend="cpu"))
    with pytest.raises(BadInput, match="absent.txt: no such file"):
        bob.train(bob.TrainConfig(text=str(tmp_path / "absent.txt"), steps=5,
                                  out=str(tmp_path / "new.safetensors"), backend="cpu"))
    assert listing(tmp_path) == before and existing.read_bytes() == b"keep"


def test_a_token_model_speaks_text_through_its_tokenizer(tmp_path):
    from test_tokenizer import prepare

    train_bin, meta, vocab = prepare(tmp_path)
    model = bob.train(bob.TrainConfig(tokens=str(train_bin), tokenizer=str(meta), steps=40,
                                      backend="cpu"))
    assert model.vocab == vocab and model.tokenizer is not None
    text = model.generate("ROMEO:", 80, seed=5)
    assert isinstance(text, str) and len(text) == 80
    ids = model.generate(model.encode("ROMEO:"), 80, seed=5)
    assert model.decode(ids) == text
    report = model.eval("ROMEO:\nBut, soft!")
    assert report.unit == "token" and report.transitions == len("ROMEO:\nBut, soft!") - 1
    bare = bob.load(model.path)  # no tokenizer: ids only
    assert bare.generate(ids[:1], 5, temperature=0) == model.generate(ids[:1], 5,
                                                                       temperature=0)
    with pytest.raises(BadInput, match=f"V={vocab}; text needs a byte table"):
        bare.generate("ROMEO:", 5)
    with pytest.raises(BadInput, match=f"V={vocab}, but the tokenizer"):
        bob.load(model.path, tokenizer=_other_meta(tmp_path))


def _other_meta(directory: Path) -> str:
    """A meta.pkl of another V."""
    from test_tokenizer import prepare

    other = directory / "other"
    other.mkdir()
    return str(prepare(other, "xyz xyz")[1])


# -- the README's example ------------------------------------------------------------------
def readme_example() -> tuple[str, str]:
    """The Python API section's first python block and the text block it says it prints."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The Python API", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    printed = section.split("prints\n\n```text\n", 1)[1].split("```", 1)[0]
    return code, printed


def test_the_readme_example_runs_and_prints_what_it_shows(tmp_path):
    code, printed = readme_example()
    assert "import bob" in code and "bob.train(" in code and "bob.load(" in code
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=source_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == printed
    assert (tmp_path / "model.safetensors").exists()
