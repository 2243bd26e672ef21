"""No silent surprises, no tracebacks: resume on other data, stated hyperparameters,
the checkpoint lock, outputs checked before work, interrupts, internal errors, --json,
progress without a terminal, generate, stdin."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bob.cli.main import REPORT_DIR_VARIABLE, main
from bob.host import api, inference, sampling
from bob.program.bob import Hyper
from bob.records import corpus
from bob.records.checkpoint import Checkpoint, Segment, checkpoint_lock, lock_path
from bob.records.counting import PairCounts
from bob.records.digest import sparse_digest
from conftest import contents, train_cpu

INTERRUPTED = re.compile(r"interrupted at update (\d+); checkpoint at update (\d+) kept")


def text_digest(data: bytes) -> str:
    """The data digest a checkpoint stores for a text: the sparse one of its counts."""
    return sparse_digest(PairCounts.from_dense(corpus.counts_from_bytes(data)))


# -- resume on other data ------------------------------------------------------
def test_resume_on_other_data_is_refused_naming_both_digests(tmp_path, text, capsys):
    path = tmp_path / "bob.safetensors"
    assert train_cpu("--text", str(text), "--steps", "10", "-c", str(path)) == 0
    capsys.readouterr()
    other = tmp_path / "other.txt"
    other.write_bytes(corpus.builtin_corpus())
    before = contents(tmp_path)
    status = train_cpu("--resume", "--steps", "5", "--text", str(other), "-c", str(path))
    err = capsys.readouterr().err
    assert status == 2, err
    mine = text_digest(text.read_bytes())
    builtin = text_digest(corpus.builtin_corpus())
    # Named by their hex digits, past the "v2:" of the form.
    assert mine[3:15] in err and builtin[3:15] in err and "--new-data" in err
    assert len(err.strip().splitlines()) == 1
    assert contents(tmp_path) == before  # the checkpoint untouched, no lock file left


def test_new_data_is_recorded_where_it_changed(tmp_path, text, capsys):
    path = tmp_path / "bob.safetensors"
    other = tmp_path / "b.txt"
    other.write_bytes(b"0123456789" * 30)
    assert train_cpu("--text", str(text), "--steps", "10", "-c", str(path)) == 0
    assert train_cpu("--resume", "--new-data", "--text", str(other), "--steps", "5",
                     "-c", str(path)) == 0
    state = Checkpoint.load(path)
    new = text_digest(other.read_bytes())
    assert state.step == 15 and state.data_digest == new
    assert [(s.first_step, s.data_digest) for s in state.segments] == [
        (0, text_digest(text.read_bytes())), (10, new)]
    assert state.optimum == pytest.approx(corpus.optimum(corpus.counts_from_bytes(
        other.read_bytes())))
    # The same data again needs no flag.
    assert train_cpu("--resume", "--text", str(other), "--steps", "5", "-c", str(path)) == 0
    assert len(Checkpoint.load(path).segments) == 2


def test_new_data_without_resume_is_refused(tmp_path, text, capsys):
    status = train_cpu("--new-data", "--text", str(text), "-c", str(tmp_path / "x.safetensors"))
    assert status == 2
    assert "needs --resume" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]


# -- hyperparameters on resume -------------------------------------------------
def test_a_stated_default_hyperparameter_is_honoured_on_resume(tmp_path, text):
    path = tmp_path / "bob.safetensors"
    assert train_cpu("--text", str(text), "--steps", "10", "--lr", "0.05", "-c", str(path)) == 0
    assert train_cpu("--text", str(text), "--resume", "--steps", "5", "-c", str(path)) == 0
    assert Checkpoint.load(path).hyper.lr == 0.05  # not stated: the checkpoint's own
    assert train_cpu("--text", str(text), "--resume", "--steps", "5", "--lr", "0.1",
                     "-c", str(path)) == 0  # 0.1 is the default, stated: it counts
    state = Checkpoint.load(path)
    assert state.hyper == Hyper(lr=0.1)
    assert [(s.first_step, s.hyper.lr) for s in state.segments] == [(0, 0.05), (15, 0.1)]


def test_resume_runs_with_the_stated_hyperparameters(tmp_path, text):
    """The updates after the change use the new lr: equal to a run that used it throughout
    from the same state."""
    changed, reference = tmp_path / "changed.safetensors", tmp_path / "ref.safetensors"
    for path in (changed, reference):
        assert train_cpu("--text", str(text), "--steps", "10", "--lr", "0.05", "-c",
                         str(path)) == 0
    assert train_cpu("--text", str(text), "--resume", "--steps", "5", "--beta1", "0.9",
                     "--lr", "0.1", "-c", str(changed)) == 0
    start = Checkpoint.load(reference)
    data = api.training_data([str(text)])
    from bob.backends import choose_backend
    from bob.host.session import Session
    from bob.host.session import train as run
    from bob.program.bob import BobConfig
    with Session(choose_backend("cpu"), Hyper(lr=0.1)) as session:
        expected = run(session, BobConfig(prompts=0, updates=5, mode="corpus",
                                          pairs=data.record.pairs), start,
                       data.record, 5)[-1].checkpoint
    assert Checkpoint.load(changed).parameters.tobytes() == expected.parameters.tobytes()


def test_a_checkpoint_without_segments_resumes(tmp_path, text):
    path = tmp_path / "old.safetensors"
    assert train_cpu("--text", str(text), "--steps", "10", "-c", str(path)) == 0
    state = Checkpoint.load(path)
    old = state.with_segments(())  # as Bob wrote before it kept segments
    old.save(path)
    assert Checkpoint.load(path).segments == ()
    assert train_cpu("--text", str(text), "--resume", "--steps", "5", "--lr", "0.2",
                     "-c", str(path)) == 0
    assert Checkpoint.load(path).segments == (
        Segment(0, state.data_digest, Hyper()),
        Segment(10, state.data_digest, Hyper(lr=0.2), state.state.sources))


# -- one run per checkpoint ----------------------------------------------------
def test_a_locked_checkpoint_is_refused_naming_the_holder(tmp_path, text, capsys):
    path = tmp_path / "bob.safetensors"
    assert train_cpu("--text", str(text), "--steps", "5", "-c", str(path)) == 0
    capsys.readouterr()
    before = path.read_bytes()
    with checkpoint_lock(path):
        assert f"pid {os.getpid()}" in lock_path(path).read_text()
        for extra in (["--resume"], ["--overwrite"]):
            status = train_cpu("--text", str(text), "--steps", "5", "-c", str(path), *extra)
            err = capsys.readouterr().err
            assert status == 2, err
            assert f"in use by another run (pid {os.getpid()} on " in err
            assert path.read_bytes() == before
    assert not lock_path(path).exists()
    assert train_cpu("--text", str(text), "--resume", "--steps", "5", "-c", str(path)) == 0


# -- outputs checked before any work -------------------------------------------
@pytest.mark.parametrize("argv,message", [
    (["--result", "{dir}/missing/r.bin"], "directory {dir}/missing does not exist"),
    (["--result", "{dir}"], "is a directory"),
    (["-c", "{dir}/missing/x.safetensors"], "directory {dir}/missing does not exist"),
    # a directory that exists but takes no new files, even for root
    (["--result", "/proc/bob-result"], "/proc/bob-result: cannot write the result record"),
])
def test_bad_output_paths_are_refused_before_training(tmp_path, text, capsys, argv, message):
    args = [a.format(dir=tmp_path) for a in argv]
    if "-c" not in args:
        args += ["-c", str(tmp_path / "bob.safetensors")]
    before = contents(tmp_path)
    assert train_cpu("--text", str(text), "--steps", "5", *args) == 2
    err = capsys.readouterr().err
    assert message.format(dir=tmp_path) in err
    assert contents(tmp_path) == before and not (tmp_path / "missing").exists()


def test_steps_0_reports_only_what_it_wrote(tmp_path, text, capsys):
    path = tmp_path / "bob.safetensors"
    assert train_cpu("--text", str(text), "--steps", "0", "-c", str(path), "--json") == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["checkpoint"] is None and summary["written"] == []
    assert "nothing (--steps 0)" in captured.err and str(path) not in captured.err
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]
    result = tmp_path / "r.bin"
    assert train_cpu("--text", str(text), "--steps", "0", "-c", str(path), "--json",
                     "--result", str(result)) == 0
    assert json.loads(capsys.readouterr().out)["written"] == [str(result)]
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "r.bin"]


@pytest.mark.parametrize("target,message", [("file", "is a file"),
                                            ("missing/deeper", "missing does not exist"),
                                            ("plots", "loss.png: is a directory")])
def test_plot_refuses_a_bad_directory(tmp_path, capsys, target, message):
    path = tmp_path / "bob.safetensors"
    Checkpoint.zeros(4).with_history(((0, 1.0),)).save(path)
    (tmp_path / "file").write_text("keep")
    (tmp_path / "plots" / "loss.png").mkdir(parents=True)
    before = contents(tmp_path)
    assert main(["plot", "-c", str(path), "--out", str(tmp_path / target)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "plots" / "transitions.png").exists()
    assert contents(tmp_path) == before and not (tmp_path / "missing").exists()


# -- a text whose optimum is 0 -------------------------------------------------
@pytest.mark.parametrize("content", [b"ab", b"aaaa", b"abcabc"])
def test_a_text_with_zero_entropy_trains(tmp_path, capsys, content):
    source = tmp_path / "t.txt"
    source.write_bytes(content)
    path = tmp_path / "bob.safetensors"
    assert train_cpu("--text", str(source), "--steps", "10", "-c", str(path), "--json") == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["optimum"] == 0 and summary["gap"] is None
    assert f"{summary['loss']:.6f}" in captured.err  # the table shows the excess in nats
    assert "above optimum (nats)" in captured.err
    assert Checkpoint.load(path).step == 10


# -- no traceback, ever --------------------------------------------------------
def test_an_internal_error_prints_one_line_and_keeps_the_report(tmp_path, capsys,
                                                                monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the unexpected happened")

    monkeypatch.setattr(api, "evaluate", broken)
    monkeypatch.setenv(REPORT_DIR_VARIABLE, str(tmp_path / "reports"))
    assert main(["eval", "-c", "x", "--text", "y"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "internal error (RuntimeError: the unexpected happened)" in err
    reports = list((tmp_path / "reports").iterdir())
    assert len(reports) == 1 and str(reports[0]) in err
    report = reports[0].read_text()
    assert "Traceback" in report and "def broken" not in report and "in broken" in report
    assert report.startswith("bob eval -c x --text y")
    monkeypatch.setenv("BOB_TRACEBACK", "1")  # a developer asks for the traceback itself
    with pytest.raises(RuntimeError, match="the unexpected happened"):
        main(["eval", "-c", "x", "--text", "y"])


# -- --json: only JSON on stdout -----------------------------------------------
def test_every_json_output_is_only_json(tmp_path, text, capsys):
    path = tmp_path / "bob.safetensors"
    runs = [
        ["train", "--text", str(text), "--steps", "10", "-c", str(path), "--backend", "cpu"],
        ["predict", "-c", str(path), "--backend", "cpu", "a"],
        ["generate", "-c", str(path), "--backend", "cpu", "-p", "t", "-n", "5"],
        ["eval", "-c", str(path), "--text", str(text), "--backend", "cpu"],
        ["plot", "-c", str(path), "--out", str(tmp_path / "plots")],
        ["check", "--steps", "2", "-N", "1"],
        ["doctor"],
        ["plan", "-N", "1"],
        ["certify", "-N", "1"],
        ["bench", "-V", "2", "-N", "1", "-r", "1", "--backend", "cpu"],
    ]
    for argv in runs:
        assert main([*argv, "--json"]) == 0, argv
        out = capsys.readouterr().out
        json.loads(out)  # the whole of stdout, nothing else
    assert json.loads(json.dumps(None)) is None


PROGRESS_LINE = re.compile(r"step (\d+): train (\d+\.\d{4})(?:, val (\d+\.\d{4}))?  "
                           r"\((\d+(?:\.\d+)?) ms/update, ETA (\d+:\d\d(?::\d\d)?)\)")


def test_without_eval_every_each_invocation_prints_a_line(tmp_path, text, capsys):
    path = tmp_path / "bob.safetensors"
    validation = tmp_path / "val.txt"
    validation.write_bytes(b"the hat sat on the cat. " * 5)
    for extra in ((), ("--val-text", str(validation))):
        assert train_cpu("--text", str(text), "--steps", "12", "-c", str(path), "--overwrite",
                         *extra) == 0
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("step ")]
        matches = [PROGRESS_LINE.fullmatch(line) for line in lines]
        assert all(matches), lines
        assert [int(m.group(1)) for m in matches] == [5, 10, 12]
        state = Checkpoint.load(path)
        assert [m.group(2) for m in matches] == [f"{loss:.4f}"
                                                 for _, loss in state.history[1:]]
        assert matches[-1].group(5) == "0:00"  # nothing left
        if extra:
            assert [m.group(3) for m in matches] == [f"{loss:.4f}" for _, loss
                                                     in state.val_history[1:]]
        else:
            assert all(m.group(3) is None for m in matches) and state.val_history == ()


# -- interrupts, with real processes and signals -------------------------------
def start_training(tmp_path: Path, text: Path, *extra: str,
                   per_invocation: int = 1) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bob.cli.main", "train", "--text", str(text), "--backend",
         "cpu", "-N", str(per_invocation), "--steps", "1000000", "-c",
         str(tmp_path / "bob.safetensors"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=_source_env())


def wait_for_updates(path: Path, updates: int, process: subprocess.Popen) -> int:
    """The step of the checkpoint on disk once it has at least `updates`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        if path.exists():
            try:
                step = Checkpoint.load(path).step
                if step >= updates:
                    return step
            except Exception:  # noqa: BLE001, S110 - being replaced at this moment: retry
                pass
        time.sleep(0.05)
    process.kill()
    raise AssertionError("training made no progress")


@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_finishes_the_invocation_in_flight_and_saves_it(tmp_path, text, signum,
                                                                 status, capsys):
    """The first signal lets the invocation in flight finish (the one started before the
    checkpoint seen on disk was saved) and saves it: the message names that update, and
    the file resumes to the bytes of a run never stopped."""
    per_invocation = 20
    path = tmp_path / "bob.safetensors"
    process = start_training(tmp_path, text, per_invocation=per_invocation)
    try:
        seen = wait_for_updates(path, 2 * per_invocation, process)
        # A second run on the same checkpoint is refused while this one holds it.
        assert train_cpu("--text", str(text), "--resume", "-c", str(path)) == 2
        assert f"in use by another run (pid {process.pid} on " in capsys.readouterr().err
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    text_err = err.decode()
    assert process.returncode == status, text_err
    assert "Traceback" not in text_err
    last = text_err.strip().splitlines()[-1]
    found = INTERRUPTED.search(last)
    assert found and last.startswith("bob: "), last
    reached, kept = int(found.group(1)), int(found.group(2))
    assert reached == kept and kept % per_invocation == 0, text_err
    assert kept >= seen + per_invocation  # the invocation in flight was finished and kept
    assert Checkpoint.load(path).step == kept
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "bob.safetensors"]  # no lock, no temp
    assert main(["train", "--text", str(text), "--backend", "cpu", "--resume", "--steps",
                 str(per_invocation), "-N", str(per_invocation), "-c", str(path)]) == 0
    straight = tmp_path / "straight.safetensors"
    assert main(["train", "--text", str(text), "--backend", "cpu", "--steps",
                 str(kept + per_invocation), "-N", str(per_invocation), "-c",
                 str(straight)]) == 0
    resumed, whole = Checkpoint.load(path), Checkpoint.load(straight)
    assert resumed.step == whole.step == kept + per_invocation
    for name in ("parameters", "first_moment", "second_moment"):
        assert getattr(resumed, name).tobytes() == getattr(whole, name).tobytes(), name
    assert resumed.history == whole.history
    capsys.readouterr()


# -- generate and stdin --------------------------------------------------------
@pytest.fixture
def byte_model(tmp_path: Path) -> Path:
    """A model of a text that is not UTF-8: 0xff is followed by 0xfe, and 0xfe by 0xff."""
    source = tmp_path / "binary.txt"
    source.write_bytes(b"\xff\xfe" * 100 + b"xyz")
    path = tmp_path / "bytes.safetensors"
    assert train_cpu("--text", str(source), "--steps", "100", "-c", str(path)) == 0
    return path


def test_generate_raw_writes_the_bytes_unchanged(byte_model, capsysbinary):
    prompt = os.fsdecode(b"\xff")  # how Python hands a non-UTF-8 argument over
    capsysbinary.readouterr()
    assert main(["generate", "-c", str(byte_model), "-p", prompt, "-n", "5", "--raw",
                 "--backend", "cpu"]) == 0
    assert capsysbinary.readouterr().out == b"\xff\xfe\xff\xfe\xff\xfe"
    assert main(["generate", "-c", str(byte_model), "-p", prompt, "-n", "5",
                 "--backend", "cpu"]) == 0
    assert capsysbinary.readouterr().out == "\ufffd".encode() * 6 + b"\n"


def test_top_k_samples_only_the_k_likeliest(tmp_path, text, capsys):
    path = tmp_path / "bob.safetensors"
    assert train_cpu("--text", str(text), "--steps", "50", "-c", str(path)) == 0
    greedy = api.generate(str(path), b"t", 200, 0.0, 0, "cpu")
    assert api.generate(str(path), b"t", 200, 5.0, 3, "cpu", top_k=1) == greedy
    rows = inference.forward(Checkpoint.load(path), range(256), "cpu").logit_rows
    sampled = api.generate(str(path), b"t", 400, 5.0, 3, "cpu", top_k=3)
    everything = api.generate(str(path), b"t", 400, 5.0, 3, "cpu")
    previous = b"t" + sampled
    for last, nxt in zip(previous, sampled, strict=False):
        assert sampling.top_k_mask(rows[last], 3)[nxt], (last, nxt)
    assert sampled != everything  # at temperature 5 the tail is drawn without top-k
    capsys.readouterr()
    assert main(["generate", "-c", str(path), "-p", "t", "-k", "0"]) == 2
    assert "--top-k" in capsys.readouterr().err


def test_top_k_mask_breaks_ties_by_index():
    logits = np.array([1.0, 3.0, 3.0, 2.0, 3.0], np.float32)
    assert sampling.top_k_mask(logits, 2).tolist() == [False, True, True, False, False]
    assert sampling.top_k_mask(logits, None).all()


def test_text_dash_reads_stdin(tmp_path, text):
    path = tmp_path / "bob.safetensors"
    common = [sys.executable, "-m", "bob.cli.main"]
    done = subprocess.run([*common, "train", "--text", "-", "--steps", "5", "--backend", "cpu",
                           "-c", str(path), "--json"], input=text.read_bytes(),
                          capture_output=True, check=False, env=_source_env())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["data"] == "stdin"
    assert Checkpoint.load(path).data_digest == text_digest(text.read_bytes())
    done = subprocess.run([*common, "eval", "-c", str(path), "--text", "-", "--backend", "cpu",
                           "--json"], input=text.read_bytes(), capture_output=True, check=False,
                          env=_source_env())
    assert done.returncode == 0, done.stderr
    from_stdin = json.loads(done.stdout)
    from_file = api.evaluate(str(path), [str(text)], "cpu")
    assert from_stdin["nats_per_transition"] == from_file.nats


# -- doctor --------------------------------------------------------------------
def test_doctor_keeps_square_brackets(monkeypatch, capsys):
    from bob.host import doctor
    monkeypatch.setattr(doctor, "diagnose", lambda: [
        {"backend": "cuda", "usable": False, "details": "missing; pip install 'bob-bigram[cuda]'"}])
    assert main(["doctor"]) == 0
    assert "pip install 'bob-bigram[cuda]'" in capsys.readouterr().out


def test_a_stop_during_a_save_waits_for_the_save():
    """The race the subprocess test once met: a signal whose handler ran mid-save
    reported the previous checkpoint while the new one was already on disk."""
    from bob.errors import Interrupted
    from bob.host import stops

    recorded = []
    with pytest.raises(Interrupted) as caught, stops.held():
        stops.request_stop(signal.SIGTERM)
        recorded.append("saved")  # still runs: the stop waits for the block's end
    assert recorded == ["saved"] and caught.value.exit_status == 143
    with pytest.raises(Interrupted):
        stops.request_stop(signal.SIGINT)  # outside a held block: at once


def test_a_killed_runs_lock_does_not_block_the_next(tmp_path, text):
    path = tmp_path / "bob.safetensors"
    process = start_training(tmp_path, text)
    try:
        wait_for_updates(path, 2, process)
        process.kill()  # SIGKILL: no cleanup, the lock file stays
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert lock_path(path).exists()
    step = Checkpoint.load(path).step
    assert train_cpu("--text", str(text), "--resume", "--steps", "5", "-c", str(path)) == 0
    assert Checkpoint.load(path).step == step + 5 and not lock_path(path).exists()


def test_a_second_signal_stops_a_fresh_run_before_its_first_checkpoint(tmp_path, text):
    """The first SIGINT asks the run to finish its one long invocation; the second stops
    it at once: nothing was saved, nothing is written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bob.cli.main", "train", "--text", str(text), "--backend",
         "cpu", "-N", "100000", "--steps", "100000", "-c", str(tmp_path / "bob.safetensors")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=_source_env())
    try:
        deadline = time.monotonic() + 60
        while not lock_path(tmp_path / "bob.safetensors").exists():
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.02)
        time.sleep(0.3)  # into the invocation
        process.send_signal(signal.SIGINT)
        time.sleep(0.3)  # 100000 updates take minutes on the CPU: still in flight
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert err.decode().strip().splitlines()[-1] == (
        "bob: interrupted at update 100000; no checkpoint written by this run")
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]


def _source_env() -> dict[str, str]:
    """This environment with Bob's source on the path, for a Python of its own (the
    checkout's, not an installed Bob's: a relative PYTHONPATH means nothing in another
    directory)."""
    return {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "src")}


def _executable(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = _source_env()
    return subprocess.run([sys.executable, "-m", "bob", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_executable_ends_at_once_with_its_output_whole_and_its_status(tmp_path, text):
    """`bob` skips the interpreter's teardown: what it printed is all there (a large JSON
    plan through a pipe), the file it wrote is whole, and a refusal keeps its status and
    message."""
    plan = _executable("plan", "-N", "2000", "--json", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert len(plan.stdout) > 1_000_000 and len(json.loads(plan.stdout)["launches"]) > 2000
    trained = _executable("train", "--text", str(text), "--backend", "cpu", "--steps", "20",
                          "-N", "10", "--json", "-c", "bob.safetensors", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout)["steps"] == 20
    assert Checkpoint.load(str(tmp_path / "bob.safetensors")).step == 20
    refused = _executable("train", "--input", "missing.bin", "--backend", "cpu",
                          "-c", "new.safetensors", cwd=tmp_path)
    assert refused.returncode == 2
    assert "missing.bin" in refused.stderr and refused.stdout == ""


def test_the_executable_exits_at_once_only_when_nothing_else_runs():
    """A thread still running (a library's, a worker's) gets the interpreter's own exit,
    which waits for it: its last words are printed. The worker runs until the main thread
    has ended, so it is still running when the command returns, however slow the imports."""
    code = ("import threading, time\n"
            "from bob.cli.executable import entry, nothing_left_running\n"
            "print(nothing_left_running(), flush=True)\n"
            "def work():\n"
            "    while threading.main_thread().is_alive():\n"
            "        time.sleep(0.01)\n"
            "    print('worker done')\n"
            "worker = threading.Thread(target=work)\n"
            "worker.start()\n"
            "print(nothing_left_running(), flush=True)\n"
            "entry(['--version'])\n")
    env = _source_env()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert lines[:2] == ["True", "False"] and lines[-1] == "worker done"


def test_the_executable_flushes_what_is_buffered_before_it_ends():
    """Output still in the streams' buffers when the command returns (here a command that
    prints nothing more, with status 3) reaches the pipe before the process ends."""
    code = ("import sys\n"
            "import bob.cli.main as cli_main\n"
            "cli_main.main = lambda argv=None: 3\n"
            "sys.stdout.write('buffered, not yet flushed')\n"
            "from bob.cli.executable import entry\n"
            "entry([])\n")
    env = _source_env()
    env.pop("PYTHONUNBUFFERED", None)  # buffered, as a terminal's pipe is
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (3, "buffered, not yet flushed", "")


@pytest.mark.parametrize(("argv", "wanted"), [
    (["train", "--text", "notes.txt"], True),  # --backend auto: cuda where usable
    (["train", "--backend", "cuda"], True),
    (["generate", "--backend=auto", "--prompt", "a"], True),
    (["eval", "--backend", "cpu"], False),
    (["train", "--backend", "nv"], False),  # Bob's own command stream: no CUDA driver
    (["predict", "--backend=nv-sim"], False),
    (["train", "--help"], False),
    (["--version"], False),
    (["count", "corpus.txt"], False),
    (["plan", "--json"], False),
    ([], False),
])
def test_the_driver_is_warmed_up_only_for_commands_that_may_open_cuda(argv, wanted):
    from bob.cli import warmup

    assert warmup.wanted(argv) is wanted


def test_the_warm_up_makes_the_backends_first_calls_and_keeps_the_context(monkeypatch):
    """cuInit, device 0, its primary context retained and not released; a driver that
    refuses, or no bindings at all, stops it quietly."""
    import types

    from bob.cli import warmup

    calls: list[tuple] = []
    success, failure = "CUDA_SUCCESS", "CUDA_ERROR_NO_DEVICE"

    def fake(init_status):
        driver = types.SimpleNamespace(
            CUresult=types.SimpleNamespace(CUDA_SUCCESS=success),
            cuInit=lambda flags: calls.append(("cuInit", flags)) or (init_status,),
            cuDeviceGet=lambda ordinal: calls.append(("cuDeviceGet", ordinal)) or (
                success, "device 0"),
            cuDevicePrimaryCtxRetain=lambda device: calls.append(("retain", device)) or (
                success, "context"),
            cuDevicePrimaryCtxRelease=lambda device: calls.append(("release", device)))
        bindings = types.ModuleType("cuda.bindings")
        bindings.driver = driver
        monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
        monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)

    fake(success)
    assert warmup.warm_up() is True
    assert calls == [("cuInit", 0), ("cuDeviceGet", 0), ("retain", "device 0")]
    calls.clear()
    fake(failure)
    assert warmup.warm_up() is False and calls == [("cuInit", 0)]
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # not installed
    monkeypatch.delitem(sys.modules, "cuda.bindings.driver")
    assert warmup.warm_up() is False


def test_the_executable_imports_only_the_standard_library_before_the_warm_up():
    """What `python -m bob` has imported when the warm-up thread starts: no NumPy, no
    click, no part of Bob but the modules of its start and the stop signals' handler."""
    code = ("import sys\n"
            "from bob.cli import warmup\n"
            "seen = []\n"
            "warmup.start_for = lambda argv: seen.append(sorted(sys.modules)) or sys.exit(0)\n"
            "from bob.cli.executable import entry\n"
            "try:\n"
            "    entry(['train'])\n"
            "except SystemExit:\n"
            "    pass\n"
            "print('\\n'.join(seen[0]))\n")
    env = _source_env()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    modules = set(done.stdout.split())
    assert {"bob.cli.warmup", "bob.cli.executable"} <= modules
    assert not {"numpy", "click", "rich", "cuda", "bob.cli.main", "bob.backends"} & modules
    assert {name for name in modules if name.startswith("bob")} == {
        "bob", "bob.cli", "bob.cli.warmup", "bob.cli.executable", "bob.errors", "bob.host",
        "bob.host.stops"}  # the stop signals' handler is set first


@pytest.mark.gpu
def test_the_executable_on_cuda_trains_the_bytes_the_cpu_trains(tmp_path, text):
    """`python -m bob train --backend cuda`: the driver warmed up beside the imports, the
    process ended at once; its checkpoint is the CPU's, byte for byte."""
    for backend in ("cuda", "cpu"):
        done = _executable("train", "--text", str(text), "--backend", backend, "--steps",
                           "30", "-N", "10", "--json", "-c", f"{backend}.safetensors",
                           cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["backend"] == backend
    cuda, cpu = (Checkpoint.load(str(tmp_path / f"{name}.safetensors"))
                 for name in ("cuda", "cpu"))
    for name in ("parameters", "first_moment", "second_moment"):
        assert getattr(cuda, name).tobytes() == getattr(cpu, name).tobytes(), name
    assert cuda.step == cpu.step == 30
