"""bob.config: one rule for AdamW's hyperparameters, one home for the names and limits."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bob import config
from bob.backends import BACKEND_NAMES, SPECS
from bob.cli.main import main
from bob.config import Hyper
from bob.errors import BadInput
from bob.host import api
from bob.plan import TARGETS
from bob.program.bob import BobConfig


@pytest.mark.parametrize(("values", "message"), [
    ({"lr": 0.0}, "lr = 0.0 is zero (it must be positive)"),
    ({"lr": -1.0}, "lr = -1.0 is negative"),
    ({"lr": math.inf}, "lr = inf is not a finite number"),
    ({"lr": "0.1"}, "lr = '0.1' is not a finite number"),
    ({"lr": True}, "lr = True is not a finite number"),
    ({"beta1": 1.0}, "beta1 = 1.0 is outside [0, 1)"),
    ({"beta2": -0.1}, "beta2 = -0.1 is outside [0, 1)"),
    ({"beta2": math.nan}, "beta2 = nan is not a finite number"),
    ({"eps": 0}, "eps = 0 is zero (it must be positive)"),
    ({"eps": -1e-8}, "eps = -1e-08 is negative"),
    ({"weight_decay": -0.01}, "weight_decay = -0.01 is negative"),
])
def test_hyper_refuses_with_one_line(values: dict, message: str) -> None:
    with pytest.raises(BadInput) as caught:
        Hyper(**values)
    assert str(caught.value) == message
    assert caught.value.exit_status == 2


def test_hyper_accepts_the_edges_of_its_rule() -> None:
    Hyper(lr=1e-30, beta1=0.0, beta2=0.0, eps=1e-300, weight_decay=0.0)
    Hyper(lr=1e39, weight_decay=1.0)  # diverges, as torch would: caught as a non-finite loss
    assert Hyper() == Hyper(lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--lr", "0", "lr = 0.0 is zero (it must be positive)"),
    ("--eps", "0", "eps = 0.0 is zero (it must be positive)"),
    ("--beta2", "1", "beta2 = 1.0 is outside [0, 1)"),
    ("--weight-decay", "-1", "weight_decay = -1.0 is negative"),
    ("--lr", "nan", "lr = nan is not a finite number"),
])
def test_the_cli_applies_the_same_rule(tmp_path: Path, capsys, flag: str, value: str,
                                       message: str) -> None:
    status = main(["train", flag, value, "--backend", "cpu", "-c",
                   str(tmp_path / "model.safetensors")])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err == (f"bob train: Invalid value for '{flag}': {message} "
                   "(see bob train --help)\n")
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("call", "message"), [
    (lambda path: api.train(steps=-1, checkpoint=path, backend="cpu"),
     "steps must be >= 0, not -1"),
    (lambda path: api.train(steps=1, checkpoint=path, backend="cpu", updates_per_invocation=0),
     "updates_per_invocation must be at least 1, not 0"),
    (lambda path: api.train(steps=1, checkpoint=path, backend="cpu", schedule="turbo"),
     "schedule must be one of auto, seed, fused, not 'turbo'"),
    (lambda path: api.train(texts=["a.txt"], input_record="b.bob", checkpoint=path),
     "give either texts or an input_record, not both"),
])
def test_the_api_speaks_its_own_words(tmp_path: Path, call, message: str) -> None:
    with pytest.raises(BadInput) as caught:
        call(str(tmp_path / "model.safetensors"))
    assert str(caught.value) == message
    assert list(tmp_path.iterdir()) == []


def test_the_cli_speaks_in_flags_where_the_api_does_not(tmp_path: Path, capsys) -> None:
    (tmp_path / "a.txt").write_bytes(b"abc")
    argv = ["train", "--text", str(tmp_path / "a.txt"), "--input", str(tmp_path / "b.bob"),
            "-c", str(tmp_path / "model.safetensors")]
    assert main(argv) == 2
    assert "give either --text files or an --input record" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


@pytest.mark.parametrize(("values", "message"), [
    ({"vocab": 1}, "vocab must be an integer in [2, 65536], not 1"),
    ({"updates": True}, "updates must be an integer in [0, 100000], not True"),
    ({"mode": "soft"}, "mode must be one of hard, corpus, not 'soft'"),
    ({"mode": "corpus"}, "pairs must be an integer in [1, 2147483648] in corpus mode, not 0"),
    ({"pairs": 3}, "pairs must be an integer in [0, 0] in hard mode, not 3"),
    ({"validation_pairs": 1}, "validation_pairs must be an integer in [0, 0] in hard mode, "
                              "not 1"),
    ({"mode": "corpus", "pairs": 1, "validation_pairs": -1},
     "validation_pairs must be an integer in [0, 2147483648] in corpus mode, not -1"),
    ({"mode": "corpus", "vocab": 3, "pairs": 10},
     "a V=3 table has 9 cells, fewer than the 10 pairs asked for"),
    ({"mode": "corpus", "vocab": 3, "pairs": 9, "validation_pairs": 10},
     "a V=3 table has 9 cells, fewer than the 10 pairs asked for"),
])
def test_a_bad_program_configuration_is_bad_input(values: dict, message: str) -> None:
    with pytest.raises(BadInput) as caught:
        BobConfig(**values)
    assert str(caught.value) == message


def test_the_names_are_the_ones_the_layers_use() -> None:
    # Targets are placed by the plan layer: it offers exactly the names the CLI and the
    # records take from bob.config. Backends are named by their registry alone.
    assert config.TARGET_NAMES == tuple(TARGETS)
    assert not {"BACKENDS", "BACKEND_NAMES", "CHAINED_BACKENDS",
                "resolve_submission"} & set(vars(config))
    assert BACKEND_NAMES == (*(spec.name for spec in SPECS), "auto")
    assert config.DEFAULT_TARGET in config.TARGET_NAMES
    assert config.HYPER_FIELDS == ("lr", "beta1", "beta2", "eps", "weight_decay")


def _imported_packages(package: str) -> set[str]:
    """The packages of Bob that the modules of `package` (a package or a module) import."""
    root = Path(config.__file__).parent
    paths = [root / f"{package}.py"] if (root / f"{package}.py").exists() else \
        list((root / package).rglob("*.py"))
    found = set()
    for path in paths:
        for line in path.read_text().splitlines():
            words = line.replace(",", " ").split()
            if len(words) < 2 or words[0] not in ("from", "import"):
                continue
            if words[1].startswith("bob."):
                found.add(words[1].split(".")[1])
            elif words[:3] == ["from", "bob", "import"]:  # from bob import config, files
                found.update(word for word in words[3:] if word != "(")
    return found - {package}


@pytest.mark.parametrize(("package", "allowed"), [
    ("errors", set()),
    ("config", {"errors"}),
    ("files", {"errors"}),
    ("records", {"config", "files", "errors"}),
    ("host", {"backends", "records", "program", "kernels", "plan", "config", "files",
              "errors"}),
    ("backends", {"kernels", "plan", "config", "errors"}),
])
def test_imports_point_down(package: str, allowed: set[str]) -> None:
    assert _imported_packages(package) <= allowed


