"""Sampling as makemore does: `bob generate` without a prompt (a byte model from the start
of a line, a token model from the symbol its data starts with) and `--lines K` for K whole
lines, so a model of a names list writes K names. Run as a user would, the output checked."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

import bob
from bob.cli.main import main
from bob.host import api

NAMES = [b"emma", b"olivia", b"ava", b"isabella", b"sophia", b"mia", b"charlotte", b"amelia",
         b"harper", b"evelyn", b"abigail", b"emily", b"ella", b"elizabeth", b"camila"]
TEXT = b"".join(name + b"\n" for name in NAMES) * 4
LETTERS = set(b"".join(NAMES))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(scope="module")
def names_model(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("names")
    (directory / "names.txt").write_bytes(TEXT)
    model = directory / "names.safetensors"
    assert main(["train", "--backend", "cpu", "--text", str(directory / "names.txt"),
                 "--steps", "300", "-c", str(model)]) == 0
    return model


@pytest.fixture(scope="module")
def char_model(tmp_path_factory) -> tuple[Path, Path, dict[str, int]]:
    """The names as nanoGPT's char-level prepare.py writes them: train.bin and meta.pkl."""
    directory = tmp_path_factory.mktemp("chars")
    text = TEXT.decode()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    np.array([stoi[c] for c in text], np.uint16).tofile(directory / "train.bin")
    with open(directory / "meta.pkl", "wb") as file:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi},
                    file)
    model = directory / "chars.safetensors"
    assert main(["train", "--backend", "cpu", "--tokens", str(directory / "train.bin"),
                 "--tokenizer", str(directory / "meta.pkl"), "--steps", "300", "-c",
                 str(model)]) == 0
    return model, directory / "meta.pkl", stoi


def test_lines_without_a_prompt_prints_that_many_names(names_model, capsys):
    status, out, err = run(capsys, "generate", "-c", str(names_model), "--lines", "7",
                           "--seed", "3")
    assert status == 0 and err == ""
    lines = out.split("\n")
    assert lines[-1] == "" and len(lines) == 8  # seven whole lines, each ended
    assert all(line and set(line.encode()) <= LETTERS for line in lines[:-1]), lines
    # A seed gives the same names; another seed others.
    assert run(capsys, "generate", "-c", str(names_model), "--lines", "7", "--seed",
               "3")[1] == out
    assert run(capsys, "generate", "-c", str(names_model), "--lines", "7", "--seed",
               "4")[1] != out


def test_without_a_prompt_a_byte_model_starts_a_line(names_model, capsys):
    """The first draw continues a newline: what the prompt "\\n" gives, less the prompt."""
    status, out, _ = run(capsys, "generate", "-c", str(names_model), "-n", "40", "--seed", "5")
    assert status == 0
    _, after_newline, _ = run(capsys, "generate", "-c", str(names_model), "-p", "\n", "-n", "40",
                              "--seed", "5")
    assert "\n" + out == after_newline
    assert len(out.encode()) == 41  # 40 bytes and the line print adds


def test_several_samples_of_lines_are_separated_and_each_whole(names_model, capsys):
    status, out, _ = run(capsys, "generate", "-c", str(names_model), "--lines", "3",
                         "--num-samples", "2", "--seed", "1")
    assert status == 0
    first, second = out.split("\n---------------\n")
    assert first.count("\n") == 2 and second.count("\n") == 3 and out.endswith("\n")
    # Sample 0 is the one sample of that seed.
    assert run(capsys, "generate", "-c", str(names_model), "--lines", "3", "--seed",
               "1")[1] == first + "\n"


def test_lines_as_json_and_raw(names_model, capsys):
    status, out, _ = run(capsys, "generate", "-c", str(names_model), "--lines", "2", "--json")
    shown = json.loads(out)
    assert status == 0 and shown["prompt"] == "" and shown["text"].count("\n") == 2
    status, out, _ = run(capsys, "generate", "-c", str(names_model), "--lines", "2", "--raw")
    assert status == 0 and out == shown["text"]


def test_a_sample_that_reaches_n_before_its_lines_end_says_so(names_model, capsys):
    status, out, err = run(capsys, "generate", "-c", str(names_model), "--lines", "50", "-n",
                           "20", "--seed", "2")
    assert status == 0 and len(out.encode()) <= 21
    assert err.startswith("(sample 1: ") and err.endswith(" of 50 lines ended within -n 20 "
                                                          "symbols)\n")


def test_the_api_generates_whole_lines_as_the_command_does(names_model, capsys):
    model = bob.load(str(names_model))
    text = model.generate(lines=4, seed=9)
    assert isinstance(text, str) and text.count("\n") == 4 and text.endswith("\n")
    assert run(capsys, "generate", "-c", str(names_model), "--lines", "4", "--seed",
               "9")[1] == text
    assert model.generate(lines=4, seed=9, num_samples=2)[0] == text
    ids = api.generate_samples(str(names_model), None, 1000, 0.8, 9, "cpu", 200, None, 1, 4)
    assert bytes(ids[0]).decode() == text


def test_a_token_model_starts_from_its_datas_first_symbol(char_model, capsys):
    model, meta, stoi = char_model
    status, out, err = run(capsys, "generate", "-c", str(model), "--tokenizer", str(meta),
                           "--lines", "5", "--seed", "2")
    assert status == 0 and err == ""
    lines = out.split("\n")
    assert len(lines) == 6 and lines[0].startswith("e")  # the data starts with "emma"
    assert all(line and set(line.encode()) <= LETTERS for line in lines[:-1]), lines
    # Without the tokenizer the ids; the newline's id ends a line with --stop.
    status, out, _ = run(capsys, "generate", "-c", str(model), "--lines", "2", "--stop",
                         str(stoi["\n"]), "--seed", "2")
    ids = [int(word) for word in out.split()]
    assert status == 0 and ids[0] == stoi["e"] and ids.count(stoi["\n"]) == 2
    assert ids[-1] == stoi["\n"]
    names = bob.load(str(model), tokenizer=str(meta)).generate(lines=5, seed=2)
    assert names == "\n".join(lines[:-1]) + "\n"


@pytest.mark.parametrize("argv,message", [
    (["--lines", "0"], "bob generate: Invalid value for '--lines': 0 is not in the range "
                       "1<=x<=100000. (see bob generate --help)"),
    (["--stop", "10"], "bob generate: --stop ends the lines of --lines: give --lines K too "
                       "(see bob generate --help)"),
    (["--lines", "2", "--stop", "300"], "bob: --stop 300 is not a symbol of this model: "
                                        "[0, V=256)"),
    (["-p", "x", "--ids", "1"], "bob generate: give --prompt text or --ids, not both (see bob "
                                "generate --help)"),
])
def test_bad_generation_options_are_refused_in_one_line(names_model, capsys, argv, message):
    status, out, err = run(capsys, "generate", "-c", str(names_model), *argv)
    assert status == 2 and out == "" and err == message + "\n"


def test_a_token_model_without_a_line_end_refuses_lines(char_model, capsys):
    model, _, _ = char_model
    status, out, err = run(capsys, "generate", "-c", str(model), "--lines", "2")
    assert status == 2 and out == ""
    assert err == (f"bob: {model}: --lines ends a sample at its lines' ends: a token model "
                   "needs --stop ID (or a --tokenizer with a newline token)\n")


def test_a_token_model_from_counts_needs_a_prompt(tmp_path, capsys):
    tokens = tmp_path / "t.bin"
    np.array([1, 2, 3, 1, 2, 3, 4], "<u2").tofile(tokens)
    counts = tmp_path / "t.counts"
    assert main(["count", "--tokens", str(tokens), "--vocab", "8", "-o", str(counts)]) == 0
    model = tmp_path / "m.safetensors"
    assert main(["train", "--backend", "cpu", "--counts", str(counts), "--steps", "3", "-c",
                 str(model)]) == 0
    status, out, err = run(capsys, "generate", "-c", str(model), "-n", "5")
    assert status == 2 and out == ""
    assert err == (f"bob: {model}: the checkpoint does not record a symbol its data starts "
                   "with (trained from a counts file, or written before Bob kept it): give "
                   "--prompt or --ids, or a --tokenizer that has a newline token\n")
    # with ids it generates
    assert run(capsys, "generate", "-c", str(model), "--ids", "1", "-n", "5")[0] == 0
