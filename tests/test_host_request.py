"""One TrainRequest: api.train's keywords as fields, checked once when it is made, and
passed whole from the command line to the training driver."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bob.cli.main import main
from bob.config import ARENA_KINDS, AUTO_SUBMISSION, DEFAULT_TARGET, Hyper
from bob.errors import BadInput
from bob.host import api
from bob.host.data import CorpusSpec
from bob.host.training import TrainRequest

# api.train's keywords before it took a TrainRequest: name and default, in their order.
TRAIN_KEYWORDS = (
    ("texts", None), ("steps", 1000), ("checkpoint", "bob.safetensors"), ("resume", False),
    ("backend", "auto"), ("hyper", None), ("updates_per_invocation", 100),
    ("input_record", None), ("overwrite", False), ("arch", DEFAULT_TARGET),
    ("arena", ARENA_KINDS[0]), ("result_path", None), ("schedule", "auto"),
    ("hyper_changes", None), ("new_data", False), ("data_spec", None), ("val_spec", None),
    ("submission", AUTO_SUBMISSION),
    # Checkpoint periods (None: SavePolicy's default for the checkpoint's size).
    ("save_every_seconds", None), ("save_every_updates", None),
    # Eval points (None: every invocation) and the checkpoint of the lowest validation loss.
    ("eval_every", None), ("keep_best", False),
    # steps = 0 still writes the starting point (bob.train's model must exist to load).
    ("save_start", False),
    # Row shards (None: one piece): their count, CPU workers, GPUs, a device-memory budget,
    # a Dask scheduler to run them on.
    ("shards", None), ("workers", None), ("gpus", None), ("device_memory", None),
    ("dask_address", None),
    # Whose machine code the seed's regions run (bob.kernels.own: "own").
    ("kernels", "nvrtc"),
    # How the tables are held (bob.host.tables: chosen from the data).
    ("tables", "auto"),
    # The last fraction of the training data held out as validation (None: none).
    ("val_fraction", None),
)


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_the_request_has_every_keyword_of_train_with_its_default():
    assert [(f.name, f.default) for f in dataclasses.fields(TrainRequest)] == \
        list(TRAIN_KEYWORDS)


# Every refusal api.train made before any work, with its message: (fields, message);
# "{dir}" is the test's directory.
REFUSALS = [
    ({"steps": -1}, "steps must be >= 0, not -1"),
    ({"updates_per_invocation": 0}, "updates_per_invocation must be at least 1, not 0"),
    ({"schedule": "turbo"}, "schedule must be one of auto, seed, fused, not 'turbo'"),
    ({"submission": "batched"},
     "submission must be one of auto, per-launch, chained, not 'batched'"),
    ({"eval_every": 0}, "eval_every must be at least 1, not 0"),
    ({"keep_best": True}, "--keep-best keeps the checkpoint of the lowest validation loss: "
                          "it needs validation data (--val-fraction, --val-text, --val-tokens "
                          "or --val-counts)"),
    ({"val_fraction": 1.0}, "--val-fraction 1.0 is not a fraction in (0, 1): the last F of "
                            "the data validates, the rest trains"),
    ({"new_data": True},
     "--new-data continues a checkpoint on other data: it needs --resume"),
    ({"hyper_changes": {"momentum": 0.5}},
     "unknown hyperparameter 'momentum'; Bob's are lr, beta1, beta2, eps, weight_decay (and "
     "the schedule's warmup_steps, lr_decay_steps, min_lr)"),
    ({"checkpoint": "{dir}/missing/m.safetensors"},
     "{dir}/missing/m.safetensors: directory {dir}/missing does not exist (the checkpoint "
     "goes there)"),
    ({"checkpoint": "{dir}"}, "{dir}: is a directory, not a checkpoint file"),
    ({"checkpoint": "/proc/m.safetensors"},
     "/proc/m.safetensors: cannot write the checkpoint in /proc (No such file or directory)"),
    ({"result_path": "{dir}/missing/r.bin"},
     "{dir}/missing/r.bin: directory {dir}/missing does not exist (the result record goes "
     "there)"),
    ({"result_path": "{dir}"}, "{dir}: is a directory, not a result record file"),
    ({"save_every_seconds": 0.0}, "save_every_seconds must be a positive number, not 0.0"),
    ({"save_every_seconds": float("nan")},
     "save_every_seconds must be a positive number, not nan"),
    ({"save_every_updates": 0}, "save_every_updates must be at least 1, not 0"),
    ({"texts": ["a.txt"], "input_record": "b.bob"},
     "give either texts or an input_record, not both"),
    ({"data_spec": CorpusSpec(counts="c.counts"), "input_record": "b.bob"},
     "give either --text files or an --input record, not both"),
    ({"data_spec": CorpusSpec(counts="c.counts"), "texts": ["a.txt"]},
     "give either --text files or an --input record, not both"),
    ({"kernels": "ptxas"}, "kernels must be one of nvrtc, own, not 'ptxas'"),
    ({"kernels": "own"}, "--kernels own runs on nv-sim and nv; the cpu backend runs the "
                         "NumPy reference, no machine code"),
    ({"kernels": "own", "backend": "cuda"},
     "--kernels own runs on nv-sim and nv (Bob's command stream); the cuda backend loads "
     "NVRTC's cubin and stays on NVRTC's kernels"),
    ({"kernels": "own", "backend": "auto"},
     "--kernels own runs on nv-sim and nv: name one with --backend (auto picks cuda, nv or "
     "cpu)"),
    ({"kernels": "own", "backend": "nv-sim", "shards": 2},
     "row shards (--shards, --workers, --gpus, --device-memory, --dask) do not take "
     "--kernels own"),
]


def _filled(fields: dict, directory: Path) -> dict:
    return {name: value.replace("{dir}", str(directory)) if isinstance(value, str) else value
            for name, value in fields.items()}


@pytest.mark.parametrize(("fields", "message"), REFUSALS)
def test_each_refusal_comes_from_the_request_and_from_train_with_nothing_written(
        tmp_path: Path, fields: dict, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fields = {"checkpoint": str(tmp_path / "m.safetensors"), "backend": "cpu",
              **_filled(fields, tmp_path)}
    expected = message.replace("{dir}", str(tmp_path))
    with pytest.raises(BadInput) as made:
        TrainRequest(**fields)
    assert str(made.value) == expected
    with pytest.raises(BadInput) as trained:
        api.train(**fields)
    assert str(trained.value) == expected
    assert listing(tmp_path) == []


def test_the_request_keeps_its_own_copies():
    texts, changes = ["a.txt", "b.txt"], {"lr": 0.5}
    request = TrainRequest(texts=texts, hyper_changes=changes, steps=0)
    texts.append("c.txt")
    changes["lr"] = 1.0
    assert request.texts == ("a.txt", "b.txt") and request.hyper_changes == {"lr": 0.5}
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.steps = 5  # type: ignore[misc]


def test_train_builds_the_request_of_its_keywords(monkeypatch: pytest.MonkeyPatch):
    given = []
    monkeypatch.setattr(api, "run_training",
                        lambda request, progress=None: given.append((request, progress)))
    progress = print
    api.train(["a.txt"], steps=0, backend="cpu", hyper=Hyper(lr=0.2), progress=progress)
    assert given == [(TrainRequest(texts=("a.txt",), steps=0, backend="cpu",
                                   hyper=Hyper(lr=0.2)), progress)]
    with pytest.raises(TypeError, match="turbo"):
        api.train(steps=0, turbo=True)


def test_the_cli_passes_one_request_whole_to_the_driver(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    given = []

    def driver(request, progress=None, announce=None):
        given.append(request)
        raise BadInput("stopped here")

    monkeypatch.setattr(api, "run_training", driver)
    (tmp_path / "a.txt").write_bytes(b"abc")
    checkpoint = str(tmp_path / "m.safetensors")
    status = main(["train", "--text", str(tmp_path / "a.txt"), "--steps", "7", "-N", "3",
                   "-c", checkpoint, "--backend", "cpu", "--schedule", "fused", "--lr",
                   "0.05", "--val-counts", str(tmp_path / "v.counts"), "--save-every", "90",
                   "--save-every-updates", "6"])
    assert status == 2
    assert given == [TrainRequest(
        texts=(str(tmp_path / "a.txt"),), steps=7, checkpoint=checkpoint, backend="cpu",
        updates_per_invocation=3, schedule="fused", hyper_changes={"lr": 0.05},
        val_spec=CorpusSpec(counts=str(tmp_path / "v.counts")), save_every_seconds=90.0,
        save_every_updates=6)]


def test_the_driver_runs_a_request(tmp_path: Path):
    request = TrainRequest(steps=6, updates_per_invocation=4, backend="cpu",
                           checkpoint=str(tmp_path / "m.safetensors"))
    report = api.run_training(request)
    assert (report.steps, report.global_step, report.written) == (6, 6, (request.checkpoint,))
    again = api.run_training(dataclasses.replace(request, resume=True, steps=2))
    assert again.global_step == 8 and again.history[-1][0] == 8
