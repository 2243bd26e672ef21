"""Hostile data nobody here wrote, each case as a user meets it on the command line: a
meta.pkl of mixed key types or with a persistent id, an index whose weight map holds
lists, empty successors, empty paths, an output that is also an input under another
name, temperatures near zero, a write that fails for want of room, an old index that
names other files, headers NumPy answers in three lines, and memory that runs out. Each
ends in one line with its exit status (2 bad input, 1 a failure at run time), and no
file is written, damaged or removed unless the command is meant to write it."""

from __future__ import annotations

import errno
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from bob.cli.main import main
from bob.cli.shortage import memory_shortage
from bob.records.checkpoint import Checkpoint
from bob.records.shards import open_checkpoint
from conftest import contents, train_cpu

TEXT = b"the cat sat on the mat; the rat ate the hat. " * 20
SRC = Path(__file__).resolve().parents[1] / "src"


def refused(capsys, directory: Path, argv: list[str], status: int = 2) -> str:
    """Run `bob argv` here; check the status, one line on stderr starting "bob", nothing
    written, changed or removed under `directory`; the line."""
    before = contents(directory)
    names = sorted(os.listdir(directory))
    capsys.readouterr()
    got = main(argv)
    err = capsys.readouterr().err
    assert got == status, err
    assert err.startswith("bob") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert contents(directory) == before and sorted(os.listdir(directory)) == names
    return err.strip()


def bob_process(cwd: Path, argv: list[str], limits: dict[int, int] | None = None,
                ) -> subprocess.CompletedProcess[str]:
    """`python -m bob argv` in its own process (with these resource limits): what a user
    runs, warnings and limits included."""
    def limit() -> None:
        for kind, value in (limits or {}).items():
            resource.setrlimit(kind, (value, value))

    env = {**os.environ, "PYTHONPATH": str(SRC), "OPENBLAS_NUM_THREADS": "1",
           "BOB_REPORT_DIR": str(cwd / "reports")}
    return subprocess.run([sys.executable, "-m", "bob", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False,
                          preexec_fn=limit if limits else None)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A small byte model of TEXT (its checkpoint records the text's successors)."""
    directory = tmp_path_factory.mktemp("trained")
    (directory / "a.txt").write_bytes(TEXT)
    path = directory / "m.safetensors"
    assert train_cpu("--text", str(directory / "a.txt"), "--steps", "10",
                     "-c", str(path)) == 0
    return path


@pytest.fixture
def work(tmp_path: Path, trained: Path) -> Path:
    """A directory of this test's own holding the text and a copy of the model."""
    (tmp_path / "a.txt").write_bytes(TEXT)
    shutil.copy(trained, tmp_path / "m.safetensors")
    return tmp_path


def with_metadata(source: Path, target: Path, **changes: str) -> Path:
    with safe_open(str(source), framework="numpy") as file:
        metadata = dict(file.metadata())
    save_file(load_file(str(source)), str(target), metadata={**metadata, **changes})
    return target


# -- a meta.pkl of mixed key types, or with a persistent id ---------------------------
def write_meta(path: Path, itos: dict, stoi: dict, vocab: int = 3) -> Path:
    with open(path, "wb") as file:
        pickle.dump({"vocab_size": vocab, "itos": itos, "stoi": stoi}, file)
    return path


@pytest.mark.parametrize(("itos", "stoi", "message"), [
    ({0: "a", "b": 1, 2: "c"}, {"a": 0, "b": 1, "c": 2},
     "itos is not a string for each id 0..2"),
    ({"0": "a", "1": "b", "2": "c"}, {"a": 0, "b": 1, "c": 2},
     "itos is not a string for each id 0..2"),
    ({0: "a", 1: "b", 2: "c"}, {"a": 0, "b": {"x": 1}, "c": 2},
     "stoi is not the inverse of itos"),
    ({0: "a", 1: "b", 2: "c"}, {"a": 0, 1: "b", "c": 2}, "stoi is not the inverse of itos"),
])
def test_a_meta_pkl_of_mixed_key_types_is_refused_in_one_line(work, capsys, itos, stoi,
                                                              message):
    meta = write_meta(work / "meta.pkl", itos, stoi)
    for argv in (["count", "--tokens", "t.bin", "--tokenizer", str(meta), "-o",
                  str(work / "c.counts")],
                 ["predict", "-c", str(work / "m.safetensors"), "--tokenizer", str(meta),
                  "--ids", "1"]):
        err = refused(capsys, work, argv)
        assert err == f"bob: {meta}: {message}"


def test_a_meta_pkl_with_a_persistent_id_is_refused_in_one_line(work, capsys):
    class Outside(pickle.Pickler):
        def persistent_id(self, obj: object) -> str | None:
            return "kept elsewhere" if obj == "b" else None

    with open(work / "meta.pkl", "wb") as file:
        Outside(file, protocol=2).dump({"vocab_size": 3, "itos": {0: "a", 1: "b", 2: "c"},
                                        "stoi": {"a": 0, "b": 1, "c": 2}})
    err = refused(capsys, work, ["predict", "-c", str(work / "m.safetensors"), "--tokenizer",
                                 str(work / "meta.pkl"), "--ids", "1"])
    assert err == (f"bob: {work / 'meta.pkl'}: refused as a meta.pkl: it refers to an object "
                   "outside the file (a persistent id), and a meta.pkl holds only dicts, ints "
                   "and strings")


# -- .npy headers NumPy answers in several lines, or not at all ------------------------
def write_npy(path: Path, shape: str, descr: str = "'<u2'") -> Path:
    header = f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (-(len(header) + 11) % 64) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little")
                     + header.encode() + bytes(4))
    return path


@pytest.mark.parametrize(("shape", "reason"), [
    ("(" + "1," * 6000 + ")", ": not a readable .npy file (Header info length (12086) is "
                              "large and may not be safe to load securely. To allow loading"),
    ("(" * 300 + "1," + ")," * 299 + ")", ": not a readable .npy file (Cannot parse header:"),
    ("((1,)", ": not a readable .npy file (('EOF in multi-line statement'"),
    (f"({10**30},)", " bytes, its .npy header says 2000000000000000000000000000"),
    ("(-5,)", ": .npy shape (-5,) has a negative length"),
])
def test_a_hostile_npy_header_is_one_line(work, capsys, shape, reason):
    """NumPy's own text runs to three lines (a header past its 10,000 bytes) or quotes the
    whole header; a length past int64 overflowed NumPy's product."""
    path = write_npy(work / "t.npy", shape)
    err = refused(capsys, work, ["count", "--tokens", str(path), "--vocab", "300",
                                 "-o", str(work / "c.counts")])
    assert err.startswith(f"bob: {path}") and reason in err, err
    assert len(err) < 400  # the reason is cut short, not the whole header again


# -- a sharded index whose weight map holds lists and objects --------------------------
@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """A checkpoint of TEXT in two row shards: its index, beside its shard files."""
    directory = tmp_path_factory.mktemp("sharded")
    (directory / "a.txt").write_bytes(TEXT)
    assert train_cpu("--text", str(directory / "a.txt"), "--steps", "5", "--shards", "2",
                     "-c", str(directory / "ck.safetensors")) == 0
    return directory / "ck.safetensors.index.json"


def copied(index: Path, directory: Path) -> Path:
    """The sharded checkpoint copied into `directory`: its index there."""
    for entry in json.loads(index.read_text())["metadata"]["shards"]:
        shutil.copy(index.parent / entry["file"], directory / entry["file"])
    return Path(shutil.copy(index, directory / index.name))


@pytest.mark.parametrize("value", [["ck.step5-00001-of-00002.safetensors"],
                                   {"file": "ck.step5-00001-of-00002.safetensors"}, 7, None])
def test_a_weight_map_value_that_is_no_string_is_refused_in_one_line(work, capsys, sharded,
                                                                     value):
    index = copied(sharded, work)
    document = json.loads(index.read_text())
    document["weight_map"]["parameters[0:128]"] = value
    index.write_text(json.dumps(document))
    err = refused(capsys, work, ["predict", "-c", str(index), "a"])
    assert err == (f"bob: {index}: weight_map disagrees with the shards' rows at "
                   f"'parameters[0:128]' -> {value!r} (the shards' rows put it in "
                   "'ck.step5-00001-of-00002.safetensors')")


# -- successors "[]" -------------------------------------------------------------------
def test_empty_successors_are_refused_before_generation(work, capsys):
    path = with_metadata(work / "m.safetensors", work / "h.safetensors", successors="[]")
    for argv in (["generate", "-c", str(path), "-p", "a"],
                 ["generate", "-c", str(path), "-p", "a", "--no-seen-only", "-t", "0"],
                 ["predict", "-c", str(path), "a"]):
        err = refused(capsys, work, argv)
        assert err == (f"bob: {path}: metadata successors is empty (training data has at "
                       "least one next symbol)")


# -- empty paths -----------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "what"), [
    (["train", "--backend", "cpu", "--text", "", "-c", "n.st"], "corpus file"),
    (["count", ""], "corpus file"),
    (["count", "", "-o", "c.counts"], "corpus file"),
    (["eval", "--backend", "cpu", "-c", "m.safetensors", "--text", ""], "corpus file"),
    (["count", "--tokens", "", "--vocab", "300"], "token file"),
    (["train", "--backend", "cpu", "--counts", "", "-c", "n.st"], "counts file"),
    (["eval", "--backend", "cpu", "-c", "m.safetensors", "--counts", ""], "counts file"),
    (["train", "--backend", "cpu", "--text", "a.txt", "--val-text", "", "-c", "n.st"],
     "corpus file"),
    (["train", "--backend", "cpu", "--input", "", "-c", "n.st"], "input record file"),
    (["predict", "-c", "", "a"], "checkpoint file"),
    (["export", "-c", "m.safetensors", "-o", ""], "parameters file"),
    (["count", "a.txt", "-o", ""], "counts file"),
    (["train", "--backend", "cpu", "--text", "a.txt", "-c", ""], "checkpoint file"),
    (["predict", "-c", "m.safetensors", "--tokenizer", "", "--ids", "1"], "tokenizer file"),
    (["certify", "--plan", ""], "plan file"),
])
def test_an_empty_path_names_no_file(work, capsys, monkeypatch, argv, what):
    """"" is no file to the system, but pathlib's Path("") is the current directory: a
    directory input would read all of it (the checkpoint, token files), an output would
    land in it. Refused, run from a directory holding a checkpoint and a .npy."""
    monkeypatch.chdir(work)
    np.save(work / "t.npy", np.arange(10, dtype="<u2"))
    err = refused(capsys, work, argv)
    assert err == f"bob: '': an empty path names no {what}"


def test_an_empty_plot_directory_is_refused(work, capsys, monkeypatch):
    monkeypatch.chdir(work)
    err = refused(capsys, work, ["plot", "-c", "m.safetensors", "--out", ""])
    assert err == "bob: '': an empty path names no directory for the plots"


# -- count --json: JSON alone on stdout ------------------------------------------------
@pytest.mark.parametrize("dask", [False, True])
def test_count_json_prints_only_json_on_stdout(work, capsys, dask):
    if dask:
        pytest.importorskip("distributed")
    capsys.readouterr()
    argv = ["count", str(work / "a.txt"), "-o", str(work / "c.counts"), "--json"]
    assert main(argv + (["--dask", "--dask-workers", "1"] if dask else [])) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # the whole of stdout, nothing before it
    assert report["counts"] == str(work / "c.counts") and report["transitions"] == 899
    assert "bob count" in captured.err  # the table went to stderr


# -- an output that is also an input, through any alias ---------------------------------
def alias(work: Path, how: str, target: str, name: str) -> str:
    """`name` in `work` made another name of `target`: the same path, a symbolic link, a
    hard link, or the path through a link to the directory."""
    if how == "same":
        return str(work / target)
    if how == "symlink":
        os.symlink(target, work / name)
    elif how == "hard link":
        os.link(work / target, work / name)
    else:  # through a directory link
        os.symlink(".", work / "here")
        return str(work / "here" / target)
    return str(work / name)


@pytest.mark.parametrize("how", ["same", "symlink", "hard link", "directory link"])
def test_export_over_its_own_checkpoint_is_refused(work, capsys, how):
    out = alias(work, how, "m.safetensors", "e.safetensors")
    err = refused(capsys, work, ["export", "-c", str(work / "m.safetensors"), "-o", out,
                                 "--overwrite"])
    other = "" if how == "same" else f" {work / 'm.safetensors'}"
    assert err == f"bob: {out}: the checkpoint{other} and the parameters file would be one file"


def test_export_over_a_shard_of_its_checkpoint_is_refused(work, capsys, sharded):
    index = copied(sharded, work)
    shard = work / "ck.step5-00002-of-00002.safetensors"
    err = refused(capsys, work, ["export", "-c", str(index), "-o", str(shard), "--overwrite"])
    assert err == (f"bob: {shard}: the checkpoint shard and the parameters file would be "
                   "one file")


@pytest.mark.parametrize("how", ["same", "symlink", "hard link", "directory link"])
def test_count_over_its_own_input_is_refused(work, capsys, how):
    out = alias(work, how, "a.txt", "s.txt")
    err = refused(capsys, work, ["count", str(work / "a.txt"), "-o", out, "--overwrite"])
    other = "" if how == "same" else f" {work / 'a.txt'}"
    assert err == f"bob: {out}: the counted file{other} and the counts file would be one file"


def test_count_over_a_file_of_the_directory_it_counts_is_refused(work, capsys):
    (work / "corpus").mkdir()
    (work / "corpus" / "x.txt").write_bytes(TEXT)
    out = work / "corpus" / "x.txt"
    err = refused(capsys, work, ["count", str(work / "corpus"), "-o", str(out), "--overwrite"])
    assert err == f"bob: {out}: the counted file and the counts file would be one file"
    err = refused(capsys, work, ["count", str(work / "corpus" / "*.txt"), "-o", str(out),
                                 "--overwrite"])
    assert err == f"bob: {out}: the counted file and the counts file would be one file"


@pytest.mark.parametrize("how", ["same", "symlink", "hard link", "directory link"])
def test_train_over_its_own_text_is_refused(work, capsys, how):
    out = alias(work, how, "a.txt", "small.st")
    err = refused(capsys, work, ["train", "--backend", "cpu", "--text", str(work / "a.txt"),
                                 "-c", out, "--overwrite"])
    other = "" if how == "same" else f" {work / 'a.txt'}"
    assert err == f"bob: {out}: the text file{other} and the checkpoint would be one file"


@pytest.mark.parametrize(("flag", "what"), [("--counts", "counts file"),
                                            ("--val-counts", "validation counts file"),
                                            ("--val-text", "validation text file"),
                                            ("--tokenizer", "tokenizer file")])
def test_train_over_another_of_its_inputs_is_refused(work, capsys, flag, what):
    assert main(["count", str(work / "a.txt"), "-o", str(work / "a.counts")]) == 0
    (work / "v.txt").write_bytes(TEXT[::-1])
    source = {"--val-text": "v.txt", "--tokenizer": "meta.pkl"}.get(flag, "a.counts")
    if flag == "--tokenizer":
        write_meta(work / "meta.pkl", {0: "a", 1: "b"}, {"a": 0, "b": 1}, vocab=2)
        np.array([0, 1, 1, 0], "<u2").tofile(work / "t.bin")
    os.symlink(source, work / "link.st")
    data = (["--tokens", str(work / "t.bin")] if flag == "--tokenizer"
            else [] if flag == "--counts" else ["--text", str(work / "a.txt")])
    err = refused(capsys, work, ["train", "--backend", "cpu", *data, flag, str(work / source),
                                 "-c", str(work / "link.st"), "--overwrite"])
    assert err == (f"bob: {work / 'link.st'}: the {what} {work / source} and the checkpoint "
                   "would be one file")


def test_a_best_checkpoint_linked_to_the_checkpoint_is_refused(work, capsys):
    os.symlink("m.safetensors", work / "m.best.safetensors")
    err = refused(capsys, work, ["train", "--backend", "cpu", "--text", str(work / "a.txt"),
                                 "--val-text", str(work / "a.txt"), "--keep-best", "-c",
                                 str(work / "m.safetensors"), "--overwrite"])
    assert err == (f"bob: {work / 'm.best.safetensors'}: the checkpoint "
                   f"{work / 'm.safetensors'} and the best checkpoint would be one file")


def test_plot_over_its_own_checkpoint_is_refused(work, capsys):
    shutil.copy(work / "m.safetensors", work / "loss.png")
    err = refused(capsys, work, ["plot", "-c", str(work / "loss.png"), "--out", str(work)])
    assert err == f"bob: {work / 'loss.png'}: the checkpoint and the PNG would be one file"


# -- temperatures near zero --------------------------------------------------------------
@pytest.mark.parametrize("temperature", ["1e-45", "1e-39", "1e-320", "1e-30"])
def test_a_temperature_near_zero_is_greedy_without_warnings(work, temperature):
    greedy = bob_process(work, ["generate", "-c", "m.safetensors", "-p", "a", "-t", "0",
                                "-n", "40"])
    assert greedy.returncode == 0, greedy.stderr
    done = bob_process(work, ["generate", "-c", "m.safetensors", "-p", "a", "-t", temperature,
                              "-n", "40", "--num-samples", "2", "--seed", "3"])
    assert done.returncode == 0 and done.stderr == "", done.stderr  # no RuntimeWarning
    assert done.stdout == f"{greedy.stdout}---------------\n{greedy.stdout}"
    assert set(done.stdout) <= set(TEXT.decode() + "-\n")  # only bytes the text has


# -- a write that fails: the output's failure, exit 1 -----------------------------------
def test_export_under_a_file_size_limit_names_the_output(work):
    v = 512  # a parameters table of 1 MiB, past the 100 KiB limit
    Checkpoint.zeros(v).save(work / "big.safetensors")
    (work / "e.safetensors").write_bytes(b"the old export")
    before = contents(work)
    done = bob_process(work, ["export", "-c", "big.safetensors", "-o", "e.safetensors",
                              "--overwrite"], {resource.RLIMIT_FSIZE: 100 << 10})
    assert done.returncode == 1, done.stderr
    assert done.stderr == ("bob: e.safetensors: cannot write (File too large); the old file "
                           "is untouched\n")
    assert contents(work) == before  # the old export, the checkpoint, no temporary


# -- --overwrite over a sharded checkpoint ------------------------------------------------
def shard_names(index: Path) -> list[str]:
    return [entry["file"] for entry in json.loads(index.read_text())["metadata"]["shards"]]


@pytest.mark.parametrize("sound", [True, False])
def test_overwrite_in_shards_removes_only_files_of_a_sound_old_index(work, sharded, sound):
    """An old index whose first shard is `victim.txt`: with the weight map to match (the
    index sound, the name not a shard's) or without (the index not sound). victim.txt
    stays; so does any file the old index does not name as Bob names a shard."""
    index = copied(sharded, work)
    (work / "victim.txt").write_bytes(b"not a shard")
    document = json.loads(index.read_text())
    document["metadata"]["shards"][0]["file"] = "victim.txt"
    if sound:
        for name, file in list(document["weight_map"].items()):
            if file == "ck.step5-00001-of-00002.safetensors":
                document["weight_map"][name] = "victim.txt"
    index.write_text(json.dumps(document))
    assert train_cpu("--text", str(work / "a.txt"), "--steps", "3", "-N", "3", "--shards",
                     "2", "-c", str(work / "ck.safetensors"), "--overwrite") == 0
    assert (work / "victim.txt").read_bytes() == b"not a shard"
    assert (work / "ck.step5-00001-of-00002.safetensors").exists()  # named by no index
    second_old = work / "ck.step5-00002-of-00002.safetensors"
    assert second_old.exists() is not sound  # named as Bob names it: removed where sound
    assert open_checkpoint(index).state.step == 3
    assert shard_names(index) == ["ck.step3-00001-of-00002.safetensors",
                                  "ck.step3-00002-of-00002.safetensors"]


def test_one_piece_overwrite_over_a_sharded_checkpoint_removes_it(work, sharded):
    index = copied(sharded, work)
    shards = shard_names(index)
    assert train_cpu("--text", str(work / "a.txt"), "--steps", "5",
                     "-c", str(work / "ck.safetensors"), "--overwrite") == 0
    left = set(os.listdir(work))
    assert "ck.safetensors" in left and index.name not in left and not left & set(shards)
    assert open_checkpoint(work / "ck.safetensors").state.step == 5


def test_sharded_overwrite_over_a_one_piece_checkpoint_removes_it(work):
    assert train_cpu("--text", str(work / "a.txt"), "--steps", "5", "--shards", "2",
                     "-c", str(work / "m.safetensors"), "--overwrite") == 0
    assert not (work / "m.safetensors").exists()
    assert open_checkpoint(work / "m.safetensors").path.endswith(".index.json")


# -- memory that runs out -----------------------------------------------------------------
def test_memory_shortages_are_named_in_one_line():
    class ArrayMemoryError(MemoryError):
        _total_size = 256 << 10

    assert memory_shortage(ArrayMemoryError("Unable to allocate 256. KiB")).startswith(
        "memory ran out: an allocation of 256 KiB failed")
    # llvmlite's own OSError, raised while dlopen's is handled (its __context__).
    wrapped = OSError("Could not find/load shared object file 'libllvmlite.so'")
    wrapped.__context__ = OSError("/venv/site-packages/llvmlite/binding/libllvmlite.so: "
                                  "failed to map segment from shared object")
    line = memory_shortage(wrapped)
    assert line is not None and line.startswith(
        "memory ran out: the system refused memory (libllvmlite.so: failed to map segment "
        "from shared object)")
    assert memory_shortage(OSError(errno.ENOMEM, "Cannot allocate memory")) is not None
    assert memory_shortage(ValueError("no symbol is allowed")) is None
    assert memory_shortage(OSError(errno.ENOENT, "No such file")) is None


def test_an_address_space_limit_says_memory_ran_out(work):
    """Under `ulimit -v`, training loads Numba's compiler and allocates its arena: where
    either fails, one line says memory ran out and under which limit (exit 1), and no
    checkpoint is written. The limits straddle what this machine's libraries take: at
    least one of them runs out."""
    before = sorted(os.listdir(work))
    ran_out = 0
    for megabytes in (200, 300, 400):
        done = bob_process(work, ["train", "--backend", "cpu", "--text", "a.txt", "--steps",
                                  "4", "-N", "2", "-c", "n.st"],
                           {resource.RLIMIT_AS: megabytes << 20})
        if done.returncode == 0:  # the limit left room on this machine
            (work / "n.st").unlink()
            continue
        assert done.returncode == 1, done.stderr
        # The run's plan line may come first (said before the backend starts); the
        # refusal is one line, the last.
        lines = done.stderr.strip().splitlines()
        assert lines[-1].startswith("bob: memory ran out: "), done.stderr
        assert f"under the address-space limit of {megabytes} MiB (ulimit -v)" in lines[-1]
        assert all(line.startswith("plan: ") for line in lines[:-1]), done.stderr
        assert "internal error" not in done.stderr
        assert sorted(os.listdir(work)) == before
        ran_out += 1
    assert ran_out


# -- small sizes in a refusal --------------------------------------------------------------
def test_a_full_disk_refusal_prints_small_sizes_in_bytes(work, capsys, monkeypatch):
    from bob.host import training

    monkeypatch.setattr(training.shutil, "disk_usage",
                        lambda path: shutil._ntuple_diskusage(1 << 30, 1 << 30, 512))
    err = refused(capsys, work, ["train", "--backend", "cpu", "--text", str(work / "a.txt"),
                                 "-c", str(work / "n.st")])
    assert err.startswith(f"bob: {work / 'n.st'}: the checkpoint needs 76") and \
        err.endswith(f" KiB on disk, {work} has 512 B free"), err
