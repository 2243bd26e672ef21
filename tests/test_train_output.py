"""What `bob train`, `eval` and `count` tell the user: progress lines at eval points with
honest rates, --keep-best, one notation for several files, the compile notice, and the
labels of the eval and count tables. Each runs the command as a user would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bob.cli.main import main
from bob.errors import BadInput
from bob.host import training
from bob.host.training import TrainRequest, best_checkpoint_path
from bob.records.checkpoint import Checkpoint
from conftest import contents, listing

ROOT = Path(__file__).resolve().parent.parent
PROGRESS_LINE = re.compile(r"step (\d+): train (\d+\.\d{4})(?:, val (\d+\.\d{4}))?  "
                           r"\((\d+(?:\.\d+)?(?:e-\d+)?) ms/update, ETA (\d+:\d\d(?::\d\d)?)\)")
TRAIN_TEXT = b"the cat sat on the mat; the rat ate the hat. " * 20
# Shares some pairs with TRAIN_TEXT, not others: its loss falls, then rises as the table
# learns the training text alone.
VAL_TEXT = b"the dog sat on a frog; a hog ate the log. " * 3


@pytest.fixture
def texts(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "train.txt").write_bytes(TRAIN_TEXT)
    (tmp_path / "val.txt").write_bytes(VAL_TEXT)
    return tmp_path / "train.txt", tmp_path / "val.txt"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def train(capsys, *argv: str) -> tuple[int, str, str]:
    return run(capsys, "train", "--backend", "cpu", *argv)


def progress(err: str) -> list[re.Match]:
    lines = [line for line in err.splitlines() if line.startswith("step ")]
    matches = [PROGRESS_LINE.fullmatch(line) for line in lines]
    assert all(matches), lines
    return matches  # type: ignore[return-value]


# -- --eval-every: lines at eval points, validation as it goes -------------------------
def test_eval_every_prints_a_line_with_validation_at_each_eval_point(tmp_path, texts, capsys):
    text, val = texts
    path = tmp_path / "bob.safetensors"
    status, out, err = train(capsys, "--text", str(text), "--val-text", str(val), "--steps",
                             "30", "-N", "10", "--eval-every", "4", "-c", str(path), "--json")
    assert status == 0
    lines = progress(err)
    assert [int(m.group(1)) for m in lines] == [4, 8, 12, 16, 20, 24, 28, 30]
    assert all(m.group(3) is not None for m in lines)  # validation at every line
    # The checkpoint keeps the -N grain: a point every 10 updates, and the end.
    state = Checkpoint.load(path)
    assert [step for step, _ in state.history] == [0, 10, 20, 30]
    assert [step for step, _ in state.val_history] == [0, 10, 20, 30]
    # The lines at 20 and 30 show what the checkpoint recorded there.
    shown = {int(m.group(1)): (m.group(2), m.group(3)) for m in lines}
    for (step, loss), (_, val_loss) in zip(state.history[2:], state.val_history[2:],
                                           strict=True):
        assert shown[step] == (f"{loss:.4f}", f"{val_loss:.4f}")
    assert lines[-1].group(5) == "0:00"
    assert json.loads(out)["val_loss"] == state.val_history[-1][1]


def test_the_rates_of_the_lines_add_up_to_the_run(tmp_path, texts, capsys):
    text, _ = texts
    status, out, err = train(capsys, "--text", str(text), "--steps", "40", "-N", "5",
                             "--eval-every", "10", "-c", str(tmp_path / "b.st"), "--json")
    assert status == 0
    lines = progress(err)
    assert [int(m.group(1)) for m in lines] == [10, 20, 30, 40]
    # Each rate is the wall time of its interval over its 10 updates: together no more than
    # the whole run (which adds the data, the backend's start and the last save).
    spent = sum(10 * float(m.group(4)) / 1000 for m in lines)
    assert 0 < spent <= json.loads(out)["wall_seconds"] * 1.01  # three-digit rounding


@pytest.mark.parametrize("options", [
    ("--eval-every", "3"),
    ("--eval-every", "20"),
    ("--eval-every", "4", "--keep-best"),
])
def test_eval_every_and_keep_best_leave_the_checkpoint_bytes_unchanged(tmp_path, texts,
                                                                        capsys, options):
    text, val = texts
    common = ("--text", str(text), "--val-text", str(val), "--steps", "33", "-N", "10")
    plain, with_options = tmp_path / "plain.safetensors", tmp_path / "options.safetensors"
    assert train(capsys, *common, "-c", str(plain))[0] == 0
    assert train(capsys, *common, *options, "-c", str(with_options))[0] == 0
    assert plain.read_bytes() == with_options.read_bytes()


def test_eval_every_must_be_a_positive_count(tmp_path, texts, capsys):
    text, _ = texts
    before = listing(tmp_path)
    status, _, err = train(capsys, "--text", str(text), "--eval-every", "0",
                           "-c", str(tmp_path / "x.st"))
    assert status == 2 and "--eval-every" in err and "0" in err
    assert listing(tmp_path) == before
    with pytest.raises(BadInput, match="eval_every must be at least 1, not 0"):
        TrainRequest(eval_every=0, checkpoint=str(tmp_path / "x.st"))


# -- --keep-best -----------------------------------------------------------------------
def test_keep_best_saves_the_checkpoint_of_the_lowest_validation_loss(tmp_path, texts, capsys,
                                                                      monkeypatch):
    text, val = texts
    monkeypatch.chdir(tmp_path)  # short names: the summary's table shows them whole
    path = Path("bob.safetensors")
    status, out, err = train(capsys, "--text", str(text), "--val-text", str(val), "--steps",
                             "80", "-N", "10", "--eval-every", "5", "--keep-best",
                             "-c", str(path), "--json")
    assert status == 0
    lines = progress(err)
    losses = {int(m.group(1)): float(m.group(3)) for m in lines}
    lowest = min(losses, key=losses.__getitem__)
    assert 5 < lowest < 80  # the validation loss fell, then rose: the best is neither end
    report = json.loads(out)
    best = Path("bob.best.safetensors")
    assert report["best_checkpoint"] == str(best) == best_checkpoint_path(str(path))
    assert report["best_step"] == lowest
    assert f"{report['best_val_loss']:.4f}" == f"{losses[lowest]:.4f}"
    assert report["written"] == [str(path), str(best)]
    kept = Checkpoint.load(best)
    assert kept.step == lowest and kept.val_history[-1] == (lowest, report["best_val_loss"])
    assert Checkpoint.load(path).step == 80
    # The summary names it.
    assert (f"best checkpoint │ {best} (update {lowest}, validation "
            f"{report['best_val_loss']:.6f})") in " ".join(err.split())
    # It is a checkpoint like the other: it resumes and evaluates.
    status, out, _ = run(capsys, "eval", "-c", str(best), "--text", str(val), "--backend",
                         "cpu", "--json")
    assert status == 0 and json.loads(out)["loss"] == pytest.approx(report["best_val_loss"])


def test_a_resumed_run_keeps_the_earlier_best_until_it_is_beaten(tmp_path, texts, capsys):
    text, val = texts
    path = tmp_path / "bob.safetensors"
    common = ("--text", str(text), "--val-text", str(val), "-N", "10", "--keep-best",
              "-c", str(path))
    assert train(capsys, *common, "--steps", "60", "--json")[0] == 0
    best = tmp_path / "bob.best.safetensors"
    before = best.read_bytes()
    # Past the minimum the validation loss only rises: the earlier best stays.
    status, out, err = train(capsys, *common, "--steps", "20", "--resume", "--json")
    assert status == 0 and best.read_bytes() == before
    report = json.loads(out)
    assert report["best_step"] == Checkpoint.load(best).step < 60
    assert report["written"] == [str(path)]
    assert "an earlier run's" in err


def test_a_streamed_checkpoint_keeps_the_same_best(tmp_path, texts, capsys, monkeypatch):
    """Past SMALL_CHECKPOINT_BYTES the tables are streamed from the arena, the best ones
    too: the same files as when they are read back beside the next invocation."""
    text, val = texts
    common = ("--text", str(text), "--val-text", str(val), "--steps", "60", "-N", "10",
              "--eval-every", "5", "--keep-best")
    read_back = tmp_path / "read" / "bob.safetensors"
    streamed = tmp_path / "streamed" / "bob.safetensors"
    read_back.parent.mkdir()
    streamed.parent.mkdir()
    assert train(capsys, *common, "-c", str(read_back))[0] == 0
    monkeypatch.setattr(training, "SMALL_CHECKPOINT_BYTES", 1)
    status, out, _ = train(capsys, *common, "-c", str(streamed), "--json")
    assert status == 0 and 5 < json.loads(out)["best_step"] < 60
    for name in ("bob.safetensors", "bob.best.safetensors"):
        assert (read_back.parent / name).read_bytes() == (streamed.parent / name).read_bytes()


@pytest.mark.parametrize("argv,message", [
    (["--keep-best"], "bob: --keep-best keeps the checkpoint of the lowest validation loss: "
                      "it needs validation data (--val-fraction, --val-text, --val-tokens or "
                      "--val-counts)"),
    (["--keep-best", "--val-text", "{val}", "--result", "{d}/bob.best.safetensors"],
     "bob: {d}/bob.best.safetensors: the best checkpoint and the result record would be one "
     "file"),
    (["--result", "{d}/same.st", "-c", "{d}/same.st"],
     "bob: {d}/same.st: the checkpoint and the result record would be one file"),
    (["--keep-best", "--val-text", "{val}", "-c", "{d}/nowhere/x.st"],
     "bob: {d}/nowhere/x.st: directory {d}/nowhere does not exist"),
])
def test_keep_best_refusals_are_one_line_exit_2_nothing_written(tmp_path, texts, capsys,
                                                                argv, message):
    text, val = texts
    before = listing(tmp_path)
    words = [word.format(d=tmp_path, val=val) for word in argv]
    if "-c" not in words:
        words += ["-c", str(tmp_path / "bob.safetensors")]
    status, out, err = train(capsys, "--text", str(text), "--steps", "5", *words)
    assert status == 2
    assert err.startswith(message.format(d=tmp_path)) and err.count("\n") == 1, err
    assert listing(tmp_path) == before


def test_an_existing_best_checkpoint_is_refused_without_resume_or_overwrite(tmp_path, texts,
                                                                            capsys):
    text, val = texts
    best = tmp_path / "bob.best.safetensors"
    best.write_bytes(b"an earlier best")
    before = listing(tmp_path)
    status, _, err = train(capsys, "--text", str(text), "--val-text", str(val), "--steps", "5",
                           "--keep-best", "-c", str(tmp_path / "bob.safetensors"))
    assert status == 2
    assert err == (f"bob: {best}: exists; pass --resume to keep it until a lower validation "
                   "loss beats it, or --overwrite to start again\n")
    assert listing(tmp_path) == before and best.read_bytes() == b"an earlier best"
    assert train(capsys, "--text", str(text), "--val-text", str(val), "--steps", "5",
                 "--keep-best", "--overwrite", "-c", str(tmp_path / "bob.safetensors"))[0] == 0
    assert Checkpoint.load(best).step == 5


def test_a_new_run_owns_its_best_file(tmp_path, texts, capsys):
    """`make run` (--overwrite, no --keep-best) after a run that kept a best: the earlier
    run's best goes when the new run writes its checkpoint, so a later --resume
    --keep-best keeps the new run's own best, never reporting the old model as its own."""
    text, val = texts
    path, best = tmp_path / "bob.safetensors", tmp_path / "bob.best.safetensors"
    assert train(capsys, "--text", str(val), "--val-text", str(text), "--steps", "20",
                 "--keep-best", "-c", str(path))[0] == 0
    assert best.exists()
    # --steps 0 writes no checkpoint: the earlier run's files stay as they were.
    before = contents(tmp_path)
    assert train(capsys, "--text", str(text), "--steps", "0", "--overwrite", "-c",
                 str(path))[0] == 0
    assert contents(tmp_path) == before
    status, _, err = train(capsys, "--text", str(text), "--steps", "10", "--overwrite", "-c",
                           str(path))
    assert status == 0 and not best.exists() and "best checkpoint" not in err
    status, out, err = train(capsys, "--text", str(text), "--val-text", str(val), "--steps",
                             "10", "--resume", "--keep-best", "-c", str(path), "--json")
    assert status == 0 and "an earlier run's" not in err
    report = json.loads(out)
    assert report["written"] == [str(path), str(best)] and report["best_step"] == 20
    assert Checkpoint.load(best).step == 20


def test_a_fresh_keep_best_run_keeps_its_own_best_written_before_its_checkpoint(
        tmp_path, texts, capsys):
    """With a save period the best is written at an eval point before the first checkpoint:
    that file is this run's and stays."""
    text, val = texts
    path, best = tmp_path / "bob.safetensors", tmp_path / "bob.best.safetensors"
    common = ("--text", str(text), "--val-text", str(val), "-N", "10", "--keep-best",
              "-c", str(path), "--json")
    assert train(capsys, *common, "--steps", "30")[0] == 0
    status, out, _ = train(capsys, *common, "--steps", "30", "--overwrite",
                           "--save-every-updates", "30")
    assert status == 0
    report = json.loads(out)
    assert report["written"] == [str(path), str(best)]
    assert Checkpoint.load(best).step == report["best_step"]


def test_another_runs_best_file_is_refused_on_resume(tmp_path, texts, capsys):
    text, val = texts
    path, best = tmp_path / "bob.safetensors", tmp_path / "bob.best.safetensors"
    other = tmp_path / "other"
    other.mkdir()
    for where, data in ((other, val), (tmp_path, text)):
        assert train(capsys, "--text", str(data), "--val-text", str(val), "--steps", "10",
                     "--keep-best", "-c", str(where / "bob.safetensors"))[0] == 0
    best.write_bytes((other / "bob.best.safetensors").read_bytes())  # copied in by hand
    before = contents(tmp_path)
    status, out, err = train(capsys, "--text", str(text), "--val-text", str(val), "--steps",
                             "10", "--resume", "--keep-best", "-c", str(path))
    assert status == 2 and out == ""
    assert err == (f"bob: {best}: another run's best checkpoint (its loss history is not "
                   f"{path}'s); move it away to keep this run's best\n")
    assert contents(tmp_path) == before


# -- one notation for several files: the option repeated -------------------------------
def test_train_and_eval_take_several_files_by_repeating_the_option(tmp_path, texts, capsys):
    text, val = texts
    both = tmp_path / "both.txt"
    both.write_bytes(TRAIN_TEXT + VAL_TEXT)
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    assert train(capsys, "--text", str(text), "--text", str(val), "--steps", "5",
                 "-c", str(one))[0] == 0
    status, out, _ = run(capsys, "eval", "-c", str(one), "--text", str(text), "--text",
                         str(val), "--backend", "cpu", "--json")
    assert status == 0
    assert json.loads(out)["transitions"] == len(TRAIN_TEXT) + len(VAL_TEXT) - 2
    assert train(capsys, "--text", str(both), "--steps", "5", "-c", str(two))[0] == 0
    # Pairs never cross a file boundary: two files are not their concatenation.
    assert Checkpoint.load(one).data_digest != Checkpoint.load(two).data_digest


@pytest.mark.parametrize("command", [
    ["train", "--backend", "cpu", "--text", "{a}", "{b}", "-c", "{d}/x.st"],
    ["train", "--backend", "cpu", "--text", "{a}", "--val-text", "{a}", "{b}", "-c",
     "{d}/x.st"],
    ["eval", "-c", "{d}/x.st", "--text", "{a}", "{b}"],
])
def test_a_second_file_after_an_option_says_how_to_give_it(tmp_path, texts, capsys, command):
    a, b = texts
    before = listing(tmp_path)
    status, out, err = run(capsys, *[w.format(a=a, b=b, d=tmp_path) for w in command])
    assert status == 2
    assert (f": unexpected argument '{b}': an option takes one file, repeat it for "
            "several (--text a.txt --text b.txt, --tokens a.bin --tokens b.bin)") in err
    assert listing(tmp_path) == before


def test_count_takes_several_token_files_by_repeating_the_option(tmp_path, capsys):
    first, second = tmp_path / "train.bin", tmp_path / "val.bin"
    np.array([1, 2, 3, 1, 2], "<u2").tofile(first)
    np.array([3, 2, 1], "<u2").tofile(second)
    before = listing(tmp_path)
    status, _, err = run(capsys, "count", "--tokens", str(first), str(second), "--vocab", "8",
                         "-o", str(tmp_path / "c.st"))
    assert status == 2
    assert (f"bob count: {second}: text INPUTS beside --tokens files; give each token file its "
            f"own --tokens (--tokens {first} --tokens {second}), or count text INPUTS "
            "alone") in err
    assert listing(tmp_path) == before
    status, out, _ = run(capsys, "count", "--tokens", str(first), "--tokens", str(second),
                         "--vocab", "8", "-o", str(tmp_path / "c.st"), "--json")
    assert status == 0
    report = json.loads(out.strip().splitlines()[-1])
    assert report["files"] == 2 and report["transitions"] == 4 + 2


def test_every_help_text_writes_the_repeated_option(capsys):
    for command, options in (("train", ("--text", "--tokens", "--val-text", "--val-tokens")),
                             ("eval", ("--text", "--tokens")), ("count", ("--tokens",))):
        assert main([command, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        for option in options:
            assert re.search(f"{option}(, --[a-z-]+)? FILE", text), (command, option)
        assert "repeat for several: --text a.txt --text b.txt" in text or \
            "repeat for several: --tokens a.bin --tokens b.bin" in text
        assert "FILE..." not in text


# -- labels ----------------------------------------------------------------------------
def test_eval_names_the_texts_own_entropy_as_a_lower_bound(tmp_path, texts, capsys):
    text, val = texts
    path = tmp_path / "bob.safetensors"
    assert train(capsys, "--text", str(text), "--steps", "5", "-c", str(path))[0] == 0
    status, out, _ = run(capsys, "eval", "-c", str(path), "--text", str(val),
                         "--backend", "cpu")
    assert status == 0
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in out.splitlines() if line.startswith("│")}
    report = json.loads(run(capsys, "eval", "-c", str(path), "--text", str(val), "--backend",
                            "cpu", "--json")[1])
    assert rows["entropy of this text (lower bound)"] == f"{report['optimum']:.6f}"
    assert "optimum (bigram)" not in out


def test_count_shows_its_rate_and_where_it_ran(tmp_path, texts, capsys):
    text, _ = texts
    status, out, _ = run(capsys, "count", str(text), "-o", str(tmp_path / "c.st"),
                         "--workers", "2")
    assert status == 0
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in out.splitlines() if line.startswith("│")}
    assert rows["counted on"] == "this machine, 2 threads at most"
    assert re.fullmatch(r"\d+\.\d\d s, \d+(\.\d+)? (B|kB|MB|GB)/s", rows["time"]), rows["time"]
    assert "0 MB/s" not in out and "speed" not in rows
    assert "bob count" in out and "(this machine" not in out


# -- the compile notice ----------------------------------------------------------------
def test_the_first_run_compiles_once_for_the_whole_session(tmp_path, texts):
    """The README session from a fresh cache: the first `bob train` says it compiles, once,
    and compiles what the commands after it need too; predict, a run with validation and
    eval then load every kernel from Numba's cache, say nothing and add nothing to it."""
    pytest.importorskip("numba")
    text, val = texts
    cache = tmp_path / "numba-cache"
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NUMBA_CACHE_DIR": str(cache)}
    environment.pop("BOB_CPU_KERNELS", None)
    notice = "compiling the CPU kernels (first run only) ..."
    checkpoint = str(tmp_path / "bob.safetensors")
    session = [
        ["train", "--text", str(text), "--steps", "2", "-c", checkpoint],
        ["predict", "-c", checkpoint, "the c"],
        ["train", "--resume", "--text", str(text), "--val-text", str(val), "--steps", "2",
         "--keep-best", "-c", checkpoint],
        ["eval", "-c", checkpoint, "--text", str(val)],
        ["train", "--text", str(text), "--steps", "2", "--overwrite", "-c", checkpoint],
    ]
    compiled: list[str] = []
    for number, words in enumerate(session):
        done = subprocess.run([sys.executable, "-m", "bob", *words, "--backend", "cpu"],
                              env=environment, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr
        assert done.stderr.count(notice) == (1 if number == 0 else 0), (words, done.stderr)
        files = sorted(path.name for path in cache.rglob("*.nbc"))
        if number == 0:
            compiled = files
        assert files == compiled, words  # no kernel compiled again, for other types either
    assert len(compiled) == 4  # the corpus loss-gradient, AdamW, the hard and validation losses


# -- without a terminal: the plan first, then a line at least every HEARTBEAT_SECONDS -----
def test_without_a_terminal_the_run_says_its_plan_and_keeps_saying_what_it_does(
        tmp_path, texts, capsys, monkeypatch):
    from bob.backends.cpu import CpuBackend
    from bob.cli import progress as progress_module
    from bob.host import data

    text, _ = texts
    monkeypatch.setattr(progress_module, "HEARTBEAT_SECONDS", 0.2)
    counted = data.training_data

    def slow_data(*args, **kwargs):
        time.sleep(0.6)
        return counted(*args, **kwargs)

    slow_run = CpuBackend._run

    def slow_invocation(self, submissions):
        time.sleep(0.6)
        slow_run(self, submissions)

    monkeypatch.setattr(training, "training_data", slow_data)
    monkeypatch.setattr(CpuBackend, "_run", slow_invocation)
    status, _, err = train(capsys, "--text", str(text), "--steps", "5", "-N", "2",
                           "-c", str(tmp_path / "bob.safetensors"))
    assert status == 0
    lines = [line for line in err.splitlines() if line.strip() and "│" not in line
             and line[0] not in "┏┃┡└" and "bob train (" not in line]
    beats = [line for line in lines if line.startswith("... ")]
    assert all(re.fullmatch(r"\.\.\. \d+:\d\d: .+", line) for line in beats), beats
    # The data first, then the plan, then each invocation as it runs.
    assert beats[0].endswith(": starting: the backend, the data"), lines
    plan = lines.index("plan: updates 1-5 on the cpu backend (V=256, corpus mode, seed "
                       "schedule), 3 invocations of up to 2 updates; the first estimated at "
                       "0.0015 s")
    assert all(line.endswith("the backend, the data") for line in beats
               if lines.index(line) < plan)
    phases = [line.split(": ", 1)[1] for line in lines[plan:] if line.startswith("... ")]
    assert set(phases) <= {"the first invocation running (updates 1-2)",
                           "2 of 5 updates done", "4 of 5 updates done",
                           "saving the checkpoint"}, phases
    assert "the first invocation running (updates 1-2)" in phases
    assert any(re.fullmatch(r"[24] of 5 updates done", phase) for phase in phases), phases
    assert [line.split(":")[0] for line in lines if line.startswith("step ")] == [
        "step 2", "step 4", "step 5"]


def test_the_plan_line_names_a_resumed_runs_updates_and_its_estimate(tmp_path, texts, capsys):
    text, _ = texts
    path = str(tmp_path / "bob.safetensors")
    assert train(capsys, "--text", str(text), "--steps", "3", "-c", path)[0] == 0
    status, _, err = train(capsys, "--text", str(text), "--steps", "250", "--resume",
                           "-c", path)
    assert status == 0
    assert err.splitlines()[0] == (
        "plan: updates 4-253 on the cpu backend (V=256, corpus mode, seed schedule), 3 "
        "invocations of up to 100 updates; the first estimated at 0.076 s")
