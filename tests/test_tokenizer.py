"""Token models with a tokenizer: nanoGPT's meta.pkl (read without unpickling objects), a
Hugging Face `tokenizers` JSON file, a tiktoken name; V read from it; contradictions
refused with exit 2 and nothing written."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import pickle
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from bob.cli.main import main
from bob.errors import BadInput
from bob.host import inference
from bob.records import tokenizer as tokenizer_module
from bob.records.checkpoint import Checkpoint
from bob.records.shards import open_checkpoint
from bob.records.tokenizer import load_tokenizer
from conftest import listing

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
        "\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\n"
        "Resolved. resolved.\n\nROMEO:\nBut, soft! what light through yonder window breaks?\n"
        ) * 30


def prepare(directory: Path, text: str = TEXT) -> tuple[Path, Path, int]:
    """What nanoGPT's data/shakespeare_char/prepare.py writes: train.bin (uint16) and
    meta.pkl (vocab_size, itos, stoi)."""
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}
    np.array([stoi[c] for c in text], np.uint16).tofile(directory / "train.bin")
    with open(directory / "meta.pkl", "wb") as file:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, file)
    return directory / "train.bin", directory / "meta.pkl", len(chars)


@pytest.fixture(scope="module")
def chars(tmp_path_factory) -> tuple[Path, Path, Path, int]:
    """A character-level model trained on train.bin with V read from meta.pkl."""
    directory = tmp_path_factory.mktemp("chars")
    train_bin, meta, vocab = prepare(directory)
    model = directory / "chars.safetensors"
    assert main(["train", "--tokens", str(train_bin), "--tokenizer", str(meta), "--steps",
                 "150", "-N", "50", "-c", str(model), "--backend", "cpu"]) == 0
    return model, train_bin, meta, vocab


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# -- meta.pkl --------------------------------------------------------------------------------
def test_meta_pkl_round_trips_text(tmp_path):
    _, meta, vocab = prepare(tmp_path)
    loaded = load_tokenizer(meta)
    assert (loaded.kind, loaded.vocab) == ("meta.pkl", vocab)
    ids = loaded.encode("ROMEO: But, soft!")
    assert loaded.decode(ids) == "ROMEO: But, soft!"
    chars = sorted(set(TEXT))
    assert ids == [chars.index(c) for c in "ROMEO: But, soft!"]
    with pytest.raises(BadInput, match=r"'Z' \(character 2 of the text\) is not in the "
                                       r"vocabulary of .*meta.pkl"):
        loaded.encode("ROZ")


def test_train_reads_v_from_meta_pkl(chars):
    model, _, _, vocab = chars
    assert open_checkpoint(model).state.vocab == vocab


def test_generate_encodes_the_prompt_and_decodes_the_ids(chars, capsys):
    model, _, meta, _ = chars
    argv = ("generate", "-c", str(model), "--tokenizer", str(meta), "-p", "ROMEO:", "-n",
            "200", "--seed", "3", "--backend", "cpu")
    status, out, _ = run(capsys, *argv)
    assert status == 0 and out.startswith("ROMEO:")
    assert set(out[:-1]) <= set(TEXT)
    loaded = load_tokenizer(meta)
    status, ids_out, _ = run(capsys, "generate", "-c", str(model), "--ids",
                             " ".join(map(str, loaded.encode("ROMEO:"))), "-n", "200",
                             "--seed", "3", "--backend", "cpu")
    assert status == 0
    assert loaded.decode([int(i) for i in ids_out.split()]) + "\n" == out  # the same draw
    status, as_json, _ = run(capsys, *argv, "--json")
    entry = json.loads(as_json)
    assert entry["prompt"] == "ROMEO:" and entry["text"] + "\n" == out
    assert loaded.decode(entry["ids"]) == entry["text"]
    status, raw, _ = run(capsys, *argv, "--raw")
    assert status == 0 and raw == out[:-1]
    status, greedy, _ = run(capsys, "generate", "-c", str(model), "--tokenizer", str(meta),
                            "-p", "Speak", "-n", "20", "-t", "0", "--backend", "cpu")
    rows = Checkpoint.load(model).parameters
    last, want = loaded.encode("k")[0], []
    for _ in range(20):
        last = int(np.argmax(rows[last]))
        want.append(last)
    assert greedy == "Speak" + loaded.decode(want) + "\n"


def test_predict_with_a_tokenizer(chars, capsys):
    model, _, meta, _ = chars
    status, out, _ = run(capsys, "predict", "-c", str(model), "--tokenizer", str(meta),
                         "--backend", "cpu", "--json", "ROMEO", "Speak")
    assert status == 0
    loaded = load_tokenizer(meta)
    rows = Checkpoint.load(model).parameters
    for entry, prompt in zip(json.loads(out), ("ROMEO", "Speak"), strict=True):
        assert entry["prompt"] == prompt and entry["ids"] == loaded.encode(prompt)
        assert entry["next"] == int(np.argmax(rows[loaded.encode(prompt)[-1]]))
        assert entry["next_text"] == loaded.decode([entry["next"]])


def test_eval_of_the_text_through_the_tokenizer_is_eval_of_its_tokens(chars, tmp_path, capsys):
    model, train_bin, meta, _ = chars
    text = tmp_path / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    status, by_text, _ = run(capsys, "eval", "-c", str(model), "--tokenizer", str(meta),
                             "--text", str(text), "--backend", "cpu", "--json")
    assert status == 0
    status, by_tokens, _ = run(capsys, "eval", "-c", str(model), "--tokenizer", str(meta),
                               "--tokens", str(train_bin), "--backend", "cpu", "--json")
    assert status == 0
    by_text, by_tokens = json.loads(by_text), json.loads(by_tokens)
    assert by_text["nats_per_transition"] == by_tokens["nats_per_transition"]
    assert by_text["transitions"] == by_tokens["transitions"] == len(TEXT) - 1
    assert by_text["unit"] == "token" and "bits_per_token" in by_text


def test_eval_through_the_tokenizer_reads_a_fifo_as_the_file(chars, tmp_path, capsys):
    model, _, meta, _ = chars
    text = tmp_path / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(text.read_bytes()), daemon=True)
    writer.start()
    reports = []
    for source in (fifo, text):
        status, out, err = run(capsys, "eval", "-c", str(model), "--tokenizer", str(meta),
                               "--text", str(source), "--backend", "cpu", "--json")
        assert status == 0, err
        reports.append(json.loads(out))
    writer.join(10)
    assert reports[0]["nats_per_transition"] == reports[1]["nats_per_transition"]


def test_eval_through_the_tokenizer_bounds_what_it_reads_of_a_stream(chars, tmp_path, capsys,
                                                                      monkeypatch):
    model, _, meta, _ = chars
    assert inference.TEXT_STREAM_MAX_BYTES == 1 << 30
    monkeypatch.setattr(inference, "TEXT_STREAM_MAX_BYTES", 4096)
    status, _, err = run(capsys, "eval", "-c", str(model), "--tokenizer", str(meta),
                         "--text", "/dev/zero", "--backend", "cpu")
    assert status == 2
    assert err == ("bob: /dev/zero: the stream goes on past 4,096 bytes (4 KiB), the most Bob "
                   "reads from a stream for a tokenizer to encode\n")
    assert listing(tmp_path) == []


def test_count_reads_v_from_meta_pkl(tmp_path, capsys):
    train_bin, meta, vocab = prepare(tmp_path)
    status, out, _ = run(capsys, "count", "--tokens", str(train_bin), "--tokenizer", str(meta),
                         "-o", str(tmp_path / "c.safetensors"), "--json")
    assert status == 0
    assert json.loads(out.strip().splitlines()[-1])["vocab"] == vocab


class Evil:
    """Unpickling this would run a command: a restricted unpickler must never call it."""

    def __reduce__(self):
        return os.system, ("touch pwned",)


@pytest.mark.parametrize(("payload", "message"), [
    (Evil(), "refused as a meta.pkl: it names posix.system, and a meta.pkl holds only "
             "dicts, ints and strings"),
    ({"vocab_size": 2, "itos": [0, 1], "stoi": {}},
     "refused as a meta.pkl: it holds a list, and a meta.pkl holds only dicts, ints and "
     "strings"),
    ({"vocab_size": 2.0, "itos": {}, "stoi": {}}, "refused as a meta.pkl: it holds a float"),
    ({"vocab": 2}, "not nanoGPT's meta.pkl (a dict of vocab_size, stoi and itos)"),
    ({"vocab_size": 3, "itos": {0: "a", 1: "b"}, "stoi": {"a": 0, "b": 1}},
     "itos is not a string for each id 0..2"),
    ({"vocab_size": 2, "itos": {0: "a", 1: "b"}, "stoi": {"a": 1, "b": 0}},
     "stoi is not the inverse of itos"),
    ({"vocab_size": 2, "itos": {0: "ab", 1: "b"}, "stoi": {"ab": 0, "b": 1}},
     "stoi key 'ab' is not one character"),
    ({"vocab_size": 1, "itos": {0: "a"}, "stoi": {"a": 0}}, "vocab_size 1 is outside [2, "),
])
def test_a_meta_pkl_that_is_not_plain_is_refused_unrun(tmp_path, capsys, monkeypatch, payload,
                                                      message):
    monkeypatch.chdir(tmp_path)
    meta = tmp_path / "meta.pkl"
    meta.write_bytes(pickle.dumps(payload))
    (tmp_path / "t.bin").write_bytes(np.zeros(10, "<u2").tobytes())
    before = listing(tmp_path)
    status, out, err = run(capsys, "train", "--tokens", "t.bin", "--tokenizer", "meta.pkl",
                           "--steps", "1", "--backend", "cpu")
    assert status == 2, err
    assert err.startswith("bob: meta.pkl: ") and message in err
    assert listing(tmp_path) == before  # no checkpoint, and no "pwned"


def test_a_file_that_is_no_tokenizer_is_refused(tmp_path, capsys):
    junk = tmp_path / "vocab.txt"
    junk.write_text("a b c")
    status, _, err = run(capsys, "count", "--tokens", str(junk), "--tokenizer", str(junk),
                         "-o", str(tmp_path / "c.st"))
    assert status == 2
    assert err == (f"bob: {junk}: not a tokenizer (expected a Hugging Face tokenizers JSON "
                   "file or nanoGPT's meta.pkl)\n")
    status, _, err = run(capsys, "count", "--tokens", str(junk), "--tokenizer",
                         str(tmp_path / "absent.json"), "-o", str(tmp_path / "c.st"))
    assert status == 2 and err == f"bob: {tmp_path / 'absent.json'}: no such file\n"
    assert listing(tmp_path) == ["vocab.txt"]


# -- contradictions -----------------------------------------------------------------------
def test_a_vocab_that_contradicts_the_tokenizer_is_refused(tmp_path, capsys):
    train_bin, meta, vocab = prepare(tmp_path)
    before = listing(tmp_path)
    wrong = str(vocab + 3)
    expected = f"bob: --vocab: V={wrong}, but the tokenizer {meta} has V={vocab}\n"
    for argv in (["train", "--tokens", str(train_bin), "--vocab", wrong, "--tokenizer",
                  str(meta), "--backend", "cpu", "-c", str(tmp_path / "m.st")],
                 ["count", "--tokens", str(train_bin), "--vocab", wrong, "--tokenizer",
                  str(meta), "-o", str(tmp_path / "c.st")]):
        status, out, err = run(capsys, *argv)
        assert (status, err) == (2, expected), argv
    assert listing(tmp_path) == before


def test_a_checkpoint_of_another_v_than_the_tokenizer_is_refused(chars, tmp_path, capsys):
    model, _, _, vocab = chars
    _, other_meta, other_vocab = prepare(tmp_path, "just these letters")
    assert other_vocab != vocab
    text = tmp_path / "x.txt"
    text.write_text("just")
    before = listing(tmp_path)
    expected = f"bob: {model}: V={vocab}, but the tokenizer {other_meta} has V={other_vocab}\n"
    for argv in (["generate", "-c", str(model), "-p", "just"],
                 ["predict", "-c", str(model), "just"],
                 ["eval", "-c", str(model), "--text", str(text)]):
        status, out, err = run(capsys, *argv, "--tokenizer", str(other_meta), "--backend",
                               "cpu")
        assert (status, out, err) == (2, "", expected), argv
    assert listing(tmp_path) == before


def test_text_trains_on_bytes_so_a_tokenizer_beside_it_is_refused(tmp_path, capsys):
    _, meta, _ = prepare(tmp_path)
    (tmp_path / "a.txt").write_text("abc" * 10)
    before = listing(tmp_path)
    status, _, err = run(capsys, "train", "--text", str(tmp_path / "a.txt"), "--tokenizer",
                         str(meta), "-c", str(tmp_path / "m.st"), "--backend", "cpu")
    assert status == 2
    assert err == "bob: --tokenizer gives the V of --tokens files; text trains on bytes (V=256)\n"
    status, _, err = run(capsys, "count", str(tmp_path / "a.txt"), "--tokenizer", str(meta),
                         "-o", str(tmp_path / "c.st"))
    assert status == 2 and "text is counted as bytes (V=256)" in err
    assert listing(tmp_path) == before


def test_a_token_model_without_a_tokenizer_takes_ids(chars, capsys):
    model, _, _, vocab = chars
    status, out, err = run(capsys, "generate", "-c", str(model), "-p", "ROMEO", "--backend",
                           "cpu")
    assert status == 2 and out == ""
    assert f"V={vocab}; text needs a byte table (V=256), or a --tokenizer for a token model" \
        in err


# -- Hugging Face tokenizers ----------------------------------------------------------------
def word_level_tokenizer(path: Path, words: list[str]) -> None:
    """A tiny word-level `tokenizers` JSON file: one id per word, split at whitespace."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    built = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    built.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    built.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
    built.save(str(path))


@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None,
                    reason="the tokenizers package (bob-bigram[tokens]) is not installed here; the "
                           "meta.pkl path is tested without it")
def test_a_tokenizers_json_file_encodes_decodes_and_gives_v(tmp_path, capsys):
    words = ["<unk>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
    path = tmp_path / "tokenizer.json"
    word_level_tokenizer(path, words)
    loaded = load_tokenizer(path)
    assert (loaded.kind, loaded.vocab) == ("tokenizers", len(words))
    assert loaded.encode("the cat sat") == [1, 2, 3]
    assert loaded.decode([1, 7, 8]) == "the dog ran"
    sentence = "the cat sat on the mat a dog ran on the mat "
    ids = np.array(loaded.encode(sentence * 50), "<u2")
    ids.tofile(tmp_path / "train.bin")
    model = tmp_path / "words.safetensors"
    status, _, err = run(capsys, "train", "--tokens", str(tmp_path / "train.bin"),
                         "--tokenizer", str(path), "--steps", "100", "-c", str(model),
                         "--backend", "cpu")
    assert status == 0, err
    assert open_checkpoint(model).state.vocab == len(words)
    status, out, _ = run(capsys, "generate", "-c", str(model), "--tokenizer", str(path), "-p",
                         "the cat", "-n", "12", "--backend", "cpu")
    assert status == 0 and out.startswith("the cat ")
    assert set(out.split()) <= set(words[1:])


def test_a_tokenizers_json_without_the_package_is_one_line(tmp_path, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(tokenizer_module.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tokenizers" else find_spec(name, *a))
    path = tmp_path / "tokenizer.json"
    path.write_text('{"version": "1.0", "model": {"type": "WordLevel"}}')
    (tmp_path / "t.bin").write_bytes(np.zeros(4, "<u2").tobytes())
    before = listing(tmp_path)
    status, out, err = run(capsys, "train", "--tokens", str(tmp_path / "t.bin"), "--tokenizer",
                           str(path), "-c", str(tmp_path / "m.st"), "--backend", "cpu")
    assert (status, out) == (2, "")
    assert err == (f"bob: {path}: a tokenizers JSON file needs the tokenizers package, not "
                   "installed here: pip install 'bob-bigram[tokens]'\n")
    assert listing(tmp_path) == before


# -- tiktoken ---------------------------------------------------------------------------------
def test_a_tiktoken_name_without_tiktoken_is_refused(tmp_path, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(tokenizer_module.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tiktoken" else find_spec(name, *a))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.bin").write_bytes(np.zeros(4, "<u2").tobytes())
    status, _, err = run(capsys, "count", "--tokens", "t.bin", "--tokenizer", "gpt2")
    assert status == 2
    assert err == ("bob: gpt2: no such file; as a tiktoken encoding name it needs the "
                   "tiktoken package, not installed here\n")
    assert listing(tmp_path) == ["t.bin"]


class FakeEncoding:
    """A stand-in for a tiktoken Encoding: one id per lower-case letter or space."""

    n_vocab = 27

    def encode(self, text: str, allowed_special=()) -> list[int]:
        return [26 if c == " " else ord(c) - ord("a") for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(" " if i == 26 else chr(ord("a") + i) for i in ids)


def fake_tiktoken(monkeypatch, available: set[str]) -> None:
    module = types.ModuleType("tiktoken")
    module.__spec__ = importlib.machinery.ModuleSpec("tiktoken", None)

    def get_encoding(name: str) -> FakeEncoding:
        if name not in available:
            raise ValueError(f"Unknown encoding {name}")  # as tiktoken says it
        return FakeEncoding()

    module.get_encoding = get_encoding
    monkeypatch.setitem(sys.modules, "tiktoken", module)


def test_a_tiktoken_encoding_where_tiktoken_has_it(tmp_path, capsys, monkeypatch):
    fake_tiktoken(monkeypatch, {"letters"})
    monkeypatch.chdir(tmp_path)
    encoding = FakeEncoding()
    np.array(encoding.encode("the quick brown fox jumps over the lazy dog " * 40),
             "<u2").tofile("train.bin")
    status, _, err = run(capsys, "train", "--tokens", "train.bin", "--tokenizer", "letters",
                         "--steps", "50", "-c", "m.st", "--backend", "cpu")
    assert status == 0, err
    assert open_checkpoint("m.st").state.vocab == 27
    status, out, _ = run(capsys, "generate", "-c", "m.st", "--tokenizer", "letters", "-p",
                         "the ", "-n", "30", "--backend", "cpu")
    assert status == 0 and out.startswith("the ") and set(out[:-1]) <= set(
        "abcdefghijklmnopqrstuvwxyz ")
    status, _, err = run(capsys, "generate", "-c", "m.st", "--tokenizer", "gpt2", "-p", "x")
    assert status == 2
    assert err == ("bob: gpt2: no such file, and tiktoken cannot load it as an encoding "
                   "(Unknown encoding gpt2); its data must be in tiktoken's cache\n")
