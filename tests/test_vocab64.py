"""Vocabularies up to 65536 on the CPU: plans, records and kernels, with no table allocated.

At V = 65536 a table holds 2**32 elements (16 GiB as float32): every element count,
byte size and offset must be 64-bit. These tests build, certify, serialise and
encode such plans, read their records' headers, and run the kernels on a few rows;
none allocates a table (CI has about 4 GiB of memory).
"""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from bob.backends.nv.encoder import encode, parameter_block
from bob.cli.main import main
from bob.config import MAX_DENSE_VOCAB, MAX_PAIRS, MAX_VOCAB, Hyper
from bob.errors import BadInput
from bob.host import api, training
from bob.host.training import refuse_slow_cpu
from bob.kernels import reference as ref
from bob.kernels import signatures as sig
from bob.kernels.cuda.regions import catalogue
from bob.kernels.memory import Memory
from bob.plan.certificate import certify
from bob.plan.jsonio import dumps, loads
from bob.plan.model import Scalar
from bob.plan.placement import SM86, SM90, decode_parameter_block
from bob.program.bob import (
    PAIR_BYTES,
    WEIGHTS_TENSOR,
    BobConfig,
    adam_scalar_table,
    build_plan,
    typical_pairs,
)
from bob.records import checkpoint as ckpt
from bob.records import corpus
from bob.records.binary import HEADER, INPUT_MAGIC, InputRecord
from bob.records.counting import count_sources
from bob.records.countsfile import CountsFile
from bob.records.digest import digest_matches, sparse_digest
from bob.records.sources import resolve
from conftest import listing, needs_nvrtc
from large_vocab import Rows, fused_rows_reference, lazy_bytes

V = 65536
TABLE_BYTES = 4 * V * V  # 2**34


def test_dense_tables_stop_at_65536() -> None:
    assert MAX_DENSE_VOCAB == V and TABLE_BYTES == 1 << 34
    assert MAX_VOCAB == 1 << 20  # collapsed tables, and the data layer (test_vocab20.py)


# -- the plan --------------------------------------------------------------------------


def big_plan(schedule: str, mode: str, target=SM90, updates: int = 2, pairs: int = 0):
    """Bob's plan at V = 65536; corpus mode with `pairs` (typical_pairs(V) when 0)."""
    sparse = {} if mode == "hard" else {"pairs": pairs or typical_pairs(V)}
    config = BobConfig(vocab=V, prompts=2, updates=updates, mode=mode,  # type: ignore[arg-type]
                       schedule=schedule, **sparse)  # type: ignore[arg-type]
    return config, build_plan(config, target)


@pytest.mark.parametrize("target", [SM86, SM90], ids=lambda t: t.name)
@pytest.mark.parametrize("mode", ["hard", "corpus"])
@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_a_plan_at_65536_certifies_with_64_bit_sizes(schedule: str, mode: str, target) -> None:
    config, plan = big_plan(schedule, mode, target)
    certificate = certify(plan)
    assert certificate.holds, certificate.hazards
    arena = plan.address_map.arena
    tables = [plan.tensor(n) for n in ("parameters", "first_moment", "second_moment",
                                       "gradients")]
    assert [t.bytes for t in tables] == [TABLE_BYTES] * 4
    # Each table starts past the one before it, 16 GiB on: offsets beyond 2**32 and 2**34.
    offsets = [t.address - arena.base for t in tables]
    assert offsets == sorted(offsets) and offsets[3] >= 3 * TABLE_BYTES
    assert all(b.address >= a.end for a, b in zip(tables, tables[1:], strict=False))
    data = plan.tensor("input")
    # corpus: the sparse pairs, keys u64 then values f32, not a table
    assert data.bytes == config.input_bytes == (
        PAIR_BYTES * config.pairs if mode == "corpus" else 4 * V) + 8
    assert all(t.end <= arena.end for t in plan.tensors)
    assert arena.bytes > (5 if mode == "corpus" else 4) * TABLE_BYTES
    if mode == "corpus":  # the table the pairs are scattered into, after the seed's nine
        weights = plan.tensor(WEIGHTS_TENSOR)
        assert weights.bytes == TABLE_BYTES and weights.address > tables[-1].address


@pytest.mark.parametrize("target", [SM86, SM90], ids=lambda t: t.name)
def test_a_corpus_plan_of_the_most_pairs_at_65536_certifies(target) -> None:
    """K = MAX_PAIRS = 2**31: 16 GiB of keys and 8 GiB of values, the scatter's count and
    the offset of its values past 32 bits."""
    config, plan = big_plan("fused", "corpus", target, pairs=MAX_PAIRS)
    certificate = certify(plan)
    assert certificate.holds, certificate.hazards
    assert plan.tensor("input").bytes == PAIR_BYTES * MAX_PAIRS + 8
    index = next(i for i, launch in enumerate(plan.launches) if launch.region == sig.SCATTER)
    decoded = decode_parameter_block(plan.target, plan.region(sig.SCATTER),
                                     parameter_block(plan, index))
    assert decoded["count"] == Scalar.u32(MAX_PAIRS) and decoded["vocab"] == Scalar.u32(V)
    assert decoded["values"].address - decoded["keys"].address == 8 * MAX_PAIRS
    assert decoded["table"].address == plan.tensor(WEIGHTS_TENSOR).address


def test_the_seed_adamw_launch_covers_2_32_elements() -> None:
    _, plan = big_plan("seed", "hard")
    index = next(i for i, launch in enumerate(plan.launches) if launch.region == sig.ADAMW)
    region = plan.region(sig.ADAMW)
    decoded = decode_parameter_block(plan.target, region, parameter_block(plan, index))
    assert decoded["rows"] == Scalar.u32(V) and decoded["columns"] == Scalar.u32(V)
    footprint = region.params[0].footprint.evaluate({"rows": V, "columns": V})
    assert footprint == plan.tensor("parameters").bytes == TABLE_BYTES
    # Every pointer decodes to its tensor's 64-bit address.
    for name in ("parameters", "gradients", "first_moment", "second_moment"):
        assert decoded[name].address == plan.tensor(name).address


def test_the_certificate_sees_a_footprint_one_column_past_a_16_gib_table() -> None:
    _, plan = big_plan("seed", "hard")
    index = next(i for i, launch in enumerate(plan.launches) if launch.region == sig.ADAMW)
    launch = plan.launches[index]
    args = (*launch.args[:-1], Scalar.u32(V + 1))  # rows x (V + 1): 4 V bytes too many
    broken = replace(plan, launches=(*plan.launches[:index], replace(launch, args=args),
                                     *plan.launches[index + 1:]))
    kinds = {hazard.kind for hazard in certify(broken).hazards}
    assert "pointer-outside-tensors" in kinds or "footprint-overflow" in kinds, kinds


@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_a_plan_at_65536_round_trips_through_json(schedule: str) -> None:
    _, plan = big_plan(schedule, "corpus")
    text = dumps(plan)
    assert loads(text, regions=catalogue()) == plan
    # The sizes are written as integers beyond 2**32, not truncated.
    tensors = {t["name"]: t for t in json.loads(text)["tensors"]}
    assert tensors["parameters"]["bytes"] == TABLE_BYTES


@pytest.mark.parametrize("target", [SM86, SM90], ids=lambda t: t.name)
@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_the_encoder_encodes_a_plan_at_65536(schedule: str, target) -> None:
    _, plan = big_plan(schedule, "hard", target)
    encoded = encode(certify_and(plan))
    assert len(encoded.qmd_table.data) == plan.qmd_table_bytes
    assert encoded.program.base == plan.address_map.program.base
    # The fused launch's parameter block carries the 64-bit addresses of its tables.
    index = next(i for i, launch in enumerate(plan.launches)
                 if launch.region in (sig.ADAMW, sig.FUSED_HELD_HARD))
    decoded = decode_parameter_block(plan.target, plan.region(plan.launches[index].region),
                                     parameter_block(plan, index))
    assert decoded["second_moment"].address == plan.tensor("second_moment").address
    assert decoded["second_moment"].address > 1 << 32


def certify_and(plan):
    assert certify(plan).holds
    return plan


def test_the_fused_schedule_holds_rows_in_part_all_updates_in_one_launch_at_65536() -> None:
    config, plan = big_plan("fused", "hard", updates=3)
    (fused,) = [launch for launch in plan.launches if launch.region == sig.FUSED_HELD_HARD]
    assert fused.label == "fused[0:3]" and config.updates == 3
    assert fused.grid.x == SM90.multiprocessors  # a block per SM, rows looped


# -- records ---------------------------------------------------------------------------


def test_an_input_record_at_65536_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    record = InputRecord.hard(rng.integers(0, V, V, dtype=np.uint32), [0, V - 1])
    path = tmp_path / "in.bin"
    record.write(path)
    assert InputRecord.read(path) == record


def test_a_corpus_record_header_at_65536_states_16_gib(tmp_path: Path) -> None:
    """The expected length is computed in 64 bits: 2**34 + 4 P bytes after the header."""
    path = tmp_path / "in.bin"
    path.write_bytes(HEADER.pack(INPUT_MAGIC, 1, 1, V, 1))
    with pytest.raises(BadInput) as caught:
        InputRecord.read(path)
    expected = HEADER.size + TABLE_BYTES + 4
    assert str(caught.value) == (f"{path}: truncated: {HEADER.size} bytes, a corpus input "
                                 f"record with V={V}, P=1 has {expected}")


def lazy_checkpoint(vocab: int) -> ckpt.Checkpoint:
    """A checkpoint of three zero tables that exist only as address space."""
    tables = [lazy_bytes(4 * vocab * vocab).view(np.float32).reshape(vocab, vocab)
              for _ in range(3)]
    return ckpt.Checkpoint(*tables, step=7, hyper=Hyper(), mode="corpus", data_digest="")


def test_a_checkpoint_header_at_65536_has_64_bit_offsets(tmp_path: Path) -> None:
    state = lazy_checkpoint(V)
    header = state.state.header()
    length = struct.unpack("<Q", header[:8])[0]
    layout = json.loads(header[8:8 + length])
    assert layout["second_moment"]["data_offsets"] == [2 * TABLE_BYTES, 3 * TABLE_BYTES]
    # safetensors itself reads it: the file is sparse (48 GiB of holes), one slice is read.
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as file:
        file.write(header)
        file.truncate(len(header) + 3 * TABLE_BYTES)
        file.seek(len(header) + 2 * TABLE_BYTES + TABLE_BYTES - 4)
        file.write(np.float32(1.5).tobytes())  # the last element of the second moment
    with safe_open(str(path), framework="numpy") as opened:
        fields = ckpt._read_metadata(opened.metadata(), str(path))
        assert fields.vocab == V and fields.step == 7
        moment = opened.get_slice("second_moment")
        assert moment.get_shape() == [V, V]
        assert moment[V - 1:V, V - 2:V].tolist() == [[0.0, 1.5]]


def test_checkpoint_metadata_refuses_v_65537() -> None:
    metadata = lazy_checkpoint(2).metadata()
    with pytest.raises(BadInput, match=r"^x: metadata vocab 65537 is outside \[2, 65536\] "
                                       r"\(dense tables\)$"):
        ckpt._read_metadata({**metadata, "vocab": str(V + 1)}, "x")
    assert ckpt._read_metadata({**metadata, "vocab": str(V)}, "x").vocab == V


def test_counting_at_65536_keeps_the_last_pair(tmp_path: Path) -> None:
    """Keys prev * V + next reach 2**32 - 1 at V = 65536: still exact."""
    path = tmp_path / "t.bin"
    np.array([V - 1, V - 1, 0, V - 1, 1], "<u2").tofile(path)
    counts = count_sources(resolve([str(path)], "uint16"), V, workers=1)
    rows, columns, values = counts.entries()
    assert list(zip(rows.tolist(), columns.tolist(), values.tolist(), strict=True)) == [
        (0, V - 1, 1), (V - 1, 0, 1), (V - 1, 1, 1), (V - 1, V - 1, 1)]
    assert counts.transitions == 4


# -- kernels ---------------------------------------------------------------------------


def test_the_gather_reads_a_row_16_gib_into_the_arena() -> None:
    """logits = table[V - 1]: 4 (V - 1) V bytes past the table, far past 2**32."""
    base = 0x20_0000_0000
    prompt_at, table_at = base, base + 4096
    logits_at = table_at + TABLE_BYTES
    memory = Memory(lazy_bytes(logits_at + 4 * V - base), base)
    row = np.arange(V, dtype=np.float32) * np.float32(0.25)
    memory.array(table_at + 4 * (V - 1) * V, "f32", V)[:] = row
    memory.array(prompt_at, "u32", 1)[0] = V - 1
    ref.row_gather(memory, {"logits": logits_at, "prompt": prompt_at, "table": table_at,
                            "vocab": V})
    assert memory.array(logits_at, "f32", V).tobytes() == row.tobytes()


def big_rows(mode: str, rows: int = 3, seed: int = 5) -> Rows:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, V), dtype=np.float32)
    w[0] = 0.0  # a row of ties
    m = (rng.standard_normal((rows, V)) * 1e-3).astype(np.float32)
    v = (rng.random((rows, V)) * 1e-6).astype(np.float32)
    if mode == "hard":
        return Rows(w, m, v, targets=np.array([0, V - 1, 12345], np.uint32)[:rows])
    weights = (rng.random((rows, V)) * (rng.random((rows, V)) < 0.01) / rows).astype(np.float32)
    return Rows(w, m, v, weights=weights)


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_fast_kernels_equal_the_reference_on_rows_of_65536(mode: str) -> None:
    fast = pytest.importorskip("bob.kernels.fast", reason="numba (the `fast` extra)")
    rows = big_rows(mode)
    steps = adam_scalar_table(Hyper(), 1, 2)
    want = fused_rows_reference(rows, steps, V)
    w, m, v = (a.copy() for a in (rows.parameters, rows.first_moment, rows.second_moment))
    grad, loss = np.empty_like(w), np.empty(len(w), np.float32)
    scalars = ref.LossScalars.for_vocab(V)
    if mode == "hard":
        fast.fused_hard_rows(w, m, v, rows.targets, steps, scalars.log2e, scalars.ln2,
                             scalars.inverse_rows, True, grad, loss)
    else:
        fast.fused_corpus_rows(w, m, v, rows.weights, steps, scalars.log2e, scalars.ln2, True,
                               grad, loss)
    for name, got, expected in zip(("parameters", "first", "second", "gradients", "loss"),
                                   (w, m, v, grad, loss), want, strict=True):
        assert got.tobytes() == expected.tobytes(), name


def test_the_reference_loss_at_65536_is_the_float64_cross_entropy() -> None:
    """Every one of the 65536 columns enters the row's sum (no index wraps)."""
    rows = big_rows("hard")
    loss, grad = ref.loss_gradient_hard_rows(rows.parameters, rows.targets,
                                             ref.LossScalars.for_vocab(V))
    w = rows.parameters.astype(np.float64)
    top = w.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(w - top).sum(axis=1))
    exact = log_z - w[np.arange(len(w)), rows.targets.astype(np.int64)]
    np.testing.assert_allclose(loss, exact, rtol=2e-5)
    assert loss[0] == pytest.approx(np.log(V), rel=1e-6)  # a row of ties: uniform
    # gradients sum to 0 per row (p sums to 1, minus 1 at the target), scaled by 1/V
    np.testing.assert_allclose(grad.astype(np.float64).sum(axis=1), 0.0, atol=1e-9)


# -- the CPU backend and the command line ----------------------------------------------


def test_the_cpu_backend_refuses_gpt2_sized_tables() -> None:
    with pytest.raises(BadInput) as caught:
        refuse_slow_cpu("cpu", 50257, 1)
    assert str(caught.value) == (
        "V=50257 is above the largest dense table the CPU backend trains (V=32768): it would "
        "hold about 65.9 GiB in host memory; train on a GPU (--backend cuda) or with "
        "--tables collapsed")
    refuse_slow_cpu("cuda", 50257, 1000)  # the GPU is where such tables go
    refuse_slow_cpu("cpu", 16384, 1)  # slow, allowed


@pytest.mark.parametrize("command", [
    ["plan", "--vocab", "1048577"],
    ["check", "--vocab", "1048577"],
    ["bench", "--vocab", "256", "--vocab", "1048577"],
    ["count", "--tokens", "{d}/t.bin", "--vocab", "1048577", "-o", "{d}/c.st"],
    ["train", "--tokens", "{d}/t.bin", "--vocab", "1048577", "-c", "{d}/c.st"],
])
def test_a_v_past_max_vocab_is_refused_in_one_line(tmp_path: Path, capsys,
                                                   command: list[str]) -> None:
    np.array([1, 2, 3], "<u2").tofile(tmp_path / "t.bin")
    before = listing(tmp_path)
    status = main([part.format(d=tmp_path) for part in command])
    err = capsys.readouterr().err
    assert status == 2
    assert err == ("bob: --vocab 1048577 is outside [2, 1048576]: V=1048576 is the largest "
                   "table Bob trains\n")
    assert listing(tmp_path) == before


def test_bob_plan_at_65536_certifies(capsys) -> None:
    status = main(["plan", "--vocab", "65536", "--schedule", "fused", "--mode", "corpus",
                   "-N", "2", "--json"])
    out = capsys.readouterr().out
    assert status == 0
    plan = loads(out, regions=catalogue())
    assert plan.arena_bytes > 5 * TABLE_BYTES and certify(plan).holds
    assert json.loads(out)["address_map"]["arena"]["bytes"] == plan.arena_bytes


# -- a token file counted sparse, up to the device, at a V the CPU can hold ------------


def token_walk(path: Path, vocab: int, tokens: int = 20_000) -> None:
    """A walk with small steps: sparse counts with structure, every token below V."""
    rng = np.random.default_rng(vocab)
    (np.cumsum(rng.integers(1, 50, tokens)) % vocab).astype("<u2").tofile(path)


def test_sparse_counts_become_the_sparse_corpus_record(tmp_path: Path, capsys) -> None:
    vocab = 3000  # above DENSE_MAX_VOCAB: the counts file is sparse
    token_walk(tmp_path / "t.bin", vocab)
    counts = tmp_path / "t.counts"
    assert main(["count", "--tokens", str(tmp_path / "t.bin"), "--vocab", str(vocab), "-o",
                 str(counts), "--json"]) == 0
    counted = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counted["layout"] == "sparse"
    seen: list[int] = []
    data = api.training_data(spec=api.CorpusSpec(counts=str(counts)), admit=seen.append)
    assert seen == [vocab]  # V is admitted before the V x V weights are built
    loaded = CountsFile.load(counts)
    dense = loaded.counts.to_dense()
    assert data.record.mode == "corpus" and data.record.vocab == vocab
    # the counted pairs, no more: the record's scattered table is the dense weights
    assert data.record.keys.tolist() == np.flatnonzero(dense).tolist()
    assert data.record.dense_weights().tobytes() == corpus.weights(dense).tobytes()
    assert counted["digest"] == loaded.digest == sparse_digest(loaded.counts)
    assert digest_matches(data.record.data_digest, loaded.counts)  # the record's digest
    assert data.optimum == counted["optimum"]
    checkpoint = tmp_path / "bob.safetensors"
    assert main(["train", "--counts", str(counts), "--backend", "cpu", "--schedule", "fused",
                 "--steps", "1", "-N", "1", "-c", str(checkpoint), "--json",
                 "--tables", "dense"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["global_step"] == 1 and report["loss"] < report["initial_loss"]
    assert ckpt.Checkpoint.load(checkpoint).vocab == vocab


def test_the_cpu_refuses_counts_above_its_limit_before_building_the_record(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal of V=50257 on the CPU, on a table small enough for CI: the limit lowered."""
    vocab = 3000
    token_walk(tmp_path / "t.bin", vocab)
    counts = tmp_path / "t.counts"
    assert main(["count", "--tokens", str(tmp_path / "t.bin"), "--vocab", str(vocab), "-o",
                 str(counts)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(training, "CPU_MAX_VOCAB", 2048)

    def no_record(counted, description):  # no record is built for a refused V
        raise AssertionError("corpus_record was called")

    monkeypatch.setattr("bob.host.data.corpus_record", no_record)
    before = listing(tmp_path)
    status = main(["train", "--counts", str(counts), "--backend", "cpu", "-c",
                   str(tmp_path / "bob.safetensors"), "--tables", "dense"])
    err = capsys.readouterr().err
    assert status == 2
    assert err == ("bob: V=3000 is above the largest dense table the CPU backend trains "
                   "(V=2048): it would hold about 0.2 GiB in host memory; train on a GPU "
                   "(--backend cuda) or with --tables collapsed\n")
    assert listing(tmp_path) == before


@needs_nvrtc
@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_a_plan_of_the_compiled_kernels_at_65536_certifies_and_encodes(schedule: str) -> None:
    """Bob's kernels as NVRTC compiles them: their parameter layouts (bob-adamw's rows and
    columns included) carry a V = 65536 plan."""
    from bob.kernels.cuda.regions import compiled_regions

    config = BobConfig(vocab=V, prompts=1, updates=2, mode="corpus",  # type: ignore[arg-type]
                       schedule=schedule, pairs=typical_pairs(V),  # type: ignore[arg-type]
                       validation_pairs=V)
    plan = build_plan(config, SM90, compiled=compiled_regions(SM90.name))
    assert certify(plan).holds, certify(plan).hazards
    encoded = encode(plan)
    assert len(encoded.program.data) == plan.program_bytes  # code, a block per launch
    assert len(encoded.qmd_table.data) == plan.qmd_table_bytes
    assert loads(dumps(plan), regions=catalogue()) == plan


def test_bob_bench_refuses_a_table_the_cpu_cannot_hold(tmp_path: Path, capsys) -> None:
    before = listing(tmp_path)
    status = main(["bench", "--backend", "cpu", "--vocab", "256", "--vocab", "65536",
                   "--save", str(tmp_path / "bench.json")])
    assert status == 2
    assert capsys.readouterr().err == (
        "bob: V=65536 is above the largest table the CPU backend trains (V=32768); bench it "
        "on a GPU (--backend cuda)\n")
    assert listing(tmp_path) == before
