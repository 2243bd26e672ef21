"""Row shards in turn on the GPU at V = 32768 (the table 4 GiB, a shard's 1 GiB): four
shards equal the one-piece run byte for byte in every table, across an invocation
boundary (the second invocation reads its rows back from the first's shard files), and
sampled rows equal the cpu backend's kernels run on those rows alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from bob.config import CHECKPOINT_TENSORS, Hyper
from bob.host.api import run_training
from bob.host.sharded import ShardTask, run_shard, shard_config, shard_inputs
from bob.host.training import TrainRequest
from dev.bench.bench_shards import first_difference, input_record

pytestmark = pytest.mark.gpu
VOCAB = 32768
SAMPLED_ROWS = ((0, 3), (8190, 8194), (32765, 32768))  # one across a shard boundary


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    where = tmp_path_factory.mktemp("shards-32768")
    record = input_record(VOCAB, "hard")
    record.write(where / "input.bin")
    found = {"where": where, "record": record}
    for name, fields in (("one", {}), ("sharded", {"shards": 4})):
        found[name] = run_training(TrainRequest(
            input_record=str(where / "input.bin"), steps=2, updates_per_invocation=1,
            backend="cuda", checkpoint=str(where / f"{name}.safetensors"), **fields))
    return found


def test_four_shards_in_turn_equal_one_piece_in_every_byte(runs) -> None:
    assert runs["sharded"].history == runs["one"].history
    assert len(runs["sharded"].shard_rows) == 4
    assert first_difference(runs["one"].checkpoint, runs["sharded"].checkpoint, VOCAB) is None


@pytest.mark.parametrize("rows", SAMPLED_ROWS)
def test_sampled_rows_equal_the_cpu_kernels_on_those_rows(runs, rows) -> None:
    from bob.records.shards import open_checkpoint

    where: Path = runs["where"]
    out = where / f"cpu-{rows[0]}.safetensors"
    first = run_shard(ShardTask(0, 1, shard_config(VOCAB, "hard", 1, rows), Hyper(), 0, None,
                                shard_inputs(runs["record"], rows), str(out), "cpu", "sm_90",
                                "device"))
    second = run_shard(ShardTask(0, 1, shard_config(VOCAB, "hard", 1, rows), Hyper(), 1,
                                 _FileRows(out, rows), shard_inputs(runs["record"], rows),
                                 str(where / f"cpu2-{rows[0]}.safetensors"), "cpu", "sm_90",
                                 "device"))
    assert first.entry.rows == second.entry.rows == rows
    cpu = load_file(str(where / f"cpu2-{rows[0]}.safetensors"))
    sharded = open_checkpoint(runs["sharded"].checkpoint)
    for name in CHECKPOINT_TENSORS:
        got = sharded.row_block(name, *rows).view(np.uint32)
        want = cpu[f"{name}[{rows[0]}:{rows[1]}]"].view(np.uint32)
        assert np.array_equal(got, want), f"{name} rows {rows}"


class _FileRows:
    """A lone cpu shard file as the next task's row source (rows [a, b) of its tables)."""

    def __init__(self, path: Path, rows: tuple[int, int]):
        self.tables = load_file(str(path))
        self.rows = rows

    def row_block(self, name: str, first: int, last: int) -> np.ndarray:
        table = self.tables[f"{name}[{self.rows[0]}:{self.rows[1]}]"]
        first, last = first - self.rows[0], last - self.rows[0]
        return np.ascontiguousarray(table[first:last])


def test_shards_on_a_dask_worker_per_gpu_equal_one_piece(tmp_path) -> None:
    """--gpus: a Dask worker per GPU listed, each seeing its GPU alone (on one GPU here,
    the path a host of several takes)."""
    pytest.importorskip("distributed")
    vocab = 4096
    input_record(vocab, "corpus").write(tmp_path / "input.bin")
    reports = {name: run_training(TrainRequest(
        input_record=str(tmp_path / "input.bin"), steps=4, updates_per_invocation=2,
        backend="cuda", checkpoint=str(tmp_path / f"{name}.safetensors"), **fields))
        for name, fields in (("one", {}), ("gpus", {"gpus": (0,), "shards": 3}))}
    assert reports["gpus"].shards_ran.startswith("side by side on GPUs 0")
    assert reports["gpus"].history == reports["one"].history
    assert first_difference(reports["one"].checkpoint, reports["gpus"].checkpoint,
                            vocab) is None
