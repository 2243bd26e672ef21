"""`--submission auto`: chained on the backends that run Bob's command stream, per-launch
elsewhere, resolved by one function (bob.backends.resolve_submission, from the backend
registry) for every command.

    .venv/bin/python -m pytest -q tests/test_submission_auto.py
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from safetensors import safe_open

from bob import config
from bob.backends import resolve_submission
from bob.cli.main import cli, main
from bob.errors import BadInput
from bob.host import api
from bob.host import session as session_module
from bob.program.bob import BobConfig, build_plan

# -- the resolution ------------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "policy"), [
    ("cpu", "per-launch"), ("cuda", "per-launch"), ("nv-sim", "chained"), ("nv", "chained"),
])
def test_auto_is_chained_exactly_on_the_command_stream_backends(backend, policy):
    assert resolve_submission("auto", backend) == policy
    for named in config.SUBMISSION_POLICIES:  # a policy asked for by name is kept
        assert resolve_submission(named, backend) == named


def test_auto_without_a_backend_is_the_plan_default_and_a_pair_shares_the_stream_policy():
    assert resolve_submission("auto") == config.DEFAULT_SUBMISSION_POLICY == "per-launch"
    assert resolve_submission("auto", "cpu", "nv-sim") == "chained"
    assert resolve_submission("auto", "nv", "cuda") == "chained"
    assert resolve_submission("auto", "cpu", "cuda") == "per-launch"


def test_an_unknown_policy_and_an_unresolved_backend_are_refused():
    with pytest.raises(BadInput, match=r"^submission must be one of auto, per-launch, "
                                       r"chained, not 'batched'$"):
        resolve_submission("batched", "nv")
    with pytest.raises(ValueError, match="resolve the backend 'auto' before"):
        resolve_submission("auto", "auto")


def test_the_plan_default_stays_per_launch():
    assert BobConfig().submission == "per-launch"
    assert build_plan(BobConfig(updates=2)).submission_policy == "per-launch"


# -- what each command builds ---------------------------------------------------------------


@pytest.fixture
def built(monkeypatch) -> list[str]:
    """The submission policy of every plan a Session builds, in order."""
    policies: list[str] = []
    original = session_module.build_plan

    def recording(bob_config, *args, **kwargs):
        policies.append(bob_config.submission)
        return original(bob_config, *args, **kwargs)

    monkeypatch.setattr(session_module, "build_plan", recording)
    return policies


@pytest.mark.parametrize(("backend", "asked", "policy"), [
    ("cpu", [], "per-launch"),
    ("nv-sim", [], "chained"),
    ("cpu", ["--submission", "chained"], "chained"),
    ("nv-sim", ["--submission", "per-launch"], "per-launch"),
    ("cpu", ["--submission", "auto"], "per-launch"),
])
def test_train_builds_the_resolved_policy(backend, asked, policy, built, tmp_path, capsys):
    checkpoint = tmp_path / "c.safetensors"
    assert main(["train", "--backend", backend, "--steps", "2", "-N", "2",
                 "--checkpoint", str(checkpoint), *asked]) == 0
    capsys.readouterr()
    assert built and set(built) == {policy}


def test_predict_and_eval_follow_the_backend(built, tmp_path, capsys):
    checkpoint = str(tmp_path / "c.safetensors")
    assert main(["train", "--backend", "cpu", "--steps", "1", "-N", "1",
                 "--checkpoint", checkpoint]) == 0
    text = tmp_path / "t.txt"
    text.write_bytes(b"abcabcab")
    for backend, policy in (("cpu", "per-launch"), ("nv-sim", "chained")):
        built.clear()
        assert main(["predict", "--backend", backend, "-c", checkpoint, "ab"]) == 0
        assert main(["eval", "--backend", backend, "-c", checkpoint, "--text", str(text)]) == 0
        assert built and set(built) == {policy}, backend
    capsys.readouterr()


def test_api_train_resolves_auto_and_refuses_an_unknown_policy(built, tmp_path):
    checkpoint = tmp_path / "c.safetensors"
    api.train(steps=2, updates_per_invocation=2, checkpoint=str(checkpoint), backend="nv-sim")
    assert set(built) == {"chained"}
    with pytest.raises(BadInput, match=r"^submission must be one of auto, per-launch, "
                                       r"chained, not 'batched'$"):
        api.train(steps=2, checkpoint=str(tmp_path / "d.safetensors"), backend="cpu",
                  submission="batched")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.safetensors"]


def test_check_shares_the_chained_plan_when_either_backend_runs_the_stream(capsys):
    assert main(["check", "--backends", "cpu,nv-sim", "--steps", "2", "-N", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["submission"] == "chained" and report["identical"] is True
    assert main(["check", "--backends", "cpu,cpu", "--steps", "2", "-N", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["submission"] == "per-launch"
    assert main(["check", "--backends", "nv-sim,cpu", "--steps", "2", "-N", "2"]) == 0
    assert "; chained submissions)" in capsys.readouterr().out


# -- nothing persisted depends on the policy -------------------------------------------------


def _train(backend: str, checkpoint, steps: int, *more: str) -> None:
    assert main(["train", "--backend", backend, "--steps", str(steps), "-N", "2",
                 "--checkpoint", str(checkpoint), *more]) == 0


@pytest.mark.parametrize("first, then", [("nv-sim", "cpu"), ("cpu", "nv-sim")])
def test_a_checkpoint_resumes_across_policies(first, then, built, tmp_path, capsys):
    """Chained on nv-sim then per-launch on cpu (and the reverse) writes the checkpoint
    that cpu alone writes: a checkpoint holds no plan and no policy."""
    mixed, alone = tmp_path / "mixed.safetensors", tmp_path / "alone.safetensors"
    _train(first, mixed, 4)
    _train(then, mixed, 4, "--resume")
    assert built[0] != built[-1]  # both policies did run
    _train("cpu", alone, 4)
    _train("cpu", alone, 4, "--resume")
    capsys.readouterr()
    assert mixed.read_bytes() == alone.read_bytes()
    with safe_open(str(mixed), "np") as opened:
        metadata = opened.metadata()
    assert not [key for key in metadata if "submission" in key or "plan" in key]
    assert not any(value in ("chained", "per-launch") for value in metadata.values())


# -- bob plan: auto is the stream's policy, and says so ----------------------------------------

# Where --schedule is left out `bob plan` says, before the submission's note, which schedule
# bob train runs (tests/test_schedule_auto.py).
SCHEDULE_NOTE = ("schedule: seed shown (the reference); bob train on nv runs fused (auto: the "
                 "seed schedule's bytes, faster)\n")
CHAINED_NOTE = "submission: auto is chained (the nv backend's default)\n"


def test_plan_disasm_default_is_the_chained_stream_and_says_so(capsys):
    assert main(["plan", "-N", "2", "-P", "1", "--disasm"]) == 0
    captured = capsys.readouterr()
    assert captured.err == SCHEDULE_NOTE + CHAINED_NOTE
    plan = build_plan(BobConfig(prompts=1, updates=2, submission="chained"))
    assert "(chained submissions)" in captured.out
    assert captured.out.count("GPFIFO entry") == plan.submission_count + 1


def test_plan_emit_default_writes_the_chained_stream(tmp_path, capsys):
    out = tmp_path / "components"
    assert main(["plan", "-N", "2", "--emit", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err == SCHEDULE_NOTE + CHAINED_NOTE
    assert json.loads((out / "index.json").read_text())["submission_policy"] == "chained"
    assert main(["plan", "-N", "2", "--submission", "per-launch", "--schedule", "seed",
                 "--emit", str(out)]) == 0
    assert capsys.readouterr().err == ""  # a policy and a schedule by name need no note
    assert json.loads((out / "index.json").read_text())["submission_policy"] == "per-launch"


def test_plan_json_default_is_chained_and_adds_no_note(capsys):
    assert main(["plan", "-N", "2", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["submission_policy"] == "chained" and captured.err == ""


# -- bob profile keeps per-launch -----------------------------------------------------------


def test_profile_still_defaults_to_per_launch():
    from bob.cli.profile_cmd import profile

    (option,) = [p for p in profile.params if p.name == "submission"]
    assert option.default == "per-launch"
    assert "auto" not in option.type.choices
    help_text = CliRunner().invoke(cli, ["profile", "--help"], terminal_width=200).output
    assert "[default: per-launch]" in help_text


# -- the help says what auto does ------------------------------------------------------------


@pytest.mark.parametrize(("command", "says"), [
    ("train", "auto: chained on nv and nv-sim"),
    ("check", "auto: chained when either backend is nv or nv-sim"),
    ("bench", "chained for the nv rows, with a per-launch nv seed row beside them"),
    ("plan", "auto: the nv backend's, chained"),
])
def test_help_says_what_auto_resolves_to(command, says):
    result = CliRunner().invoke(cli, [command, "--help"], terminal_width=400)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert says in text and "[default: auto]" in text


def test_a_refused_emit_adds_no_note_and_writes_nothing(tmp_path, capsys):
    target = tmp_path / "plain-file"
    target.write_text("keep me")
    assert main(["plan", "-N", "1", "--emit", str(target)]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "submission:" not in err
    assert target.read_text() == "keep me" and sorted(tmp_path.iterdir()) == [target]


def test_the_plan_table_names_the_resolved_policy(capsys):
    assert main(["plan", "-N", "2"]) == 0
    captured = capsys.readouterr()
    assert "Submissions (chained)" in captured.out
    assert captured.err == SCHEDULE_NOTE + CHAINED_NOTE
