"""Faults in arguments and data files: each one line on stderr starting "bob", its exit
status, and nothing written."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from bob.cli.main import main
from bob.plan.jsonio import MAX_LAUNCHES, MAX_REGIONS, MAX_SUBMISSIONS, MAX_TENSORS, dumps
from bob.program.bob import BobConfig, build_plan
from bob.records.countsfile import CountsFile
from conftest import contents


def refused(capsys, directory: Path, argv: list[str], status: int = 2) -> str:
    """Run `bob argv`; check the status, one line on stderr, nothing written; the line."""
    before = contents(directory)
    got = main(argv)
    err = capsys.readouterr().err
    assert got == status, err
    assert err.startswith("bob") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert contents(directory) == before
    return err.strip()


# -- usage errors: one line ----------------------------------------------------
@pytest.mark.parametrize(("argv", "line"), [
    (["train", "--backend", "cpu", "--lr", "-1", "-c", "{d}/m.st"],
     "bob train: Invalid value for '--lr': lr = -1.0 is negative (see bob train --help)"),
    (["train", "--backend", "cpu", "--text", "{d}", "-c", "{d}/m.st"],
     "bob train: Invalid value for '--text': File '{d}' is a directory. "
     "(see bob train --help)"),
    (["predict", "-c", "{d}"],
     "bob predict: Invalid value for '--checkpoint' / '-c': File '{d}' is a directory. "
     "(see bob predict --help)"),
    (["train", "--no-such-option"],
     "bob train: No such option '--no-such-option'. (see bob train --help)"),
    (["no-such-command"], "bob: No such command 'no-such-command'. (see bob --help)"),
    (["train", "--steps", "x"], "bob train: Invalid value for '--steps': 'x' is not a "
                                "valid integer range. (see bob train --help)"),
])
def test_a_usage_error_is_one_line(tmp_path, capsys, argv, line):
    err = refused(capsys, tmp_path, [w.format(d=tmp_path) for w in argv])
    assert err == line.format(d=tmp_path)


def test_help_keeps_click_usage_form(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: bob train [OPTIONS]")


# -- checkpoint integers: bounded ----------------------------------------------
def trained(directory: Path, name: str = "base.safetensors") -> Path:
    path = directory / name
    assert main(["train", "--backend", "cpu", "-N", "2", "--steps", "2", "-c", str(path)]) == 0
    return path


def with_metadata(source: Path, target: Path, **changes: str) -> Path:
    """A copy of the checkpoint `source` at `target`, these metadata fields changed."""
    with safe_open(str(source), framework="numpy") as file:
        metadata = dict(file.metadata())
    save_file(load_file(str(source)), str(target), metadata={**metadata, **changes})
    return target


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory) -> Path:
    return trained(tmp_path_factory.mktemp("base"))


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("step", "9223372036854775803", "9223372036854775803"),
    ("step", str(10**20), "100000000000000000000"),
    ("step", "9" * 400, "999999999999... (400 digits)"),
    ("step", str(2**53 + 1), "9007199254740993"),
    ("format_version", "9" * 5000, "999999999999... (5000 digits)"),
])
@pytest.mark.parametrize("command", ["resume", "predict"])
def test_a_huge_checkpoint_integer_is_refused_naming_field_and_bound(
        tmp_path, capsys, base_checkpoint, field, value, shown, command):
    path = with_metadata(base_checkpoint, tmp_path / "huge.safetensors", **{field: value})
    argv = (["train", "--backend", "cpu", "--resume", "-N", "2", "--steps", "2",
             "-c", str(path)] if command == "resume" else ["predict", "-c", str(path), "a"])
    err = refused(capsys, tmp_path, argv)
    assert err == (f"bob: {path}: metadata {field} {shown} is above 2**53 = {2**53}, "
                   "the largest Bob reads")


def test_resuming_past_the_largest_step_is_refused(tmp_path, capsys, base_checkpoint):
    path = with_metadata(base_checkpoint, tmp_path / "edge.safetensors", step=str(2**53 - 1))
    err = refused(capsys, tmp_path, ["train", "--backend", "cpu", "--resume", "-N", "2",
                                     "--steps", "2", "-c", str(path)])
    assert err == (f"bob: {path}: step {2**53 - 1} + 2 updates is above 2**53 = {2**53}, "
                   "the largest step a checkpoint holds")
    assert main(["predict", "-c", str(path), "a"]) == 0  # the bound itself is readable


def no_data_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting the training data from now on fails the test: a refusal came first."""
    from bob.host import training

    def counted(*args, **kwargs):
        raise AssertionError("the data was counted before the refusal")
    monkeypatch.setattr(training, "training_data", counted)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])  # cuda: no time estimate refuses it
def test_fresh_steps_above_the_largest_step_are_refused_before_work(tmp_path, capsys,
                                                                    monkeypatch, backend):
    no_data_counted(monkeypatch)
    err = refused(capsys, tmp_path, ["train", "--backend", backend, "--steps",
                                     str(2**53 + 1), "-c", str(tmp_path / "m.st")])
    assert err == (f"bob: --steps {2**53 + 1} is above 2**53 = {2**53}, the largest step "
                   "a checkpoint holds")


def test_resume_past_the_largest_step_is_refused_before_the_data_is_counted(
        tmp_path, capsys, monkeypatch, base_checkpoint):
    path = with_metadata(base_checkpoint, tmp_path / "edge.safetensors", step=str(2**53 - 3))
    no_data_counted(monkeypatch)
    err = refused(capsys, tmp_path, ["train", "--backend", "cpu", "--resume", "--steps", "5",
                                     "-c", str(path)])
    assert err == (f"bob: {path}: step {2**53 - 3} + 5 updates is above 2**53 = {2**53}, "
                   "the largest step a checkpoint holds")


# -- plan reader: counts bounded, duplicates found in linear time ---------------
def plan_with_tensors(directory: Path, count: int, duplicate: bool = False) -> Path:
    data = json.loads(dumps(build_plan(BobConfig(prompts=1, updates=1))))
    first = data["tensors"][0]
    tensors = [{**first, "name": f"t{i}"} for i in range(count)]
    if duplicate:
        tensors[-1] = {**first, "name": "t0"}
    data["tensors"] = tensors
    path = directory / "plan.json"
    path.write_text(json.dumps(data))
    return path


def test_a_plan_with_100000_tensors_is_refused_by_the_bound(tmp_path, capsys):
    path = plan_with_tensors(tmp_path, 100_000)
    err = refused(capsys, tmp_path, ["certify", "--plan", str(path)])
    assert err == f"bob: {path}: tensors: 100000 items, at most {MAX_TENSORS}"


def test_a_duplicate_among_the_most_tensors_a_plan_holds_is_named(tmp_path, capsys):
    path = plan_with_tensors(tmp_path, MAX_TENSORS, duplicate=True)
    err = refused(capsys, tmp_path, ["certify", "--plan", str(path)])
    assert err == (f"bob: {path}: tensors[{MAX_TENSORS - 1}].name: tensor 't0' is "
                   "declared twice")


@pytest.mark.parametrize(("field", "bound"), [
    ("regions", MAX_REGIONS), ("placed_regions", MAX_REGIONS),
    ("launches", MAX_LAUNCHES), ("submissions", MAX_SUBMISSIONS)])
def test_every_plan_list_is_bounded_before_it_is_read(tmp_path, capsys, field, bound):
    data = json.loads(dumps(build_plan(BobConfig(prompts=1, updates=1))))
    data[field] = [0] * (bound + 1)  # not even entries: the count is refused first
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    err = refused(capsys, tmp_path, ["certify", "--plan", str(path)])
    assert err == f"bob: {path}: {field}: {bound + 1} items, at most {bound}"


# -- counts files: nothing trusted ------------------------------------------------
@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> tuple[Path, Path]:
    """A counts file of a small text, and a checkpoint trained on that text."""
    directory = tmp_path_factory.mktemp("counted")
    text = directory / "a.txt"
    text.write_bytes(b"the cat sat on the mat; the rat ate the hat. " * 20)
    counts = directory / "a.counts"
    assert main(["count", str(text), "-o", str(counts)]) == 0
    checkpoint = directory / "a.safetensors"
    assert main(["train", "--backend", "cpu", "-N", "2", "--steps", "2", "--text", str(text),
                 "-c", str(checkpoint)]) == 0
    return counts, checkpoint


def counts_commands(counts: Path, checkpoint: Path, directory: Path) -> list[list[str]]:
    return [["train", "--backend", "cpu", "--steps", "1", "--counts", str(counts),
             "-c", str(directory / "new.safetensors")],
            ["eval", "--backend", "cpu", "-c", str(checkpoint), "--counts", str(counts)]]


@pytest.mark.parametrize("sources", [
    "[" * 50_000 + "]" * 50_000,
    "[[" * 50_000 + "]]" * 50_000,
    '[["a.txt", 900, 1]]',
    '["ab"]',
    '[["a.txt", true]]',
    '[["a.txt", -1]]',
    '{"a.txt": 900}',
])
@pytest.mark.parametrize("command", [0, 1], ids=["train", "eval"])
def test_a_malformed_sources_field_is_refused(tmp_path, capsys, counted, sources, command):
    counts, checkpoint = counted
    bad = with_metadata(counts, tmp_path / "bad.counts", sources=sources)
    argv = counts_commands(bad, checkpoint, tmp_path)[command]
    err = refused(capsys, tmp_path, argv)
    assert err == f"bob: {bad}: metadata sources is not a JSON list of [name, bytes]"


def test_a_counts_file_optimum_is_computed_not_trusted(tmp_path, capsys, counted):
    counts, checkpoint = counted
    stored = CountsFile.load(counts).optimum
    bad = with_metadata(counts, tmp_path / "bad.counts", optimum="1.0")
    for argv in counts_commands(bad, checkpoint, tmp_path):
        err = refused(capsys, tmp_path, argv)
        assert err == (f"bob: {bad}: metadata optimum 1.0 is not the {stored!r} nats of "
                       "the stored counts")


@pytest.mark.parametrize("digest", ["v2:" + "0" * 64, "0" * 64])
def test_a_counts_file_digest_is_checked_against_its_counts(tmp_path, capsys, counted, digest):
    counts, checkpoint = counted
    bad = with_metadata(counts, tmp_path / "bad.counts", digest=digest)
    for argv in counts_commands(bad, checkpoint, tmp_path):
        err = refused(capsys, tmp_path, argv)
        assert err == (f"bob: {bad}: metadata digest {digest[:15]}... is not the digest "
                       "of the stored counts (the file was altered or damaged)")


def test_a_sound_counts_file_still_trains_and_evaluates(tmp_path, capsys, counted):
    counts, checkpoint = counted
    for argv in counts_commands(counts, checkpoint, tmp_path):
        assert main(argv) == 0, capsys.readouterr().err


# -- plot: the counts must be the checkpoint's kind ---------------------------------
def test_plot_refuses_counts_of_another_vocabulary_as_eval_does(tmp_path, capsys, counted):
    counts, _ = counted
    tokens = tmp_path / "t.bin"
    np.random.default_rng(0).integers(0, 512, 2000).astype("<u2").tofile(tokens)
    checkpoint = tmp_path / "v512.safetensors"
    assert main(["train", "--backend", "cpu", "--tokens", str(tokens), "--vocab", "512",
                 "-N", "2", "--steps", "2", "-c", str(checkpoint)]) == 0
    capsys.readouterr()
    err = refused(capsys, tmp_path, ["plot", "-c", str(checkpoint), "--counts", str(counts),
                                     "--out", str(tmp_path / "plots")])
    assert err == f"bob: {counts}: counts of V=256, the checkpoint has V=512"
    err = refused(capsys, tmp_path, ["eval", "--backend", "cpu", "-c", str(checkpoint),
                                     "--counts", str(counts)])
    assert err == f"bob: {counts}: V=256, the checkpoint V=512"  # the file given, not its source
    assert not (tmp_path / "plots").exists()


def test_plot_refuses_counts_of_other_data_of_the_same_vocabulary(tmp_path, capsys, counted):
    counts, checkpoint = counted
    other = tmp_path / "b.txt"
    other.write_bytes(b"zyxwvu tsrq " * 300)
    other_counts = tmp_path / "b.counts"
    assert main(["count", str(other), "-o", str(other_counts)]) == 0
    capsys.readouterr()
    theirs = CountsFile.load(other_counts).digest.rsplit(":", 1)[-1][:12]
    ours = CountsFile.load(counts).digest.rsplit(":", 1)[-1][:12]
    err = refused(capsys, tmp_path, ["plot", "-c", str(checkpoint), "--counts",
                                     str(other_counts), "--out", str(tmp_path / "plots")])
    assert err == (f"bob: {other_counts}: counts of data {theirs}, the checkpoint trained on "
                   f"data {ours}; give the counts of its training data")
    assert not (tmp_path / "plots").exists()
    pytest.importorskip("matplotlib")
    assert main(["plot", "-c", str(checkpoint), "--counts", str(counts), "--out",
                 str(tmp_path / "plots")]) == 0  # its own counts are drawn
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "loss.png", "transitions.png"]


# -- Dask: a lost scheduler named ----------------------------------------------
def test_losing_the_dask_scheduler_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    distributed = pytest.importorskip("distributed")
    from bob.records import dask_count

    text = tmp_path / "a.txt"
    text.write_bytes(b"abcdef" * 10)
    clusters = []

    class Recorded(distributed.LocalCluster):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            clusters.append(self)

    def slow(*args):
        # The first task closes the scheduler under the count, then takes its time.
        cluster = clusters[0]
        threading.Thread(target=lambda: cluster.sync(cluster.scheduler.close)).start()
        time.sleep(3)

    monkeypatch.setattr(distributed, "LocalCluster", Recorded)
    monkeypatch.setattr(dask_count, "count_piece", slow)
    err = refused(capsys, tmp_path, ["count", str(text), "--dask", "--dask-workers", "1",
                                     "-o", str(tmp_path / "a.counts")], status=1)
    assert re.fullmatch(rf"bob: {re.escape(str(text))} bytes 0-60: lost the Dask scheduler "
                        r"\(\S+\); the count stopped", err), err
