"""Input and result records, and the atomic write under them."""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from bob import files
from bob.errors import BadInput, RunFailure
from bob.files import atomic_write
from bob.program.bob import BobConfig
from bob.records.binary import (
    HEADER,
    INPUT_MAGIC,
    RESULT_MAGIC,
    InputRecord,
    ResultRecord,
)
from conftest import listing


def hard_record(v: int = 256, prompts: tuple[int, ...] = (104, 105)) -> InputRecord:
    return InputRecord.hard((np.arange(v) * 7 + 3) % v, prompts, source="test")


def corpus_record(v: int = 8, prompts: tuple[int, ...] = (1, 7)) -> InputRecord:
    counts = np.arange(v * v, dtype=np.float64).reshape(v, v) + 1
    return InputRecord.corpus((counts / counts.sum()).astype(np.float32), prompts)


def result_record(v: int = 16, p: int = 3) -> ResultRecord:
    rng = np.random.default_rng(1)
    return ResultRecord(
        mode="hard", vocab=v,
        initial_loss=rng.standard_normal(v).astype(np.float32),
        training_loss=rng.standard_normal(v).astype(np.float32),
        logit_rows=rng.standard_normal((p, v)).astype(np.float32),
        predictions=rng.integers(0, v, p).astype(np.uint32))


# -- round trips ---------------------------------------------------------------
@pytest.mark.parametrize("record", [hard_record(), hard_record(2, ()), corpus_record(),
                                    corpus_record(3, ())], ids=repr)
def test_input_record_round_trips(record: InputRecord, tmp_path: Path) -> None:
    data = record.to_bytes()
    assert InputRecord.from_bytes(data, "memory") == record
    path = tmp_path / "input.bob"
    record.write(path)
    assert path.read_bytes() == data
    assert InputRecord.read(path) == record
    assert listing(tmp_path) == ["input.bob"]  # no temporary left behind


def test_input_payload_is_the_arena_input_tensor() -> None:
    for record in (hard_record(), corpus_record()):
        config = BobConfig(vocab=record.vocab, prompts=record.prompt_count, mode=record.mode,
                           pairs=record.pairs)
        payload = record.payload()
        assert len(payload) == config.input_bytes
        if record.mode == "hard":
            training = record.targets.astype("<u4").tobytes()
        else:  # keys u64[K], then their values f32[K]
            training = record.keys.astype("<u8").tobytes() + record.values.astype("<f4").tobytes()
        assert payload[: config.input_targets_bytes] == training
        prompts = np.frombuffer(payload[config.input_targets_bytes:], "<u4")
        assert prompts.tolist() == record.prompts.tolist()


def test_header_layout() -> None:
    record = corpus_record(5, (4,))
    data = record.to_bytes()
    # A corpus record is version 2: the header, then K as a u64, then the payload.
    assert data[:HEADER.size] == b"BOBINPUT" + struct.pack("<IIII", 2, 1, 5, 1)
    assert data[HEADER.size:HEADER.size + 8] == struct.pack("<Q", 25) and record.pairs == 25
    assert data[HEADER.size + 8:] == record.payload()
    assert hard_record(4, (1, 2)).to_bytes()[:24] == b"BOBINPUT" + struct.pack("<IIII",
                                                                                1, 0, 4, 2)


def test_prompts_from_bytes_and_digest_ignores_prompts() -> None:
    record = InputRecord.hard(np.zeros(256, np.int64), b"hi")
    assert record.prompts.dtype == np.uint32 and record.prompts.tolist() == [104, 105]
    other = InputRecord.hard(np.zeros(256, np.int64), b"xyz")
    assert record.data_digest == other.data_digest
    assert record.data_digest != hard_record().data_digest
    assert not record.prompts.flags.writeable  # frozen all the way down


def test_result_record_round_trips(tmp_path: Path) -> None:
    record = result_record()
    assert ResultRecord.from_bytes(record.to_bytes(), "memory") == record
    path = tmp_path / "result.bob"
    record.write(path)
    assert ResultRecord.read(path) == record
    assert path.read_bytes()[:24] == RESULT_MAGIC + struct.pack("<IIII", 1, 0, 16, 3)


def test_result_record_from_arena_bytes() -> None:
    record = result_record(v=8, p=2)
    parts = {name: getattr(record, name).tobytes() for name in
             ("initial_loss", "training_loss", "logit_rows", "predictions")}
    rebuilt = ResultRecord.from_arena("hard", 8, **parts)
    assert rebuilt == record
    assert rebuilt.payload() == b"".join(parts.values())
    with pytest.raises(ValueError, match="logit_rows is 4 bytes"):
        ResultRecord.from_arena("hard", 8, **{**parts, "logit_rows": b"\0" * 4})


def test_result_objectives() -> None:
    losses = np.array([1.0, 2.0, 3.0, 6.0], np.float32)
    assert ResultRecord.objective("hard", losses) == 3.0
    assert ResultRecord.objective("corpus", losses) == 12.0


def test_construction_checks() -> None:
    with pytest.raises(BadInput, match=r"^cli: prompts\[1\] = 256 is not below V=256$"):
        InputRecord.hard(np.zeros(256, np.uint32), [3, 256], source="cli")
    with pytest.raises(BadInput, match=r"prompts\[0\] = -1 is negative"):
        InputRecord.hard(np.zeros(256, np.int64), [-1])
    with pytest.raises(ValueError, match="targets has shape"):
        InputRecord(mode="hard", vocab=4, targets=np.zeros(5, np.uint32), prompts=())
    with pytest.raises(ValueError, match="V=1 is outside"):
        InputRecord.hard([0], ())
    with pytest.raises(TypeError, match="integers"):
        InputRecord.hard(np.zeros(4, np.float32), ())


# -- bad input files -----------------------------------------------------------
def _header(magic: bytes = INPUT_MAGIC, version: int = 1, mode: int = 0, v: int = 4,
            p: int = 1) -> bytes:
    return HEADER.pack(magic, version, mode, v, p)


def _u32(*values: int) -> bytes:
    return np.array(values, "<u4").tobytes()


def _weights(v: int, changes: dict[tuple[int, int], float]) -> bytes:
    weights = np.full((v, v), 1.0 / (v * v), "<f4")
    for index, value in changes.items():
        weights[index] = value
    return weights.tobytes()


GOOD_HARD = _header() + _u32(1, 2, 3, 0) + _u32(2)

BAD_INPUTS = {
    "empty": (b"", "empty file, not a Bob input record"),
    "text": (b"hello, world\n" * 4, "starts with b'hello, w', not b'BOBINPUT' (this looks "
                                    "like text (a corpus?), not a record)"),
    "result": (result_record().to_bytes(), "this is a Bob result record"),
    "safetensors": (b"\x10\0\0\0\0\0\0\0{\"a\":1}        ", "looks like a safetensors file"),
    "binary": (bytes(range(200, 240)), "(this is not a Bob file)"),
    "short header": (GOOD_HARD[:10], "truncated header: 10 bytes, a Bob input record "
                                     "starts with 24"),
    "short magic": (b"BOBIN", "truncated header: 5 bytes"),
    "version": (_header(version=3) + GOOD_HARD[24:],
                "unsupported format version 3 (this Bob reads version 1 and 2)"),
    "hard version 2": (_header(version=2) + GOOD_HARD[24:],
                       "a hard-mode record is format version 1, not 2"),
    "mode": (_header(mode=2) + GOOD_HARD[24:], "unknown mode 2 (0 hard, 1 corpus)"),
    "small V": (_header(v=1) + _u32(0, 0), "V=1 is outside [2, 1048576]"),
    "large V": (_header(v=1048577), "V=1048577 is outside [2, 1048576]"),
    # A dense table past 65536 is refused from the header, before 16 GiB of weights.
    "dense corpus V": (_header(mode=1, v=65537) + _u32(0),
                       "a dense (version 1) corpus record of V=65537 would hold "
                       "17,180,393,476 bytes of weights; dense records go up to V=65536 "
                       "(larger ones are sparse, version 2)"),
    "hard V past 65536": (_header(v=65537), "truncated: 24 bytes, a hard input record with "
                                            "V=65537, P=1 has 262176"),
    "large P": (_header(p=4097), "P=4097 is outside [0, 4096]"),
    "truncated": (GOOD_HARD[:-1], "truncated: 43 bytes, a hard input record with V=4, P=1 "
                                  "has 44"),
    "trailing": (GOOD_HARD + b"xyz", "3 trailing bytes after a hard input record with V=4, "
                                     "P=1 (44 bytes)"),
    "target": (_header() + _u32(1, 2, 4, 0) + _u32(2), "targets[2] = 4 is not below V=4"),
    "prompt": (_header(p=2) + _u32(1, 2, 3, 0) + _u32(2, 9), "prompts[1] = 9 is not below V=4"),
    "corpus prompt": (_header(mode=1) + _weights(4, {}) + _u32(4),
                      "prompts[0] = 4 is not below V=4"),
    "nan": (_header(mode=1) + _weights(4, {(1, 2): np.nan}) + _u32(0),
            "weights[1][2] is nan (not finite)"),
    "inf": (_header(mode=1) + _weights(4, {(3, 0): np.inf}) + _u32(0),
            "weights[3][0] is inf (not finite)"),
    "negative": (_header(mode=1) + _weights(4, {(0, 3): -0.0625, (0, 2): 0.1875}) + _u32(0),
                 "weights[0][3] = -0.0625 is negative"),
    "sum": (_header(mode=1) + _weights(4, {(2, 2): 0.5}) + _u32(0),
            "weights sum to 1.4375, not 1"),
    "corpus truncated": (_header(mode=1) + _weights(4, {}), "truncated: 88 bytes, a corpus "
                                                            "input record with V=4, P=1 has 92"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_record(name: str, tmp_path: Path) -> None:
    data, fragment = BAD_INPUTS[name]
    path = tmp_path / "bad.bob"
    path.write_bytes(data)
    before = listing(tmp_path)
    with pytest.raises(BadInput) as caught:
        InputRecord.read(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert fragment in message
    assert "\n" not in message
    assert caught.value.exit_status == 2
    assert listing(tmp_path) == before
    assert path.read_bytes() == data


# -- sparse corpus records -----------------------------------------------------
def _sparse(keys: tuple[int, ...], values: tuple[float, ...], v: int = 4,
            prompts: tuple[int, ...] = (0,), pairs: int | None = None) -> bytes:
    """A version 2 corpus record written field by field: header, K, keys, values, prompts."""
    k = len(keys) if pairs is None else pairs
    return (_header(version=2, mode=1, v=v, p=len(prompts)) + struct.pack("<Q", k)
            + np.array(keys, "<u8").tobytes() + np.array(values, "<f4").tobytes()
            + _u32(*prompts))


GOOD_SPARSE = _sparse((1, 6, 15), (0.25, 0.5, 0.25))

BAD_SPARSE = {
    "key outside": (_sparse((1, 16), (0.5, 0.5)),
                    "keys[1] = 16 is outside the V x V table (V=4: keys below 16)"),
    "key repeated": (_sparse((3, 3), (0.5, 0.5)), "keys[1] = 3 does not follow keys[0] = 3: "
                                                  "keys must be strictly increasing"),
    "keys decreasing": (_sparse((1, 9, 2), (0.25, 0.5, 0.25)),
                        "keys[2] = 2 does not follow keys[1] = 9"),
    "no pairs": (_sparse((), ()), "no pairs: a corpus record needs at least one transition"),
    "too many pairs": (_sparse((), (), pairs=17),
                       "K=17 pairs, more than the 16 cells of a V=4 table"),
    "value nan": (_sparse((1, 6), (np.nan, 1.0)), "weights[0][1] is nan (not finite)"),
    "value inf": (_sparse((1, 6), (0.0, np.inf)), "weights[1][2] is inf (not finite)"),
    "value negative": (_sparse((1, 6, 15), (1.25, -0.5, 0.25)),
                       "weights[1][2] = -0.5 is negative"),
    "values sum": (_sparse((1, 6), (0.5, 0.25)), "weights sum to 0.75, not 1"),
    "prompt": (_sparse((1,), (1.0,), prompts=(4,)), "prompts[0] = 4 is not below V=4"),
    "no K": (_header(version=2, mode=1), "truncated header: 24 bytes, a sparse corpus record "
                                          "starts with 32"),
    "truncated": (GOOD_SPARSE[:-1], f"truncated: {len(GOOD_SPARSE) - 1} bytes, a corpus input "
                                    f"record with V=4, K=3, P=1 has {len(GOOD_SPARSE)}"),
    "trailing": (GOOD_SPARSE + b"\0" * 4, f"4 trailing bytes after a corpus input record with "
                                          f"V=4, K=3, P=1 ({len(GOOD_SPARSE)} bytes)"),
    "dense, all zero": (_header(mode=1) + bytes(64) + _u32(0),
                        "no pairs: a corpus record needs at least one transition"),
}


@pytest.mark.parametrize("name", list(BAD_SPARSE))
def test_bad_sparse_record(name: str, tmp_path: Path) -> None:
    data, fragment = BAD_SPARSE[name]
    path = tmp_path / "bad.bob"
    path.write_bytes(data)
    with pytest.raises(BadInput) as caught:
        InputRecord.read(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and fragment in message, message
    assert "\n" not in message and caught.value.exit_status == 2
    assert listing(tmp_path) == ["bad.bob"] and path.read_bytes() == data


def test_a_sparse_record_is_version_2_and_round_trips(tmp_path: Path) -> None:
    record = InputRecord.from_bytes(GOOD_SPARSE, "good")
    assert (record.mode, record.vocab, record.pairs, record.prompt_count) == ("corpus", 4, 3, 1)
    assert record.keys.dtype == np.uint64 and record.keys.tolist() == [1, 6, 15]
    assert record.values.dtype == np.float32 and record.values.tolist() == [0.25, 0.5, 0.25]
    assert record.to_bytes() == GOOD_SPARSE
    assert repr(record) == "InputRecord(mode='corpus', V=4, K=3, P=1)"
    dense = np.zeros((4, 4), np.float32)
    dense[0, 1], dense[1, 2], dense[3, 3] = 0.25, 0.5, 0.25
    assert record.dense_weights().tobytes() == dense.tobytes()
    assert InputRecord.corpus(dense, (0,)) == record
    # A large V with few pairs: the file is O(K), no V x V table is built to write or read it.
    v = 65536
    wide = InputRecord.sparse(v, [0, 70_000, v * v - 1], [0.5, 0.25, 0.25], [v - 1])
    path = tmp_path / "wide.bob"
    wide.write(path)
    assert path.stat().st_size == 24 + 8 + 3 * 12 + 4
    assert InputRecord.read(path) == wide
    assert listing(tmp_path) == ["wide.bob"]


def test_a_version_1_dense_corpus_record_is_read_as_sparse() -> None:
    """Bob wrote corpus records as the dense table (version 1): they are still read, their
    cells whose bits are not zero becoming the pairs (a -0.0 cell among them)."""
    dense = np.zeros((4, 4), np.float32)
    dense[0, 3], dense[2, 0], dense[2, 1], dense[3, 2] = 0.5, 0.125, -0.0, 0.375
    old = _header(mode=1, p=2) + dense.astype("<f4").tobytes() + _u32(3, 1)
    record = InputRecord.from_bytes(old, "old.bob")
    assert record.keys.tolist() == [3, 8, 9, 14]
    assert record.values.view(np.uint32).tolist() == dense.reshape(-1)[[3, 8, 9, 14]].view(
        np.uint32).tolist()
    assert record.prompts.tolist() == [3, 1]
    assert record.dense_weights().tobytes() == dense.tobytes()
    rewritten = record.to_bytes()
    assert rewritten[8:12] == struct.pack("<I", 2)  # written again as version 2
    assert InputRecord.from_bytes(rewritten, "new.bob") == record
    # It trains on the same data: its sparse digest, and the legacy digest of its table.
    import hashlib

    from bob.records.digest import is_sparse
    assert is_sparse(record.data_digest)
    legacy = hashlib.sha256(dense.astype("<f4").tobytes()).hexdigest()
    assert record.digest_matches(legacy) and record.digest_matches(record.data_digest)
    assert not record.digest_matches(hashlib.sha256(b"other").hexdigest())


def test_sparse_construction_checks() -> None:
    with pytest.raises(TypeError, match="values must be floating point"):
        InputRecord.sparse(4, [1], np.array([1], np.int32))
    with pytest.raises(TypeError, match="keys must be integers"):
        InputRecord.sparse(4, np.array([1.0]), [1.0])
    with pytest.raises(ValueError, match="must be one entry per pair"):
        InputRecord.sparse(4, [1, 2], [1.0])
    with pytest.raises(BadInput, match=r"^cli: keys\[0\] = -1 is negative$"):
        InputRecord.sparse(4, np.array([-1, 2]), [0.5, 0.5], source="cli")
    with pytest.raises(ValueError, match="a corpus-mode record has keys and values"):
        InputRecord(mode="corpus", vocab=4, keys=[1], prompts=())


def test_the_good_hard_sample_is_good() -> None:
    record = InputRecord.from_bytes(GOOD_HARD, "good")
    assert record.targets.tolist() == [1, 2, 3, 0] and record.prompts.tolist() == [2]


@pytest.mark.parametrize(("data", "fragment"), [
    (hard_record().to_bytes(), "this is a Bob input record"),
    (result_record().to_bytes()[:-1], "truncated: "),
    (result_record(v=4, p=1).to_bytes()[:-4] + _u32(4), "predictions[0] = 4 is not below V=4"),
])
def test_bad_result_record(data: bytes, fragment: str, tmp_path: Path) -> None:
    path = tmp_path / "result.bob"
    path.write_bytes(data)
    with pytest.raises(BadInput, match=f"^{path}: .*") as caught:
        ResultRecord.read(path)
    assert fragment in str(caught.value)
    assert listing(tmp_path) == ["result.bob"]


def test_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=f"^{tmp_path / 'nope'}: no such file$"):
        InputRecord.read(tmp_path / "nope")
    with pytest.raises(BadInput, match="is a directory"):
        InputRecord.read(tmp_path)
    assert listing(tmp_path) == []


def test_unreadable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret.bob"
    path.write_bytes(GOOD_HARD)

    def denied(self: Path, *args: object) -> bytes:
        raise PermissionError(13, "Permission denied")  # as for root-owned 0600, even as root

    monkeypatch.setattr(Path, "open", denied)
    with pytest.raises(BadInput, match=r"^.*secret.bob: cannot read the file \(permission "
                                       r"denied\)$"):
        InputRecord.read(path)


# -- atomic writes -------------------------------------------------------------
def test_atomic_write_bytes_and_writer(tmp_path: Path) -> None:
    path = tmp_path / "file"
    atomic_write(path, b"one")
    assert path.read_bytes() == b"one"
    atomic_write(path, lambda f: (f.write(b"tw"), f.write(b"o")))
    assert path.read_bytes() == b"two"
    assert listing(tmp_path) == ["file"]


def test_atomic_write_keeps_the_mode(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"old")
    path.chmod(0o640)
    atomic_write(path, b"new")
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_writer_failing_midway_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    atomic_write(path, b"old contents")

    def half(file: io.BufferedWriter) -> None:
        file.write(b"new half")
        raise KeyboardInterrupt  # an interruption, not only an error

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, half)
    assert path.read_bytes() == b"old contents"
    assert listing(tmp_path) == ["file"]


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
def test_an_os_failure_leaves_the_old_file(step: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "file"
    atomic_write(path, b"old contents")

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    if step == "fsync":
        monkeypatch.setattr(files.os, "fsync", fail)
        data: object = b"new contents"
    elif step == "replace":
        monkeypatch.setattr(files.os, "replace", fail)
        data = b"new contents"
    else:
        def data(file: io.BufferedWriter) -> None:
            file.write(b"new")
            fail()
    with pytest.raises(RunFailure, match=r"^.*file: cannot write \(No space left on device\); "
                                         r"the old file is untouched$"):
        atomic_write(path, data)  # type: ignore[arg-type]
    monkeypatch.undo()
    assert path.read_bytes() == b"old contents"
    assert listing(tmp_path) == ["file"]


def test_atomic_write_into_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="does not exist"):
        atomic_write(tmp_path / "no" / "file", b"x")
    (tmp_path / "dir").mkdir()
    with pytest.raises(BadInput, match="is a directory"):
        atomic_write(tmp_path / "dir", b"x")
    assert listing(tmp_path) == ["dir"]


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "file"
    prefix = files._temp_prefix(path)
    dead = prefix.replace(f".{os.getpid()}.", ".999999999.") + "abc123" + files.TEMP_SUFFIX
    mine = prefix + "xyz" + files.TEMP_SUFFIX  # a write of this process in flight
    for name in (dead, mine, "unrelated.tmp"):
        (tmp_path / name).write_bytes(b"partial")
    atomic_write(path, b"new")
    assert listing(tmp_path) == sorted(["file", mine, "unrelated.tmp"])


# -- one ladder for every input file ---------------------------------------------
@pytest.mark.parametrize(("error", "message"), [
    (FileNotFoundError(2, "No such file or directory"), "no such file"),
    (IsADirectoryError(21, "Is a directory"), "is a directory, not a checkpoint"),
    (PermissionError(13, "Permission denied"), "cannot read the file (permission denied)"),
    (OSError(5, "Input/output error"), "cannot read the file (Input/output error)"),
])
def test_every_reader_meets_the_same_ladder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            error: OSError, message: str) -> None:
    from bob.records.checkpoint import Checkpoint
    from bob.records.corpus import counts_from_files

    path = tmp_path / "input"
    path.write_bytes(GOOD_HARD)

    def fail(self: Path, *args: object) -> None:
        raise error

    monkeypatch.setattr(Path, "open", fail)
    kinds = {"checkpoint": lambda: Checkpoint.load(path),
             "file": lambda: InputRecord.read(path),
             "text file": lambda: counts_from_files([path])}
    for kind, read in kinds.items():
        with pytest.raises(BadInput) as caught:
            read()
        expected = message.replace("checkpoint", kind)
        assert str(caught.value) == f"{path}: {expected}", kind


def test_make_directory_names_what_is_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("keep me")
    files.make_directory(tmp_path / "new" / "deeper")
    assert (tmp_path / "new" / "deeper").is_dir()
    with pytest.raises(BadInput, match=r"plain: is a file, not a directory$"):
        files.make_directory(tmp_path / "plain")
    with pytest.raises(BadInput, match=r"plain/below: cannot create the directory \(Not a "):
        files.make_directory(tmp_path / "plain" / "below")
    assert (tmp_path / "plain").read_text() == "keep me"


def test_a_corpus_needs_a_file() -> None:
    from bob.records.corpus import counts_from_files

    with pytest.raises(BadInput, match="^a corpus needs at least one text file$"):
        counts_from_files([])
