"""`bob generate` as nanoGPT's sample.py: temperature 0.8 and top-k 200 by default, greedy
with -t 0, --seen-only from the successors a checkpoint records, --num-samples; and
`bob eval`'s unit, bits per byte or per token."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from bob.cli.main import main
from bob.errors import BadInput
from bob.host import inference, sampling
from bob.records.checkpoint import Checkpoint, ranges_mask, symbol_ranges
from bob.records.shards import open_checkpoint

# ASCII prose, long enough that a byte model learns it, short enough to train in seconds.
ASCII_TEXT = (b"It is a truth universally acknowledged, that a single man in possession of a "
              b"good fortune, must be in want of a wife. However little known the feelings "
              b"or views of such a man may be on his first entering a neighbourhood; "
              b"1234567890 (brackets) [more] {braces} <angles> 'quotes' \"double\" ~!@#$%^&*\n"
              ) * 40


def successors_of(data: bytes) -> np.ndarray:
    """The bytes that follow another byte in `data`: computed here, not by Bob."""
    seen = np.zeros(256, bool)
    seen[np.frombuffer(data[1:], np.uint8)] = True
    return seen


@pytest.fixture(scope="module")
def ascii_model(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("ascii")
    text = directory / "ascii.txt"
    text.write_bytes(ASCII_TEXT)
    path = directory / "ascii.safetensors"
    assert main(["train", "--text", str(text), "--steps", "100", "-N", "50", "-c", str(path),
                 "--backend", "cpu"]) == 0
    return path


def generate(capsys, model: Path, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["generate", "-c", str(model), "--backend", "cpu", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def expected_sample(rows: np.ndarray, last: int, length: int, temperature: float, seed: int,
                    top_k: int | None, allowed: np.ndarray | None, first: int = 0) -> list[int]:
    """What sampling draws, position by position, from the table's rows."""
    out = []
    for position in range(first, first + length):
        last = sampling.sample_row(rows[last], temperature, sampling.uniform(seed, position),
                                   top_k, allowed)
        out.append(last)
    return out


# -- what a checkpoint records ---------------------------------------------------------
def test_a_text_run_records_the_bytes_its_text_has_as_a_next_byte(ascii_model):
    state = open_checkpoint(ascii_model).state
    assert state.successors == symbol_ranges(successors_of(ASCII_TEXT))
    assert (state.seen() == successors_of(ASCII_TEXT)).all()
    assert not state.seen()[128:].any()  # ASCII: no byte above 127 ever follows


def test_symbol_ranges_are_the_runs_of_a_mask():
    mask = np.zeros(12, bool)
    mask[[0, 1, 2, 5, 9, 10, 11]] = True
    assert symbol_ranges(mask) == ((0, 2), (5, 5), (9, 11))
    assert (ranges_mask(symbol_ranges(mask), 12) == mask).all()
    assert symbol_ranges(np.zeros(4, bool)) == ()


@pytest.mark.parametrize(("successors", "message"), [
    ("[[5, 3]]", "successors range [5, 3] is not first <= last inside [0, V=256)"),
    ("[[0, 4], [5, 9]]", "successors range [5, 9] touches or overlaps the one before it "
                         "(ending at 4): ranges increase, apart"),
    ("[[0, 256]]", "successors range [0, 256] is not first <= last inside [0, V=256)"),
    ("[[1]]", "successors entry [1] is not a [first, last] pair of integers"),
    ("{}", "successors is not a list of [first, last] ranges"),
    ("[[0,", "successors is not JSON"),
])
def test_a_bad_successors_field_is_refused_on_load(tmp_path, ascii_model, capsys, successors,
                                                    message):
    stored = Checkpoint.load(ascii_model)
    path = tmp_path / "bad.safetensors"
    save_file({"parameters": stored.parameters, "first_moment": stored.first_moment,
               "second_moment": stored.second_moment},
              str(path), metadata={**stored.metadata(), "successors": successors})
    with pytest.raises(BadInput, match=re.escape("metadata " + message)):
        open_checkpoint(path)
    before = sorted(p.name for p in tmp_path.iterdir())
    status, out, err = generate(capsys, path, "-p", "a")
    assert status == 2 and out == "" and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_resuming_on_other_data_records_both_datas_successors(tmp_path, capsys):
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_bytes(b"abcabcabc" * 20)
    second.write_bytes(b"xyzxyz" * 20)
    path = tmp_path / "m.safetensors"
    common = ["--backend", "cpu", "-c", str(path), "--steps", "5"]
    assert main(["train", "--text", str(first), *common]) == 0
    assert main(["train", "--text", str(second), "--resume", "--new-data", *common]) == 0
    both = successors_of(b"abcabcabc") | successors_of(b"xyzxyz")
    assert (open_checkpoint(path).state.seen() == both).all()
    # From a checkpoint that cannot tell, other data leaves it unable to tell; the same
    # data alone tells again.
    stored = Checkpoint.load(path)
    old = tmp_path / "old.safetensors"
    replace(stored, successors=None).save(old)
    assert open_checkpoint(old).state.successors is None
    resume = ["--backend", "cpu", "-c", str(old), "--steps", "5", "--resume"]
    assert main(["train", "--text", str(first), "--new-data", *resume]) == 0
    assert open_checkpoint(old).state.successors is None
    capsys.readouterr()
    single = tmp_path / "single.safetensors"
    assert main(["train", "--text", str(first), "--backend", "cpu", "-c", str(single),
                 "--steps", "5"]) == 0
    replace(Checkpoint.load(single), successors=None).save(single)
    assert main(["train", "--text", str(first), "--backend", "cpu", "-c", str(single),
                 "--steps", "5", "--resume"]) == 0
    assert (open_checkpoint(single).state.seen() == successors_of(b"abcabcabc")).all()


# -- the defaults: nanoGPT's sample.py -------------------------------------------------
def test_the_default_samples_at_0_8_among_the_top_200_seen_bytes(ascii_model, capsys):
    status, out, _ = generate(capsys, ascii_model, "-p", "The ", "-n", "120")
    assert status == 0
    rows = Checkpoint.load(ascii_model).parameters
    want = expected_sample(rows, ord(" "), 120, 0.8, 0, 200, successors_of(ASCII_TEXT))
    assert out == "The " + bytes(want).decode("ascii") + "\n"
    explicit = generate(capsys, ascii_model, "-p", "The ", "-n", "120", "-t", "0.8",
                        "--top-k", "200", "--seed", "0", "--seen-only")
    assert explicit == (0, out, "")
    greedy = generate(capsys, ascii_model, "-p", "The ", "-n", "120", "-t", "0")
    assert greedy[1] != out  # the default is no longer greedy


def test_t_0_is_greedy(ascii_model, capsys):
    status, out, _ = generate(capsys, ascii_model, "-p", "e", "-n", "30", "-t", "0")
    assert status == 0
    rows = Checkpoint.load(ascii_model).parameters
    last, want = ord("e"), []
    for _ in range(30):
        last = int(np.argmax(rows[last]))
        want.append(last)
    assert out == "e" + bytes(want).decode() + "\n"


def test_the_seed_fixes_the_sample(ascii_model, capsys):
    runs = [generate(capsys, ascii_model, "-p", "a", "-n", "80", "--seed", seed)[1]
            for seed in ("5", "5", "6")]
    assert runs[0] == runs[1] != runs[2]


def test_the_length_help_speaks_of_symbols(capsys):
    assert main(["generate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Symbols to generate: bytes, or token ids for a token model (default 200;" in text
    assert "Bytes to generate" not in text
    assert "default: 0.8" in text and "default: 200" in text  # --temperature, --top-k


# -- --seen-only -------------------------------------------------------------------------
def test_seen_only_keeps_a_model_of_ascii_text_in_valid_utf8(ascii_model, capsys):
    """At -t 1 over all 256 bytes the table's tail reaches bytes above 127, which no ASCII
    text has; by default they are never drawn, so every sample is valid UTF-8."""
    argv = ("-p", "if ", "-n", "500", "-t", "1", "-k", "256", "--num-samples", "8", "--json")
    status, out, _ = generate(capsys, ascii_model, *argv)
    assert status == 0
    samples = json.loads(out)["samples"]
    assert len(samples) == 8
    for sample in samples:
        data = bytes(sample["bytes"])
        assert len(data) == 500
        data.decode("utf-8")  # strict: raises on an invalid sequence
        assert max(data) < 128
    _, unfiltered, _ = generate(capsys, ascii_model, *argv, "--no-seen-only")
    drawn = [bytes(s["bytes"]) for s in json.loads(unfiltered)["samples"]]
    assert any(max(data) >= 128 for data in drawn)  # what --seen-only prevents
    status, text, _ = generate(capsys, ascii_model, "-p", "if ", "-n", "500", "-t", "1",
                               "--num-samples", "8")
    assert status == 0 and "\ufffd" not in text


def test_seen_only_draws_only_seen_tokens_of_a_token_model(tmp_path, capsys):
    tokens = np.array([3, 5, 7, 5, 3, 7, 9] * 300, "<u2")  # V = 300: only 3, 5, 7, 9 follow
    (tmp_path / "t.bin").write_bytes(tokens.tobytes())
    path = tmp_path / "tok.safetensors"
    assert main(["train", "--tokens", str(tmp_path / "t.bin"), "--vocab", "300", "--steps",
                 "3", "-c", str(path), "--backend", "cpu"]) == 0
    argv = ("--ids", "3", "-n", "300", "-t", "3", "-k", "300", "--json")
    _, out, _ = generate(capsys, path, *argv)  # token models: off by default
    assert set(json.loads(out)["ids"][1:]) - {3, 5, 7, 9}
    _, out, _ = generate(capsys, path, *argv, "--seen-only")
    assert set(json.loads(out)["ids"][1:]) <= {3, 5, 7, 9}


def test_a_checkpoint_that_cannot_tell_samples_everything_and_refuses_seen_only(
        tmp_path, ascii_model, capsys):
    old = tmp_path / "old.safetensors"
    replace(Checkpoint.load(ascii_model), successors=None).save(old)
    argv = ("-p", "q", "-n", "200", "-t", "1", "-k", "256")
    default = generate(capsys, old, *argv)
    assert default == generate(capsys, old, *argv, "--no-seen-only")
    assert default[1] != generate(capsys, ascii_model, *argv)[1]
    before = sorted(p.name for p in tmp_path.iterdir())
    status, out, err = generate(capsys, old, *argv, "--seen-only")
    assert status == 2 and out == ""
    assert err.startswith(f"bob: {old}: the checkpoint does not record which symbols its "
                          "training data has as a next symbol")
    assert "pass --no-seen-only" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# -- --num-samples -------------------------------------------------------------------------
def test_num_samples_prints_k_samples_between_dashes(ascii_model, capsys):
    status, out, _ = generate(capsys, ascii_model, "-p", "a", "-n", "60", "--seed", "4",
                              "--num-samples", "3")
    assert status == 0
    samples = out[:-1].split("\n---------------\n")
    assert len(samples) == 3 and len(set(samples)) == 3
    assert all(sample.startswith("a") and len(sample) == 61 for sample in samples)
    _, one, _ = generate(capsys, ascii_model, "-p", "a", "-n", "60", "--seed", "4")
    assert one == samples[0] + "\n"  # sample 0 is the single sample of that seed
    rows = Checkpoint.load(ascii_model).parameters
    seen = successors_of(ASCII_TEXT)
    for k, sample in enumerate(samples):
        want = expected_sample(rows, ord("a"), 60, 0.8, 4, 200, seen, first=60 * k)
        assert sample == "a" + bytes(want).decode()
    _, as_json, _ = generate(capsys, ascii_model, "-p", "a", "-n", "60", "--seed", "4",
                             "--num-samples", "3", "--json")
    assert ["a" + s["text"] for s in json.loads(as_json)["samples"]] == samples


def test_num_samples_refuses_raw_and_zero(ascii_model, capsys):
    status, out, err = generate(capsys, ascii_model, "-p", "a", "--num-samples", "2", "--raw")
    assert status == 2 and out == "" and "--raw writes one sample" in err
    status, out, err = generate(capsys, ascii_model, "-p", "a", "--num-samples", "0")
    assert status == 2 and out == "" and "--num-samples" in err


def test_the_host_api_refuses_zero_samples(ascii_model):
    with pytest.raises(BadInput, match="--num-samples must be at least 1, not 0"):
        inference.generate_samples(str(ascii_model), b"a", 5, samples=0)


# -- eval's unit ------------------------------------------------------------------------------
def test_eval_says_bits_per_byte_or_per_token(tmp_path, ascii_model, capsys):
    text = tmp_path / "ascii.txt"
    text.write_bytes(ASCII_TEXT[:2000])
    capsys.readouterr()
    assert main(["eval", "-c", str(ascii_model), "--text", str(text), "--backend", "cpu"]) == 0
    table = capsys.readouterr().out
    assert "bits / byte" in table and "bits / token" not in table
    tokens = np.array([1, 2, 3, 2, 1] * 100, "<u2")
    (tmp_path / "t.bin").write_bytes(tokens.tobytes())
    path = tmp_path / "tok.safetensors"
    assert main(["train", "--tokens", str(tmp_path / "t.bin"), "--vocab", "300", "--steps",
                 "2", "-c", str(path), "--backend", "cpu"]) == 0
    capsys.readouterr()
    argv = ["eval", "-c", str(path), "--tokens", str(tmp_path / "t.bin"), "--vocab", "300",
            "--backend", "cpu"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "bits / token" in table and "bits / byte" not in table
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["unit"] == "token" and "bits_per_byte" not in report
    assert report["bits_per_token"] == pytest.approx(report["nats_per_transition"] / np.log(2))
