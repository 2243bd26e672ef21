"""`--schedule auto`, `bob train`'s default: the fused schedule wherever Bob has fused
kernels for the run, the seed schedule for row shards, Bob's own kernels and the cpu
backend (quicker to compile), resolved by one function (bob.backends.resolve_schedule)
that says why; the table, --json and `bob plan` say it. `--schedule seed` stays the
reference and still runs.

    .venv/bin/python -m pytest -q tests/test_schedule_auto.py
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from bob import config
from bob.backends import BACKENDS, BackendChoice, ScheduleChoice, resolve_schedule
from bob.cli.main import cli, main
from bob.errors import BadInput
from bob.host import api
from bob.host import session as session_module
from bob.host.training import TrainRequest, run_config
from bob.kernels import signatures as sig
from bob.plan.certificate import certify
from bob.plan.placement import SM86, SM90
from bob.program.bob import BobConfig, build_plan
from bob.records.binary import InputRecord
from conftest import contents, train_cpu

FUSED = ScheduleChoice("fused", "auto: the seed schedule's bytes, faster")
SEED_FOR_SHARDS = ScheduleChoice("seed", "auto: row shards run the seed schedule")
SEED_FOR_OWN = ScheduleChoice("seed", "auto: Bob's own code has no fused kernel for the run")
SEED_ON_CPU = ScheduleChoice("seed", "auto: on cpu, quicker to compile")
GPU_BACKENDS = ("cuda", "nv")
GPT2_VOCAB = 50257

# -- the resolution ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", [*GPU_BACKENDS, "nv-sim"])
def test_auto_is_fused_and_says_why(backend):
    assert resolve_schedule("auto", backend) == FUSED
    assert FUSED.text == "fused (auto: the seed schedule's bytes, faster)"
    assert FUSED.to_json() == {"schedule": "fused",
                               "schedule_reason": "auto: the seed schedule's bytes, faster"}


def test_auto_on_the_cpu_backend_is_the_seed_schedule_and_says_why():
    assert resolve_schedule("auto", "cpu") == SEED_ON_CPU
    assert SEED_ON_CPU.text == "seed (auto: on cpu, quicker to compile)"


@pytest.mark.parametrize("backend", BACKENDS)
def test_auto_is_the_seed_schedule_where_there_are_no_fused_kernels(backend):
    assert resolve_schedule("auto", backend, row_shards=True) == SEED_FOR_SHARDS
    assert resolve_schedule("auto", backend, "own") == SEED_FOR_OWN
    assert resolve_schedule("auto", backend, "own", row_shards=True) == SEED_FOR_SHARDS
    assert resolve_schedule("auto", backend, "own", row_shards=True, own_fused=True) == \
        SEED_FOR_SHARDS


@pytest.mark.parametrize("backend", ["nv", "nv-sim"])
def test_auto_with_own_code_is_fused_where_own_code_covers_the_fused_plan(backend):
    assert resolve_schedule("auto", backend, "own", own_fused=True) == FUSED
    assert resolve_schedule("auto", backend, "nvrtc", own_fused=False) == FUSED


@pytest.mark.parametrize("named", config.SCHEDULES)
def test_a_schedule_asked_for_by_name_is_kept(named):
    for backend in BACKENDS:
        for kernels in config.KERNELS:
            assert resolve_schedule(named, backend, kernels) == \
                ScheduleChoice(named, "asked for")
        assert resolve_schedule(named, backend, row_shards=True).schedule == named


def test_an_unknown_schedule_and_an_unresolved_backend_are_refused():
    with pytest.raises(BadInput, match=r"^schedule must be one of auto, seed, fused, not "
                                       r"'turbo'$"):
        resolve_schedule("turbo", "cuda")
    with pytest.raises(ValueError, match="resolve the backend 'auto' before its schedule"):
        resolve_schedule("auto", "auto")


def test_a_plan_still_names_a_schedule_and_defaults_to_the_seed():
    assert BobConfig().schedule == "seed"
    with pytest.raises(BadInput, match="schedule must be one of seed, fused, not 'auto'"):
        BobConfig(schedule="auto")  # type: ignore[arg-type]


# -- the plans a run builds: V = 256 and GPT-2's 50257, no table allocated -------------------


def _hard(vocab: int) -> InputRecord:
    return InputRecord.hard(np.arange(1, vocab + 1, dtype=np.uint32) % vocab)


def _corpus(vocab: int) -> InputRecord:
    rows = np.arange(vocab, dtype=np.uint64)  # one successor a row: r -> r + 1
    keys = rows * np.uint64(vocab) + (rows + np.uint64(1)) % np.uint64(vocab)
    return InputRecord.sparse(vocab, keys, np.full(vocab, 1 / vocab, np.float32))


@pytest.mark.parametrize("vocab", [256, GPT2_VOCAB])
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize(("backend", "target"), [("cuda", SM90), ("cuda", SM86),
                                                 ("nv", SM90), ("nv-sim", SM90)])
def test_a_default_run_builds_the_fused_plan(tmp_path, vocab, mode, backend, target):
    request = TrainRequest(checkpoint=str(tmp_path / "c.safetensors"), backend=backend)
    record = _hard(vocab) if mode == "hard" else _corpus(vocab)
    bob_config, schedule = run_config(request, record, BackendChoice(backend, target))
    assert schedule == FUSED and bob_config.schedule == "fused"
    plan = build_plan(bob_config, target)  # plain data: addresses, no arena
    assert certify(plan).holds
    regions = {launch.region for launch in plan.launches}
    assert bob_config.fused_region(target) in regions and sig.ADAMW not in regions


def test_the_seed_schedule_asked_for_builds_the_seed_plan(tmp_path):
    request = TrainRequest(checkpoint=str(tmp_path / "c.safetensors"), schedule="seed")
    bob_config, schedule = run_config(request, _corpus(GPT2_VOCAB), BackendChoice("cuda", SM90))
    assert schedule == ScheduleChoice("seed", "asked for") and bob_config.schedule == "seed"
    plan = build_plan(bob_config, SM90)
    assert sum(launch.region == sig.ADAMW for launch in plan.launches) == bob_config.updates


def test_a_default_run_on_the_cpu_builds_the_seed_plan(tmp_path):
    request = TrainRequest(checkpoint=str(tmp_path / "c.safetensors"), backend="cpu")
    bob_config, schedule = run_config(request, _corpus(256), BackendChoice("cpu", SM86))
    assert schedule == SEED_ON_CPU and bob_config.schedule == "seed"


def test_own_kernels_build_the_seed_plan_where_own_code_has_no_fused_kernel(tmp_path):
    request = TrainRequest(checkpoint=str(tmp_path / "c.safetensors"), backend="nv",
                           kernels="own")
    own_nv = BackendChoice("nv", SM90, kernels="own")
    bob_config, schedule = run_config(request, _hard(4096), own_nv)  # the wide kernel: none
    assert schedule == SEED_FOR_OWN and bob_config.schedule == "seed"


@pytest.mark.parametrize(("limit", "expected"), [(None, FUSED), (128, SEED_FOR_OWN)])
def test_own_kernels_build_the_fused_plan_where_own_code_covers_it(tmp_path, monkeypatch,
                                                                     limit, expected):
    from bob.kernels import own

    monkeypatch.setitem(own.BUILDERS, sig.FUSED_HARD, own.BUILDERS[sig.ADAMW])
    if limit is not None:  # own code serves V <= limit only
        monkeypatch.setitem(own.VOCAB_LIMITS, sig.FUSED_HARD, limit)
    request = TrainRequest(checkpoint=str(tmp_path / "c.safetensors"), backend="nv",
                           kernels="own")
    bob_config, schedule = run_config(request, _hard(256), BackendChoice("nv", SM90,
                                                                         kernels="own"))
    assert schedule == expected and bob_config.schedule == expected.schedule


# -- small runs on this CPU: auto gives the seed schedule's bytes and says which ran -----------


@pytest.fixture
def built(monkeypatch) -> list[str]:
    """The schedule of every plan a Session builds, in order."""
    schedules: list[str] = []
    original = session_module.build_plan

    def recording(bob_config, *args, **kwargs):
        schedules.append(bob_config.schedule)
        return original(bob_config, *args, **kwargs)

    monkeypatch.setattr(session_module, "build_plan", recording)
    return schedules


def _train(capsys, built, checkpoint, *argv: str) -> tuple[dict, str, set[str]]:
    """`bob train --json` in this process: its summary, its table (stderr) and the
    schedules of the plans it built."""
    built.clear()
    assert main(["train", "-N", "4", "--steps", "12", "-c", str(checkpoint), "--json",
                 *argv]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err, set(built)


def test_auto_runs_fused_and_writes_the_seed_schedule_s_checkpoint(tmp_path, text, built,
                                                                     capsys):
    """nv-sim runs the plan's kernels on this CPU (the NumPy reference, from the command
    stream's bytes): auto's fused run leaves the bytes of the seed schedule's run there and
    on the cpu backend."""
    runs = {name: _train(capsys, built, tmp_path / f"{name}.safetensors", "--text",
                         str(text), *argv)
            for name, argv in (("auto", ["--backend", "nv-sim"]),
                               ("seed", ["--backend", "nv-sim", "--schedule", "seed"]),
                               ("cpu", ["--backend", "cpu", "--schedule", "seed"]))}
    auto, seed, cpu = runs["auto"], runs["seed"], runs["cpu"]
    assert auto[2] == {"fused"} and seed[2] == cpu[2] == {"seed"}  # an explicit seed runs
    checkpoints = {name: (tmp_path / f"{name}.safetensors").read_bytes() for name in runs}
    assert checkpoints["auto"] == checkpoints["seed"] == checkpoints["cpu"]
    for key in ("loss", "initial_loss", "global_step", "optimum"):
        assert auto[0][key] == seed[0][key] == cpu[0][key]
    assert (auto[0]["schedule"], auto[0]["schedule_reason"]) == \
        ("fused", "auto: the seed schedule's bytes, faster")
    assert (seed[0]["schedule"], seed[0]["schedule_reason"]) == ("seed", "asked for")
    assert _table_row(auto[1], "schedule") == "fused (auto: the seed schedule's bytes, faster)"
    assert _table_row(seed[1], "schedule") == "seed (asked for)"


def test_auto_on_the_cpu_backend_runs_the_seed_schedule_and_says_why(tmp_path, text, built,
                                                                      capsys):
    summary, table, schedules = _train(capsys, built, tmp_path / "c.safetensors", "--text",
                                       str(text), "--backend", "cpu")
    assert schedules == {"seed"}
    assert (summary["schedule"], summary["schedule_reason"]) == \
        ("seed", "auto: on cpu, quicker to compile")
    assert _table_row(table, "schedule") == "seed (auto: on cpu, quicker to compile)"
    fused, _, schedules = _train(capsys, built, tmp_path / "f.safetensors", "--text",
                                 str(text), "--backend", "cpu", "--schedule", "fused")
    assert schedules == {"fused"} and fused["schedule_reason"] == "asked for"
    assert (tmp_path / "c.safetensors").read_bytes() == (tmp_path / "f.safetensors").read_bytes()


def test_a_resumed_auto_run_continues_the_seed_run_s_bytes(tmp_path, text, built, capsys):
    """A checkpoint carries no schedule: either resumes the other's run, byte for byte."""
    mixed, alone = tmp_path / "mixed.safetensors", tmp_path / "alone.safetensors"
    ran = []
    for checkpoint, steps, asked in ((mixed, "5", ["--schedule", "seed"]),
                                     (mixed, "5", ["--resume"]),
                                     (alone, "10", ["--schedule", "seed"])):
        built.clear()
        assert main(["train", "--backend", "nv-sim", "-N", "5", "--text", str(text),
                     "--steps", steps, "-c", str(checkpoint), *asked]) == 0
        ran.append(set(built))
    capsys.readouterr()
    assert ran == [{"seed"}, {"fused"}, {"seed"}]
    assert mixed.read_bytes() == alone.read_bytes()


@pytest.mark.parametrize(("backend", "schedule"), [("nv-sim", FUSED), ("cpu", SEED_ON_CPU)])
def test_the_api_trains_with_auto(tmp_path, text, built, backend, schedule):
    report = api.train([str(text)], steps=4, updates_per_invocation=2, backend=backend,
                       checkpoint=str(tmp_path / "c.safetensors"))
    assert report.schedule == schedule and set(built) == {schedule.schedule}
    assert report.to_json()["schedule"] == schedule.schedule


def test_row_shards_run_the_seed_schedule_and_say_why(tmp_path, text, built, capsys):
    assert train_cpu("--text", str(text), "--steps", "5", "-c", str(tmp_path / "sh.st"),
                     "--shards", "2", "--json") == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert (summary["schedule"], summary["schedule_reason"]) == \
        ("seed", "auto: row shards run the seed schedule")
    assert _table_row(captured.err, "schedule") == "seed (auto: row shards run the seed schedule)"


def test_a_resumed_sharded_checkpoint_refuses_the_fused_schedule(tmp_path, text, capsys):
    checkpoint = tmp_path / "sh.st"
    assert train_cpu("--text", str(text), "--steps", "5", "-c", str(checkpoint),
                     "--shards", "2") == 0
    before = contents(tmp_path)
    capsys.readouterr()
    assert train_cpu("--text", str(text), "--steps", "5", "-c", str(checkpoint), "--resume",
                     "--schedule", "fused") == 2
    assert capsys.readouterr().err == (f"bob: {checkpoint} is sharded; row shards do not take "
                                       "--schedule fused\n")
    assert contents(tmp_path) == before
    assert train_cpu("--text", str(text), "--steps", "5", "-c", str(checkpoint),
                     "--resume") == 0  # auto: the seed schedule


def test_own_kernels_on_nv_sim_run_the_seed_schedule_with_auto(tmp_path, text, built, capsys,
                                                              monkeypatch):
    from bob.kernels import own

    monkeypatch.setitem(own.VOCAB_LIMITS, sig.FUSED_CORPUS, 128)  # no own fused kernel at 256
    assert main(["train", "--text", str(text), "--backend", "nv-sim", "--kernels", "own",
                 "--steps", "2", "-N", "2", "-c", str(tmp_path / "c.safetensors")]) == 0
    assert set(built) == {"seed"}
    assert _table_row(capsys.readouterr().out, "schedule") == \
        "seed (auto: Bob's own code has no fused kernel for the run)"


def _table_row(output: str, label: str) -> str:
    """The value of the run table's row `label`."""
    rows = [line.split("│") for line in output.splitlines() if line.startswith("│")]
    (value,) = [row[2].strip() for row in rows if row[1].strip() == label]
    return value


# -- bob plan shows the seed's program and says what bob train runs ---------------------------


@pytest.mark.parametrize(("argv", "trained"), [
    ([], "fused (auto: the seed schedule's bytes, faster)"),  # on nv, whose plan it shows
    (["--kernels", "own", "-V", "4096"],  # the wide fused kernel: Bob has no own code for it
     "seed (auto: Bob's own code has no fused kernel for the run)"),
    (["--shards", "2", "-V", "64"], "seed (auto: row shards run the seed schedule)"),
])
def test_plan_shows_the_seed_program_and_names_train_s_schedule(argv, trained, capsys):
    assert main(["plan", "-N", "2", *argv]) == 0
    captured = capsys.readouterr()
    note = f"schedule: seed shown (the reference); bob train on nv runs {trained}"
    assert note in captured.err.splitlines()
    assert "bob-adamw" in captured.out and "bob-fused-train" not in captured.out


@pytest.mark.parametrize("argv", [["--schedule", "seed"], ["--schedule", "fused"], ["--json"]])
def test_plan_with_a_schedule_or_json_adds_no_schedule_note(argv, capsys):
    assert main(["plan", "-N", "2", *argv]) == 0
    assert "schedule:" not in capsys.readouterr().err


def test_train_help_says_what_auto_resolves_to():
    result = CliRunner().invoke(cli, ["train", "--help"], terminal_width=400)
    text = " ".join(result.output.split())
    assert ("auto: fused, but seed on cpu (quicker to compile there), for row shards and for "
            "--kernels own where Bob has no own fused kernel for the run") in text
    assert "[seed|fused|auto]" not in text and "[auto|seed|fused]" in text
    plan_help = " ".join(CliRunner().invoke(cli, ["plan", "--help"], terminal_width=400)
                         .output.split())
    assert "[seed|fused]" in plan_help and "[default: seed]" in plan_help


def test_a_checkpoint_records_no_schedule(tmp_path, text, capsys):
    from safetensors import safe_open

    checkpoint = tmp_path / "c.safetensors"
    assert train_cpu("--text", str(text), "--steps", "2", "-c", str(checkpoint)) == 0
    capsys.readouterr()
    with safe_open(str(checkpoint), "np") as opened:
        metadata = opened.metadata()
    assert not any("schedule" in key for key in metadata)
    assert not any(value in ("fused", "seed") for value in metadata.values())
