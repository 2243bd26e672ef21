"""`bob train` as a whole run: when checkpoints are saved (SavePolicy) and that each one
resumes to the bytes of a run never stopped, validation on the device, the first and the
second SIGINT/SIGTERM, the memory estimate's refusal; and the token-model verbs beside
it: `generate --ids`, `export`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from bob.backends import cpu as cpu_module
from bob.backends.base import host_memory_available, require_memory
from bob.backends.cpu import CpuBackend
from bob.cli.main import main
from bob.config import CHECKPOINT_TENSORS, Hyper
from bob.errors import BadInput
from bob.host import sampling, training
from bob.host.training import SMALL_CHECKPOINT_BYTES, SavePolicy, TrainRequest
from bob.host.writer import BackgroundWriter
from bob.program.bob import BobConfig, build_plan
from bob.records.checkpoint import Checkpoint
from conftest import listing

TEXT = b"the cat sat on the mat; the rat ate the hat. " * 20
VALIDATION = b"a bat sat on the hat of the cat. " * 8


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "a.txt"
    path.write_bytes(TEXT)
    return path


@pytest.fixture
def val(tmp_path: Path) -> Path:
    path = tmp_path / "val.txt"
    path.write_bytes(VALIDATION)
    return path


def train(*argv: object) -> int:
    return main(["train", "--backend", "cpu", *map(str, argv)])


def assert_same_tables(got: Checkpoint, want: Checkpoint) -> None:
    assert got.step == want.step
    for name in CHECKPOINT_TENSORS:
        assert getattr(got, name).tobytes() == getattr(want, name).tobytes(), name


class InlineWriter(BackgroundWriter):
    """The checkpoint writer running each save at once, in the caller's thread: no save is
    superseded, so the steps saved are exactly those the policy chose. Each file saved is
    copied aside as CKPT.<step>."""


    def submit(self, job, supersede: bool = False, keep: bool = False) -> None:
        job()


@pytest.fixture
def saves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The steps of the checkpoints written, in order (each file copied to CKPT.<step>)."""
    steps: list[int] = []
    save = Checkpoint.save

    def kept_aside(self: Checkpoint, where: str) -> None:
        save(self, where)
        steps.append(self.step)
        shutil.copyfile(where, f"{where}.{self.step}")

    monkeypatch.setattr(Checkpoint, "save", kept_aside)
    monkeypatch.setattr(training, "BackgroundWriter", InlineWriter)
    return steps


# -- when a run saves ----------------------------------------------------------------
def test_the_default_policy_saves_a_small_checkpoint_every_invocation_and_a_large_one_by_time(
        tmp_path: Path) -> None:
    request = TrainRequest(steps=10, checkpoint=str(tmp_path / "c.safetensors"))
    assert SavePolicy.of(request, SMALL_CHECKPOINT_BYTES) == SavePolicy(True)
    assert SavePolicy.of(request, SMALL_CHECKPOINT_BYTES + 1) == SavePolicy(
        False, training.DEFAULT_SAVE_SECONDS)
    asked = TrainRequest(steps=10, checkpoint=str(tmp_path / "c.safetensors"),
                         save_every_seconds=30.0, save_every_updates=500)
    for size in (1, SMALL_CHECKPOINT_BYTES + 1):  # what is asked for holds at any size
        assert SavePolicy.of(asked, size) == SavePolicy(False, 30.0, 500)
    by_updates = SavePolicy(False, None, 6)
    assert [by_updates.due(done, 0, 1e9) for done in (5, 6)] == [False, True]
    by_time = SavePolicy(False, 30.0)
    assert [by_time.due(10**6, 0, seconds) for seconds in (29.9, 30.0)] == [False, True]


def test_the_default_policy_saves_every_invocation_of_a_small_checkpoint(tmp_path, text,
                                                                         saves):
    path = tmp_path / "bob.safetensors"
    assert train("--text", text, "--steps", 10, "-N", 2, "-c", path) == 0
    assert saves == [2, 4, 6, 8, 10]


def test_eval_points_leave_the_saves_at_the_invocation_grain(tmp_path, text, saves):
    """--eval-every 3 with -N 4 ends invocations every update (gcd 1), yet the checkpoint
    is saved where -N 4 alone saves it; --keep-best saves the other file at eval points."""
    path = tmp_path / "bob.safetensors"
    assert train("--text", text, "--steps", 10, "-N", 4, "--eval-every", 3, "-c", path) == 0
    assert saves == [4, 8, 10]
    saves.clear()
    validation = tmp_path / "val.txt"
    validation.write_bytes(Path(text).read_bytes()[:200])
    assert train("--text", text, "--steps", 10, "-N", 4, "--eval-every", 3, "--keep-best",
                 "--val-text", validation, "-c", path, "--overwrite") == 0
    best = Checkpoint.load(tmp_path / "bob.best.safetensors")
    # The validation text is training text: its loss falls at every eval point.
    assert saves == [3, 4, 6, 8, 9, 10, 10] and best.step == 10


@pytest.mark.parametrize(("policy", "per_invocation", "saved"), [
    (("--save-every-updates", 6), 2, [6, 12, 18, 20]),
    # 3 + 3 + 3 + 1: the invocation before the shorter last is saved too (the last one's
    # plan is another, which starts from the file).
    (("--save-every-updates", 4), 3, [6, 9, 10]),
    (("--save-every", 3600), 2, [20]),
    (("--save-every", 1e-9), 5, [5, 10, 15, 20]),
])
def test_a_policy_saved_checkpoint_resumes_to_the_bytes_of_a_straight_run(
        tmp_path, text, saves, policy, per_invocation, saved):
    steps = 20 if per_invocation != 3 else 10
    path = tmp_path / "bob.safetensors"
    assert train("--text", text, "--steps", steps, "-N", per_invocation, "-c", path,
                 *policy) == 0
    assert saves == saved
    straight = tmp_path / "straight.safetensors"
    assert train("--text", text, "--steps", steps, "-N", 7, "-c", straight) == 0
    whole = Checkpoint.load(straight)
    assert_same_tables(Checkpoint.load(path), whole)
    for step in saved[:-1]:  # each file saved on the way resumes to the same end
        copy = tmp_path / f"bob.safetensors.{step}"
        assert Checkpoint.load(copy).step == step
        assert train("--text", text, "--resume", "--steps", steps - step, "-N",
                     per_invocation, "-c", copy) == 0
        assert_same_tables(Checkpoint.load(copy), whole)


# -- validation on the device ----------------------------------------------------------
def evaluate(path: Path, data: Path, capsys) -> float:
    capsys.readouterr()
    assert main(["eval", "-c", str(path), "--text", str(data), "--backend", "cpu",
                 "--json"]) == 0
    return json.loads(capsys.readouterr().out)["nats_per_transition"]


def test_validation_on_the_device_is_bob_eval_and_has_a_point_per_invocation(
        tmp_path, text, val, saves, capsys):
    path = tmp_path / "bob.safetensors"
    assert train("--text", text, "--val", val, "--steps", 10, "-N", 4, "-c", path,
                 "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    state = Checkpoint.load(path)
    # The start, then one point per invocation (4 + 4 + 2).
    assert [step for step, _ in state.val_history] == [0, 4, 8, 10]
    assert summary["val_loss"] == state.val_history[-1][1]
    for step, loss in state.val_history[1:]:
        assert evaluate(tmp_path / f"bob.safetensors.{step}", val, capsys) == loss, step
    zeros = tmp_path / "zeros.safetensors"
    Checkpoint.zeros(256, Hyper(), "corpus").save(zeros)
    assert evaluate(zeros, val, capsys) == state.val_history[0][1]
    # A resumed run continues the history: no second starting point.
    assert train("--text", text, "--val", val, "--resume", "--steps", 5, "-N", 4,
                 "-c", path) == 0
    resumed = Checkpoint.load(path)
    assert resumed.val_history[:4] == state.val_history
    assert [step for step, _ in resumed.val_history[4:]] == [14, 15]
    assert evaluate(path, val, capsys) == resumed.val_history[-1][1]
    # --steps 0 reports the validation loss of the checkpoint as it is.
    capsys.readouterr()
    assert train("--text", text, "--val", val, "--resume", "--steps", 0, "-c", path,
                 "--json") == 0
    assert json.loads(capsys.readouterr().out)["val_loss"] == resumed.val_history[-1][1]


# -- stops -----------------------------------------------------------------------------
def signal_during_runs(monkeypatch: pytest.MonkeyPatch, at: int, *signals: int) -> None:
    """Send this process `signals`, one after another, as the `at`-th run of submissions
    (from 1: one per invocation on the CPU) begins."""
    runs = [0]
    run = CpuBackend._run

    def signalled(self: CpuBackend, submissions: range) -> None:
        runs[0] += 1
        if runs[0] == at:
            for signum in signals:
                os.kill(os.getpid(), signum)  # its handler runs before the next line
        run(self, submissions)

    monkeypatch.setattr(CpuBackend, "_run", signalled)


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_first_signal_finishes_the_invocation_in_flight_and_saves_it(
        tmp_path, text, capsys, monkeypatch, signum, status):
    path = tmp_path / "bob.safetensors"
    signal_during_runs(monkeypatch, 3, signum)  # updates 5 and 6 run meanwhile
    assert train("--text", text, "--steps", 20, "-N", 2, "-c", path) == status
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "bob: interrupted at update 6; checkpoint at update 6 kept"
    assert Checkpoint.load(path).step == 6
    assert listing(tmp_path) == ["a.txt", "bob.safetensors"]  # no lock, no temporary
    monkeypatch.undo()
    assert train("--text", text, "--resume", "--steps", 4, "-N", 2, "-c", path) == 0
    straight = tmp_path / "straight.safetensors"
    assert train("--text", text, "--steps", 10, "-N", 2, "-c", straight) == 0
    resumed, whole = Checkpoint.load(path), Checkpoint.load(straight)
    assert_same_tables(resumed, whole)
    assert resumed.history == whole.history


def test_the_first_signal_saves_an_invocation_the_policy_would_not_have(
        tmp_path, text, capsys, monkeypatch, saves):
    """With a period that is not due, the invocation the stop finished is saved from the
    arena all the same: the file is the state the message names."""
    path = tmp_path / "bob.safetensors"
    signal_during_runs(monkeypatch, 2, signal.SIGINT)
    assert train("--text", text, "--steps", 20, "-N", 2, "-c", path, "--save-every",
                 3600) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "bob: interrupted at update 4; checkpoint at update 4 kept")
    assert saves == []  # streamed from the arena, not read back as tables
    monkeypatch.undo()
    straight = tmp_path / "straight.safetensors"
    assert train("--text", text, "--steps", 4, "-N", 2, "-c", straight) == 0
    assert_same_tables(Checkpoint.load(path), Checkpoint.load(straight))


def test_a_second_signal_stops_at_once_keeping_the_last_file(tmp_path, text, capsys,
                                                             monkeypatch):
    path = tmp_path / "bob.safetensors"
    signal_during_runs(monkeypatch, 2, signal.SIGINT, signal.SIGINT)
    assert train("--text", text, "--steps", 20, "-N", 2, "-c", path) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "bob: interrupted at update 4; checkpoint at update 2 kept")
    assert Checkpoint.load(path).step == 2
    assert listing(tmp_path) == ["a.txt", "bob.safetensors"]


def test_a_second_signal_in_the_first_invocation_writes_nothing(tmp_path, text, capsys,
                                                                monkeypatch):
    signal_during_runs(monkeypatch, 1, signal.SIGTERM, signal.SIGTERM)
    assert train("--text", text, "--steps", 20, "-N", 2, "-c",
                 tmp_path / "bob.safetensors") == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "bob: interrupted at update 2; no checkpoint written by this run")
    assert listing(tmp_path) == ["a.txt"]


# -- memory honesty --------------------------------------------------------------------
def test_host_memory_available_reads_mem_available(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemAvailable:    1234567 kB\n")
    assert host_memory_available(str(meminfo)) == 1234567 * 1024
    meminfo.write_text("MemTotal:       16000000 kB\n")
    assert host_memory_available(str(meminfo)) is None
    assert host_memory_available(str(tmp_path / "none")) is None
    require_memory("cpu", "host memory", 10, None)  # nothing known: nothing refused
    require_memory("cpu", "host memory", 10, 10)
    with pytest.raises(BadInput, match=r"^the cpu backend needs 2.79 GiB of host memory for "
                                       r"this plan; 2.33 GiB is available$"):
        require_memory("cpu", "host memory", 3 * 10**9, 25 * 10**8)


@pytest.mark.parametrize("backend", ["cpu", "nv-sim"])
def test_a_plan_larger_than_the_host_memory_is_refused_before_anything_is_written(
        tmp_path, monkeypatch, capsys, backend):
    vocab = 2048
    tokens = tmp_path / "train.bin"
    np.random.default_rng(1).integers(0, vocab, 20_000).astype("<u2").tofile(tokens)
    available = 50 * 10**6
    monkeypatch.setattr(cpu_module, "host_memory_available", lambda: available)
    before = listing(tmp_path)
    status = main(["train", "--tokens", str(tokens), "--vocab", str(vocab), "--backend",
                   backend, "--steps", "2", "-N", "2", "-c", str(tmp_path / "bob.safetensors"),
                   "--tables", "dense"])
    # The plan line (said before the backend starts), then the refusal.
    err = capsys.readouterr().err.strip().split("\n", 1)[1]
    assert status == 2, err
    found = re.fullmatch(rf"bob: the {backend} backend needs (\d+(?:\.\d+)?) MiB of host "
                         r"memory for this plan; 47\.7 MiB is available", err)
    assert found, err
    assert float(found.group(1)) > 4 * 4 * vocab * vocab / 2**20  # the arena's tables at least
    assert listing(tmp_path) == before  # no checkpoint, no lock file


def test_the_cpu_estimate_is_the_arena_and_one_table(monkeypatch) -> None:
    config = BobConfig(vocab=512, prompts=0, updates=1, mode="corpus", pairs=1000)
    plan = build_plan(config)
    need = plan.address_map.arena.bytes + 4 * 512 * 512
    monkeypatch.setattr(cpu_module, "host_memory_available", lambda: need)
    CpuBackend(plan).close()  # exactly enough
    monkeypatch.setattr(cpu_module, "host_memory_available", lambda: need - 1)
    with pytest.raises(BadInput, match="the cpu backend needs"):
        CpuBackend(plan)


# -- token models: generate --ids and export -------------------------------------------
@pytest.fixture
def token_model(tmp_path: Path) -> Path:
    """A V = 300 model of a token sequence: token 7 is followed by 9 or 11, and so on."""
    rng = np.random.default_rng(3)
    tokens = np.empty(6000, "<u2")
    tokens[0] = 7
    for i in range(1, len(tokens)):
        previous = int(tokens[i - 1])
        tokens[i] = (previous * 3 + int(rng.integers(0, 5)) * 2 + 1) % 300
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    model = tmp_path / "tokens.safetensors"
    assert main(["train", "--tokens", str(path), "--vocab", "300", "--backend", "cpu",
                 "--steps", "60", "-N", "30", "-c", str(model)]) == 0
    return model


def generate_ids(model: Path, capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(["generate", "-c", str(model), "--backend", "cpu", *argv]) == 0
    return capsys.readouterr().out


def test_generate_ids_samples_the_checkpoints_rows_with_a_seed(token_model, capsys):
    argv = ("--ids", "7 12", "-n", "40", "-t", "1.5", "--top-k", "4", "--seed", "9")
    out = generate_ids(token_model, capsys, *argv)
    assert out == generate_ids(token_model, capsys, *argv)  # the same seed, the same ids
    ids = [int(word) for word in out.split()]
    assert ids[:2] == [7, 12] and len(ids) == 42
    rows = Checkpoint.load(token_model).parameters
    last, expected = 12, []
    for position in range(40):
        last = sampling.sample_row(rows[last], 1.5, sampling.uniform(9, position), 4)
        expected.append(last)
    assert ids[2:] == expected
    for previous, chosen in zip(ids[1:], ids[2:], strict=False):
        assert sampling.top_k_mask(rows[previous], 4)[chosen]
    other = generate_ids(token_model, capsys, *argv[:-1], "10")
    assert other != out  # another seed draws another sequence
    raw = generate_ids(token_model, capsys, *argv, "--raw")
    assert raw == out.rstrip("\n") and not raw.endswith("\n")
    as_json = json.loads(generate_ids(token_model, capsys, *argv, "--json"))
    assert as_json == {"ids": ids}


def test_greedy_generate_ids_is_predict_ids_again_and_again(token_model, capsys):
    ids = [int(word) for word in generate_ids(token_model, capsys, "--ids", "5", "-n",
                                              "12", "-t", "0").split()]
    for previous, chosen in zip(ids, ids[1:], strict=False):
        capsys.readouterr()
        assert main(["predict", "-c", str(token_model), "--backend", "cpu", "--ids",
                     str(previous), "--json"]) == 0
        predicted = json.loads(capsys.readouterr().out)
        assert chosen == predicted[0]["next"], (previous, predicted)
    capsys.readouterr()
    assert main(["generate", "-c", str(token_model), "--ids", "300", "-n", "2"]) == 2
    assert "token id 300 is not in [0, V=300)" in capsys.readouterr().err


def test_export_writes_the_parameters_any_safetensors_reader_loads(token_model, tmp_path,
                                                                   capsys):
    out = tmp_path / "parameters.safetensors"
    capsys.readouterr()
    assert main(["export", "-c", str(token_model), "-o", str(out)]) == 0
    size = out.stat().st_size
    assert capsys.readouterr().out.strip() == (
        f"{out}: parameters of {token_model} ({size:,} bytes)")
    tensors = load_file(str(out))
    stored = Checkpoint.load(token_model)
    assert list(tensors) == ["parameters"]
    assert tensors["parameters"].dtype == np.float32 and tensors["parameters"].shape == (300,
                                                                                          300)
    assert tensors["parameters"].tobytes() == stored.parameters.tobytes()
    with safe_open(str(out), framework="numpy") as file:
        metadata = file.metadata()
    assert metadata["format"] == "bob-parameters"
    assert (metadata["vocab"], metadata["step"]) == ("300", "60")
    assert metadata["data_digest"] == stored.data_digest
    assert size == 8 + struct_length(out) + 4 * 300 * 300


def struct_length(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[:8], "little")


@pytest.mark.parametrize(("target", "message"), [
    ("missing/p.safetensors", "directory {dir}/missing does not exist"),
    ("plots", "{dir}/plots' is a directory"),  # click's usage error
    ("kept.safetensors", "{dir}/kept.safetensors: exists; pass --overwrite to replace it"),
])
def test_export_refuses_a_bad_output_and_writes_nothing(token_model, tmp_path, capsys,
                                                        target, message):
    (tmp_path / "plots").mkdir()
    (tmp_path / "kept.safetensors").write_bytes(b"keep me")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(["export", "-c", str(token_model), "-o", str(tmp_path / target)]) == 2
    err = capsys.readouterr().err
    assert message.format(dir=tmp_path) in err, err
    assert not err.startswith("bob: ") or len(err.strip().splitlines()) == 1, err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == []
    assert main(["export", "-c", str(token_model), "-o", str(tmp_path / "kept.safetensors"),
                 "--overwrite"]) == 0
    assert load_file(str(tmp_path / "kept.safetensors"))["parameters"].shape == (300, 300)


def test_export_refuses_what_is_not_a_checkpoint(tmp_path, capsys):
    out = tmp_path / "p.safetensors"
    (tmp_path / "text.txt").write_text("hello")
    for source, message in ((tmp_path / "none.safetensors", "no such file"),
                            (tmp_path / "text.txt", "not a readable safetensors file")):
        assert main(["export", "-c", str(source), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"{source}: " in err and message in err, err
    assert listing(tmp_path) == ["text.txt"]
