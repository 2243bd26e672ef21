"""Row shards on the cpu backend: sharded runs give the one-piece run's bytes and losses,
resume across shard counts, and the index is checked on read."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bob.errors import BadInput
from bob.host.api import run_training
from bob.host.training import TrainRequest
from bob.program.bob import BobConfig, shard_boundaries
from bob.records.shards import open_checkpoint


def _request(text: Path, checkpoint: Path, **fields) -> TrainRequest:
    return TrainRequest(texts=(str(text),), updates_per_invocation=5, backend="cpu",
                        checkpoint=str(checkpoint), **fields)


def test_four_shards_in_turn_give_the_one_piece_bytes_and_losses(tmp_path, text):
    one = run_training(_request(text, tmp_path / "one.safetensors", steps=10))
    sharded = run_training(_request(text, tmp_path / "sh.safetensors", steps=10, shards=4))
    assert sharded.history == one.history
    assert (open_checkpoint(tmp_path / "sh.safetensors").load()
            == open_checkpoint(tmp_path / "one.safetensors").load())
    # only the last generation's shards are left beside the index
    names = sorted(p.name for p in tmp_path.glob("sh*"))
    assert names == ["sh.safetensors.index.json",
                     *(f"sh.step10-0000{i}-of-00004.safetensors" for i in range(1, 5))]


@pytest.mark.parametrize("onto", [2, 1])
def test_resume_from_four_shards_onto_fewer_equals_the_straight_run(tmp_path, text, onto):
    run_training(_request(text, tmp_path / "one.safetensors", steps=15))
    run_training(_request(text, tmp_path / "sh.safetensors", steps=10, shards=4))
    run_training(_request(text, tmp_path / "sh.safetensors", steps=5, shards=onto,
                          resume=True))
    assert (open_checkpoint(tmp_path / "sh.safetensors").load()
            == open_checkpoint(tmp_path / "one.safetensors").load())


def test_the_index_is_checked_on_read(tmp_path, text):
    run_training(_request(text, tmp_path / "sh.safetensors", steps=5, shards=2))
    index = tmp_path / "sh.safetensors.index.json"
    good = index.read_text()
    data = json.loads(good)
    first = tmp_path / data["metadata"]["shards"][0]["file"]
    first.rename(tmp_path / "away")
    with pytest.raises(BadInput, match="shard file .* is missing"):
        open_checkpoint(index)
    (tmp_path / "away").rename(first)
    data["metadata"]["shards"][1]["rows"][0] -= 1
    index.write_text(json.dumps(data))
    with pytest.raises(BadInput, match="overlap"):
        open_checkpoint(index)
    index.write_text(good)
    with first.open("r+b") as file:
        file.seek(-4, os.SEEK_END)
        file.write(b"\0\0\0\1")
    with pytest.raises(BadInput, match="sha256"):
        open_checkpoint(index)


@pytest.mark.parametrize("fields, message", [
    ({"shards": 0}, "--shards must be an integer of at least 1"),
    ({"gpus": (0, 0)}, "--gpus must list distinct GPU numbers"),
    ({"shards": 2, "schedule": "fused"}, "do not take --schedule fused"),
    ({"shards": 2, "eval_every": 5}, "do not take --eval-every"),
])
def test_bad_shard_options_are_one_line_and_write_nothing(tmp_path, text, fields, message):
    with pytest.raises(BadInput, match=message) as refused:
        run_training(_request(text, tmp_path / "sh.safetensors", steps=5, **fields))
    assert "\n" not in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [text.name]


def test_more_shards_than_rows_is_refused_before_anything_is_written(tmp_path, text):
    with pytest.raises(BadInput, match=r"--shards must be an integer in \[1, V=256\]"):
        run_training(_request(text, tmp_path / "sh.safetensors", steps=5, shards=257))
    assert sorted(p.name for p in tmp_path.iterdir()) == [text.name]


def test_shard_boundaries_cover_the_rows_once():
    assert shard_boundaries(10, 3) == ((0, 3), (3, 6), (6, 10))
    with pytest.raises(BadInput):
        BobConfig(vocab=16, prompts=0, rows=(8, 17))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "nv"])
def test_four_shards_in_turn_on_a_gpu_give_the_cpu_one_piece_bytes(tmp_path, text, backend):
    one = run_training(_request(text, tmp_path / "one.safetensors", steps=10))
    sharded = run_training(replace(_request(text, tmp_path / "sh.safetensors", steps=10,
                                            shards=4), backend=backend))
    assert sharded.history == one.history
    assert (open_checkpoint(tmp_path / "sh.safetensors").load()
            == open_checkpoint(tmp_path / "one.safetensors").load())


@pytest.mark.parametrize("mode", ["corpus", "hard"])
def test_rows_streamed_in_pieces_of_a_few_rows_give_the_same_bytes(tmp_path, text,
                                                                   monkeypatch, mode):
    """A shard's tables and weights go in a piece of rows at a time (the host holds one
    piece): pieces of 7 rows, the last one short, change no byte."""
    from bob.host import sharded
    from bob.records.binary import InputRecord

    record = tmp_path / "input.bin"
    rng = np.random.default_rng(1)
    if mode == "hard":
        InputRecord.hard(rng.integers(0, 256, 256, dtype="uint32")).write(record)
        fields = {"input_record": str(record), "texts": None}
    else:
        fields = {}
    one = run_training(replace(_request(text, tmp_path / "one.safetensors", steps=10),
                               **fields))
    monkeypatch.setattr(sharded, "CHUNK_BYTES", 4 * 256 * 7)
    sharded_run = run_training(replace(_request(text, tmp_path / "sh.safetensors", steps=10,
                                                shards=3), **fields))
    assert sharded_run.history == one.history
    assert (open_checkpoint(tmp_path / "sh.safetensors").load()
            == open_checkpoint(tmp_path / "one.safetensors").load())
