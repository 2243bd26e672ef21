"""What --help and `bob doctor` say: each option's own name in its example, every option
of train and check explained, a pip hint printed as it is written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from bob.cli.main import cli, main
from bob.config import DISTRIBUTION


def help_text(*command: str) -> str:
    result = CliRunner().invoke(cli, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())  # click wraps lines: compare words


def test_validation_options_show_their_own_names_in_the_repeat_example():
    text = help_text("train")
    assert "--val-text a.txt --val-text b.txt" in text
    assert "--val-tokens a.bin --val-tokens b.bin" in text
    assert "--text a.txt --text b.txt" in text


def test_eval_says_the_checkpoint_gives_the_tokens_v():
    text = help_text("eval")
    assert "needs --vocab" not in text
    assert "their V is the checkpoint's" in text
    assert "needs --vocab or --tokenizer" in help_text("train")


@pytest.mark.parametrize("option", ["--lr", "--beta1", "--beta2", "--eps", "--weight-decay"])
def test_every_hyperparameter_has_help(option):
    words = help_text("train").split(f"{option} FLOAT", 1)[1].split(" [default", 1)[0]
    assert len(words.split()) >= 5, (option, words)


def test_check_explains_its_steps_and_updates_per_invocation():
    text = help_text("check")
    assert "-N, --updates-per-invocation INTEGER RANGE Updates per invocation" in text
    assert "--steps INTEGER RANGE AdamW updates in all" in text
    assert "--seed INTEGER RANGE Seed of the random" in text


def test_minus_n_is_updates_per_invocation_in_train_and_bench():
    assert "-N, --updates-per-invocation INTEGER RANGE Updates per invocation" in \
        help_text("train")
    assert "-N, --updates INTEGER RANGE Updates per invocation, as bob train -N" in \
        help_text("bench")


def test_doctor_prints_a_pip_hint_as_written(monkeypatch, capsys):
    from bob.backends.cuda import driver
    from bob.errors import BackendUnavailable

    def missing() -> None:
        raise BackendUnavailable("cuda-bindings is not installed (No module named 'cuda'): "
                           "pip install 'bob-bigram[cuda]'")

    monkeypatch.setattr(driver, "initialize", missing)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "no GPU listed: cuda-bindings is not installed (No module named 'cuda'): pip " \
           "install 'bob-bigram[cuda]'" in " ".join(out.split())
    assert "\\[" not in out
    assert main(["doctor", "--json"]) == 0
    note = json.loads(capsys.readouterr().out)["gpus_note"]
    assert note.endswith("pip install 'bob-bigram[cuda]'"), note


def test_doctor_unquotes_a_key_errors_text(monkeypatch):
    from bob.backends.cuda import driver
    from bob.host.doctor import list_gpus

    def missing() -> None:
        raise KeyError("no such device")

    monkeypatch.setattr(driver, "initialize", missing)
    assert list_gpus() == ([], "no GPU listed: no such device")


ROOT = Path(__file__).resolve().parent.parent
INSTALL_HINT = re.compile(r"pip install\s+'([A-Za-z][\w.-]*)\[")  # a name, not '.'


def test_the_distribution_is_bob_bigram_and_every_install_hint_names_it():
    pyproject = (ROOT / "pyproject.toml").read_text()  # tomllib is 3.11's: the two lines
    assert re.findall(r'(?m)^name = "(.*)"$', pyproject) == [DISTRIBUTION] == ["bob-bigram"]
    assert '\nbob = "bob.cli.executable:entry"\n' in pyproject  # the command stays bob
    hints = []
    for folder in ("src", "dev", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md"):
                hints += [(path.name, name) for name in
                          INSTALL_HINT.findall(" ".join(path.read_text().split()))]
    hints += [("README.md", name) for name in INSTALL_HINT.findall(
        " ".join((ROOT / "README.md").read_text().split()))]
    assert len(hints) >= 10
    assert {name for _, name in hints} == {DISTRIBUTION}, hints
