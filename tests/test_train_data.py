"""The data a run trains on, as a user gives it: `--resume` with no data reads the data
the checkpoint recorded (refused in one line when it is gone or changed), and
`--val-fraction F` holds the last F of the data out as validation, as nanoGPT's prepare
scripts split 90/10. Each runs the command as a user would and checks what it prints."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from bob.cli.main import main
from bob.host import api
from bob.records.checkpoint import Checkpoint
from bob.records.data_sources import DataSources
from conftest import contents

NAMES = b"".join(name + b"\n" for name in (
    b"emma", b"olivia", b"ava", b"isabella", b"sophia", b"mia", b"charlotte", b"amelia",
    b"harper", b"evelyn", b"abigail", b"emily", b"ella", b"elizabeth", b"camila")) * 3


def train(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["train", "--backend", "cpu", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def table_row(text: str, name: str) -> str:
    """A row of the run's table (the value, its wrapped lines joined)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"│ {name} "):
            value = [line.split("│")[2].strip()]
            for more in lines[i + 1:]:
                cells = more.split("│")
                if len(cells) < 3 or cells[1].strip():
                    break
                value.append(cells[2].strip())
            return " ".join(value)
    raise AssertionError(f"no row {name!r} in {text}")


def refused(capsys, tmp_path: Path, *argv: str) -> str:
    """The one-line refusal of `bob train ARGV`: exit 2, nothing written or changed."""
    before = contents(tmp_path)
    status, out, err = train(capsys, *argv)
    assert status == 2, err
    assert out == "" and err.startswith("bob: ") and err.count("\n") == 1, err
    assert contents(tmp_path) == before
    return err[len("bob: "):-1]


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Short relative names, so the run's table shows them whole."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def names() -> Path:
    path = Path("names.txt")
    path.write_bytes(NAMES)
    return path


# -- --resume remembers the data -------------------------------------------------------
def test_resume_without_data_trains_on_the_checkpoints_data_and_says_so(tmp_path, names,
                                                                        capsys):
    path, named = Path("names.safetensors"), Path("named.safetensors")
    for checkpoint in (path, named):
        assert train(capsys, "--text", str(names), "--steps", "20", "-N", "10", "-c",
                     str(checkpoint))[0] == 0
    status, out, err = train(capsys, "--resume", "--steps", "20", "-N", "10", "-c", str(path),
                             "--json")
    assert status == 0, err
    assert table_row(out + err, "data") == f"{names} (the checkpoint's data, unchanged)"
    assert json.loads(out)["data"] == f"{names} (the checkpoint's data, unchanged)"
    # The same bytes as a resume that names the data.
    assert train(capsys, "--resume", "--text", str(names), "--steps", "20", "-N", "10", "-c",
                 str(named))[0] == 0
    assert Checkpoint.load(path) == Checkpoint.load(named)
    state = Checkpoint.load(path).state
    assert state.step == 40 and len(state.segments) == 1
    assert state.sources == DataSources("text", (str(names),), first_symbol=ord("e"))


def test_the_api_resumes_on_the_recorded_data_too(tmp_path, names):
    path = str(Path("names.safetensors"))
    api.train([str(names)], steps=5, checkpoint=path, backend="cpu")
    report = api.train(steps=5, checkpoint=path, backend="cpu", resume=True)
    assert report.data == f"{names} (the checkpoint's data, unchanged)"
    assert report.global_step == 10


def test_token_files_and_counts_files_are_read_again(tmp_path, capsys):
    tokens = Path("train.bin")
    np.frombuffer(NAMES, np.uint8).astype("<u2").tofile(tokens)
    counts = Path("names.counts")
    assert main(["count", "--tokens", str(tokens), "--vocab", "300", "-o", str(counts)]) == 0
    for given in (["--tokens", str(tokens), "--vocab", "300"], ["--counts", str(counts)]):
        path = Path("model.safetensors")
        assert train(capsys, *given, "--steps", "5", "--overwrite", "-c", str(path))[0] == 0
        status, out, err = train(capsys, "--resume", "--steps", "5", "-c", str(path))
        assert status == 0, err
        assert "(the checkpoint's data, unchanged)" in table_row(out + err, "data")
        recorded = Checkpoint.load(path).state.sources
        assert recorded.kind == ("tokens" if "--tokens" in given else "counts")
    assert Checkpoint.load(path).state.step == 10


def test_a_checkpoint_that_records_no_sources_resumes_on_the_built_in_corpus(tmp_path, capsys):
    path = Path("bob.safetensors")
    assert train(capsys, "--steps", "5", "-c", str(path))[0] == 0
    stored = Checkpoint.load(path)
    older = stored.with_segments(tuple(s.__class__(s.first_step, s.data_digest, s.hyper)
                                       for s in stored.segments))
    older.save(path)  # as Bob wrote it before it recorded the sources
    status, out, err = train(capsys, "--resume", "--steps", "5", "-c", str(path))
    assert status == 0
    assert table_row(out + err, "data") == "the built-in corpus (CPython's pydoc topics)"


def test_changed_data_is_refused_in_one_line(tmp_path, names, capsys):
    path = Path("names.safetensors")
    assert train(capsys, "--text", str(names), "--steps", "5", "-c", str(path))[0] == 0
    names.write_bytes(NAMES + b"zoe\n")
    message = refused(capsys, tmp_path, "--resume", "--steps", "5", "-c", str(path))
    assert message.startswith(f"{path}: trained on {names}, which has changed since (data ")
    assert message.endswith(" now); name the data to train on (--text, --tokens, --counts or "
                            "--input), with --new-data for other data")


def test_gone_data_is_refused_in_one_line(tmp_path, names, capsys):
    path = Path("names.safetensors")
    assert train(capsys, "--text", str(names), "--steps", "5", "-c", str(path))[0] == 0
    names.unlink()
    assert refused(capsys, tmp_path, "--resume", "--steps", "5", "-c", str(path)) == (
        f"{path}: trained on {names}, and {names} is gone; name the data to train on "
        "(--text, --tokens, --counts or --input)")


def test_data_from_stdin_cannot_be_read_again(tmp_path, capsys, monkeypatch):
    path = Path("stdin.safetensors")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(NAMES)))
    assert train(capsys, "--text", "-", "--steps", "5", "-c", str(path))[0] == 0
    assert refused(capsys, tmp_path, "--resume", "--steps", "5", "-c", str(path)) == (
        f"{path}: trained on stdin, which cannot be read again; name the data to train on "
        "(--text, --tokens, --counts or --input)")


def test_new_data_without_data_is_refused(tmp_path, names, capsys):
    path = Path("names.safetensors")
    assert train(capsys, "--text", str(names), "--steps", "5", "-c", str(path))[0] == 0
    assert refused(capsys, tmp_path, "--resume", "--new-data", "--steps", "5", "-c",
                   str(path)) == ("--new-data continues the checkpoint on other data: name it "
                                  "(--text, --tokens, --counts or --input)")


def test_the_same_data_from_another_place_is_recorded_where_it_was_read_last(tmp_path, names,
                                                                             capsys):
    path = Path("names.safetensors")
    assert train(capsys, "--text", str(names), "--steps", "5", "-c", str(path))[0] == 0
    moved = Path("moved.txt")
    names.rename(moved)
    assert train(capsys, "--resume", "--text", str(moved), "--steps", "5", "-c",
                 str(path))[0] == 0
    state = Checkpoint.load(path).state
    assert len(state.segments) == 1 and state.sources.paths == (str(moved),)
    assert train(capsys, "--resume", "--steps", "5", "-c", str(path))[0] == 0


@pytest.mark.parametrize("sources,problem", [
    ({"kind": "tape", "paths": ["a"]}, "sources kind 'tape' is not one of builtin, text, "
                                       "tokens, counts, input"),
    ({"kind": "text"}, "sources of kind 'text' name 0 paths"),
    ({"kind": "text", "paths": ["a"], "val_fraction": 2}, "sources val_fraction 2 is not in "
                                                          "(0, 1)"),
    ({"kind": "tokens", "paths": ["a"]}, "sources vocab None does not fit kind 'tokens'"),
    ({"kind": "text", "paths": ["a"], "colour": 1}, "sources {'kind': 'text', 'paths': "
     "['a'], 'colour': 1} is not an object of"),
])
def test_a_bad_sources_record_is_refused_naming_it(tmp_path, names, capsys, sources, problem):
    from safetensors.numpy import load_file, save_file

    path = Path("names.safetensors")
    assert train(capsys, "--text", str(names), "--steps", "5", "-c", str(path))[0] == 0
    state = Checkpoint.load(path).state
    metadata = state.metadata()
    segments = json.loads(metadata["segments"])
    segments[0]["sources"] = sources
    metadata["segments"] = json.dumps(segments)
    save_file(load_file(path), path, metadata=metadata)
    message = refused(capsys, tmp_path, "--resume", "--steps", "5", "-c", str(path))
    assert message.startswith(f"{path}: metadata segment at step 0: {problem}"), message


# -- --val-fraction: the last F validates ------------------------------------------------
def split_bytes(data: bytes, fraction: float) -> tuple[bytes, bytes]:
    cut = int(len(data) * (1 - fraction))
    return data[:cut], data[cut:]


def test_val_fraction_equals_training_on_the_first_part_validating_on_the_rest(
        tmp_path, names, capsys):
    head, tail = split_bytes(NAMES, 0.1)
    Path("head.txt").write_bytes(head)
    Path("tail.txt").write_bytes(tail)
    split, apart = Path("split.safetensors"), Path("apart.safetensors")
    status, out, err = train(capsys, "--text", str(names), "--val-fraction", "0.1", "--steps",
                             "30", "-N", "10", "-c", str(split), "--json")
    assert status == 0, err
    assert table_row(out + err, "data") == f"{names} (the first 90%; the last 10% validates)"
    assert "validation loss (nats)" in err and json.loads(out)["val_loss"] > 0
    assert train(capsys, "--text", "head.txt", "--val-text",
                 "tail.txt", "--steps", "30", "-N", "10", "-c",
                 str(apart))[0] == 0
    one, two = Checkpoint.load(split), Checkpoint.load(apart)
    assert one.data_digest == two.data_digest and one.val_history == two.val_history
    assert one.parameters.tobytes() == two.parameters.tobytes()
    assert one.state.sources.val_fraction == 0.1


def test_val_fraction_cuts_token_files_across_files(tmp_path, capsys):
    symbols = np.frombuffer(NAMES, np.uint8).astype("<u2")
    first, second = symbols[:150], symbols[150:]
    first.tofile("a.bin")
    second.tofile("b.bin")
    total = symbols.size
    cut = int(total * (1 - 0.25))
    assert cut > first.size  # the cut falls in the second file
    second[:cut - first.size].tofile("b-head.bin")
    second[cut - first.size:].tofile("b-tail.bin")
    common = ("--vocab", "300", "--steps", "10", "-N", "10")
    split, apart = Path("split.safetensors"), Path("apart.safetensors")
    assert train(capsys, "--tokens", "a.bin", "--tokens",
                 "b.bin", "--val-fraction", "0.25", *common, "-c",
                 str(split))[0] == 0
    assert train(capsys, "--tokens", "a.bin", "--tokens",
                 "b-head.bin", "--val-tokens", "b-tail.bin",
                 *common, "-c", str(apart))[0] == 0
    one, two = Checkpoint.load(split), Checkpoint.load(apart)
    assert one.data_digest == two.data_digest and one.val_history == two.val_history
    assert one == Checkpoint.load(split) and one.parameters.tobytes() == \
        two.parameters.tobytes()


def test_val_fraction_on_the_built_in_corpus(tmp_path, capsys):
    status, out, err = train(capsys, "--val-fraction", "0.1", "--steps", "5", "-c",
                           "bob.safetensors")
    assert status == 0
    assert table_row(out + err, "data") == (
        "the built-in corpus (CPython's pydoc topics) (the first 90%; the last 10% validates)")
    assert "validation loss (nats)" in out


def test_a_resumed_split_run_splits_the_same_way(tmp_path, names, capsys):
    path = Path("names.safetensors")
    assert train(capsys, "--text", str(names), "--val-fraction", "0.2", "--steps", "5", "-c",
                 str(path))[0] == 0
    status, out, err = train(capsys, "--resume", "--steps", "5", "--keep-best", "-c", str(path))
    assert status == 0, err
    assert table_row(out + err, "data") == (f"{names} (the first 80%; the last 20% validates; the "
                                      "checkpoint's data, unchanged)")
    assert "best checkpoint" in out
    assert refused(capsys, tmp_path, "--resume", "--val-fraction", "0.1", "--steps", "5",
                   "-c", str(path)) == (
        f"{path}: trained on {names} and held out its last 0.2; --val-fraction 0.1 trains on "
        "other data: name the data to train on (--text, --tokens, --counts or --input), with "
        "--new-data")


def test_keep_best_takes_the_held_out_part_as_validation(tmp_path, names, capsys):
    status, out, _ = train(capsys, "--text", str(names), "--val-fraction", "0.1", "--steps",
                           "10", "--keep-best", "-c", "n.safetensors",
                           "--json")
    assert status == 0 and json.loads(out)["best_checkpoint"]


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.1", "nan", "inf"])
def test_a_bad_val_fraction_is_refused(tmp_path, names, capsys, value):
    assert refused(capsys, tmp_path, "--text", str(names), "--val-fraction", value, "-c",
                   "n.safetensors") == (
        f"--val-fraction {float(value)!r} is not a fraction in (0, 1): the last F of the data "
        "validates, the rest trains")


def test_val_fraction_refusals(tmp_path, names, capsys):
    counts = Path("names.counts")
    assert main(["count", str(names), "-o", str(counts)]) == 0
    capsys.readouterr()
    out = "n.safetensors"
    assert refused(capsys, tmp_path, "--counts", str(counts), "--val-fraction", "0.1", "-c",
                   out) == (
        f"--val-fraction holds out the end of a text or token sequence; a counts file "
        f"({counts}) keeps no order to cut: give the texts or token files, or validation data "
        "(--val-text, --val-tokens, --val-counts)")
    assert refused(capsys, tmp_path, "--text", str(names), "--val-fraction", "0.1",
                   "--val-text", str(names), "-c", out) == (
        "--val-fraction holds the end of the training data out as validation; --val-text, "
        "--val-tokens and --val-counts name other data: choose one")
    tiny = Path("tiny.txt")
    tiny.write_bytes(b"abc")
    assert refused(capsys, tmp_path, "--text", str(tiny), "--val-fraction", "0.1", "-c",
                   out) == (
        f"{tiny}: --val-fraction 0.1 leaves 2 bytes to train on and 1 to validate: each "
        "needs a pair")
    assert refused(capsys, tmp_path, "--text", str(names), "--val-fraction", "0.1",
                   "--shards", "2", "-c", out) == (
        "row shards (--shards, --workers, --gpus, --device-memory, --dask) do not take "
        "validation data")


def test_val_fraction_refuses_stdin(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(NAMES)))
    assert refused(capsys, tmp_path, "--text", "-", "--val-fraction", "0.1", "-c",
                   "n.safetensors") == (
        "-: --val-fraction cuts the data where its last part begins, and a stream's length "
        "is known only at its end; give a file")
